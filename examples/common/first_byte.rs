//! An `AsyncWrite` that notes when the first byte of a job's output arrives: shared by
//! the job benchmarks.

use std::time::{Duration, Instant};

/// Records when the first byte arrives.
pub(crate) struct FirstByte(pub(crate) Option<Duration>, pub(crate) Instant);

impl tokio::io::AsyncWrite for FirstByte {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.0.is_none() && !buf.is_empty() {
            self.0 = Some(self.1.elapsed());
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
