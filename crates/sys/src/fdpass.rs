//! One descriptor sent from a sandbox's PID 1 to the runner over a Unix socket pair
//! (`SCM_RIGHTS`): how a socket made inside the job's network namespace reaches the
//! runner, which serves it from the host's.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A close-on-exec `SOCK_SEQPACKET` pair: `(receiving end, sending end)`.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two descriptors into `fds`, which we then own.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors of ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one descriptor's control message, aligned as `cmsghdr` needs.
#[repr(C)]
union Control {
    buf: [u8; 64],
    _align: libc::cmsghdr,
}

/// Sends `fd` (and one byte) through `sock`. Allocates nothing: PID 1 calls it.
///
/// # Safety
/// `sock` and `fd` are open descriptors.
pub(super) unsafe fn send(sock: RawFd, fd: RawFd) -> bool {
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = Control { buf: [0; 64] };
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf.as_mut_ptr().cast();
    msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
    let cmsg = libc::CMSG_FIRSTHDR(&msg);
    (*cmsg).cmsg_level = libc::SOL_SOCKET;
    (*cmsg).cmsg_type = libc::SCM_RIGHTS;
    (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == 1
}

/// The descriptor waiting in `sock`, close-on-exec; an error if none is there yet (the
/// sender has finished by the time the runner asks).
pub fn recv_now(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = Control { buf: [0; 64] };
    // SAFETY: `msg` points at `iov` and `control`, which outlive the call; the kernel
    // writes at most `msg_controllen` bytes of control data, which we read back through
    // the CMSG macros only within it.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of::<Control>() as _;
        let n = libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        );
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if n != 1
            || cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
            || msg.msg_flags & libc::MSG_CTRUNC != 0
        {
            return Err(io::Error::other("no descriptor came with the message"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_descriptor_crosses_the_pair() {
        let (rx, tx) = pair().unwrap();
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: both descriptors are open for the call.
        assert!(unsafe { send(tx.as_raw_fd(), b.as_raw_fd()) });
        drop(b);
        let mut got = std::os::unix::net::UnixStream::from(recv_now(&rx).unwrap());
        got.write_all(b"x").unwrap();
        let mut buf = [0u8];
        a.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"x");
        assert!(recv_now(&rx).is_err(), "a second descriptor out of nothing");
    }
}
