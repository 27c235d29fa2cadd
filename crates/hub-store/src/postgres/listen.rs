//! The other hubs' notifications: a task on a connection of its own that `LISTEN`s and
//! turns them into [`Event`]s, and the generations this hub has seen, so that one missed
//! while the connection was down is found.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::tls::Tls;
use super::{CHANNEL, HUBS_LOCK, LISTEN_BACKOFF_MAX, LISTEN_PING, MAINTENANCE_APPLICATION};
use crate::Event;

/// The generations this hub knows about: those it handed out, those in the other hubs'
/// notifications, and all up to the last full load. A number missing below the store's
/// counter for two checks in a row is a change this hub missed.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Every generation up to here is accounted for.
    synced: u64,
    above: BTreeSet<u64>,
    /// The store's counter when a gap was first found.
    gap_at: Option<u64>,
}

impl Seen {
    pub(super) fn add(&mut self, generation: u64) {
        if generation > self.synced {
            self.above.insert(generation);
        }
        self.advance();
    }

    pub(super) fn advance(&mut self) {
        while self.above.remove(&(self.synced + 1)) {
            self.synced += 1;
        }
    }

    /// Everything up to `generation` was loaded.
    pub(super) fn loaded(&mut self, generation: u64) {
        if generation > self.synced {
            self.synced = generation;
            self.above.retain(|g| *g > generation);
            self.advance();
        }
        self.gap_at = None;
    }

    /// Whether nothing up to `newest` (the store's counter) is missing, allowing one
    /// check for notifications in flight.
    pub(super) fn check(&mut self, newest: u64) -> bool {
        self.advance();
        if self.synced >= newest {
            self.gap_at = None;
            return true;
        }
        match self.gap_at {
            Some(g) if self.synced < g => false,
            _ => {
                self.gap_at = Some(newest);
                true
            }
        }
    }
}

/// The task that listens for the other hubs' notifications, on a connection of its own.
pub(super) struct Listener {
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: Tls,
    pub(super) url: String,
    pub(super) origin: String,
    pub(super) tx: mpsc::UnboundedSender<Event>,
    pub(super) seen: Arc<Mutex<Seen>>,
}

impl Listener {
    pub(super) async fn run(self, listening: tokio::sync::oneshot::Sender<()>) {
        let mut listening = Some(listening);
        let mut pause = crate::util::Doubling::new(Duration::from_millis(200), LISTEN_BACKOFF_MAX);
        loop {
            match self.listen(&mut listening, &mut pause).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(database = %self.url, error = %crate::util::error_chain(&e), "lost the hub database's notifications; listening again (everything is loaded again once it is back)");
                }
            }
            tokio::time::sleep(pause.pause()).await;
        }
    }

    /// Listens until the connection fails (`Err`) or the store is gone (`Ok`). The first
    /// time, `listening` is told once LISTEN is in place; every later time, the hub is
    /// told to load everything (what changed meanwhile was announced to nobody).
    async fn listen(
        &self,
        listening: &mut Option<tokio::sync::oneshot::Sender<()>>,
        pause: &mut crate::util::Doubling,
    ) -> Result<(), ListenError> {
        use futures_util::StreamExt;
        let (client, mut connection) = self.config.connect(self.tls.clone()).await?;
        let (ntx, mut nrx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(AsyncMessage::Notification(n)) => {
                        if ntx.send(Ok(n.payload().to_owned())).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = ntx.send(Err(e));
                        return;
                    }
                }
            }
        });
        let _abort = AbortOnDrop(driver);
        // Held for the connection's life, by every hub: `hub store renumber` and `copy` run
        // only when they can take the lock exclusively, so never beside a running hub.
        if self.config.get_application_name() != Some(MAINTENANCE_APPLICATION) {
            client
                .batch_execute(&format!("SELECT pg_advisory_lock_shared({HUBS_LOCK})"))
                .await?;
        }
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        pause.reset();
        match listening.take() {
            Some(tx) => {
                let _ = tx.send(());
            }
            None => {
                if self.tx.send(Event::Resync).is_err() {
                    return Ok(());
                }
            }
        }
        let mut ping = tokio::time::interval(LISTEN_PING);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ping.tick().await;
        loop {
            tokio::select! {
                // Cancel-safe: mpsc::recv loses no message when another arm wins.
                m = nrx.recv() => {
                    let Some(m) = m else {
                        // The connection ended without an error: the server closed it.
                        return Err(ListenError::Silent);
                    };
                    let payload = m?;
                    let Some((generation, event)) = parse(&payload, &self.origin) else {
                        continue;
                    };
                    if generation > 0 {
                        crate::util::lock(&self.seen).add(generation);
                    }
                    if let Some(event) = event {
                        if self.tx.send(event).is_err() {
                            return Ok(());
                        }
                    }
                }
                // A connection whose peer vanished says nothing: a query that must come
                // back proves it is still the one notifications arrive on.
                _ = ping.tick() => {
                    match tokio::time::timeout(LISTEN_PING, client.batch_execute("SELECT 1")).await {
                        Ok(r) => r?,
                        Err(_) => return Err(ListenError::Silent),
                    }
                    if self.tx.is_closed() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error(transparent)]
    Postgres(#[from] tokio_postgres::Error),
    #[error("the listening connection went silent")]
    Silent,
}

pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The generation a notification names, and its event unless this hub sent it.
pub(super) fn parse(payload: &str, own: &str) -> Option<(u64, Option<Event>)> {
    let mut parts = payload.splitn(4, ' ');
    let (origin, kind) = (parts.next()?, parts.next()?);
    let generation = parts.next()?.parse().ok()?;
    let key = parts.next().unwrap_or("");
    if origin == own {
        return Some((generation, None));
    }
    let event = match kind {
        "a" => Event::Agent(key.to_owned()),
        "f" => Event::Fleet,
        "o" => Event::Output(key.to_owned()),
        "q" => Event::Queued(key.to_owned()),
        "t" => Event::Tokens,
        _ => return None,
    };
    Some((generation, Some(event)))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn notifications_name_their_change_and_skip_our_own() {
        assert_eq!(
            parse("ab a 7 web-1", "cd"),
            Some((7, Some(Event::Agent("web-1".into()))))
        );
        assert_eq!(parse("ab f 8 ", "cd"), Some((8, Some(Event::Fleet))));
        assert_eq!(
            parse("ab o 0 j1", "cd"),
            Some((0, Some(Event::Output("j1".into()))))
        );
        assert_eq!(
            parse("ab q 0 j2", "cd"),
            Some((0, Some(Event::Queued("j2".into()))))
        );
        assert_eq!(parse("cd a 9 web-1", "cd"), Some((9, None)));
        assert_eq!(parse("ab z 1 x", "cd"), None);
        assert_eq!(parse("ab a x web-1", "cd"), None);
        assert_eq!(parse("", "cd"), None);
    }

    #[test]
    fn a_missed_generation_is_found_after_one_more_check() {
        let mut seen = Seen::default();
        seen.loaded(10);
        seen.add(12);
        seen.add(11);
        assert!(seen.check(12), "all seen");
        seen.add(14);
        // 13 may be a notification in flight: one check of grace.
        assert!(seen.check(14));
        assert!(!seen.check(14), "13 never came");
        seen.loaded(14);
        assert!(seen.check(14));
        assert_eq!(seen.synced, 14);
    }
}
