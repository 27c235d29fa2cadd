//! Rollouts and the driver's lease, in PostgreSQL: the bodies of `crate::rollouts`, with
//! the rows a step reads locked (`FOR UPDATE`) so that an operator's move through another
//! replica waits for the step, or the step for it.

use super::PgStore;
use crate::rollouts::{
    self, Fetch, MemberRow, Progress, Recorded, RolloutRow, RolloutStore, StateMove,
};
use crate::StoreError;

impl RolloutStore for PgStore {
    async fn insert_rollout(
        &self,
        row: &RolloutRow,
        members: &[MemberRow],
    ) -> Result<Result<RolloutRow, Vec<(String, String)>>, StoreError> {
        self.transact(async |t| rollouts::insert(t, row, members).await)
            .await
    }

    async fn list_rollouts(&self, active: bool) -> Result<Vec<RolloutRow>, StoreError> {
        self.plain(async |t| rollouts::list(t, active).await).await
    }

    async fn get_rollout(
        &self,
        id: &str,
    ) -> Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError> {
        // One snapshot: the members as of the row.
        self.snapshot(async |t| rollouts::get(t, id).await).await
    }

    async fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        m: &StateMove,
    ) -> Result<Option<RolloutRow>, StoreError> {
        self.transact(async |t| rollouts::move_to(t, id, from, m).await)
            .await
    }

    async fn record_rollout(
        &self,
        holder: &str,
        lease_until_ms: u64,
        p: &Progress,
    ) -> Result<Recorded, StoreError> {
        self.transact(async |t| rollouts::record(t, holder, lease_until_ms, p).await)
            .await
    }

    async fn record_fetch(&self, f: &Fetch) -> Result<(), StoreError> {
        self.plain(async |t| rollouts::record_fetch(t, f).await)
            .await
    }

    async fn fetches(&self, version: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.plain(async |t| rollouts::fetches(t, version).await)
            .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, StoreError> {
        self.plain(async |t| rollouts::take_lease(t, name, holder, now_ms, until_ms).await)
            .await
    }
}
