//! History compaction on the embedded store, against the number of objects
//! stored: `N` widgets of about 1.3 KiB are created (64 writers, through
//! `storage::Store`, no HTTP), the history compacted once, then `K` of them
//! updated and the history compacted again: the work a compactor does every
//! five minutes on a large, quiet store. Beside it, a scan of every stored
//! version, which is what compaction read every time until 2026-11-29 (it
//! looked for the versions to drop among all of them; now the event log's
//! records since the last compaction name them).
//!
//! `cargo bench --bench compaction`; writes `target/bench/compaction.json`.
//! Env: `KSHARD_COMPACTION_OBJECTS` (N, comma-separated sizes;
//! `100000,400000`), `KSHARD_COMPACTION_UPDATES` (K; 1,000),
//! `KSHARD_COMPACTION_SMOKE=1` (2,000 objects: checks it works end to end;
//! CI runs it on the debug build; writes `compaction-smoke.{json,svg}`). CPU times are the kernel's 10 ms ticks:
//! for a compaction of milliseconds, read the wall time.

#[path = "../tests/common/mod.rs"]
mod common;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use kshard::storage::embedded::Embedded;
use kshard::storage::{Store, Write};
use serde_json::{json, Value};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WRITERS: usize = 64;

fn smoke() -> bool {
    std::env::var("KSHARD_COMPACTION_SMOKE").is_ok_and(|v| v == "1")
}

fn progress(msg: &str) {
    eprintln!("[compaction bench] {msg}");
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| default.to_vec())
}

/// A widget of about 1.3 KiB as stored (as in benches/etcd.rs).
fn widget(name: &str, replicas: usize) -> Value {
    json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "namespace": "bench", "uid": uuid::Uuid::new_v4().to_string(),
                     "labels": {"bench": "true"},
                     "annotations": {"bench.kshard.dev/payload": "x".repeat(640)}},
        "spec": {"replicas": replicas, "color": "blue"},
    })
}

fn key(i: usize) -> String {
    format!("demo.kshard.dev/widgets/bench/w-{i}")
}

/// This process's CPU time (user and system), in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// Wall and CPU seconds of `f`.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, f64, f64) {
    let (start, cpu) = (Instant::now(), cpu_seconds());
    let out = f.await;
    (out, start.elapsed().as_secs_f64(), cpu_seconds() - cpu)
}

/// Writes `writes` from `WRITERS` tasks; the revisions, in `writes`' order.
async fn write_all(store: &Arc<Store>, writes: Vec<Write>) -> Vec<u64> {
    let n = writes.len();
    let writes = Arc::new(std::sync::Mutex::new(
        writes.into_iter().enumerate().collect::<Vec<_>>(),
    ));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (store, writes) = (store.clone(), writes.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let next = writes.lock().expect("writes").pop();
                let Some((i, w)) = next else { break };
                let rev = store.write(w).await.expect("write").revision;
                done.push((i, rev));
            }
            done
        }));
    }
    let mut revs = vec![0; n];
    for t in tasks {
        for (i, rev) in t.await.expect("writer") {
            revs[i] = rev;
        }
    }
    revs
}

struct Point {
    objects: usize,
    updates: usize,
    create_s: f64,
    first_compaction: (f64, f64),
    window_compaction: (f64, f64),
    full_scan: (f64, f64),
    versions_after: usize,
}

async fn measure(objects: usize, updates: usize) -> Point {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(Embedded::open(&dir.path().join("store.redb")).expect("open"));
    let store = Store::open(engine).expect("store");
    progress(&format!("{objects} objects: creating…"));
    let creates = (0..objects)
        .map(|i| Write::Create {
            key: key(i),
            object: widget(&format!("w-{i}"), 1),
        })
        .collect();
    let (revs, create_s, _) = timed(write_all(&store, creates)).await;
    progress(&format!(
        "{objects} objects: created in {create_s:.1} s; compacting the creates' history…"
    ));
    let (r, wall, cpu) = timed(store.compact(store.revision())).await;
    r.expect("compact");
    let first_compaction = (wall, cpu);
    progress(&format!(
        "{objects} objects: first compaction {wall:.2} s ({cpu:.2} s CPU); {updates} updates…"
    ));
    let step = (objects / updates.max(1)).max(1);
    let picked: Vec<usize> = (0..objects).step_by(step).take(updates).collect();
    let writes = picked
        .iter()
        .map(|&i| Write::Update {
            key: key(i),
            expected: revs[i],
            object: widget(&format!("w-{i}"), 2),
        })
        .collect();
    write_all(&store, writes).await;
    let (r, wall, cpu) = timed(store.compact(store.revision())).await;
    r.expect("compact");
    let window_compaction = (wall, cpu);
    progress(&format!(
        "{objects} objects: compaction of {updates} updates {:.1} ms ({:.1} ms CPU); scanning every version…",
        wall * 1e3,
        cpu * 1e3
    ));
    let engine = store.engine().clone();
    let ((versions, bytes), wall, cpu) = timed(async move {
        tokio::task::spawn_blocking(move || {
            let (mut n, mut bytes) = (0usize, 0usize);
            engine
                .read()
                .expect("read")
                .scan(b"v/", b"v0", &mut |_, v| {
                    n += 1;
                    bytes += v.len();
                    ControlFlow::Continue(())
                })
                .expect("scan");
            (n, bytes)
        })
        .await
        .expect("scan task")
    })
    .await;
    let full_scan = (wall, cpu);
    progress(&format!(
        "{objects} objects: a scan of every version ({versions}, {} MB) {:.0} ms ({:.0} ms CPU)",
        bytes / 1_000_000,
        wall * 1e3,
        cpu * 1e3
    ));
    assert_eq!(versions, objects, "one version per object after compaction");
    store.close();
    Point {
        objects,
        updates,
        create_s,
        first_compaction,
        window_compaction,
        full_scan,
        versions_after: versions,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --bench` runs this as a
    // test binary: only the smoke run then.
    let sizes = if smoke() {
        vec![2000]
    } else {
        env_list("KSHARD_COMPACTION_OBJECTS", &[100_000, 400_000])
    };
    let updates = if smoke() {
        100
    } else {
        env_list("KSHARD_COMPACTION_UPDATES", &[1000])[0]
    };
    if !smoke() && !std::env::args().any(|a| a == "--bench") {
        progress("not run: `cargo bench --bench compaction`, or KSHARD_COMPACTION_SMOKE=1");
        return;
    }
    let mut points = Vec::new();
    for n in sizes {
        points.push(measure(n, updates).await);
    }
    let mut rows = Vec::new();
    for p in &points {
        println!(
            "{} objects: compaction of {} updates {:.1} ms wall, {:.1} ms CPU; the scan of every version it used to make {:.0} ms wall, {:.0} ms CPU; first compaction (every object's creation) {:.2} s, {:.2} s CPU; creates {:.0}/s",
            p.objects,
            p.updates,
            p.window_compaction.0 * 1e3,
            p.window_compaction.1 * 1e3,
            p.full_scan.0 * 1e3,
            p.full_scan.1 * 1e3,
            p.first_compaction.0,
            p.first_compaction.1,
            p.objects as f64 / p.create_s,
        );
        rows.push(json!({
            "objects": p.objects,
            "updates": p.updates,
            "creates_per_sec": p.objects as f64 / p.create_s,
            "first_compaction_s": p.first_compaction.0,
            "first_compaction_cpu_s": p.first_compaction.1,
            "window_compaction_ms": p.window_compaction.0 * 1e3,
            "window_compaction_cpu_ms": p.window_compaction.1 * 1e3,
            "full_scan_ms": p.full_scan.0 * 1e3,
            "full_scan_cpu_ms": p.full_scan.1 * 1e3,
            "versions_after": p.versions_after,
        }));
    }
    let target = common::repo_path("target/bench");
    std::fs::create_dir_all(&target).expect("target/bench");
    let out = json!({"smoke": smoke(), "points": rows});
    // A smoke run leaves a full run's results alone.
    let name = if smoke() {
        "compaction-smoke"
    } else {
        "compaction"
    };
    std::fs::write(
        target.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&out).expect("json"),
    )
    .expect("write");
    std::fs::write(target.join(format!("{name}.svg")), plot(&points)).expect("write");
    progress(&format!(
        "wrote {}.{{json,svg}}",
        target.join(name).display()
    ));
}

/// Bars per size: the compaction of the updates' window and the scan of
/// every version that compaction used to make (wall milliseconds).
fn plot(points: &[Point]) -> String {
    let max = points
        .iter()
        .map(|p| p.full_scan.0.max(p.window_compaction.0) * 1e3)
        .fold(1.0, f64::max);
    let (left, width, row) = (250.0, 520.0, 70.0);
    let height = 60.0 + row * points.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{height}\"><rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"10\" y=\"25\" font-size=\"15\">Compaction of a window of updates against the scan of every version it used to make (ms)</text>"
    );
    for (i, p) in points.iter().enumerate() {
        let y = 50.0 + row * i as f64;
        let bars = [
            (
                format!("{} objects, {} updates: compaction", p.objects, p.updates),
                p.window_compaction.0 * 1e3,
                "steelblue",
            ),
            (
                format!("{} objects: scan of every version", p.objects),
                p.full_scan.0 * 1e3,
                "darkorange",
            ),
        ];
        for (j, (label, ms, color)) in bars.into_iter().enumerate() {
            let y = y + 26.0 * j as f64;
            let w = (ms / max * width).max(1.0);
            svg.push_str(&format!(
                "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">{label}</text><rect x=\"{left}\" y=\"{y}\" width=\"{w:.1}\" height=\"16\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"12\">{ms:.1} ms</text>",
                left - 6.0,
                y + 12.0,
                left + w + 5.0,
                y + 12.0,
            ));
        }
    }
    svg.push_str("</svg>");
    svg
}
