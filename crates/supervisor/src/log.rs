//! The child's capped, owner-only log, and the threads that fill it.
//!
//! Each `start` of a supervisor creates one pipe for the stdout and stderr of the children
//! it launches, and one thread ([`Pump`]) that copies the pipe into the supervisor's
//! [`CappedLog`], which keeps at most `max_bytes` in `<log>` and as much again in
//! `<log>.1`. The thread, not the async runtime, does the blocking I/O, so a slow disk
//! never stalls supervision; a log that cannot be written drops bytes, so the child never
//! blocks on it. The thread sleeps in `poll` while the pipe is empty (no timer). A pump
//! ends when the last writer of its pipe is gone, or when stop asks it to: once the
//! children's process groups are gone, it copies what is left in the pipe and ends, even
//! if a process that escaped the group (setsid) still holds the pipe open.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::sys::pipe;

/// Size of each read from the pipe: large enough that a fast writer costs few syscalls,
/// small enough that the buffer stays in cache between the read and the write (measured:
/// 128 KiB beat both 64 KiB and 256 KiB-1 MiB).
const READ_CHUNK: usize = 128 * 1024;
/// A partial line is held back (so rotation never splits it) up to this size; a longer
/// line is written in pieces.
const LINE_HOLD: usize = 64 * 1024;
/// A replaced backup at least this large is freed on a helper thread (see
/// `CappedLog::release`); a smaller one costs less to free than a thread costs to start.
const RELEASE_OFF_THREAD: u64 = 1024 * 1024;
/// Pipe buffer asked of the kernel (Linux caps it at /proc/sys/fs/pipe-max-size, 1 MiB by
/// default): a fast writer blocks less often and each read moves more.
const PIPE_BYTES: usize = 1024 * 1024;
/// At most one report of failing log writes (and one of their recovery) per this period: a
/// disk that keeps filling up would otherwise log a pair for every few chunks of output.
const REPORT_EVERY: Duration = Duration::from_secs(30);
/// Most a drain takes from the pipe: more than the pipe holds, so everything the dead
/// children wrote is taken, yet bounded, so a process that escaped their group and writes
/// without pause cannot keep the drain going.
const DRAIN_MAX: usize = 2 * PIPE_BYTES;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("could not open log file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("log path {path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("log file {path} belongs to {owner} (uid {uid}), and this account (uid {ours}) may not write it: remove it as {owner}, or give another --log")]
    NotOurs {
        path: PathBuf,
        owner: String,
        uid: u32,
        ours: u32,
    },
    #[error("could not restrict log file {path} to mode 0600")]
    Chmod {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not create the log pipe")]
    Pipe(#[source] io::Error),
    #[error("could not start the log thread")]
    Thread(#[source] io::Error),
}

/// An append-only file that rotates to `<path>.1` before it would exceed `max_bytes`.
#[derive(Debug)]
pub struct CappedLog {
    path: PathBuf,
    backup: PathBuf,
    file: Option<File>,
    size: u64,
    max: u64,
    /// Which write failures are reported (once per failure, and rate-limited).
    reports: Reports,
    /// The thread freeing the backup that the last rotation replaced.
    releasing: Option<std::thread::JoinHandle<()>>,
}

impl CappedLog {
    /// Opens (or creates, mode 0600) the log for appending. An existing file with wider
    /// permissions is tightened to 0600; a symlink is refused.
    pub fn open(path: &Path, max_bytes: u64) -> Result<Self, LogError> {
        let backup = backup_path(path);
        // A backup moved aside by a rotation that was cut short: past the cap, so gone.
        let _ = fs::remove_file(backup.with_extension("1.old"));
        let file = open_private(path)?;
        if backup.exists() {
            tighten(&backup)?;
        }
        let size = file
            .metadata()
            .map_err(|source| LogError::Open {
                path: path.to_owned(),
                source,
            })?
            .len();
        Ok(Self {
            path: path.to_owned(),
            backup,
            file: Some(file),
            size,
            max: max_bytes.max(1),
            reports: Reports::new(REPORT_EVERY),
            releasing: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `data`, rotating whenever the current file would pass the cap. The cut is
    /// made after the last newline that fits, so whole lines stay whole unless a single line
    /// is longer than the space left in an empty file.
    pub fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = self.max.saturating_sub(self.size);
            if data.len() as u64 <= room {
                self.append(data);
                return;
            }
            let fits = &data[..room as usize];
            let cut = match fits.iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None if self.size == 0 => fits.len(),
                None => 0,
            };
            self.append(&data[..cut]);
            data = &data[cut..];
            self.rotate();
            if self.file.is_none() {
                // The log cannot be reopened (directory gone, no descriptors, no space):
                // drop the rest rather than retry forever; the next write tries again.
                self.size = 0;
                return;
            }
        }
    }

    fn append(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.file.is_none() {
            self.reopen();
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        match file.write_all(data) {
            Ok(()) => {
                self.size += data.len() as u64;
                if self.reports.recovered() {
                    tracing::info!(log = %self.path.display(), "log writes work again");
                }
            }
            Err(e) => {
                // The bytes are dropped: the child must never block on its log.
                if let Some(n) = self.reports.failed(Instant::now()) {
                    tracing::warn!(log = %self.path.display(), error = %e, "could not write child output; dropping it until writes work again{}", not_logged(n));
                }
                // A partial write leaves the size unknown; re-read it.
                self.size = file.metadata().map(|m| m.len()).unwrap_or(self.max);
            }
        }
    }

    fn rotate(&mut self) {
        self.file = None;
        // Two kernel costs would otherwise land here, on the thread the child's output
        // waits for. Freeing the replaced backup's blocks and pages (20-50 ms for 64 MiB)
        // happens at its last close: holding it open moves that to `release`. And ext4
        // starts writeback of a file renamed *over* another (auto_da_alloc): the old backup
        // is first moved aside, so that the rename replaces nothing, and is put back if the
        // rename fails.
        let aside = self.backup.with_extension("1.old");
        let replaced = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.backup)
            .ok()
            .filter(|_| fs::rename(&self.backup, &aside).is_ok());
        if let Err(e) = fs::rename(&self.path, &self.backup) {
            if replaced.is_some() {
                let _ = fs::rename(&aside, &self.backup);
            }
            // Without the rename the file must still shrink, or the cap would not hold.
            tracing::warn!(log = %self.path.display(), error = %e, "could not rotate log; truncating it instead");
            if let Err(e) = OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.path)
            {
                tracing::warn!(log = %self.path.display(), error = %e, "could not truncate log");
            }
        } else if let Some(old) = replaced {
            let _ = fs::remove_file(&aside);
            self.release(old);
        }
        self.reopen();
    }

    /// Closes the last descriptor of a replaced backup, where the kernel frees it: on a
    /// helper thread when it is large, so the child's output keeps flowing meanwhile. The
    /// previous release is waited for first: at most one replaced backup (≤ max_bytes) is
    /// ever being freed, for the few milliseconds that takes.
    fn release(&mut self, old: File) {
        if let Some(previous) = self.releasing.take() {
            let _ = previous.join();
        }
        if old.metadata().map_or(0, |m| m.len()) < RELEASE_OFF_THREAD {
            return;
        }
        // If no thread can be started, the closure and the file in it are dropped here:
        // freed inline, as without a helper.
        self.releasing = std::thread::Builder::new()
            .name("railgrid-log-free".into())
            .spawn(move || drop(old))
            .ok();
    }

    fn reopen(&mut self) {
        match open_private(&self.path) {
            Ok(file) => {
                self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
                self.file = Some(file);
            }
            Err(e) => {
                if let Some(n) = self.reports.failed(Instant::now()) {
                    tracing::warn!(error = %crate::error_chain(&e), "dropping child output until the log can be opened again{}", not_logged(n));
                }
            }
        }
    }
}

/// Decides which failures of the log's writes are reported: the first of a run of failed
/// writes (and then its recovery), at most once per period; failures inside the period are
/// counted, and the next report says how many were not logged. A failure that lasts past
/// the period is reported then, so a log that stopped working never goes unmentioned.
#[derive(Debug)]
struct Reports {
    every: Duration,
    /// When a failure was last reported.
    last: Option<Instant>,
    /// Failures (runs of failed writes) since the last report, the current one included.
    pending: u64,
    /// Writes fail now.
    failing: bool,
    /// The current failure was reported, so its recovery is too.
    reported: bool,
}

impl Reports {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            pending: 0,
            failing: false,
            reported: false,
        }
    }

    /// A write failed at `now`. `Some(n)` when this is to be reported, `n` being how many
    /// failures before it were not.
    fn failed(&mut self, now: Instant) -> Option<u64> {
        if !self.failing {
            self.failing = true;
            self.reported = false;
            self.pending += 1;
        }
        let quiet = self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < self.every);
        if self.reported || quiet {
            return None;
        }
        self.reported = true;
        self.last = Some(now);
        Some(std::mem::take(&mut self.pending).saturating_sub(1))
    }

    /// A write worked. True when a reported failure ended, which is reported too.
    fn recovered(&mut self) -> bool {
        let report = self.failing && self.reported;
        self.failing = false;
        self.reported = false;
        report
    }
}

/// "; 3 more failures since the last report were not logged", when some were left out.
fn not_logged(n: u64) -> String {
    match n {
        0 => String::new(),
        1 => "; 1 more failure since the last report was not logged".to_owned(),
        n => format!("; {n} more failures since the last report were not logged"),
    }
}

/// `<path>.1`.
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(".1");
    PathBuf::from(name)
}

fn open_private(path: &Path) -> Result<File, LogError> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| {
            // Left by another account (a root quick start, then an ordinary user): say
            // whose it is, not only "Permission denied".
            let (ours, _) = crate::sys::current_ids();
            match fs::symlink_metadata(path) {
                Ok(m) if source.kind() == io::ErrorKind::PermissionDenied && m.uid() != ours => {
                    LogError::NotOurs {
                        path: path.to_owned(),
                        owner: super::account::Account::by_uid(m.uid())
                            .map_or_else(|| format!("uid {}", m.uid()), |a| a.name),
                        uid: m.uid(),
                        ours,
                    }
                }
                _ => LogError::Open {
                    path: path.to_owned(),
                    source,
                },
            }
        })?;
    let meta = regular_file(path, file.metadata())?;
    tighten_open(&file, path, meta.mode())?;
    Ok(file)
}

/// `meta`, of the log at `path`, if it is a regular file's.
fn regular_file(path: &Path, meta: io::Result<fs::Metadata>) -> Result<fs::Metadata, LogError> {
    let meta = meta.map_err(|source| LogError::Open {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(LogError::NotAFile {
            path: path.to_owned(),
        });
    }
    Ok(meta)
}

fn tighten(path: &Path) -> Result<(), LogError> {
    let meta = regular_file(path, fs::symlink_metadata(path))?;
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(|source| {
            LogError::Chmod {
                path: path.to_owned(),
                source,
            }
        })?;
        tracing::warn!(log = %path.display(), was = format!("{:o}", meta.mode() & 0o777), "log file was readable by others; restricted it to 0600");
    }
    Ok(())
}

fn tighten_open(file: &File, path: &Path, mode: u32) -> Result<(), LogError> {
    if mode & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))
            .map_err(|source| LogError::Chmod {
                path: path.to_owned(),
                source,
            })?;
        tracing::warn!(log = %path.display(), was = format!("{:o}", mode & 0o777), "log file was readable by others; restricted it to 0600");
    }
    Ok(())
}

/// Whole lines from a byte stream: the unfinished last line is held back (up to
/// [`LINE_HOLD`]) until its newline arrives or the stream ends, so a read that ends mid-line
/// never makes rotation split that line.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Hands every complete line in `data` (with what was held) to `out`.
    fn feed(&mut self, mut data: &[u8], out: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.partial.extend_from_slice(&data[..=i]);
                    data = &data[i + 1..];
                    self.flush(out);
                }
                None => {
                    self.partial.extend_from_slice(data);
                    if self.partial.len() >= LINE_HOLD {
                        self.flush(out);
                    }
                    return;
                }
            }
        }
        let whole = data.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if whole > 0 {
            out(&data[..whole]);
        }
        let rest = &data[whole..];
        if rest.len() >= LINE_HOLD {
            out(rest);
        } else {
            self.partial.extend_from_slice(rest);
        }
    }

    /// Hands over a held-back partial line.
    fn flush(&mut self, out: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            out(&self.partial);
            self.partial.clear();
        }
    }
}

/// A log shared by the supervisor and its pumps.
pub type SharedLog = Arc<Mutex<CappedLog>>;

/// A running log thread and the supervisor's end of its pipe.
pub struct Pump {
    /// Handed (duplicated) to each child as stdout and stderr.
    pub child_end: OwnedFd,
    /// Closing it wakes the thread out of its wait for the pipe (see [`Pump::finish`]).
    wake: OwnedFd,
    /// Set before `wake` is closed: copy what is in the pipe, then end.
    draining: Arc<AtomicBool>,
    done: tokio::sync::oneshot::Receiver<End>,
}

/// Why a log thread ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Every writer closed the pipe.
    Eof,
    /// Drained on request while some process still held the pipe open.
    Drained,
    /// Reading the pipe failed.
    Failed,
}

impl Pump {
    /// Starts a thread that copies everything written to `child_end` into `log`.
    pub fn start(log: SharedLog) -> Result<Self, LogError> {
        let (reader, child_end) = pipe::pipe().map_err(LogError::Pipe)?;
        pipe::grow(&child_end, PIPE_BYTES);
        pipe::set_nonblocking(&reader).map_err(LogError::Pipe)?;
        let (wake_rx, wake) = pipe::pipe().map_err(LogError::Pipe)?;
        let draining = Arc::new(AtomicBool::new(false));
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let flag = draining.clone();
        std::thread::Builder::new()
            .name("railgrid-log".into())
            .spawn(move || {
                let end = copy(reader, &wake_rx, &flag, &log);
                let _ = done_tx.send(end);
            })
            .map_err(LogError::Thread)?;
        Ok(Self {
            child_end,
            wake,
            draining,
            done,
        })
    }

    /// Copies what is already in the pipe, then ends the thread; waits up to `limit`
    /// for that (a log on a stalled disk). Call it once every process of the children's
    /// groups is gone: what they wrote is then all in the pipe, so nothing they wrote is
    /// lost, and a process that escaped their groups (setsid) and still holds the pipe
    /// cannot hold the stop. What such a process writes afterwards is not logged (its
    /// writes fail with EPIPE once the thread has closed the pipe).
    pub async fn finish(self, limit: Duration) {
        let Self {
            child_end,
            wake,
            draining,
            done,
        } = self;
        drop(child_end);
        draining.store(true, Ordering::Release);
        drop(wake);
        match tokio::time::timeout(limit, done).await {
            Ok(Ok(End::Drained)) => tracing::warn!("a process that left the child's process group still holds its output pipe; what it writes from now on is not logged"),
            Ok(_) => {}
            Err(_) => tracing::warn!(limit = ?limit, "the log thread did not finish copying the child's last output in time; it goes on in the background"),
        }
    }
}

/// The log thread: copies the pipe into the log until every writer is gone, or until a
/// drain is asked for and the pipe is empty. Reads do not block; an empty pipe is waited
/// for with `poll` on the pipe and the wake-up pipe together, so no timer runs.
fn copy(mut reader: File, wake: &File, draining: &AtomicBool, log: &Mutex<CappedLog>) -> End {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut lines = Lines::default();
    let mut write = |bytes: &[u8]| crate::util::lock(log).write(bytes);
    // Set once a drain is asked for: how much more may be taken.
    let mut budget: Option<usize> = None;
    let end = loop {
        if budget.is_none() && draining.load(Ordering::Acquire) {
            budget = Some(DRAIN_MAX);
        }
        match reader.read(&mut buf) {
            Ok(0) => break End::Eof,
            Ok(n) => {
                lines.feed(&buf[..n], &mut write);
                if let Some(left) = budget.as_mut() {
                    *left = left.saturating_sub(n);
                    if *left == 0 {
                        break End::Drained;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if budget.is_some() {
                    break End::Drained;
                }
                match pipe::wait_readable(&reader, wake) {
                    // Woken: a drain was asked for, or the pump was dropped without one
                    // (its wake-up pipe hung up for good), which must end the thread too.
                    Ok(true) => budget = Some(DRAIN_MAX),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not wait for the log pipe; closing the log");
                        break End::Failed;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "log pipe read failed; closing the log");
                break End::Failed;
            }
        }
    };
    lines.flush(&mut write);
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_disk(path: &Path) -> (u64, u64) {
        let main = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let backup = fs::metadata(backup_path(path))
            .map(|m| m.len())
            .unwrap_or(0);
        (main, backup)
    }

    #[tokio::test]
    async fn finish_takes_what_is_in_the_pipe_while_another_process_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        let log = Arc::new(Mutex::new(CappedLog::open(&path, 1024).unwrap()));
        let pump = Pump::start(log).unwrap();
        // Stands for a process that left the child's group with the pipe as its stdout.
        let escapee = File::from(pump.child_end.try_clone().unwrap());
        let mut child = File::from(pump.child_end.try_clone().unwrap());
        child.write_all(b"whole line\npartial").unwrap();
        drop(child);
        pump.finish(Duration::from_secs(60)).await;
        assert_eq!(fs::read(&path).unwrap(), b"whole line\npartial");
        // The thread closed the pipe: it did not wait for the escapee.
        let err = (&escapee).write(b"later").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_pump_dropped_without_finish_ends_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(Mutex::new(
            CappedLog::open(&dir.path().join("child.log"), 1024).unwrap(),
        ));
        let pump = Pump::start(log).unwrap();
        let escapee = File::from(pump.child_end.try_clone().unwrap());
        drop(pump);
        // The thread drains and closes the pipe rather than waking up forever.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match (&escapee).write(b"x") {
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => break,
                _ => assert!(std::time::Instant::now() < deadline, "the pipe stayed open"),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn write_failures_are_reported_at_most_once_per_period_with_a_count() {
        let every = Duration::from_secs(30);
        let mut r = Reports::new(every);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // The first failure is reported, once, however many writes fail.
        assert_eq!(r.failed(at(0)), Some(0));
        assert_eq!(r.failed(at(0)), None);
        assert!(r.recovered(), "the reported failure's end is reported");
        assert!(!r.recovered(), "one recovery per failure");
        // A disk that keeps filling up: 40 failures and recoveries in 3 s, none logged.
        for i in 0..40 {
            assert_eq!(r.failed(at(1) + Duration::from_millis(75 * i)), None);
            assert!(
                !r.recovered(),
                "the end of an unreported failure is not reported"
            );
        }
        // The next failure after the period is reported, with the count of those left out.
        assert_eq!(r.failed(at(31)), Some(40));
        assert!(r.recovered());
        // A failure that began inside the period and lasts is reported once it is over.
        assert_eq!(r.failed(at(40)), None);
        assert_eq!(r.failed(at(60)), None);
        assert_eq!(r.failed(at(61)), Some(0));
        assert_eq!(r.failed(at(62)), None);
        assert!(r.recovered());
    }

    #[test]
    fn rotates_at_line_boundaries_and_never_passes_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        let mut log = CappedLog::open(&path, 100).unwrap();
        for i in 0..50 {
            log.write(format!("line {i:04}\n").as_bytes());
            let (main, backup) = on_disk(&path);
            assert!(main <= 100 && backup <= 100, "{main} {backup}");
        }
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("line 0049\n"));
        assert!(text.lines().all(|l| l.len() == 9), "{text:?}");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "only the log and its backup: {names:?}");
    }

    #[test]
    fn reads_that_end_mid_line_do_not_split_lines_at_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        let mut log = CappedLog::open(&path, 1000).unwrap();
        let mut lines = Lines::default();
        let text: String = (0..500).map(|i| format!("line {i:05}\n")).collect();
        for piece in text.as_bytes().chunks(7) {
            lines.feed(piece, &mut |b| log.write(b));
        }
        lines.flush(&mut |b| log.write(b));
        for p in [path.clone(), backup_path(&path)] {
            let got = fs::read_to_string(&p).unwrap();
            assert!(got.len() <= 1000);
            assert!(got.lines().all(|l| l.len() == 10), "{got:?}");
        }
        assert!(fs::read_to_string(&path).unwrap().ends_with("line 00499\n"));
    }

    #[test]
    fn a_partial_line_is_written_on_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        let mut log = CappedLog::open(&path, 1000).unwrap();
        let mut lines = Lines::default();
        lines.feed(b"done\nPassword: ", &mut |b| log.write(b));
        assert_eq!(fs::read(&path).unwrap(), b"done\n");
        lines.flush(&mut |b| log.write(b));
        assert_eq!(fs::read(&path).unwrap(), b"done\nPassword: ");
    }

    #[test]
    fn a_log_that_cannot_be_reopened_drops_output_instead_of_spinning() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        fs::create_dir(&logs).unwrap();
        let path = logs.join("child.log");
        let mut log = CappedLog::open(&path, 64).unwrap();
        log.write(b"0123456789012345678901234567890123456789012345678901234567\n");
        fs::remove_dir_all(&logs).unwrap();
        // Rotation is due and nothing can be reopened: this must return.
        log.write(b"a line that does not fit in what is left\n");
        log.write(b"and another\n");
        assert!(!path.exists());
    }

    #[test]
    fn a_chunk_larger_than_the_cap_is_split() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        let mut log = CappedLog::open(&path, 64).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        log.write(&data);
        let (main, backup) = on_disk(&path);
        assert!(main <= 64 && backup <= 64);
        assert!(data.ends_with(&fs::read(&path).unwrap()));
    }

    #[test]
    fn creates_0600_and_tightens_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        CappedLog::open(&path, 1024).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        CappedLog::open(&path, 1024).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn refuses_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"").unwrap();
        let link = dir.path().join("child.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            CappedLog::open(&link, 1024),
            Err(LogError::Open { .. })
        ));
    }

    #[test]
    fn appends_across_opens_and_counts_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("child.log");
        CappedLog::open(&path, 20).unwrap().write(b"0123456789\n");
        let mut log = CappedLog::open(&path, 20).unwrap();
        log.write(b"abcdefghij\n");
        assert_eq!(fs::read(backup_path(&path)).unwrap(), b"0123456789\n");
        assert_eq!(fs::read(&path).unwrap(), b"abcdefghij\n");
    }
}
