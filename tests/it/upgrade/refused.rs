//! Releases an agent refuses before it runs them: a bad hash or signature, an untrusted key, a downgrade, a binary that is not what it says.

use super::*;

/// The agent must end where it started: the old version running from the old file.
fn assert_refused(up: &Up, why: &str) {
    let u = up.wait_upgrade("refused");
    let error = u["error"].as_str().unwrap_or_default();
    assert!(error.contains(why), "expected {why:?} in {error:?}");
    up.assert_running(&builds().v1_version);
    assert_eq!(sha256_hex(&up.exe()), sha256_hex(&builds().v1));
    let names = up.bin_entries();
    assert_eq!(names, ["railgrid"], "nothing left beside the executable");
    let hub = up.hub_upgrade("refused");
    assert_says(&hub, "error", why);
}

#[test]
fn a_corrupted_artifact_is_refused_by_its_hash() {
    let mut up = Up::new();
    up.start_agent();
    up.release(V2, &builds().v2);
    // The hub's stored copy rots (same size, other bytes).
    let sha = sha256_hex(&builds().v2);
    let stored = up.hub().dir.join("releases").join(&sha);
    let mut bytes = fs::read(&stored).expect("stored release");
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    fs::write(&stored, &bytes).expect("corrupt");
    up.want(V2);
    assert_refused(&up, "SHA-256");
}

#[test]
fn a_signature_that_does_not_verify_is_refused() {
    let mut up = Up::new();
    up.start_agent();
    up.release(V2, &builds().v2);
    // The hub's database is tampered with: the signature of other bytes, by the same key.
    let other = up.path("other");
    fs::write(&other, b"other bytes").expect("other");
    let sig = fs::read_to_string(sign(&up.key, &other, V2)).expect("signature");
    let mut hub = up.hub.take().expect("hub");
    let listen = hub.listen.clone();
    let hub_dir = hub.dir.clone();
    hub.guard.signal(Signal::SIGTERM);
    hub.guard.wait_output(LIMIT);
    let db = rusqlite::Connection::open(hub_dir.join("hub.db")).expect("hub db");
    let n = db
        .execute("UPDATE releases SET signature = ?1", [&sig])
        .expect("tamper");
    assert_eq!(n, 1);
    drop(db);
    up.hub = Some(TestHub::start_on(
        &hub_dir,
        &listen,
        &["--release-key", &path_str(&up.key.public)],
    ));
    up.want(V2);
    assert_refused(&up, "does not verify");
}

#[test]
fn a_release_signed_by_a_key_the_agent_does_not_trust_is_refused() {
    let mut up = Up::new();
    let other = keygen(up.dir.path(), "someone-else");
    up.start_agent_trusting(&other.line);
    up.offer_v2();
    assert_refused(&up, "not trusted");
}

#[test]
fn an_agent_without_trusted_keys_refuses_every_upgrade() {
    let mut up = Up::new();
    up.start_agent_trusting("");
    up.offer_v2();
    assert_refused(&up, "no [upgrade] trusted_keys");
}

#[test]
fn the_hub_refuses_unsigned_and_wrongly_signed_releases() {
    let up = Up::new();
    let bin = up.path("release");
    fs::copy(&builds().v2, &bin).expect("copy");
    let stranger = keygen(up.dir.path(), "stranger");
    let sig = sign(&stranger, &bin, V2);
    let out = up.publish(V2, &bin, &sig);
    assert_eq!(out.status.code(), Some(2), "refused input");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not trusted") && err.contains("--release-key"),
        "{err}"
    );
    // A signature of other bytes, by the hub's own key.
    let other = up.path("other");
    fs::write(&other, b"x").expect("other");
    let other_sig = sign(&up.key, &other, V2);
    let out = up.publish(V2, &bin, &other_sig);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not verify"),
        "{err}"
    );
    // The version must be the one signed.
    let good = sign(&up.key, &bin, V2);
    let out = up.publish("99.0.1", &bin, &good);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("says it is version"),
        "{err}"
    );
    // Unsigned, through the API itself.
    let (code, body) = up.hub().curl(
        "PUT",
        &format!("/v1/admin/releases/{V2}/linux-x86_64"),
        Some(&up.hub().admin_token()),
        Some("binary"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("unsigned"), "{body}");
    assert_eq!(up.releases(), serde_json::json!([]), "nothing was taken");
    assert!(fs::read_dir(up.hub().dir.join("releases"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));
}

#[test]
fn a_downgrade_is_refused_unless_the_hub_asks_for_a_rollback() {
    let mut up = Up::with_exe(&builds().v2);
    up.start_agent();
    let v1 = builds().v1_version.clone();
    up.release(&v1, &builds().v1);
    up.want(&v1);
    let u = up.wait_upgrade("refused");
    assert_says(&u, "error", "downgrade");
    up.assert_running(V2);
    assert_eq!(up.bin_entries(), ["railgrid"]);
    // The hub asks for it on purpose.
    up.hub()
        .admin_ok(&["desired", "set", "--fleet", "--rollback", "true"]);
    up.wait_upgrade("committed");
    up.assert_running(&v1);
    up.assert_clean_bin();
}

#[test]
fn a_garbage_binary_fails_its_test_run_and_nothing_changes() {
    let mut up = Up::new();
    up.start_agent();
    let garbage = up.path("garbage");
    fs::write(&garbage, vec![0x5au8; 64 * 1024]).expect("garbage");
    up.release("99.0.3", &garbage);
    up.want("99.0.3");
    assert_refused(&up, "test run");
}

#[test]
fn a_binary_that_reports_another_version_is_refused() {
    let mut up = Up::new();
    up.start_agent();
    // The second build (99.0.0) signed and published as 99.0.1.
    up.release("99.0.1", &builds().v2);
    up.want("99.0.1");
    assert_refused(&up, "reports version 99.0.0, not 99.0.1");
}
