//! The path users take: kshard through the real host's aggregator, against
//! kshard reached directly and against the same CRD served by the host's
//! kube-apiserver itself.
//!
//! One real host (`tests/common/real_host.rs`: Debian's etcd and the
//! reference kube-apiserver on loopback) with kshard installed from
//! `manifests/base`, and the Widget CRD of `manifests/base/served-crds`
//! installed into the host under another group (`hosted.demo.kshard.dev`, so
//! it does not clash with kshard's APIService). Three targets:
//! - `direct`: HTTPS straight to kshard as the aggregator reaches it: a
//!   client certificate of the front-proxy CA with CN `front-proxy-client`
//!   and `X-Remote-User: admin`, `X-Remote-Group: system:masters` (kshard's
//!   own generated admin credentials do not exist in delegated mode, and
//!   this is the identity path every request through the host takes);
//! - `through_host`: kshard's group at the host's address with the host
//!   administrator's bearer token (`system:masters`), as kubectl and
//!   client-go reach it; kube-aggregator proxies every request to kshard
//!   over its one HTTP/2 connection;
//! - `host_crd`: the same CRD served by kube-apiserver (and etcd) itself.
//!
//! Each is driven by the same client: hyper over rustls, HTTP/2, one shared
//! connection (client-go's way: one HTTP/2 connection per host,
//! multiplexed), closed loop with `KSHARD_TH_CLIENTS` (16) workers; creates
//! of 1 KiB widgets, then GETs of 64 widgets made beforehand. Rounds
//! alternate between the targets; the median round (by rate) of each is
//! kept. CPU per request comes from `/proc/<pid>/stat` (user + system) of
//! the client (this process), kshard, kube-apiserver and etcd.
//!
//! `cargo bench --features tikv --bench through_host`; writes
//! `benches/results/through_host.{json,svg}` (the smoke run writes
//! `target/bench/`). Env: `KSHARD_TH_SECS` (per round, 10),
//! `KSHARD_TH_ROUNDS` (3), `KSHARD_TH_CLIENTS` (16), `KSHARD_TH_CONNS`
//! (HTTP/2 connections per target, 1), `KSHARD_TH_ONLY`
//! (`direct,through_host,host_crd`), `KSHARD_TH_OPS` (`create,get`),
//! `KSHARD_TH_ARGS` (extra kshard flags), `KSHARD_TH_HOLD` (seconds to keep
//! everything running at the end), `KSHARD_THROUGH_HOST_SMOKE=1` (a
//! seconds-long run), `KSHARD_BIN` (the kshard binary, e.g. a release build).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::real_host::{RealHost, ADMIN_TOKEN};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

/// The load generator allocates as the server does (see `benches/etcd.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KSHARD_GROUP: &str = "demo.kshard.dev";
/// The host-served copy of the Widget CRD.
const HOSTED_GROUP: &str = "hosted.demo.kshard.dev";
const NS: &str = "bench";
/// Widgets made before the GETs, read round-robin.
const GET_SET: usize = 64;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn smoke() -> bool {
    std::env::var("KSHARD_THROUGH_HOST_SMOKE").is_ok_and(|v| v == "1")
}

fn wanted(var: &str, item: &str) -> bool {
    std::env::var(var).map_or(true, |only| only.split(',').any(|p| p.trim() == item))
}

fn progress(msg: &str) {
    eprintln!("[through_host bench] {msg}");
}

/// User + system CPU seconds of a process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = [11usize, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// A widget of about 1 KiB as stored (as `benches/etcd.rs` makes them).
fn widget_1k(group: &str, name: &str) -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": {"name": name, "labels": {"bench": "true"},
                         "annotations": {"bench.kshard.dev/payload": "x".repeat(640)}},
            "spec": {"replicas": 1, "color": "blue"},
        }))
        .expect("json"),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Direct,
    /// Direct, paced to the rate `ThroughHost` reached in the same round:
    /// kshard's CPU per request falls as its rate rises (a group commit's
    /// fsync and each thread wake-up are shared by more requests), so this
    /// is the like-for-like basis for kshard's own cost through the host.
    DirectSameRate,
    ThroughHost,
    HostCrd,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::DirectSameRate => "direct_same_rate",
            Target::ThroughHost => "through_host",
            Target::HostCrd => "host_crd",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Target::Direct => "kshard direct",
            Target::DirectSameRate => "kshard direct, host's rate",
            Target::ThroughHost => "kshard through the host",
            Target::HostCrd => "CRD served by the host",
        }
    }
    fn group(self) -> &'static str {
        match self {
            Target::HostCrd => HOSTED_GROUP,
            _ => KSHARD_GROUP,
        }
    }
    fn collection(self) -> String {
        format!("/apis/{}/v1/namespaces/{NS}/widgets", self.group())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Create,
    Get,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
        }
    }
}

/// A connection: HTTP/2 (shared by the workers) or HTTP/1.1 (one worker's own).
#[derive(Clone)]
enum Send {
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
    H1(Arc<tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Full<Bytes>>>>),
}

/// How a target is reached: its address, TLS, and the headers naming the user.
struct Endpoint {
    addr: String,
    tls: Arc<rustls::ClientConfig>,
    headers: Vec<(&'static str, String)>,
}

fn tls_config(ca_pem: &str, client: Option<(String, String)>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let mut config = match client {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.expect("pem"))
                    .collect();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

async fn connect(ep: &Endpoint, http1: bool) -> Send {
    use rustls::pki_types::ServerName;
    let tcp = tokio::net::TcpStream::connect(&ep.addr)
        .await
        .expect("connect");
    let _ = tcp.set_nodelay(true);
    let tls = if http1 {
        let mut config = (*ep.tls).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        tokio_rustls::TlsConnector::from(Arc::new(config))
    } else {
        tokio_rustls::TlsConnector::from(ep.tls.clone())
    }
    .connect(ServerName::try_from("localhost").expect("name"), tcp)
    .await
    .expect("tls");
    if http1 {
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("http/1.1 handshake");
        tokio::spawn(conn);
        return Send::H1(Arc::new(tokio::sync::Mutex::new(send)));
    }
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    Send::H2(send)
}

/// One request; its status and body.
async fn request(
    send: &mut Send,
    ep: &Endpoint,
    method: http::Method,
    uri: &str,
    body: Bytes,
) -> Option<(u16, Bytes)> {
    let mut b = http::Request::builder()
        .method(method)
        .uri(match send {
            Send::H2(_) => format!("https://localhost{uri}"),
            Send::H1(_) => uri.to_string(),
        })
        .header("accept", "application/json")
        .header("user-agent", "kshard-through-host-bench/0.1");
    if let Send::H1(_) = send {
        b = b.header(http::header::HOST, "localhost");
    }
    if !body.is_empty() {
        b = b.header("content-type", "application/json");
    }
    for (k, v) in &ep.headers {
        b = b.header(*k, v);
    }
    let req = b.body(Full::new(body)).ok()?;
    let resp = match send {
        Send::H2(send) => {
            send.ready().await.ok()?;
            send.send_request(req).await.ok()?
        }
        Send::H1(send) => {
            let mut send = send.lock().await;
            send.ready().await.ok()?;
            send.send_request(req).await.ok()?
        }
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}

/// Prints the first unexpected answer of the run (the rest are counted).
fn first_failure(got: &Option<(u16, Bytes)>, want: u16) {
    static SEEN: std::sync::Once = std::sync::Once::new();
    match got {
        Some((s, _)) if *s == want => {}
        other => SEEN.call_once(|| {
            progress(&format!(
                "unexpected answer (later ones only counted): {:?}",
                other
                    .as_ref()
                    .map(|(s, b)| (s, String::from_utf8_lossy(b).into_owned()))
            ))
        }),
    }
}

#[derive(Clone, Debug, Default)]
struct Round {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
    client_us: f64,
    kshard_us: f64,
    apiserver_us: f64,
    etcd_us: f64,
}

struct Pids {
    kshard: u32,
    apiserver: u32,
    etcd: u32,
}

/// A closed loop of `clients` workers over `conns` connections for `secs`
/// (paced to `pace` requests/s in all when given).
#[allow(clippy::too_many_arguments)]
async fn run_round(
    ep: &Arc<Endpoint>,
    conns: &[Send],
    target: Target,
    op: Op,
    clients: usize,
    secs: f64,
    tag: &str,
    pids: &Pids,
    pace: Option<f64>,
) -> Round {
    let own = std::process::id();
    let before = [
        cpu_seconds(own),
        cpu_seconds(pids.kshard),
        cpu_seconds(pids.apiserver),
        cpu_seconds(pids.etcd),
    ];
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut handles = Vec::new();
    for w in 0..clients {
        let mut send = conns[w % conns.len()].clone();
        let ep = ep.clone();
        let tag = tag.to_string();
        let collection = target.collection();
        // Paced: each worker sends every `clients / rate` seconds, the
        // workers spread over one interval.
        let interval = pace.map(|rate| Duration::from_secs_f64(clients as f64 / rate.max(1.0)));
        let mut next = start + interval.map_or(Duration::ZERO, |i| i * w as u32 / clients as u32);
        handles.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), 0usize);
            let mut i = 0usize;
            while Instant::now() < until {
                if let Some(interval) = interval {
                    tokio::time::sleep_until(next.into()).await;
                    next += interval;
                    // Behind (a slow answer): no burst to catch up.
                    next = next.max(Instant::now() - interval);
                    if Instant::now() >= until {
                        break;
                    }
                }
                let t = Instant::now();
                let ok = match op {
                    Op::Create => {
                        let name = format!("{tag}-w{w}-{i}");
                        let body = widget_1k(target.group(), &name);
                        let got =
                            request(&mut send, &ep, http::Method::POST, &collection, body).await;
                        first_failure(&got, 201);
                        got.map(|(s, _)| s == 201)
                    }
                    Op::Get => {
                        let uri = format!("{collection}/get-{}", (w * 7 + i) % GET_SET);
                        let got =
                            request(&mut send, &ep, http::Method::GET, &uri, Bytes::new()).await;
                        first_failure(&got, 200);
                        got.map(|(s, _)| s == 200)
                    }
                };
                i += 1;
                match ok {
                    Some(true) => lat.push(t.elapsed()),
                    Some(false) => errors += 1,
                    None => {
                        errors += 1;
                        break;
                    }
                }
            }
            (lat, errors)
        }));
    }
    let (mut lat, mut errors) = (Vec::new(), 0);
    for h in handles {
        let (l, e) = h.await.unwrap_or_default();
        lat.extend(l);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = lat.len().max(1) as f64;
    let per = |pid: u32, before: f64| (cpu_seconds(pid) - before) * 1e6 / n;
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Round {
        per_sec: lat.len() as f64 / elapsed,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        errors,
        client_us: per(own, before[0]),
        kshard_us: per(pids.kshard, before[1]),
        apiserver_us: per(pids.apiserver, before[2]),
        etcd_us: per(pids.etcd, before[3]),
    }
}

fn median(mut rounds: Vec<Round>) -> Round {
    rounds.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    rounds.get(rounds.len() / 2).cloned().unwrap_or_default()
}

/// The Widget CRD of `manifests/base`, renamed into `group`.
fn hosted_crd(group: &str) -> Value {
    let path = common::repo_path("manifests/base/served-crds/widgets.yaml");
    let text = std::fs::read_to_string(path).expect("widgets.yaml");
    let mut crd: Value = serde_saphyr::from_str(&text).expect("CRD YAML");
    crd["metadata"]["name"] = json!(format!("widgets.{group}"));
    crd["spec"]["group"] = json!(group);
    // Short names and categories would be shared with kshard's Widget.
    if let Some(names) = crd["spec"]["names"].as_object_mut() {
        names.remove("shortNames");
        names.remove("categories");
    }
    crd
}

fn plot(results: &[(Target, Op, Round)]) -> String {
    let (w, h) = (860.0, 360.0);
    let (left, bottom, height) = (70.0, 270.0, 200.0);
    let max = results.iter().map(|r| r.2.per_sec).fold(1.0_f64, f64::max);
    let colors = |t: Target| match t {
        Target::Direct => "steelblue",
        Target::DirectSameRate => "lightsteelblue",
        Target::ThroughHost => "seagreen",
        Target::HostCrd => "gray",
    };
    let mut bars = String::new();
    for (gi, op) in [Op::Create, Op::Get].iter().enumerate() {
        let x0 = left + 20.0 + gi as f64 * 390.0;
        bars.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" text-anchor=\"middle\">{}s at c=16</text>",
            x0 + 170.0,
            bottom + 36.0,
            op.name().to_uppercase()
        ));
        for (ti, (t, _, r)) in results.iter().filter(|r| r.1 == *op).enumerate() {
            let x = x0 + ti as f64 * 90.0;
            let bh = r.per_sec / max * height;
            bars.push_str(&format!(
                "<rect x=\"{x}\" y=\"{}\" width=\"70\" height=\"{bh}\" fill=\"{}\"/>\
<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{:.0}/s</text>\
<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{:.0} µs kshard</text>\
<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{:.0} µs host</text>",
                bottom - bh,
                colors(*t),
                x + 35.0,
                bottom - bh - 4.0,
                r.per_sec,
                x + 35.0,
                bottom + 12.0,
                r.kshard_us,
                x + 35.0,
                bottom + 22.0,
                r.apiserver_us + r.etcd_us,
            ));
        }
    }
    let legend: String = [
        Target::Direct,
        Target::DirectSameRate,
        Target::ThroughHost,
        Target::HostCrd,
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| {
        format!(
            "<rect x=\"{}\" y=\"40\" width=\"12\" height=\"12\" fill=\"{}\"/>\
<text x=\"{}\" y=\"50\" font-size=\"12\">{}</text>",
            left + i as f64 * 190.0,
            colors(*t),
            left + 16.0 + i as f64 * 190.0,
            t.label()
        )
    })
    .collect();
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{left}\" y=\"24\" font-size=\"14\">Requests/s (1 KiB widgets, HTTP/2), with CPU per request of kshard and of the host (kube-apiserver + etcd)</text>\
{legend}<line x1=\"{left}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"black\"/>{bars}</svg>",
        w - 20.0
    )
}

fn main() {
    // As the shipped Deployment runs kshard (`benches/etcd.rs` says why);
    // set before any thread or child exists, and inherited by kshard.
    std::env::set_var(
        "GLIBC_TUNABLES",
        "glibc.cpu.x86_rep_movsb_threshold=18446744073709551615",
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let secs = if smoke() {
        1.0
    } else {
        env_usize("KSHARD_TH_SECS", 10) as f64
    };
    let rounds = env_usize("KSHARD_TH_ROUNDS", if smoke() { 1 } else { 3 }).max(1);
    let clients = env_usize("KSHARD_TH_CLIENTS", 16).max(1);
    let conns_per_target = env_usize("KSHARD_TH_CONNS", 1).max(1);

    let dir = tempfile::tempdir().expect("tempdir");
    progress("starting etcd and kube-apiserver…");
    let host = RealHost::start(dir.path());
    let extra = std::env::var("KSHARD_TH_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    progress("installing kshard from manifests/base…");
    let kshard = host.install_kshard(&extra);
    progress("installing the Widget CRD into the host as hosted.demo.kshard.dev…");
    host.apply(&[hosted_crd(HOSTED_GROUP)]);
    host.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/widgets.{HOSTED_GROUP}"),
    ]);
    host.kubectl_ok(&["create", "namespace", NS]);

    let (apiserver, etcd) = host.pids();
    let pids = Pids {
        kshard: kshard.process.as_ref().map_or(0, |p| p.0.id()),
        apiserver,
        etcd,
    };
    progress(&format!(
        "pids: kshard {}, kube-apiserver {}, etcd {}, client {}",
        pids.kshard,
        pids.apiserver,
        pids.etcd,
        std::process::id()
    ));

    let host_addr = host.url.trim_start_matches("https://").to_string();
    let host_tls = tls_config(&host.ca.pem, None);
    let bearer = vec![("authorization", format!("Bearer {ADMIN_TOKEN}"))];
    let endpoint = |t: Target| -> Endpoint {
        match t {
            Target::Direct | Target::DirectSameRate => Endpoint {
                addr: format!("127.0.0.1:{}", kshard.port),
                tls: tls_config(
                    &kshard.ca.pem,
                    Some(host.front_proxy_ca.client("front-proxy-client", &[])),
                ),
                headers: vec![
                    ("x-remote-user", "admin".into()),
                    ("x-remote-group", "system:masters".into()),
                    ("x-remote-group", "system:authenticated".into()),
                ],
            },
            _ => Endpoint {
                addr: host_addr.clone(),
                tls: host_tls.clone(),
                headers: bearer.clone(),
            },
        }
    };
    let targets: Vec<Target> = [
        Target::Direct,
        Target::ThroughHost,
        Target::DirectSameRate,
        Target::HostCrd,
    ]
    .into_iter()
    .filter(|t| wanted("KSHARD_TH_ONLY", t.name()))
    .collect();
    let ops: Vec<Op> = [Op::Create, Op::Get]
        .into_iter()
        .filter(|o| wanted("KSHARD_TH_OPS", o.name()))
        .collect();

    // Connections, the GET set, and a warm-up of each target.
    let mut sides = Vec::new();
    for t in &targets {
        let ep = Arc::new(endpoint(*t));
        // `KSHARD_TH_HTTP1`: targets driven over HTTP/1.1, one connection per worker.
        let http1 = std::env::var("KSHARD_TH_HTTP1")
            .is_ok_and(|v| v.split(',').any(|p| p.trim() == t.name()));
        let mut conns = Vec::new();
        for _ in 0..if http1 { clients } else { conns_per_target } {
            conns.push(connect(&ep, http1).await);
        }
        let mut send = conns[0].clone();
        // The aggregator may answer 503 for a moment after the APIService
        // turns Available on its own, older view; retry the first create.
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..GET_SET {
            loop {
                let body = widget_1k(t.group(), &format!("get-{i}"));
                let got = request(&mut send, &ep, http::Method::POST, &t.collection(), body).await;
                match got {
                    // kshard's two targets share one store and GET set.
                    Some((201 | 409, _)) => break,
                    Some((status, body)) if Instant::now() > deadline => panic!(
                        "{}: create answered {status}: {}",
                        t.name(),
                        String::from_utf8_lossy(&body)
                    ),
                    None if Instant::now() > deadline => {
                        panic!("{}: the connection failed", t.name())
                    }
                    _ => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        }
        progress(&format!("{}: warming up…", t.name()));
        for op in &ops {
            let tag = format!("{}-warm", t.name().replace('_', "-"));
            run_round(
                &ep,
                &conns,
                *t,
                *op,
                clients,
                secs.min(2.0),
                &tag,
                &pids,
                None,
            )
            .await;
        }
        sides.push((*t, ep, conns));
    }

    let mut all: Vec<(Target, Op, Vec<Round>)> = Vec::new();
    for r in 0..rounds {
        for op in &ops {
            // Rounds alternate between the targets, so a slow spell of the
            // shared machine costs each alike.
            for (t, ep, conns) in &sides {
                progress(&format!(
                    "round {}/{rounds}: {} {}s at c={clients} for {secs} s…",
                    r + 1,
                    t.name(),
                    op.name()
                ));
                let tag = format!("{}-r{r}", t.name().replace('_', "-"));
                let pace = match t {
                    Target::DirectSameRate => {
                        let through = all
                            .iter()
                            .find(|(tt, oo, _)| *tt == Target::ThroughHost && oo == op)
                            .and_then(|e| e.2.last());
                        match through {
                            Some(r) => Some(r.per_sec),
                            None => continue,
                        }
                    }
                    _ => None,
                };
                let round = run_round(ep, conns, *t, *op, clients, secs, &tag, &pids, pace).await;
                progress(&format!(
                    "  {:.0}/s, p50 {:.2} ms, p99 {:.2} ms, {} errors; CPU µs per request: client {:.0}, kshard {:.0}, kube-apiserver {:.0}, etcd {:.0}",
                    round.per_sec, round.p50_ms, round.p99_ms, round.errors,
                    round.client_us, round.kshard_us, round.apiserver_us, round.etcd_us
                ));
                match all.iter_mut().find(|(tt, oo, _)| tt == t && oo == op) {
                    Some(e) => e.2.push(round),
                    None => all.push((*t, *op, vec![round])),
                }
            }
        }
    }
    let results: Vec<(Target, Op, Round)> = all
        .into_iter()
        .map(|(t, o, rs)| (t, o, median(rs)))
        .collect();

    println!(
        "{:<14} {:<7} {:>9} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "target", "op", "req/s", "p50 ms", "p99 ms", "client µs", "kshard µs", "k-a µs", "etcd µs"
    );
    for (t, o, r) in &results {
        println!(
            "{:<14} {:<7} {:>9.0} {:>8.2} {:>8.2} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            t.name(),
            o.name(),
            r.per_sec,
            r.p50_ms,
            r.p99_ms,
            r.client_us,
            r.kshard_us,
            r.apiserver_us,
            r.etcd_us
        );
    }
    let find = |t: Target, o: Op| results.iter().find(|r| r.0 == t && r.1 == o).map(|r| &r.2);
    let mut ratios = serde_json::Map::new();
    for op in &ops {
        if let (Some(th), Some(d)) = (find(Target::ThroughHost, *op), find(Target::Direct, *op)) {
            let rate = th.per_sec / d.per_sec.max(1e-9);
            let cpu = th.kshard_us / d.kshard_us.max(1e-9);
            println!(
                "{}: through the host {rate:.2}× the direct rate; kshard CPU per request {cpu:.2}× direct",
                op.name()
            );
            ratios.insert(
                format!("{}_rate_through_host_over_direct", op.name()),
                json!(rate),
            );
            ratios.insert(
                format!("{}_kshard_cpu_through_host_over_direct", op.name()),
                json!(cpu),
            );
        }
        if let (Some(th), Some(d)) = (
            find(Target::ThroughHost, *op),
            find(Target::DirectSameRate, *op),
        ) {
            let cpu = th.kshard_us / d.kshard_us.max(1e-9);
            println!(
                "{}: kshard CPU per request through the host {cpu:.2}× direct at the same rate",
                op.name()
            );
            ratios.insert(
                format!(
                    "{}_kshard_cpu_through_host_over_direct_same_rate",
                    op.name()
                ),
                json!(cpu),
            );
        }
        if let (Some(th), Some(c)) = (find(Target::ThroughHost, *op), find(Target::HostCrd, *op)) {
            let rate = th.per_sec / c.per_sec.max(1e-9);
            println!(
                "{}: through the host {rate:.2}× the rate of the CRD served by the host",
                op.name()
            );
            ratios.insert(
                format!("{}_rate_through_host_over_host_crd", op.name()),
                json!(rate),
            );
        }
    }
    let out = json!({
        "machine": {"cores": std::thread::available_parallelism().map_or(0, |n| n.get())},
        "seconds_per_round": secs,
        "rounds": rounds,
        "clients": clients,
        "http2_connections_per_target": conns_per_target,
        "object_bytes": widget_1k(KSHARD_GROUP, "r0-w0-0").len(),
        "results": results.iter().map(|(t, o, r)| json!({
            "target": t.name(), "op": o.name(),
            "per_sec": r.per_sec, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "errors": r.errors,
            "cpu_us_per_request": {"client": r.client_us, "kshard": r.kshard_us,
                                   "kube_apiserver": r.apiserver_us, "etcd": r.etcd_us},
        })).collect::<Vec<_>>(),
        "ratios": ratios,
    });
    let target = if smoke() {
        common::repo_path("target/bench")
    } else {
        common::repo_path("benches/results")
    };
    std::fs::create_dir_all(&target).expect("results dir");
    std::fs::write(
        target.join("through_host.json"),
        serde_json::to_vec_pretty(&out).expect("json"),
    )
    .expect("write json");
    std::fs::write(target.join("through_host.svg"), plot(&results)).expect("write svg");
    progress(&format!(
        "wrote {}",
        target.join("through_host.{json,svg}").display()
    ));
    let hold = env_usize("KSHARD_TH_HOLD", 0);
    if hold > 0 {
        progress(&format!("holding everything for {hold} s…"));
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
    }
    drop(kshard);
    drop(host);
}
