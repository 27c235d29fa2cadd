//! Ctrl-C while a client follows a job it submitted: the first cancels the job, a second
//! detaches and leaves it to its cancellation.

use std::future::Future;

use anyhow::Context;

/// What `submit` exits with when a second Ctrl-C detaches it: 128 + SIGINT, as a shell
/// reports a command interrupted from the terminal.
pub(super) const DETACHED: u8 = 130;

/// SIGINT and SIGTERM to the client, while it follows a job it submitted.
pub(super) struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    pub(super) fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("could not handle SIGINT")?,
            term: signal(SignalKind::terminate()).context("could not handle SIGTERM")?,
        })
    }

    /// The next one, by the name a user knows it by.
    pub(super) async fn next(&mut self) -> &'static str {
        tokio::select! {
            // Cancel-safe (both arms): `recv` on a signal stream loses nothing.
            _ = self.int.recv() => "Ctrl-C",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

/// Runs `follow` (the job's output streamed until it is done) to its end and returns what
/// it gave; `None` when the user detached. The first interrupt cancels job `id` (`how`
/// says by which path); a second detaches, naming `detach`, the command that follows it.
pub(super) async fn follow_or_cancel<T, C, F, R>(
    signals: &mut Interrupts,
    follow: impl Future<Output = anyhow::Result<T>>,
    id: &str,
    how: &str,
    detach: &str,
    cancel: C,
) -> anyhow::Result<Option<T>>
where
    C: Fn() -> F,
    F: Future<Output = anyhow::Result<R>>,
{
    tokio::pin!(follow);
    let mut cancelling = false;
    loop {
        tokio::select! {
            // Cancel-safe: the future is pinned outside the loop and polled by reference.
            done = &mut follow => return done.map(Some),
            // Cancel-safe: the signal streams buffer deliveries.
            sig = signals.next() => {
                if cancelling {
                    eprintln!("railgrid: {sig}: detached from job {id}, which is being cancelled; follow it with: {detach}");
                    return Ok(None);
                }
                cancelling = true;
                eprintln!("railgrid: {sig}: cancelling job {id} {how}; {sig} again to detach");
                cancel().await?;
            }
        }
    }
}
