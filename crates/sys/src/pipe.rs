//! The pipe that carries a child's output to its log.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::OFlag;

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

/// Makes reads from `fd` return `WouldBlock` instead of waiting, so that the reader can
/// wait with [`wait_readable`] for its data *or* a wake-up.
pub fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg};
    let flags = OFlag::from_bits_truncate(fcntl(fd.as_fd(), FcntlArg::F_GETFL)?);
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Blocks until `data` can be read (data, or end of file) or `wake` becomes readable or
/// hung up (its write end closed). Returns whether `wake` fired. Interrupted waits are
/// retried.
pub fn wait_readable(data: &impl AsFd, wake: &impl AsFd) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    loop {
        let mut fds = [
            PollFd::new(data.as_fd(), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => return Ok(fds[1].revents().is_some_and(|r| !r.is_empty())),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads what is in a non-blocking pipe now: `WouldBlock` when it is empty, `Ok(0)` at end
/// of file. Interrupted reads are retried.
pub fn read_now(fd: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(fd.as_fd(), buf) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
