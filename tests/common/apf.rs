//! Flow-control scenarios shared by the tests and the fairness benchmark.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kshard::flowcontrol::types::ConditionStatus;
use kshard::flowcontrol::{FlowSchema, PriorityLevelConfiguration};
use serde_json::json;

use super::TestServer;

pub fn level(
    name: &str,
    shares: u32,
    limit_response: serde_json::Value,
) -> PriorityLevelConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": limit_response,
        }},
    }))
    .expect("level")
}

pub fn schema(name: &str, group: &str, level: &str) -> FlowSchema {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": 1000,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "Group", "group": {"name": group}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": true}],
            }],
        },
    }))
    .expect("schema")
}

/// Configures flow control the way operators do: FlowSchema and
/// PriorityLevelConfiguration objects through the API, reconciled by the
/// controller; returns once the new levels and schemas are in force.
pub async fn install(
    s: &TestServer,
    schemas: Vec<FlowSchema>,
    levels: Vec<PriorityLevelConfiguration>,
) {
    use kshard::flowcontrol::types::{FlowSchemaResource, PriorityLevelConfigurationResource};
    let pp = kube::api::PostParams::default();
    let names: Vec<String> = levels.iter().map(|l| l.metadata.name.clone()).collect();
    let pl_api: kube::Api<PriorityLevelConfigurationResource> = kube::Api::all(s.client.clone());
    for l in levels {
        let obj = PriorityLevelConfigurationResource::new(&l.metadata.name, l.spec);
        pl_api.create(&pp, &obj).await.expect("create level");
    }
    let fs_api: kube::Api<FlowSchemaResource> = kube::Api::all(s.client.clone());
    let schema_names: Vec<String> = schemas.iter().map(|f| f.metadata.name.clone()).collect();
    for f in schemas {
        let obj = FlowSchemaResource::new(&f.metadata.name, f.spec);
        fs_api.create(&pp, &obj).await.expect("create schema");
    }
    for _ in 0..200 {
        let snap = s.running.apf.snapshot();
        let levels_in_force = names
            .iter()
            .all(|n| snap.levels.iter().any(|l| &l.name == n && !l.quiescing));
        // Levels and schemas reach the controller by separate watches; the
        // controller writes a schema's status after putting it in force, so
        // `Dangling=False` says the schema classifies requests to its level.
        let mut schemas_in_force = true;
        for n in &schema_names {
            let fs = fs_api.get(n).await.expect("get schema");
            schemas_in_force &= has_condition(&fs, "Dangling", ConditionStatus::False);
        }
        if levels_in_force && schemas_in_force {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("flow-control objects {names:?} and {schema_names:?} not in force");
}

/// Whether a FlowSchema's status has the condition `kind` at `status`.
pub fn has_condition(
    fs: &kshard::flowcontrol::types::FlowSchemaResource,
    kind: &str,
    status: ConditionStatus,
) -> bool {
    fs.status.as_ref().is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == kind && c.status == status)
    })
}

/// A LIST that is expensive for the server and cheap for the client: an exact
/// read of history through storage with a selector nothing matches.
pub fn wide_list_base(s: &TestServer) -> String {
    let rv = s.running.registry.revision();
    format!(
        "{}?resourceVersion={rv}&resourceVersionMatch=Exact&labelSelector=app%3Dnobody",
        super::WIDGETS
    )
}

pub fn as_user<'a>(user: &'a str, group: &'a str) -> [(&'static str, &'a str); 2] {
    [("impersonate-user", user), ("impersonate-group", group)]
}

pub async fn fill(s: &TestServer, n: usize) {
    let payload = "x".repeat(900);
    let mut tasks = Vec::new();
    let next = Arc::new(AtomicUsize::new(0));
    for _ in 0..16 {
        let client = s.client.clone();
        let next = next.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let mut w = super::widget(&format!("big{i:05}"), 1);
                w["spec"]["payload"] = json!(payload);
                let req = http::Request::post(super::WIDGETS)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&w).expect("json"),
                    ))
                    .expect("req");
                let resp = client.send(req).await.expect("send");
                assert_eq!(resp.status(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.expect("fill");
    }
}

/// Runs an elephant (many concurrent wide LISTs) against a mouse (sequential small
/// GETs) from another user of the same level; returns (mouse latencies, elephant 429s,
/// elephant successes, mouse failures).
pub async fn elephant_and_mouse(
    s: &TestServer,
    elephants: usize,
    run_for: Duration,
) -> (Vec<Duration>, usize, usize, usize) {
    let stop = Instant::now() + run_for;
    let rejected = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let uri = wide_list_base(s);
    for _ in 0..elephants {
        let client = s.client.clone();
        let (rejected, served) = (rejected.clone(), served.clone());
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let req = http::Request::get(uri.as_str())
                    .header("impersonate-user", "elephant")
                    .header("impersonate-group", "tenants")
                    .body(kube::client::Body::empty())
                    .expect("req");
                let resp = client.send(req).await.expect("send");
                let status = resp.status();
                let _ = resp.into_body().collect_bytes().await;
                if status == 429 {
                    rejected.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                } else {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut mouse = Vec::new();
    let mut mouse_failed = 0;
    let mut peak = (0, 0);
    while Instant::now() < stop {
        if let Some(l) = s
            .running
            .apf
            .snapshot()
            .levels
            .iter()
            .find(|l| l.name == "tenants")
        {
            peak = (
                peak.0.max(l.executing_seats),
                peak.1.max(l.waiting_requests),
            );
        }
        let t = Instant::now();
        let r = s
            .raw(
                "GET",
                &format!("{}/big00001", super::WIDGETS),
                &as_user("mouse", "tenants"),
                vec![],
            )
            .await;
        if r.status == 200 {
            mouse.push(t.elapsed());
        } else {
            mouse_failed += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        t.await.expect("elephant");
    }
    eprintln!("peak executing seats {}, waiting {}", peak.0, peak.1);
    mouse.sort();
    (
        mouse,
        rejected.load(Ordering::Relaxed),
        served.load(Ordering::Relaxed),
        mouse_failed,
    )
}
