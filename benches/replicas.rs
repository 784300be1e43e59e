//! Creates per second through one replica vs round-robin through three, all
//! `kshard serve` processes on the in-process TiKV **test double** (not TiKV:
//! an in-memory Percolator store behind the real gRPC protocol, so the
//! figures say how replication and forwarding cost, not what TiKV does);
//! then failover: the longest time without an acknowledged write when the
//! leader of three, under write load through the two followers, is killed
//! (`kill -9`), stopped (SIGTERM) or frozen (SIGSTOP), default settings.
//!
//! `cargo bench --features tikv --bench replicas`; writes
//! `target/bench/replicas.{json,svg}`. `KSHARD_BENCH_FAILOVER_RUNS` (default
//! 3) runs of each failover; `KSHARD_BENCH_SECONDS=0` skips the throughput part.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::replicas::{shared_store, spawn_replica, wait_ready};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn widgets(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    Api::namespaced_with(client, "default", &ApiResource::from_gvk(&gvk))
}

/// Creates for `duration` with `clients` concurrent clients, spread over
/// `apis` in turn; returns creates per second.
async fn creates_per_sec(
    apis: &[Api<DynamicObject>],
    clients: usize,
    duration: Duration,
    tag: &str,
) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let api = apis[c % apis.len()].clone();
        let (done, failed) = (done.clone(), failed.clone());
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while t0.elapsed() < duration {
                i += 1;
                let obj: DynamicObject =
                    serde_json::from_value(common::widget(&format!("{tag}-{c}-{i}"), 1))
                        .expect("obj");
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let secs = t0.elapsed().as_secs_f64();
    let f = failed.load(Ordering::Relaxed);
    if f > 0 {
        eprintln!("{tag}: {f} creates failed");
    }
    done.load(Ordering::Relaxed) as f64 / secs
}

#[derive(Clone, Copy, Debug)]
enum Disruption {
    Kill,
    Term,
    Stop,
}

impl Disruption {
    fn name(self) -> &'static str {
        match self {
            Disruption::Kill => "kill -9",
            Disruption::Term => "SIGTERM",
            Disruption::Stop => "SIGSTOP",
        }
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status();
}

/// Three fresh replicas, `clients` writers through the two followers; the
/// leader is disrupted; returns the longest time without an acknowledged
/// create from then until 200 more were acknowledged (and the writes that
/// failed meanwhile).
async fn failover_gap(
    dir: &std::path::Path,
    run: usize,
    how: Disruption,
    clients: usize,
) -> (Duration, usize) {
    let (_double, pd, shard) = shared_store();
    // Object names: lowercase DNS labels.
    let tag = format!("{}{run}", how.name().replace([' ', '-'], "")).to_lowercase();
    let mut three = Vec::new();
    for id in ["a", "b", "c"] {
        three.push(spawn_replica(dir, &format!("{tag}-{id}"), &pd, &shard));
    }
    let mut apis = Vec::new();
    for r in &three {
        let client = r.client().await;
        wait_ready(&client, Duration::from_secs(30)).await;
        apis.push(widgets(client));
    }
    // The first replica started alone, so it leads.
    let followers = apis[1..].to_vec();
    let acks: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let failed = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(true));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let api = followers[c % followers.len()].clone();
        let (acks, failed, writing, tag) =
            (acks.clone(), failed.clone(), writing.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while writing.load(Ordering::Acquire) {
                i += 1;
                let obj: DynamicObject =
                    serde_json::from_value(common::widget(&format!("{tag}-{c}-{i}"), 1))
                        .expect("obj");
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => acks.lock().expect("lock").push(Instant::now()),
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks.lock().expect("lock").len() < 100 {
        assert!(
            Instant::now() < deadline,
            "{tag}: no writes before the disruption ({} failed)",
            failed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failed_before = failed.load(Ordering::Relaxed);
    let before = acks.lock().expect("lock").len();
    let at = Instant::now();
    match how {
        Disruption::Kill => three[0].kill(),
        Disruption::Term => signal(&three[0].child, "-TERM"),
        Disruption::Stop => signal(&three[0].child, "-STOP"),
    }
    let deadline = at + Duration::from_secs(30);
    while acks.lock().expect("lock").len() < before + 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let until = Instant::now();
    writing.store(false, Ordering::Release);
    for t in tasks {
        let _ = t.await;
    }
    if matches!(how, Disruption::Stop) {
        signal(&three[0].child, "-CONT");
    }
    let mut times = acks.lock().expect("lock").clone();
    times.sort();
    let mut last = times
        .iter()
        .rev()
        .find(|t| **t <= at)
        .copied()
        .unwrap_or(at);
    let mut gap = Duration::ZERO;
    for t in times.iter().filter(|t| **t > at && **t <= until) {
        gap = gap.max(t.duration_since(last));
        last = *t;
    }
    gap = gap.max(until.duration_since(last));
    (gap, failed.load(Ordering::Relaxed) - failed_before)
}

fn plot(bars: &[(&str, f64)], lines: &[String]) -> String {
    let (w, h, pad) = (640.0f64, 420.0f64, 50.0f64);
    // Bars below the text lines.
    let top = 30.0 + 16.0 * lines.len() as f64;
    let max = bars.iter().map(|b| b.1).fold(1.0, f64::max);
    let bw = (w - 2.0 * pad) / (bars.len() as f64 * 2.0);
    let mut shapes = String::new();
    for (i, (label, v)) in bars.iter().enumerate() {
        let x = pad + bw * (0.5 + 2.0 * i as f64);
        let bh = v / max * (h - pad - top);
        shapes.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{bh:.1}\" fill=\"steelblue\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{label}: {v:.0}/s</text>",
            h - pad - bh,
            x + bw / 2.0,
            h - pad + 16.0
        ));
    }
    for (i, l) in lines.iter().enumerate() {
        shapes.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"12\" font-family=\"monospace\">{l}</text>",
            pad,
            20.0 + 16.0 * i as f64
        ));
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>{shapes}</svg>",
        y0 = h - pad,
        x1 = w - pad,
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let clients = env_usize("KSHARD_BENCH_CLIENTS", 32);
    let secs = env_usize("KSHARD_BENCH_SECONDS", 10) as u64;
    let runs = env_usize("KSHARD_BENCH_FAILOVER_RUNS", 3);
    let duration = Duration::from_secs(secs);
    let dir = tempfile::tempdir().expect("tmp");

    let mut failover = serde_json::Map::new();
    let mut failover_lines = Vec::new();
    for how in [Disruption::Kill, Disruption::Term, Disruption::Stop] {
        let mut gaps = Vec::new();
        let mut failed = 0;
        for run in 0..runs {
            let (gap, f) = failover_gap(dir.path(), run, how, 8).await;
            eprintln!(
                "{}: run {run}: longest gap {gap:?}, {f} writes failed",
                how.name()
            );
            gaps.push(gap.as_secs_f64());
            failed += f;
        }
        gaps.sort_by(f64::total_cmp);
        let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0);
        let max = gaps.last().copied().unwrap_or(0.0);
        failover_lines.push(format!(
            "{:<8} leader: writes paused {:.2} s median, {:.2} s max ({runs} runs, {failed} failed)",
            how.name(),
            median,
            max
        ));
        failover.insert(
            how.name().to_string(),
            json!({"gaps_seconds": gaps, "median_seconds": median, "max_seconds": max, "failed_writes": failed}),
        );
    }
    for l in &failover_lines {
        println!("{l}");
    }
    if secs == 0 {
        return;
    }

    // One replica alone on its own double.
    let (double, pd, shard) = shared_store();
    let solo = spawn_replica(dir.path(), "solo", &pd, &shard);
    let solo_api = widgets(solo.client().await);
    wait_ready(&solo_api.clone().into_client(), Duration::from_secs(30)).await;
    eprintln!("one replica: {clients} clients for {secs} s...");
    let one = creates_per_sec(&[solo_api], clients, duration, "one").await;
    drop(solo);
    drop(double);

    // Three replicas of one shard on a fresh double; clients spread over them.
    let (_double, pd, shard) = shared_store();
    let mut three = Vec::new();
    for id in ["a", "b", "c"] {
        three.push(spawn_replica(dir.path(), id, &pd, &shard));
    }
    let mut apis = Vec::new();
    for r in &three {
        let client = r.client().await;
        wait_ready(&client, Duration::from_secs(30)).await;
        apis.push(widgets(client));
    }
    eprintln!("three replicas: {clients} clients for {secs} s...");
    let spread = creates_per_sec(&apis, clients, duration, "three").await;
    let leader_only = creates_per_sec(&apis[..1], clients, duration, "leader").await;
    drop(three);

    let lines =
        vec![
            "kshard replicas on the TiKV TEST DOUBLE (in-memory; not TiKV)".to_string(),
            format!(
            "{clients} clients, {secs} s each, {} build, 2-core machine shared by all processes",
            if cfg!(debug_assertions) { "debug" } else { "release" }
        ),
            format!("1 replica:                     {one:.0} creates/s"),
            format!("3 replicas, round-robin:       {spread:.0} creates/s"),
            format!("3 replicas, all to the leader: {leader_only:.0} creates/s"),
        ]
        .into_iter()
        .chain(failover_lines)
        .collect::<Vec<_>>();
    for l in &lines {
        println!("{l}");
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("mkdir");
    let summary = json!({
        "store": "tikv-double (in-process test double, not TiKV)",
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "clients": clients, "seconds": secs,
        "one_replica_creates_per_sec": one,
        "three_replicas_round_robin_creates_per_sec": spread,
        "three_replicas_all_to_leader_creates_per_sec": leader_only,
        "failover_8_writers_through_followers": failover,
    });
    std::fs::write(
        out.join("replicas.json"),
        serde_json::to_vec_pretty(&summary).expect("json"),
    )
    .expect("write");
    std::fs::write(
        out.join("replicas.svg"),
        plot(
            &[
                ("1 replica", one),
                ("3, round-robin", spread),
                ("3, leader only", leader_only),
            ],
            &lines,
        ),
    )
    .expect("write");
    println!("wrote {}/replicas.json and replicas.svg", out.display());
}
