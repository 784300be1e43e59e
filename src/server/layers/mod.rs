//! The request path from a decoded HTTP request to the API handler: a stack
//! of small tower layers, one concern each, in kube-apiserver's order. This
//! list is the one place to read the chain; adding a concern means adding
//! one layer here.
//!
//! | order | layer | what it does | answers on its own |
//! |---|---|---|---|
//! | 1 | [`panic`] | a panicking handler becomes kube's 500 | 500 |
//! | 2 | [`request_info`] | the path is decoded and parsed **once** into [`RequestInfo`](crate::api::request::RequestInfo); every later stage reads that value | 404 for paths kube refuses |
//! | 3 | [`metrics`] | `apiserver_request_total` / `_duration_seconds` for every answer | |
//! | | [`cache_control`] | `Cache-Control: no-cache, private` unless the handler set one | |
//! | 4 | [`deadline`] | `--request-timeout` / `?timeout=` for non-long-running requests | 400, 504 |
//! | 5 | [`authentication`] | front proxy, client certificate, bearer token, anonymous | 401 |
//! | 6 | [`body`] | reads the request body (3 MiB, under the deadline and a memory budget) before any seat is taken | 413, 429 |
//! | 7 | [`audit`] | `Audit-Id`, the policy's events per stage | |
//! | 8 | [`impersonation`] | `Impersonate-*` headers, authorized with the `impersonate` verb | 400, 403 |
//! | 9 | [`forward`] | several replicas: writes go to the leader | the leader's answer |
//! | 10 | [`priority`] | API Priority and Fairness: classify, queue, hold seats until the response is sent | 429 |
//! | 11 | [`authorization`] | SubjectAccessReview (or standalone rules) with the request info's attributes | 403 |
//!
//! Kube runs authorization inside the flow-control seat too: a request
//! denied there has still been paid for by its flow.

pub mod audit;
pub mod authentication;
pub mod authorization;
pub mod body;
pub mod cache_control;
pub mod deadline;
pub mod forward;
pub mod impersonation;
pub mod metrics;
pub mod panic;
pub mod priority;
pub mod request_info;

use std::sync::Arc;

use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::Response;
use axum::Router;
use http::HeaderValue;

use crate::auth::Identity;

/// Everything the layers need, built once by the server.
pub struct Parts {
    pub apf: Arc<crate::flowcontrol::Apf>,
    pub registry: Arc<crate::registry::Registry>,
    pub auth: crate::auth::Authenticator,
    pub authz: crate::authz::Authorizer,
    /// Several replicas: writes go to the leader.
    pub replica: Option<Arc<crate::replica::Replica>>,
    /// With an audit policy: records events (the `Audit-Id` header is always set).
    pub auditor: Option<Arc<crate::audit::Auditor>>,
    /// `--request-timeout`: the longest a non-long-running request may take.
    pub request_timeout: std::time::Duration,
    /// Request bodies: size limit and memory budget.
    pub body: Arc<body::BodyLimits>,
}

/// Wraps `app` in the request path, outermost first (tower's
/// `ServiceBuilder` order: each layer wraps all the ones below it).
pub fn stack(app: Router, parts: Parts) -> Router {
    let Parts {
        apf,
        registry,
        auth,
        authz,
        replica,
        auditor,
        request_timeout,
        body,
    } = parts;
    let impersonation = Arc::new(impersonation::Impersonation {
        authz: authz.clone(),
        dev: auth.is_dev(),
    });
    let layers = tower::ServiceBuilder::new()
        .layer(panic::layer())
        .layer(from_fn(request_info::layer))
        .layer(from_fn(metrics::layer))
        .layer(from_fn(cache_control::layer))
        .layer(from_fn_with_state(request_timeout, deadline::layer))
        .layer(from_fn_with_state(
            Arc::new(authentication::Authentication {
                auth,
                auditor: auditor.clone(),
            }),
            authentication::layer,
        ))
        .layer(from_fn_with_state(body, body::layer))
        .layer(from_fn_with_state(auditor, audit::layer))
        .layer(from_fn_with_state(impersonation, impersonation::layer))
        .layer(from_fn_with_state(replica, forward::layer))
        .layer(from_fn_with_state(
            Arc::new(priority::Priority { apf, registry }),
            priority::layer,
        ))
        .layer(from_fn_with_state(authz, authorization::layer));
    app.layer(layers)
}

/// Marks requests of `--insecure-listen`, the plain-HTTP debugging port,
/// which (as kube's old insecure port) skips authentication: the admin.
#[derive(Clone, Copy, Debug)]
pub struct InsecureListener;

/// Who authenticated (before impersonation). Set by [`authentication`].
#[derive(Clone, Debug)]
pub struct Authenticated(pub Identity);

/// Set by [`authentication`] for a write a follower forwarded: authenticated
/// and impersonated there already, so neither runs again here.
#[derive(Clone, Copy, Debug)]
pub struct Forwarded;

/// The user a request acts as (after impersonation), as the handler and the
/// authorizer see it. Set by [`authentication`] and replaced by
/// [`impersonation`].
pub fn acting_user(req: &axum::extract::Request) -> Identity {
    req.extensions()
        .get::<Identity>()
        .cloned()
        .unwrap_or_default()
}

pub(crate) fn set_header(resp: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}

pub(crate) fn status_response(e: &crate::status::ApiError) -> Response {
    crate::api::response::error_response(e)
}

/// The request's info as the first layer stored it.
pub(crate) fn info(req: &axum::extract::Request) -> crate::api::request::RequestInfo {
    crate::api::request::RequestInfo::of(req.method(), req.uri(), req.extensions())
}
