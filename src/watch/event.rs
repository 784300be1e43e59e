//! One change as the watch cache keeps it: shared by the history, the
//! current state (its object) and every watcher, and encoded once per form
//! a watcher asks for (version and media type), whatever the number of
//! watchers of that form.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use super::CachedObject;
use crate::storage::{EventType, Revision};

#[derive(Debug)]
pub struct WatchEvent {
    pub kind: EventType,
    pub revision: Revision,
    pub object: Arc<CachedObject>,
    /// The previous state for modifications and deletions (selector transitions need it).
    pub prev: Option<Arc<CachedObject>>,
    /// Frames built so far, by form. The first watcher of a form encodes
    /// under the lock; the others of that form wait for it and share the
    /// bytes rather than encoding the same frame again.
    encodings: Mutex<Vec<(String, Option<Bytes>)>>,
    /// The storage version's JSON frame, the form nearly every watcher
    /// takes: read without a lock once built.
    json: OnceLock<Bytes>,
    /// Where the bytes of frames built later are counted (the history's
    /// byte budget covers them).
    ledger: Arc<AtomicU64>,
}

impl WatchEvent {
    pub fn new(
        kind: EventType,
        revision: Revision,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
        ledger: Arc<AtomicU64>,
    ) -> Self {
        Self {
            kind,
            revision,
            object,
            prev,
            encodings: Mutex::new(Vec::new()),
            json: OnceLock::new(),
            ledger,
        }
    }

    /// The frame of this event in the form `form` names (any string that
    /// tells forms apart: frame type, version, media type), built by
    /// `encode` on first use and shared after. `None` (the event is not sent
    /// in that form) is remembered too.
    pub fn encoded(&self, form: &str, encode: impl FnOnce() -> Option<Bytes>) -> Option<Bytes> {
        let mut cached = self.encodings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = cached.iter().find(|(k, _)| k == form) {
            return f.clone();
        }
        let f = encode();
        let cost = (form.len() + f.as_ref().map_or(0, Bytes::len)) as u64;
        self.ledger.fetch_add(cost, Ordering::Relaxed);
        cached.push((form.to_string(), f.clone()));
        f
    }

    /// The JSON watch frame for this event's own type and object, encoded once.
    pub fn json_frame(&self) -> Bytes {
        self.json
            .get_or_init(|| {
                let f = frame(self.kind.as_str(), &self.object.json);
                self.ledger.fetch_add(f.len() as u64, Ordering::Relaxed);
                f
            })
            .clone()
    }

    /// Bytes the frames built so far hold.
    pub fn encoded_bytes(&self) -> u64 {
        let cached = self.encodings.lock().unwrap_or_else(|e| e.into_inner());
        let json = self.json.get().map_or(0, Bytes::len) as u64;
        json + cached
            .iter()
            .map(|(k, f)| (k.len() + f.as_ref().map_or(0, Bytes::len)) as u64)
            .sum::<u64>()
    }
}

/// Builds one JSON watch frame around already-encoded object bytes.
pub fn frame(kind: &str, object_json: &[u8]) -> Bytes {
    let mut buf = Vec::with_capacity(object_json.len() + 32);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(kind.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    buf.extend_from_slice(object_json);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}
