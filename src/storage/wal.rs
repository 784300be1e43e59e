//! The embedded engine's write-ahead log. A durable redb commit costs about
//! three times an `fdatasync` of an append to a preallocated file (it syncs
//! scattered B-tree pages and its header), so each transaction is made
//! durable here first and committed to redb without a sync; a periodic
//! durable redb commit (a checkpoint) makes the log's records redundant and
//! the log starts over. etcd does the same with its WAL and bbolt.
//!
//! Records: `magic | epoch | length | crc32 | payload`. The epoch is the
//! number of checkpoints taken, stored in redb by the checkpoint itself, so
//! after a checkpoint the records of the old epoch still in the file are
//! ignored without truncating it (truncation would make every later sync
//! also write the file's size). A torn last record fails its checksum and
//! ends the log: it was never acknowledged.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x4b57_414c; // "KWAL"
const HEADER: usize = 4 + 8 + 4 + 4;
/// The file grows by this much at a time, written as zeros, so that a
/// record's `fdatasync` writes only data, never the file's size or extents.
const GROW: u64 = 4 * 1024 * 1024;
/// A checkpoint is taken once the log holds this much.
pub const CHECKPOINT_BYTES: u64 = 16 * 1024 * 1024;

const PUT: u8 = 1;
const DELETE: u8 = 0;

/// One transaction's writes, encoded as they are made, after room for the
/// record's header: `Wal::append` fills that in and writes the buffer as it
/// is, with no copy of what can be a group of a hundred objects.
pub struct Payload(Vec<u8>);

impl Default for Payload {
    fn default() -> Self {
        Self::with_buffer(Vec::new())
    }
}

impl Payload {
    /// An empty payload in `buf`'s allocation: the writer reuses one buffer
    /// rather than have the allocator hand it fresh pages for every group.
    pub fn with_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.resize(HEADER, 0);
        Self(buf)
    }

    /// The allocation, for the next payload.
    pub fn into_buffer(self) -> Vec<u8> {
        self.0
    }

    fn body(&self) -> &[u8] {
        self.0.get(HEADER..).unwrap_or_default()
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.0.push(PUT);
        self.field(key);
        self.field(value);
    }

    pub fn delete(&mut self, key: &[u8]) {
        self.0.push(DELETE);
        self.field(key);
    }

    pub fn len(&self) -> usize {
        self.body().len()
    }

    pub fn is_empty(&self) -> bool {
        self.body().is_empty()
    }

    fn field(&mut self, bytes: &[u8]) {
        self.0
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.0.extend_from_slice(bytes);
    }

    /// The writes from byte `from` on (a length `len` returned earlier), in order.
    pub fn ops_from(&self, from: usize) -> OpRefs<'_> {
        OpRefs(self.body().get(from..).unwrap_or_default())
    }

    /// The last write to `key` from byte `from` on: `Some(None)` for a
    /// delete, `None` if there is none.
    pub fn last_write(&self, from: usize, key: &[u8]) -> Option<Option<&[u8]>> {
        let mut found = None;
        for op in self.ops_from(from) {
            match op {
                OpRef::Put(k, v) if k == key => found = Some(Some(v)),
                OpRef::Delete(k) if k == key => found = Some(None),
                _ => {}
            }
        }
        found
    }
}

/// A write in a payload, borrowed.
#[derive(Debug, PartialEq, Eq)]
pub enum OpRef<'a> {
    Put(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
}

/// The writes of an encoded payload, in order; ends at a malformed one.
pub struct OpRefs<'a>(&'a [u8]);

impl<'a> Iterator for OpRefs<'a> {
    type Item = OpRef<'a>;

    fn next(&mut self) -> Option<OpRef<'a>> {
        fn field<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
            let (len, rest) = b.split_first_chunk::<4>()?;
            let len = u32::from_le_bytes(*len) as usize;
            if rest.len() < len {
                return None;
            }
            let (f, rest) = rest.split_at(len);
            *b = rest;
            Some(f)
        }
        let (&tag, mut rest) = self.0.split_first()?;
        let op = match tag {
            PUT => field(&mut rest).and_then(|k| Some(OpRef::Put(k, field(&mut rest)?))),
            DELETE => field(&mut rest).map(OpRef::Delete),
            _ => None,
        };
        // A malformed write ends the iteration with its bytes left over.
        if op.is_some() {
            self.0 = rest;
        }
        op
    }
}

/// A write replayed from the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// A failed append, and whether its record may yet replay.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// The record can never be read back.
    #[error("{0}")]
    NotWritten(io::Error),
    /// The record may be in the file whole: it may replay after a crash.
    #[error("{0}")]
    MaybeWritten(io::Error),
}

pub struct Wal {
    file: File,
    path: PathBuf,
    epoch: u64,
    /// Where the next record goes.
    offset: u64,
    /// Bytes of the file already written (zeros or records).
    allocated: u64,
    /// How long the last record's sync took (`MAX` before the first).
    last_sync: std::time::Duration,
}

impl Wal {
    /// Opens (or creates) the log at `path` and reads the records of `epoch`,
    /// in order, up to the first that is missing or torn.
    pub fn open(path: &Path, epoch: u64) -> io::Result<(Self, Vec<Vec<Op>>)> {
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if created {
            // The new name must survive a crash like the records in it.
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        let allocated = file.metadata()?.len();
        let mut wal = Self {
            file,
            path: path.to_path_buf(),
            epoch,
            offset: 0,
            allocated,
            last_sync: std::time::Duration::MAX,
        };
        let mut records = Vec::new();
        while let Some((ops, next)) = wal.read_at(wal.offset)? {
            records.push(ops);
            wal.offset = next;
        }
        Ok((wal, records))
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn len(&self) -> u64 {
        self.offset
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one transaction and returns once it is on disk.
    pub fn append(&mut self, payload: &mut Payload) -> Result<(), AppendError> {
        let crc = checksum(self.epoch, payload.body());
        let len = payload.len() as u32;
        let Some(header) = payload.0.first_chunk_mut::<HEADER>() else {
            return Err(AppendError::NotWritten(io::Error::other(
                "payload without a header",
            )));
        };
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..12].copy_from_slice(&self.epoch.to_le_bytes());
        header[12..16].copy_from_slice(&len.to_le_bytes());
        header[16..].copy_from_slice(&crc.to_le_bytes());
        let rec = &payload.0;
        let end = self.offset + rec.len() as u64;
        // Nothing of the record is in the file yet: not written.
        self.reserve(end).map_err(AppendError::NotWritten)?;
        let synced = std::time::Instant::now();
        let written = self
            .file
            .write_all_at(rec, self.offset)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            return Err(self.unwrite(e));
        }
        self.last_sync = synced.elapsed();
        self.offset = end;
        Ok(())
    }

    /// After a failed write or sync the record may be in the file whole
    /// (the zeros past a torn one could even complete it), so it could
    /// replay after a crash: its magic is zeroed. If even that cannot be
    /// made durable, whether it replays is unknown until the next record
    /// (written at the same offset) replaces it.
    fn unwrite(&mut self, e: io::Error) -> AppendError {
        let erased = self
            .file
            .write_all_at(&[0u8; 4], self.offset)
            .and_then(|()| self.file.sync_data());
        match erased {
            Ok(()) => AppendError::NotWritten(e),
            Err(_) => AppendError::MaybeWritten(e),
        }
    }

    /// How long the last record's sync took.
    pub fn last_sync(&self) -> std::time::Duration {
        self.last_sync
    }

    #[cfg(test)]
    pub fn pretend_last_sync(&mut self, took: std::time::Duration) {
        self.last_sync = took;
    }

    /// Whether `bytes` more fit in what the file already holds (no growth step).
    pub fn fits(&self, bytes: u64) -> bool {
        self.offset + HEADER as u64 + bytes <= self.allocated
    }

    /// After a checkpoint: the records so far are in redb; `epoch` begins.
    pub fn restart(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.offset = 0;
    }

    /// Makes sure the file is written as far as `end`. A full disk may
    /// refuse a whole step but allow just what is needed.
    fn reserve(&mut self, end: u64) -> io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let step = (end - self.allocated).max(GROW);
        match self.zero_fill(self.allocated + step) {
            Ok(()) => Ok(()),
            Err(_) if step > end - self.allocated => self.zero_fill(end),
            Err(e) => Err(e),
        }
    }

    fn zero_fill(&mut self, to: u64) -> io::Result<()> {
        let zeros = vec![0u8; 64 * 1024];
        let mut at = self.allocated;
        while at < to {
            let n = ((to - at) as usize).min(zeros.len());
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        // The size and extents are synced once here, not with each record.
        self.file.sync_all()?;
        self.allocated = to;
        Ok(())
    }

    /// The record at `at` and where the next begins, if it is whole and of
    /// this epoch.
    fn read_at(&self, at: u64) -> io::Result<Option<(Vec<Op>, u64)>> {
        let mut header = [0u8; HEADER];
        if at + HEADER as u64 > self.allocated {
            return Ok(None);
        }
        self.file.read_exact_at(&mut header, at)?;
        let word =
            |i: usize| u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let mut epoch = [0u8; 8];
        epoch.copy_from_slice(&header[4..12]);
        if word(0) != MAGIC || u64::from_le_bytes(epoch) != self.epoch {
            return Ok(None);
        }
        let len = word(12) as u64;
        let end = at + HEADER as u64 + len;
        if end > self.allocated {
            return Ok(None);
        }
        let mut payload = vec![0u8; len as usize];
        self.file.read_exact_at(&mut payload, at + HEADER as u64)?;
        if checksum(self.epoch, &payload) != word(16) {
            return Ok(None);
        }
        Ok(decode(&payload).map(|ops| (ops, end)))
    }
}

fn checksum(epoch: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// All of a payload's writes, or `None` if any is malformed.
fn decode(b: &[u8]) -> Option<Vec<Op>> {
    let mut ops = OpRefs(b);
    let decoded = ops
        .by_ref()
        .map(|op| match op {
            OpRef::Put(k, v) => Op::Put(k.to_vec(), v.to_vec()),
            OpRef::Delete(k) => Op::Delete(k.to_vec()),
        })
        .collect();
    ops.0.is_empty().then_some(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(i: u8) -> Payload {
        let mut p = Payload::default();
        p.put(&[b'k', i], &[i; 300]);
        p.delete(&[b'd', i]);
        p
    }

    fn expected(i: u8) -> Vec<Op> {
        vec![
            Op::Put(vec![b'k', i], vec![i; 300]),
            Op::Delete(vec![b'd', i]),
        ]
    }

    #[test]
    fn records_come_back_in_order_until_a_torn_one() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("wal");
        let (mut wal, records) = Wal::open(&path, 7).expect("open");
        assert!(records.is_empty());
        for i in 0..3 {
            wal.append(&mut payload(i)).expect("append");
        }
        let torn_at = wal.len();
        wal.append(&mut payload(3)).expect("append");
        // A crash in the middle of the last record: its tail never reached the disk.
        wal.file
            .write_all_at(&[0xAA; 10], torn_at + 30)
            .expect("tear");
        drop(wal);
        let (wal, records) = Wal::open(&path, 7).expect("reopen");
        assert_eq!(records, (0..3).map(expected).collect::<Vec<_>>());
        assert_eq!(wal.len(), torn_at, "the next record replaces the torn one");
    }

    #[test]
    fn a_reused_buffer_starts_empty_and_writes_only_its_own_record() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("wal");
        let (mut wal, _) = Wal::open(&path, 4).expect("open");
        let mut first = payload(1);
        first.put(b"long", &[7; 2000]);
        wal.append(&mut first).expect("append");
        // The next payload takes the first's allocation, header and all.
        let mut second = Payload::with_buffer(first.into_buffer());
        assert!(second.is_empty());
        assert_eq!(second.ops_from(0).count(), 0);
        second.put(&[b'k', 2], &[2; 300]);
        second.delete(&[b'd', 2]);
        assert_eq!(second.len(), 1 + 4 + 2 + 4 + 300 + 1 + 4 + 2);
        wal.append(&mut second).expect("append");
        drop(wal);
        let (_, records) = Wal::open(&path, 4).expect("reopen");
        assert_eq!(records.len(), 2);
        assert_eq!(records[1], expected(2));
    }

    #[test]
    fn records_of_an_older_epoch_are_ignored() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("wal");
        let (mut wal, _) = Wal::open(&path, 1).expect("open");
        for i in 0..3 {
            wal.append(&mut payload(i)).expect("append");
        }
        // A checkpoint: epoch 2 starts over the old records.
        wal.restart(2);
        wal.append(&mut payload(9)).expect("append");
        drop(wal);
        let (_, records) = Wal::open(&path, 2).expect("reopen");
        assert_eq!(
            records,
            vec![expected(9)],
            "epoch 1's later records are not replayed"
        );
        let (_, records) = Wal::open(&path, 3).expect("reopen");
        assert!(records.is_empty());
    }

    #[test]
    fn the_file_grows_in_steps_not_per_record() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("wal");
        let (mut wal, _) = Wal::open(&path, 0).expect("open");
        wal.append(&mut payload(1)).expect("append");
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), GROW);
        let mut big = Payload::default();
        big.put(b"big", &vec![1u8; GROW as usize + 10]);
        wal.append(&mut big).expect("append");
        assert!(std::fs::metadata(&path).expect("meta").len() >= wal.len());
    }
}
