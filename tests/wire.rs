//! The wire format: Status errors, discovery (legacy and aggregated with
//! ETags), health, version and OpenAPI documents.

mod common;

use common::WIDGETS;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn status_errors_match_kube() {
    let s = common::start().await;
    let r = s.get(&format!("{WIDGETS}/missing")).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "widgets.demo.kshard.dev \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "group": "demo.kshard.dev", "kind": "widgets"}, "code": 404})
    );
    assert!(r.headers.contains_key("audit-id"));
    assert_eq!(
        s.get("/apis/demo.kshard.dev/v1/namespaces/default/nothings")
            .await
            .status,
        404
    );

    assert_eq!(
        s.post_json(WIDGETS, &common::widget("a", 1)).await.status,
        201
    );
    let r = s.post_json(WIDGETS, &common::widget("a", 1)).await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );

    // Invalid metadata: 422 with one cause per problem and kube's field paths.
    let mut bad = common::widget("Bad_Name", 1);
    bad["metadata"]["labels"] = json!({"ok": "-nope"});
    let r = s.post_json(WIDGETS, &bad).await;
    assert_eq!(r.status, 422);
    let st = r.json();
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["details"]["kind"], "Widget");
    let fields: Vec<&str> = st["details"]["causes"]
        .as_array()
        .expect("causes")
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert_eq!(fields, ["metadata.name", "metadata.labels"]);
    assert!(st["message"].as_str().expect("m").starts_with("Widget.demo.kshard.dev \"Bad_Name\" is invalid: [metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"));

    // Body/URL mismatches: 400.
    let mut other_ns = common::widget("b", 1);
    other_ns["metadata"]["namespace"] = json!("elsewhere");
    let r = s.post_json(WIDGETS, &other_ns).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );
    let mut wrong_version = common::widget("b", 1);
    wrong_version["apiVersion"] = json!("demo.kshard.dev/v2");
    let r = s.post_json(WIDGETS, &wrong_version).await;
    assert_eq!(r.json()["message"], "the API version in the data (demo.kshard.dev/v2) does not match the expected API version (demo.kshard.dev/v1)");
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/json")],
            b"{not json".to_vec(),
        )
        .await;
    assert_eq!(r.status, 400);

    // PUT without resourceVersion: 422 as for CRDs.
    let r = s
        .put_json(&format!("{WIDGETS}/a"), &common::widget("a", 2))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["message"], "widgets.demo.kshard.dev \"a\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update");
    // PUT to a missing object: 404.
    let mut m = common::widget("ghost", 1);
    m["metadata"]["resourceVersion"] = json!("1");
    assert_eq!(
        s.put_json(&format!("{WIDGETS}/ghost"), &m).await.status,
        404
    );
    // Name mismatch: 400.
    let mut a = s.get(&format!("{WIDGETS}/a")).await.json();
    a["metadata"]["name"] = json!("zzz");
    let r = s.put_json(&format!("{WIDGETS}/a"), &a).await;
    assert_eq!(
        r.json()["message"],
        "the name of the object (zzz) does not match the name on the URL (a)"
    );

    // Selectors.
    let r = s.get(&format!("{WIDGETS}?labelSelector=a%20in%20b")).await;
    assert_eq!(
        (r.status, r.json()["message"].as_str()),
        (
            400,
            Some("unable to parse requirement: found 'b' expected: '('")
        )
    );
    let r = s
        .get(&format!("{WIDGETS}?fieldSelector=spec.size%3Dx"))
        .await;
    assert_eq!(
        (r.status, r.json()["message"].as_str()),
        (400, Some("field label not supported: spec.size"))
    );

    // Media types.
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/a"),
            &[("content-type", "application/strategic-merge-patch+json")],
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let r = s
        .raw(
            "GET",
            WIDGETS,
            &[("accept", "application/vnd.kubernetes.protobuf")],
            vec![],
        )
        .await;
    assert_eq!(
        r.status, 406,
        "protobuf only: a protobuf Status (see tests/encodings.rs)"
    );
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
    assert_eq!(r.status, 200);
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "text/plain")],
            b"x".to_vec(),
        )
        .await;
    assert_eq!(r.status, 415);
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/a"),
            &[("content-type", "application/json-patch+json")],
            br#"[{"op":"test","path":"/spec/replicas","value":99}]"#.to_vec(),
        )
        .await;
    assert_eq!(r.status, 422);
    let r = s
        .raw(
            "PATCH",
            &format!("{WIDGETS}/missing"),
            &[("content-type", "application/merge-patch+json")],
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(r.status, 404);
    // dryRun values
    let r = s
        .raw(
            "POST",
            &format!("{WIDGETS}?dryRun=Some"),
            &[("content-type", "application/json")],
            serde_json::to_vec(&common::widget("c", 1)).expect("j"),
        )
        .await;
    // kube validates the options object: 422 on CreateOptions, Go's %#v.
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        r#"CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["Some"]: supported values: "All""#
    );
    assert_eq!(r.json()["details"]["causes"][0]["field"], "dryRun");
    let r = s
        .raw(
            "DELETE",
            &format!("{WIDGETS}/c?dryRun=All&dryRun=Some"),
            &[],
            vec![],
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(
        r.json()["message"],
        r#"DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["All","Some"]: supported values: "All""#
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn yaml_tables_and_metadata_views() {
    let s = common::start().await;
    let body = b"apiVersion: demo.kshard.dev/v1\nkind: Widget\nmetadata:\n  name: yam\nspec:\n  replicas: 2\n".to_vec();
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/yaml")],
            body,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}/yam"),
            &[("accept", "application/yaml")],
            vec![],
        )
        .await;
    assert!(r.text().contains("replicas: 2"), "{}", r.text());
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let r = s.raw("GET", WIDGETS, &[("accept", table)], vec![]).await;
    let t = r.json();
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .expect("cols")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(cols, ["Name", "Replicas", "Color", "Ready", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "yam");
    assert_eq!(t["rows"][0]["cells"][1], 2);
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}?includeObject=None"),
            &[("accept", table)],
            vec![],
        )
        .await;
    assert!(r.json()["rows"][0].get("object").is_none());
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}?includeObject=Object"),
            &[("accept", table)],
            vec![],
        )
        .await;
    assert_eq!(r.json()["rows"][0]["object"]["spec"]["replicas"], 2);
    let r = s
        .raw(
            "GET",
            &format!("{WIDGETS}?includeObject=Bogus"),
            &[("accept", table)],
            vec![],
        )
        .await;
    assert_eq!(r.status, 400);
    let r = s
        .raw(
            "GET",
            WIDGETS,
            &[(
                "accept",
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
            )],
            vec![],
        )
        .await;
    let v = r.json();
    assert_eq!(v["kind"], "PartialObjectMetadataList");
    assert!(v["items"][0].get("spec").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_health_version_openapi() {
    let s = common::start().await;
    let apis = s.get("/apis").await.json();
    assert_eq!(apis["kind"], "APIGroupList");
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["name"].as_str())
        .collect();
    assert_eq!(
        groups,
        [
            "authentication.k8s.io",
            "authorization.k8s.io",
            "admissionregistration.k8s.io",
            "apiextensions.k8s.io",
            "demo.kshard.dev",
            "flowcontrol.kshard.dev",
            "test.kshard.dev"
        ]
    );
    assert_eq!(apis["groups"][3]["preferredVersion"]["version"], "v1");
    let g = s.get("/apis/test.kshard.dev").await.json();
    assert_eq!(g["kind"], "APIGroup");
    let versions: Vec<&str> = g["versions"]
        .as_array()
        .expect("v")
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v1", "v1beta1"]);
    let rl = s.get("/apis/demo.kshard.dev/v1").await.json();
    assert_eq!(rl["kind"], "APIResourceList");
    let res: Vec<&Value> = rl["resources"].as_array().expect("r").iter().collect();
    let names: Vec<&str> = res.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["widgets", "widgets/status", "widgets/scale"]);
    assert_eq!(
        res[0]["verbs"],
        json!([
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "create",
            "update",
            "watch"
        ])
    );
    assert_eq!(res[0]["singularName"], "widget");
    assert_eq!(res[0]["shortNames"], json!(["wd"]));
    assert_eq!(res[0]["categories"], json!(["all", "kshard"]));
    assert_eq!(
        res[0]["storageVersionHash"].as_str().map(str::len),
        Some(12)
    );
    assert_eq!(res[2]["group"], "autoscaling");
    assert_eq!(s.get("/apis/nope.dev/v1").await.status, 404);

    let accept =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let r = s.raw("GET", "/apis", &[("accept", accept)], vec![]).await;
    assert_eq!(
        r.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    );
    let d = r.json();
    assert_eq!(d["kind"], "APIGroupDiscoveryList");
    let demo = d["items"]
        .as_array()
        .and_then(|gs| {
            gs.iter()
                .find(|g| g["metadata"]["name"] == "demo.kshard.dev")
        })
        .cloned()
        .unwrap_or_default();
    let widgets = &demo["versions"][0]["resources"][0];
    assert_eq!(widgets["resource"], "widgets");
    assert_eq!(widgets["scope"], "Namespaced");
    assert_eq!(widgets["subresources"][1]["responseKind"]["kind"], "Scale");
    let etag = r
        .headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("etag")
        .to_string();
    let r = s
        .raw(
            "GET",
            "/apis",
            &[("accept", accept), ("if-none-match", &etag)],
            vec![],
        )
        .await;
    assert_eq!(r.status, 304);
    let r = s
        .raw(
            "GET",
            "/apis",
            &[(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            )],
            vec![],
        )
        .await;
    // kube 1.36 serves aggregated discovery as v2 only.
    assert_eq!(r.status, 406);
    assert_eq!(r.json()["reason"], "NotAcceptable");
    let r = s.raw("GET", "/api", &[("accept", accept)], vec![]).await;
    assert_eq!(r.json()["items"], json!([]));
    assert_eq!(s.get("/api").await.json()["kind"], "APIVersions");

    for p in ["/livez", "/readyz", "/healthz"] {
        let r = s.get(p).await;
        assert_eq!((r.status, r.text()), (200, "ok".to_string()), "{p}");
    }
    let v = s.get("/version").await.json();
    assert_eq!(v["major"], "1");

    let v3root = s.get("/openapi/v3").await.json();
    let url = v3root["paths"]["apis/demo.kshard.dev/v1"]["serverRelativeURL"]
        .as_str()
        .expect("url")
        .to_string();
    let doc = s.get(&url).await.json();
    assert!(doc["components"]["schemas"]["dev.kshard.demo.v1.Widget"].is_object());
    let v2 = s.get("/openapi/v2").await;
    assert_eq!(v2.status, 200);
    let etag = v2
        .headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("etag")
        .to_string();
    assert_eq!(
        s.raw("GET", "/openapi/v2", &[("if-none-match", &etag)], vec![])
            .await
            .status,
        304
    );
    // kubectl explain works from the served OpenAPI.
    let out = s.kubectl_ok(&["explain", "widgets.spec"]);
    assert!(
        out.contains("replicas") && out.contains("Number of desired replicas"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn insecure_listener_serves_plain_http_for_debugging() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = common::start_with(|c| c.insecure_listen = Some("127.0.0.1:0".parse().expect("addr")))
        .await;
    let addr = s.running.insecure_addr.expect("insecure listener");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        b"GET /apis/demo.kshard.dev/v1 HTTP/1.1\r\nHost: kshard\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("write");
    let mut resp = String::new();
    tcp.read_to_string(&mut resp).await.expect("read");
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(resp.contains("\"kind\":\"APIResourceList\""), "{resp}");
}

/// A huge `timeoutSeconds` is clamped, not an overflow in the watch task.
#[tokio::test(flavor = "multi_thread")]
async fn watch_with_the_largest_timeout_serves_events() {
    use http_body_util::BodyExt;
    let s = common::start().await;
    assert_eq!(
        s.post_json(common::WIDGETS, &common::widget("w1", 1))
            .await
            .status,
        201
    );
    let req = http::Request::get(format!(
        "{}?watch=true&timeoutSeconds=9223372036854775807",
        common::WIDGETS
    ))
    .body(kube::client::Body::empty())
    .expect("request");
    let resp = s.client.send(req).await.expect("watch");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
        .await
        .expect("a frame within 10 s")
        .expect("a frame")
        .expect("data");
    let data = frame.into_data().expect("data frame");
    let ev: serde_json::Value = serde_json::from_slice(&data).expect("event");
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "w1");
    drop(body);
    assert_eq!(s.get(&format!("{}/w1", common::WIDGETS)).await.status, 200);
}

/// `1e2` in an integer field is stored as kube stores it: `100`, not `100.0`.
#[tokio::test(flavor = "multi_thread")]
async fn whole_numbers_keep_kube_integer_form() {
    let s = common::start().await;
    let body = br#"{"apiVersion":"demo.kshard.dev/v1","kind":"Widget","metadata":{"name":"n1"},"spec":{"replicas":1e2,"color":"blue","ratio":2.5,"count":3.0}}"#;
    let r = s
        .raw(
            "POST",
            WIDGETS,
            &[("content-type", "application/json")],
            body.to_vec(),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let text = s.get(&format!("{WIDGETS}/n1")).await.text();
    // 100 exactly (not 100.0 or 1e2), whatever key follows it.
    assert!(
        text.contains("\"replicas\":100,") || text.contains("\"replicas\":100}"),
        "{text}"
    );
    assert!(text.contains("\"count\":3"), "{text}");
    assert!(!text.contains("\"count\":3.0"), "{text}");
    assert!(text.contains("\"ratio\":2.5"), "{text}");
}

/// kube-apiserver (Go's crypto/tls) picks the cipher suite by its own order,
/// AES-128-GCM first, even from a client that lists AES-256-GCM first, as
/// rustls and OpenSSL clients do; a client offering only another suite is
/// still served.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_chooses_aes_128_gcm_as_kube_apiserver_does() {
    use rustls::CipherSuite;
    let s = common::start().await;
    let handshake = |suites: Option<Vec<CipherSuite>>, tls12: bool| {
        let s = &s;
        async move {
            let mut provider = rustls::crypto::ring::default_provider();
            if let Some(keep) = &suites {
                provider.cipher_suites.retain(|c| keep.contains(&c.suite()));
            }
            let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
                &[&rustls::version::TLS12]
            } else {
                &[&rustls::version::TLS13]
            };
            let connector = common::tls_connector_with(s, provider, versions, &[b"http/1.1"]);
            let tcp = tokio::net::TcpStream::connect(s.running.addr)
                .await
                .expect("connect");
            let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
            let tls = connector.connect(name, tcp).await.expect("handshake");
            tls.get_ref().1.negotiated_cipher_suite().map(|c| c.suite())
        }
    };
    let client_order: Vec<_> = rustls::crypto::ring::default_provider()
        .cipher_suites
        .iter()
        .map(|c| c.suite())
        .collect();
    assert_eq!(
        client_order.first(),
        Some(&CipherSuite::TLS13_AES_256_GCM_SHA384),
        "the client prefers AES-256"
    );
    assert_eq!(
        handshake(None, false).await,
        Some(CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
    assert_eq!(
        handshake(None, true).await,
        Some(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
    );
    assert_eq!(
        handshake(
            Some(vec![CipherSuite::TLS13_CHACHA20_POLY1305_SHA256]),
            false
        )
        .await,
        Some(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256)
    );
}

/// Issue 42, item 6: `--max-request-body-bytes` is the one body limit. Raised
/// to 5 MiB, a 4 MiB body (over kube's default 3 MiB) is served; a 6 MiB body
/// gets kube's 413 with the configured limit in its message.
#[tokio::test(flavor = "multi_thread")]
async fn the_request_body_limit_is_the_configured_one() {
    const MIB: usize = 1024 * 1024;
    let s = common::start_with(|c| {
        c.connections.max_request_body_bytes = 5 * MIB as u64;
        c.connections.max_buffered_request_body_bytes = 64 * MIB as u64;
    })
    .await;
    // Whitespace after the object: a large body, a small object.
    let padded = |name: &str, size: usize| {
        let mut body = serde_json::to_vec(&common::widget(name, 1)).expect("json");
        body.resize(size, b' ');
        body
    };
    let json = [("content-type", "application/json")];
    let r = s.raw("POST", WIDGETS, &json, padded("big", 4 * MIB)).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s
        .raw("POST", WIDGETS, &json, padded("bigger", 6 * MIB))
        .await;
    assert_eq!(r.status, 413, "{}", r.text());
    let status = r.json();
    assert_eq!(status["reason"], "RequestEntityTooLarge");
    assert_eq!(
        status["message"],
        format!("Request entity too large: limit is {}", 5 * MIB)
    );
}
