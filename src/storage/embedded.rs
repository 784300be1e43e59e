//! The embedded engine on redb: one table, fsync on every commit (redb's
//! default durability), crash-safe.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::engine::{Engine, ReadTxn, Visitor, WriteFn, WriteTxn};
use super::StorageError;

const KV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");

pub struct Embedded {
    db: Database,
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
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(engine_err)?;
        // Make sure the table exists so that read transactions can open it.
        let txn = db.begin_write().map_err(engine_err)?;
        txn.open_table(KV).map_err(engine_err)?;
        txn.commit().map_err(engine_err)?;
        Ok(Self { db })
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
        self.table.insert(key, value).map_err(engine_err)?;
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StorageError> {
        self.table.remove(key).map_err(engine_err)?;
        Ok(())
    }
}

impl Engine for Embedded {
    fn read(&self) -> Result<Box<dyn ReadTxn + '_>, StorageError> {
        let txn = self.db.begin_read().map_err(engine_err)?;
        let table = txn.open_table(KV).map_err(engine_err)?;
        Ok(Box::new(Reader { table }))
    }

    fn write(&self, f: &mut WriteFn<'_>) -> Result<(), StorageError> {
        let txn = self.db.begin_write().map_err(engine_err)?;
        {
            let table = txn.open_table(KV).map_err(engine_err)?;
            let mut writer = Writer { table };
            if let Err(e) = f(&mut writer) {
                drop(writer);
                txn.abort().map_err(engine_err)?;
                return Err(e);
            }
        }
        txn.commit().map_err(engine_err)?;
        Ok(())
    }
}
