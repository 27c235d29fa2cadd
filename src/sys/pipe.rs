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
