//! Revisioned object storage: one global revision per write, history, an
//! event log, compaction and the change feed, all shared above a tiny engine.

pub mod embedded;
pub mod engine;
pub(crate) mod keys;
mod render;
#[cfg(feature = "tikv")]
pub mod tikv;
mod vlog;
mod wal;
mod writer;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

pub use engine::Engine;
use writer::{Msg, Op, Writer};

/// Checked inside every write transaction of the store's sequencer, after the
/// revision counter: with several replicas, that this one still holds the
/// leader lease (see `replica`). An error aborts the transaction.
pub trait Fence: Send + Sync + 'static {
    fn check(&self, txn: &mut dyn engine::WriteTxn) -> Result<(), StorageError>;
    /// Whether this process assigns revisions right now (a leader). A store
    /// whose fence says no is a follower's: it reads the newest committed
    /// revision from the engine and leaves compaction to the leader.
    fn sequencing(&self) -> bool;
}

pub type Revision = u64;

/// Opens the engine `--store` names: none (or `embedded`) is the embedded
/// engine at `embedded_path` with a page cache of `embedded_cache_bytes`;
/// `tikv://pd:2379[,...]?prefix=<shard>` is TiKV, available when built with
/// the `tikv` feature.
pub fn open_engine(
    store: Option<&str>,
    embedded_path: &std::path::Path,
    embedded_cache_bytes: usize,
) -> Result<Arc<dyn Engine>, StorageError> {
    match store {
        None | Some("" | "embedded") => Ok(Arc::new(embedded::Embedded::open_with_cache(
            embedded_path,
            embedded_cache_bytes,
        )?)),
        Some(url) if url.starts_with("tikv://") => open_tikv(url),
        Some(other) => Err(StorageError::Invalid(format!(
            "--store {other}: expected `embedded` or tikv://pd-host:port[,...]?prefix=<shard>"
        ))),
    }
}

#[cfg(feature = "tikv")]
fn open_tikv(url: &str) -> Result<Arc<dyn Engine>, StorageError> {
    Ok(Arc::new(tikv::Tikv::connect(&tikv::TikvUrl::parse(url)?)?))
}

#[cfg(not(feature = "tikv"))]
fn open_tikv(url: &str) -> Result<Arc<dyn Engine>, StorageError> {
    Err(StorageError::Invalid(format!(
        "--store {url}: this kshard was built without TiKV support (cargo feature `tikv`)"
    )))
}

/// Largest encoded object one write may store (etcd's default request limit).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// Deepest nesting of arrays and objects one write may store: every reader
/// decodes stored JSON with serde_json's default recursion limit, which
/// refuses a 128th level, so a deeper object could never be read, deleted
/// or loaded into the watch cache again.
pub const MAX_OBJECT_NESTING: usize = 127;

/// Arrays and objects nested in `v` (0 for a scalar), or `None` once that
/// exceeds `limit`. Iterative and stopping early, so any depth is safe to ask.
pub fn nesting_within(v: &Value, limit: usize) -> Option<usize> {
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, above)) = stack.pop() {
        let level = above + 1;
        match v {
            Value::Array(_) | Value::Object(_) if level > limit => return None,
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, level))),
            Value::Object(o) => stack.extend(o.values().map(|c| (c, level))),
            _ => continue,
        }
        deepest = deepest.max(level);
    }
    Some(deepest)
}

/// Decides from an object's stored JSON whether a list includes it.
pub type ValueFilter = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage engine: {0}")]
    Engine(String),
    #[error("not found")]
    NotFound,
    #[error("already exists")]
    AlreadyExists,
    #[error("revision conflict (current {current})")]
    Conflict { current: Revision },
    #[error("revision {requested} has been compacted (compacted to {compacted})")]
    Compacted {
        requested: Revision,
        compacted: Revision,
    },
    #[error("corrupt record: {0}")]
    Corrupt(String),
    #[error("invalid object: {0}")]
    Invalid(String),
    #[error("storage is shut down")]
    Closed,
    #[error("object is {size} bytes, more than the {limit} bytes one write may store")]
    TooLarge { size: usize, limit: usize },
    #[error("object nests arrays and objects more than {limit} levels deep")]
    TooDeep { limit: usize },
    /// This replica does not hold the leader lease: nothing was written.
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// The transaction was rolled back by another writer before it
    /// committed (verified): nothing was written.
    #[error("transaction aborted, nothing written: {0}")]
    Aborted(String),
    /// The engine cannot be reached (TiKV down at start); worth retrying.
    #[error("{0}")]
    Unavailable(String),
    /// The store is not whole: a snapshot restore into it did not finish.
    #[error("{0}")]
    Incomplete(String),
    /// The write may or may not have been stored: neither could be made
    /// sure of (a log sync failed; a TiKV commit could not be verified).
    #[error("{0}")]
    OutcomeUnknown(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change. `object` carries `metadata.resourceVersion` = `revision`;
/// for a deletion it is the last state of the object.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventType,
    pub key: String,
    pub revision: Revision,
    pub object: Arc<Value>,
    pub json: Bytes,
}

/// Events committed together, in revision order, and the watermark after them.
#[derive(Debug)]
pub struct Batch {
    pub events: Vec<Event>,
    pub revision: Revision,
}

/// The result of a write: the object as stored.
#[derive(Debug, Clone)]
pub struct Written {
    pub revision: Revision,
    pub object: Arc<Value>,
    pub json: Bytes,
}

/// A write request; `object` must already carry everything but its revision.
#[derive(Debug)]
pub enum Write {
    Create {
        key: String,
        object: Value,
    },
    /// Replaces the object if its current revision is `expected`.
    Update {
        key: String,
        expected: Revision,
        object: Value,
    },
    /// Removes the object (if `expected` is set, only at that revision).
    Delete {
        key: String,
        expected: Option<Revision>,
    },
}

#[derive(Debug, Clone)]
pub struct ListPage {
    pub revision: Revision,
    pub items: Vec<(String, Bytes)>,
    /// Key of the last returned item when more items exist.
    pub continue_after: Option<String>,
    pub remaining: u64,
}

pub struct Store {
    engine: Arc<dyn Engine>,
    writes: mpsc::Sender<Msg>,
    /// The sequencer, shared by the writer thread and a lone write that
    /// commits itself.
    sequencer: Arc<Mutex<Writer>>,
    /// Write requests being handled (`Store::writing`), from their decoding
    /// to their answer: a write that finds no other may commit itself.
    in_flight: AtomicU64,
    revision: watch::Receiver<Revision>,
    compacted: Arc<AtomicU64>,
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<Batch>>>>>,
    /// Several replicas: the fence says whether this one leads.
    fence: Option<Arc<dyn Fence>>,
}

impl Store {
    pub fn open(engine: Arc<dyn Engine>) -> Result<Arc<Self>, StorageError> {
        Self::open_fenced(engine, None)
    }

    /// Like [`Store::open`], with `fence` checked in every write transaction.
    pub fn open_fenced(
        engine: Arc<dyn Engine>,
        fence: Option<Arc<dyn Fence>>,
    ) -> Result<Arc<Self>, StorageError> {
        let (rev, compacted) = {
            let r = engine.read()?;
            if r.get(keys::META_RESTORING)?.is_some() {
                return Err(StorageError::Incomplete(
                    "the store holds an unfinished `kshard snapshot restore` (it was \
                     interrupted); run the restore again with --force"
                        .into(),
                ));
            }
            let rev = r
                .get(keys::META_REVISION)?
                .and_then(|v| keys::decode_u64(&v))
                .unwrap_or(0);
            let compacted = r
                .get(keys::META_COMPACT)?
                .and_then(|v| keys::decode_u64(&v))
                .unwrap_or(0);
            (rev, compacted)
        };
        let (rev_tx, rev_rx) = watch::channel(rev);
        let subscribers = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel(4096);
        let writer = Writer::new(
            engine.clone(),
            rev,
            rev_tx,
            subscribers.clone(),
            fence.clone(),
        );
        let sequencer = Arc::new(Mutex::new(writer));
        let thread_sequencer = sequencer.clone();
        std::thread::Builder::new()
            .name("kshard-writer".into())
            .spawn(move || Writer::run(thread_sequencer, rx))
            .map_err(|e| StorageError::Engine(e.to_string()))?;
        Ok(Arc::new(Self {
            engine,
            writes: tx,
            sequencer,
            in_flight: AtomicU64::new(0),
            revision: rev_rx,
            compacted: Arc::new(AtomicU64::new(compacted)),
            subscribers,
            fence,
        }))
    }

    /// Shutdown: releases the engine (redb closes its file cleanly). Every
    /// acknowledged write is durable already; later operations fail.
    pub fn close(&self) {
        self.engine.close();
    }

    /// The engine under the store, for `crate::snapshot`, which reads it
    /// whole in one of its consistent read views.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// A follower replica's store: another process assigns revisions.
    pub fn is_follower(&self) -> bool {
        self.fence.as_ref().is_some_and(|f| !f.sequencing())
    }

    /// The revision a consistent read must reflect. The sequencer knows it; a
    /// follower reads the stored counter, which the leader advances in the
    /// same transaction as every write, so it is never behind the leader's
    /// watermark when the request arrived.
    pub async fn read_revision(&self) -> Result<Revision, StorageError> {
        if !self.is_follower() {
            return Ok(self.revision());
        }
        let stored = self.stored_revision().await?;
        Ok(stored.max(self.revision()))
    }

    /// A real read through the engine, for health checks: of a key only
    /// compaction writes, so that a transaction a killed replica left half
    /// committed on the hot revision counter (TiKV blocks readers of its
    /// keys until the lock's TTL, 3 s, runs out) does not fail the check
    /// of every replica at once.
    pub async fn probe(&self) -> Result<(), StorageError> {
        let engine = self.engine.clone();
        blocking(move || engine.read()?.get(keys::META_COMPACT).map(|_| ())).await
    }

    /// The revision counter as stored (the last revision any sequencer committed).
    pub async fn stored_revision(&self) -> Result<Revision, StorageError> {
        let engine = self.engine.clone();
        blocking(move || {
            Ok(engine
                .read()?
                .get(keys::META_REVISION)?
                .and_then(|v| keys::decode_u64(&v))
                .unwrap_or(0))
        })
        .await
    }

    /// A follower: publishes `events` another sequencer committed (in revision
    /// order; already published ones are skipped) and then everything up to
    /// `watermark`, reading gaps from the event log. Returns the revision
    /// published to.
    pub async fn follow(
        &self,
        events: Vec<Event>,
        watermark: Revision,
    ) -> Result<Revision, StorageError> {
        let (tx, rx) = oneshot::channel();
        self.writes
            .send(Msg::Follow {
                events,
                watermark,
                reply: tx,
            })
            .await
            .map_err(|_| StorageError::Closed)?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    /// A follower learns the leader's compaction so it refuses the same reads.
    pub fn observe_compaction(&self, compacted: Revision) {
        self.compacted.fetch_max(compacted, Ordering::AcqRel);
    }

    /// The newest committed revision (the watermark: everything up to it is durable).
    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    pub fn compacted_revision(&self) -> Revision {
        self.compacted.load(Ordering::Acquire)
    }

    /// Subscribes to the change feed; returns the revision the feed starts after.
    pub fn subscribe(&self) -> (Revision, mpsc::UnboundedReceiver<Arc<Batch>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the lock the writer publishes under, so no batch is missed or doubled.
        let rev = self.revision();
        subs.push(tx);
        (rev, rx)
    }

    pub async fn write(&self, write: Write) -> Result<Written, StorageError> {
        // In a traced request: the commit's span, from handing the write in
        // to its acknowledgement (durable and published).
        let span = crate::traces::Span::child_with(
            "storage commit",
            opentelemetry::trace::SpanKind::Internal,
            || {
                let (operation, key) = match &write {
                    Write::Create { key, .. } => ("create", key),
                    Write::Update { key, .. } => ("update", key),
                    Write::Delete { key, .. } => ("delete", key),
                };
                vec![
                    opentelemetry::KeyValue::new("operation", operation),
                    opentelemetry::KeyValue::new("key", key.clone()),
                ]
            },
        );
        let (written, grouped) = self.commit(write).await;
        if let Some(span) = &span {
            use opentelemetry::KeyValue;
            span.set_attribute(KeyValue::new("group-commit", grouped));
            match &written {
                Ok(w) => span.set_attribute(KeyValue::new("revision", w.revision as i64)),
                Err(e) => span.fail(e.to_string()),
            }
        }
        written
    }

    /// Commits one write; says whether the writer thread did (in a group).
    async fn commit(&self, mut write: Write) -> (Result<Written, StorageError>, bool) {
        let (tx, rx) = oneshot::channel();
        let rendered = match &mut write {
            Write::Create { object, .. } | Write::Update { object, .. } => {
                render::Rendered::new(object)
            }
            Write::Delete { .. } => None,
        };
        let op = Op {
            write,
            rendered,
            reply: tx,
        };
        // The caller's own request counts one.
        let alone = self.in_flight.load(Ordering::Acquire) <= 1;
        let op = match self.commit_alone(op, alone) {
            Some(op) => op,
            None => return (rx.await.unwrap_or(Err(StorageError::Closed)), false),
        };
        if self.writes.send(Msg::Write(op)).await.is_err() {
            return (Err(StorageError::Closed), true);
        }
        (rx.await.unwrap_or(Err(StorageError::Closed)), true)
    }

    /// Counts a write request as in flight until the guard drops. Counting
    /// whole requests rather than their storage step tells a lone writer
    /// from one of many whose storage steps happen not to overlap.
    pub fn writing(&self) -> Writing<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Writing(&self.in_flight)
    }

    /// A write with no other in flight commits itself, on this thread: the
    /// two hand-offs to and from the writer thread (a thread wake each) were
    /// a third of a lone create's latency. Unless the engine expects the
    /// write to be quick (a log append with a fast sync), the runtime's core
    /// is handed to another thread meanwhile (`block_in_place`), so a slow
    /// sync stalls no other task. Concurrent writes go to the writer thread,
    /// which groups them. Returns the op when it must go there.
    fn commit_alone(&self, op: Op, alone: bool) -> Option<Op> {
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        // A queued op (the writer thread's) goes first.
        let queue_empty = self.writes.capacity() == self.writes.max_capacity();
        if !(alone && multi_thread && queue_empty) {
            return Some(op);
        }
        let Ok(mut sequencer) = self.sequencer.try_lock() else {
            return Some(op);
        };
        if self.engine.quick_write() {
            // A fast sync costs less than handing the worker to another
            // thread and back; the runtime's other workers serve meanwhile.
            sequencer.commit_group(vec![op]);
        } else {
            tokio::task::block_in_place(|| sequencer.commit_group(vec![op]));
        }
        drop(sequencer);
        // The engine's leftover work runs once the response is on its way:
        // the task takes this worker's next slot, which runs when the
        // request's task waits for the client.
        let engine = self.engine.clone();
        tokio::spawn(async move { engine.settle() });
        None
    }

    /// Latest state of one object.
    pub async fn get(&self, key: &str) -> Result<Option<(Revision, Bytes)>, StorageError> {
        let engine = self.engine.clone();
        let key = key.to_string();
        blocking(move || {
            let r = engine.read()?;
            let Some(latest) = r.get(&keys::latest(&key))? else {
                return Ok(None);
            };
            let (rev, deleted) = keys::decode_latest(&latest)
                .ok_or_else(|| StorageError::Corrupt(format!("latest record of {key}")))?;
            if deleted {
                return Ok(None);
            }
            let value = r
                .get(&keys::version(&key, rev))?
                .ok_or_else(|| StorageError::Corrupt(format!("missing version {rev} of {key}")))?;
            Ok(Some((rev, Bytes::from(value))))
        })
        .await
    }

    /// Lists the objects whose key starts with `prefix` as they were at `revision`,
    /// starting after `after`, at most `limit` matching `filter`, with the
    /// number of objects after the page. A filtered list (`filter` not
    /// everything) only learns whether there are more: pass `count_rest`
    /// false and the scan stops at the first one.
    pub async fn list(
        &self,
        prefix: &str,
        revision: Revision,
        after: Option<String>,
        limit: Option<usize>,
        filter: ValueFilter,
    ) -> Result<ListPage, StorageError> {
        self.list_counting(prefix, revision, after, limit, filter, true)
            .await
    }

    /// [`Store::list`], counting what follows the page only if `count_rest`.
    pub async fn list_counting(
        &self,
        prefix: &str,
        revision: Revision,
        after: Option<String>,
        limit: Option<usize>,
        filter: ValueFilter,
        count_rest: bool,
    ) -> Result<ListPage, StorageError> {
        self.check_not_compacted(revision)?;
        let engine = self.engine.clone();
        let prefix = prefix.to_string();
        let page = blocking(move || {
            list_at(
                &*engine, &prefix, revision, after, limit, &*filter, count_rest,
            )
        })
        .await?;
        // Compaction may have raced with the scan: a result below it is not trustworthy.
        self.check_not_compacted(revision)?;
        Ok(page)
    }

    fn check_not_compacted(&self, revision: Revision) -> Result<(), StorageError> {
        let compacted = self.compacted_revision();
        if revision < compacted {
            return Err(StorageError::Compacted {
                requested: revision,
                compacted,
            });
        }
        Ok(())
    }

    /// Drops history at or below `to` (keeping each object's state as of `to`).
    pub async fn compact(&self, to: Revision) -> Result<(), StorageError> {
        let to = to.min(self.revision());
        if to <= self.compacted_revision() {
            return Ok(());
        }
        // Refuse reads below `to` before any data goes away.
        self.compacted.store(to, Ordering::Release);
        let engine = self.engine.clone();
        blocking(move || compact_engine(&*engine, to)).await
    }

    /// Every `interval`, compacts to the revision current one interval earlier.
    pub fn spawn_compactor(self: &Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut previous: Option<Revision> = None;
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { return };
                if store.is_follower() {
                    // The leader compacts the shared history.
                    previous = None;
                    continue;
                }
                if let Some(to) = previous {
                    if let Err(e) = store.compact(to).await {
                        tracing::warn!(error = %e, "compaction failed");
                    } else {
                        tracing::debug!(revision = to, "compacted");
                    }
                }
                previous = Some(store.revision());
            }
        })
    }
}

/// A write request in flight (`Store::writing`).
pub struct Writing<'a>(&'a AtomicU64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StorageError::Engine(e.to_string()))?
}

fn list_at(
    engine: &dyn Engine,
    prefix: &str,
    revision: Revision,
    after: Option<String>,
    limit: Option<usize>,
    filter: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    count_rest: bool,
) -> Result<ListPage, StorageError> {
    let r = engine.read()?;
    let start = match &after {
        // Everything of `after` itself sorts before its successor key + NUL... so
        // start at the first byte string greater than every version of `after`.
        Some(a) => keys::prefix_end(&keys::version_prefix(a)),
        None => keys::versions_from(prefix),
    };
    let end = keys::prefix_end(&keys::versions_from(prefix));
    let mut items: Vec<(String, Bytes)> = Vec::new();
    let mut remaining = 0u64;
    let mut continue_after = None;
    let mut error = None;

    // Versions of one key are adjacent and ascending: remember the newest one
    // <= revision. Once the page is full, only whether a key is live (and
    // passes the filter) matters: nothing is copied for the rest, and with a
    // filter the scan stops at the first match past the page (a selector's
    // list reports no remaining count, only that there is more).
    let full = |items: &Vec<(String, Bytes)>| limit.is_some_and(|l| items.len() >= l);
    let mut current: Option<(String, Option<Vec<u8>>)> = None;
    let mut finish_key = |key: String, value: Option<Vec<u8>>, items: &mut Vec<_>| {
        let Some(value) = value else { return false };
        if value.is_empty() || !filter(&value) {
            return false;
        }
        if limit.is_some_and(|l| items.len() >= l) {
            remaining += 1;
            true
        } else {
            items.push((key, Bytes::from(value)));
            false
        }
    };
    // Past the page without a filter only the newest version's liveness
    // per key matters: the scan stops where that begins and a second one,
    // of lengths only, counts (an engine with a value log reads no value).
    let mut resume_at: Option<Vec<u8>> = None;
    r.scan(&start, &end, &mut |k, v| {
        let Some((key, rev)) = keys::parse_version(k) else {
            error = Some(StorageError::Corrupt("bad version key".into()));
            return ControlFlow::Break(());
        };
        if current.is_none() && full(&items) && count_rest {
            resume_at = Some(k.to_vec());
            return ControlFlow::Break(());
        }
        match &mut current {
            Some((ck, cv)) if ck == key => {
                if rev <= revision {
                    *cv = Some(v.to_vec());
                }
            }
            _ => {
                if let Some((ck, cv)) = current.take() {
                    if finish_key(ck, cv, &mut items) && !count_rest {
                        return ControlFlow::Break(());
                    }
                }
                if full(&items) && count_rest {
                    resume_at = Some(k.to_vec());
                    return ControlFlow::Break(());
                }
                current = Some((key.to_string(), (rev <= revision).then(|| v.to_vec())));
            }
        }
        ControlFlow::Continue(())
    })?;
    if let Some(e) = error {
        return Err(e);
    }
    if let Some((ck, cv)) = current.take() {
        finish_key(ck, cv, &mut items);
    }
    let mut counted = 0u64;
    if let Some(from) = resume_at {
        let mut counting: Option<(String, bool)> = None;
        r.scan_lengths(&from, &end, &mut |k, len| {
            let Some((key, rev)) = keys::parse_version(k) else {
                error = Some(StorageError::Corrupt("bad version key".into()));
                return ControlFlow::Break(());
            };
            match &mut counting {
                Some((ck, live)) if ck == key => {
                    if rev <= revision {
                        *live = len > 0;
                    }
                }
                _ => {
                    if let Some((_, true)) = counting.take() {
                        counted += 1;
                    }
                    counting = Some((key.to_string(), rev <= revision && len > 0));
                }
            }
            ControlFlow::Continue(())
        })?;
        if let Some(e) = error {
            return Err(e);
        }
        if let Some((_, true)) = counting.take() {
            counted += 1;
        }
    }
    remaining += counted;
    if remaining > 0 {
        continue_after = items.last().map(|(k, _)| k.clone());
    }
    Ok(ListPage {
        revision,
        items,
        continue_after,
        remaining,
    })
}

/// Log records a compaction handles per write transaction (etcd's
/// `--experimental-compaction-batch-limit` default).
const COMPACTION_BATCH: usize = 1000;
/// The pause between two of a compaction's transactions, so that requests'
/// writes are not kept waiting behind a long run of them (etcd's
/// `--experimental-compaction-sleep-interval` default).
const COMPACTION_PAUSE: Duration = Duration::from_millis(10);

/// Drops the history at or below `to` that the last compaction left: the
/// event log's records of that window name every version that can go, so
/// the work is in proportion to the writes since, not to the objects stored
/// (a scan of every version read the whole store every five minutes: 1.3 GB
/// at a million objects, beside the requests it slowed). Per key, every
/// version at or below `to` but the newest goes, and the newest too when it
/// is a deletion's tombstone (with the latest record, unless the object was
/// created again). Each batch deletes its records' versions and the records
/// themselves in one transaction, so a compaction cut short by a crash
/// leaves no record whose versions are still there to find.
fn compact_engine(engine: &dyn Engine, to: Revision) -> Result<(), StorageError> {
    let mut from = engine
        .read()?
        .get(keys::META_COMPACT)?
        .as_deref()
        .and_then(keys::decode_u64)
        .unwrap_or(0);
    let end = keys::log(to.saturating_add(1));
    loop {
        let mut records = Vec::with_capacity(COMPACTION_BATCH);
        engine
            .read()?
            .scan(&keys::log(from.saturating_add(1)), &end, &mut |k, v| {
                let rev = k.strip_prefix(b"l/").and_then(keys::decode_u64);
                records.push(rev.map(|rev| (rev, v.to_vec())));
                if records.len() < COMPACTION_BATCH {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            })?;
        let mut batch = Vec::with_capacity(records.len());
        for r in records {
            let (rev, record) = r.ok_or_else(|| StorageError::Corrupt("log key".into()))?;
            batch.push(writer::parse_log_record(rev, &record)?);
        }
        let Some(last) = batch.last().map(|r| r.rev) else {
            break;
        };
        engine.write(&mut |txn| {
            for r in &batch {
                if r.prev > 0 {
                    // The version this write replaced.
                    txn.delete(&keys::version(&r.key, r.prev))?;
                }
                if r.kind == EventType::Deleted {
                    txn.delete(&keys::version(&r.key, r.rev))?;
                    let latest = keys::latest(&r.key);
                    if let Some(v) = txn.get(&latest)? {
                        if keys::decode_latest(&v).is_some_and(|(rev, gone)| gone && rev <= to) {
                            txn.delete(&latest)?;
                        }
                    }
                }
                txn.delete(&keys::log(r.rev))?;
            }
            Ok(())
        })?;
        from = last;
        if batch.len() < COMPACTION_BATCH {
            break;
        }
        std::thread::sleep(COMPACTION_PAUSE);
    }
    engine.write(&mut |txn| txn.put(keys::META_COMPACT, &to.to_be_bytes()))?;
    engine.after_compaction()
}

/// An object's JSON as shared bytes in an allocation of its own length: the
/// bytes live as long as the object is cached, and serializing grows a
/// `Vec` by doubling. Shrinking that `Vec` does not help: mimalloc keeps a
/// block shrunk by less than half where it is, so a 1,292-byte object held
/// its whole 2,048-byte block. The encoding is copied out instead (~0.1 µs).
pub fn json_bytes(v: &Value) -> Result<Bytes, serde_json::Error> {
    Ok(Bytes::copy_from_slice(&serde_json::to_vec(v)?))
}

#[cfg(test)]
mod tests;
