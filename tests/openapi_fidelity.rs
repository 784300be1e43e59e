//! The OpenAPI documents as kube-apiserver 1.35 publishes them for CRDs:
//! `/openapi/v2` in gnostic's protobuf on request (kube-openapi's Accept
//! negotiation, one ETag for both forms, 304 and 406), the `/scale` and
//! `/status` subresource paths with the `autoscaling/v1` Scale definitions,
//! and int-or-string fields as `anyOf: [integer, string]` in v3 and the bare
//! extension in v2. kubectl's OpenAPI v2 explain reads the protobuf form.

mod common;

use std::collections::BTreeSet;

use kshard::api::openapi_proto::{self, Document};
use prost::Message;
use serde_json::{json, Value};

const PB: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
const PB_NEW: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
const WIDGETS: &str = "/apis/demo.kshard.dev/v1/namespaces/{namespace}/widgets/{name}";

fn header(r: &common::Reply, name: &str) -> String {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn decode(r: &common::Reply) -> Document {
    Document::decode(r.body.as_slice()).expect("an openapi.v2.Document")
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn v2_protobuf_is_the_json_document_with_one_etag() {
    let s = common::start().await;
    let json_reply = s.get("/openapi/v2").await;
    assert_eq!(json_reply.status, 200);
    assert_eq!(header(&json_reply, "content-type"), "application/json");
    assert_eq!(header(&json_reply, "vary"), "Accept");
    let doc = json_reply.json();
    let etag = header(&json_reply, "etag");
    assert!(etag.starts_with('"') && etag.len() == 130, "{etag}");

    for accept in [PB, PB_NEW, &format!("{PB}, application/json")] {
        let r = s
            .raw("GET", "/openapi/v2", &[("accept", accept)], vec![])
            .await;
        assert_eq!(r.status, 200, "{accept}");
        // kube-openapi answers the newer name for either.
        assert_eq!(header(&r, "content-type"), PB_NEW, "{accept}");
        assert_eq!(header(&r, "etag"), etag, "one ETag for both forms");
        assert_eq!(header(&r, "vary"), "Accept");
        let pb = decode(&r);
        assert_eq!(pb.swagger, "2.0");
        // The same document: every path and definition, in the JSON's order.
        let paths: Vec<String> = pb
            .paths
            .as_ref()
            .map(|p| p.path.iter().map(|p| p.name.clone()).collect())
            .unwrap_or_default();
        let json_paths: Vec<String> = doc["paths"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        assert_eq!(paths, json_paths);
        let defs: Vec<String> = pb
            .definitions
            .as_ref()
            .map(|d| {
                d.additional_properties
                    .iter()
                    .map(|d| d.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        let json_defs: Vec<String> = doc["definitions"]
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        assert_eq!(defs, json_defs);
        // And exactly what converting the JSON answer gives.
        assert_eq!(pb, openapi_proto::from_json(&doc));
    }

    // The scale operations, decoded: a read answering autoscaling/v1 Scale.
    let r = s.raw("GET", "/openapi/v2", &[("accept", PB)], vec![]).await;
    let pb = decode(&r);
    let scale = pb
        .paths
        .as_ref()
        .and_then(|p| p.path.iter().find(|p| p.name == format!("{WIDGETS}/scale")))
        .and_then(|p| p.value.clone())
        .expect("scale path");
    let get = scale.get.expect("get");
    assert_eq!(get.operation_id, "readDemoKshardDevV1NamespacedWidgetScale");
    let ok = get
        .responses
        .as_ref()
        .and_then(|r| r.response_code.iter().find(|c| c.name == "200"))
        .and_then(|c| c.value.clone())
        .and_then(|v| v.oneof);
    match ok {
        Some(openapi_proto::response_value::Oneof::Response(resp)) => {
            match resp.schema.and_then(|s| s.oneof) {
                Some(openapi_proto::schema_item::Oneof::Schema(schema)) => {
                    assert_eq!(
                        schema.r#ref,
                        "#/definitions/io.k8s.api.autoscaling.v1.Scale"
                    )
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(scale.put.is_some() && scale.patch.is_some());
    // The Widget definition keeps its GVK extension as YAML.
    let widget = pb
        .definitions
        .as_ref()
        .and_then(|d| {
            d.additional_properties
                .iter()
                .find(|d| d.name == "dev.kshard.demo.v1.Widget")
        })
        .and_then(|d| d.value.clone())
        .expect("Widget");
    let gvk = widget
        .vendor_extension
        .iter()
        .find(|e| e.name == "x-kubernetes-group-version-kind")
        .and_then(|e| e.value.clone())
        .expect("gvk");
    let gvk: Value = serde_saphyr::from_str(&gvk.yaml).expect("yaml");
    assert_eq!(
        gvk,
        json!([{"group": "demo.kshard.dev", "version": "v1", "kind": "Widget"}])
    );

    // If-None-Match: 304 with the ETag and no body, for either form.
    for accept in [PB, "application/json"] {
        let r = s
            .raw(
                "GET",
                "/openapi/v2",
                &[("accept", accept), ("if-none-match", &etag)],
                vec![],
            )
            .await;
        assert_eq!(r.status, 304, "{accept}");
        assert_eq!(header(&r, "etag"), etag);
        assert!(r.body.is_empty());
        assert_eq!(header(&r, "content-type"), "");
    }
    let weak_in_list = format!("\"other\", W/{etag}");
    let r = s
        .raw(
            "GET",
            "/openapi/v2",
            &[("accept", PB), ("if-none-match", &weak_in_list)],
            vec![],
        )
        .await;
    assert_eq!(r.status, 304);
    let r = s
        .raw(
            "GET",
            "/openapi/v2",
            &[("accept", PB), ("if-none-match", "\"stale\"")],
            vec![],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "content-type"), PB_NEW);

    // Negotiation: JSON for JSON or wildcards first, 406 for anything else.
    for (accept, status, ct) in [
        ("application/json, */*", 200, "application/json"),
        ("*/*", 200, "application/json"),
        (
            &format!("application/json, {PB}") as &str,
            200,
            "application/json",
        ),
        (&format!("application/json;q=0.5, {PB}"), 200, PB_NEW),
        ("application/yaml", 406, ""),
        ("application/vnd.kubernetes.protobuf", 406, ""),
    ] {
        let r = s
            .raw("GET", "/openapi/v2", &[("accept", accept)], vec![])
            .await;
        assert_eq!(r.status, status, "{accept}");
        if status == 406 {
            assert!(r.body.is_empty(), "{accept}");
            assert_eq!(header(&r, "vary"), "Accept");
        } else {
            assert_eq!(header(&r, "content-type"), ct, "{accept}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn subresource_paths_and_scale_definitions() {
    let s = common::start().await;
    let v2 = s.get("/openapi/v2").await.json();
    let paths = &v2["paths"];
    for sub in ["status", "scale"] {
        let p = &paths[format!("{WIDGETS}/{sub}")];
        // The parameters every operation shares (name, namespace, pretty)
        // are the path's, as kube's v2 has them.
        assert_eq!(
            keys(p),
            ["get", "parameters", "patch", "put"]
                .map(String::from)
                .into(),
            "{sub}"
        );
        for (method, action) in [("get", "get"), ("put", "put"), ("patch", "patch")] {
            assert_eq!(p[method]["x-kubernetes-action"], action);
            assert_eq!(
                p[method]["x-kubernetes-group-version-kind"],
                json!({"group": "demo.kshard.dev", "version": "v1", "kind": "Widget"})
            );
        }
        let answered = if sub == "scale" {
            "#/definitions/io.k8s.api.autoscaling.v1.Scale"
        } else {
            "#/definitions/dev.kshard.demo.v1.Widget"
        };
        assert_eq!(p["put"]["responses"]["200"]["schema"]["$ref"], answered);
    }
    assert_eq!(
        paths[format!("{WIDGETS}/scale")]["patch"]["operationId"],
        "patchDemoKshardDevV1NamespacedWidgetScale"
    );
    // Things have a status subresource only; gadgets neither.
    let things = "/apis/test.kshard.dev/v1/namespaces/{namespace}/things/{name}";
    assert!(paths[format!("{things}/status")].is_object());
    assert!(paths.get(format!("{things}/scale")).is_none());
    for v in ["v1", "v1beta1"] {
        let gadget = format!("/apis/test.kshard.dev/{v}/gadgets/{{name}}");
        assert!(paths[&gadget].is_object());
        assert!(paths.get(format!("{gadget}/status")).is_none());
        assert!(paths.get(format!("{gadget}/scale")).is_none());
    }

    let defs = &v2["definitions"];
    let scale = &defs["io.k8s.api.autoscaling.v1.Scale"];
    assert_eq!(
        scale["x-kubernetes-group-version-kind"],
        json!([{"group": "autoscaling", "kind": "Scale", "version": "v1"}])
    );
    assert_eq!(
        scale["properties"]["spec"]["$ref"],
        "#/definitions/io.k8s.api.autoscaling.v1.ScaleSpec"
    );
    assert_eq!(
        defs["io.k8s.api.autoscaling.v1.ScaleSpec"]["properties"]["replicas"],
        json!({"description": "replicas is the desired number of instances for the scaled object.", "format": "int32", "type": "integer"})
    );
    assert_eq!(
        defs["io.k8s.api.autoscaling.v1.ScaleStatus"]["required"],
        json!(["replicas"])
    );
    // v2 keeps no defaults anywhere.
    assert!(!serde_json::to_string(defs)
        .expect("json")
        .contains("\"default\""));

    // v3: the group-version with widgets has the same paths and the Scale schemas.
    let root = s.get("/openapi/v3").await.json();
    let url = root["paths"]["apis/demo.kshard.dev/v1"]["serverRelativeURL"]
        .as_str()
        .expect("url")
        .to_string();
    let v3 = s.get(&url).await.json();
    let scale_get = &v3["paths"][format!("{WIDGETS}/scale")]["get"];
    assert_eq!(
        scale_get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.api.autoscaling.v1.Scale"
    );
    let schemas = &v3["components"]["schemas"];
    for name in ["Scale", "ScaleSpec", "ScaleStatus"] {
        assert!(
            schemas[format!("io.k8s.api.autoscaling.v1.{name}")].is_object(),
            "{name}"
        );
    }
    // A group-version without scale carries no Scale schemas.
    let url = root["paths"]["apis/test.kshard.dev/v1"]["serverRelativeURL"]
        .as_str()
        .expect("url")
        .to_string();
    let v3 = s.get(&url).await.json();
    assert!(v3["components"]["schemas"]
        .get("io.k8s.api.autoscaling.v1.Scale")
        .is_none());
}

/// A CRD whose int-or-string fields leave the `anyOf` out, as most do.
const KNOBS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: knobs.openapi.kshard.dev
spec:
  group: openapi.kshard.dev
  scope: Cluster
  names: {plural: knobs, singular: knob, kind: Knob}
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
              port:
                x-kubernetes-int-or-string: true
                description: A port by number or name.
              surge:
                x-kubernetes-int-or-string: true
                pattern: "^[0-9]+%?$"
              ports:
                type: array
                items:
                  x-kubernetes-int-or-string: true
"#;

fn int_or_string() -> Value {
    json!([{"type": "integer"}, {"type": "string"}])
}

#[tokio::test(flavor = "multi_thread")]
async fn int_or_string_fields_as_kube_publishes_them() {
    let knobs = tempfile::tempdir().expect("tempdir");
    std::fs::write(knobs.path().join("knobs.yaml"), KNOBS).expect("write");
    let knobs_dir = knobs.path().to_path_buf();
    let s = common::start_with(|c| {
        c.crds.push(common::repo_path("tests/fixtures/realworld"));
        c.crds.push(knobs_dir);
    })
    .await;

    // v3: anyOf [integer, string] beside the extension, added where the CRD
    // leaves it out, kept where it spells it out.
    let v3 = s.get("/openapi/v3/apis/openapi.kshard.dev/v1").await.json();
    let spec = &v3["components"]["schemas"]["dev.kshard.openapi.v1.Knob"]["properties"]["spec"]
        ["properties"];
    assert_eq!(
        spec["port"],
        json!({"x-kubernetes-int-or-string": true, "description": "A port by number or name.", "anyOf": int_or_string()})
    );
    assert_eq!(spec["surge"]["anyOf"], int_or_string());
    assert_eq!(spec["surge"]["pattern"], "^[0-9]+%?$");
    assert_eq!(spec["ports"]["items"]["anyOf"], int_or_string());
    assert_eq!(spec["ports"]["items"]["x-kubernetes-int-or-string"], true);

    let v3 = s
        .get("/openapi/v3/apis/monitoring.coreos.com/v1")
        .await
        .json();
    let target_port = &v3["components"]["schemas"]["com.coreos.monitoring.v1.ServiceMonitor"]
        ["properties"]["spec"]["properties"]["endpoints"]["items"]["properties"]["targetPort"];
    assert_eq!(target_port["anyOf"], int_or_string());
    assert_eq!(target_port["x-kubernetes-int-or-string"], true);
    assert!(target_port.get("allOf").is_none());

    // v2: no junctors, so the extension alone says int-or-string.
    let v2 = s.get("/openapi/v2").await.json();
    let spec = &v2["definitions"]["dev.kshard.openapi.v1.Knob"]["properties"]["spec"]["properties"];
    assert_eq!(
        spec["port"],
        json!({"x-kubernetes-int-or-string": true, "description": "A port by number or name."})
    );
    assert_eq!(
        spec["surge"],
        json!({"x-kubernetes-int-or-string": true, "pattern": "^[0-9]+%?$"})
    );
    let target_port = &v2["definitions"]["com.coreos.monitoring.v1.ServiceMonitor"]["properties"]
        ["spec"]["properties"]["endpoints"]["items"]["properties"]["targetPort"];
    assert!(target_port.get("anyOf").is_none(), "{target_port}");
    assert_eq!(target_port["x-kubernetes-int-or-string"], true);
    assert!(!serde_json::to_string(&v2)
        .expect("json")
        .contains("\"anyOf\""));

    // And in the protobuf form: the extension as YAML, no type.
    let r = s.raw("GET", "/openapi/v2", &[("accept", PB)], vec![]).await;
    let pb = decode(&r);
    let knob = pb
        .definitions
        .as_ref()
        .and_then(|d| {
            d.additional_properties
                .iter()
                .find(|d| d.name == "dev.kshard.openapi.v1.Knob")
        })
        .and_then(|d| d.value.clone())
        .expect("Knob");
    let prop = |s: &openapi_proto::Schema, name: &str| {
        s.properties
            .as_ref()
            .and_then(|p| p.additional_properties.iter().find(|p| p.name == name))
            .and_then(|p| p.value.clone())
            .expect("property")
    };
    let port = prop(&prop(&knob, "spec"), "port");
    assert!(port.r#type.is_none());
    assert_eq!(port.description, "A port by number or name.");
    assert_eq!(port.vendor_extension.len(), 1);
    assert_eq!(port.vendor_extension[0].name, "x-kubernetes-int-or-string");
    assert_eq!(
        port.vendor_extension[0]
            .value
            .as_ref()
            .map(|a| a.yaml.as_str()),
        Some("true\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_explain_reads_openapi_v2_protobuf() {
    let s = common::start().await;
    // plaintext-openapiv2 makes kubectl fetch /openapi/v2 as protobuf.
    let out = s.kubectl(&[
        "explain",
        "things.spec",
        "--output",
        "plaintext-openapiv2",
        "-v=8",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("KIND:") && stdout.contains("Thing"),
        "{stdout}"
    );
    for field in ["id", "replicas", "ports", "tags"] {
        assert!(stdout.contains(field), "{field}: {stdout}");
    }
    assert!(stderr.contains("/openapi/v2"), "{stderr}");
    assert!(
        stderr.contains("com.github.proto-openapi.spec.v2"),
        "{stderr}"
    );
    assert!(stderr.contains("200 OK"), "{stderr}");

    let out = s.kubectl_ok(&["explain", "widgets", "--output", "plaintext-openapiv2"]);
    assert!(out.contains("Widget") && out.contains("metadata"), "{out}");
}

/// The reference kube-apiserver's `/openapi/v2` as JSON and as gnostic's
/// protobuf, in one ETag's version.
async fn reference_documents(c: &kube::Client) -> (Vec<u8>, Vec<u8>) {
    let get = |accept: &'static str| async move {
        let req = http::Request::get("/openapi/v2")
            .header("accept", accept)
            .body(kube::client::Body::from(Vec::new()))
            .expect("request");
        let resp = c.send(req).await.expect("send");
        assert_eq!(resp.status().as_u16(), 200, "{accept}");
        resp.into_body()
            .collect_bytes()
            .await
            .expect("body")
            .to_vec()
    };
    (get("application/json").await, get(PB_NEW).await)
}

/// Rust's `{:?}` escapes of a string, undone.
fn unescape_debug(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('0') => out.push('\0'),
            Some('u') => {
                let hex: String = chars.by_ref().skip(1).take_while(|c| *c != '}').collect();
                let code = u32::from_str_radix(&hex, 16).expect("escape");
                out.push(char::from_u32(code).expect("char"));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// A document's fields one per line, each `Any`'s YAML text as the value it
/// reads as.
fn with_yaml_read(doc: &Document) -> Vec<String> {
    format!("{doc:#?}")
        .lines()
        .map(|line| {
            let text = line
                .trim_start()
                .strip_prefix("yaml: \"")
                .and_then(|t| t.strip_suffix("\","));
            match text {
                Some(escaped) => {
                    let v: Value = serde_saphyr::from_str(&unescape_debug(escaped)).expect("YAML");
                    format!("yaml: {v}")
                }
                None => line.to_string(),
            }
        })
        .collect()
}

/// gnostic's messages as kshard builds them, against the real thing: the
/// reference kube-apiserver's own OpenAPI v2 JSON (every keyword kube's
/// built-in types use), converted by kshard, is the protobuf the reference
/// server answers for it, field for field. Values carried as YAML text are
/// compared as values: Go's yaml.v3 single-quotes a few strings that
/// serde-saphyr double-quotes (`'*'` and `"*"`), a difference kshard has.
#[tokio::test(flavor = "multi_thread")]
async fn the_reference_servers_document_converts_to_its_own_protobuf() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = common::real_host::RealHost::start(dir.path());
    let client = host.client().await;
    let (json, pb) = reference_documents(&client).await;
    let doc: Value = serde_json::from_slice(&json).expect("json");
    let theirs = Document::decode(pb.as_slice()).expect("an openapi.v2.Document");
    let defs = |d: &Document| {
        d.definitions
            .as_ref()
            .map_or(0, |d| d.additional_properties.len())
    };
    assert!(
        defs(&theirs) > 500,
        "the reference document: {}",
        defs(&theirs)
    );
    let (ours, theirs) = (
        with_yaml_read(&openapi_proto::from_json(&doc)),
        with_yaml_read(&theirs),
    );
    if let Some(i) = (0..ours.len().max(theirs.len())).find(|&i| ours.get(i) != theirs.get(i)) {
        let around = |d: &[String]| d[i.saturating_sub(20)..(i + 5).min(d.len())].join("\n");
        panic!(
            "line {i} differs\n--- kshard:\n{}\n--- kube-apiserver:\n{}",
            around(&ours),
            around(&theirs)
        );
    }
}
