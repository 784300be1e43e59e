//! Panic recovery, the outermost layer: a handler that panics answers kube's
//! 500 instead of dropping the connection, and the server keeps serving.

use std::any::Any;

use axum::body::Body;
use http::{Response, StatusCode};
use tower_http::catch_panic::CatchPanicLayer;

/// kube-apiserver's `WithPanicRecovery` answer.
pub const PANIC_BODY: &str =
    "This request caused apiserver to panic. Look in the logs for details.";

/// What the layer calls with a caught panic's payload.
pub type PanicHandler = fn(Box<dyn Any + Send + 'static>) -> Response<Body>;

pub fn layer() -> CatchPanicLayer<PanicHandler> {
    CatchPanicLayer::custom(respond as PanicHandler)
}

fn respond(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %what, "a request panicked");
    let mut r = Response::new(Body::from(format!("{PANIC_BODY}\n")));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut().insert(
        "x-content-type-options",
        http::HeaderValue::from_static("nosniff"),
    );
    r
}
