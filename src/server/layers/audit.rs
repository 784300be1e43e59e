//! The audit hook: every request gets an `Audit-Id` response header (the
//! client's `Audit-ID` if it sent one) and, under an audit policy, its events
//! per stage (`crate::audit`). It runs after authentication, so the event
//! names the user; impersonation below adds the impersonated user.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use super::Authenticated;
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

pub async fn layer<F, Fut>(auditor: Option<&Arc<Auditor>>, req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    // Without an auditor only the Audit-Id header is added: the event's
    // fields are not gathered.
    let meta = match auditor {
        Some(_) => {
            let user = req
                .extensions()
                .get::<Authenticated>()
                .map(|a| a.0.clone())
                .unwrap_or_default();
            meta(&req, &user)
        }
        None => crate::audit::RequestMeta::default(),
    };
    crate::audit::record(auditor, meta, req, next).await
}
