//! The schema, written once for both backends.

/// Schema migrations, applied in order (SQLite's `user_version`, PostgreSQL's
/// `railgrid_migrations` record how many ran). Portable SQL: PostgreSQL runs the same
/// statements with `BYTEA` for `BLOB`.
pub(crate) const MIGRATIONS: &[&str] = &[
    "CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );
    INSERT INTO meta (key, value) VALUES ('generation', 0);
    CREATE TABLE agents (
        id TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL,
        enrolled_at BIGINT NOT NULL,
        revoked_at BIGINT,
        last_seen BIGINT,
        observed_generation BIGINT NOT NULL DEFAULT 0,
        report TEXT
    );
    CREATE TABLE desired (
        scope TEXT PRIMARY KEY,
        generation BIGINT NOT NULL,
        settings TEXT NOT NULL
    );",
    // 2: jobs through the hub, and their output in chunks (each upload's new bytes).
    // PostgreSQL: BYTEA for BLOB.
    "INSERT INTO meta (key, value) VALUES ('job_seq', 0);
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL UNIQUE,
        agent TEXT NOT NULL,
        spec TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        state TEXT NOT NULL,
        cancel_requested BIGINT NOT NULL DEFAULT 0,
        exit_code BIGINT,
        exit_signal BIGINT,
        error TEXT,
        finished_ms BIGINT,
        stdout_bytes BIGINT NOT NULL DEFAULT 0,
        stderr_bytes BIGINT NOT NULL DEFAULT 0,
        runner_truncated TEXT,
        done BIGINT NOT NULL DEFAULT 0,
        stdout_length BIGINT NOT NULL DEFAULT 0,
        stderr_length BIGINT NOT NULL DEFAULT 0,
        stdout_stored BIGINT NOT NULL DEFAULT 0,
        stderr_stored BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_by_agent ON jobs (agent, seq);
    CREATE INDEX jobs_by_done ON jobs (done, seq);
    CREATE TABLE job_output (
        job TEXT NOT NULL,
        stream TEXT NOT NULL,
        start BIGINT NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (job, stream, start)
    );",
    // 3: release artifacts (their bytes are files in the data dir) and halted versions.
    "CREATE TABLE releases (
        version TEXT NOT NULL,
        os TEXT NOT NULL,
        arch TEXT NOT NULL,
        size BIGINT NOT NULL,
        sha256 TEXT NOT NULL,
        signature TEXT NOT NULL,
        key_id TEXT NOT NULL,
        published_at BIGINT NOT NULL,
        PRIMARY KEY (version, os, arch)
    );
    CREATE TABLE halts (
        version TEXT PRIMARY KEY,
        agent TEXT NOT NULL,
        reason TEXT NOT NULL,
        halted_at BIGINT NOT NULL
    );",
    // 4: when the hub first heard a job had reached its agent's runner.
    "ALTER TABLE jobs ADD COLUMN started_ms BIGINT;",
    // 5: the labels the hub sets on an agent (JSON), over the ones its host reports.
    "ALTER TABLE agents ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';",
    // 6: jobs routed by labels: their selector, priority and queue deadline. A queued
    // job has no agent yet (`agent = ''`).
    "ALTER TABLE jobs ADD COLUMN selector TEXT;
    ALTER TABLE jobs ADD COLUMN priority BIGINT NOT NULL DEFAULT 50;
    ALTER TABLE jobs ADD COLUMN queue_deadline_ms BIGINT;",
    // 7: fan-out: the group a job is a member of (one job per matching agent).
    "ALTER TABLE jobs ADD COLUMN job_group TEXT;
    CREATE INDEX jobs_by_group ON jobs (job_group, seq);",
    // 8: retries of a selected job lost with its agent: which attempt a job is, how
    // many more it may have, and the agent the last one was lost on.
    "ALTER TABLE jobs ADD COLUMN attempt BIGINT NOT NULL DEFAULT 1;
    ALTER TABLE jobs ADD COLUMN retries BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN avoid TEXT;",
    // 9: rollouts, their members, and the lease of the hub that drives them.
    super::rollouts::MIGRATION,
    // 10: scoped admin tokens, enrolment tokens, the audit log, agent token rotation.
    super::access::MIGRATION,
    // 11: an audit line that stands for many refusals alike.
    super::access::AUDIT_COUNT_MIGRATION,
    // 12: which agent was served which release's artifact, for a rollout's evidence.
    super::rollouts::FETCH_MIGRATION,
    // 13: what a job's egress proxy refused, by destination (JSON, see `Denial`).
    "ALTER TABLE jobs ADD COLUMN egress_denied TEXT;",
    // 14: secrets for jobs, sealed (the key is a file beside the hub, never a row).
    super::secrets::MIGRATION,
    // 15: the version of what an agent is sent of its jobs: the number of the fleet's
    // counter its latest such change took (jobs move no generation). A table of its
    // own, of two small columns: every job's change writes it, and rewriting the
    // agent's row (its report with it) made dispatch a fifth slower.
    "CREATE TABLE agent_jobs (agent TEXT PRIMARY KEY, version BIGINT NOT NULL);",
];
