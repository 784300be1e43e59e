//! kshard as an aggregated APIService, against the HOST DOUBLE
//! (`common::host`: an HTTPS server speaking the Kubernetes API for
//! TokenReview, SubjectAccessReview, ConfigMaps and Namespaces, and proxying
//! like kube-aggregator). Covers front-proxy and token authentication,
//! delegated authorization with its caches, impersonation, ConfigMap CA
//! rotation, namespace lifecycle, readiness and serving-certificate reload.

mod common;

use common::send;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::host::{HostDouble, User};
use serde_json::{json, Value};

struct Setup {
    host: HostDouble,
    kshard: common::TestServer,
    /// kube-aggregator's connection: the front-proxy certificate (CN front-proxy-client).
    aggregator: kube::Client,
    _dir: tempfile::TempDir,
}

async fn setup(tune: impl FnOnce(&mut kshard::server::ServeConfig)) -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let host = HostDouble::start(dir.path()).await;
    let hk = host.kubeconfig.clone();
    let kshard = common::start_with(move |c| {
        c.host_kubeconfig = Some(hk);
        c.authorization_allow_ttl = Duration::from_secs(2);
        c.authorization_deny_ttl = Duration::from_secs(2);
        tune(c);
    })
    .await;
    let ca = std::fs::read_to_string(
        kshard
            .running
            .kubeconfig
            .with_file_name("pki")
            .join("ca.crt"),
    )
    .expect("kshard ca");
    host.aggregate(kshard.running.addr, &ca, "front-proxy-client")
        .await;
    let agg_kc = dir.path().join("front-proxy-front-proxy-client.kubeconfig");
    let aggregator = common::client_for(&agg_kc).await;
    let s = Setup {
        host,
        kshard,
        aggregator,
        _dir: dir,
    };
    s.wait_ready().await;
    s
}

const AGGREGATOR: [(&str, &str); 2] = [
    ("x-remote-user", "system:kube-aggregator"),
    ("x-remote-group", "system:masters"),
];

impl Setup {
    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, _, body) = send(&self.aggregator, "GET", "/readyz", &AGGREGATOR, None).await;
            if code == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "kshard never ready: {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// kube-aggregator's availability probe: the group-version as system:kube-aggregator.
    async fn discovery_probe(&self) -> (u16, http::HeaderMap, String) {
        send(
            &self.aggregator,
            "GET",
            "/apis/demo.kshard.dev/v1",
            &AGGREGATOR,
            None,
        )
        .await
    }

    /// A request as `user` through the front proxy's headers.
    async fn as_user(
        &self,
        user: &str,
        groups: &[&str],
        method: &str,
        uri: &str,
        body: Option<&Value>,
    ) -> (u16, String) {
        let mut h = vec![("x-remote-user", user)];
        for g in groups {
            h.push(("x-remote-group", g));
        }
        let (code, _, body) = send(&self.aggregator, method, uri, &h, body).await;
        (code, body)
    }

    fn kubectl(&self, token: &str, args: &[&str]) -> std::process::Output {
        common::kubectl_with(&self.host.user_kubeconfig(token), args, None)
    }
}

/// alice may do anything with widgets in `default`; everyone else is denied
/// with a reason, as RBAC would say.
fn alice_policy(spec: &Value) -> (bool, String) {
    let ra = &spec["resourceAttributes"];
    if spec["user"] == "alice" && ra["resource"] == "widgets" && ra["namespace"] == "default" {
        return (true, "RBAC: allowed by RoleBinding \"widgets\"".into());
    }
    (false, String::new())
}

fn widget(name: &str) -> Value {
    json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
           "metadata": {"name": name}, "spec": {"replicas": 1, "color": "blue"}})
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_through_the_front_proxy_and_aggregator_probes() {
    let s = setup(|_| {}).await;
    s.host.state.set_policy(alice_policy);
    s.host
        .state
        .add_token("alice-token", User::new("alice", &["devs"]));
    s.host
        .state
        .add_token("bob-token", User::new("bob", &["devs"]));

    // The aggregator's availability probe and its aggregated-discovery fetch.
    let (code, _, body) = s.discovery_probe().await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"widgets\""), "{body}");
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    let mut h = AGGREGATOR.to_vec();
    h.push(("accept", accept));
    let (code, headers, body) = send(&s.aggregator, "GET", "/apis", &h, None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("APIGroupDiscoveryList"), "{body}");
    let etag = headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("etag")
        .to_string();
    h.push(("if-none-match", &etag));
    let (code, _, _) = send(&s.aggregator, "GET", "/apis", &h, None).await;
    assert_eq!(code, 304);

    // kubectl, talking to the host, reaches kshard as alice.
    let kc = s.host.user_kubeconfig("alice-token");
    let out = common::kubectl_with(
        &kc,
        &["create", "-f", "-"],
        Some(&serde_json::to_string(&widget("w1")).expect("json")),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.kubectl("alice-token", &["get", "widgets", "-o", "name"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "widget.demo.kshard.dev/w1"
    );
    let out = s.kubectl(
        "alice-token",
        &[
            "api-resources",
            "--api-group",
            "demo.kshard.dev",
            "-o",
            "name",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("widgets.demo.kshard.dev"));
    let out = common::kubectl_with(
        &kc,
        &["apply", "--server-side", "-f", "-"],
        Some(&serde_json::to_string(&widget("w2")).expect("json")),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("serverside-applied"));

    // The review kshard sent carries the full attributes and alice's groups.
    let reviewed = s.host.state.reviewed.lock().expect("reviewed").clone();
    let list = reviewed
        .iter()
        .find(|r| r["resourceAttributes"]["verb"] == "list" && r["user"] == "alice")
        .expect("a list review");
    assert_eq!(
        list["resourceAttributes"],
        json!({"namespace": "default", "verb": "list", "group": "demo.kshard.dev",
               "version": "v1", "resource": "widgets"})
    );
    let groups: Vec<&str> = list["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        groups.contains(&"devs") && groups.contains(&"system:authenticated"),
        "{groups:?}"
    );

    // kubectl get -w through the host sees a change made meanwhile: once it
    // has printed the initial list, the watch is open.
    let watch = common::KubectlStream::spawn(
        &kc,
        &[
            "get",
            "widgets",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,R:.spec.replicas",
        ],
    );
    while watch.next_row().first().map(String::as_str) != Some("w1") {}
    let out = s.kubectl("alice-token", &["scale", "widget", "w1", "--replicas=7"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    watch.wait_for_row(&["w1", "7"]);

    // bob is denied with kube's message.
    let out = s.kubectl("bob-token", &["get", "widgets"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("widgets.demo.kshard.dev is forbidden: User \"bob\" cannot list resource \"widgets\" in API group \"demo.kshard.dev\" in the namespace \"default\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_reviews_are_cached() {
    let s = setup(|_| {}).await;
    s.host.state.set_policy(alice_policy);
    s.host
        .state
        .add_token("alice-token", User::new("alice", &[]));
    // Straight to kshard with a bearer token: kshard asks the host (TokenReview).
    let kc = s.kshard.dir.path().join("alice-direct.kubeconfig");
    let ca = std::fs::read_to_string(
        s.kshard
            .running
            .kubeconfig
            .with_file_name("pki")
            .join("ca.crt"),
    )
    .expect("ca");
    common::host::write_kubeconfig(
        &kc,
        &format!("https://{}", s.kshard.running.addr),
        &ca,
        Some("alice-token"),
        None,
    );
    let alice = common::client_for(&kc).await;
    let reviews_before = s.host.state.token_reviews.load(Ordering::SeqCst);
    let access_before = s.host.state.access_reviews.load(Ordering::SeqCst);
    for _ in 0..3 {
        let (code, _, body) = send(&alice, "GET", common::WIDGETS, &[], None).await;
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!(
        s.host.state.token_reviews.load(Ordering::SeqCst) - reviews_before,
        1
    );
    assert_eq!(
        s.host.state.access_reviews.load(Ordering::SeqCst) - access_before,
        1
    );

    // A denial is cached too: flipping the policy has no effect until the TTL passes.
    s.host.state.set_policy(|_| (false, "revoked".into()));
    let (code, _, _) = send(&alice, "GET", common::WIDGETS, &[], None).await;
    assert_eq!(code, 200, "allow answer still cached");
    // Once the allow answer's TTL has passed, the host is asked again.
    common::eventually("the cached allow answer expires", || async {
        send(&alice, "GET", common::WIDGETS, &[], None).await.0 == 403
    })
    .await;
    let (code, _, body) = send(&alice, "GET", common::WIDGETS, &[], None).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("in the namespace \\\"default\\\": revoked"),
        "{body}"
    );
    s.host.state.set_policy(alice_policy);
    let (code, _, _) = send(&alice, "GET", common::WIDGETS, &[], None).await;
    assert_eq!(code, 403, "deny answer still cached");
    common::eventually("the cached deny answer expires", || async {
        send(&alice, "GET", common::WIDGETS, &[], None).await.0 == 200
    })
    .await;

    // An unknown token is anonymous: 401.
    common::host::write_kubeconfig(
        &kc,
        &format!("https://{}", s.kshard.running.addr),
        &ca,
        Some("stolen"),
        None,
    );
    let nobody = common::client_for(&kc).await;
    let (code, _, body) = send(&nobody, "GET", common::WIDGETS, &[], None).await;
    assert_eq!(code, 401, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn front_proxy_trust_rotation_and_impersonation() {
    let s = setup(|_| {}).await;
    s.host.state.set_policy(alice_policy);
    let ca = std::fs::read_to_string(
        s.kshard
            .running
            .kubeconfig
            .with_file_name("pki")
            .join("ca.crt"),
    )
    .expect("ca");
    let dir = s.kshard.dir.path();
    let client_with = |name: &str, cert: Option<(String, String)>| {
        let path = dir.join(format!("{name}.kubeconfig"));
        common::host::write_kubeconfig(
            &path,
            &format!("https://{}", s.kshard.running.addr),
            &ca,
            None,
            cert.as_ref(),
        );
        path
    };
    let alice_hdr = [("x-remote-user", "alice"), ("x-remote-group", "devs")];

    // X-Remote-* without a proxy certificate: ignored; the request is
    // anonymous, and the host does not authorize system:anonymous.
    let anon = common::client_for(&client_with("anon", None)).await;
    let (code, _, body) = send(&anon, "GET", common::WIDGETS, &alice_hdr, None).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:anonymous"), "{body}");
    // A certificate from the proxy CA with a CN that is not allowed: 401.
    let wrong_cn = common::client_for(&client_with(
        "wrong-cn",
        Some(s.host.front_proxy_ca.client("someone", &[])),
    ))
    .await;
    assert_eq!(
        send(&wrong_cn, "GET", common::WIDGETS, &alice_hdr, None)
            .await
            .0,
        401
    );
    // The allowed CN from another CA: 401.
    let rogue_ca = common::host::Ca::new("rogue");
    let rogue = common::client_for(&client_with(
        "rogue",
        Some(rogue_ca.client("front-proxy-client", &[])),
    ))
    .await;
    assert_eq!(
        send(&rogue, "GET", common::WIDGETS, &alice_hdr, None)
            .await
            .0,
        401
    );
    // The real proxy: alice is allowed.
    let (code, body) = s
        .as_user("alice", &["devs"], "GET", common::WIDGETS, None)
        .await;
    assert_eq!(code, 200, "{body}");

    // Impersonation needs the impersonate verb: alice may not become bob...
    let (code, _, body) = send(
        &s.aggregator,
        "GET",
        common::WIDGETS,
        &[("x-remote-user", "alice"), ("impersonate-user", "bob")],
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("users \\\"bob\\\" is forbidden: User \\\"alice\\\" cannot impersonate resource \\\"users\\\" in API group \\\"\\\" at the cluster scope"),
        "{body}"
    );
    // ...until the host allows it (and the cached denial has expired); then
    // the request runs, and is authorized, as bob.
    s.host.state.set_policy(|spec| {
        let ra = &spec["resourceAttributes"];
        let ok = (spec["user"] == "alice" && ra["verb"] == "impersonate" && ra["name"] == "bob")
            || (spec["user"] == "bob" && ra["resource"] == "widgets");
        (ok, String::new())
    });
    common::eventually("the cached impersonation denial expires", || async {
        let h = [("x-remote-user", "alice"), ("impersonate-user", "bob")];
        send(&s.aggregator, "GET", common::WIDGETS, &h, None)
            .await
            .0
            == 200
    })
    .await;
    let (code, _, body) = send(
        &s.aggregator,
        "GET",
        common::WIDGETS,
        &[("x-remote-user", "alice"), ("impersonate-user", "bob")],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(s
        .host
        .state
        .reviewed
        .lock()
        .expect("reviewed")
        .iter()
        .any(|r| r["user"] == "bob" && r["resourceAttributes"]["verb"] == "list"));

    // The host rotates the front-proxy CA: the old proxy certificate stops
    // working and a new one works, without restarting kshard.
    let new_ca = common::host::Ca::new("front-proxy-ca-2");
    s.host.state.put_configmap(
        "kube-system",
        "extension-apiserver-authentication",
        common::host::authentication_configmap_data(
            &s.host.client_ca.pem,
            &new_ca.pem,
            &["front-proxy-client"],
        ),
    );
    let rotated = common::client_for(&client_with(
        "rotated",
        Some(new_ca.client("front-proxy-client", &[])),
    ))
    .await;
    let master = [
        ("x-remote-user", "carol"),
        ("x-remote-group", "system:masters"),
    ];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let new_ok = send(&rotated, "GET", common::WIDGETS, &master, None)
            .await
            .0
            == 200;
        let old_refused = send(&s.aggregator, "GET", common::WIDGETS, &master, None)
            .await
            .0
            == 401;
        if new_ok && old_refused {
            break;
        }
        assert!(Instant::now() < deadline, "rotation never took effect");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn namespace_lifecycle_follows_the_host() {
    let s = setup(|_| {}).await;
    let master = ["system:masters"];
    let in_ns = |ns: &str| format!("/apis/demo.kshard.dev/v1/namespaces/{ns}/widgets");

    let (code, body) = s
        .as_user("carol", &master, "POST", &in_ns("nope"), Some(&widget("w")))
        .await;
    assert_eq!(code, 404, "{body}");
    let v: Value = serde_json::from_str(&body).expect("status");
    assert_eq!(v["message"], "namespaces \"nope\" not found");
    assert_eq!(v["details"], json!({"name": "nope", "kind": "namespaces"}));

    // A namespace the host has just created is usable at once.
    s.host.state.put_namespace("team-a", false);
    let (code, body) = s
        .as_user(
            "carol",
            &master,
            "POST",
            &in_ns("team-a"),
            Some(&widget("w1")),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let (code, body) = s
        .as_user(
            "carol",
            &master,
            "POST",
            &in_ns("team-a"),
            Some(&widget("w2")),
        )
        .await;
    assert_eq!(code, 201, "{body}");

    // Terminating: creates refused with kube's message and cause; reads and deletes go on.
    s.host.state.put_namespace("team-a", true);
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let (code, body) = s
            .as_user(
                "carol",
                &master,
                "POST",
                &in_ns("team-a"),
                Some(&widget("w3")),
            )
            .await;
        if code == 403 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "terminating namespace never seen: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v: Value = serde_json::from_str(&body).expect("status");
    assert_eq!(
        v["message"],
        "widgets.demo.kshard.dev \"w3\" is forbidden: unable to create new content in namespace team-a because it is being terminated"
    );
    assert_eq!(
        v["details"]["causes"],
        json!([{"reason": "NamespaceTerminating", "message": "namespace team-a is being terminated",
                "field": "metadata.namespace"}])
    );

    // The host's namespace controller cleans up with the metadata client:
    // protobuf-then-JSON PartialObjectMetadataList, then deletecollection.
    let meta_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let controller = [
        (
            "x-remote-user",
            "system:serviceaccount:kube-system:namespace-controller",
        ),
        ("x-remote-group", "system:masters"),
        ("accept", meta_accept),
    ];
    let (code, headers, _) = send(&s.aggregator, "GET", &in_ns("team-a"), &controller, None).await;
    assert_eq!(code, 200);
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf")
    );
    let (code, _, body) = send(&s.aggregator, "DELETE", &in_ns("team-a"), &controller, None).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = s
        .as_user("carol", &master, "GET", &in_ns("team-a"), None)
        .await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).expect("list");
    assert_eq!(v["items"], json!([]), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_waits_for_the_authentication_configmap() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = HostDouble::start(dir.path()).await;
    let cm_path = "/api/v1/namespaces/kube-system/configmaps".to_string();
    host.state
        .unavailable
        .lock()
        .expect("lock")
        .push(cm_path.clone());
    let hk = host.kubeconfig.clone();
    let kshard = common::start_with(move |c| c.host_kubeconfig = Some(hk)).await;
    // /readyz is anonymous-accessible; the dev kubeconfig's certificate is not trusted here.
    let ca = std::fs::read_to_string(
        kshard
            .running
            .kubeconfig
            .with_file_name("pki")
            .join("ca.crt"),
    )
    .expect("ca");
    let kc = dir.path().join("anon.kubeconfig");
    common::host::write_kubeconfig(
        &kc,
        &format!("https://{}", kshard.running.addr),
        &ca,
        None,
        None,
    );
    let anon = common::client_for(&kc).await;
    let (code, _, body) = send(&anon, "GET", "/readyz", &[], None).await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]authentication-config failed: reason withheld"),
        "{body}"
    );
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    let (code, _, _) = send(&anon, "GET", "/livez", &[], None).await;
    assert_eq!(code, 200, "liveness is not readiness");

    host.state.unavailable.lock().expect("lock").clear();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, body) = send(&anon, "GET", "/readyz?verbose", &[], None).await;
        if code == 200 {
            assert!(body.contains("[+]authentication-config ok"), "{body}");
            assert!(body.contains("[+]namespace-informer-sync ok"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn serving_certificate_reloads_without_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = common::host::Ca::new("serving-ca-1");
    let (c, k) = first.server(&["localhost", "127.0.0.1", "kshard.kshard-system.svc"]);
    std::fs::write(&cert_path, c).expect("cert");
    std::fs::write(&key_path, k).expect("key");
    let (cp, kp) = (cert_path.clone(), key_path.clone());
    let kshard = common::start_with(move |c| {
        c.tls_cert_file = Some(cp);
        c.tls_private_key_file = Some(kp);
    })
    .await;
    let server = format!("https://{}", kshard.running.addr);
    let trusting = |ca: &common::host::Ca, name: &str| {
        let p = dir.path().join(format!("{name}.kubeconfig"));
        common::host::write_kubeconfig(&p, &server, &ca.pem, None, None);
        p
    };
    let c1 = common::client_for(&trusting(&first, "first")).await;
    assert_eq!(send(&c1, "GET", "/livez", &[], None).await.0, 200);

    let second = common::host::Ca::new("serving-ca-2");
    let (c, k) = second.server(&["localhost", "127.0.0.1"]);
    std::fs::write(&key_path, k).expect("key");
    std::fs::write(&cert_path, c).expect("cert");
    let kc2 = trusting(&second, "second");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // A fresh client makes a fresh TLS connection.
        let c2 = common::client_for(&kc2).await;
        let ok = c2
            .send(
                http::Request::get("/livez")
                    .body(kube::client::Body::empty())
                    .expect("req"),
            )
            .await
            .is_ok();
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "new certificate never served");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn discovery_for_the_aggregator_is_exempt_while_load_is_shed() {
    let s = setup(|_| {}).await;
    s.host.state.set_policy(alice_policy);
    // Every authenticated user lands in a level that rejects everything.
    let shed: kshard::flowcontrol::FlowSchema = serde_json::from_value(json!({
        "metadata": {"name": "shed-everyone"},
        "spec": {
            "priorityLevelConfiguration": {"name": "shed"},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "Group", "group": {"name": "system:authenticated"}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "namespaces": ["*"], "clusterScope": true}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }))
    .expect("schema");
    let report = s.kshard.running.apf.replace_config(
        vec![shed],
        vec![common::apf::level("shed", 0, json!({"type": "Reject"}))],
    );
    assert!(report.invalid.is_empty(), "{:?}", report.invalid);
    let shed_now = |code: u16| code == 429;
    // A level of one seat rejects once that seat is busy; keep it busy with a watch-free
    // stream of requests from alice and check she is being shed.
    let mut shed_seen = false;
    for _ in 0..50 {
        let (a, b) = tokio::join!(
            s.as_user("alice", &["devs"], "GET", "/apis/demo.kshard.dev/v1", None),
            s.as_user("alice", &["devs"], "GET", common::WIDGETS, None),
        );
        if shed_now(a.0) || shed_now(b.0) {
            shed_seen = true;
            break;
        }
    }
    assert!(shed_seen, "alice's requests should be shed");
    // The aggregator (system:masters) still gets discovery, well under its 5 s timeout.
    for _ in 0..20 {
        let (code, headers, body) = s.discovery_probe().await;
        assert_eq!(code, 200, "{body}");
        let pl = headers
            .get("x-kubernetes-pf-prioritylevel-uid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let exempt_uid = s
            .kshard
            .running
            .apf
            .snapshot()
            .levels
            .iter()
            .find(|l| l.name == "exempt")
            .map(|l| l.uid.clone())
            .unwrap_or_default();
        assert_eq!(
            pl, exempt_uid,
            "discovery for masters runs in the exempt level"
        );
    }
}

/// Authorization and routing read the same decoded path: an encoded `/`
/// cannot reach a subresource the user may not touch.
#[tokio::test(flavor = "multi_thread")]
async fn encoded_slash_cannot_bypass_subresource_authorization() {
    let s = setup(|_| {}).await;
    s.host.state.set_policy(|spec| {
        let ra = &spec["resourceAttributes"];
        let main_resource_only =
            ra["resource"] == "widgets" && ra["subresource"].as_str().unwrap_or("").is_empty();
        (spec["user"] == "alice" && main_resource_only, String::new())
    });
    let alice = [("x-remote-user", "alice"), ("x-remote-group", "devs")];
    let (code, _, body) = send(
        &s.aggregator,
        "POST",
        common::WIDGETS,
        &alice,
        Some(&widget("w1")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (_, _, live) = send(
        &s.aggregator,
        "GET",
        &format!("{}/w1", common::WIDGETS),
        &alice,
        None,
    )
    .await;
    let mut obj: Value = serde_json::from_str(&live).expect("json");
    obj["status"] = json!({"replicas": 9});
    for (path, sub) in [
        ("w1%2Fstatus", "status"),
        ("w1%2fstatus", "status"),
        ("w1%2Fscale", "scale"),
    ] {
        let uri = format!("{}/{path}", common::WIDGETS);
        let (code, _, body) = send(&s.aggregator, "PUT", &uri, &alice, Some(&obj)).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains(&format!("cannot update resource \\\"widgets/{sub}\\\"")),
            "{path}: {body}"
        );
    }
    let (_, _, after) = send(
        &s.aggregator,
        "GET",
        &format!("{}/w1", common::WIDGETS),
        &alice,
        None,
    )
    .await;
    let after: Value = serde_json::from_str(&after).expect("json");
    assert!(
        after
            .get("status")
            .is_none_or(|st| st.get("replicas").is_none()),
        "{after}"
    );
    // Dot segments and extra segments are ordinary segments, as in kube:
    // still the status subresource, still refused.
    for path in [
        "w1/status/..",
        "w1/status/extra",
        "w1/status/",
        "w1%2Fstatus%2F..",
    ] {
        let uri = format!("{}/{path}", common::WIDGETS);
        let (code, _, body) = send(&s.aggregator, "PUT", &uri, &alice, Some(&obj)).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("widgets/status"), "{path}: {body}");
    }
    // Decoded once only: a double-encoded slash is part of a name, which is
    // authorized as the main resource and then refused as an invalid name.
    let uri = format!("{}/w1%252Fstatus", common::WIDGETS);
    let (code, _, body) = send(&s.aggregator, "PUT", &uri, &alice, Some(&obj)).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains(r#"Name parameter invalid: \"w1%2Fstatus\": may not contain '%'"#),
        "{body}"
    );
    let (code, _, body) = send(
        &s.aggregator,
        "GET",
        &format!("{}/%2e%2e", common::WIDGETS),
        &alice,
        None,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("may not be '..'"), "{body}");
    // `..` followed by a segment is a name and an unknown subresource: not
    // authorized for alice, who has only the main resource.
    let (code, _, body) = send(
        &s.aggregator,
        "GET",
        &format!("{}/%2e%2e/x", common::WIDGETS),
        &alice,
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    // The same request by name-only path is the main resource: allowed.
    let (code, _, body) = send(
        &s.aggregator,
        "GET",
        &format!("{}/w1", common::WIDGETS),
        &alice,
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
}
