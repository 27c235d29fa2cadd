//! A job's output: each stream copied into its spool file as it is produced, capped, the
//! pipe always drained; a write that fails (a full disk) ends the file there for good.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::Stream;
use crate::sys::dirfd::Dir;

/// Counters of one spooled stream, shared with the API while the job runs.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Bytes on disk.
    pub written: AtomicU64,
    /// Bytes the job produced, kept or not.
    pub produced: AtomicU64,
    pub truncated: AtomicBool,
    /// Why the stream was cut, once it was: the cap, or a spool file that could not be
    /// written.
    pub reason: OnceLock<String>,
    /// Set by [`SpoolStats::drain`]; `drained` wakes the spool task.
    draining: AtomicBool,
    drained: tokio::sync::Notify,
}

impl SpoolStats {
    /// Tells the spool task that every process of the job's group is gone, so what they
    /// wrote is all in the pipe: it takes that and ends, without waiting for the end of
    /// file that a process which left the group (setsid) and holds the pipe would delay.
    /// What such a process writes later is not spooled.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.drained.notify_waiters();
    }

    /// Resolves once [`SpoolStats::drain`] was called, before or during the wait.
    async fn drain_asked(&self) {
        let notified = self.drained.notified();
        tokio::pin!(notified);
        // Registered before the flag is read: a drain between the two is not missed.
        notified.as_mut().enable();
        if self.draining.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Marks the stream cut; the first reason stays.
    fn cut(&self, reason: impl FnOnce() -> String) {
        self.truncated.store(true, Ordering::Relaxed);
        if self.reason.get().is_none() {
            let _ = self.reason.set(reason());
        }
    }
}

/// Why the job's output was cut short, for its record.
pub fn truncation(
    stdout: &SpoolStats,
    stderr: &SpoolStats,
) -> Option<crate::proto::job::Truncation> {
    crate::proto::job::Truncation::of(stdout.reason.get().cloned(), stderr.reason.get().cloned())
}

/// What a failed spool write says in the record: a full disk by that name.
fn spool_failure(what: &str, path: &Path, e: &io::Error) -> String {
    if crate::sys::errno::is_no_space(e) {
        format!("disk full {what} {}: {e}", path.display())
    } else {
        format!("could not write ({what}) {}: {e}", path.display())
    }
}

/// Most a drain takes: more than a pipe holds, so all the dead group wrote is taken.
const DRAIN_MAX: usize = 2 * 1024 * 1024;
/// Most a read takes: what a pipe holds.
const READ: usize = 64 * 1024;

/// Copies a job's stream into its spool file until every writer is gone. Past `cap`
/// bytes are counted and dropped, so a slow reader or a chatty job never blocks: the pipe
/// is always drained. A write that fails (a full disk) ends the file there for good, so it
/// holds a prefix of the output and never one with a hole; `stats.reason` says why.
/// The spool file is created with the first byte: a job that prints nothing costs no
/// inodes (file creation dominates the runner's cost for trivial jobs). Reads are async
/// (no thread per stream); writes go straight to the page cache, which takes microseconds,
/// so they stay on the runtime rather than paying a thread hand-off per chunk.
pub(super) async fn spool(
    mut reader: tokio::net::unix::pipe::Receiver,
    target: &SpoolTarget,
    cap: u64,
    stats: &SpoolStats,
    notify: &(dyn Fn() + Send + Sync),
    mut masker: Option<super::mask::Masker>,
) {
    use tokio::io::AsyncReadExt;
    // A masker reads into a buffer of its own, right after what it holds back.
    let mut buf = vec![0u8; if masker.is_some() { 0 } else { READ }];
    let mut sink = Sink {
        target,
        cap,
        file: None,
        written: 0,
        broken: false,
    };
    // Once a drain is asked for: how much more may be taken, so a process outside the
    // group that writes without pause cannot keep the drain going.
    let mut drain_left: Option<usize> = None;
    loop {
        let space = match masker.as_mut() {
            Some(m) => m.space(READ),
            None => &mut buf[..],
        };
        let n = match drain_left.as_mut() {
            Some(left) => {
                let want = space.len().min(*left);
                // Straight from the pipe, not through the reactor, whose readiness may lag
                // behind what the dead group wrote last. Empty (WouldBlock) or closed: done.
                match crate::sys::pipe::read_now(&reader, &mut space[..want]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        *left -= n;
                        n
                    }
                }
            }
            None => tokio::select! {
                // Cancel-safe: a read that loses the race has taken nothing.
                r = reader.read(space) => match r {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                },
                // Cancel-safe: the flag behind it stays set.
                () = stats.drain_asked() => {
                    drain_left = Some(DRAIN_MAX);
                    continue;
                }
            },
        };
        stats.produced.fetch_add(n as u64, Ordering::Relaxed);
        // Masked before anything is written: a secret never reaches the disk.
        let kept = match masker.as_mut() {
            Some(m) => sink.put(m.masked(n), stats),
            None => sink.put(&buf[..n], stats),
        };
        // Followers only care about bytes they can read.
        if kept > 0 {
            notify();
        }
    }
    if let Some(m) = masker.as_mut() {
        sink.put(m.finish(), stats);
    }
    notify();
}

/// A spool file as output goes into it.
struct Sink<'a> {
    target: &'a SpoolTarget,
    cap: u64,
    file: Option<File>,
    written: u64,
    /// The file could not be created or written: the rest is counted and dropped.
    broken: bool,
}

impl Sink<'_> {
    /// Writes what of `data` the cap leaves room for; how much it kept.
    fn put(&mut self, data: &[u8], stats: &SpoolStats) -> usize {
        let path = &self.target.path;
        let n = data.len();
        let keep = if self.broken {
            0
        } else {
            (self.cap.saturating_sub(self.written) as usize).min(n)
        };
        if keep > 0 && self.file.is_none() {
            match self.target.open() {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not create spool file; dropping output");
                    stats.cut(|| spool_failure("creating", path, &e));
                    self.broken = true;
                }
            }
        }
        let mut kept = 0;
        if let (true, Some(f)) = (keep > 0, self.file.as_mut()) {
            // By hand rather than `write_all`, to count what a failing write left in the
            // file.
            while kept < keep {
                match f.write(&data[kept..keep]) {
                    Ok(0) => {
                        let e = io::Error::from(io::ErrorKind::WriteZero);
                        stats.cut(|| spool_failure("writing", path, &e));
                        self.broken = true;
                        break;
                    }
                    Ok(k) => kept += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "could not write spool file; dropping the rest of the output");
                        stats.cut(|| spool_failure("writing", path, &e));
                        self.broken = true;
                        break;
                    }
                }
            }
            self.written += kept as u64;
            stats.written.store(self.written, Ordering::Relaxed);
            if self.broken {
                self.file = None;
            }
        }
        if kept < n {
            let cap = self.cap;
            stats.cut(|| format!("cap of {cap} bytes reached"));
        }
        kept
    }
}

/// Where one stream is spooled: `<jobs>/<id>/<stream>`, made and opened through the spool
/// root's descriptor (`path` is for messages).
pub(super) struct SpoolTarget {
    pub(super) root: Arc<Dir>,
    pub(super) id: String,
    pub(super) stream: Stream,
    pub(super) path: PathBuf,
}

impl SpoolTarget {
    /// Creates the job's spool dir (0700) and its stream's file (0600, append-only); a
    /// symlink planted at either is refused, never followed.
    fn open(&self) -> io::Result<File> {
        self.root
            .make_child(&self.id, 0o700)?
            .append_file(self.stream.name(), 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobPaths;
    use crate::sys::pipe;
    use std::fs;
    use std::os::fd::OwnedFd;

    fn paths(dir: &Path) -> JobPaths {
        JobPaths::open(dir).unwrap()
    }

    #[tokio::test]
    async fn a_drain_takes_what_is_in_the_pipe_while_another_process_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let paths = paths(dir.path());
        let path = paths.spool_file("j", Stream::Stdout);
        let target = SpoolTarget {
            root: paths.spool.clone(),
            id: "j".into(),
            stream: Stream::Stdout,
            path: path.clone(),
        };
        let (r, w) = pipe::pipe().unwrap();
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(r)).unwrap();
        let stats = Arc::new(SpoolStats::default());
        let st = stats.clone();
        let task = tokio::spawn(async move { spool(rx, &target, 1024, &st, &|| {}, None).await });
        // Stands for a process that left the job's group with the pipe as its stdout.
        let escapee = File::from(w.try_clone().unwrap());
        let mut job = File::from(w);
        job.write_all(b"last words").unwrap();
        drop(job);
        stats.drain();
        tokio::time::timeout(std::time::Duration::from_secs(60), task)
            .await
            .expect("the spool task waited for the escapee")
            .unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"last words");
        assert_eq!(stats.produced.load(Ordering::Relaxed), 10);
        drop(escapee);
    }
}
