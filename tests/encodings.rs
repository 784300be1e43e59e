//! Binary encodings on the wire: protobuf for the meta types (decoded here with
//! prost, field by field) and CBOR for resources, including watch streams.

mod common;

use std::time::Duration;

use common::WIDGETS;
use http_body_util::BodyExt;
use kshard::api::encoding::{cbor, protobuf};
use prost::Message;
use serde_json::json;

const META_LIST: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const META_ONE: &str = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

async fn seeded() -> common::TestServer {
    let s = common::start().await;
    let mut w = common::widget("a", 1);
    w["metadata"]["labels"] = json!({"app": "web", "tier": ""});
    w["metadata"]["finalizers"] = json!(["demo.kshard.dev/keep"]);
    assert_eq!(s.post_json(WIDGETS, &w).await.status, 201);
    s
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_object_metadata_in_protobuf() {
    let s = seeded().await;
    let json_view = s.get(&format!("{WIDGETS}/a")).await.json();
    let r = s
        .raw("GET", WIDGETS, &[("accept", META_LIST)], vec![])
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf")
    );
    assert_eq!(&r.body[..4], b"k8s\x00");
    let (tm, raw) = protobuf::decode_envelope(&r.body).expect("envelope");
    assert_eq!(
        (tm.api_version.as_deref(), tm.kind.as_deref()),
        (Some("meta.k8s.io/v1"), Some("PartialObjectMetadataList"))
    );
    let list = protobuf::PartialObjectMetadataList::decode(&raw[..]).expect("list");
    assert_eq!(
        list.metadata
            .as_ref()
            .and_then(|m| m.resource_version.as_deref()),
        Some("1")
    );
    assert_eq!(list.items.len(), 1);
    let m = list.items[0].metadata.clone().expect("metadata");
    assert_eq!(m.name.as_deref(), Some("a"));
    assert_eq!(m.namespace.as_deref(), Some("default"));
    assert_eq!(m.uid.as_deref(), json_view["metadata"]["uid"].as_str());
    assert_eq!(m.resource_version.as_deref(), Some("1"));
    assert_eq!(m.generation, Some(1));
    let created = chrono::DateTime::parse_from_rfc3339(
        json_view["metadata"]["creationTimestamp"]
            .as_str()
            .expect("ts"),
    )
    .expect("rfc3339");
    assert_eq!(
        m.creation_timestamp.and_then(|t| t.seconds),
        Some(created.timestamp())
    );
    let labels: Vec<(String, String)> = m
        .labels
        .iter()
        .map(|e| {
            (
                e.key.clone().unwrap_or_default(),
                e.value.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        labels,
        [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), String::new())
        ]
    );
    assert_eq!(m.finalizers, ["demo.kshard.dev/keep"]);
    assert_eq!(m.managed_fields.len(), 1, "managedFields travel too");

    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}/a"),
            &[("accept", META_ONE)],
            vec![],
        )
        .await;
    let (tm, raw) = protobuf::decode_envelope(&r.body).expect("envelope");
    assert_eq!(tm.kind.as_deref(), Some("PartialObjectMetadata"));
    let one = protobuf::PartialObjectMetadata::decode(&raw[..]).expect("one");
    assert_eq!(one.metadata.and_then(|m| m.name), Some("a".to_string()));

    // An error is a Status, which has no metadata view: kube's negotiation
    // skips the `as=` range and answers in the client's next type, JSON.
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}/missing"),
            &[("accept", META_ONE)],
            vec![],
        )
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json()["message"],
        "widgets.demo.kshard.dev \"missing\" not found"
    );

    // Custom resources themselves have no protobuf form.
    let r = s
        .raw(
            "GET",
            WIDGETS,
            &[("accept", "application/vnd.kubernetes.protobuf")],
            vec![],
        )
        .await;
    assert_eq!(r.status, 406);
    let (_, raw) =
        protobuf::decode_envelope(&r.body).expect("a protobuf Status for a protobuf client");
    let st = protobuf::Status::decode(&raw[..]).expect("status");
    assert_eq!(st.reason.as_deref(), Some("NotAcceptable"));
    assert!(st.message.unwrap_or_default().starts_with("only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"));
    // Asked with JSON as a fallback, it is served as JSON.
    let r = s
        .raw(
            "GET",
            WIDGETS,
            &[(
                "accept",
                "application/vnd.kubernetes.protobuf, application/json",
            )],
            vec![],
        )
        .await;
    assert_eq!(
        (r.status, r.json()["kind"].as_str()),
        (200, Some("WidgetList"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn protobuf_metadata_watch_stream() {
    let s = seeded().await;
    let req = http::Request::get(format!("{WIDGETS}?watch=true&timeoutSeconds=2"))
        .header("accept", META_ONE.replace(",application/json", ""))
        .body(kube::client::Body::empty())
        .expect("req");
    let resp = s.client.send(req).await.expect("watch");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf;stream=watch")
    );
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let s2 = &s;
    let (_, _) = tokio::join!(
        async {
            while let Ok(Some(Ok(f))) =
                tokio::time::timeout(Duration::from_secs(3), body.frame()).await
            {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                }
            }
        },
        // The watch is subscribed before its response headers are sent.
        async { s2.post_json(WIDGETS, &common::widget("b", 2)).await }
    );
    // Length-prefixed WatchEvents, each object a PartialObjectMetadata envelope.
    let mut events = Vec::new();
    let mut rest = &buf[..];
    while rest.len() >= 4 {
        let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let ev = protobuf::WatchEvent::decode(&rest[4..4 + n]).expect("event");
        let raw = ev.object.and_then(|o| o.raw).expect("raw");
        let (tm, inner) = protobuf::decode_envelope(&raw).expect("inner envelope");
        assert_eq!(tm.kind.as_deref(), Some("PartialObjectMetadata"));
        let meta = protobuf::PartialObjectMetadata::decode(&inner[..]).expect("meta");
        events.push((
            ev.r#type.unwrap_or_default(),
            meta.metadata.and_then(|m| m.name).unwrap_or_default(),
        ));
        rest = &rest[4 + n..];
    }
    assert_eq!(
        events,
        [
            ("ADDED".to_string(), "a".to_string()),
            ("ADDED".to_string(), "b".to_string())
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cbor_bodies_responses_watches_and_apply() {
    let s = common::start().await;
    let body = cbor::to_cbor(&common::widget("c", 3));
    assert_eq!(&body[..3], &cbor::SELF_DESCRIBED);
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[
                ("content-type", "application/cbor"),
                ("accept", "application/cbor"),
            ],
            body,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        r.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/cbor")
    );
    let created = cbor::from_cbor(&r.body).expect("cbor");
    assert_eq!(created["spec"]["replicas"], 3);
    let r = s
        .raw("GET", WIDGETS, &[("accept", "application/cbor")], vec![])
        .await;
    let list = cbor::from_cbor(&r.body).expect("cbor list");
    assert_eq!(list["kind"], "WidgetList");
    assert_eq!(list["items"][0]["metadata"]["name"], "c");
    // Server-side apply with a CBOR configuration.
    let cfg = cbor::to_cbor(
        &json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget", "metadata": {"name": "c"}, "spec": {"size": "L"}}),
    );
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/c?fieldManager=cbor-client"),
            &[("content-type", "application/apply-patch+cbor")],
            cfg,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["spec"]["size"], "L");
    assert_eq!(
        r.json()["spec"]["color"],
        "blue",
        "the creator's field stays"
    );
    // Duplicate keys are refused, as kube's decoder does.
    let mut dup = vec![0xd9, 0xd9, 0xf7, 0xa2];
    for _ in 0..2 {
        dup.extend_from_slice(&[0x64]);
        dup.extend_from_slice(b"kind");
        dup.extend_from_slice(&[0x61, b'W']);
    }
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/cbor")],
            dup,
        )
        .await;
    assert_eq!(r.status, 400);
    // A CBOR watch is a CBOR sequence.
    let req = http::Request::get(format!("{WIDGETS}?watch=true&timeoutSeconds=1"))
        .header("accept", "application/cbor")
        .body(kube::client::Body::empty())
        .expect("req");
    let resp = s.client.send(req).await.expect("watch");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/cbor-seq")
    );
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    let first = cbor::from_cbor(&bytes).expect("one event");
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "c");
}
