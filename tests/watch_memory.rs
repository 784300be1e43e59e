//! A user with update rights who rewrites one large object again and again
//! cannot grow the server without bound: the watch cache's event history is
//! bounded in bytes (not only in count) and the embedded store's page cache
//! is bounded (redb's own default is 1 GiB, which this pattern filled: 340 MB
//! of growth for 300 updates before the flag existed).

mod common;

use serde_json::json;

const UPDATES: usize = 300;
const OBJECT_BYTES: usize = 1_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn repeated_updates_of_a_large_object_keep_memory_bounded() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = common::spawn_kshard(
        &data,
        &[
            "--watch-cache-history-bytes",
            "16Mi",
            "--compaction-interval",
            "1h",
        ],
    );
    let pid = child.id();
    let client = common::client_for(&data.join("kubeconfig")).await;
    let uri = format!("{}/big", common::WIDGETS);
    let put = |i: usize| {
        let client = client.clone();
        let uri = uri.clone();
        async move {
            // A different 1 MB value each time: every event holds its own copy.
            let fill = char::from(b'a' + (i % 26) as u8)
                .to_string()
                .repeat(OBJECT_BYTES);
            let body = json!({"spec": {"replicas": i, "color": fill}});
            let req = http::Request::patch(uri)
                .header("content-type", "application/merge-patch+json")
                .body(serde_json::to_vec(&body).expect("json"))
                .expect("request");
            client.request_text(req).await.expect("update accepted")
        }
    };
    let create = http::Request::post(common::WIDGETS)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&common::widget("big", 0)).expect("json"))
        .expect("request");
    client.request_text(create).await.expect("created");
    let baseline = common::rss_bytes(pid);
    for i in 1..=UPDATES {
        put(i).await;
    }
    let grown = common::rss_bytes(pid).saturating_sub(baseline);
    eprintln!(
        "{UPDATES} updates of a {} MB object: RSS grew by {} MB",
        OBJECT_BYTES / 1_000_000,
        grown / 1_000_000
    );
    // Measured: about 95 MB of growth with both caches at 16 MiB.
    assert!(
        grown < 300_000_000,
        "RSS grew by {} MB for a 16 MiB history",
        grown / 1_000_000
    );
    // The server still answers, and the newest state is served.
    let obj = client
        .request_text(
            http::Request::get(uri.clone())
                .body(Vec::new())
                .expect("get"),
        )
        .await
        .expect("get");
    let obj: serde_json::Value = serde_json::from_str(&obj).expect("json");
    assert_eq!(obj["spec"]["replicas"], UPDATES);
    assert_eq!(
        obj["spec"]["color"].as_str().map(str::len),
        Some(OBJECT_BYTES)
    );
    // A watch from the first revision is 410 Gone (its events were dropped):
    // the client re-lists, as after compaction.
    let old = http::Request::get(format!(
        "{}?watch=true&resourceVersion=2&timeoutSeconds=1",
        common::WIDGETS
    ))
    .body(Vec::new())
    .expect("watch");
    let text = client.request_text(old).await.expect("watch answers");
    assert!(
        text.contains("\"code\":410") && text.contains("Expired"),
        "{text}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
