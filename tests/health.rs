//! `/livez` and `/readyz` check the store for real: a store that cannot answer
//! within the deadline fails both probes, by name, and they pass again when
//! it recovers. The store here is TiKV (the TIKV DOUBLE), whose reads can be
//! held up on the wire.
#![cfg(feature = "tikv")]

mod common;

use std::time::Duration;

async fn probe(s: &common::TestServer, path: &str) -> (u16, String) {
    let r = s.get(path).await;
    (r.status, r.text())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_does_not_answer_fails_readyz_and_livez() {
    let double = tikv_double::TikvDouble::start().expect("tikv double");
    let pd = double.pd_endpoint();
    let s = common::start_with(move |c| {
        c.store = Some(format!("tikv://{pd}?prefix=health"));
    })
    .await;
    let (code, body) = probe(&s, "/readyz?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]storage ok\n"), "{body}");
    let (code, body) = probe(&s, "/livez?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]storage ok\n"), "{body}");

    // Every read now waits far longer than the check's deadline.
    double.set_delay("KvGet", Duration::from_secs(60));
    let (code, body) = probe(&s, "/readyz?verbose").await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]storage failed: reason withheld\n"),
        "{body}"
    );
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    let (code, body) = probe(&s, "/livez").await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]storage failed: reason withheld\n"),
        "{body}"
    );
    assert_eq!(probe(&s, "/readyz/storage").await.0, 500);
    // Excluding the check is how an operator looks past it, as in kube.
    assert_eq!(probe(&s, "/readyz?exclude=storage").await.0, 200);

    double.clear_faults();
    common::eventually("the storage check passes again", || async {
        probe(&s, "/readyz/storage").await.0 == 200
    })
    .await;
    assert_eq!(probe(&s, "/livez").await, (200, "ok".to_string()));
}
