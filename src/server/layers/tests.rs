//! What each request layer without tests of its own does with a request,
//! and the response it answers with: each layer is called as the stack
//! calls it, with a `next` that records what reached it.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::Value;

use super::*;
use crate::api::request::{RequestInfo, Route, Verb};
use crate::auth::{Anonymous, AuthConfig, Authenticator, DynamicConfig};
use crate::authz::Authorizer;

fn request(method: &str, uri: &str) -> Request {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .expect("request")
}

/// A request as it leaves the request-info layer.
fn parsed(method: &str, uri: &str) -> Request {
    let mut req = request(method, uri);
    let info = RequestInfo::parse(req.method(), req.uri());
    req.extensions_mut().insert(Arc::new(info));
    req
}

fn user(name: &str) -> Identity {
    Identity {
        user: name.into(),
        groups: vec!["system:authenticated".into()],
        ..Identity::default()
    }
}

fn anonymous() -> Identity {
    Identity {
        user: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
        ..Identity::default()
    }
}

/// As authentication leaves it: `who` authenticated and acting.
fn authenticated(mut req: Request, who: Identity) -> Request {
    req.extensions_mut().insert(Authenticated(who.clone()));
    req.extensions_mut().insert(who);
    req
}

/// A `next` that keeps what it was given (extracted by `look`) and answers 200.
fn recorder<T: Send + 'static>(
    look: impl FnOnce(&Request) -> T + Send + 'static,
) -> (
    Arc<Mutex<Option<T>>>,
    impl FnOnce(Request) -> std::future::Ready<Response>,
) {
    let seen = Arc::new(Mutex::new(None));
    let keep = seen.clone();
    let next = move |req: Request| {
        *keep.lock().expect("lock") = Some(look(&req));
        std::future::ready(StatusCode::OK.into_response())
    };
    (seen, next)
}

fn taken<T>(seen: &Arc<Mutex<Option<T>>>) -> Option<T> {
    seen.lock().expect("lock").take()
}

async fn status_body(resp: Response) -> Value {
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    serde_json::from_slice(&bytes).expect("a Status")
}

// ------------------------------------------------------------- request_info

#[tokio::test]
async fn request_info_parses_the_path_once_for_every_later_stage() {
    let (seen, next) = recorder(|req| {
        let (first, again) = (info(req), info(req));
        (Arc::ptr_eq(&first, &again), first)
    });
    let req = request("GET", "/apis/g.example/v1/namespaces/ns/things/t1%2Fstatus");
    let resp = request_info::request_info_layer(req, next).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (shared, info) = taken(&seen).expect("next ran");
    assert!(shared, "every stage reads the one parsed value");
    assert_eq!(
        info.path,
        "/apis/g.example/v1/namespaces/ns/things/t1/status"
    );
    let Route::Resource(r) = &info.route else {
        panic!("{:?}", info.route);
    };
    assert_eq!(
        (r.group.as_str(), r.version.as_str(), r.resource.as_str()),
        ("g.example", "v1", "things")
    );
    assert_eq!(r.namespace.as_deref(), Some("ns"));
    assert_eq!(r.name.as_deref(), Some("t1"));
    assert_eq!(
        r.subresource.as_deref(),
        Some("status"),
        "an encoded slash separates segments"
    );
    assert_eq!(r.verb, Some(Verb::Get));
}

// ------------------------------------------------------------ cache_control

#[tokio::test]
async fn cache_control_is_no_cache_private_unless_the_handler_chose() {
    let resp = cache_control::cache_control_layer(request("GET", "/apis"), |_| async {
        StatusCode::OK.into_response()
    })
    .await;
    assert_eq!(resp.headers()["cache-control"], "no-cache, private");

    let resp = cache_control::cache_control_layer(request("GET", "/openapi/v2"), |_| async {
        ([(http::header::CACHE_CONTROL, "public, max-age=60")], "doc").into_response()
    })
    .await;
    assert_eq!(resp.headers()["cache-control"], "public, max-age=60");

    let resp = cache_control::cache_control_layer(request("GET", "/openapi/v2"), |_| async {
        StatusCode::NOT_MODIFIED.into_response()
    })
    .await;
    assert!(
        resp.headers().get("cache-control").is_none(),
        "a 304 has none"
    );
}

// ------------------------------------------------------------------ metrics

#[test]
fn metrics_label_requests_as_kube_does() {
    let labels = |method: &str, uri: &str| {
        let req = request(method, uri);
        metrics::labels(req.method(), &RequestInfo::parse(req.method(), req.uri()))
    };
    let l = labels("POST", "/apis/g.example/v1/namespaces/ns/things");
    assert_eq!(
        (l.verb.as_str(), l.group.as_str(), l.version.as_str()),
        ("POST", "g.example", "v1")
    );
    assert_eq!(
        (l.resource.as_str(), l.scope.as_str()),
        ("things", "namespace")
    );
    let l = labels("PUT", "/apis/g.example/v1/namespaces/ns/things/t1/status");
    assert_eq!(
        (l.verb.as_str(), l.subresource.as_str(), l.scope.as_str()),
        ("PUT", "status", "resource")
    );
    let l = labels("GET", "/apis/g.example/v1/things?watch=true");
    assert_eq!((l.verb.as_str(), l.scope.as_str()), ("WATCH", "cluster"));
    let l = labels("GET", "/apis/g.example/v1/things");
    assert_eq!(l.verb, "LIST");
    let l = labels("GET", "/healthz");
    assert_eq!(
        (l.verb.as_str(), l.resource.as_str(), l.scope.as_str()),
        ("GET", "", "")
    );
}

#[tokio::test]
async fn metrics_count_every_answer_with_its_code() {
    let recorder = crate::server::metrics::handle().expect("the recorder");
    let req = parsed("DELETE", "/apis/metrics.example/v1/namespaces/ns/probes/p1");
    let resp =
        metrics::metrics_layer(req, |_| async { StatusCode::IM_A_TEAPOT.into_response() }).await;
    assert_eq!(resp.status(), StatusCode::IM_A_TEAPOT);
    let text = recorder.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("apiserver_request_total{") && l.contains("metrics.example"))
        .expect("counted");
    for label in [
        r#"verb="DELETE""#,
        r#"resource="probes""#,
        r#"scope="resource""#,
        r#"code="418""#,
    ] {
        assert!(line.contains(label), "{label}: {line}");
    }
    assert!(line.ends_with(" 1"), "{line}");
    assert!(
        text.contains("apiserver_request_duration_seconds_bucket{")
            && text.lines().any(
                |l| l.starts_with("apiserver_request_duration_seconds_count{")
                    && l.contains("metrics.example")
            )
    );
}

// ----------------------------------------------------------- authentication

fn delegating(anonymous: Anonymous) -> authentication::Authentication {
    let config = AuthConfig {
        client_ca: None,
        request_header: None,
    };
    authentication::Authentication {
        auth: Authenticator::Delegating {
            config: Arc::new(DynamicConfig::new(config, true)),
            tokens: None,
            anonymous,
        },
    }
}

#[tokio::test]
async fn authentication_names_the_user_for_the_stages_below() {
    let look = |req: &Request| {
        (
            req.extensions()
                .get::<Authenticated>()
                .map(|a| a.0.user.clone()),
            acting_user(req).user,
            req.extensions().get::<Forwarded>().is_some(),
        )
    };
    // No credentials, anonymous allowed: system:anonymous.
    let (seen, next) = recorder(look);
    let resp = authentication::authentication_layer(
        &delegating(Anonymous::Allowed),
        parsed("GET", "/apis"),
        next,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        taken(&seen),
        Some((
            Some("system:anonymous".into()),
            "system:anonymous".into(),
            false
        ))
    );

    // Without a token reviewer (standalone) a bearer token is not looked at.
    let (seen, next) = recorder(look);
    let mut req = parsed("GET", "/apis");
    req.headers_mut().insert(
        http::header::AUTHORIZATION,
        "Bearer some-token".parse().expect("header"),
    );
    authentication::authentication_layer(&delegating(Anonymous::Allowed), req, next).await;
    assert_eq!(
        taken(&seen).and_then(|s| s.0),
        Some("system:anonymous".into())
    );

    // The insecure debugging port is the admin.
    let (seen, next) = recorder(look);
    let mut req = parsed("GET", "/apis");
    req.extensions_mut().insert(InsecureListener);
    authentication::authentication_layer(&delegating(Anonymous::Refused), req, next).await;
    assert_eq!(
        taken(&seen),
        Some((Some("system:admin".into()), "system:admin".into(), false))
    );

    // A write forwarded by a follower carries the user authenticated there.
    let (seen, next) = recorder(look);
    let mut req = parsed("POST", "/apis/g.example/v1/namespaces/ns/things");
    req.extensions_mut()
        .insert(crate::replica::forward::ForwardedIdentity(user("alice")));
    authentication::authentication_layer(&delegating(Anonymous::Refused), req, next).await;
    assert_eq!(
        taken(&seen),
        Some((Some("alice".into()), "alice".into(), true))
    );
}

#[tokio::test]
async fn authentication_answers_401_without_credentials_when_anonymous_is_refused() {
    let (seen, next) = recorder(|_| ());
    let req = parsed("GET", "/apis/g.example/v1/things");
    let resp =
        authentication::authentication_layer(&delegating(Anonymous::Refused), req, next).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(taken(&seen).is_none(), "nothing below runs");
    assert!(
        resp.extensions().get::<Unauthenticated>().is_some(),
        "marked for the audit layer around it"
    );
    let status = status_body(resp).await;
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Unauthorized");
    assert_eq!(status["message"], "Unauthorized");
    assert_eq!(status["code"], 401);
}

// ------------------------------------------------------------ authorization

#[tokio::test]
async fn authorization_lets_allowed_requests_through_with_the_authorizer() {
    let authz = Authorizer::Standalone {
        anonymous_full_access: false,
    };
    let (seen, next) = recorder(|req: &Request| req.extensions().get::<Authorizer>().is_some());
    let req = authenticated(parsed("GET", "/apis/g.example/v1/things"), user("alice"));
    let resp = authorization::authorization_layer(&authz, req, next).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        taken(&seen),
        Some(true),
        "a SelfSubjectAccessReview asks the same authorizer"
    );

    // Anonymous on a network address: the probes and discovery only.
    let (seen, next) = recorder(|_| ());
    let req = authenticated(parsed("GET", "/healthz"), anonymous());
    assert_eq!(
        authorization::authorization_layer(&authz, req, next)
            .await
            .status(),
        StatusCode::OK
    );
    assert!(taken(&seen).is_some());
}

#[tokio::test]
async fn authorization_answers_403_in_kubes_words() {
    let authz = Authorizer::Standalone {
        anonymous_full_access: false,
    };
    for (uri, message) in [
        (
            "/apis/g.example/v1/things",
            r#"things.g.example is forbidden: User "system:anonymous" cannot list resource "things" in API group "g.example" at the cluster scope"#,
        ),
        (
            "/apis/g.example/v1/namespaces/ns/things/t1/status",
            r#"things.g.example "t1" is forbidden: User "system:anonymous" cannot get resource "things/status" in API group "g.example" in the namespace "ns""#,
        ),
    ] {
        let (seen, next) = recorder(|_| ());
        let req = authenticated(parsed("GET", uri), anonymous());
        let resp = authorization::authorization_layer(&authz, req, next).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{uri}");
        assert!(taken(&seen).is_none(), "the handler does not run");
        let status = status_body(resp).await;
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(status["message"], message);
    }
}

// -------------------------------------------------------------------- audit

#[tokio::test]
async fn audit_ids_are_the_clients_or_new() {
    let mut req = parsed("GET", "/apis");
    req.headers_mut()
        .insert("audit-id", "from-the-client".parse().expect("header"));
    let resp = audit::audit_layer(None, req, |_| async { StatusCode::OK.into_response() }).await;
    assert_eq!(resp.headers()["audit-id"], "from-the-client");

    let resp = audit::audit_layer(None, parsed("GET", "/apis"), |_| async {
        StatusCode::NOT_FOUND.into_response()
    })
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let id = resp.headers()["audit-id"].to_str().expect("text");
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
}

/// An auditor at level Request for everything, keeping what it emits.
fn recording_auditor() -> (
    Arc<crate::audit::Auditor>,
    Arc<Mutex<Vec<crate::audit::Event>>>,
) {
    struct Keep(Arc<Mutex<Vec<crate::audit::Event>>>);
    impl crate::audit::Sink for Keep {
        fn process(&self, event: &crate::audit::Event) {
            self.0.lock().expect("lock").push(event.clone());
        }
    }
    let policy = crate::audit::Policy::parse(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Request\n",
    )
    .expect("policy");
    let kept = Arc::new(Mutex::new(Vec::new()));
    let auditor = crate::audit::Auditor::new(policy, vec![Arc::new(Keep(kept.clone()))]);
    (auditor, kept)
}

#[tokio::test]
async fn audit_records_a_refused_authentication_as_kube_does() {
    // The audit layer around authentication, as the stack orders them: a
    // refused credential is one ResponseStarted event with no user and the
    // 401's Status (kube-apiserver v1.36 writes exactly that, at any level,
    // without the request body).
    let (auditor, kept) = recording_auditor();
    let mut req = parsed("POST", "/apis/g.example/v1/namespaces/ns/things");
    *req.body_mut() = Body::from(r#"{"kind":"Thing"}"#);
    let (seen, next) = recorder(|_| ());
    let resp = audit::audit_layer(Some(&auditor), req, |req| async move {
        authentication::authentication_layer(&delegating(Anonymous::Refused), req, next).await
    })
    .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(taken(&seen).is_none());
    let id = resp.headers()["audit-id"].to_str().expect("id").to_string();
    let status = status_body(resp).await;
    assert_eq!(status["reason"], "Unauthorized", "the body is passed on");
    let events = kept.lock().expect("lock").clone();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.stage, crate::audit::Stage::ResponseStarted);
    assert_eq!(e.audit_id, id);
    assert_eq!(e.verb, "create");
    assert!(e.user.username.is_empty());
    assert!(e.request_object.is_none());
    let rs = e.response_status.as_ref().expect("status");
    assert_eq!(
        (
            rs.code,
            rs.status.as_str(),
            rs.reason.as_str(),
            rs.message.as_str()
        ),
        (401, "Failure", "Unauthorized", "Unauthorized")
    );

    // An authenticated request: the events step below records it, naming
    // the user, under the same audit ID the first step chose.
    let (auditor, kept) = recording_auditor();
    let mut req = parsed("GET", "/apis/g.example/v1/things");
    req.headers_mut()
        .insert("audit-id", "client-id".parse().expect("header"));
    let inner = auditor.clone();
    let resp = audit::audit_layer(Some(&auditor), req, |req| async move {
        let req = authenticated(req, user("alice"));
        audit::events(Some(&inner), req, |_| async {
            StatusCode::OK.into_response()
        })
        .await
    })
    .await;
    assert_eq!(resp.headers()["audit-id"], "client-id");
    let events = kept.lock().expect("lock").clone();
    let stages: Vec<_> = events
        .iter()
        .map(|e| (e.stage, e.audit_id.as_str(), e.user.username.as_str()))
        .collect();
    assert_eq!(
        stages,
        [
            (crate::audit::Stage::RequestReceived, "client-id", "alice"),
            (crate::audit::Stage::ResponseComplete, "client-id", "alice")
        ]
    );
}

#[test]
fn audit_events_describe_the_request_and_who_sent_it() {
    let mut req = parsed(
        "GET",
        "/apis/g.example/v1/namespaces/ns/things?watch=true&timeoutSeconds=5",
    );
    let h = req.headers_mut();
    h.insert(
        "x-forwarded-for",
        "10.0.0.1, 10.0.0.2".parse().expect("header"),
    );
    h.insert("x-real-ip", "10.0.0.3".parse().expect("header"));
    h.insert(
        http::header::USER_AGENT,
        "kubectl/v1.36".parse().expect("header"),
    );
    let peer: std::net::SocketAddr = "10.0.0.2:4443".parse().expect("addr");
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    let meta = audit::meta(&req, &user("alice"));
    assert_eq!(meta.verb, "watch");
    assert!(
        meta.long_running,
        "a watch's events come when it starts and ends"
    );
    assert_eq!(
        meta.request_uri,
        "/apis/g.example/v1/namespaces/ns/things?watch=true&timeoutSeconds=5"
    );
    assert_eq!(
        meta.source_ips,
        ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        "forwarded-for, real ip, then the peer unless already named"
    );
    assert_eq!(meta.user.username, "alice");
    assert_eq!(meta.user_agent, "kubectl/v1.36");
    let o = meta.object_ref.expect("a resource request");
    assert_eq!(
        (
            o.api_group.as_str(),
            o.api_version.as_str(),
            o.resource.as_str(),
            o.namespace.as_str()
        ),
        ("g.example", "v1", "things", "ns")
    );

    let meta = audit::meta(&parsed("GET", "/readyz"), &anonymous());
    assert_eq!((meta.verb.as_str(), meta.path.as_str()), ("get", "/readyz"));
    assert!(!meta.resource_request && meta.object_ref.is_none() && !meta.long_running);
}

// ------------------------------------------------------------ impersonation

fn impersonating(mut req: Request, as_user: &str, groups: &[&str]) -> Request {
    let h = req.headers_mut();
    h.insert("impersonate-user", as_user.parse().expect("header"));
    for g in groups {
        h.append("impersonate-group", g.parse().expect("header"));
    }
    req
}

#[tokio::test]
async fn impersonation_replaces_the_acting_user_once_authorized() {
    let im = impersonation::Impersonation {
        authz: Authorizer::Standalone {
            anonymous_full_access: false,
        },
        dev: false,
    };
    let look = |req: &Request| {
        (
            acting_user(req),
            req.extensions()
                .get::<Authenticated>()
                .map(|a| a.0.user.clone()),
            req.headers()
                .keys()
                .any(|k| k.as_str().starts_with("impersonate-")),
        )
    };
    let (seen, next) = recorder(look);
    let req = authenticated(parsed("GET", "/apis/g.example/v1/things"), user("alice"));
    let resp =
        impersonation::impersonation_layer(&im, impersonating(req, "bob", &["devs"]), next).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let (acting, requester, headers_left) = taken(&seen).expect("next ran");
    assert_eq!(acting.user, "bob");
    assert_eq!(acting.groups, ["devs", "system:authenticated"]);
    assert_eq!(requester.as_deref(), Some("alice"), "who asked is kept");
    assert!(!headers_left, "the headers go no further");

    // Without the headers: the authenticated user acts.
    let (seen, next) = recorder(look);
    let req = authenticated(parsed("GET", "/apis/g.example/v1/things"), user("alice"));
    impersonation::impersonation_layer(&im, req, next).await;
    assert_eq!(taken(&seen).map(|s| s.0.user), Some("alice".into()));
}

#[tokio::test]
async fn impersonation_refused_is_403_and_nothing_runs() {
    let im = impersonation::Impersonation {
        authz: Authorizer::Standalone {
            anonymous_full_access: false,
        },
        dev: false,
    };
    let (seen, next) = recorder(|_| ());
    let req = authenticated(parsed("GET", "/apis/g.example/v1/things"), anonymous());
    let resp = impersonation::impersonation_layer(&im, impersonating(req, "bob", &[]), next).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(taken(&seen).is_none());
    let status = status_body(resp).await;
    assert_eq!(
        status["message"],
        r#"users "bob" is forbidden: User "system:anonymous" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );

    // Groups without a user are a bad request.
    let (seen, next) = recorder(|_| ());
    let mut req = authenticated(parsed("GET", "/apis"), user("alice"));
    req.headers_mut()
        .insert("impersonate-group", "devs".parse().expect("header"));
    let resp = impersonation::impersonation_layer(&im, req, next).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(taken(&seen).is_none());
}

#[tokio::test]
async fn impersonation_is_skipped_where_it_happened_already_or_cannot() {
    for (dev, marker) in [
        (true, None),
        (false, Some("forwarded")),
        (false, Some("insecure")),
    ] {
        let im = impersonation::Impersonation {
            authz: Authorizer::Standalone {
                anonymous_full_access: false,
            },
            dev,
        };
        let (seen, next) = recorder(|req: &Request| {
            (
                acting_user(req).user,
                req.headers().contains_key("impersonate-user"),
            )
        });
        let mut req = authenticated(parsed("GET", "/apis"), anonymous());
        match marker {
            Some("forwarded") => {
                req.extensions_mut().insert(Forwarded);
            }
            Some(_) => {
                req.extensions_mut().insert(InsecureListener);
            }
            None => {}
        }
        let resp =
            impersonation::impersonation_layer(&im, impersonating(req, "bob", &[]), next).await;
        assert_eq!(resp.status(), StatusCode::OK, "{marker:?}");
        assert_eq!(
            taken(&seen),
            Some(("system:anonymous".into(), true)),
            "{marker:?}: untouched"
        );
    }
}

// ------------------------------------------------------------------ forward

#[tokio::test]
async fn forward_passes_everything_through_without_replicas() {
    for (method, uri) in [
        ("POST", "/apis/g.example/v1/namespaces/ns/things"),
        ("GET", "/apis/g.example/v1/namespaces/ns/things"),
    ] {
        let (seen, next) = recorder(|_| ());
        let resp = forward::forward_layer(None, parsed(method, uri), next).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(taken(&seen).is_some(), "{method}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn forward_runs_the_leaders_writes_and_refuses_forwarded_ones_elsewhere() {
    let (_dir, engine) = crate::replica::tests::shared_engine();
    let lease = std::time::Duration::from_secs(30);
    let leader = crate::replica::tests::replica(&engine, "a", lease).await;
    let mut tasks = leader.start().await;
    let follower = crate::replica::tests::replica(&engine, "b", lease).await;
    tasks.extend(follower.start().await);
    assert!(leader.is_leader() && !follower.is_leader());
    let write = || parsed("POST", "/apis/g.example/v1/namespaces/ns/things");
    let forwarded = || {
        let mut req = write();
        req.extensions_mut().insert(Forwarded);
        req
    };

    // The leader handles writes, its own and forwarded ones.
    for req in [write(), forwarded()] {
        let (seen, next) = recorder(|_| ());
        let resp = forward::forward_layer(Some(&leader), req, next).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(taken(&seen).is_some());
    }
    // Reads are served wherever they arrive.
    let (seen, next) = recorder(|_| ());
    let resp = forward::forward_layer(
        Some(&follower),
        parsed("GET", "/apis/g.example/v1/things"),
        next,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(taken(&seen).is_some());
    // A write forwarded to a replica that does not lead: refused, so the
    // sender looks for the leader again; never forwarded twice.
    let (seen, next) = recorder(|_| ());
    let resp = forward::forward_layer(Some(&follower), forwarded(), next).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp
        .headers()
        .contains_key(crate::replica::forward::NOT_LEADER));
    assert!(taken(&seen).is_none());
    for t in tasks {
        t.abort();
    }
}
