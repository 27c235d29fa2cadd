//! A real systemd for the tests: a minimal Debian bookworm root file system, built once
//! with debootstrap and cached, booted with `systemd-nspawn --boot` for one test (systemd
//! 252 as the container's PID 1), with the built binary bound in. Commands run inside with
//! `nsenter` into every namespace of the container's PID 1.
//!
//! - The root file system is cached in [`CACHE`]`/rootfs-<hash of the recipe>` and built
//!   again when [`RECIPE`] changes; a file lock keeps test processes from building it twice.
//! - Each container boots with `--volatile=overlay` (the cached tree is never written, and
//!   several containers boot from it at once), `--register=no --keep-unit`, and with
//!   `SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1`, from a process moved into cgroups of the test's
//!   own, so that nspawn makes its cgroups there and not at the host's roots
//!   (../shared/notes of the project's machines; docs/operations.md, "Verified under a
//!   real systemd").
//! - A container that must survive a reboot ([`Options::persistent`]) boots from an
//!   overlay of the cached tree that the harness mounts in the test's temp dir.
//! - Dropping it powers the container off (SIGTERM to nspawn), kills its PID 1 if it is
//!   still there after 15 s, unmounts its overlay, and removes the test's cgroups,
//!   deepest first.
//!
//! Root only: the tests say SKIPPED otherwise. The prerequisites script installs
//! `systemd-container` and `debootstrap`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::fixtures::*;

/// Where root file systems are kept between runs.
pub const CACHE: &str = "/var/cache/railgrid-test";
/// What the root file system is: its hash names the cached tree.
const RECIPE: &str = "debootstrap --variant=minbase --include=systemd,dbus,procps,curl bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// Where the built binary is bound in the container.
pub const BUILT: &str = "/opt/railgrid-build/railgrid";

/// The cached root file system, built on first use.
fn rootfs() -> PathBuf {
    use sha2::Digest;
    static ROOTFS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOTFS
        .get_or_init(|| {
            let digest = sha2::Sha256::digest(RECIPE.as_bytes());
            let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
            let cache = Path::new(CACHE);
            fs::create_dir_all(cache).expect("the root file systems' cache");
            let dir = cache.join(format!("rootfs-{hex}"));
            let lock = fs::File::create(cache.join("build.lock")).expect("lock file");
            fs4::FileExt::lock(&lock).expect("lock");
            if !dir.join("usr/lib/systemd/systemd").exists() {
                let tmp = cache.join(format!("build-{}", std::process::id()));
                let _ = fs::remove_dir_all(&tmp);
                let mut args: Vec<&str> = RECIPE.split_whitespace().skip(1).collect();
                let tmp_s = path_str(&tmp);
                args.extend([tmp_s.as_str(), MIRROR]);
                run_ok(
                    Command::new("debootstrap").args(&args),
                    "debootstrap (scripts/install-test-prerequisites.sh installs it)",
                );
                for junk in [
                    "var/lib/apt/lists",
                    "usr/share/doc",
                    "usr/share/man",
                    "usr/share/locale",
                ] {
                    let _ = fs::remove_dir_all(tmp.join(junk));
                }
                let _ = fs::remove_dir_all(&dir);
                fs::rename(&tmp, &dir).expect("the root file system in place");
            }
            dir
        })
        .clone()
}

/// The cgroup hierarchies nspawn needs a place of ours in: the v2 one, and the v1
/// `name=systemd` one where the host has it.
fn hierarchies() -> Vec<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = PathBuf::from(left.split_whitespace().nth(4)?);
            let mut f = right.split_whitespace();
            let fstype = f.next()?;
            let opts = f.nth(1).unwrap_or_default();
            (fstype == "cgroup2" || (fstype == "cgroup" && opts.contains("name=systemd")))
                .then_some(mount)
        })
        .collect()
}

/// How a container boots, beyond [`Container::boot`]'s defaults.
#[derive(Default)]
pub struct Options {
    /// The binary bound in at [`BUILT`] (the test build when `None`).
    pub binary: Option<PathBuf>,
    /// More host paths bound in read-only: (host path, path in the container).
    pub binds: Vec<(PathBuf, &'static str)>,
    /// Keeps what the container writes across [`Container::reboot`]: an overlay of the
    /// cached root file system that the harness mounts itself, instead of nspawn's
    /// `--volatile=overlay`, which forgets everything at poweroff.
    pub persistent: bool,
}

pub struct Container {
    pub name: String,
    nspawn: Option<Child>,
    pub pid1: i32,
    cgroups: Vec<PathBuf>,
    log: PathBuf,
    /// The root nspawn boots: the cached tree (volatile) or the harness's overlay of it.
    root: PathBuf,
    /// The harness's overlay mount, when persistent.
    overlay: Option<PathBuf>,
    binds: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Container {
    /// Boots a container until `systemctl is-system-running` says running (or degraded);
    /// `None`, saying SKIPPED, where the tests do not run as root.
    pub fn boot(name: &str) -> Option<Self> {
        Self::boot_with(name, Options::default())
    }

    pub fn boot_with(name: &str, options: Options) -> Option<Self> {
        if !requires_root("booting a systemd container needs root") {
            return None;
        }
        let cached = rootfs();
        let dir = tempdir();
        let name = format!("rg-{name}-{}", std::process::id());
        let cgroups: Vec<PathBuf> = hierarchies().iter().map(|h| h.join(&name)).collect();
        for cg in &cgroups {
            fs::create_dir_all(cg).expect("the container's cgroup");
        }
        let binary = options.binary.unwrap_or_else(|| PathBuf::from(BIN));
        let mut binds = vec![format!("--bind-ro={}:{BUILT}", path_str(&binary))];
        for (host, inside) in &options.binds {
            binds.push(format!("--bind-ro={}:{inside}", path_str(host)));
        }
        let (root, overlay) = if options.persistent {
            let merged = dir.path().join("root");
            for d in ["upper", "work", "root"] {
                fs::create_dir(dir.path().join(d)).expect("the overlay's directories");
            }
            let opts = format!(
                "lowerdir={},upperdir={},workdir={}",
                path_str(&cached),
                path_str(&dir.path().join("upper")),
                path_str(&dir.path().join("work"))
            );
            let st = Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &opts])
                .arg(&merged)
                .status()
                .expect("mount");
            assert!(st.success(), "mounting the overlay at {}", merged.display());
            (merged.clone(), Some(merged))
        } else {
            binds.push("--volatile=overlay".into());
            (cached, None)
        };
        let mut c = Self {
            name,
            nspawn: None,
            pid1: 0,
            cgroups,
            log: dir.path().join("nspawn.log"),
            root,
            overlay,
            binds,
            _dir: dir,
        };
        c.start();
        Some(c)
    }

    fn start(&mut self) {
        let script = format!(
            "for cg in {cgs}; do echo $$ > $cg/cgroup.procs || exit 1; done; exec \"$@\"",
            cgs = self
                .cgroups
                .iter()
                .map(|c| path_str(c))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new("sh")
            .args([
                "-c",
                &script,
                "sh",
                "systemd-nspawn",
                "--boot",
                "--register=no",
                "--keep-unit",
            ])
            .args(["--machine", &self.name, "-D"])
            .arg(&self.root)
            .args(&self.binds)
            .env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .spawn()
            .expect("systemd-nspawn: run scripts/install-test-prerequisites.sh");
        let nspawn_pid = child.id() as i32;
        self.nspawn = Some(child);
        // nspawn's first child forks the container's init and goes: the child that is
        // systemd is PID 1.
        self.pid1 = wait_for(Duration::from_secs(30), "the container's PID 1", || {
            let children =
                fs::read_to_string(format!("/proc/{nspawn_pid}/task/{nspawn_pid}/children"))
                    .ok()?;
            children.split_whitespace().find_map(|p| {
                let comm = fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
                (comm.trim() == "systemd").then(|| p.parse().ok()).flatten()
            })
        });
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.sh("systemctl is-system-running");
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if matches!(state.as_str(), "running" | "degraded") {
                break;
            }
            assert!(
                Instant::now() < until,
                "{}: systemd did not come up (is-system-running: {state:?}, {}):\n{}",
                self.name,
                String::from_utf8_lossy(&out.stderr),
                self.console()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A clean poweroff (systemd stops every unit), then a boot of the same root file
    /// system: a reboot. Needs [`Options::persistent`] to keep anything.
    pub fn reboot(&mut self) {
        assert!(self.overlay.is_some(), "a reboot of a volatile container");
        self.poweroff();
        self.start();
    }

    /// SIGTERM to nspawn (systemd in the container powers off); its PID 1 killed if it is
    /// still there after 15 s.
    fn poweroff(&mut self) {
        let Some(mut nspawn) = self.nspawn.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(nspawn.id() as i32), Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(15);
        while nspawn.try_wait().ok().flatten().is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        if nspawn.try_wait().ok().flatten().is_none() {
            // Ends the container's whole PID namespace, then nspawn.
            if self.pid1 > 1 {
                let _ = kill(Pid::from_raw(self.pid1), Signal::SIGKILL);
            }
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
    }

    /// `sh -c script` in every namespace of the container (its environment is the test's:
    /// PATH is set to the container's usual one).
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.pid1.to_string(),
                "-a",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .output()
            .expect("nsenter")
    }

    /// [`Self::sh`] that must succeed; its stdout.
    pub fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "in {}: {script}: {}\n{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Polls `script` until its stdout (trimmed) satisfies `accept`.
    pub fn wait(
        &self,
        what: &str,
        limit: Duration,
        script: &str,
        accept: impl Fn(&str) -> bool,
    ) -> String {
        wait_for(limit, what, || {
            let out = self.sh(script);
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            accept(&text).then_some(text)
        })
    }

    /// What the container printed on its console.
    pub fn console(&self) -> String {
        read_lossy(&self.log)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.poweroff();
        if let Some(root) = &self.overlay {
            let unmounted = Command::new("umount").arg(root).status();
            if !unmounted.is_ok_and(|s| s.success()) {
                let _ = Command::new("umount").arg("-l").arg(root).status();
            }
        }
        for cg in &self.cgroups {
            remove_cgroup_tree(cg);
        }
    }
}
