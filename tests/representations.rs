//! Representations and limits: gzip, request/object size limits, strict
//! decoding of duplicate fields, metadata-only clients, kubectl explain and
//! real-world CRDs (PolicyReport, ServiceMonitor).

mod common;

use std::io::Read;

use common::WIDGETS;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use serde_json::json;

async fn with_realworld() -> common::TestServer {
    common::start_with(|c| c.crds.push(common::repo_path("tests/fixtures/realworld"))).await
}

#[tokio::test(flavor = "multi_thread")]
async fn large_lists_are_gzipped_small_ones_are_not() {
    let s = common::start().await;
    common::apf::fill(&s, 200).await;
    let r = s
        .raw("GET", WIDGETS, &[("accept-encoding", "gzip")], vec![])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers
            .get("content-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("gzip")
    );
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_end(&mut plain)
        .expect("gunzip");
    assert!(plain.len() > 128 * 1024);
    let list: serde_json::Value = serde_json::from_slice(&plain).expect("json");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(200));
    // One object is far below 128 KiB: sent as is.
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}/big00001"),
            &[("accept-encoding", "gzip")],
            vec![],
        )
        .await;
    assert!(r.headers.get("content-encoding").is_none());
    // Without Accept-Encoding nothing is compressed.
    let r = s.get(WIDGETS).await;
    assert!(r.headers.get("content-encoding").is_none());
    assert_eq!(r.json()["items"].as_array().map(Vec::len), Some(200));
}

#[tokio::test(flavor = "multi_thread")]
async fn size_limits_and_hostile_json() {
    let s = common::start().await;
    let mut huge = common::widget("huge", 1);
    huge["spec"]["blob"] = json!("x".repeat(3 * 1024 * 1024 + 10));
    let r = s.post_json(WIDGETS, &huge).await;
    assert_eq!(r.status, 413);
    let mut big = common::widget("big", 1);
    big["spec"]["blob"] = json!("x".repeat(2 * 1024 * 1024));
    let r = s.post_json(WIDGETS, &big).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("may not be more than 1572864 bytes"));
    assert_eq!(
        s.get(&format!("{WIDGETS}/big")).await.status,
        404,
        "nothing stored"
    );
    let deep = format!("{{\"apiVersion\":\"demo.kshard.dev/v1\",\"kind\":\"Widget\",\"metadata\":{{\"name\":\"d\"}},\"spec\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/json")],
            deep.into_bytes(),
        )
        .await;
    assert_eq!(r.status, 400);
    // The server is still fine.
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("fine", 1))
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicate_fields_follow_field_validation() {
    let s = common::start().await;
    let body = br#"{"apiVersion":"demo.kshard.dev/v1","kind":"Widget","metadata":{"name":"dup"},"spec":{"replicas":1,"replicas":2}}"#;
    let r = s
        .raw(
            "POST",
            &format!("{WIDGETS}?fieldValidation=Strict"),
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: duplicate field \"spec.replicas\""
    );
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await;
    assert_eq!(r.status, 201);
    let warnings: Vec<&str> = r
        .headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(
        warnings,
        ["299 - \"duplicate field \\\"spec.replicas\\\"\""]
    );
    assert_eq!(
        r.json()["spec"]["replicas"],
        2,
        "the last value wins, as in kube"
    );
    let r = s
        .raw(
            "POST",
            &format!("{WIDGETS}?fieldValidation=Bogus"),
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await;
    // kube validates the options object: 422 naming CreateOptions.
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["details"]["kind"], "CreateOptions");
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_only_clients() {
    let s = common::start().await;
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    let api: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let mut w = common::widget("m1", 1);
    w["metadata"]["labels"] = json!({"app": "m"});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(w).expect("obj"),
    )
    .await
    .expect("create");
    let meta = api.get_metadata("m1").await.expect("get_metadata");
    assert_eq!(
        meta.metadata
            .labels
            .unwrap_or_default()
            .get("app")
            .map(String::as_str),
        Some("m")
    );
    let list = api
        .list_metadata(&ListParams::default())
        .await
        .expect("list_metadata");
    assert_eq!(list.items.len(), 1);
    // A metadata watcher sees the objects and new ones.
    let meta_api: Api<PartialObjectMeta<DynamicObject>> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let mut stream = watcher(meta_api, watcher::Config::default()).boxed();
    let mut seen = Vec::new();
    api.create(
        &PostParams::default(),
        &serde_json::from_value(common::widget("m2", 1)).expect("obj"),
    )
    .await
    .expect("create");
    while !seen.contains(&"m2".to_string()) {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(5), stream.try_next())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open");
        match ev {
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                seen.push(o.metadata.name.unwrap_or_default())
            }
            _ => {}
        }
    }
    assert!(seen.contains(&"m1".to_string()));
    // Only a form the server cannot serve (a Table has no protobuf message): 406.
    let r = s
        .raw(
            "GET",
            WIDGETS,
            &[("accept", "application/json;as=Table;g=meta.k8s.io;v=v2")],
            vec![],
        )
        .await;
    assert_eq!(r.status, 406);
    assert_eq!(r.json()["reason"], "NotAcceptable");
    // The legacy /watch/ prefix streams too.
    let req = http::Request::get(
        "/apis/demo.kshard.dev/v1/watch/namespaces/default/widgets?timeoutSeconds=1",
    )
    .body(kube::client::Body::empty())
    .expect("req");
    let resp = s.client.send(req).await.expect("legacy watch");
    let body = resp.into_body().collect_bytes().await.expect("body");
    let frames: Vec<serde_json::Value> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("frame"))
        .collect();
    assert_eq!(frames.len(), 2);
    assert!(frames.iter().all(|f| f["type"] == "ADDED"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_explain_recursive_and_real_world_crds() {
    let s = with_realworld().await;
    let out = s.kubectl_ok(&["explain", "widgets", "--recursive"]);
    assert!(
        out.contains("KIND:") && out.contains("Widget") && out.contains("replicas"),
        "{out}"
    );
    let out = s.kubectl_ok(&["explain", "policyreports.results.result"]);
    assert!(
        out.contains("Result indicates the outcome of the policy rule execution"),
        "{out}"
    );
    assert!(out.contains("\"pass\"") || out.contains("pass"), "{out}");

    // PolicyReport: printer columns (priority ones only with -o wide), enums enforced.
    let report = "apiVersion: reports.x-k8s.io/v1beta2\nkind: PolicyReport\nmetadata:\n  name: r1\nscope:\n  kind: Pod\n  name: web\nsummary:\n  pass: 3\n  fail: 1\nresults:\n- policy: require-labels\n  result: fail\n  severity: high\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], report);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = s.kubectl_ok(&["get", "polr"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "PASS", "FAIL", "WARN", "ERROR", "SKIP", "AGE"]
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .expect("row")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..3], ["r1", "3", "1"]);
    let wide = s.kubectl_ok(&["get", "polr", "-o", "wide"]);
    assert!(wide.lines().next().unwrap_or("").contains("KIND"), "{wide}");
    let bad = report
        .replace("result: fail", "result: maybe")
        .replace("name: r1", "name: r2");
    let out = s.kubectl_stdin(&["create", "-f", "-"], &bad);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("results[0].result: Unsupported value: \"maybe\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // ServiceMonitor: patterns and list-maps of a large real schema.
    let sm = "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: web\nspec:\n  selector:\n    matchLabels: {app: web}\n  endpoints:\n  - port: http\n    interval: 30s\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], sm);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = sm
        .replace("interval: 30s", "interval: soon")
        .replace("name: web", "name: web2");
    let out = s.kubectl_stdin(&["create", "-f", "-"], &bad);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.endpoints[0].interval: Invalid value: \"soon\": spec.endpoints[0].interval in body should match"), "{}", String::from_utf8_lossy(&out.stderr));
}
