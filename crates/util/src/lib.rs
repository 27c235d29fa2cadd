//! railgrid's small shared tools, one of each: the clock, text cut by characters or by
//! bytes, a lock that survives a panic, the one way an operator-named file is read
//! (`small_file`), the one I/O error the modules' errors wrap (`file_error`), every
//! environment variable railgrid reads or sets (`env_vars`) and the ones it refuses
//! (`env_policy`), whether the process logs JSON (`log_format`), Prometheus' text format
//! (`metrics_text`) and, for the two HTTP servers, a followed stream as a response body
//! (`stream_body`, feature `http`).

pub mod env_policy;
pub mod env_vars;
pub mod file_error;
pub mod log_format;
pub mod metrics_text;
pub mod small_file;
#[cfg(feature = "http")]
pub mod stream_body;

use railgrid_sys as sys;

use std::fmt::Write;

/// Formats an error and every source under it: "a: b: c".
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let _ = write!(out, ": {e}");
        cur = e.source();
    }
    out
}

/// Longest client-supplied value an error message repeats, in characters.
pub const ECHO_CHARS: usize = 128;

/// Seconds since the Unix epoch (0 before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `s` as an error message may repeat it: at most [`ECHO_CHARS`] characters, and '…' when
/// cut. A value a client sent may be megabytes; the message it gets back (and the log
/// line) must not be.
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    clip_to(s, ECHO_CHARS)
}

/// [`clip`] to `max_chars`.
pub fn clip_to(s: &str, max_chars: usize) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(max_chars) {
        None => s.into(),
        Some((end, _)) => format!("{}…", &s[..end]).into(),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary:
/// for bounds counted in bytes (what a peer stores), where [`clip_to`] counts characters
/// (what a person reads).
pub fn prefix_bytes(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Cuts `s` to [`prefix_bytes`] of `max`, with `…` after it when something was cut.
pub fn cut_bytes(s: &mut String, max: usize) {
    if s.len() > max {
        let end = prefix_bytes(s, max).len();
        s.truncate(end);
        s.push('…');
    }
}

/// A pause that doubles from `first` up to `max` while failures follow each other, and
/// starts over after a success: the one retry rhythm of every loop that waits for a peer
/// (a hub, a database, a runner, a disk).
#[derive(Debug, Clone)]
pub struct Doubling {
    first: std::time::Duration,
    max: std::time::Duration,
    next: std::time::Duration,
}

impl Doubling {
    pub fn new(first: std::time::Duration, max: std::time::Duration) -> Self {
        let first = first.min(max);
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The pause before the next try; the one after it is twice as long, up to `max`.
    pub fn pause(&mut self) -> std::time::Duration {
        let pause = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }

    /// After a success: the next pause is `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Locks `m`, recovering the guard if another thread panicked while holding it. Every
/// mutex in railgrid guards state that stays consistent between statements (a log file
/// handle, a queue, a connection), so a panic elsewhere must not wedge the process.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `s` as one URL path segment or query value: everything but `A-Za-z0-9._-` is
/// percent-encoded, so a value can neither end its segment nor add a parameter.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`lock`] for the read side of an `RwLock`.
pub fn read<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for the write side of an `RwLock`.
pub fn write<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serde helper: a `SystemTime` as whole seconds since the Unix epoch.
pub mod unix_secs {
    use std::time::{SystemTime, UNIX_EPOCH};

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let secs = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        s.serialize_u64(secs)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let secs = u64::deserialize(d)?;
        Ok(UNIX_EPOCH + std::time::Duration::from_secs(secs))
    }
}

/// Replaces `path` atomically with `bytes`: a temporary file in the same directory is
/// written, fsynced and renamed over it, then the directory is fsynced, so a crash leaves
/// either the old or the new file, never a torn one. The directory is opened once and
/// every step goes through that descriptor, so all of them act on the same directory.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let dir = crate::sys::dirfd::Dir::open(parent)?;
    // Unique per call, not only per process: two threads replacing the same file must
    // not write into one temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!(".{name}.tmp.{}.{n}", std::process::id());
    // Left by an earlier process with our pid that died mid-write.
    let _ = dir.remove_file(&tmp);
    let result = (|| {
        let mut f = dir.create_new_file(&tmp, mode)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        dir.rename(&tmp, name)?;
        dir.sync()
    })();
    if result.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    result
}

/// Called once a long-lived command has finished starting (its child is launched): gives
/// back the pages of code that only startup ran (see [`crate::sys::memory`]).
pub fn release_startup_code() {
    match crate::sys::memory::page_out_own_code() {
        Ok(bytes) => tracing::debug!(bytes, "released startup code pages"),
        Err(e) => tracing::debug!(error = %e, "could not release startup code pages"),
    }
}

/// A time in milliseconds since the epoch as RFC 3339 (seconds), or `-` for none.
pub fn rfc3339_ms(ms: Option<u64>) -> String {
    ms.map_or_else(
        || "-".into(),
        |ms| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
            )
            .to_string()
        },
    )
}

/// `argv` as a shell would need it typed: words with spaces or quotes are quoted.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|w| {
            let plain = !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c));
            if plain {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_doubling_pause_is_capped_and_starts_over() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let mut d = Doubling::new(ms(100), ms(500));
        let seen: Vec<Duration> = (0..5).map(|_| d.pause()).collect();
        assert_eq!(seen, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        d.reset();
        assert_eq!(d.pause(), ms(100));
        assert_eq!(Doubling::new(ms(900), ms(500)).pause(), ms(500));
    }

    #[test]
    fn percent_encoding_keeps_a_value_in_its_place() {
        assert_eq!(percent_encode("web-1.a_b"), "web-1.a_b");
        assert_eq!(
            percent_encode("a&limit=1/../x y"),
            "a%26limit%3D1%2F..%2Fx%20y"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
    }

    #[test]
    fn clip_cuts_long_values_on_a_character_boundary() {
        assert_eq!(clip("short"), "short");
        let exact = "é".repeat(ECHO_CHARS);
        assert_eq!(clip(&exact), exact);
        let long = "é".repeat(ECHO_CHARS + 1);
        assert_eq!(clip(&long), format!("{}…", "é".repeat(ECHO_CHARS)));
    }

    #[test]
    fn commands_are_shown_as_they_would_be_typed() {
        let argv: Vec<String> = ["useradd", "--comment", "railgrid runner", "it's", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            shell_words(&argv),
            "useradd --comment 'railgrid runner' 'it'\\''s' x"
        );
    }
}
