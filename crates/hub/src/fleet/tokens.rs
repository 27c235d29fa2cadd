//! Agent tokens that the hub hands out by itself: to a host that enrols with an
//! enrolment token, and to an agent whose token is rotated (docs/hub.md, "Access").
//!
//! Rotation: an agent asked for (by `hub agent rotate`, or past `--agent-token-max-age`)
//! is sent a new token with the answer to a reconcile made with its current one; the
//! hub keeps the new token's hash beside the current one, and takes either, until the
//! agent reconciles with the new one (it has stored it by then): from that moment the
//! old one is refused. An answer lost on the way, or an agent killed before it stored the
//! token, costs nothing: its next reconcile, with the old token, is sent another.

use super::*;
use crate::proto::access::SelfEnrol;
use crate::store::access::{Enrolled, Enrolment};

impl<S: Store> Fleet<S> {
    /// Enrols the host asking with enrolment token `token`; its agent token, and the
    /// enrolment token's id (for the audit log), or why not.
    pub async fn self_enrol(
        &self,
        req: &SelfEnrol,
        token: &str,
        peer: &str,
    ) -> Result<(crate::proto::hub::Enrolled, String), (FleetError, String)> {
        let none = String::from("-");
        check_id(&req.id).map_err(|e| (e, none.clone()))?;
        let secret = token::new_agent_token().map_err(|e| {
            (
                FleetError::BadSetting {
                    field: "token".into(),
                    why: e.to_string(),
                },
                none.clone(),
            )
        })?;
        let hash = token::sha256_hex(&secret);
        let mut host = req.hostname.clone();
        crate::util::cut_bytes(&mut host, 255);
        let e = Enrolment {
            id: req.id.clone(),
            token_sha256: token::sha256_hex(token),
            now_ms: util::unix_now_ms(),
            peer: peer.to_owned(),
            host: host.clone(),
        };
        let _one = self.changes.lock().await;
        let outcome = self
            .store
            .self_enrol(&e, &hash)
            .await
            .map_err(|s| (FleetError::Store(s), none.clone()))?;
        match outcome {
            Enrolled::Done {
                generation,
                via,
                labels,
            } => {
                self.enrolled(&req.id, hash, e.now_ms / 1000, generation, labels);
                crate::metrics::ENROLMENTS.inc();
                tracing::info!(agent = %req.id, enrol_token = %via, %peer, host = %host, "agent enrolled itself");
                self.kick();
                Ok((
                    crate::proto::hub::Enrolled {
                        id: req.id.clone(),
                        token: secret,
                    },
                    via,
                ))
            }
            Enrolled::UnknownToken => Err((FleetError::BadEnrolToken, none)),
            Enrolled::Retired { revoked_ms } => Err((
                FleetError::IdRetired {
                    id: req.id.clone(),
                    at: format!(" {}", describe(revoked_ms, None, None)),
                },
                none,
            )),
            Enrolled::Refused { via, why } => Err((
                FleetError::EnrolRefused {
                    id: via.clone(),
                    why,
                },
                via,
            )),
            Enrolled::Taken {
                enrolled_ms,
                peer: first_peer,
                host: first_host,
            } => Err((
                FleetError::IdTaken {
                    id: req.id.clone(),
                    first: describe(enrolled_ms, first_peer.as_deref(), first_host.as_deref()),
                    this: describe(e.now_ms, Some(peer), Some(&host)),
                },
                none,
            )),
        }
    }

    /// Asks `ids` (every enrolled agent when `None`) for a new token at their next
    /// reconcile; the agents asked.
    pub async fn rotate_tokens(&self, ids: Option<&[String]>) -> Result<Vec<String>, FleetError> {
        if let Some(ids) = ids {
            for id in ids {
                if self.entry(id)?.is_revoked() {
                    return Err(FleetError::Revoked(id.clone()));
                }
            }
        }
        let _one = self.changes.lock().await;
        let asked = self.store.ask_rotation(ids).await?;
        for (id, generation) in &asked {
            self.newest.fetch_max(*generation, Ordering::AcqRel);
            if let Ok(entry) = self.entry(id) {
                {
                    let mut st = util::lock(&entry.state);
                    st.rotate_asked = true;
                    st.own.generation = st.own.generation.max(*generation);
                }
                // Its poll is answered now, with the token.
                self.announce(&entry);
            }
        }
        tracing::info!(
            agents = asked.len(),
            "agent tokens to rotate at their next reconcile"
        );
        Ok(asked.into_iter().map(|(id, _)| id).collect())
    }

    /// Whether `presented` (a token's hash) is the token `entry` is being sent.
    pub fn is_next_token(&self, entry: &AgentEntry, presented: &str) -> bool {
        util::lock(&entry.state).next_token_sha256.as_deref() == Some(presented)
    }

    /// The agent reconciles with `presented` (a token's hash): if it is the token it was
    /// being sent, that token becomes its only one.
    pub async fn promote_if_next(
        &self,
        entry: &AgentEntry,
        presented: &str,
    ) -> Result<(), FleetError> {
        let is_next = util::lock(&entry.state).next_token_sha256.as_deref() == Some(presented);
        if !is_next {
            return Ok(());
        }
        let now = util::unix_now_ms();
        if self.store.promote_token(&entry.id, presented, now).await? {
            tracing::info!(agent = %entry.id, "agent token rotated: the old one is refused from now on");
        }
        let mut st = util::lock(&entry.state);
        if st.next_token_sha256.as_deref() == Some(presented) {
            st.token_sha256 = presented.to_owned();
            st.next_token_sha256 = None;
            st.rotate_asked = false;
            st.token_issued_ms = now;
        }
        Ok(())
    }

    /// A new token for `entry`'s answer, when one is due and the agent reconciled with
    /// its current token (`presented`): kept as its next before it is sent.
    pub(super) async fn token_for_answer(
        &self,
        entry: &AgentEntry,
        presented: &str,
    ) -> Result<Option<String>, FleetError> {
        let due = {
            let st = util::lock(&entry.state);
            let old = self.token_max_age.is_some_and(|age| {
                util::unix_now_ms().saturating_sub(st.token_issued_ms) >= age.as_millis() as u64
            });
            st.token_sha256 == presented && (st.rotate_asked || old)
        };
        if !due {
            return Ok(None);
        }
        let secret = token::new_agent_token().map_err(|e| FleetError::BadSetting {
            field: "token".into(),
            why: e.to_string(),
        })?;
        let hash = token::sha256_hex(&secret);
        self.store.set_next_token(&entry.id, &hash).await?;
        util::lock(&entry.state).next_token_sha256 = Some(hash);
        tracing::info!(agent = %entry.id, "a new agent token goes with this answer");
        Ok(Some(secret))
    }
}

/// When and where from, for a message.
fn describe(at_ms: u64, peer: Option<&str>, host: Option<&str>) -> String {
    let when = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms),
    );
    let mut s = format!("at {when}");
    if let Some(p) = peer.filter(|p| !p.is_empty()) {
        s.push_str(&format!(" from {p}"));
    }
    if let Some(h) = host.filter(|h| !h.is_empty()) {
        s.push_str(&format!(" (host {})", util::clip(h)));
    }
    s
}
