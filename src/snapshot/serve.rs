//! `GET /kshard/snapshot`: the server's side of `kshard snapshot save`. The
//! request layers have authenticated and authorized it (non-resource path,
//! verb `get`; long-running, so no request deadline and no flow-control
//! seat); here a blocking thread reads the store in one view and streams it.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_util::sync::CancellationToken;

use super::format::Encoder;
use super::save::Source;
use crate::api::response::{error_response, NoCompression};
use crate::status::ApiError;
use crate::storage::Store;

/// The snapshot's media type.
pub const CONTENT_TYPE: &str = "application/vnd.kshard.snapshot";
/// Chunks (about `format::CHUNK_BYTES` each) queued for a slow client at most.
const QUEUE_CHUNKS: usize = 4;

/// What the endpoint needs.
pub struct Snapshots {
    store: Arc<Store>,
    /// One snapshot at a time per server: each holds a read view open and a
    /// thread busy for as long as its client reads.
    one_at_a_time: Arc<Semaphore>,
    /// Cancelled at shutdown: a snapshot under way ends with an error frame.
    stop: CancellationToken,
}

impl Snapshots {
    pub fn new(store: Arc<Store>, stop: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            store,
            one_at_a_time: Arc::new(Semaphore::new(1)),
            stop,
        })
    }
}

pub async fn handle(State(s): State<Arc<Snapshots>>, req: Request) -> Response {
    if req.method() != http::Method::GET {
        return error_response(&ApiError::method_not_allowed());
    }
    let Ok(permit) = s.one_at_a_time.clone().try_acquire_owned() else {
        return error_response(&ApiError::too_many_requests(
            "a snapshot is being taken already; try again once it is done",
        ));
    };
    let user = crate::server::layers::acting_user(&req).user;
    let engine = s.store.engine().clone();
    let stop = s.stop.clone();
    let (opened_tx, opened_rx) = oneshot::channel();
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(QUEUE_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let started = Instant::now();
        let mut source = match Source::open(&*engine) {
            Ok(s) => s,
            Err(e) => {
                let _ = opened_tx.send(Err(e));
                return;
            }
        };
        let header = source.header(&*engine);
        let revision = header.revision;
        let mut enc = Encoder::new();
        if opened_tx.send(Ok(enc.start(&header))).is_err() {
            return;
        }
        tracing::info!(%user, revision, "snapshot started");
        let failure = loop {
            if stop.is_cancelled() {
                break Some("the server is shutting down".to_string());
            }
            match source.next_chunk() {
                Ok(Some(chunk)) => {
                    // Waits while the client is behind: the queue is the bound.
                    if tx.blocking_send(Ok(enc.objects(&chunk))).is_err() {
                        tracing::info!(%user, revision, "snapshot abandoned by its client");
                        return;
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(e.to_string()),
            }
        };
        let (objects, bytes) = enc.objects_so_far();
        match failure {
            None => {
                let (end, trailer) = enc.finish();
                let _ = tx.blocking_send(Ok(end));
                tracing::info!(
                    %user, revision, objects, bytes,
                    sha256 = %trailer.sha256,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "snapshot taken"
                );
            }
            Some(why) => {
                tracing::error!(%user, revision, objects, error = %why, "snapshot failed");
                let _ = tx.blocking_send(Ok(Encoder::error(&why)));
            }
        }
    });
    let first = match opened_rx.await {
        Ok(Ok(first)) => first,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "snapshot: the store could not be read");
            return error_response(&crate::registry::storage_error(e));
        }
        Err(_) => return error_response(&ApiError::internal("the snapshot reader stopped")),
    };
    let rest = tokio_stream::wrappers::ReceiverStream::new(rx);
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(rest);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(CONTENT_TYPE),
    );
    resp.extensions_mut().insert(NoCompression);
    resp
}
