//! Request-scoped values the server's layers leave in a request's
//! extensions for whatever handles it later (the API handlers, forwarding
//! to the leader): its deadline and its body limit. A small module below
//! `server`, so that `api` and `replica` read them without reaching up.

use axum::body::Body;
use bytes::Bytes;
use tokio::time::Instant;

use crate::status::ApiError;

/// When a non-long-running request must be done.
#[derive(Clone, Copy, Debug)]
pub struct RequestDeadline(pub Instant);

/// kube's 504 for a request past its deadline.
pub fn deadline_exceeded() -> ApiError {
    ApiError::timeout(
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
    )
}

/// kube's default `--max-request-body-bytes` (3 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The request body limit in force, so every reader of the body (the
/// handlers, forwarding) holds it to the same limit and refuses it the same
/// way.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Reads a body within the limit `ext` carries; kube's 413 beyond it.
pub async fn read_within(body: Body, ext: &http::Extensions) -> Result<Bytes, ApiError> {
    let limit = ext
        .get::<BodyLimit>()
        .map_or(DEFAULT_MAX_BODY_BYTES, |l| l.0);
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large(limit))
}

/// kube's 413 for a body over the limit (handlers' `limitedReadBody`).
pub fn too_large(limit: usize) -> ApiError {
    let mut e = ApiError::bad_request(format!("Request entity too large: limit is {limit}"));
    e.code = 413;
    e.reason = "RequestEntityTooLarge".into();
    e
}
