//! The webhook backend: events are buffered and posted in batches as an
//! `audit.k8s.io/v1` EventList to the server a kubeconfig names, as
//! kube-apiserver's `--audit-webhook-*` batch mode does: a batch goes out when
//! it is full or its first event has waited long enough, sends are throttled
//! (qps and burst), a failed send is retried with backoff, and events that
//! find the buffer full are dropped (counted and logged) rather than slowing
//! requests down.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tokio::sync::mpsc;

use super::event::{Event, EventList};
use super::Sink;
use crate::backoff::Backoff;

#[derive(Debug, Clone)]
pub struct Batching {
    pub buffer_size: usize,
    pub max_batch_size: usize,
    pub max_wait: Duration,
    pub throttle_qps: f64,
    pub throttle_burst: u32,
    pub initial_backoff: Duration,
}

/// Sends at most 5 times, waiting `initial_backoff × 1.5ⁿ` between tries
/// (k8s.io/apiserver's webhook retry backoff).
const SEND_ATTEMPTS: u32 = 5;

pub struct WebhookSink {
    queue: mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("audit webhook kubeconfig {path}: {reason}")]
    Config { path: String, reason: String },
}

impl WebhookSink {
    /// Reads the kubeconfig and starts the batching task.
    pub async fn start(
        kubeconfig: &std::path::Path,
        batching: Batching,
    ) -> Result<Self, WebhookError> {
        let err = |reason: String| WebhookError::Config {
            path: kubeconfig.display().to_string(),
            reason,
        };
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| err(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| err(e.to_string()))?;
        let connector = config
            .rustls_https_connector()
            .map_err(|e| err(e.to_string()))?;
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        let url = config.cluster_url.clone();
        let token = config.auth_info.token.as_ref().map(secrecy_expose);
        let (queue, mut rx) = mpsc::channel::<Event>(batching.buffer_size.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(async move {
            let mut tokens = f64::from(batching.throttle_burst.max(1));
            let mut last_refill = tokio::time::Instant::now();
            loop {
                let Some(first) = rx.recv().await else {
                    return;
                };
                let mut batch = vec![first];
                let deadline = tokio::time::Instant::now() + batching.max_wait;
                while batch.len() < batching.max_batch_size.max(1) {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(e)) => batch.push(e),
                        Ok(None) | Err(_) => break,
                    }
                }
                // Token bucket: qps refill, burst capacity.
                if batching.throttle_qps > 0.0 {
                    let now = tokio::time::Instant::now();
                    tokens = (tokens
                        + now.duration_since(last_refill).as_secs_f64() * batching.throttle_qps)
                        .min(f64::from(batching.throttle_burst.max(1)));
                    last_refill = now;
                    if tokens < 1.0 {
                        let wait = (1.0 - tokens) / batching.throttle_qps;
                        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                        tokens = 1.0;
                        last_refill = tokio::time::Instant::now();
                    }
                    tokens -= 1.0;
                }
                send_with_retries(
                    &client,
                    &url,
                    token.as_deref(),
                    &batch,
                    batching.initial_backoff,
                )
                .await;
            }
        });
        Ok(WebhookSink { queue, dropped })
    }

    /// Events lost because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn secrecy_expose(t: &secrecy::SecretString) -> String {
    use secrecy::ExposeSecret;
    t.expose_secret().to_string()
}

async fn send_with_retries<C>(
    client: &Client<C, Full<bytes::Bytes>>,
    url: &http::Uri,
    token: Option<&str>,
    batch: &[Event],
    initial_backoff: Duration,
) where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let body = match serde_json::to_vec(&EventList::new(batch)) {
        Ok(b) => bytes::Bytes::from(b),
        Err(e) => {
            tracing::error!(error = %e, "encoding audit events");
            return;
        }
    };
    // k8s.io/apiserver's webhook retry backoff: ×1.5 a try, uncapped.
    let mut backoff = Backoff::new(initial_backoff, Duration::MAX).growth(3, 2);
    for attempt in 1..=SEND_ATTEMPTS {
        let mut req = http::Request::post(url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = match req.body(Full::new(body.clone())) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "building the audit webhook request");
                return;
            }
        };
        let outcome = match tokio::time::timeout(Duration::from_secs(30), client.request(req)).await
        {
            Ok(Ok(resp)) if resp.status().is_success() => {
                // Drain, so the connection is reused.
                let _ = resp.into_body().collect().await;
                return;
            }
            Ok(Ok(resp)) => format!("status {}", resp.status()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        tracing::warn!(attempt, events = batch.len(), error = %outcome, "audit webhook send failed");
        if attempt < SEND_ATTEMPTS {
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    tracing::error!(
        events = batch.len(),
        "audit events lost: the webhook did not accept them"
    );
}

impl Sink for WebhookSink {
    fn process(&self, event: &Event) {
        if self.queue.try_send(event.clone()).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // At most one line per thousand drops.
            if n % 1000 == 1 {
                tracing::error!(dropped = n, "audit buffer full: events dropped");
            }
        }
    }
}
