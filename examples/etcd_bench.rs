//! The hub's peer in `bench/hub.sh`: etcd 3.4 with as many watchers of one key as the hub
//! has agents, over TLS on this machine, measured as the hub is: one Put, the time until
//! every watcher has it (p50/p99 over the rounds), and etcd's resident memory per 1 000
//! watchers. Built only with `--features etcd-bench` (the etcd client compiles its
//! protocol with `protoc`); see docs/benchmarks.md.
//!
//!   etcd_bench WATCHERS [ROUNDS] [CONNECTIONS]
//!
//! It starts its own etcd (`etcd` on PATH) on free loopback ports with a self-signed
//! certificate, in a temporary directory it removes. CONNECTIONS (default: WATCHERS, one
//! per watcher as each host of a fleet would have) spreads the watchers over that many
//! TLS connections; each watcher is a watch stream of its own.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use etcd_client::{Certificate, Client, ConnectOptions, EventType, TlsOptions};
use tokio::sync::{mpsc, Semaphore};

#[path = "common/measure.rs"]
mod measure;
use measure::{percentile, usage};

const KEY: &str = "railgrid-bench/desired";

/// Handshakes in flight at once while the watchers connect.
const CONNECTING: usize = 256;

/// The etcd this benchmark started; killed and reaped when dropped.
struct Etcd {
    child: Child,
    client_url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    Ok(l.local_addr()?.port())
}

/// A certificate for 127.0.0.1 and its key, written to `dir`; returns the certificate's PEM.
fn self_signed(dir: &Path) -> anyhow::Result<String> {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let pem = ck.cert.pem();
    std::fs::write(dir.join("cert.pem"), &pem)?;
    std::fs::write(dir.join("key.pem"), ck.key_pair.serialize_pem())?;
    Ok(pem)
}

fn start_etcd(dir: &Path) -> anyhow::Result<Etcd> {
    let (client, peer) = (free_port()?, free_port()?);
    let client_url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let child = Command::new("etcd")
        .arg("--name=bench")
        .arg(format!("--data-dir={}", dir.join("data").display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--cert-file={}", dir.join("cert.pem").display()))
        .arg(format!("--key-file={}", dir.join("key.pem").display()))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=bench={peer_url}"))
        .arg("--log-level=warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("could not start etcd (Debian: apt-get install etcd-server)")?;
    Ok(Etcd { child, client_url })
}

async fn connect(url: &str, ca: &str) -> anyhow::Result<Client> {
    let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
    let opts = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(30));
    Ok(Client::connect([url], Some(opts)).await?)
}

/// Waits until etcd answers a read over TLS.
async fn ready(etcd: &mut Etcd, ca: &str) -> anyhow::Result<Client> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = etcd.child.try_wait()? {
            bail!("etcd exited at start ({status}); see its log");
        }
        if let Ok(mut c) = connect(&etcd.client_url, ca).await {
            if c.get(KEY, None).await.is_ok() {
                return Ok(c);
            }
        }
        if Instant::now() > deadline {
            bail!("etcd at {} did not answer within 30 s", etcd.client_url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One watch stream on `client`, created before this returns; each Put of [`KEY`] is sent
/// to `seen` as (its value, when it arrived).
async fn watcher(
    mut client: Client,
    seen: mpsc::UnboundedSender<(u64, Instant)>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut stream = client.watch(KEY, None).await?;
    let created = stream
        .message()
        .await?
        .context("watch stream closed at once")?;
    if !created.created() {
        bail!("the first answer of a watch was not its creation");
    }
    Ok(tokio::spawn(async move {
        while let Ok(Some(resp)) = stream.message().await {
            let at = Instant::now();
            for ev in resp.events() {
                let value = ev.kv().and_then(|kv| kv.value_str().ok()?.parse().ok());
                if let (EventType::Put, Some(v)) = (ev.event_type(), value) {
                    let _ = seen.send((v, at));
                }
            }
        }
    }))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage_line = "usage: etcd_bench WATCHERS [ROUNDS] [CONNECTIONS]";
    let n: usize = args.get(1).ok_or_else(|| anyhow!(usage_line))?.parse()?;
    let rounds: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let conns: usize = args.get(3).map_or(Ok(n), |s| s.parse())?;
    if n == 0 || conns == 0 || conns > n || rounds == 0 {
        bail!("{usage_line}: at least one watcher, connection and round, no more connections than watchers");
    }
    railgrid::sys::raise_open_files_limit()?;
    // The rustls provider the etcd client's TLS uses, chosen once for the process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new()
        .prefix("railgrid-etcdbench.")
        .tempdir_in(std::env::var_os("BENCH_TMP").unwrap_or_else(|| "/tmp".into()))?;
    let ca = self_signed(dir.path())?;
    let mut etcd = start_etcd(dir.path())?;
    let pid = etcd.child.id();
    let result = rt.block_on(run(&mut etcd, &ca, pid, n, rounds, conns));
    drop(etcd);
    if result.is_err() {
        if let Ok(log) = std::fs::read_to_string(dir.path().join("etcd.log")) {
            eprintln!("etcd's log:\n{log}");
        }
    }
    result
}

async fn run(
    etcd: &mut Etcd,
    ca: &str,
    pid: u32,
    n: usize,
    rounds: u64,
    conns: usize,
) -> anyhow::Result<()> {
    let mut writer = ready(etcd, ca).await?;
    let version = writer.status().await?.version().to_owned();
    writer.put(KEY, "0", None).await?;
    let (rss0, _) = usage(pid)?;

    // The connections, then the watchers spread over them, a bounded number at a time.
    let t = Instant::now();
    let gate = Arc::new(Semaphore::new(CONNECTING));
    let mut connecting = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let (url, ca, gate) = (etcd.client_url.clone(), ca.to_owned(), gate.clone());
        connecting.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            connect(&url, &ca).await
        });
    }
    let mut clients = Vec::with_capacity(conns);
    while let Some(c) = connecting.join_next().await {
        clients.push(c??);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut starting = tokio::task::JoinSet::new();
    for i in 0..n {
        let (client, tx, gate) = (clients[i % conns].clone(), tx.clone(), gate.clone());
        starting.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            watcher(client, tx).await
        });
    }
    drop(tx);
    let mut watchers = Vec::with_capacity(n);
    while let Some(w) = starting.join_next().await {
        watchers.push(w??);
    }
    eprintln!(
        "{n} watchers over {conns} connections to etcd {version} after {:.1?}",
        t.elapsed()
    );
    // Let etcd settle as the hub's benchmark lets the hub, then read its memory.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss, cpu_a) = usage(pid)?;

    let mut all = Vec::with_capacity(n * rounds as usize);
    let mut worst = Vec::new();
    let mut cpu_rounds = Vec::new();
    for r in 1..=rounds {
        let (_, cpu0) = usage(pid)?;
        let t0 = Instant::now();
        writer.put(KEY, r.to_string(), None).await?;
        let mut lat = Vec::with_capacity(n);
        while lat.len() < n {
            let (v, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .map_err(|_| anyhow!("round {r}: {} of {n} watchers saw the Put", lat.len()))?
                .context("every watcher's stream ended")?;
            if v == r {
                lat.push(at - t0);
            }
        }
        lat.sort();
        cpu_rounds.push(format!("{:.2}", usage(pid)?.1 - cpu0));
        worst.push(*lat.last().expect("n > 0"));
        all.extend(lat);
    }
    all.sort();
    let (_, cpu_b) = usage(pid)?;
    for w in &watchers {
        w.abort();
    }

    let per_1000 = rss.saturating_sub(rss0) as f64 / 1024.0 / (n as f64 / 1000.0);
    println!("etcd watchers                  {n}, over {conns} TLS connections (etcd {version})");
    println!(
        "etcd RSS                       {:.1} MiB ({per_1000:.1} MiB per 1000 watchers over {:.1} MiB at start)",
        rss as f64 / 1024.0,
        rss0 as f64 / 1024.0
    );
    println!(
        "Put -> every watcher           p50 {:.1?}  p99 {:.1?}  max {:.1?}  (over {rounds} Puts; worst per Put {worst:?})",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or_default(),
    );
    println!(
        "etcd CPU seconds per Put       {} (until the last watcher had it; {:.2} s in all)",
        cpu_rounds.join(", "),
        cpu_b - cpu_a
    );
    let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
    println!(
        "{}",
        serde_json::json!({
            "bench": "etcd",
            "watchers": n,
            "connections": conns,
            "p50_ms": ms(percentile(&all, 0.5)),
            "p99_ms": ms(percentile(&all, 0.99)),
            "rss_per_1000_mib": (per_1000 * 10.0).round() / 10.0,
        })
    );
    Ok(())
}
