//! Clients that hold connections without finishing anything: they cost the
//! server a socket for a bounded time, and everyone else is served meanwhile.

mod common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Waits until the peer closes `stream` (read returns 0 or an error).
async fn closed_by_server(stream: &mut (impl AsyncReadExt + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_and_stuck_handshakes_are_cut_off_while_others_are_served() {
    let s = common::start_with(|c| {
        c.connections.tls_handshake_timeout = Duration::from_secs(1);
        c.connections.request_header_timeout = Duration::from_secs(1);
        c.connections.max_connections = 40;
    })
    .await;
    let addr = s.running.addr;
    // Twice the connection cap: plain TCP that never says hello, and TLS
    // that starts a handshake and stops.
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let mut stuck = Vec::new();
    for _ in 0..40 {
        let mut t = TcpStream::connect(addr).await.expect("connect");
        // The first bytes of a ClientHello record header, then nothing.
        t.write_all(&[0x16, 0x03, 0x01]).await.expect("write");
        stuck.push(t);
    }
    // Others are served meanwhile: probes and reads answer once the slots of
    // the hostile connections are reclaimed, within a few handshake timeouts.
    common::eventually("a GET is served while 80 connections hang", || async {
        s.get(common::WIDGETS).await.status == 200
    })
    .await;
    assert_eq!(s.get("/readyz").await.status, 200);
    // And each hostile connection was closed by the server.
    for mut c in idle.into_iter().chain(stuck) {
        assert!(
            closed_by_server(&mut c, Duration::from_secs(30)).await,
            "a connection stayed open"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_trickled_one_byte_at_a_time_are_cut_off() {
    let s =
        common::start_with(|c| c.connections.request_header_timeout = Duration::from_secs(1)).await;
    let connector = common::tls_connector(&s, &[]);
    let tcp = TcpStream::connect(s.running.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    let request = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let started = Instant::now();
    let mut cut_off = false;
    for b in request.iter() {
        if tls.write_all(&[*b]).await.and(tls.flush().await).is_err() {
            cut_off = true;
            break;
        }
        // One byte every 200 ms: the whole header would take about 20 s.
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(200), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut_off = true;
                break;
            }
            Ok(Ok(n)) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                // hyper answers 408 before closing; either way it is over.
                assert!(text.starts_with("HTTP/1.1 408"), "{text}");
                cut_off = true;
                break;
            }
            Err(_) => {}
        }
    }
    assert!(cut_off, "the server waited for the whole trickled header");
    eprintln!("trickling client cut off after {:?}", started.elapsed());
    // The server still answers others.
    assert_eq!(s.get("/readyz").await.status, 200);
}

/// CPU time (clock ticks) a process has used.
fn cpu(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// Out of descriptors: with twice its descriptor limit in idle connections,
/// the server backs off instead of spinning on accept errors, and answers
/// once the handshake timeout frees descriptors.
#[tokio::test(flavor = "multi_thread")]
async fn accept_errors_back_off_instead_of_spinning() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = common::spawn_kshard(&data, &["--tls-handshake-timeout", "2s"]);
    let pid = child.id();
    let client = common::client_for(&data.join("kubeconfig")).await;
    // Warm up (threads, files) before the limit goes on.
    client
        .request_text(http::Request::get("/readyz").body(Vec::new()).expect("req"))
        .await
        .expect("ready");
    // And let start-up work (the flow-control controller's first
    // reconciliation) finish: wait for a quiet half second.
    let mut settled = false;
    for _ in 0..60 {
        let before = cpu(pid);
        tokio::time::sleep(Duration::from_millis(500)).await;
        if cpu(pid) - before < 5 {
            settled = true;
            break;
        }
    }
    assert!(settled, "the server never went quiet");
    let out = std::process::Command::new("prlimit")
        .args([format!("--pid={pid}"), "--nofile=96:96".to_string()])
        .output()
        .expect("prlimit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kubeconfig = std::fs::read_to_string(data.join("kubeconfig")).expect("kubeconfig");
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("server")
        .to_string();
    let mut idle = Vec::new();
    for _ in 0..192 {
        if let Ok(c) = TcpStream::connect(&server).await {
            idle.push(c);
        }
    }
    // CPU over one second with the listener out of descriptors.
    let cpu = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("stat")
            .1
            .split_whitespace()
            .collect();
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
    };
    let before = cpu(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ticks = cpu(pid) - before;
    eprintln!("CPU while out of descriptors: {ticks} ticks in 1 s");
    // A spinning accept loop burns a whole core (~100 ticks); backing off, a few.
    assert!(ticks < 50, "accept loop spins: {ticks} ticks in 1 s");
    drop(idle);
    common::eventually("the server answers again", || async {
        client
            .request_text(http::Request::get("/readyz").body(Vec::new()).expect("req"))
            .await
            .is_ok()
    })
    .await;
    assert!(child.try_wait().expect("wait").is_none(), "the server died");
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends raw HTTP/1.1 bytes over TLS and returns the first line of the answer.
async fn raw_status_line(s: &common::TestServer, request: &[u8]) -> String {
    let connector = common::tls_connector(s, &[b"http/1.1"]);
    let tcp = TcpStream::connect(s.running.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    // The server may answer (and close) before it has read everything.
    let _ = tls.write_all(request).await;
    let _ = tls.flush().await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer).to_string();
    text.lines().next().unwrap_or_default().to_string()
}

/// A request line longer than the URI limit (64 KiB, hyper's) and headers
/// beyond `--max-request-header-bytes` are refused before anything parses
/// them: label and field selectors and continue tokens live in the URI, so
/// this bounds them too.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_request_lines_and_headers_are_refused() {
    let s = common::start_with(|c| {
        c.connections.max_request_header_bytes = 256 * 1024;
    })
    .await;
    let selector = "app=x,".repeat(40_000);
    let long_uri = format!(
        "GET {}?labelSelector={selector} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        common::WIDGETS
    );
    let line = raw_status_line(&s, long_uri.as_bytes()).await;
    assert!(line.starts_with("HTTP/1.1 414"), "{line}");

    let big_header = format!(
        "GET /readyz HTTP/1.1\r\nHost: localhost\r\nX-Padding: {}\r\n\r\n",
        "a".repeat(300 * 1024)
    );
    let line = raw_status_line(&s, big_header.as_bytes()).await;
    assert!(line.starts_with("HTTP/1.1 431"), "{line}");

    // Within the limits the same connection type is served.
    let ok = raw_status_line(&s, b"GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 "), "{ok}");
    assert_eq!(s.get(common::WIDGETS).await.status, 200);
}

/// HTTP/2 writes are gathered until the connection's task has nothing more
/// to send: a small answer alone on a connection, the last frame of a burst
/// and a lone event on an idle connection must still leave at once, not
/// wait for the next activity (the keep-alive ping is 30 s away).
#[tokio::test(flavor = "multi_thread")]
async fn http2_watch_frames_leave_at_once_after_a_burst_and_when_idle() {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let s = common::start().await;
    let tcp = TcpStream::connect(s.running.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = common::tls_connector(&s, &[b"h2"])
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(tls))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    // A small answer alone on the connection (no DATA frame h2 holds on to).
    let req = http::Request::get("https://localhost/healthz")
        .body(http_body_util::Empty::new())
        .expect("req");
    let health = tokio::time::timeout(Duration::from_secs(5), async {
        let resp = send.clone().send_request(req).await.expect("healthz");
        resp.into_body().collect().await.expect("body").to_bytes()
    })
    .await
    .expect("a lone small answer is not held back");
    assert_eq!(&health[..], b"ok");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, String)>();
    let (open_tx, mut open_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for w in 0..WATCHERS {
        let mut send = send.clone();
        let (tx, open) = (tx.clone(), open_tx.clone());
        tokio::spawn(async move {
            let req = http::Request::get(format!(
                "https://localhost{}?watch=1&resourceVersion=0",
                common::WIDGETS
            ))
            .body(http_body_util::Empty::new())
            .expect("req");
            let resp = send.send_request(req).await.expect("watch");
            // Headers come once the watch is subscribed.
            let _ = open.send(());
            let mut body = resp.into_body();
            let mut pending = String::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                pending.push_str(&String::from_utf8_lossy(&data));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let _ = tx.send((w, line));
                }
            }
        });
    }
    for _ in 0..WATCHERS {
        open_rx.recv().await.expect("watch opened");
    }
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("lone", 1))
            .await
            .status,
        201
    );
    expect_events(&mut rx, 1, "a lone event").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("after-idle", 1))
            .await
            .status,
        201
    );
    expect_events(&mut rx, 1, "an event on an idle connection").await;
    let writes = (0..100).map(|i| {
        let s = &s;
        async move {
            s.post_json(common::WIDGETS, &common::widget(&format!("burst-{i}"), 1))
                .await
                .status
        }
    });
    let statuses = futures::future::join_all(writes).await;
    assert!(statuses.iter().all(|st| *st == 201), "{statuses:?}");
    expect_events(&mut rx, 100, "the end of a burst").await;
}

const WATCHERS: usize = 20;

/// Every watcher reports `n` more ADDED events within 5 s.
async fn expect_events(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, String)>,
    n: usize,
    what: &str,
) {
    let mut seen = vec![0usize; WATCHERS];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.iter().any(|c| *c < n) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((w, line))) => {
                assert!(line.contains("\"ADDED\""), "{line}");
                seen[w] += 1;
            }
            _ => panic!("{what}: events per watcher after 5 s: {seen:?} (want {n})"),
        }
    }
}

/// A watcher that stops reading while a burst larger than one write (64
/// events or 256 KiB) is committed gets, once it reads again, every event
/// once and in revision order: the events taken from the cache beyond one
/// write wait for the next.
#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_behind_a_burst_larger_than_one_write_gets_every_event_in_order() {
    let s = common::start().await;
    let ns = "/apis/demo.kshard.dev/v1/namespaces/burst/widgets";
    let list = s.get(&format!("{ns}?limit=1")).await.json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    // A small receive buffer: the server's writes stall once its socket
    // and hyper's buffers are full (a few MB), and the rest of the burst
    // waits in the watcher's cache buffer.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    let tcp = socket.connect(s.running.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = common::tls_connector(&s, &[b"http/1.1"])
        .connect(name, tcp)
        .await
        .expect("handshake");
    let request =
        format!("GET {ns}?watch=1&resourceVersion={rv} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    tls.write_all(request.as_bytes()).await.expect("request");
    let n = 150;
    let payload = "p".repeat(60 * 1024);
    for i in 0..n {
        let mut w = common::widget(&format!("b{i:03}"), 1);
        w["metadata"]["annotations"] = serde_json::json!({ "payload": payload });
        let r = s.post_json(ns, &w).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let marker = b"\"ADDED\",\"obj";
    let (mut seen, mut scanned) = (0, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Until the last event's chunk has ended.
    while (seen < n || !raw.ends_with(b"\n\r\n")) && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(k)) => raw.extend_from_slice(&buf[..k]),
        }
        // Only the new bytes (and a marker's length before them) are searched.
        let from = scanned.saturating_sub(marker.len() - 1);
        seen += raw[from..]
            .windows(marker.len())
            .filter(|w| w == marker)
            .count();
        scanned = raw.len();
    }
    // Chunked HTTP/1.1: each chunk is whole events, newline-terminated.
    let text = String::from_utf8_lossy(&raw);
    let events: Vec<(String, String, u64)> = text
        .split(['\n', '\r'])
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).expect("one event per line");
            let rv = e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("rv");
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                rv,
            )
        })
        .collect();
    assert_eq!(events.len(), n, "nothing more, nothing twice");
    for (i, (kind, name, _)) in events.iter().enumerate() {
        assert_eq!(
            (kind.as_str(), name.as_str()),
            ("ADDED", format!("b{i:03}").as_str())
        );
    }
    assert!(
        events.windows(2).all(|w| w[0].2 < w[1].2),
        "revisions only grow"
    );
}

/// Sends `tries` POSTs of a `size`-byte body over one HTTP/2 connection
/// (TLS, ALPN h2, anonymous) and returns each answer's status and body, or
/// the error the client saw instead.
async fn h2_posts(
    s: &common::TestServer,
    size: usize,
    tries: usize,
    content_length: bool,
) -> Vec<Result<(u16, serde_json::Value), String>> {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let tcp = TcpStream::connect(s.running.addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let tls = common::tls_connector(s, &[b"h2"])
        .connect(name, tcp)
        .await
        .expect("handshake");
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake::<_, http_body_util::Full<bytes::Bytes>>(TokioIo::new(tls))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let body = bytes::Bytes::from(vec![b' '; size]);
    let mut out = Vec::new();
    for _ in 0..tries {
        let mut req = http::Request::post(format!("https://localhost{}", common::WIDGETS))
            .header("content-type", "application/json");
        if content_length {
            req = req.header("content-length", size.to_string());
        }
        let req = req
            .body(http_body_util::Full::new(body.clone()))
            .expect("req");
        let got = async {
            let resp = send
                .clone()
                .send_request(req)
                .await
                .map_err(|e| format!("request: {e:?}"))?;
            let code = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{code} body: {e:?}"))?
                .to_bytes();
            let st = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{code} not JSON ({e}): {bytes:?}"))?;
            Ok((code, st))
        };
        out.push(
            tokio::time::timeout(Duration::from_secs(20), got)
                .await
                .unwrap_or_else(|_| Err("no answer in 20 s".into())),
        );
    }
    out
}

fn assert_refused(
    got: &[Result<(u16, serde_json::Value), String>],
    code: u16,
    reason: &str,
    what: &str,
) {
    let bad: Vec<_> = got
        .iter()
        .filter(|r| {
            !matches!(r, Ok((c, st)) if *c == code && st["kind"] == "Status" && st["reason"] == reason && st["code"] == code)
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} answers were not {code} {reason}: {:?}",
        bad.len(),
        got.len(),
        bad.iter().take(3).collect::<Vec<_>>()
    );
}

/// A refusal sent before the request body is read (401 here) reaches an
/// HTTP/2 client whole, then the stream ends with NO_ERROR: never a stream
/// reset in its place, whatever the body's size.
#[tokio::test(flavor = "multi_thread")]
async fn early_refusals_reach_http2_clients_whatever_the_body() {
    let s = common::start_with(|c| c.anonymous_auth = false).await;
    for size in [1, 16 * 1024, 200 * 1024, 2 * 1024 * 1024] {
        for content_length in [true, false] {
            let got = h2_posts(&s, size, 50, content_length).await;
            assert_refused(
                &got,
                401,
                "Unauthorized",
                &format!("{size} bytes, content-length {content_length}"),
            );
        }
    }
    // The connection's flow-control window was not used up by unread bodies.
    let got = h2_posts(&s, 10, 1, true).await;
    assert_refused(&got, 401, "Unauthorized", "afterwards");
}

/// A body over the limit (413) or over the shared budget (429) is refused
/// to an HTTP/2 client with kube's Status every time.
#[tokio::test(flavor = "multi_thread")]
async fn body_refusals_reach_http2_clients() {
    let s = common::start_with(|c| {
        c.connections.max_request_body_bytes = 64 * 1024;
        c.connections.max_buffered_request_body_bytes = 32 * 1024;
    })
    .await;
    for content_length in [true, false] {
        let got = h2_posts(&s, 100 * 1024, 50, content_length).await;
        assert_refused(
            &got,
            413,
            "RequestEntityTooLarge",
            &format!("413, content-length {content_length}"),
        );
        let got = h2_posts(&s, 48 * 1024, 50, content_length).await;
        assert_refused(
            &got,
            429,
            "TooManyRequests",
            &format!("429, content-length {content_length}"),
        );
    }
}

/// `tries` POSTs of a `size`-byte body by curl over HTTP/2 (a client that
/// reports a stream reset during its upload as an error, instead of the
/// answer): the status codes and bodies, or curl's error.
fn curl_posts(
    s: &common::TestServer,
    size: usize,
    tries: usize,
) -> Vec<Result<(u16, serde_json::Value), String>> {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("body");
    std::fs::write(&file, vec![b' '; size]).expect("body");
    let ca = s.running.kubeconfig.with_file_name("pki").join("ca.crt");
    let url = format!(
        "https://localhost:{}{}",
        s.running.addr.port(),
        common::WIDGETS
    );
    (0..tries)
        .map(|_| {
            let out = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--http2",
                    "-X",
                    "POST",
                    "-H",
                    "content-type: application/json",
                ])
                .arg("--cacert")
                .arg(&ca)
                .arg("--resolve")
                .arg(format!("localhost:{}:127.0.0.1", s.running.addr.port()))
                .arg("--data-binary")
                .arg(format!("@{}", file.display()))
                .args(["-w", "\n%{http_code}"])
                .arg(&url)
                .output()
                .expect("curl on PATH");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if !out.status.success() {
                return Err(format!(
                    "curl: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
            let st =
                serde_json::from_str(body).map_err(|e| format!("{code} not JSON ({e}): {body}"))?;
            Ok((code.parse().unwrap_or(0), st))
        })
        .collect()
}

/// curl over HTTP/2, refused before its body is read (401) or for its body
/// (413), gets the answer every time, never "Stream error in the HTTP/2
/// framing layer".
#[tokio::test(flavor = "multi_thread")]
async fn early_refusals_reach_curl_over_http2() {
    let s = common::start_with(|c| c.anonymous_auth = false).await;
    for size in [1024, 200 * 1024, 4 * 1024 * 1024] {
        let s = &s;
        let got = tokio::task::block_in_place(|| curl_posts(s, size, 50));
        assert_refused(&got, 401, "Unauthorized", &format!("curl, {size} bytes"));
    }
    let s = common::start_with(|c| c.connections.max_request_body_bytes = 64 * 1024).await;
    let got = tokio::task::block_in_place(|| curl_posts(&s, 1024 * 1024, 50));
    assert_refused(&got, 413, "RequestEntityTooLarge", "curl, over the limit");
}
