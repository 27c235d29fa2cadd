//! Who holds a flock: the kernel's own answer, so a pid written in a lock file can be
//! checked before anything is signalled.

use std::fs::File;
use std::io;

/// Pids that the kernel lists as holding a BSD `flock` on `file`, or `None` where the OS
/// does not say (everywhere but Linux).
#[cfg(target_os = "linux")]
pub fn flock_holders(file: &File) -> io::Result<Option<Vec<i32>>> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    let table = std::fs::read_to_string("/proc/locks")?;
    Ok(Some(holders_in(&table, meta.dev(), meta.ino())))
}

#[cfg(not(target_os = "linux"))]
pub fn flock_holders(_file: &File) -> io::Result<Option<Vec<i32>>> {
    Ok(None)
}

/// [`flock_holders`] for the file at `path`, found by its device and inode without opening
/// it: a reader that may not open the file (0600, another owner) can still tell who holds
/// it, and a reader that never opens it can never take or disturb the lock.
#[cfg(target_os = "linux")]
pub fn flock_holders_at(path: &std::path::Path) -> io::Result<Option<Vec<i32>>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    let table = std::fs::read_to_string("/proc/locks")?;
    Ok(Some(holders_in(&table, meta.dev(), meta.ino())))
}

#[cfg(not(target_os = "linux"))]
pub fn flock_holders_at(_path: &std::path::Path) -> io::Result<Option<Vec<i32>>> {
    Ok(None)
}

/// Parses a /proc/locks table. Lines look like
/// `1: FLOCK  ADVISORY  WRITE 1234 fe:00:10010815 0 EOF`; waiters carry a `->` marker and
/// hold nothing. The device in the table is the superblock's, which on some filesystems
/// (btrfs subvolumes, overlays) differs from `st_dev`, so an inode match on another device
/// is used only when no line matches both.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn holders_in(table: &str, dev: u64, ino: u64) -> Vec<i32> {
    let (want_major, want_minor) = split_dev(dev);
    let mut exact = Vec::new();
    let mut inode_only = Vec::new();
    for line in table.lines() {
        let mut fields = line.split_ascii_whitespace().skip(1).peekable();
        if fields.peek() == Some(&"->") {
            continue;
        }
        let (Some(kind), Some(_mode), Some(_rw), Some(pid), Some(id)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        if kind != "FLOCK" {
            continue;
        }
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        let mut parts = id.split(':');
        let (Some(major), Some(minor), Some(inode)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if inode.parse::<u64>().ok() != Some(ino) {
            continue;
        }
        let major = u64::from_str_radix(major, 16).ok();
        let minor = u64::from_str_radix(minor, 16).ok();
        if major == Some(want_major) && minor == Some(want_minor) {
            exact.push(pid);
        } else {
            inode_only.push(pid);
        }
    }
    if exact.is_empty() {
        inode_only
    } else {
        exact
    }
}

/// glibc's encoding of `dev_t` into major and minor numbers.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
1: FLOCK  ADVISORY  WRITE 2394 fe:00:10010815 0 EOF
1: -> FLOCK  ADVISORY  WRITE 2500 fe:00:10010815 0 EOF
2: POSIX  ADVISORY  WRITE 777 fe:00:10010815 0 EOF
3: FLOCK  ADVISORY  WRITE 3000 08:01:10010815 0 EOF
4: FLOCK  ADVISORY  WRITE 4000 fe:00:42 0 EOF
";

    #[test]
    fn finds_the_holder_and_skips_waiters_and_posix_locks() {
        assert_eq!(holders_in(TABLE, 0xfe00, 10010815), vec![2394]);
    }

    #[test]
    fn falls_back_to_inode_when_no_device_matches() {
        assert_eq!(holders_in(TABLE, 0x0902, 10010815), vec![2394, 3000]);
        assert!(holders_in(TABLE, 0xfe00, 1).is_empty());
    }

    #[test]
    fn splits_devices_like_glibc() {
        assert_eq!(split_dev(0xfe00), (0xfe, 0));
        assert_eq!(split_dev(0x0801), (8, 1));
    }
}
