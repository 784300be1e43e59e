//! End-to-end benchmark through the HTTP API (real TLS, real store on disk):
//! creates per second with concurrent clients (1 KiB objects) and their
//! p50/p99 latency, a LIST of 10,000 objects, and the time for one write to
//! reach 100 watchers. Prints the numbers, writes them as JSON and an SVG plot
//! under `target/bench/`.
//!
//! `cargo bench --bench api` (env: KSHARD_BENCH_OBJECTS, KSHARD_BENCH_CLIENTS).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const WIDGETS: &str = "/apis/demo.kshard.dev/v1/namespaces/bench/widgets";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

fn body_1k(name: &str) -> Vec<u8> {
    // About 1 KiB on the wire once metadata is added.
    let filler = "x".repeat(760);
    serde_json::to_vec(&json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "labels": {"bench": "true", "app": "load"}},
        "spec": {"replicas": 1, "color": "blue", "payload": filler},
    }))
    .expect("json")
}

async fn send(c: &kube::Client, method: &str, uri: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect_bytes()
        .await
        .expect("body")
        .to_vec();
    (status, bytes)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// An SVG of the create-latency distribution (CDF) with the headline numbers.
fn plot(latencies: &[Duration], lines: &[String]) -> String {
    let (w, h, pad) = (720.0, 420.0, 60.0);
    let max = latencies.last().map(|d| ms(*d)).unwrap_or(1.0).max(0.001);
    let n = latencies.len().max(1) as f64;
    let mut points = String::new();
    let step = (latencies.len() / 500).max(1);
    for (i, d) in latencies.iter().enumerate().step_by(step) {
        let x = pad + ms(*d) / max * (w - 2.0 * pad);
        let y = h - pad - (i as f64 + 1.0) / n * (h - 2.0 * pad);
        points.push_str(&format!("{x:.1},{y:.1} "));
    }
    let mut text = String::new();
    for (i, l) in lines.iter().enumerate() {
        text.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"12\" font-family=\"monospace\">{}</text>",
            pad + 10.0,
            pad + 16.0 * i as f64,
            l
        ));
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\
<line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{y0}\" stroke=\"black\"/>\
<text x=\"{cx}\" y=\"{ly}\" font-size=\"13\" text-anchor=\"middle\">create latency (ms), 0 to {max:.1}</text>\
<text x=\"15\" y=\"{cy}\" font-size=\"13\" transform=\"rotate(-90 15 {cy})\" text-anchor=\"middle\">fraction of requests</text>\
<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"2\" points=\"{points}\"/>{text}</svg>",
        y0 = h - pad,
        x1 = w - pad,
        cx = w / 2.0,
        ly = h - 20.0,
        cy = h / 2.0,
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let objects = env_usize("KSHARD_BENCH_OBJECTS", 10_000);
    let clients = env_usize("KSHARD_BENCH_CLIENTS", 32);
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = kshard::server::ServeConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        crds: vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/examples")],
        ..Default::default()
    };
    let server = kshard::server::start(cfg).await.expect("server");
    let c = client(&server.kubeconfig).await;

    // 1. Creates with concurrent clients.
    eprintln!("creating {objects} objects with {clients} concurrent clients...");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let c = c.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= objects {
                    return lat;
                }
                if i > 0 && i.is_multiple_of(2000) {
                    eprintln!("  {i}/{objects}");
                }
                let start = Instant::now();
                let (status, _) = send(&c, "POST", WIDGETS, body_1k(&format!("w{i:06}"))).await;
                assert_eq!(status, 201);
                lat.push(start.elapsed());
            }
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    let elapsed = t0.elapsed();
    latencies.sort();
    let creates_per_sec = objects as f64 / elapsed.as_secs_f64();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));

    // 2. LIST of all objects (consistent read from the watch cache), a few times.
    let mut list_times = Vec::new();
    let mut list_bytes = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let (status, body) = send(&c, "GET", WIDGETS, vec![]).await;
        assert_eq!(status, 200);
        list_times.push(t.elapsed());
        list_bytes = body.len();
    }
    list_times.sort();
    let list_median = percentile(&list_times, 0.5);
    let t = Instant::now();
    let (status, _) = send(&c, "GET", &format!("{WIDGETS}?limit=500"), vec![]).await;
    assert_eq!(status, 200);
    let first_page = t.elapsed();

    // 3. One write fanned out to 100 watchers.
    let watchers = 100;
    let rv = server.registry.revision();
    let mut streams = Vec::new();
    for _ in 0..watchers {
        let req = http::Request::get(format!("{WIDGETS}?watch=true&resourceVersion={rv}"))
            .body(kube::client::Body::empty())
            .expect("req");
        let resp = c.send(req).await.expect("watch");
        streams.push(resp.into_body().into_data_stream());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let waits = streams.into_iter().map(|mut s| async move {
        while let Some(chunk) = s.next().await {
            if chunk.map(|b| b.contains(&b'\n')).unwrap_or(false) {
                return Instant::now();
            }
        }
        Instant::now()
    });
    let all = futures::future::join_all(waits);
    let (status, _) = send(&c, "POST", WIDGETS, body_1k("fanout")).await;
    assert_eq!(status, 201);
    let arrivals = all.await;
    let fanout = arrivals
        .iter()
        .map(|a| a.duration_since(t))
        .max()
        .unwrap_or_default();

    let lines = vec![
        format!("creates: {objects} x 1 KiB, {clients} clients: {creates_per_sec:.0}/s"),
        format!(
            "create latency p50 {:.2} ms, p99 {:.2} ms",
            ms(p50),
            ms(p99)
        ),
        format!(
            "LIST {objects} objects ({:.1} MB): median {:.1} ms",
            list_bytes as f64 / 1e6,
            ms(list_median)
        ),
        format!("LIST first page of 500: {:.1} ms", ms(first_page)),
        format!(
            "one write to {watchers} watchers: {:.2} ms (last arrival)",
            ms(fanout)
        ),
    ];
    for l in &lines {
        println!("{l}");
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("mkdir");
    let summary = json!({
        "objects": objects, "clients": clients, "creates_per_sec": creates_per_sec,
        "create_p50_ms": ms(p50), "create_p99_ms": ms(p99),
        "list_all_median_ms": ms(list_median), "list_all_bytes": list_bytes,
        "list_first_page_500_ms": ms(first_page), "fanout_100_watchers_ms": ms(fanout),
    });
    std::fs::write(
        out.join("api.json"),
        serde_json::to_vec_pretty(&summary).expect("json"),
    )
    .expect("write");
    std::fs::write(out.join("api.svg"), plot(&latencies, &lines)).expect("write");
    println!("wrote {}/api.json and api.svg", out.display());
    server.shutdown();
}
