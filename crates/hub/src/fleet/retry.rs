//! Retries (`hub job submit --select SEL --retry N`): a selected job that ends `lost`
//! (its agent revoked, or its runner lost it) is queued again as a new attempt `ID.2`,
//! `ID.3` …, with its own id, output and record, preferring another agent. Only `lost`:
//! a job that may have run to an end of its own is never run again unasked.

use super::{AgentEntry, Fleet, FleetError};
use crate::proto::fleet_job::QUEUED;
use crate::store::{JobProgress, JobRow, Store};
use crate::util;

impl<S: Store> Fleet<S> {
    /// Queues the next attempt of job `id`, which just ended `lost` on `entry`, if it has
    /// retries left. Called with `changes` held. Idempotent: the next attempt's id is
    /// fixed, and the store refuses it a second time (another replica saw the loss too).
    pub(super) async fn retry_lost(&self, entry: &AgentEntry, id: &str) -> Result<(), FleetError> {
        let Some(row) = self.store.get_job(id).await? else {
            return Ok(());
        };
        if row.retries == 0 || row.selector.is_none() {
            return Ok(());
        }
        let Some(mut next) = next_attempt(&row, &entry.id, util::unix_now_ms()) else {
            tracing::warn!(job = %id, "a lost job is not retried: its next attempt's id would pass 128 characters");
            return Ok(());
        };
        if let Some((seq, _)) = self.store.insert_job(&next).await? {
            next.seq = seq;
            tracing::warn!(job = %id, retry = %next.id, agent = %entry.id, attempt = next.attempt, "a lost job is queued again");
            self.enqueue(next);
            self.jobs.moved();
        }
        Ok(())
    }
}

/// The attempt after `lost`, lost on `agent`: queued, one retry fewer, `agent` avoided.
fn next_attempt(lost: &JobRow, agent: &str, now_ms: u64) -> Option<JobRow> {
    let suffix = format!(".{}", lost.attempt);
    let base = match lost.attempt {
        1 => lost.id.as_str(),
        _ => lost.id.strip_suffix(&suffix).unwrap_or(&lost.id),
    };
    let attempt = lost.attempt + 1;
    let id = format!("{base}.{attempt}");
    if !crate::proto::spec::valid_id(&id) {
        return None;
    }
    let mut spec = lost.spec.clone();
    spec.id = Some(id.clone());
    Some(JobRow {
        id,
        seq: 0,
        agent: String::new(),
        spec,
        created_ms: now_ms,
        progress: JobProgress {
            state: QUEUED.into(),
            ..JobProgress::default()
        },
        selector: lost.selector.clone(),
        priority: lost.priority,
        queue_deadline_ms: None,
        group: lost.group.clone(),
        attempt,
        retries: lost.retries - 1,
        avoid: Some(agent.to_owned()),
        scope: lost.scope.clone(),
        stdout_length: 0,
        stderr_length: 0,
        stdout_stored: 0,
        stderr_stored: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_count_up_from_the_first_id() {
        let first = JobRow {
            id: "build.7".into(),
            retries: 2,
            selector: Some("queue=build".into()),
            ..JobRow::queued("build.7")
        };
        let second = next_attempt(&first, "b1", 5).expect("second");
        assert_eq!(
            (second.id.as_str(), second.attempt, second.retries),
            ("build.7.2", 2, 1)
        );
        assert_eq!(second.spec.id.as_deref(), Some("build.7.2"));
        assert_eq!(second.avoid.as_deref(), Some("b1"));
        let third = next_attempt(&second, "b2", 6).expect("third");
        assert_eq!(third.id, "build.7.3", "from the first id, not build.7.2.3");
        let long = JobRow {
            id: "x".repeat(127),
            ..first
        };
        assert!(next_attempt(&long, "b1", 5).is_none());
    }
}
