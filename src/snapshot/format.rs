//! The snapshot file, version 1. Everything is in frames, so a reader never
//! holds more than one (at most [`MAX_FRAME`] bytes) and a broken file is
//! found where it breaks:
//!
//! ```text
//! file   = MAGIC header objects* trailer
//! frame  = tag:u8 | length:u32le | payload[length] | crc32(tag, length, payload):u32le
//! header = 'H' frame, JSON [`Header`]
//! objects= 'O' frame: count:u32le, then per object
//!          key_len:u32le key revision:u64le json_len:u32le json
//! trailer= 'T' frame, JSON [`Trailer`]: the object count, their bytes and
//!          the SHA-256 of every byte before the trailer frame
//! error  = 'E' frame, UTF-8: the server failed while streaming (never in a
//!          saved file: the client refuses it)
//! ```
//!
//! Objects come in key order, each once, as stored: their JSON carries
//! `metadata.resourceVersion` equal to the revision beside it, at most the
//! header's revision. The decoder checks all of that, so a restore can trust
//! what it verified.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"KSHARDSN";
/// The version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The largest frame a reader accepts: a chunk of [`CHUNK_BYTES`] plus one
/// object of the largest size a write may store, with room to spare.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;
/// An objects frame is closed once it holds this much.
pub const CHUNK_BYTES: usize = 1024 * 1024;

const TAG_HEADER: u8 = b'H';
const TAG_OBJECTS: u8 = b'O';
const TAG_TRAILER: u8 = b'T';
const TAG_ERROR: u8 = b'E';
/// Tag and length before a frame's payload; its checksum after it.
const FRAME_HEAD: usize = 5;
const FRAME_TAIL: usize = 4;

/// What the snapshot is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    pub format_version: u32,
    pub kshard_version: String,
    /// The engine it was taken from (`embedded`, `tikv`).
    pub engine: String,
    /// A shared store's shard (TiKV's `?prefix=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Every object is as of this revision: the store's counter then.
    pub revision: u64,
    /// The source's compaction mark then (history is not in the file).
    pub compacted_revision: u64,
    /// RFC 3339, UTC.
    pub created_at: String,
}

/// The end of a whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trailer {
    pub objects: u64,
    /// The objects' JSON, summed.
    pub object_bytes: u64,
    /// SHA-256 (hex) of every byte of the file before the trailer frame.
    pub sha256: String,
}

/// One stored object: its store key, the revision it was written at and its JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub revision: u64,
    pub json: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a kshard snapshot (the file does not start with {MAGIC:?})")]
    NotASnapshot,
    #[error("snapshot format version {0} is not supported by this kshard (it reads version {FORMAT_VERSION})")]
    UnsupportedVersion(u32),
    #[error("the snapshot is truncated: it ends at byte {offset}, after {objects} objects, without its trailer")]
    Truncated { offset: u64, objects: u64 },
    #[error("the snapshot is corrupted: frame at byte {offset} fails its checksum")]
    Checksum { offset: u64 },
    #[error("the snapshot is corrupted at byte {offset}: {why}")]
    Corrupt { offset: u64, why: String },
    #[error("the snapshot is corrupted: its trailer says {what}")]
    Mismatch { what: String },
    #[error("the server failed while taking the snapshot: {0}")]
    ServerFailed(String),
}

/// Frames with their checksums; the running digest covers every byte up to
/// the trailer.
#[derive(Default)]
pub struct Encoder {
    digest: Sha256,
    objects: u64,
    object_bytes: u64,
}

fn frame(tag: u8, payload: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(FRAME_HEAD + payload.len() + FRAME_TAIL);
    out.put_u8(tag);
    out.put_u32_le(payload.len() as u32);
    out.put_slice(payload);
    let crc = crc32fast::hash(&out);
    out.put_u32_le(crc);
    out
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The magic bytes and the header frame.
    pub fn start(&mut self, header: &Header) -> Bytes {
        let json = serde_json::to_vec(header).unwrap_or_default();
        let mut out = BytesMut::from(&MAGIC[..]);
        out.extend_from_slice(&frame(TAG_HEADER, &json));
        self.digest.update(&out);
        out.freeze()
    }

    /// One objects frame.
    pub fn objects(&mut self, entries: &[Entry]) -> Bytes {
        let size: usize = entries
            .iter()
            .map(|e| 16 + e.key.len() + e.json.len())
            .sum();
        let mut payload = BytesMut::with_capacity(4 + size);
        payload.put_u32_le(entries.len() as u32);
        for e in entries {
            payload.put_u32_le(e.key.len() as u32);
            payload.put_slice(e.key.as_bytes());
            payload.put_u64_le(e.revision);
            payload.put_u32_le(e.json.len() as u32);
            payload.put_slice(&e.json);
            self.object_bytes += e.json.len() as u64;
        }
        self.objects += entries.len() as u64;
        let out = frame(TAG_OBJECTS, &payload);
        self.digest.update(&out);
        out.freeze()
    }

    /// The trailer; the file is whole after it.
    pub fn finish(self) -> (Bytes, Trailer) {
        let trailer = Trailer {
            objects: self.objects,
            object_bytes: self.object_bytes,
            sha256: hex(&self.digest.finalize()),
        };
        let json = serde_json::to_vec(&trailer).unwrap_or_default();
        (frame(TAG_TRAILER, &json).freeze(), trailer)
    }

    /// An error frame: the stream ends without a trailer, and says why.
    pub fn error(message: &str) -> Bytes {
        frame(TAG_ERROR, message.as_bytes()).freeze()
    }

    pub fn objects_so_far(&self) -> (u64, u64) {
        (self.objects, self.object_bytes)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the decoder found next.
#[derive(Debug)]
pub enum Item {
    Header(Header),
    Objects(Vec<Entry>),
    /// The trailer, checked against everything before it.
    End(Trailer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Magic,
    Header,
    Objects,
    Nothing,
}

/// Checks a snapshot as its bytes arrive (`push`) and hands out what it
/// checked (`next_item`). It holds at most one frame beyond what was pushed last.
pub struct Decoder {
    buf: BytesMut,
    /// File offset of `buf`'s first byte.
    offset: u64,
    expect: Expect,
    digest: Sha256,
    header: Option<Header>,
    last_key: Option<String>,
    objects: u64,
    object_bytes: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Only the resourceVersion of a stored object, to check it against its
/// revision; the rest is checked to be JSON and skipped.
#[derive(Deserialize)]
struct Stored<'a> {
    #[serde(borrow)]
    metadata: StoredMeta<'a>,
}

#[derive(Deserialize)]
struct StoredMeta<'a> {
    #[serde(rename = "resourceVersion", borrow, default)]
    resource_version: Option<std::borrow::Cow<'a, str>>,
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            buf: BytesMut::new(),
            offset: 0,
            expect: Expect::Magic,
            digest: Sha256::new(),
            header: None,
            last_key: None,
            objects: 0,
            object_bytes: 0,
        }
    }

    /// More bytes of the file.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The header, once read.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Objects and their JSON bytes so far.
    pub fn progress(&self) -> (u64, u64) {
        (self.objects, self.object_bytes)
    }

    /// Bytes taken so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    fn corrupt(&self, at: u64, why: impl Into<String>) -> FormatError {
        FormatError::Corrupt {
            offset: at,
            why: why.into(),
        }
    }

    /// The next item whose bytes are all pushed and check out; `None` when
    /// more bytes are needed.
    pub fn next_item(&mut self) -> Result<Option<Item>, FormatError> {
        if self.expect == Expect::Magic {
            if self.buf.len() < MAGIC.len() {
                // A short file that is not even the magic's beginning is no snapshot.
                if !MAGIC.starts_with(&self.buf) {
                    return Err(FormatError::NotASnapshot);
                }
                return Ok(None);
            }
            if &self.buf[..MAGIC.len()] != MAGIC {
                return Err(FormatError::NotASnapshot);
            }
            let magic = self.buf.split_to(MAGIC.len());
            self.digest.update(&magic);
            self.offset += magic.len() as u64;
            self.expect = Expect::Header;
        }
        if self.buf.len() < FRAME_HEAD {
            return Ok(None);
        }
        let at = self.offset;
        let tag = self.buf[0];
        let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.expect == Expect::Nothing {
            return Err(self.corrupt(at, "data after the trailer"));
        }
        if !matches!(tag, TAG_HEADER | TAG_OBJECTS | TAG_TRAILER | TAG_ERROR) {
            return Err(self.corrupt(at, format!("unknown frame tag {tag:#04x}")));
        }
        if len > MAX_FRAME {
            return Err(self.corrupt(at, format!("a frame of {len} bytes (at most {MAX_FRAME})")));
        }
        let whole = FRAME_HEAD + len + FRAME_TAIL;
        if self.buf.len() < whole {
            return Ok(None);
        }
        let raw = self.buf.split_to(whole).freeze();
        self.offset += whole as u64;
        let body = &raw[..FRAME_HEAD + len];
        let crc = u32::from_le_bytes([
            raw[whole - 4],
            raw[whole - 3],
            raw[whole - 2],
            raw[whole - 1],
        ]);
        if crc32fast::hash(body) != crc {
            return Err(FormatError::Checksum { offset: at });
        }
        let payload = raw.slice(FRAME_HEAD..FRAME_HEAD + len);
        match (tag, self.expect) {
            (TAG_ERROR, _) => Err(FormatError::ServerFailed(
                String::from_utf8_lossy(&payload).into_owned(),
            )),
            (TAG_HEADER, Expect::Header) => {
                self.digest.update(&raw);
                let header: Header = serde_json::from_slice(&payload)
                    .map_err(|e| self.corrupt(at, format!("header: {e}")))?;
                if header.format_version != FORMAT_VERSION {
                    return Err(FormatError::UnsupportedVersion(header.format_version));
                }
                self.header = Some(header.clone());
                self.expect = Expect::Objects;
                Ok(Some(Item::Header(header)))
            }
            (TAG_OBJECTS, Expect::Objects) => {
                self.digest.update(&raw);
                let entries = self.entries(at, payload)?;
                Ok(Some(Item::Objects(entries)))
            }
            (TAG_TRAILER, Expect::Objects) => {
                let trailer: Trailer = serde_json::from_slice(&payload)
                    .map_err(|e| self.corrupt(at, format!("trailer: {e}")))?;
                let digest = hex(&std::mem::take(&mut self.digest).finalize());
                if trailer.objects != self.objects {
                    return Err(FormatError::Mismatch {
                        what: format!(
                            "{} objects, the file holds {}",
                            trailer.objects, self.objects
                        ),
                    });
                }
                if trailer.object_bytes != self.object_bytes {
                    return Err(FormatError::Mismatch {
                        what: format!(
                            "{} bytes of objects, the file holds {}",
                            trailer.object_bytes, self.object_bytes
                        ),
                    });
                }
                if trailer.sha256 != digest {
                    return Err(FormatError::Mismatch {
                        what: format!("SHA-256 {}, the file's is {digest}", trailer.sha256),
                    });
                }
                self.expect = Expect::Nothing;
                Ok(Some(Item::End(trailer)))
            }
            (_, Expect::Header) => Err(self.corrupt(at, "the file does not begin with its header")),
            (_, _) => Err(self.corrupt(at, format!("a frame {:?} out of place", tag as char))),
        }
    }

    /// Call at the end of the input: the file must have ended with its trailer.
    pub fn finish(&self) -> Result<(), FormatError> {
        if self.expect == Expect::Magic && self.buf.is_empty() && self.offset == 0 {
            return Err(FormatError::NotASnapshot);
        }
        if self.expect != Expect::Nothing {
            return Err(FormatError::Truncated {
                offset: self.offset + self.buf.len() as u64,
                objects: self.objects,
            });
        }
        if !self.buf.is_empty() {
            return Err(self.corrupt(self.offset, "data after the trailer"));
        }
        Ok(())
    }

    fn entries(&mut self, at: u64, mut p: Bytes) -> Result<Vec<Entry>, FormatError> {
        let revision = self.header.as_ref().map_or(0, |h| h.revision);
        let short = |what: &str| format!("objects frame ends inside {what}");
        if p.remaining() < 4 {
            return Err(self.corrupt(at, short("its count")));
        }
        let count = p.get_u32_le() as usize;
        // Each entry takes at least 16 bytes: a count beyond that is a lie.
        if count > p.remaining() / 16 {
            return Err(self.corrupt(at, format!("objects frame claims {count} objects")));
        }
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            if p.remaining() < 4 {
                return Err(self.corrupt(at, short("a key")));
            }
            let key_len = p.get_u32_le() as usize;
            if p.remaining() < key_len + 12 {
                return Err(self.corrupt(at, short("a key")));
            }
            let key = p.split_to(key_len);
            let rev = p.get_u64_le();
            let json_len = p.get_u32_le() as usize;
            if p.remaining() < json_len {
                return Err(self.corrupt(at, short("an object")));
            }
            let json = p.split_to(json_len);
            let key = std::str::from_utf8(&key)
                .map_err(|_| self.corrupt(at, "a key that is not UTF-8"))?
                .to_string();
            if key.is_empty() {
                return Err(self.corrupt(at, "an empty key"));
            }
            if self.last_key.as_ref().is_some_and(|last| *last >= key) {
                return Err(self.corrupt(at, format!("key {key:?} out of order")));
            }
            if rev == 0 || rev > revision {
                return Err(self.corrupt(
                    at,
                    format!("{key:?} at revision {rev}, outside 1..={revision}"),
                ));
            }
            let stored: Stored<'_> = serde_json::from_slice(&json)
                .map_err(|e| self.corrupt(at, format!("{key:?} is not an object's JSON: {e}")))?;
            let rv = stored.metadata.resource_version.unwrap_or_default();
            if rv != rev.to_string() {
                return Err(self.corrupt(
                    at,
                    format!("{key:?} has resourceVersion {rv:?}, stored at revision {rev}"),
                ));
            }
            self.objects += 1;
            self.object_bytes += json.len() as u64;
            self.last_key = Some(key.clone());
            out.push(Entry {
                key,
                revision: rev,
                json,
            });
        }
        if p.has_remaining() {
            return Err(self.corrupt(at, "bytes left over in an objects frame"));
        }
        Ok(out)
    }
}

/// Reads a snapshot from `r` to its end, checking everything, and hands
/// each item to `each`. Returns the header and trailer.
pub fn read_all(
    mut r: impl std::io::Read,
    mut each: impl FnMut(&Decoder, Item) -> Result<(), crate::snapshot::SnapshotError>,
) -> Result<(Header, Trailer), crate::snapshot::SnapshotError> {
    let mut d = Decoder::new();
    let mut block = vec![0u8; 256 * 1024];
    let mut trailer = None;
    loop {
        let n = r
            .read(&mut block)
            .map_err(|e| crate::snapshot::SnapshotError::io("reading the snapshot", e))?;
        if n == 0 {
            break;
        }
        d.push(&block[..n]);
        while let Some(item) = d.next_item()? {
            if let Item::End(t) = &item {
                trailer = Some(t.clone());
            }
            each(&d, item)?;
        }
    }
    d.finish()?;
    match (d.header().cloned(), trailer) {
        (Some(h), Some(t)) => Ok((h, t)),
        // `finish` refuses a file without either.
        _ => Err(FormatError::Truncated {
            offset: d.offset(),
            objects: d.progress().0,
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(revision: u64) -> Header {
        Header {
            format_version: FORMAT_VERSION,
            kshard_version: "test".into(),
            engine: "embedded".into(),
            shard: None,
            revision,
            compacted_revision: 0,
            created_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn entry(key: &str, rev: u64) -> Entry {
        Entry {
            key: key.into(),
            revision: rev,
            json: Bytes::from(format!(
                r#"{{"apiVersion":"v1","metadata":{{"name":"{key}","resourceVersion":"{rev}"}}}}"#
            )),
        }
    }

    fn file(entries: &[Vec<Entry>], revision: u64) -> Vec<u8> {
        let mut e = Encoder::new();
        let mut out = e.start(&header(revision)).to_vec();
        for chunk in entries {
            out.extend_from_slice(&e.objects(chunk));
        }
        out.extend_from_slice(&e.finish().0);
        out
    }

    fn decode(bytes: &[u8], step: usize) -> Result<(Vec<Entry>, Trailer), FormatError> {
        let mut d = Decoder::new();
        let mut got = Vec::new();
        let mut end = None;
        for piece in bytes.chunks(step.max(1)) {
            d.push(piece);
            while let Some(item) = d.next_item()? {
                match item {
                    Item::Header(h) => assert_eq!(h.revision, 9),
                    Item::Objects(o) => got.extend(o),
                    Item::End(t) => end = Some(t),
                }
            }
        }
        d.finish()?;
        Ok((got, end.expect("trailer")))
    }

    fn sample() -> (Vec<Vec<Entry>>, Vec<u8>) {
        let chunks = vec![
            vec![entry("a/1", 3), entry("a/2", 9)],
            vec![],
            vec![entry("b/1", 1)],
        ];
        let bytes = file(&chunks, 9);
        (chunks, bytes)
    }

    #[test]
    fn round_trips_in_any_pieces() {
        let (chunks, bytes) = sample();
        let want: Vec<Entry> = chunks.concat();
        for step in [1, 3, 7, 64, bytes.len()] {
            let (got, trailer) = decode(&bytes, step).expect("decodes");
            assert_eq!(got, want, "step {step}");
            assert_eq!(trailer.objects, 3);
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let (_, bytes) = sample();
        for cut in 0..bytes.len() {
            let err = decode(&bytes[..cut], 5).expect_err("a cut file");
            assert!(
                matches!(
                    err,
                    FormatError::Truncated { .. } | FormatError::NotASnapshot
                ),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let (_, bytes) = sample();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x20;
            assert!(decode(&bad, 11).is_err(), "byte {i} flipped went unnoticed");
        }
    }

    #[test]
    fn a_reordered_file_with_fresh_checksums_fails_the_digest_or_order() {
        // Frames swapped and re-checksummed: each frame checks out, the order does not.
        let mut e = Encoder::new();
        let mut out = e.start(&header(9)).to_vec();
        out.extend_from_slice(&e.objects(&[entry("b/1", 1)]));
        out.extend_from_slice(&e.objects(&[entry("a/1", 3)]));
        out.extend_from_slice(&e.finish().0);
        let err = decode(&out, 64).expect_err("out of order");
        assert!(err.to_string().contains("out of order"), "{err}");
    }

    #[test]
    fn objects_must_match_their_revision_and_the_header() {
        let mut wrong_rv = entry("a/1", 3);
        wrong_rv.revision = 4;
        let bad = file(&[vec![wrong_rv]], 9);
        assert!(decode(&bad, 64).is_err());
        let beyond = file(&[vec![entry("a/1", 10)]], 9);
        assert!(decode(&beyond, 64).is_err());
    }

    #[test]
    fn an_error_frame_says_why_the_server_stopped() {
        let mut e = Encoder::new();
        let mut out = e.start(&header(9)).to_vec();
        out.extend_from_slice(&Encoder::error("the store went away"));
        match decode(&out, 64) {
            Err(FormatError::ServerFailed(why)) => assert_eq!(why, "the store went away"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_newer_format_is_refused_by_name() {
        let mut h = header(9);
        h.format_version = 2;
        let mut e = Encoder::new();
        let out = e.start(&h).to_vec();
        assert!(matches!(
            decode(&out, 64),
            Err(FormatError::UnsupportedVersion(2))
        ));
    }
}
