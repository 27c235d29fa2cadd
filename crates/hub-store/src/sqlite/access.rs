//! Access (tokens, enrolment, audit, rotation) in SQLite: the bodies of `crate::access`,
//! run on the worker thread.

use super::exec::run_now;
use super::SqliteStore;
use crate::access::{
    self, AccessStore, AdminTokenRow, AuditRow, EnrolTokenRow, Enrolled, Enrolment,
    ADMIN_TOKEN_COLUMNS, ENROL_TOKEN_COLUMNS,
};
use crate::exec::Row;
use crate::StoreError;

impl SqliteStore {
    /// [`access::revoke`] on the worker thread; the row is decoded by the caller.
    async fn revoke(
        &self,
        table: &'static str,
        key: &'static str,
        columns: &'static str,
        value: &str,
        now_ms: u64,
    ) -> Result<Option<Row>, StoreError> {
        let value = value.to_owned();
        self.transact(move |t| run_now(access::revoke(t, table, key, columns, &value, now_ms)))
            .await
    }
}

impl AccessStore for SqliteStore {
    async fn create_admin_token(&self, row: &AdminTokenRow) -> Result<bool, StoreError> {
        let row = row.clone();
        self.transact(move |t| run_now(access::create_admin_token(t, &row)))
            .await
    }

    async fn admin_tokens(&self) -> Result<Vec<AdminTokenRow>, StoreError> {
        self.plain(|t| run_now(access::admin_tokens(t))).await
    }

    async fn revoke_admin_token(
        &self,
        name: &str,
        now_ms: u64,
    ) -> Result<Option<AdminTokenRow>, StoreError> {
        let row = self
            .revoke("admin_tokens", "name", ADMIN_TOKEN_COLUMNS, name, now_ms)
            .await?;
        row.map(access::admin_token_row).transpose()
    }

    async fn create_enrol_token(&self, row: &EnrolTokenRow) -> Result<EnrolTokenRow, StoreError> {
        let row = row.clone();
        self.transact(move |t| run_now(access::create_enrol_token(t, &row)))
            .await
    }

    async fn enrol_tokens(&self) -> Result<Vec<EnrolTokenRow>, StoreError> {
        self.plain(|t| run_now(access::enrol_tokens(t))).await
    }

    async fn revoke_enrol_token(
        &self,
        id: &str,
        now_ms: u64,
    ) -> Result<Option<EnrolTokenRow>, StoreError> {
        let row = self
            .revoke("enrol_tokens", "id", ENROL_TOKEN_COLUMNS, id, now_ms)
            .await?;
        row.map(access::enrol_row).transpose()
    }

    async fn self_enrol(&self, en: &Enrolment, agent_sha256: &str) -> Result<Enrolled, StoreError> {
        let (en, sha256) = (en.clone(), agent_sha256.to_owned());
        self.transact(move |t| run_now(access::self_enrol(t, &en, &sha256)))
            .await
    }

    async fn append_audit(&self, row: &AuditRow) -> Result<u64, StoreError> {
        let row = row.clone();
        self.transact(move |t| run_now(access::append_audit(t, &row)))
            .await
    }

    async fn add_audit_count(&self, seq: u64, n: u64) -> Result<(), StoreError> {
        self.plain(move |t| run_now(access::add_audit_count(t, seq, n)))
            .await
    }

    async fn audit(
        &self,
        since_ms: u64,
        token: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, StoreError> {
        let token = token.map(str::to_owned);
        self.plain(move |t| run_now(access::audit(t, since_ms, token.as_deref(), limit)))
            .await
    }

    async fn prune_audit(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.plain(move |t| run_now(access::prune_audit(t, before_ms)))
            .await
    }

    async fn ask_rotation(&self, ids: Option<&[String]>) -> Result<Vec<(String, u64)>, StoreError> {
        let ids = ids.map(<[String]>::to_vec);
        self.transact(move |t| run_now(access::ask_rotation(t, ids.as_deref())))
            .await
    }

    async fn set_next_token(&self, id: &str, next_sha256: &str) -> Result<(), StoreError> {
        let (id, next) = (id.to_owned(), next_sha256.to_owned());
        self.plain(move |t| run_now(access::set_next_token(t, &id, &next)))
            .await
    }

    async fn promote_token(
        &self,
        id: &str,
        next_sha256: &str,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let (id, next) = (id.to_owned(), next_sha256.to_owned());
        self.transact(move |t| run_now(access::promote_token(t, &id, &next, now_ms)))
            .await
    }

    async fn replace_secret(&self, _name: &str, _value: &str) -> Result<(), StoreError> {
        // One hub: its secrets are files in its data dir.
        Ok(())
    }
}
