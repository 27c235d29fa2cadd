//! The sealed secrets' cases.

use super::*;
use railgrid_hub_store::secrets::{Put, SecretRow, SecretStore};

fn row(name: &str, version: u64, key: &str) -> SecretRow {
    SecretRow {
        name: name.into(),
        version,
        selector: Some("queue=deploy".into()),
        sealed: vec![0, 1, 2, 255, version as u8],
        key_id: key.into(),
        set_by: "root".into(),
        set_ms: 7,
    }
}

pub(super) async fn secrets_are_set_by_version_under_one_key_and_resealed_at_once(
    b: &impl Backend,
) {
    let s = b.open().await;
    assert_eq!(
        s.put_secret(&row("A", 1, "k1"), None).await.expect("put"),
        Put::Done
    );
    // Compared: a write from a stale read is refused, whichever way it is stale.
    assert_eq!(
        s.put_secret(&row("A", 2, "k1"), None).await.expect("put"),
        Put::Moved
    );
    assert_eq!(
        s.put_secret(&row("A", 3, "k1"), Some(2))
            .await
            .expect("put"),
        Put::Moved
    );
    assert_eq!(
        s.put_secret(&row("A", 2, "k1"), Some(1))
            .await
            .expect("put"),
        Put::Done
    );
    // Another key while A is sealed under k1: refused, naming k1, for A itself too.
    assert_eq!(
        s.put_secret(&row("B", 1, "k2"), None).await.expect("put"),
        Put::OtherKey("k1".into())
    );
    assert_eq!(
        s.put_secret(&row("A", 3, "k2"), Some(2))
            .await
            .expect("put"),
        Put::OtherKey("k1".into())
    );
    assert_eq!(
        s.put_secret(&row("B", 1, "k1"), None).await.expect("put"),
        Put::Done
    );
    let again = b.open().await;
    assert_eq!(
        again.secrets().await.expect("list"),
        vec![row("A", 2, "k1"), row("B", 1, "k1")]
    );
    let named = again
        .secrets_named(&["B".into(), "C".into()])
        .await
        .expect("named");
    assert_eq!(named, vec![row("B", 1, "k1")]);
    // Resealed all at once, or not at all when one moved or one is missing.
    assert_eq!(
        s.reseal_secrets(&[row("A", 2, "k2")], "k1")
            .await
            .expect("reseal"),
        Put::Moved
    );
    assert_eq!(
        s.reseal_secrets(&[row("A", 1, "k2"), row("B", 1, "k2")], "k1")
            .await
            .expect("reseal"),
        Put::Moved
    );
    // Nor from another key than the one they are sealed under (a second rotation).
    assert_eq!(
        s.reseal_secrets(&[row("A", 2, "k3"), row("B", 1, "k3")], "k0")
            .await
            .expect("reseal"),
        Put::Moved
    );
    assert_eq!(again.secrets().await.expect("list")[0].key_id, "k1");
    assert_eq!(
        s.reseal_secrets(&[row("A", 2, "k2"), row("B", 1, "k2")], "k1")
            .await
            .expect("reseal"),
        Put::Done
    );
    assert!(again
        .secrets()
        .await
        .expect("list")
        .iter()
        .all(|r| r.key_id == "k2"));
    assert_eq!(s.remove_secret("A", 1).await.expect("rm"), None);
    assert_eq!(s.remove_secret("A", 2).await.expect("rm"), Some(2));
    assert_eq!(s.remove_secret("A", 2).await.expect("rm"), None);
    assert_eq!(again.secrets().await.expect("list").len(), 1);
}
