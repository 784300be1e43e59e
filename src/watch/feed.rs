//! A watcher's feed: the events the cache hands it, one item per run (the
//! events of one resource from one commit) rather than per event. Every
//! watcher that takes a whole run shares it, and with it the run's frames
//! joined once: under load a commit costs each watcher one queue item, one
//! wake and one write, with no copy of its own.
//!
//! A feed is bounded in events and in bytes (what its events pin: their
//! objects and frames). The cache never waits for a reader: a run that does
//! not fit is not queued, and the cache catches the watcher up from its
//! history once it has read, or ends it ([`FeedSender::terminate`], which
//! frees what it held at once) when it stays behind past a grace.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::Bytes;
use tokio::sync::Notify;

use super::WatchEvent;

/// Consecutive events of one resource, in revision order.
#[derive(Debug)]
pub struct EventRun {
    pub events: Vec<Arc<WatchEvent>>,
    /// Memory the events pin while a watcher holds them (see [`event_cost`]).
    cost: u64,
    /// The events' storage-form JSON frames joined, built by the first
    /// watcher that sends the whole run in that form.
    joined: OnceLock<Bytes>,
    /// This run's frames joined with those of the runs after it, as the
    /// last watcher to take them together took them: watchers woken by the
    /// same commits take the same runs, and share one buffer.
    joined_on: std::sync::Mutex<Option<(Vec<Arc<EventRun>>, Bytes)>>,
}

/// What a queued event pins, roughly: its object's bytes and the frame
/// built from them (a watcher holding an event that left the history is
/// what keeps both alive; a frame in another form is about as large).
pub fn event_cost(ev: &WatchEvent) -> u64 {
    2 * ev.object.json.len() as u64 + 128
}

impl EventRun {
    pub fn new(events: Vec<Arc<WatchEvent>>) -> Self {
        let cost = events.iter().map(|e| event_cost(e)).sum();
        Self {
            events,
            cost,
            joined: OnceLock::new(),
            joined_on: std::sync::Mutex::new(None),
        }
    }

    /// Memory the run's events pin (see [`event_cost`]).
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The storage-form frames of consecutive whole `runs` as one buffer,
    /// shared with every watcher that takes the same runs together.
    pub fn joined_runs(runs: &[Arc<EventRun>]) -> Bytes {
        let [first, rest @ ..] = runs else {
            return Bytes::new();
        };
        if rest.is_empty() {
            return first.joined_json();
        }
        let mut slot = first.joined_on.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((after, bytes)) = slot.as_ref() {
            if after.len() == rest.len() && after.iter().zip(rest).all(|(a, b)| Arc::ptr_eq(a, b)) {
                return bytes.clone();
            }
        }
        let frames: Vec<Bytes> = runs.iter().map(|r| r.joined_json()).collect();
        let joined = concat(&frames);
        *slot = Some((rest.to_vec(), joined.clone()));
        joined
    }

    /// The storage-form frames of all the run's events as one buffer, built
    /// once for every watcher (a lone event's is its own frame: no copy).
    pub fn joined_json(&self) -> Bytes {
        self.joined
            .get_or_init(|| match self.events.as_slice() {
                [one] => one.json_frame(),
                events => {
                    let frames: Vec<Bytes> = events.iter().map(|e| e.json_frame()).collect();
                    concat(&frames)
                }
            })
            .clone()
    }

    /// Bytes of the storage-form frames, building them if need be.
    pub fn json_len(&self) -> usize {
        match self.joined.get() {
            Some(j) => j.len(),
            None => self.events.iter().map(|e| e.json_frame().len()).sum(),
        }
    }
}

/// `frames` in one buffer of their exact size (one copy).
pub fn concat(frames: &[Bytes]) -> Bytes {
    let mut joined = Vec::with_capacity(frames.iter().map(Bytes::len).sum());
    for f in frames {
        joined.extend_from_slice(f);
    }
    Bytes::from(joined)
}

/// What one watcher's feed may hold.
#[derive(Debug, Clone, Copy)]
pub struct FeedLimits {
    /// Events (bookkeeping: kube's watchers hold a count too).
    pub events: usize,
    /// Bytes, as [`event_cost`] counts them.
    pub bytes: u64,
}

/// Bytes of runs a reader takes at once at most (at least one run): what it
/// took no longer counts against its feed, so it must not take much more
/// than one write's worth ahead of the socket.
const TAKE_BYTES: u64 = 512 * 1024;

#[derive(Default)]
struct Queue {
    runs: VecDeque<Arc<EventRun>>,
    events: usize,
    bytes: u64,
    /// Nothing more will come: the cache let the watcher go (what is queued
    /// is still read) or ended it (nothing is left).
    ended: bool,
    /// The reader went away.
    dropped: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Notify,
    /// Odd while the cache holds events for this watcher it could not
    /// queue; every change counts up, so a reader can tell it fell behind
    /// (and was caught up) meanwhile.
    behind: AtomicU64,
    limits: FeedLimits,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A watcher's side of its feed.
pub struct Feed {
    shared: Arc<Shared>,
    /// A run being read event by event ([`Feed::recv`]), and where.
    partial: Option<(Arc<EventRun>, usize)>,
}

/// The cache's side of one watcher's feed.
pub struct FeedSender {
    shared: Arc<Shared>,
}

/// What became of a run handed to [`FeedSender::send`].
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    Queued,
    /// It would take the feed past its limits: not queued.
    Full,
    /// The watcher is gone.
    Closed,
}

/// A feed holding at most `limits` not yet taken (a single run more, when
/// the feed is empty: a run larger than the budget must still get through).
pub fn feed(limits: FeedLimits) -> (FeedSender, Feed) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue::default()),
        ready: Notify::new(),
        behind: AtomicU64::new(0),
        limits,
    });
    (
        FeedSender {
            shared: shared.clone(),
        },
        Feed {
            shared,
            partial: None,
        },
    )
}

impl FeedSender {
    /// The watcher dropped its side: nothing will read what is sent.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().dropped
    }

    /// Queues `run` if it fits.
    pub fn send(&self, run: Arc<EventRun>) -> Sent {
        let mut q = self.shared.lock();
        if q.dropped || q.ended {
            return Sent::Closed;
        }
        let limits = &self.shared.limits;
        let (n, b) = (run.events.len(), run.cost());
        if !q.runs.is_empty() && (q.events + n > limits.events || q.bytes + b > limits.bytes) {
            return Sent::Full;
        }
        q.events += n;
        q.bytes += b;
        q.runs.push_back(run);
        drop(q);
        self.shared.ready.notify_one();
        Sent::Queued
    }

    /// Whether the reader has taken at least half of what the feed may
    /// hold: worth catching it up.
    pub fn has_room(&self) -> bool {
        let q = self.shared.lock();
        let limits = &self.shared.limits;
        q.events <= limits.events / 2 && q.bytes <= limits.bytes / 2
    }

    /// Marks whether the cache holds events it could not queue: until it
    /// catches up, the watcher must not claim (with a bookmark) to be current.
    pub fn set_behind(&self, behind: bool) {
        let b = &self.shared.behind;
        if b.load(Ordering::Acquire).is_multiple_of(2) == behind {
            b.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Ends the feed now: what it holds is freed and its reader sees the
    /// end at once (the client re-watches from the last revision it got).
    pub fn terminate(&self) {
        let runs = {
            let mut q = self.shared.lock();
            q.ended = true;
            q.events = 0;
            q.bytes = 0;
            std::mem::take(&mut q.runs)
        };
        self.shared.ready.notify_one();
        // Freed outside the lock: these may be the last holders of large objects.
        drop(runs);
    }
}

impl Drop for FeedSender {
    /// Let go: the reader gets what is queued, then the end.
    fn drop(&mut self) {
        self.shared.lock().ended = true;
        self.shared.ready.notify_one();
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let runs = {
            let mut q = self.shared.lock();
            q.dropped = true;
            std::mem::take(&mut q.runs)
        };
        drop(runs);
    }
}

impl Feed {
    /// What is left of a run [`Feed::recv`] stopped in, as a run of its own.
    fn take_partial(&mut self) -> Option<Arc<EventRun>> {
        let (run, at) = self.partial.take()?;
        Some(Arc::new(EventRun::new(run.events[at..].to_vec())))
    }

    /// Whether the cache holds events for this watcher it has not queued
    /// yet (the watcher is not current to the cache's revision).
    pub fn is_behind(&self) -> bool {
        !self.behind_epoch().is_multiple_of(2)
    }

    /// Counts every time the watcher fell behind or was caught up: odd
    /// while behind.
    pub fn behind_epoch(&self) -> u64 {
        self.shared.behind.load(Ordering::Acquire)
    }

    /// Takes queued runs (at least one, at most `limit` and about
    /// [`TAKE_BYTES`]) into `out`: `Some(n)`, or `None` when nothing is
    /// queued and `ended` says whether more may come.
    fn take(&self, out: &mut Vec<Arc<EventRun>>, limit: usize) -> Result<usize, bool> {
        let mut q = self.shared.lock();
        let mut n = 0;
        let mut bytes = 0;
        while n < limit.max(1) {
            let Some(cost) = q.runs.front().map(|r| r.cost()) else {
                break;
            };
            if n > 0 && bytes + cost > TAKE_BYTES {
                break;
            }
            let Some(run) = q.runs.pop_front() else { break };
            bytes += cost;
            q.events -= run.events.len();
            q.bytes -= cost;
            out.push(run);
            n += 1;
        }
        if n > 0 {
            Ok(n)
        } else {
            Err(q.ended)
        }
    }

    /// Waits for runs, then takes the queued ones (up to `limit`, and about
    /// half a megabyte) into `out`; 0 when the feed has ended. Cancel-safe.
    pub async fn recv_runs(&mut self, out: &mut Vec<Arc<EventRun>>, limit: usize) -> usize {
        if let Some(rest) = self.take_partial() {
            out.push(rest);
            return 1;
        }
        loop {
            match self.take(out, limit) {
                Ok(n) => return n,
                Err(true) => return 0,
                // A run queued after this check stores a permit: no wake is lost.
                Err(false) => self.shared.ready.notified().await,
            }
        }
    }

    /// A run already queued, without waiting.
    pub fn try_recv_run(&mut self) -> Option<Arc<EventRun>> {
        if let Some(rest) = self.take_partial() {
            return Some(rest);
        }
        let mut out = Vec::with_capacity(1);
        self.take(&mut out, 1).ok()?;
        out.pop()
    }

    /// The next event, one at a time; `None` when the feed has ended.
    pub async fn recv(&mut self) -> Option<Arc<WatchEvent>> {
        loop {
            if let Some((run, at)) = self.partial.take() {
                if let Some(ev) = run.events.get(at).cloned() {
                    self.partial = Some((run, at + 1));
                    return Some(ev);
                }
            }
            let mut out = Vec::with_capacity(1);
            if self.recv_runs(&mut out, 1).await == 0 {
                return None;
            }
            self.partial = out.pop().map(|run| (run, 0));
        }
    }

    /// The events one at a time, as a stream.
    pub fn into_events(self) -> impl futures::Stream<Item = Arc<WatchEvent>> + Send {
        futures::stream::unfold(self, |mut feed| async move {
            let ev = feed.recv().await?;
            Some((ev, feed))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::EventType;
    use crate::watch::CachedObject;
    use serde_json::json;
    use std::sync::atomic::AtomicU64;

    fn run(revs: std::ops::RangeInclusive<u64>) -> Arc<EventRun> {
        let ledger = Arc::new(AtomicU64::new(0));
        let events = revs
            .map(|rev| {
                let value = json!({"metadata": {"name": format!("o{rev}")}});
                let object = Arc::new(CachedObject::new(
                    format!("ns/o{rev}"),
                    rev,
                    &value,
                    Bytes::from(serde_json::to_vec(&value).expect("json")),
                    "g/v1".into(),
                ));
                Arc::new(WatchEvent::new(
                    EventType::Added,
                    rev,
                    object,
                    None,
                    ledger.clone(),
                ))
            })
            .collect();
        Arc::new(EventRun::new(events))
    }

    #[test]
    fn watchers_taking_the_same_runs_share_one_joined_buffer() {
        let (a, b, c) = (run(1..=2), run(3..=3), run(4..=5));
        let frames = |runs: &[&Arc<EventRun>]| -> Vec<u8> {
            runs.iter()
                .flat_map(|r| r.events.iter().flat_map(|e| e.json_frame().to_vec()))
                .collect()
        };
        let first = EventRun::joined_runs(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(first.as_ref(), frames(&[&a, &b, &c]).as_slice());
        let again = EventRun::joined_runs(&[a.clone(), b.clone(), c.clone()]);
        assert_eq!(
            again.as_ptr(),
            first.as_ptr(),
            "the same runs share the buffer"
        );
        // A watcher that took fewer runs, or other runs after the first,
        // gets its own frames, never the shared ones.
        let fewer = EventRun::joined_runs(&[a.clone(), b.clone()]);
        assert_eq!(fewer.as_ref(), frames(&[&a, &b]).as_slice());
        let other = run(3..=3);
        let own = EventRun::joined_runs(&[a.clone(), other.clone(), c.clone()]);
        assert_eq!(own.as_ref(), frames(&[&a, &other, &c]).as_slice());
        assert_ne!(own.as_ptr(), first.as_ptr());
        // A lone run is its own joined frame.
        assert_eq!(
            EventRun::joined_runs(std::slice::from_ref(&b)).as_ptr(),
            b.joined_json().as_ptr()
        );
    }

    fn limits(events: usize, bytes: u64) -> FeedLimits {
        FeedLimits { events, bytes }
    }

    #[tokio::test]
    async fn the_bound_counts_events_not_runs_and_reading_frees_it() {
        let (tx, mut rx) = feed(limits(5, u64::MAX));
        assert_eq!(tx.send(run(1..=3)), Sent::Queued);
        assert_eq!(tx.send(run(4..=6)), Sent::Full, "6 events would exceed 5");
        assert_eq!(tx.send(run(4..=5)), Sent::Queued, "exactly 5 fit");
        assert_eq!(tx.send(run(6..=6)), Sent::Full);
        let mut got = Vec::new();
        assert_eq!(rx.recv_runs(&mut got, 16).await, 2);
        assert_eq!(
            tx.send(run(6..=10)),
            Sent::Queued,
            "taken events free their room"
        );
        let first = rx.recv().await.expect("event");
        assert_eq!(first.revision, 6);
        // A run half read event by event goes on from where it stopped.
        let mut rest = Vec::new();
        assert_eq!(rx.recv_runs(&mut rest, 16).await, 1);
        let revs: Vec<_> = rest[0].events.iter().map(|e| e.revision).collect();
        assert_eq!(revs, [7, 8, 9, 10]);
    }

    #[tokio::test]
    async fn the_bound_counts_bytes_and_a_run_larger_than_it_still_gets_through_alone() {
        let one = run(1..=1).cost();
        let (tx, mut rx) = feed(limits(100, 2 * one));
        assert_eq!(tx.send(run(1..=1)), Sent::Queued);
        assert_eq!(tx.send(run(2..=2)), Sent::Queued);
        assert_eq!(tx.send(run(3..=3)), Sent::Full, "two events' bytes at most");
        assert!(!tx.has_room());
        let mut got = Vec::new();
        assert_eq!(rx.recv_runs(&mut got, 16).await, 2);
        assert!(tx.has_room());
        assert_eq!(
            tx.send(run(3..=7)),
            Sent::Queued,
            "an empty feed takes any run"
        );
        assert_eq!(tx.send(run(8..=8)), Sent::Full);
    }

    #[tokio::test]
    async fn terminating_frees_what_the_feed_holds_and_ends_it_at_once() {
        let (tx, mut rx) = feed(limits(100, u64::MAX));
        let held = run(1..=3);
        assert_eq!(tx.send(held.clone()), Sent::Queued);
        assert_eq!(Arc::strong_count(&held), 2);
        tx.terminate();
        assert_eq!(Arc::strong_count(&held), 1, "the queue let go of it");
        assert!(rx.recv().await.is_none(), "ended, nothing left to read");
        assert_eq!(tx.send(run(4..=4)), Sent::Closed);
    }

    #[tokio::test]
    async fn a_let_go_feed_is_read_to_its_end() {
        let (tx, mut rx) = feed(limits(100, u64::MAX));
        assert_eq!(tx.send(run(1..=2)), Sent::Queued);
        drop(tx);
        assert_eq!(rx.recv().await.map(|e| e.revision), Some(1));
        assert_eq!(rx.recv().await.map(|e| e.revision), Some(2));
        assert!(rx.recv().await.is_none());
    }
}
