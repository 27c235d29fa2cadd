//! The fleet's rows: reports written in batches.

use super::Backend;
use railgrid_hub_store::*;

/// More agents than one statement writes at once, reported in no order: every report
/// lands on its own agent, and a report older than the one stored (written by another
/// hub meanwhile) never replaces it.
pub(super) async fn reports_land_on_their_agents_in_batches_and_never_over_a_newer_one(
    b: &impl Backend,
) {
    let store = b.open().await;
    let ids: Vec<String> = (0..150).map(|i| format!("a{i:03}")).collect();
    for id in &ids {
        store.enrol(id, "hash", 1, false).await.expect("enrol");
    }
    let report = |id: &str, seen_at: u64, observed: u64| ReportRow {
        id: id.into(),
        seen_at,
        observed_generation: observed,
        report: format!("{{\"at\":{seen_at}}}"),
    };
    let mut batch: Vec<ReportRow> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| report(id, 1000 + i as u64, i as u64))
        .rev()
        .collect();
    batch.push(report("never-enrolled", 5, 5));
    store.record_reports(batch).await.expect("reports");
    let snap = store.load().await.expect("load");
    assert_eq!(snap.agents.len(), 150, "no row made for an unknown id");
    for (i, a) in snap.agents.iter().enumerate() {
        let seen = 1000 + i as u64;
        assert_eq!(
            (a.last_seen, a.observed_generation, a.report.clone()),
            (Some(seen), i as u64, Some(format!("{{\"at\":{seen}}}"))),
            "{}",
            a.id
        );
    }

    store
        .record_reports(vec![report("a001", 2000, 77), report("a000", 500, 66)])
        .await
        .expect("reports");
    let snap = store.load().await.expect("load");
    let (a0, a1) = (&snap.agents[0], &snap.agents[1]);
    assert_eq!((a0.last_seen, a0.observed_generation), (Some(1000), 0));
    assert_eq!((a1.last_seen, a1.observed_generation), (Some(2000), 77));
}
