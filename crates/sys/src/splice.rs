//! Moving bytes from one socket to another inside the kernel, through a pipe
//! (splice(2)): how an egress tunnel forwards a download without copying it through the
//! runner's memory twice.

use std::io;
use std::os::fd::AsFd;
#[cfg(target_os = "linux")]
use std::os::fd::OwnedFd;

#[cfg(target_os = "linux")]
use nix::fcntl::{OFlag, SpliceFFlags};

/// A pipe that holds a tunnel's bytes between two splices: `(read end, write end)`,
/// neither blocking, neither inherited by a child.
#[cfg(target_os = "linux")]
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?)
}

/// Moves at most `len` bytes from `from` to `to`, one of which must be a pipe; 0 at the
/// end of `from`. `WouldBlock` when `from` has nothing or `to` has no room (both
/// sockets are non-blocking, and the pipe is not waited on).
#[cfg(target_os = "linux")]
pub fn splice(from: &impl AsFd, to: &impl AsFd, len: usize) -> io::Result<usize> {
    let flags = SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK;
    loop {
        match nix::fcntl::splice(from.as_fd(), None, to.as_fd(), None, len, flags) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Ends what is sent on socket `fd` (a half close: the peer reads its end) while what
/// comes from the peer still arrives.
pub fn shutdown_write(fd: &impl AsFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    Ok(nix::sys::socket::shutdown(
        fd.as_fd().as_raw_fd(),
        nix::sys::socket::Shutdown::Write,
    )?)
}
