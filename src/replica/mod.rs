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
//!
//! One file (about 1,000 lines): the replica's states (leader, follower, fenced) and their
//! transitions read best in one place; the lease, forwarding, the event stream and the
//! internal listener are their own files.

pub mod forward;
pub mod internal;
pub mod lease;
pub mod stream;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::auth::Identity;
use crate::backoff::{Backoff, Jitter};
use crate::storage::{Engine, StorageError, Store};
use lease::{EpochFence, Lease, Observed, Outcome};

/// The shared secret replicas present to each other, created by the first one.
const SECRET_KEY: &[u8] = b"m/replica-secret";
/// A forwarding follower answers this long before the request's deadline,
/// so the client gets its specific answer rather than the deadline layer's.
const ANSWER_MARGIN: Duration = Duration::from_millis(100);
/// How long a transaction a killed writer left half committed blocks its
/// keys unless resolved: tikv-client's lock TTL for small transactions
/// (fixed in tikv-client 0.4). Every write locks the revision counter.
pub const STORE_LOCK_TTL: Duration = Duration::from_secs(3);
/// Retrying the leader's stream (and backfilling) while it is unreachable;
/// jittered so that followers do not hammer a dead address in step.
const FOLLOW_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1)).jitter(Jitter::Equal);
/// Retrying a forward to a leader that refused the connection.
const FORWARD_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(20), Duration::from_millis(250)).jitter(Jitter::Equal);

#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// Unique among the replicas of a shard.
    pub replica_id: String,
    /// `host:port` where peers reach this replica's internal endpoint.
    pub advertise_address: String,
    /// How long a lease lasts unless renewed; renewed every fifth of it.
    pub lease_duration: Duration,
}

impl ReplicaConfig {
    /// The leader renews every fifth of its lease, so four renewals in a row
    /// may fail or stall before it lapses; followers look at the lease as often.
    pub fn renew_interval(&self) -> Duration {
        self.lease_duration / 5
    }

    /// A follower whose leader's stream broke (or that knows no leader)
    /// looks twice as often, at least every 100 ms: the lease is then likely
    /// to lapse or to have been given up, and one round is a small read.
    pub fn suspect_interval(&self) -> Duration {
        (self.lease_duration / 10).min(Duration::from_millis(100))
    }

    /// How long a forwarded write still waits for the old leader's answer
    /// once the lease has moved on. A leader handing over (SIGTERM) answers
    /// its last writes before it gives the lease up, but on a loaded machine
    /// that answer can trail the follower's view of the new lease by more
    /// than one renewal; a whole lease covers it. A lease that lapsed
    /// instead (the leader froze, died or lost the store) was not renewed
    /// for a whole lease, and its holder stopped writing before then: only
    /// an answer already on the wire can still come, so one renewal
    /// interval. Either way an answer that does not come is a 504 (outcome
    /// unknown), never a wrong one.
    pub fn answer_grace(&self, handed_over: bool) -> Duration {
        if handed_over {
            self.lease_duration.max(Duration::from_millis(500))
        } else {
            self.renew_interval().max(Duration::from_millis(100))
        }
    }

    /// How long a forwarded write waits for a reachable leader: a takeover
    /// takes a lease plus a few rounds, plus room for a store slow to
    /// resolve what a dead leader left (at worst TiKV's lock TTL,
    /// [`STORE_LOCK_TTL`]). Past that something else is wrong (the store)
    /// and the client is better told to retry.
    pub fn leader_patience(&self) -> Duration {
        self.lease_duration * 3 + STORE_LOCK_TTL
    }

    /// A follower stays ready while it was current (streamed a watermark or
    /// read the log to the stored revision) this recently.
    pub fn ready_staleness(&self) -> Duration {
        (self.lease_duration * 2).max(Duration::from_secs(5))
    }
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

/// Writes this replica carries out as the leader, counted so that a leader
/// handing over waits for them before giving the lease up.
#[derive(Default)]
struct InFlight {
    n: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One local write in flight (see [`Replica::begin_local_write`]).
pub struct LocalWrite(Arc<Replica>);

impl Drop for LocalWrite {
    fn drop(&mut self) {
        let w = &self.0.writes;
        if w.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            w.idle.notify_waiters();
        }
    }
}

/// The leader this replica last reported (log line, metrics).
#[derive(Default)]
struct Reported {
    holder: Option<String>,
    epoch: u64,
}

pub struct Replica {
    cfg: ReplicaConfig,
    engine: Arc<dyn Engine>,
    fence: Arc<EpochFence>,
    secret: String,
    view: watch::Sender<View>,
    store: Arc<Store>,
    client: forward::Client,
    /// Follower: connected to the leader's stream (it delivered a watermark).
    streaming: AtomicBool,
    /// Asks for an election round now: the leader's stream ended, and a
    /// leader that shut down has given its lease up.
    elect_now: tokio::sync::Notify,
    /// Origin of the millisecond clocks below.
    born: Instant,
    /// Leader: until when (ms since `born`) the lease is surely this
    /// replica's: the start of its last successful renewal plus a lease.
    leading_until: AtomicU64,
    /// When (ms since `born`, plus one; 0 = never) this replica was last
    /// known current: a watermark applied, the log read to the stored
    /// revision, or a renewal as the leader.
    synced_at: AtomicU64,
    /// Held inside every election round's and the resignation's blocking
    /// transaction, so they never overlap; `true` once resigned.
    rounds: Arc<Mutex<bool>>,
    /// The epoch the last round won (0: none), for resigning.
    won: Arc<AtomicU64>,
    /// Shutting down: no new local writes; in-flight ones finish, then the
    /// lease is given up.
    handing_over: AtomicBool,
    writes: InFlight,
    /// The epoch of the last lapsed lease whose holder's locks this replica
    /// resolved before taking over (once per lease).
    abandoned: Arc<AtomicU64>,
    /// Cancelled on resignation: ends this replica's leader streams at once.
    resigned: CancellationToken,
    reported: Mutex<Reported>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
}

/// Where a write goes.
pub enum Routed {
    /// Handled by the leader; this is its response (or why it could not be).
    Remote(Response),
    /// This replica leads (now): handle it here, holding the guard until done.
    Local(Request, LocalWrite),
}

/// What a forwarded write is, for honest error messages.
#[derive(Debug, Clone, Default)]
pub struct WriteInfo {
    /// kube's verb: create, update, patch, delete, deletecollection.
    pub verb: String,
    pub group: String,
    pub resource: String,
}

/// How one attempt to forward a write ended.
enum Sent {
    /// The leader answered (anything but "not the leader").
    Answered(http::Response<hyper::body::Incoming>),
    /// Could not be sent at all (this replica's fault): 503 at once.
    Unsendable(String),
    /// Certainly not carried out: retry (elsewhere).
    NotLeader,
    Unreachable(String),
    /// Sent, and no answer: the outcome is unknown.
    Lost(String),
    Deadline,
    LeaderChanged,
}

/// Counts a forward that failed, by how (`kshard_replica_forward_failures_total`).
fn record_forward_failure(outcome: &'static str) {
    metrics::counter!("kshard_replica_forward_failures_total", "outcome" => outcome).increment(1);
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
        // Present from the start, before (or without) any leader change.
        metrics::gauge!("kshard_replica_is_leader").set(0.0);
        metrics::gauge!("kshard_replica_epoch").set(0.0);
        metrics::counter!("kshard_replica_leader_changes_total").absolute(0);
        Ok(Arc::new(Self {
            fence,
            cfg,
            engine,
            secret,
            view: watch::channel(View::default()).0,
            store,
            client: forward::client(),
            streaming: AtomicBool::new(false),
            elect_now: tokio::sync::Notify::new(),
            born: Instant::now(),
            leading_until: AtomicU64::new(0),
            synced_at: AtomicU64::new(0),
            rounds: Arc::new(Mutex::new(false)),
            won: Arc::new(AtomicU64::new(0)),
            handing_over: AtomicBool::new(false),
            writes: InFlight::default(),
            resigned: CancellationToken::new(),
            abandoned: Arc::new(AtomicU64::new(0)),
            reported: Mutex::new(Reported::default()),
        }))
    }

    pub fn id(&self) -> &str {
        &self.cfg.replica_id
    }

    pub fn secret(&self) -> &str {
        &self.secret
    }

    fn ms_since_born(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.born).as_millis() as u64
    }

    /// Leads now: won the lease, renewed it within the last lease duration,
    /// and not handing it over.
    pub fn is_leader(&self) -> bool {
        self.view.borrow().leading
            && self.fence.epoch() != 0
            && !self.handing_over.load(Ordering::SeqCst)
            && self.ms_since_born(Instant::now()) < self.leading_until.load(Ordering::Acquire)
    }

    pub fn view(&self) -> View {
        self.view.borrow().clone()
    }

    pub(crate) fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Ends when this replica has resigned (its leader streams end then).
    pub(crate) fn resigned_token(&self) -> CancellationToken {
        self.resigned.clone()
    }

    fn mark_synced(&self) {
        self.synced_at
            .store(self.ms_since_born(Instant::now()) + 1, Ordering::Release);
    }

    /// Readiness: the leader is ready; a follower while it is current with
    /// the store: it applied the leader's watermark, or (no leader being
    /// elected yet, or the stream broken) read the event log up to the
    /// stored revision, recently. So followers stay ready through a
    /// failover: they serve reads, and consistent reads check the store.
    pub fn caught_up(&self) -> bool {
        // A leader (even one whose renewal is late: a slow store is the
        // storage check's to report) holds every write it committed.
        if self.view.borrow().leading {
            return true;
        }
        let at = self.synced_at.load(Ordering::Acquire);
        at != 0
            && self.ms_since_born(Instant::now()).saturating_sub(at - 1)
                <= self.cfg.ready_staleness().as_millis() as u64
    }

    /// One line for `/readyz?verbose`: who leads, and this replica's role.
    pub fn describe(&self) -> String {
        let view = self.view();
        let me = &self.cfg.replica_id;
        match view.lease {
            Some(l) if self.is_leader() => {
                format!("replica {me}: leader (epoch {})", l.epoch)
            }
            Some(l) if l.holder != *me => format!(
                "replica {me}: follower; leader {} (epoch {})",
                l.holder, l.epoch
            ),
            _ => format!("replica {me}: follower; no leader (election in progress)"),
        }
    }

    /// Counts a write this replica carries out as the leader, or `None` if
    /// it does not lead (then the write goes to the leader). Counting comes
    /// first so a hand-over that starts meanwhile waits for it.
    pub fn begin_local_write(self: &Arc<Self>) -> Option<LocalWrite> {
        self.writes.n.fetch_add(1, Ordering::SeqCst);
        let guard = LocalWrite(self.clone());
        self.is_leader().then_some(guard)
    }

    async fn local_writes_done(&self) {
        loop {
            let idle = self.writes.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.writes.n.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Shutdown, while still serving: takes no new local writes (they are
    /// forwarded to the next leader), lets those in flight finish (at most
    /// `grace`), then gives the lease up so a follower takes over at once.
    /// Election rounds go on reporting the leader until the server stops.
    pub async fn hand_over(&self, grace: Duration) {
        // Holding an epoch (even with a renewal late): writes may be in flight.
        let leading = self.fence.epoch() != 0;
        self.handing_over.store(true, Ordering::SeqCst);
        if leading {
            tracing::info!("handing the leader lease over");
            if tokio::time::timeout(grace, self.local_writes_done())
                .await
                .is_err()
            {
                tracing::warn!("writes still in flight after the grace period; resigning anyway");
            }
        }
        self.resign().await;
    }

    /// Stops writing and gives the lease up at once, so a peer need not wait
    /// for it to expire; later election rounds only report the leader.
    pub async fn resign(&self) {
        self.handing_over.store(true, Ordering::SeqCst);
        let (engine, rounds, won, fence) = (
            self.engine.clone(),
            self.rounds.clone(),
            self.won.clone(),
            self.fence.clone(),
        );
        let me = self.cfg.replica_id.clone();
        let released = tokio::task::spawn_blocking(move || {
            let mut resigned = rounds.lock().unwrap_or_else(|e| e.into_inner());
            *resigned = true;
            fence.set_epoch(0);
            let epoch = won.swap(0, Ordering::AcqRel);
            if epoch == 0 {
                return Ok(None);
            }
            lease::resign(&*engine, &me, epoch).map(|done| done.then_some(epoch))
        })
        .await;
        self.resigned.cancel();
        match released {
            Ok(Ok(Some(epoch))) => tracing::info!(epoch, "gave up the leader lease"),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "giving up the leader lease failed"),
            Err(e) => tracing::warn!(error = %e, "giving up the leader lease failed"),
        }
        self.leading_until.store(0, Ordering::Release);
        self.view.send_if_modified(|v| {
            let changed = v.leading;
            if v.leading {
                *v = View::default();
            }
            changed
        });
        metrics::gauge!("kshard_replica_is_leader").set(0.0);
        // Learn the next leader soon: writes arriving meanwhile go to it.
        self.elect_now.notify_one();
    }

    /// Runs the first election round (so the role is known before serving),
    /// then keeps electing and, while a follower, following the leader.
    pub async fn start(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut observed = None;
        let mut last = Instant::now();
        self.election_round(&mut observed).await;
        let me = self.clone();
        let elect = tokio::spawn(async move {
            loop {
                // Renewals keep their cadence however long a round took.
                let settled = {
                    let v = me.view.borrow();
                    v.leading || (v.lease.is_some() && me.streaming.load(Ordering::Acquire))
                };
                let pause = if settled {
                    me.cfg.renew_interval()
                } else {
                    me.cfg.suspect_interval()
                };
                tokio::select! {
                    _ = tokio::time::sleep_until((last + pause).into()) => {}
                    _ = me.elect_now.notified() => {}
                }
                last = Instant::now();
                me.election_round(&mut observed).await;
            }
        });
        let me = self.clone();
        let follow = tokio::spawn(async move { me.follow_loop().await });
        vec![elect, follow]
    }

    /// Logs and counts a new leader once, on every replica.
    fn report_leader(&self, holder: Option<&str>, epoch: u64) {
        let mut r = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        if r.holder.as_deref() == holder && (holder.is_none() || r.epoch == epoch) {
            return;
        }
        if let Some(old) = r.holder.take() {
            metrics::gauge!("kshard_replica_leader", "holder" => old).set(0.0);
        }
        match holder {
            Some(h) => {
                let role = if h == self.cfg.replica_id {
                    "leader"
                } else {
                    "follower"
                };
                tracing::info!(leader = %h, epoch, role, "leader changed");
                metrics::gauge!("kshard_replica_leader", "holder" => h.to_string()).set(1.0);
                metrics::gauge!("kshard_replica_epoch").set(epoch as f64);
                metrics::counter!("kshard_replica_leader_changes_total").increment(1);
                r.epoch = epoch;
            }
            None => tracing::info!("no leader"),
        }
        r.holder = holder.map(str::to_string);
    }

    async fn election_round(self: &Arc<Self>, observed: &mut Option<Observed>) {
        let store = self.store.clone();
        let (engine, rounds, won) = (self.engine.clone(), self.rounds.clone(), self.won.clone());
        let (id, address, ttl) = (
            self.cfg.replica_id.clone(),
            self.cfg.advertise_address.clone(),
            self.cfg.lease_duration,
        );
        let current = self.fence.epoch();
        let seen = observed.clone();
        let abandoned = self.abandoned.clone();
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            let resigned = rounds.lock().unwrap_or_else(|e| e.into_inner());
            // The holder stopped renewing a lease ago: it is dead, frozen or
            // cut off, and a transaction it left half committed would block
            // the takeover (which reads the revision counter) until its
            // locks expire. Resolve them first, once per lease.
            if let Some(o) = seen
                .as_ref()
                .filter(|o| !*resigned && !lease::released(&o.lease) && o.since.elapsed() >= ttl)
            {
                if abandoned.swap(o.lease.epoch, Ordering::AcqRel) != o.lease.epoch {
                    if let Err(e) = engine.abandon_locks() {
                        tracing::warn!(error = %e, "resolving the lapsed leader's locks failed");
                    }
                }
            }
            let outcome = lease::elect(
                &*engine,
                &id,
                &address,
                ttl,
                current,
                seen.as_ref(),
                !*resigned,
            );
            let epoch = match &outcome {
                Ok(Outcome::Leader { epoch, .. }) => *epoch,
                Ok(_) => 0,
                Err(_) => won.load(Ordering::Acquire),
            };
            won.store(epoch, Ordering::Release);
            outcome
        })
        .await
        .map_err(|e| StorageError::Engine(e.to_string()))
        .and_then(|r| r);
        match outcome {
            Ok(Outcome::Leader {
                epoch,
                took_over,
                revision,
                handed_over,
            }) => {
                *observed = None;
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
                    // From here this replica's store sequences (the fence says
                    // so), unless it resigned meanwhile.
                    let resigned = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
                    if *resigned {
                        return;
                    }
                    self.fence.set_epoch(epoch);
                }
                // Count the lease from when the round started, to be safe.
                let until = self.ms_since_born(started) + ttl.as_millis() as u64;
                self.leading_until.store(until, Ordering::Release);
                self.mark_synced();
                let lease = Lease {
                    holder: self.cfg.replica_id.clone(),
                    address: self.cfg.advertise_address.clone(),
                    epoch,
                    expires_ms: 0,
                    handed_over,
                };
                self.view.send_if_modified(|v| {
                    let changed = !v.leading || v.lease.as_ref().map(|l| l.epoch) != Some(epoch);
                    v.leading = true;
                    v.lease = Some(lease);
                    changed
                });
                metrics::gauge!("kshard_replica_is_leader").set(1.0);
                self.report_leader(Some(&self.cfg.replica_id), epoch);
            }
            Ok(Outcome::Follower(l)) => {
                if self.fence.epoch() != 0 {
                    tracing::warn!(holder = %l.holder, epoch = l.epoch, "lost the leader lease");
                }
                self.step_down();
                // The record's age counts from when this replica first saw
                // it, after the read: never earlier than its holder wrote it.
                if observed.as_ref().is_none_or(|o| o.lease != l) {
                    *observed = Some(Observed {
                        lease: l.clone(),
                        since: Instant::now(),
                    });
                }
                self.report_leader(Some(&l.holder), l.epoch);
                self.view.send_if_modified(|v| {
                    let changed = v.leading
                        || v.lease.as_ref().map(|x| (&x.holder, x.epoch, &x.address))
                            != Some((&l.holder, l.epoch, &l.address));
                    v.leading = false;
                    v.lease = Some(l);
                    changed
                });
            }
            Ok(Outcome::Vacant) => {
                self.step_down();
                self.report_leader(None, 0);
                self.view.send_if_modified(|v| {
                    let changed = v.leading || v.lease.is_some();
                    *v = View::default();
                    changed
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "election round failed");
                // Unable to renew for a whole lease: another replica may lead by now.
                if self.fence.epoch() != 0
                    && self.ms_since_born(Instant::now())
                        >= self.leading_until.load(Ordering::Acquire)
                {
                    tracing::warn!("lease not renewed in time; stepping down");
                    self.step_down();
                    self.report_leader(None, 0);
                    self.view.send_replace(View::default());
                }
            }
        }
    }

    /// Back to following: the fence makes the store a follower's and refuses
    /// every write transaction of this replica.
    fn step_down(&self) {
        self.fence.set_epoch(0);
        self.leading_until.store(0, Ordering::Release);
        metrics::gauge!("kshard_replica_is_leader").set(0.0);
    }

    /// While a follower: stream from the leader, and after the stream breaks
    /// backfill from the log, then connect again, backing off (with jitter,
    /// capped) while it keeps failing; a new leader is tried at once.
    async fn follow_loop(self: Arc<Self>) {
        let mut changes = self.view.subscribe();
        let mut backoff = FOLLOW_BACKOFF;
        loop {
            let view = changes.borrow_and_update().clone();
            if view.leading {
                self.streaming.store(false, Ordering::Release);
                backoff.reset();
                let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
                continue;
            }
            let Some(leader) = view.lease else {
                // No leader yet: stay current from the log, so reads stay
                // fresh (and this replica ready) through the election.
                self.streaming.store(false, Ordering::Release);
                self.backfill().await;
                if wait_or_change(backoff.next_delay(), &mut changes).await {
                    backoff.reset();
                }
                continue;
            };
            let (ended, view_changed) = tokio::select! {
                r = self.stream_from(&leader.address) => (r, false),
                _ = changes.changed() => (Ok(()), true),
            };
            if self.streaming.swap(false, Ordering::AcqRel) {
                // It streamed: a break now is news, retried promptly.
                backoff.reset();
            }
            if let Err(e) = ended {
                tracing::debug!(leader = %leader.address, error = %e, "leader stream ended");
            }
            if !view_changed {
                // The leader may be gone; one that shut down gave its lease
                // up, so a round now takes over without waiting for expiry.
                self.elect_now.notify_one();
            }
            self.backfill().await;
            if view_changed {
                backoff.reset();
                continue;
            }
            if wait_or_change(backoff.next_delay(), &mut changes).await {
                backoff.reset();
            }
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
        match store.follow(Vec::new(), stored).await {
            Ok(_) => self.mark_synced(),
            Err(e) => tracing::warn!(error = %e, "backfilling from the event log failed"),
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
                        self.streaming.store(true, Ordering::Release);
                        self.mark_synced();
                    }
                }
            }
        }
    }

    /// A write arriving here: carried out here if this replica leads, else
    /// sent to the leader. Waits for a reachable leader within the
    /// request's deadline and the leader patience; retries only when the
    /// leader certainly did not take the request (no connection, or it no
    /// longer leads). Certainly not carried out: 503 with Retry-After;
    /// outcome unknown (sent, then no answer): 504.
    pub async fn route(
        self: &Arc<Self>,
        req: Request,
        identity: &Identity,
        write: &WriteInfo,
    ) -> Routed {
        if let Some(local) = self.begin_local_write() {
            return Routed::Local(req, local);
        }
        let now = Instant::now();
        let request_deadline = req
            .extensions()
            .get::<crate::scope::RequestDeadline>()
            .map(|d| d.0.into_std());
        let buffered = match forward::buffer(req).await {
            Ok(b) => b,
            Err(resp) => return Routed::Remote(resp),
        };
        // Answer before the deadline layer would (it cannot tell why).
        let deadline = request_deadline.map(|d| {
            let margin = ANSWER_MARGIN.min(d.saturating_duration_since(now) / 10);
            d.checked_sub(margin).unwrap_or(d)
        });
        let patience = now + self.cfg.leader_patience();
        let give_up = deadline.map_or(patience, |d| d.min(patience));
        let mut changes = self.view.subscribe();
        let mut backoff = FORWARD_BACKOFF;
        loop {
            if let Some(local) = self.begin_local_write() {
                return Routed::Local(buffered.into_request(), local);
            }
            let view = changes.borrow_and_update().clone();
            let target = view
                .lease
                .filter(|l| !view.leading && l.holder != self.cfg.replica_id);
            if let Some(leader) = target {
                let started = Instant::now();
                match self
                    .send(&buffered, &leader, identity, deadline, &mut changes)
                    .await
                {
                    Sent::Answered(resp) => {
                        metrics::histogram!("kshard_replica_forward_duration_seconds")
                            .record(started.elapsed().as_secs_f64());
                        return Routed::Remote(forward::relay(resp));
                    }
                    Sent::Unsendable(e) => {
                        record_forward_failure("unsendable");
                        return Routed::Remote(forward::unavailable(&format!(
                            "cannot forward the request: {e}"
                        )));
                    }
                    Sent::NotLeader => {
                        record_forward_failure("not_leader");
                        tracing::debug!(leader = %leader.address, "forward target no longer leads");
                    }
                    Sent::Unreachable(e) => {
                        record_forward_failure("unreachable");
                        tracing::debug!(leader = %leader.address, error = %e, "leader unreachable");
                    }
                    Sent::Lost(e) => {
                        record_forward_failure("lost");
                        tracing::warn!(leader = %leader.address, error = %e, "forwarded write got no answer");
                        return Routed::Remote(forward::outcome_unknown(write));
                    }
                    Sent::LeaderChanged => {
                        record_forward_failure("leader_changed");
                        tracing::warn!(leader = %leader.address, "the leader changed before answering a forwarded write");
                        return Routed::Remote(forward::outcome_unknown(write));
                    }
                    Sent::Deadline => {
                        record_forward_failure("deadline");
                        tracing::warn!(leader = %leader.address, "the leader did not answer a forwarded write in time");
                        return Routed::Remote(crate::api::response::error_response(
                            &crate::scope::deadline_exceeded(),
                        ));
                    }
                }
            }
            let now = Instant::now();
            if now >= give_up {
                record_forward_failure("no_leader");
                return Routed::Remote(forward::unavailable(
                    "no leader replica is available for writes",
                ));
            }
            let pause = backoff.next_delay().min(give_up - now);
            let _ = tokio::time::timeout(pause, changes.changed()).await;
        }
    }

    /// One attempt to have `leader` carry out the write. Gives up at the
    /// deadline, or shortly after the lease moved away from `leader` (a
    /// frozen leader never answers; a leader that handed over answers its
    /// last writes before it gives the lease up, so they still arrive).
    async fn send(
        &self,
        buffered: &forward::Buffered,
        leader: &Lease,
        identity: &Identity,
        deadline: Option<Instant>,
        changes: &mut watch::Receiver<View>,
    ) -> Sent {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let mut out = match buffered.to_leader(&leader.address, &self.secret, identity, left) {
            Ok(r) => r,
            Err(e) => return Sent::Unsendable(e.to_string()),
        };
        // The leader's spans continue this request's trace.
        let span = crate::traces::Span::child_with(
            "forward to leader",
            opentelemetry::trace::SpanKind::Client,
            || {
                vec![opentelemetry::KeyValue::new(
                    "server.address",
                    leader.address.clone(),
                )]
            },
        );
        match &span {
            Some(s) => s.inject(out.headers_mut()),
            None => crate::traces::inject(out.headers_mut()),
        }
        let answer = self.client.request(out);
        tokio::pin!(answer);
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(until_deadline);
        let epoch = leader.epoch;
        let moved = async {
            loop {
                if changes.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                let v = changes.borrow();
                if v.leading || v.lease.as_ref().map(|l| l.epoch) != Some(epoch) {
                    return;
                }
            }
        };
        tokio::select! {
            r = &mut answer => return classify(r),
            _ = &mut until_deadline => return Sent::Deadline,
            _ = moved => {}
        }
        // The lease moved on: an answer already on its way still counts.
        // Whether the next epoch came from a hand-over tells how long one
        // may trail; not knowing (no leader in view, or epochs skipped),
        // wait the longer grace.
        let handed_over = {
            let v = changes.borrow();
            v.lease
                .as_ref()
                .is_none_or(|l| l.epoch != epoch + 1 || l.handed_over)
        };
        let grace = self.cfg.answer_grace(handed_over);
        tokio::select! {
            r = &mut answer => classify(r),
            _ = &mut until_deadline => Sent::Deadline,
            _ = tokio::time::sleep(grace) => Sent::LeaderChanged,
        }
    }
}

fn classify(
    r: Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error>,
) -> Sent {
    match r {
        Ok(resp) if resp.headers().contains_key(forward::NOT_LEADER) => Sent::NotLeader,
        Ok(resp) => Sent::Answered(resp),
        // Not connected: the leader never saw the request, so it may go again.
        Err(e) if e.is_connect() => Sent::Unreachable(e.to_string()),
        // Refused by the leader's GOAWAY (it is shutting down): HTTP/2
        // guarantees a stream past the GOAWAY's last stream was not
        // processed, so it may go again too.
        Err(e) if refused_by_go_away(&e) => Sent::Unreachable(e.to_string()),
        // The leader may or may not have carried it out: never repeat it.
        Err(e) => Sent::Lost(format!("{e:?}")),
    }
}

/// Whether a request failed because the server's GOAWAY refused its stream.
fn refused_by_go_away(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away() && h2.is_remote();
        }
        cur = err.source();
    }
    false
}

/// Sleeps `pause`, or less if the view changes; true if it changed.
async fn wait_or_change(pause: Duration, changes: &mut watch::Receiver<View>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(pause) => false,
        r = changes.changed() => r.is_ok(),
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
