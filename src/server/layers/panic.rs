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

pub fn panic_layer() -> CatchPanicLayer<PanicHandler> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn a_panicking_handler_answers_kubes_500() {
        let handler = tower::service_fn(|_req: http::Request<Body>| async move {
            if true {
                panic!("handler bug");
            }
            Ok::<_, std::convert::Infallible>(Response::new(Body::empty()))
        });
        let resp = panic_layer()
            .layer(handler)
            .oneshot(http::Request::new(Body::empty()))
            .await
            .unwrap_or_else(|e| match e {});
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        assert_eq!(body, format!("{PANIC_BODY}\n").as_bytes());
    }
}
