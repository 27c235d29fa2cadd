//! The download: cut mid-body and resumed, a disk that is full or fills meanwhile.

use super::*;

/// What a [`Proxy`] does when a connection first carries more than its limit towards
/// the agent (a download; reconciles are small).
#[derive(Clone)]
enum AtLimit {
    /// Closes the connection mid-body.
    Cut,
    /// Holds the rest of the body until the gate opens.
    Hold(Arc<Gate>),
}

/// A gate a proxy waits at.
#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().expect("gate") = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("gate");
        while !*open {
            open = self.opened.wait(open).expect("gate");
        }
    }
}

/// A TLS-blind TCP proxy to the hub that acts once, on the first connection carrying
/// more than `limit` bytes towards the agent.
struct Proxy {
    url: String,
    stop: Arc<AtomicBool>,
    /// How many connections reached the limit (acted on for the first only).
    reached: Arc<AtomicU64>,
}

impl Proxy {
    fn start(hub_listen: &str, limit: u64, at_limit: AtLimit) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let url = format!("https://{}", listener.local_addr().expect("addr"));
        let stop = Arc::new(AtomicBool::new(false));
        let reached = Arc::new(AtomicU64::new(0));
        let (hub, stop2, reached2) = (hub_listen.to_owned(), stop.clone(), reached.clone());
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).expect("blocking");
                        let server = TcpStream::connect(&hub).expect("connect hub");
                        let (c2, s2) = (
                            client.try_clone().expect("clone"),
                            server.try_clone().expect("clone"),
                        );
                        std::thread::spawn(move || pipe(c2, s2, None));
                        let act = (limit, at_limit.clone(), reached2.clone());
                        std::thread::spawn(move || pipe(server, client, Some(act)));
                    }
                    // The accept loop's own pace, not a test's synchronisation.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { url, stop, reached }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`; with `act`, does what it says the first time any connection
/// passes its limit.
fn pipe(mut from: TcpStream, mut to: TcpStream, act: Option<(u64, AtLimit, Arc<AtomicU64>)>) {
    let mut buf = [0u8; 16 * 1024];
    let mut sent = 0u64;
    let mut passed = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let (false, Some((limit, at_limit, reached))) = (passed, &act) {
            if sent + n as u64 > *limit {
                passed = true;
                if reached.fetch_add(1, Ordering::SeqCst) == 0 {
                    let head = (*limit - sent) as usize;
                    if to.write_all(&buf[..head]).is_err() {
                        break;
                    }
                    match at_limit {
                        AtLimit::Cut => break,
                        AtLimit::Hold(gate) => {
                            gate.wait();
                            if to.write_all(&buf[head..n]).is_err() {
                                break;
                            }
                            sent += n as u64;
                            continue;
                        }
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n as u64;
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

#[test]
fn a_download_cut_mid_body_resumes_with_a_range_and_commits() {
    let mut up = Up::new();
    let proxy = Proxy::start(&up.hub().listen, 4 * 1024 * 1024, AtLimit::Cut);
    up.url = proxy.url.clone();
    up.start_agent();
    up.offer_v2();
    up.wait_upgrade("committed");
    assert!(
        proxy.reached.load(Ordering::SeqCst) >= 1,
        "the proxy cut a download"
    );
    let log = read_lossy(&up.path("agent.stderr")) + &up.host.agent_log();
    assert!(
        log.contains("resuming from the bytes on disk"),
        "the download resumed: {log}"
    );
    up.assert_running(V2);
    up.assert_clean_bin();
}

#[test]
fn a_full_disk_refuses_the_download_early_and_leaves_nothing() {
    if !requires_root("mounting a small tmpfs needs root") {
        return;
    }
    let mut up = Up::new();
    // The executable's directory on a tmpfs that holds it, and not the new one too.
    let size = fs::metadata(up.exe()).expect("exe").len() + 8 * 1024 * 1024;
    let _disk = small_disk(&up, size);
    up.start_agent();
    up.offer_v2();
    failed_for_space(&up.wait_upgrade("failed"));
    up.assert_running(&builds().v1_version);
    assert_eq!(up.bin_entries(), ["railgrid"]);
    failed_for_space(&up.hub_upgrade("failed"));
    up.kill_everything();
}

/// A tmpfs of `size` bytes over the executable's directory, with the agent's binary on
/// it.
fn small_disk(up: &Up, size: u64) -> Mounted {
    let saved = up.path("saved-railgrid");
    fs::copy(up.exe(), &saved).expect("save");
    let disk = Mounted::tmpfs(&up.bin_dir(), &size.to_string(), "0755");
    fs::copy(&saved, up.exe()).expect("install on the tmpfs");
    disk
}

#[test]
fn a_disk_that_fills_during_the_download_loses_the_download_and_nothing_else() {
    if !requires_root("mounting a small tmpfs needs root") {
        return;
    }
    let mut up = Up::new();
    let v2 = fs::metadata(&builds().v2).expect("v2").len();
    let exe = fs::metadata(up.exe()).expect("exe").len();
    // Room for the binary, the download and the agent's margin, and a little more.
    let disk = small_disk(&up, exe + v2 + 24 * 1024 * 1024);
    let gate = Arc::new(Gate::default());
    let proxy = Proxy::start(
        &up.hub().listen,
        4 * 1024 * 1024,
        AtLimit::Hold(gate.clone()),
    );
    up.url = proxy.url.clone();
    up.start_agent();
    up.offer_v2();
    // The download is under way and held: fill the disk behind its back, then let the
    // rest of the body come.
    wait_for(LIMIT, "the download held at the proxy", || {
        (proxy.reached.load(Ordering::SeqCst) >= 1).then_some(())
    });
    let filler = up.bin_dir().join("filler");
    fill(&filler);
    gate.open();
    failed_for_space(&up.wait_upgrade("failed"));
    fs::remove_file(&filler).expect("remove filler");
    up.assert_running(&builds().v1_version);
    assert_eq!(
        up.bin_entries(),
        ["railgrid"],
        "the partial download is gone"
    );
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    up.kill_everything();
    drop(disk);
}

/// An upgrade record that failed for want of disk space.
fn failed_for_space(upgrade: &Value) {
    assert_says(upgrade, "error", "not enough space");
}
