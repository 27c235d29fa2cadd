//! Secrets in the hub's answers: what one answer has no room for.

use std::time::Duration;

use super::{echoing, json, token, HeldPoll};
use crate::fixtures::*;

/// Six jobs naming a 64 KiB secret, more than one answer carries the values of: the
/// first answer takes what fits, and the rest go as soon as the agent reports taking
/// those (they leave `pending`, which moves its jobs' version and wakes the poll it holds
/// meanwhile), each job's values carried once.
#[test]
fn a_job_whose_secrets_an_answer_had_no_room_for_comes_once_its_agent_takes_the_others() {
    let tmp = tempdir();
    let hub = TestHub::start(&tmp.path().join("hub"), &[]);
    let t = token(&hub.enrol("a"));
    let value = tmp.path().join("value");
    let text: String = (0..12_000u32)
        .map(|i| format!("{i:x}-"))
        .collect::<String>()
        .chars()
        .take(64 * 1024)
        .collect();
    std::fs::write(&value, text).expect("value");
    hub.admin_ok(&["secret", "set", "BIG", "--from-file", &path_str(&value)]);
    let ids: Vec<String> = (1..=6).map(|i| format!("s{i}")).collect();
    for id in &ids {
        hub.admin_ok(&[
            "job", "submit", "--agent", "a", "--id", id, "--secret", "BIG", "--", "true",
        ]);
    }
    // The jobs an answer carries with their spec and values.
    let carried = |d: &serde_json::Value| -> Vec<String> {
        d["jobs"]
            .as_array()
            .expect("jobs")
            .iter()
            .filter(|j| j["spec"].is_object())
            .map(|j| {
                assert!(
                    j["secret_values"]["BIG"].is_string(),
                    "values with the spec: {j}"
                );
                j["id"].as_str().expect("id").to_owned()
            })
            .collect()
    };

    let (code, body) = hub.reconcile("a", &t, 0);
    assert_eq!(code, 200, "{body}");
    let first = json(&body);
    let g = first["generation"].as_u64().expect("generation");
    let mut got = carried(&first);
    assert!(
        !got.is_empty() && got.len() < ids.len(),
        "one answer carries some, not all: {got:?}"
    );
    // The agent takes them (its runner runs them) and says so, echoing the version it
    // was answered with: the rest come in the next answer, well before the hold's end.
    let mut report = json(&echoing(g, &first["jobs_version"]));
    report["jobs"] = got
        .iter()
        .map(|id| {
            serde_json::json!({"id": id, "state": "running", "exit_code": null,
            "signal": null, "error": null, "output_truncated": null})
        })
        .collect();
    let (code, body) =
        HeldPoll::report(&hub, "a", &t, &report.to_string(), 30).answer(Duration::from_secs(15));
    assert_eq!(code, 200, "{body}");
    got.extend(carried(&json(&body)));
    got.sort();
    assert_eq!(got, ids, "every job carried once over two answers");
}
