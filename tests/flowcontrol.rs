//! API Priority and Fairness through HTTP: headers, 429s, fairness between an
//! elephant and a mouse in one level, watches releasing seats, metrics and
//! debug dumps.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::apf::{as_user, elephant_and_mouse, fill, install, level, schema, wide_list_base};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn every_response_is_classified() {
    let s = common::start_with_flowcontrol().await;
    let r = s.get(common::WIDGETS).await;
    let fs = r
        .headers
        .get("x-kubernetes-pf-flowschema-uid")
        .expect("flow schema uid");
    let pl = r
        .headers
        .get("x-kubernetes-pf-prioritylevel-uid")
        .expect("priority level uid");
    assert!(!fs.is_empty() && !pl.is_empty());
    // Errors and non-resource requests are classified too.
    assert!(s
        .get(&format!("{}/missing", common::WIDGETS))
        .await
        .headers
        .contains_key("x-kubernetes-pf-flowschema-uid"));
    assert!(s
        .get("/version")
        .await
        .headers
        .contains_key("x-kubernetes-pf-prioritylevel-uid"));
    // The admin (system:masters) is exempt; an ordinary user lands in global-default.
    let dump = s
        .get("/debug/api_priority_and_fairness/dump_priority_levels")
        .await
        .text();
    assert!(
        dump.starts_with("PriorityLevelName, ActiveQueues, IsIdle,"),
        "{dump}"
    );
    let r = s
        .raw("GET", common::WIDGETS, &as_user("alice", "devs"), vec![])
        .await;
    assert_eq!(r.status, 200);
    let before = s.running.apf.snapshot();
    let gd = before
        .flows
        .iter()
        .find(|f| f.priority_level == "global-default" && f.flow_schema == "global-default")
        .expect("global-default flow");
    assert!(gd.dispatched >= 1);
    let out = s.kubectl_ok(&[
        "get",
        "--raw",
        "/debug/api_priority_and_fairness/dump_queues",
    ]);
    let columns = |text: &str| -> Vec<String> {
        text.lines()
            .next()
            .unwrap_or("")
            .split(',')
            .map(|c| c.trim().to_string())
            .collect()
    };
    assert_eq!(
        columns(&out)[..5],
        [
            "PriorityLevelName",
            "Index",
            "PendingRequests",
            "ExecutingRequests",
            "SeatsInUse"
        ],
        "{out}"
    );
    let out = s.kubectl_ok(&[
        "get",
        "--raw",
        "/debug/api_priority_and_fairness/dump_requests?includeRequestDetails=1",
    ]);
    assert_eq!(
        columns(&out)[..6],
        [
            "PriorityLevelName",
            "FlowSchemaName",
            "QueueIndex",
            "RequestIndexInQueue",
            "FlowDistingsher",
            "ArriveTime"
        ],
        "{out}"
    );
    assert!(columns(&out).contains(&"UserName".to_string()), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reject_level_answers_429_and_watch_releases_its_seat() {
    let s = common::start_with_flowcontrol().await;
    install(
        &s,
        vec![schema("solo", "solo", "solo")],
        vec![level("solo", 1, json!({"type": "Reject"}))],
    )
    .await;
    assert_eq!(
        s.running
            .apf
            .snapshot()
            .levels
            .iter()
            .find(|l| l.name == "solo")
            .map(|l| l.nominal_limit_seats),
        Some(3)
    );
    let me = as_user("bob", "solo");
    // A watch that has sent its initial events holds no seat: GETs keep working.
    let mut watches = Vec::new();
    for _ in 0..5 {
        let req = http::Request::get(format!("{}?watch=true&timeoutSeconds=20", common::WIDGETS))
            .header("impersonate-user", "bob")
            .header("impersonate-group", "solo")
            .body(kube::client::Body::empty())
            .expect("req");
        let resp = s.client.send(req).await.expect("watch");
        assert_eq!(resp.status(), 200);
        watches.push(resp);
    }
    // A watch gives its seat back just after its initial events.
    common::eventually("the watches' seats are back", || async {
        s.raw("GET", common::WIDGETS, &me, vec![]).await.status == 200
    })
    .await;
    for _ in 0..5 {
        let r = s.raw("GET", common::WIDGETS, &me, vec![]).await;
        assert_eq!(r.status, 200, "watches must not hold seats");
    }
    // Saturate the 3 seats with slow requests: concurrent extra ones are rejected at once.
    fill(&s, 600).await;
    let rejected = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let uri = wide_list_base(&s);
    for i in 0..24 {
        let client = s.client.clone();
        let rejected = rejected.clone();
        let uri = uri.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let req = http::Request::get(uri.as_str())
                    .header("impersonate-user", format!("u{i}"))
                    .header("impersonate-group", "solo")
                    .body(kube::client::Body::empty())
                    .expect("req");
                let resp = client.send(req).await.expect("send");
                if resp.status() == 429 {
                    assert_eq!(
                        resp.headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .map(|v| v.parse::<u64>().is_ok()),
                        Some(true)
                    );
                    assert!(resp
                        .headers()
                        .contains_key("x-kubernetes-pf-flowschema-uid"));
                    let body = resp.into_body().collect_bytes().await.expect("body");
                    assert_eq!(&body[..], b"Too many requests, please try again later.\n");
                    rejected.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert_eq!(resp.status(), 200);
                    let _ = resp.into_body().collect_bytes().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert!(
        rejected.load(Ordering::Relaxed) > 0,
        "a full Reject level rejects"
    );
    let metrics = s.get("/metrics").await.text();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("apiserver_flowcontrol_rejected_requests_total")
                && l.contains("priority_level=\"solo\"")
                && l.contains("reason=\"concurrency-limit\"")
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("rejected"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(metrics.contains("apiserver_request_total{verb=\"LIST\",group=\"demo.kshard.dev\""));
    assert!(metrics.contains("apiserver_request_duration_seconds_bucket"));
    drop(watches);
}

#[tokio::test(flavor = "multi_thread")]
async fn mouse_keeps_being_served_while_elephant_gets_429s() {
    let s = common::start_with_flowcontrol().await;
    install(
        &s,
        vec![schema("tenants", "tenants", "tenants")],
        vec![level(
            "tenants",
            9,
            json!({"type": "Queue", "queuing": {"queues": 16, "handSize": 2, "queueLengthLimit": 4}}),
        )],
    ).await;
    fill(&s, 1000).await;
    let (idle, _, _, failed) = elephant_and_mouse(&s, 0, Duration::from_millis(500)).await;
    assert_eq!(failed, 0);
    let (loaded, rejected, served, failed) =
        elephant_and_mouse(&s, 24, Duration::from_secs(3)).await;
    let p = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    eprintln!(
        "mouse p50/p99 idle {:?}/{:?}, loaded {:?}/{:?} ({} GETs); elephant served {served}, rejected {rejected}",
        p(&idle, 0.5), p(&idle, 0.99), p(&loaded, 0.5), p(&loaded, 0.99), loaded.len()
    );
    assert_eq!(failed, 0, "every mouse request succeeds");
    assert!(rejected > 0, "the elephant is pushed back with 429s");
    assert!(served > 0, "the elephant still gets its share");
    assert!(loaded.len() >= 10, "the mouse keeps going");
    assert!(
        p(&loaded, 0.99) < Duration::from_secs(2),
        "mouse latency stays bounded: {:?}",
        p(&loaded, 0.99)
    );
}

/// One user's writes held by a slow validating webhook, with the server's
/// concurrency small (`--max-requests-inflight 4
/// --max-mutating-requests-inflight 2`: global-default has one nominal seat,
/// which it lends out while idle): another user of the same level writing
/// where the webhook does not apply is served from its own queue. Fair
/// queuing is by queue, and A's flow spreads over its hand of 6 queues, so
/// B may wait for one of A's writes from each of them (admission runs inside
/// the seat, as in kube): with webhook holds of `HOLD` that is at most about
/// 6 × HOLD on one seat. With HOLD 1 s that is well within the 15 s queue
/// wait, so every one of B's writes succeeds; with 10 s holds it is not, and
/// B's first write may be answered 429 after the queue wait, as by kube
/// (README, "Security and limits").
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_webhook_on_one_users_writes_does_not_starve_another_user() {
    use common::until;
    use common::webhook::{Reply, WebhookServer};
    const HOLD: Duration = Duration::from_secs(1);
    const FLOOD: u32 = 20;
    let hooks = WebhookServer::start().await;
    let resolve = hooks.resolve();
    let s = common::start_with(move |c| {
        c.admission_webhook_resolve = resolve;
        c.max_requests_inflight = 4;
        c.max_mutating_requests_inflight = 2;
    })
    .await;
    hooks.handle("/slow", |review| Reply::allow(review).after(HOLD));
    // Standalone, namespaces are implicit (labelled with their name).
    let mut hook = hooks.webhook("slow.kshard.dev", "/slow");
    hook["timeoutSeconds"] = json!(30);
    hook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": "slow"}});
    let r = s
        .post_json(
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            &json!({"apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "ValidatingWebhookConfiguration",
                    "metadata": {"name": "slow"}, "webhooks": [hook]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let widgets = |ns: &str| format!("/apis/demo.kshard.dev/v1/namespaces/{ns}/widgets");
    let post_as = |user: &'static str, ns: &str, name: String| {
        let client = s.client.clone();
        let uri = widgets(ns);
        async move {
            let body = serde_json::to_vec(&common::widget(&name, 1)).expect("json");
            let req = http::Request::post(uri)
                .header("content-type", "application/json")
                .header("impersonate-user", user)
                .header("impersonate-group", "tenants")
                .body(kube::client::Body::from(body))
                .expect("req");
            let t = std::time::Instant::now();
            let resp = client.send(req).await.expect("send");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect_bytes().await.unwrap_or_default();
            (
                status,
                t.elapsed(),
                String::from_utf8_lossy(&body).into_owned(),
            )
        }
    };
    // The configuration is in force once a write in `slow` (the admin's:
    // exempt) reaches the webhook.
    let mut probe = 0;
    until("the webhook is called", Duration::from_secs(30), || {
        probe += 1;
        let (s, hooks) = (&s, &hooks);
        let uri = format!("{}?dryRun=All", widgets("slow"));
        let body = serde_json::to_vec(&common::widget(&format!("probe{probe}"), 1)).expect("json");
        async move {
            let _ = s
                .raw("POST", &uri, &[("content-type", "application/json")], body)
                .await;
            (!hooks.take("/slow").is_empty()).then_some(())
        }
    })
    .await;

    // A borrowing round while the level is idle lends its one seat out.
    s.running.apf.update_borrowing(tokio::time::Instant::now());
    let gd = |s: &common::TestServer| {
        s.running
            .apf
            .snapshot()
            .levels
            .into_iter()
            .find(|l| l.name == "global-default")
            .expect("global-default")
    };
    assert_eq!(gd(&s).current_limit_seats, 0, "{:?}", gd(&s));

    // User A: FLOOD writes into `slow` at once.
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| tokio::spawn(post_as("user-a", "slow", format!("a{i}"))))
        .collect();
    // All of A's writes are in the level before B comes, so B queues
    // behind them wherever fair queuing puts it.
    let at_b = until(
        "A's writes are all in the level",
        Duration::from_secs(30),
        || {
            let l = gd(&s);
            async move { (l.waiting_requests + l.executing_requests >= FLOOD).then_some(l) }
        },
    )
    .await;
    eprintln!(
        "global-default when B comes: limit {} (nominal {}), executing {}, waiting {}",
        at_b.current_limit_seats,
        at_b.nominal_limit_seats,
        at_b.executing_requests,
        at_b.waiting_requests
    );
    // A level that lent all its seats out while idle still runs one
    // request at a time (kube's rule), rather than none until the next
    // borrowing round.
    assert!(
        at_b.executing_requests >= 1,
        "nothing executes in global-default: {at_b:?}"
    );

    // User B, same level, writes into `fast`, one after another.
    let mut b = Vec::new();
    for i in 0..4 {
        b.push(post_as("user-b", "fast", format!("b{i}")).await);
    }
    let mut a = Vec::new();
    for t in flood {
        a.push(t.await.expect("A"));
    }
    eprintln!(
        "B's writes (status, latency): {:?}",
        b.iter().map(|(c, t, _)| (*c, *t)).collect::<Vec<_>>()
    );
    let mut a_codes: Vec<u16> = a.iter().map(|(c, _, _)| *c).collect();
    a_codes.sort();
    eprintln!(
        "A's writes: {a_codes:?}, the last answered after {:?}",
        a.iter().map(|(_, t, _)| *t).max().unwrap_or_default()
    );
    for (code, took, body) in &b {
        assert_eq!(
            *code, 201,
            "B's write answered {code} after {took:?}: {body}"
        );
    }
}
