//! The internal endpoint replicas talk to each other on: plain HTTP/2 on
//! `--internal-listen` (meant for the pod network), every request carrying
//! the shared secret as a bearer token. It serves the leader's event stream
//! and the API for forwarded writes, whose identity headers are trusted only
//! here and only with the secret.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tokio_util::sync::CancellationToken;

use super::forward::{self, ForwardedIdentity};
use super::Replica;

pub const EVENTS_PATH: &str = "/internal/kshard/v1/events";

/// The internal endpoint: the event stream plus `api` (the public app, whose
/// filters honour a [`ForwardedIdentity`]), behind the secret check. Event
/// streams end when `stop` is cancelled (shutdown), so they do not hold the
/// drain open.
pub fn router(replica: Arc<Replica>, api: Router, stop: CancellationToken) -> Router {
    Router::new()
        .route(EVENTS_PATH, get(events))
        .with_state((replica.clone(), stop))
        .merge(api)
        .layer(axum::middleware::from_fn_with_state(replica, authenticate))
}

fn plain(status: StatusCode, text: &str) -> Response {
    let mut r = Response::new(Body::from(format!("{text}\n")));
    *r.status_mut() = status;
    r
}

/// Constant-time comparison, so the secret cannot be guessed byte by byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authenticate(
    State(replica): State<Arc<Replica>>,
    mut req: Request,
    next: Next,
) -> Response {
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| same(t.as_bytes(), replica.secret().as_bytes()))
        .unwrap_or(false);
    if !presented {
        return plain(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    req.headers_mut().remove(http::header::AUTHORIZATION);
    let identity = forward::take_identity(req.headers_mut());
    if req.uri().path() != EVENTS_PATH {
        let Some(identity) = identity else {
            return plain(
                StatusCode::BAD_REQUEST,
                "forwarded request without an identity",
            );
        };
        req.extensions_mut().insert(ForwardedIdentity(identity));
    }
    next.run(req).await
}

/// Tells a forwarding replica to look for the leader elsewhere; nothing was done.
pub fn not_leader() -> Response {
    let mut r = forward::unavailable("this replica does not lead the shard");
    r.headers_mut()
        .insert(forward::NOT_LEADER, http::HeaderValue::from_static("1"));
    r
}

async fn events(State((replica, stop)): State<(Arc<Replica>, CancellationToken)>) -> Response {
    let store = replica.store().clone();
    if !replica.is_leader() {
        return not_leader();
    }
    let epoch = replica.fence.epoch();
    let me = replica.clone();
    let body = super::stream::leader_stream(
        store,
        move || me.is_leader() && me.fence.epoch() == epoch,
        stop,
        replica.resigned_token(),
    );
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-kshard-events"),
    );
    r.extensions_mut()
        .insert(crate::api::response::NoCompression);
    r
}
