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
