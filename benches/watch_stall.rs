//! Memory of a server whose watchers stop reading while one 1 MB object is
//! updated again and again: 1, 100 and 2,000 stalled HTTP/1.1 watches (each
//! sends its request over TLS, then never reads). Each case runs the real
//! `kshard serve` binary afresh with default flags and reports its RSS
//! before the updates and its peak during them. Not timed.
//!
//! `cargo bench --bench watch_stall` (env: KSHARD_BENCH_UPDATES, default 300;
//! KSHARD_BENCH_STALLED, a comma-separated list of watcher counts).
//!
//! Bound: RSS grows by at most `BOUND` in every case. Each stalled watch holds
//! at most its feed's budget (32 MiB, of events shared with the others) for
//! the 5 s grace, then only what its socket's buffers took (shared frames in
//! hyper's write queue, ~64 KiB of TLS records); the history holds at most
//! 64 MiB of events plus their frames. Measured (dev build, 300 updates):
//! +416 MB with 1 stalled watcher, +429 MB with 100, +636 MB with 2,000
//! (per connection: TLS and hyper buffers); flat once the watchers are ended.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

const WIDGETS: &str = "/apis/demo.kshard.dev/v1/namespaces/default/widgets";
const OBJECT_BYTES: usize = 1_000_000;
/// Largest RSS growth accepted in any case.
const BOUND: u64 = 700 * 1024 * 1024;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

struct Server {
    child: std::process::Child,
    data: PathBuf,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn() -> Server {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let bin = std::env::var("KSHARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kshard").into());
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/examples");
    let mut child = std::process::Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(crds)
        .arg("--data-dir")
        .arg(&data)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kshard");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a line").expect("utf8");
    let addr = first
        .strip_prefix("kshard is serving on https://")
        .and_then(|a| {
            use std::net::ToSocketAddrs;
            a.split_whitespace().next()?.to_socket_addrs().ok()?.next()
        })
        .unwrap_or_else(|| panic!("{first}"));
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        data,
        addr,
        _dir: dir,
    }
}

fn connector(pki: &Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    let ca = std::fs::read(pki.join("ca.crt")).expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.expect("pem")).expect("ca cert");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

async fn connect(
    s: &Server,
    tls: &tokio_rustls::TlsConnector,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    tls.connect(name, tcp).await.expect("handshake")
}

/// One request on its own connection (anonymous: standalone on loopback it
/// may do anything); the status code.
async fn request(
    s: &Server,
    tls: &tokio_rustls::TlsConnector,
    line: &str,
    content_type: &str,
    body: &[u8],
) -> u16 {
    use tokio::io::AsyncReadExt;
    let mut c = connect(s, tls).await;
    let head = format!(
        "{line} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).await.expect("write");
    c.write_all(body).await.expect("write");
    c.flush().await.expect("flush");
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got).await;
    std::str::from_utf8(&got[..got.len().min(12)])
        .ok()
        .and_then(|l| l.get(9..12))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

async fn case(stalled: usize, updates: usize) -> (u64, u64) {
    let s = spawn();
    let pid = s.child.id();
    let tls = connector(&s.data.join("pki"));
    let widget = serde_json::json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": "big"}, "spec": {"replicas": 0},
    });
    let created = request(
        &s,
        &tls,
        &format!("POST {WIDGETS}"),
        "application/json",
        &serde_json::to_vec(&widget).expect("json"),
    )
    .await;
    assert_eq!(created, 201);
    let mut held = Vec::with_capacity(stalled);
    for _ in 0..stalled {
        let mut c = connect(&s, &tls).await;
        let head = format!(
            "GET {WIDGETS}?watch=true&resourceVersion=0 HTTP/1.1\r\nHost: localhost\r\n\r\n"
        );
        c.write_all(head.as_bytes()).await.expect("write");
        c.flush().await.expect("flush");
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss(pid);
    let mut peak = baseline;
    for i in 1..=updates {
        let fill = char::from(b'a' + (i % 26) as u8)
            .to_string()
            .repeat(OBJECT_BYTES);
        let body = serde_json::to_vec(&serde_json::json!({"spec": {"replicas": i, "color": fill}}))
            .expect("json");
        let code = request(
            &s,
            &tls,
            &format!("PATCH {WIDGETS}/big"),
            "application/merge-patch+json",
            &body,
        )
        .await;
        assert_eq!(code, 200, "update {i}");
        if i % 10 == 0 {
            peak = peak.max(rss(pid));
        }
    }
    // Past the grace every stalled watcher has been ended.
    tokio::time::sleep(Duration::from_secs(7)).await;
    peak = peak.max(rss(pid));
    let after = rss(pid);
    drop(held);
    eprintln!("  (after the grace: RSS {} MB)", after / 1_000_000);
    (baseline, peak)
}

fn main() {
    let updates: usize = std::env::var("KSHARD_BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let counts: Vec<usize> = std::env::var("KSHARD_BENCH_STALLED")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 2000]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    println!(
        "{updates} updates of a 1 MB object; RSS of the server (bound on growth: {} MB)",
        BOUND / 1_000_000
    );
    println!(
        "{:>8} {:>12} {:>10} {:>10}",
        "stalled", "before (MB)", "peak (MB)", "grew (MB)"
    );
    let mut over = Vec::new();
    for n in counts {
        let (before, peak) = rt.block_on(case(n, updates));
        let grew = peak.saturating_sub(before);
        println!(
            "{n:>8} {:>12} {:>10} {:>10}",
            before / 1_000_000,
            peak / 1_000_000,
            grew / 1_000_000
        );
        if grew > BOUND {
            over.push(n);
        }
    }
    assert!(
        over.is_empty(),
        "RSS grew past the bound with {over:?} stalled watchers"
    );
}
