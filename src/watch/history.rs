//! The event history of one resource, which watches resume from: bounded in
//! time (kube-apiserver keeps 75 s), in bytes and in count. A watch from a
//! revision older than the history answers 410 Gone and the client re-lists.
//!
//! Bytes are counted, not only events: a user allowed to update one large
//! object could otherwise grow memory by count × object size. The count
//! bound only caps bookkeeping (kube's cache grows to 100 × 1024 events).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Filter, WatchEvent};
use crate::storage::Revision;

/// How long events are kept by default: kube-apiserver's eventFreshDuration.
pub const DEFAULT_HISTORY_WINDOW: Duration = Duration::from_secs(75);
/// Estimated memory one resource's history may hold by default.
pub const DEFAULT_HISTORY_BYTES: u64 = 64 * 1024 * 1024;
/// Events one resource's history may hold by default (kube's upper bound).
pub const DEFAULT_HISTORY_EVENTS: usize = 100 * 1024;

/// Bytes (objects and frames, as `feed::event_cost` counts them) a watcher
/// may hold queued by default: 16 events of a 1 MB object.
pub const DEFAULT_WATCHER_BYTES: u64 = 32 * 1024 * 1024;
/// How long a watcher may stay behind (events it could not take waiting for
/// it) by default before it is ended.
pub const DEFAULT_WATCHER_GRACE: Duration = Duration::from_secs(5);

/// How much event history each resource keeps, and what each watcher may hold.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLimits {
    /// Events older than this go.
    pub window: Duration,
    /// Estimated bytes (objects and the frames built for them) it may hold.
    pub bytes: u64,
    /// Events it may hold.
    pub events: usize,
    /// Bytes one watcher may hold queued; beyond them it falls behind and
    /// is caught up from the history once it reads.
    pub watcher_bytes: u64,
    /// How long a watcher may stay behind before it is ended.
    pub watcher_grace: Duration,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self {
            window: DEFAULT_HISTORY_WINDOW,
            bytes: DEFAULT_HISTORY_BYTES,
            events: DEFAULT_HISTORY_EVENTS,
            watcher_bytes: DEFAULT_WATCHER_BYTES,
            watcher_grace: DEFAULT_WATCHER_GRACE,
        }
    }
}

pub(super) struct History {
    events: VecDeque<(Instant, Arc<WatchEvent>)>,
    /// Every event of the resource after this revision is in `events`.
    complete_after: Revision,
    /// Estimated memory of `events`, frames built after they came included.
    bytes: Arc<AtomicU64>,
}

impl History {
    pub fn new(complete_after: Revision) -> Self {
        Self {
            events: VecDeque::new(),
            complete_after,
            bytes: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Where an event of this history counts the frames built for it.
    pub fn ledger(&self) -> Arc<AtomicU64> {
        self.bytes.clone()
    }

    pub fn push(&mut self, at: Instant, ev: Arc<WatchEvent>, limits: &HistoryLimits) {
        self.bytes.fetch_add(ev.object.cost(), Ordering::Relaxed);
        self.events.push_back((at, ev));
        self.trim(at, limits);
    }

    /// Drops the oldest events while any bound is exceeded.
    pub fn trim(&mut self, now: Instant, limits: &HistoryLimits) {
        while let Some((at, ev)) = self.events.front() {
            let expired = now.saturating_duration_since(*at) > limits.window;
            let over = self.events.len() > limits.events || self.bytes() > limits.bytes;
            if !expired && !over {
                break;
            }
            self.complete_after = ev.revision;
            let cost = ev.object.cost() + ev.encoded_bytes();
            // Saturating: a frame may have been counted after we read it.
            let _ = self
                .bytes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                    Some(b.saturating_sub(cost))
                });
            self.events.pop_front();
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// The events after `rev` that concern `filter`, or the oldest revision
    /// the history can resume from when `rev` is older.
    pub fn since(&self, rev: Revision, filter: &Filter) -> Result<Vec<Arc<WatchEvent>>, Revision> {
        if rev < self.complete_after {
            return Err(self.complete_after);
        }
        // Events are in revision order: skip the older ones by binary search.
        let start = self.events.partition_point(|(_, e)| e.revision <= rev);
        Ok(self
            .events
            .range(start..)
            .filter(|(_, e)| super::cache::interested(filter, e))
            .map(|(_, e)| e.clone())
            .collect())
    }
}
