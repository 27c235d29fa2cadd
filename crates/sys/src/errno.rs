//! What a failed system call means, so that callers outside `sys` match a kind of failure
//! and never a raw errno (std's `io::ErrorKind` leaves several of these unnamed on stable,
//! or folds them together).

use std::io;

/// The failures callers act on; everything else is [`Failure::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// ENOENT.
    NotFound,
    /// EACCES or EPERM.
    Denied,
    /// ENOEXEC: not a format the kernel can run.
    NotExecutable,
    /// EISDIR.
    IsDirectory,
    /// ENOTDIR: a component that must be a directory is not one.
    NotDirectory,
    /// ELOOP: a symlink where none is followed (`O_NOFOLLOW`, `RESOLVE_NO_SYMLINKS`).
    Symlink,
    /// EXDEV: out of the tree a lookup was confined to (`RESOLVE_BENEATH`).
    Outside,
    /// EEXIST.
    Exists,
    /// ENAMETOOLONG.
    NameTooLong,
    /// ENOSPC (or what std already calls a full storage): a full disk.
    NoSpace,
    Other,
}

/// The kind of `e`.
pub fn failure(e: &io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Failure::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) => Failure::Denied,
        Some(libc::ENOEXEC) => Failure::NotExecutable,
        Some(libc::EISDIR) => Failure::IsDirectory,
        Some(libc::ENOTDIR) => Failure::NotDirectory,
        Some(libc::ELOOP) => Failure::Symlink,
        Some(libc::EXDEV) => Failure::Outside,
        Some(libc::EEXIST) => Failure::Exists,
        Some(libc::ENAMETOOLONG) => Failure::NameTooLong,
        Some(libc::ENOSPC) => Failure::NoSpace,
        _ => match e.kind() {
            io::ErrorKind::NotFound => Failure::NotFound,
            io::ErrorKind::PermissionDenied => Failure::Denied,
            io::ErrorKind::AlreadyExists => Failure::Exists,
            io::ErrorKind::StorageFull => Failure::NoSpace,
            _ => Failure::Other,
        },
    }
}

/// A full disk, however it was said.
pub fn is_no_space(e: &io::Error) -> bool {
    failure(e) == Failure::NoSpace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_and_kinds_both_name_a_failure() {
        let os = |n| io::Error::from_raw_os_error(n);
        assert_eq!(failure(&os(libc::ENOENT)), Failure::NotFound);
        assert_eq!(failure(&os(libc::EPERM)), Failure::Denied);
        assert_eq!(failure(&os(libc::ELOOP)), Failure::Symlink);
        assert_eq!(failure(&os(libc::EXDEV)), Failure::Outside);
        assert_eq!(failure(&os(libc::EIO)), Failure::Other);
        assert!(is_no_space(&os(libc::ENOSPC)));
        assert!(is_no_space(&io::Error::from(io::ErrorKind::StorageFull)));
        let made = io::Error::new(io::ErrorKind::NotFound, "not found in PATH /bin");
        assert_eq!(failure(&made), Failure::NotFound);
        assert!(!is_no_space(&io::Error::other("disk full, says a message")));
    }
}
