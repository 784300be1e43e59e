//! Delegated authentication: client certificates and a front proxy's
//! `X-Remote-*` headers, trusted only from a certificate of the requestheader
//! CA with an allowed CN.

mod common;

use std::path::Path;

use common::tls::{write_kubeconfig, Ca};

fn ca(name: &str) -> Ca {
    Ca::new(name)
}

/// A client certificate (PEM cert, PEM key) signed by `ca`.
fn client(ca: &Ca, cn: &str, orgs: &[&str]) -> (String, String) {
    ca.client(cn, orgs)
}

/// A kube client for the server with the given client certificate (or none).
async fn client_with(
    s: &common::TestServer,
    cert: Option<&(String, String)>,
    dir: &Path,
    name: &str,
) -> kube::Client {
    let ca = std::fs::read_to_string(s.running.kubeconfig.with_file_name("pki").join("ca.crt"))
        .expect("server ca");
    let path = dir.join(format!("{name}.kubeconfig"));
    // A server on 0.0.0.0 is reached on loopback (its certificate names 127.0.0.1).
    let port = s.running.addr.port();
    let server = if s.running.addr.ip().is_unspecified() {
        format!("https://127.0.0.1:{port}")
    } else {
        format!("https://{}", s.running.addr)
    };
    write_kubeconfig(&path, &server, &ca, None, cert);
    common::client_for(&path).await
}

async fn get(c: &kube::Client, uri: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut b = http::Request::get(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c
        .send(b.body(kube::client::Body::empty()).expect("req"))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect_bytes().await.expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn front_proxy_and_client_certificates() {
    let dir = tempfile::tempdir().expect("tmp");
    let proxy_ca = ca("front-proxy-ca");
    let users_ca = ca("client-ca");
    let rogue_ca = ca("rogue-ca");
    std::fs::write(dir.path().join("proxy-ca.crt"), &proxy_ca.pem).expect("write");
    std::fs::write(dir.path().join("client-ca.crt"), &users_ca.pem).expect("write");
    let (p, c) = (
        dir.path().join("proxy-ca.crt"),
        dir.path().join("client-ca.crt"),
    );
    let s = common::start_with(move |cfg| {
        cfg.requestheader_client_ca_file = Some(p);
        cfg.requestheader_allowed_names = vec!["front-proxy-client".into()];
        cfg.client_ca_file = Some(c);
    })
    .await;
    let widgets = common::WIDGETS;

    // No credentials: anonymous (kube's --anonymous-auth=true default), which
    // the authorizer refuses with kube's 403; probes still answer.
    let anon = client_with(&s, None, dir.path(), "anon").await;
    let (code, body) = get(&anon, widgets, &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("User \\\"system:anonymous\\\" cannot list resource"),
        "{body}"
    );
    assert_eq!(get(&anon, "/readyz", &[]).await.0, 200);
    // X-Remote-* without a proxy certificate is ignored: still anonymous.
    let (code, body) = get(
        &anon,
        widgets,
        &[
            ("x-remote-user", "admin"),
            ("x-remote-group", "system:masters"),
        ],
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:anonymous"), "{body}");
    // A certificate from a CA nobody trusts is refused outright: 401.
    let rogue = client(&rogue_ca, "admin", &["system:masters"]);
    let rogue_client = client_with(&s, Some(&rogue), dir.path(), "rogue").await;
    let (code, body) = get(&rogue_client, widgets, &[]).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("\"reason\":\"Unauthorized\""), "{body}");

    // A user certificate from the client CA authenticates; with no host to ask,
    // only system:masters is authorized (as k8s.io/apiserver without an
    // authorization kubeconfig).
    let alice = client(&users_ca, "alice", &["devs"]);
    let alice_client = client_with(&s, Some(&alice), dir.path(), "alice").await;
    let (code, body) = get(&alice_client, widgets, &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("widgets.demo.kshard.dev is forbidden: User \\\"alice\\\" cannot list resource \\\"widgets\\\" in API group \\\"demo.kshard.dev\\\" in the namespace \\\"default\\\""),
        "{body}"
    );
    let ops = client(&users_ca, "ops", &["system:masters"]);
    let ops_client = client_with(&s, Some(&ops), dir.path(), "ops").await;
    assert_eq!(get(&ops_client, widgets, &[]).await.0, 200);
    // A certificate with an empty common name names no user, whatever its
    // groups: the request is anonymous.
    let nameless = client(&users_ca, "", &["system:masters"]);
    let nameless_client = client_with(&s, Some(&nameless), dir.path(), "nameless").await;
    let (code, body) = get(&nameless_client, widgets, &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:anonymous"), "{body}");
    // ...which may not claim to be someone else through proxy headers or impersonation.
    let (code, body) = get(&alice_client, widgets, &[("impersonate-user", "bob")]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("User \\\"alice\\\" cannot impersonate resource \\\"users\\\""),
        "{body}"
    );

    // The front proxy (right CA, allowed CN) names the user.
    let proxy = client(&proxy_ca, "front-proxy-client", &[]);
    let proxy_client = client_with(&s, Some(&proxy), dir.path(), "proxy").await;
    let (code, _) = get(
        &proxy_client,
        widgets,
        &[
            ("x-remote-user", "carol"),
            ("x-remote-group", "system:masters"),
            ("x-remote-extra-scopes", "a"),
        ],
    )
    .await;
    assert_eq!(code, 200);
    // A master named by the proxy may impersonate.
    assert_eq!(
        get(
            &proxy_client,
            widgets,
            &[
                ("x-remote-user", "carol"),
                ("x-remote-group", "system:masters"),
                ("impersonate-user", "dave"),
                ("impersonate-group", "system:masters")
            ]
        )
        .await
        .0,
        200
    );
    // Without a user header the proxy certificate alone is nobody.
    assert_eq!(get(&proxy_client, widgets, &[]).await.0, 401);

    // A proxy certificate with a CN that is not allowed, or from another CA: headers not trusted.
    let other = client(&proxy_ca, "someone-else", &[]);
    let other_client = client_with(&s, Some(&other), dir.path(), "other").await;
    assert_eq!(
        get(&other_client, widgets, &[("x-remote-user", "carol")])
            .await
            .0,
        401
    );
    let rogue = client(&rogue_ca, "front-proxy-client", &[]);
    let rogue_client = client_with(&s, Some(&rogue), dir.path(), "rogue").await;
    let rogue_result = rogue_client
        .send(
            http::Request::get(widgets)
                .header("x-remote-user", "carol")
                .body(kube::client::Body::empty())
                .expect("req"),
        )
        .await;
    // The TLS layer refuses a certificate from an unknown CA (or the request is 401).
    if let Ok(resp) = rogue_result {
        assert_eq!(resp.status().as_u16(), 401);
    }

    // kubectl with a user certificate works end to end.
    let kc = dir.path().join("ops.kubeconfig");
    let out = common::kubectl_with(&kc, &["get", "widgets", "-n", "default"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_auth_false_refuses_requests_without_credentials() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = common::start_with(|cfg| cfg.anonymous_auth = false).await;
    let anon = client_with(&s, None, dir.path(), "anon").await;
    for path in [common::WIDGETS, "/readyz", "/version"] {
        let (code, body) = get(&anon, path, &[]).await;
        assert_eq!(code, 401, "{path}: {body}");
    }
    // The admin kubeconfig's certificate still works.
    assert_eq!(s.get(common::WIDGETS).await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_anonymous_access_depends_on_the_address() {
    let dir = tempfile::tempdir().expect("tmp");
    // Loopback (a laptop): anonymous requests may do what the admin may.
    let local = common::start().await;
    let anon = client_with(&local, None, dir.path(), "anon-local").await;
    assert_eq!(get(&anon, common::WIDGETS, &[]).await.0, 200);

    // Any other address: only probes, version and discovery without credentials.
    let open = common::start_with(|cfg| cfg.listen = "0.0.0.0:0".parse().expect("addr")).await;
    let anon = client_with(&open, None, dir.path(), "anon-open").await;
    let (code, body) = get(&anon, common::WIDGETS, &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("User \\\"system:anonymous\\\" cannot list resource"),
        "{body}"
    );
    for path in ["/readyz", "/version", "/apis", "/openapi/v2"] {
        assert_eq!(get(&anon, path, &[]).await.0, 200, "{path}");
    }
    assert_eq!(
        open.get(common::WIDGETS).await.status,
        200,
        "the admin certificate"
    );

    // ...unless the operator says otherwise.
    let opened = common::start_with(|cfg| {
        cfg.listen = "0.0.0.0:0".parse().expect("addr");
        cfg.anonymous_admin = true;
    })
    .await;
    let anon = client_with(&opened, None, dir.path(), "anon-opened").await;
    assert_eq!(get(&anon, common::WIDGETS, &[]).await.0, 200);
}
