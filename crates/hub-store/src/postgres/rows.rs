//! Rows as the store's types: numbers as PostgreSQL keeps them (signed), JSON columns
//! decoded, a row that does not decode named with its database.

use tokio_postgres::Row;

use crate::parse_settings;
use crate::{AgentRow, HaltRow, JobProgress, JobRow, ReleaseRow, ScopeRow, StoreError};

pub(super) use crate::{encode, opt_u64, u64_of};

pub(super) fn corrupt(
    url: &str,
    what: String,
) -> impl FnOnce(serde_json::Error) -> StoreError + '_ {
    move |source| StoreError::Corrupt {
        path: url.to_owned(),
        what,
        source,
    }
}

pub(super) fn agent_row(r: &Row) -> AgentRow {
    AgentRow {
        id: r.get(0),
        token_sha256: r.get(1),
        enrolled_at: u64_of(r.get(2)),
        revoked_at: opt_u64(r.get(3)),
        last_seen: opt_u64(r.get(4)),
        observed_generation: u64_of(r.get(5)),
        report: r.get(6),
        labels: r.get(7),
        next_token_sha256: r.get(8),
        rotate_asked: r.get::<_, i64>(9) != 0,
        token_issued_ms: opt_u64(r.get(10)),
        jobs_version: u64_of(r.get(11)),
    }
}

pub(super) fn job_row(url: &str, r: &Row) -> Result<JobRow, StoreError> {
    let id: String = r.get(0);
    let spec: String = r.get(3);
    let spec =
        serde_json::from_str(&spec).map_err(corrupt(url, format!("the spec of job {id:?}")))?;
    let truncated: Option<String> = r.get(13);
    let runner_truncated = truncated
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt(url, format!("the truncation of job {id:?}")))?;
    let denied: Option<String> = r.get(28);
    let egress_denied = denied
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt(url, format!("the egress refusals of job {id:?}")))?
        .unwrap_or_default();
    Ok(JobRow {
        seq: u64_of(r.get(1)),
        agent: r.get(2),
        spec,
        created_ms: u64_of(r.get(4)),
        progress: JobProgress {
            state: r.get(5),
            cancel_requested: r.get::<_, i64>(6) != 0,
            exit_code: r.get::<_, Option<i64>>(7).map(|c| c as i32),
            signal: r.get::<_, Option<i64>>(8).map(|s| s as i32),
            error: r.get(9),
            finished_ms: opt_u64(r.get(10)),
            started_ms: opt_u64(r.get(19)),
            stdout_bytes: u64_of(r.get(11)),
            stderr_bytes: u64_of(r.get(12)),
            runner_truncated,
            egress_denied,
            done: r.get::<_, i64>(14) != 0,
        },
        stdout_length: u64_of(r.get(15)),
        stderr_length: u64_of(r.get(16)),
        stdout_stored: u64_of(r.get(17)),
        stderr_stored: u64_of(r.get(18)),
        selector: r.get(20),
        priority: r.get::<_, i64>(21).clamp(0, i64::from(u8::MAX)) as u8,
        queue_deadline_ms: opt_u64(r.get(22)),
        group: r.get(23),
        attempt: r.get::<_, i64>(24).clamp(1, i64::from(u32::MAX)) as u32,
        retries: r.get::<_, i64>(25).clamp(0, i64::from(u8::MAX)) as u8,
        avoid: r.get(26),
        scope: r.get(27),
        id,
    })
}

pub(super) fn scope_row(url: &str, r: &Row) -> Result<ScopeRow, StoreError> {
    let scope: String = r.get(0);
    let settings: String = r.get(2);
    let settings = parse_settings(url, &scope, Some(&settings))?;
    Ok(ScopeRow {
        generation: u64_of(r.get(1)),
        scope,
        settings,
    })
}

pub(super) fn release_row(r: &Row) -> ReleaseRow {
    ReleaseRow {
        version: r.get(0),
        os: r.get(1),
        arch: r.get(2),
        size: u64_of(r.get(3)),
        sha256: r.get(4),
        signature: r.get(5),
        key_id: r.get(6),
        published_at: u64_of(r.get(7)),
    }
}

pub(super) fn halt_row(r: &Row) -> HaltRow {
    HaltRow {
        version: r.get(0),
        agent: r.get(1),
        reason: r.get(2),
        halted_at: u64_of(r.get(3)),
    }
}
