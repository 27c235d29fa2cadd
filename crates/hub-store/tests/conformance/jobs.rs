//! Jobs past the number kept.

use super::{job, Backend};
use railgrid_hub_store::*;
use railgrid_proto::job::Stream;

/// More done jobs than one statement deletes the output of: each job retention deletes
/// goes with all of its output, and what it keeps (the newest done jobs, every open one)
/// keeps its own.
pub(super) async fn retention_deletes_each_job_with_its_output_however_many_go(b: &impl Backend) {
    let store = b.open().await;
    store.enrol("a", "h", 1, false).await.expect("enrol");
    let ids: Vec<String> = (0..72).map(|i| format!("j{i:02}")).collect();
    for id in &ids {
        store.insert_job(&job(id)).await.expect("insert");
        let out = bytes::Bytes::from(format!("out of {id}"));
        store
            .append_output(id, Stream::Stdout, 0, out, 64)
            .await
            .expect("output");
    }
    let done = JobProgress {
        state: "succeeded".into(),
        done: true,
        ..JobProgress::default()
    };
    // The last two stay open.
    let ended = ids[..70]
        .iter()
        .map(|id| (id.clone(), done.clone()))
        .collect();
    store.update_jobs("a", ended, true).await.expect("end");

    assert_eq!(store.retain_jobs(3).await.expect("retain"), 67);
    for (i, id) in ids.iter().enumerate() {
        let row = store.get_job(id).await.expect("get");
        let out = store
            .read_output(id, Stream::Stdout, 0, 64)
            .await
            .expect("read");
        if i < 67 {
            assert!(row.is_none() && out.is_empty(), "{id} goes whole");
        } else {
            assert!(row.is_some(), "{id} is kept");
            assert_eq!(
                out,
                format!("out of {id}").as_bytes(),
                "{id} keeps its output"
            );
        }
    }
}
