//! Admission webhooks through the real server: a real HTTPS webhook server
//! (`common::webhook`, rustls with a test CA given as `caBundle`), the
//! configurations served by kshard itself (applied with kubectl too), and
//! every answer compared with kube-apiserver's. Configurations a real host
//! holds are tested behind it (`tests/real_host.rs`,
//! `host_admission_policies_and_webhooks_are_enforced_by_kshard`).

mod common;

use std::time::{Duration, Instant};

use common::until;
use common::webhook::{Reply, WebhookServer};
use common::{TestServer, WIDGETS};
use serde_json::{json, Value};

const MUTATING: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VALIDATING: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
/// How long a test waits for a condition on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

async fn setup() -> (WebhookServer, TestServer) {
    let hooks = WebhookServer::start().await;
    let resolve = hooks.resolve();
    let kshard = common::start_with(move |c| c.admission_webhook_resolve = resolve).await;
    (hooks, kshard)
}

/// A widget the test webhooks deny for its color.
fn red_widget(name: &str) -> Value {
    let mut w = common::widget(name, 1);
    w["spec"]["color"] = json!("red");
    w
}

/// Creates a configuration (`MUTATING` or `VALIDATING`) through the API.
async fn configure(s: &TestServer, collection: &str, name: &str, webhooks: Vec<Value>) {
    let kind = if collection == MUTATING {
        "MutatingWebhookConfiguration"
    } else {
        "ValidatingWebhookConfiguration"
    };
    let r = s
        .post_json(
            collection,
            &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                    "metadata": {"name": name}, "webhooks": webhooks}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Waits until `path` of the webhook server is called: dry-run creates of a
/// probe widget until a review arrives (the configuration is followed
/// through a watch, so this takes milliseconds on an idle machine).
async fn wait_called(s: &TestServer, hooks: &WebhookServer, path: &str) {
    let before = hooks.received(path).len();
    until(&format!("{path} to be called"), PATIENCE, || async {
        s.post_json(
            &format!("{WIDGETS}?dryRun=All"),
            &common::widget("probe", 1),
        )
        .await;
        (hooks.received(path).len() > before).then_some(())
    })
    .await;
    hooks.take(path);
}

fn request_of(r: &common::webhook::Received) -> &Value {
    &r.review["request"]
}

/// Every write kind reaches a validating webhook as kube sends it: the
/// review's kinds, resources, subresource, name, namespace, operation, user,
/// objects, dry run and options.
#[tokio::test(flavor = "multi_thread")]
async fn a_validating_webhook_sees_every_write_as_kube_sends_it() {
    let (hooks, s) = setup().await;
    hooks.handle("/validate", Reply::allow);
    configure(
        &s,
        VALIDATING,
        "checks",
        vec![hooks.webhook("check.kshard.dev", "/validate")],
    )
    .await;
    wait_called(&s, &hooks, "/validate").await;

    let r = s
        .post_json(
            &format!("{WIDGETS}?fieldManager=tester"),
            &common::widget("w1", 1),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let got = hooks.take("/validate");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].query, "timeout=10s");
    let review = &got[0].review;
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["kind"], "AdmissionReview");
    let req = &review["request"];
    assert!(req["uid"].as_str().is_some_and(|u| u.len() == 36), "{req}");
    let widget_kind = json!({"group": "demo.kshard.dev", "version": "v1", "kind": "Widget"});
    let widgets = json!({"group": "demo.kshard.dev", "version": "v1", "resource": "widgets"});
    assert_eq!(req["kind"], widget_kind);
    assert_eq!(req["resource"], widgets);
    assert_eq!(req["requestKind"], widget_kind);
    assert_eq!(req["requestResource"], widgets);
    assert!(req.get("subResource").is_none());
    assert_eq!(req["name"], "w1");
    assert_eq!(req["namespace"], "default");
    assert_eq!(req["operation"], "CREATE");
    assert_eq!(req["userInfo"]["username"], "kshard-admin");
    assert!(req["userInfo"]["groups"]
        .as_array()
        .is_some_and(|g| g.contains(&json!("system:masters"))));
    // Validating admission sees the object about to be stored.
    assert_eq!(req["object"]["metadata"]["name"], "w1");
    assert!(req["object"]["metadata"]["uid"].is_string());
    assert_eq!(req["object"]["metadata"]["generation"], 1);
    assert_eq!(req["oldObject"], Value::Null);
    assert_eq!(req["dryRun"], false);
    assert_eq!(
        req["options"],
        json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "tester"})
    );
    // The fields kube's AdmissionRequest has for a create, no more (their
    // order in the JSON is not part of its meaning).
    let mut keys: Vec<&str> = req
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    let mut expected = [
        "uid",
        "kind",
        "resource",
        "requestKind",
        "requestResource",
        "name",
        "namespace",
        "operation",
        "userInfo",
        "object",
        "oldObject",
        "dryRun",
        "options",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);

    // The status subresource: UPDATE of widgets/status with the old object.
    let mut stored = r.json();
    stored["status"] = json!({"replicas": 1});
    let r = s.put_json(&format!("{WIDGETS}/w1/status"), &stored).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = hooks.take("/validate");
    let req = request_of(&got[0]);
    assert_eq!(
        (req["operation"].as_str(), req["subResource"].as_str()),
        (Some("UPDATE"), Some("status"))
    );
    assert_eq!(req["requestSubResource"], "status");
    assert_eq!(req["object"]["status"]["replicas"], 1);
    assert_eq!(req["oldObject"]["status"], Value::Null);
    assert_eq!(req["options"]["kind"], "UpdateOptions");

    // The scale subresource: the webhook sees autoscaling/v1 Scale objects.
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/w1/scale"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"replicas":5}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = hooks.take("/validate");
    let req = request_of(&got[0]);
    let scale = json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
    assert_eq!(req["kind"], scale);
    assert_eq!(req["requestKind"], scale);
    assert_eq!(req["resource"], widgets);
    assert_eq!(req["subResource"], "scale");
    assert_eq!(req["object"]["kind"], "Scale");
    assert_eq!(req["object"]["spec"]["replicas"], 5);
    assert_eq!(req["oldObject"]["spec"]["replicas"], 1);
    // A patch is admitted with UpdateOptions (kube's patchToUpdateOptions).
    assert_eq!(req["options"]["kind"], "UpdateOptions");

    // A dry-run delete: object null, the stored object as oldObject, DeleteOptions.
    let r = s
        .raw(
            "DELETE",
            &format!("{WIDGETS}/w1?dryRun=All"),
            &[("content-type", "application/json")],
            br#"{"propagationPolicy":"Background"}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = hooks.take("/validate");
    let req = request_of(&got[0]);
    assert_eq!(req["operation"], "DELETE");
    assert_eq!(req["object"], Value::Null);
    assert_eq!(req["oldObject"]["metadata"]["name"], "w1");
    assert_eq!(req["dryRun"], true);
    assert_eq!(
        req["options"],
        json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1", "propagationPolicy": "Background", "dryRun": ["All"]})
    );
    assert_eq!(s.get(&format!("{WIDGETS}/w1")).await.status, 200);
}

/// A denial is kube's answer: the webhook's code and reason, its message
/// after `admission webhook "<name>" denied the request: `; nothing stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_denial_is_answered_as_kube_answers_it() {
    let (hooks, s) = setup().await;
    hooks.handle("/deny-red", |review: &Value| {
        if review["request"]["object"]["spec"]["color"] == "red" {
            Reply::deny(
                review,
                json!({"code": 403, "reason": "Forbidden", "message": "red widgets are not allowed"}),
            )
        } else {
            Reply::allow(review)
        }
    });
    // A mutating webhook that refuses without saying why.
    hooks.handle("/deny-silently", |review: &Value| {
        if review["request"]["object"]["metadata"]["labels"]["refuse"] == "yes" {
            Reply::answer(review, json!({"allowed": false}))
        } else {
            Reply::allow(review)
        }
    });
    configure(
        &s,
        VALIDATING,
        "colors",
        vec![hooks.webhook("deny.kshard.dev", "/deny-red")],
    )
    .await;
    configure(
        &s,
        MUTATING,
        "silent",
        vec![hooks.webhook("silent.kshard.dev", "/deny-silently")],
    )
    .await;
    wait_called(&s, &hooks, "/deny-red").await;
    wait_called(&s, &hooks, "/deny-silently").await;

    let r = s.post_json(WIDGETS, &red_widget("red")).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.text(),
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"admission webhook \"deny.kshard.dev\" denied the request: red widgets are not allowed","reason":"Forbidden","code":403}
"#
    );
    assert_eq!(s.get(&format!("{WIDGETS}/red")).await.status, 404);

    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        &serde_json::to_string(&red_widget("red2")).expect("json"),
    );
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        r#"Error from server (Forbidden): error when creating "STDIN": admission webhook "deny.kshard.dev" denied the request: red widgets are not allowed"#
    );

    let mut refused = common::widget("refused", 1);
    refused["metadata"]["labels"] = json!({"refuse": "yes"});
    let r = s.post_json(WIDGETS, &refused).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "admission webhook \"silent.kshard.dev\" denied the request without explanation",
               "code": 400})
    );
    // An update is denied the same way, and the stored object stays.
    let r = s.post_json(WIDGETS, &common::widget("blue", 1)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/blue"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"color":"red"}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        s.get(&format!("{WIDGETS}/blue")).await.json()["spec"]["color"],
        "blue"
    );
}

/// A mutating webhook's JSON patch is applied before validation and
/// stored; the validating webhook sees the patched object; managedFields
/// keep the client's fields only (kube records them before admission); an
/// `IfNeeded` webhook runs again after a later webhook changed the object.
#[tokio::test(flavor = "multi_thread")]
async fn a_mutating_patch_is_validated_and_stored() {
    let (hooks, s) = setup().await;
    hooks.handle("/first", Reply::allow);
    hooks.handle("/mutate", |review: &Value| {
        if review["request"]["object"]["metadata"]["labels"]["mutated-by"].is_string() {
            return Reply::allow(review);
        }
        Reply::patch(
            review,
            json!([
                {"op": "add", "path": "/metadata/labels", "value": {"mutated-by": "webhook"}},
                {"op": "replace", "path": "/spec/color", "value": "green"},
            ]),
        )
        .with_warnings(&["color set to green"])
    });
    hooks.handle("/validate", Reply::allow);
    let mut first = hooks.webhook("a-first.kshard.dev", "/first");
    first["reinvocationPolicy"] = json!("IfNeeded");
    configure(
        &s,
        MUTATING,
        "paint",
        vec![first, hooks.webhook("paint.kshard.dev", "/mutate")],
    )
    .await;
    configure(
        &s,
        VALIDATING,
        "checks",
        vec![hooks.webhook("check.kshard.dev", "/validate")],
    )
    .await;
    wait_called(&s, &hooks, "/mutate").await;
    wait_called(&s, &hooks, "/validate").await;
    // The probes of the second wait went through the mutating webhooks too.
    for path in ["/first", "/mutate"] {
        hooks.take(path);
    }

    let r = s
        .post_json(
            &format!("{WIDGETS}?fieldManager=tester"),
            &common::widget("w", 1),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let created = r.json();
    assert_eq!(
        created["metadata"]["labels"],
        json!({"mutated-by": "webhook"})
    );
    assert_eq!(created["spec"]["color"], "green");
    assert_eq!(
        r.headers
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap_or(""))
            .collect::<Vec<_>>(),
        [r#"299 - "color set to green""#]
    );
    let stored = s.get(&format!("{WIDGETS}/w")).await.json();
    assert_eq!(stored["metadata"]["labels"]["mutated-by"], "webhook");
    assert_eq!(stored["spec"]["color"], "green");
    // The mutating webhook saw the object before system fields were set.
    let mutated = hooks.take("/mutate");
    assert_eq!(mutated.len(), 1);
    assert!(request_of(&mutated[0])["object"]["metadata"]["uid"].is_null());
    // The validating webhook saw it after the patch.
    let validated = hooks.take("/validate");
    assert_eq!(
        request_of(&validated[0])["object"]["spec"]["color"],
        "green"
    );
    // Called first, then again after the later webhook changed the object.
    let firsts = hooks.take("/first");
    assert_eq!(firsts.len(), 2);
    assert!(request_of(&firsts[0])["object"]["metadata"]["labels"].is_null());
    assert_eq!(
        request_of(&firsts[1])["object"]["metadata"]["labels"]["mutated-by"],
        "webhook"
    );
    // Only the client's manager, owning what the client sent.
    let managed = stored["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(managed.len(), 1, "{stored}");
    assert_eq!(managed[0]["manager"], "tester");
    let fields = &managed[0]["fieldsV1"];
    assert!(fields["f:spec"]["f:color"].is_object(), "{fields}");
    assert!(fields["f:metadata"].is_null(), "{fields}");

    // An update is mutated too (no new patch: the label is there).
    let mut update = stored.clone();
    update["spec"]["replicas"] = json!(3);
    let r = s.put_json(&format!("{WIDGETS}/w"), &update).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let req = request_of(&hooks.take("/mutate")[0]).clone();
    assert_eq!(req["operation"], "UPDATE");
    assert_eq!(req["oldObject"]["spec"]["replicas"], 1);
    assert_eq!(req["object"]["spec"]["replicas"], 3);
}

/// A webhook that does not answer within `timeoutSeconds` fails the request
/// with kube's message under failurePolicy Fail, and is skipped under Ignore.
#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_times_out_fails_or_is_ignored_by_policy() {
    let (hooks, s) = setup().await;
    hooks.handle("/slow", Reply::allow);
    let mut slow = hooks.webhook("slow.kshard.dev", "/slow");
    slow["timeoutSeconds"] = json!(1);
    configure(&s, VALIDATING, "slow", vec![slow]).await;
    wait_called(&s, &hooks, "/slow").await;
    hooks.handle("/slow", |review: &Value| {
        Reply::allow(review).after(Duration::from_secs(5))
    });

    let started = Instant::now();
    let r = s.post_json(WIDGETS, &common::widget("w", 1)).await;
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(r.status, 500);
    let reason = r#"failed calling webhook "slow.kshard.dev": failed to call webhook: Post "https://hooks.test.svc:443/slow?timeout=1s": context deadline exceeded"#;
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("Internal error occurred: {reason}"),
               "reason": "InternalError",
               "details": {"causes": [{"message": reason}]}, "code": 500})
    );
    assert_eq!(s.get(&format!("{WIDGETS}/w")).await.status, 404);

    // failurePolicy Ignore: the same webhook no longer holds the request up.
    let r = s
        .raw(
            "PATCH",
            &format!("{VALIDATING}/slow"),
            &[("content-type", "application/json-patch+json")],
            br#"[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = until("failurePolicy Ignore to take effect", PATIENCE, || async {
        let r = s.post_json(WIDGETS, &common::widget("w", 1)).await;
        (r.status != 500).then_some(r)
    })
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Dry runs call only webhooks without side effects (they see `dryRun:
/// true`); v1 configurations may only say None or NoneOnDryRun.
#[tokio::test(flavor = "multi_thread")]
async fn dry_runs_reach_webhooks_without_side_effects() {
    let (hooks, s) = setup().await;
    hooks.handle("/mutate", |review: &Value| {
        Reply::patch(
            review,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}}]),
        )
    });
    let mut hook = hooks.webhook("dry.kshard.dev", "/mutate");
    hook["sideEffects"] = json!("NoneOnDryRun");
    configure(&s, MUTATING, "dry", vec![hook]).await;
    wait_called(&s, &hooks, "/mutate").await;

    let r = s
        .post_json(&format!("{WIDGETS}?dryRun=All"), &common::widget("d", 1))
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["metadata"]["labels"]["seen"], "yes");
    let got = hooks.take("/mutate");
    assert_eq!(request_of(&got[0])["dryRun"], true);
    assert_eq!(request_of(&got[0])["options"]["dryRun"], json!(["All"]));
    assert_eq!(s.get(&format!("{WIDGETS}/d")).await.status, 404);

    let mut some = hooks.webhook("some.kshard.dev", "/mutate");
    some["sideEffects"] = json!("Some");
    let r = s
        .post_json(
            VALIDATING,
            &json!({"apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": "some"}, "webhooks": [some]}),
        )
        .await;
    assert_eq!(r.status, 422);
    // kube's cause and message, nothing more.
    let e = r.json();
    assert_eq!(
        e["message"],
        r#"ValidatingWebhookConfiguration.admissionregistration.k8s.io "some" is invalid: webhooks[0].sideEffects: Unsupported value: "Some": supported values: "None", "NoneOnDryRun""#,
        "{e}"
    );
    assert_eq!(
        e["details"]["causes"][0],
        json!({"reason": "FieldValueNotSupported", "field": "webhooks[0].sideEffects",
               "message": r#"Unsupported value: "Some": supported values: "None", "NoneOnDryRun""#})
    );
}

/// Webhook warnings reach the client as `Warning: 299` headers, which
/// kubectl prints, on success and on a denial alike.
#[tokio::test(flavor = "multi_thread")]
async fn webhook_warnings_reach_the_client() {
    let (hooks, s) = setup().await;
    hooks.handle("/warn", |review: &Value| {
        let w = ["widgets are deprecated, use gadgets"];
        if review["request"]["object"]["spec"]["color"] == "red" {
            Reply::deny(
                review,
                json!({"code": 403, "reason": "Forbidden", "message": "no red"}),
            )
            .with_warnings(&w)
        } else {
            Reply::allow(review).with_warnings(&w)
        }
    });
    configure(
        &s,
        VALIDATING,
        "warn",
        vec![hooks.webhook("warn.kshard.dev", "/warn")],
    )
    .await;
    wait_called(&s, &hooks, "/warn").await;

    let out = s.kubectl_stdin(
        &["create", "-f", "-"],
        &serde_json::to_string(&common::widget("w", 1)).expect("json"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Warning: widgets are deprecated, use gadgets"
    );
    let r = s.post_json(WIDGETS, &red_widget("red")).await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.headers.get("warning").and_then(|v| v.to_str().ok()),
        Some(r#"299 - "widgets are deprecated, use gadgets""#)
    );
}

/// `kubectl apply -f webhook.yaml` against kshard configures it at once
/// (kube's defaults filled in), and deleting the configuration stops it.
#[tokio::test(flavor = "multi_thread")]
async fn a_configuration_applied_with_kubectl_takes_effect() {
    let (hooks, s) = setup().await;
    hooks.handle("/label", |review: &Value| {
        Reply::patch(
            review,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"labeled": "true"}}]),
        )
    });
    let yaml = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: labeler
webhooks:
- name: labeler.kshard.dev
  clientConfig:
    service: {{namespace: test, name: hooks, path: /label}}
    caBundle: {}
  rules:
  - operations: [CREATE]
    apiGroups: [demo.kshard.dev]
    apiVersions: [v1]
    resources: [widgets]
  sideEffects: None
  admissionReviewVersions: [v1]
"#,
        hooks.ca_bundle()
    );
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/labeler created"
    );
    let stored = s.get(&format!("{MUTATING}/labeler")).await.json();
    let hook = &stored["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["matchPolicy"], "Equivalent");
    assert_eq!(hook["namespaceSelector"], json!({}));
    assert_eq!(hook["objectSelector"], json!({}));
    assert_eq!(hook["timeoutSeconds"], 10);
    assert_eq!(hook["reinvocationPolicy"], "Never");
    assert_eq!(hook["rules"][0]["scope"], "*");
    assert_eq!(hook["clientConfig"]["service"]["port"], 443);

    let n = std::sync::atomic::AtomicUsize::new(0);
    let next = || format!("w{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let server = &s;
    until("the applied webhook to label new widgets", PATIENCE, || {
        let (name, s) = (next(), server);
        async move {
            let out = s.kubectl_stdin(
                &["create", "-f", "-", "-o", "json"],
                &serde_json::to_string(&common::widget(&name, 1)).expect("json"),
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let created: Value = serde_json::from_slice(&out.stdout).expect("json");
            (created["metadata"]["labels"]["labeled"] == "true").then_some(())
        }
    })
    .await;

    let out = s.kubectl(&["delete", "mutatingwebhookconfiguration", "labeler"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until("the deleted webhook to stop", PATIENCE, || {
        let (name, s) = (next(), server);
        async move {
            let r = s.post_json(WIDGETS, &common::widget(&name, 1)).await;
            assert_eq!(r.status, 201, "{}", r.text());
            r.json()["metadata"]["labels"].is_null().then_some(())
        }
    })
    .await;
}

/// Match conditions, object and namespace selectors decide which requests
/// a webhook sees; a condition that fails to evaluate fails the request
/// (failurePolicy Fail) with kube's 403.
#[tokio::test(flavor = "multi_thread")]
async fn selectors_and_match_conditions_choose_requests() {
    let (hooks, s) = setup().await;
    hooks.handle("/selected", Reply::allow);
    let mut hook = hooks.webhook("selected.kshard.dev", "/selected");
    hook["objectSelector"] = json!({"matchLabels": {"watched": "yes"}});
    hook["namespaceSelector"] = json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}]});
    hook["matchConditions"] = json!([
        {"name": "not-kept", "expression": "!has(object.metadata.annotations) || !('keep' in object.metadata.annotations)"},
        {"name": "create-only", "expression": "request.operation == 'CREATE'"},
    ]);
    configure(&s, VALIDATING, "selected", vec![hook]).await;
    let watched = |name: &str| {
        let mut w = common::widget(name, 1);
        w["metadata"]["labels"] = json!({"watched": "yes"});
        w
    };
    until("the selective webhook to be called", PATIENCE, || async {
        s.post_json(&format!("{WIDGETS}?dryRun=All"), &watched("probe"))
            .await;
        (!hooks.take("/selected").is_empty()).then_some(())
    })
    .await;

    assert_eq!(s.post_json(WIDGETS, &watched("a")).await.status, 201);
    assert_eq!(hooks.take("/selected").len(), 1);
    // Not labeled, another namespace, an excluded annotation, an update: not called.
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("b", 1)).await.status,
        201
    );
    let other = "/apis/demo.kshard.dev/v1/namespaces/other/widgets";
    assert_eq!(s.post_json(other, &watched("c")).await.status, 201);
    let mut kept = watched("d");
    kept["metadata"]["annotations"] = json!({"keep": "1"});
    assert_eq!(s.post_json(WIDGETS, &kept).await.status, 201);
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/a"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"replicas":2}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(hooks.take("/selected").is_empty());

    // A condition that cannot be evaluated: 403, the webhook not called.
    let r = s
        .raw(
            "PATCH",
            &format!("{VALIDATING}/selected"),
            &[("content-type", "application/json-patch+json")],
            br#"[{"op":"replace","path":"/webhooks/0/matchConditions/1/expression","value":"object.spec.nope == 1"}]"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = until("the broken condition to take effect", PATIENCE, || async {
        let r = s
            .post_json(&format!("{WIDGETS}?dryRun=All"), &watched("e"))
            .await;
        (r.status == 403).then_some(r)
    })
    .await;
    let message = r.json()["message"].as_str().unwrap_or("").to_string();
    assert!(
        message.starts_with(r#"widgets.demo.kshard.dev "e" is forbidden: expression 'object.spec.nope == 1' resulted in error: "#),
        "{message}"
    );
    // Probes sent before the new configuration was in force reached the
    // webhook; one sent after it must not.
    hooks.take("/selected");
    let r = s
        .post_json(&format!("{WIDGETS}?dryRun=All"), &watched("e"))
        .await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(hooks.take("/selected").is_empty());
}

/// A server that audits every request at Metadata level to `<dir>/audit.log`.
async fn start_audited(hooks: &WebhookServer, dir: &std::path::Path) -> TestServer {
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  omitStages: [RequestReceived]\n",
    )
    .expect("policy");
    let (l, resolve) = (dir.join("audit.log"), hooks.resolve());
    common::start_with(move |c| {
        c.audit.audit_policy_file = Some(policy);
        c.audit.audit_log_path = Some(l);
        c.admission_webhook_resolve = resolve;
    })
    .await
}

/// The ResponseComplete audit event of the request with this audit ID.
async fn audit_event(log: &std::path::Path, r: &common::Reply) -> Value {
    let id = r
        .headers
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .expect("audit id")
        .to_string();
    until("the request's audit event", PATIENCE, || async {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete")
    })
    .await
}

/// Admission is audited as kube audits it (the mutation, the webhook's own
/// annotations, a webhook that failed open) and measured with kube's
/// metrics; a webhook may not rename the object it updates.
#[tokio::test(flavor = "multi_thread")]
async fn admission_is_audited_and_measured() {
    let dir = tempfile::tempdir().expect("tmp");
    let hooks = WebhookServer::start().await;
    let s = start_audited(&hooks, dir.path()).await;
    let log = dir.path().join("audit.log");
    hooks.handle("/paint", |review: &Value| {
        let r = &review["request"];
        if r["operation"] == "UPDATE" && r["object"]["spec"]["color"] == "rename" {
            return Reply::patch(
                review,
                json!([{"op": "replace", "path": "/metadata/name", "value": "other"}]),
            );
        }
        let mut reply = Reply::patch(
            review,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"painted": "yes"}}]),
        );
        reply.body["response"]["auditAnnotations"] = json!({"decision": "painted"});
        reply
    });
    hooks.handle("/broken", |review: &Value| {
        let mut r = Reply::allow(review);
        r.status = 500;
        r
    });
    configure(
        &s,
        MUTATING,
        "paint",
        vec![hooks.webhook("paint.kshard.dev", "/paint")],
    )
    .await;
    let mut broken = hooks.webhook("broken.kshard.dev", "/broken");
    broken["failurePolicy"] = json!("Ignore");
    configure(&s, VALIDATING, "broken", vec![broken]).await;
    wait_called(&s, &hooks, "/paint").await;
    wait_called(&s, &hooks, "/broken").await;

    let r = s.post_json(WIDGETS, &common::widget("w", 1)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let event = audit_event(&log, &r).await;
    let annotations = &event["annotations"];
    assert_eq!(
        annotations["mutation.webhook.admission.k8s.io/round_0_index_0"],
        r#"{"configuration":"paint","webhook":"paint.kshard.dev","mutated":true}"#
    );
    assert_eq!(annotations["paint.kshard.dev/decision"], "painted");
    assert_eq!(
        annotations["failed-open.validating.webhook.admission.k8s.io/round_0_index_0"],
        "broken.kshard.dev"
    );

    let metrics = s.get("/metrics").await.text();
    for line in [
        r#"apiserver_admission_webhook_fail_open_count{name="broken.kshard.dev",type="validating"}"#,
        r#"apiserver_admission_webhook_admission_duration_seconds_count{name="paint.kshard.dev",type="admit",operation="CREATE",rejected="false"}"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }

    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/w"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"color":"rename"}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        r#"Widget.demo.kshard.dev "other" is invalid: metadata.name: Invalid value: "other": field is immutable"#
    );
}

/// A ValidatingAdmissionPolicy applied with kubectl: its binding denies
/// with kube's status and message, params come from an object kshard
/// serves, a Warn/Audit binding warns and audits, missing params under
/// `parameterNotFoundAction: Deny` refuse.
#[tokio::test(flavor = "multi_thread")]
async fn a_validating_admission_policy_denies_warns_and_audits() {
    let dir = tempfile::tempdir().expect("tmp");
    let hooks = WebhookServer::start().await;
    let s = start_audited(&hooks, dir.path()).await;
    let log = dir.path().join("audit.log");
    let gadgets = "/apis/test.kshard.dev/v1/gadgets";
    let r = s
        .post_json(
            gadgets,
            &json!({"apiVersion": "test.kshard.dev/v1", "kind": "Gadget",
                    "metadata": {"name": "limits"}, "spec": {"maxReplicas": 3}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let yaml = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: replica-limit
spec:
  paramKind: {apiVersion: test.kshard.dev/v1, kind: Gadget}
  matchConstraints:
    resourceRules:
    - apiGroups: [demo.kshard.dev]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE]
      resources: [widgets]
  variables:
  - name: replicas
    expression: object.spec.replicas
  validations:
  - expression: variables.replicas <= params.spec.maxReplicas
    messageExpression: "'replicas must be at most ' + string(params.spec.maxReplicas)"
    reason: Forbidden
  auditAnnotations:
  - key: replicas
    valueExpression: string(variables.replicas)
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replica-limit-deny
spec:
  policyName: replica-limit
  validationActions: [Deny]
  paramRef: {name: limits, parameterNotFoundAction: Deny}
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: default}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replica-limit-warn
spec:
  policyName: replica-limit
  validationActions: [Warn, Audit]
  paramRef: {name: limits, parameterNotFoundAction: Allow}
  matchResources:
    namespaceSelector:
      matchLabels: {kubernetes.io/metadata.name: other}
"#;
    let out = s.kubectl_stdin(&["apply", "-f", "-"], yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = s
        .get("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/replica-limit")
        .await
        .json();
    assert_eq!(stored["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        stored["spec"]["matchConstraints"]["matchPolicy"],
        "Equivalent"
    );

    let big = |name: &str| {
        let mut w = common::widget(name, 1);
        w["spec"]["replicas"] = json!(5);
        w
    };
    let r = until("the policy to take effect", PATIENCE, || async {
        let r = s
            .post_json(&format!("{WIDGETS}?dryRun=All"), &big("big"))
            .await;
        (r.status != 201).then_some(r)
    })
    .await;
    let message = "ValidatingAdmissionPolicy 'replica-limit' with binding 'replica-limit-deny' denied request: replicas must be at most 3";
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("widgets.demo.kshard.dev \"big\" is forbidden: {message}"),
               "reason": "Forbidden",
               "details": {"name": "big", "group": "demo.kshard.dev", "kind": "widgets",
                           "causes": [{"message": message}]},
               "code": 403})
    );
    let out = s.kubectl_stdin(
        &["create", "-f", "-"],
        &serde_json::to_string(&big("big")).expect("json"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!(
            r#"Error from server (Forbidden): error when creating "STDIN": widgets.demo.kshard.dev "big" is forbidden: {message}"#
        )
    );
    let small = s.post_json(WIDGETS, &common::widget("small", 1)).await;
    assert_eq!(small.status, 201, "{}", small.text());
    let event = audit_event(&log, &small).await;
    assert_eq!(event["annotations"]["replica-limit/replicas"], "1");

    // The Warn/Audit binding: admitted, with kube's warning and annotation.
    let other = "/apis/demo.kshard.dev/v1/namespaces/other/widgets";
    // Bindings take effect one by one, as their events arrive.
    until("the Warn binding to take effect", PATIENCE, || async {
        let r = s
            .post_json(&format!("{other}?dryRun=All"), &big("big"))
            .await;
        r.headers.contains_key("warning").then_some(())
    })
    .await;
    let r = s.post_json(other, &big("big")).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.headers.get("warning").and_then(|v| v.to_str().ok()),
        Some(
            r#"299 - "Validation failed for ValidatingAdmissionPolicy 'replica-limit' with binding 'replica-limit-warn': replicas must be at most 3""#
        )
    );
    let event = audit_event(&log, &r).await;
    assert_eq!(
        event["annotations"]["validation.policy.admission.k8s.io/validation_failure"],
        r#"[{"message":"replicas must be at most 3","policy":"replica-limit","binding":"replica-limit-warn","expressionIndex":0,"validationActions":["Warn","Audit"]}]"#
    );

    // Without its params, the Deny binding refuses everything it matches.
    assert_eq!(
        s.raw("DELETE", &format!("{gadgets}/limits"), &[], vec![])
            .await
            .status,
        200
    );
    let r = until("the params to be gone", PATIENCE, || async {
        let r = s
            .post_json(&format!("{WIDGETS}?dryRun=All"), &common::widget("any", 1))
            .await;
        (r.status != 201).then_some(r)
    })
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.json()["message"],
        "widgets.demo.kshard.dev \"any\" is forbidden: ValidatingAdmissionPolicy 'replica-limit' with binding 'replica-limit-deny' denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"
    );
    // The Allow binding lets requests through without params.
    assert_eq!(s.post_json(other, &big("big2")).await.status, 201);
}

/// Match policy Equivalent: a webhook whose rules name another served
/// version of the resource is called with the object in that version.
#[tokio::test(flavor = "multi_thread")]
async fn an_equivalent_version_reaches_a_webhook_in_its_version() {
    let (hooks, s) = setup().await;
    hooks.handle("/v1-only", |review: &Value| {
        Reply::patch(review, json!([{"op": "add", "path": "/spec/seenAs", "value": review["request"]["object"]["apiVersion"]}]))
    });
    let mut hook = hooks.webhook("v1only.kshard.dev", "/v1-only");
    hook["rules"] = json!([{"operations": ["CREATE"], "apiGroups": ["test.kshard.dev"],
                            "apiVersions": ["v1"], "resources": ["gadgets"], "scope": "Cluster"}]);
    configure(&s, MUTATING, "v1only", vec![hook]).await;
    let gadget = |name: &str| {
        json!({"apiVersion": "test.kshard.dev/v1beta1", "kind": "Gadget",
                                     "metadata": {"name": name}, "spec": {}})
    };
    let beta = "/apis/test.kshard.dev/v1beta1/gadgets";
    let r = until("the webhook to be called", PATIENCE, || async {
        let r = s
            .post_json(&format!("{beta}?dryRun=All"), &gadget("probe"))
            .await;
        (!hooks.take("/v1-only").is_empty()).then_some(r)
    })
    .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_json(beta, &gadget("g")).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["apiVersion"], "test.kshard.dev/v1beta1");
    assert_eq!(r.json()["spec"]["seenAs"], "test.kshard.dev/v1");
    let got = hooks.take("/v1-only");
    let req = request_of(&got[0]);
    assert_eq!(
        req["kind"],
        json!({"group": "test.kshard.dev", "version": "v1", "kind": "Gadget"})
    );
    assert_eq!(req["resource"]["version"], "v1");
    assert_eq!(req["requestKind"]["version"], "v1beta1");
    assert_eq!(req["requestResource"]["version"], "v1beta1");
    // Exact: the same rule does not match v1beta1 requests.
    let r = s
        .raw(
            "PATCH",
            &format!("{MUTATING}/v1only"),
            &[("content-type", "application/json-patch+json")],
            br#"[{"op":"replace","path":"/webhooks/0/matchPolicy","value":"Exact"}]"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    until("matchPolicy Exact to take effect", PATIENCE, || async {
        let r = s
            .post_json(&format!("{beta}?dryRun=All"), &gadget("probe"))
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["spec"]["seenAs"].is_null().then_some(())
    })
    .await;
}

/// A policy expression whose cost over the request's object exceeds kube's
/// per-call limit fails without running (cel-go's cancelled evaluation),
/// under the policy's failure policy; smaller objects are still judged.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_expression_over_the_cost_limit_fails_without_running() {
    let (_hooks, s) = setup().await;
    let yaml = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: unique-annotations
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [demo.kshard.dev]
      apiVersions: ["*"]
      operations: [CREATE]
      resources: [widgets]
  validations:
  - expression: "!has(object.metadata.annotations) || object.metadata.annotations.all(k, object.metadata.annotations.exists_one(j, j == k))"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: unique-annotations
spec:
  policyName: unique-annotations
  validationActions: [Deny]
"#;
    let out = s.kubectl_stdin(&["apply", "-f", "-"], yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let with_annotations = |name: &str, n: usize| {
        let mut w = common::widget(name, 1);
        w["metadata"]["annotations"] =
            Value::Object((0..n).map(|i| (format!("a{i}"), json!("x"))).collect());
        w
    };
    // Make sure the policy is in force: an object it judges is admitted.
    until("the policy to take effect", PATIENCE, || async {
        let r = s
            .post_json(
                &format!("{WIDGETS}?dryRun=All"),
                &with_annotations("probe", 1500),
            )
            .await;
        (r.status != 201).then_some(r)
    })
    .await;
    let big_widget = with_annotations("big", 1500);
    let (big, other) = tokio::join!(s.post_json(WIDGETS, &big_widget), s.get("/version"));
    assert_ne!(big.status, 201, "{}", big.text());
    assert!(
        big.text().contains(
            "denied request: expression '!has(object.metadata.annotations) || object.metadata.annotations.all(k, object.metadata.annotations.exists_one(j, j == k))' resulted in error: operation cancelled: actual cost limit exceeded"
        ),
        "{}",
        big.text()
    );
    assert_eq!(other.status, 200);
    let small = s.post_json(WIDGETS, &with_annotations("small", 20)).await;
    assert_eq!(small.status, 201, "{}", small.text());
    assert_eq!(
        s.get(&format!("{WIDGETS}/big")).await.status,
        404,
        "nothing written"
    );
}

/// Expressions each within the per-call limit share one budget per policy
/// evaluation (kube's 10,000,000): once it is spent, no further expression
/// runs and the evaluation fails under the failure policy.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_s_expressions_share_one_cost_budget() {
    let (_hooks, s) = setup().await;
    let rule = "!has(object.metadata.annotations) || object.metadata.annotations.all(k, object.metadata.annotations.exists(j, j == k))";
    let validations: String = (0..30)
        .map(|_| format!("  - expression: \"{rule}\"\n"))
        .collect();
    let yaml = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: many-checks
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [demo.kshard.dev]
      apiVersions: ["*"]
      operations: [CREATE]
      resources: [widgets]
  validations:
{validations}---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: many-checks
spec:
  policyName: many-checks
  validationActions: [Deny]
"#
    );
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let with_annotations = |name: &str, n: usize| {
        let mut w = common::widget(name, 1);
        w["metadata"]["annotations"] =
            Value::Object((0..n).map(|i| (format!("a{i}"), json!("x"))).collect());
        w
    };
    let r = until("the policy to take effect", PATIENCE, || async {
        let r = s
            .post_json(
                &format!("{WIDGETS}?dryRun=All"),
                &with_annotations("probe", 300),
            )
            .await;
        (r.status != 201).then_some(r)
    })
    .await;
    assert!(
        r.text().contains(
            "denied request: validation failed due to running out of cost budget, no further validation rules will be run"
        ),
        "{}",
        r.text()
    );
    let small = s.post_json(WIDGETS, &with_annotations("small", 10)).await;
    assert_eq!(small.status, 201, "{}", small.text());
}
