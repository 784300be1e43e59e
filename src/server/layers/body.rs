//! Reads the request body before the request takes a flow-control seat, so
//! a client that stalls its body holds a socket and some buffered bytes, not
//! a seat that other users of its priority level need. The body must arrive
//! within the request deadline (the layer above answers 504 then), may be at
//! most `--max-request-body-bytes` (kube's 3 MiB: 413 with kube's Status),
//! and all bodies being read at once share a memory budget
//! (`--max-buffered-request-body-bytes`): a request that would exceed it is
//! refused with 429 at once instead of waiting, so slow uploaders cannot make
//! the server hold unbounded memory or queue everyone else behind them.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::status::ApiError;

/// Budget accounting unit: one permit per KiB (a semaphore counts in u32).
const UNIT: usize = 1024;
/// How much of a too-large body is read and thrown away so the client, still
/// sending, gets to read the 413 (closing with unread data makes the kernel
/// reset the connection, and an HTTP/1.1 client then sees only a broken
/// pipe). Beyond it the connection is closed. Discarding holds no memory.
const DISCARD_BYTES: u64 = 16 * 1024 * 1024;

pub struct BodyLimits {
    /// Largest request body.
    pub max_bytes: usize,
    /// Bytes of request bodies held in memory at once, over all requests.
    budget: Arc<Semaphore>,
}

impl BodyLimits {
    pub fn new(max_bytes: u64, budget_bytes: u64) -> Self {
        let units = usize::try_from(budget_bytes / UNIT as u64)
            .unwrap_or(usize::MAX)
            .clamp(1, Semaphore::MAX_PERMITS);
        Self {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            budget: Arc::new(Semaphore::new(units)),
        }
    }

    /// Budget left, in bytes (for tests and metrics).
    pub fn available_bytes(&self) -> usize {
        self.budget.available_permits() * UNIT
    }
}

pub use crate::scope::{
    read_within, too_large, BodyLimit, DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BYTES,
};

fn budget_exhausted() -> Response {
    let e = ApiError::too_many_requests(
        "too many request bodies are being received at once, please try again later",
    );
    let mut r = super::status_response(&e);
    super::set_header(&mut r, "retry-after", "1");
    r
}

enum Refused {
    TooLarge,
    Budget,
    Read(axum::Error),
}

/// Reads `body` whole, taking budget for each chunk as it arrives.
async fn read(
    limits: &BodyLimits,
    body: &mut Body,
    held: &mut Vec<OwnedSemaphorePermit>,
) -> Result<Bytes, Refused> {
    let mut buf = BytesMut::new();
    let mut units_held = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Refused::Read)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > limits.max_bytes {
            return Err(Refused::TooLarge);
        }
        let units = (buf.len() + data.len()).div_ceil(UNIT);
        if units > units_held {
            let more = u32::try_from(units - units_held).map_err(|_| Refused::TooLarge)?;
            let permit = limits
                .budget
                .clone()
                .try_acquire_many_owned(more)
                .map_err(|_| Refused::Budget)?;
            held.push(permit);
            units_held = units;
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

pub async fn body_layer<F, Fut>(limits: &BodyLimits, req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(BodyLimit(limits.max_bytes));
    if http_body::Body::is_end_stream(&body) {
        return next(Request::from_parts(parts, body)).await;
    }
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > limits.max_bytes as u64) {
        let refused = super::status_response(&too_large(limits.max_bytes));
        return if n <= limits.max_bytes as u64 + DISCARD_BYTES && discard(body).await {
            refused
        } else {
            close_after(refused)
        };
    }
    // The budget is held until the request is answered: the handler works
    // on these bytes (and copies of them) until then.
    let mut held = Vec::new();
    let mut body = body;
    let step = crate::traces::Span::child("read request body");
    let read = read(limits, &mut body, &mut held).await;
    drop(step);
    match read {
        Ok(bytes) => {
            let resp = next(Request::from_parts(parts, Body::from(bytes))).await;
            drop(held);
            resp
        }
        Err(Refused::TooLarge) => {
            drop(held);
            let refused = super::status_response(&too_large(limits.max_bytes));
            if discard(http_body_util::Limited::new(body, DISCARD_BYTES as usize)).await {
                refused
            } else {
                close_after(refused)
            }
        }
        Err(Refused::Budget) => {
            // Read the rest without keeping it (it is within the body limit
            // and the deadline bounds the wait), so a client still sending
            // reads the 429 instead of a broken pipe.
            drop(held);
            if discard(http_body_util::Limited::new(body, limits.max_bytes)).await {
                budget_exhausted()
            } else {
                close_after(budget_exhausted())
            }
        }
        Err(Refused::Read(e)) => {
            tracing::debug!(error = %e, "reading the request body failed");
            close_after(super::status_response(&ApiError::bad_request(format!(
                "error reading the request body: {e}"
            ))))
        }
    }
}

/// Reads `body` to its end, keeping nothing; false if it fails (or passes a
/// limit wrapped around it).
async fn discard<B>(mut body: B) -> bool
where
    B: http_body::Body + Unpin,
{
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return false;
        }
    }
    true
}

/// The rest of an unread body is not worth reading: HTTP/1.1 closes the
/// connection after this answer instead of draining it.
fn close_after(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(n: usize, size: usize) -> Body {
        let parts: Vec<Result<Bytes, std::io::Error>> =
            (0..n).map(|_| Ok(Bytes::from(vec![b'x'; size]))).collect();
        Body::from_stream(futures::stream::iter(parts))
    }

    /// The handlers and forwarding read the body within the limit this layer
    /// left in the extensions, and refuse beyond it as the layer does.
    #[tokio::test]
    async fn later_readers_hold_the_body_to_the_layers_limit() {
        let mut ext = http::Extensions::new();
        ext.insert(BodyLimit(5 * 1024));
        let read = read_within(chunks(4, 1024), &ext).await.expect("within");
        assert_eq!(read.len(), 4 * 1024);
        let e = read_within(chunks(6, 1024), &ext).await.expect_err("over");
        assert_eq!(
            (e.code, e.message.as_str()),
            (413, too_large(5 * 1024).message.as_str())
        );
        // No layer ran (a request built in-process): kube's default.
        let none = http::Extensions::new();
        assert!(read_within(chunks(3, 1024 * 1024), &none).await.is_ok());
        assert!(read_within(chunks(4, 1024 * 1024), &none).await.is_err());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_and_gives_its_budget_back() {
        let limits = BodyLimits::new(10 * 1024, 1024 * 1024);
        let mut held = Vec::new();
        let r = read(&limits, &mut chunks(11, 1024), &mut held).await;
        assert!(matches!(r, Err(Refused::TooLarge)));
        drop(held);
        assert_eq!(limits.available_bytes(), 1024 * 1024);
    }

    #[tokio::test]
    async fn bodies_share_one_budget() {
        let limits = BodyLimits::new(DEFAULT_MAX_BYTES as u64, 64 * 1024);
        let mut first = Vec::new();
        let ok = read(&limits, &mut chunks(40, 1024), &mut first).await;
        assert_eq!(ok.ok().map(|b| b.len()), Some(40 * 1024));
        assert_eq!(limits.available_bytes(), 24 * 1024);
        let mut second = Vec::new();
        let r = read(&limits, &mut chunks(30, 1024), &mut second).await;
        assert!(matches!(r, Err(Refused::Budget)));
        drop(second);
        drop(first);
        assert_eq!(limits.available_bytes(), 64 * 1024);
    }
}
