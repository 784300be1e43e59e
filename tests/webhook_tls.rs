//! Webhook TLS as Go's crypto/x509 does it, checked against the real
//! kube-apiserver: the same webhook server and the same configuration are
//! given to both (kube guards ConfigMaps with it, kshard its Widgets), and
//! both must call it, or fail to, with the same words.

mod common;

use std::time::Duration;

use common::real_host::RealHost;
use common::webhook::{Reply, WebhookServer};
use serde_json::{json, Value};

const HOOK: &str = "tls.test.kshard.dev";

fn configuration(group: &str, resource: &str, url: &str, ca_pem: &str) -> Value {
    use base64::Engine as _;
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "tls-check"},
        "webhooks": [{
            "name": HOOK,
            "clientConfig": {
                "url": url,
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{"operations": ["CREATE"], "apiGroups": [group],
                       "apiVersions": ["v1"], "resources": [resource]}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    })
}

async fn post(c: &kube::Client, uri: &str, body: &Value) -> (u16, Value) {
    let req = http::Request::post(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(body).expect("json"),
        ))
        .expect("request");
    let resp = c.send(req).await.expect("send");
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

struct Sides {
    host: RealHost,
    kube: kube::Client,
    kshard: common::TestServer,
    n: std::sync::atomic::AtomicUsize,
}

impl Sides {
    /// Installs the configuration on both sides, waits until each has it in
    /// force (`in_force` holds for a dry-run create's answer, given the kind
    /// created), and returns each side's answer to one real create.
    async fn create_on_both(
        &self,
        url: &str,
        ca_pem: &str,
        in_force: impl Fn(&str, u16, &Value) -> bool,
    ) -> ((u16, Value), (u16, Value)) {
        self.host
            .apply(&[configuration("", "configmaps", url, ca_pem)]);
        // Server-side: kshard serves these kinds as custom resources, which
        // take no strategic merge patch (kubectl's client-side apply).
        let out = self.kshard.kubectl_stdin(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            &configuration("demo.kshard.dev", "widgets", url, ca_pem).to_string(),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let i = self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let config_map =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}});
        let mut widget = common::widget(&format!("w{i}"), 1);
        widget["metadata"]["namespace"] = json!("default");
        let config_maps = "/api/v1/namespaces/default/configmaps";
        // Both servers pick the configuration up asynchronously; a dry run
        // calls the webhook (sideEffects: None) and stores nothing.
        for (client, uri, body, kind) in [
            (&self.kube, config_maps, &config_map, "ConfigMap"),
            (&self.kshard.client, common::WIDGETS, &widget, "Widget"),
        ] {
            let dry_run = format!("{uri}?dryRun=All");
            common::until(
                &format!("the configuration for {url} in force for {kind}s"),
                Duration::from_secs(20),
                || async {
                    let (code, answer) = post(client, &dry_run, body).await;
                    in_force(kind, code, &answer).then_some(())
                },
            )
            .await;
        }
        let kube = post(&self.kube, config_maps, &config_map).await;
        let ours = post(&self.kshard.client, common::WIDGETS, &widget).await;
        (kube, ours)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_certificates_are_trusted_and_refused_as_kube_apiserver_does() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kube = host.client().await;
    let kshard = common::start().await;
    let sides = Sides {
        host,
        kube,
        kshard,
        n: Default::default(),
    };
    let (hooks, own_cert) =
        WebhookServer::start_self_signed(&["hooks.test.svc", "127.0.0.1"]).await;
    hooks.handle("/validate", Reply::allow);
    let port = hooks.addr.port();

    // A self-signed CA:TRUE certificate as its own caBundle: Go trusts it.
    let url = format!("https://127.0.0.1:{port}/validate");
    let reviewed = |kind: &str| {
        hooks
            .received("/validate")
            .iter()
            .any(|r| r.review["request"]["kind"]["kind"] == kind)
    };
    let ((kc, kb), (oc, ob)) = sides
        .create_on_both(&url, &own_cert, |kind, code, _| {
            code == 201 && reviewed(kind)
        })
        .await;
    assert_eq!(kc, 201, "kube: {kb}");
    assert_eq!(oc, 201, "kshard refused what kube accepts: {ob}");
    let received = hooks.received("/validate");
    let kinds: Vec<&str> = received
        .iter()
        .filter_map(|r| r.review["request"]["kind"]["kind"].as_str())
        .collect();
    assert!(
        kinds.contains(&"ConfigMap") && kinds.contains(&"Widget"),
        "{kinds:?}"
    );

    // A name the certificate does not carry, and a bundle that does not
    // hold the certificate: both refuse with the same words.
    let wrong_name = format!("https://localhost:{port}/validate");
    let stranger = common::tls::Ca::new("stranger").pem;
    for (what, url, ca) in [
        (
            "a name the certificate lacks",
            wrong_name.as_str(),
            own_cert.as_str(),
        ),
        ("an unknown authority", url.as_str(), stranger.as_str()),
    ] {
        // In force once the refusal names this configuration's URL.
        let ((kc, kb), (oc, ob)) = sides
            .create_on_both(url, ca, |_, code, answer| {
                code == 500 && answer["message"].as_str().is_some_and(|m| m.contains(url))
            })
            .await;
        assert_eq!(kc, 500, "{what}: kube {kb}");
        assert_eq!(
            (oc, &ob["reason"], &ob["message"]),
            (kc, &kb["reason"], &kb["message"]),
            "{what}: kshard's answer differs from kube's"
        );
    }
}
