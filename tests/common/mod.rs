//! Test harness: a real kshard (in-process on an ephemeral port, real TLS,
//! real store on disk), a kube-rs client from the kubeconfig it writes, the
//! real kubectl, and a raw HTTP helper that keeps status codes.

#![allow(dead_code)]

pub mod apf;
pub mod host_double;
pub mod real_host;
pub mod replicas;
pub mod tls;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

pub struct TestServer {
    pub running: kshard::server::Running,
    pub dir: tempfile::TempDir,
    pub client: kube::Client,
}

pub fn repo_path(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// A server without the flow-control controller (whose own writes would move
/// revisions under tests that count them); see [`start_with_flowcontrol`].
pub async fn start() -> TestServer {
    start_with(|_| {}).await
}

/// A server whose flow control is configured by FlowSchema/PriorityLevelConfiguration objects.
pub async fn start_with_flowcontrol() -> TestServer {
    start_with(|c| c.flowcontrol_controller = true).await
}

pub async fn start_with(tune: impl FnOnce(&mut kshard::server::ServeConfig)) -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = kshard::server::ServeConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        crds: vec![repo_path("crds/examples"), repo_path("tests/fixtures/crds")],
        flowcontrol_controller: false,
        ..Default::default()
    };
    tune(&mut cfg);
    let running = kshard::server::start(cfg).await.expect("server starts");
    let client = client_for(&running.kubeconfig).await;
    TestServer {
        running,
        dir,
        client,
    }
}

pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    // Tests look at every response as sent (504s, 429s), not at kube-rs's retries.
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl TestServer {
    /// Any request through the real TLS client; the status code is kept.
    pub async fn raw(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Reply {
        let mut b = http::Request::builder().method(method).uri(uri);
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("user-agent"))
        {
            b = b.header("user-agent", "kshard-tests/0.1");
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(kube::client::Body::from(body)).expect("request");
        let resp = self.client.send(req).await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect_bytes()
            .await
            .expect("body")
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, uri: &str) -> Reply {
        self.raw("GET", uri, &[], vec![]).await
    }

    pub async fn post_json(&self, uri: &str, v: &Value) -> Reply {
        self.raw(
            "POST",
            uri,
            &[("content-type", "application/json")],
            serde_json::to_vec(v).expect("json"),
        )
        .await
    }

    pub async fn put_json(&self, uri: &str, v: &Value) -> Reply {
        self.raw(
            "PUT",
            uri,
            &[("content-type", "application/json")],
            serde_json::to_vec(v).expect("json"),
        )
        .await
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.running.kubeconfig, args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        kubectl_with(&self.running.kubeconfig, args, Some(stdin))
    }

    /// Runs kubectl and returns stdout, failing the test with stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        kubectl_ok_with(&self.running.kubeconfig, args)
    }
}

/// kubectl's stdout; panics with its stderr when it fails.
pub fn kubectl_ok_with(kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl_with(kubeconfig, args, None);
    assert!(
        out.status.success(),
        "kubectl {args:?} ({}) failed: {}",
        kubeconfig.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = std::process::Command::new("kubectl");
    // A hung request fails the test instead of the whole CI run.
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=60s")
        .args(args);
    // No cache dir shared between tests: discovery must come from this server.
    cmd.env("KUBECACHEDIR", kubeconfig.with_file_name("kubecache"));
    run_blocking(cmd, stdin)
}

/// Runs a child process to completion without stalling the test's runtime.
/// The server under test shares that runtime: blocking a worker outright can
/// strand a task it just woke (tokio's LIFO slot is not stealable) and the
/// child then waits forever for a reply. `block_in_place` hands the worker's
/// queue to another thread first.
pub fn run_blocking(cmd: std::process::Command, stdin: Option<&str>) -> Output {
    let run = move || spawn_and_wait(cmd, stdin);
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
}

fn spawn_and_wait(mut cmd: std::process::Command, stdin: Option<&str>) -> Output {
    use std::io::Write;
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("kubectl on PATH");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    child.wait_with_output().expect("kubectl output")
}

/// A blue `Widget` (the `demo.kshard.dev` example every test server serves).
pub fn widget(name: &str, replicas: i64) -> Value {
    serde_json::json!({
        "apiVersion": "demo.kshard.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "color": "blue"},
    })
}

/// A namespaced CustomResourceDefinition `<plural>.<group>` of kind
/// `kind`, with one version `v1` (served, stored) whose `spec` object has
/// `spec_properties`; tests change what they need in it.
pub fn crd(group: &str, plural: &str, kind: &str, spec_properties: Value) -> Value {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "kind": kind},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": spec_properties}}}}
            }]
        }
    })
}

pub const WIDGETS: &str = "/apis/demo.kshard.dev/v1/namespaces/default/widgets";

/// Polls `f` until it returns `Some`, for at most `limit` (the machine
/// may be loaded: callers give generous limits, and the loop stops as soon
/// as the condition holds).
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `f` until it returns true, for at most 10 s (for effects of
/// background work like GC).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until(what, Duration::from_secs(10), || {
        let done = f();
        async move { done.await.then_some(()) }
    })
    .await
}

/// A long-running kubectl (`get -w`) whose output is read line by line as it
/// comes, so a test can wait for "the watch is open" instead of sleeping.
/// The process is killed when this is dropped.
pub struct KubectlStream {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl KubectlStream {
    pub fn spawn(kubeconfig: &Path, args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .env("KUBECACHEDIR", kubeconfig.with_file_name("kubecache"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl on PATH");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        KubectlStream { child, lines }
    }

    /// Whether kubectl's output ends (the process closed it) within `limit`;
    /// lines meanwhile are returned too.
    pub fn ends_within(&self, limit: Duration) -> (bool, Vec<String>) {
        let deadline = std::time::Instant::now() + limit;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => seen.push(line),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return (true, seen),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return (false, seen),
            }
        }
    }

    /// The next line, split into columns; panics after 30 s without one.
    pub fn next_row(&self) -> Vec<String> {
        let wait = || self.lines.recv_timeout(Duration::from_secs(30));
        let line = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
        .expect("a line from kubectl within 30 s");
        line.split_whitespace().map(str::to_string).collect()
    }

    /// Reads lines until one has exactly these columns.
    pub fn wait_for_row(&self, row: &[&str]) {
        while self.next_row() != row {}
    }
}

impl Drop for KubectlStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the real `kshard serve` binary on an ephemeral port with the example
/// CRDs and `extra` flags; returns the process once it serves (its kubeconfig
/// is `<data_dir>/kubeconfig`).
pub fn spawn_kshard(data_dir: &Path, extra: &[&str]) -> KillOnDrop {
    spawn_kshard_with(data_dir, extra, &[])
}

/// A child process that is killed when the test ends, passed or not.
pub struct KillOnDrop(pub std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`spawn_kshard`] with environment variables for the process.
pub fn spawn_kshard_with(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> KillOnDrop {
    use std::io::{BufRead, BufReader};
    // `KSHARD_BIN` runs another build (a profiling build, an older commit).
    let bin = kshard_bin();
    let mut child = std::process::Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kshard");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().expect("a line").expect("utf8");
    assert!(
        first.starts_with("kshard is serving on https://"),
        "{first}"
    );
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    KillOnDrop(child)
}

/// Resident memory of a process, from /proc (Linux).
pub fn rss_bytes(pid: u32) -> u64 {
    proc_status_bytes(pid, "VmRSS:")
}

/// A `kB` figure of /proc/<pid>/status (`VmRSS:`, `VmSize:`), in bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    try_proc_status_bytes(pid, field).unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// [`proc_status_bytes`], `None` once the process is gone (or without the field).
pub fn try_proc_status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The kshard binary to run: `KSHARD_BIN` (a profiling build, an older
/// commit) or this build's.
pub fn kshard_bin() -> String {
    std::env::var("KSHARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kshard").into())
}

/// The `i`th rewrite of the widget `big` by merge patch: `spec.color` a
/// different `bytes`-long value each time (every event holds its own copy),
/// `spec.replicas` `i`. A refusal panics, saying whether the server lives.
pub async fn rewrite_big_widget(
    client: &kube::Client,
    server: &mut KillOnDrop,
    i: usize,
    bytes: usize,
) {
    let fill = char::from(b'a' + (i % 26) as u8).to_string().repeat(bytes);
    let body = serde_json::json!({"spec": {"replicas": i, "color": fill}});
    let req = http::Request::patch(format!("{WIDGETS}/big"))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client.request_text(req).await.unwrap_or_else(|e| {
        panic!(
            "update {i} refused ({e}); server alive: {:?}",
            server.try_wait()
        )
    });
}

/// A watcher of widgets that reads everything (HTTP/1.1 over TLS, hyper),
/// as an informer does, counting the frames (newline-ended) it gets into
/// `frames`; it ends after `timeout_secs`.
pub async fn line_counting_watch(
    data: &Path,
    frames: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    timeout_secs: u64,
) {
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;
    let tls = connect_to(data, &[b"http/1.1"]).await;
    let (mut send, conn) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(TokioIo::new(tls))
    .await
    .expect("handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!(
        "{WIDGETS}?watch=true&resourceVersion=0&timeoutSeconds={timeout_secs}"
    ))
    .header("host", "localhost")
    .body(http_body_util::Empty::new())
    .expect("req");
    let resp = send.send_request(req).await.expect("watch");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                let n = data.iter().filter(|b| **b == b'\n').count();
                frames.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
}

/// Caps a running process's address space at its current size plus
/// `headroom` (util-linux `prlimit`): an allocation beyond it fails, and a
/// Rust process aborts, so a test that the server survives means its memory
/// stayed within the headroom.
pub fn limit_memory(pid: u32, headroom: u64) {
    let cap = proc_status_bytes(pid, "VmSize:") + headroom;
    let out = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--as={cap}"))
        .output()
        .expect("prlimit (util-linux) on PATH");
    assert!(
        out.status.success(),
        "prlimit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A TLS client that trusts the server's generated CA (no client
/// certificate), offering `alpn` (e.g. `h2`).
pub fn tls_connector(s: &TestServer, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    tls_connector_with(
        s,
        rustls::crypto::ring::default_provider(),
        rustls::DEFAULT_VERSIONS,
        alpn,
    )
}

/// [`tls_connector`] with the client's own cipher suites and TLS versions.
pub fn tls_connector_with(
    s: &TestServer,
    provider: rustls::crypto::CryptoProvider,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> tokio_rustls::TlsConnector {
    connector_trusting(
        &s.running.kubeconfig.with_file_name("pki"),
        provider,
        versions,
        alpn,
    )
}

/// A TLS client (no client certificate) trusting the CA in `pki` (a data
/// directory's `pki/`), offering `alpn`.
pub fn connector_trusting(
    pki: &Path,
    provider: rustls::crypto::CryptoProvider,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> tokio_rustls::TlsConnector {
    let ca = std::fs::read(pki.join("ca.crt")).expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile_certs(&ca) {
        roots.add(cert).expect("ca cert");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(|c| c.expect("pem"))
        .collect()
}

/// The address a spawned server serves on, from the kubeconfig in its data directory.
pub fn served_addr(data_dir: &Path) -> std::net::SocketAddr {
    let kc = std::fs::read_to_string(data_dir.join("kubeconfig")).expect("kubeconfig");
    kc.lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .and_then(|a| {
            use std::net::ToSocketAddrs;
            a.trim().to_socket_addrs().ok()?.next()
        })
        .unwrap_or_else(|| panic!("no server address in {kc}"))
}

/// An anonymous TLS connection to a spawned server (standalone on loopback,
/// anonymous may do anything), offering `alpn`.
pub async fn connect_to(
    data_dir: &Path,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(served_addr(data_dir))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    connector_trusting(
        &data_dir.join("pki"),
        rustls::crypto::ring::default_provider(),
        rustls::DEFAULT_VERSIONS,
        alpn,
    )
    .connect(name, tcp)
    .await
    .expect("handshake")
}

/// A raw request through a kube client, any status kept: (status,
/// headers, body).
pub async fn send(
    c: &kube::Client,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, http::HeaderMap, String) {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let body = body
        .map(|v| serde_json::to_vec(v).expect("json"))
        .unwrap_or_default();
    let resp = c
        .send(b.body(kube::client::Body::from(body)).expect("req"))
        .await
        .expect("send");
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect_bytes().await.expect("body");
    (code, headers, String::from_utf8_lossy(&body).into_owned())
}
