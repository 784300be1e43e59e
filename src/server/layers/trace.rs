//! The request's server span (`crate::traces`, with
//! `--tracing-config-file`), as kube's `WithTracing` makes it: named
//! `<METHOD> /apis/<group>/<version>/namespaces/{:namespace}/<resource>/{:name}/<subresource>`
//! (a non-resource request by its method), started after authentication
//! and dated from the request's arrival, with authentication as its first
//! child. Everything after runs with it current, and it ends when the
//! response body has been sent.
//!
//! The caller's W3C `traceparent` makes it a child of the caller's span
//! only for callers kube trusts with their trace context (groups
//! `system:masters` and `system:monitoring`), the host's aggregator (a
//! front proxy holding the requestheader certificate, which can name any
//! user and group, so it is trusted as much) and a follower replica
//! forwarding a write. Anyone else's context is not followed: the span
//! starts a new trace and links to the caller's span (otelhttp's
//! public-endpoint rule), so an untrusted client can neither choose the
//! trace nor force sampling.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::SystemTime;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::audit::AuditId;
use super::{Authenticated, Forwarded, FrontProxied};
use crate::api::request::{RequestInfo, Route};
use crate::traces;

/// When the request arrived (set by `request_info` while tracing is on).
#[derive(Clone, Copy, Debug)]
pub struct Received(pub SystemTime);

/// Groups whose trace context kube follows (`notSystemPrivilegedGroup`).
const TRUSTED_GROUPS: [&str; 2] = ["system:masters", "system:monitoring"];

pub async fn trace_layer<F, Fut>(req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    if !traces::enabled() {
        return next(req).await;
    }
    let start = req
        .extensions()
        .get::<Received>()
        .map_or_else(SystemTime::now, |r| r.0);
    let (parent, links) = match traces::extract(req.headers()) {
        Some(caller) if follows_caller(&req) => {
            (Context::new().with_remote_span_context(caller), Vec::new())
        }
        Some(caller) => (Context::new(), vec![Link::with_context(caller)]),
        None => (Context::new(), Vec::new()),
    };
    let info = super::info(&req);
    let name = span_name(req.method(), &info);
    let Some(cx) =
        traces::start_server_span(name, start, &parent, links, server_attributes(&req, &info))
    else {
        return next(req).await;
    };
    // Authentication ran before the span could exist: its child, back-dated.
    drop(traces::Span::child_of(&cx, "authentication", start));
    let audit_id = req.extensions().get::<AuditId>().map(|a| a.0.clone());
    let mut resp = traces::in_context(cx.clone(), next(req)).await;
    let span = cx.span();
    let status = resp.status().as_u16();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if let Some(id) = audit_id {
        span.set_attribute(KeyValue::new("audit-id", id.to_string()));
    }
    // otelhttp's server rule: only a 5xx is the server's error.
    if status >= 500 {
        span.set_status(Status::error(""));
    }
    let body = std::mem::take(resp.body_mut());
    *resp.body_mut() = Body::new(EndOnDrop { body, cx });
    resp
}

/// Whether the caller's trace context is followed (see the module's text).
fn follows_caller(req: &Request) -> bool {
    let ext = req.extensions();
    ext.get::<FrontProxied>().is_some()
        || ext.get::<Forwarded>().is_some()
        || ext.get::<Authenticated>().is_some_and(|a| {
            a.0.groups
                .iter()
                .any(|g| TRUSTED_GROUPS.contains(&g.as_str()))
        })
}

/// kube's `getSpanNameFromRequestInfo`.
fn span_name(method: &http::Method, info: &RequestInfo) -> String {
    let Route::Resource(r) = &info.route else {
        return method.as_str().to_string();
    };
    let mut name = format!(
        "{} /{}",
        method.as_str(),
        if r.group.is_empty() { "api" } else { "apis" }
    );
    if !r.group.is_empty() {
        name.push('/');
        name.push_str(&r.group);
    }
    name.push('/');
    name.push_str(&r.version);
    if r.namespace.is_some() {
        name.push_str("/namespaces/{:namespace}");
    }
    name.push('/');
    name.push_str(&r.resource);
    if r.name.is_some() {
        name.push_str("/{:name}");
    }
    if let Some(sub) = &r.subresource {
        name.push('/');
        name.push_str(sub);
    }
    name
}

/// otelhttp's server attributes (semantic conventions 1.26) and kube's `http.target`.
fn server_attributes(req: &Request, info: &RequestInfo) -> Vec<KeyValue> {
    let mut attrs = vec![
        KeyValue::new("http.request.method", req.method().as_str().to_string()),
        KeyValue::new(
            "http.target",
            req.uri()
                .path_and_query()
                .map_or_else(|| info.path.clone(), |p| p.as_str().to_string()),
        ),
        KeyValue::new("url.scheme", "https"),
        KeyValue::new("network.protocol.version", protocol(req.version())),
    ];
    if let Some(ua) = req
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        attrs.push(KeyValue::new("user_agent.original", ua.to_string()));
    }
    if let Some(axum::extract::ConnectInfo(peer)) = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
    {
        attrs.push(KeyValue::new("client.address", peer.ip().to_string()));
    }
    attrs
}

fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_10 => "1.0",
        _ => "1.1",
    }
}

/// The handler's span for a resource request, named by its verb as kube's
/// handlers name theirs (`Create`, `Get`, `List`, ...), with kube's
/// `traceFields`; `None` when tracing is off or the request unsampled.
pub fn handler_span(req: &Request) -> Option<traces::Span> {
    if !traces::enabled() {
        return None;
    }
    let info = super::info(req);
    let Route::Resource(r) = &info.route else {
        return None;
    };
    let name = match r.verb? {
        crate::api::request::Verb::Get => "Get",
        crate::api::request::Verb::List => "List",
        crate::api::request::Verb::Watch => "Watch",
        crate::api::request::Verb::Create => "Create",
        crate::api::request::Verb::Update => "Update",
        crate::api::request::Verb::Patch => "Patch",
        crate::api::request::Verb::Delete => "Delete",
        crate::api::request::Verb::DeleteCollection => "DeleteCollection",
    };
    traces::Span::child_with(name, SpanKind::Internal, || {
        let labels = super::metrics::labels(req.method(), &info);
        let header = |h: http::header::HeaderName| {
            req.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let mut attrs = vec![
            KeyValue::new("accept", header(http::header::ACCEPT)),
            KeyValue::new("protocol", format!("HTTP/{}", protocol(req.version()))),
            KeyValue::new("resource", labels.resource),
            KeyValue::new("scope", labels.scope),
            KeyValue::new("url", info.path.clone()),
            KeyValue::new("user-agent", header(http::header::USER_AGENT)),
            KeyValue::new("verb", labels.verb),
        ];
        if let Some(axum::extract::ConnectInfo(peer)) = req
            .extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        {
            attrs.push(KeyValue::new("client", peer.ip().to_string()));
        }
        attrs
    })
}

/// The response body, ending the server span when it is done with (sent,
/// or dropped with the connection).
struct EndOnDrop {
    body: Body,
    cx: Context,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

impl http_body::Body for EndOnDrop {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_named_as_kube_names_them() {
        let name = |m: &str, p: &str| {
            let method: http::Method = m.parse().expect("method");
            let uri: http::Uri = p.parse().expect("uri");
            span_name(&method, &RequestInfo::parse(&method, &uri))
        };
        assert_eq!(
            name(
                "POST",
                "/apis/demo.kshard.dev/v1/namespaces/default/widgets"
            ),
            "POST /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets"
        );
        assert_eq!(
            name(
                "PUT",
                "/apis/demo.kshard.dev/v1/namespaces/default/widgets/w1/status"
            ),
            "PUT /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets/{:name}/status"
        );
        assert_eq!(
            name("GET", "/apis/demo.kshard.dev/v1/widgets"),
            "GET /apis/demo.kshard.dev/v1/widgets"
        );
        assert_eq!(name("GET", "/readyz"), "GET");
        assert_eq!(name("GET", "/apis"), "GET");
    }
}
