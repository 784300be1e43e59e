//! Snapshots of a whole shard: `kshard snapshot save` takes one from a
//! running server (or straight from a TiKV store), `kshard snapshot restore`
//! writes one into a new embedded data directory or a TiKV prefix, and
//! `kshard snapshot status` checks a file. This is how a shard is backed up,
//! and how it moves between engines.
//!
//! - **What is in it** (`format.rs`): every live object as stored (its JSON,
//!   whose `metadata.resourceVersion` is the revision it was written at)
//!   and the store's revision counter, all as of one revision, in key
//!   order, in checksummed frames with a header and a trailer. History
//!   (`v/` versions below the newest, the `l/` event log) is not: a
//!   restored shard starts with its history compacted at its revision, so
//!   a watch or list from an older revision gets 410 and the client
//!   re-lists, as after an etcd restore.
//! - **Consistency** (`save.rs`): one engine read view ([`Engine::read`]) is
//!   a snapshot of whole transactions — redb's read transaction (the
//!   embedded engine first commits every write its log made durable, so the
//!   view holds every acknowledged write), TiKV's snapshot at a timestamp
//!   taken after every acknowledged commit. The revision is the counter read
//!   in that same view.
//! - **Streaming**: the server reads a chunk of about [`format::CHUNK_BYTES`]
//!   at a time on a blocking thread and hands it to the response through a
//!   channel of a few chunks, so a slow client slows the reader
//!   (backpressure) and neither side holds more than a few chunks.
//! - **Who may** (`GET /kshard/snapshot`, [`crate::api::request::SNAPSHOT_PATH`]):
//!   `system:masters`; behind a host also whoever the host's authorizer allows
//!   `get` on that non-resource URL. Standalone, only `system:masters`.
//! - **Restore** (`restore.rs`) checks the whole file before it writes
//!   anything, writes into a temporary store (embedded: a file renamed over
//!   the target at the end) or under a marker key (TiKV: `m/restoring`, which
//!   a server refuses to start on) and finishes with the revision counter.
//!
//! [`Engine::read`]: crate::storage::Engine::read

pub mod cli;
pub mod format;
pub mod restore;
pub mod save;
pub mod serve;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Format(#[from] format::FormatError),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The target cannot take the restore (not empty, in use).
    #[error("{0}")]
    Refused(String),
    /// The server answered with an error.
    #[error("the server refused the snapshot ({status}): {message}")]
    Server { status: u16, message: String },
    /// The server could not be reached or its answer not read.
    #[error("{0}")]
    Client(String),
}

impl SnapshotError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SnapshotError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Objects and bytes so far, on stderr: rewritten in place on a terminal,
/// a line every few seconds otherwise (a log).
pub struct Progress {
    label: &'static str,
    started: Instant,
    last: Option<Instant>,
    terminal: bool,
    quiet: bool,
    /// A line is on the terminal that `done` ends.
    printed: bool,
}

impl Progress {
    pub fn new(label: &'static str, quiet: bool) -> Self {
        let now = Instant::now();
        Self {
            label,
            started: now,
            // The first line after one interval: a quick run prints none.
            last: Some(now),
            terminal: std::io::stderr().is_terminal(),
            quiet,
            printed: false,
        }
    }

    pub fn update(&mut self, objects: u64, bytes: u64) {
        let every = if self.terminal {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(5)
        };
        if self.quiet || self.last.is_some_and(|l| l.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        let line = format!(
            "{}: {objects} objects, {} ({:.1} s)",
            self.label,
            human_bytes(bytes),
            self.started.elapsed().as_secs_f64()
        );
        if self.terminal {
            self.printed = true;
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }

    /// Ends the progress line; returns the time taken.
    pub fn done(&mut self) -> Duration {
        if self.terminal && self.printed && !self.quiet {
            eprintln!();
            self.printed = false;
        }
        self.started.elapsed()
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
