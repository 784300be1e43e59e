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
    eprintln!(
        "{} acknowledged writes before kill -9, all present; revision {list_rv} -> {rv}",
        acked.len()
    );
    child.kill().expect("kill");
    let _ = child.wait();
}
