//! A full disk: writes fail with a Status while it is full, succeed again once
//! space is freed (no restart), and every acknowledged write survives a
//! `kill -9` and restart. The data directory is a small tmpfs mounted for the
//! test (these machines run tests as root).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

/// A tmpfs mount that is unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .ok()?
            .success();
        ok.then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Fills the file system holding `path` until it reports ENOSPC.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let block = vec![0u8; 64 * 1024];
    loop {
        if let Err(e) = f.write_all(&block).and_then(|_| f.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(28), "ENOSPC expected: {e}");
            return;
        }
    }
}

async fn create(client: &kube::Client, name: &str) -> (u16, String) {
    create_sized(client, name, 20_000).await
}

/// A widget of about `size` bytes.
async fn create_sized(client: &kube::Client, name: &str, size: usize) -> (u16, String) {
    let obj = json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "color": "x".repeat(size)},
    });
    let req = http::Request::post(common::WIDGETS)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(&obj).expect("json"),
        ))
        .expect("request");
    let resp = client.send(req).await.expect("the server answers");
    let code = resp.status().as_u16();
    let body = resp.into_body().collect_bytes().await.expect("body");
    (code, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_fail_on_a_full_disk_and_succeed_again_once_space_is_freed() {
    full_disk(20_000, "4Mi").await;
}

/// Objects small enough that their changes reach redb after the log (a
/// write is acknowledged once logged): a redb commit that fails then comes
/// after the records are durable, and such a write happened.
#[tokio::test(flavor = "multi_thread")]
async fn small_writes_on_a_full_disk_are_refused_only_when_not_stored() {
    full_disk(4_000, "64Mi").await;
}

/// Fills the disk under writes of about `size` bytes: every acknowledged
/// write survives, and none refused with an error that says "not written"
/// (anything but 504) is ever stored.
async fn full_disk(size: usize, cache: &str) {
    let dir = tempfile::tempdir().expect("tmp");
    let Some(_mount) = Mount::tmpfs(&dir.path().join("vol"), "24m") else {
        panic!("mounting a tmpfs failed: this test needs root (as CI and these machines have)");
    };
    let data = dir.path().join("vol").join("data");
    let mut child = common::spawn_kshard(&data, &["--storage-cache-bytes", cache]);
    let client = common::client_for(&data.join("kubeconfig")).await;
    let mut acked = Vec::new();
    // Writes answered with an error that says "not written" (not a 504,
    // whose outcome is unknown): none of them may ever appear.
    let mut refused_names = Vec::new();
    for i in 0..5 {
        let name = format!("before-{i}");
        assert_eq!(create(&client, &name).await.0, 201);
        acked.push(name);
    }

    let filler = dir.path().join("vol").join("filler");
    fill(&filler);
    // redb may still have free pages in its file: write until the disk says no.
    let mut refused = None;
    for i in 0..2_000 {
        let name = format!("full-{i}");
        match create_sized(&client, &name, size).await {
            (201, _) => acked.push(name),
            (code, body) => {
                if code != 504 {
                    refused_names.push(name);
                }
                refused = Some((code, body));
                break;
            }
        }
    }
    let (code, body) = refused.expect("a write is refused while the disk is full");
    assert_eq!(code, 500, "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["reason"], "InternalError");
    assert!(
        st["message"]
            .as_str()
            .unwrap_or("")
            .contains("storage I/O error"),
        "{st}"
    );
    // Reads the watch cache serves keep working meanwhile.
    let r = client
        .request_text(
            http::Request::get(format!("{}?resourceVersion=0", common::WIDGETS))
                .body(Vec::new())
                .expect("list"),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");

    // Space comes back: writes succeed again without a restart.
    std::fs::remove_file(&filler).expect("free the space");
    let mut healed = false;
    for i in 0..20 {
        let name = format!("after-{i}");
        let (code, body) = create_sized(&client, &name, size).await;
        if code == 201 {
            acked.push(name);
            healed = true;
            break;
        }
        assert_eq!(code, 500, "{body}");
        refused_names.push(name);
    }
    assert!(healed, "writes never succeeded again");
    assert!(child.try_wait().expect("wait").is_none(), "the server died");

    // Every acknowledged write survives kill -9 and a restart.
    child.kill().expect("kill -9");
    child.wait().expect("reaped");
    let mut child = common::spawn_kshard(&data, &["--storage-cache-bytes", cache]);
    let client = common::client_for(&data.join("kubeconfig")).await;
    let list = client
        .request_text(
            http::Request::get(common::WIDGETS)
                .body(Vec::new())
                .expect("list"),
        )
        .await
        .expect("list");
    let list: serde_json::Value = serde_json::from_str(&list).expect("json");
    let names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    for name in &acked {
        assert!(names.contains(&name.as_str()), "acknowledged {name} lost");
    }
    // An error answer meant "not written": it was not, before the restart
    // (the store reopened) or after.
    for name in &refused_names {
        assert!(
            !names.contains(&name.as_str()),
            "{name} was refused with an error, yet stored"
        );
    }
    eprintln!(
        "{} acknowledged writes, all present after restart; {} refused, none present",
        acked.len(),
        refused_names.len()
    );
    let _ = child.kill();
    let _ = child.wait();
}
