//! Auditing as kube-apiserver does it: every request gets an audit ID
//! (the client's `Audit-ID` header, or a new UUID) returned in `Audit-Id`;
//! an `audit.k8s.io/v1` Policy decides the level of each request; events for
//! the stages RequestReceived, ResponseStarted (watches), ResponseComplete
//! and Panic go to the log backend (JSON lines, rotated) and/or the webhook
//! backend (batched EventLists).
//!
//! The request path's audit layer runs before authentication (kube's
//! `WithAuditID`): it sets `Audit-Id` and records a failed authentication
//! ([`record_failed_authentication`], kube's `WithFailedAuthenticationAudit`).
//! After authentication (the event names the user) it calls [`record`] once;
//! later filters add to the same event through the [`Recording`] in the
//! request's extensions (impersonated user, authorization decision, priority
//! level).
//!
//! - [`policy`]: the Policy file and its rule matching;
//! - [`event`]: the Event wire types;
//! - [`log`], [`webhook`]: the two backends.

pub mod event;
pub mod log;
pub mod policy;
pub mod webhook;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures::FutureExt;
use http::HeaderMap;
use serde_json::Value;

pub use event::{Event, ObjectReference, ResponseStatus, UserInfo};
pub use policy::{Attributes, Decision, Level, Policy, Stage};

/// Where events go. `process` must not block for long: it runs on the request path.
pub trait Sink: Send + Sync {
    fn process(&self, event: &Event);
}

/// kube-apiserver's audit flags (the subset kshard serves; same names and defaults).
#[derive(Debug, Clone, clap::Args)]
pub struct AuditOptions {
    /// Audit policy file (audit.k8s.io/v1 Policy). Without it nothing is audited.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,
    /// Audit log file (`-` for standard output). Without it, no log backend.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,
    /// Days to keep rotated audit log files (0: no age limit).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,
    /// Rotated audit log files to keep (0: all).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,
    /// Size in megabytes at which the audit log is rotated (0: 100).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,
    /// Audit log format; only `json` (one event per line) is supported.
    #[arg(long, default_value = "json")]
    pub audit_log_format: String,
    /// kubeconfig naming the audit webhook (server URL, CA, client credentials).
    #[arg(long)]
    pub audit_webhook_config_file: Option<PathBuf>,
    /// Events buffered for the webhook before new ones are dropped.
    #[arg(long, default_value_t = 10000)]
    pub audit_webhook_batch_buffer_size: usize,
    /// Most events in one webhook request.
    #[arg(long, default_value_t = 400)]
    pub audit_webhook_batch_max_size: usize,
    /// Longest an event waits for its batch to fill.
    #[arg(long, default_value = "30s", value_parser = crate::units::parse_duration)]
    pub audit_webhook_batch_max_wait: Duration,
    /// Webhook requests per second (0: unthrottled).
    #[arg(long, default_value_t = 10.0)]
    pub audit_webhook_batch_throttle_qps: f64,
    /// Webhook requests allowed at once when the throttle has been idle.
    #[arg(long, default_value_t = 15)]
    pub audit_webhook_batch_throttle_burst: u32,
    /// Wait before the first retry of a failed webhook request.
    #[arg(long, default_value = "10s", value_parser = crate::units::parse_duration)]
    pub audit_webhook_initial_backoff: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error("opening the audit log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Webhook(#[from] webhook::WebhookError),
    #[error("--audit-log-format {0:?} is not supported (use json)")]
    Format(String),
}

/// The policy and the backends; absent when no policy file is given.
pub struct Auditor {
    policy: Policy,
    sinks: Vec<Arc<dyn Sink>>,
}

/// Largest request or response body copied into an event (larger: omitted).
const MAX_RECORDED_BODY: usize = 3 * 1024 * 1024;

impl Auditor {
    pub fn new(policy: Policy, sinks: Vec<Arc<dyn Sink>>) -> Arc<Self> {
        Arc::new(Auditor { policy, sinks })
    }

    /// The auditor the flags describe; `None` without a policy or a backend.
    pub async fn from_options(o: &AuditOptions) -> Result<Option<Arc<Self>>, AuditError> {
        let Some(policy_file) = &o.audit_policy_file else {
            return Ok(None);
        };
        if o.audit_log_format != "json" {
            return Err(AuditError::Format(o.audit_log_format.clone()));
        }
        let policy = Policy::load(policy_file)?;
        let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
        if let Some(path) = &o.audit_log_path {
            let rotation = log::Rotation::from_flags(
                o.audit_log_maxsize,
                o.audit_log_maxbackup,
                o.audit_log_maxage,
            );
            let sink = log::LogSink::open(path, rotation).map_err(|source| AuditError::Log {
                path: path.display().to_string(),
                source,
            })?;
            sinks.push(Arc::new(sink));
        }
        if let Some(kc) = &o.audit_webhook_config_file {
            let batching = webhook::Batching {
                buffer_size: o.audit_webhook_batch_buffer_size,
                max_batch_size: o.audit_webhook_batch_max_size,
                max_wait: o.audit_webhook_batch_max_wait,
                throttle_qps: o.audit_webhook_batch_throttle_qps,
                throttle_burst: o.audit_webhook_batch_throttle_burst,
                initial_backoff: o.audit_webhook_initial_backoff,
            };
            sinks.push(Arc::new(webhook::WebhookSink::start(kc, batching).await?));
        }
        if sinks.is_empty() {
            tracing::warn!("--audit-policy-file without --audit-log-path or --audit-webhook-config-file: nothing is audited");
            return Ok(None);
        }
        Ok(Some(Self::new(policy, sinks)))
    }

    fn emit(&self, event: &Event) {
        for s in &self.sinks {
            s.process(event);
        }
    }
}

/// The audit ID of a request: the client's `Audit-ID` header if it sent a
/// usable one (as kube-apiserver honours it), else a new UUID.
pub fn audit_id(headers: &HeaderMap) -> String {
    headers
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_string)
        .unwrap_or_else(|| crate::object::meta::new_uid().to_string())
}

/// What the event says about the request, filled in by the request path.
#[derive(Debug, Clone, Default)]
pub struct RequestMeta {
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    pub groups_for_policy: Vec<String>,
    pub source_ips: Vec<String>,
    pub user_agent: String,
    pub resource_request: bool,
    pub object_ref: Option<ObjectReference>,
    pub path: String,
    /// A watch: ResponseStarted when the headers go out, ResponseComplete at the end.
    pub long_running: bool,
}

/// One request's event while it is being served; later filters add to it.
pub struct Recording {
    auditor: Arc<Auditor>,
    decision: Decision,
    event: Mutex<Event>,
}

impl Recording {
    pub fn annotate(&self, key: &str, value: impl Into<String>) {
        if let Ok(mut e) = self.event.lock() {
            e.annotations
                .entry(key.to_string())
                .or_insert_with(|| value.into());
        }
    }

    pub fn set_impersonated_user(&self, user: UserInfo) {
        if let Ok(mut e) = self.event.lock() {
            e.impersonated_user = Some(user);
        }
    }

    fn emit(&self, stage: Stage, fill: impl FnOnce(&mut Event)) {
        if !self.decision.records(stage) {
            return;
        }
        let Ok(mut e) = self.event.lock() else {
            return;
        };
        e.stage = stage;
        e.stage_timestamp = event::micro_time();
        fill(&mut e);
        self.auditor.emit(&e);
    }
}

/// Audits one authenticated request, audit ID `id`, around `serve` (the
/// rest of the chain): records events as the policy says.
pub async fn record<F, Fut>(
    auditor: &Arc<Auditor>,
    id: &str,
    meta: RequestMeta,
    mut req: Request,
    serve: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let Some(recording) = begin(auditor, id, &meta) else {
        return serve(req).await;
    };
    if recording.decision.level >= Level::Request {
        let (parts, body) = req.into_parts();
        // A body over the limit is passed on untouched for the handler to refuse.
        let bytes = match axum::body::to_bytes(body, MAX_RECORDED_BODY).await {
            Ok(b) => b,
            Err(_) => bytes::Bytes::new(),
        };
        if let Some(mut obj) = json_object(&bytes) {
            if recording.decision.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            if let Ok(mut e) = recording.event.lock() {
                e.request_object = Some(obj);
            }
        }
        req = Request::from_parts(parts, Body::from(bytes));
    }
    recording.emit(Stage::RequestReceived, |_| {});
    let recording = Arc::new(recording);
    req.extensions_mut().insert(recording.clone());
    let served = std::panic::AssertUnwindSafe(serve(req))
        .catch_unwind()
        .await;
    let resp = match served {
        Ok(r) => r,
        Err(panic) => {
            recording.emit(Stage::Panic, |e| {
                e.response_status = Some(ResponseStatus {
                    status: "Failure".into(),
                    message: "APIServer panic'd".into(),
                    reason: "InternalError".into(),
                    code: 500,
                    ..Default::default()
                })
            });
            std::panic::resume_unwind(panic);
        }
    };
    let code = resp.status().as_u16();
    if meta.long_running && code < 300 {
        recording.emit(Stage::ResponseStarted, |e| {
            e.response_status = Some(ResponseStatus {
                code,
                ..Default::default()
            })
        });
        let (parts, body) = resp.into_parts();
        return Response::from_parts(
            parts,
            Body::new(CompleteOnEnd {
                inner: body,
                recording: Some(recording),
                code,
            }),
        );
    }
    let wants_body = code >= 400 || recording.decision.level == Level::RequestResponse;
    let is_json = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    let mut status = ResponseStatus {
        code,
        ..Default::default()
    };
    // Only bodies of known, bounded size are copied; a streamed LIST goes out
    // as it streams, and its event carries no responseObject.
    let bounded = http_body::Body::size_hint(resp.body())
        .exact()
        .is_some_and(|n| n <= MAX_RECORDED_BODY as u64);
    if wants_body && is_json && bounded {
        let (parts, body) = resp.into_parts();
        let bytes = match axum::body::to_bytes(body, MAX_RECORDED_BODY).await {
            Ok(b) => b,
            Err(e) => {
                recording.emit(Stage::ResponseComplete, |ev| {
                    ev.response_status = Some(status);
                });
                tracing::warn!(error = %e, "reading a response body for the audit log");
                return Response::from_parts(parts, Body::empty());
            }
        };
        let obj = json_object(&bytes);
        if let Some(o) = obj.as_ref() {
            fill_status(&mut status, o);
        }
        let response_object = (recording.decision.level == Level::RequestResponse)
            .then_some(obj)
            .flatten()
            .map(|mut o| {
                if recording.decision.omit_managed_fields {
                    strip_managed_fields(&mut o);
                }
                o
            });
        recording.emit(Stage::ResponseComplete, |e| {
            e.response_status = Some(status);
            e.response_object = response_object;
        });
        return Response::from_parts(parts, Body::from(bytes));
    }
    if http_body::Body::size_hint(resp.body()).exact().is_some() {
        // A body already whole: complete now, so the event is written before
        // the client has its answer.
        recording.emit(Stage::ResponseComplete, |e| {
            e.response_status = Some(status)
        });
        return resp;
    }
    let (parts, body) = resp.into_parts();
    Response::from_parts(
        parts,
        Body::new(CompleteOnEnd {
            inner: body,
            recording: Some(recording),
            code,
        }),
    )
}

/// A request whose credentials were refused (`resp`, authentication's 401),
/// as kube's failed-authentication audit records it: one ResponseStarted
/// event with no user and the answer's Status, no request body, whatever the
/// level (as kube-apiserver v1.36 writes it).
pub async fn record_failed_authentication(
    auditor: &Arc<Auditor>,
    id: &str,
    meta: &RequestMeta,
    resp: Response,
) -> Response {
    let Some(recording) = begin(auditor, id, meta) else {
        return resp;
    };
    let mut status = ResponseStatus {
        code: resp.status().as_u16(),
        ..Default::default()
    };
    // The 401 is built whole by authentication; any other body is left alone.
    let whole = http_body::Body::size_hint(resp.body())
        .exact()
        .is_some_and(|n| n <= MAX_RECORDED_BODY as u64);
    let resp = if whole {
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, MAX_RECORDED_BODY)
            .await
            .unwrap_or_default();
        if let Some(o) = json_object(&bytes) {
            fill_status(&mut status, &o);
        }
        Response::from_parts(parts, Body::from(bytes))
    } else {
        resp
    };
    recording.emit(Stage::ResponseStarted, |e| e.response_status = Some(status));
    resp
}

/// An answer's `Status` fields, when its body is one.
fn fill_status(status: &mut ResponseStatus, o: &Value) {
    if o["kind"] == "Status" {
        status.status = str_field(o, "status");
        status.message = str_field(o, "message");
        status.reason = str_field(o, "reason");
        status.details = o.get("details").cloned();
    }
}

fn begin(auditor: &Arc<Auditor>, id: &str, meta: &RequestMeta) -> Option<Recording> {
    let empty = ObjectReference::default();
    let r = meta.object_ref.as_ref().unwrap_or(&empty);
    let decision = auditor.policy.evaluate(&Attributes {
        user: &meta.user.username,
        groups: &meta.groups_for_policy,
        verb: &meta.verb,
        resource_request: meta.resource_request,
        group: &r.api_group,
        resource: &r.resource,
        subresource: &r.subresource,
        namespace: &r.namespace,
        name: &r.name,
        path: &meta.path,
    });
    if decision.level == Level::None {
        return None;
    }
    let mut e = Event::new(decision.level, id.to_string());
    e.request_uri = meta.request_uri.clone();
    e.verb = meta.verb.clone();
    e.user = meta.user.clone();
    e.source_ips = meta.source_ips.clone();
    e.user_agent = meta.user_agent.clone();
    e.object_ref = meta.object_ref.clone();
    Some(Recording {
        auditor: auditor.clone(),
        decision,
        event: Mutex::new(e),
    })
}

fn json_object(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .filter(Value::is_object)
}

fn str_field(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// `omitManagedFields`: drop managedFields from the object, or each item of a list.
fn strip_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for i in items {
            strip_managed_fields(i);
        }
    }
}

/// A streamed response body that emits ResponseComplete when it has been
/// sent (or dropped, when the client goes away).
struct CompleteOnEnd {
    inner: Body,
    recording: Option<Arc<Recording>>,
    code: u16,
}

impl CompleteOnEnd {
    fn complete(&mut self) {
        if let Some(r) = self.recording.take() {
            let code = self.code;
            r.emit(Stage::ResponseComplete, |e| {
                e.response_status = Some(ResponseStatus {
                    code,
                    ..Default::default()
                })
            });
        }
    }
}

impl Drop for CompleteOnEnd {
    fn drop(&mut self) {
        self.complete();
    }
}

impl http_body::Body for CompleteOnEnd {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled {
            self.complete();
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
