//! A real PostgreSQL for tests: `initdb` and `pg_ctl` (Debian's `postgresql` package)
//! into a temporary directory, run as the `postgres` account when the tests run as root,
//! serving on a Unix socket in that directory only (plus, when asked, TLS on a loopback
//! port). Stopped and removed when dropped, or for the one server a process shares
//! ([`Postgres::shared`]) when that process ends.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{free_port, is_root, path_str, tempdir, INSTALL};

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    data: PathBuf,
    pub socket: PathBuf,
    /// The loopback TCP port, when listening on one.
    pub tcp_port: Option<u16>,
    /// Of the socket (and of TCP, when listening).
    port: u16,
}

/// Where `initdb` is: on PATH, or the newest `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if d.join("initdb").is_file() && d.join("pg_ctl").is_file() {
                return Some(d);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

/// The `postgres` account's ids (PostgreSQL refuses to run as root).
fn postgres_ids() -> (u32, u32) {
    let u = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("the postgres account (made by the postgresql package)");
    (u.uid.as_raw(), u.gid.as_raw())
}

impl Postgres {
    /// A fresh cluster, running; a test without PostgreSQL fails, naming what installs it.
    /// (`None` is kept for the callers' shape: a host where it cannot run.)
    pub fn start() -> Option<Postgres> {
        Self::start_with(None)
    }

    /// With `tls`: (certificate PEM, key PEM) served on a loopback port too.
    pub fn start_with(tls: Option<(&str, &str)>) -> Option<Postgres> {
        // A missing tool fails the test, as every missing test prerequisite does.
        let bin = bin_dir().unwrap_or_else(|| {
            panic!("PostgreSQL is not installed: run {INSTALL} (Debian package postgresql)")
        });
        let dir = tempdir();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let data = dir.path().join("data");
        let socket = dir.path().join("sock");
        std::fs::create_dir(&socket).expect("socket dir");
        let mut pg = Postgres {
            dir,
            bin,
            data,
            socket,
            tcp_port: None,
            port: 5432,
        };
        if is_root() {
            let (uid, gid) = postgres_ids();
            nix::unistd::chown(pg.dir.path(), Some(uid.into()), Some(gid.into())).expect("chown");
            nix::unistd::chown(&pg.socket, Some(uid.into()), Some(gid.into())).expect("chown");
        }
        pg.run(
            "initdb",
            &[
                "-D",
                &path_str(&pg.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        let mut conf = format!(
            "listen_addresses = ''\nunix_socket_directories = '{}'\nport = 5432\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n",
            path_str(&pg.socket)
        );
        if let Some((cert, key)) = tls {
            let port = free_port();
            let (c, k) = (
                pg.dir.path().join("server.crt"),
                pg.dir.path().join("server.key"),
            );
            std::fs::write(&c, cert).expect("cert");
            std::fs::write(&k, key).expect("key");
            std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if is_root() {
                let (uid, gid) = postgres_ids();
                for f in [&c, &k] {
                    nix::unistd::chown(f, Some(uid.into()), Some(gid.into())).expect("chown");
                }
            }
            conf.push_str(&format!(
                "listen_addresses = '127.0.0.1'\nport = {port}\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
                path_str(&c),
                path_str(&k)
            ));
            // TCP from loopback must use TLS: no plain fallback to pass a test.
            let hba = pg.data.join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).expect("pg_hba.conf");
            text = text
                .lines()
                .filter(|l| !l.starts_with("host"))
                .collect::<Vec<_>>()
                .join("\n");
            text.push_str("\nhostssl all all 127.0.0.1/32 trust\n");
            std::fs::write(&hba, text).expect("pg_hba.conf");
            pg.tcp_port = Some(port);
            pg.port = port;
        }
        let conf_file = pg.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_file).expect("postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&conf_file, text).expect("postgresql.conf");
        pg.restart();
        Some(pg)
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(program));
        if is_root() {
            let (uid, gid) = postgres_ids();
            cmd.uid(uid).gid(gid).current_dir(self.dir.path());
        }
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server (fast shutdown: connections are closed).
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &["-D", &path_str(&self.data), "-m", "fast", "-w", "stop"],
        );
    }

    /// Starts the server (again, after [`Self::stop`]), and waits until it serves.
    pub fn restart(&self) {
        let log = self.dir.path().join("postgres.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &path_str(&self.data),
                "-l",
                &path_str(&log),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// The URL of database `db` on the Unix socket.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgresql:///{db}?host={}&port={}&user=postgres",
            path_str(&self.socket),
            self.port
        )
    }

    /// Runs `sql` in `db`; its rows, one per line, columns `|`-separated.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let psql = if self.bin.join("psql").is_file() {
            self.bin.join("psql")
        } else {
            PathBuf::from("psql")
        };
        let out = Command::new(psql)
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                db,
                "-c",
                sql,
            ])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A new, empty database.
    pub fn create_db(&self, name: &str) -> String {
        self.sql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(name)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// One server for every caller in this process. A reaper of its own (its own process
    /// group, so an interrupt of the tests does not take it first) stops it and removes
    /// its directory once this process has ended, however it ends: it waits for the end of
    /// a pipe only this process holds open.
    pub fn shared() -> &'static Postgres {
        static SHARED: std::sync::OnceLock<(Postgres, std::process::ChildStdin)> =
            std::sync::OnceLock::new();
        &SHARED
            .get_or_init(|| {
                let pg = Postgres::start().expect("PostgreSQL");
                let mut reaper = Command::new("sh");
                reaper
                    .args([
                        "-c",
                        "cat >/dev/null; \"$0\" -D \"$1\" -m immediate -w stop; rm -rf \"$2\"",
                    ])
                    .arg(pg.bin.join("pg_ctl"))
                    .arg(&pg.data)
                    .arg(pg.dir.path())
                    .process_group(0)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                if is_root() {
                    let (uid, gid) = postgres_ids();
                    reaper.uid(uid).gid(gid).current_dir(pg.dir.path());
                }
                let stdin = reaper
                    .spawn()
                    .expect("the shared PostgreSQL's reaper")
                    .stdin
                    .take()
                    .expect("its stdin");
                (pg, stdin)
            })
            .0
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D", &path_str(&self.data), "-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
