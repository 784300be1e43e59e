//! Connection policy: what a client must do, and by when, before it costs
//! the server anything more than a socket. Values follow kube-apiserver's
//! secure serving (Go's net/http underneath): a TLS handshake within 10 s,
//! request headers within 32 s (also the idle limit between keep-alive
//! requests), headers of at most 1 MiB, 1,000 concurrent HTTP/2 streams, and
//! hyper's guards against rapid-reset and CONTINUATION floods. A cap on open
//! connections stops accepting (the kernel's backlog holds the rest) instead
//! of running out of descriptors, and accept errors back off from 5 ms to 1 s
//! with at most one log line a second.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::units::{parse_bytes, parse_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionLimits {
    /// Longest a client may take to complete the TLS handshake.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,
    /// Longest a client may take to send a request's headers; also how long an
    /// idle keep-alive connection is kept.
    #[arg(long, default_value = "32s", value_parser = parse_duration)]
    pub request_header_timeout: Duration,
    /// Largest request header block (HTTP/1.1 and HTTP/2); larger is refused.
    #[arg(long, default_value = "1Mi", value_parser = parse_bytes)]
    pub max_request_header_bytes: u64,
    /// Concurrent streams one HTTP/2 connection may open.
    #[arg(long, default_value_t = 1000)]
    pub http2_max_streams_per_connection: u32,
    /// Open client connections at most; beyond it new ones wait in the
    /// kernel's accept queue until one closes.
    #[arg(long, default_value_t = 10_000)]
    pub max_connections: usize,
    /// Deadline of a request that is not a watch, from its arrival to the last
    /// byte of its response (a `?timeout=` shorter than it wins): 504 if the
    /// handler is not done by then, and its flow-control seats are returned
    /// then even if a slow client is still reading.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// A watch without `timeoutSeconds` ends after a random time between this
    /// and twice this (kube's `--min-request-timeout`), so clients reconnect
    /// spread out instead of all at once.
    #[arg(long, default_value = "1800s", value_parser = parse_duration)]
    pub min_request_timeout: Duration,
    /// Largest request body (kube's 3 MiB): 413 beyond it, before it is read.
    #[arg(long, default_value = "3Mi", value_parser = parse_bytes)]
    pub max_request_body_bytes: u64,
    /// Memory all request bodies being received at once may take; a request
    /// that would exceed it gets 429 at once. Bodies are read before a request
    /// takes a flow-control seat, so a stalled upload holds memory from this
    /// budget, not a seat.
    #[arg(long, default_value = "512Mi", value_parser = parse_bytes)]
    pub max_buffered_request_body_bytes: u64,
    /// On SIGTERM/SIGINT, how long `/readyz` fails before the server stops
    /// accepting connections (time for load balancers to notice).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay_duration: Duration,
    /// Then how long in-flight requests get to finish; connections still open
    /// after it are closed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,
}

/// Lets a layer close the connection its request came on (a response that
/// could not be sent by its deadline), in the request's extensions.
#[derive(Clone, Debug, Default)]
pub struct ConnectionControl(Arc<Notify>);

impl ConnectionControl {
    /// Closes the connection: every stream on it ends at once.
    pub fn close(&self) {
        self.0.notify_one();
    }

    async fn closed(&self) {
        self.0.notified().await;
    }
}

/// The server's connections, for a graceful shutdown: `stop` ends the accept
/// loops and asks every connection to finish what it has in flight (HTTP/1.1
/// closes after the current response, HTTP/2 sends GOAWAY); `tasks` tells
/// when they are all gone.
#[derive(Clone, Debug, Default)]
pub struct Connections {
    pub stop: CancellationToken,
    pub tasks: TaskTracker,
}

/// Accepts connections while under the cap, backing off on accept errors
/// (out of descriptors), and hands each to `serve` with its permit, which
/// frees the slot when the connection is dropped. Ends when `conns.stop` is
/// cancelled.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limits: &ConnectionLimits,
    conns: Connections,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
    let mut last_log: Option<Instant> = None;
    let mut suppressed = 0u64;
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = conns.stop.cancelled() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = conns.stop.cancelled() => return,
        };
        match accepted {
            Ok((tcp, peer)) => {
                backoff.reset();
                let _ = tcp.set_nodelay(true);
                conns.tasks.spawn(serve(tcp, peer, permit));
            }
            Err(e) => {
                drop(permit);
                let wait = backoff.next_delay();
                if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(error = %e, suppressed, retry_in = ?wait, "accept failed");
                    last_log = Some(Instant::now());
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 on one connection with the limits applied,
/// until the client is done, a layer closes it ([`ConnectionControl`]), or
/// a graceful shutdown (`stop`) lets its in-flight requests finish.
///
/// Every request carries the peer's address (`ConnectInfo`), its client
/// certificates when the connection is TLS, and the [`ConnectionControl`].
/// They are inserted here rather than by `Extension` layers on a
/// per-connection router, which would box and clone services per request.
pub async fn serve_connection<I>(
    io: I,
    app: axum::Router,
    peer: SocketAddr,
    certs: Option<crate::auth::PeerCertificates>,
    limits: &ConnectionLimits,
    stop: &CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let control = ConnectionControl::default();
    let drain_limits = (
        limits
            .max_request_body_bytes
            .saturating_add(DRAIN_BEYOND_LIMIT),
        limits.request_timeout,
    );
    let on_request = control.clone();
    let service = TowerToHyperService::new(tower::service_fn(
        move |mut req: http::Request<hyper::body::Incoming>| {
            let ext = req.extensions_mut();
            ext.insert(axum::extract::ConnectInfo(peer));
            if let Some(certs) = &certs {
                ext.insert(certs.clone());
            }
            ext.insert(on_request.clone());
            if req.version() != http::Version::HTTP_2 {
                return futures::future::Either::Left(tower::Service::call(&mut app.clone(), req));
            }
            let (req, unread) = keep_unread(req);
            let answer = tower::Service::call(&mut app.clone(), req);
            let drain = drain_limits;
            futures::future::Either::Right(Box::pin(async move {
                let resp = answer.await;
                let body = unread.lock().map(|mut b| b.take()).unwrap_or(None);
                if let Some(body) = body {
                    drain_unread(body, drain).await;
                }
                resp
            }))
        },
    ));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let header_bytes = usize::try_from(limits.max_request_header_bytes).unwrap_or(usize::MAX);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_header_timeout)
        // hyper's read buffer bounds the header block (at least 8 KiB).
        .max_buf_size(header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_streams_per_connection)
        .max_header_list_size(u32::try_from(header_bytes).unwrap_or(u32::MAX))
        // Rapid reset (CVE-2023-44487): streams a client opens and cancels at once.
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(1024)
        // A peer that stops answering pings is gone.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // Dropping the connection closes the socket and every stream on it.
            _ = control.closed() => return,
            _ = stop.cancelled(), if !draining => {
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}

/// How much more than the body limit an HTTP/2 request body refused unread
/// is read and thrown away (as the body layer does for a 413).
const DRAIN_BEYOND_LIMIT: u64 = 16 * 1024 * 1024;

type Unread = std::sync::Arc<std::sync::Mutex<Option<hyper::body::Incoming>>>;

/// An HTTP/2 request body that, dropped before its end (a refusal answered
/// before reading it: 401, 403, 429...), is kept for [`drain_unread`].
struct KeptBody {
    inner: Option<hyper::body::Incoming>,
    unread: Unread,
}

fn keep_unread(req: http::Request<hyper::body::Incoming>) -> (http::Request<KeptBody>, Unread) {
    let unread = Unread::default();
    let kept = unread.clone();
    (
        req.map(|b| KeptBody {
            inner: Some(b),
            unread: kept,
        }),
        unread,
    )
}

impl http_body::Body for KeptBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.inner.as_mut() {
            Some(b) => std::pin::Pin::new(b).poll_frame(cx),
            None => std::task::Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.as_ref().map_or_else(
            || http_body::SizeHint::with_exact(0),
            http_body::Body::size_hint,
        )
    }
}

impl Drop for KeptBody {
    fn drop(&mut self) {
        if let Some(b) = self.inner.take() {
            if !http_body::Body::is_end_stream(&b) {
                if let Ok(mut slot) = self.unread.lock() {
                    *slot = Some(b);
                }
            }
        }
    }
}

/// Reads what is left of a refused HTTP/2 request body, keeping nothing,
/// before its answer goes out: the stream then ends normally. Answering
/// first would end it with RST_STREAM(NO_ERROR) (RFC 9113 8.1), which
/// clients still uploading (curl, among others) report as a stream error
/// instead of the answer. Bounded by `limit` bytes and `within`; past either
/// the answer goes out anyway.
async fn drain_unread(mut body: hyper::body::Incoming, (limit, within): (u64, Duration)) {
    use http_body_util::BodyExt;
    let read = async {
        let mut seen = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                seen += data.len() as u64;
                if seen > limit {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
}
