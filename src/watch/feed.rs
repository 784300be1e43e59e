//! A watcher's feed: the events the cache hands it, one item per run (the
//! events of one resource from one commit) rather than per event. Every
//! watcher that takes a whole run shares it, and with it the run's frames
//! joined once: under load a commit costs each watcher one queue item, one
//! wake and one write, with no copy of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::WatchEvent;

/// Consecutive events of one resource, in revision order.
#[derive(Debug)]
pub struct EventRun {
    pub events: Vec<Arc<WatchEvent>>,
    /// The events' storage-form JSON frames joined, built by the first
    /// watcher that sends the whole run in that form.
    joined: OnceLock<Bytes>,
    /// This run's frames joined with those of the runs after it, as the
    /// last watcher to take them together took them: watchers woken by the
    /// same commits take the same runs, and share one buffer.
    joined_on: std::sync::Mutex<Option<(Vec<Arc<EventRun>>, Bytes)>>,
}

impl EventRun {
    pub fn new(events: Vec<Arc<WatchEvent>>) -> Self {
        Self {
            events,
            joined: OnceLock::new(),
            joined_on: std::sync::Mutex::new(None),
        }
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

/// A watcher's side of its feed: bounded in events (not runs), so a watcher
/// that stops reading holds at most `limit` events before the cache closes it.
pub struct Feed {
    rx: mpsc::Receiver<Arc<EventRun>>,
    queued: Arc<AtomicUsize>,
    /// A run being read event by event ([`Feed::recv`]), and where.
    partial: Option<(Arc<EventRun>, usize)>,
}

/// The cache's side of one watcher's feed.
pub struct FeedSender {
    tx: mpsc::Sender<Arc<EventRun>>,
    queued: Arc<AtomicUsize>,
    limit: usize,
}

/// A feed holding at most `limit` events not yet taken.
pub fn feed(limit: usize) -> (FeedSender, Feed) {
    let (tx, rx) = mpsc::channel(limit.max(1));
    let queued = Arc::new(AtomicUsize::new(0));
    (
        FeedSender {
            tx,
            queued: queued.clone(),
            limit,
        },
        Feed {
            rx,
            queued,
            partial: None,
        },
    )
}

impl FeedSender {
    /// The watcher dropped its side: nothing will read what is sent.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Queues `run`; `false` when the watcher is gone or has fallen `limit`
    /// events behind (the cache then drops it, which ends its feed after
    /// what it holds).
    pub fn send(&self, run: Arc<EventRun>) -> bool {
        let n = run.events.len();
        if self.queued.load(Ordering::Acquire) + n > self.limit {
            return false;
        }
        self.queued.fetch_add(n, Ordering::AcqRel);
        if self.tx.try_send(run).is_err() {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }
}

impl Feed {
    /// What is left of a run [`Feed::recv`] stopped in, as a run of its own.
    fn take_partial(&mut self) -> Option<Arc<EventRun>> {
        let (run, at) = self.partial.take()?;
        Some(Arc::new(EventRun::new(run.events[at..].to_vec())))
    }

    fn taken(&self, run: &EventRun) {
        self.queued.fetch_sub(run.events.len(), Ordering::AcqRel);
    }

    /// Waits for runs, then takes every queued one (up to `limit`) into
    /// `out`; 0 when the feed has ended.
    pub async fn recv_runs(&mut self, out: &mut Vec<Arc<EventRun>>, limit: usize) -> usize {
        if let Some(rest) = self.take_partial() {
            out.push(rest);
            return 1;
        }
        let start = out.len();
        let n = self.rx.recv_many(out, limit).await;
        for run in &out[start..] {
            self.taken(run);
        }
        n
    }

    /// A run already queued, without waiting.
    pub fn try_recv_run(&mut self) -> Option<Arc<EventRun>> {
        if let Some(rest) = self.take_partial() {
            return Some(rest);
        }
        let run = self.rx.try_recv().ok()?;
        self.taken(&run);
        Some(run)
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
            let run = self.rx.recv().await?;
            self.taken(&run);
            self.partial = Some((run, 0));
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

    #[tokio::test]
    async fn the_bound_counts_events_not_runs_and_reading_frees_it() {
        let (tx, mut rx) = feed(5);
        assert!(tx.send(run(1..=3)));
        assert!(!tx.send(run(4..=6)), "6 events would exceed 5");
        assert!(tx.send(run(4..=5)), "exactly 5 fit");
        assert!(!tx.send(run(6..=6)));
        let mut got = Vec::new();
        assert_eq!(rx.recv_runs(&mut got, 16).await, 2);
        assert!(tx.send(run(6..=10)), "taken events free their room");
        let first = rx.recv().await.expect("event");
        assert_eq!(first.revision, 6);
        // A run half read event by event goes on from where it stopped.
        let mut rest = Vec::new();
        assert_eq!(rx.recv_runs(&mut rest, 16).await, 1);
        let revs: Vec<_> = rest[0].events.iter().map(|e| e.revision).collect();
        assert_eq!(revs, [7, 8, 9, 10]);
    }
}
