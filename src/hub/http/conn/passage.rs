//! One request's bytes, lent to hyper: the part already read (its head, perhaps some of
//! its body), then the rest of its body from the connection, then the end of the stream.
//! hyper answers it and sees the connection end; the connection itself goes on, for the
//! next request. So hyper's buffers live for one request, not for a poll held for minutes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes of the body passed on per read, at the most.
const CHUNK: usize = 8 * 1024;

pub(super) struct Passage<'a, T> {
    read: Vec<u8>,
    at: usize,
    /// Body bytes still to come from `io`.
    left: u64,
    /// The rest of the connection is hyper's: its end is the connection's.
    whole: bool,
    io: &'a mut T,
}

impl<'a, T> Passage<'a, T> {
    /// `read`: what was read of the request; `left`: how many more bytes belong to it.
    pub(super) fn new(read: Vec<u8>, left: u64, io: &'a mut T) -> Self {
        Self {
            read,
            at: 0,
            left,
            whole: false,
            io,
        }
    }

    /// The rest of the connection, for hyper alone: `read` and all that follows.
    pub(super) fn rest(read: Vec<u8>, io: &'a mut T) -> Self {
        Self {
            read,
            at: 0,
            left: u64::MAX,
            whole: true,
            io,
        }
    }

    /// Whether hyper took the whole request: only then does the next one start where
    /// the connection now stands.
    pub(super) fn taken(&self) -> bool {
        self.at == self.read.len() && self.left == 0
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Passage<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        if this.left == 0 {
            // The end of this request is the end of hyper's stream.
            return Poll::Ready(Ok(()));
        }
        let want = usize::try_from(this.left)
            .unwrap_or(usize::MAX)
            .min(buf.remaining())
            .min(CHUNK);
        let mut chunk = [0u8; CHUNK];
        let mut part = ReadBuf::new(&mut chunk[..want]);
        std::task::ready!(Pin::new(&mut *this.io).poll_read(cx, &mut part))?;
        let got = part.filled();
        if got.is_empty() && !this.whole {
            return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
        }
        if !this.whole {
            this.left -= got.len() as u64;
        }
        buf.put_slice(got);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Passage<'_, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write(cx, data)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }

    /// hyper shuts its stream down when it is done with it: the connection stays open,
    /// unless it is all hyper's.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.whole {
            Pin::new(&mut *this.io).poll_shutdown(cx)
        } else {
            Pin::new(&mut *this.io).poll_flush(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn hyper_reads_one_request_and_no_byte_of_the_next() {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(b"restNEXT REQUEST").await.expect("write");
        let mut p = Passage::new(b"HEAD\r\n\r\nbody-".to_vec(), 4, &mut server);
        let mut got = Vec::new();
        p.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"HEAD\r\n\r\nbody-rest");
        assert!(p.taken());
        p.shutdown().await.expect("shutdown");
        p.write_all(b"answer").await.expect("write");
        drop(p);
        let mut next = [0u8; 12];
        server.read_exact(&mut next).await.expect("next");
        assert_eq!(&next, b"NEXT REQUEST");
        // hyper's shutdown left the connection open: what it wrote arrives.
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).await.expect("answer");
        assert_eq!(&answer, b"answer");
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_the_request_is_not_taken() {
        let (client, mut server) = tokio::io::duplex(1024);
        drop(client);
        let mut p = Passage::new(b"HEAD\r\n\r\n".to_vec(), 10, &mut server);
        let mut got = Vec::new();
        let e = p.read_to_end(&mut got).await.expect_err("cut short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(!p.taken());
    }
}
