//! The small interface every storage engine implements: ordered reads on a
//! snapshot and an atomic write transaction. Revisions, history, the event log
//! and compaction live above it (`storage::Store`), so engines stay tiny and
//! behave identically.

use std::ops::ControlFlow;

use super::StorageError;

/// Called per entry of a scan; `Break` stops it.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> ControlFlow<()> + 'a;

/// A consistent read view of the engine.
pub trait ReadTxn {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// The values of `keys`, in their order. Engines with a round trip per
    /// read (TiKV) fetch them in one; replaying thousands of revisions from
    /// the event log took one round trip each.
    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Visits `[start, end)` in key order until `visit` breaks.
    fn scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StorageError>;
    /// As `scan`, with each value's length only: an engine that keeps
    /// values apart from their keys (the embedded value log) reads none.
    fn scan_lengths(
        &self,
        start: &[u8],
        end: &[u8],
        visit: &mut LengthVisitor<'_>,
    ) -> Result<(), StorageError> {
        self.scan(start, end, &mut |k, v| visit(k, v.len()))
    }
}

/// Called per entry of a `scan_lengths` with the value's length.
pub type LengthVisitor<'a> = dyn FnMut(&[u8], usize) -> ControlFlow<()> + 'a;

/// A read-write transaction; its reads see its own writes.
pub trait WriteTxn: ReadTxn {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StorageError>;
    fn delete(&mut self, key: &[u8]) -> Result<(), StorageError>;
}

pub type WriteFn<'a> = dyn FnMut(&mut dyn WriteTxn) -> Result<(), StorageError> + 'a;

pub trait Engine: Send + Sync + 'static {
    fn read(&self) -> Result<Box<dyn ReadTxn + '_>, StorageError>;
    /// Runs `f` in one transaction and makes it durable before returning.
    /// If `f` fails nothing is written.
    fn write(&self, f: &mut WriteFn<'_>) -> Result<(), StorageError>;
    /// Whether the next write is expected to finish within a sync of a
    /// small record (well under a millisecond), so a request may commit it
    /// on its runtime worker instead of handing the worker to another
    /// thread first. No by default: a remote engine waits on the network.
    fn quick_write(&self) -> bool {
        false
    }
    /// Finishes work the last write left for later, once it is
    /// acknowledged: the embedded engine's inserts into redb, which the log
    /// made unnecessary for durability. Called off the request's path,
    /// possibly on a runtime worker, so it never waits for a lock: the next
    /// read or write does the work first anyway.
    fn settle(&self) {}
    /// Called after the store has compacted its history: an engine with its
    /// own garbage collection (TiKV's GC safe point) advances it here.
    fn after_compaction(&self) -> Result<(), StorageError> {
        Ok(())
    }
    /// Before a replica takes over from a leader whose lease lapsed:
    /// resolves the transactions that leader may have left half committed
    /// (TiKV: rolled back unless their primary committed), so that readers
    /// of their keys — every write locks the revision counter — need not
    /// wait out the locks' TTL (3 s). Percolator keeps this safe: a writer
    /// still alive fails to commit a transaction rolled back here.
    fn abandon_locks(&self) -> Result<(), StorageError> {
        Ok(())
    }
    /// Shutdown: release the database cleanly; later transactions fail.
    fn close(&self) {}
    /// The engine's name, as `--store` spells its kind (`embedded`, `tikv`),
    /// for snapshot headers.
    fn kind(&self) -> &'static str;
    /// The shard a shared store keeps this shard's keys under (TiKV's
    /// `?prefix=`); `None` for a store of its own.
    fn shard(&self) -> Option<String> {
        None
    }
}
