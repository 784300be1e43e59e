//! The sequencer: the only place revisions are assigned. Writes that arrive
//! together are committed in one engine transaction (group commit) and
//! acknowledged only after it is durable; then their events are published in
//! revision order.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use super::engine::{Engine, WriteTxn};
use super::{keys, Batch, Event, EventType, Fence, Revision, StorageError, Write, Written};

/// Writes taken into one transaction at most.
const MAX_GROUP: usize = 512;

pub(super) struct Op {
    pub write: Write,
    /// The object's JSON rendered by the request (`None`: rendered here).
    pub rendered: Option<super::render::Rendered>,
    pub reply: oneshot::Sender<Result<Written, StorageError>>,
}

/// What the writer thread is asked to do, in order.
pub(super) enum Msg {
    Write(Op),
    /// A follower replica: publish events another sequencer committed (the
    /// leader's stream), then everything up to `watermark` from the log.
    Follow {
        events: Vec<Event>,
        watermark: Revision,
        reply: oneshot::Sender<Result<Revision, StorageError>>,
    },
}

pub(super) struct Writer {
    engine: Arc<dyn Engine>,
    revision: Revision,
    published: watch::Sender<Revision>,
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<Batch>>>>>,
    fence: Option<Arc<dyn Fence>>,
}

impl Writer {
    pub fn new(
        engine: Arc<dyn Engine>,
        revision: Revision,
        published: watch::Sender<Revision>,
        subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<Batch>>>>>,
        fence: Option<Arc<dyn Fence>>,
    ) -> Self {
        Self {
            engine,
            revision,
            published,
            subscribers,
            fence,
        }
    }

    /// The writer thread: commits what the channel brings, a group at a
    /// time, holding the sequencer only while it commits (a lone write may
    /// commit itself in between: `Store::write`).
    pub fn run(this: Arc<Mutex<Self>>, mut rx: mpsc::Receiver<Msg>) {
        let mut next = rx.blocking_recv();
        while let Some(msg) = next.take() {
            let mut w = this.lock().unwrap_or_else(|e| e.into_inner());
            let first = match msg {
                Msg::Write(op) => op,
                Msg::Follow {
                    events,
                    watermark,
                    reply,
                } => {
                    let _ = reply.send(w.follow(events, watermark).map(|()| w.revision));
                    drop(w);
                    next = rx.blocking_recv();
                    continue;
                }
            };
            let mut ops = vec![first];
            while ops.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(Msg::Write(op)) => ops.push(op),
                    // Keep the order: the follow request goes after this group.
                    Ok(other) => {
                        next = Some(other);
                        break;
                    }
                    Err(_) => break,
                }
            }
            w.commit_group(ops);
            let engine = w.engine.clone();
            drop(w);
            // The replies are sent; the engine's leftover work goes now.
            engine.settle();
            if next.is_none() {
                next = rx.blocking_recv();
            }
        }
    }

    /// Publishes `events` (committed by another sequencer, in revision order),
    /// reading any gap before, between or after them from the event log.
    fn follow(&mut self, events: Vec<Event>, watermark: Revision) -> Result<(), StorageError> {
        for event in events {
            if event.revision <= self.revision {
                continue; // Already published (from the log after a gap).
            }
            if event.revision > self.revision + 1 {
                self.catch_up(event.revision - 1)?;
            }
            self.publish(vec![event]);
        }
        if watermark > self.revision {
            self.catch_up(watermark)?;
        }
        Ok(())
    }

    pub fn commit_group(&mut self, mut ops: Vec<Op>) {
        let mut outcomes: Vec<Result<Applied, StorageError>> = Vec::with_capacity(ops.len());
        let mut result = self.try_group(&mut ops, &mut outcomes);
        if let Err(Fenced(stored)) = result {
            // Revisions up to `stored` were used by a commit this writer did not see
            // succeed (an undetermined engine error, or another writer on the same
            // keyspace): publish them from the log, then try once more. Nothing of
            // this group was written, so retrying it is safe.
            result = match self.catch_up(stored) {
                Ok(()) => self.try_group(&mut ops, &mut outcomes),
                Err(e) => Ok(Err(e)),
            };
        } else if self.fence.is_some()
            && matches!(
                result,
                Ok(Err(StorageError::Conflict { .. } | StorageError::Aborted(_)))
            )
        {
            // The whole transaction met another writer (a replica taking over
            // rewrites the counter, or rolled this one back): nothing was
            // written; one more attempt sees the new counter and the new
            // lease, and fails cleanly.
            result = self.try_group(&mut ops, &mut outcomes);
            if let Err(Fenced(stored)) = result {
                result = match self.catch_up(stored) {
                    Ok(()) => self.try_group(&mut ops, &mut outcomes),
                    Err(e) => Ok(Err(e)),
                };
            }
        }
        let failure = match result {
            Ok(Ok(())) => None,
            // Replicas: the whole transaction still met another writer after
            // its retries (this one was paused and deposed, and the new
            // leader keeps committing). Nothing of it was written, and this
            // replica is not the one writing: the client retries elsewhere
            // (503), as with a lost lease.
            Ok(Err(StorageError::Conflict { current })) | Err(Fenced(current))
                if self.fence.is_some() =>
            {
                Some(StorageError::NotLeader(format!(
                    "another replica committed revision {current}; nothing was written"
                )))
            }
            Ok(Err(e)) => Some(e),
            Err(Fenced(stored)) => Some(StorageError::Conflict { current: stored }),
        };
        if let Some(e) = failure {
            tracing::error!(error = %e, "commit failed");
            for op in ops {
                // A conflict stays a conflict (409 upstream), a lost lease stays
                // itself (503: retry elsewhere); nothing else is the client's fault.
                let err = match &e {
                    StorageError::Conflict { current } => {
                        StorageError::Conflict { current: *current }
                    }
                    StorageError::NotLeader(why) => StorageError::NotLeader(why.clone()),
                    // Never "not written" for a write that may have been.
                    StorageError::OutcomeUnknown(why) => StorageError::OutcomeUnknown(why.clone()),
                    other => StorageError::Engine(other.to_string()),
                };
                let _ = op.reply.send(Err(err));
            }
            return;
        }
        let mut events = Vec::new();
        let mut replies = Vec::with_capacity(ops.len());
        for (op, outcome) in ops.into_iter().zip(outcomes) {
            match outcome {
                Ok(applied) => {
                    let event = applied.into_event(op.write);
                    replies.push((
                        op.reply,
                        Ok(Written {
                            revision: event.revision,
                            object: event.object.clone(),
                            json: event.json.clone(),
                        }),
                    ));
                    events.push(event);
                }
                Err(e) => replies.push((op.reply, Err(e))),
            }
        }
        self.publish(events);
        // Acknowledge only now, so a client that saw its write can read it back.
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
    /// One attempt at committing the group on top of `self.revision`.
    fn try_group(
        &self,
        ops: &mut [Op],
        outcomes: &mut Vec<Result<Applied, StorageError>>,
    ) -> Result<Result<(), StorageError>, Fenced> {
        let base = self.revision;
        let mut fenced = None;
        let result = self.engine.write(&mut |txn| {
            outcomes.clear();
            // The fence: the stored counter must be where this writer left it.
            let stored = txn
                .get(keys::META_REVISION)?
                .and_then(|v| keys::decode_u64(&v))
                .unwrap_or(0);
            if stored != base {
                fenced = Some(stored);
                return Err(StorageError::Conflict { current: stored });
            }
            // Replicas: only the current lease holder may commit, checked in
            // the same transaction so a deposed leader's write never lands.
            if let Some(fence) = &self.fence {
                fence.check(txn)?;
            }
            let mut next = base;
            for op in ops.iter_mut() {
                let outcome = apply(txn, &mut op.write, op.rendered.as_ref(), next + 1);
                match outcome {
                    Ok(_) => next += 1,
                    // The engine failed (an I/O error): part of this write
                    // may be in the transaction, so the whole group fails,
                    // and the engine sees the failure (it may reopen).
                    Err(e @ (StorageError::Unavailable(_) | StorageError::Engine(_))) => {
                        return Err(e)
                    }
                    Err(_) => {}
                }
                outcomes.push(outcome);
            }
            if next > base {
                txn.put(keys::META_REVISION, &next.to_be_bytes())?;
            }
            Ok(())
        });
        match fenced {
            Some(stored) if stored > base => Err(Fenced(stored)),
            _ => Ok(result),
        }
    }

    /// Publishes the committed revisions in `(self.revision, to]` from the event log.
    fn catch_up(&mut self, to: Revision) -> Result<(), StorageError> {
        let from = self.revision;
        let started = std::time::Instant::now();
        let events = {
            let r = self.engine.read()?;
            let mut records = Vec::new();
            let mut error = None;
            r.scan(&keys::log(from + 1), &keys::log(to + 1), &mut |k, v| {
                match k.get(2..).and_then(keys::decode_u64) {
                    Some(rev) => records.push((rev, v.to_vec())),
                    None => error = Some(StorageError::Corrupt("bad log key".into())),
                }
                std::ops::ControlFlow::Continue(())
            })?;
            if let Some(e) = error {
                return Err(e);
            }
            let mut events = Vec::with_capacity(records.len());
            for (i, (rev, _)) in records.iter().enumerate() {
                if *rev != from + 1 + i as u64 {
                    return Err(StorageError::Corrupt(format!("event log gap before {rev}")));
                }
            }
            // The stored versions are read a chunk at a time, one round trip
            // each, not one per revision.
            for chunk in records.chunks(CATCH_UP_CHUNK) {
                let parsed = chunk
                    .iter()
                    .map(|(rev, record)| parse_log_record(*rev, record))
                    .collect::<Result<Vec<_>, _>>()?;
                let keys: Vec<Vec<u8>> =
                    parsed.iter().map(|p| keys::version(&p.key, p.at)).collect();
                let stored = r.get_many(&keys)?;
                if stored.len() != parsed.len() {
                    return Err(StorageError::Engine("a batch read lost keys".into()));
                }
                for (p, v) in parsed.into_iter().zip(stored) {
                    let rev = p.rev;
                    let v = v.ok_or_else(|| StorageError::Corrupt(format!("log record {rev}")))?;
                    events.push(event_from_stored(p, v)?);
                }
            }
            if events.len() as u64 != to - from {
                return Err(StorageError::Corrupt(format!("event log ends before {to}")));
            }
            events
        };
        tracing::warn!(
            from,
            to,
            read_ms = started.elapsed().as_millis() as u64,
            "revisions committed elsewhere; publishing them from the log"
        );
        self.publish(events);
        Ok(())
    }

    fn publish(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.revision = events.last().map_or(self.revision, |e| e.revision);
        let batch = Arc::new(Batch {
            events,
            revision: self.revision,
        });
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| s.send(batch.clone()).is_ok());
        self.published.send_replace(self.revision);
    }
}

/// The group could not commit: the stored revision counter is ahead of this writer.
struct Fenced(Revision);

/// How many revisions a catch-up from the log reads in one batch.
const CATCH_UP_CHUNK: usize = 1024;

/// A log record: the revision, its change, the version holding the
/// object (for a deletion, the last one before it) and the version it
/// followed (0 for a creation).
pub(super) struct LogRecord {
    pub(super) rev: Revision,
    pub(super) kind: EventType,
    pub(super) key: String,
    at: Revision,
    pub(super) prev: Revision,
}

pub(super) fn parse_log_record(rev: Revision, record: &[u8]) -> Result<LogRecord, StorageError> {
    let corrupt = || StorageError::Corrupt(format!("log record {rev}"));
    let (&tag, rest) = record.split_first().ok_or_else(corrupt)?;
    let kind = match tag {
        b'A' => EventType::Added,
        b'M' => EventType::Modified,
        b'D' => EventType::Deleted,
        _ => return Err(corrupt()),
    };
    let prev = rest
        .get(..8)
        .and_then(keys::decode_u64)
        .ok_or_else(corrupt)?;
    let key = std::str::from_utf8(&rest[8..])
        .map_err(|_| corrupt())?
        .to_string();
    // A deletion's event carries the last state of the object at the new revision.
    let at = if kind == EventType::Deleted {
        prev
    } else {
        rev
    };
    Ok(LogRecord {
        rev,
        kind,
        key,
        at,
        prev,
    })
}

/// The event of a log record, from the stored version it names.
fn event_from_stored(p: LogRecord, stored: Vec<u8>) -> Result<Event, StorageError> {
    let mut object: Value =
        serde_json::from_slice(&stored).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    let json = if p.kind == EventType::Deleted {
        set_resource_version(&mut object, p.rev)?;
        super::json_bytes(&object).map_err(|e| StorageError::Corrupt(e.to_string()))?
    } else {
        Bytes::from(stored)
    };
    Ok(Event {
        kind: p.kind,
        key: p.key,
        revision: p.rev,
        object: Arc::new(object),
        json,
    })
}

fn set_resource_version(object: &mut Value, rev: Revision) -> Result<(), StorageError> {
    let meta = object
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| StorageError::Invalid("object has no metadata".into()))?;
    meta.insert("resourceVersion".into(), Value::String(rev.to_string()));
    Ok(())
}

fn current(txn: &dyn WriteTxn, key: &str) -> Result<Option<Revision>, StorageError> {
    match txn.get(&keys::latest(key))? {
        None => Ok(None),
        Some(v) => {
            let (rev, deleted) = keys::decode_latest(&v)
                .ok_or_else(|| StorageError::Corrupt(format!("latest record of {key}")))?;
            Ok((!deleted).then_some(rev))
        }
    }
}

fn log_record(kind: EventType, key: &str, prev: Revision) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + key.len());
    v.push(match kind {
        EventType::Added => b'A',
        EventType::Modified => b'M',
        EventType::Deleted => b'D',
    });
    v.extend_from_slice(&prev.to_be_bytes());
    v.extend_from_slice(key.as_bytes());
    v
}

/// What one write did inside the group's transaction; its event is made
/// from it (taking the request's object, not a copy) once the group commits.
struct Applied {
    kind: EventType,
    revision: Revision,
    json: Bytes,
    /// A deletion's event carries the object's last state, read from the store.
    deleted: Option<Value>,
}

impl Applied {
    fn into_event(self, write: Write) -> Event {
        let (key, object) = match write {
            Write::Create { key, object } | Write::Update { key, object, .. } => (key, object),
            Write::Delete { key, .. } => (key, Value::Null),
        };
        Event {
            kind: self.kind,
            key,
            revision: self.revision,
            object: Arc::new(self.deleted.unwrap_or(object)),
            json: self.json,
        }
    }
}

/// Applies one write at revision `rev` inside the group's transaction. The
/// request's object gets its resourceVersion in place (a retried group sets
/// it again).
fn apply(
    txn: &mut dyn WriteTxn,
    write: &mut Write,
    rendered: Option<&super::render::Rendered>,
    rev: Revision,
) -> Result<Applied, StorageError> {
    let (kind, key, prev, mut deleted) = match write {
        Write::Create { key, .. } => {
            if current(txn, key)?.is_some() {
                return Err(StorageError::AlreadyExists);
            }
            (EventType::Added, &*key, 0, None)
        }
        Write::Update { key, expected, .. } => match current(txn, key)? {
            None => return Err(StorageError::NotFound),
            Some(cur) if cur != *expected => return Err(StorageError::Conflict { current: cur }),
            Some(cur) => (EventType::Modified, &*key, cur, None),
        },
        Write::Delete { key, expected } => match current(txn, key)? {
            None => return Err(StorageError::NotFound),
            Some(cur) if expected.is_some_and(|e| e != cur) => {
                return Err(StorageError::Conflict { current: cur })
            }
            Some(cur) => {
                let last = txn
                    .get(&keys::version(key, cur))?
                    .ok_or_else(|| StorageError::Corrupt(format!("missing version of {key}")))?;
                let object: Value = serde_json::from_slice(&last)
                    .map_err(|e| StorageError::Corrupt(e.to_string()))?;
                (EventType::Deleted, &*key, cur, Some(object))
            }
        },
    };
    let key = key.to_string();
    let object = match (&mut deleted, write) {
        (Some(object), _) => object,
        (None, Write::Create { object, .. } | Write::Update { object, .. }) => object,
        (None, Write::Delete { .. }) => {
            return Err(StorageError::Invalid(
                "a deletion without its object".into(),
            ))
        }
    };
    let is_deletion = kind == EventType::Deleted;
    // Checked on the value, before serializing recurses into it (a rendered
    // object was checked when it was rendered; a deletion is never rendered).
    if !is_deletion
        && rendered.is_none()
        && super::nesting_within(object, super::MAX_OBJECT_NESTING).is_none()
    {
        return Err(StorageError::TooDeep {
            limit: super::MAX_OBJECT_NESTING,
        });
    }
    set_resource_version(object, rev)?;
    let json = match rendered {
        Some(rendered) => rendered.finish(rev),
        None => super::json_bytes(object).map_err(|e| StorageError::Invalid(e.to_string()))?,
    };
    if !is_deletion && json.len() > super::MAX_OBJECT_BYTES {
        return Err(StorageError::TooLarge {
            size: json.len(),
            limit: super::MAX_OBJECT_BYTES,
        });
    }
    txn.put(&keys::latest(&key), &keys::encode_latest(rev, is_deletion))?;
    // A deletion leaves an empty tombstone version so lists at later revisions skip it.
    txn.put(
        &keys::version(&key, rev),
        if is_deletion { &[] } else { json.as_ref() },
    )?;
    txn.put(&keys::log(rev), &log_record(kind, &key, prev))?;
    Ok(Applied {
        kind,
        revision: rev,
        json,
        deleted,
    })
}
