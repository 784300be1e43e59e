//! kshard against the etcd it replaces, on this machine, in one run.
//!
//! Starts etcd (Debian's `etcd-server` is installed when `etcd` is missing
//! and this runs as root) and kshard (the release binary, embedded store),
//! then (rounds interleaved, each round's time per client in slices taken
//! by every client of both sides in turn, the median round of each kept):
//! - creates/s of 1 KiB objects through kshard's HTTPS API (every write
//!   validated, managedFields tracked, fsync'd before the answer) against
//!   1 KiB puts/s to etcd over its own gRPC (fsync on, one member), closed
//!   loop at 1, 16 and 64 concurrent clients; then updates (PUT at the
//!   last resourceVersion), merge patches and deletes against the
//!   transactions kube-apiserver sends etcd for them (`KSHARD_ETCD_ONLY=verbs`).
//!   Each server is driven by every client tried for it and keeps its best:
//!   kshard over HTTP/1.1 with a connection per worker and over one shared
//!   HTTP/2 connection (client-go's way); etcd by the `etcd-client` crate
//!   over one shared channel (kube-apiserver's way) and a channel per
//!   worker (`benches/etcd-driver`, built here; it needs `protoc`, which is
//!   installed from Debian when missing), and for puts also by this file's
//!   own gRPC client;
//! - resident memory of kshard against the objects' JSON, at 40,000 and
//!   200,000 objects, each on a fresh server and store of its own, above
//!   the server's base once it has served writes and holds nothing;
//! - fan-out: W watchers of one resource, one write every 10 ms, the
//!   latency from the write's acknowledgement to its receipt by the last
//!   watcher, and the CPU per delivered event (kshard's and the client's);
//! - creates at c=16 with 100 watchers of the resource against without;
//! - a full list of 10,000 objects from the cache against serde_json
//!   serializing the same objects in memory.
//!
//! `cargo bench --bench etcd`; writes `target/bench/etcd.{json,svg}` (a smoke
//! run `etcd-smoke.*`, a run of some parts `etcd-<parts>.*`).
//! Env: `KSHARD_ETCD_SECS` (per round, 10), `KSHARD_ETCD_ROUNDS` (3),
//! `KSHARD_ETCD_SLICES` (each round's time run in this many slices, every
//! client of both sides in turn; 5),
//! `KSHARD_ETCD_OBJECTS` (the memory points, comma-separated; `40000,200000`),
//! `KSHARD_ETCD_WATCHERS` (1000), `KSHARD_ETCD_SMOKE=1` (a seconds-long run),
//! `KSHARD_ETCD_ONLY` (`creates`, `verbs`, `memory`, `fanout`, `watched`, `lists`),
//! `KSHARD_ETCD_ARGS` (extra kshard flags), `KSHARD_ETCD_CLIENTS` (the
//! creates' concurrencies, comma-separated; `1,16,64`),
//! `KSHARD_ETCD_VERB_CLIENTS` (the other verbs'; `16`), `KSHARD_ETCD_DELETES`
//! (objects deleted per delete round; 20,000).
//!
//! The hand-written etcd client (a gRPC unary `KV/Put` over one HTTP/2
//! connection per worker, the protobuf message encoded by hand) needs no
//! protoc; the etcd-client driver is a separate binary so that kshard's own
//! build never needs protoc, and reports its own CPU and etcd's over the
//! timed part only.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "etcd-driver/src/disk.rs"]
mod disk;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// kshard runs with the environment the shipped Deployment gives it
/// (`manifests/base/deployment.yaml`): glibc's vector copies for large
/// buffers, which on these AMD machines matter for every TLS record.
const AS_DEPLOYED: [(&str, &str); 1] = [(
    "GLIBC_TUNABLES",
    "glibc.cpu.x86_rep_movsb_threshold=18446744073709551615",
)];

/// The load generator allocates with the server's allocator: with glibc's,
/// allocation was a tenth of the watch clients' CPU, which they take from
/// the cores the servers share.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WIDGETS: &str = "/apis/demo.kshard.dev/v1/namespaces/bench/widgets";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A comma-separated list of numbers from the environment, or `default`.
fn env_usizes(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name).ok().map_or_else(
        || default.to_vec(),
        |v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
    )
}

fn smoke() -> bool {
    std::env::var("KSHARD_ETCD_SMOKE").is_ok_and(|v| v == "1")
}

/// `KSHARD_ETCD_ONLY=creates|verbs|memory|fanout|watched|lists` runs some parts (comma-separated).
fn wanted(part: &str) -> bool {
    std::env::var("KSHARD_ETCD_ONLY").map_or(true, |only| only.split(',').any(|p| p == part))
}

fn progress(msg: &str) {
    eprintln!("[etcd bench] {msg}");
}

/// A widget of about 1 KiB as stored (the filler is an annotation: the
/// schema would prune an unknown spec field).
fn widget_1k(name: &str) -> Vec<u8> {
    widget_1k_at(name, None, 1)
}

/// The same widget with `replicas`, at `resource_version` for an update.
fn widget_1k_at(name: &str, resource_version: Option<&str>, replicas: usize) -> Vec<u8> {
    let mut w = json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": name, "labels": {"bench": "true"},
                     "annotations": {"bench.kshard.dev/payload": "x".repeat(640)}},
        "spec": {"replicas": replicas, "color": "blue"},
    });
    if let Some(rv) = resource_version {
        w["metadata"]["resourceVersion"] = json!(rv);
    }
    serde_json::to_vec(&w).expect("json")
}

// ------------------------------------------------------------------ etcd

fn etcd_binary() -> Option<String> {
    let found = |name: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(p) = found("etcd") {
        return Some(p);
    }
    progress("etcd not found: installing Debian's etcd-server (apt-get)…");
    let ok = Command::new("sh")
        .args([
            "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        progress("could not install etcd-server; the etcd side is skipped");
        return None;
    }
    found("etcd")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_etcd(bin: &str, dir: &Path) -> (common::KillOnDrop, u16) {
    let (client, peer) = (free_port(), free_port());
    let child = Command::new(bin)
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client}"),
        ])
        .args([
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{client}"),
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer}"),
        ])
        // As a cluster kube-apiserver runs on: history compacted every 5
        // minutes (kube-apiserver's --etcd-compaction-interval; kshard
        // compacts as often) and the largest quota etcd recommends. With
        // neither, the updates of one run filled etcd's 2 GiB default and
        // every later write failed with "database space exceeded".
        .args(["--auto-compaction-mode", "periodic"])
        .args(["--auto-compaction-retention", "5m"])
        .args(["--quota-backend-bytes", "8589934592"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    (common::KillOnDrop(child), client)
}

/// One HTTP/2 (h2c) connection to etcd, for unary gRPC calls.
struct Etcd {
    send: hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
}

impl Etcd {
    async fn connect(port: u16) -> Option<Self> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        tcp.set_nodelay(true).ok()?;
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .ok()?;
        tokio::spawn(conn);
        Some(Self { send })
    }

    /// `etcdserverpb.KV/Put` of `key` = `value`; true when etcd says OK.
    async fn put(&mut self, key: &[u8], value: &[u8]) -> bool {
        // PutRequest{key = 1, value = 2}, both length-delimited.
        let mut msg = BytesMut::new();
        for (tag, field) in [(0x0a_u8, key), (0x12, value)] {
            msg.put_u8(tag);
            let mut n = field.len() as u64;
            while n >= 0x80 {
                msg.put_u8((n as u8) | 0x80);
                n >>= 7;
            }
            msg.put_u8(n as u8);
            msg.put_slice(field);
        }
        let mut frame = BytesMut::with_capacity(msg.len() + 5);
        frame.put_u8(0);
        frame.put_u32(msg.len() as u32);
        frame.put_slice(&msg);
        let req = http::Request::post("http://127.0.0.1/etcdserverpb.KV/Put")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(http_body_util::Full::new(frame.freeze()))
            .expect("request");
        if self.send.ready().await.is_err() {
            return false;
        }
        let Ok(resp) = self.send.send_request(req).await else {
            return false;
        };
        let Ok(body) = resp.into_body().collect().await else {
            return false;
        };
        // grpc-status 0 in the trailers.
        body.trailers()
            .and_then(|t| t.get("grpc-status"))
            .is_some_and(|s| s == "0")
    }
}

// ------------------------------------------------------------------ load

struct Round {
    /// Acknowledged writes.
    ops: usize,
    /// The timed part's length.
    secs: f64,
    ops_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The server's own CPU (user + system) per acknowledged write.
    cpu_us_per_op: f64,
    /// The load generator's CPU per acknowledged write: on this shared
    /// machine what the client spends, the server cannot.
    client_us_per_op: f64,
    /// Bytes the machine's disks wrote per acknowledged write, the writes
    /// the round left dirty included (see `disk::disk_written`).
    disk_bytes_per_op: f64,
}

/// The disks' writes since `before`, per write of `round`.
fn disk_bytes_per_op(before: u64, round: &Round) -> f64 {
    disk::disk_written().saturating_sub(before) as f64 / (round.ops as f64).max(1.0)
}

/// The CPU `pid` used since `before` (seconds), per write of `round`.
fn cpu_us_per_op(pid: u32, before: f64, round: &Round) -> f64 {
    (cpu_seconds(pid) - before) * 1e6 / (round.ops as f64).max(1.0)
}

fn summarize(count: usize, elapsed: Duration, mut lat: Vec<Duration>) -> Round {
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Round {
        ops: count,
        secs: elapsed.as_secs_f64(),
        ops_per_sec: count as f64 / elapsed.as_secs_f64(),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        cpu_us_per_op: 0.0,
        client_us_per_op: 0.0,
        disk_bytes_per_op: 0.0,
    }
}

/// A Kubernetes write verb, measured on kshard and as kube-apiserver would
/// write it to etcd.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verb {
    Create,
    /// PUT of the whole object at the resourceVersion last seen.
    Update,
    /// JSON merge patch of `spec.replicas`, no resourceVersion.
    Patch,
    /// DELETE of objects created before the clock starts.
    Delete,
}

impl Verb {
    fn name(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }

    /// What kube-apiserver sends etcd for it (the driver's `--op`): a
    /// create as a plain put (cheaper for etcd than kube's create
    /// transaction), an update and a patch as GuaranteedUpdate's
    /// conditional transaction, a delete as the conditional delete.
    fn etcd_op(self) -> &'static str {
        match self {
            Verb::Create => "put",
            Verb::Update | Verb::Patch => "update",
            Verb::Delete => "delete",
        }
    }
}

/// How the load generator reaches kshard: HTTP/1.1 with a connection per
/// worker, or one HTTP/2 connection multiplexed by all (client-go's way).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Transport {
    H1PerWorker,
    H2Shared,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::H1PerWorker => "HTTPS/1.1, a connection per worker",
            Transport::H2Shared => "HTTPS/2, one shared connection",
        }
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>),
}

impl Sender {
    /// Sends `req`; the status and the whole body, or None when the
    /// connection failed.
    async fn call(
        &mut self,
        req: http::Request<http_body_util::Full<Bytes>>,
    ) -> Option<(u16, Bytes)> {
        let resp = match self {
            Sender::H1(s) => {
                s.ready().await.ok()?;
                s.send_request(req).await.ok()?
            }
            Sender::H2(s) => {
                s.ready().await.ok()?;
                s.send_request(req).await.ok()?
            }
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    }
}

fn request(
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> http::Request<http_body_util::Full<Bytes>> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", content_type)
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request")
}

/// The resourceVersion of an object answer, read without building a tree.
fn resource_version(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "resourceVersion")]
        resource_version: String,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    serde_json::from_slice::<Object>(body)
        .ok()
        .map(|o| o.metadata.resource_version)
}

/// Closed-loop creates of 1 KiB widgets into `collection` by `clients`
/// workers for `secs`, each on its own HTTPS (HTTP/1.1) connection; names
/// start with `prefix`.
async fn kshard_creates(
    kubeconfig: &Path,
    collection: &'static str,
    clients: usize,
    secs: f64,
    prefix: &str,
) -> Round {
    kshard_verb(
        kubeconfig,
        None,
        collection,
        Verb::Create,
        Transport::H1PerWorker,
        clients,
        secs,
        0,
        prefix,
    )
    .await
}

/// Closed-loop `verb`s of 1 KiB widgets in `collection` by `clients`
/// workers for `secs` (deletes: until the `deletes` objects created first
/// are gone); names start with `prefix`. What a verb needs to exist is
/// created before the clock starts; the CPU figures (kshard's, given its
/// `pid`, and the load generator's) cover the timed part only.
#[allow(clippy::too_many_arguments)]
async fn kshard_verb(
    kubeconfig: &Path,
    pid: Option<u32>,
    collection: &'static str,
    verb: Verb,
    transport: Transport,
    clients: usize,
    secs: f64,
    deletes: usize,
    prefix: &str,
) -> Round {
    let data = kubeconfig.parent().expect("data dir");
    let addr = server_addr(kubeconfig);
    let shared = match transport {
        Transport::H2Shared => Some(h2_connection(data, &addr).await),
        Transport::H1PerWorker => None,
    };
    let mut workers = Vec::new();
    for w in 0..clients {
        let mut send = match &shared {
            Some(s) => Sender::H2(s.clone()),
            None => Sender::H1(h1_connection(data, &addr).await),
        };
        // (name, resourceVersion) of the objects this worker writes to.
        let count = match verb {
            Verb::Create => 0,
            Verb::Update | Verb::Patch => 1,
            Verb::Delete => deletes.div_ceil(clients),
        };
        let mut objects = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("{prefix}-w{w}-{i}");
            let req = request("POST", collection, "application/json", widget_1k(&name));
            let rv = match send.call(req).await {
                Some((201, body)) => resource_version(&body).unwrap_or_default(),
                other => panic!("creating {name} before the clock: {:?}", other.map(|o| o.0)),
            };
            objects.push((name, rv));
        }
        workers.push((send, objects));
    }
    let mut handles = Vec::new();
    // Writes an earlier round left dirty go to the disks before the clock.
    let disk = disk::disk_written();
    let server_cpu = pid.map(cpu_seconds);
    let own_cpu = cpu_seconds(std::process::id());
    let start = Instant::now();
    // Deletes run until their objects are gone (a bound only against a hang).
    let until = start
        + match verb {
            Verb::Delete => Duration::from_secs(600),
            _ => Duration::from_secs_f64(secs),
        };
    for (w, (mut send, mut objects)) in workers.into_iter().enumerate() {
        let prefix = prefix.to_string();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0usize;
            while Instant::now() < until {
                i += 1;
                let (req, want) = match verb {
                    Verb::Create => {
                        let name = format!("{prefix}-w{w}-c{i}");
                        (
                            request("POST", collection, "application/json", widget_1k(&name)),
                            201,
                        )
                    }
                    Verb::Update => {
                        let (name, rv) = &objects[0];
                        let body = widget_1k_at(name, Some(rv), i % 1000);
                        (
                            request(
                                "PUT",
                                &format!("{collection}/{name}"),
                                "application/json",
                                body,
                            ),
                            200,
                        )
                    }
                    Verb::Patch => {
                        let (name, _) = &objects[0];
                        let body =
                            format!(r#"{{"spec":{{"replicas":{}}}}}"#, i % 1000).into_bytes();
                        let path = format!("{collection}/{name}");
                        (
                            request("PATCH", &path, "application/merge-patch+json", body),
                            200,
                        )
                    }
                    Verb::Delete => {
                        let Some((name, _)) = objects.pop() else {
                            break;
                        };
                        (
                            request(
                                "DELETE",
                                &format!("{collection}/{name}"),
                                "application/json",
                                Vec::new(),
                            ),
                            200,
                        )
                    }
                };
                let t = Instant::now();
                let Some((status, body)) = send.call(req).await else {
                    break;
                };
                if status == want {
                    lat.push(t.elapsed());
                    if verb == Verb::Update {
                        if let Some(rv) = resource_version(&body) {
                            objects[0].1 = rv;
                        }
                    }
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap_or_default());
    }
    let mut round = summarize(lat.len(), start.elapsed(), lat);
    if let Some((pid, before)) = pid.zip(server_cpu) {
        round.cpu_us_per_op = cpu_us_per_op(pid, before, &round);
    }
    round.client_us_per_op = cpu_us_per_op(std::process::id(), own_cpu, &round);
    round.disk_bytes_per_op = disk_bytes_per_op(disk, &round);
    round
}

async fn etcd_puts(port: u16, clients: usize, secs: f64, prefix: &str) -> Round {
    let value = vec![b'x'; 1024];
    let mut handles = Vec::new();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    for w in 0..clients {
        let value = value.clone();
        let prefix = prefix.to_string();
        let Some(mut etcd) = Etcd::connect(port).await else {
            continue;
        };
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0usize;
            while Instant::now() < until {
                let key = format!("{prefix}-w{w}-{i}");
                i += 1;
                let t = Instant::now();
                if etcd.put(key.as_bytes(), &value).await {
                    lat.push(t.elapsed());
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap_or_default());
    }
    summarize(lat.len(), start.elapsed(), lat)
}

// ------------------------------------------------------------ etcd-client

/// The clients etcd is driven with; each verb keeps the best.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum EtcdClient {
    /// This file's gRPC client: an HTTP/2 connection per worker (puts only).
    HandWritten,
    /// The `etcd-client` crate, one client (one HTTP/2 connection) shared by
    /// every worker, as kube-apiserver multiplexes its requests.
    CrateShared,
    /// The `etcd-client` crate, a client per worker.
    CratePerWorker,
}

impl EtcdClient {
    fn name(self) -> &'static str {
        match self {
            EtcdClient::HandWritten => "hand-written gRPC, a connection per worker",
            EtcdClient::CrateShared => "etcd-client crate, one shared channel",
            EtcdClient::CratePerWorker => "etcd-client crate, a channel per worker",
        }
    }
}

/// Builds `benches/etcd-driver` (the `etcd-client` crate, in a workspace of
/// its own) and returns its binary. etcd-client compiles etcd's protos with
/// `protoc`: Debian's protobuf-compiler is installed when it is missing.
fn etcd_driver() -> Option<std::path::PathBuf> {
    let has_protoc = || {
        Command::new("protoc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has_protoc() {
        progress("protoc not found: installing Debian's protobuf-compiler (apt-get)…");
        let _ = Command::new("sh")
            .args([
                "-c",
                "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null",
            ])
            .status();
        if !has_protoc() {
            progress("no protoc: etcd is driven by the hand-written client only");
            return None;
        }
    }
    let manifest = common::repo_path("benches/etcd-driver/Cargo.toml");
    let target = common::repo_path("target/etcd-driver");
    progress("building the etcd-client driver (benches/etcd-driver)…");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let ok = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "--manifest-path",
        ])
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .is_ok_and(|s| s.success());
    let bin = target.join("release/etcd-driver");
    if ok && bin.exists() {
        Some(bin)
    } else {
        progress(
            "the etcd-client driver did not build: etcd is driven by the hand-written client only",
        );
        None
    }
}

/// One round of the driver against etcd (`etcd_pid` for its CPU, measured
/// by the driver over the timed part only).
#[allow(clippy::too_many_arguments)]
async fn driver_round(
    bin: &Path,
    port: u16,
    etcd_pid: u32,
    verb: Verb,
    shared: bool,
    clients: usize,
    secs: f64,
    deletes: usize,
    prefix: &str,
) -> Option<Round> {
    let out = tokio::process::Command::new(bin)
        .args(["--endpoint", &format!("http://127.0.0.1:{port}")])
        .args(["--op", verb.etcd_op()])
        .args(["--clients", &clients.to_string()])
        .args(["--secs", &secs.to_string()])
        .args(["--channel", if shared { "shared" } else { "per-worker" }])
        .args(["--prefix", prefix])
        .args(["--keys", &deletes.div_ceil(clients).max(1).to_string()])
        .args(["--server-pid", &etcd_pid.to_string()])
        .output()
        .await
        .ok()?;
    if !out.status.success() {
        progress(&format!(
            "etcd-driver failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let ops = v["ops"].as_u64()? as usize;
    // A round whose requests failed says why (the round counts only successes).
    if let Some(first) = v["first_error"].as_str() {
        progress(&format!(
            "etcd-driver: {} of {} requests failed; the first: {first}",
            v["errors"].as_u64().unwrap_or(0),
            v["errors"].as_u64().unwrap_or(0) + ops as u64
        ));
    }
    if ops == 0 {
        return None;
    }
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Some(Round {
        ops,
        secs: f("elapsed_secs"),
        ops_per_sec: ops as f64 / f("elapsed_secs").max(1e-9),
        p50_ms: f("p50_ms"),
        p99_ms: f("p99_ms"),
        cpu_us_per_op: f("server_cpu_secs") * 1e6 / (ops as f64).max(1.0),
        client_us_per_op: f("cpu_secs") * 1e6 / (ops as f64).max(1.0),
        disk_bytes_per_op: f("disk_written_bytes") / (ops as f64).max(1.0),
    })
}

// ------------------------------------------------------------------ memory

/// Fills kshard up to `objects` widgets, then reads its resident memory and
/// the JSON size of what it stores.
/// Creates widgets `{prefix}-0` … `{prefix}-{n-1}` in `collection` with 32
/// clients, reporting progress every 10,000.
async fn fill(client: &kube::Client, collection: &'static str, prefix: &str, n: usize) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..32 {
        let (client, next, prefix) = (client.clone(), next.clone(), prefix.to_string());
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return;
                }
                if i % 10_000 == 0 && i > 0 {
                    progress(&format!("{prefix}: {i}/{n}"));
                }
                let req = http::Request::post(collection)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(widget_1k(&format!(
                        "{prefix}-{i}"
                    ))))
                    .expect("request");
                if let Ok(r) = client.send(req).await {
                    let _ = r.into_body().collect_bytes().await;
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
}

/// Memory of a server holding `objects`, against the JSON it holds.
struct MemoryPoint {
    objects: usize,
    json_bytes: u64,
    /// The same server just started, idle, nothing stored.
    base_rss: u64,
    /// Once the load's events have left the watch history.
    rss: u64,
    /// Right after the load, its events still in the history.
    rss_with_history: u64,
}

impl MemoryPoint {
    /// Memory above the idle base per byte of stored JSON.
    fn ratio(&self) -> f64 {
        self.rss.saturating_sub(self.base_rss) as f64 / self.json_bytes.max(1) as f64
    }

    fn ratio_with_history(&self) -> f64 {
        self.rss_with_history.saturating_sub(self.base_rss) as f64 / self.json_bytes.max(1) as f64
    }

    fn bytes_per_object(&self) -> f64 {
        self.rss.saturating_sub(self.base_rss) as f64 / self.objects.max(1) as f64
    }
}

/// Memory at each of `sizes`, each on a fresh server and store of its own,
/// so one point's load (or another phase's) is not counted in the next.
/// While one server waits for its load's events to leave the watch history
/// the next is loaded: the waits overlap.
async fn memory_points(sizes: &[usize], extra: &[&str]) -> Vec<MemoryPoint> {
    let window = env_usize("KSHARD_ETCD_HISTORY_SECS", if smoke() { 0 } else { 77 });
    let mut loaded = Vec::new();
    for &objects in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = common::spawn_kshard_with(&dir.path().join("kshard"), extra, &AS_DEPLOYED);
        let pid = server.id();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let base_rss = common::rss_bytes(pid);
        progress(&format!(
            "memory: loading {objects} objects into a fresh server ({:.1} MB idle)…",
            base_rss as f64 / 1e6
        ));
        let client = common::client_for(&dir.path().join("kshard/kubeconfig")).await;
        fill(&client, WIDGETS, "m", objects).await;
        let (count, json_bytes) = stored_json(&client).await;
        // Its connections close: what they held is not the objects'.
        drop(client);
        // Let the allocator settle after the big list before reading RSS.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_with_history = common::rss_bytes(pid);
        progress(&format!(
            "memory: {count} objects, {:.1} MB with the load's events in the watch history",
            rss_with_history as f64 / 1e6
        ));
        let point = MemoryPoint {
            objects: count,
            json_bytes,
            base_rss,
            rss: rss_with_history,
            rss_with_history,
        };
        loaded.push((dir, server, point, Instant::now()));
    }
    let mut points = Vec::new();
    for (_dir, server, mut point, at) in loaded {
        // Steady state: the history of the load (every create of the last
        // 75 s) has expired.
        let until = at + Duration::from_secs(window as u64);
        if window > 0 && Instant::now() < until {
            progress(&format!(
                "memory: waiting {:.0} s for the history of {} objects to expire…",
                until
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64(),
                point.objects
            ));
            tokio::time::sleep_until(until.into()).await;
        }
        point.rss = common::rss_bytes(server.id());
        println!(
            "memory: {} objects, {:.1} MB of JSON, RSS {:.1} MB over a {:.1} MB base ({:.2}× the JSON, {:.0} B/object); {:.2}× while the load's events were in the watch history",
            point.objects,
            point.json_bytes as f64 / 1e6,
            point.rss as f64 / 1e6,
            point.base_rss as f64 / 1e6,
            point.ratio(),
            point.bytes_per_object(),
            point.ratio_with_history()
        );
        points.push(point);
    }
    points
}

/// Memory per byte of JSON stored between the smallest and the largest
/// point, and what is fixed beyond the idle base (the line's intercept:
/// what a server takes on once it has served, whatever it stores).
fn memory_growth(points: &[MemoryPoint]) -> Option<(f64, f64)> {
    let (a, b) = (points.first()?, points.last()?);
    if b.json_bytes <= a.json_bytes {
        return None;
    }
    let over = |m: &MemoryPoint| m.rss.saturating_sub(m.base_rss) as f64;
    let per_byte = (over(b) - over(a)) / (b.json_bytes - a.json_bytes) as f64;
    Some((per_byte, over(a) - per_byte * a.json_bytes as f64))
}

/// How many widgets are stored, and the bytes of their JSON.
async fn stored_json(client: &kube::Client) -> (usize, u64) {
    let req = http::Request::get(WIDGETS)
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = client.send(req).await.expect("list");
    let body = resp.into_body().collect_bytes().await.expect("body");
    let all = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let items = all["items"].as_array().map_or(&[][..], Vec::as_slice);
    let bytes = items
        .iter()
        .map(|i| serde_json::to_vec(i).map_or(0, |b| b.len() as u64))
        .sum();
    (items.len(), bytes)
}

// ------------------------------------------------------------------ fan-out

fn cpu_seconds(pid: u32) -> f64 {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// User and system CPU seconds from a `stat` file of /proc (a process's or a thread's).
fn stat_cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = [11usize, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    ticks / 100.0
}

/// The object's name in a watch frame: the first `"name":"…"` after
/// `"metadata":` (the bench's objects have no other `name` key before it).
fn frame_name(line: &[u8]) -> Option<&[u8]> {
    let meta = memchr::memmem::find(line, b"\"metadata\":")?;
    let key = b"\"name\":\"";
    let at = meta + memchr::memmem::find(&line[meta..], key)? + key.len();
    let len = memchr::memchr(b'"', &line[at..])?;
    Some(&line[at..at + len])
}

/// Every watcher's receipts of one fan-out write, kept without a lock: 1,000
/// watchers in one process record 100,000 receipts a second, and a shared
/// map behind a mutex made the load generator's own stalls part of the
/// measured tail.
struct Receipt {
    count: AtomicUsize,
    /// Nanoseconds since the fan-out began.
    first: AtomicU64,
    last: AtomicU64,
    /// The watcher that got it last (for the tail's connection).
    last_watcher: AtomicUsize,
}

impl Receipt {
    fn new() -> Self {
        Self {
            count: AtomicUsize::new(0),
            first: AtomicU64::new(u64::MAX),
            last: AtomicU64::new(0),
            last_watcher: AtomicUsize::new(0),
        }
    }

    fn record(&self, at: u64, watcher: usize) {
        self.first.fetch_min(at, Ordering::Relaxed);
        if self.last.fetch_max(at, Ordering::Relaxed) <= at {
            self.last_watcher.store(watcher, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Release);
    }
}

struct FanOut {
    watchers: usize,
    events: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// The server's CPU per delivered event.
    cpu_us_per_delivery: f64,
    /// The watchers' and the writer's (this process's) CPU per delivered event.
    client_cpu_us_per_delivery: f64,
}

/// A TLS connection to kshard as the admin (the dev PKI's client
/// certificate), offering `alpn`. Socket reads go through a large buffer:
/// rustls reads at most 4 KiB at a time, so a watcher's stream of 16 KiB
/// records cost the client three `recvfrom` calls each on the cores it
/// shares with the server. Go's TLS client, client-go's, reads whatever
/// the socket holds.
async fn admin_tls(
    data: &Path,
    addr: &str,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::io::BufReader<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let pki = data.join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("ca") {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("admin.crt"))
        .expect("admin cert")
        .map(|c| c.expect("pem"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).expect("admin key");
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .expect("client auth");
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let _ = tcp.set_nodelay(true);
    let tcp = tokio::io::BufReader::with_capacity(256 * 1024, tcp);
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("tls")
}

/// An HTTP/2 connection to kshard as the admin, as client-go opens one per
/// host and multiplexes every watch over it.
async fn h2_connection<B>(data: &Path, addr: &str) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = admin_tls(data, addr, b"h2").await;
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    send
}

/// An HTTP/1.1 connection to kshard as the admin: the same bare hyper
/// client as the etcd side's, so the load generator costs both servers'
/// shared cores alike.
async fn h1_connection(
    data: &Path,
    addr: &str,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>> {
    let tls = admin_tls(data, addr, b"http/1.1").await;
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .expect("http/1.1 handshake");
    tokio::spawn(conn);
    send
}

/// kshard's address, from the kubeconfig it wrote.
fn server_addr(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .expect("server")
        .trim()
        .trim_matches('"');
    server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string()
}

async fn fan_out(kubeconfig: &Path, pid: u32, watchers: usize, writes: usize) -> FanOut {
    const NS: &str = "/apis/demo.kshard.dev/v1/namespaces/fanout/widgets";
    let data = kubeconfig.parent().expect("data dir");
    let addr = server_addr(kubeconfig);
    // Several connections, each carrying up to 250 watch streams over HTTP/2.
    let conns = watchers.div_ceil(250).max(1);
    let mut senders = Vec::new();
    for _ in 0..conns {
        senders.push(h2_connection::<http_body_util::Empty<Bytes>>(data, &addr).await);
    }
    let began = Instant::now();
    let since = move |t: Instant| t.saturating_duration_since(began).as_nanos() as u64;
    let received: Arc<Vec<Receipt>> = Arc::new((0..writes).map(|_| Receipt::new()).collect());
    let mut tasks = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(watchers);
    for w in 0..watchers {
        let mut send = senders[w % conns].clone();
        let received = received.clone();
        let ready = ready_tx.clone();
        tasks.push(tokio::spawn(async move {
            let req =
                http::Request::get(format!("https://localhost{NS}?watch=1&timeoutSeconds=600"))
                    .body(http_body_util::Empty::new())
                    .expect("request");
            if send.ready().await.is_err() {
                return;
            }
            let Ok(resp) = send.send_request(req).await else {
                return;
            };
            if w == 0 {
                progress(&format!("fan-out: watches over {:?}", resp.version()));
            }
            let _ = ready.send(()).await;
            let mut body = resp.into_body();
            let mut buf = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let now = since(Instant::now());
                // The client only needs the name (`f-<write>`): finding it
                // costs far less than parsing the frame, so 1000 watchers in
                // one process leave the machine to the server.
                let take = |line: &[u8]| {
                    let write = frame_name(line)
                        .and_then(|n| std::str::from_utf8(n).ok())
                        .and_then(|n| n.strip_prefix("f-"))
                        .and_then(|n| n.parse::<usize>().ok());
                    if let Some(r) = write.and_then(|i| received.get(i)) {
                        r.record(now, w);
                    }
                };
                // Whole lines are read where they arrived; only a line split
                // across frames is copied.
                let mut rest: &[u8] = &data;
                if !buf.is_empty() {
                    let Some(i) = memchr::memchr(b'\n', rest) else {
                        buf.extend_from_slice(rest);
                        continue;
                    };
                    buf.extend_from_slice(&rest[..=i]);
                    take(&buf);
                    buf.clear();
                    rest = &rest[i + 1..];
                }
                while let Some(i) = memchr::memchr(b'\n', rest) {
                    take(&rest[..=i]);
                    rest = &rest[i + 1..];
                }
                buf.extend_from_slice(rest);
            }
        }));
    }
    drop(ready_tx);
    for _ in 0..watchers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    progress(&format!(
        "fan-out: {watchers} watchers open; writing {writes} objects"
    ));
    let writer = common::client_for(kubeconfig).await;
    let cpu_before = cpu_seconds(pid);
    let own_before = cpu_seconds(std::process::id());
    let mut acked = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for i in 0..writes {
        tick.tick().await;
        let name = format!("f-{i}");
        let req = http::Request::post(NS)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(widget_1k(&name)))
            .expect("request");
        if let Ok(r) = writer.send(req).await {
            let ok = r.status().as_u16() == 201;
            let _ = r.into_body().collect_bytes().await;
            if ok {
                acked.push((i, since(Instant::now())));
            }
        }
    }
    // Wait for the last deliveries (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let done = acked
            .iter()
            .all(|(i, _)| received[*i].count.load(Ordering::Acquire) >= watchers);
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu = cpu_seconds(pid) - cpu_before;
    let own = cpu_seconds(std::process::id()) - own_before;
    for t in tasks {
        t.abort();
    }
    // From each acknowledged write to its first and its last receipt.
    let spans: Vec<(Duration, Duration, usize)> = acked
        .iter()
        .filter(|(i, _)| received[*i].count.load(Ordering::Acquire) > 0)
        .map(|(i, at)| {
            let r = &received[*i];
            let after =
                |t: &AtomicU64| Duration::from_nanos(t.load(Ordering::Relaxed).saturating_sub(*at));
            (
                after(&r.first),
                after(&r.last),
                r.last_watcher.load(Ordering::Relaxed),
            )
        })
        .collect();
    let mut lat: Vec<Duration> = spans.iter().map(|s| s.1).collect();
    // Where the tail sits (write number: first/last receipt in ms, and the
    // connection of the last watcher to get it): a late first receipt is a
    // stall before any watcher was written to, an early first and a late
    // last one the spread of the fan-out itself.
    let mut slowest: Vec<(usize, (Duration, Duration, usize))> =
        spans.iter().copied().enumerate().collect();
    slowest.sort_by_key(|s| std::cmp::Reverse(s.1 .1));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    progress(&format!(
        "fan-out: slowest writes (first/last receipt) {}",
        slowest
            .iter()
            .take(12)
            .map(|(i, (f, l, w))| format!(
                "#{i}: {:.1}/{:.1} ms (last: connection {})",
                ms(*f),
                ms(*l),
                w % conns
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let deliveries: usize = acked
        .iter()
        .map(|(i, _)| received[*i].count.load(Ordering::Acquire))
        .sum();
    let events = lat.len();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    FanOut {
        watchers,
        events,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        cpu_us_per_delivery: cpu * 1e6 / deliveries.max(1) as f64,
        client_cpu_us_per_delivery: own * 1e6 / deliveries.max(1) as f64,
    }
}

// ------------------------------------------------------------------ plot

// ------------------------------------------------------------ watched creates

/// Creates/s at c=16 without watchers, then with `watchers` watching the
/// same resource over HTTP/2 (the watchers only drain their streams),
/// `rounds` times, each round's time in `slices` taken alone and watched in
/// turn; the round whose watched/alone ratio is the median, and the bytes
/// of watch body the watchers received per create in it.
async fn watched_creates(
    kubeconfig: &Path,
    pid: u32,
    watchers: usize,
    secs: f64,
    rounds: usize,
    slices: usize,
) -> (Round, Round, f64) {
    const NS: &str = "/apis/demo.kshard.dev/v1/namespaces/watched/widgets";
    let mut rounds_run = Vec::new();
    let received = Arc::new(AtomicU64::new(0));
    let slice_secs = secs / slices as f64;
    for r in 0..rounds {
        // Alone and watched in turn, a slice each, as the creates' rounds
        // run: a slow spell of the machine falls on both.
        let (mut a_parts, mut w_parts, mut bytes) = (Vec::new(), Vec::new(), 0u64);
        for s in 0..slices {
            let at = format!("{}/{rounds}, slice {}/{slices}", r + 1, s + 1);
            progress(&format!(
                "watched {at}: creates at c=16 for {slice_secs} s without watchers…"
            ));
            let (cpu, own) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
            let mut a =
                kshard_creates(kubeconfig, NS, 16, slice_secs, &format!("alone{r}-{s}")).await;
            a.cpu_us_per_op = cpu_us_per_op(pid, cpu, &a);
            a.client_us_per_op = cpu_us_per_op(std::process::id(), own, &a);
            a_parts.push(a);
            let streams = WatcherThread::open(kubeconfig, NS, watchers, received.clone()).await;
            progress(&format!(
                "watched {at}: creates at c=16 for {slice_secs} s with {watchers} watchers…"
            ));
            let (cpu, own) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
            let before = received.load(Ordering::Relaxed);
            let mut w =
                kshard_creates(kubeconfig, NS, 16, slice_secs, &format!("watched{r}-{s}")).await;
            w.cpu_us_per_op = cpu_us_per_op(pid, cpu, &w);
            // The watchers' draining is the client's too.
            w.client_us_per_op = cpu_us_per_op(std::process::id(), own, &w);
            bytes += received.load(Ordering::Relaxed) - before;
            w_parts.push(w);
            streams.close().await;
        }
        if let (Some(a), Some(w)) = (joined_slices(a_parts), joined_slices(w_parts)) {
            progress(&format!(
                "watched round {}/{rounds}: {:.0}/s alone, {:.0}/s watched ({:.2}×)",
                r + 1,
                a.ops_per_sec,
                w.ops_per_sec,
                w.ops_per_sec / a.ops_per_sec.max(1e-9)
            ));
            let per_create = bytes as f64 / w.ops.max(1) as f64;
            rounds_run.push((a, w, per_create));
        }
    }
    // A round's alone and watched slices ran in turn, so the pair is what
    // compares: the round of the median ratio, both sides of it. (Medians
    // taken of each side apart paired one round's alone with another's
    // watched, while the objects piling up slowed the later rounds.)
    rounds_run.sort_by(|x, y| ratio(x).total_cmp(&ratio(y)));
    let mid = rounds_run.len() / 2;
    let (a, w, per_create) = rounds_run.swap_remove(mid);
    (a, w, per_create)
}

/// Watched creates/s against alone in one round.
fn ratio((alone, watched, _): &(Round, Round, f64)) -> f64 {
    watched.ops_per_sec / alone.ops_per_sec.max(1e-9)
}

/// What moving watch bytes costs this machine at the least: one TLS 1.3
/// connection over loopback with kshard's certificate and cipher
/// (AES-128-GCM), one end writing 32 KiB at a time (as kshard's HTTP/2
/// connections write) on a thread of its own, the other reading through
/// the watchers' large buffer and discarding, for `secs`. The CPU of each
/// end, the kernel's included, per KiB moved: the encryption, the loopback
/// and the decryption every delivered byte costs, without HTTP/2, JSON or
/// a watch.
async fn tls_floor(data: &Path, secs: f64) -> TlsFloor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = data.join("pki");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("server.crt"))
        .expect("server cert")
        .map(|c| c.expect("pem"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(pki.join("server.key")).expect("server key");
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|s| s.suite() == rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr").to_string();
    let (start_tx, start_rx) = tokio::sync::oneshot::channel::<()>();
    // The writing end's CPU is its thread's.
    let writer = std::thread::spawn(move || -> f64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let (tcp, _) = listener.accept().await.expect("accept");
            let _ = tcp.set_nodelay(true);
            let mut tls = acceptor.accept(tcp).await.expect("tls accept");
            let _ = start_rx.await;
            let cpu = stat_cpu_seconds("/proc/thread-self/stat");
            let chunk = vec![b'x'; 32 * 1024];
            let until = Instant::now() + Duration::from_secs_f64(secs);
            while Instant::now() < until {
                if tls.write_all(&chunk).await.is_err() || tls.flush().await.is_err() {
                    break;
                }
            }
            let _ = tls.shutdown().await;
            stat_cpu_seconds("/proc/thread-self/stat") - cpu
        })
    });
    let mut tls = admin_tls(data, &addr, b"h2").await;
    let cpu = cpu_seconds(std::process::id());
    let _ = start_tx.send(());
    let mut buf = vec![0u8; 64 * 1024];
    let mut moved = 0u64;
    while let Ok(n @ 1..) = tls.read(&mut buf).await {
        moved += n as u64;
    }
    let both = cpu_seconds(std::process::id()) - cpu;
    let writing = tokio::task::spawn_blocking(move || writer.join().unwrap_or(0.0))
        .await
        .unwrap_or(0.0);
    let kib = (moved as f64 / 1024.0).max(1.0);
    TlsFloor {
        writer_us_per_kib: writing * 1e6 / kib,
        reader_us_per_kib: (both - writing).max(0.0) * 1e6 / kib,
    }
}

/// [`tls_floor`]'s figures: CPU per KiB moved at each end.
struct TlsFloor {
    writer_us_per_kib: f64,
    reader_us_per_kib: f64,
}

impl TlsFloor {
    fn us_per_kib(&self) -> f64 {
        self.writer_us_per_kib + self.reader_us_per_kib
    }
}

/// Watched creates against what the bytes alone allow on this machine.
struct WatchedBound {
    /// Watch body bytes the watchers received per create.
    kib_per_create: f64,
    /// The CPU (server and client) a create took with the watchers beyond
    /// what it took alone: what delivering its events cost.
    delivery_us_per_create: f64,
    /// The server's part of it.
    server_delivery_us_per_create: f64,
    floor: TlsFloor,
    floor_us_per_kib: f64,
    /// Creates/s were every core busy and delivery cost only its bytes'
    /// floor: an upper bound, whatever the delivery path.
    ceiling_per_sec: f64,
}

impl WatchedBound {
    fn new(alone: &Round, watched: &Round, bytes_per_create: f64, floor: TlsFloor) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let kib_per_create = bytes_per_create / 1024.0;
        let alone_us = alone.cpu_us_per_op + alone.client_us_per_op;
        let floor_us_per_kib = floor.us_per_kib();
        Self {
            kib_per_create,
            delivery_us_per_create: watched.cpu_us_per_op + watched.client_us_per_op - alone_us,
            server_delivery_us_per_create: watched.cpu_us_per_op - alone.cpu_us_per_op,
            floor,
            floor_us_per_kib,
            ceiling_per_sec: cores * 1e6 / (alone_us + kib_per_create * floor_us_per_kib).max(1e-9),
        }
    }

    fn floor_us_per_create(&self) -> f64 {
        self.kib_per_create * self.floor_us_per_kib
    }
}

/// One round from its slices: writes and time summed; CPU, disk and the
/// latency percentiles per write over all of them (each slice knows only
/// its own percentiles: theirs weighted by their writes).
fn joined_slices(slices: Vec<Round>) -> Option<Round> {
    let ops: usize = slices.iter().map(|r| r.ops).sum();
    let secs: f64 = slices.iter().map(|r| r.secs).sum();
    if ops == 0 || secs <= 0.0 {
        return None;
    }
    let per_op =
        |f: fn(&Round) -> f64| slices.iter().map(|r| f(r) * r.ops as f64).sum::<f64>() / ops as f64;
    Some(Round {
        ops,
        secs,
        ops_per_sec: ops as f64 / secs,
        p50_ms: per_op(|r| r.p50_ms),
        p99_ms: per_op(|r| r.p99_ms),
        cpu_us_per_op: per_op(|r| r.cpu_us_per_op),
        client_us_per_op: per_op(|r| r.client_us_per_op),
        disk_bytes_per_op: per_op(|r| r.disk_bytes_per_op),
    })
}

/// The middle of `sorted` (the upper one of an even count).
fn median_of(sorted: &[f64]) -> Option<f64> {
    sorted.get(sorted.len() / 2).copied()
}

/// The round of median throughput.
fn median_round(mut rounds: Vec<Round>) -> Round {
    rounds.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    let mid = rounds.len() / 2;
    rounds.swap_remove(mid)
}

/// Watchers on a thread of their own, as the other processes they stand
/// for would be: sharing the load generator's runtime, they queued its
/// creates' requests and responses behind their reads (each of the runtime's
/// workers waited twice as long per wake), which slowed the creates by the
/// client's own scheduling rather than by the server's delivery.
struct WatcherThread {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl WatcherThread {
    async fn open(
        kubeconfig: &Path,
        collection: &'static str,
        watchers: usize,
        received: Arc<AtomicU64>,
    ) -> WatcherThread {
        let kubeconfig = kubeconfig.to_path_buf();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("watchers".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("watchers' runtime");
                rt.block_on(async move {
                    let tasks = open_watchers(&kubeconfig, collection, watchers, received).await;
                    let _ = ready_tx.send(());
                    let _ = stop_rx.await;
                    for t in tasks {
                        t.abort();
                    }
                });
            })
            .expect("watchers' thread");
        ready_rx.await.expect("watchers open");
        WatcherThread {
            stop: stop_tx,
            thread,
        }
    }

    async fn close(self) {
        let WatcherThread { stop, thread } = self;
        let _ = stop.send(());
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// `watchers` watches of `collection` over HTTP/2 that drain their streams,
/// open once this returns. They start as informers do after their list:
/// from its resourceVersion. A watch without one would first get every
/// object already stored as an ADDED event, and the creates measured next
/// would compete with that replay rather than with the fan-out of creates.
async fn open_watchers(
    kubeconfig: &Path,
    collection: &'static str,
    watchers: usize,
    received: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let client = common::client_for(kubeconfig).await;
    let req = http::Request::get(format!("{collection}?limit=1"))
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = client.send(req).await.expect("list");
    let body = resp.into_body().collect_bytes().await.expect("body");
    let list: Value = serde_json::from_slice(&body).expect("list json");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_string();
    let data = kubeconfig.parent().expect("data dir");
    let addr = server_addr(kubeconfig);
    let conns = watchers.div_ceil(250).max(1);
    let mut senders = Vec::new();
    for _ in 0..conns {
        senders.push(h2_connection::<http_body_util::Empty<Bytes>>(data, &addr).await);
    }
    let mut tasks = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(watchers.max(1));
    for (c, send) in senders.into_iter().enumerate() {
        let streams = watchers / conns + usize::from(c < watchers % conns);
        let ready = ready_tx.clone();
        let received = received.clone();
        let url = format!(
            "https://localhost{collection}?watch=1&timeoutSeconds=600&resourceVersion={rv}"
        );
        // One task drains every stream of its connection: data on any of
        // them wakes this task once, rather than a task per stream each
        // time, so the client's scheduling stays off the shared cores.
        tasks.push(tokio::spawn(async move {
            let mut opening: FuturesUnordered<_> = (0..streams)
                .map(|_| {
                    let mut send = send.clone();
                    let req = http::Request::get(url.as_str())
                        .body(http_body_util::Empty::new())
                        .expect("request");
                    async move {
                        send.ready().await.ok()?;
                        send.send_request(req).await.ok()
                    }
                })
                .collect();
            let mut draining = FuturesUnordered::new();
            while let Some(resp) = opening.next().await {
                let Some(resp) = resp else { continue };
                let _ = ready.send(()).await;
                let received = &received;
                draining.push(async move {
                    let mut body = resp.into_body();
                    while let Some(Ok(frame)) = body.frame().await {
                        if let Some(data) = frame.data_ref() {
                            received.fetch_add(data.len() as u64, Ordering::Relaxed);
                        }
                    }
                });
            }
            drop(ready);
            while draining.next().await.is_some() {}
        }));
    }
    drop(ready_tx);
    for _ in 0..watchers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    tasks
}

// ------------------------------------------------------------------ lists

/// Times of a paginated list of every widget, page by page (`limit=500` and `continue`, a
/// consistent read, as client-go's pager sends it).
struct Pages {
    first_ms: f64,
    middle_ms: f64,
    last_ms: f64,
    pages: usize,
}

/// A full list of `n` objects from the watch cache (`resourceVersion=0`,
/// over HTTPS, as a client sees it) against serde_json serializing the same
/// objects in memory, medians of 5; then the same objects in pages of 500.
async fn list_against_serde(kubeconfig: &Path, pid: u32, n: usize) -> (f64, f64, f64, Pages) {
    const NS: &str = "/apis/demo.kshard.dev/v1/namespaces/lists/widgets";
    let client = common::client_for(kubeconfig).await;
    progress(&format!("lists: creating {n} objects…"));
    fill(&client, NS, "l", n).await;
    let mut list_ms = Vec::new();
    let mut frames = Vec::new();
    // The server's CPU across the lists: whether a slow list is the
    // server's work or the machine's (the client shares its cores).
    let cpu_before = cpu_seconds(pid);
    let own_before = cpu_seconds(std::process::id());
    // Nine, the median kept: a list takes 30-50 ms, and a slow spell of the
    // shared machine would otherwise decide it.
    const LISTS: usize = 9;
    for i in 0..LISTS {
        let req = http::Request::get(format!("{NS}?resourceVersion=0"))
            .body(kube::client::Body::empty())
            .expect("request");
        let t = Instant::now();
        let resp = client.send(req).await.expect("list");
        // Received as a streaming decoder reads it, frame by frame: copying
        // 13 MB into one fresh buffer costs this client (page faults)
        // more than the server's whole answer, and is not the server's time.
        // A frame is dropped once read (kept only from the last list, for
        // the serde baseline): held frames pin the client's read buffers,
        // so each list would take 13 MB of fresh memory, and this client
        // spent as much CPU faulting it in as the server spent answering.
        let keep = i + 1 == LISTS;
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            if let (Ok(data), true) = (frame.expect("list body").into_data(), keep) {
                frames.push(data);
            }
        }
        list_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let per_list = |cpu: f64| cpu * 1000.0 / list_ms.len().max(1) as f64;
    let server_cpu_ms = per_list(cpu_seconds(pid) - cpu_before);
    let client_cpu_ms = per_list(cpu_seconds(std::process::id()) - own_before);
    progress(&format!(
        "lists: {} ms each; CPU per list {server_cpu_ms:.1} ms the server's, {client_cpu_ms:.1} ms this client's",
        list_ms
            .iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    ));
    let body = frames.concat();
    let items = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null)["items"].clone();
    let mut serde_ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let out = serde_json::to_vec(&items).expect("serialize");
        serde_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        std::hint::black_box(out);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Each page three times (the same continue token), the median kept:
    // the time of page k shows whether its offset costs anything.
    let mut page_ms = Vec::new();
    let mut token = String::new();
    let mut body = Bytes::new();
    loop {
        // Across all namespaces: every object the bench stored (the memory
        // load's too, when it ran), so the offsets reach far.
        const ALL: &str = "/apis/demo.kshard.dev/v1/widgets";
        let url = if token.is_empty() {
            format!("{ALL}?limit=500")
        } else {
            format!("{ALL}?limit=500&continue={token}")
        };
        let mut times = Vec::new();
        for _ in 0..3 {
            let req = http::Request::get(url.as_str())
                .body(kube::client::Body::empty())
                .expect("request");
            let t = Instant::now();
            let resp = client.send(req).await.expect("page");
            body = resp.into_body().collect_bytes().await.expect("body");
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        page_ms.push(median(times));
        let page: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match page["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => break,
        }
    }
    let pages = Pages {
        first_ms: page_ms.first().copied().unwrap_or(0.0),
        middle_ms: page_ms.get(page_ms.len() / 2).copied().unwrap_or(0.0),
        // The last page may be short: the one before it is a full page.
        last_ms: page_ms
            .get(page_ms.len().saturating_sub(2))
            .copied()
            .unwrap_or(0.0),
        pages: page_ms.len(),
    };
    (median(list_ms), median(serde_ms), server_cpu_ms, pages)
}

fn plot(
    ratios: &[(String, f64)],
    memory: &[MemoryPoint],
    growth: Option<(f64, f64)>,
    fan: &FanOut,
    watched: Option<(f64, f64)>,
    disk: &[(usize, f64, f64)],
) -> String {
    let mem_ratio = memory.iter().map(MemoryPoint::ratio).fold(0.0, f64::max);
    let (w, h, left, bottom) = (960.0, 320.0, 60.0, 260.0);
    let max = ratios
        .iter()
        .map(|r| r.1)
        .fold(1.2_f64, f64::max)
        .max(mem_ratio / 2.0);
    let step = 560.0 / ratios.len().max(1) as f64;
    let bar_w = step * 0.7;
    let mut bars = String::new();
    for (i, (c, r)) in ratios.iter().enumerate() {
        let x = left + 10.0 + i as f64 * step;
        let bh = (r / max) * 200.0;
        let color = if *r >= 1.0 { "seagreen" } else { "indianred" };
        bars.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"{bar_w}\" height=\"{bh}\" fill=\"{color}\"/>\
<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{r:.2}×</text>\
<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{c}</text>",
            bottom - bh,
            x + bar_w / 2.0,
            bottom - bh - 4.0,
            x + bar_w / 2.0,
            bottom + 16.0
        ));
    }
    let one = bottom - (1.0 / max) * 200.0;
    let mem_lines: String = memory
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "<text x=\"670\" y=\"{}\" font-size=\"13\">{} objects: {:.2}× ({:.0} B/object)</text>",
                80.0 + i as f64 * 20.0,
                m.objects,
                m.ratio(),
                m.bytes_per_object()
            )
        })
        .collect::<String>()
        + &growth.map_or(String::new(), |(per_byte, fixed)| {
            format!(
                "<text x=\"670\" y=\"{}\" font-size=\"13\">growth {per_byte:.2} B per JSON byte, +{:.0} MB fixed</text>",
                80.0 + memory.len() as f64 * 20.0,
                fixed / 1e6
            )
        });
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
<text x=\"{left}\" y=\"24\" font-size=\"14\">kshard writes/s ÷ etcd's for the same verb (1 KiB, fsync'd; each side's best client)</text>\
<line x1=\"{left}\" y1=\"{one}\" x2=\"{}\" y2=\"{one}\" stroke=\"gray\" stroke-dasharray=\"4\"/>\
<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"gray\">1.0 = etcd</text>{bars}\
<text x=\"660\" y=\"60\" font-size=\"13\">memory above base ÷ JSON:</text>{mem_lines}\
<text x=\"660\" y=\"164\" font-size=\"13\">fan-out to {} watchers:</text>\
<text x=\"660\" y=\"184\" font-size=\"13\">p50 {:.1} ms, p99 {:.1} ms</text>\
<text x=\"660\" y=\"204\" font-size=\"13\">{:.2} µs CPU per delivered event</text>{}{}</svg>",
        left + 570.0,
        left + 510.0,
        one - 4.0,
        fan.watchers,
        fan.p50_ms,
        fan.p99_ms,
        fan.cpu_us_per_delivery,
        watched.map_or(String::new(), |(ratio, ceiling)| format!(
            "<text x=\"660\" y=\"236\" font-size=\"13\">creates with 100 watchers: {ratio:.2}× alone</text>\
<text x=\"660\" y=\"256\" font-size=\"13\">(the bytes' TLS floor allows ≤ {ceiling:.2}×)</text>"
        )),
        disk_lines(disk)
    )
}

/// The disks' writes per create against etcd's per put, by concurrency.
fn disk_lines(disk: &[(usize, f64, f64)]) -> String {
    if disk.is_empty() {
        return String::new();
    }
    let join =
        |f: fn(&(usize, f64, f64)) -> String| disk.iter().map(f).collect::<Vec<_>>().join(" / ");
    format!(
        "<text x=\"660\" y=\"288\" font-size=\"13\">disk writes per create at c={}:</text>\
<text x=\"660\" y=\"308\" font-size=\"13\">{} KB (etcd's per put {} KB)</text>",
        join(|d| d.0.to_string()),
        join(|d| format!("{:.1}", d.1 / 1e3)),
        join(|d| format!("{:.1}", d.2 / 1e3)),
    )
}

// ------------------------------------------------------------------ main

/// What the comparisons of one server pair share.
struct Ctx<'a> {
    kubeconfig: &'a Path,
    /// kshard's pid.
    pid: u32,
    /// etcd's pid and client port, when etcd runs.
    etcd: Option<(u32, u16)>,
    driver: Option<&'a Path>,
    secs: f64,
    rounds: usize,
    /// Each round's time per client is run in this many slices, every
    /// client of both sides in turn, so that a slow spell of the shared
    /// machine falls on both sides rather than on whichever ran then.
    slices: usize,
    /// Objects deleted per delete round.
    deletes: usize,
}

/// Each client's median round, best first.
struct Measured {
    verb: Verb,
    clients: usize,
    kshard: Vec<(&'static str, Round)>,
    etcd: Vec<(&'static str, Round)>,
}

impl Measured {
    fn best_kshard(&self) -> Option<&(&'static str, Round)> {
        self.kshard.first()
    }

    fn best_etcd(&self) -> Option<&(&'static str, Round)> {
        self.etcd.first()
    }

    fn ratio(&self) -> Option<f64> {
        Some(self.best_kshard()?.1.ops_per_sec / self.best_etcd()?.1.ops_per_sec.max(1e-9))
    }

    /// kshard's best client against etcd's best, round by round (the
    /// rounds run interleaved), lowest first.
    fn round_ratios(&self, per_round: &[(Vec<f64>, Vec<f64>)]) -> Vec<f64> {
        let mut r: Vec<f64> = per_round
            .iter()
            .filter_map(|(k, e)| {
                let k = k.iter().copied().fold(f64::NAN, f64::max);
                let e = e.iter().copied().fold(f64::NAN, f64::max);
                (k.is_finite() && e.is_finite() && e > 0.0).then(|| k / e)
            })
            .collect();
        r.sort_by(f64::total_cmp);
        r
    }

    fn json(&self, round_ratios: &[f64]) -> Value {
        let side = |v: &[(&'static str, Round)]| {
            v.iter()
                .map(|(label, r)| {
                    json!({"client": label, "per_sec": r.ops_per_sec, "p50_ms": r.p50_ms,
                           "p99_ms": r.p99_ms, "server_cpu_us_per_op": r.cpu_us_per_op,
                           "client_cpu_us_per_op": r.client_us_per_op,
                           "server_disk_bytes_per_op": r.disk_bytes_per_op})
                })
                .collect::<Vec<_>>()
        };
        let k = self.best_kshard().map(|(_, r)| r);
        let e = self.best_etcd().map(|(_, r)| r);
        json!({
            "verb": self.verb.name(), "etcd_op": self.verb.etcd_op(), "clients": self.clients,
            "kshard_per_sec": k.map(|r| r.ops_per_sec), "kshard_p50_ms": k.map(|r| r.p50_ms),
            "kshard_p99_ms": k.map(|r| r.p99_ms),
            "kshard_cpu_us_per_write": k.map(|r| r.cpu_us_per_op),
            "kshard_client_cpu_us_per_write": k.map(|r| r.client_us_per_op),
            "kshard_disk_bytes_per_write": k.map(|r| r.disk_bytes_per_op),
            "etcd_per_sec": e.map(|r| r.ops_per_sec), "etcd_p50_ms": e.map(|r| r.p50_ms),
            "etcd_p99_ms": e.map(|r| r.p99_ms),
            "etcd_cpu_us_per_put": e.map(|r| r.cpu_us_per_op),
            "etcd_client_cpu_us_per_put": e.map(|r| r.client_us_per_op),
            "etcd_disk_bytes_per_put": e.map(|r| r.disk_bytes_per_op),
            "ratio": self.ratio(),
            "round_ratios": round_ratios,
            "round_ratio_median": median_of(round_ratios),
            "kshard_clients": side(&self.kshard), "etcd_clients": side(&self.etcd),
        })
    }
}

/// `verb` at `clients` on kshard with each transport and on etcd with each
/// client, rounds interleaved and each round run in slices, every client
/// in turn (a slow spell of the shared machine costs every side alike);
/// each client's median round, and the round-by-round ratios of the best
/// of each side.
async fn compare_verb(ctx: &Ctx<'_>, verb: Verb, clients: usize) -> (Measured, Vec<f64>) {
    let transports: &[Transport] = if clients > 1 {
        &[Transport::H1PerWorker, Transport::H2Shared]
    } else {
        &[Transport::H1PerWorker]
    };
    let mut etcd_clients = Vec::new();
    if ctx.etcd.is_some() {
        if verb == Verb::Create {
            etcd_clients.push(EtcdClient::HandWritten);
        }
        if ctx.driver.is_some() {
            etcd_clients.extend([EtcdClient::CrateShared, EtcdClient::CratePerWorker]);
        }
    }
    // Each call writes names of its own: a concurrency measured twice in one
    // run (`KSHARD_ETCD_CLIENTS=64,64`) must not create names that exist.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let mut k_rounds: Vec<Vec<Round>> = transports.iter().map(|_| Vec::new()).collect();
    let mut e_rounds: Vec<Vec<Round>> = etcd_clients.iter().map(|_| Vec::new()).collect();
    let mut per_round = Vec::new();
    // Deletes run until their objects are gone: one slice.
    let slices = if verb == Verb::Delete { 1 } else { ctx.slices };
    let slice_secs = ctx.secs / slices as f64;
    for r in 0..ctx.rounds {
        let mut k_slices: Vec<Vec<Round>> = transports.iter().map(|_| Vec::new()).collect();
        let mut e_slices: Vec<Vec<Round>> = etcd_clients.iter().map(|_| Vec::new()).collect();
        for s in 0..slices {
            let at = if slices > 1 {
                format!("round {}/{}, slice {}/{slices}", r + 1, ctx.rounds, s + 1)
            } else {
                format!("round {}/{}", r + 1, ctx.rounds)
            };
            for (t, transport) in transports.iter().enumerate() {
                progress(&format!(
                    "{} c={clients} {at}: kshard over {}…",
                    verb.name(),
                    transport.name()
                ));
                let k = kshard_verb(
                    ctx.kubeconfig,
                    Some(ctx.pid),
                    WIDGETS,
                    verb,
                    *transport,
                    clients,
                    slice_secs,
                    ctx.deletes,
                    &format!("{}{call}-r{r}-s{s}-c{clients}-t{t}", verb.name()),
                )
                .await;
                k_slices[t].push(k);
            }
            let Some((etcd_pid, port)) = ctx.etcd else {
                continue;
            };
            for (c, client) in etcd_clients.iter().enumerate() {
                progress(&format!(
                    "{} c={clients} {at}: etcd {} over {}…",
                    verb.name(),
                    verb.etcd_op(),
                    client.name()
                ));
                let prefix = format!("/bench/{}{call}-r{r}-s{s}-c{clients}-e{c}", verb.name());
                let e = match (client, ctx.driver) {
                    (EtcdClient::HandWritten, _) => {
                        let disk = disk::disk_written();
                        let cpu = cpu_seconds(etcd_pid);
                        let own = cpu_seconds(std::process::id());
                        let mut e = etcd_puts(port, clients, slice_secs, &prefix).await;
                        e.cpu_us_per_op = cpu_us_per_op(etcd_pid, cpu, &e);
                        e.client_us_per_op = cpu_us_per_op(std::process::id(), own, &e);
                        e.disk_bytes_per_op = disk_bytes_per_op(disk, &e);
                        Some(e)
                    }
                    (_, Some(bin)) => {
                        driver_round(
                            bin,
                            port,
                            etcd_pid,
                            verb,
                            *client == EtcdClient::CrateShared,
                            clients,
                            if verb == Verb::Delete {
                                600.0
                            } else {
                                slice_secs
                            },
                            ctx.deletes,
                            &prefix,
                        )
                        .await
                    }
                    (_, None) => None,
                };
                if let Some(e) = e {
                    e_slices[c].push(e);
                }
            }
        }
        let (mut kr, mut er) = (Vec::new(), Vec::new());
        for (t, parts) in k_slices.into_iter().enumerate() {
            if let Some(k) = joined_slices(parts) {
                kr.push(k.ops_per_sec);
                k_rounds[t].push(k);
            }
        }
        for (c, parts) in e_slices.into_iter().enumerate() {
            if let Some(e) = joined_slices(parts) {
                er.push(e.ops_per_sec);
                e_rounds[c].push(e);
            }
        }
        let best = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
        progress(&format!(
            "{} c={clients} round {}/{}: kshard {:.0}/s, etcd {:.0}/s ({:.2}×)",
            verb.name(),
            r + 1,
            ctx.rounds,
            best(&kr),
            best(&er),
            best(&kr) / best(&er)
        ));
        per_round.push((kr, er));
    }
    let best_first = |labels: Vec<&'static str>, rounds: Vec<Vec<Round>>| {
        let mut v: Vec<(&'static str, Round)> = labels
            .into_iter()
            .zip(rounds)
            .filter(|(_, r)| !r.is_empty())
            .map(|(l, r)| (l, median_round(r)))
            .collect();
        v.sort_by(|a, b| b.1.ops_per_sec.total_cmp(&a.1.ops_per_sec));
        v
    };
    let m = Measured {
        verb,
        clients,
        kshard: best_first(transports.iter().map(|t| t.name()).collect(), k_rounds),
        etcd: best_first(etcd_clients.iter().map(|c| c.name()).collect(), e_rounds),
    };
    let ratios = m.round_ratios(&per_round);
    (m, ratios)
}

fn print_measured((m, round_ratios): &(Measured, Vec<f64>)) {
    let line = |side: &str, (label, r): &(&'static str, Round)| {
        println!(
            "    {side:<6} {:>8.0}/s (p50 {:.2} ms, p99 {:.2} ms, server {:.0} µs CPU/op, client {:.0}, disk {:.1} KB/op) — {label}",
            r.ops_per_sec, r.p50_ms, r.p99_ms, r.cpu_us_per_op, r.client_us_per_op,
            r.disk_bytes_per_op / 1e3
        )
    };
    let two = |r: Option<f64>| r.map_or("—".to_string(), |r| format!("{r:.2}"));
    println!(
        "{} c={}: ratio {} (of the medians of each side; the rounds' median {}; rounds {})",
        m.verb.name(),
        m.clients,
        two(m.ratio()),
        two(median_of(round_ratios)),
        round_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for k in &m.kshard {
        line("kshard", k);
    }
    for e in &m.etcd {
        line("etcd", e);
    }
}

fn main() {
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
        env_usize("KSHARD_ETCD_SECS", 10) as f64
    };
    // `KSHARD_ETCD_OBJECTS`: the sizes memory is measured at (comma-separated).
    let sizes: Vec<usize> = if smoke() {
        vec![300, 600]
    } else {
        env_usizes("KSHARD_ETCD_OBJECTS", &[40_000, 200_000])
    };
    let watchers = if smoke() {
        20
    } else {
        env_usize("KSHARD_ETCD_WATCHERS", 1000)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let etcd = etcd_binary().map(|bin| start_etcd(&bin, dir.path()));
    let data = dir.path().join("kshard");
    // `KSHARD_ETCD_ARGS`: extra flags for kshard (space-separated).
    let extra = std::env::var("KSHARD_ETCD_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let kshard = common::spawn_kshard_with(&data, &extra, &AS_DEPLOYED);
    let pid = kshard.id();
    let kubeconfig = data.join("kubeconfig");
    if let Some((_, port)) = &etcd {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Etcd::connect(*port).await.is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let rounds = env_usize("KSHARD_ETCD_ROUNDS", if smoke() { 1 } else { 3 }).max(1);
    // Slices of at least a second each: 2 s at the default 10 s.
    let slices = env_usize("KSHARD_ETCD_SLICES", 5).clamp(1, (secs as usize).max(1));
    let driver = if etcd.is_some() && (wanted("creates") || wanted("verbs")) {
        etcd_driver()
    } else {
        None
    };
    let mut results = Vec::new();
    let concurrencies: Vec<usize> = if wanted("creates") {
        env_usizes("KSHARD_ETCD_CLIENTS", &[1, 16, 64])
    } else {
        Vec::new()
    };
    for clients in concurrencies.iter().copied() {
        let m = compare_verb(
            &Ctx {
                kubeconfig: &kubeconfig,
                pid,
                etcd: etcd.as_ref().map(|(c, p)| (c.id(), *p)),
                driver: driver.as_deref(),
                secs,
                rounds,
                slices,
                deletes: 0,
            },
            Verb::Create,
            clients,
        )
        .await;
        print_measured(&m);
        results.push(m);
    }

    // Updates, patches and deletes against kube's transactions on etcd.
    let mut verbs = Vec::new();
    if wanted("verbs") {
        let deletes = env_usize("KSHARD_ETCD_DELETES", if smoke() { 200 } else { 20_000 });
        for clients in env_usizes("KSHARD_ETCD_VERB_CLIENTS", &[16]) {
            for verb in [Verb::Update, Verb::Patch, Verb::Delete] {
                let ctx = Ctx {
                    kubeconfig: &kubeconfig,
                    pid,
                    etcd: etcd.as_ref().map(|(c, p)| (c.id(), *p)),
                    driver: driver.as_deref(),
                    secs,
                    rounds,
                    slices,
                    deletes,
                };
                let m = compare_verb(&ctx, verb, clients).await;
                print_measured(&m);
                verbs.push(m);
            }
        }
    }

    // Memory first, on servers of its own, while the machine is otherwise idle.
    let memory = if wanted("memory") {
        memory_points(&sizes, &extra).await
    } else {
        Vec::new()
    };
    let growth = memory_growth(&memory);
    if let Some((per_byte, fixed)) = growth {
        println!(
            "memory grows {per_byte:.2} bytes per byte of JSON stored; {:.1} MB more is fixed once the server has served writes",
            fixed / 1e6
        );
    }

    let fan = if wanted("fanout") {
        fan_out(&kubeconfig, pid, watchers, if smoke() { 20 } else { 500 }).await
    } else {
        FanOut {
            watchers: 0,
            events: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            cpu_us_per_delivery: 0.0,
            client_cpu_us_per_delivery: 0.0,
        }
    };
    println!(
        "fan-out: {} watchers, {} events, last receipt p50 {:.1} ms p99 {:.1} ms, {:.2} µs server CPU per delivery (client {:.2})",
        fan.watchers, fan.events, fan.p50_ms, fan.p99_ms, fan.cpu_us_per_delivery, fan.client_cpu_us_per_delivery
    );

    let watched = if wanted("watched") {
        let watchers = if smoke() { 10 } else { 100 };
        let (alone, watched, bytes_per_create) =
            watched_creates(&kubeconfig, pid, watchers, secs, rounds, slices).await;
        println!(
            "watched creates at c=16: {:.0}/s alone, {:.0}/s with {watchers} watchers ({:.2}×); server CPU per create {:.0} / {:.0} µs, client {:.0} / {:.0} µs",
            alone.ops_per_sec,
            watched.ops_per_sec,
            watched.ops_per_sec / alone.ops_per_sec.max(1e-9),
            alone.cpu_us_per_op,
            watched.cpu_us_per_op,
            alone.client_us_per_op,
            watched.client_us_per_op,
        );
        progress("the bytes' floor: TLS over loopback, both ends in this process…");
        let floor = tls_floor(&data, if smoke() { 1.0 } else { 5.0 }).await;
        let bound = WatchedBound::new(&alone, &watched, bytes_per_create, floor);
        println!(
            "watched creates: {:.0} KiB of events per create cost {:.0} µs of CPU (server + client; the server's {:.0}) over a create alone; moving those bytes costs {:.0} µs at least here ({:.3} µs/KiB: TLS and loopback, {:.3} the writing end, {:.3} the reading end), so with every core busy at most {:.0} creates/s ({:.2}× alone)",
            bound.kib_per_create,
            bound.delivery_us_per_create,
            bound.server_delivery_us_per_create,
            bound.floor_us_per_create(),
            bound.floor_us_per_kib,
            bound.floor.writer_us_per_kib,
            bound.floor.reader_us_per_kib,
            bound.ceiling_per_sec,
            bound.ceiling_per_sec / alone.ops_per_sec.max(1e-9),
        );
        Some((alone, watched, bound))
    } else {
        None
    };
    let list_n = if smoke() { 200 } else { 10_000 };
    let lists = if wanted("lists") {
        let (list_ms, serde_ms, server_ms, pages) =
            list_against_serde(&kubeconfig, pid, list_n).await;
        println!(
            "list of {list_n} from the cache: {list_ms:.1} ms over HTTPS ({server_ms:.1} ms of server CPU); serde_json serializes them in {serde_ms:.1} ms ({:.2}×)",
            list_ms / serde_ms.max(1e-9)
        );
        println!(
            "pages of 500 ({} pages): first {:.2} ms, middle {:.2} ms, last full {:.2} ms",
            pages.pages, pages.first_ms, pages.middle_ms, pages.last_ms
        );
        Some((list_ms, serde_ms, server_ms, pages))
    } else {
        None
    };

    let ratios: Vec<(String, f64)> = results
        .iter()
        .chain(&verbs)
        .filter_map(|(m, _)| Some((format!("{} c={}", m.verb.name(), m.clients), m.ratio()?)))
        .collect();
    let out = json!({
        "machine": {"cores": std::thread::available_parallelism().map_or(0, |n| n.get())},
        "seconds_per_round": secs,
        "rounds": rounds,
        "slices_per_round": slices,
        "creates": results.iter().map(|(m, r)| m.json(r)).collect::<Vec<_>>(),
        "verbs": verbs.iter().map(|(m, r)| m.json(r)).collect::<Vec<_>>(),
        "memory_growth": growth.map(|(per_byte, fixed)| json!({
            "bytes_per_json_byte": per_byte, "fixed_bytes_beyond_idle_base": fixed})),
        "memory": memory.iter().map(|m| json!({"objects": m.objects, "json_bytes": m.json_bytes,
                   "rss_bytes": m.rss, "rss_bytes_with_history": m.rss_with_history,
                   "base_rss_bytes": m.base_rss, "ratio_above_base": m.ratio(),
                   "ratio_with_history": m.ratio_with_history(),
                   "bytes_per_object": m.bytes_per_object()})).collect::<Vec<_>>(),
        "watched_creates": watched.as_ref().map(|(a, w, b)| json!({
            "clients": 16, "watchers": if smoke() { 10 } else { 100 },
            "alone_per_sec": a.ops_per_sec, "watched_per_sec": w.ops_per_sec,
            "ratio": w.ops_per_sec / a.ops_per_sec.max(1e-9),
            "alone_cpu_us_per_create": a.cpu_us_per_op, "watched_cpu_us_per_create": w.cpu_us_per_op,
            "alone_client_cpu_us_per_create": a.client_us_per_op,
            "watched_client_cpu_us_per_create": w.client_us_per_op,
            "event_kib_per_create": b.kib_per_create,
            "delivery_cpu_us_per_create": b.delivery_us_per_create,
            "server_delivery_cpu_us_per_create": b.server_delivery_us_per_create,
            "tls_floor_us_per_kib": b.floor_us_per_kib,
            "tls_floor_writer_us_per_kib": b.floor.writer_us_per_kib,
            "tls_floor_reader_us_per_kib": b.floor.reader_us_per_kib,
            "tls_floor_us_per_create": b.floor_us_per_create(),
            "ceiling_per_sec": b.ceiling_per_sec,
            "ceiling_ratio": b.ceiling_per_sec / a.ops_per_sec.max(1e-9)})),
        "list": lists.map(|(l, s, cpu, p)| json!({"objects": list_n, "list_ms": l, "serde_ms": s, "ratio": l / s.max(1e-9),
            "server_cpu_ms_per_list": cpu,
            "pages_of_500": {"pages": p.pages, "first_ms": p.first_ms, "middle_ms": p.middle_ms, "last_full_ms": p.last_ms}})),
        "fan_out": {"watchers": fan.watchers, "events": fan.events, "p50_ms": fan.p50_ms,
                    "p99_ms": fan.p99_ms, "cpu_us_per_delivery": fan.cpu_us_per_delivery,
                    "client_cpu_us_per_delivery": fan.client_cpu_us_per_delivery},
    });
    let target = common::repo_path("target/bench");
    std::fs::create_dir_all(&target).expect("target/bench");
    // A smoke run or a run of some parts leaves a full run's results alone.
    let name = match std::env::var("KSHARD_ETCD_ONLY") {
        _ if smoke() => "etcd-smoke".to_string(),
        Ok(only) => format!("etcd-{}", only.replace(',', "-")),
        Err(_) => "etcd".to_string(),
    };
    std::fs::write(
        target.join(format!("{name}.json")),
        serde_json::to_vec_pretty(&out).expect("json"),
    )
    .expect("write json");
    std::fs::write(
        target.join(format!("{name}.svg")),
        plot(
            &ratios,
            &memory,
            growth,
            &fan,
            watched.as_ref().map(|(a, w, b)| {
                let alone = a.ops_per_sec.max(1e-9);
                (w.ops_per_sec / alone, b.ceiling_per_sec / alone)
            }),
            &results
                .iter()
                .filter_map(|(m, _)| {
                    let k = m.best_kshard()?.1.disk_bytes_per_op;
                    let e = m.best_etcd()?.1.disk_bytes_per_op;
                    Some((m.clients, k, e))
                })
                .collect::<Vec<_>>(),
        ),
    )
    .expect("write svg");
    progress(&format!(
        "wrote {}",
        target.join(format!("{name}.{{json,svg}}")).display()
    ));
    // `KSHARD_ETCD_HOLD`: seconds to keep kshard running at the end (to inspect it).
    let hold = env_usize("KSHARD_ETCD_HOLD", 0);
    if hold > 0 {
        progress(&format!("holding kshard (pid {pid}) for {hold} s…"));
        tokio::time::sleep(Duration::from_secs(hold as u64)).await;
    }
    drop(kshard);
    drop(etcd);
}
