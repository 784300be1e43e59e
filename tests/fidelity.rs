//! Answers that must match kube-apiserver 1.35 exactly (issue 15): each test
//! sends the request over real HTTP and checks the status, reason and
//! message kube's handlers and registry produce for it.

mod common;

use common::WIDGETS;
use serde_json::json;

const APPLY: (&str, &str) = ("content-type", "application/apply-patch+yaml");

/// Reads a watch stream until `done` holds for what arrived (10 s at most per
/// frame) and returns the text.
async fn read_watch(body: &mut kube::client::Body, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    while !done(&text) {
        let frame = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            http_body_util::BodyExt::frame(body),
        )
        .await
        .expect("an event")
        .expect("frame")
        .expect("data");
        if let Ok(d) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn an_apply_that_creates_answers_201_then_200() {
    let s = common::start().await;
    let uri = format!("{WIDGETS}/applied?fieldManager=me");
    let body = br#"{"apiVersion":"demo.kshard.dev/v1","kind":"Widget","metadata":{"name":"applied"},"spec":{"replicas":1}}"#;
    let first = s.raw("PATCH", &uri, &[APPLY], body.to_vec()).await;
    assert_eq!(first.status, 201, "{}", first.text());
    let again = s.raw("PATCH", &uri, &[APPLY], body.to_vec()).await;
    assert_eq!(again.status, 200, "{}", again.text());
    let dry = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/dry?fieldManager=me&dryRun=All"),
            &[APPLY],
            br#"{"apiVersion":"demo.kshard.dev/v1","kind":"Widget","metadata":{"name":"dry"}}"#
                .to_vec(),
        )
        .await;
    assert_eq!(
        dry.status,
        201,
        "a dry-run create is a create: {}",
        dry.text()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn put_of_a_missing_object_is_404_and_a_foreign_uid_is_409() {
    let s = common::start().await;
    // Custom resources are never created by PUT, with or without a version.
    for rv in [None, Some("1")] {
        let mut obj = common::widget("ghost", 1);
        if let Some(rv) = rv {
            obj["metadata"]["resourceVersion"] = json!(rv);
        }
        let r = s.put_json(&format!("{WIDGETS}/ghost"), &obj).await;
        assert_eq!(r.status, 404, "{:?}: {}", rv, r.text());
        assert_eq!(r.json()["reason"], "NotFound");
        assert_eq!(
            r.json()["message"],
            r#"widgets.demo.kshard.dev "ghost" not found"#
        );
    }
    let created = s.post_json(WIDGETS, &common::widget("w1", 1)).await;
    assert_eq!(created.status, 201);
    let live = created.json();
    let uid = live["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Existing, no resourceVersion: kube's 422.
    let mut no_rv = live.clone();
    no_rv["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    let r = s.put_json(&format!("{WIDGETS}/w1"), &no_rv).await;
    assert_eq!(r.status, 422, "{}", r.text());
    // A uid that is not the stored object's: the storage precondition's 409.
    let mut foreign = live.clone();
    foreign["metadata"]["uid"] = json!("not-the-uid");
    let r = s.put_json(&format!("{WIDGETS}/w1"), &foreign).await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["reason"], "Conflict");
    assert_eq!(
        r.json()["message"],
        format!(
            "Operation cannot be fulfilled on widgets.demo.kshard.dev \"w1\": StorageError: \
             invalid object, Code: 4, Key: /registry/demo.kshard.dev/widgets/default/w1, \
             ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in \
             precondition: not-the-uid, UID in object meta: {uid}"
        )
    );
    // The right uid updates.
    let mut same = live.clone();
    same["spec"]["replicas"] = json!(2);
    let r = s.put_json(&format!("{WIDGETS}/w1"), &same).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_metadata_view_of_the_wrong_shape_is_406() {
    let s = common::start().await;
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("w1", 1)).await.status,
        201
    );
    let one = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io,application/json";
    let list = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json";
    let r = s.raw("GET", WIDGETS, &[("accept", one)], vec![]).await;
    assert_eq!(r.status, 406, "{}", r.text());
    assert_eq!(r.json()["reason"], "NotAcceptable");
    assert_eq!(
        r.json()["message"],
        "you requested PartialObjectMetadata, but the requested object is a list (*unstructured.UnstructuredList)"
    );
    let r = s
        .raw("GET", &format!("{WIDGETS}/w1"), &[("accept", list)], vec![])
        .await;
    assert_eq!(r.status, 406, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "you requested PartialObjectMetadataList, but the requested object is not a list (*unstructured.Unstructured)"
    );
    // The matching shapes are served.
    let r = s.raw("GET", WIDGETS, &[("accept", list)], vec![]).await;
    assert_eq!(
        (r.status, r.json()["kind"].as_str()),
        (200, Some("PartialObjectMetadataList"))
    );
    let r = s
        .raw("GET", &format!("{WIDGETS}/w1"), &[("accept", one)], vec![])
        .await;
    assert_eq!(
        (r.status, r.json()["kind"].as_str()),
        (200, Some("PartialObjectMetadata"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn version_and_table_versions_are_kubes() {
    let s = common::start().await;
    let v = s.get("/version").await.json();
    for (field, want) in [
        ("major", "1"),
        ("minor", "35"),
        ("emulationMajor", "1"),
        ("emulationMinor", "35"),
        ("minCompatibilityMajor", "1"),
        ("minCompatibilityMinor", "34"),
    ] {
        assert_eq!(v[field], want, "{field}: {v}");
    }
    let kubectl = s.kubectl_ok(&["version", "-o", "json"]);
    let kv: serde_json::Value = serde_json::from_str(&kubectl).expect("kubectl version json");
    assert_eq!(kv["serverVersion"]["minor"], "35", "{kv}");
    // A Table asked for as v1beta1 says so.
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("w1", 1)).await.status,
        201
    );
    for version in ["v1", "v1beta1"] {
        let accept = format!("application/json;as=Table;v={version};g=meta.k8s.io");
        let r = s.raw("GET", WIDGETS, &[("accept", &accept)], vec![]).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["kind"], "Table");
        assert_eq!(r.json()["apiVersion"], format!("meta.k8s.io/{version}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_without_manager_or_user_agent_is_owned_by_unknown() {
    let s = common::start().await;
    // An empty User-Agent header: no manager can be derived from it.
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("user-agent", ""), ("content-type", "application/json")],
            serde_json::to_vec(&common::widget("anon", 1)).expect("json"),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let managers: Vec<String> = r.json()["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    format!(
                        "{}/{}",
                        e["manager"].as_str().unwrap_or(""),
                        e["operation"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(managers, ["unknown/Update"], "{}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_metadata_fields_are_dropped_warned_or_refused() {
    let s = common::start().await;
    let mut w = common::widget("m1", 1);
    w["metadata"]["foo"] = json!("bar");
    w["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "cm", "uid": "u1", "bogus": true}]);
    // Default (Warn): stored without them, one warning per field.
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let meta = &r.json()["metadata"];
    assert!(meta.get("foo").is_none(), "{meta}");
    assert!(meta["ownerReferences"][0].get("bogus").is_none(), "{meta}");
    let warnings: Vec<String> = r
        .headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(r#"unknown field \"metadata.foo\""#)),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(r#"unknown field \"metadata.ownerReferences[0].bogus\""#)),
        "{warnings:?}"
    );
    // Strict: refused with kube's message, on create and on every patch type.
    w["metadata"]["name"] = json!("m2");
    let r = s
        .post_json(&format!("{WIDGETS}?fieldValidation=Strict"), &w)
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        r#"Widget in version "v1" cannot be handled as a Widget: strict decoding error: unknown field "metadata.foo", unknown field "metadata.ownerReferences[0].bogus""#
    );
    for (ct, body) in [
        (
            "application/merge-patch+json",
            r#"{"metadata":{"foo":"bar"}}"#,
        ),
        (
            "application/json-patch+json",
            r#"[{"op":"add","path":"/metadata/foo","value":"bar"}]"#,
        ),
    ] {
        let r = s
            .raw(
                "PATCH",
                &format!("{WIDGETS}/m1?fieldValidation=Strict"),
                &[("content-type", ct)],
                body.as_bytes().to_vec(),
            )
            .await;
        // kube's patch handler: 422 on `patch`, quoting the patched object.
        assert_eq!(r.status, 422, "{ct}: {}", r.text());
        let message = r.json()["message"].as_str().unwrap_or("").to_string();
        assert!(
            message.starts_with(r#" "" is invalid: patch: Invalid value: "{"#)
                && message.ends_with(r#"": strict decoding error: unknown field "metadata.foo""#),
            "{ct}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_the_last_finalizer_answers_the_updated_object() {
    let s = common::start().await;
    let mut f = common::widget("f1", 1);
    f["metadata"]["finalizers"] = json!(["demo.kshard.dev/hold"]);
    assert_eq!(s.post_json(WIDGETS, &f).await.status, 201);
    let deleting = s
        .raw("DELETE", &format!("{WIDGETS}/f1"), &[], vec![])
        .await
        .json();
    let rv: u64 = deleting["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("rv");
    // Watch from the deletion's revision: what the finalizer removal does.
    let watch = s
        .client
        .send(
            http::Request::get(format!("{WIDGETS}?watch=1&resourceVersion={rv}"))
                .body(kube::client::Body::empty())
                .expect("req"),
        )
        .await
        .expect("watch");
    let mut update = deleting.clone();
    update["metadata"]["finalizers"] = json!([]);
    let r = s.put_json(&format!("{WIDGETS}/f1"), &update).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let answered = r.json();
    assert!(
        answered["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "kube answers the object as updated: {answered}"
    );
    let answered_rv: u64 = answered["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("rv");
    // The update is never stored: the answer keeps the revision it was
    // decided from, as the reference kube-apiserver's does.
    assert_eq!(answered_rv, rv, "the revision read");
    assert_eq!(s.get(&format!("{WIDGETS}/f1")).await.status, 404);
    // Watchers see only the deletion, of the object as it was stored
    // (finalizer and all), as with kube.
    let text = read_watch(&mut watch.into_body(), |t| t.matches('\n').count() >= 1).await;
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["DELETED"], "{text}");
    assert_eq!(
        events[0]["object"]["metadata"]["finalizers"],
        json!(["demo.kshard.dev/hold"]),
        "{text}"
    );
}

/// Issue 14: a resource nobody has written yet is watched like any other,
/// from the revision its (empty) list reports, however far other resources
/// have moved the shared revision since.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_watch_of_a_never_written_resource_is_an_ordinary_watch() {
    let s = common::start().await;
    for i in 0..5 {
        let w = common::widget(&format!("w{i}"), i);
        assert_eq!(s.post_json(WIDGETS, &w).await.status, 201);
    }
    let gadgets = "/apis/test.kshard.dev/v1/gadgets";
    let list = s.get(gadgets).await;
    assert_eq!(list.status, 200, "{}", list.text());
    let rv = list.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    for from in [rv.as_str(), "1", "0"] {
        let watch = s
            .client
            .send(
                http::Request::get(format!("{gadgets}?watch=1&resourceVersion={from}"))
                    .body(kube::client::Body::empty())
                    .expect("req"),
            )
            .await
            .expect("watch");
        assert_eq!(watch.status(), 200, "from {from}");
        let name = format!("g{from}");
        let g = json!({"apiVersion": "test.kshard.dev/v1", "kind": "Gadget",
                       "metadata": {"name": name}});
        assert_eq!(s.post_json(gadgets, &g).await.status, 201);
        let text = read_watch(&mut watch.into_body(), |t| t.contains(&name)).await;
        assert!(!text.contains("\"ERROR\""), "from {from}: {text}");
        assert!(text.contains("\"ADDED\""), "from {from}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_patches_that_do_not_apply_get_kubes_generic_422() {
    let s = common::start().await;
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("w1", 1)).await.status,
        201
    );
    let jp = ("content-type", "application/json-patch+json");
    for body in [
        r#"[{"op":"bogus","path":"/spec"}]"#,
        r#"[{"op":"test","path":"/spec/replicas","value":7}]"#,
        r#"[{"op":"remove","path":"/spec/nothing/here"}]"#,
    ] {
        let r = s
            .raw(
                "PATCH",
                &format!("{WIDGETS}/w1"),
                &[jp],
                body.as_bytes().to_vec(),
            )
            .await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert_eq!(r.json()["reason"], "Invalid", "{body}");
        assert_eq!(
            r.json()["message"],
            "the server rejected our request due to an error in our request",
            "{body}"
        );
    }
    // Not a JSON patch at all: 400.
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/w1"),
            &[jp],
            br#"{"op":"add"}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// GitOps tools apply the same configuration every few minutes: when nothing
/// but managedFields timestamps would change, nothing is written (same
/// resourceVersion, no watch event), also with defaults inside list items
/// and with the `creationTimestamp: null` that `kubectl create --dry-run -o
/// yaml` emits.
#[tokio::test(flavor = "multi_thread")]
async fn applying_the_same_configuration_again_writes_nothing() {
    let s = common::start().await;
    let things = "/apis/test.kshard.dev/v1/namespaces/default/things";
    let uri = format!("{things}/t1?fieldManager=gitops");
    let first = "apiVersion: test.kshard.dev/v1\nkind: Thing\nmetadata: {name: t1}\nspec: {id: a, ports: [{name: http, port: 80}], tags: [a, b]}\n";
    let r = s
        .raw("PATCH", &uri, &[APPLY], first.as_bytes().to_vec())
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let rv = r.json()["metadata"]["resourceVersion"].clone();
    assert_eq!(
        r.json()["spec"]["ports"][0]["protocol"],
        "TCP",
        "the default inside the list item is set"
    );
    let watch = s
        .client
        .send(
            http::Request::get(format!(
                "{things}?watch=1&resourceVersion={}",
                rv.as_str().unwrap_or("0")
            ))
            .body(kube::client::Body::empty())
            .expect("req"),
        )
        .await
        .expect("watch");
    let with_null = first.replace("{name: t1}", "{name: t1, creationTimestamp: null}");
    // Into the next second, so a re-apply that counted as a change would
    // carry a new managedFields time, and show.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for body in [with_null.clone(), first.to_string(), with_null] {
        for _ in 0..2 {
            let r = s
                .raw("PATCH", &uri, &[APPLY], body.as_bytes().to_vec())
                .await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["metadata"]["resourceVersion"], rv, "{body}");
        }
    }
    // A real change is written, and it is the first event the watch sees.
    let changed = first.replace("port: 80", "port: 81");
    let r = s.raw("PATCH", &uri, &[APPLY], changed.into_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.json()["metadata"]["resourceVersion"], rv);
    let text = read_watch(&mut watch.into_body(), |t| t.contains('\n')).await;
    let first_event: serde_json::Value =
        serde_json::from_str(text.lines().next().unwrap_or("")).expect("event json");
    assert_eq!(first_event["type"], "MODIFIED");
    assert_eq!(
        first_event["object"]["spec"]["ports"][0]["port"], 81,
        "{text}"
    );
}

/// Writes through `/scale` are owned "with subresource scale", and a Scale
/// can be applied (kube's scale handler), conflicting like any apply.
#[tokio::test(flavor = "multi_thread")]
async fn scale_writes_are_recorded_and_scale_can_be_applied() {
    let s = common::start().await;
    assert_eq!(
        s.post_json(WIDGETS, &common::widget("w1", 1)).await.status,
        201
    );
    let scale = format!("{WIDGETS}/w1/scale");
    let r = s
        .raw(
            "PATCH",
            &scale,
            &[("content-type", "application/merge-patch+json")],
            br#"{"spec":{"replicas":4}}"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let entries = |v: &serde_json::Value| -> Vec<(String, String, String, serde_json::Value)> {
        v["metadata"]["managedFields"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        (
                            e["manager"].as_str().unwrap_or("").to_string(),
                            e["operation"].as_str().unwrap_or("").to_string(),
                            e["subresource"].as_str().unwrap_or("").to_string(),
                            e["fieldsV1"].clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let live = s.get(&format!("{WIDGETS}/w1")).await.json();
    let mf = entries(&live);
    assert!(
        mf.contains(&(
            "kshard-tests".into(),
            "Update".into(),
            "scale".into(),
            json!({"f:spec": {"f:replicas": {}}})
        )),
        "{mf:?}"
    );
    // The main-resource entry gave up the replicas it no longer owns.
    assert!(
        mf.iter().any(|(m, _, sub, f)| m == "kshard-tests"
            && sub.is_empty()
            && f["f:spec"].get("f:replicas").is_none()),
        "{mf:?}"
    );
    let applied =
        b"apiVersion: autoscaling/v1\nkind: Scale\nmetadata: {name: w1}\nspec: {replicas: 6}\n";
    let r = s
        .raw(
            "PATCH",
            &format!("{scale}?fieldManager=hpa"),
            &[APPLY],
            applied.to_vec(),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap_or("")
            .contains(r#"conflict with "kshard-tests" with subresource "scale""#),
        "{}",
        r.text()
    );
    let r = s
        .raw(
            "PATCH",
            &format!("{scale}?fieldManager=hpa&force=true"),
            &[APPLY],
            applied.to_vec(),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        (
            r.json()["kind"].as_str(),
            r.json()["spec"]["replicas"].as_i64()
        ),
        (Some("Scale"), Some(6))
    );
    let live = s.get(&format!("{WIDGETS}/w1")).await.json();
    assert_eq!(live["spec"]["replicas"], 6);
    assert_eq!(live["spec"]["color"], "blue", "nothing else changed");
    assert!(
        entries(&live).contains(&(
            "hpa".into(),
            "Apply".into(),
            "scale".into(),
            json!({"f:spec": {"f:replicas": {}}})
        )),
        "{:?}",
        entries(&live)
    );
    // Not a Scale: refused.
    let r = s
        .raw(
            "PATCH",
            &format!("{scale}?fieldManager=hpa"),
            &[APPLY],
            b"apiVersion: demo.kshard.dev/v1\nkind: Widget\nmetadata: {name: w1}\n".to_vec(),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

/// ownerReferences entries are atomic and keyed by uid in managedFields, as
/// kube's ObjectMeta schema types them.
#[tokio::test(flavor = "multi_thread")]
async fn owner_references_are_owned_whole_by_uid() {
    let s = common::start().await;
    let mut w = common::widget("w1", 1);
    w["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
        "name": "cm", "uid": "u1", "controller": true}]);
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.json()["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:ownerReferences"],
        json!({".": {}, "k:{\"uid\":\"u1\"}": {}})
    );
    let applied = b"apiVersion: demo.kshard.dev/v1\nkind: Widget\nmetadata:\n  name: w2\n  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: cm, uid: u2}]\n";
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/w2?fieldManager=m"),
            &[APPLY],
            applied.to_vec(),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.json()["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:ownerReferences"],
        json!({"k:{\"uid\":\"u2\"}": {}})
    );
}

/// Errors are written in the media type the client prefers, as kube's
/// ErrorNegotiated does (views such as `as=Table` are not offered for them).
#[tokio::test(flavor = "multi_thread")]
async fn error_bodies_follow_the_negotiated_media_type() {
    let s = common::start().await;
    let uri = format!("{WIDGETS}/nope");
    for (accept, want) in [
        ("application/yaml", "application/yaml"),
        ("application/cbor", "application/cbor"),
        (
            "application/vnd.kubernetes.protobuf",
            "application/vnd.kubernetes.protobuf",
        ),
        (
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/yaml",
            "application/yaml",
        ),
        ("application/json", "application/json"),
    ] {
        let r = s.raw("GET", &uri, &[("accept", accept)], vec![]).await;
        assert_eq!(r.status, 404, "{accept}");
        let ct = r
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(ct.starts_with(want), "{accept}: {ct}");
    }
    let r = s
        .raw("GET", &uri, &[("accept", "application/yaml")], vec![])
        .await;
    let st: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8_lossy(&r.body)).expect("a YAML Status");
    assert_eq!(
        (st["kind"].as_str(), st["reason"].as_str()),
        (Some("Status"), Some("NotFound"))
    );
    let r = s
        .raw("GET", &uri, &[("accept", "application/cbor")], vec![])
        .await;
    let st = kshard::api::encoding::cbor::from_cbor(&r.body).expect("a CBOR Status");
    assert_eq!(st["code"], 404);
}

/// The causes of a 422, as `[field, message]` pairs in order.
fn causes(r: &common::Reply) -> Vec<(String, String)> {
    r.json()["details"]["causes"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        c["field"].as_str().unwrap_or_default().to_string(),
                        c["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// With a scale subresource, kube's CR validator checks the replica paths on
/// every write after the schema (the spec's not on `/status`), names them
/// with the CRD's leading dot, and reports wrong types with the unstructured
/// accessor's message; metadata causes come first, all in one 422.
#[tokio::test(flavor = "multi_thread")]
async fn scale_paths_are_validated_on_every_write_in_kubes_order() {
    let s = common::start().await;
    let mut w = common::widget("w1", -1);
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        causes(&r),
        vec![
            (
                "spec.replicas".to_string(),
                "Invalid value: -1: spec.replicas in body should be greater than or equal to 0"
                    .to_string()
            ),
            (
                ".spec.replicas".to_string(),
                "Invalid value: -1: should be a non-negative integer".to_string()
            ),
        ]
    );
    // Metadata first, then the schema, then the scale path, in one answer.
    w["metadata"]["labels"] = json!({"bad key!": "x"});
    w["spec"]["replicas"] = json!("three");
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let got = causes(&r);
    let fields: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        vec!["metadata.labels", "spec.replicas", ".spec.replicas"],
        "{got:?}"
    );
    assert_eq!(
        got[2].1,
        "Invalid value: 0: .spec.replicas accessor error: three is of the type string, expected int64"
    );
    // Beyond int32 (the schema's format does not bound it; the scale check does).
    let r = s
        .post_json(WIDGETS, &common::widget("w1", 3_000_000_000))
        .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        causes(&r).last().map(|(f, m)| (f.as_str(), m.as_str())),
        Some((
            ".spec.replicas",
            "Invalid value: 3000000000: should be less than or equal to 2147483647"
        ))
    );

    // Status writes check the status paths only. (The selector's keys are
    // pruned first: its schema is a string, which has no properties.)
    let created = s.post_json(WIDGETS, &common::widget("w1", 1)).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let mut live = created.json();
    live["status"] = json!({"replicas": -2, "selector": {"app": "x"}});
    let r = s.put_json(&format!("{WIDGETS}/w1/status"), &live).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let got = causes(&r);
    let scale_causes: Vec<_> = got.iter().filter(|(f, _)| f.starts_with('.')).collect();
    assert_eq!(
        scale_causes,
        vec![
            &(
                ".status.replicas".to_string(),
                "Invalid value: -2: should be a non-negative integer".to_string()
            ),
            &(
                ".status.selector".to_string(),
                "Invalid value: \"\": .status.selector accessor error: map[] is of the type map[string]interface {}, expected string".to_string()
            ),
        ],
        "{got:?}"
    );
    // A valid status passes.
    live["status"] = json!({"replicas": 2, "selector": "app=x"});
    let r = s.put_json(&format!("{WIDGETS}/w1/status"), &live).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A create that names a resourceVersion is refused with kube's storage
/// message (kube: 500; kshard: 400, see the README's differences); "0", an
/// unparsable version and a dry run are not checked, as in kube.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_that_names_a_resource_version_is_refused() {
    let s = common::start().await;
    let mut w = common::widget("w1", 1);
    w["metadata"]["resourceVersion"] = json!("42");
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        "resourceVersion should not be set on objects to be created"
    );
    assert_eq!(s.get(&format!("{WIDGETS}/w1")).await.status, 404);
    let r = s.post_json(&format!("{WIDGETS}?dryRun=All"), &w).await;
    assert_eq!(r.status, 201, "{}", r.text());
    for (name, rv) in [("w2", "0"), ("w3", "-1")] {
        let mut w = common::widget(name, 1);
        w["metadata"]["resourceVersion"] = json!(rv);
        let r = s.post_json(WIDGETS, &w).await;
        assert_eq!(r.status, 201, "{rv}: {}", r.text());
        assert_ne!(r.json()["metadata"]["resourceVersion"], json!(rv));
    }
}

/// Finalizer and label causes list every message of kube's qualified-name
/// check (prefix part, then name part) on the list's own path; a bad
/// generateName is reported for itself and for the name generated from it.
#[tokio::test(flavor = "multi_thread")]
async fn metadata_causes_are_kubes_for_finalizers_and_generate_name() {
    let s = common::start().await;
    let mut w = common::widget("w1", 1);
    w["metadata"]["finalizers"] = json!(["Bad_Prefix!/x y", "ok.example.com/fine"]);
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let got = causes(&r);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got.iter().all(|(f, _)| f == "metadata.finalizers"),
        "{got:?}"
    );
    assert!(
        got[0].1.starts_with(
            "Invalid value: \"Bad_Prefix!/x y\": prefix part a lowercase RFC 1123 subdomain"
        ),
        "{got:?}"
    );
    assert!(
        got[1].1.starts_with(
            "Invalid value: \"Bad_Prefix!/x y\": name part must consist of alphanumeric characters"
        ),
        "{got:?}"
    );
    // Upper case and '_' are fine in a finalizer's name part; a name with
    // no domain-qualified path is warned about, once, when it is added.
    let mut w = common::widget("w2", 1);
    w["metadata"]["finalizers"] = json!(["Bad_Finalizer", "example.com/ok"]);
    let r = s.post_json(WIDGETS, &w).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let warnings = |r: &common::Reply| -> Vec<String> {
        r.headers
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        warnings(&r),
        vec![
            r#"299 - "metadata.finalizers: \"Bad_Finalizer\": prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers""#
        ]
    );
    let mut live = r.json();
    live["metadata"]["finalizers"] =
        json!(["Bad_Finalizer", "example.com/ok", "cleanup.example.com"]);
    let r = s.put_json(&format!("{WIDGETS}/w2"), &live).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        warnings(&r),
        vec![
            r#"299 - "metadata.finalizers: \"cleanup.example.com\": prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers""#
        ]
    );

    let mut g = common::widget("", 1);
    g["metadata"].as_object_mut().map(|m| m.remove("name"));
    g["metadata"]["generateName"] = json!("Bad_Prefix-");
    let r = s.post_json(WIDGETS, &g).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let got = causes(&r);
    let fields: Vec<&str> = got.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        vec!["metadata.generateName", "metadata.name"],
        "{got:?}"
    );
    let generated = r.json()["details"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        generated.starts_with("Bad_Prefix-") && generated.len() == "Bad_Prefix-".len() + 5,
        "{generated}"
    );
    assert!(got[0]
        .1
        .starts_with("Invalid value: \"Bad_Prefix-\": a lowercase RFC 1123"));
    assert!(got[1].1.starts_with(&format!(
        "Invalid value: \"{generated}\": a lowercase RFC 1123"
    )));
    // A good prefix still generates.
    g["metadata"]["generateName"] = json!("good-");
    let r = s.post_json(WIDGETS, &g).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.json()["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("good-")));
}
