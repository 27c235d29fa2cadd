//! Places for the hub's connections that have not shown a valid token yet (agent or admin).
//!
//! Such a connection costs the hub a TLS session and a read buffer, and anyone may open
//! one: at most [`Places::new`]'s number hold a place at once. A connection that comes when
//! all are taken closes the *oldest* unproven one and takes its place at once (an honest
//! client shows its token within milliseconds of its handshake; one that holds a place for
//! seconds without a token is the one to go). Nobody queues behind a flood. So a flood of clients without a token costs a
//! bounded amount of memory, and an honest client that arrives during it still gets in.
//! A place is given back for good once its connection is proven ([`Place::proven`]), or
//! when the connection closes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::util;

tokio::task_local! {
    /// The place of the connection whose request is being served.
    pub static PLACE: Arc<Place>;
}

/// The request being served showed a valid token: its connection is no longer counted
/// among the unproven ones. Called by every route that checks a token, once it passed.
pub(crate) fn proven() {
    if PLACE.try_with(|p| p.proven()).is_err() {
        tracing::debug!("a token was proven outside any connection's scope");
    }
}
pub(crate) struct Places {
    free: Arc<Semaphore>,
    /// Oldest first; entries of connections proven or closed since are skipped.
    order: Mutex<VecDeque<Weak<Place>>>,
    max: usize,
}

/// One connection's place, while it is unproven.
pub(crate) struct Place {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    evict: Notify,
}

impl Places {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Arc::new(Semaphore::new(max)),
            order: Mutex::new(VecDeque::new()),
            max,
        })
    }

    /// A place for a new connection, taking the oldest unproven connection's when none is
    /// free. `None` once the hub shuts its semaphore (never, today).
    pub(crate) async fn take(&self) -> Option<Arc<Place>> {
        let permit = match self.free.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => match self.evict_oldest() {
                Some(p) => p,
                // Every place is in a handshake that has not registered yet: wait.
                None => self.free.clone().acquire_owned().await.ok()?,
            },
        };
        let place = Arc::new(Place {
            permit: Mutex::new(Some(permit)),
            evict: Notify::new(),
        });
        let mut order = util::lock(&self.order);
        order.push_back(Arc::downgrade(&place));
        if order.len() > 2 * self.max {
            order.retain(|w| w.upgrade().is_some_and(|p| p.is_unproven()));
        }
        Some(place)
    }

    /// Places taken now.
    pub(crate) fn in_use(&self) -> usize {
        self.max - self.free.available_permits()
    }

    /// The oldest unproven connection loses its place, which is returned, and is told to
    /// close.
    fn evict_oldest(&self) -> Option<OwnedSemaphorePermit> {
        let mut order = util::lock(&self.order);
        while let Some(w) = order.pop_front() {
            let Some(place) = w.upgrade() else { continue };
            // Taken under the place's lock: a connection proven meanwhile keeps its
            // place, one evicted is never counted as proven.
            let taken = util::lock(&place.permit).take();
            if taken.is_some() {
                place.evict.notify_one();
                return taken;
            }
        }
        None
    }
}

impl Place {
    /// Its connection showed a valid token: the place is free for good.
    pub(crate) fn proven(&self) {
        util::lock(&self.permit).take();
    }

    fn is_unproven(&self) -> bool {
        util::lock(&self.permit).is_some()
    }

    /// Resolves once a newer connection took this place: the connection must close.
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_newcomer_takes_the_place_of_the_oldest_unproven_connection() {
        let places = Places::new(2);
        let a = places.take().await.expect("a");
        let b = places.take().await.expect("b");
        // Proven: no longer counted, never evicted.
        a.proven();
        let c = places.take().await.expect("c");
        let d = tokio::time::timeout(Duration::from_secs(5), places.take())
            .await
            .expect("d got in")
            .expect("d");
        // b was the oldest unproven one: told to go, and its place is d's.
        tokio::time::timeout(Duration::from_secs(5), b.evicted())
            .await
            .expect("b evicted");
        assert!(!b.is_unproven() && c.is_unproven() && d.is_unproven());
        assert_eq!(places.free.available_permits(), 0);
        drop((c, d));
        assert_eq!(places.free.available_permits(), 2);
    }
}
