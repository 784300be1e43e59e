//! kshard's own handling of what reaches it from the host, behind the REAL
//! HOST (`common::real_host`: etcd and kube-apiserver v1.36.2, kshard
//! installed from `manifests/base`): the TokenReviews and
//! SubjectAccessReviews it asks the host (counted in the host's audit log)
//! and their caches, impersonation, authorization on the decoded path, the
//! front proxy's trust (from the host's authentication ConfigMap, through a
//! CA rotation), and flow control sparing the aggregator's discovery.
//!
//! Through the host, kube-apiserver authenticates, authorizes and
//! impersonates before it proxies, so what kshard decides itself is reached
//! **straight**: with the aggregator's real front-proxy client certificate
//! and the `X-Remote-*` headers kube-aggregator would send, or with a bearer
//! token. What users see through the host is checked through it too.

mod common;

use common::send;

use std::time::{Duration, Instant};

use common::real_host::{poll, Installed, RealHost, ALICE, BOB};
use serde_json::{json, Value};

const TEAM_A: &str = "/apis/demo.kshard.dev/v1/namespaces/team-a/widgets";
const TEAM_B: &str = "/apis/demo.kshard.dev/v1/namespaces/team-b/widgets";

/// A real host with kshard installed (with `extra` flags) and a namespace `team-a`.
struct Behind {
    host: RealHost,
    kshard: Installed,
    _dir: tempfile::TempDir,
}

fn behind(extra: &[&str]) -> Behind {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(extra);
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    Behind {
        host,
        kshard,
        _dir: dir,
    }
}

impl Behind {
    /// A client straight at kshard with a bearer token and/or a client certificate.
    async fn straight(
        &self,
        name: &str,
        token: Option<&str>,
        cert: Option<&(String, String)>,
    ) -> kube::Client {
        let path = self.host.dir.join(format!("straight-{name}.kubeconfig"));
        common::tls::write_kubeconfig(
            &path,
            &format!("https://127.0.0.1:{}", self.kshard.port),
            &self.kshard.ca.pem,
            token,
            cert,
        );
        common::client_for(&path).await
    }

    /// kube-aggregator's connection to kshard: the host's proxy client
    /// certificate, as it is now.
    async fn aggregator(&self) -> kube::Client {
        self.straight("aggregator", None, Some(&self.host.proxy_client_cert()))
            .await
    }

    /// Applies RBAC objects on the host and waits until its authorizer
    /// grants each binding's subject the first rule of its role.
    fn rbac(&self, objects: &[Value]) {
        self.host.apply(objects);
        for b in objects.iter().filter(|o| o["roleRef"].is_object()) {
            let namespace = b["metadata"]["namespace"].as_str().unwrap_or("");
            let Some(rule) = objects.iter().find_map(|r| {
                let same = r["kind"] == b["roleRef"]["kind"]
                    && r["metadata"]["name"] == b["roleRef"]["name"]
                    && r["metadata"]["namespace"].as_str().unwrap_or("") == namespace;
                same.then(|| r["rules"][0].clone())
            }) else {
                continue;
            };
            let verb = rule["verbs"][0].as_str().unwrap_or("get").to_string();
            let group = rule["apiGroups"][0].as_str().unwrap_or("");
            let resource = rule["resources"][0].as_str().unwrap_or("");
            let resource = if group.is_empty() {
                resource.to_string()
            } else {
                format!("{resource}.{group}")
            };
            let subject = &b["subjects"][0];
            let name = subject["name"].as_str().unwrap_or("");
            let mut args = vec![verb, resource];
            if subject["kind"] == "Group" {
                args.extend(["--as=rbac-probe".into(), format!("--as-group={name}")]);
            } else {
                args.push(format!("--as={name}"));
            }
            if !namespace.is_empty() {
                args.extend(["-n".into(), namespace.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.host.wait_can_i(&args);
        }
    }
}

/// A Role or ClusterRole with one rule: `verbs` on `resources` of kshard's
/// demo group (or, for `users`, of the core group, where impersonation is).
fn role(kind: &str, name: &str, namespace: &str, verbs: &[&str], resources: &[&str]) -> Value {
    let group = if resources == ["users"] {
        ""
    } else {
        "demo.kshard.dev"
    };
    let rule = json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let mut r = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
                       "metadata": {"name": name}, "rules": [rule]});
    if !namespace.is_empty() {
        r["metadata"]["namespace"] = json!(namespace);
    }
    r
}

fn binding(kind: &str, name: &str, namespace: &str, role: &str, subject: (&str, &str)) -> Value {
    let role_kind = if kind == "RoleBinding" {
        "Role"
    } else {
        "ClusterRole"
    };
    let mut b = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject.0, "name": subject.1}]});
    if !namespace.is_empty() {
        b["metadata"]["namespace"] = json!(namespace);
    }
    b
}

/// What kube-aggregator sends for alice (token file: group `devs`).
const ALICE_HEADERS: [(&str, &str); 3] = [
    ("x-remote-user", "alice"),
    ("x-remote-group", "devs"),
    ("x-remote-group", "system:authenticated"),
];

/// kshard asks the host who a bearer token is (TokenReview) and whether a
/// user may do something (SubjectAccessReview), with the request's full
/// attributes, and caches both answers: the host's audit log shows one
/// review of each for several requests. A revoked permission is honoured
/// once the cached allow expires, and the refusal carries the host's RBAC
/// reason; a restored one once the cached denial expires. An unknown token
/// is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_reviews_go_to_the_host_and_are_cached() {
    use k8s_openapi::api::rbac::v1::Role;
    let b = behind(&[
        "--authorization-webhook-cache-authorized-ttl=4s",
        "--authorization-webhook-cache-unauthorized-ttl=4s",
        "--authentication-token-webhook-cache-ttl=60s",
    ]);
    let editor = role(
        "Role",
        "widget-editor",
        "team-a",
        &["get", "list", "watch", "create"],
        &["widgets"],
    );
    b.rbac(&[
        editor.clone(),
        binding(
            "RoleBinding",
            "devs-edit",
            "team-a",
            "widget-editor",
            ("Group", "devs"),
        ),
    ]);
    let roles: kube::Api<Role> = kube::Api::namespaced(b.host.client().await, "team-a");
    let alice = b.straight("alice", Some(ALICE.0), None).await;
    let of_alice = |resource: &str| -> Vec<Value> {
        b.host
            .reviews(resource)
            .into_iter()
            .filter(|spec| spec["token"] == ALICE.0 || spec["user"] == ALICE.1)
            .collect()
    };
    let (tokens_before, access_before) = (
        of_alice("tokenreviews").len(),
        of_alice("subjectaccessreviews").len(),
    );

    for _ in 0..3 {
        let (code, _, body) = send(&alice, "GET", TEAM_A, &[], None).await;
        assert_eq!(code, 200, "{body}");
    }
    // Revoked on the host (the binding stays, its Role goes): the allow
    // answer is still cached.
    roles
        .delete("widget-editor", &Default::default())
        .await
        .expect("delete the role");
    let (code, _, body) = send(&alice, "GET", TEAM_A, &[], None).await;
    assert_eq!(code, 200, "the cached allow answer: {body}");
    // Four requests, one review of each kind. (The audit log is written as
    // the host answers; give it a moment before counting.)
    b.host
        .wait_until("the host's audit log", Duration::from_secs(10), || {
            of_alice("subjectaccessreviews").len() > access_before
        });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(of_alice("tokenreviews").len() - tokens_before, 1);
    let reviews = of_alice("subjectaccessreviews");
    assert_eq!(reviews.len() - access_before, 1, "{reviews:#?}");
    let review = reviews.last().expect("a review");
    assert_eq!(
        review["resourceAttributes"],
        json!({"namespace": "team-a", "verb": "list", "group": "demo.kshard.dev",
               "version": "v1", "resource": "widgets"})
    );
    assert_eq!(review["uid"], "alice-uid");
    let groups: Vec<&str> = review["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        groups.contains(&"devs") && groups.contains(&"system:authenticated"),
        "{groups:?}"
    );

    // Once the allow answer expires, the host's refusal, with its reason.
    let mut refused = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused.is_empty() {
        let (code, _, body) = send(&alice, "GET", TEAM_A, &[], None).await;
        if code == 403 {
            refused = body;
        } else {
            assert_eq!(code, 200, "{body}");
            assert!(
                Instant::now() < deadline,
                "the revocation never took effect"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let status: Value = serde_json::from_str(&refused).expect("a Status");
    assert_eq!(
        status["message"],
        r#"widgets.demo.kshard.dev is forbidden: User "alice" cannot list resource "widgets" in API group "demo.kshard.dev" in the namespace "team-a": RBAC: role.rbac.authorization.k8s.io "widget-editor" not found"#
    );
    // Restored: the denial is cached in turn, then expires.
    roles
        .create(
            &Default::default(),
            &serde_json::from_value(editor).expect("role"),
        )
        .await
        .expect("restore the role");
    let (code, _, _) = send(&alice, "GET", TEAM_A, &[], None).await;
    assert_eq!(code, 403, "the cached deny answer");
    common::eventually("the cached deny answer expires", || async {
        send(&alice, "GET", TEAM_A, &[], None).await.0 == 200
    })
    .await;

    // A token the host does not know: 401, after asking it.
    let stolen = b.straight("stolen", Some("stolen-token"), None).await;
    let (code, _, body) = send(&stolen, "GET", TEAM_A, &[], None).await;
    assert_eq!(code, 401, "{body}");
    assert!(b
        .host
        .reviews("tokenreviews")
        .iter()
        .any(|spec| spec["token"] == "stolen-token"));
}

/// What kshard authorizes itself with the host's SubjectAccessReviews:
/// impersonation (the `impersonate` verb on `users`, then the request as the
/// impersonated user), and subresources on the path as decoded once, so an
/// encoded `/` cannot reach a subresource the user may not touch.
/// `kubectl --as` through the host reaches kshard as the impersonated user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_and_subresources_are_authorized_by_the_host() {
    let b = behind(&[
        "--authorization-webhook-cache-authorized-ttl=1s",
        "--authorization-webhook-cache-unauthorized-ttl=1s",
    ]);
    b.host.kubectl_ok(&["create", "namespace", "team-b"]);
    // alice edits widgets in team-a (not their status or scale); only bob
    // reads team-b.
    b.rbac(&[
        role(
            "Role",
            "widget-editor",
            "team-a",
            &["get", "list", "create", "update", "patch"],
            &["widgets"],
        ),
        binding(
            "RoleBinding",
            "alice-edit",
            "team-a",
            "widget-editor",
            ("User", "alice"),
        ),
        role(
            "Role",
            "widget-reader",
            "team-b",
            &["get", "list"],
            &["widgets"],
        ),
        binding(
            "RoleBinding",
            "bob-read",
            "team-b",
            "widget-reader",
            ("User", "bob"),
        ),
    ]);
    let agg = b.aggregator().await;
    let as_alice_as_bob = {
        let mut h = ALICE_HEADERS.to_vec();
        h.push(("impersonate-user", "bob"));
        h
    };

    // Impersonation needs the impersonate verb: alice may not become bob...
    let (code, _, body) = send(&agg, "GET", TEAM_B, &ALICE_HEADERS, None).await;
    assert_eq!(code, 403, "alice herself may not read team-b: {body}");
    let (code, _, body) = send(&agg, "GET", TEAM_B, &as_alice_as_bob, None).await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("a Status")["message"],
        r#"users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    // ...until the host allows it; then the request runs, and is
    // authorized, as bob.
    b.rbac(&[
        role(
            "ClusterRole",
            "impersonate-bob",
            "",
            &["impersonate"],
            &["users"],
        ),
        binding(
            "ClusterRoleBinding",
            "alice-impersonates",
            "",
            "impersonate-bob",
            ("User", "alice"),
        ),
    ]);
    common::eventually("the cached impersonation denial expires", || async {
        send(&agg, "GET", TEAM_B, &as_alice_as_bob, None).await.0 == 200
    })
    .await;
    // Through the host: kube-apiserver checks the impersonation itself and
    // sends kshard bob.
    let alice_kc = b.host.kubeconfig_for(ALICE.0);
    let out = common::kubectl_with(
        &alice_kc,
        &["get", "widgets", "-n", "team-b", "--as", BOB.1],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An encoded slash is decoded once, before authorization and routing.
    let (code, _, body) = send(
        &agg,
        "POST",
        TEAM_A,
        &ALICE_HEADERS,
        Some(&common::widget("w1", 1)),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (_, _, live) = send(&agg, "GET", &format!("{TEAM_A}/w1"), &ALICE_HEADERS, None).await;
    let mut obj: Value = serde_json::from_str(&live).expect("json");
    obj["status"] = json!({"replicas": 9});
    for (path, sub) in [
        ("w1%2Fstatus", "status"),
        ("w1%2fstatus", "status"),
        ("w1%2Fscale", "scale"),
    ] {
        let uri = format!("{TEAM_A}/{path}");
        let (code, _, body) = send(&agg, "PUT", &uri, &ALICE_HEADERS, Some(&obj)).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains(&format!("cannot update resource \\\"widgets/{sub}\\\"")),
            "{path}: {body}"
        );
    }
    let (_, _, after) = send(&agg, "GET", &format!("{TEAM_A}/w1"), &ALICE_HEADERS, None).await;
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
        let uri = format!("{TEAM_A}/{path}");
        let (code, _, body) = send(&agg, "PUT", &uri, &ALICE_HEADERS, Some(&obj)).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("widgets/status"), "{path}: {body}");
    }
    // Decoded once only: a double-encoded slash is part of a name, which is
    // authorized as the main resource and then refused as an invalid name.
    let uri = format!("{TEAM_A}/w1%252Fstatus");
    let (code, _, body) = send(&agg, "PUT", &uri, &ALICE_HEADERS, Some(&obj)).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains(r#"Name parameter invalid: \"w1%2Fstatus\": may not contain '%'"#),
        "{body}"
    );
    let (code, _, body) = send(
        &agg,
        "GET",
        &format!("{TEAM_A}/%2e%2e"),
        &ALICE_HEADERS,
        None,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("may not be '..'"), "{body}");
    // `..` followed by a segment is a name and an unknown subresource: not
    // authorized for alice, who has only the main resource.
    let (code, _, body) = send(
        &agg,
        "GET",
        &format!("{TEAM_A}/%2e%2e/x"),
        &ALICE_HEADERS,
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    let (code, _, body) = send(&agg, "GET", &format!("{TEAM_A}/w1"), &ALICE_HEADERS, None).await;
    assert_eq!(code, 200, "{body}");
}

/// The front proxy's trust comes from the host's
/// `kube-system/extension-apiserver-authentication` ConfigMap: only the
/// aggregator's certificate (the front-proxy CA's, with an allowed name)
/// may assert a user in headers; without read access to the ConfigMap
/// kshard is alive but not ready; and when the host rotates its front-proxy
/// CA (kube-apiserver reloads the CA and proxy certificate files and
/// republishes the ConfigMap) kshard follows without a restart: requests
/// through the host keep working, and once the old CA is dropped its
/// certificates are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_proxy_trust_follows_the_hosts_configmap() {
    let mut b = behind(&[]);
    b.rbac(&[
        role(
            "Role",
            "widget-reader",
            "team-a",
            &["get", "list"],
            &["widgets"],
        ),
        binding(
            "RoleBinding",
            "devs-read",
            "team-a",
            "widget-reader",
            ("Group", "devs"),
        ),
    ]);
    let agg = b.aggregator().await;
    let (code, _, body) = send(&agg, "GET", TEAM_A, &ALICE_HEADERS, None).await;
    assert_eq!(code, 200, "{body}");

    // Headers from anyone else are not trusted. Without a certificate they
    // are ignored: the caller is anonymous, whom the host's RBAC refuses.
    let anonymous = b.straight("anonymous", None, None).await;
    let (code, _, body) = send(&anonymous, "GET", TEAM_A, &ALICE_HEADERS, None).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"User \"system:anonymous\""#), "{body}");
    // A certificate of the front-proxy CA with a name not allowed, and the
    // allowed name from another CA: 401.
    let wrong_name = b.host.front_proxy_ca.client("someone", &[]);
    let rogue = common::tls::Ca::new("front-proxy-ca").client("front-proxy-client", &[]);
    for (name, cert) in [("wrong-name", &wrong_name), ("rogue", &rogue)] {
        let c = b.straight(name, None, Some(cert)).await;
        let (code, _, body) = send(&c, "GET", TEAM_A, &ALICE_HEADERS, None).await;
        assert_eq!(code, 401, "{name}: {body}");
    }

    // Not allowed to read the ConfigMap (the shipped RoleBinding removed,
    // kshard restarted): alive, not ready, and the aggregator not trusted.
    let reader: Value = serde_json::from_str(&b.host.kubectl_ok(&[
        "get",
        "rolebinding",
        "-n",
        "kube-system",
        "kshard:extension-apiserver-authentication-reader",
        "-o",
        "json",
    ]))
    .expect("the shipped RoleBinding");
    b.host.kubectl_ok(&[
        "delete",
        "rolebinding",
        "-n",
        "kube-system",
        "kshard:extension-apiserver-authentication-reader",
    ]);
    b.kshard.restart();
    let direct = b.host.dir.join("direct.kubeconfig");
    b.kshard.direct_kubeconfig(&direct, None);
    b.host
        .wait_until("kshard to serve again", Duration::from_secs(30), || {
            common::kubectl_with(&direct, &["get", "--raw", "/livez"], None)
                .status
                .success()
        });
    // New connections to the new process.
    let anonymous = b.straight("anonymous-again", None, None).await;
    let (code, _, body) = send(&anonymous, "GET", "/readyz", &[], None).await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]authentication-config failed: reason withheld"),
        "{body}"
    );
    // The aggregator's certificate means nothing without the ConfigMap:
    // its headers are ignored and its requests anonymous (as a kube
    // aggregated server that could not read it treats them).
    let agg = b.aggregator().await;
    let (code, _, body) = send(&agg, "GET", TEAM_A, &ALICE_HEADERS, None).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains(r#"User \"system:anonymous\""#), "{body}");
    // Allowed again: ready without a restart.
    let mut restored = reader.clone();
    restored["metadata"] = json!({"name": reader["metadata"]["name"],
        "namespace": "kube-system", "labels": reader["metadata"]["labels"]});
    b.host.apply(&[restored]);
    b.host
        .wait_until("kshard ready again", Duration::from_secs(60), || {
            common::kubectl_with(&direct, &["get", "--raw", "/readyz"], None)
                .status
                .success()
        });
    let (code, _, body) = send(&anonymous, "GET", "/readyz?verbose", &[], None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]authentication-config ok"), "{body}");
    let (code, _, body) = send(&agg, "GET", TEAM_A, &ALICE_HEADERS, None).await;
    assert_eq!(code, 200, "{body}");

    // The host rotates its front-proxy CA. First both CAs are trusted
    // (kube-apiserver adds the new one to the ConfigMap)...
    let old_cert = b.host.proxy_client_cert();
    let new_ca = common::tls::Ca::new("front-proxy-ca-2");
    let new_cert = new_ca.client("front-proxy-client", &[]);
    std::fs::write(
        b.host.pki("front-proxy-ca.crt"),
        format!("{}{}", b.host.front_proxy_ca.pem, new_ca.pem),
    )
    .expect("CA bundle");
    let new_client = b.straight("new-proxy", None, Some(&new_cert)).await;
    let old_client = b.straight("old-proxy", None, Some(&old_cert)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while send(&new_client, "GET", TEAM_A, &ALICE_HEADERS, None)
        .await
        .0
        != 200
    {
        assert!(Instant::now() < deadline, "the new CA was never trusted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        send(&old_client, "GET", TEAM_A, &ALICE_HEADERS, None)
            .await
            .0,
        200
    );
    // ...then the aggregator presents a certificate of the new CA...
    std::fs::write(b.host.pki("front-proxy-client.key"), &new_cert.1).expect("key");
    std::fs::write(b.host.pki("front-proxy-client.crt"), &new_cert.0).expect("cert");
    let through_host = || {
        b.host
            .kubectl(&["get", "widgets", "-n", "team-a"])
            .status
            .success()
    };
    assert!(through_host(), "through the host during the rotation");
    // ...and the old CA is dropped: the file holds the new one alone, and
    // the ConfigMap is deleted so that kube-apiserver publishes it afresh
    // (it only ever adds CAs to the one it finds).
    std::fs::write(b.host.pki("front-proxy-ca.crt"), &new_ca.pem).expect("CA");
    b.host.kubectl_ok(&[
        "delete",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while send(&old_client, "GET", TEAM_A, &ALICE_HEADERS, None)
        .await
        .0
        != 401
    {
        assert!(
            Instant::now() < deadline,
            "the old CA's certificate was never refused\n{}",
            b.kshard.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, _, body) = send(&new_client, "GET", TEAM_A, &ALICE_HEADERS, None).await;
    assert_eq!(code, 200, "{body}");
    // The aggregator went over to its new certificate: through the host,
    // requests keep working.
    assert!(
        poll(Duration::from_secs(30), through_host),
        "through the host after the rotation"
    );
    for _ in 0..5 {
        assert!(through_host(), "through the host after the rotation");
    }
}

/// While kshard sheds every ordinary user (a FlowSchema applied to the host
/// sends `system:authenticated` to a level that rejects), kube-aggregator's
/// availability probe and discovery fetches (`system:kube-aggregator` in
/// `system:masters`) run in the exempt level, so the APIService stays
/// Available; the aggregated discovery document carries an ETag and a
/// matching `If-None-Match` is answered 304, as the aggregator asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_for_the_aggregator_is_exempt_while_load_is_shed() {
    let b = behind(&[]);
    b.rbac(&[
        role(
            "ClusterRole",
            "widget-reader",
            "",
            &["get", "list"],
            &["widgets"],
        ),
        binding(
            "ClusterRoleBinding",
            "devs-read",
            "",
            "widget-reader",
            ("Group", "devs"),
        ),
    ]);
    b.host.apply(&[
        json!({"apiVersion": "flowcontrol.kshard.dev/v1", "kind": "PriorityLevelConfiguration",
            "metadata": {"name": "shed"},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"}}}}),
        json!({"apiVersion": "flowcontrol.kshard.dev/v1", "kind": "FlowSchema",
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
        }}),
    ]);
    // alice through the host: shed (429) once kshard has the new schema;
    // the level has one seat, so concurrent requests find it taken.
    let alice = common::client_for(&b.host.kubeconfig_for(ALICE.0)).await;
    let mut shed = false;
    for _ in 0..100 {
        let codes =
            futures::future::join_all((0..8).map(|_| send(&alice, "GET", TEAM_A, &[], None))).await;
        if codes.iter().any(|(code, _, _)| *code == 429) {
            shed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        shed,
        "alice's requests were never shed\n{}",
        b.kshard.log_tail()
    );

    // The aggregator's probe, as it sends it: exempt, every time.
    let exempt = b.host.kubectl_ok(&[
        "get",
        "prioritylevelconfigurations.flowcontrol.kshard.dev",
        "exempt",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    assert!(!exempt.is_empty());
    let agg = b.aggregator().await;
    let aggregator = [
        ("x-remote-user", "system:kube-aggregator"),
        ("x-remote-group", "system:masters"),
    ];
    for _ in 0..20 {
        let (code, headers, body) =
            send(&agg, "GET", "/apis/demo.kshard.dev/v1", &aggregator, None).await;
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("\"widgets\""), "{body}");
        assert_eq!(
            headers
                .get("x-kubernetes-pf-prioritylevel-uid")
                .and_then(|v| v.to_str().ok()),
            Some(exempt.as_str()),
            "the aggregator's probe runs in the exempt level"
        );
    }
    // Aggregated discovery, as the aggregator fetches it: an ETag, then 304.
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    let mut h = aggregator.to_vec();
    h.push(("accept", accept));
    let (code, headers, body) = send(&agg, "GET", "/apis", &h, None).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("APIGroupDiscoveryList"), "{body}");
    let etag = headers
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .expect("etag")
        .to_string();
    h.push(("if-none-match", &etag));
    let (code, _, _) = send(&agg, "GET", "/apis", &h, None).await;
    assert_eq!(code, 304);
    assert!(b.host.apiservice_available("v1.demo.kshard.dev"));
}

/// kshard's serving certificate (what cert-manager renews and the
/// APIService's caBundle names) is reloaded from its files without a
/// restart. (No host needed.)
#[tokio::test(flavor = "multi_thread")]
async fn serving_certificate_reloads_without_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = common::tls::Ca::new("serving-ca-1");
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
    let trusting = |ca: &common::tls::Ca, name: &str| {
        let p = dir.path().join(format!("{name}.kubeconfig"));
        common::tls::write_kubeconfig(&p, &server, &ca.pem, None, None);
        p
    };
    let c1 = common::client_for(&trusting(&first, "first")).await;
    assert_eq!(send(&c1, "GET", "/livez", &[], None).await.0, 200);

    let second = common::tls::Ca::new("serving-ca-2");
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
