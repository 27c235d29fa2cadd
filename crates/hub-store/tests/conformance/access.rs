//! The access cases of the conformance suite: enrolment, tokens, the audit log.

use super::*;

pub(super) async fn an_enrolment_token_enrols_as_many_hosts_as_it_may_and_never_takes_an_id(
    b: &impl Backend,
) {
    use railgrid_hub_store::access::{EnrolTokenRow, Enrolled, Enrolment};
    let store = b.open().await;
    let labels: Labels = [("pool".to_owned(), "ci".to_owned())].into();
    let t = store
        .create_enrol_token(&EnrolTokenRow {
            sha256: "et".into(),
            max_uses: Some(2),
            labels: labels.clone(),
            created_ms: 1,
            expires_ms: Some(1_000_000),
            ..EnrolTokenRow::default()
        })
        .await
        .expect("create");
    assert_eq!(t.id, "et1");
    let host = |id: &str, now_ms: u64| Enrolment {
        id: id.into(),
        token_sha256: "et".into(),
        now_ms,
        peer: "10.0.0.1".into(),
        host: format!("{id}.example"),
    };
    let done = |r: Enrolled| match r {
        Enrolled::Done { via, labels, .. } => (via, labels),
        other => panic!("not enrolled: {other:?}"),
    };
    let (via, got) = done(store.self_enrol(&host("h1", 10), "a1").await.expect("h1"));
    assert_eq!((via.as_str(), &got), ("et1", &labels));
    // Its answer lost, the same host asks again: enrolled again, no use taken.
    done(
        store
            .self_enrol(&host("h1", 11), "a1b")
            .await
            .expect("again"),
    );
    // Another host under the same id, once the first was seen: refused, naming it.
    store
        .record_reports(vec![ReportRow {
            id: "h1".into(),
            seen_at: 12,
            observed_generation: 0,
            report: "{}".into(),
        }])
        .await
        .expect("seen");
    match store.self_enrol(&host("h1", 13), "x").await.expect("taken") {
        Enrolled::Taken { peer, host, .. } => {
            assert_eq!(
                (peer.as_deref(), host.as_deref()),
                (Some("10.0.0.1"), Some("h1.example"))
            )
        }
        other => panic!("{other:?}"),
    }
    done(store.self_enrol(&host("h2", 14), "a2").await.expect("h2"));
    match store.self_enrol(&host("h3", 15), "a3").await.expect("h3") {
        Enrolled::Refused { via, why } => {
            assert_eq!(via, "et1");
            assert!(why.contains("as many hosts"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let listed = store.enrol_tokens().await.expect("list");
    assert_eq!(
        (listed[0].uses, listed[0].labels.clone()),
        (2, labels.clone())
    );
    let snap = store.load().await.expect("load");
    let h1 = snap.agents.iter().find(|a| a.id == "h1").expect("h1");
    assert_eq!(h1.token_sha256, "a1b");
    assert_eq!(
        railgrid_hub_store::parse_labels("db", "h1", &h1.labels).expect("labels"),
        labels
    );
    // Expired, revoked, unknown.
    assert!(matches!(
        store
            .self_enrol(&host("h4", 2_000_000), "a4")
            .await
            .expect("late"),
        Enrolled::Refused {
            why: "it has expired",
            ..
        }
    ));
    store.revoke_enrol_token("et1", 20).await.expect("revoke");
    assert!(matches!(
        store
            .self_enrol(&host("h1", 21), "a1c")
            .await
            .expect("revoked"),
        Enrolled::Refused {
            why: "it was revoked",
            ..
        }
    ));
    // A revoked agent's id is never given to an enrolling host, however good its token.
    let second = store
        .create_enrol_token(&EnrolTokenRow {
            sha256: "et2".into(),
            created_ms: 1,
            ..EnrolTokenRow::default()
        })
        .await
        .expect("second token");
    store.revoke("h2", 25).await.expect("revoke h2");
    let retake = Enrolment {
        token_sha256: "et2".into(),
        ..host("h2", 26_000)
    };
    assert_eq!(
        store.self_enrol(&retake, "a6").await.expect("retired"),
        Enrolled::Retired { revoked_ms: 25_000 }
    );
    assert_eq!(
        store.enrol_tokens().await.expect("list")[1].uses,
        0,
        "{} spent no use",
        second.id
    );
    let unknown = Enrolment {
        token_sha256: "nope".into(),
        ..host("h5", 22)
    };
    assert_eq!(
        store.self_enrol(&unknown, "a5").await.expect("unknown"),
        Enrolled::UnknownToken
    );
}

/// Revoking is what an operator does about a leaked token: a row the store cannot read
/// back must not keep the token working.
pub(super) async fn a_token_is_revoked_even_when_its_row_no_longer_reads(b: &impl Backend) {
    use railgrid_hub_store::access::{EnrolTokenRow, Enrolled, Enrolment};
    let store = b.open().await;
    let t = store
        .create_enrol_token(&EnrolTokenRow {
            sha256: "et".into(),
            created_ms: 1,
            ..EnrolTokenRow::default()
        })
        .await
        .expect("create");
    b.sql(&format!(
        "UPDATE enrol_tokens SET labels = 'not json' WHERE id = '{}'",
        t.id
    ));
    let err = store
        .revoke_enrol_token(&t.id, 5)
        .await
        .expect_err("a row that does not decode is an error");
    assert!(err.to_string().contains("labels"), "{err}");
    // Readable again: it was revoked all the same.
    b.sql(&format!(
        "UPDATE enrol_tokens SET labels = '{{}}' WHERE id = '{}'",
        t.id
    ));
    let en = Enrolment {
        id: "h1".into(),
        token_sha256: "et".into(),
        now_ms: 10,
        peer: "10.0.0.1".into(),
        host: "h1.example".into(),
    };
    match store.self_enrol(&en, "a1").await.expect("enrol") {
        Enrolled::Refused { via, .. } => assert_eq!(via, t.id),
        other => panic!("a revoked token enrolled: {other:?}"),
    }
}

pub(super) async fn admin_tokens_audit_and_rotation_are_kept(b: &impl Backend) {
    use railgrid_hub_store::access::AdminTokenRow;
    use railgrid_proto::access::AuditEntry;
    let store = b.open().await;
    let row = AdminTokenRow {
        name: "ci".into(),
        sha256: "h".into(),
        scopes: "jobs:submit,jobs:read".into(),
        selector: Some("pool=ci".into()),
        created_ms: 1,
        ..AdminTokenRow::default()
    };
    assert!(store.create_admin_token(&row).await.expect("create"));
    assert!(
        !store.create_admin_token(&row).await.expect("again"),
        "a name is used once"
    );
    let revoked = store
        .revoke_admin_token("ci", 5)
        .await
        .expect("revoke")
        .expect("ci");
    assert_eq!(revoked.revoked_ms, Some(5));
    assert_eq!(
        store.admin_tokens().await.expect("list")[0].revoked_ms,
        Some(5)
    );
    assert_eq!(
        store.revoke_admin_token("nope", 5).await.expect("none"),
        None
    );

    for (at, token) in [(10, "root"), (20, "ci"), (30, "root")] {
        let line = AuditEntry {
            at_ms: at,
            token: token.into(),
            peer: "10.0.0.1".into(),
            action: "POST /v1/admin/jobs".into(),
            target: "j".into(),
            outcome: "201".into(),
            ..AuditEntry::default()
        };
        let seq = store.append_audit(&line).await.expect("append");
        assert_eq!(seq, at / 10);
    }
    // A line that stands for refusals alike counts them.
    store.add_audit_count(2, 41).await.expect("count");
    let all = store.audit(0, None, 100).await.expect("audit");
    assert_eq!(all.iter().map(|l| l.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(all.iter().map(|l| l.count).collect::<Vec<_>>(), [1, 42, 1]);
    assert_eq!(store.audit(15, None, 100).await.expect("since").len(), 2);
    assert_eq!(store.audit(0, Some("ci"), 100).await.expect("ci").len(), 1);
    assert_eq!(store.audit(0, None, 1).await.expect("newest")[0].at_ms, 30);
    assert_eq!(store.prune_audit(25).await.expect("prune"), 2);
    assert_eq!(store.audit(0, None, 100).await.expect("left").len(), 1);

    store.enrol("a", "old", 1, false).await.expect("enrol");
    let asked = store.ask_rotation(None).await.expect("ask");
    assert_eq!(
        asked.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    store.set_next_token("a", "new").await.expect("next");
    let a = store.load().await.expect("load").agents.remove(0);
    assert_eq!(
        (
            a.token_sha256.as_str(),
            a.next_token_sha256.as_deref(),
            a.rotate_asked
        ),
        ("old", Some("new"), true)
    );
    assert!(!store.promote_token("a", "other", 9).await.expect("not it"));
    assert!(store.promote_token("a", "new", 9).await.expect("promote"));
    let a = store.load().await.expect("load").agents.remove(0);
    assert_eq!(
        (
            a.token_sha256.as_str(),
            a.next_token_sha256,
            a.rotate_asked,
            a.token_issued_ms
        ),
        ("new", None, false, Some(9))
    );
}
