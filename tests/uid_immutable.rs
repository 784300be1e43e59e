//! `metadata.uid` cannot be changed, by any write: what the reference
//! kube-apiserver (v1.36.2, with the same CRD) answers to a JSON patch, a
//! merge patch, a server-side apply and a PUT that carry another uid, and
//! kshard must answer the same (status, reason, message, details).

mod common;

use common::real_host::RealHost;
use common::WIDGETS;
use serde_json::{json, Value};

/// A raw request through a kube client: the status and the body.
async fn send(
    c: &kube::Client,
    method: &str,
    uri: &str,
    ctype: &str,
    body: &Value,
) -> (u16, Value) {
    // (JSON is YAML: an apply body as JSON too.)
    let body = serde_json::to_vec(body).expect("json");
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ctype)
        .body(kube::client::Body::from(body))
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// What one server answers to each uid-changing write of `w1` (its own
/// uid, which differs between servers, replaced by `<uid>`).
async fn answers(c: &kube::Client) -> Vec<(String, u16, Value)> {
    let w1 = format!("{WIDGETS}/w1");
    let (code, created) = send(
        c,
        "POST",
        WIDGETS,
        "application/json",
        &common::widget("w1", 1),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let uid = created["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut put = created.clone();
    put["metadata"]["uid"] = json!("not-the-uid");
    let apply = json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": "w1", "uid": "not-the-uid"}, "spec": {"replicas": 1}});
    let cases: Vec<(&str, &str, String, Value)> = vec![
        (
            "merge patch",
            "PATCH",
            w1.clone(),
            json!({"metadata": {"uid": "not-the-uid"}}),
        ),
        (
            "json patch",
            "PATCH",
            w1.clone(),
            json!([{"op": "replace", "path": "/metadata/uid", "value": "not-the-uid"}]),
        ),
        (
            "apply",
            "PATCH",
            format!("{w1}?fieldManager=t&force=true"),
            apply,
        ),
        ("put", "PUT", w1.clone(), put),
    ];
    let mut out = Vec::new();
    for (what, method, uri, body) in cases {
        let ctype = match what {
            "merge patch" => "application/merge-patch+json",
            "json patch" => "application/json-patch+json",
            "apply" => "application/apply-patch+yaml",
            _ => "application/json",
        };
        let (code, mut answer) = send(c, method, &uri, ctype, &body).await;
        if code < 300 {
            // Only whether the uid stayed matters of a success.
            answer = json!({"uid kept": answer["metadata"]["uid"] == json!(uid)});
        }
        let text = answer.to_string().replace(&uid, "<uid>");
        out.push((
            what.to_string(),
            code,
            serde_json::from_str(&text).expect("json"),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_uid_is_refused_as_kube_refuses_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let crd = common::repo_path("crds/examples/widgets.yaml");
    host.kubectl_ok(&["apply", "-f", &crd.display().to_string()]);
    host.wait_crds_served();
    let kube = answers(&host.client().await).await;
    let s = common::start().await;
    let ours = answers(&s.client).await;
    for (k, o) in kube.iter().zip(&ours) {
        eprintln!(
            "{}: kube {} {}\n{}: kshard {} {}",
            k.0, k.1, k.2, o.0, o.1, o.2
        );
    }
    assert_eq!(ours, kube);
}
