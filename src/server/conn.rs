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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::config::{parse_bytes, parse_duration};

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
}

/// Accepts connections while under the cap, backing off on accept errors
/// (out of descriptors), and hands each to `serve` with its permit, which
/// frees the slot when the connection is dropped.
pub async fn accept_loop<F, Fut>(listener: TcpListener, limits: &ConnectionLimits, serve: F)
where
    F: Fn(TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = Duration::ZERO;
    let mut last_log: Option<Instant> = None;
    let mut suppressed = 0u64;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((tcp, peer)) => {
                backoff = Duration::ZERO;
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve(tcp, peer, permit));
            }
            Err(e) => {
                drop(permit);
                backoff = if backoff.is_zero() {
                    Duration::from_millis(5)
                } else {
                    (backoff * 2).min(Duration::from_secs(1))
                };
                if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(error = %e, suppressed, retry_in = ?backoff, "accept failed");
                    last_log = Some(Instant::now());
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 on one connection with the limits applied.
pub async fn serve_connection<I>(io: I, app: axum::Router, limits: &ConnectionLimits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
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
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .await
    {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
