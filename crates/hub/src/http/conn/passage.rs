//! One request's bytes, lent to hyper: the part already read (its head, perhaps some of
//! its body), then the rest of its body from the connection. Then, while hyper answers,
//! the passage keeps watching the connection: bytes that come are kept for the next
//! request, and the client going away is an end of stream in the middle of a message,
//! on which hyper drops the request's handler as it always did. Once hyper has let go of
//! its answer ([`Signals::answered`]), the passage ends where hyper expects the next
//! request, and hyper closes its side gracefully; the connection itself goes on. So
//! hyper's buffers live for one request, not for a poll held for minutes.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::serve::MAX_BUF_BYTES;

/// Bytes passed on or taken per read, at the most.
const CHUNK: usize = 8 * 1024;

/// What a lent request's handler and its passage tell each other.
#[derive(Default)]
pub(super) struct Signals {
    /// hyper let go of the answer (its body is dropped): the passage ends.
    answered: AtomicBool,
    /// The client went away before the answer.
    gone: AtomicBool,
    /// The passage's reader, woken once the answer is let go of.
    reader: AtomicWaker,
}

impl Signals {
    /// The answer is let go of.
    pub(super) fn answered(&self) {
        self.answered.store(true, Ordering::Release);
        self.reader.wake();
    }

    pub(super) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    fn went(&self) {
        self.gone.store(true, Ordering::Release);
    }
}

pub(super) struct Passage<'a, T> {
    read: Vec<u8>,
    at: usize,
    /// Body bytes still to come from `io`.
    left: u64,
    /// The rest of the connection is hyper's: its end is the connection's.
    whole: bool,
    /// What came after the request while it was served: the next request's start.
    early: Vec<u8>,
    /// hyper flushed after it let go of its answer: every byte of it is out.
    flushed: bool,
    signals: std::sync::Arc<Signals>,
    io: &'a mut T,
}

impl<'a, T> Passage<'a, T> {
    /// `read`: what was read of the request; `left`: how many more bytes belong to it.
    pub(super) fn new(
        read: Vec<u8>,
        left: u64,
        signals: std::sync::Arc<Signals>,
        io: &'a mut T,
    ) -> Self {
        Self {
            read,
            at: 0,
            left,
            whole: false,
            early: Vec::new(),
            flushed: false,
            signals,
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
            early: Vec::new(),
            flushed: false,
            signals: Default::default(),
            io,
        }
    }

    /// Whether hyper took the whole request and the connection may go on: only then
    /// does the next request start where the connection now stands.
    pub(super) fn taken(&self) -> bool {
        self.at == self.read.len() && self.left == 0
    }

    /// What came after the request meanwhile.
    pub(super) fn early(self) -> Vec<u8> {
        self.early
    }
}

impl<T: AsyncRead + Unpin> Passage<'_, T> {
    /// Past the request: watches the connection until hyper has let go of its answer
    /// and flushed it. (An end of stream before that flush is, to hyper, the client
    /// going away in the middle of a message: it would drop what it has not written.)
    fn watch(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.signals.reader.register(cx.waker());
        loop {
            if self.flushed || self.signals.is_gone() {
                return Poll::Ready(Ok(()));
            }
            if self.early.len() >= MAX_BUF_BYTES {
                // Requests sent ahead wait in the socket until this one is answered (a
                // client that pipelines that much is not watched for going away
                // meanwhile).
                return Poll::Pending;
            }
            let mut chunk = [0u8; 1024];
            let mut part = ReadBuf::new(&mut chunk);
            match Pin::new(&mut *self.io).poll_read(cx, &mut part) {
                Poll::Ready(Ok(())) if part.filled().is_empty() => {
                    self.signals.went();
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(())) => self.early.extend_from_slice(part.filled()),
                Poll::Ready(Err(e)) => {
                    self.signals.went();
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Passage<'_, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.at < this.read.len() {
            let n = (this.read.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.read[this.at..this.at + n]);
            this.at += n;
            if this.at == this.read.len() {
                // Given in whole: not kept for the connection's life.
                this.read = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        if this.left == 0 {
            return this.watch(cx);
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
            this.signals.went();
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

    /// hyper flushes once all it has buffered is written: after it let go of its answer,
    /// that is the answer's last byte, and the passage may end.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let answered = this.signals.answered.load(Ordering::Acquire);
        std::task::ready!(Pin::new(&mut *this.io).poll_flush(cx))?;
        if answered && !this.flushed {
            this.flushed = true;
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    /// hyper shuts its stream down when it is done with it: the connection stays open,
    /// unless it is all hyper's.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.whole {
            Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
        } else {
            self.poll_flush(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn hyper_reads_one_request_and_the_next_is_kept_for_its_turn() {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        client.write_all(b"restNEXT REQUEST").await.expect("write");
        let signals = Arc::new(Signals::default());
        let mut p = Passage::new(
            b"HEAD\r\n\r\nbody-".to_vec(),
            4,
            signals.clone(),
            &mut server,
        );
        let mut got = vec![0u8; 17];
        p.read_exact(&mut got).await.expect("read");
        assert_eq!(got, b"HEAD\r\n\r\nbody-rest");
        assert!(p.taken());
        // Past the request: what comes is kept, and the passage ends once the answer is
        // let go of.
        let mut more = [0u8; 8];
        let ended = tokio::time::timeout(Duration::from_millis(100), p.read(&mut more)).await;
        assert!(ended.is_err(), "the passage ended before the answer");
        signals.answered();
        // Not before hyper has flushed what it wrote: the answer's last bytes.
        let ended = tokio::time::timeout(Duration::from_millis(100), p.read(&mut more)).await;
        assert!(
            ended.is_err(),
            "the passage ended before the answer was flushed"
        );
        p.flush().await.expect("flush");
        assert_eq!(p.read(&mut more).await.expect("end"), 0);
        p.shutdown().await.expect("shutdown");
        p.write_all(b"answer").await.expect("write");
        assert!(!signals.is_gone());
        assert_eq!(p.early(), b"NEXT REQUEST");
        // hyper's shutdown left the connection open: what it wrote arrives.
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).await.expect("answer");
        assert_eq!(&answer, b"answer");
    }

    #[tokio::test]
    async fn a_client_that_goes_away_ends_the_passage_before_the_answer() {
        let (client, mut server) = tokio::io::duplex(1024);
        let signals = Arc::new(Signals::default());
        let mut p = Passage::new(b"HEAD\r\n\r\n".to_vec(), 0, signals.clone(), &mut server);
        let mut got = vec![0u8; 8];
        p.read_exact(&mut got).await.expect("head");
        drop(client);
        assert_eq!(p.read(&mut got).await.expect("end"), 0);
        assert!(signals.is_gone());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_and_the_request_is_not_taken() {
        let (client, mut server) = tokio::io::duplex(1024);
        drop(client);
        let mut p = Passage::new(
            b"HEAD\r\n\r\n".to_vec(),
            10,
            Default::default(),
            &mut server,
        );
        let mut got = Vec::new();
        let e = p.read_to_end(&mut got).await.expect_err("cut short");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(!p.taken());
    }

    use std::time::Duration;
}
