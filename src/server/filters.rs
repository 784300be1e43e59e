//! The request filters in front of the API handlers, in kube-apiserver's
//! order: request info → authentication → impersonation → API Priority and
//! Fairness → authorization → handler, with request metrics around them all.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode};

use super::metrics::{record_request, RequestLabels};
use crate::api::request::{RequestInfo, Route, Verb};
use crate::api::watch::InitialEventsSent;
use crate::auth::Identity;
use crate::flowcontrol::{Apf, EstimateInputs, RequestDigest, TOO_MANY_REQUESTS_BODY};
use crate::registry::Registry;

pub struct Filters {
    pub apf: Arc<Apf>,
    pub registry: Arc<Registry>,
    pub auth: crate::auth::Authenticator,
    pub authz: crate::authz::Authorizer,
    /// Several replicas: writes go to the leader.
    pub replica: Option<Arc<crate::replica::Replica>>,
    /// With an audit policy: records events (the `Audit-Id` header is always set).
    pub auditor: Option<Arc<crate::audit::Auditor>>,
    /// `--request-timeout`: the longest a non-watch request may take.
    pub request_timeout: std::time::Duration,
}

/// kube's 504 for a request past its deadline.
fn deadline_exceeded() -> Response {
    let e = crate::status::ApiError::timeout(
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
    );
    status_response(&e)
}

/// The request's deadline: `--request-timeout`, or the client's shorter
/// `?timeout=` (Go duration syntax). `Err` is kube's 400 for a bad value.
fn request_deadline(
    req: &Request,
    max: std::time::Duration,
) -> Result<tokio::time::Instant, crate::status::ApiError> {
    let asked = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "timeout")
        .map(|(_, v)| v.into_owned());
    let timeout = match asked {
        None => max,
        Some(v) => match super::parse_go_duration(&v) {
            Ok(d) if !d.is_zero() => d.min(max),
            Ok(_) => max,
            Err(_) => {
                return Err(crate::status::ApiError::bad_request(format!(
                    "invalid timeout specified in the request URL: {v}"
                )))
            }
        },
    };
    Ok(tokio::time::Instant::now() + timeout)
}

/// Marks requests of `--insecure-listen`, the plain-HTTP debugging port,
/// which (as kube's old insecure port) skips authentication: the admin.
#[derive(Clone, Copy, Debug)]
pub struct InsecureListener;

/// The authorizer's view of a request.
fn attributes(digest: &RequestDigest, identity: &Identity) -> crate::authz::Attributes {
    crate::authz::Attributes {
        user: identity.clone(),
        verb: digest.verb.clone(),
        resource_request: digest.is_resource,
        group: digest.api_group.clone(),
        version: digest.api_version.clone(),
        resource: digest.resource.clone(),
        subresource: digest.subresource.clone(),
        namespace: digest.namespace.clone(),
        name: digest.name.clone(),
        path: digest.path.clone(),
    }
}

fn status_response(e: &crate::status::ApiError) -> Response {
    crate::api::response::error_response(e)
}

struct Info {
    digest: RequestDigest,
    labels: RequestLabels,
    verb: Option<Verb>,
    resource_id: Option<String>,
}

fn request_info(req: &Request, identity: &Identity) -> Info {
    let ri = RequestInfo::of(req.method(), req.uri(), req.extensions());
    let path = ri.path.clone();
    let method = req.method().clone();
    let mut digest = RequestDigest {
        user: identity.user.clone(),
        groups: identity.groups.clone(),
        is_resource: false,
        verb: method.as_str().to_ascii_lowercase(),
        api_group: String::new(),
        api_version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        path: path.clone(),
        is_long_running_non_watch: false,
    };
    let mut labels = RequestLabels {
        verb: method.as_str().to_string(),
        group: String::new(),
        version: String::new(),
        resource: String::new(),
        subresource: String::new(),
        scope: String::new(),
    };
    let mut verb = None;
    let mut resource_id = None;
    if let Route::Resource(r) = ri.route {
        digest.is_resource = true;
        verb = r.verb;
        digest.verb = r
            .verb
            .map_or_else(|| digest.verb.clone(), |v| v.as_str().to_string());
        digest.api_group = r.group.clone();
        digest.api_version = r.version.clone();
        digest.resource = r.resource.clone();
        digest.subresource = r.subresource.clone().unwrap_or_default();
        digest.namespace = r.namespace.clone().unwrap_or_default();
        digest.name = r.name.clone().unwrap_or_default();
        labels = RequestLabels {
            verb: match r.verb {
                Some(Verb::Create) => "POST".into(),
                Some(Verb::Update) => "PUT".into(),
                Some(v) => v.as_str().to_ascii_uppercase(),
                None => method.as_str().to_string(),
            },
            group: r.group.clone(),
            version: r.version.clone(),
            resource: r.resource.clone(),
            subresource: r.subresource.clone().unwrap_or_default(),
            scope: if r.name.is_some() {
                "resource".into()
            } else if r.namespace.is_some() {
                "namespace".into()
            } else {
                "cluster".into()
            },
        };
        resource_id = Some(format!("{}/{}", r.group, r.resource));
    }
    Info {
        digest,
        labels,
        verb,
        resource_id,
    }
}

/// What a request will cost, from the watch cache's live figures.
fn estimate(registry: &Registry, info: &Info) -> EstimateInputs {
    let Some(resource) = &info.resource_id else {
        return EstimateInputs::Simple;
    };
    match info.verb {
        Some(Verb::List) | Some(Verb::Watch) if info.digest.name.is_empty() => {
            let (count, avg) = registry.list_cost(resource);
            EstimateInputs::List {
                object_count: count as u64,
                avg_object_size: avg,
                from_watch_cache: true,
            }
        }
        Some(Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection) => {
            EstimateInputs::Mutating {
                watchers: registry.watchers_of(resource) as u32,
            }
        }
        _ => EstimateInputs::Simple,
    }
}

fn set_header(resp: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        resp.headers_mut().insert(name, v);
    }
}

/// What the audit event says about the request (user: the authenticated
/// one; an impersonated user is added later).
fn audit_meta(req: &Request, info: &Info, user: &Identity) -> crate::audit::RequestMeta {
    let d = &info.digest;
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
    crate::audit::RequestMeta {
        request_uri: req
            .uri()
            .path_and_query()
            .map_or_else(|| d.path.clone(), |p| p.as_str().to_string()),
        verb: d.verb.clone(),
        user: crate::audit::UserInfo::from(user),
        groups_for_policy: user.groups.clone(),
        source_ips,
        user_agent: req
            .headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        resource_request: d.is_resource,
        object_ref: d.is_resource.then(|| crate::audit::ObjectReference {
            resource: d.resource.clone(),
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            api_group: d.api_group.clone(),
            api_version: d.api_version.clone(),
            subresource: d.subresource.clone(),
            ..Default::default()
        }),
        path: d.path.clone(),
        long_running: info.verb == Some(Verb::Watch),
    }
}

pub async fn filter(State(f): State<Arc<Filters>>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    // Parsed once; every later stage reads this value.
    let ri = RequestInfo::parse(req.method(), req.uri());
    req.extensions_mut().insert(ri);
    let peer = req
        .extensions()
        .get::<crate::auth::PeerCertificates>()
        .cloned();
    // Only the internal endpoint sets this, after checking the replicas' secret.
    let forwarded = req
        .extensions_mut()
        .remove::<crate::replica::forward::ForwardedIdentity>();
    let insecure = req.extensions().get::<InsecureListener>().is_some();
    let (identity, authenticated) = if let Some(fwd) = &forwarded {
        (fwd.0.clone(), fwd.0.clone())
    } else if insecure {
        let admin = Identity::dev_admin();
        (admin.clone(), admin)
    } else {
        let identity = match f.auth.authenticate(req.headers_mut(), peer.as_ref()).await {
            Ok(id) => id,
            Err(_) => {
                // Failed authentication is audited too, with no user.
                let info = request_info(&req, &Identity::default());
                let meta = audit_meta(&req, &info, &Identity::default());
                return crate::audit::record(f.auditor.as_ref(), meta, req, |_| async {
                    let mut e = crate::status::ApiError::forbidden("Unauthorized");
                    e.code = 401;
                    e.reason = "Unauthorized";
                    status_response(&e)
                })
                .await;
            }
        };
        if f.auth.is_dev() {
            (identity.clone(), identity)
        } else {
            let authenticated = identity.clone();
            match crate::authz::impersonation::impersonate(&f.authz, identity, req.headers_mut())
                .await
            {
                Ok(id) => (id, authenticated),
                Err(e) => {
                    let info = request_info(&req, &authenticated);
                    let meta = audit_meta(&req, &info, &authenticated);
                    return crate::audit::record(f.auditor.as_ref(), meta, req, |_| async move {
                        status_response(&e)
                    })
                    .await;
                }
            }
        }
    };
    let info = request_info(&req, &identity);
    let meta = audit_meta(&req, &info, &authenticated);
    let auditor = f.auditor.clone();
    crate::audit::record(auditor.as_ref(), meta, req, move |req| async move {
        if identity != authenticated {
            if let Some(rec) = req.extensions().get::<Arc<crate::audit::Recording>>() {
                rec.set_impersonated_user(crate::audit::UserInfo::from(&identity));
            }
        }
        admit_and_serve(f, req, info, identity, forwarded.is_some(), start, next).await
    })
    .await
}

/// Replica routing, priority and fairness, authorization, then the handler.
async fn admit_and_serve(
    f: Arc<Filters>,
    mut req: Request,
    info: Info,
    identity: Identity,
    forwarded: bool,
    start: Instant,
    next: Next,
) -> Response {
    let recording = req
        .extensions()
        .get::<Arc<crate::audit::Recording>>()
        .cloned();
    if let Some(replica) = f
        .replica
        .as_ref()
        .filter(|_| crate::replica::is_write(info.verb))
    {
        if forwarded {
            // Forwarded once is enough: a replica that no longer leads says so.
            if !replica.is_leader() {
                return crate::replica::internal::not_leader();
            }
        } else {
            match replica.route(req, &identity).await {
                crate::replica::Routed::Remote(resp) => {
                    record_request(&info.labels, resp.status().as_u16(), start.elapsed());
                    return resp;
                }
                crate::replica::Routed::Local(r) => req = r,
            }
        }
    }
    req.extensions_mut().insert(identity.clone());
    // A watch is long-running: it has its own timeoutSeconds.
    let deadline = if info.verb == Some(Verb::Watch) {
        None
    } else {
        match request_deadline(&req, f.request_timeout) {
            Ok(d) => Some(d),
            Err(bad) => return status_response(&bad),
        }
    };
    let inputs = estimate(&f.registry, &info);
    let queued = Instant::now();
    // A client that goes away drops this future, which withdraws a queued request.
    let admitted = f
        .apf
        .admit(&info.digest, inputs, deadline, std::future::pending::<()>())
        .await;
    if let Some(rec) = &recording {
        rec.annotate(
            "apiserver.latency.k8s.io/apf-queue-wait",
            format!("{:?}", queued.elapsed()),
        );
        if let Ok(seats) = &admitted {
            rec.annotate(
                "flowcontrol.kshard.dev/priority-level-uid",
                seats.priority_level_uid(),
            );
            rec.annotate(
                "flowcontrol.kshard.dev/flow-schema-uid",
                seats.flow_schema_uid(),
            );
        }
    }
    let mut resp = match admitted {
        Err(rejected) => {
            let mut r = Response::new(axum::body::Body::from(format!(
                "{TOO_MANY_REQUESTS_BODY}\n"
            )));
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            set_header(&mut r, "content-type", "text/plain; charset=utf-8");
            set_header(&mut r, "x-content-type-options", "nosniff");
            set_header(
                &mut r,
                "retry-after",
                &rejected.retry_after_secs.to_string(),
            );
            set_header(
                &mut r,
                "x-kubernetes-pf-flowschema-uid",
                &rejected.flow_schema_uid,
            );
            set_header(
                &mut r,
                "x-kubernetes-pf-prioritylevel-uid",
                &rejected.priority_level_uid,
            );
            r
        }
        Ok(seats) => {
            match f
                .authz
                .authorize(&attributes(&info.digest, &identity))
                .await
            {
                Ok(crate::authz::Decision::Allow) => {
                    if let Some(rec) = &recording {
                        rec.annotate("authorization.k8s.io/decision", "allow");
                    }
                }
                Ok(crate::authz::Decision::Deny(reason)) => {
                    if let Some(rec) = &recording {
                        rec.annotate("authorization.k8s.io/decision", "forbid");
                        rec.annotate("authorization.k8s.io/reason", reason.clone());
                    }
                    seats.finish();
                    let e = crate::authz::forbidden(&attributes(&info.digest, &identity), &reason);
                    let mut r = status_response(&e);
                    record_request(&info.labels, 403, start.elapsed());
                    set_header(&mut r, "cache-control", "no-cache, private");
                    return r;
                }
                Err(e) => {
                    seats.finish();
                    tracing::warn!(error = %e, "authorization failed");
                    let mut r = status_response(&crate::status::ApiError::internal(e));
                    record_request(&info.labels, 500, start.elapsed());
                    set_header(&mut r, "cache-control", "no-cache, private");
                    return r;
                }
            }
            let fs = seats.flow_schema_uid().to_string();
            let pl = seats.priority_level_uid().to_string();
            let mut r = if info.verb == Some(Verb::Watch) {
                // A watch holds its seats only until its initial events are out.
                req.extensions_mut().insert(InitialEventsSent::new(move || {
                    seats.release_initial_seats()
                }));
                next.run(req).await
            } else {
                // Seats are held until the body is fully sent (a streamed LIST
                // works after its handler returns), and never past the deadline.
                let deadline = deadline.unwrap_or_else(tokio::time::Instant::now);
                let seats = Arc::new(std::sync::Mutex::new(Some(seats)));
                let held = seats.clone();
                let reclaim = tokio::spawn(async move {
                    tokio::time::sleep_until(deadline).await;
                    if let Some(s) = take_seats(&held) {
                        tracing::debug!("seats returned at the request deadline");
                        s.finish();
                    }
                });
                match tokio::time::timeout_at(deadline, next.run(req)).await {
                    Ok(r) => {
                        let (parts, body) = r.into_parts();
                        Response::from_parts(
                            parts,
                            axum::body::Body::new(FinishOnEnd {
                                inner: body,
                                seats,
                                deadline: Box::pin(tokio::time::sleep_until(deadline)),
                                reclaim,
                            }),
                        )
                    }
                    Err(_) => {
                        reclaim.abort();
                        if let Some(s) = take_seats(&seats) {
                            s.finish();
                        }
                        deadline_exceeded()
                    }
                }
            };
            set_header(&mut r, "x-kubernetes-pf-flowschema-uid", &fs);
            set_header(&mut r, "x-kubernetes-pf-prioritylevel-uid", &pl);
            r
        }
    };
    record_request(&info.labels, resp.status().as_u16(), start.elapsed());
    if resp.headers().get("cache-control").is_none() && resp.status() != StatusCode::NOT_MODIFIED {
        set_header(&mut resp, "cache-control", "no-cache, private");
    }
    resp
}

fn take_seats(
    seats: &std::sync::Mutex<Option<crate::flowcontrol::SeatGuard>>,
) -> Option<crate::flowcontrol::SeatGuard> {
    seats.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// A response body that returns its request's seats when it has been sent
/// (or dropped, when the client goes away), or at the request deadline,
/// whichever comes first: a client that reads slowly cannot keep them. A body
/// still unsent at the deadline ends with an error, which closes the stream.
struct FinishOnEnd {
    inner: axum::body::Body,
    seats: Arc<std::sync::Mutex<Option<crate::flowcontrol::SeatGuard>>>,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Returns the seats at the deadline even when nobody polls this body.
    reclaim: tokio::task::JoinHandle<()>,
}

impl Drop for FinishOnEnd {
    fn drop(&mut self) {
        self.reclaim.abort();
        if let Some(s) = take_seats(&self.seats) {
            s.finish();
        }
    }
}

impl http_body::Body for FinishOnEnd {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            if let Some(s) = take_seats(&self.seats) {
                s.finish();
            }
            return std::task::Poll::Ready(Some(Err(axum::Error::new(
                "response not sent within the request deadline",
            ))));
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled {
            if let Some(s) = take_seats(&self.seats) {
                s.finish();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
