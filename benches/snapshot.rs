//! Backup and restore of 10,000 and 100,000 objects: `kshard snapshot save` from a
//! running server (the release binary, embedded store) and `kshard snapshot
//! restore` into a new data directory (and into the TiKV test double), each
//! timed, with the peak resident memory of the command and, for the save,
//! of the server while it streams. Then the restored server is started and
//! its list checked.
//!
//! `cargo bench --features tikv --bench snapshot`; writes
//! `target/bench/snapshot.json`. Env: `KSHARD_SNAPSHOT_OBJECTS` (the sizes,
//! comma-separated; `10000,100000`: memory that does not grow with the data
//! is the same at both),
//! `KSHARD_SNAPSHOT_SMOKE=1` (2,000 objects: checks the commands work end to
//! end; CI runs it on the debug build), `KSHARD_BIN` (another kshard build).
//!
//! Objects are widgets of about 1 KiB as stored (as in benches/etcd.rs),
//! created through the API by 32 clients.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn smoke() -> bool {
    std::env::var("KSHARD_SNAPSHOT_SMOKE").is_ok_and(|v| v == "1")
}

fn progress(msg: &str) {
    eprintln!("[snapshot bench] {msg}");
}

fn widgets(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    Api::namespaced_with(client, "bench", &ApiResource::from_gvk(&gvk))
}

/// A widget of about 1 KiB as stored.
fn widget_1k(name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "labels": {"bench": "true"},
                     "annotations": {"bench.kshard.dev/payload": "x".repeat(640)}},
        "spec": {"replicas": 1, "color": "blue"},
    }))
    .expect("widget")
}

/// One command's run: how long, its peak resident memory, and the peak of
/// another process (the server) meanwhile.
struct Run {
    seconds: f64,
    peak_rss: u64,
    other_peak_rss: u64,
    stdout: String,
}

/// Runs `kshard <args>`, sampling its peak resident memory (VmHWM) and
/// `other`'s resident memory every 5 ms until it exits.
fn run_sampled(args: &[&str], other: Option<u32>) -> Run {
    let started = Instant::now();
    let mut child = Command::new(common::kshard_bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kshard");
    let pid = child.id();
    let (mut peak, mut other_peak) = (0, 0);
    loop {
        if let Some(hwm) = common::try_proc_status_bytes(pid, "VmHWM:") {
            peak = peak.max(hwm);
        }
        if let Some(o) = other.and_then(|p| common::try_proc_status_bytes(p, "VmRSS:")) {
            other_peak = other_peak.max(o);
        }
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    let out = child.wait_with_output().expect("output");
    assert!(
        out.status.success(),
        "kshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Run {
        seconds,
        peak_rss: peak,
        other_peak_rss: other_peak,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

async fn populate(api: &Api<DynamicObject>, n: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (api, next) = (api.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    api.create(&PostParams::default(), &widget_1k(&format!("w{i:06}")))
                        .await
                        .expect("create");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
}

async fn count(api: &Api<DynamicObject>) -> usize {
    let mut n = 0;
    let mut lp = ListParams::default().limit(5000);
    loop {
        let page = api.list(&lp).await.expect("list");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return n,
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sizes: Vec<usize> = if smoke() {
        vec![2_000]
    } else {
        std::env::var("KSHARD_SNAPSHOT_OBJECTS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![10_000, 100_000])
    };
    let mut results = Vec::new();
    let mut lines = Vec::new();
    for objects in sizes {
        let (summary, mut l) = measure(objects).await;
        results.push(summary);
        lines.append(&mut l);
    }
    for l in &lines {
        println!("{l}");
    }
    let out = common::repo_path("target/bench");
    std::fs::create_dir_all(&out).expect("target/bench");
    std::fs::write(
        out.join("snapshot.json"),
        serde_json::to_string_pretty(&json!({"runs": results, "lines": lines})).expect("json"),
    )
    .expect("write results");
}

/// One size, on fresh servers and stores: the figures and their lines.
async fn measure(objects: usize) -> (serde_json::Value, Vec<String>) {
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let dir = tempfile::tempdir().expect("tmp");
    let source = dir.path().join("source");
    let server = common::spawn_kshard(&source, &[]);
    let api = widgets(common::client_for(&source.join("kubeconfig")).await);
    progress(&format!(
        "creating {objects} objects of ~1 KiB ({build} build)…"
    ));
    let t = Instant::now();
    populate(&api, objects).await;
    progress(&format!("created in {:.1} s", t.elapsed().as_secs_f64()));

    let file = dir.path().join("bench.snap");
    let server_pid = server.id();
    let server_before = common::try_proc_status_bytes(server_pid, "VmRSS:").unwrap_or(0);
    progress("saving through the API…");
    let save = tokio::task::block_in_place(|| {
        run_sampled(
            &[
                "snapshot",
                "save",
                file.to_str().expect("path"),
                "--data-dir",
                source.to_str().expect("path"),
                "-q",
            ],
            Some(server_pid),
        )
    });
    let file_bytes = std::fs::metadata(&file).expect("file").len();
    progress(save.stdout.trim());
    drop(server);

    let restored = dir.path().join("restored");
    progress("restoring into a new data directory…");
    let restore = tokio::task::block_in_place(|| {
        run_sampled(
            &[
                "snapshot",
                "restore",
                file.to_str().expect("path"),
                "--data-dir",
                restored.to_str().expect("path"),
                "-q",
            ],
            None,
        )
    });
    progress(restore.stdout.trim());
    let t = Instant::now();
    let server = common::spawn_kshard(&restored, &[]);
    let started = t.elapsed().as_secs_f64();
    let api = widgets(common::client_for(&restored.join("kubeconfig")).await);
    let listed = count(&api).await;
    assert_eq!(listed, objects, "the restored server lists other objects");
    drop(server);

    #[cfg(feature = "tikv")]
    let tikv = {
        let double = tikv_double::TikvDouble::start().expect("double");
        let store = format!("tikv://{}?prefix=bench", double.pd_endpoint());
        progress("restoring into the TiKV test double…");
        let r = tokio::task::block_in_place(|| {
            run_sampled(
                &[
                    "snapshot",
                    "restore",
                    file.to_str().expect("path"),
                    "--store",
                    &store,
                    "-q",
                ],
                None,
            )
        });
        progress(r.stdout.trim());
        Some(r)
    };
    #[cfg(not(feature = "tikv"))]
    let tikv: Option<Run> = None;

    let lines = [
        format!("kshard snapshot, {objects} objects of ~1 KiB, {build} build, 2-core machine"),
        format!(
            "save (API, embedded store): {:.2} s, {:.0} MiB file; CLI peak RSS {:.1} MiB; server RSS {:.1} MiB before, peak {:.1} MiB while streaming (+{:.1} MiB)",
            save.seconds,
            mib(file_bytes),
            mib(save.peak_rss),
            mib(server_before),
            mib(save.other_peak_rss),
            mib(save.other_peak_rss.saturating_sub(server_before)),
        ),
        format!(
            "restore (new embedded data directory): {:.2} s; CLI peak RSS {:.1} MiB; restored server serving after {:.2} s, {listed} objects listed",
            restore.seconds,
            mib(restore.peak_rss),
            started
        ),
        match &tikv {
            Some(r) => format!(
                "restore (TiKV test double, in this process): {:.2} s; CLI peak RSS {:.1} MiB",
                r.seconds,
                mib(r.peak_rss)
            ),
            None => "restore into TiKV: not built (feature `tikv`)".into(),
        },
    ];
    let summary = json!({
        "objects": objects,
        "build": build,
        "file_bytes": file_bytes,
        "save": {
            "seconds": save.seconds,
            "cli_peak_rss_bytes": save.peak_rss,
            "server_rss_before_bytes": server_before,
            "server_peak_rss_bytes": save.other_peak_rss,
        },
        "restore_embedded": {
            "seconds": restore.seconds,
            "cli_peak_rss_bytes": restore.peak_rss,
            "restored_server_start_seconds": started,
        },
        "restore_tikv_double": tikv.as_ref().map(|r| json!({
            "seconds": r.seconds,
            "cli_peak_rss_bytes": r.peak_rss,
        })),
    });
    (summary, lines.to_vec())
}
