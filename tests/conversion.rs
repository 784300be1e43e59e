//! Conversion webhooks (issue 17): a real HTTPS webhook started by the test
//! converts gadgets between v1 (stored, `spec.color`) and v2 (`spec.colour`)
//! for get, list, watch, create, update and apply through v2, and its failure
//! gets kube's error while the storage version still reads.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::tls::Ca;
use futures::StreamExt as _;
use serde_json::{json, Value};

const V1: &str = "/apis/gadgets.kshard.dev/v1/namespaces/default/gadgets";
const V2: &str = "/apis/gadgets.kshard.dev/v2/namespaces/default/gadgets";

#[derive(Default)]
struct Hook {
    calls: AtomicUsize,
    fail: AtomicBool,
    /// How many objects each review carried.
    batches: std::sync::Mutex<Vec<usize>>,
    /// Waited before answering, in milliseconds.
    delay_ms: AtomicU64,
    /// Never answers.
    hang: AtomicBool,
    /// Bytes of whitespace sent ahead of the (valid) answer.
    padding: AtomicUsize,
}

/// The webhook's conversion: rename the colour field between versions
/// (gadgets), or v1 `size` to v2 `replicas` (gizmos).
fn convert(obj: &Value, desired: &str) -> Value {
    let mut out = obj.clone();
    out["apiVersion"] = json!(desired);
    let spec = out["spec"].as_object_mut().cloned().unwrap_or_default();
    let mut spec = spec;
    let (v1, v2) = if obj["kind"] == "Gizmo" {
        ("size", "replicas")
    } else {
        ("color", "colour")
    };
    if desired.ends_with("/v2") {
        if let Some(c) = spec.remove(v1) {
            spec.insert(v2.into(), c);
        }
    } else if let Some(c) = spec.remove(v2) {
        spec.insert(v1.into(), c);
    }
    out["spec"] = Value::Object(spec);
    out
}

async fn review(
    axum::extract::State(hook): axum::extract::State<Arc<Hook>>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    hook.calls.fetch_add(1, Ordering::SeqCst);
    let req = &review["request"];
    if let Ok(mut b) = hook.batches.lock() {
        b.push(req["objects"].as_array().map_or(0, Vec::len));
    }
    let desired = req["desiredAPIVersion"].as_str().unwrap_or_default();
    if hook.hang.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    let delay = hook.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let response = if hook.fail.load(Ordering::SeqCst) {
        json!({"uid": req["uid"], "result": {"status": "Failure", "message": "colour wheel broken"}})
    } else {
        let objects: Vec<Value> = req["objects"]
            .as_array()
            .map(|os| os.iter().map(|o| convert(o, desired)).collect())
            .unwrap_or_default();
        json!({"uid": req["uid"], "convertedObjects": objects, "result": {"status": "Success"}})
    };
    let answer = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview", "response": response});
    let padding = hook.padding.load(Ordering::SeqCst);
    let body = if padding > 0 {
        // A huge answer, made as it is sent: valid JSON after `padding`
        // bytes of whitespace.
        const CHUNK: usize = 1 << 20;
        let chunks = padding.div_ceil(CHUNK);
        let pad = futures::stream::iter(0..chunks).map(move |i| {
            let n = CHUNK.min(padding - i * CHUNK);
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(vec![b' '; n]))
        });
        let tail = futures::stream::once(async move {
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(answer.to_string()))
        });
        axum::body::Body::from_stream(pad.chain(tail))
    } else {
        axum::body::Body::from(answer.to_string())
    };
    let mut r = axum::response::Response::new(body);
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// Starts the webhook over HTTPS; returns its port and the CA's PEM.
async fn start_webhook(hook: Arc<Hook>) -> (u16, String) {
    let ca = Ca::new("webhook-ca");
    let app = axum::Router::new()
        .route("/convert", axum::routing::post(review))
        .with_state(hook);
    let (addr, _task) = common::tls::serve_https(&ca, &["127.0.0.1"], app).await;
    let port = addr.port();
    (port, ca.pem)
}

fn crd(port: u16, ca_pem: &str) -> String {
    let version = |name: &str, storage: bool, field: &str| {
        json!({"name": name, "served": true, "storage": storage,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "size": {"type": "integer"}, field: {"type": "string"}}}}}}})
    };
    webhook_crd(
        "gadget",
        "Gadget",
        port,
        ca_pem,
        [version("v1", true, "color"), version("v2", false, "colour")],
    )
}

/// A namespaced definition `<singular>s.<singular>s.kshard.dev` with
/// `versions`, converted by the test's webhook at `port`.
fn webhook_crd(
    singular: &str,
    kind: &str,
    port: u16,
    ca_pem: &str,
    versions: [Value; 2],
) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let plural = format!("{singular}s");
    let mut crd = common::crd(&format!("{plural}.kshard.dev"), &plural, kind, json!({}));
    crd["spec"]["versions"] = json!(versions);
    crd["spec"]["conversion"] = json!({
        "strategy": "Webhook",
        "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/convert"), "caBundle": ca},
        },
    });
    // JSON is YAML: the definition file as a user would write it.
    crd.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversion_webhook_converts_every_path_and_its_failure_is_kubes() {
    let hook = Arc::new(Hook::default());
    let (port, ca) = start_webhook(hook.clone()).await;
    let defs = tempfile::tempdir().expect("tempdir");
    let file = defs.path().join("gadgets.yaml");
    std::fs::write(&file, crd(port, &ca)).expect("write crd");
    let s = common::start_with(|c| c.crds.push(file)).await;

    // A watch through v2 from the start.
    let mut watch = s
        .client
        .send(
            http::Request::get(format!("{V2}?watch=1"))
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("watch");
    assert_eq!(watch.status(), 200);

    // Create through v2: stored as v1.
    let g1 = json!({"apiVersion": "gadgets.kshard.dev/v2", "kind": "Gadget",
                    "metadata": {"name": "g1"}, "spec": {"size": 1, "colour": "red"}});
    let r = s.post_json(V2, &g1).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["apiVersion"], "gadgets.kshard.dev/v2");
    assert_eq!(r.json()["spec"]["colour"], "red", "{}", r.text());
    let stored = s.get(&format!("{V1}/g1")).await.json();
    assert_eq!(stored["spec"]["color"], "red", "{stored}");
    assert!(stored["spec"].get("colour").is_none(), "{stored}");
    assert!(hook.calls.load(Ordering::SeqCst) >= 2);

    // Get and list through v2.
    let got = s.get(&format!("{V2}/g1")).await.json();
    assert_eq!(got["spec"]["colour"], "red", "{got}");
    let list = s.get(V2).await.json();
    assert_eq!(list["items"][0]["spec"]["colour"], "red", "{list}");
    assert_eq!(list["items"][0]["apiVersion"], "gadgets.kshard.dev/v2");

    // Update through v2.
    let mut live = got.clone();
    live["spec"]["colour"] = json!("blue");
    let r = s.put_json(&format!("{V2}/g1"), &live).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        s.get(&format!("{V1}/g1")).await.json()["spec"]["color"],
        "blue"
    );

    // Server-side apply through v2.
    let applied = s
        .raw(
            "PATCH",
            &format!("{V2}/g1?fieldManager=tester&force=true"),
            &[("content-type", "application/apply-patch+yaml")],
            serde_json::to_vec(
                &json!({"apiVersion": "gadgets.kshard.dev/v2", "kind": "Gadget",
                "metadata": {"name": "g1"}, "spec": {"colour": "green"}}),
            )
            .expect("json"),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.text());
    assert_eq!(applied.json()["spec"]["colour"], "green");
    assert_eq!(
        s.get(&format!("{V1}/g1")).await.json()["spec"]["color"],
        "green"
    );

    // The watch saw every change in v2's shape.
    let mut seen = String::new();
    let body = watch.body_mut();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(frame)) = http_body_util::BodyExt::frame(body).await {
            if let Ok(d) = frame.into_data() {
                seen.push_str(&String::from_utf8_lossy(&d));
            }
            if seen.contains("\"colour\":\"green\"") {
                return;
            }
        }
    })
    .await;
    for colour in ["red", "blue", "green"] {
        assert!(
            seen.contains(&format!("\"colour\":\"{colour}\"")),
            "{colour}: {seen}"
        );
    }
    assert!(!seen.contains("\"color\""), "{seen}");

    // A failing webhook: kube's error through v2, the storage version reads.
    hook.fail.store(true, Ordering::SeqCst);
    let mut g2 = g1.clone();
    g2["metadata"]["name"] = json!("g2");
    let r = s.post_json(V2, &g2).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["reason"], "InternalError");
    assert_eq!(
        r.json()["message"],
        "Internal error occurred: conversion webhook for gadgets.kshard.dev/v2, Kind=Gadget failed: colour wheel broken"
    );
    assert_eq!(
        s.get(&format!("{V1}/g2")).await.status,
        404,
        "nothing stored"
    );
    let r = s.get(&format!("{V1}/g1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A list through another version is converted in one review, as kube sends
/// a list whole, and converted objects are not sent again.
#[tokio::test(flavor = "multi_thread")]
async fn a_list_is_converted_in_one_review() {
    let hook = Arc::new(Hook::default());
    let (port, ca) = start_webhook(hook.clone()).await;
    let defs = tempfile::tempdir().expect("tempdir");
    let file = defs.path().join("gadgets.yaml");
    std::fs::write(&file, crd(port, &ca)).expect("write crd");
    let s = common::start_with(|c| c.crds.push(file)).await;
    for i in 0..20 {
        let g = json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                       "metadata": {"name": format!("g{i:02}")}, "spec": {"size": i, "color": "red"}});
        let r = s.post_json(V1, &g).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    hook.batches.lock().expect("lock").clear();
    let list = s.get(V2).await.json();
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 20);
    assert!(items
        .iter()
        .all(|i| i["apiVersion"] == "gadgets.kshard.dev/v2" && i["spec"]["colour"] == "red"));
    assert_eq!(
        *hook.batches.lock().expect("lock"),
        [20],
        "one review, every object"
    );
    // Listed again: nothing left to convert.
    let again = s.get(V2).await.json();
    assert_eq!(again["items"].as_array().map_or(0, Vec::len), 20);
    assert_eq!(*hook.batches.lock().expect("lock"), [20]);
    // A failing webhook fails the list as kube's does.
    let r = s
        .post_json(
            V1,
            &json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                    "metadata": {"name": "late"}, "spec": {"size": 1, "color": "red"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    hook.fail.store(true, Ordering::SeqCst);
    let r = s.get(V2).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("colour wheel broken"), "{}", r.text());
}

const GZ1: &str = "/apis/gizmos.kshard.dev/v1/namespaces/default/gizmos";
const GZ2: &str = "/apis/gizmos.kshard.dev/v2/namespaces/default/gizmos";

/// Gizmos: v1 (stored) calls a field `size` that v2 calls `replicas`.
fn gizmo_crd(port: u16, ca_pem: &str) -> String {
    let version = |name: &str, storage: bool, field: &str| {
        json!({"name": name, "served": true, "storage": storage,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "note": {"type": "string"}, field: {"type": "integer"}}},
                "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}}}}})
    };
    webhook_crd(
        "gizmo",
        "Gizmo",
        port,
        ca_pem,
        [
            version("v1", true, "size"),
            version("v2", false, "replicas"),
        ],
    )
}

async fn gizmo_server(hook: Arc<Hook>) -> (common::TestServer, tempfile::TempDir) {
    let (port, ca) = start_webhook(hook).await;
    let defs = tempfile::tempdir().expect("tempdir");
    let file = defs.path().join("gizmos.yaml");
    std::fs::write(&file, gizmo_crd(port, &ca)).expect("write crd");
    let s = common::start_with(|c| c.crds.push(file)).await;
    (s, defs)
}

async fn apply_gizmo(
    s: &common::TestServer,
    base: &str,
    manager: &str,
    force: bool,
    spec: Value,
) -> common::Reply {
    let version = if base == GZ1 { "v1" } else { "v2" };
    s.raw(
        "PATCH",
        &format!("{base}/z?fieldManager={manager}&force={force}"),
        &[("content-type", "application/apply-patch+yaml")],
        serde_json::to_vec(
            &json!({"apiVersion": format!("gizmos.kshard.dev/{version}"),
            "kind": "Gizmo", "metadata": {"name": "z"}, "spec": spec}),
        )
        .expect("json"),
    )
    .await
}

/// The fields of `manager`'s entry (`None`: it has none).
fn owned(obj: &Value, manager: &str) -> Option<Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager)
        .map(|e| e["fieldsV1"].clone())
}

/// Server-side apply through a webhook that renames a field: ownership is
/// judged at each manager's version (structured-merge-diff converts old and
/// new to every recorded apiVersion), so a manager of v1 `size` conflicts
/// with, and loses to, writers of v2 `replicas`.
#[tokio::test(flavor = "multi_thread")]
async fn ownership_follows_a_field_the_webhook_renames() {
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gizmo_server(hook.clone()).await;

    let r = apply_gizmo(&s, GZ1, "a", false, json!({"size": 1, "note": "n"})).await;
    assert_eq!(r.status, 201, "{}", r.text());

    // "b" applies the same field under its v2 name with another value: a
    // conflict with "a", on the path as "a" owns it.
    hook.batches.lock().expect("lock").clear();
    let r = apply_gizmo(&s, GZ2, "b", false, json!({"replicas": 2})).await;
    assert_eq!(r.status, 409, "{}", r.text());
    let status = r.json();
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(
        status["message"],
        r#"Apply failed with 1 conflict: conflict with "a": .spec.size"#
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.size"}])
    );
    // The live object and the merged one went to v1 in one review.
    assert!(
        hook.batches.lock().expect("lock").contains(&2),
        "{:?}",
        hook.batches.lock().expect("lock")
    );

    // Forced: "b" owns replicas at v2, "a" keeps only its note.
    let r = apply_gizmo(&s, GZ2, "b", true, json!({"replicas": 2})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = s.get(&format!("{GZ1}/z")).await.json();
    assert_eq!(got["spec"]["size"], 2, "{got}");
    assert_eq!(
        owned(&got, "a"),
        Some(json!({"f:spec": {"f:note": {}}})),
        "{got}"
    );
    assert_eq!(
        owned(&got, "b"),
        Some(json!({"f:spec": {"f:replicas": {}}})),
        "{got}"
    );

    // "a" takes size back through v1; a PUT through v2 that changes replicas
    // takes it from "a" again.
    let r = apply_gizmo(&s, GZ1, "a", true, json!({"size": 3, "note": "n"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        owned(&r.json(), "a"),
        Some(json!({"f:spec": {"f:note": {}, "f:size": {}}}))
    );
    assert_eq!(owned(&r.json(), "b"), None, "b lost replicas");
    let mut live = s.get(&format!("{GZ2}/z")).await.json();
    live["spec"]["replicas"] = json!(4);
    let r = s
        .raw(
            "PUT",
            &format!("{GZ2}/z?fieldManager=editor"),
            &[("content-type", "application/json")],
            serde_json::to_vec(&live).expect("json"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = s.get(&format!("{GZ1}/z")).await.json();
    assert_eq!(got["spec"]["size"], 4);
    assert_eq!(
        owned(&got, "a"),
        Some(json!({"f:spec": {"f:note": {}}})),
        "{got}"
    );
    assert_eq!(
        owned(&got, "editor"),
        Some(json!({"f:spec": {"f:replicas": {}}})),
        "{got}"
    );

    // "a" owns size again; a merge patch through v2 removing replicas drops
    // it from "a".
    let r = apply_gizmo(&s, GZ1, "a", true, json!({"size": 5, "note": "n"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s
        .raw(
            "PATCH",
            &format!("{GZ2}/z?fieldManager=remover"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec": {"replicas": null}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = s.get(&format!("{GZ1}/z")).await.json();
    assert!(got["spec"].get("size").is_none(), "{got}");
    assert_eq!(
        owned(&got, "a"),
        Some(json!({"f:spec": {"f:note": {}}})),
        "{got}"
    );

    // The status subresource through v2 judges v1 managers at v1 too.
    let r = s
        .raw(
            "PATCH",
            &format!("{GZ1}/z/status?fieldManager=s1"),
            &[("content-type", "application/apply-patch+yaml")],
            br#"{"apiVersion": "gizmos.kshard.dev/v1", "kind": "Gizmo", "metadata": {"name": "z"}, "status": {"ready": 1}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s
        .raw(
            "PATCH",
            &format!("{GZ2}/z/status?fieldManager=s2"),
            &[("content-type", "application/apply-patch+yaml")],
            br#"{"apiVersion": "gizmos.kshard.dev/v2", "kind": "Gizmo", "metadata": {"name": "z"}, "status": {"ready": 2}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        r#"Apply failed with 1 conflict: conflict with "s1" with subresource "status": .status.ready"#
    );
    // The spec managers are untouched by status writes.
    let got = s.get(&format!("{GZ1}/z")).await.json();
    assert_eq!(
        owned(&got, "a"),
        Some(json!({"f:spec": {"f:note": {}}})),
        "{got}"
    );
}

/// A manager recorded at a version the definition does not have is dropped
/// (structured-merge-diff's missing-version case) rather than failing the
/// write; a failing webhook fails an apply that needs it.
#[tokio::test(flavor = "multi_thread")]
async fn managers_at_unknown_versions_are_dropped_and_a_failing_webhook_fails_apply() {
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gizmo_server(hook.clone()).await;
    let r = apply_gizmo(&s, GZ1, "a", false, json!({"size": 1})).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let mut live = s.get(&format!("{GZ1}/z")).await.json();
    let mut stale = live["metadata"]["managedFields"][0].clone();
    stale["manager"] = json!("old");
    stale["operation"] = json!("Update");
    stale["apiVersion"] = json!("gizmos.kshard.dev/v0");
    if let Some(list) = live["metadata"]["managedFields"].as_array_mut() {
        list.push(stale);
    }
    live["spec"]["note"] = json!("x");
    let r = s
        .raw(
            "PUT",
            &format!("{GZ1}/z?fieldManager=editor"),
            &[("content-type", "application/json")],
            serde_json::to_vec(&live).expect("json"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json();
    assert_eq!(owned(&got, "old"), None, "{got}");
    assert_eq!(
        owned(&got, "a"),
        Some(json!({"f:spec": {"f:size": {}}})),
        "{got}"
    );

    // "b" at v2 needs "a"'s view at v1: with the webhook failing, 500.
    hook.fail.store(true, Ordering::SeqCst);
    let r = apply_gizmo(&s, GZ2, "b", true, json!({"replicas": 2})).await;
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("colour wheel broken"), "{}", r.text());
}

// ---------------------------------------------------------------- issue 41
// No conversion webhook, however slow, hanging or verbose, and no number of
// watchers of a converted version can hang the server or pin its memory.

/// A server serving gadgets through the test's webhook.
async fn gadget_server(
    hook: Arc<Hook>,
    tune: impl FnOnce(&mut kshard::server::ServeConfig),
) -> (common::TestServer, tempfile::TempDir) {
    let (port, ca) = start_webhook(hook).await;
    let defs = tempfile::tempdir().expect("tempdir");
    let file = defs.path().join("gadgets.yaml");
    std::fs::write(&file, crd(port, &ca)).expect("write crd");
    let s = common::start_with(|c| {
        c.crds.push(file);
        tune(c);
    })
    .await;
    (s, defs)
}

fn gadget(name: &str, colour: &str) -> Value {
    json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
           "metadata": {"name": name}, "spec": {"size": 1, "color": colour}})
}

/// Creates `names` through the storage version, a few at a time.
async fn create_all(s: &common::TestServer, names: Vec<String>) {
    futures::stream::iter(names)
        .map(|n| async move {
            let r = s.post_json(V1, &gadget(&n, "red")).await;
            assert_eq!(r.status, 201, "{}", r.text());
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
}

async fn open_watch(client: &kube::Client, uri: &str) -> http::Response<kube::client::Body> {
    let w = client
        .send(
            http::Request::get(uri)
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("watch");
    assert_eq!(w.status(), 200);
    w
}

/// What a watch sent until `done` holds of it, it ended (`true`), or
/// `limit` passed.
async fn read_watch(
    w: &mut http::Response<kube::client::Body>,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> (String, bool) {
    let mut seen = String::new();
    let body = w.body_mut();
    let ended = tokio::time::timeout(limit, async {
        loop {
            match http_body_util::BodyExt::frame(body).await {
                Some(Ok(frame)) => {
                    if let Ok(d) = frame.into_data() {
                        seen.push_str(&String::from_utf8_lossy(&d));
                    }
                    if done(&seen) {
                        return false;
                    }
                }
                _ => return true,
            }
        }
    })
    .await
    .unwrap_or(false);
    (seen, ended)
}

fn events(seen: &str) -> Vec<Value> {
    seen.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Fails the test (the whole process: its runtime may be stuck) when not
/// dropped within `limit`.
struct Watchdog(#[allow(dead_code)] std::sync::mpsc::Sender<()>);

fn watchdog(what: &'static str, limit: Duration) -> Watchdog {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("{what}: nothing answered within {limit:?}: the server is stuck");
            std::process::exit(1);
        }
    });
    Watchdog(tx)
}

/// The old deadlock: every runtime worker blocked on an event's encoding
/// lock while the watcher holding it waited for webhook I/O no worker was
/// free to drive. Two workers (the server shares the test's runtime) and
/// six watchers of the converted version, each on its own HTTP/1.1
/// connection: every watcher gets the event, converted once for all of
/// them, and `/version` answers meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_of_a_converted_version_share_one_conversion_and_never_stall_the_server() {
    let _dog = watchdog("watchers of a converted version", Duration::from_secs(90));
    let hook = Arc::new(Hook::default());
    // Slow enough that every watcher reaches the event while it converts.
    hook.delay_ms.store(500, Ordering::SeqCst);
    let (s, _defs) = gadget_server(hook.clone(), |_| {}).await;
    let mut watches = Vec::new();
    for _ in 0..6 {
        let client = common::client_for(&s.running.kubeconfig).await;
        watches.push(open_watch(&client, &format!("{V2}?watch=1")).await);
    }
    let r = s.post_json(V1, &gadget("g1", "red")).await;
    assert_eq!(r.status, 201, "{}", r.text());

    let started = std::time::Instant::now();
    let v = s.get("/version").await;
    assert_eq!(v.status, 200, "{}", v.text());
    eprintln!("/version answered in {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "/version took {:?} while watchers converted",
        started.elapsed()
    );
    for w in &mut watches {
        let (seen, _) = read_watch(w, Duration::from_secs(30), |t| t.contains('\n')).await;
        let evs = events(&seen);
        assert_eq!(evs.len(), 1, "{seen}");
        assert_eq!(evs[0]["type"], "ADDED", "{seen}");
        assert_eq!(evs[0]["object"]["apiVersion"], "gadgets.kshard.dev/v2");
        assert_eq!(evs[0]["object"]["spec"]["colour"], "red", "{seen}");
    }
    assert_eq!(
        hook.calls.load(Ordering::SeqCst),
        1,
        "one conversion of the event, shared by every watcher"
    );
    assert_eq!(s.get("/version").await.status, 200);
}

/// Many objects go to the webhook in reviews of at most 100 objects: a
/// watch's initial events (not one review per object) and a list (not one
/// unbounded review).
#[tokio::test(flavor = "multi_thread")]
async fn many_objects_convert_in_bounded_batches() {
    const N: usize = 250;
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gadget_server(hook.clone(), |_| {}).await;
    create_all(&s, (0..N).map(|i| format!("a{i:03}")).collect()).await;
    // The watch below starts from the watch cache, which trails the
    // acknowledged writes a little: objects it has not seen yet would come
    // as live events, each converted on its own. The storage version's
    // list from the cache converts nothing.
    common::eventually("the watch cache holds every object", || async {
        let list = s.get(&format!("{V1}?resourceVersion=0")).await;
        list.json()["items"].as_array().map_or(0, Vec::len) == N
    })
    .await;
    hook.batches.lock().expect("lock").clear();

    let mut w = open_watch(&s.client, &format!("{V2}?watch=1&resourceVersion=0")).await;
    let (seen, _) = read_watch(&mut w, Duration::from_secs(60), |t| {
        t.matches('\n').count() >= N
    })
    .await;
    let evs = events(&seen);
    assert_eq!(evs.len(), N);
    assert!(evs
        .iter()
        .all(|e| e["type"] == "ADDED" && e["object"]["spec"]["colour"] == "red"));
    let batches = std::mem::take(&mut *hook.batches.lock().expect("lock"));
    assert_eq!(batches, [100, 100, 50], "initial events in batches");
    drop(w);

    // A list of objects not converted yet.
    create_all(&s, (0..N).map(|i| format!("b{i:03}")).collect()).await;
    let list = s.get(V2).await;
    assert_eq!(list.status, 200, "{}", list.text());
    let items = list.json()["items"].as_array().map_or(0, Vec::len);
    assert_eq!(items, 2 * N);
    let batches = std::mem::take(&mut *hook.batches.lock().expect("lock"));
    assert_eq!(batches, [100, 100, 50], "the new objects, in batches");
}

/// A webhook that never answers: a list gets kube's 504 at its deadline,
/// and a watch from resourceVersion 0 one ERROR event (kube's Status) and
/// the end of its stream, within the same deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_webhook_ends_lists_and_watches_at_the_deadline() {
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gadget_server(hook.clone(), |c| {
        c.connections.request_timeout = Duration::from_secs(3);
    })
    .await;
    create_all(&s, (0..5).map(|i| format!("g{i}")).collect()).await;
    hook.hang.store(true, Ordering::SeqCst);

    let started = std::time::Instant::now();
    let r = s.get(V2).await;
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["reason"], "Timeout");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let started = std::time::Instant::now();
    let mut w = open_watch(&s.client, &format!("{V2}?watch=1&resourceVersion=0")).await;
    let (seen, ended) = read_watch(&mut w, Duration::from_secs(30), |_| false).await;
    assert!(ended, "the watch ends: {seen}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let evs = events(&seen);
    assert_eq!(evs.len(), 1, "{seen}");
    assert_eq!(evs[0]["type"], "ERROR");
    let st = &evs[0]["object"];
    assert_eq!(st["kind"], "Status", "{st}");
    assert_eq!(st["code"], 500, "{st}");
    assert_eq!(
        st["message"],
        "Internal error occurred: conversion webhook for gadgets.kshard.dev/v1, Kind=Gadget failed: context deadline exceeded"
    );
    // The storage version still reads.
    assert_eq!(s.get(V1).await.status, 200);
}

/// A conversion that fails on a watch sends kube's one ERROR event and
/// ends the stream (not one ERROR per object on a stream left open).
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_conversion_ends_the_watch_with_one_error_event() {
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gadget_server(hook.clone(), |_| {}).await;
    let mut w = open_watch(&s.client, &format!("{V2}?watch=1")).await;
    hook.fail.store(true, Ordering::SeqCst);
    create_all(&s, (0..3).map(|i| format!("g{i}")).collect()).await;
    let (seen, ended) = read_watch(&mut w, Duration::from_secs(20), |_| false).await;
    assert!(ended, "the watch ends: {seen}");
    let evs = events(&seen);
    assert_eq!(evs.len(), 1, "{seen}");
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["object"]["kind"], "Status");
    assert_eq!(
        evs[0]["object"]["message"],
        "Internal error occurred: conversion webhook for gadgets.kshard.dev/v1, Kind=Gadget failed: colour wheel broken"
    );
}

fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// A webhook answering 300 MiB: refused once past the admission webhooks'
/// 16 MiB bound with the error, never held whole, and the server serves on.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_conversion_answer_is_refused_without_being_read_whole() {
    let hook = Arc::new(Hook::default());
    let (s, _defs) = gadget_server(hook.clone(), |_| {}).await;
    create_all(&s, vec!["g1".into()]).await;
    hook.padding.store(300 << 20, Ordering::SeqCst);
    let rss_before = proc_status_kib("VmRSS:");

    let r = s.get(&format!("{V2}/g1")).await;
    assert_eq!(r.status, 500, "{}", r.text());
    let msg = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.starts_with("Internal error occurred: conversion webhook for gadgets.kshard.dev/v1, Kind=Gadget failed: Post \"https://127.0.0.1:")
            && msg.ends_with("/convert\": length limit exceeded"),
        "{msg}"
    );
    // The process (server and test) never held the answer.
    let peak = proc_status_kib("VmHWM:");
    eprintln!("RSS before {rss_before} KiB, peak after {peak} KiB");
    assert!(
        peak < rss_before + 128 * 1024,
        "peak RSS {peak} KiB, {rss_before} KiB before"
    );
    let r = s.get(&format!("{V1}/g1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
