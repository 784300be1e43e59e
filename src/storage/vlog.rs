//! The embedded engine's value log: objects' JSON kept out of redb's B-tree
//! (the WiscKey layout). A value of `INLINE_MAX` bytes or less stays in
//! redb; a larger one is appended to a segment file here and redb keeps a
//! 17-byte pointer to it. A 1.3 KiB object in a 4 KiB B-tree leaf split that
//! leaf every other insert, and each split built two pages: redb's inserts
//! were a seventh of a create's instructions and most of its disk writes.
//! With pointers a leaf holds a hundred entries.
//!
//! Durability is the write-ahead log's (`wal.rs`): a value reaches this log
//! when its transaction is applied to redb, after the write-ahead log made
//! it durable, and is written without a sync. Before every durable redb
//! commit (a checkpoint) the segments written since the last one are
//! synced, so every pointer a durable commit holds points at synced bytes.
//! After a crash redb is back at its last durable commit, whose meta table
//! says where this log ended; what follows is overwritten as the
//! write-ahead log's records are replayed.
//!
//! Entries: `value length | key length | crc32(value) | key | value`, the
//! key so that garbage collection can ask redb whether the entry is still
//! the key's value. Segments are numbered files of `SEGMENT_BYTES` or so;
//! redb's `vlog-live` table counts the bytes of values each one holds that
//! redb still points at. Once the store's compaction has dropped old
//! versions, a sealed segment less than half live has its live values
//! copied to the open segment, and a segment with none left is deleted
//! after the next checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::StorageError;

/// Values up to this size stay in redb: revision counters, latest-state
/// and event-log records (a pointer is 17 bytes).
pub const INLINE_MAX: usize = 192;
/// A segment is sealed once it holds this much (a larger value still gets one).
pub const SEGMENT_BYTES: u64 = if cfg!(test) {
    // Unit tests see segments sealed and collected without writing 64 MiB.
    256 * 1024
} else {
    64 * 1024 * 1024
};
const ENTRY_HEADER: usize = 12;
const TAG_INLINE: u8 = 0;
const TAG_POINTER: u8 = 1;
const POINTER_LEN: usize = 17;

/// Where a value lives in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pointer {
    pub seg: u32,
    pub off: u32,
    pub len: u32,
    pub crc: u32,
}

/// What redb holds for a key: the value itself or where it is.
pub enum Stored<'a> {
    Inline(&'a [u8]),
    Pointer(Pointer),
}

/// Decodes what redb holds for a key.
pub fn stored(raw: &[u8]) -> Result<Stored<'_>, StorageError> {
    match raw.split_first() {
        Some((&TAG_INLINE, value)) => Ok(Stored::Inline(value)),
        Some((&TAG_POINTER, p)) if p.len() == POINTER_LEN - 1 => {
            let word = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
            Ok(Stored::Pointer(Pointer {
                seg: word(0),
                off: word(4),
                len: word(8),
                crc: word(12),
            }))
        }
        _ => Err(StorageError::Engine(
            "a stored value of unknown form".into(),
        )),
    }
}

/// The pointer in what redb holds, if it is one.
fn pointer_in(raw: &[u8]) -> Option<Pointer> {
    match stored(raw) {
        Ok(Stored::Pointer(p)) => Some(p),
        _ => None,
    }
}

/// What redb holds for a value kept inline.
pub fn inline(value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(1 + value.len());
    out.push(TAG_INLINE);
    out.extend_from_slice(value);
}

fn encode_pointer(p: Pointer, out: &mut Vec<u8>) {
    out.clear();
    out.push(TAG_POINTER);
    for word in [p.seg, p.off, p.len, p.crc] {
        out.extend_from_slice(&word.to_be_bytes());
    }
}

fn io_err(what: &str, e: io::Error) -> StorageError {
    StorageError::Unavailable(format!("storage I/O error: value log: {what}: {e}"))
}

/// The segment files, shared with readers. A reader takes the whole map
/// when it begins, so a segment deleted under it stays readable through
/// the open file.
#[derive(Default)]
pub struct Segments {
    files: RwLock<Arc<BTreeMap<u32, Arc<File>>>>,
}

pub type Files = Arc<BTreeMap<u32, Arc<File>>>;

impl Segments {
    pub fn files(&self) -> Files {
        self.files.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, f: impl FnOnce(&mut BTreeMap<u32, Arc<File>>)) {
        let mut slot = self.files.write().unwrap_or_else(|e| e.into_inner());
        let mut map = BTreeMap::clone(&slot);
        f(&mut map);
        *slot = Arc::new(map);
    }
}

/// Reads the value at `p` into `buf`, checked against its checksum.
pub fn read(files: &Files, p: Pointer, buf: &mut Vec<u8>) -> Result<(), StorageError> {
    let file = files
        .get(&p.seg)
        .ok_or_else(|| StorageError::Engine(format!("value log segment {} is missing", p.seg)))?;
    buf.clear();
    buf.resize(p.len as usize, 0);
    file.read_exact_at(buf, u64::from(p.off))
        .map_err(|e| io_err(&format!("reading segment {}", p.seg), e))?;
    if crc32fast::hash(buf) != p.crc {
        return Err(StorageError::Engine(format!(
            "value log segment {} at {}: checksum mismatch",
            p.seg, p.off
        )));
    }
    Ok(())
}

/// The value redb holds for a key, read from the log if need be.
pub fn resolve(files: &Files, raw: &[u8]) -> Result<Vec<u8>, StorageError> {
    match stored(raw)? {
        Stored::Inline(v) => Ok(v.to_vec()),
        Stored::Pointer(p) => {
            let mut buf = Vec::new();
            read(files, p, &mut buf)?;
            Ok(buf)
        }
    }
}

/// The segment directory of the database at `db` with `nonce`: the
/// nonce keeps a replaced database's segments apart from its successor's.
pub fn dir_of(db: &Path, nonce: u64) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(format!(".vlog-{nonce:016x}"));
    PathBuf::from(p)
}

/// Every segment directory beside `db`, whatever its nonce.
pub fn dirs_of(db: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(parent), Some(name)) = (db.parent(), db.file_name()) else {
        return Ok(Vec::new());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let prefix = format!("{}.vlog-", name.to_string_lossy());
    let mut dirs = Vec::new();
    let entries = match std::fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(dirs),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            dirs.push(entry.path());
        }
    }
    Ok(dirs)
}

fn segment_path(dir: &Path, seg: u32) -> PathBuf {
    dir.join(format!("{seg:08}.vlog"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The writer's side of the log: appends, syncs, counts live bytes.
pub struct Appender {
    dir: PathBuf,
    segments: Arc<Segments>,
    seg: u32,
    file: Arc<File>,
    /// Where the next entry goes in `file` (after `buf`'s bytes).
    end: u64,
    /// Entries appended but not yet written to the file.
    buf: Vec<u8>,
    /// Segments written since the last sync.
    unsynced: BTreeSet<u32>,
    /// A segment file was created since the directory was last synced.
    dir_unsynced: bool,
    /// Bytes of values redb points at, per segment.
    live: BTreeMap<u32, u64>,
    /// Bytes of the sealed segments' files.
    sealed_bytes: u64,
}

/// Where the log ended at redb's last commit, and its live counts.
pub struct State {
    pub seg: u32,
    pub end: u64,
    pub live: BTreeMap<u32, u64>,
}

impl Appender {
    /// Opens the log in `dir` as redb's last commit (`state`) left it:
    /// segments after its last are from a write redb lost and go, and the
    /// last is written from `state.end` on.
    pub fn open(dir: &Path, state: State, segments: Arc<Segments>) -> Result<Self, StorageError> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir).map_err(|e| io_err("creating its directory", e))?;
        if created {
            if let Some(parent) = dir.parent() {
                let parent = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
                sync_dir(parent).map_err(|e| io_err("syncing its parent directory", e))?;
            }
        }
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io_err("listing segments", e))? {
            let entry = entry.map_err(|e| io_err("listing segments", e))?;
            let name = entry.file_name();
            let Some(seg) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".vlog"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if seg > state.seg {
                std::fs::remove_file(entry.path())
                    .map_err(|e| io_err("removing a segment redb lost", e))?;
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(seg == state.seg)
                .open(entry.path())
                .map_err(|e| io_err("opening a segment", e))?;
            files.insert(seg, Arc::new(file));
        }
        let file = match files.get(&state.seg) {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(create_segment(dir, state.seg)?);
                files.insert(state.seg, f.clone());
                f
            }
        };
        // What follows the last commit's end is a lost write's: never read.
        let len = file
            .metadata()
            .map_err(|e| io_err("reading a segment", e))?
            .len();
        if len > state.end {
            file.set_len(state.end)
                .map_err(|e| io_err("cutting a lost write", e))?;
        }
        let mut sealed_bytes = 0;
        for (seg, f) in &files {
            if *seg != state.seg {
                sealed_bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        segments.replace(|map| *map = files);
        Ok(Self {
            dir: dir.to_path_buf(),
            segments,
            seg: state.seg,
            file,
            end: state.end,
            buf: Vec::new(),
            unsynced: BTreeSet::from([state.seg]),
            dir_unsynced: true,
            live: state.live,
            sealed_bytes,
        })
    }

    /// What redb is to hold for `value` under `key`: the value itself, or
    /// a pointer to it once appended here.
    pub fn encode(
        &mut self,
        key: &[u8],
        value: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), StorageError> {
        if value.len() <= INLINE_MAX {
            inline(value, out);
            return Ok(());
        }
        let entry = ENTRY_HEADER + key.len() + value.len();
        let at = self.end + self.buf.len() as u64;
        if at > 0 && at + entry as u64 > SEGMENT_BYTES {
            self.roll()?;
        }
        let (klen, vlen) = (
            u32::try_from(key.len()).map_err(|_| StorageError::Engine("key too long".into()))?,
            u32::try_from(value.len())
                .map_err(|_| StorageError::Engine("value too long".into()))?,
        );
        let crc = crc32fast::hash(value);
        let at = self.end + self.buf.len() as u64;
        let off = u32::try_from(at + (ENTRY_HEADER + key.len()) as u64)
            .map_err(|_| StorageError::Engine("value log segment too long".into()))?;
        self.buf.extend_from_slice(&vlen.to_be_bytes());
        self.buf.extend_from_slice(&klen.to_be_bytes());
        self.buf.extend_from_slice(&crc.to_be_bytes());
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(value);
        let p = Pointer {
            seg: self.seg,
            off,
            len: vlen,
            crc,
        };
        *self.live.entry(p.seg).or_default() += u64::from(vlen);
        encode_pointer(p, out);
        Ok(())
    }

    /// Notes that redb no longer holds `raw` (replaced or removed).
    pub fn forget(&mut self, raw: &[u8]) {
        if let Some(p) = pointer_in(raw) {
            if let Some(live) = self.live.get_mut(&p.seg) {
                *live = live.saturating_sub(u64::from(p.len));
            }
        }
    }

    /// Writes the appended entries to the file (no sync): done before the
    /// redb transaction holding their pointers is committed or read.
    pub fn write_out(&mut self) -> Result<(), StorageError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.file
            .write_all_at(&self.buf, self.end)
            .map_err(|e| io_err(&format!("writing segment {}", self.seg), e))?;
        self.end += self.buf.len() as u64;
        self.unsynced.insert(self.seg);
        self.buf.clear();
        if self.buf.capacity() > 4 * 1024 * 1024 {
            self.buf = Vec::new();
        }
        self.publish();
        Ok(())
    }

    /// Seals the open segment and starts the next.
    fn roll(&mut self) -> Result<(), StorageError> {
        self.write_out()?;
        let next = self
            .seg
            .checked_add(1)
            .ok_or_else(|| StorageError::Engine("value log segments exhausted".into()))?;
        let file = Arc::new(create_segment(&self.dir, next)?);
        self.segments.replace(|map| {
            map.insert(next, file.clone());
        });
        self.sealed_bytes += self.end;
        self.seg = next;
        self.file = file;
        self.end = 0;
        self.dir_unsynced = true;
        Ok(())
    }

    /// Makes everything written so far durable: before a durable redb commit.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.write_out()?;
        let files = self.segments.files();
        for seg in std::mem::take(&mut self.unsynced) {
            if let Some(f) = files.get(&seg) {
                f.sync_data()
                    .map_err(|e| io_err(&format!("syncing segment {seg}"), e))?;
            }
        }
        if self.dir_unsynced {
            sync_dir(&self.dir).map_err(|e| io_err("syncing its directory", e))?;
            self.dir_unsynced = false;
        }
        Ok(())
    }

    /// Where the log ends and what each segment holds live, for redb's
    /// next commit.
    pub fn state(&self) -> State {
        State {
            seg: self.seg,
            end: self.end + self.buf.len() as u64,
            live: self.live.clone(),
        }
    }

    pub fn live(&self) -> &BTreeMap<u32, u64> {
        &self.live
    }

    /// After an aborted redb transaction: the counts from before it.
    pub fn restore_live(&mut self, live: BTreeMap<u32, u64>) {
        self.live = live;
    }

    /// Publishes the log's size, what of it is live and its segments as
    /// gauges (once per group written, and at each redb commit).
    pub fn publish(&self) {
        let end = self.end + self.buf.len() as u64;
        metrics::gauge!("kshard_storage_value_log_bytes").set((self.sealed_bytes + end) as f64);
        let live: u64 = self.live.values().sum();
        metrics::gauge!("kshard_storage_value_log_live_bytes").set(live as f64);
        let segments = self.segments.files().len();
        metrics::gauge!("kshard_storage_value_log_segments").set(segments as f64);
    }

    /// Sealed segments worth collecting: less than half their bytes live.
    pub fn sparse(&self) -> Vec<u32> {
        let files = self.segments.files();
        files
            .iter()
            .filter(|(seg, _)| **seg != self.seg)
            .filter_map(|(seg, f)| {
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                let live = self.live.get(seg).copied().unwrap_or(0);
                (live * 2 < size || live == 0).then_some(*seg)
            })
            .collect()
    }

    /// Deletes sealed segments whose live values were all copied out, after
    /// a durable commit of the copies (before it, a crash brings back
    /// pointers into them). Returns how many went.
    pub fn remove_segments(&mut self, segs: &[u32]) -> Result<usize, StorageError> {
        let dead: Vec<u32> = segs.iter().copied().filter(|s| *s != self.seg).collect();
        let files = self.segments.files();
        for seg in &dead {
            let size = files
                .get(seg)
                .and_then(|f| f.metadata().ok())
                .map_or(0, |m| m.len());
            self.sealed_bytes = self.sealed_bytes.saturating_sub(size);
            match std::fs::remove_file(segment_path(&self.dir, *seg)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_err(&format!("removing segment {seg}"), e))
                }
                _ => {}
            }
            self.live.remove(seg);
            self.unsynced.remove(seg);
        }
        if !dead.is_empty() {
            self.segments.replace(|map| {
                for seg in &dead {
                    map.remove(seg);
                }
            });
            self.dir_unsynced = true;
        }
        Ok(dead.len())
    }
}

fn create_segment(dir: &Path, seg: u32) -> Result<File, StorageError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(segment_path(dir, seg))
        .map_err(|e| io_err("creating a segment", e))
}

/// One entry of a sealed segment, for garbage collection.
pub struct Entry {
    pub key: Vec<u8>,
    pub pointer: Pointer,
    pub value: Vec<u8>,
}

/// Reads entries of segment `seg` from `*at` on, about `budget` bytes of
/// them, advancing `*at`; empty at the segment's end.
pub fn read_entries(
    files: &Files,
    seg: u32,
    at: &mut u64,
    budget: usize,
) -> Result<Vec<Entry>, StorageError> {
    let Some(file) = files.get(&seg) else {
        return Ok(Vec::new());
    };
    let size = file
        .metadata()
        .map_err(|e| io_err("reading a segment", e))?
        .len();
    let mut entries = Vec::new();
    let mut taken = 0;
    while taken < budget && *at + ENTRY_HEADER as u64 <= size {
        let mut header = [0u8; ENTRY_HEADER];
        file.read_exact_at(&mut header, *at)
            .map_err(|e| io_err(&format!("reading segment {seg}"), e))?;
        let word =
            |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (vlen, klen, crc) = (word(0), word(4), word(8));
        let body = klen as u64 + u64::from(vlen);
        if *at + ENTRY_HEADER as u64 + body > size {
            break;
        }
        let mut kv = vec![0u8; body as usize];
        file.read_exact_at(&mut kv, *at + ENTRY_HEADER as u64)
            .map_err(|e| io_err(&format!("reading segment {seg}"), e))?;
        let value = kv.split_off(klen as usize);
        let off = u32::try_from(*at + ENTRY_HEADER as u64 + u64::from(klen))
            .map_err(|_| StorageError::Engine("value log segment too long".into()))?;
        *at += ENTRY_HEADER as u64 + body;
        taken += ENTRY_HEADER + body as usize;
        entries.push(Entry {
            key: kv,
            pointer: Pointer {
                seg,
                off,
                len: vlen,
                crc,
            },
            value,
        });
    }
    Ok(entries)
}

/// Whether redb's `raw` still points at `p`.
pub fn points_at(raw: &[u8], p: Pointer) -> bool {
    pointer_in(raw).is_some_and(|q| q.seg == p.seg && q.off == p.off)
}
