//! Auditing against a running server: the policy picks levels, the log
//! backend writes kube's Event JSON per stage, the webhook backend posts
//! batched EventLists, and every response carries `Audit-Id`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::WIDGETS;
use serde_json::{json, Value};

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    nonResourceURLs: ["/readyz*", "/livez*", "/healthz*"]
  - level: RequestResponse
    verbs: ["create"]
    resources:
      - group: demo.kshard.dev
        resources: ["widgets"]
  - level: Metadata
    omitStages: ["RequestReceived"]
"#;

fn events(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect()
}

fn with_id<'a>(all: &'a [Value], id: &str) -> Vec<&'a Value> {
    all.iter().filter(|e| e["auditID"] == id).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn log_backend_records_each_stage_at_the_policy_level() {
    let dir = tempfile::tempdir().expect("tmp");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let log = dir.path().join("audit").join("audit.log");
    let (p, l) = (policy.clone(), log.clone());
    let s = common::start_with(move |c| {
        c.audit.audit_policy_file = Some(p);
        c.audit.audit_log_path = Some(l);
    })
    .await;

    // A create at RequestResponse: both bodies, two stages, the client's audit ID.
    let body = serde_json::to_vec(&common::widget("w1", 2)).expect("json");
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[
                ("content-type", "application/json"),
                ("audit-id", "create-1"),
            ],
            body,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.headers["audit-id"], "create-1");
    let all = events(&log);
    let create = with_id(&all, "create-1");
    let stages: Vec<&str> = create
        .iter()
        .map(|e| e["stage"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        stages,
        ["RequestReceived", "ResponseComplete"],
        "{create:?}"
    );
    let done = create[1];
    assert_eq!(done["kind"], "Event");
    assert_eq!(done["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(done["level"], "RequestResponse");
    assert_eq!(done["verb"], "create");
    assert_eq!(done["requestURI"], WIDGETS);
    // The admin kubeconfig's certificate: CN kshard-admin, O system:masters.
    assert_eq!(done["user"]["username"], "kshard-admin");
    assert_eq!(
        done["user"]["groups"],
        json!(["system:masters", "system:authenticated"])
    );
    assert_eq!(done["userAgent"], "kshard-tests/0.1");
    assert_eq!(done["sourceIPs"], json!(["127.0.0.1"]));
    assert_eq!(
        done["objectRef"],
        json!({"resource": "widgets", "namespace": "default", "apiGroup": "demo.kshard.dev", "apiVersion": "v1"})
    );
    assert_eq!(done["responseStatus"], json!({"metadata": {}, "code": 201}));
    assert_eq!(done["requestObject"]["spec"]["replicas"], 2);
    assert_eq!(done["responseObject"]["metadata"]["name"], "w1");
    assert!(done["responseObject"]["metadata"]["uid"].is_string());
    assert_eq!(
        done["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    assert!(done["annotations"]["apiserver.latency.k8s.io/apf-queue-wait"].is_string());
    for k in ["requestReceivedTimestamp", "stageTimestamp"] {
        let t = done[k].as_str().expect(k);
        assert!(
            t.ends_with('Z') && t.len() == "2026-11-23T23:30:00.123456Z".len(),
            "{t}"
        );
    }

    // A read at Metadata: no bodies, RequestReceived omitted by the rule;
    // a generated audit ID is returned and recorded.
    let r = s.get(&format!("{WIDGETS}/w1")).await;
    assert_eq!(r.status, 200);
    let id = r.headers["audit-id"].to_str().expect("id").to_string();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    let all = events(&log);
    let get = with_id(&all, &id);
    assert_eq!(get.len(), 1, "{get:?}");
    assert_eq!(get[0]["stage"], "ResponseComplete");
    assert_eq!(get[0]["level"], "Metadata");
    assert_eq!(get[0]["objectRef"]["name"], "w1");
    assert!(get[0].get("requestObject").is_none() && get[0].get("responseObject").is_none());

    // An error keeps kube's Status fields in responseStatus.
    let r = s.get(&format!("{WIDGETS}/nope")).await;
    assert_eq!(r.status, 404);
    let id = r.headers["audit-id"].to_str().expect("id").to_string();
    let all = events(&log);
    let missing = with_id(&all, &id);
    assert_eq!(missing[0]["responseStatus"]["code"], 404);
    assert_eq!(missing[0]["responseStatus"]["reason"], "NotFound");
    assert_eq!(missing[0]["responseStatus"]["status"], "Failure");

    // A watch: ResponseStarted when it starts, ResponseComplete when it ends.
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}?watch=true&timeoutSeconds=1"),
            &[("audit-id", "watch-1")],
            vec![],
        )
        .await;
    assert_eq!(r.status, 200);
    let watch_stages = || {
        with_id(&events(&log), "watch-1")
            .iter()
            .map(|e| e["stage"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    common::eventually("the watch's ResponseComplete", || async {
        watch_stages().len() == 2
    })
    .await;
    assert_eq!(watch_stages(), ["ResponseStarted", "ResponseComplete"]);

    // Health probes are level None: nothing recorded, but the header is there.
    let r = s.get("/readyz").await;
    let id = r.headers["audit-id"].to_str().expect("id").to_string();
    assert!(with_id(&events(&log), &id).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn rejected_requests_carry_an_audit_id() {
    // No policy at all: responses still name their audit ID, including a 404 route.
    let s = common::start().await;
    let r = s.get("/apis/nope.example.com/v1/things").await;
    assert_eq!(r.status, 404);
    assert!(r.headers.contains_key("audit-id"));
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_backend_posts_batched_event_lists() {
    // The receiver: a plain HTTP endpoint collecting what it is sent.
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/audit/events",
        axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                // The kubeconfig's credentials are presented.
                assert_eq!(headers["authorization"], "Bearer secret-token");
                let v: Value = serde_json::from_slice(&body).expect("EventList JSON");
                sink.lock().expect("lock").push(v);
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("tmp");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).expect("policy");
    let kubeconfig = dir.path().join("webhook.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: audit\n  cluster:\n    server: http://{addr}/audit/events\ncontexts:\n- name: audit\n  context:\n    cluster: audit\n    user: audit\ncurrent-context: audit\nusers:\n- name: audit\n  user:\n    token: secret-token\n"
        ),
    )
    .expect("kubeconfig");
    let (p, k) = (policy.clone(), kubeconfig.clone());
    let s = common::start_with(move |c| {
        c.audit.audit_policy_file = Some(p);
        c.audit.audit_webhook_config_file = Some(k);
        c.audit.audit_webhook_batch_max_wait = Duration::from_millis(200);
        c.audit.audit_webhook_batch_max_size = 3;
    })
    .await;
    for i in 0..4 {
        let r = s
            .post_json(WIDGETS, &common::widget(&format!("w{i}"), 1))
            .await;
        assert_eq!(r.status, 201);
    }
    common::eventually("the webhook receives all 8 events", || async {
        let got = received.lock().expect("lock");
        got.iter()
            .map(|l| l["items"].as_array().map_or(0, Vec::len))
            .sum::<usize>()
            == 8
    })
    .await;
    let got = received.lock().expect("lock").clone();
    assert!(
        got.len() >= 3,
        "8 events in batches of at most 3: {}",
        got.len()
    );
    for list in &got {
        assert_eq!(list["kind"], "EventList");
        assert_eq!(list["apiVersion"], "audit.k8s.io/v1");
        let items = list["items"].as_array().expect("items");
        assert!(!items.is_empty() && items.len() <= 3);
        assert!(items
            .iter()
            .all(|e| e["kind"] == "Event" && e["verb"] == "create"));
    }
}
