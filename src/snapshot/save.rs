//! Taking a snapshot: [`Source`] reads an engine's objects in one read view,
//! a chunk at a time; [`write_from_engine`] saves one straight from a store
//! (TiKV, with no server); [`save_via_api`] streams one from a running
//! server into a file.

use std::collections::VecDeque;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::format::{self, Decoder, Encoder, Entry, Header, Item, Trailer};
use super::{Progress, SnapshotError};
use crate::storage::engine::{Engine, ReadTxn};
use crate::storage::{keys, StorageError};

/// Keys looked up together at first; then as many as make a chunk at the
/// sizes seen so far, within these bounds.
const FIRST_BATCH: usize = 32;
const MAX_BATCH: usize = 512;

/// The objects of one engine read view, in key order.
pub struct Source<'e> {
    txn: Box<dyn ReadTxn + 'e>,
    /// The store's revision counter in the view: every object is as of it.
    pub revision: u64,
    pub compacted: u64,
    /// Where the next `k/` scan starts.
    next: Vec<u8>,
    end: Vec<u8>,
    scanned_all: bool,
    /// Objects read but not yet handed out (they would have overfilled a chunk).
    pending: VecDeque<Entry>,
    batch: usize,
}

impl<'e> Source<'e> {
    /// Opens one read view of `engine`.
    pub fn open(engine: &'e dyn Engine) -> Result<Self, StorageError> {
        let txn = engine.read()?;
        let counter = |key: &[u8]| -> Result<u64, StorageError> {
            Ok(txn
                .get(key)?
                .and_then(|v| keys::decode_u64(&v))
                .unwrap_or(0))
        };
        if txn.get(keys::META_RESTORING)?.is_some() {
            return Err(StorageError::Incomplete(
                "the store holds an unfinished restore; nothing to snapshot".into(),
            ));
        }
        let revision = counter(keys::META_REVISION)?;
        let compacted = counter(keys::META_COMPACT)?;
        Ok(Self {
            txn,
            revision,
            compacted,
            next: keys::LATEST.to_vec(),
            end: keys::prefix_end(keys::LATEST),
            scanned_all: false,
            pending: VecDeque::new(),
            batch: FIRST_BATCH,
        })
    }

    /// The header of a snapshot of this view of `engine`.
    pub fn header(&self, engine: &dyn Engine) -> Header {
        Header {
            format_version: format::FORMAT_VERSION,
            kshard_version: env!("CARGO_PKG_VERSION").to_string(),
            engine: engine.kind().to_string(),
            shard: engine.shard(),
            revision: self.revision,
            compacted_revision: self.compacted,
            created_at: crate::object::now_rfc3339(),
        }
    }

    /// The next live keys and their revisions, at most `n`.
    fn next_keys(&mut self, n: usize) -> Result<Vec<(String, u64)>, StorageError> {
        let mut found = Vec::with_capacity(n);
        let mut last: Option<Vec<u8>> = None;
        let mut error = None;
        let revision = self.revision;
        self.txn.scan(&self.next, &self.end, &mut |k, v| {
            last = Some(k.to_vec());
            let parsed = keys::parse_latest(k).zip(keys::decode_latest(v));
            match parsed {
                Some((_, (_, true))) => {}
                Some((key, (rev, false))) if rev <= revision => {
                    found.push((key.to_string(), rev));
                }
                Some((key, (rev, false))) => {
                    error = Some(StorageError::Corrupt(format!(
                        "{key} at revision {rev}, above the counter {revision}"
                    )));
                    return ControlFlow::Break(());
                }
                None => {
                    error = Some(StorageError::Corrupt(format!(
                        "latest record {}",
                        String::from_utf8_lossy(k)
                    )));
                    return ControlFlow::Break(());
                }
            }
            if found.len() >= n {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if let Some(e) = error {
            return Err(e);
        }
        match last {
            // The scan stopped early (a full batch): go on after its last key.
            Some(mut k) if found.len() >= n => {
                k.push(0);
                self.next = k;
            }
            _ => self.scanned_all = true,
        }
        Ok(found)
    }

    /// The next chunk (about [`format::CHUNK_BYTES`] of objects, or one
    /// larger object); `None` after the last.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<Entry>>, StorageError> {
        let mut chunk = Vec::new();
        let mut bytes = 0usize;
        loop {
            while let Some(e) = self.pending.front() {
                if !chunk.is_empty() && bytes + e.json.len() > format::CHUNK_BYTES {
                    return Ok(Some(chunk));
                }
                bytes += e.json.len();
                chunk.extend(self.pending.pop_front());
            }
            if self.scanned_all {
                return Ok((!chunk.is_empty()).then_some(chunk));
            }
            let found = self.next_keys(self.batch)?;
            if found.is_empty() {
                continue;
            }
            let versions: Vec<Vec<u8>> = found
                .iter()
                .map(|(k, rev)| keys::version(k, *rev))
                .collect();
            let values = self.txn.get_many(&versions)?;
            if values.len() != found.len() {
                return Err(StorageError::Engine("a batch read lost keys".into()));
            }
            let mut read = 0usize;
            for ((key, rev), value) in found.into_iter().zip(values) {
                let json = value.ok_or_else(|| {
                    StorageError::Corrupt(format!("missing version {rev} of {key}"))
                })?;
                read += json.len();
                self.pending.push_back(Entry {
                    key,
                    revision: rev,
                    json: Bytes::from(json),
                });
            }
            // As many keys as fill a chunk at this batch's average size.
            let average = (read / self.pending.len().max(1)).max(1);
            self.batch = (format::CHUNK_BYTES / average).clamp(1, MAX_BATCH);
        }
    }
}

/// What a save wrote.
#[derive(Debug, Clone)]
pub struct Saved {
    pub path: PathBuf,
    pub header: Header,
    pub trailer: Trailer,
    /// The file's size.
    pub bytes: u64,
}

/// The file a save writes before it is whole; renamed at the end, so a
/// failed save never leaves a file under the name asked for.
fn part_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".part");
    PathBuf::from(p)
}

/// Creates the partial file, readable by its owner only: it holds every
/// object, Secrets-like data included.
fn create_private(path: &Path) -> Result<std::fs::File, SnapshotError> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.open(path)
        .map_err(|e| SnapshotError::io(format!("creating {}", path.display()), e))
}

/// Makes the partial file durable and gives it its name.
fn complete(file: std::fs::File, part: &Path, path: &Path) -> Result<(), SnapshotError> {
    file.sync_all()
        .map_err(|e| SnapshotError::io(format!("syncing {}", part.display()), e))?;
    drop(file);
    std::fs::rename(part, path)
        .map_err(|e| SnapshotError::io(format!("renaming to {}", path.display()), e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Saves a snapshot of `engine` (its own read view) to `path`. Blocking.
pub fn write_from_engine(
    engine: &dyn Engine,
    path: &Path,
    progress: &mut Progress,
) -> Result<Saved, SnapshotError> {
    let part = part_path(path);
    let result = (|| {
        let file = create_private(&part)?;
        let mut out = std::io::BufWriter::with_capacity(1024 * 1024, file);
        let mut source = Source::open(engine)?;
        let header = source.header(engine);
        let mut enc = Encoder::new();
        let mut written = 0u64;
        let mut put = |b: &[u8], written: &mut u64| {
            *written += b.len() as u64;
            out.write_all(b)
                .map_err(|e| SnapshotError::io(format!("writing {}", part.display()), e))
        };
        put(&enc.start(&header), &mut written)?;
        while let Some(chunk) = source.next_chunk()? {
            put(&enc.objects(&chunk), &mut written)?;
            let (objects, bytes) = enc.objects_so_far();
            progress.update(objects, bytes);
        }
        let (end, trailer) = enc.finish();
        put(&end, &mut written)?;
        let file = out.into_inner().map_err(|e| {
            SnapshotError::io(format!("writing {}", part.display()), e.into_error())
        })?;
        complete(file, &part, path)?;
        Ok(Saved {
            path: path.to_path_buf(),
            header,
            trailer,
            bytes: written,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

/// Streams a snapshot from the server `client` points at into `path`,
/// checking every frame as it arrives: a file is only named `path` once it
/// is whole and checked.
pub async fn save_via_api(
    client: kube::Client,
    path: &Path,
    progress: &mut Progress,
) -> Result<Saved, SnapshotError> {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;

    let request = http::Request::get(crate::api::request::SNAPSHOT_PATH)
        .header(http::header::ACCEPT, super::serve::CONTENT_TYPE)
        .body(kube::client::Body::empty())
        .map_err(|e| SnapshotError::Client(e.to_string()))?;
    let response = client
        .send(request)
        .await
        .map_err(|e| SnapshotError::Client(format!("requesting the snapshot: {e}")))?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        return Err(refusal(status.as_u16(), body).await);
    }
    let part = part_path(path);
    let file = tokio::task::spawn_blocking({
        let part = part.clone();
        move || create_private(&part)
    })
    .await
    .map_err(|e| SnapshotError::Client(e.to_string()))??;
    let mut out = tokio::io::BufWriter::with_capacity(1024 * 1024, tokio::fs::File::from_std(file));
    let result = async {
        let mut decoder = Decoder::new();
        let mut written = 0u64;
        let mut trailer = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                SnapshotError::Client(format!(
                    "the snapshot stream broke after {written} bytes: {e}"
                ))
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            // Checking a frame (CRC, digest, each object's JSON) is a few
            // milliseconds of CPU per MiB, on this command's own runtime.
            decoder.push(&data);
            // Checked before written: a frame the decoder refuses never
            // reaches the file.
            while let Some(item) = decoder.next_item()? {
                if let Item::End(t) = item {
                    trailer = Some(t);
                }
            }
            out.write_all(&data)
                .await
                .map_err(|e| SnapshotError::io(format!("writing {}", part.display()), e))?;
            written += data.len() as u64;
            let (objects, bytes) = decoder.progress();
            progress.update(objects, bytes);
        }
        decoder.finish()?;
        out.flush()
            .await
            .map_err(|e| SnapshotError::io(format!("writing {}", part.display()), e))?;
        let header = decoder.header().cloned();
        match (header, trailer) {
            (Some(header), Some(trailer)) => Ok((header, trailer, written)),
            _ => Err(SnapshotError::Client(
                "the snapshot stream ended early".into(),
            )),
        }
    }
    .await;
    let file = out.into_inner().into_std().await;
    match result {
        Ok((header, trailer, bytes)) => {
            let (part2, path2) = (part.clone(), path.to_path_buf());
            tokio::task::spawn_blocking(move || complete(file, &part2, &path2))
                .await
                .map_err(|e| SnapshotError::Client(e.to_string()))??;
            Ok(Saved {
                path: path.to_path_buf(),
                header,
                trailer,
                bytes,
            })
        }
        Err(e) => {
            drop(file);
            let _ = tokio::fs::remove_file(&part).await;
            Err(e)
        }
    }
}

/// The server's error answer: its Status message, read within a bound.
async fn refusal(status: u16, body: kube::client::Body) -> SnapshotError {
    use http_body_util::BodyExt;
    const LIMIT: usize = 64 * 1024;
    let text = match http_body_util::Limited::new(body, LIMIT).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let mut message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or(text);
    if status == 404 {
        // A host's aggregator proxies only the APIServices' paths.
        message.push_str(
            " (does the kubeconfig point at kshard itself? /kshard/snapshot is not served through a host)",
        );
    }
    SnapshotError::Server { status, message }
}
