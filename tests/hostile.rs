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

/// Decoders and parsers a client reaches without a body limit of its own:
/// CBOR length prefixes and nesting, protobuf envelopes, label and field
/// selectors as long as the header limit allows, continue tokens and
/// managedFields field sets, all against the capped server.
#[tokio::test(flavor = "multi_thread")]
async fn decoders_selectors_and_tokens_that_would_exhaust_memory_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let mut child = common::spawn_kshard_with(&data, &[], &[("MALLOC_ARENA_MAX", "2")]);
    common::limit_memory(child.id(), HEADROOM);
    let client = common::client_for(&data.join("kubeconfig")).await;
    let widget = serde_json::to_vec(&common::widget("w1", 1)).expect("json");
    let (code, _) = send(&client, "POST", common::WIDGETS, "application/json", widget).await;
    assert_eq!(code, 201);

    // A CBOR array announcing 2^62 elements in a 9-byte body.
    let mut huge = vec![0x9b];
    huge.extend_from_slice(&(1u64 << 62).to_be_bytes());
    let (code, st) = send(&client, "POST", common::WIDGETS, "application/cbor", huge).await;
    assert_eq!(code, 400, "{st}");
    // A CBOR map announcing 2^62 entries, and a byte string of 2^62 bytes.
    for head in [0xbbu8, 0x5b, 0x7b] {
        let mut body = vec![0xd9, 0xd9, 0xf7, head];
        body.extend_from_slice(&(1u64 << 62).to_be_bytes());
        let (code, st) = send(&client, "POST", common::WIDGETS, "application/cbor", body).await;
        assert_eq!(code, 400, "head {head:#x}: {st}");
    }
    // 1 MiB of nested one-element arrays.
    let (code, st) = send(
        &client,
        "POST",
        common::WIDGETS,
        "application/cbor",
        vec![0x81; 1 << 20],
    )
    .await;
    assert_eq!(code, 400, "{st}");
    // The same depth through an apply in CBOR.
    let (code, st) = send(
        &client,
        "PATCH",
        &format!("{}/w1?fieldManager=deep", common::WIDGETS),
        "application/apply-patch+cbor",
        vec![0x81; 1 << 20],
    )
    .await;
    assert_eq!(code, 400, "{st}");

    // A protobuf envelope whose length prefix claims 2^62 bytes: custom
    // resources take no protobuf bodies, so it is refused before decoding.
    let mut pb = b"k8s\x00\x12".to_vec();
    let mut n: u64 = 1 << 62;
    while n >= 0x80 {
        pb.push((n as u8) | 0x80);
        n >>= 7;
    }
    pb.push(n as u8);
    let (code, st) = send(
        &client,
        "POST",
        common::WIDGETS,
        "application/vnd.kubernetes.protobuf",
        pb,
    )
    .await;
    assert_eq!(code, 415, "{st}");
    assert_eq!(st["reason"], "UnsupportedMediaType");

    // Label selectors close to the 64 KiB URI limit (beyond it: 414, see
    // tests/connections.rs): 10,000 requirements, and one set of 8,000
    // values. Valid, so answered, in bounded memory.
    let many = vec!["app=x"; 10_000].join(",");
    let (code, st) = send(
        &client,
        "GET",
        &format!("{}?labelSelector={many}", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["items"].as_array().map(Vec::len), Some(0));
    let values: Vec<String> = (0..8_000).map(|i| format!("v{i}")).collect();
    let set = format!("app%20in%20({})", values.join(","));
    let (code, st) = send(
        &client,
        "GET",
        &format!("{}?labelSelector={set}", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200, "{st}");
    // 60 KB of unbalanced parentheses is a parse error, not a recursion.
    let open = "(".repeat(60_000);
    let (code, st) = send(
        &client,
        "GET",
        &format!("{}?labelSelector=a%20in%20{open}", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    // Field selectors likewise.
    let fields = vec!["metadata.name!=x"; 3_500].join(",");
    let (code, st) = send(
        &client,
        "GET",
        &format!("{}?fieldSelector={fields}", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["items"].as_array().map(Vec::len), Some(1));

    // Continue tokens: 60 KB of garbage, and a well-formed token whose
    // start key is long.
    let mut outcomes = Vec::new();
    for token in ["A".repeat(60_001), {
        use base64::Engine as _;
        let inner = json!({"v": "meta.k8s.io/v1", "rv": 1, "start": "k".repeat(40_000)});
        base64::engine::general_purpose::URL_SAFE.encode(inner.to_string())
    }] {
        let (code, st) = send(
            &client,
            "GET",
            &format!("{}?limit=1&continue={token}", common::WIDGETS),
            "application/json",
            Vec::new(),
        )
        .await;
        outcomes.push((code, st));
    }
    assert_eq!(outcomes[0].0, 400, "{}", outcomes[0].1);
    assert_eq!(outcomes[0].1["reason"], "BadRequest");
    assert!(outcomes[0].1["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("invalid continue token: continue key is not valid")));
    // kube resumes after the decoded key as given ("default/..." sorts before "k...").
    assert_eq!(outcomes[1].0, 200, "{}", outcomes[1].1);
    assert_eq!(outcomes[1].1["items"].as_array().map(Vec::len), Some(0));

    // managedFields whose field set has 150,000 entries (2.5 MB, under the
    // body limit): refused as too large to store, never expanded into a tree
    // that outgrows the cap.
    let mut fields = serde_json::Map::new();
    for i in 0..150_000 {
        fields.insert(format!("f:k{i}"), json!({}));
    }
    let (_, current) = send(
        &client,
        "GET",
        &format!("{}/w1", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    let mut w = common::widget("w1", 2);
    w["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    w["metadata"]["managedFields"] = json!([{
        "manager": "hostile", "operation": "Update", "apiVersion": "demo.kshard.dev/v1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": fields}
    }]);
    let (code, st) = send(
        &client,
        "PUT",
        &format!("{}/w1", common::WIDGETS),
        "application/json",
        serde_json::to_vec(&w).expect("json"),
    )
    .await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(
        st["details"]["causes"][0]["reason"], "FieldValueTooLong",
        "{st}"
    );

    // Still serving.
    let (code, obj) = send(
        &client,
        "GET",
        &format!("{}/w1", common::WIDGETS),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(obj["spec"]["replicas"], 1, "{obj}");
    assert!(child.try_wait().expect("wait").is_none(), "the server died");
    let _ = child.kill();
    let _ = child.wait();
}
