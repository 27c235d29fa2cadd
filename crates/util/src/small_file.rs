//! Reading the small files an operator names (configs, tokens, keys, certificates, CA
//! bundles): one descriptor, checked before a byte is read.
//!
//! A path an operator typed may name anything: a FIFO (an `open` for reading blocks until
//! a writer comes, and signals are not handled yet at that point), `/dev/zero` (a read
//! that never ends), a file of gigabytes. So every such file is opened without blocking
//! and without becoming a controlling terminal, `fstat`ed through that descriptor (no
//! race with a rename between the check and the read), refused unless it is a regular
//! file, and read up to a bound. The caller's error names the path; the [`io::Error`]
//! here says what was wrong with it.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Tokens and public keys: a line of text.
pub const TOKEN_MAX: u64 = 4 << 10;
/// Private keys, and the hub's small config files.
pub const KEY_MAX: u64 = 64 << 10;
/// Configuration files, certificates and CA bundles.
pub const CONFIG_MAX: u64 = 1 << 20;

/// Why a file that holds a secret is not private to this process's account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposed {
    /// Owned by another account (uid), which could read or replace it.
    Owner(u32),
    /// Open to group or others (its mode).
    Mode(u32),
}

/// The one check of a secret's file: owned by this account or root, and closed to group
/// and others. Each caller says it in its own words (what the secret is, what to run).
pub fn private(meta: &Metadata) -> Result<(), Exposed> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (euid, _) = crate::sys::current_ids();
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(Exposed::Owner(meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Exposed::Mode(mode));
    }
    Ok(())
}

/// An open regular file and what `fstat` said of it.
#[derive(Debug)]
pub struct SmallFile {
    file: File,
    meta: Metadata,
}

impl SmallFile {
    /// Opens `path` for reading; refused (`InvalidInput`) unless it is a regular file.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a regular file ({})", kind_of(&meta)),
            ));
        }
        Ok(Self { file, meta })
    }

    /// What `fstat` said when the file was opened: owner and mode checks use this, so
    /// that what is checked is what is read.
    pub fn meta(&self) -> &Metadata {
        &self.meta
    }

    /// The whole file, refused (`FileTooLarge`) when it holds more than `max` bytes, also
    /// when it grew after it was opened.
    pub fn read(self, max: u64) -> io::Result<Vec<u8>> {
        if self.meta.len() > max {
            return Err(too_large(max));
        }
        let mut bytes = Vec::with_capacity(self.meta.len() as usize);
        self.file.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(too_large(max));
        }
        Ok(bytes)
    }

    /// The whole file as UTF-8 text (`InvalidData` otherwise), at most `max` bytes.
    pub fn read_string(self, max: u64) -> io::Result<String> {
        String::from_utf8(self.read(max)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
    }
}

/// The regular file at `path`, at most `max` bytes.
pub fn read(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    SmallFile::open(path)?.read(max)
}

/// The regular file at `path` as UTF-8 text, at most `max` bytes.
pub fn read_string(path: &Path, max: u64) -> io::Result<String> {
    SmallFile::open(path)?.read_string(max)
}

fn too_large(max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("larger than {max} bytes, more than such a file ever holds"),
    )
}

fn kind_of(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read(&fifo, TOKEN_MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }

    #[test]
    fn devices_and_directories_are_refused() {
        let e = read(Path::new("/dev/zero"), CONFIG_MAX).unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e}");
        let e = read(Path::new("/"), CONFIG_MAX).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    #[test]
    fn a_file_past_the_bound_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![b'x'; 100]).unwrap();
        assert_eq!(read(&path, 100).unwrap().len(), 100);
        let e = read(&path, 99).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_string(&path, 10).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }
}
