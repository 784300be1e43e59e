//! Every row of the resourceVersion tables (API concepts page) for get, list
//! and watch, through HTTP: status codes and the revision each answer is at.
//!
//! History used throughout: rev 1 create w0, rev 2 create w1, rev 3 create w2,
//! rev 4 update w0, rev 5 delete w1. Current revision 5; live: w0 (4), w2 (3).

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, WIDGETS};
use serde_json::{json, Value};

async fn history() -> TestServer {
    // Two events of history: enough for watches from revision 3 on.
    let s = common::start_with(|c| c.watch_history = 2).await;
    for i in 0..3 {
        let r = s
            .post_json(WIDGETS, &common::widget(&format!("w{i}"), i))
            .await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/w0"),
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"replicas":10}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.raw("DELETE", &format!("{WIDGETS}/w1"), &[], vec![]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.running.registry.revision(), 5);
    s
}

fn list_rv(v: &Value) -> &str {
    v["metadata"]["resourceVersion"].as_str().expect("list rv")
}

fn names_and_rvs(v: &Value) -> Vec<(String, String)> {
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["metadata"]["name"].as_str().unwrap_or("").to_string(),
                i["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn get_table() {
    let s = history().await;
    // unset: most recent
    let r = s.get(&format!("{WIDGETS}/w0")).await;
    assert_eq!(
        (r.status, r.json()["metadata"]["resourceVersion"].as_str()),
        (200, Some("4"))
    );
    // "0": any
    let r = s.get(&format!("{WIDGETS}/w0?resourceVersion=0")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["spec"]["replicas"], 10);
    // not older than
    let r = s.get(&format!("{WIDGETS}/w0?resourceVersion=4")).await;
    assert_eq!(
        (r.status, r.json()["metadata"]["resourceVersion"].as_str()),
        (200, Some("4"))
    );
    let r = s.get(&format!("{WIDGETS}/w1?resourceVersion=2")).await;
    assert_eq!(r.status, 404, "served from the present, where w1 is gone");
    // newer than the server has: wait briefly, then 504 "Too large resource version"
    let t0 = Instant::now();
    let r = s.get(&format!("{WIDGETS}/w0?resourceVersion=99")).await;
    assert!(t0.elapsed() >= Duration::from_secs(2));
    assert_eq!(r.status, 504);
    let st = r.json();
    assert_eq!(st["reason"], "Timeout");
    assert_eq!(
        st["message"],
        "Timeout: Too large resource version: 99, current: 5"
    );
    assert_eq!(
        st["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn list_table_without_limit() {
    let s = history().await;
    let live = pairs(&[("w0", "4"), ("w2", "3")]);
    // unset: most recent
    let r = s.get(WIDGETS).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (list_rv(&r.json()), names_and_rvs(&r.json())),
        ("5", live.clone())
    );
    // "0": any
    let r = s.get(&format!("{WIDGETS}?resourceVersion=0")).await;
    assert_eq!((r.status, names_and_rvs(&r.json())), (200, live.clone()));
    // N, match unset: not older than
    let r = s.get(&format!("{WIDGETS}?resourceVersion=3")).await;
    let v = r.json();
    assert!(list_rv(&v).parse::<u64>().expect("rv") >= 3);
    assert_eq!(names_and_rvs(&v), live);
    // Exact: the state at revision 3, collection rv == 3
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=3&resourceVersionMatch=Exact"
        ))
        .await;
    let v = r.json();
    assert_eq!(list_rv(&v), "3");
    assert_eq!(
        names_and_rvs(&v),
        pairs(&[("w0", "1"), ("w1", "2"), ("w2", "3")])
    );
    // NotOlderThan with 0: any
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=0&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(r.status, 200);
    // NotOlderThan with N
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=2&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert!(list_rv(&r.json()).parse::<u64>().expect("rv") >= 2);
    // Invalid rows: 422 with kube's message
    for (q, msg) in [
        (
            "resourceVersionMatch=Exact",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "resourceVersionMatch=NotOlderThan",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ),
        (
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ),
    ] {
        let r = s.get(&format!("{WIDGETS}?{q}")).await;
        assert_eq!(r.status, 422, "{q}");
        let st = r.json();
        assert_eq!(st["reason"], "Invalid");
        assert!(
            st["message"].as_str().expect("msg").contains(msg),
            "{q}: {st}"
        );
        assert_eq!(st["details"]["kind"], "ListOptions");
    }
    // Too large: 504
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=50&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(r.status, 504);
}

#[tokio::test(flavor = "multi_thread")]
async fn list_table_with_limit_and_continue() {
    let s = history().await;
    // limit, rv unset: most recent, paged
    let r = s.get(&format!("{WIDGETS}?limit=1")).await;
    let v = r.json();
    assert_eq!(
        (list_rv(&v), names_and_rvs(&v)),
        ("5", pairs(&[("w0", "4")]))
    );
    assert_eq!(v["metadata"]["remainingItemCount"], 1);
    let token = v["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    // continue, rv unset: the same snapshot
    let r = s.get(&format!("{WIDGETS}?limit=1&continue={token}")).await;
    let v = r.json();
    assert_eq!(
        (list_rv(&v), names_and_rvs(&v)),
        ("5", pairs(&[("w2", "3")]))
    );
    // The last page: kube's unstructured list says so with an empty token.
    assert_eq!(v["metadata"]["continue"], "");
    // continue with rv=0: treated as the continue token
    let r = s
        .get(&format!(
            "{WIDGETS}?limit=1&continue={token}&resourceVersion=0"
        ))
        .await;
    assert_eq!(
        (r.status, list_rv(&r.json()).to_string()),
        (200, "5".to_string())
    );
    // continue with rv=N: 400
    let r = s
        .get(&format!(
            "{WIDGETS}?limit=1&continue={token}&resourceVersion=5"
        ))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "specifying resource version is not allowed when using continue"
    );
    // continue with a match: 422
    let r = s
        .get(&format!(
            "{WIDGETS}?limit=1&continue={token}&resourceVersion=5&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, 422);
    // limit, rv=0: any
    let r = s.get(&format!("{WIDGETS}?limit=1&resourceVersion=0")).await;
    assert_eq!(
        (r.status, r.json()["items"].as_array().map(Vec::len)),
        (200, Some(1))
    );
    // limit, rv=N, match unset: exact, paged through history
    let r = s.get(&format!("{WIDGETS}?limit=2&resourceVersion=3")).await;
    let v = r.json();
    assert_eq!(
        (list_rv(&v), names_and_rvs(&v)),
        ("3", pairs(&[("w0", "1"), ("w1", "2")]))
    );
    let token = v["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    let r = s.get(&format!("{WIDGETS}?limit=2&continue={token}")).await;
    let v = r.json();
    assert_eq!(
        (list_rv(&v), names_and_rvs(&v)),
        ("3", pairs(&[("w2", "3")]))
    );
    // limit, Exact
    let r = s
        .get(&format!(
            "{WIDGETS}?limit=1&resourceVersion=2&resourceVersionMatch=Exact"
        ))
        .await;
    let v = r.json();
    assert_eq!(
        (list_rv(&v), names_and_rvs(&v)),
        ("2", pairs(&[("w0", "1")]))
    );
    // limit, NotOlderThan
    let r = s
        .get(&format!(
            "{WIDGETS}?limit=1&resourceVersion=2&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    let v = r.json();
    assert!(list_rv(&v).parse::<u64>().expect("rv") >= 2);
    assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
    // a broken continue token: 400
    let r = s.get(&format!("{WIDGETS}?limit=1&continue=garbage")).await;
    assert_eq!(r.status, 400);
    assert!(r.json()["message"]
        .as_str()
        .expect("msg")
        .starts_with("invalid continue token"));
}

#[tokio::test(flavor = "multi_thread")]
async fn compacted_revisions_are_gone() {
    let s = history().await;
    let r = s.get(&format!("{WIDGETS}?limit=1&resourceVersion=3")).await;
    let token = r.json()["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    s.running.store.compact(4).await.expect("compact");
    // Exact below the compacted revision: 410 Expired
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=3&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(r.status, 410);
    let st = r.json();
    assert_eq!(
        (st["reason"].as_str(), st["message"].as_str()),
        (
            Some("Expired"),
            Some("The resourceVersion for the provided list is too old.")
        )
    );
    // An expired continue token: 410 with a fresh (inconsistent) token to go on with
    let r = s.get(&format!("{WIDGETS}?limit=1&continue={token}")).await;
    assert_eq!(r.status, 410);
    let st = r.json();
    assert!(st["message"]
        .as_str()
        .expect("msg")
        .starts_with("The provided continue parameter is too old"));
    let fresh = st["metadata"]["continue"]
        .as_str()
        .expect("new token")
        .to_string();
    let r = s.get(&format!("{WIDGETS}?limit=1&continue={fresh}")).await;
    let v = r.json();
    assert_eq!((r.status, names_and_rvs(&v)), (200, pairs(&[("w2", "3")])));
    // The compacted state itself still lists exactly.
    let r = s
        .get(&format!(
            "{WIDGETS}?resourceVersion=4&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(
        names_and_rvs(&r.json()),
        pairs(&[("w0", "4"), ("w1", "2"), ("w2", "3")])
    );
}

/// Reads watch frames until `n` have arrived (or the stream ends).
async fn watch_frames(s: &TestServer, query: &str, n: usize) -> Vec<Value> {
    let req = http::Request::get(format!("{WIDGETS}?watch=true&timeoutSeconds=3&{query}"))
        .body(kube::client::Body::empty())
        .expect("req");
    let resp = s.client.send(req).await.expect("send");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    use http_body_util::BodyExt;
    while frames.len() < n {
        let Some(Ok(frame)) = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .ok()
            .flatten()
        else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            frames.push(serde_json::from_slice(&line).expect("frame json"));
        }
    }
    frames
}

fn summary(frames: &[Value]) -> Vec<(String, String, String)> {
    frames
        .iter()
        .map(|f| {
            (
                f["type"].as_str().unwrap_or("").to_string(),
                f["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                f["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

fn t(kind: &str, name: &str, rv: &str) -> (String, String, String) {
    (kind.into(), name.into(), rv.into())
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_table() {
    let s = history().await;
    // unset: state at the most recent revision as ADDED, then changes
    let f = watch_frames(&s, "", 2).await;
    assert_eq!(summary(&f), [t("ADDED", "w0", "4"), t("ADDED", "w2", "3")]);
    // "0": state at any revision, then changes
    let f = watch_frames(&s, "resourceVersion=0", 2).await;
    assert_eq!(summary(&f), [t("ADDED", "w0", "4"), t("ADDED", "w2", "3")]);
    // exact: changes after it, no initial state
    let f = watch_frames(&s, "resourceVersion=3", 2).await;
    assert_eq!(
        summary(&f),
        [t("MODIFIED", "w0", "4"), t("DELETED", "w1", "5")]
    );
    // streaming list: initial events, then the annotated bookmark at the list revision
    let f = watch_frames(
        &s,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        3,
    )
    .await;
    assert_eq!(
        summary(&f)[..2],
        [t("ADDED", "w0", "4"), t("ADDED", "w2", "3")]
    );
    assert_eq!(f[2]["type"], "BOOKMARK");
    assert_eq!(f[2]["object"]["metadata"]["resourceVersion"], "5");
    assert_eq!(
        f[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(f[2]["object"]["kind"], "Widget");
    // a change after the watch's revision arrives, whenever it is written
    let s2 = &s;
    let (frames, _) = tokio::join!(watch_frames(s2, "resourceVersion=5", 1), async {
        s2.post_json(WIDGETS, &json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget", "metadata": {"name": "w9"}})).await
    });
    assert_eq!(summary(&frames), [t("ADDED", "w9", "6")]);
    // invalid: sendInitialEvents without NotOlderThan
    let r = s
        .get(&format!("{WIDGETS}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(r.status, 422);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_from_a_revision_the_cache_no_longer_has() {
    let s = history().await;
    // The cache keeps 2 events: revision 1 has fallen out.
    for i in 0..6 {
        s.post_json(WIDGETS, &common::widget(&format!("x{i}"), i))
            .await;
    }
    let f = watch_frames(&s, "resourceVersion=1", 1).await;
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["type"], "ERROR");
    assert_eq!(f[0]["object"]["code"], 410);
    assert_eq!(f[0]["object"]["reason"], "Expired");
    assert!(f[0]["object"]["message"]
        .as_str()
        .expect("msg")
        .starts_with("too old resource version: 1"));
}
