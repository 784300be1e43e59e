//! The request path from a decoded HTTP request to the API handler: a stack
//! of small layers, one concern each, in kube-apiserver's order. Each layer
//! is an async function given the request and the rest of the chain
//! (`next`); [`stack`] chains them, each step's future in its own box. This list is
//! the one place to read the chain; adding a concern means adding one layer
//! here.
//!
//! | order | layer | what it does | answers on its own |
//! |---|---|---|---|
//! | 1 | [`panic`] | a panicking handler becomes kube's 500 | 500 |
//! | 2 | [`request_info`] | the path is decoded and parsed **once** into [`RequestInfo`](crate::api::request::RequestInfo); every later stage reads that value | 404 for paths kube refuses |
//! | 3 | [`metrics`] | `apiserver_request_total` / `_duration_seconds` for every answer | |
//! | | [`cache_control`] | `Cache-Control: no-cache, private` unless the handler set one | |
//! | 4 | [`deadline`] | `--request-timeout` / `?timeout=` for non-long-running requests | 400, 504 |
//! | 5 | [`audit`] | `Audit-Id` on every answer; under a policy, the event of a refused authentication | |
//! | 6 | [`authentication`] | front proxy, client certificate, bearer token, anonymous | 401 |
//! | | [`trace`] | with `--tracing-config-file`: the request's server span (the caller's `traceparent` followed for privileged callers and the host's aggregator), back-dated to its arrival | |
//! | 7 | [`body`] | reads the request body (3 MiB, under the deadline and a memory budget) before any seat is taken | 413, 429 |
//! | 8 | [`audit::events`] | the policy's events per stage, naming the user | |
//! | 9 | [`impersonation`] | `Impersonate-*` headers, authorized with the `impersonate` verb | 400, 403 |
//! | 10 | [`forward`] | several replicas: writes go to the leader | the leader's answer |
//! | 11 | [`priority`] | API Priority and Fairness: classify, queue, hold seats until the response is sent | 429 |
//! | 12 | [`authorization`] | SubjectAccessReview (or standalone rules) with the request info's attributes | 403 |
//!
//! Kube runs authorization inside the flow-control seat too: a request
//! denied there has still been paid for by its flow.
//!
//! With tracing on, the steps from authentication to authorization are
//! child spans of the server span, each ending when it hands the request on
//! (kube's `filterlatency` spans), and the handler's span holds the rest.

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
#[cfg(test)]
mod tests;
pub mod trace;

use std::sync::Arc;

use axum::extract::Request;
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

/// Wraps `app` in the request path, outermost first. The layers are plain
/// async functions composed statically: axum's `from_fn` would also clone
/// the inner service per layer and request, which cost several percent of a
/// create's CPU.
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
    let impersonation = impersonation::Impersonation {
        authz: authz.clone(),
        dev: auth.is_dev(),
    };
    let stack = Stack(Arc::new(Layers {
        request_timeout,
        authentication: authentication::Authentication { auth },
        body,
        auditor,
        impersonation,
        replica,
        priority: priority::Priority {
            apf,
            registry,
            watchdog: priority::Watchdog::default(),
        },
        authz,
        app,
    }));
    Router::new().fallback_service(
        tower::ServiceBuilder::new()
            .layer(panic::panic_layer())
            .service(stack),
    )
}

/// Everything below the panic layer, shared by all connections.
struct Layers {
    request_timeout: std::time::Duration,
    authentication: authentication::Authentication,
    body: Arc<body::BodyLimits>,
    auditor: Option<Arc<crate::audit::Auditor>>,
    impersonation: impersonation::Impersonation,
    replica: Option<Arc<crate::replica::Replica>>,
    priority: priority::Priority,
    authz: crate::authz::Authorizer,
    app: Router,
}

// One method per step, each naming the next: nesting the layers as closures
// inside one function made rustc's compile time explode. Each step's future
// is boxed: nested in place they made one 18 KB future, and every level
// moved all of its inner levels when it started them (about 100 KB of
// memcpy per request); boxed, each level is moved once at its own size.
impl Layers {
    async fn serve(&self, req: Request) -> Response {
        request_info::request_info_layer(req, |req| Box::pin(self.metrics(req))).await
    }

    async fn metrics(&self, req: Request) -> Response {
        metrics::metrics_layer(req, |req| Box::pin(self.cache_control(req))).await
    }

    async fn cache_control(&self, req: Request) -> Response {
        cache_control::cache_control_layer(req, |req| Box::pin(self.deadline(req))).await
    }

    async fn deadline(&self, req: Request) -> Response {
        deadline::deadline_layer(self.request_timeout, req, |req| Box::pin(self.audit(req))).await
    }

    async fn audit(&self, req: Request) -> Response {
        audit::audit_layer(self.auditor.as_ref(), req, |req| {
            Box::pin(self.authentication(req))
        })
        .await
    }

    async fn authentication(&self, req: Request) -> Response {
        authentication::authentication_layer(&self.authentication, req, |req| {
            // Untraced, the trace step is skipped, not boxed.
            if crate::traces::enabled() {
                futures::future::Either::Left(Box::pin(self.trace(req)))
            } else {
                futures::future::Either::Right(Box::pin(self.body(req)))
            }
        })
        .await
    }

    async fn trace(&self, req: Request) -> Response {
        trace::trace_layer(req, |req| Box::pin(self.body(req))).await
    }

    async fn body(&self, req: Request) -> Response {
        body::body_layer(&self.body, req, |req| Box::pin(self.audit_events(req))).await
    }

    async fn audit_events(&self, req: Request) -> Response {
        let step = crate::traces::Span::child("audit");
        audit::events(self.auditor.as_ref(), req, |req| {
            drop(step);
            Box::pin(self.impersonation(req))
        })
        .await
    }

    async fn impersonation(&self, req: Request) -> Response {
        let step = crate::traces::Span::child("impersonation");
        impersonation::impersonation_layer(&self.impersonation, req, |req| {
            drop(step);
            Box::pin(self.forward(req))
        })
        .await
    }

    async fn forward(&self, req: Request) -> Response {
        forward::forward_layer(self.replica.as_ref(), req, |req| {
            Box::pin(self.priority(req))
        })
        .await
    }

    async fn priority(&self, req: Request) -> Response {
        priority::priority_layer(&self.priority, req, |req| Box::pin(self.authorization(req))).await
    }

    async fn authorization(&self, req: Request) -> Response {
        authorization::authorization_layer(&self.authz, req, |req| Box::pin(self.handle(req))).await
    }

    async fn handle(&self, req: Request) -> Response {
        use tower::Service;
        let span = trace::handler_span(&req);
        match crate::traces::in_span(&span, self.app.clone().call(req)).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        }
    }
}

/// The layers as one tower service.
#[derive(Clone)]
struct Stack(Arc<Layers>);

impl tower::Service<Request> for Stack {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let layers = self.0.clone();
        Box::pin(async move { Ok(layers.serve(req).await) })
    }
}

/// Marks requests of `--insecure-listen`, the plain-HTTP debugging port,
/// which (as kube's old insecure port) skips authentication: the admin.
#[derive(Clone, Copy, Debug)]
pub struct InsecureListener;

/// Who authenticated (before impersonation). Set by [`authentication`].
#[derive(Clone, Debug)]
pub struct Authenticated(pub Identity);

/// Set on authentication's 401 (credentials presented and refused), for
/// the [`audit`] layer around it to record.
#[derive(Clone, Copy, Debug)]
pub struct Unauthenticated;

/// Set by [`authentication`] for a write a follower forwarded: authenticated
/// and impersonated there already, so neither runs again here.
#[derive(Clone, Copy, Debug)]
pub struct Forwarded;

/// Set by [`authentication`] when a front proxy (the host's aggregator,
/// holding a requestheader certificate) named the user.
#[derive(Clone, Copy, Debug)]
pub struct FrontProxied;

/// The user a request acts as (after impersonation), as the handler and the
/// authorizer see it. Set by [`authentication`] and replaced by
/// [`impersonation`].
pub fn acting_user(req: &axum::extract::Request) -> Identity {
    acting_user_ref(req).into_owned()
}

/// [`acting_user`] borrowed, for a layer that only reads it (a copy of the
/// user's groups and extra for each layer was a percent of a create).
pub fn acting_user_ref(req: &axum::extract::Request) -> std::borrow::Cow<'_, Identity> {
    match req.extensions().get::<Identity>() {
        Some(user) => std::borrow::Cow::Borrowed(user),
        None => std::borrow::Cow::Owned(Identity::default()),
    }
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
pub(crate) fn info(req: &axum::extract::Request) -> Arc<crate::api::request::RequestInfo> {
    crate::api::request::RequestInfo::of(req.method(), req.uri(), req.extensions())
}
