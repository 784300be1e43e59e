//! One change as the watch cache keeps it: shared by the history, the
//! current state (its object) and every watcher, and encoded once per form
//! a watcher asks for (version and media type), whatever the number of
//! watchers of that form.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::CachedObject;
use crate::status::ApiError;
use crate::storage::{EventType, Revision};

/// An event's object converted to another version (its JSON), computed once
/// and awaited by every watcher of that version: whoever polls drives it,
/// and no watcher blocks a thread or holds a lock while it runs.
pub type Conversion = Shared<BoxFuture<'static, Result<Bytes, ApiError>>>;

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
    /// Conversions of the object (`false`) or of its old state (`true`, for
    /// a watcher whose selector it left) by version. The lock is held only
    /// to find or insert one, never while it runs.
    conversions: Mutex<Vec<(String, bool, Conversion)>>,
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
            conversions: Mutex::new(Vec::new()),
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

    /// The conversion of the object (`old`: of its old state) to
    /// `api_version` already started, unless it failed (a later watcher
    /// tries again).
    pub fn conversion(&self, api_version: &str, old: bool) -> Option<Conversion> {
        let all = self.conversions.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .find(|(v, o, c)| v == api_version && *o == old && !failed(c))
            .map(|(_, _, c)| c.clone())
    }

    /// Starts sharing `convert` as the conversion of the object (`old`: of
    /// its old state) to `api_version`, or returns the one another watcher
    /// started first. Its bytes count against the history's budget.
    pub fn start_conversion(
        &self,
        api_version: &str,
        old: bool,
        convert: BoxFuture<'static, Result<Bytes, ApiError>>,
    ) -> Conversion {
        let mut all = self.conversions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, c)) = all
            .iter()
            .find(|(v, o, c)| v == api_version && *o == old && !failed(c))
        {
            return c.clone();
        }
        all.retain(|(v, o, _)| !(v == api_version && *o == old));
        let ledger = self.ledger.clone();
        let cost = api_version.len() as u64;
        let shared = convert
            .inspect(move |r| {
                let bytes = r.as_ref().map_or(0, Bytes::len) as u64;
                ledger.fetch_add(cost + bytes, Ordering::Relaxed);
            })
            .boxed()
            .shared();
        all.push((api_version.to_string(), old, shared.clone()));
        shared
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
        let conversions = self
            .conversions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(v, _, c)| {
                let bytes = match c.peek() {
                    Some(Ok(b)) => b.len(),
                    _ => 0,
                };
                (v.len() + bytes) as u64
            })
            .sum::<u64>();
        json + conversions
            + cached
                .iter()
                .map(|(k, f)| (k.len() + f.as_ref().map_or(0, Bytes::len)) as u64)
                .sum::<u64>()
    }
}

fn failed(c: &Conversion) -> bool {
    matches!(c.peek(), Some(Err(_)))
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
