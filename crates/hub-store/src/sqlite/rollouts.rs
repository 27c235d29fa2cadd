//! Rollouts and the driver's lease, in SQLite: the bodies of `crate::rollouts`, run on
//! the worker thread.

use super::exec::run_now;
use super::SqliteStore;
use crate::rollouts::{
    self, Fetch, MemberRow, Progress, Recorded, RolloutRow, RolloutStore, StateMove,
};
use crate::StoreError;

impl RolloutStore for SqliteStore {
    async fn insert_rollout(
        &self,
        row: &RolloutRow,
        members: &[MemberRow],
    ) -> Result<Result<RolloutRow, Vec<(String, String)>>, StoreError> {
        let (row, members) = (row.clone(), members.to_vec());
        self.transact(move |t| run_now(rollouts::insert(t, &row, &members)))
            .await
    }

    async fn list_rollouts(&self, active: bool) -> Result<Vec<RolloutRow>, StoreError> {
        self.plain(move |t| run_now(rollouts::list(t, active)))
            .await
    }

    async fn get_rollout(
        &self,
        id: &str,
    ) -> Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError> {
        let id = id.to_owned();
        self.plain(move |t| run_now(rollouts::get(t, &id))).await
    }

    async fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        m: &StateMove,
    ) -> Result<Option<RolloutRow>, StoreError> {
        let (id, m) = (id.to_owned(), m.clone());
        let from: Vec<String> = from.iter().map(|s| (*s).to_owned()).collect();
        self.transact(move |t| {
            let from: Vec<&str> = from.iter().map(String::as_str).collect();
            run_now(rollouts::move_to(t, &id, &from, &m))
        })
        .await
    }

    async fn record_rollout(
        &self,
        holder: &str,
        lease_until_ms: u64,
        p: &Progress,
    ) -> Result<Recorded, StoreError> {
        let (holder, p) = (holder.to_owned(), p.clone());
        self.transact(move |t| run_now(rollouts::record(t, &holder, lease_until_ms, &p)))
            .await
    }

    async fn record_fetch(&self, f: &Fetch) -> Result<(), StoreError> {
        let f = f.clone();
        self.plain(move |t| run_now(rollouts::record_fetch(t, &f)))
            .await
    }

    async fn fetches(&self, version: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let version = version.to_owned();
        self.plain(move |t| run_now(rollouts::fetches(t, &version)))
            .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.plain(move |t| run_now(rollouts::take_lease(t, &name, &holder, now_ms, until_ms)))
            .await
    }
}
