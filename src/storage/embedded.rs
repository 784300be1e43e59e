//! The embedded engine on redb: one table, fsync on every commit (redb's
//! default durability), crash-safe.
//!
//! After an I/O error (a full disk) redb refuses every later transaction
//! ("previous I/O error") until the database is opened again. The engine
//! does that itself: the failed write is refused (nothing of it is visible,
//! redb's commit is atomic), and the next transaction reopens the file,
//! which redb checks and repairs, so writes succeed again once the cause is
//! gone, without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::engine::{Engine, ReadTxn, Visitor, WriteFn, WriteTxn};
use super::StorageError;

const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

pub struct Embedded {
    /// `None` while a failed database waits to be opened again.
    db: RwLock<Option<Arc<Database>>>,
    /// Set at shutdown: the database is not opened again.
    closed: std::sync::atomic::AtomicBool,
    path: PathBuf,
    cache_bytes: usize,
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
        let db = open_db(path, cache_bytes)?;
        Ok(Self {
            db: RwLock::new(Some(Arc::new(db))),
            closed: std::sync::atomic::AtomicBool::new(false),
            path: path.to_path_buf(),
            cache_bytes,
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
            return Err(StorageError::Unavailable("the store is closed".into()));
        }
        let db = Arc::new(open_db(&self.path, self.cache_bytes)?);
        tracing::info!(path = %self.path.display(), "store reopened after an I/O error");
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
}

fn open_db(path: &Path, cache_bytes: usize) -> Result<Database, StorageError> {
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(engine_err)?;
    // Make sure the table exists so that read transactions can open it
    // (without a write when it does: reopening on a full disk must not need one).
    let exists = db.begin_read().map_err(engine_err)?.open_table(KV).is_ok();
    if !exists {
        let txn = db.begin_write().map_err(engine_err)?;
        txn.open_table(KV).map_err(engine_err)?;
        txn.commit().map_err(engine_err)?;
    }
    Ok(db)
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
}

fn scan_table<T: ReadableTable<&'static [u8], &'static [u8]>>(
    table: &T,
    start: &[u8],
    end: &[u8],
    visit: &mut Visitor<'_>,
) -> Result<(), StorageError> {
    for entry in table.range::<&[u8]>(start..end).map_err(engine_err)? {
        let (k, v) = entry.map_err(engine_err)?;
        if visit(k.value(), v.value()).is_break() {
            break;
        }
    }
    Ok(())
}

impl ReadTxn for Reader {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .table
            .get(key)
            .map_err(engine_err)?
            .map(|v| v.value().to_vec()))
    }
    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        scan_table(&self.table, start, end, visit)
    }
}

struct Writer<'t> {
    table: redb::Table<'t, &'static [u8], &'static [u8]>,
}

impl ReadTxn for Writer<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self
            .table
            .get(key)
            .map_err(engine_err)?
            .map(|v| v.value().to_vec()))
    }
    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError> {
        scan_table(&self.table, start, end, visit)
    }
}

impl WriteTxn for Writer<'_> {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.table.insert(key, value).map_err(txn_err)?;
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StorageError> {
        self.table.remove(key).map_err(txn_err)?;
        Ok(())
    }
}

impl Engine for Embedded {
    fn read(&self) -> Result<Box<dyn ReadTxn + '_>, StorageError> {
        let db = self.db()?;
        let txn = db.begin_read().map_err(|e| self.failed(e))?;
        let table = txn.open_table(KV).map_err(|e| self.failed(e))?;
        Ok(Box::new(Reader { table }))
    }

    fn close(&self) {
        self.closed
            .store(true, std::sync::atomic::Ordering::Release);
        // The file is released (cleanly) when the last transaction holding it ends.
        *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn write(&self, f: &mut WriteFn<'_>) -> Result<(), StorageError> {
        let db = self.db()?;
        let txn = db.begin_write().map_err(|e| self.failed(e))?;
        {
            let table = txn.open_table(KV).map_err(|e| self.failed(e))?;
            let mut writer = Writer { table };
            if let Err(e) = f(&mut writer) {
                drop(writer);
                if matches!(e, StorageError::Unavailable(_)) {
                    *self.db.write().unwrap_or_else(|p| p.into_inner()) = None;
                }
                txn.abort().map_err(|e| self.failed(e))?;
                return Err(e);
            }
        }
        txn.commit().map_err(|e| self.failed(e))?;
        Ok(())
    }
}

/// A redb error inside a transaction: I/O failures are `Unavailable`.
fn txn_err(e: redb::StorageError) -> StorageError {
    if e.is_io() {
        StorageError::Unavailable(format!("storage I/O error: {e}"))
    } else {
        engine_err(e)
    }
}
