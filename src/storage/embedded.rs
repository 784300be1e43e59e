//! The embedded engine on redb: one table, crash-safe. Each transaction is
//! made durable in the write-ahead log (`wal.rs`) and applied to one redb
//! write transaction that several of them share: it is committed (without a
//! sync) every `PENDING_GROUPS` transactions or `PENDING_BYTES` of log, and
//! before any read, so readers see every acknowledged write. A redb commit
//! costs far more than a small transaction's inserts (page allocation and
//! checksums per commit), so sharing it is most of the engine's CPU saved. A
//! durable redb commit every `CHECKPOINT_BYTES` of log (and at shutdown) lets
//! the log start over. Opening the database replays the log's records onto
//! redb's last durable commit.
//!
//! A write's inserts into redb need not precede its acknowledgement: once
//! the log holds it, it is durable. So a write records its changes in its
//! log payload only (its own reads look there first), and they reach the
//! redb transaction after the sync, when the caller `settle`s the engine
//! off the request's path, or else before the next read or write, which
//! must see them. A payload larger than `UNSETTLED_BYTES` goes in at once.
//!
//! After an I/O error (a full disk) redb refuses every later transaction
//! ("previous I/O error") until the database is opened again. The engine
//! does that itself: the failed write is refused (nothing of it is visible,
//! redb's commit is atomic), and the next transaction reopens the file,
//! which redb checks and repairs, so writes succeed again once the cause is
//! gone, without a restart.

use std::cell::{Cell, RefCell};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::engine::{Engine, LengthVisitor, ReadTxn, Visitor, WriteFn, WriteTxn};
use super::vlog::{self, Appender, Segments};
use super::wal::{self, OpRef, Payload, Wal};
use super::StorageError;

/// The store's keys; each value tagged inline or a pointer into the value
/// log (`vlog.rs`).
const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv.v2");
/// The table of stores written before the value log: untagged values,
/// moved into `KV` when such a store is opened.
const OLD_KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
/// The engine's own bookkeeping, apart from the store's keys.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Bytes of values each value-log segment holds that `KV` points at.
const VLOG_LIVE: TableDefinition<u32, u64> = TableDefinition::new("vlog-live");
/// The log epoch redb's state includes every record before (see `wal.rs`).
const WAL_EPOCH: &str = "wal-epoch";
/// Names this database's value-log directory (see `vlog::dir_of`).
const VLOG_NONCE: &str = "vlog-nonce";
/// The value log's open segment and its end at this commit.
const VLOG_SEG: &str = "vlog-seg";
const VLOG_END: &str = "vlog-end";

/// Transactions applied to one redb commit at most. Every commit freezes
/// the pages it wrote, and the next write to each costs a copy of it; writes
/// to scattered keys touch a new leaf each, so fewer commits are fewer
/// copies (64 here and 2 MiB below cost 5 % more CPU per create at c=64).
const PENDING_GROUPS: usize = 1024;
/// Log bytes applied to one redb commit at most: as much as a checkpoint
/// (`wal::CHECKPOINT_BYTES`) covers, which commits anyway.
const PENDING_BYTES: u64 = 16 * 1024 * 1024;
/// A sync at most this long counts as quick (an SSD's; a disk's takes milliseconds).
const QUICK_SYNC: std::time::Duration = std::time::Duration::from_micros(500);
/// The record size a quick write is expected to stay under.
const QUICK_RECORD: u64 = 64 * 1024;
/// A write's changes not yet in redb stay under this much: its reads search
/// them one by one before redb's table.
const UNSETTLED_BYTES: usize = 16 * 1024;
/// The largest payload allocation kept for reuse.
const SPARE_LOG_BYTES: usize = 4 * 1024 * 1024;

/// The write-ahead log and what of it redb has not committed yet.
struct Durable {
    wal: Wal,
    vlog: Appender,
    pending: Option<Pending>,
    /// The last write's changes that are durable in the log but not yet in
    /// `pending`: its payload from the given byte on.
    unsettled: Option<(Payload, usize)>,
    /// The last payload's allocation, for the next (see `Payload::with_buffer`).
    spare: Vec<u8>,
}

impl Durable {
    fn new((wal, vlog): (Wal, Appender)) -> Self {
        Self {
            wal,
            vlog,
            pending: None,
            unsettled: None,
            spare: Vec::new(),
        }
    }

    /// Keeps a settled payload's allocation for the next write, unless an
    /// unusually large group made it big enough to be worth giving back.
    fn recycle(&mut self, log: Payload) {
        let buf = log.into_buffer();
        if buf.capacity() <= SPARE_LOG_BYTES {
            self.spare = buf;
        }
    }
}

/// A redb transaction holding transactions already durable in the log.
struct Pending {
    txn: redb::WriteTransaction,
    groups: usize,
    bytes: u64,
    /// The value log's live counts when the transaction began, for an abort.
    live: std::collections::BTreeMap<u32, u64>,
}

impl Pending {
    fn begin(mut txn: redb::WriteTransaction, vlog: &Appender) -> Result<Self, StorageError> {
        // Durable through the log; redb syncs only at checkpoints.
        txn.set_durability(Durability::None).map_err(engine_err)?;
        Ok(Self {
            txn,
            groups: 0,
            bytes: 0,
            live: vlog.live().clone(),
        })
    }

    /// Commits, with the value log's end and counts.
    fn commit(self, vlog: &Appender) -> Result<(), StorageError> {
        record_vlog(&self.txn, vlog)?;
        self.txn.commit().map_err(engine_err)
    }
}

pub struct Embedded {
    /// `None` while a failed database waits to be opened again.
    db: RwLock<Option<Arc<Database>>>,
    /// The log of the open database and the redb transaction holding its
    /// newest records; `None` with the database.
    wal: Mutex<Option<Durable>>,
    /// The value log's segment files, for readers.
    segments: Arc<Segments>,
    /// How many times the database was opened again after a failure: a
    /// value-log collection that sees it change lost its copies with redb's
    /// uncommitted state and deletes nothing.
    reopened: std::sync::atomic::AtomicU64,
    /// Whether `Durable::pending` holds records readers must not miss (read
    /// without the lock: a read commits them first).
    has_pending: AtomicBool,
    /// Set at shutdown: the database is not opened again.
    closed: std::sync::atomic::AtomicBool,
    path: PathBuf,
    cache_bytes: usize,
    /// Tests: the next redb commit after the log fails, as on a full disk.
    #[cfg(test)]
    fail_commit: AtomicBool,
    /// Runs once between opening the database and taking the writer's lock
    /// (a failure on another thread landing in that window).
    #[cfg(test)]
    before_lock: Mutex<Option<fn(&Embedded)>>,
}

fn engine_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Engine(e.to_string())
}

/// redb's page cache when none is given. redb's own default is 1 GiB, far
/// more than kshard needs: reads are served by the watch cache, and the
/// kernel's page cache holds the file anyway.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

impl Embedded {
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens (or creates) the database with a page cache of `cache_bytes`.
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Self, StorageError> {
        let segments = Arc::new(Segments::default());
        let (db, wal, vlog) = open_db(path, cache_bytes, &segments)?;
        Ok(Self {
            db: RwLock::new(Some(Arc::new(db))),
            wal: Mutex::new(Some(Durable::new((wal, vlog)))),
            segments,
            reopened: std::sync::atomic::AtomicU64::new(0),
            has_pending: AtomicBool::new(false),
            closed: std::sync::atomic::AtomicBool::new(false),
            path: path.to_path_buf(),
            cache_bytes,
            #[cfg(test)]
            fail_commit: AtomicBool::new(false),
            #[cfg(test)]
            before_lock: Mutex::new(None),
        })
    }

    /// The open database, opening it again after an I/O error.
    fn db(&self) -> Result<Arc<Database>, StorageError> {
        if let Some(db) = self.db.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Ok(db.clone());
        }
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        if let Some(db) = slot.as_ref() {
            return Ok(db.clone());
        }
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(closed());
        }
        // Only a failure gave the database up: opening it again (a full
        // disk still full) is the store's I/O error too.
        let (db, wal, vlog) =
            open_db(&self.path, self.cache_bytes, &self.segments).map_err(|e| {
                StorageError::Unavailable(format!("storage I/O error: reopening the store: {e}"))
            })?;
        let db = Arc::new(db);
        self.reopened.fetch_add(1, Ordering::AcqRel);
        tracing::info!(path = %self.path.display(), "store reopened after an I/O error");
        *self.wal.lock().unwrap_or_else(|e| e.into_inner()) = Some(Durable::new((wal, vlog)));
        *slot = Some(db.clone());
        Ok(db)
    }

    /// Notes an error: an I/O failure poisons redb's handle, so drop it and
    /// let the next transaction open the file again.
    fn failed(&self, e: impl std::fmt::Display + IsIo) -> StorageError {
        if e.is_io() {
            tracing::error!(error = %e, "store I/O error; it is reopened on the next transaction");
            *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
            return StorageError::Unavailable(format!("storage I/O error: {e}"));
        }
        engine_err(e)
    }

    /// Gives up the open database after a failure that lost records redb had
    /// not committed: they are in the log, so the next transaction opens the
    /// database again, which replays them. The pending transaction is
    /// dropped first (redb keeps a database open while one lives).
    fn reopen_later(&self, slot: &mut Option<Durable>) {
        *slot = None;
        self.has_pending.store(false, Ordering::Release);
        *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The open database and the writer's lock, with the last write's
    /// changes settled (a change reads the table), and the pending redb
    /// transaction taken out of it: begun when there is none.
    ///
    /// A failure on another thread (a background settle's commit on a full
    /// disk) may give the store up between opening the database and taking
    /// the lock; the database is then opened again once, so this write
    /// meets the store's own state (the I/O error itself, on a disk still
    /// full) rather than a store that looks closed.
    #[allow(clippy::type_complexity)]
    fn lock_pending(
        &self,
    ) -> Result<(Arc<Database>, MutexGuard<'_, Option<Durable>>, Pending), StorageError> {
        for _ in 0..2 {
            let db = self.db()?;
            #[cfg(test)]
            if let Some(race) = self
                .before_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                race(self);
            }
            let mut slot = self.wal.lock().unwrap_or_else(|e| e.into_inner());
            self.settle_locked(&mut slot)?;
            let Some(durable) = slot.as_mut() else {
                continue;
            };
            let pending = match durable.pending.take() {
                Some(p) => p,
                None => {
                    let txn = db.begin_write().map_err(|e| self.failed(e))?;
                    Pending::begin(txn, &durable.vlog)?
                }
            };
            return Ok((db, slot, pending));
        }
        Err(self.given_up())
    }

    /// Why there is no open store: shut down, or given up after an I/O
    /// error (opened again by the next transaction).
    fn given_up(&self) -> StorageError {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return closed();
        }
        StorageError::Unavailable(
            "storage I/O error: the store was given up after an I/O error; \
             the next write opens it again"
                .into(),
        )
    }

    /// Gives up a change that was not logged. Its transaction is aborted,
    /// unless it also holds earlier, acknowledged groups: aborting would
    /// lose them with it, so the database is reopened instead, which
    /// replays them from the log.
    fn discard(
        &self,
        slot: &mut Option<Durable>,
        mut pending: Pending,
    ) -> Result<(), StorageError> {
        if pending.groups > 0 {
            drop(pending);
            self.reopen_later(slot);
            return Ok(());
        }
        if let Some(durable) = slot.as_mut() {
            durable.vlog.restore_live(std::mem::take(&mut pending.live));
        }
        pending.txn.abort().map_err(|e| self.failed(e))
    }

    /// Puts the last write's unsettled changes into the pending redb
    /// transaction. A failure gives up the database: the changes are in the
    /// log, so opening it again replays them.
    fn settle_locked(&self, slot: &mut Option<Durable>) -> Result<(), StorageError> {
        let Some(durable) = slot.as_mut() else {
            return Ok(());
        };
        let Some((log, from)) = durable.unsettled.take() else {
            return Ok(());
        };
        let applied = match durable.pending.as_ref() {
            Some(pending) => insert_into(&pending.txn, &mut durable.vlog, log.ops_from(from)),
            None => Err(engine_err("changes to settle without a transaction")),
        };
        durable.recycle(log);
        if let Err(e) = applied {
            tracing::error!(error = %e, "applying logged changes to redb failed; the store is reopened");
            self.reopen_later(slot);
            return Err(StorageError::Unavailable(format!("storage I/O error: {e}")));
        }
        Ok(())
    }

    /// Commits the records redb holds uncommitted, so a read sees them.
    fn flush(&self) -> Result<(), StorageError> {
        let mut slot = self.wal.lock().unwrap_or_else(|e| e.into_inner());
        self.commit_locked(&mut slot)
    }

    fn commit_locked(&self, slot: &mut Option<Durable>) -> Result<(), StorageError> {
        self.settle_locked(slot)?;
        let Some(durable) = slot.as_mut() else {
            return Ok(());
        };
        let Some(pending) = durable.pending.take() else {
            return Ok(());
        };
        let committed = pending.commit(&durable.vlog);
        // Cleared only once committed: a reader that sees it clear must
        // find every acknowledged record in redb.
        self.has_pending.store(false, Ordering::Release);
        if let Err(e) = committed {
            tracing::error!(error = %e, "redb commit failed; the store is reopened");
            self.reopen_later(slot);
            return Err(StorageError::Unavailable(format!("storage I/O error: {e}")));
        }
        Ok(())
    }
}

/// How much of a segment's entries a collection copies per turn of the
/// writer's lock: writes wait at most that long (a few milliseconds).
const COLLECT_BATCH_BYTES: usize = 1024 * 1024;

impl Embedded {
    /// Copies the values still live in sparse value-log segments to the
    /// open one; once a checkpoint has made the copies durable, deletes
    /// those segments. Returns how many were deleted.
    fn collect_values(&self) -> Result<usize, StorageError> {
        let generation = self.reopened.load(Ordering::Acquire);
        let sparse = {
            let slot = self.wal.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(d) => d.vlog.sparse(),
                None => return Ok(0),
            }
        };
        if sparse.is_empty() {
            return Ok(0);
        }
        let files = self.segments.files();
        let mut moved = 0usize;
        for &seg in &sparse {
            let mut at = 0;
            loop {
                let entries = vlog::read_entries(&files, seg, &mut at, COLLECT_BATCH_BYTES)?;
                if entries.is_empty() {
                    break;
                }
                moved += self.relocate(&entries)?;
            }
        }
        let db = self.db()?;
        let mut slot = self.wal.lock().unwrap_or_else(|e| e.into_inner());
        self.commit_locked(&mut slot)?;
        let Some(durable) = slot.as_mut() else {
            return Ok(0);
        };
        checkpoint(&db, durable)?;
        if self.reopened.load(Ordering::Acquire) != generation {
            // The copies may have gone with redb's uncommitted state.
            return Ok(0);
        }
        let removed = durable.vlog.remove_segments(&sparse)?;
        durable.vlog.publish();
        metrics::counter!("kshard_storage_value_log_collected_segments_total")
            .increment(removed as u64);
        metrics::counter!("kshard_storage_value_log_moved_values_total").increment(moved as u64);
        tracing::info!(segments = removed, values = moved, "value log collected");
        Ok(removed)
    }

    /// Copies the entries redb still points at to the open segment and
    /// points there; returns how many.
    fn relocate(&self, entries: &[vlog::Entry]) -> Result<usize, StorageError> {
        let (_db, mut slot, mut pending) = self.lock_pending()?;
        let durable = slot.as_mut().ok_or_else(|| self.given_up())?;
        let values = &mut durable.vlog;
        let copied = (|| {
            let mut table = pending.txn.open_table(KV).map_err(engine_err)?;
            let mut stored = Vec::new();
            let mut n = 0;
            for e in entries {
                let live = table
                    .get(e.key.as_slice())
                    .map_err(txn_err)?
                    .is_some_and(|raw| vlog::points_at(raw.value(), e.pointer));
                if !live {
                    continue;
                }
                if crc32fast::hash(&e.value) != e.pointer.crc {
                    return Err(engine_err(format!(
                        "value log segment {} at {}: checksum mismatch",
                        e.pointer.seg, e.pointer.off
                    )));
                }
                values.encode(&e.key, &e.value, &mut stored)?;
                if let Some(old) = table
                    .insert(e.key.as_slice(), stored.as_slice())
                    .map_err(txn_err)?
                {
                    values.forget(old.value());
                }
                n += 1;
            }
            values.write_out()?;
            Ok(n)
        })();
        match copied {
            Ok(n) => {
                pending.groups += 1;
                durable.pending = Some(pending);
                self.has_pending.store(true, Ordering::Release);
                Ok(n)
            }
            Err(e) => {
                drop(pending);
                self.reopen_later(&mut slot);
                Err(e)
            }
        }
    }
}

fn closed() -> StorageError {
    StorageError::Unavailable("the store is closed".into())
}

/// The database file's name in a data directory.
pub const STORE_FILE: &str = "store.redb";

/// Removes a closed database, its log and its value log, if there.
pub fn remove_database(path: &Path) -> std::io::Result<()> {
    for p in [wal_path(path), path.to_path_buf()] {
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    for dir in vlog::dirs_of(path)? {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// Puts the database at `from` (closed cleanly: its log holds nothing redb
/// lacks) in place of the one at `to`, whose log goes first: its records
/// must never be replayed onto the new database, whose log epoch they may
/// share. The rename is atomic: `to` is the old database or the new one.
/// The new database's value log moves beside `to` first, under its own
/// nonce: until the rename the old database ignores it (and removes it
/// when opened), after it the old one's is removed when the new one opens.
pub fn replace_database(from: &Path, to: &Path) -> std::io::Result<()> {
    for dir in vlog::dirs_of(from)? {
        let (Some(name), Some(from_name), Some(to_name)) =
            (dir.file_name(), from.file_name(), to.file_name())
        else {
            continue;
        };
        let nonce = name
            .to_string_lossy()
            .strip_prefix(from_name.to_string_lossy().as_ref())
            .map(str::to_owned)
            .unwrap_or_default();
        let mut target = to_name.to_owned();
        target.push(&nonce);
        std::fs::rename(&dir, to.with_file_name(target))?;
    }
    match std::fs::remove_file(wal_path(from)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    match std::fs::remove_file(wal_path(to)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::rename(from, to)?;
    if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The log beside the database file.
fn wal_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".wal");
    PathBuf::from(p)
}

fn open_db(
    path: &Path,
    cache_bytes: usize,
    segments: &Arc<Segments>,
) -> Result<(Database, Wal, Appender), StorageError> {
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(engine_err)?;
    // Make sure the tables exist so that read transactions can open them
    // (without a write when they do: reopening on a full disk must not need one).
    let read = db.begin_read().map_err(engine_err)?;
    let (mut epoch, mut nonce, mut seg, mut end) = (None, None, 0, 0);
    if let Ok(meta) = read.open_table(META) {
        let get = |key: &str| -> Result<Option<u64>, StorageError> {
            Ok(meta.get(key).map_err(engine_err)?.map(|v| v.value()))
        };
        epoch = get(WAL_EPOCH)?;
        nonce = get(VLOG_NONCE)?;
        seg = get(VLOG_SEG)?.unwrap_or(0);
        end = get(VLOG_END)?.unwrap_or(0);
    }
    let mut live = std::collections::BTreeMap::new();
    if let Ok(table) = read.open_table(VLOG_LIVE) {
        for entry in table.iter().map_err(engine_err)? {
            let (s, bytes) = entry.map_err(engine_err)?;
            live.insert(s.value(), bytes.value());
        }
    }
    let old_format = read.open_table(OLD_KV).is_ok();
    let exists = read.open_table(KV).is_ok() && epoch.is_some() && nonce.is_some();
    drop(read);
    if old_format {
        move_old_table(&db)?;
    }
    let nonce = match nonce.filter(|_| exists) {
        Some(n) => n,
        None => {
            let n = new_nonce();
            let txn = db.begin_write().map_err(engine_err)?;
            txn.open_table(KV).map_err(engine_err)?;
            txn.open_table(VLOG_LIVE).map_err(engine_err)?;
            {
                let mut meta = txn.open_table(META).map_err(engine_err)?;
                // A store from before the value log keeps its log epoch.
                meta.insert(WAL_EPOCH, epoch.unwrap_or(0))
                    .map_err(engine_err)?;
                meta.insert(VLOG_NONCE, n).map_err(engine_err)?;
                meta.insert(VLOG_SEG, 0).map_err(engine_err)?;
                meta.insert(VLOG_END, 0).map_err(engine_err)?;
            }
            txn.commit().map_err(engine_err)?;
            (seg, end) = (0, 0);
            live.clear();
            n
        }
    };
    let dir = vlog::dir_of(path, nonce);
    // Another nonce's directory is a replaced database's, or one that
    // never got a commit.
    for other in vlog::dirs_of(path).map_err(|e| engine_err(format!("value log: {e}")))? {
        if other != dir {
            std::fs::remove_dir_all(&other).map_err(|e| {
                StorageError::Unavailable(format!("removing {}: {e}", other.display()))
            })?;
        }
    }
    let state = vlog::State {
        seg: u32::try_from(seg).map_err(|_| engine_err("value log segment out of range"))?,
        end,
        live,
    };
    let mut values = Appender::open(&dir, state, segments.clone())?;
    let epoch = epoch.unwrap_or(0);
    let wal_file = wal_path(path);
    let (mut wal, records) = Wal::open(&wal_file, epoch).map_err(|e| {
        StorageError::Unavailable(format!("write-ahead log {}: {e}", wal_file.display()))
    })?;
    if !records.is_empty() {
        // Records after redb's last durable commit: apply them and take a
        // checkpoint, so they are never replayed twice over newer writes.
        let txn = db.begin_write().map_err(engine_err)?;
        {
            let mut table = txn.open_table(KV).map_err(engine_err)?;
            let ops = records.iter().flatten().map(|op| match op {
                wal::Op::Put(k, v) => OpRef::Put(k, v),
                wal::Op::Delete(k) => OpRef::Delete(k),
            });
            insert_all(&mut table, &mut values, ops)?;
        }
        values.sync()?;
        record_vlog(&txn, &values)?;
        txn.open_table(META)
            .map_err(engine_err)?
            .insert(WAL_EPOCH, epoch + 1)
            .map_err(engine_err)?;
        txn.commit().map_err(engine_err)?;
        tracing::info!(records = records.len(), "replayed the write-ahead log");
        wal.restart(epoch + 1);
    }
    Ok((db, wal, values))
}

/// A value-log directory name no other database here has had.
fn new_nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// Moves a store written before the value log into the tagged table, a
/// batch per commit (each one atomic, so a crash resumes where it was).
/// Its values stay inline.
fn move_old_table(db: &Database) -> Result<(), StorageError> {
    const BATCH: usize = 4096;
    let mut moved = 0usize;
    loop {
        let txn = db.begin_write().map_err(engine_err)?;
        let n = {
            let mut old = txn.open_table(OLD_KV).map_err(engine_err)?;
            let mut new = txn.open_table(KV).map_err(engine_err)?;
            let mut batch = Vec::with_capacity(BATCH);
            for entry in old.iter().map_err(engine_err)?.take(BATCH) {
                let (k, v) = entry.map_err(engine_err)?;
                batch.push((k.value().to_vec(), v.value().to_vec()));
            }
            let mut tagged = Vec::new();
            for (k, v) in &batch {
                vlog::inline(v, &mut tagged);
                new.insert(k.as_slice(), tagged.as_slice())
                    .map_err(engine_err)?;
                old.remove(k.as_slice()).map_err(engine_err)?;
            }
            batch.len()
        };
        if n == 0 {
            txn.delete_table(OLD_KV).map_err(engine_err)?;
        }
        txn.commit().map_err(engine_err)?;
        moved += n;
        if n == 0 {
            break;
        }
    }
    tracing::info!(
        keys = moved,
        "moved a store from before the value log into its new table"
    );
    Ok(())
}

/// Records where the value log ends and what its segments hold live, in
/// the commit that holds the pointers.
fn record_vlog(txn: &redb::WriteTransaction, values: &Appender) -> Result<(), StorageError> {
    let state = values.state();
    values.publish();
    {
        let mut meta = txn.open_table(META).map_err(engine_err)?;
        meta.insert(VLOG_SEG, u64::from(state.seg))
            .map_err(engine_err)?;
        meta.insert(VLOG_END, state.end).map_err(engine_err)?;
    }
    let mut live = txn.open_table(VLOG_LIVE).map_err(engine_err)?;
    live.retain(|_, _| false).map_err(engine_err)?;
    for (seg, bytes) in &state.live {
        live.insert(seg, bytes).map_err(engine_err)?;
    }
    Ok(())
}

/// Whether a redb error means the file could not be read or written.
trait IsIo {
    fn is_io(&self) -> bool;
}

impl IsIo for redb::StorageError {
    fn is_io(&self) -> bool {
        matches!(
            self,
            redb::StorageError::Io(_) | redb::StorageError::PreviousIo
        )
    }
}

impl IsIo for redb::CommitError {
    fn is_io(&self) -> bool {
        matches!(self, redb::CommitError::Storage(e) if e.is_io())
    }
}

impl IsIo for redb::TransactionError {
    fn is_io(&self) -> bool {
        matches!(self, redb::TransactionError::Storage(e) if e.is_io())
    }
}

impl IsIo for redb::TableError {
    fn is_io(&self) -> bool {
        matches!(self, redb::TableError::Storage(e) if e.is_io())
    }
}

struct Reader {
    table: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    /// The value log's segments as they were when the read began.
    files: vlog::Files,
}

/// Visits the stored form (inline value or pointer) of each entry of
/// `table` in `start..end`, in key order, until `visit` breaks.
fn walk_table<T: ReadableTable<&'static [u8], &'static [u8]>>(
    table: &T,
    start: &[u8],
    end: &[u8],
    mut visit: impl FnMut(&[u8], vlog::Stored<'_>) -> Result<ControlFlow<()>, StorageError>,
) -> Result<(), StorageError> {
    for entry in table.range::<&[u8]>(start..end).map_err(engine_err)? {
        let (k, v) = entry.map_err(engine_err)?;
        if visit(k.value(), vlog::stored(v.value())?)?.is_break() {
            break;
        }
    }
    Ok(())
}

fn scan_table<T: ReadableTable<&'static [u8], &'static [u8]>>(
    table: &T,
    files: &vlog::Files,
    start: &[u8],
    end: &[u8],
    visit: &mut Visitor<'_>,
) -> Result<(), StorageError> {
    let mut buf = Vec::new();
    walk_table(table, start, end, |key, stored| {
        let value = match stored {
            vlog::Stored::Inline(value) => value,
            vlog::Stored::Pointer(p) => {
                vlog::read(files, p, &mut buf)?;
                &buf
            }
        };
        Ok(visit(key, value))
    })
}

impl ReadTxn for Reader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.table.get(key).map_err(engine_err)? {
            Some(v) => Ok(Some(vlog::resolve(&self.files, v.value())?)),
            None => Ok(None),
        }
    }
    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        scan_table(&self.table, &self.files, start, end, visit)
    }
    fn scan_lengths(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut LengthVisitor<'_>,
    ) -> Result<(), StorageError> {
        // A pointer holds the value's length: nothing is read from the log.
        walk_table(&self.table, start, end, |key, stored| {
            Ok(visit(
                key,
                match stored {
                    vlog::Stored::Inline(value) => value.len(),
                    vlog::Stored::Pointer(p) => p.len as usize,
                },
            ))
        })
    }
}

/// Puts writes into redb's table, large values through the value log.
fn insert_all<'a>(
    table: &mut KvTable<'_>,
    values: &mut Appender,
    ops: impl Iterator<Item = OpRef<'a>>,
) -> Result<(), StorageError> {
    let mut stored = Vec::with_capacity(32);
    for op in ops {
        match op {
            OpRef::Put(k, v) => {
                values.encode(k, v, &mut stored)?;
                if let Some(old) = table.insert(k, stored.as_slice()).map_err(txn_err)? {
                    values.forget(old.value());
                }
            }
            OpRef::Delete(k) => {
                if let Some(old) = table.remove(k).map_err(txn_err)? {
                    values.forget(old.value());
                }
            }
        }
    }
    // Before anything can read the pointers.
    values.write_out()
}

/// Puts a payload's writes into the transaction's table.
fn insert_into(
    txn: &redb::WriteTransaction,
    values: &mut Appender,
    ops: wal::OpRefs<'_>,
) -> Result<(), StorageError> {
    let mut table = txn.open_table(KV).map_err(engine_err)?;
    insert_all(&mut table, values, ops)
}

type KvTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// A write transaction whose changes go to the log payload first and reach
/// redb's table later (see the module's comment).
struct Writer<'t> {
    /// A cell because a scan, which reads, first settles the changes.
    table: RefCell<KvTable<'t>>,
    /// The transaction's writes, for the log.
    log: Payload,
    /// How much of `log` is in `table` already.
    in_table: Cell<usize>,
    /// The value log, which settling appends to.
    values: RefCell<&'t mut Appender>,
    segments: &'t Segments,
}

impl Writer<'_> {
    /// Puts the changes not yet in the table there.
    fn settle(&self) -> Result<(), StorageError> {
        let mut table = self
            .table
            .try_borrow_mut()
            .map_err(|_| engine_err("table in use"))?;
        let mut values = self
            .values
            .try_borrow_mut()
            .map_err(|_| engine_err("value log in use"))?;
        insert_all(
            &mut table,
            &mut values,
            self.log.ops_from(self.in_table.get()),
        )?;
        self.in_table.set(self.log.len());
        Ok(())
    }

    fn after_change(&self) -> Result<(), StorageError> {
        if self.log.len() - self.in_table.get() > UNSETTLED_BYTES {
            self.settle()?;
        }
        Ok(())
    }
}

impl ReadTxn for Writer<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(change) = self.log.last_write(self.in_table.get(), key) {
            return Ok(change.map(<[u8]>::to_vec));
        }
        let table = self
            .table
            .try_borrow()
            .map_err(|_| engine_err("table in use"))?;
        // An I/O failure here (a full disk) is the store's, as in a commit.
        let value = table.get(key).map_err(txn_err)?;
        match value {
            Some(v) => Ok(Some(vlog::resolve(&self.segments.files(), v.value())?)),
            None => Ok(None),
        }
    }
    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        // A scan sees the changes by finding them in the table.
        self.settle()?;
        let table = self
            .table
            .try_borrow()
            .map_err(|_| engine_err("table in use"))?;
        scan_table(&*table, &self.segments.files(), start, end, visit)
    }
}

impl WriteTxn for Writer<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.log.put(key, value);
        self.after_change()
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StorageError> {
        self.log.delete(key);
        self.after_change()
    }
}

impl Engine for Embedded {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn read(&self) -> Result<Box<dyn ReadTxn + '_>, StorageError> {
        // Every write acknowledged before this read is in the log and in
        // the pending transaction (set before the write returned).
        if self.has_pending.load(Ordering::Acquire) {
            self.flush()?;
        }
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| self.failed(e))?;
        let table = txn.open_table(KV).map_err(|e| self.failed(e))?;
        // After the read began: a segment its pointers need is listed.
        let files = self.segments.files();
        Ok(Box::new(Reader { table, files }))
    }

    fn close(&self) {
        // A checkpoint, so that the next start has nothing to replay.
        if let Err(e) = self.flush() {
            tracing::warn!(error = %e, "no commit at shutdown; the log is replayed at start");
        }
        if let Some(db) = self.db.read().unwrap_or_else(|e| e.into_inner()).clone() {
            let mut slot = self.wal.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(d) = slot.as_mut().filter(|d| d.wal.len() > 0) {
                if let Err(e) = checkpoint(&db, d) {
                    tracing::warn!(error = %e, "no checkpoint at shutdown; the log is replayed at start");
                }
            }
        }
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        // The file is released (cleanly) when the last transaction holding it ends.
        *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn write(&self, f: &mut WriteFn<'_>) -> Result<(), StorageError> {
        // One writer at a time, as redb has anyway; the log follows its order.
        let (db, mut slot, mut pending) = self.lock_pending()?;
        let durable = slot.as_mut().ok_or_else(|| self.given_up())?;
        let applied = {
            match pending.txn.open_table(KV) {
                Err(e) => Err(self.failed(e)),
                Ok(table) => {
                    let mut writer = Writer {
                        table: RefCell::new(table),
                        log: Payload::with_buffer(std::mem::take(&mut durable.spare)),
                        in_table: Cell::new(0),
                        values: RefCell::new(&mut durable.vlog),
                        segments: &self.segments,
                    };
                    f(&mut writer).map(|()| (writer.log, writer.in_table.get()))
                }
            }
        };
        let (mut log, in_table) = match applied {
            Ok(written) => written,
            Err(e) => {
                if pending.groups == 0 && matches!(e, StorageError::Unavailable(_)) {
                    *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
                }
                self.discard(&mut slot, pending)?;
                return Err(e);
            }
        };
        if log.is_empty() {
            durable.pending = Some(pending);
            return Ok(());
        }
        if let Err(e) = durable.wal.append(&mut log) {
            // Not acknowledged: the next record is written over whatever part
            // of it reached the file. redb's copy must go too.
            tracing::error!(error = %e, "write-ahead log append failed");
            self.discard(&mut slot, pending)?;
            return Err(match e {
                wal::AppendError::NotWritten(e) => {
                    StorageError::Unavailable(format!("storage I/O error: {e}"))
                }
                // A restart before the next record could replay this one.
                wal::AppendError::MaybeWritten(e) => StorageError::OutcomeUnknown(format!(
                    "storage I/O error: {e}; the write-ahead log may hold the write"
                )),
            });
        }
        pending.groups += 1;
        pending.bytes += log.len() as u64;
        let checkpoint_due = durable.wal.len() >= wal::CHECKPOINT_BYTES;
        if pending.groups < PENDING_GROUPS && pending.bytes < PENDING_BYTES && !checkpoint_due {
            durable.pending = Some(pending);
            if in_table < log.len() {
                durable.unsettled = Some((log, in_table));
            }
            self.has_pending.store(true, Ordering::Release);
            return Ok(());
        }
        let committed = insert_into(&pending.txn, &mut durable.vlog, log.ops_from(in_table))
            .and_then(|()| {
                #[cfg(test)]
                if self.fail_commit.swap(false, Ordering::AcqRel) {
                    return Err(engine_err("No space left on device (injected)"));
                }
                pending.commit(&durable.vlog)
            });
        durable.recycle(log);
        self.has_pending.store(false, Ordering::Release);
        if let Err(e) = committed {
            // The records, this write's too, are durable in the log: the
            // writes happened, and answering an error would be a lie (the
            // write appears once the database is opened again, which
            // replays them on the next transaction, or after a restart).
            tracing::error!(error = %e, "redb commit failed after the log; the store is reopened");
            self.reopen_later(&mut slot);
            return Ok(());
        }
        if checkpoint_due {
            if let Err(e) = checkpoint(&db, durable) {
                // The log keeps growing and the next write tries again.
                tracing::warn!(error = %e, "checkpoint failed");
            }
        }
        Ok(())
    }

    fn after_compaction(&self) -> Result<(), StorageError> {
        self.collect_values().map(|_| ())
    }

    fn settle(&self) {
        // Whoever holds the lock is writing or reading, and settles first:
        // waiting here could hold a runtime worker for a whole sync.
        let mut slot = match self.wal.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        // A failure is logged and gives up the database; the next
        // transaction opens it again.
        let _ = self.settle_locked(&mut slot);
    }

    fn quick_write(&self) -> bool {
        // A write under way (the lock taken) makes the next one wait: not quick.
        match self.wal.try_lock() {
            Ok(slot) => slot.as_ref().is_some_and(next_is_quick),
            Err(_) => false,
        }
    }
}

/// Whether a small write after this point is only a log append with a fast
/// sync: the last sync was fast and neither a redb commit, a checkpoint nor
/// the log's growth falls due with it.
fn next_is_quick(durable: &Durable) -> bool {
    let wal = &durable.wal;
    let pending_ok = durable
        .pending
        .as_ref()
        .is_none_or(|p| p.groups + 1 < PENDING_GROUPS && p.bytes + QUICK_RECORD < PENDING_BYTES);
    wal.last_sync() <= QUICK_SYNC
        && wal.fits(QUICK_RECORD)
        && wal.len() + QUICK_RECORD < wal::CHECKPOINT_BYTES
        && pending_ok
}

/// A durable redb commit that records the next log epoch: every record so
/// far is then in redb, and the log starts over.
/// The value log's bytes go to disk first: the commit makes durable every
/// pointer redb holds.
fn checkpoint(db: &Database, durable: &mut Durable) -> Result<(), StorageError> {
    let wal = &mut durable.wal;
    let next = wal.epoch() + 1;
    durable.vlog.sync()?;
    let txn = db.begin_write().map_err(engine_err)?;
    record_vlog(&txn, &durable.vlog)?;
    txn.open_table(META)
        .map_err(engine_err)?
        .insert(WAL_EPOCH, next)
        .map_err(engine_err)?;
    txn.commit().map_err(engine_err)?;
    tracing::debug!(log = %wal.path().display(), bytes = wal.len(), "checkpoint");
    wal.restart(next);
    Ok(())
}

/// A redb error inside a transaction: I/O failures are `Unavailable`.
fn txn_err(e: redb::StorageError) -> StorageError {
    if e.is_io() {
        StorageError::Unavailable(format!("storage I/O error: {e}"))
    } else {
        engine_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(e: &Embedded, k: &str, v: &[u8]) {
        e.write(&mut |txn| txn.put(k.as_bytes(), v)).expect("write");
    }

    fn get(e: &Embedded, k: &str) -> Option<Vec<u8>> {
        e.read().expect("read").get(k.as_bytes()).expect("get")
    }

    /// The files as a crash would leave them: copied while the database is
    /// open, with no shutdown.
    fn crash_copy(from: &Path, to: &Path) {
        std::fs::copy(from, to).expect("copy db");
        std::fs::copy(wal_path(from), wal_path(to)).expect("copy log");
        for dir in vlog::dirs_of(from).expect("value log dirs") {
            let name = dir
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            let nonce = name.rsplit_once(".vlog-").expect("nonce").1;
            let target = vlog::dirs_of(to)
                .expect("dirs")
                .into_iter()
                .next()
                .unwrap_or_else(|| {
                    let mut p = to.as_os_str().to_owned();
                    p.push(format!(".vlog-{nonce}"));
                    PathBuf::from(p)
                });
            let _ = std::fs::remove_dir_all(&target);
            let mut p = to.as_os_str().to_owned();
            p.push(format!(".vlog-{nonce}"));
            let target = PathBuf::from(p);
            std::fs::create_dir_all(&target).expect("mkdir");
            for f in std::fs::read_dir(&dir).expect("list") {
                let f = f.expect("entry");
                std::fs::copy(f.path(), target.join(f.file_name())).expect("copy segment");
            }
        }
    }

    #[test]
    fn a_crash_keeps_every_committed_write_through_the_log() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        for i in 0..200 {
            put(&e, &format!("k{i}"), &[i as u8; 500]);
        }
        e.write(&mut |txn| txn.delete(b"k7")).expect("delete");
        crash_copy(&path, &copy);
        // Every transaction is in the log, none yet checkpointed.
        let log = wal_path(&path);
        let (_, records) = Wal::open(&log, 0).expect("log");
        assert_eq!(records.len(), 201);

        let r = Embedded::open(&copy).expect("reopen after the crash");
        for i in 0..200 {
            let want = (i != 7).then(|| vec![i as u8; 500]);
            assert_eq!(get(&r, &format!("k{i}")), want, "k{i}");
        }
        // The replay was checkpointed: a second crash replays nothing twice.
        put(&r, "after", b"1");
        r.close();
        let r = Embedded::open(&copy).expect("open again");
        assert_eq!(get(&r, "k5"), Some(vec![5; 500]));
        assert_eq!(get(&r, "k7"), None);
        assert_eq!(get(&r, "after"), Some(b"1".to_vec()));
    }

    /// A redb commit that fails after the log (a full disk) leaves the
    /// write stored: it is acknowledged, not refused, and it is there once
    /// the database is opened again, and after a restart.
    #[test]
    fn a_write_whose_redb_commit_fails_after_the_log_is_acknowledged() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        // The last write of a shared redb transaction commits it.
        for i in 0..PENDING_GROUPS - 1 {
            put(&e, &format!("k{i}"), b"v");
        }
        e.fail_commit.store(true, Ordering::Release);
        let last = e.write(&mut |txn| txn.put(b"last", b"stored"));
        assert!(last.is_ok(), "a durable write was refused: {last:?}");
        // The next transaction opens the database again, replaying the log.
        assert_eq!(get(&e, "last"), Some(b"stored".to_vec()));
        assert_eq!(get(&e, "k0"), Some(b"v".to_vec()));
        crash_copy(&path, &copy);
        let r = Embedded::open(&copy).expect("reopen");
        assert_eq!(get(&r, "last"), Some(b"stored".to_vec()));
    }

    /// Another thread's failure (a background settle on a full disk) gives
    /// the store up after this write opened the database and before it took
    /// the lock: the write opens the store again and is stored, rather than
    /// failing as if the store were shut down.
    #[test]
    fn a_write_racing_a_failure_elsewhere_opens_the_store_again() {
        let dir = tempfile::tempdir().expect("dir");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        put(&e, "before", b"1");
        *e.before_lock.lock().expect("hook") = Some(|e: &Embedded| {
            let mut slot = e.wal.lock().expect("wal");
            e.reopen_later(&mut slot);
        });
        let raced = e.write(&mut |txn| txn.put(b"raced", b"2"));
        assert!(raced.is_ok(), "{raced:?}");
        assert!(
            e.before_lock.lock().expect("hook").is_none(),
            "the race ran"
        );
        assert_eq!(e.reopened.load(Ordering::Acquire), 1, "opened again");
        assert_eq!(get(&e, "raced"), Some(b"2".to_vec()));
        assert_eq!(get(&e, "before"), Some(b"1".to_vec()));
    }

    #[test]
    fn a_checkpoint_restarts_the_log_and_later_writes_still_replay() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        // Past one checkpoint's worth of log.
        let big = vec![3u8; 64 * 1024];
        let n = (wal::CHECKPOINT_BYTES / big.len() as u64) as usize + 10;
        for i in 0..n {
            put(&e, &format!("big{i}"), &big);
        }
        let epoch = e.wal.lock().expect("wal").as_ref().map(|d| d.wal.epoch());
        assert_eq!(epoch, Some(1), "one checkpoint taken");
        put(&e, "last", b"x");
        crash_copy(&path, &copy);
        let r = Embedded::open(&copy).expect("reopen");
        for i in 0..n {
            assert_eq!(
                get(&r, &format!("big{i}")).map(|v| v.len()),
                Some(big.len())
            );
        }
        assert_eq!(get(&r, "last"), Some(b"x".to_vec()));
    }

    #[test]
    fn writes_share_one_redb_commit_and_a_read_commits_them_first() {
        let dir = tempfile::tempdir().expect("dir");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        for i in 0..3 {
            put(&e, &format!("k{i}"), b"v");
        }
        assert!(
            e.has_pending.load(Ordering::Acquire),
            "the three writes wait in one uncommitted redb transaction"
        );
        assert_eq!(get(&e, "k2"), Some(b"v".to_vec()), "a read sees them");
        assert!(
            !e.has_pending.load(Ordering::Acquire),
            "the read committed them"
        );
        // A full share is committed by the write that fills it.
        for i in 0..PENDING_GROUPS {
            put(&e, &format!("n{i}"), b"w");
        }
        assert!(!e.has_pending.load(Ordering::Acquire));
        assert_eq!(get(&e, "n0"), Some(b"w".to_vec()));
    }

    #[test]
    fn only_a_plain_append_with_a_fast_sync_is_quick() {
        let dir = tempfile::tempdir().expect("dir");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        assert!(!e.quick_write(), "no sync measured yet");
        put(&e, "a", b"1");
        let pretend = |d: std::time::Duration| {
            if let Some(durable) = e.wal.lock().expect("wal").as_mut() {
                durable.wal.pretend_last_sync(d);
            }
        };
        pretend(std::time::Duration::from_micros(100));
        assert!(e.quick_write(), "an SSD's sync, nothing else due");
        pretend(std::time::Duration::from_millis(5));
        assert!(!e.quick_write(), "a disk's sync");
        pretend(std::time::Duration::from_micros(100));
        // The write that fills the pending redb transaction commits it.
        for i in 1..PENDING_GROUPS - 1 {
            put(&e, &format!("k{i}"), b"v");
            pretend(std::time::Duration::from_micros(100));
        }
        assert!(!e.quick_write(), "the next write commits redb");
        put(&e, "last", b"v");
        pretend(std::time::Duration::from_micros(100));
        assert!(!e.has_pending.load(Ordering::Acquire), "committed");
        assert!(e.quick_write(), "a fresh transaction follows");
    }

    /// How many bytes of the last write's changes wait outside redb.
    fn unsettled(e: &Embedded) -> usize {
        let slot = e.wal.lock().expect("wal");
        let unsettled = slot.as_ref().and_then(|d| d.unsettled.as_ref());
        unsettled.map_or(0, |(log, from)| log.len() - from)
    }

    #[test]
    fn a_write_reaches_redb_after_its_log_and_is_seen_all_along() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        put(&e, "gone", b"0");
        // Inside one write, its reads see its own changes, newest first.
        e.write(&mut |txn| {
            txn.put(b"a", b"1")?;
            txn.put(b"a", b"2")?;
            txn.delete(b"gone")?;
            assert_eq!(txn.get(b"a")?, Some(b"2".to_vec()));
            assert_eq!(txn.get(b"gone")?, None);
            // A scan finds them too.
            let mut seen = Vec::new();
            txn.scan(b"a", b"z", &mut |k, v| {
                seen.push((k.to_vec(), v.to_vec()));
                ControlFlow::Continue(())
            })?;
            assert_eq!(seen, vec![(b"a".to_vec(), b"2".to_vec())]);
            txn.put(b"b", b"3")
        })
        .expect("write");
        // Acknowledged with `b` outside redb (put after the scan).
        assert!(unsettled(&e) > 0, "the last change waits");
        // A crash now loses nothing: the log has it.
        crash_copy(&path, &copy);
        // The next write sees it, and leaves only its own waiting.
        e.write(&mut |txn| {
            assert_eq!(txn.get(b"b")?, Some(b"3".to_vec()));
            txn.put(b"c", b"4")
        })
        .expect("write");
        e.settle();
        assert_eq!(unsettled(&e), 0, "settled");
        assert!(e.has_pending.load(Ordering::Acquire), "still uncommitted");
        put(&e, "d", b"5");
        // A read commits everything acknowledged, settled or not.
        assert_eq!(get(&e, "d"), Some(b"5".to_vec()));
        assert_eq!(get(&e, "a"), Some(b"2".to_vec()));
        assert_eq!(get(&e, "gone"), None);
        let r = Embedded::open(&copy).expect("reopen after the crash");
        assert_eq!(get(&r, "b"), Some(b"3".to_vec()));
        assert_eq!(get(&r, "gone"), None);
    }

    #[test]
    fn large_changes_go_into_redb_as_they_are_made() {
        let dir = tempfile::tempdir().expect("dir");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        let big = vec![7u8; UNSETTLED_BYTES + 1];
        e.write(&mut |txn| {
            txn.put(b"big", &big)?;
            txn.put(b"small", b"1")
        })
        .expect("write");
        assert!(
            unsettled(&e) < 64,
            "only the change after the large one waits: {}",
            unsettled(&e)
        );
        assert_eq!(get(&e, "big").map(|v| v.len()), Some(big.len()));
        assert_eq!(get(&e, "small"), Some(b"1".to_vec()));
    }

    #[test]
    fn a_clean_shutdown_leaves_nothing_to_replay() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("db");
        let e = Embedded::open(&path).expect("open");
        put(&e, "a", b"1");
        e.close();
        drop(e);
        let (_, records) = Wal::open(&wal_path(&path), 1).expect("log");
        assert!(records.is_empty());
        let r = Embedded::open(&path).expect("reopen");
        assert_eq!(get(&r, "a"), Some(b"1".to_vec()));
    }

    /// Every segment file of the database at `path`: (name, bytes).
    fn segment_files(path: &Path) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for dir in vlog::dirs_of(path).expect("dirs") {
            for f in std::fs::read_dir(dir).expect("list") {
                let f = f.expect("entry");
                let len = f.metadata().expect("meta").len();
                out.push((f.file_name().to_string_lossy().into_owned(), len));
            }
        }
        out.sort();
        out
    }

    fn value(i: usize, version: u8) -> Vec<u8> {
        let mut v = format!("{{\"i\":{i},\"v\":{version},\"pad\":\"").into_bytes();
        v.resize(1500, b'x' ^ version);
        v
    }

    #[test]
    fn large_values_live_in_the_value_log_and_redb_holds_pointers() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("db");
        let e = Embedded::open(&path).expect("open");
        put(&e, "big", &value(1, 1));
        put(&e, "small", b"tiny");
        assert_eq!(get(&e, "big"), Some(value(1, 1)));
        assert_eq!(get(&e, "small"), Some(b"tiny".to_vec()));
        let db = e.db().expect("db");
        let read = db.begin_read().expect("read");
        let table = read.open_table(KV).expect("table");
        let raw = |k: &str| {
            table
                .get(k.as_bytes())
                .expect("get")
                .expect("there")
                .value()
                .to_vec()
        };
        assert_eq!(raw("big").len(), 17, "redb holds a pointer");
        assert!(matches!(
            vlog::stored(&raw("small")),
            Ok(vlog::Stored::Inline(b"tiny"))
        ));
        let files = segment_files(&path);
        assert_eq!(files.len(), 1);
        assert!(files[0].1 >= 1500, "the value is in the segment: {files:?}");
        // A scan reads values from both places, in key order.
        let mut seen = Vec::new();
        e.read()
            .expect("read")
            .scan(b"a", b"z", &mut |k, v| {
                seen.push((k.to_vec(), v.to_vec()));
                ControlFlow::Continue(())
            })
            .expect("scan");
        assert_eq!(
            seen,
            vec![
                (b"big".to_vec(), value(1, 1)),
                (b"small".to_vec(), b"tiny".to_vec())
            ]
        );
    }

    /// The value log is written without a sync: a crash may lose what it
    /// got since the last checkpoint, and the write-ahead log brings it back.
    #[test]
    fn a_crash_that_loses_the_value_logs_unsynced_bytes_loses_no_write() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        for i in 0..100 {
            put(&e, &format!("k{i:03}"), &value(i, 1));
        }
        // Read once (a redb commit, not durable), then change some more.
        assert_eq!(get(&e, "k000"), Some(value(0, 1)));
        for i in 0..10 {
            put(&e, &format!("k{i:03}"), &value(i, 2));
        }
        crash_copy(&path, &copy);
        for d in vlog::dirs_of(&copy).expect("dirs") {
            for f in std::fs::read_dir(d).expect("list") {
                let f = f.expect("entry");
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(f.path())
                    .and_then(|f| f.set_len(0))
                    .expect("lose the unsynced bytes");
            }
        }
        let r = Embedded::open(&copy).expect("reopen after the crash");
        for i in 0..100 {
            let want = value(i, if i < 10 { 2 } else { 1 });
            assert_eq!(get(&r, &format!("k{i:03}")), Some(want), "k{i}");
        }
    }

    #[test]
    fn collection_moves_live_values_and_deletes_sparse_segments() {
        let dir = tempfile::tempdir().expect("dir");
        let (path, copy) = (dir.path().join("db"), dir.path().join("crashed"));
        let e = Embedded::open(&path).expect("open");
        // About six segments' worth, then most of it replaced or deleted.
        let n = 1000;
        for i in 0..n {
            put(&e, &format!("k{i:04}"), &value(i, 1));
        }
        for i in 0..n {
            match i % 10 {
                0 => {}
                1..=6 => put(&e, &format!("k{i:04}"), &value(i, 2)),
                _ => e
                    .write(&mut |txn| txn.delete(format!("k{i:04}").as_bytes()))
                    .expect("delete"),
            }
        }
        let before = segment_files(&path);
        let bytes = |files: &[(String, u64)]| files.iter().map(|f| f.1).sum::<u64>();
        let removed = e.collect_values().expect("collect");
        let after = segment_files(&path);
        assert!(removed >= 3, "{removed} removed of {before:?}");
        assert!(
            bytes(&after) < bytes(&before) * 3 / 4,
            "{} bytes before, {} after",
            bytes(&before),
            bytes(&after)
        );
        let want = |i: usize| match i % 10 {
            0 => Some(value(i, 1)),
            1..=6 => Some(value(i, 2)),
            _ => None,
        };
        for i in 0..n {
            assert_eq!(get(&e, &format!("k{i:04}")), want(i), "k{i}");
        }
        // Durable: a crash right after keeps every value.
        crash_copy(&path, &copy);
        let r = Embedded::open(&copy).expect("reopen");
        for i in 0..n {
            assert_eq!(get(&r, &format!("k{i:04}")), want(i), "k{i} after a crash");
        }
        // Nothing left worth collecting.
        assert_eq!(e.collect_values().expect("collect again"), 0);
    }

    #[test]
    fn a_reader_keeps_reading_a_segment_collected_under_it() {
        let dir = tempfile::tempdir().expect("dir");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        for i in 0..400 {
            put(&e, &format!("k{i:04}"), &value(i, 1));
        }
        let old = e.read().expect("read");
        for i in 0..400 {
            put(&e, &format!("k{i:04}"), &value(i, 2));
        }
        assert!(e.collect_values().expect("collect") > 0);
        assert_eq!(old.get(b"k0001").expect("get"), Some(value(1, 1)));
        assert_eq!(get(&e, "k0001"), Some(value(1, 2)));
    }

    #[test]
    fn a_store_from_before_the_value_log_is_moved_and_readable() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("db");
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            {
                let mut kv = txn.open_table(OLD_KV).expect("kv");
                for i in 0..5000u32 {
                    kv.insert(format!("k{i:05}").as_bytes(), i.to_be_bytes().as_slice())
                        .expect("insert");
                }
                kv.insert(b"big".as_slice(), value(7, 7).as_slice())
                    .expect("insert");
                txn.open_table(META)
                    .expect("meta")
                    .insert(WAL_EPOCH, 3)
                    .expect("epoch");
            }
            txn.commit().expect("commit");
        }
        let e = Embedded::open(&path).expect("open an old store");
        assert_eq!(get(&e, "k04999"), Some(4999u32.to_be_bytes().to_vec()));
        assert_eq!(get(&e, "big"), Some(value(7, 7)));
        put(&e, "new", &value(8, 8));
        e.close();
        drop(e);
        let e = Embedded::open(&path).expect("open again");
        assert_eq!(get(&e, "k00000"), Some(0u32.to_be_bytes().to_vec()));
        assert_eq!(get(&e, "new"), Some(value(8, 8)));
    }

    #[test]
    fn a_replaced_database_brings_its_value_log_and_the_old_one_goes() {
        let dir = tempfile::tempdir().expect("dir");
        let (target, building) = (dir.path().join("store"), dir.path().join("store.new"));
        let old = Embedded::open(&target).expect("open");
        put(&old, "k", &value(1, 1));
        old.close();
        drop(old);
        let new = Embedded::open(&building).expect("open");
        put(&new, "k", &value(1, 2));
        new.close();
        drop(new);
        replace_database(&building, &target).expect("replace");
        let e = Embedded::open(&target).expect("open the replaced store");
        assert_eq!(get(&e, "k"), Some(value(1, 2)));
        assert_eq!(vlog::dirs_of(&target).expect("dirs").len(), 1);
        assert!(vlog::dirs_of(&building).expect("dirs").is_empty());
        e.close();
        drop(e);
        remove_database(&target).expect("remove");
        assert!(vlog::dirs_of(&target).expect("dirs").is_empty());
    }
}
