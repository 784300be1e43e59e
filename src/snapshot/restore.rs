//! `kshard snapshot restore`: a checked snapshot file into a new store.
//!
//! The file is read twice: once to check all of it (checksums, order,
//! revisions, the trailer's digest) before anything is written, and again to
//! write it, checked once more. What is written is not served until the
//! restore finishes: the embedded store is built in a file of its own and
//! renamed over the target at the end; a TiKV prefix carries `m/restoring`
//! from the first write until the last, and `kshard serve` refuses a store
//! that holds it. A restore that fails while writing removes what it wrote.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::format::{self, Header, Item, Trailer};
use super::{Progress, SnapshotError};
use crate::storage::engine::Engine;
use crate::storage::{embedded, keys, StorageError};

/// How far above the snapshot's revision the restored shard's counter
/// starts, by default: every resourceVersion a client may have seen from the
/// source after the snapshot (up to a billion writes) is then below the
/// restored shard's compacted revision, so a client resuming from one gets
/// 410 and re-lists instead of waiting for revisions that would mean other
/// writes (etcd's `--bump-revision`, which Kubernetes recommends with
/// `--mark-compacted` after a restore).
pub const DEFAULT_BUMP_REVISION: u64 = 1_000_000_000;

/// redb's page cache while a command reads or writes an embedded store
/// (`kshard serve`'s default): the command goes through the data once, and
/// redb's own default (64 MiB here) would only grow the command's memory
/// with the data.
pub const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Where a snapshot goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// A data directory's embedded store (`<dir>/store.redb`).
    Embedded(PathBuf),
    /// A `--store` URL (`tikv://pd:2379?prefix=<shard>`).
    Store(String),
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Replace what the target holds.
    pub force: bool,
    /// Added to the snapshot's revision for the restored counter.
    pub bump_revision: u64,
}

/// What a restore wrote.
#[derive(Debug, Clone)]
pub struct Restored {
    pub header: Header,
    pub trailer: Trailer,
    /// The restored store's revision counter (and compaction mark).
    pub revision: u64,
}

fn open_file(path: &Path) -> Result<std::fs::File, SnapshotError> {
    std::fs::File::open(path)
        .map_err(|e| SnapshotError::io(format!("opening {}", path.display()), e))
}

/// Reads and checks the whole file; writes nothing.
pub fn verify(path: &Path, progress: &mut Progress) -> Result<(Header, Trailer), SnapshotError> {
    format::read_all(open_file(path)?, |d, _| {
        let (objects, bytes) = d.progress();
        progress.update(objects, bytes);
        Ok(())
    })
}

/// Restores `path` into `target`. Blocking (run it off any async runtime's workers).
pub fn restore(
    path: &Path,
    target: &Target,
    opts: Options,
    verifying: &mut Progress,
    writing: &mut Progress,
) -> Result<Restored, SnapshotError> {
    let (header, trailer) = verify(path, verifying)?;
    verifying.done();
    let revision = header
        .revision
        .checked_add(opts.bump_revision)
        .ok_or_else(|| SnapshotError::Refused("--bump-revision overflows the revision".into()))?;
    match target {
        Target::Embedded(dir) => restore_embedded(path, dir, opts, revision, writing)?,
        Target::Store(url) if url.is_empty() || url == "embedded" => {
            return Err(SnapshotError::Refused(
                "an embedded store is restored into a data directory (--data-dir)".into(),
            ))
        }
        Target::Store(url) => {
            let engine = crate::storage::open_engine(Some(url), Path::new(""), 0)?;
            restore_shared(path, &*engine, opts, revision, writing)?;
        }
    }
    Ok(Restored {
        header,
        trailer,
        revision,
    })
}

/// Whether the engine holds any key at all.
fn holds_anything(engine: &dyn Engine) -> Result<bool, StorageError> {
    let mut any = false;
    engine.read()?.scan(&[], &[0xff], &mut |_, _| {
        any = true;
        ControlFlow::Break(())
    })?;
    Ok(any)
}

fn restore_embedded(
    path: &Path,
    dir: &Path,
    opts: Options,
    revision: u64,
    progress: &mut Progress,
) -> Result<(), SnapshotError> {
    crate::server::pki::private_dir(dir).map_err(|e| SnapshotError::Refused(e.to_string()))?;
    let target = dir.join(embedded::STORE_FILE);
    if target.exists() {
        // Opening fails while a server has it open (redb locks the file).
        let existing = embedded::Embedded::open_with_cache(&target, CACHE_BYTES).map_err(|e| {
            SnapshotError::Refused(format!(
                "{} cannot be opened (is a kshard serving it?): {e}",
                target.display()
            ))
        })?;
        let full = holds_anything(&existing);
        existing.close();
        drop(existing);
        if full? && !opts.force {
            return Err(SnapshotError::Refused(format!(
                "{} holds a store already; restore into a new data directory, or pass --force to replace it",
                target.display()
            )));
        }
    }
    let building = dir.join(format!("{}.restoring", embedded::STORE_FILE));
    embedded::remove_database(&building)
        .map_err(|e| SnapshotError::io(format!("removing {}", building.display()), e))?;
    let written = (|| {
        let engine = embedded::Embedded::open_with_cache(&building, CACHE_BYTES)?;
        let loaded = load(path, &engine, revision, progress);
        engine.close();
        drop(engine);
        loaded
    })();
    if let Err(e) = written {
        let _ = embedded::remove_database(&building);
        return Err(e);
    }
    embedded::replace_database(&building, &target).map_err(|e| {
        SnapshotError::io(
            format!("moving the restored store to {}", target.display()),
            e,
        )
    })
}

fn restore_shared(
    path: &Path,
    engine: &dyn Engine,
    opts: Options,
    revision: u64,
    progress: &mut Progress,
) -> Result<(), SnapshotError> {
    if let Some(lease) = engine.read()?.get(crate::replica::lease::LEASE_KEY)? {
        if let Ok(lease) = serde_json::from_slice::<crate::replica::lease::Lease>(&lease) {
            // The holder's clock wrote it; a margin covers skew between machines.
            let live_until = lease.expires_ms.saturating_add(10_000);
            if lease.expires_ms != 0 && live_until > crate::replica::lease::now_ms() {
                return Err(SnapshotError::Refused(format!(
                    "replica {:?} holds this shard's leader lease: stop every replica of it first",
                    lease.holder
                )));
            }
        }
    }
    if holds_anything(engine)? {
        if !opts.force {
            return Err(SnapshotError::Refused(format!(
                "the {} store holds this shard's data already; restore into a new prefix, or pass --force to replace it",
                engine.kind()
            )));
        }
        clear(engine)?;
    }
    if let Err(e) = load(path, engine, revision, progress) {
        // Nothing of it is served (the marker is the last key removed).
        if let Err(cleanup) = clear(engine) {
            tracing::error!(error = %cleanup, "removing the partial restore failed; the store keeps its restore marker");
        }
        return Err(e);
    }
    Ok(())
}

/// Removes every key of the store, the restore marker last.
fn clear(engine: &dyn Engine) -> Result<(), StorageError> {
    loop {
        let mut batch = Vec::new();
        engine.read()?.scan(&[], &[0xff], &mut |k, _| {
            if k != keys::META_RESTORING {
                batch.push(k.to_vec());
            }
            if batch.len() >= 1000 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if batch.is_empty() {
            break;
        }
        engine.write(&mut |txn| {
            for k in &batch {
                txn.delete(k)?;
            }
            Ok(())
        })?;
    }
    engine.write(&mut |txn| txn.delete(keys::META_RESTORING))
}

/// Writes the file's objects into `engine` (checking the file again as it
/// goes) under the restore marker, then the counter, which ends the restore.
fn load(
    path: &Path,
    engine: &dyn Engine,
    revision: u64,
    progress: &mut Progress,
) -> Result<(), SnapshotError> {
    engine.write(&mut |txn| txn.put(keys::META_RESTORING, revision.to_string().as_bytes()))?;
    format::read_all(open_file(path)?, |d, item| {
        if let Item::Objects(entries) = item {
            if !entries.is_empty() {
                engine.write(&mut |txn| {
                    for e in &entries {
                        txn.put(
                            &keys::latest(&e.key),
                            &keys::encode_latest(e.revision, false),
                        )?;
                        txn.put(&keys::version(&e.key, e.revision), &e.json)?;
                    }
                    Ok(())
                })?;
            }
            let (objects, bytes) = d.progress();
            progress.update(objects, bytes);
        }
        Ok(())
    })?;
    // No history before `revision`: older reads and watches are 410.
    engine.write(&mut |txn| {
        txn.put(keys::META_REVISION, &revision.to_be_bytes())?;
        txn.put(keys::META_COMPACT, &revision.to_be_bytes())?;
        txn.delete(keys::META_RESTORING)
    })?;
    Ok(())
}
