//! Rollouts (docs/hub.md, "Rollouts"; docs/design.md, invariant 20): a version taken by
//! the matching agents wave by wave. The operator's side (start, status, pause, resume,
//! abort) works through any replica, in the store; the driving is done by one hub at a
//! time.
//!
//! Task: [`Roller`], one per hub. Every [`TICK`], and at once when an agent reports a
//! change of version or upgrade state, it takes (or renews) the rollout lease in the
//! store; the hub that holds it steps each rollout that is not over ([`step`]) from the
//! stored rows and the agents' reports, stores the step (only if the lease is still its
//! own and nobody moved the rollout meanwhile) and then puts the versions it decided in
//! the agents' own desired settings, each a desired change like any other (stored,
//! generation, poll woken). A hub that dies holding the lease is replaced by another
//! within [`LEASE`]; a member given the version is given it again by whoever drives next
//! if the change did not happen, so a crash between the two writes loses nothing.

mod plan;
mod step;
mod view;

use std::sync::Arc;
use std::time::Duration;

use super::{Fleet, FleetError, MUST_RESET};
use crate::proto::hub::{DesiredChange, DesiredSettings};
use crate::proto::rollout::{
    RolloutRequest, RolloutView, ABORTED, ACTIVE, DEFAULT_MAX_PARALLEL, DEFAULT_WAVES, FAILED,
    HALTED, PAUSED, ROLLING_BACK, RUNNING, STOPPED,
};
use crate::proto::selector::Selector;
use crate::store::rollouts::{
    Fetch, MemberRow, Progress, Recorded, RolloutRow, StateMove, ROLLOUT_LEASE,
};
use crate::store::Store;
use crate::util;

use self::step::{Act, Facts, Seen};

/// How often rollouts are stepped without a reason.
const TICK: Duration = Duration::from_secs(1);
/// How long the lease lasts unrenewed: a hub that stops renewing it is replaced after.
const LEASE: Duration = Duration::from_secs(10);
/// The least time between two passes.
const MIN_GAP: Duration = Duration::from_millis(200);
/// With replicas, how often a pass takes in the reports other hubs wrote.
const ADOPT_EVERY: Duration = Duration::from_secs(2);
/// The most agents upgrading at once a rollout may ask for.
const MAX_PARALLEL: usize = 10_000;
/// The longest soak and deadline.
const MAX_SECS: u64 = 366 * 24 * 3600;
/// The rollouts a listing shows, newest last.
const LISTED: usize = 50;

impl<S: Store> Fleet<S> {
    /// Starts a rollout of `req.version` over the agents `req.selector` matches now.
    pub async fn start_rollout(&self, req: &RolloutRequest) -> Result<RolloutView, FleetError> {
        let bad = |field: &str, why: String| FleetError::BadSetting {
            field: field.into(),
            why,
        };
        let version = req.version.as_str();
        if !crate::proto::desired::is_version(version) {
            return Err(bad("version", format!("{version:?} is not a version")));
        }
        let waves = req.waves.as_deref().unwrap_or(DEFAULT_WAVES);
        let reaches = plan::parse_waves(waves).map_err(|e| bad("waves", e))?;
        let max_parallel = req.max_parallel.unwrap_or(DEFAULT_MAX_PARALLEL);
        if !(1..=MAX_PARALLEL).contains(&max_parallel) {
            return Err(bad(
                "max_parallel",
                format!("{max_parallel} is not within 1 to {MAX_PARALLEL}"),
            ));
        }
        for (field, secs) in [
            ("soak_secs", Some(req.soak_secs)),
            ("deadline_secs", req.deadline_secs),
        ] {
            if secs.is_some_and(|s| s > MAX_SECS) {
                return Err(bad(field, "more than a year".into()));
            }
        }
        if req.deadline_secs == Some(0) {
            return Err(bad("deadline_secs", "0 would end it at once".into()));
        }
        let selector = req
            .selector
            .as_deref()
            .map(|s| Selector::parse(s).map_err(|e| bad("selector", e.to_string())))
            .transpose()?;
        if req.max_failures > MAX_PARALLEL {
            return Err(bad(
                "max_failures",
                format!("{} is more than {MAX_PARALLEL}", req.max_failures),
            ));
        }
        // What each agent runs now (its version to go back to), from every replica.
        self.adopt_reports().await?;
        let selection = self.selection(selector.as_ref());
        if selection.is_empty() {
            return Err(bad(
                "selector",
                match &selector {
                    Some(s) => format!("no agent matches {s}"),
                    None => "there is no agent to roll out to".into(),
                },
            ));
        }
        {
            let r = util::read(&self.releases);
            if !r.has_version(version) {
                return Err(FleetError::NoSuchRelease(version.to_owned()));
            }
            if let Some(why) = r.halt_of(version) {
                return Err(FleetError::Halted {
                    version: version.to_owned(),
                    why,
                });
            }
        }
        self.check_platforms(version, &selection)?;
        let members = step::members_of(selection, |n| plan::wave_sizes(&reaches, n));
        let now = util::unix_now_ms();
        let row = RolloutRow {
            version: version.to_owned(),
            selector: selector.as_ref().map(|s| s.to_string()),
            waves: waves.to_owned(),
            soak_ms: req.soak_secs.saturating_mul(1000),
            max_parallel,
            max_failures: req.max_failures,
            deadline_ms: req
                .deadline_secs
                .map(|s| now.saturating_add(s.saturating_mul(1000))),
            state: RUNNING.into(),
            created_ms: now,
            ..RolloutRow::default()
        };
        let row = self
            .store
            .insert_rollout(&row, &members)
            .await?
            .map_err(FleetError::RolloutClash)?;
        tracing::info!(rollout = %row.id, %version, members = members.len(), waves = %waves, "rollout started");
        self.rollout_kick.notify_one();
        Ok(self.view_rollout(&row, &members, true))
    }

    /// The agents a rollout over `selector` takes, each with its labels in force and the
    /// version it reports.
    fn selection(
        &self,
        selector: Option<&Selector>,
    ) -> Vec<(String, crate::proto::labels::Labels, Option<String>)> {
        self.agents
            .all()
            .into_iter()
            .filter(|e| !e.is_revoked())
            .filter_map(|e| {
                let st = util::lock(&e.state);
                let labels = st.labels();
                if selector.is_some_and(|s| !s.matches(&labels)) {
                    return None;
                }
                let version = st.report.as_ref().map(|r| r.version.clone());
                Some((e.id.clone(), labels, version))
            })
            .collect()
    }

    /// Refuses a rollout some of whose agents have no artifact of `version` for their
    /// platform (those that never reported one cannot be told apart, and are let be).
    fn check_platforms(
        &self,
        version: &str,
        selection: &[(String, crate::proto::labels::Labels, Option<String>)],
    ) -> Result<(), FleetError> {
        // Each agent's platform first, then the releases: an agent's state is never
        // waited for with the releases held (the lock order, docs/design.md).
        let platforms: Vec<(&str, String, String)> = selection
            .iter()
            .filter_map(|(id, _, _)| {
                let entry = self.entry(id).ok()?;
                let st = util::lock(&entry.state);
                let r = st.report.as_ref()?;
                Some((id.as_str(), r.os.clone(), r.arch.clone()))
            })
            .collect();
        let releases = util::read(&self.releases);
        let mut missing: Vec<String> = platforms
            .into_iter()
            .filter(|(_, os, arch)| releases.get(version, os, arch).is_none())
            .map(|(id, os, arch)| format!("{id} ({os}-{arch})"))
            .collect();
        drop(releases);
        if missing.is_empty() {
            return Ok(());
        }
        let more = missing.len().saturating_sub(5);
        missing.truncate(5);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Err(FleetError::NotForPlatform {
            version: version.to_owned(),
            agents: format!("{}{more}", missing.join(", ")),
        })
    }

    /// Bytes of a release's artifact served to an agent: kept as evidence of its fetch
    /// (a failure is logged; the agent's commit then goes uncounted, never counted wrongly).
    pub async fn record_fetch(&self, f: Fetch) {
        if let Err(e) = self.store.record_fetch(&f).await {
            tracing::error!(error = %util::error_chain(&e), agent = %f.agent, version = %f.version, "could not record that an agent fetched a release");
        }
    }

    /// What is seen of each member's agent now, with when each was last served
    /// `version`'s artifact to its last byte.
    async fn seen_with_fetches(
        &self,
        version: &str,
        members: &[MemberRow],
    ) -> Result<Vec<Seen>, FleetError> {
        let fetched: std::collections::HashMap<String, u64> =
            self.store.fetches(version).await?.into_iter().collect();
        let mut seen = self.seen(members);
        for (s, m) in seen.iter_mut().zip(members) {
            s.fetched_ms = fetched.get(&m.agent).copied();
        }
        Ok(seen)
    }

    /// What is seen of each member's agent now.
    fn seen(&self, members: &[MemberRow]) -> Vec<Seen> {
        let now = util::unix_now_ms();
        members
            .iter()
            .map(|m| {
                let Ok(entry) = self.entry(&m.agent) else {
                    return Seen::default();
                };
                let st = util::lock(&entry.state);
                let connected = self.connected(&entry, st.last_seen);
                let away_ms = match (connected, st.last_seen) {
                    (true, _) => 0,
                    (false, Some(t)) => now.saturating_sub(t.saturating_mul(1000)),
                    (false, None) => u64::MAX,
                };
                Seen {
                    known: !entry.is_revoked(),
                    connected,
                    version: st.report.as_ref().map(|r| r.version.clone()),
                    upgrade: st.report.as_ref().and_then(|r| r.upgrade.clone()),
                    own_version: st.own.settings.version.clone(),
                    fresh: st.observed_generation != MUST_RESET
                        && st.observed_generation >= st.own.generation,
                    away_ms,
                    fetched_ms: None,
                }
            })
            .collect()
    }

    fn view_rollout(&self, r: &RolloutRow, members: &[MemberRow], detailed: bool) -> RolloutView {
        view::build(
            r,
            members,
            &self.seen(members),
            detailed,
            util::unix_now_ms(),
        )
    }

    /// One rollout, member by member.
    pub async fn rollout(&self, id: &str) -> Result<RolloutView, FleetError> {
        self.adopt_reports().await?;
        let (r, members) = self
            .store
            .get_rollout(id)
            .await?
            .ok_or_else(|| FleetError::NoSuchRollout(id.to_owned()))?;
        Ok(self.view_rollout(&r, &members, true))
    }

    /// The latest rollouts, oldest first, with their counts.
    pub async fn rollouts(&self) -> Result<Vec<RolloutView>, FleetError> {
        self.adopt_reports().await?;
        let rows = self.store.list_rollouts(false).await?;
        let skip = rows.len().saturating_sub(LISTED);
        let mut out = Vec::new();
        for row in rows.into_iter().skip(skip) {
            if let Some((r, members)) = self.store.get_rollout(&row.id).await? {
                out.push(self.view_rollout(&r, &members, false));
            }
        }
        Ok(out)
    }

    /// Moves rollout `id` from one of `from` to `to`, or says why it cannot.
    async fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        to: &str,
        reason: Option<String>,
        failures_accepted: Option<usize>,
        verb: &str,
    ) -> Result<RolloutView, FleetError> {
        let m = StateMove {
            to: to.to_owned(),
            reason,
            now_ms: util::unix_now_ms(),
            failures_accepted,
        };
        match self.store.move_rollout(id, from, &m).await? {
            Some(_) => {
                tracing::info!(rollout = %id, state = %to, "rollout {verb}");
                self.rollout_kick.notify_one();
                self.rollout(id).await
            }
            None => {
                let (r, _) = self
                    .store
                    .get_rollout(id)
                    .await?
                    .ok_or_else(|| FleetError::NoSuchRollout(id.to_owned()))?;
                Err(FleetError::RolloutState {
                    id: id.to_owned(),
                    state: r.state,
                    why: format!("it cannot be {verb} now"),
                })
            }
        }
    }

    /// Gives no member the version until resumed (those under way go on).
    pub async fn pause_rollout(&self, id: &str) -> Result<RolloutView, FleetError> {
        self.move_rollout(
            id,
            &[RUNNING],
            PAUSED,
            Some("paused by the operator".into()),
            None,
            "paused",
        )
        .await
    }

    /// Goes on with a paused, halted or stopped rollout.
    pub async fn resume_rollout(&self, id: &str) -> Result<RolloutView, FleetError> {
        let (r, members) = self
            .store
            .get_rollout(id)
            .await?
            .ok_or_else(|| FleetError::NoSuchRollout(id.to_owned()))?;
        if r.state == HALTED {
            if let Some(why) = util::read(&self.releases).halt_of(&r.version) {
                return Err(FleetError::RolloutState {
                    id: id.to_owned(),
                    state: r.state,
                    why: format!(
                        "its version is still halted ({why}): lift the halt with `railgrid hub release resume {}` first, or abort it",
                        r.version
                    ),
                });
            }
        }
        if !step::is_resumable(&r.state) {
            return Err(FleetError::RolloutState {
                id: id.to_owned(),
                state: r.state,
                why: "only a paused, halted or stopped rollout is resumed".into(),
            });
        }
        // A stopped rollout goes on with the failures so far taken on.
        let accepted =
            (r.state == STOPPED).then(|| members.iter().filter(|m| m.state == FAILED).count());
        self.move_rollout(
            id,
            &[PAUSED, HALTED, STOPPED],
            RUNNING,
            None,
            accepted,
            "resumed",
        )
        .await
    }

    /// Ends a rollout where it is; with `rollback`, first takes the members that
    /// committed back to what each ran before.
    pub async fn abort_rollout(&self, id: &str, rollback: bool) -> Result<RolloutView, FleetError> {
        if rollback {
            let from = [RUNNING, PAUSED, HALTED, STOPPED];
            let why = Some("aborted by the operator, taking back what committed".into());
            return self
                .move_rollout(id, &from, ROLLING_BACK, why, None, "aborted")
                .await;
        }
        let why = Some("aborted by the operator".into());
        self.move_rollout(id, ACTIVE, ABORTED, why, None, "aborted")
            .await
    }

    /// One pass of the driver as `holder`: whether it holds the lease (`None`: no
    /// rollout to drive, no lease taken).
    async fn drive(&self, holder: &str, adopt: bool) -> Result<Option<bool>, FleetError> {
        let active = self.store.list_rollouts(true).await?;
        if active.is_empty() {
            return Ok(None);
        }
        let now = util::unix_now_ms();
        let until = now + LEASE.as_millis() as u64;
        if !self
            .store
            .take_lease(ROLLOUT_LEASE, holder, now, until)
            .await?
        {
            return Ok(Some(false));
        }
        // With replicas, an agent's report may have reached another hub.
        if adopt {
            self.adopt_reports().await?;
        }
        let several = active.len() > 1;
        for row in active {
            let Some((r, members)) = self.store.get_rollout(&row.id).await? else {
                continue;
            };
            if !self
                .step_rollout(holder, until, &r, &members, several)
                .await?
            {
                return Ok(Some(false));
            }
        }
        Ok(Some(true))
    }

    /// One step of `r`: false when the lease was lost.
    async fn step_rollout(
        &self,
        holder: &str,
        until: u64,
        r: &RolloutRow,
        members: &[MemberRow],
        other_active: bool,
    ) -> Result<bool, FleetError> {
        let seen = self.seen_with_fetches(&r.version, members).await?;
        let facts = Facts {
            now_ms: util::unix_now_ms(),
            halted: util::read(&self.releases).halt_of(&r.version),
            fleet_version: self.fleet_scope().settings.version,
            other_active,
        };
        let s = step::step(r, members, &seen, &facts);
        for agent in &s.unproven {
            unproven_claim(&r.id, &r.version, agent);
        }
        let unchanged = s.members.is_empty()
            && s.moved.is_none()
            && s.wave == r.wave
            && s.last_commit_ms == r.last_commit_ms;
        if unchanged {
            self.act_all(&r.id, &s.after).await;
            return Ok(true);
        }
        // A final state is the last word: what it leaves behind is done first, and
        // only while the rollout is as read and this hub still drives (each act is
        // idempotent, so a crash before the state is stored repeats them harmlessly).
        if !s.before.is_empty() {
            let now = util::unix_now_ms();
            let ours = self
                .store
                .take_lease(ROLLOUT_LEASE, holder, now, until)
                .await?;
            let same = self.store.get_rollout(&r.id).await?.map(|(x, _)| x.state);
            if !ours || same.as_deref() != Some(r.state.as_str()) {
                return Ok(ours);
            }
            for a in &s.before {
                self.act(a).await?;
            }
        }
        let progress = Progress {
            id: r.id.clone(),
            state: r.state.clone(),
            wave: s.wave,
            last_commit_ms: s.last_commit_ms,
            members: s.members.clone(),
            moved: s.moved.as_ref().map(|(to, reason)| StateMove {
                to: to.clone(),
                reason: reason.clone(),
                now_ms: facts.now_ms,
                failures_accepted: None,
            }),
        };
        match self.store.record_rollout(holder, until, &progress).await? {
            Recorded::LeaseLost => return Ok(false),
            // An operator moved it meanwhile: the next step starts from that.
            Recorded::Moved => return Ok(true),
            Recorded::Written => {}
        }
        for m in &s.members {
            tracing::info!(rollout = %r.id, agent = %m.agent, state = %m.state, error = m.error.as_deref().unwrap_or(""), "rollout member");
        }
        if s.wave != r.wave {
            tracing::info!(rollout = %r.id, wave = s.wave + 1, "rollout wave started");
        }
        if let Some((to, reason)) = &s.moved {
            tracing::warn!(rollout = %r.id, version = %r.version, state = %to, reason = reason.as_deref().unwrap_or(""), "rollout moved");
        }
        self.act_all(&r.id, &s.after).await;
        Ok(true)
    }

    /// Acts on each of `acts`; a failure is logged (the next step acts again).
    async fn act_all(&self, id: &str, acts: &[Act]) {
        for a in acts {
            if let Err(e) = self.act(a).await {
                tracing::warn!(rollout = %id, error = %util::error_chain(&e), "a rollout's desired change failed (tried again at the next step)");
            }
        }
    }

    async fn act(&self, a: &Act) -> Result<(), FleetError> {
        let (agent, change) = match a {
            Act::Give {
                agent,
                version,
                rollback,
            } => (
                Some(agent.as_str()),
                DesiredChange {
                    set: DesiredSettings {
                        version: Some(version.clone()),
                        rollback: rollback.then_some(true),
                        ..DesiredSettings::default()
                    },
                    clear: if *rollback {
                        Vec::new()
                    } else {
                        vec!["rollback".into()]
                    },
                },
            ),
            Act::FleetVersion(version) => (
                None,
                DesiredChange {
                    set: DesiredSettings {
                        version: Some(version.clone()),
                        ..DesiredSettings::default()
                    },
                    clear: Vec::new(),
                },
            ),
            Act::Clear(agent) => (
                Some(agent.as_str()),
                DesiredChange {
                    set: DesiredSettings::default(),
                    clear: vec!["version".into(), "rollback".into()],
                },
            ),
        };
        match self.change(agent, &change).await {
            // Gone since: nothing to give it.
            Err(FleetError::NoSuchAgent(_)) => Ok(()),
            r => r.map(drop),
        }
    }
}

/// Drives the rollouts while this hub holds their lease; a handle that stops the task.
/// When each agent's ignored claim was last logged (one hub per process).
static UNPROVEN_LOGGED: std::sync::Mutex<Option<std::collections::HashMap<String, u64>>> =
    std::sync::Mutex::new(None);

/// A member claimed the version without evidence: counted each time it is ignored, and
/// logged once a minute per agent at most (a hostile agent may claim it every second).
fn unproven_claim(rollout: &str, version: &str, agent: &str) {
    crate::metrics::UNPROVEN_COMMITS.inc();
    let now = util::unix_now_ms();
    let mut logged = util::lock(&UNPROVEN_LOGGED);
    let logged = logged.get_or_insert_with(Default::default);
    if logged.len() > 10_000 {
        logged.retain(|_, at| now.saturating_sub(*at) < 60_000);
    }
    let last = logged.entry(agent.to_owned()).or_insert(0);
    if now.saturating_sub(*last) >= 60_000 {
        *last = now;
        tracing::warn!(%rollout, %version, %agent, "a rollout member claims the version without having fetched its artifact from the hub: not counted, and its wave waits");
    }
}

pub struct Roller(tokio::task::JoinHandle<()>);

impl Roller {
    pub fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Self {
        Self(tokio::spawn(async move {
            let holder = format!(
                "{}-{}-{:x}",
                crate::sys::hostname().unwrap_or_default(),
                std::process::id(),
                util::unix_now_ms()
            );
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            let mut holding = false;
            let mut adopted = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    // Cancel-safe: a `notify_one` while another arm wins is kept as a
                    // permit for the next `notified`.
                    () = fleet.rollout_kick.notified() => {}
                    _ = tick.tick() => {}
                }
                // A fleet reporting many moves at once is stepped at this pace, not once
                // per report.
                let paced = tokio::time::sleep(MIN_GAP);
                let adopt = adopted.elapsed() >= ADOPT_EVERY;
                if adopt {
                    adopted = tokio::time::Instant::now();
                }
                match fleet.drive(&holder, adopt).await {
                    Ok(None) => {}
                    Ok(Some(held)) => {
                        if held != holding {
                            tracing::info!(holder = %holder, "{}", if held { "this hub drives the rollouts" } else { "another hub drives the rollouts" });
                            holding = held;
                        }
                        if failing {
                            tracing::info!("rollouts are driven again");
                            failing = false;
                        }
                    }
                    Err(e) => {
                        if !failing {
                            tracing::error!(error = %util::error_chain(&e), "could not drive the rollouts (tried again every second)");
                        }
                        failing = true;
                    }
                }
                paced.await;
            }
        }))
    }

    pub fn stop(self) {
        self.0.abort();
    }
}
