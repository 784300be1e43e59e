//! Several replicas of one shard on a shared store (TiKV): one leader, elected
//! through a lease in the store, assigns revisions; followers forward writes
//! to it, follow its ordered event stream (backfilling from the event log
//! after any gap) and serve reads and watches from their own caches.
//!
//! - `lease`: the lease record, election rounds and the epoch fence checked
//!   inside every write transaction of the leader.
//! - `stream`: the leader's event stream and its wire format.
//! - `forward`: writes from followers to the leader, identities in headers.
//! - `internal`: the internal endpoint (plain HTTP/2, shared-secret bearer).

pub mod forward;
pub mod internal;
pub mod lease;
pub mod stream;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::watch;

use crate::auth::Identity;
use crate::storage::{Engine, StorageError, Store};
use lease::{EpochFence, Lease, Outcome};

/// The shared secret replicas present to each other, created by the first one.
const SECRET_KEY: &[u8] = b"m/replica-secret";
/// How long a forwarded write waits for a leader to appear or answer.
const FORWARD_PATIENCE: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// Unique among the replicas of a shard.
    pub replica_id: String,
    /// `host:port` where peers reach this replica's internal endpoint.
    pub advertise_address: String,
    /// How long a lease lasts unless renewed; renewed every fifth of it.
    pub lease_duration: Duration,
}

/// The default replica id: the host name (a pod's name) and the process id.
pub fn default_replica_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    format!("{host}-{}", std::process::id())
}

/// What this replica knows about leadership right now.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The current lease (this replica's own when leading).
    pub lease: Option<Lease>,
    pub leading: bool,
}

pub struct Replica {
    cfg: ReplicaConfig,
    engine: Arc<dyn Engine>,
    fence: Arc<EpochFence>,
    secret: String,
    view: watch::Sender<View>,
    store: Arc<Store>,
    client: forward::Client,
    /// Follower: connected to the leader's stream, and its last watermark.
    streaming: AtomicBool,
    leader_watermark: AtomicU64,
    /// Asks for an election round now: the leader's stream ended, and a
    /// leader that shut down has given its lease up.
    elect_now: tokio::sync::Notify,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
}

/// Where a write goes.
pub enum Routed {
    /// Handled by the leader; this is its response.
    Remote(Response),
    /// This replica leads (now): handle it here.
    Local(Request),
}

impl Replica {
    /// The fence a replica's store checks in every write transaction: open
    /// the store with it, then hand both to [`Replica::new`].
    pub fn fence_for(cfg: &ReplicaConfig) -> Arc<EpochFence> {
        Arc::new(EpochFence::new(&cfg.replica_id))
    }

    /// A replica on `engine` whose store was opened with `fence` (loading or
    /// creating the shared secret); then [`Replica::start`].
    pub async fn new(
        cfg: ReplicaConfig,
        engine: Arc<dyn Engine>,
        fence: Arc<EpochFence>,
        store: Arc<Store>,
    ) -> Result<Arc<Self>, ReplicaError> {
        let e = engine.clone();
        let secret = tokio::task::spawn_blocking(move || {
            // Replicas starting together race to create it: the loser reads it.
            let mut attempt = 0;
            loop {
                match load_or_create_secret(&*e) {
                    Err(StorageError::Conflict { .. }) if attempt < 5 => attempt += 1,
                    other => return other,
                }
            }
        })
        .await
        .map_err(|e| StorageError::Engine(e.to_string()))??;
        Ok(Arc::new(Self {
            fence,
            cfg,
            engine,
            secret,
            view: watch::channel(View::default()).0,
            store,
            client: forward::client(),
            streaming: AtomicBool::new(false),
            leader_watermark: AtomicU64::new(0),
            elect_now: tokio::sync::Notify::new(),
        }))
    }

    pub fn id(&self) -> &str {
        &self.cfg.replica_id
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }

    pub fn is_leader(&self) -> bool {
        self.view.borrow().leading && self.fence.epoch() != 0
    }

    pub fn view(&self) -> View {
        self.view.borrow().clone()
    }

    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Readiness: the leader is ready; a follower once it follows the
    /// leader's stream and has published up to the leader's last watermark.
    pub fn caught_up(&self) -> bool {
        if self.is_leader() {
            return true;
        }
        self.streaming.load(Ordering::Acquire)
            && self.store.revision() >= self.leader_watermark.load(Ordering::Acquire)
    }

    /// Shutdown (after the election loop has stopped): stops writing and
    /// gives the lease up at once, so a peer need not wait for it to expire.
    pub async fn resign(&self) {
        let epoch = self.fence.epoch();
        if epoch == 0 {
            return;
        }
        self.fence.set_epoch(0);
        let engine = self.engine.clone();
        let me = self.cfg.replica_id.clone();
        match tokio::task::spawn_blocking(move || lease::resign(&*engine, &me, epoch)).await {
            Ok(Ok(true)) => tracing::info!(epoch, "gave up the leader lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "giving up the leader lease failed"),
            Err(e) => tracing::warn!(error = %e, "giving up the leader lease failed"),
        }
    }

    /// Runs the first election round (so the role is known before serving),
    /// then keeps electing and, while a follower, following the leader.
    pub async fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut renewed = None;
        self.election_round(&mut renewed).await;
        let me = self.clone();
        let elect = tokio::spawn(async move {
            loop {
                let pause = if me.view.borrow().lease.is_some() {
                    me.cfg.lease_duration / 5
                } else {
                    me.cfg.lease_duration / 10
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = me.elect_now.notified() => {}
                }
                me.election_round(&mut renewed).await;
            }
        });
        let me = self.clone();
        let follow = tokio::spawn(async move { me.follow_loop().await });
        vec![elect, follow]
    }

    async fn election_round(self: &Arc<Self>, renewed: &mut Option<Instant>) {
        let store = self.store.clone();
        let engine = self.engine.clone();
        let (id, address, ttl) = (
            self.cfg.replica_id.clone(),
            self.cfg.advertise_address.clone(),
            self.cfg.lease_duration,
        );
        let current = self.fence.epoch();
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            lease::elect(&*engine, &id, &address, ttl, current)
        })
        .await
        .map_err(|e| StorageError::Engine(e.to_string()))
        .and_then(|r| r);
        match outcome {
            Ok(Outcome::Leader {
                epoch,
                took_over,
                revision,
            }) => {
                if took_over {
                    tracing::info!(
                        replica = %self.cfg.replica_id,
                        epoch,
                        revision,
                        "took over the leader lease"
                    );
                    self.fence.set_epoch(0);
                    // Publish everything committed before, so the caches are
                    // current before this replica assigns the next revision.
                    if let Err(e) = store.follow(Vec::new(), revision).await {
                        tracing::error!(error = %e, "catching up after takeover failed");
                        return;
                    }
                    // From here this replica's store sequences (the fence says so).
                    self.fence.set_epoch(epoch);
                }
                // Count the lease from when the round started, to be safe.
                *renewed = Some(started);
                let lease = Lease {
                    holder: self.cfg.replica_id.clone(),
                    address: self.cfg.advertise_address.clone(),
                    epoch,
                    expires_ms: 0,
                };
                self.view.send_if_modified(|v| {
                    let changed = !v.leading || v.lease.as_ref().map(|l| l.epoch) != Some(epoch);
                    v.leading = true;
                    v.lease = Some(lease);
                    changed
                });
            }
            Ok(Outcome::Follower(l)) => {
                if self.fence.epoch() != 0 {
                    tracing::warn!(holder = %l.holder, epoch = l.epoch, "lost the leader lease");
                }
                self.step_down();
                self.view.send_if_modified(|v| {
                    let changed = v.leading
                        || v.lease.as_ref().map(|x| (&x.holder, x.epoch, &x.address))
                            != Some((&l.holder, l.epoch, &l.address));
                    v.leading = false;
                    v.lease = Some(l);
                    changed
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "election round failed");
                // Unable to renew for a whole lease: another replica may lead by now.
                if self.fence.epoch() != 0
                    && renewed.is_none_or(|t| t.elapsed() >= self.cfg.lease_duration)
                {
                    tracing::warn!("lease not renewed in time; stepping down");
                    self.step_down();
                    self.view.send_replace(View::default());
                }
            }
        }
    }

    /// Back to following: the fence makes the store a follower's and refuses
    /// every write transaction of this replica.
    fn step_down(&self) {
        self.fence.set_epoch(0);
    }

    /// While a follower: stream from the leader, and after the stream breaks
    /// backfill from the log, then connect again.
    async fn follow_loop(self: Arc<Self>) {
        let mut changes = self.view.subscribe();
        loop {
            let view = changes.borrow_and_update().clone();
            let leader = view.lease.filter(|_| !view.leading);
            let Some(leader) = leader else {
                self.streaming.store(false, Ordering::Release);
                let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
                continue;
            };
            let (ended, view_changed) = tokio::select! {
                r = self.stream_from(&leader.address) => (r, false),
                _ = changes.changed() => (Ok(()), true),
            };
            self.streaming.store(false, Ordering::Release);
            if let Err(e) = ended {
                tracing::debug!(leader = %leader.address, error = %e, "leader stream ended");
            }
            if !view_changed {
                // The leader may be gone; one that shut down gave its lease
                // up, so a round now takes over without waiting for expiry.
                // (At most one round per reconnect attempt, 100 ms apart.)
                self.elect_now.notify_one();
            }
            self.backfill().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes everything the store holds that this replica has not (a gap
    /// or a lost stream): the log is the source of truth.
    async fn backfill(&self) {
        let store = &self.store;
        let stored = match store.stored_revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the revision counter failed");
                return;
            }
        };
        if let Err(e) = store.follow(Vec::new(), stored).await {
            tracing::warn!(error = %e, "backfilling from the event log failed");
        }
    }

    async fn stream_from(&self, address: &str) -> Result<(), String> {
        let store = self.store.clone();
        let req = http::Request::get(format!(
            "http://{address}{}?from={}",
            internal::EVENTS_PATH,
            store.revision()
        ))
        .header(
            http::header::AUTHORIZATION,
            format!("Bearer {}", self.secret),
        )
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(stream::SILENCE, self.client.request(req))
            .await
            .map_err(|_| "connecting timed out".to_string())?
            .map_err(|e| e.to_string())?;
        if resp.status() != StatusCode::OK {
            return Err(format!("leader answered {}", resp.status()));
        }
        let mut body = resp.into_body();
        let mut decoder = stream::Decoder::default();
        let mut pending = Vec::new();
        loop {
            let frame = tokio::time::timeout(stream::SILENCE, body.frame())
                .await
                .map_err(|_| "leader went silent".to_string())?;
            let Some(frame) = frame else {
                return Ok(());
            };
            let frame = frame.map_err(|e| e.to_string())?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            decoder.push(&data);
            while let Some(f) = decoder.next_frame().map_err(|e| e.to_string())? {
                match f {
                    stream::Frame::Event(e) => pending.push(e),
                    stream::Frame::Watermark {
                        revision,
                        compacted,
                    } => {
                        store.observe_compaction(compacted);
                        store
                            .follow(std::mem::take(&mut pending), revision)
                            .await
                            .map_err(|e| e.to_string())?;
                        self.leader_watermark.fetch_max(revision, Ordering::AcqRel);
                        self.streaming.store(true, Ordering::Release);
                    }
                }
            }
        }
    }

    /// A write arriving here: sent to the leader unless this replica leads.
    /// Waits (bounded) for a leader; retries only when the leader did not
    /// take the request (no connection, or it no longer leads).
    pub async fn route(&self, req: Request, identity: &Identity) -> Routed {
        if self.is_leader() {
            return Routed::Local(req);
        }
        let buffered = match forward::buffer(req).await {
            Ok(b) => b,
            Err(resp) => return Routed::Remote(resp),
        };
        let deadline = Instant::now() + FORWARD_PATIENCE;
        let mut changes = self.view.subscribe();
        loop {
            if self.is_leader() {
                return Routed::Local(buffered.into_request());
            }
            let target = changes
                .borrow_and_update()
                .lease
                .clone()
                .filter(|l| l.holder != self.cfg.replica_id);
            if let Some(leader) = target {
                let out = match buffered.to_leader(&leader.address, &self.secret, identity) {
                    Ok(r) => r,
                    Err(e) => {
                        return Routed::Remote(forward::unavailable(&format!(
                            "cannot forward the request: {e}"
                        )))
                    }
                };
                match self.client.request(out).await {
                    Ok(resp) if resp.headers().contains_key(forward::NOT_LEADER) => {
                        tracing::debug!(leader = %leader.address, "forward target no longer leads");
                    }
                    Ok(resp) => return Routed::Remote(forward::relay(resp)),
                    // Not connected: the leader never saw the request, so it may go again.
                    Err(e) if e.is_connect() => {
                        tracing::debug!(leader = %leader.address, error = %e, "leader unreachable");
                    }
                    Err(e) => {
                        // The leader may or may not have carried it out: say so, do not repeat it.
                        tracing::warn!(leader = %leader.address, error = %e, "forwarded write failed");
                        return Routed::Remote(forward::unavailable(&format!(
                            "the leader replica did not answer: {e}"
                        )));
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Routed::Remote(forward::unavailable(
                    "no leader replica is available for writes",
                ));
            }
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(200)), changes.changed()).await;
        }
    }
}

fn load_or_create_secret(engine: &dyn Engine) -> Result<String, StorageError> {
    let mut secret = None;
    engine.write(&mut |txn| {
        if let Some(v) = txn.get(SECRET_KEY)? {
            secret = Some(String::from_utf8_lossy(&v).into_owned());
            return Ok(());
        }
        let fresh = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        txn.put(SECRET_KEY, fresh.as_bytes())?;
        secret = Some(fresh);
        Ok(())
    })?;
    secret.ok_or_else(|| StorageError::Engine("secret transaction did not run".into()))
}

/// The verbs a follower forwards.
pub fn is_write(verb: Option<crate::api::request::Verb>) -> bool {
    use crate::api::request::Verb;
    matches!(
        verb,
        Some(Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection)
    )
}
