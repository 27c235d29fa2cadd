//! Access (tokens, enrolment, audit, rotation) in PostgreSQL: the bodies of
//! `crate::access`. A change the other hubs must see (a new or revoked token) is told as
//! the tokens' event; an enrolment and a rotation as the agent's change.

use super::PgStore;
use crate::access::{
    self, AccessStore, AdminTokenRow, AuditRow, EnrolTokenRow, Enrolled, Enrolment,
    ADMIN_TOKEN_COLUMNS, ENROL_TOKEN_COLUMNS,
};
use crate::StoreError;

impl AccessStore for PgStore {
    async fn create_admin_token(&self, row: &AdminTokenRow) -> Result<bool, StoreError> {
        self.transact(async |t| access::create_admin_token(t, row).await)
            .await
    }

    async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        self.plain(async |t| access::admin_tokens(t).await).await
    }

    async fn revoke_admin_token(
        &self,
        name: &str,
        now_ms: u64,
    ) -> Result<Option<AdminTokenRow>, StoreError> {
        let (table, columns) = ("admin_tokens", ADMIN_TOKEN_COLUMNS);
        let row = self
            .transact(async |t| access::revoke(t, table, "name", columns, name, now_ms).await)
            .await?;
        row.map(access::admin_token_row).transpose()
    }

    async fn create_enrol_token(&self, row: &EnrolTokenRow) -> Result<EnrolTokenRow, StoreError> {
        self.transact(async |t| access::create_enrol_token(t, row).await)
            .await
    }

    async fn enrol_tokens(&self) -> Result<Vec<EnrolTokenRow>, StoreError> {
        self.plain(async |t| access::enrol_tokens(t).await).await
    }

    async fn revoke_enrol_token(
        &self,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<EnrolTokenRow>, StoreError> {
        let (table, columns) = ("enrol_tokens", ENROL_TOKEN_COLUMNS);
        let row = self
            .transact(async |t| access::revoke(t, table, "id", columns, id, now_ms).await)
            .await?;
        row.map(access::enrol_row).transpose()
    }

    async fn self_enrol(&self, en: &Enrolment, agent_sha256: &str) -> Result<Enrolled, StoreError> {
        self.transact(async |t| access::self_enrol(t, en, agent_sha256).await)
            .await
    }

    async fn append_audit(&self, row: &AuditRow) -> Result<u64, StoreError> {
        self.transact(async |t| access::append_audit(t, row).await)
            .await
    }

    async fn add_audit_count(&self, seq: u64, n: u64) -> Result<(), StoreError> {
        self.plain(async |t| access::add_audit_count(t, seq, n).await)
            .await
    }

    async fn audit(
        &self,
        since_ms: u64,
        token: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, StoreError> {
        self.plain(async |t| access::audit(t, since_ms, token, limit).await)
            .await
    }

    async fn prune_audit(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.plain(async |t| access::prune_audit(t, before_ms).await)
            .await
    }

    async fn ask_rotation(&self, ids: Option<&[String]>) -> Result<Vec<(String, u64)>, StoreError> {
        self.transact(async |t| access::ask_rotation(t, ids).await)
            .await
    }

    async fn set_next_token(&self, id: &str, next_sha256: &str) -> Result<(), StoreError> {
        self.plain(async |t| access::set_next_token(t, id, next_sha256).await)
            .await
    }

    async fn promote_token(
        &self,
        id: &str,
        next_sha256: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        self.transact(async |t| access::promote_token(t, id, next_sha256, now_ms).await)
            .await
    }

    /// The hub's own secrets (its admin token), which every replica must share: in the
    /// database, as SQLite's one hub keeps them in files.
    async fn replace_secret(&self, name: &str, value: &str) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO hub_secrets (name, value) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            &[&name, &value],
        )
        .await
        .map_err(self.err())?;
        Ok(())
    }
}
