//! Auditing in two steps, as kube's filters do it. [`layer`] runs before
//! authentication (kube's `WithAuditID` and failed-authentication audit):
//! every request gets an `Audit-Id` response header (the client's `Audit-ID`
//! if it sent one), and under an audit policy a request whose credentials
//! authentication refused is recorded. [`events`] runs after authentication
//! and the body (kube's `WithAudit`): the policy's events per stage
//! (`crate::audit`), naming the user; impersonation below adds the
//! impersonated user. Authentication knows nothing of auditing: it marks its
//! 401 [`Unauthenticated`].

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use http::HeaderValue;

use super::{Authenticated, Unauthenticated};
use crate::api::request::{Route, Verb};
use crate::audit::{Auditor, ObjectReference, RequestMeta, UserInfo};
use crate::auth::Identity;

/// What the audit event says about the request, for `user`.
pub fn meta(req: &Request, user: &Identity) -> RequestMeta {
    let info = super::info(req);
    let mut source_ips: Vec<String> = req
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|ip| ip.trim().to_string())
        .filter(|ip| !ip.is_empty())
        .collect();
    if let Some(ip) = req.headers().get("x-real-ip").and_then(|v| v.to_str().ok()) {
        source_ips.push(ip.trim().to_string());
    }
    if let Some(axum::extract::ConnectInfo(peer)) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
    {
        let ip = peer.ip().to_string();
        if !source_ips.contains(&ip) {
            source_ips.push(ip);
        }
    }
    let (verb, object_ref, long_running) = match &info.route {
        Route::Resource(r) => (
            r.verb.map_or_else(
                || req.method().as_str().to_ascii_lowercase(),
                |v| v.as_str().to_string(),
            ),
            Some(ObjectReference {
                resource: r.resource.clone(),
                namespace: r.namespace.clone().unwrap_or_default(),
                name: r.name.clone().unwrap_or_default(),
                api_group: r.group.clone(),
                api_version: r.version.clone(),
                subresource: r.subresource.clone().unwrap_or_default(),
                ..Default::default()
            }),
            r.verb == Some(Verb::Watch),
        ),
        _ => (req.method().as_str().to_ascii_lowercase(), None, false),
    };
    RequestMeta {
        request_uri: req
            .uri()
            .path_and_query()
            .map_or_else(|| info.path.clone(), |p| p.as_str().to_string()),
        verb,
        user: UserInfo::from(user),
        groups_for_policy: user.groups.clone(),
        source_ips,
        user_agent: req
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        resource_request: object_ref.is_some(),
        object_ref,
        path: info.path.clone(),
        long_running,
    }
}

/// The request's audit ID, chosen by [`layer`] for every later stage.
#[derive(Clone, Debug)]
pub struct AuditId(pub Arc<str>);

/// Under a policy, what the event says about the request before the user
/// is known; gathered by [`layer`] for [`events`].
#[derive(Clone)]
struct Pending(RequestMeta);

/// Before authentication: the audit ID, and the event of a request whose
/// credentials were refused.
pub async fn audit_layer<F, Fut>(
    auditor: Option<&Arc<Auditor>>,
    mut req: Request,
    next: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let id: Arc<str> = crate::audit::audit_id(req.headers()).into();
    // Without an auditor the event's fields are not gathered.
    let meta = auditor.map(|_| meta(&req, &Identity::default()));
    req.extensions_mut().insert(AuditId(id.clone()));
    if let Some(m) = &meta {
        req.extensions_mut().insert(Pending(m.clone()));
    }
    let mut resp = next(req).await;
    if let (Some(auditor), Some(meta)) = (auditor, meta) {
        if resp.extensions().get::<Unauthenticated>().is_some() {
            resp = crate::audit::record_failed_authentication(auditor, &id, &meta, resp).await;
        }
    }
    if let Ok(h) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("audit-id", h);
    }
    resp
}

/// After authentication: the policy's events for the request, naming the
/// authenticated user.
pub async fn events<F, Fut>(auditor: Option<&Arc<Auditor>>, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let Some(auditor) = auditor else {
        return next(req).await;
    };
    let user = req
        .extensions()
        .get::<Authenticated>()
        .map(|a| a.0.clone())
        .unwrap_or_default();
    let id = req.extensions().get::<AuditId>().map_or_else(
        || crate::audit::audit_id(req.headers()).into(),
        |a| a.0.clone(),
    );
    let meta = match req.extensions_mut().remove::<Pending>() {
        Some(Pending(mut m)) => {
            m.user = UserInfo::from(&user);
            m.groups_for_policy = user.groups.clone();
            m
        }
        // Without the first step (as in unit tests): gathered here.
        None => meta(&req, &user),
    };
    crate::audit::record(auditor, &id, meta, req, next).await
}
