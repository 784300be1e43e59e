//! The TiKV engine (Cargo feature `tikv`): the engine interface on
//! tikv-client's optimistic transactions.
//!
//! - **Keyspace per shard**: every key is stored under `kshard/<shard>/`, and
//!   scans are bounded to that prefix, so several shards share one cluster.
//! - **Sync over async**: the engine interface is synchronous and is called
//!   from the store's writer thread and from `spawn_blocking`. tikv-client is
//!   async and spawns background tasks (TSO stream, gRPC connections) on the
//!   runtime it is created on, so the engine owns a small runtime and runs
//!   every client future there, waiting on a plain channel. It never calls
//!   `block_on` on a caller's thread, so callers inside a tokio runtime are safe.
//! - **Conflicts**: a write-write conflict reported by TiKV (or a live lock of
//!   another transaction that cannot be resolved) becomes
//!   `StorageError::Conflict`, like a failed compare on the embedded engine.
//! - **Undetermined commits**: if a commit fails for any other reason the
//!   transaction may still have committed (e.g. the response to the primary
//!   commit was lost). The engine never rolls back then (that could undo the
//!   secondaries of a committed primary); it reads its write set back at a new
//!   timestamp (which resolves its own leftover locks) and reports success only
//!   if every written key holds what it wrote.
//! - **GC safe point**: [`Tikv::advance_gc_safepoint`] (called by the store after
//!   each compaction) moves TiKV's safe point to the timestamp taken at the
//!   previous call, so a snapshot stays readable for at least one compaction
//!   interval; reads on a snapshot older than the safe point are refused.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tikv_client::transaction::{HeartbeatOption, ResolveLocksOptions};
use tikv_client::{
    CheckLevel, Config, Key, KvPair, Snapshot, Timestamp, TimestampExt, Transaction,
    TransactionClient, TransactionOptions,
};

use super::engine::{Engine, ReadTxn, Visitor, WriteFn, WriteTxn};
use super::StorageError;

/// Pairs fetched per scan request at most.
const SCAN_BATCH: u32 = 512;
/// Pairs asked for by a scan's first request, before their sizes are known.
const FIRST_SCAN_BATCH: u32 = 64;
/// Bytes a scan request should bring back: tikv-client refuses a gRPC
/// answer over 4 MiB (its default) and TiKV sends 10 MiB at most
/// (`server.max-grpc-send-msg-len`), while one object may be 1.5 MiB.
const SCAN_BYTES: usize = 2 * 1024 * 1024;
/// How long to wait for an undetermined commit to become readable.
const VERIFY_FOR: Duration = Duration::from_secs(30);
/// How long to keep retrying a timestamp request: tikv-client reconnects to
/// PD at most once a second, so a lost PD connection fails TSO requests for
/// up to a second. Fetching a timestamp has no side effect, so retrying is safe.
const TSO_RETRY_FOR: Duration = Duration::from_secs(5);
/// Timeout of each request to PD / TiKV.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the engine connects: `tikv://pd1:2379[,pd2:2379]?prefix=<shard>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TikvUrl {
    pub pd_endpoints: Vec<String>,
    pub shard: String,
}

impl TikvUrl {
    pub fn parse(url: &str) -> Result<Self, StorageError> {
        let bad = |why: &str| StorageError::Invalid(format!("--store {url}: {why}"));
        let rest = url
            .strip_prefix("tikv://")
            .ok_or_else(|| bad("expected tikv://pd-host:port[,...]?prefix=<shard>"))?;
        let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
        let pd_endpoints: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(String::from)
            .collect();
        if pd_endpoints.is_empty() {
            return Err(bad("no PD endpoint"));
        }
        let mut shard = None;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "prefix" => shard = Some(v.into_owned()),
                other => return Err(bad(&format!("unknown parameter {other:?}"))),
            }
        }
        let shard = shard.ok_or_else(|| bad("missing ?prefix=<shard>"))?;
        // No '/' (or anything odd): shard "a" must never see the keys of shard "a/k".
        let valid = !shard.is_empty()
            && shard
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(bad("prefix must be non-empty [A-Za-z0-9._-]"));
        }
        Ok(Self {
            pd_endpoints,
            shard,
        })
    }

    /// The raw key prefix of this shard.
    pub fn key_prefix(&self) -> Vec<u8> {
        format!("kshard/{}/", self.shard).into_bytes()
    }
}

fn engine_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Engine(e.to_string())
}

/// A failed transaction step that did not commit anything because of another writer.
fn is_conflict(e: &tikv_client::Error) -> bool {
    use tikv_client::Error as E;
    match e {
        // `txn_not_found`: the lock of a transaction whose primary has
        // neither a lock nor a commit record yet (or was rolled back): the
        // other writer is in flight, as with a live lock.
        E::KeyError(k) => k.conflict.is_some() || k.locked.is_some() || k.txn_not_found.is_some(),
        E::MultipleKeyErrors(es) | E::ExtractedErrors(es) => es.iter().any(is_conflict),
        // Prewrite met a live lock of another transaction and gave up.
        E::ResolveLockError(_) => true,
        E::PessimisticLockError { inner, .. } => is_conflict(inner),
        _ => false,
    }
}

/// An error of a write transaction's own read: another writer's in-flight
/// transaction is a conflict (nothing was sent yet), anything else the engine's.
fn write_read_err(e: tikv_client::Error) -> StorageError {
    if is_conflict(&e) {
        conflict()
    } else {
        engine_err(e)
    }
}

fn conflict() -> StorageError {
    // The engine does not know the object's revision; the store fills it in
    // where it matters (a CAS failure is detected above the engine).
    StorageError::Conflict { current: 0 }
}

struct Shared {
    /// Owned only to be shut down in `Drop`; work is spawned through `handle`.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    client: TransactionClient,
    prefix: Vec<u8>,
    /// The GC safe point this engine has set (TSO version; 0 = none).
    safepoint: AtomicU64,
    /// Timestamp taken at the previous safe-point advance: the next safe point.
    next_safepoint: Mutex<Option<Timestamp>>,
}

impl Shared {
    /// Runs `fut` on the engine's runtime and waits for it on this thread.
    fn run<T, F>(&self, fut: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| StorageError::Engine("tikv runtime stopped".into()))
    }

    /// Runs a side-effect-free client call that needs a fresh timestamp,
    /// retrying while PD is unreachable.
    fn with_timestamp<T, F, Fut>(self: &Arc<Self>, call: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Fn(Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = tikv_client::Result<T>> + Send,
    {
        let s = self.clone();
        self.run(async move {
            let deadline = tokio::time::Instant::now() + TSO_RETRY_FOR;
            loop {
                match call(s.clone()).await {
                    Ok(v) => return Ok(v),
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(error = %e, "timestamp request failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(engine_err(e)),
                }
            }
        })?
    }

    fn key(&self, key: &[u8]) -> Key {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        Key::from(k)
    }

    fn options() -> TransactionOptions {
        // Our transactions are short; without a heartbeat an abandoned lock
        // expires after its TTL instead of being kept alive. We roll back or
        // verify explicitly, so the drop check is off.
        TransactionOptions::new_optimistic()
            .heartbeat_option(HeartbeatOption::NoHeartbeat)
            .drop_check(CheckLevel::None)
    }

    fn check_safepoint(&self, ts: u64) -> Result<(), StorageError> {
        let sp = self.safepoint.load(Ordering::Acquire);
        if ts < sp {
            return Err(StorageError::Engine(format!(
                "snapshot at {ts} is older than the GC safe point {sp}"
            )));
        }
        Ok(())
    }

    fn scan_with<R: TxnLike>(
        &self,
        txn: &Arc<tokio::sync::Mutex<R>>,
        start: &[u8],
        end: &[u8],
        visit: &mut Visitor<'_>,
    ) -> Result<(), StorageError> {
        let end_key: Vec<u8> = Vec::from(self.key(end));
        let mut from: Vec<u8> = Vec::from(self.key(start));
        // Pairs per request, so that an answer stays near SCAN_BYTES: sized
        // by the largest pair seen so far, and halved when an answer was
        // too large for gRPC anyway (larger pairs than any seen before).
        let mut limit = FIRST_SCAN_BATCH;
        let mut largest = 0usize;
        loop {
            let t = txn.clone();
            let (lo, hi) = (from.clone(), end_key.clone());
            let batch: Vec<(Vec<u8>, Vec<u8>)> =
                match self.run(async move { t.lock().await.scan(lo, hi, limit).await })? {
                    Ok(batch) => batch,
                    Err(e) if limit > 1 && is_message_too_large(&e) => {
                        limit /= 2;
                        continue;
                    }
                    Err(e) => return Err(engine_err(e)),
                };
            let full = batch.len() as u32 >= limit;
            let Some(last) = batch.last().map(|(k, _)| k.clone()) else {
                return Ok(());
            };
            largest = batch
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .fold(largest, usize::max);
            limit = u32::try_from(SCAN_BYTES / largest.max(1))
                .unwrap_or(SCAN_BATCH)
                .clamp(1, SCAN_BATCH);
            for (k, v) in &batch {
                let Some(k) = k.strip_prefix(self.prefix.as_slice()) else {
                    return Err(StorageError::Corrupt("key outside the shard prefix".into()));
                };
                if visit(k, v).is_break() {
                    return Ok(());
                }
            }
            if !full {
                return Ok(());
            }
            from = last;
            from.push(0);
        }
    }
}

/// Whether a request failed because its answer was larger than a gRPC
/// message may be (tonic's "message length too large" on this side, gRPC's
/// "larger than max" from TiKV's).
fn is_message_too_large(e: &tikv_client::Error) -> bool {
    let text = e.to_string();
    text.contains("message length too large") || text.contains("larger than max")
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The last reference may go away inside an async context (even on this
        // runtime's own workers), where a blocking shutdown would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// What the engine needs from a tikv-client snapshot or transaction.
trait TxnLike: Send + 'static {
    fn scan(
        &mut self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: u32,
    ) -> impl Future<Output = tikv_client::Result<Vec<(Vec<u8>, Vec<u8>)>>> + Send;
}

fn plain_pairs(pairs: impl Iterator<Item = KvPair>) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .map(|kv| {
            let (k, v): (Key, Vec<u8>) = kv.into();
            (Vec::from(k), v)
        })
        .collect()
}

impl TxnLike for Snapshot {
    async fn scan(
        &mut self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: u32,
    ) -> tikv_client::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(plain_pairs(Snapshot::scan(self, start..end, limit).await?))
    }
}

impl TxnLike for Transaction {
    async fn scan(
        &mut self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: u32,
    ) -> tikv_client::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(plain_pairs(
            Transaction::scan(self, start..end, limit).await?,
        ))
    }
}

/// The TiKV engine; see the module docs.
pub struct Tikv {
    shared: Arc<Shared>,
    /// The shard's name (`?prefix=`).
    shard: String,
}

impl Tikv {
    /// Connects to the PD endpoints of `url`.
    pub fn connect(url: &TikvUrl) -> Result<Self, StorageError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kshard-tikv")
            .enable_all()
            .build()
            .map_err(engine_err)?;
        let endpoints = url.pd_endpoints.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let config = Config::default().with_timeout(REQUEST_TIMEOUT);
            let _ = tx.send(TransactionClient::new_with_config(endpoints, config).await);
        });
        let client = match rx.recv() {
            Ok(Ok(client)) => client,
            failed => {
                // Dropping a runtime inside an async context panics: the caller
                // may be one, so this runtime goes away in the background.
                runtime.shutdown_background();
                return Err(match failed {
                    Ok(Err(e)) => StorageError::Unavailable(format!(
                        "cannot reach the TiKV cluster (PD {:?}): {e}",
                        url.pd_endpoints
                    )),
                    _ => StorageError::Engine("tikv runtime stopped".into()),
                });
            }
        };
        tracing::info!(pd = ?url.pd_endpoints, shard = %url.shard, "connected to TiKV");
        Ok(Self {
            shared: Arc::new(Shared {
                handle: runtime.handle().clone(),
                runtime: Some(runtime),
                client,
                prefix: url.key_prefix(),
                safepoint: AtomicU64::new(0),
                next_safepoint: Mutex::new(None),
            }),
            shard: url.shard.clone(),
        })
    }

    /// The GC safe point this engine last set (a TSO version; 0 = never).
    pub fn gc_safepoint(&self) -> u64 {
        self.shared.safepoint.load(Ordering::Acquire)
    }

    /// Advances TiKV's GC safe point to the timestamp taken at the previous
    /// call (the first call only takes that timestamp) and returns the safe
    /// point now in force. tikv-client's `gc` resolves every lock older than
    /// the safe point and then records it in PD; TiKV then drops versions no
    /// snapshot at or above it can see. Snapshots older than the safe point
    /// are refused from now on. The safe point is cluster-wide in TiKV, so
    /// shards sharing a cluster should compact on similar schedules.
    pub fn advance_gc_safepoint(&self) -> Result<u64, StorageError> {
        let s = self.shared.clone();
        let now = s.with_timestamp(|s| async move { s.client.current_timestamp().await })?;
        let previous = {
            let mut next = s.next_safepoint.lock().unwrap_or_else(|e| e.into_inner());
            next.replace(now)
        };
        let Some(target) = previous else {
            return Ok(self.gc_safepoint());
        };
        let version = target.version();
        // Refuse old snapshots before their data can go.
        s.safepoint.fetch_max(version, Ordering::AcqRel);
        let gc = s.run({
            let s = s.clone();
            async move { s.client.gc(target).await }
        })?;
        gc.map_err(engine_err)?;
        tracing::debug!(safepoint = version, "advanced TiKV GC safe point");
        Ok(self.gc_safepoint())
    }
}

struct Reader {
    shared: Arc<Shared>,
    ts: u64,
    snapshot: Arc<tokio::sync::Mutex<Snapshot>>,
}

impl ReadTxn for Reader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.shared.check_safepoint(self.ts)?;
        let snap = self.snapshot.clone();
        let key = self.shared.key(key);
        self.shared
            .run(async move { snap.lock().await.get(key).await })?
            .map_err(engine_err)
    }

    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        self.shared.check_safepoint(self.ts)?;
        let snap = self.snapshot.clone();
        let full: Vec<Key> = keys.iter().map(|k| self.shared.key(k)).collect();
        let asked = full.clone();
        let found: std::collections::HashMap<Vec<u8>, Vec<u8>> = self
            .shared
            .run(async move {
                let mut snap = snap.lock().await;
                snap.batch_get(asked)
                    .await
                    .map(|pairs| pairs.map(|p| (Vec::from(p.0), p.1)).collect())
            })?
            .map_err(engine_err)?;
        // TiKV answers the keys it found, in no particular order.
        Ok(full
            .into_iter()
            .map(|k| found.get(&Vec::from(k)).cloned())
            .collect())
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        self.shared.check_safepoint(self.ts)?;
        self.shared.scan_with(&self.snapshot, start, end, visit)
    }
}

/// One write transaction: reads go to TiKV at the start timestamp (through
/// the client's buffer, so they see our own writes); writes are buffered by
/// the client and also remembered here to verify an undetermined commit.
struct Writer {
    shared: Arc<Shared>,
    txn: Arc<tokio::sync::Mutex<Transaction>>,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl ReadTxn for Writer {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        let txn = self.txn.clone();
        let key = self.shared.key(key);
        self.shared
            .run(async move { txn.lock().await.get(key).await })?
            .map_err(write_read_err)
    }

    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        self.shared.scan_with(&self.txn, start, end, visit)
    }
}

impl WriteTxn for Writer {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        let txn = self.txn.clone();
        let (k, v) = (self.shared.key(key), value.to_vec());
        self.shared
            .run(async move { txn.lock().await.put(k, v).await })?
            .map_err(engine_err)?;
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), StorageError> {
        let txn = self.txn.clone();
        let k = self.shared.key(key);
        self.shared
            .run(async move { txn.lock().await.delete(k).await })?
            .map_err(engine_err)?;
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }
}

impl Engine for Tikv {
    fn kind(&self) -> &'static str {
        "tikv"
    }

    fn shard(&self) -> Option<String> {
        Some(self.shard.clone())
    }

    fn read(&self) -> Result<Box<dyn ReadTxn + '_>, StorageError> {
        let s = self.shared.clone();
        let ts = s.with_timestamp(|s| async move { s.client.current_timestamp().await })?;
        let version = ts.version();
        s.check_safepoint(version)?;
        let snapshot = s.client.snapshot(ts, Shared::options().read_only());
        Ok(Box::new(Reader {
            shared: s,
            ts: version,
            snapshot: Arc::new(tokio::sync::Mutex::new(snapshot)),
        }))
    }

    fn write(&self, f: &mut WriteFn<'_>) -> Result<(), StorageError> {
        let s = self.shared.clone();
        let txn =
            s.with_timestamp(
                |s| async move { s.client.begin_with_options(Shared::options()).await },
            )?;
        let txn = Arc::new(tokio::sync::Mutex::new(txn));
        let mut writer = Writer {
            shared: s.clone(),
            txn: txn.clone(),
            writes: BTreeMap::new(),
        };
        // On failure nothing has been sent to TiKV yet (writes sit in the
        // client's buffer until commit): dropping the transaction discards them.
        f(&mut writer)?;
        let writes = std::mem::take(&mut writer.writes);
        drop(writer);
        if writes.is_empty() {
            return Ok(());
        }
        let t = txn.clone();
        let committed = s.run(async move { t.lock().await.commit().await })?;
        let err = match committed {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if is_conflict(&err) {
            tracing::debug!(error = %err, "TiKV write conflict");
            // A conflict comes from prewrite, before any commit: safe to roll back.
            let t = txn.clone();
            let _ = s.run(async move { t.lock().await.rollback().await });
            return Err(conflict());
        }
        tracing::warn!(error = %err, "TiKV commit failed; checking whether it took effect");
        drop(txn);
        self.verify(&writes, &err)
    }

    fn after_compaction(&self) -> Result<(), StorageError> {
        self.advance_gc_safepoint().map(|_| ())
    }

    fn abandon_locks(&self) -> Result<(), StorageError> {
        let s = self.shared.clone();
        let now = s.with_timestamp(|s| async move { s.client.current_timestamp().await })?;
        let range = Key::from(s.prefix.clone())..Key::from(super::keys::prefix_end(&s.prefix));
        let client = s.client.clone();
        s.run(async move {
            client
                .cleanup_locks(range, &now, ResolveLocksOptions::default())
                .await
        })?
        .map_err(engine_err)?;
        // (tikv-client's count of resolved locks is not reliable: not logged.)
        tracing::info!("resolved transactions the previous leader left half committed");
        Ok(())
    }
}

impl Tikv {
    /// Decides an uncertain commit by reading the write set back.
    fn verify(
        &self,
        writes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        cause: &tikv_client::Error,
    ) -> Result<(), StorageError> {
        let deadline = Instant::now() + VERIFY_FOR;
        loop {
            match self.matches_write_set(writes) {
                Ok(true) => {
                    tracing::info!("TiKV commit had taken effect despite the error");
                    return Ok(());
                }
                Ok(false) => {
                    return Err(StorageError::Aborted(format!(
                        "TiKV transaction did not commit: {cause}"
                    )))
                }
                // Our own leftover locks block the read until their TTL runs out.
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "verifying commit: retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(StorageError::OutcomeUnknown(format!(
                        "TiKV commit outcome unknown ({cause}); verification failed: {e}"
                    )))
                }
            }
        }
    }

    fn matches_write_set(
        &self,
        writes: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<bool, StorageError> {
        let r = self.read()?;
        for (k, v) in writes {
            if r.get(k)? != *v {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write's read or commit that meets another writer's transaction
    /// whose primary TiKV cannot find is refused as a conflict, which the
    /// caller may retry, not reported as an engine failure (a 500).
    #[test]
    fn a_transaction_not_found_is_a_conflict() {
        use tikv_client::{Error, ProtoKeyError};
        let not_found = ProtoKeyError {
            txn_not_found: Some(Default::default()),
            ..Default::default()
        };
        let other = ProtoKeyError {
            abort: "disk full".into(),
            ..Default::default()
        };
        assert!(is_conflict(&Error::KeyError(Box::new(not_found.clone()))));
        assert!(is_conflict(&Error::MultipleKeyErrors(vec![
            Error::KeyError(Box::new(other.clone())),
            Error::KeyError(Box::new(not_found)),
        ])));
        assert!(!is_conflict(&Error::KeyError(Box::new(other.clone()))));
        assert!(matches!(
            write_read_err(Error::KeyError(Box::new(other))),
            StorageError::Engine(_)
        ));
    }

    #[test]
    fn parses_store_urls() {
        let u = TikvUrl::parse("tikv://pd1:2379,pd2:2379?prefix=shard-1").expect("url");
        assert_eq!(u.pd_endpoints, vec!["pd1:2379", "pd2:2379"]);
        assert_eq!(u.key_prefix(), b"kshard/shard-1/".to_vec());
        for bad in [
            "tikv://pd:2379",
            "tikv://?prefix=a",
            "tikv://pd:2379?prefix=a/b",
            "tikv://pd:2379?prefix=a&x=1",
            "redb:///x",
        ] {
            assert!(TikvUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
