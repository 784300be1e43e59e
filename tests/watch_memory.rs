//! A user with update rights who rewrites one large object again and again
//! cannot grow the server without bound: the watch cache's event history is
//! bounded in bytes (not only in count) and the embedded store's page cache
//! is bounded (redb's own default is 1 GiB, which this pattern filled: 340 MB
//! of growth for 300 updates before the flag existed). A watch that never
//! reads pins nothing beyond its feed's byte budget, and is ended once it
//! stays behind past the grace.

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

/// Sends a watch request on a raw HTTP/1.1 connection and never reads it.
async fn stalled_watch(
    data: &std::path::Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut c = common::connect_to(data, &[b"http/1.1"]).await;
    let head = format!(
        "GET {}?watch=true&resourceVersion=0 HTTP/1.1\r\nHost: localhost\r\n\r\n",
        common::WIDGETS
    );
    c.write_all(head.as_bytes()).await.expect("write");
    c.flush().await.expect("flush");
    c
}

/// Reads a raw HTTP/1.1 response until its chunked body ends; `None` if it
/// has not ended within `within`.
async fn read_to_end_of_body(
    c: &mut (impl tokio::io::AsyncRead + Unpin),
    within: std::time::Duration,
) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if got.ends_with(b"\r\n0\r\n\r\n") {
            return Some(got);
        }
        match tokio::time::timeout_at(deadline, c.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_that_never_reads_is_ended_and_pins_no_memory() {
    const UPDATES: usize = 600;
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = common::spawn_kshard_with(
        &data,
        &[
            "--watch-cache-history-bytes",
            "16Mi",
            "--compaction-interval",
            "1h",
        ],
        &[("MALLOC_ARENA_MAX", "2")],
    );
    let pid = child.id();
    let client = common::client_for(&data.join("kubeconfig")).await;
    let create = http::Request::post(common::WIDGETS)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&common::widget("big", 0)).expect("json"))
        .expect("request");
    client.request_text(create).await.expect("created");
    let frames = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    common::line_counting_watch(&data, frames.clone(), 600).await;
    let mut stalled = vec![stalled_watch(&data).await, stalled_watch(&data).await];
    // Without a byte bound each stalled watch kept every event: about 2 MB
    // per update (object and frame), past this cap within 600 updates.
    common::limit_memory(pid, 1 << 30);
    let baseline = common::rss_bytes(pid);
    let mut peak = 0;
    for i in 1..=UPDATES {
        common::rewrite_big_widget(&client, &mut child, i, OBJECT_BYTES).await;
        if i % 50 == 0 {
            peak = peak.max(common::rss_bytes(pid));
        }
    }
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "{UPDATES} updates of a 1 MB object with 2 stalled watches: RSS grew by {} MB at most",
        grown / 1_000_000
    );
    assert!(child.try_wait().expect("wait").is_none(), "the server died");
    // The other watcher is served every event (the initial ADDED, then each update).
    common::eventually("the reading watcher gets every update", || {
        let frames = frames.clone();
        async move { frames.load(std::sync::atomic::Ordering::Relaxed) > UPDATES }
    })
    .await;
    // Measured with the bound: about 150 MB (the 16 MiB history and its
    // frames, the store's page cache, allocator slack); without it, over 1 GB.
    assert!(
        grown < 400_000_000,
        "RSS grew by {} MB with stalled watchers",
        grown / 1_000_000
    );
    // Each stalled watch was ended: reading it now gets what the sockets
    // held, then the end of the body (the client re-watches).
    for c in &mut stalled {
        let body = read_to_end_of_body(c, std::time::Duration::from_secs(30))
            .await
            .expect("the stalled watch was ended");
        assert!(
            body.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&body[..200.min(body.len())])
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}
