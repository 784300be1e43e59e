//! Durability: acknowledged writes survive `kill -9` of the real binary.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};

fn spawn(data_dir: &Path) -> common::KillOnDrop {
    common::spawn_kshard(data_dir, &[])
}

fn widgets(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    Api::namespaced_with(client, "default", &ApiResource::from_gvk(&gvk))
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = spawn(&data);
    let api = widgets(common::client_for(&data.join("kubeconfig")).await);

    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let obj: DynamicObject =
                    serde_json::from_value(common::widget(&name, i)).expect("obj");
                match api.create(&PostParams::default(), &obj).await {
                    Ok(o) => {
                        let rv = o
                            .metadata
                            .resource_version
                            .and_then(|r| r.parse().ok())
                            .unwrap_or(0);
                        acked.lock().expect("lock").push((name, rv));
                    }
                    // The server died mid-stream: stop writing.
                    Err(_) => return,
                }
            }
        }));
    }
    // Let writes flow, then kill without warning while they are in flight.
    while acked.lock().expect("lock").len() < 300 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().expect("lock").clone();
    let max_acked = acked.iter().map(|(_, rv)| *rv).max().unwrap_or(0);

    let mut child = spawn(&data);
    let api = widgets(common::client_for(&data.join("kubeconfig")).await);
    let list = api
        .list(&ListParams::default())
        .await
        .expect("list after restart");
    let present: std::collections::HashSet<String> = list
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    let lost: Vec<&String> = acked
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !present.contains(*n))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    let list_rv: u64 = list
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .expect("rv");
    assert!(list_rv >= max_acked);
    // Revisions keep increasing after the restart.
    let obj: DynamicObject = serde_json::from_value(common::widget("after", 1)).expect("obj");
    let after = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("write after restart");
    let rv: u64 = after
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()
        .expect("rv");
    assert!(rv > list_rv, "{rv} > {list_rv}");
    // The objects' JSON is in the value log beside redb, and `/metrics`
    // says how much of it is still pointed at.
    let client = common::client_for(&data.join("kubeconfig")).await;
    let text = client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("/metrics");
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    let (bytes, live) = (
        gauge("kshard_storage_value_log_bytes"),
        gauge("kshard_storage_value_log_live_bytes"),
    );
    assert!(
        live >= acked.len() as f64 * 192.0 && live <= bytes,
        "value log: {live} live of {bytes} bytes for {} objects",
        acked.len()
    );
    assert!(gauge("kshard_storage_value_log_segments") >= 1.0);
    eprintln!(
        "{} acknowledged writes before kill -9, all present; revision {list_rv} -> {rv}",
        acked.len()
    );
    child.kill().expect("kill");
    let _ = child.wait();
}

/// Sends one request with the kube client, keeping the response streaming.
async fn open(
    client: &kube::Client,
    method: &str,
    uri: &str,
    body: Option<&serde_json::Value>,
) -> http::Response<kube::client::Body> {
    let mut req = http::Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let body = body
        .map(|v| serde_json::to_vec(v).expect("json"))
        .unwrap_or_default();
    client
        .send(req.body(kube::client::Body::from(body)).expect("req"))
        .await
        .expect("send")
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_lists_ends_watches_and_loses_no_acknowledged_write() {
    use http_body_util::BodyExt;
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = spawn(&data);
    let client = common::client_for(&data.join("kubeconfig")).await;
    // 40 objects of 256 KiB: a LIST of 10 MiB, far more than socket buffers.
    let fill = "x".repeat(256 * 1024);
    for i in 0..40 {
        let obj = serde_json::json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
            "metadata": {"name": format!("big{i}"), "namespace": "default"},
            "spec": {"color": fill}});
        assert_eq!(
            open(&client, "POST", common::WIDGETS, Some(&obj))
                .await
                .status(),
            201
        );
    }
    // A watch, read to its end in the background.
    let watch = open(
        &client,
        "GET",
        &format!("{}?watch=1", common::WIDGETS),
        None,
    )
    .await;
    assert_eq!(watch.status(), 200);
    let watch_end = tokio::spawn(async move {
        let mut body = watch.into_body();
        while let Some(frame) = body.frame().await {
            frame.map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    });
    // A LIST of which only the first bytes are read before the signal.
    let list = open(&client, "GET", common::WIDGETS, None).await;
    assert_eq!(list.status(), 200);
    let mut list_body = list.into_body();
    let mut listed = Vec::new();
    if let Some(frame) = list_body.frame().await {
        if let Ok(d) = frame.expect("first bytes").into_data() {
            listed.extend_from_slice(&d);
        }
    }
    // Writers in flight when the signal comes.
    let api = widgets(client.clone());
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let api = api.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let obj: DynamicObject =
                    serde_json::from_value(common::widget(&name, i)).expect("obj");
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => acked.lock().expect("lock").push(name),
                    Err(_) => return,
                }
            }
        }));
    }
    while acked.lock().expect("lock").len() < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    // The LIST in flight is finished whole.
    while let Some(frame) = list_body.frame().await {
        if let Ok(d) = frame.expect("the LIST continues after SIGTERM").into_data() {
            listed.extend_from_slice(&d);
        }
    }
    let list: serde_json::Value = serde_json::from_slice(&listed).expect("a whole list");
    let items = list["items"].as_array().map_or(0, Vec::len);
    assert!(items >= 40, "{items} items");
    // The watch ends with a clean end of stream, not a cut connection.
    let ended = tokio::time::timeout(Duration::from_secs(20), watch_end)
        .await
        .expect("the watch ends")
        .expect("join");
    assert_eq!(ended, Ok(()), "the watch stream ended cleanly");
    for w in writers {
        let _ = w.await;
    }
    // The process exits by itself, successfully.
    let status = {
        let started = std::time::Instant::now();
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "kshard still running 30 s after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(status.success(), "{status}");
    // The store reopens cleanly, with every acknowledged write.
    let acked = acked.lock().expect("lock").clone();
    let _child = spawn(&data);
    let api = widgets(common::client_for(&data.join("kubeconfig")).await);
    let present: std::collections::HashSet<String> = api
        .list(&ListParams::default())
        .await
        .expect("list after restart")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|n| !present.contains(*n)).collect();
    assert!(lost.is_empty(), "lost acknowledged writes: {lost:?}");
    eprintln!(
        "SIGTERM: a 10 MiB LIST finished ({items} items), the watch ended cleanly, {} acknowledged writes kept",
        acked.len()
    );
}
