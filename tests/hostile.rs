//! Hostile but authenticated requests against the real binary, its address
//! space capped at 1 GiB above its size at start: each gets kube-apiserver's
//! answer and the server keeps serving.

mod common;

use serde_json::{json, Value};

const HEADROOM: u64 = 1 << 30;

async fn send(
    client: &kube::Client,
    method: &str,
    uri: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = client.send(req).await.expect("the server answers");
    let code = resp.status().as_u16();
    let body = resp.into_body().collect_bytes().await.expect("body");
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn patches_and_bodies_that_would_exhaust_memory_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    // Few malloc arenas, so the address-space cap measures data, not reservations.
    let mut child = common::spawn_kshard_with(&data, &[], &[("MALLOC_ARENA_MAX", "2")]);
    common::limit_memory(child.id(), HEADROOM);
    let client = common::client_for(&data.join("kubeconfig")).await;
    let w1 = format!("{}/w1", common::WIDGETS);
    let widget = serde_json::to_vec(&common::widget("w1", 1)).expect("json");
    let (code, _) = send(&client, "POST", common::WIDGETS, "application/json", widget).await;
    assert_eq!(code, 201);

    // 100 copies that each double the object: 2^100 bytes if applied.
    let mut ops = vec![
        json!({"op": "add", "path": "/spec/blob", "value": "x".repeat(4096)}),
        json!({"op": "add", "path": "/spec/copies", "value": []}),
    ];
    for _ in 0..100 {
        ops.push(json!({"op": "copy", "from": "/spec", "path": "/spec/copies/-"}));
    }
    let (code, st) = send(
        &client,
        "PATCH",
        &w1,
        "application/json-patch+json",
        serde_json::to_vec(&ops).expect("json"),
    )
    .await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(st["reason"], "Invalid");
    // kube's generic answer for a patch that fails to apply.
    assert_eq!(
        st["message"], "the server rejected our request due to an error in our request",
        "{st}"
    );

    // More operations than kube allows.
    let ops = vec![json!({"op": "test", "path": "/spec/replicas", "value": 1}); 10_001];
    let (code, st) = send(
        &client,
        "PATCH",
        &w1,
        "application/json-patch+json",
        serde_json::to_vec(&ops).expect("json"),
    )
    .await;
    assert_eq!(code, 413, "{st}");
    assert_eq!(st["reason"], "RequestEntityTooLarge");
    assert_eq!(st["message"], "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001");

    // A wildcard content type names no format.
    let body = serde_json::to_vec(&common::widget("w2", 1)).expect("json");
    let (code, st) = send(&client, "POST", common::WIDGETS, "*/*", body).await;
    assert_eq!(code, 415, "{st}");
    assert_eq!(st["reason"], "UnsupportedMediaType");

    // A YAML "billion laughs" apply: each alias doubles the one before; the
    // decoder's budget refuses it before it expands.
    let mut bomb = String::from("apiVersion: demo.kshard.dev/v1\nkind: Widget\nmetadata: {name: w1}\nspec:\n  a0: &a0 [\"lol\", \"lol\"]\n");
    for i in 1..40 {
        bomb.push_str(&format!("  a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
    }
    let (code, st) = send(
        &client,
        "PATCH",
        &format!("{w1}?fieldManager=bomb"),
        "application/apply-patch+yaml",
        bomb.into_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    assert_eq!(st["reason"], "BadRequest");

    // Still serving, and nothing was half-applied.
    let (code, obj) = send(&client, "GET", &w1, "application/json", Vec::new()).await;
    assert_eq!(code, 200);
    assert!(obj["spec"].get("blob").is_none(), "{obj}");
    assert!(child.try_wait().expect("wait").is_none(), "the server died");
    let _ = child.kill();
    let _ = child.wait();
}
