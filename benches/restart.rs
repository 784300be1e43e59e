//! A restart at scale: how long a `kshard serve` on an embedded store of N
//! widgets of about 1.3 KiB takes to answer `/readyz` and to serve a full
//! consistent list, and the memory it holds then.
//!
//! The store is filled the fast way: one widget is created through the API
//! on a scratch server and saved (`kshard snapshot save --store embedded`),
//! and a snapshot file of N copies of it (each its own name, uid and
//! resourceVersion) is generated and restored into a new data directory with
//! `kshard snapshot restore`, as an operator would. The server is started
//! on it once (the first start after the restore), stopped with SIGTERM,
//! and started again: the measured restart. Each start runs the release
//! binary with default flags on a fixed port; from the spawn the benchmark
//! polls `/readyz` every 20 ms and samples the server's RSS every 50 ms.
//! After the restart is ready it lists every widget without a
//! resourceVersion (a consistent read, as `kubectl get` does), first in pages
//! of 500 (`limit` and `continue`, one HTTP/1.1 connection, as client-go's
//! pager), then in one unpaged request, streaming the body.
//!
//! Reported per N: restore time; time to `/readyz` 200 at the first start
//! and at the restart; the restart's first page, full paged list and
//! unpaged list; RSS when ready, after the lists, and the peak (`VmHWM`);
//! the widgets' JSON (the sum of their stored encodings, and the unpaged
//! list's body). The kernel's page cache holds the store's file (it was just
//! written); `KSHARD_RESTART_COLD=1` evicts it before the restart
//! (`posix_fadvise(DONTNEED)` through `dd iflag=nocache`).
//!
//! `cargo bench --bench restart --profile release` (or `KSHARD_BIN=<release
//! kshard>`); writes `target/bench/restart.{json,svg}`. Environment:
//! `KSHARD_RESTART_OBJECTS` (comma-separated counts, default
//! `100000,1000000`), `KSHARD_RESTART_SMOKE=1` (2,000 objects, for CI on a
//! debug build), `KSHARD_RESTART_KEEP=1` keeps the data directories (under
//! `target/bench/restart-data`) for profiling.
//!
//! Targets (asserted for a million objects and more, after the results are
//! written): the restart answers `/readyz` and has served the paged list
//! within 30 s, with RSS when ready at most twice the widgets' JSON.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use kshard::snapshot::format::{Encoder, Entry, Header, Item};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAMESPACE: &str = "bench";
const TEMPLATE: &str = "w-template";
/// The restart's targets.
const READY_WITHIN: Duration = Duration::from_secs(30);
const RSS_PER_JSON: f64 = 2.0;
const PAGE: usize = 500;

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A widget of about 1.3 KiB as stored (as in benches/snapshot.rs).
fn widget(name: &str) -> Value {
    json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "labels": {"bench": "true"},
                     "annotations": {"bench.kshard.dev/payload": "x".repeat(640)}},
        "spec": {"replicas": 1, "color": "blue"},
    })
}

/// What a store with one widget holds, as a snapshot: the widget's entry
/// as a template, and every other entry (kshard's own objects).
struct Template {
    header: Header,
    /// The widget's store key without its name.
    key_prefix: String,
    /// Its JSON with `@@NAME@@`, `@@UID@@` and `@@RV@@` in place of its own.
    json: String,
    others: Vec<Entry>,
}

fn template(work: &Path) -> Template {
    let data = work.join("template");
    {
        let mut server = common::spawn_kshard(&data, &[]);
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let client = common::client_for(&data.join("kubeconfig")).await;
            let req = http::Request::post(format!(
                "/apis/demo.kshard.dev/v1/namespaces/{NAMESPACE}/widgets"
            ))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&widget(TEMPLATE)).expect("json"))
            .expect("request");
            client.request_text(req).await.expect("created");
        });
        stop(&mut server.0);
    }
    let file = work.join("template.snap");
    let out = Command::new(common::kshard_bin())
        .args([
            "snapshot",
            "save",
            "-q",
            "--store",
            "embedded",
            "--data-dir",
        ])
        .arg(&data)
        .arg(&file)
        .output()
        .expect("kshard snapshot save");
    assert!(
        out.status.success(),
        "snapshot save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut entries = Vec::new();
    let (header, _) = kshard::snapshot::format::read_all(
        std::fs::File::open(&file).expect("template snapshot"),
        |_, item| {
            if let Item::Objects(e) = item {
                entries.extend(e);
            }
            Ok(())
        },
    )
    .expect("read the template snapshot");
    let at = entries
        .iter()
        .position(|e| e.key.ends_with(&format!("/{NAMESPACE}/{TEMPLATE}")))
        .expect("the template widget in the snapshot");
    let w = entries.remove(at);
    let value: Value = serde_json::from_slice(&w.json).expect("json");
    let uid = value["metadata"]["uid"].as_str().expect("uid");
    let rv = value["metadata"]["resourceVersion"].as_str().expect("rv");
    let mut json = String::from_utf8(w.json.to_vec()).expect("utf8");
    for (from, to) in [
        (format!("\"name\":\"{TEMPLATE}\""), "\"name\":\"@@NAME@@\""),
        (format!("\"uid\":\"{uid}\""), "\"uid\":\"@@UID@@\""),
        (
            format!("\"resourceVersion\":\"{rv}\""),
            "\"resourceVersion\":\"@@RV@@\"",
        ),
    ] {
        assert_eq!(json.matches(&from).count(), 1, "{from} in {json}");
        json = json.replace(&from, to);
    }
    Template {
        header,
        key_prefix: w.key[..w.key.len() - TEMPLATE.len()].to_string(),
        json,
        others: entries,
    }
}

/// Writes a snapshot of `n` widgets (and the template's other objects);
/// returns the widgets' JSON bytes.
fn generate(t: &Template, n: usize, file: &Path) -> u64 {
    let started = Instant::now();
    let mut out = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(file).expect("snapshot file"),
    );
    let base = t.header.revision;
    let mut header = t.header.clone();
    header.revision = base + n as u64;
    let mut enc = Encoder::new();
    out.write_all(&enc.start(&header)).expect("write");
    let first = format!("{}w-", t.key_prefix);
    let (before, after): (Vec<&Entry>, Vec<&Entry>) = t.others.iter().partition(|e| e.key < first);
    let mut chunk: Vec<Entry> = before.into_iter().cloned().collect();
    let mut chunk_bytes = 0;
    let mut widget_bytes = 0u64;
    for i in 0..n {
        let name = format!("w-{i:07}");
        let rev = base + 1 + i as u64;
        let uid = format!("00000000-0000-4000-8000-{i:012}");
        let json = t
            .json
            .replace("@@NAME@@", &name)
            .replace("@@UID@@", &uid)
            .replace("@@RV@@", &rev.to_string());
        widget_bytes += json.len() as u64;
        chunk_bytes += json.len() + name.len() + t.key_prefix.len() + 16;
        chunk.push(Entry {
            key: format!("{}{name}", t.key_prefix),
            revision: rev,
            json: Bytes::from(json),
        });
        if chunk_bytes >= kshard::snapshot::format::CHUNK_BYTES {
            out.write_all(&enc.objects(&chunk)).expect("write");
            chunk.clear();
            chunk_bytes = 0;
        }
        if (i + 1) % 100_000 == 0 {
            eprintln!(
                "    generated {} widgets ({:.0} MiB) in {:.1} s",
                i + 1,
                mib(widget_bytes),
                started.elapsed().as_secs_f64()
            );
        }
    }
    chunk.extend(after.into_iter().cloned());
    if !chunk.is_empty() {
        out.write_all(&enc.objects(&chunk)).expect("write");
    }
    let (trailer, _) = enc.finish();
    out.write_all(&trailer).expect("write");
    out.flush().expect("flush");
    widget_bytes
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// SIGTERM (a graceful stop: the store is closed) and wait; how long it took.
fn stop(child: &mut std::process::Child) -> Duration {
    let t = Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    t.elapsed()
}

async fn tls(
    data: &Path,
    port: u16,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    if !data.join("pki/ca.crt").exists() {
        return None;
    }
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    common::connector_trusting(
        &data.join("pki"),
        rustls::crypto::ring::default_provider(),
        rustls::DEFAULT_VERSIONS,
        &[b"http/1.1"],
    )
    .connect(name, tcp)
    .await
    .ok()
}

async fn ready(data: &Path, port: u16) -> bool {
    let Some(mut c) = tls(data, port).await else {
        return false;
    };
    let req = "GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if c.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got).await;
    got.starts_with(b"HTTP/1.1 200")
}

/// Widgets in a list body chunk: each item starts with its apiVersion and kind.
const ITEM: &[u8] = b"\"kind\":\"Widget\",";

struct Lists {
    first_page: Duration,
    paged: Duration,
    pages: usize,
    paged_items: usize,
    unpaged: Duration,
    unpaged_items: usize,
    unpaged_bytes: u64,
}

/// Every widget in pages of `PAGE`, then in one request; both without a
/// resourceVersion (consistent reads).
async fn lists(data: &Path, port: u16) -> Lists {
    use hyper_util::rt::TokioIo;
    let base = format!("/apis/demo.kshard.dev/v1/namespaces/{NAMESPACE}/widgets");
    let io = tls(data, port).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(io))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let finder = memchr::memmem::Finder::new(ITEM);
    let started = Instant::now();
    let mut first_page = None;
    let (mut pages, mut items) = (0, 0);
    let mut cont: Option<String> = None;
    loop {
        let mut uri = format!("{base}?limit={PAGE}");
        if let Some(c) = &cont {
            uri += &format!("&continue={}", percent_encode(c));
        }
        let req = http::Request::get(uri)
            .header("host", "localhost")
            .body(http_body_util::Empty::new())
            .expect("req");
        send.ready().await.expect("connection ready");
        let resp = send.send_request(req).await.expect("page");
        assert_eq!(resp.status(), 200, "page {pages}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        first_page.get_or_insert(started.elapsed());
        pages += 1;
        items += finder.find_iter(&body).count();
        // The list's metadata comes last, after `items` (keys sorted, as
        // kube writes a custom resource list): its continue token, if any.
        let tail = &body[body.len().saturating_sub(2048)..];
        cont = std::str::from_utf8(tail)
            .ok()
            .and_then(|h| h.rsplit_once("\"continue\":\"").map(|(_, r)| r))
            .and_then(|r| r.split_once('"').map(|(c, _)| c.to_string()))
            .filter(|c| !c.is_empty());
        if cont.is_none() {
            break;
        }
    }
    let paged = started.elapsed();
    let started = Instant::now();
    let req = http::Request::get(base)
        .header("host", "localhost")
        .body(http_body_util::Empty::new())
        .expect("req");
    send.ready().await.expect("connection ready");
    let resp = send.send_request(req).await.expect("list");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let (mut bytes, mut unpaged_items) = (0u64, 0usize);
    let mut carry: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("body").into_data() else {
            continue;
        };
        bytes += data.len() as u64;
        // A marker straddling two frames: the last bytes of the one before
        // and the first of this one (too short to hold a marker alone).
        carry.extend_from_slice(&data[..data.len().min(ITEM.len() - 1)]);
        unpaged_items += finder.find_iter(&carry).count();
        unpaged_items += finder.find_iter(&data).count();
        carry.clear();
        carry.extend_from_slice(&data[data.len().saturating_sub(ITEM.len() - 1)..]);
    }
    Lists {
        first_page: first_page.unwrap_or_default(),
        paged,
        pages,
        paged_items: items,
        unpaged: started.elapsed(),
        unpaged_items,
        unpaged_bytes: bytes,
    }
}

fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A start of the server on `data`: times from the spawn, and its memory.
struct Start {
    child: std::process::Child,
    pid: u32,
    port: u16,
    ready: Duration,
    rss_ready: u64,
    hwm_ready: u64,
    sampling: Arc<AtomicBool>,
    max_rss: Arc<AtomicU64>,
    sampler: std::thread::JoinHandle<()>,
}

fn start(data: &Path, rt: &tokio::runtime::Runtime) -> Start {
    let port = free_port();
    let t0 = Instant::now();
    let child = Command::new(common::kshard_bin())
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--crds"])
        .arg(common::repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kshard");
    let pid = child.id();
    let sampling = Arc::new(AtomicBool::new(true));
    let max_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sampling, max_rss) = (sampling.clone(), max_rss.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                if let Some(r) = common::try_proc_status_bytes(pid, "VmRSS:") {
                    max_rss.fetch_max(r, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut child = child;
    let ready = rt.block_on(async {
        let deadline = t0 + Duration::from_secs(600);
        loop {
            if ready(data, port).await {
                return t0.elapsed();
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("kshard exited before it was ready: {status}");
            }
            assert!(Instant::now() < deadline, "not ready within 600 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let rss_ready = common::try_proc_status_bytes(pid, "VmRSS:").unwrap_or(0);
    let hwm_ready = common::try_proc_status_bytes(pid, "VmHWM:").unwrap_or(0);
    Start {
        child,
        pid,
        port,
        ready,
        rss_ready,
        hwm_ready,
        sampling,
        max_rss,
        sampler,
    }
}

impl Start {
    fn finish(mut self) -> (Duration, u64) {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.sampler.join();
        let hwm = common::try_proc_status_bytes(self.pid, "VmHWM:").unwrap_or(0);
        (
            stop(&mut self.child),
            hwm.max(self.max_rss.load(Ordering::Relaxed)),
        )
    }
}

/// Every file under `data`, the value log's segment directories too.
fn evict_from_page_cache(data: &Path) {
    for entry in std::fs::read_dir(data).expect("data dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            evict_from_page_cache(&p);
        } else if p.is_file() {
            let _ = Command::new("dd")
                .arg(format!("if={}", p.display()))
                .args(["iflag=nocache", "count=0", "status=none"])
                .status();
        }
    }
}

fn du(path: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => std::fs::read_dir(p)
                .map(|d| d.flatten().map(|e| walk(&e.path())).sum())
                .unwrap_or(0),
            Ok(m) => m.len(),
            Err(_) => 0,
        }
    }
    walk(path)
}

fn one_count(
    t: &Template,
    n: usize,
    work: &Path,
    rt: &tokio::runtime::Runtime,
    cold: bool,
) -> Value {
    println!("{n} widgets (load average {})", load_average());
    let file = work.join(format!("widgets-{n}.snap"));
    let started = Instant::now();
    let json_bytes = generate(t, n, &file);
    let file_bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
    println!(
        "  snapshot file: {:.0} MiB ({:.0} MiB of widget JSON), generated in {:.1} s",
        mib(file_bytes),
        mib(json_bytes),
        started.elapsed().as_secs_f64()
    );
    let data = work.join(format!("data-{n}"));
    let _ = std::fs::remove_dir_all(&data);
    let started = Instant::now();
    let out = Command::new(common::kshard_bin())
        .args(["snapshot", "restore", "-q", "--data-dir"])
        .arg(&data)
        .arg(&file)
        .output()
        .expect("kshard snapshot restore");
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restore = started.elapsed();
    let _ = std::fs::remove_file(&file);
    println!(
        "  restored in {:.1} s; store {:.0} MiB",
        restore.as_secs_f64(),
        mib(du(&data))
    );

    let first = start(&data, rt);
    let first_ready = first.ready;
    let first_rss = first.rss_ready;
    println!(
        "  first start after the restore: ready in {:.2} s, RSS {:.0} MiB",
        first_ready.as_secs_f64(),
        mib(first_rss)
    );
    let (first_stop, first_peak) = first.finish();
    println!(
        "  stopped (SIGTERM) in {:.2} s; its peak RSS {:.0} MiB",
        first_stop.as_secs_f64(),
        mib(first_peak)
    );
    if cold {
        evict_from_page_cache(&data);
    }
    let again = start(&data, rt);
    println!(
        "  restart: ready in {:.2} s, RSS {:.0} MiB (peak so far {:.0} MiB) (load average {})",
        again.ready.as_secs_f64(),
        mib(again.rss_ready),
        mib(again.hwm_ready),
        load_average()
    );
    let l = rt.block_on(lists(&data, again.port));
    let rss_after_lists = common::try_proc_status_bytes(again.pid, "VmRSS:").unwrap_or(0);
    println!(
        "  first list (pages of {PAGE}, no resourceVersion): first page {:.1} ms, {} pages, {} widgets in {:.2} s",
        l.first_page.as_secs_f64() * 1e3,
        l.pages,
        l.paged_items,
        l.paged.as_secs_f64()
    );
    println!(
        "  unpaged list: {} widgets, {:.0} MiB in {:.2} s",
        l.unpaged_items,
        mib(l.unpaged_bytes),
        l.unpaged.as_secs_f64()
    );
    let ready = again.ready;
    let (rss_ready, hwm_ready) = (again.rss_ready, again.hwm_ready);
    let (stop_time, peak) = again.finish();
    let ready_to_list = ready + l.paged;
    let ratio = rss_ready as f64 / json_bytes as f64;
    println!(
        "  RSS ready {:.0} MiB ({ratio:.2}× the JSON), after the lists {:.0} MiB, peak {:.0} MiB; stop {:.2} s",
        mib(rss_ready),
        mib(rss_after_lists),
        mib(peak),
        stop_time.as_secs_f64()
    );
    assert_eq!(l.paged_items, n, "the paged list holds every widget");
    assert_eq!(l.unpaged_items, n, "the unpaged list holds every widget");
    // The targets are for a million objects; smaller stores are
    // reported against them too (a fixed ~50 MiB base weighs more there).
    let mut missed = Vec::new();
    if n >= 1_000_000 {
        if ready_to_list > READY_WITHIN {
            missed.push(format!(
                "{n}: ready and listed in {:.1} s",
                ready_to_list.as_secs_f64()
            ));
        }
        if ratio > RSS_PER_JSON {
            missed.push(format!("{n}: RSS {ratio:.2}× the JSON when ready"));
        }
    }
    if std::env::var("KSHARD_RESTART_KEEP").is_err() {
        let _ = std::fs::remove_dir_all(&data);
    }
    json!({
        "objects": n,
        "widget_json_bytes": json_bytes,
        "snapshot_file_bytes": file_bytes,
        "restore_secs": restore.as_secs_f64(),
        "first_start_ready_secs": first_ready.as_secs_f64(),
        "first_start_rss_ready_bytes": first_rss,
        "first_start_peak_rss_bytes": first_peak,
        "first_stop_secs": first_stop.as_secs_f64(),
        "page_cache_evicted_before_restart": cold,
        "restart_ready_secs": ready.as_secs_f64(),
        "restart_rss_ready_bytes": rss_ready,
        "restart_peak_rss_at_ready_bytes": hwm_ready,
        "restart_rss_ready_per_json": ratio,
        "first_page_secs": l.first_page.as_secs_f64(),
        "paged_list_secs": l.paged.as_secs_f64(),
        "paged_list_pages": l.pages,
        "ready_plus_paged_list_secs": ready_to_list.as_secs_f64(),
        "unpaged_list_secs": l.unpaged.as_secs_f64(),
        "unpaged_list_bytes": l.unpaged_bytes,
        "rss_after_lists_bytes": rss_after_lists,
        "peak_rss_bytes": peak,
        "restart_stop_secs": stop_time.as_secs_f64(),
        "missed_targets": missed,
    })
}

/// Time to ready and RSS per count (log-scaled counts).
fn plot(results: &[Value]) -> String {
    let (w, h, pad) = (760.0, 360.0, 60.0);
    let n_max = results
        .iter()
        .filter_map(|r| r["objects"].as_f64())
        .fold(1.0, f64::max);
    let t_max = results
        .iter()
        .filter_map(|r| r["ready_plus_paged_list_secs"].as_f64())
        .fold(30.0, f64::max)
        * 1.15;
    let x = |n: f64| pad + (w - 2.0 * pad) * n / n_max;
    let y = |t: f64| h - pad - (h - 2.0 * pad) * t / t_max;
    let mut shapes = String::new();
    for (key, color, label) in [
        ("restart_ready_secs", "steelblue", "restart to /readyz"),
        (
            "ready_plus_paged_list_secs",
            "darkorange",
            "… and a full paged list",
        ),
    ] {
        let pts: Vec<String> = results
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "{:.1},{:.1}",
                    x(r["objects"].as_f64()?),
                    y(r[key].as_f64()?)
                ))
            })
            .collect();
        shapes += &format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for r in results {
            if let (Some(n), Some(t)) = (r["objects"].as_f64(), r[key].as_f64()) {
                shapes += &format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{t:.1} s</text>",
                    x(n),
                    y(t),
                    x(n) - 40.0,
                    y(t) - 8.0
                );
            }
        }
        let ly = if color == "steelblue" { 40.0 } else { 56.0 };
        shapes += &format!(
            "<text x=\"{}\" y=\"{ly}\" font-size=\"12\" fill=\"{color}\">{label}</text>",
            pad + 10.0
        );
    }
    for r in results {
        if let (Some(n), Some(ratio)) = (
            r["objects"].as_f64(),
            r["restart_rss_ready_per_json"].as_f64(),
        ) {
            shapes += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{n:.0} objects, RSS {ratio:.2}× JSON</text>",
                x(n).min(w - pad - 60.0),
                h - pad + 18.0
            );
        }
    }
    let limit = y(30.0);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{pad}\" y=\"22\" font-size=\"14\">kshard restart on the embedded store: seconds from spawn</text>\
<line x1=\"{pad}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"black\"/>\
<line x1=\"{pad}\" y1=\"{y0}\" x2=\"{pad}\" y2=\"{pad}\" stroke=\"black\"/>\
<line x1=\"{pad}\" y1=\"{limit:.1}\" x2=\"{x1}\" y2=\"{limit:.1}\" stroke=\"red\" stroke-dasharray=\"4\"/>\
<text x=\"{x1}\" y=\"{:.1}\" font-size=\"11\" fill=\"red\" text-anchor=\"end\">30 s</text>{shapes}</svg>",
        limit - 4.0,
        y0 = h - pad,
        x1 = w - pad,
    )
}

fn main() {
    let smoke = std::env::var("KSHARD_RESTART_SMOKE").is_ok_and(|v| v == "1");
    let counts: Vec<usize> = std::env::var("KSHARD_RESTART_OBJECTS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| {
            if smoke {
                vec![2_000]
            } else {
                vec![100_000, 1_000_000]
            }
        });
    let cold = std::env::var("KSHARD_RESTART_COLD").is_ok_and(|v| v == "1");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).expect("mkdir");
    let keep = std::env::var("KSHARD_RESTART_KEEP").is_ok();
    let scratch;
    let work: PathBuf = if keep {
        let w = out.join("restart-data");
        std::fs::create_dir_all(&w).expect("mkdir");
        w
    } else {
        scratch = tempfile::tempdir_in(&out).expect("tmp");
        scratch.path().to_path_buf()
    };
    let _ = std::fs::remove_dir_all(work.join("template"));
    let t = template(&work);
    println!(
        "kshard {} (load average {}); widgets of {} bytes of JSON",
        common::kshard_bin(),
        load_average(),
        t.json.len() + 8
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let results: Vec<Value> = counts
        .iter()
        .map(|&n| one_count(&t, n, &work, &rt, cold))
        .collect();
    if results.len() >= 2 {
        let a = &results[0];
        let b = &results[results.len() - 1];
        let growth = |k: &str| b[k].as_f64().unwrap_or(0.0) / a[k].as_f64().unwrap_or(1.0);
        println!(
            "from {} to {} objects ({:.0}×): time to ready {:.1}×, ready and listed {:.1}×",
            a["objects"],
            b["objects"],
            b["objects"].as_f64().unwrap_or(0.0) / a["objects"].as_f64().unwrap_or(1.0),
            growth("restart_ready_secs"),
            growth("ready_plus_paged_list_secs")
        );
    }
    let name = if smoke { "restart-smoke" } else { "restart" };
    std::fs::write(
        out.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&json!({
            "kshard_bin": common::kshard_bin(),
            "load_average_at_end": load_average(),
            "page": PAGE,
            "results": results,
        }))
        .expect("json"),
    )
    .expect("write");
    std::fs::write(out.join(format!("{name}.svg")), plot(&results)).expect("write");
    println!("wrote {}/{name}.{{json,svg}}", out.display());
    let missed: Vec<&Value> = results
        .iter()
        .flat_map(|r| r["missed_targets"].as_array().into_iter().flatten())
        .collect();
    assert!(missed.is_empty(), "missed targets: {missed:?}");
}
