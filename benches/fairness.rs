//! Fairness through HTTP: a mouse's small GETs against an elephant's wide LISTs
//! in the same priority level. Reports the mouse's p50/p99 latency idle vs
//! loaded and the elephant's 429s; writes JSON and an SVG under `target/bench/`.
//!
//! `cargo bench --bench fairness`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::apf::{elephant_and_mouse, fill, install, level, schema};
use serde_json::json;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn pct(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * q) as usize]
}

fn bars(rows: &[(&str, f64)], title: &str) -> String {
    let max = rows.iter().map(|r| r.1).fold(1e-9, f64::max);
    let mut body = String::new();
    for (i, (label, v)) in rows.iter().enumerate() {
        let y = 50 + i * 40;
        let w = v / max * 480.0;
        body.push_str(&format!(
            "<text x=\"10\" y=\"{}\" font-size=\"13\" font-family=\"monospace\">{label}</text><rect x=\"200\" y=\"{}\" width=\"{w:.1}\" height=\"24\" fill=\"steelblue\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"12\">{v:.2} ms</text>",
            y + 17, y, 205.0 + w, y + 17
        ));
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{}\"><rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"10\" y=\"25\" font-size=\"15\">{title}</text>{body}</svg>",
        70 + rows.len() * 40
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let s = common::start_with_flowcontrol().await;
        install(
            &s,
            vec![schema("tenants", "tenants", "tenants")],
            vec![level("tenants", 9, json!({"type": "Queue", "queuing": {"queues": 16, "handSize": 2, "queueLengthLimit": 4}}))],
        ).await;
        eprintln!("filling 2000 objects...");
        fill(&s, 2000).await;
        eprintln!("mouse alone for 3 s...");
        let (idle, _, _, idle_failed) = elephant_and_mouse(&s, 0, Duration::from_secs(3)).await;
        eprintln!("mouse with a 32-client elephant for 10 s...");
        let (loaded, rejected, served, failed) = elephant_and_mouse(&s, 32, Duration::from_secs(10)).await;
        let lines = [
            format!("mouse idle:   p50 {:.2} ms, p99 {:.2} ms ({} GETs, {idle_failed} failed)", ms(pct(&idle, 0.5)), ms(pct(&idle, 0.99)), idle.len()),
            format!("mouse loaded: p50 {:.2} ms, p99 {:.2} ms ({} GETs, {failed} failed)", ms(pct(&loaded, 0.5)), ms(pct(&loaded, 0.99)), loaded.len()),
            format!("elephant: {served} LISTs served, {rejected} rejected with 429"),
        ];
        for l in &lines {
            println!("{l}");
        }
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
        std::fs::create_dir_all(&out).expect("mkdir");
        let summary = json!({
            "mouse_idle_p50_ms": ms(pct(&idle, 0.5)), "mouse_idle_p99_ms": ms(pct(&idle, 0.99)),
            "mouse_loaded_p50_ms": ms(pct(&loaded, 0.5)), "mouse_loaded_p99_ms": ms(pct(&loaded, 0.99)),
            "mouse_failed": failed, "elephant_served": served, "elephant_rejected": rejected,
        });
        std::fs::write(out.join("fairness.json"), serde_json::to_vec_pretty(&summary).expect("json")).expect("write");
        let svg = bars(
            &[
                ("mouse idle p50", ms(pct(&idle, 0.5))),
                ("mouse idle p99", ms(pct(&idle, 0.99))),
                ("mouse loaded p50", ms(pct(&loaded, 0.5))),
                ("mouse loaded p99", ms(pct(&loaded, 0.99))),
            ],
            &format!("mouse GET latency, elephant: {served} served / {rejected} rejected"),
        );
        std::fs::write(out.join("fairness.svg"), svg).expect("write");
        println!("wrote {}/fairness.json and fairness.svg", out.display());
        s.running.shutdown();
    });
}
