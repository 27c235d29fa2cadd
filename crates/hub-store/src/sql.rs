//! The statements both backends run, each written once, with PostgreSQL's numbered
//! parameters (`$1`); SQLite runs them through [`lite`], which numbers them its own way
//! (`?1`: SQLite would read `$1` as a name, numbered by where it first appears). What
//! differs between the backends (types, `ANY`, locking reads) stays with each.
//!
//! Grouped by table, in the order of the migrations.

// Column lists: macros, so that a statement naming one is still one constant (`concat!`
// takes literals only).
macro_rules! job_columns {
    () => {
        "id, seq, agent, spec, created_ms, state, cancel_requested, exit_code, exit_signal,
         error, finished_ms, stdout_bytes, stderr_bytes, runner_truncated, done, stdout_length,
         stderr_length, stdout_stored, stderr_stored, started_ms, selector, priority,
         queue_deadline_ms, job_group, attempt, retries, avoid, scope, egress_denied"
    };
}
/// The states of a job that has not ended, as SQL values.
macro_rules! open_states {
    () => {
        "'pending', 'queued', 'starting', 'running'"
    };
}
/// An agent's columns with its jobs' version (`agent_jobs`, migration 15), in
/// `AgentRow`'s order.
macro_rules! agents_with_jobs {
    () => {
        "SELECT a.id, a.token_sha256, a.enrolled_at, a.revoked_at, a.last_seen,
             a.observed_generation, a.report, a.labels, a.next_token_sha256, a.rotate_asked,
             a.token_issued_ms, COALESCE(j.version, 0)
         FROM agents a LEFT JOIN agent_jobs j ON j.agent = a.id"
    };
}
macro_rules! secret_columns {
    () => {
        "name, version, selector, sealed, key_id, set_by, set_ms"
    };
}
macro_rules! admin_token_columns {
    () => {
        "name, sha256, scopes, selector, created_ms, expires_ms, revoked_ms"
    };
}
macro_rules! enrol_token_columns {
    () => {
        "id, sha256, max_uses, uses, labels, created_ms, expires_ms, revoked_ms"
    };
}
macro_rules! audit_columns {
    () => {
        "seq, at_ms, token, peer, action, target, outcome, count"
    };
}
macro_rules! rollout_columns {
    () => {
        "id, seq, version, selector, waves, soak_ms, max_parallel,
         max_failures, failures_accepted, deadline_ms, state, reason, wave, last_commit_ms,
         created_ms, finished_ms"
    };
}
macro_rules! member_columns {
    () => {
        "agent, wave, position, state, from_version, given_ms, ended_ms, error"
    };
}
/// The columns of a `SecretRow`, in its order.
pub(crate) const SECRET_COLUMNS: &str = secret_columns!();
pub(crate) const ADMIN_TOKEN_COLUMNS: &str = admin_token_columns!();
pub(crate) const ENROL_TOKEN_COLUMNS: &str = enrol_token_columns!();
pub(crate) const ROLLOUT_COLUMNS: &str = rollout_columns!();

// meta
/// Takes the next generation, never past `MAX_GENERATION` (no row then).
pub(crate) const GENERATION_NEXT: &str = "UPDATE meta
     SET value = value + 1
     WHERE key = 'generation' AND value < $1
     RETURNING value";
pub(crate) const SEQ_NEXT: &str =
    "UPDATE meta SET value = value + 1 WHERE key = $1 RETURNING value";

// desired
pub(crate) const DESIRED_ALL: &str =
    "SELECT scope, generation, settings FROM desired ORDER BY scope";
pub(crate) const DESIRED_OF_SCOPE: &str =
    "SELECT scope, generation, settings FROM desired WHERE scope = $1";
pub(crate) const DESIRED_CLEAR: &str = "UPDATE desired SET settings = '{}' WHERE scope = $1";
/// A scope's generation moved, its settings kept (or none, for a new scope).
pub(crate) const DESIRED_PUT_GENERATION: &str = "INSERT INTO desired (scope, generation, settings)
     VALUES ($1, $2, '{}')
     ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation";
pub(crate) const DESIRED_PUT: &str = "INSERT INTO desired (scope, generation, settings)
     VALUES ($1, $2, $3)
     ON CONFLICT (scope)
     DO UPDATE SET generation = excluded.generation, settings = excluded.settings";

// agents
/// An agent added by the hub (`hub agent add`), or its revoked id taken again when asked.
pub(crate) const AGENT_ADD: &str =
    "INSERT INTO agents (id, token_sha256, enrolled_at, observed_generation)
     VALUES ($1, $2, $3, 0)
     ON CONFLICT (id) DO UPDATE SET token_sha256 = excluded.token_sha256,
         enrolled_at = excluded.enrolled_at, revoked_at = NULL, labels = '{}',
         next_token_sha256 = NULL, rotate_asked = 0, token_issued_ms = NULL,
         enrolled_via = NULL, enrolled_peer = NULL, enrolled_host = NULL
     WHERE agents.revoked_at IS NOT NULL";
/// A host enrolled by a token; over a row of the same id only when `$9` (the same
/// token's enrolment asked again, its answer lost).
pub(crate) const AGENT_ENROL: &str =
    "INSERT INTO agents (id, token_sha256, enrolled_at, observed_generation, labels,
         token_issued_ms, enrolled_via, enrolled_peer, enrolled_host)
     VALUES ($1, $2, $3, 0, $4, $5, $6, $7, $8)
     ON CONFLICT (id) DO UPDATE SET token_sha256 = excluded.token_sha256,
         enrolled_at = excluded.enrolled_at, revoked_at = NULL, last_seen = NULL,
         labels = excluded.labels, next_token_sha256 = NULL, rotate_asked = 0,
         token_issued_ms = excluded.token_issued_ms,
         enrolled_via = excluded.enrolled_via, enrolled_peer = excluded.enrolled_peer,
         enrolled_host = excluded.enrolled_host
     WHERE $9";
pub(crate) const AGENT_ASK_ROTATION: &str = "UPDATE agents
     SET rotate_asked = 1
     WHERE id = $1 AND revoked_at IS NULL";
pub(crate) const AGENT_REVOKE: &str = "UPDATE agents SET revoked_at = $2 WHERE id = $1";
/// What an agent is sent of its jobs changed, and took this number of the counter.
pub(crate) const AGENT_SET_JOBS_VERSION: &str = "INSERT INTO agent_jobs (agent, version)
     VALUES ($1, $2)
     ON CONFLICT (agent) DO UPDATE SET version = excluded.version
     WHERE agent_jobs.version < excluded.version";
pub(crate) const AGENT_ROTATE: &str = "UPDATE agents
     SET token_sha256 = next_token_sha256, next_token_sha256 = NULL, rotate_asked = 0,
         token_issued_ms = $3
     WHERE id = $1 AND next_token_sha256 = $2 AND revoked_at IS NULL";
pub(crate) const AGENT_SET_LABELS: &str = "UPDATE agents SET labels = $2 WHERE id = $1";
pub(crate) const AGENT_SET_NEXT_TOKEN: &str = "UPDATE agents
     SET next_token_sha256 = $2
     WHERE id = $1 AND revoked_at IS NULL";
pub(crate) const LIVE_AGENT_IDS: &str =
    "SELECT id FROM agents WHERE revoked_at IS NULL ORDER BY id";

// releases
pub(crate) const RELEASES_ALL: &str =
    "SELECT version, os, arch, size, sha256, signature, key_id, published_at
     FROM releases
     ORDER BY published_at, version, os, arch";
pub(crate) const RELEASE_PUT: &str = "INSERT INTO releases (version, os, arch, size, sha256,
         signature, key_id, published_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (version, os, arch)
     DO UPDATE SET size = excluded.size, sha256 = excluded.sha256,
         signature = excluded.signature, key_id = excluded.key_id,
         published_at = excluded.published_at";

// halts
pub(crate) const HALTS_ALL: &str =
    "SELECT version, agent, reason, halted_at FROM halts ORDER BY version";
pub(crate) const HALT_DELETE: &str = "DELETE FROM halts WHERE version = $1";
pub(crate) const HALT_PUT: &str = "INSERT INTO halts (version, agent, reason, halted_at)
     VALUES ($1, $2, $3, $4)
     ON CONFLICT (version)
     DO UPDATE SET agent = excluded.agent, reason = excluded.reason,
         halted_at = excluded.halted_at";

// jobs
pub(crate) const AGENT_OPEN_JOBS: &str = "SELECT COUNT(*) FROM jobs WHERE agent = $1 AND done = 0";
pub(crate) const DONE_JOBS: &str = "SELECT COUNT(*) FROM jobs WHERE done = 1";
pub(crate) const JOB_AGENT: &str = "SELECT agent FROM jobs WHERE id = $1";
pub(crate) const JOB_ASSIGN: &str = "UPDATE jobs
     SET agent = $2, state = 'pending'
     WHERE id = $1 AND agent = '' AND done = 0";
/// The seq of the done job that has `$1` older ones.
pub(crate) const OLDEST_DONE_UP_TO: &str =
    "SELECT seq FROM jobs WHERE done = 1 ORDER BY seq LIMIT 1 OFFSET $1";
pub(crate) const DONE_JOBS_DELETE: &str =
    "DELETE FROM jobs WHERE done = 1 AND seq <= $1 RETURNING id";
pub(crate) const QUEUED_JOB_END: &str = "UPDATE jobs
     SET state = $2, cancel_requested = $3, error = $4, finished_ms = $5, done = $6
     WHERE id = $1 AND agent = '' AND done = 0";

// job_output
pub(crate) const OUTPUT_FROM: &str = "SELECT start, data
     FROM job_output
     WHERE job = $1 AND stream = $2
     AND start >= COALESCE( (SELECT MAX(start)
     FROM job_output
     WHERE job = $1 AND stream = $2
     AND start <= $3), 0)
     ORDER BY start";
pub(crate) const OUTPUT_INSERT: &str = "INSERT INTO job_output (job, stream, start, data)
     VALUES ($1, $2, $3, $4)";

// leases
pub(crate) const LEASE_RENEW: &str =
    "UPDATE leases SET expires_ms = $3 WHERE name = $1 AND holder = $2";
pub(crate) const LEASE_TAKE: &str = "INSERT INTO leases (name, holder, expires_ms)
     VALUES ($1, $2, $3)
     ON CONFLICT (name)
     DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms
     WHERE leases.holder = excluded.holder OR leases.expires_ms < $4
     RETURNING holder";

// rollouts
pub(crate) const ROLLOUT_INSERT: &str = "INSERT INTO rollouts (id, seq, version, selector,
         waves, soak_ms, max_parallel, max_failures, deadline_ms, state, reason, created_ms)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
pub(crate) const ROLLOUT_SET_WAVE: &str =
    "UPDATE rollouts SET wave = $2, last_commit_ms = $3 WHERE id = $1";
pub(crate) const ROLLOUT_UPDATE: &str = "UPDATE rollouts
     SET state = $2, reason = $3, finished_ms = $4, wave = CASE WHEN $5 THEN 0 ELSE wave END,
         failures_accepted = COALESCE($6, failures_accepted)
     WHERE id = $1";

// rollout_members
pub(crate) const MEMBER_INSERT: &str =
    "INSERT INTO rollout_members (rollout, agent, wave, position, state, from_version)
     VALUES ($1, $2, $3, $4, $5, $6)";
pub(crate) const MEMBER_UPDATE: &str = "UPDATE rollout_members
     SET state = $3, given_ms = $4, ended_ms = $5, error = $6
     WHERE rollout = $1 AND agent = $2";

// release_fetches
pub(crate) const FETCH_PUT: &str = "INSERT INTO release_fetches (agent, version, fetched_ms)
     VALUES ($1, $2, $3)
     ON CONFLICT (agent, version)
     DO UPDATE SET fetched_ms = excluded.fetched_ms";
pub(crate) const VERSION_FETCHES: &str =
    "SELECT agent, fetched_ms FROM release_fetches WHERE version = $1";

// admin_tokens
pub(crate) const ADMIN_TOKEN_INSERT: &str =
    "INSERT INTO admin_tokens (name, sha256, scopes, selector, created_ms, expires_ms)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (name) DO NOTHING";

// enrol_tokens
pub(crate) const ENROL_TOKEN_INSERT: &str =
    "INSERT INTO enrol_tokens (id, sha256, max_uses, labels, created_ms, expires_ms)
     VALUES ($1, $2, $3, $4, $5, $6)";
pub(crate) const ENROL_TOKEN_USE: &str = "UPDATE enrol_tokens SET uses = uses + 1 WHERE id = $1";

// audit
pub(crate) const AUDIT_ADD_COUNT: &str = "UPDATE audit SET count = count + $2 WHERE seq = $1";
pub(crate) const AUDIT_INSERT: &str =
    "INSERT INTO audit (seq, at_ms, token, peer, action, target, outcome, count)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
pub(crate) const AUDIT_PRUNE: &str = "DELETE FROM audit WHERE at_ms < $1";

// job_secrets
pub(crate) const OTHER_SECRET_KEY: &str =
    "SELECT key_id FROM job_secrets WHERE key_id <> $1 LIMIT 1";
pub(crate) const SECRET_COUNT: &str = "SELECT COUNT(*) FROM job_secrets";
pub(crate) const SECRET_DELETE: &str = "DELETE
     FROM job_secrets
     WHERE name = $1 AND version = $2
     RETURNING version";
pub(crate) const SECRET_RESEAL: &str = "UPDATE job_secrets
     SET sealed = $1, key_id = $2
     WHERE name = $3 AND version = $4 AND key_id = $5";
pub(crate) const SECRET_VERSION: &str = "SELECT version FROM job_secrets WHERE name = $1";

// Statements built on a column list
pub(crate) const OPEN_JOBS: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM jobs WHERE done = 0 ORDER BY seq"
);
pub(crate) const AGENT_OPEN_JOB_ROWS: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM jobs WHERE agent = $1 AND done = 0 ORDER BY seq"
);
pub(crate) const AGENTS_ALL: &str = concat!(agents_with_jobs!(), " ORDER BY a.id");
pub(crate) const AGENT_BY_ID: &str = concat!(agents_with_jobs!(), " WHERE a.id = $1");
pub(crate) const JOB_BY_ID: &str = concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1");
pub(crate) const SECRETS_ALL: &str = concat!(
    "SELECT ",
    secret_columns!(),
    " FROM job_secrets ORDER BY name"
);
pub(crate) const SECRET_PUT: &str = concat!(
    "INSERT INTO job_secrets (",
    secret_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7)
     ON CONFLICT (name) DO UPDATE SET version = excluded.version,
         selector = excluded.selector, sealed = excluded.sealed, key_id = excluded.key_id,
         set_by = excluded.set_by, set_ms = excluded.set_ms"
);
pub(crate) const ADMIN_TOKENS_ALL: &str = concat!(
    "SELECT ",
    admin_token_columns!(),
    " FROM admin_tokens ORDER BY name"
);
pub(crate) const ENROL_TOKENS_ALL: &str = concat!(
    "SELECT ",
    enrol_token_columns!(),
    " FROM enrol_tokens ORDER BY created_ms, id"
);
pub(crate) const ROLLOUT_MEMBERS: &str = concat!(
    "SELECT ",
    member_columns!(),
    " FROM rollout_members WHERE rollout = $1 ORDER BY position"
);

/// A page of jobs, newest first, each filter left out when NULL (`CAST … IS NULL`: a
/// parameter PostgreSQL can type, which SQLite reads alike).
pub(crate) const JOBS_PAGE: &str = concat!(
    "SELECT ",
    job_columns!(),
    " FROM jobs
     WHERE (CAST($1 AS TEXT) IS NULL OR agent = $1)
         AND (CAST($2 AS TEXT) IS NULL OR selector = $2)
         AND (CAST($3 AS TEXT) IS NULL OR job_group = $3) AND seq < $4
     ORDER BY seq DESC LIMIT $5"
);
pub(crate) const AUDIT_PAGE: &str = concat!(
    "SELECT ",
    audit_columns!(),
    " FROM audit WHERE at_ms >= $1 AND (CAST($2 AS TEXT) IS NULL OR token = $2)
     ORDER BY seq DESC LIMIT $3"
);
/// A job's progress as its agent reported it: keeps a cancel asked, an ended job's
/// outcome, and a done job whole (portable forms of `MAX`/`GREATEST` of two values).
pub(crate) const JOB_PROGRESS: &str = concat!(
    "UPDATE jobs SET
         cancel_requested = CASE WHEN cancel_requested > $3 THEN cancel_requested ELSE $3 END,
         state = CASE WHEN state IN (",
    open_states!(),
    ") THEN $2 ELSE state END,
         exit_code = CASE WHEN state IN (",
    open_states!(),
    ") THEN $4 ELSE exit_code END,
         exit_signal = CASE WHEN state IN (",
    open_states!(),
    ") THEN $5 ELSE exit_signal END,
         error = CASE WHEN state IN (",
    open_states!(),
    ") THEN $6 ELSE error END,
         finished_ms = CASE WHEN state IN (",
    open_states!(),
    ") THEN $7 ELSE finished_ms END,
         stdout_bytes = CASE WHEN stdout_bytes > $8 THEN stdout_bytes ELSE $8 END,
         stderr_bytes = CASE WHEN stderr_bytes > $9 THEN stderr_bytes ELSE $9 END,
         runner_truncated = COALESCE($10, runner_truncated), done = $11,
         started_ms = COALESCE(started_ms, $12),
         egress_denied = COALESCE($13, egress_denied)
     WHERE id = $1 AND done = 0"
);

/// A read, and the same read locking the rows it reads: PostgreSQL's `FOR UPDATE`, for a
/// change that decides on them among replicas (SQLite's one writer needs no lock).
/// The text may be given in parts, as `concat!` takes them (a column list's macro).
macro_rules! read_and_locked {
    ($read:ident, $locked:ident, $($text:expr),+ $(,)?) => {
        pub(crate) const $read: &str = concat!($($text),+);
        pub(crate) const $locked: &str = concat!($($text),+, " FOR UPDATE");
    };
}
read_and_locked!(
    GENERATION,
    GENERATION_LOCKED,
    "SELECT value FROM meta WHERE key = 'generation'"
);
read_and_locked!(
    AGENT_REVOKED_AT,
    AGENT_REVOKED_AT_LOCKED,
    "SELECT revoked_at FROM agents WHERE id = $1"
);
read_and_locked!(
    AGENT_LABELS,
    AGENT_LABELS_LOCKED,
    "SELECT labels FROM agents WHERE id = $1 AND revoked_at IS NULL"
);
read_and_locked!(
    AGENT_ENROLMENT,
    AGENT_ENROLMENT_LOCKED,
    "SELECT revoked_at, enrolled_at, enrolled_peer, enrolled_host, last_seen, enrolled_via
     FROM agents WHERE id = $1"
);
read_and_locked!(
    ROLLOUT_BY_ID,
    ROLLOUT_BY_ID_LOCKED,
    "SELECT ",
    rollout_columns!(),
    " FROM rollouts WHERE id = $1"
);
read_and_locked!(
    DESIRED_SETTINGS,
    DESIRED_SETTINGS_LOCKED,
    "SELECT settings FROM desired WHERE scope = $1"
);

/// A new job; no row when its id is taken (by another hub meanwhile, too).
pub(crate) const JOB_INSERT: &str =
    "INSERT INTO jobs (id, seq, agent, spec, created_ms, state, selector, priority,
         queue_deadline_ms, job_group, attempt, retries, avoid, scope)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
     ON CONFLICT (id) DO NOTHING";

/// `statement` with `$N` written `?N`, as SQLite numbers parameters.
pub(crate) fn lite(statement: &str) -> String {
    let mut out = String::with_capacity(statement.len());
    let mut chars = statement.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement of this file: its parameters are `$1` to `$n`, none skipped.
    const ALL: &[&str] = &[
        AUDIT_PRUNE,
        HALT_DELETE,
        SECRET_DELETE,
        ADMIN_TOKEN_INSERT,
        AUDIT_INSERT,
        DESIRED_PUT,
        ENROL_TOKEN_INSERT,
        HALT_PUT,
        OUTPUT_INSERT,
        LEASE_TAKE,
        FETCH_PUT,
        RELEASE_PUT,
        MEMBER_INSERT,
        ROLLOUT_INSERT,
        SECRET_COUNT,
        AGENT_OPEN_JOBS,
        DONE_JOBS,
        JOB_AGENT,
        VERSION_FETCHES,
        LIVE_AGENT_IDS,
        OLDEST_DONE_UP_TO,
        DONE_JOBS_DELETE,
        GENERATION_LOCKED,
        AGENT_OPEN_JOB_ROWS,
        AGENTS_ALL,
        AGENT_BY_ID,
        DESIRED_OF_SCOPE,
        OTHER_SECRET_KEY,
        DESIRED_ALL,
        OUTPUT_FROM,
        GENERATION,
        SECRET_VERSION,
        HALTS_ALL,
        RELEASES_ALL,
        AGENT_SET_LABELS,
        AGENT_SET_NEXT_TOKEN,
        AGENT_REVOKE,
        AGENT_ASK_ROTATION,
        AGENT_ROTATE,
        AGENT_SET_JOBS_VERSION,
        AUDIT_ADD_COUNT,
        ENROL_TOKEN_USE,
        SECRET_RESEAL,
        JOB_ASSIGN,
        QUEUED_JOB_END,
        LEASE_RENEW,
        SEQ_NEXT,
        GENERATION_NEXT,
        DESIRED_CLEAR,
        DESIRED_PUT_GENERATION,
        OPEN_JOBS,
        JOB_BY_ID,
        SECRETS_ALL,
        SECRET_PUT,
        ADMIN_TOKENS_ALL,
        ENROL_TOKENS_ALL,
        ROLLOUT_MEMBERS,
        ROLLOUT_BY_ID,
        ROLLOUT_BY_ID_LOCKED,
        MEMBER_UPDATE,
        ROLLOUT_UPDATE,
        ROLLOUT_SET_WAVE,
        JOBS_PAGE,
        AUDIT_PAGE,
        JOB_PROGRESS,
        AGENT_REVOKED_AT,
        AGENT_REVOKED_AT_LOCKED,
        AGENT_LABELS,
        AGENT_LABELS_LOCKED,
        AGENT_ENROLMENT,
        AGENT_ENROLMENT_LOCKED,
        DESIRED_SETTINGS,
        DESIRED_SETTINGS_LOCKED,
        JOB_INSERT,
        AGENT_ADD,
        AGENT_ENROL,
    ];

    #[test]
    fn every_statement_of_the_file_is_checked() {
        let source = include_str!("sql.rs");
        let declared = source
            .lines()
            .filter(|l| l.starts_with("pub(crate) const ") && !l.contains("_COLUMNS:"))
            .count()
            + 2 * source
                .lines()
                .filter(|l| l.starts_with("read_and_locked!("))
                .count();
        assert_eq!(ALL.len(), declared, "a statement is missing from ALL");
    }

    #[test]
    fn parameters_are_numbered_from_one_without_a_gap() {
        for statement in ALL {
            let mut seen: Vec<usize> = statement
                .split('$')
                .skip(1)
                .map(|rest| {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().expect("a number after $")
                })
                .collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, (1..=seen.len()).collect::<Vec<_>>(), "{statement}");
        }
    }

    #[test]
    fn sqlite_reads_the_same_parameters_by_number() {
        assert_eq!(
            lite("UPDATE agents SET labels = $2 WHERE id = $1 AND x = '$a'"),
            "UPDATE agents SET labels = ?2 WHERE id = ?1 AND x = '$a'"
        );
    }
}
