//! Memory of a server while one large object is updated again and again:
//! 600 updates of a ~1 MB widget (a merge patch that replaces a 1 MB string
//! each time), with no watcher and with one watcher that reads every event.
//! Each case runs the real `kshard serve` binary afresh, with default flags
//! unless the case changes one thing (a flag, or an allocator option in the
//! environment), and samples its resident memory every 100 ms from
//! `/proc/<pid>/status` (RSS, and its anonymous and file-backed parts).
//!
//! - idle: the median RSS over the second after start-up (before any request);
//! - plateau: the median of the last third of the samples taken during the
//!   updates, minus idle;
//! - peak: the largest sample, minus idle;
//! - settled: 10 s after the last update, minus idle.
//!
//! Not timed: the figures are memory. `cargo bench --bench large_objects`
//! (or `KSHARD_BIN=<release kshard>` with `--profile release`) writes
//! `target/bench/large_objects.{json,svg}`. Environment:
//! `KSHARD_LARGE_UPDATES` (600), `KSHARD_LARGE_CASES` (comma-separated case
//! names, default all), `KSHARD_LARGE_WATCHERS` (`0,1`), `KSHARD_LARGE_SMOKE=1`
//! (30 updates, the default case only, into `large_objects-smoke.{json,svg}`:
//! checks the command works).
//!
//! Bounds (no watcher): with `--watch-cache-history-bytes 8Mi` and
//! `MIMALLOC_PURGE_DELAY=0` the plateau stays under `BOUND` (100 MB); with
//! the 8 MiB history alone under `HISTORY_BOUND`; with default flags under `DEFAULT_BOUND`
//! (the 64 MiB history, and what the allocator keeps of freed blocks for its
//! purge delay: measured 146–177 MB). See benches/README.md for what holds
//! the memory, cause by cause.
//!
//! A separate benchmark from `watch_stall.rs`: that one asserts what stalled
//! watchers may pin (hundreds of MB by design, their connections' buffers);
//! this one measures what the server itself keeps for large objects, one
//! cause at a time, and samples memory through the run rather than its peak.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const OBJECT_BYTES: usize = 1_000_000;
/// The plateau over idle with the flags that bound it: an 8 MiB history
/// and mimalloc's purge delay at 0 (no watcher).
const BOUND: u64 = 100_000_000;
/// The plateau over idle with an 8 MiB history alone: what stays above
/// the history are freed 1 MB blocks waiting out mimalloc's 1 s purge
/// delay, which moves with the update rate (92–110 MB in runs of
/// 2026-11-29): a regression guard.
const HISTORY_BOUND: u64 = 150_000_000;
/// The plateau over idle with default flags (no watcher): a regression guard.
const DEFAULT_BOUND: u64 = 250_000_000;
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// One thing changed from the defaults.
struct Case {
    name: &'static str,
    what: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case {
        name: "default",
        what: "default flags",
        args: &[],
        env: &[],
    },
    Case {
        name: "history-8Mi",
        what: "--watch-cache-history-bytes 8Mi",
        args: &["--watch-cache-history-bytes", "8Mi"],
        env: &[],
    },
    Case {
        name: "history-0",
        what: "--watch-cache-history-bytes 0 (no event kept)",
        args: &["--watch-cache-history-bytes", "0"],
        env: &[],
    },
    Case {
        name: "storage-cache-64Mi",
        what: "--storage-cache-bytes 64Mi (default 4Mi)",
        args: &["--storage-cache-bytes", "64Mi"],
        env: &[],
    },
    Case {
        name: "purge-delay-0",
        what: "MIMALLOC_PURGE_DELAY=0 (mimalloc v3 default 1000 ms)",
        args: &[],
        env: &[("MIMALLOC_PURGE_DELAY", "0")],
    },
    Case {
        name: "purge-delay-10",
        what: "MIMALLOC_PURGE_DELAY=10 (mimalloc v2's default)",
        args: &[],
        env: &[("MIMALLOC_PURGE_DELAY", "10")],
    },
    Case {
        name: "no-thp",
        what: "MIMALLOC_ALLOW_THP=0",
        args: &[],
        env: &[("MIMALLOC_ALLOW_THP", "0")],
    },
    Case {
        name: "no-arena-eager-commit",
        what: "MIMALLOC_ARENA_EAGER_COMMIT=0",
        args: &[],
        env: &[("MIMALLOC_ARENA_EAGER_COMMIT", "0")],
    },
    Case {
        name: "purge-0-history-8Mi",
        what: "MIMALLOC_PURGE_DELAY=0 and --watch-cache-history-bytes 8Mi",
        args: &["--watch-cache-history-bytes", "8Mi"],
        env: &[("MIMALLOC_PURGE_DELAY", "0")],
    },
];

#[derive(Clone, Copy, Default)]
struct Sample {
    at: f64,
    rss: u64,
    anon: u64,
    file: u64,
}

fn sample(pid: u32, start: Instant) -> Option<Sample> {
    let field = |name: &str| common::try_proc_status_bytes(pid, name).unwrap_or(0);
    Some(Sample {
        at: start.elapsed().as_secs_f64(),
        rss: common::try_proc_status_bytes(pid, "VmRSS:")?,
        anon: field("RssAnon:"),
        file: field("RssFile:") + field("RssShmem:"),
    })
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

struct Outcome {
    idle: u64,
    plateau: Sample,
    peak: u64,
    settled: Sample,
    secs: f64,
    samples: Vec<Sample>,
}

async fn run_case(case: &Case, watchers: usize, updates: usize) -> Outcome {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = common::spawn_kshard_with(&data, case.args, case.env);
    let pid = child.id();
    let start = Instant::now();
    // Idle: the second after start-up, before any request.
    let mut idle = Vec::new();
    for _ in 0..10 {
        tokio::time::sleep(SAMPLE_EVERY).await;
        idle.push(sample(pid, start).expect("alive").rss);
    }
    let idle = median(idle);

    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (samples, stop) = (samples.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = sample(pid, start) {
                    samples.lock().expect("samples").push(s);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        })
    };

    let client = common::client_for(&data.join("kubeconfig")).await;
    let create = http::Request::post(common::WIDGETS)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&common::widget("big", 0)).expect("json"))
        .expect("request");
    client.request_text(create).await.expect("created");
    let frames = Arc::new(AtomicUsize::new(0));
    for _ in 0..watchers {
        common::line_counting_watch(&data, frames.clone(), 3600).await;
    }
    let began = Instant::now();
    let first_sample = samples.lock().expect("samples").len();
    for i in 1..=updates {
        common::rewrite_big_widget(&client, &mut child, i, OBJECT_BYTES).await;
        if i % 100 == 0 {
            eprintln!("    {i}/{updates} updates");
        }
    }
    let secs = began.elapsed().as_secs_f64();
    let during: Vec<Sample> = samples.lock().expect("samples")[first_sample..].to_vec();
    if watchers > 0 {
        common::eventually("the watcher gets every update", || {
            let frames = frames.clone();
            async move { frames.load(Ordering::Relaxed) >= updates * watchers }
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let settled = sample(pid, start).expect("alive");
    assert!(child.try_wait().expect("wait").is_none(), "the server died");
    let last_third = &during[during.len() * 2 / 3..];
    let plateau = Sample {
        at: 0.0,
        rss: median(last_third.iter().map(|s| s.rss).collect()),
        anon: median(last_third.iter().map(|s| s.anon).collect()),
        file: median(last_third.iter().map(|s| s.file).collect()),
    };
    let peak = during.iter().map(|s| s.rss).max().unwrap_or(idle);
    let all = samples.lock().expect("samples").clone();
    Outcome {
        idle,
        plateau,
        peak,
        settled,
        secs,
        samples: all,
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1_000_000.0
}

fn over(b: u64, idle: u64) -> f64 {
    (b as f64 - idle as f64) / 1_000_000.0
}

/// Bars of each case's plateau over idle, one per watcher count.
fn plot(rows: &[(String, usize, f64)], updates: usize) -> String {
    let (w, bar, gap, left) = (900.0, 16.0, 10.0, 330.0);
    let max = rows.iter().map(|r| r.2).fold(100.0_f64, f64::max) * 1.1;
    let h = 70.0 + rows.len() as f64 * (bar + gap);
    let x = |v: f64| left + (w - left - 60.0) * v.max(0.0) / max;
    let mut body = String::new();
    for (i, (name, watchers, plateau)) in rows.iter().enumerate() {
        let y = 50.0 + i as f64 * (bar + gap);
        let color = if *watchers == 0 {
            "steelblue"
        } else {
            "darkorange"
        };
        body += &format!(
            "<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"12\" text-anchor=\"end\">{name}, {watchers} watcher{}</text>\
<rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{bar}\" fill=\"{color}\"/>\
<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"12\">{plateau:.0} MB</text>",
            left - 6.0,
            y + 12.0,
            if *watchers == 1 { "" } else { "s" },
            x(*plateau) - left,
            x(*plateau) + 4.0,
            y + 12.0,
        );
    }
    let limit = x(mb(BOUND));
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h:.0}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"10\" y=\"25\" font-size=\"15\">RSS plateau over idle during {updates} updates of a 1 MB object (MB)</text>\
{body}<line x1=\"{limit:.0}\" y1=\"40\" x2=\"{limit:.0}\" y2=\"{:.0}\" stroke=\"red\" stroke-dasharray=\"4\"/>\
<text x=\"{:.0}\" y=\"{:.0}\" font-size=\"11\" fill=\"red\">{} MB</text></svg>",
        h - 10.0,
        limit + 3.0,
        h - 12.0,
        BOUND / 1_000_000
    )
}

fn main() {
    let smoke = std::env::var("KSHARD_LARGE_SMOKE").is_ok_and(|v| v == "1");
    let updates: usize = std::env::var("KSHARD_LARGE_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 30 } else { 600 });
    let wanted: Option<Vec<String>> = std::env::var("KSHARD_LARGE_CASES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let watcher_counts: Vec<usize> = std::env::var("KSHARD_LARGE_WATCHERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 1]);
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| match &wanted {
            Some(w) => w.iter().any(|n| n == c.name),
            None => !smoke || c.name == "default",
        })
        .collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{updates} updates of a {} MB object; RSS over idle (load average at start: {})",
        OBJECT_BYTES / 1_000_000,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<22} {:>3} {:>7} {:>9} {:>11} {:>11} {:>7} {:>9} {:>6}",
        "case", "w", "idle", "plateau", "(anon)", "(file)", "peak", "settled", "s"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut results = Vec::new();
    let mut rows = Vec::new();
    let mut bounds = Vec::new();
    for case in &cases {
        for &w in &watcher_counts {
            let o = rt.block_on(run_case(case, w, updates));
            let plateau = over(o.plateau.rss, o.idle);
            println!(
                "{:<22} {:>3} {:>7.1} {:>9.1} {:>11.1} {:>11.1} {:>7.1} {:>9.1} {:>6.1}",
                case.name,
                w,
                mb(o.idle),
                plateau,
                mb(o.plateau.anon),
                mb(o.plateau.file),
                over(o.peak, o.idle),
                over(o.settled.rss, o.idle),
                o.secs
            );
            if w == 0 {
                let p = o.plateau.rss.saturating_sub(o.idle);
                match case.name {
                    "default" => bounds.push((case.name, p, DEFAULT_BOUND)),
                    "history-8Mi" => bounds.push((case.name, p, HISTORY_BOUND)),
                    "purge-0-history-8Mi" => bounds.push((case.name, p, BOUND)),
                    _ => {}
                }
            }
            rows.push((case.name.to_string(), w, plateau));
            results.push(json!({
                "case": case.name, "what": case.what, "watchers": w,
                "idle_mb": mb(o.idle), "plateau_over_idle_mb": plateau,
                "plateau_rss_anon_mb": mb(o.plateau.anon), "plateau_rss_file_mb": mb(o.plateau.file),
                "peak_over_idle_mb": over(o.peak, o.idle),
                "settled_10s_over_idle_mb": over(o.settled.rss, o.idle),
                "update_secs": o.secs,
                "samples": o.samples.iter().map(|s| json!([
                    (s.at * 10.0).round() / 10.0, mb(s.rss).round(), mb(s.anon).round()
                ])).collect::<Vec<Value>>(),
            }));
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("mkdir");
    let summary = json!({
        "updates": updates, "object_bytes": OBJECT_BYTES,
        "kshard_bin": std::env::var("KSHARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kshard").into()),
        "load_average_at_start": load.trim(),
        "samples_columns": ["seconds since start", "RSS MB", "RssAnon MB"],
        "cases": results,
    });
    // The smoke run does not overwrite a real run's results.
    let name = if smoke {
        "large_objects-smoke"
    } else {
        "large_objects"
    };
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&summary).expect("json"),
    )
    .expect("write");
    std::fs::write(out.join(format!("{name}.svg")), plot(&rows, updates)).expect("write");
    println!("wrote {}/{name}.{{json,svg}}", out.display());
    if !smoke {
        for (name, p, bound) in bounds {
            assert!(
                p < bound,
                "{name}: the plateau is {} MB over idle (bound {} MB)",
                p / 1_000_000,
                bound / 1_000_000
            );
        }
    }
}
