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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::format::{self, FormatError, Item};
    use crate::storage::{embedded::Embedded, Write};

    /// A store of eight objects of about a MiB each: more frames than the
    /// queue between the reader and the response holds.
    async fn big_store(dir: &std::path::Path) -> Arc<Store> {
        let store =
            Store::open(Arc::new(Embedded::open(&dir.join("db")).expect("open"))).expect("store");
        for i in 0..8 {
            let object = serde_json::json!({
                "metadata": {"name": format!("o{i}")},
                "pad": "x".repeat(1024 * 1024),
            });
            store
                .write(Write::Create {
                    key: format!("g/r/ns/o{i}"),
                    object,
                })
                .await
                .expect("write");
        }
        store
    }

    fn get() -> Request {
        http::Request::get(crate::api::request::SNAPSHOT_PATH)
            .body(Body::empty())
            .expect("request")
    }

    /// The objects of a snapshot body, or why it is refused.
    async fn decode(resp: Response) -> Result<usize, FormatError> {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        let mut objects = 0;
        let read = format::read_all(&bytes[..], |_, item| {
            if let Item::Objects(o) = item {
                objects += o.len();
            }
            Ok(())
        });
        match read {
            Ok(_) => Ok(objects),
            Err(crate::snapshot::SnapshotError::Format(e)) => Err(e),
            Err(e) => panic!("{e}"),
        }
    }

    /// While one client's snapshot is under way (its reader waits for it),
    /// another gets 429; once it is read, or its client goes away, the next
    /// one starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_snapshot_at_a_time_until_it_is_read_or_abandoned() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = Snapshots::new(big_store(dir.path()).await, CancellationToken::new());
        let first = handle(State(s.clone()), get()).await;
        assert_eq!(first.status(), 200);
        let busy = handle(State(s.clone()), get()).await;
        assert_eq!(busy.status(), 429);
        assert_eq!(decode(first).await.expect("whole"), 8);

        // The reader frees its turn once it has sent the end.
        let mut next = None;
        for _ in 0..100 {
            let r = handle(State(s.clone()), get()).await;
            if r.status() == 200 {
                next = Some(r);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Its client goes away without reading: the reader stops.
        drop(next.expect("a second snapshot after the first"));
        let mut freed = false;
        for _ in 0..100 {
            if handle(State(s.clone()), get()).await.status() == 200 {
                freed = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(freed, "an abandoned snapshot kept its turn");
    }

    /// At shutdown a snapshot under way ends with the reason, never a
    /// trailer: the client refuses it as a failed snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_ends_a_snapshot_with_its_reason() {
        let dir = tempfile::tempdir().expect("tmp");
        let stop = CancellationToken::new();
        let s = Snapshots::new(big_store(dir.path()).await, stop.clone());
        let resp = handle(State(s), get()).await;
        stop.cancel();
        match decode(resp).await {
            Err(FormatError::ServerFailed(why)) => assert!(why.contains("shutting down"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
