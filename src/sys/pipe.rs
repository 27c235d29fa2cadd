//! The pipe that carries a child's output to its log, and a way to wake its reader.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// A close-on-exec pipe: `(read, write)`. Only the ends handed to a child as its stdio
/// survive exec, so no other child inherits a copy that would hold the pipe open.
pub fn pipe() -> io::Result<(File, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    Ok((File::from(r), w))
}

/// Asks for a larger pipe buffer, so a fast writer blocks less often and each read moves
/// more bytes. Best effort: the kernel may cap it (`/proc/sys/fs/pipe-max-size`).
#[cfg(target_os = "linux")]
pub fn grow(fd: &impl AsFd, bytes: usize) {
    let size = i32::try_from(bytes).unwrap_or(i32::MAX);
    let _ = nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETPIPE_SZ(size));
}

#[cfg(not(target_os = "linux"))]
pub fn grow(_fd: &impl AsFd, _bytes: usize) {}

/// Makes reads on `fd` return `WouldBlock` instead of waiting.
pub fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// What woke a [`wait_readable`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The data fd has bytes or reached end of file.
    Data,
    /// The wake fd was written or closed: the reader should give up.
    Woken,
    /// Neither, before the timeout.
    Timeout,
}

/// Blocks until `data` is readable (or at EOF), `wake` becomes readable, or `timeout`
/// passes (`None` waits forever). Event-driven: no busy loop while nothing happens.
pub fn wait_readable(
    data: &impl AsFd,
    wake: &impl AsFd,
    timeout: Option<Duration>,
) -> io::Result<Ready> {
    let timeout = match timeout {
        None => PollTimeout::NONE,
        Some(d) => PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX),
    };
    loop {
        let mut fds = [
            PollFd::new(data.as_fd(), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(0) => return Ok(Ready::Timeout),
            Ok(_) => {
                let any = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
                if fds[1].revents().is_some_and(|r| r.intersects(any)) {
                    return Ok(Ready::Woken);
                }
                return Ok(Ready::Data);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
