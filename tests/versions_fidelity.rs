//! CRDs with several versions, read the way kube-apiserver 1.35 reads them
//! (issue 15): defaulting on read and deprecated versions' warnings, over
//! real HTTP.
//!
//! Defaulting on read, as apiextensions-apiserver does it: an object read
//! from storage is defaulted with the schema of the version it is *stored*
//! at (`unstructuredDefaulter` in the storage codec, before conversion), then
//! converted to the requested version. The requested version's own defaults
//! apply to request bodies only; kube's `test/integration/defaulting_test.go`
//! checks exactly that ("Add 'c' default to the REST version, remove it from
//! the storage version, and wait until GET no longer sees it"). Defaults
//! applied on read are not persisted.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

const GROUP: &str = "versions.kshard.dev";
/// The custom deprecation text: a quote, a backslash and non-ASCII, which
/// kube's warning header carries as `\"`, `\\` and raw UTF-8.
const BETA_WARNING: &str = r#"Dial "v1beta1" is going away \ use v1 → now"#;

/// `dials`: v1 (storage) defaults `spec.stored`; v1beta1 (deprecated, with
/// its own warning text) defaults `spec.beta` instead; v1alpha1 (deprecated,
/// kube's default text). `levers`: v1 is deprecated but no newer version
/// is served, so kube's default text names no replacement.
const CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: dials.versions.kshard.dev}
spec:
  group: versions.kshard.dev
  scope: Namespaced
  names: {plural: dials, singular: dial, kind: Dial}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              stored: {type: string, default: v1-default}
              beta: {type: string}
              onlyV1: {type: string}
  - name: v1beta1
    served: true
    storage: false
    deprecated: true
    deprecationWarning: 'Dial "v1beta1" is going away \ use v1 → now'
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              stored: {type: string}
              beta: {type: string, default: v1beta1-default}
              onlyBeta: {type: string}
  - name: v1alpha1
    served: true
    storage: false
    deprecated: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: levers.versions.kshard.dev}
spec:
  group: versions.kshard.dev
  scope: Cluster
  names: {plural: levers, singular: lever, kind: Lever}
  versions:
  - name: v1
    served: true
    storage: true
    deprecated: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
  - name: v1alpha1
    served: true
    storage: false
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

struct Server {
    s: common::TestServer,
    _crds: tempfile::TempDir,
}

async fn start() -> Server {
    let crds = tempfile::tempdir().expect("tempdir");
    let file = crds.path().join("versions.yaml");
    std::fs::write(&file, CRDS).expect("write CRDs");
    let s = common::start_with(|c| c.crds.push(file)).await;
    Server { s, _crds: crds }
}

fn dials(version: &str) -> String {
    format!("/apis/{GROUP}/{version}/namespaces/default/dials")
}

fn dial(version: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{GROUP}/{version}"), "kind": "Dial",
           "metadata": {"name": name}, "spec": spec})
}

/// The `Warning` header values of a response, as sent.
fn warnings(h: &http::HeaderMap) -> Vec<Vec<u8>> {
    h.get_all(http::header::WARNING)
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect()
}

/// `299 - "<text>"` with kube's escaping (`"` and `\` backslashed).
fn header_for(text: &str) -> Vec<u8> {
    let mut out = String::from("299 - \"");
    for c in text.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out.into_bytes()
}

/// An open watch: its response headers and the events read so far.
struct WatchStream {
    headers: http::HeaderMap,
    body: kube::client::Body,
    buf: String,
}

impl WatchStream {
    async fn open(s: &common::TestServer, uri: &str) -> Self {
        let resp = s
            .client
            .send(
                http::Request::get(uri)
                    .body(kube::client::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("watch");
        assert_eq!(resp.status(), 200, "{uri}");
        let headers = resp.headers().clone();
        Self {
            headers,
            body: resp.into_body(),
            buf: String::new(),
        }
    }

    /// The next event (one JSON line).
    async fn next(&mut self) -> Value {
        loop {
            if let Some(i) = self.buf.find('\n') {
                let line: String = self.buf.drain(..=i).collect();
                return serde_json::from_str(&line).expect("a JSON event");
            }
            let frame = tokio::time::timeout(
                Duration::from_secs(10),
                http_body_util::BodyExt::frame(&mut self.body),
            )
            .await
            .expect("an event in time")
            .expect("a frame")
            .expect("data");
            if let Ok(d) = frame.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&d));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_default_only_in_the_requested_versions_schema_is_not_applied_on_read() {
    let srv = start().await;
    let s = &srv.s;
    // Written through the storage version: `beta` is v1beta1's default only.
    let created = s
        .post_json(&dials("v1"), &dial("v1", "d1", json!({"size": 1})))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let rv = created.json()["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();

    let check = |what: &str, obj: &Value| {
        assert_eq!(
            obj["apiVersion"],
            format!("{GROUP}/v1beta1"),
            "{what}: {obj}"
        );
        assert_eq!(obj["spec"]["stored"], "v1-default", "{what}: {obj}");
        assert!(obj["spec"].get("beta").is_none(), "{what}: {obj}");
    };
    let base = dials("v1beta1");
    // resourceVersion=0 reads the watch cache, which may lag the ack a little.
    common::eventually("the watch cache holds d1", || async {
        s.get(&format!("{base}/d1?resourceVersion=0")).await.status == 200
    })
    .await;
    for q in ["", "?resourceVersion=0"] {
        let got = s.get(&format!("{base}/d1{q}")).await;
        assert_eq!(got.status, 200, "{}", got.text());
        check(&format!("GET{q}"), &got.json());
    }
    for q in [
        "",
        "?resourceVersion=0",
        format!("?resourceVersion={rv}&resourceVersionMatch=Exact").as_str(),
    ] {
        let list = s.get(&format!("{base}{q}")).await;
        assert_eq!(list.status, 200, "{}", list.text());
        let items = list.json()["items"].as_array().cloned().unwrap_or_default();
        assert_eq!(items.len(), 1, "LIST{q}");
        check(&format!("LIST{q}"), &items[0]);
    }

    let mut w = WatchStream::open(s, &format!("{base}?watch=1")).await;
    let initial = w.next().await;
    assert_eq!(initial["type"], "ADDED");
    check("initial watch event", &initial["object"]);
    let patched = s
        .raw(
            "PATCH",
            &format!("{}/d1", dials("v1")),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"size":2}}"#.to_vec(),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text());
    let live = w.next().await;
    assert_eq!(live["type"], "MODIFIED");
    assert_eq!(live["object"]["spec"]["size"], 2);
    check("live watch event", &live["object"]);

    // Written through v1beta1, its default is part of the request and stays.
    let created = s
        .post_json(&base, &dial("v1beta1", "d2", json!({"size": 1})))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let got = s.get(&format!("{}/d2", dials("v1"))).await.json();
    assert_eq!(got["spec"]["beta"], "v1beta1-default", "{got}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_storage_versions_defaults_show_on_every_read_but_are_not_persisted() {
    let srv = start().await;
    let s = &srv.s;
    let base = dials("v1beta1");
    // v1beta1 has no default for `stored`: the object is stored without it.
    let mut w_beta = WatchStream::open(s, &format!("{base}?watch=1")).await;
    let mut w_v1 = WatchStream::open(s, &format!("{}?watch=1", dials("v1"))).await;
    let created = s
        .post_json(&base, &dial("v1beta1", "d1", json!({"size": 1})))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    // kube answers a write with the object decoded from storage: defaulted.
    let created = created.json();
    assert_eq!(created["spec"]["stored"], "v1-default", "{created}");
    assert_eq!(created["spec"]["beta"], "v1beta1-default", "{created}");
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();

    for (version, w) in [("v1beta1", &mut w_beta), ("v1", &mut w_v1)] {
        let ev = w.next().await;
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["apiVersion"], format!("{GROUP}/{version}"));
        assert_eq!(
            ev["object"]["spec"]["stored"], "v1-default",
            "{version}: {ev}"
        );
        let uri = dials(version);
        for q in ["", "?resourceVersion=0"] {
            let got = s.get(&format!("{uri}/d1{q}")).await.json();
            assert_eq!(
                got["spec"]["stored"], "v1-default",
                "GET {version}{q}: {got}"
            );
        }
        for q in [
            "",
            "?resourceVersion=0",
            format!("?resourceVersion={rv}&resourceVersionMatch=Exact").as_str(),
        ] {
            let list = s.get(&format!("{uri}{q}")).await.json();
            assert_eq!(
                list["items"][0]["spec"]["stored"], "v1-default",
                "LIST {version}{q}: {list}"
            );
        }
        let mut initial = WatchStream::open(s, &format!("{uri}?watch=1")).await;
        let ev = initial.next().await;
        assert_eq!(
            ev["object"]["spec"]["stored"], "v1-default",
            "{version}: {ev}"
        );
    }

    // Not persisted: an empty patch writes (the stored bytes lack the default
    // the patched object now carries), and only then is it a no-op.
    let patch = |uri: String| async move {
        s.raw(
            "PATCH",
            &uri,
            &[("content-type", "application/merge-patch+json")],
            b"{}".to_vec(),
        )
        .await
    };
    let first = patch(format!("{base}/d1")).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first_rv = first.json()["metadata"]["resourceVersion"].clone();
    assert_ne!(
        first_rv,
        json!(rv),
        "the default is written by the first patch"
    );
    let second = patch(format!("{base}/d1")).await;
    assert_eq!(second.json()["metadata"]["resourceVersion"], first_rv);
    let ev = w_beta.next().await;
    assert_eq!(ev["type"], "MODIFIED");
    assert_eq!(ev["object"]["spec"]["stored"], "v1-default", "{ev}");

    // A dry run answers like a write: decoded from storage, defaulted.
    let dry = s
        .post_json(
            &format!("{base}?dryRun=All"),
            &dial("v1beta1", "dry", json!({"size": 3})),
        )
        .await;
    assert_eq!(dry.status, 201, "{}", dry.text());
    assert_eq!(dry.json()["spec"]["stored"], "v1-default", "{}", dry.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_to_a_deprecated_version_carries_kubes_warning() {
    let srv = start().await;
    let s = &srv.s;
    let beta = header_for(BETA_WARNING);
    assert_eq!(
        beta,
        "299 - \"Dial \\\"v1beta1\\\" is going away \\\\ use v1 → now\"".as_bytes()
    );
    let alpha = header_for(&format!(
        "{GROUP}/v1alpha1 Dial is deprecated; use {GROUP}/v1 Dial"
    ));
    let lever = header_for(&format!("{GROUP}/v1 Lever is deprecated"));

    let created = s
        .post_json(
            &dials("v1beta1"),
            &dial("v1beta1", "d1", json!({"size": 1})),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(
        warnings(&created.headers),
        std::slice::from_ref(&beta),
        "POST"
    );

    for (version, want) in [("v1beta1", &beta), ("v1alpha1", &alpha)] {
        let base = dials(version);
        for uri in [
            format!("{base}/d1"),
            format!("{base}/missing"),
            base.clone(),
            format!("/apis/{GROUP}/{version}/dials"),
            format!("{base}/d1/status"),
        ] {
            let r = s.get(&uri).await;
            assert_eq!(
                warnings(&r.headers),
                std::slice::from_ref(want),
                "GET {uri}: {}",
                r.status
            );
        }
        let w = WatchStream::open(s, &format!("{base}?watch=1")).await;
        assert_eq!(
            warnings(&w.headers),
            std::slice::from_ref(want),
            "WATCH {version}"
        );
    }
    for uri in [format!("{}/d1", dials("v1")), dials("v1")] {
        let r = s.get(&uri).await;
        assert!(warnings(&r.headers).is_empty(), "GET {uri}");
    }
    let w = WatchStream::open(s, &format!("{}?watch=1", dials("v1"))).await;
    assert!(warnings(&w.headers).is_empty(), "WATCH v1");

    // The deprecation warning comes first, then the handler's own.
    let unknown = s
        .raw(
            "POST",
            &format!("{}?fieldValidation=Warn", dials("v1beta1")),
            &[("content-type", "application/json")],
            serde_json::to_vec(&dial("v1beta1", "d2", json!({"size": 1, "what": 1})))
                .expect("json"),
        )
        .await;
    assert_eq!(unknown.status, 201, "{}", unknown.text());
    assert_eq!(
        warnings(&unknown.headers),
        [beta.clone(), header_for("unknown field \"spec.what\"")]
    );

    let levers = format!("/apis/{GROUP}/v1/levers");
    let r = s
        .post_json(
            &levers,
            &json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Lever", "metadata": {"name": "l"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        warnings(&r.headers),
        std::slice::from_ref(&lever),
        "POST levers"
    );
    for uri in [format!("{levers}/l"), levers.clone()] {
        let r = s.get(&uri).await;
        assert_eq!(
            warnings(&r.headers),
            std::slice::from_ref(&lever),
            "GET {uri}"
        );
    }
    let w = WatchStream::open(s, &format!("{levers}?watch=1")).await;
    assert_eq!(warnings(&w.headers), [lever], "WATCH levers");
    let r = s.get(&format!("/apis/{GROUP}/v1alpha1/levers")).await;
    assert!(warnings(&r.headers).is_empty(), "v1alpha1 levers");
    // Discovery of a group with deprecated versions warns of nothing.
    let r = s.get(&format!("/apis/{GROUP}/v1beta1")).await;
    assert_eq!(r.status, 200);
    assert!(warnings(&r.headers).is_empty(), "discovery");
}

/// kube's schema-coercing converter prunes an object moved between versions
/// by the target version's schema: a field only v1beta1 declares, written
/// through v1beta1, is not stored (the storage version v1 drops it); a field
/// only v1 declares is stored but not shown through v1beta1, in gets, lists
/// and watches alike.
#[tokio::test(flavor = "multi_thread")]
async fn objects_converted_between_versions_are_pruned_by_the_target_schema() {
    let srv = start().await;
    let s = &srv.s;
    let mut watch = WatchStream::open(s, &format!("{}?watch=1", dials("v1beta1"))).await;
    let r = s
        .post_json(
            &dials("v1beta1"),
            &dial("v1beta1", "d1", json!({"size": 1, "onlyBeta": "b"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The answer was converted back from storage: the field is gone.
    assert!(r.json()["spec"].get("onlyBeta").is_none(), "{}", r.text());
    let v1 = s.get(&format!("{}/d1", dials("v1"))).await.json();
    assert!(v1["spec"].get("onlyBeta").is_none(), "{v1}");
    assert_eq!(v1["spec"]["size"], 1);

    let mut obj = v1.clone();
    obj["spec"]["onlyV1"] = json!("a");
    let r = s.put_json(&format!("{}/d1", dials("v1")), &obj).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["spec"]["onlyV1"], "a");
    let beta = s.get(&format!("{}/d1", dials("v1beta1"))).await.json();
    assert!(beta["spec"].get("onlyV1").is_none(), "{beta}");
    assert_eq!(beta["apiVersion"], format!("{GROUP}/v1beta1"));
    let list = s.get(&dials("v1beta1")).await.json();
    assert!(list["items"][0]["spec"].get("onlyV1").is_none(), "{list}");
    let added = watch.next().await;
    assert_eq!(added["type"], "ADDED");
    let modified = watch.next().await;
    assert_eq!(modified["type"], "MODIFIED", "{modified}");
    assert!(
        modified["object"]["spec"].get("onlyV1").is_none(),
        "{modified}"
    );
    // Through v1 it is there.
    let v1 = s.get(&format!("{}/d1", dials("v1"))).await.json();
    assert_eq!(v1["spec"]["onlyV1"], "a");
}
