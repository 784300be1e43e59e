//! Request deadlines: `--request-timeout` and `?timeout=` end a request with
//! kube's 504, and a client that stops reading its response cannot keep its
//! flow-control seats past the deadline.

mod common;

use std::time::Duration;

use common::apf::{as_user, install, level, schema};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn timeout_parameter_bounds_the_request() {
    let s = common::start().await;
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("w0", 1))
            .await
            .status,
        201
    );
    // A read at a revision the server does not have yet waits (3 s, then kube's
    // own 504); the client's deadline of 300 ms ends it first.
    let r = s
        .get(&format!(
            "{}/w0?resourceVersion=999999&timeout=300ms",
            common::WIDGETS
        ))
        .await;
    assert_eq!(r.status, 504, "{}", r.text());
    let st = r.json();
    assert_eq!(st["reason"], "Timeout");
    assert_eq!(
        st["message"],
        "Timeout: request did not complete within requested timeout - context deadline exceeded"
    );
    let r = s.get(&format!("{}?timeout=soon", common::WIDGETS)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "invalid timeout specified in the request URL: soon"
    );
    assert_eq!(
        s.get(&format!("{}?timeout=30s", common::WIDGETS))
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_reading_gives_its_seats_back_at_the_deadline() {
    let s = common::start_with(|c| {
        c.flowcontrol_controller = true;
        c.connections.request_timeout = Duration::from_secs(2);
    })
    .await;
    // A level of 3 seats that rejects rather than queues.
    install(
        &s,
        vec![schema("slow", "slow", "slow")],
        vec![level("slow", 1, json!({"type": "Reject"}))],
    )
    .await;
    // Enough data that a LIST does not fit in socket buffers: 80 × 256 KiB.
    let fill = "x".repeat(256 * 1024);
    for i in 0..80 {
        let obj = json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
                         "metadata": {"name": format!("big{i}")}, "spec": {"color": fill}});
        assert_eq!(s.post_json(common::WIDGETS, &obj).await.status, 201);
    }
    // Three readers take every seat and never read their bodies.
    let mut stalled = Vec::new();
    for i in 0..3 {
        let req = http::Request::get(common::WIDGETS)
            .header("impersonate-user", format!("reader{i}"))
            .header("impersonate-group", "slow")
            .body(kube::client::Body::empty())
            .expect("req");
        let resp = s.client.send(req).await.expect("send");
        assert_eq!(resp.status(), 200);
        stalled.push(resp);
    }
    let me = as_user("bob", "slow");
    assert_eq!(
        s.raw("GET", &format!("{}/big0", common::WIDGETS), &me, vec![])
            .await
            .status,
        429,
        "the stalled readers hold every seat"
    );
    // Past the 2 s deadline their seats are back, though they still read nothing.
    common::eventually(
        "bob is served while the stalled readers still hang",
        || async {
            s.raw("GET", &format!("{}/big0", common::WIDGETS), &me, vec![])
                .await
                .status
                == 200
        },
    )
    .await;
    drop(stalled);
}

/// Opens a TLS connection to the server (anonymous, which standalone on
/// loopback may do anything, including impersonate).
async fn tls(
    s: &common::TestServer,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(s.running.addr)
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    common::tls_connector(s, alpn)
        .connect(name, tcp)
        .await
        .expect("handshake")
}

/// Reads what the server sends until it closes the connection or `within`
/// passes; `None` if it was still open then.
async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stalled_request_bodies_hold_no_seats_and_end_at_the_deadline() {
    use tokio::io::AsyncWriteExt;
    let s = common::start_with(|c| {
        c.flowcontrol_controller = true;
        c.connections.request_timeout = Duration::from_secs(2);
    })
    .await;
    install(
        &s,
        vec![schema("slow", "slow", "slow")],
        vec![level("slow", 1, json!({"type": "Reject"}))],
    )
    .await;
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("w0", 1))
            .await
            .status,
        201
    );
    // Twice as many writers as the level has seats announce a body and send
    // a tenth of it.
    let mut stalled = Vec::new();
    for i in 0..6 {
        let mut c = tls(&s, &[b"http/1.1"]).await;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Impersonate-User: writer{i}\r\nImpersonate-Group: slow\r\n\
             Content-Length: 1000\r\n\r\n{}",
            common::WIDGETS,
            " ".repeat(100)
        );
        c.write_all(head.as_bytes()).await.expect("write");
        c.flush().await.expect("flush");
        stalled.push(c);
    }
    // The same level serves others at once: a body still in flight is not
    // admitted, so it holds no seat.
    let me = as_user("bob", "slow");
    for _ in 0..5 {
        let r = s
            .raw("GET", &format!("{}/w0", common::WIDGETS), &me, vec![])
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // At the deadline each stalled writer is answered with kube's 504.
    for mut c in stalled {
        let got = read_until_closed(&mut c, Duration::from_secs(20))
            .await
            .expect("the server ends a stalled body");
        assert!(got.starts_with("HTTP/1.1 504"), "{got}");
        assert!(got.contains("\"reason\":\"Timeout\""), "{got}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_lists_with_a_zero_window_lose_their_seats_and_connections_at_the_deadline() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let s = common::start_with(|c| {
        c.flowcontrol_controller = true;
        c.connections.request_timeout = Duration::from_secs(2);
    })
    .await;
    install(
        &s,
        vec![schema("slow", "slow", "slow")],
        vec![level("slow", 1, json!({"type": "Reject"}))],
    )
    .await;
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("w0", 1))
            .await
            .status,
        201
    );
    // Each client opens HTTP/2 with a stream window of 0: the server may send
    // headers but not one byte of the LIST's body.
    let mut conns = Vec::new();
    let mut responses = Vec::new();
    for i in 0..3 {
        let io = TokioIo::new(tls(&s, &[b"h2"]).await);
        let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(0)
            .adaptive_window(false)
            .handshake::<_, http_body_util::Empty<bytes::Bytes>>(io)
            .await
            .expect("h2 handshake");
        conns.push(tokio::spawn(conn));
        let req = http::Request::get(format!("https://localhost{}", common::WIDGETS))
            .header("impersonate-user", format!("lister{i}"))
            .header("impersonate-group", "slow")
            .body(http_body_util::Empty::new())
            .expect("req");
        let resp = send.send_request(req).await.expect("response headers");
        assert_eq!(resp.status(), 200);
        responses.push((send, resp));
    }
    let me = as_user("bob", "slow");
    assert_eq!(
        s.raw("GET", &format!("{}/w0", common::WIDGETS), &me, vec![])
            .await
            .status,
        429,
        "the zero-window lists hold every seat"
    );
    common::eventually("bob is served once the deadline passed", || async {
        s.raw("GET", &format!("{}/w0", common::WIDGETS), &me, vec![])
            .await
            .status
            == 200
    })
    .await;
    // And the server closed each of their connections.
    for c in conns {
        let ended = tokio::time::timeout(Duration::from_secs(20), c).await;
        assert!(ended.is_ok(), "the server closes a zero-window connection");
    }
    drop(responses);
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_uploads_share_one_memory_budget_and_others_are_served() {
    use tokio::io::AsyncWriteExt;
    let s = common::start_with(|c| {
        c.connections.request_timeout = Duration::from_secs(2);
        c.connections.max_buffered_request_body_bytes = 1024 * 1024;
    })
    .await;
    // Three uploads announce 2 MiB, send 300 KiB each (900 KiB of the 1 MiB
    // budget) and stall.
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut c = tls(&s, &[b"http/1.1"]).await;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            common::WIDGETS,
            2 * 1024 * 1024
        );
        c.write_all(head.as_bytes()).await.expect("write");
        c.write_all(&vec![b' '; 300 * 1024]).await.expect("write");
        c.flush().await.expect("flush");
        stalled.push(c);
    }
    common::eventually("the server holds the stalled uploads' 900 KiB", || async {
        s.running.body_limits.available_bytes() <= 124 * 1024
    })
    .await;
    // A body that does not fit in what is left is refused at once with 429,
    // rather than waiting or growing memory.
    let mut big = common::widget("big", 1);
    big["spec"]["color"] = json!("x".repeat(200 * 1024));
    let refused = s.post_json(common::WIDGETS, &big).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(
        refused.json()["reason"],
        "TooManyRequests",
        "{}",
        refused.text()
    );
    // Reads go on meanwhile.
    assert_eq!(s.get(common::WIDGETS).await.status, 200);
    // At the deadline the stalled uploads end and give their budget back.
    for mut c in stalled {
        let got = read_until_closed(&mut c, Duration::from_secs(20))
            .await
            .expect("the server ends a stalled upload");
        assert!(got.starts_with("HTTP/1.1 504"), "{got}");
    }
    assert_eq!(s.post_json(common::WIDGETS, &big).await.status, 201);
}
