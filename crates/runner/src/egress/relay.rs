//! A tunnel's bytes, both ways, once its first bytes were checked. Each direction
//! starts through a buffer; one that has carried [`BULK`] (a download, say) moves on
//! inside the kernel on Linux, socket to pipe to socket (splice(2)), so that the rest
//! costs the runner system calls, not two copies of every byte. Short tunnels, most of
//! them, never take the pipe's two descriptors.

use std::io;

use tokio::net::TcpStream;

use crate::sys::splice::shutdown_write;

/// Each direction's buffer in a tunnel, and what one splice moves.
pub(super) const COPY_BUF: usize = 64 * 1024;
/// What a direction carries through its buffer before it asks for a pipe.
#[cfg(target_os = "linux")]
const BULK: u64 = 1024 * 1024;

/// Relays between `client` and `upstream` until both directions have ended (each end
/// is passed on as a half close) or one fails.
pub(super) async fn relay(client: TcpStream, upstream: TcpStream) -> io::Result<()> {
    tokio::try_join!(one_way(&client, &upstream), one_way(&upstream, &client))?;
    Ok(())
}

/// `from`'s bytes into `to` until `from` ends.
async fn one_way(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    // Allocated untouched: a tunnel that carries little keeps little resident.
    let mut buf = vec![0u8; COPY_BUF];
    #[cfg(target_os = "linux")]
    let mut carried = 0u64;
    loop {
        #[cfg(target_os = "linux")]
        if carried >= BULK {
            // No pipe (the open-files limit reached, say): the buffer goes on.
            if let Ok(pipe) = crate::sys::splice::pipe() {
                drop(buf);
                return kernel::one_way(from, to, &pipe).await;
            }
            carried = 0;
        }
        from.readable().await?;
        let n = match from.try_read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => r?,
        };
        if n == 0 {
            // The peer may be gone already: nothing left to tell it.
            let _ = shutdown_write(to);
            return Ok(());
        }
        let mut sent = 0;
        while sent < n {
            to.writable().await?;
            match to.try_write(&buf[sent..n]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                r => sent += r?,
            }
        }
        #[cfg(target_os = "linux")]
        {
            carried += n as u64;
        }
    }
}

#[cfg(target_os = "linux")]
mod kernel {
    use std::io;
    use std::os::fd::OwnedFd;

    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::COPY_BUF;
    use crate::sys::splice::{shutdown_write, splice};

    /// `from`'s bytes into the pipe and out of it into `to`, until `from` ends. The pipe
    /// is empty whenever `from` is read, so a read that would block means `from` has
    /// nothing yet, and at most one pipe's worth is ever held.
    pub(super) async fn one_way(
        from: &TcpStream,
        to: &TcpStream,
        (pipe_out, pipe_in): &(OwnedFd, OwnedFd),
    ) -> io::Result<()> {
        loop {
            let n = from
                .async_io(Interest::READABLE, || splice(from, pipe_in, COPY_BUF))
                .await?;
            if n == 0 {
                let _ = shutdown_write(to);
                return Ok(());
            }
            let mut held = n;
            while held > 0 {
                match to
                    .async_io(Interest::WRITABLE, || splice(pipe_out, to, held))
                    .await?
                {
                    0 => return Err(io::ErrorKind::WriteZero.into()),
                    sent => held -= sent,
                }
            }
        }
    }
}
