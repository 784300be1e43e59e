//! The sequencer: the only place revisions are assigned. Writes that arrive
//! together are committed in one engine transaction (group commit) and
//! acknowledged only after it is durable; then their events are published in
//! revision order.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use super::engine::{Engine, WriteTxn};
use super::{keys, Batch, Event, EventType, Revision, StorageError, Write, Written};

/// Writes taken into one transaction at most.
const MAX_GROUP: usize = 512;

pub(super) struct Op {
    pub write: Write,
    pub reply: oneshot::Sender<Result<Written, StorageError>>,
}

pub(super) struct Writer {
    engine: Arc<dyn Engine>,
    revision: Revision,
    published: watch::Sender<Revision>,
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<Batch>>>>>,
}

impl Writer {
    pub fn new(
        engine: Arc<dyn Engine>,
        revision: Revision,
        published: watch::Sender<Revision>,
        subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Arc<Batch>>>>>,
    ) -> Self {
        Self {
            engine,
            revision,
            published,
            subscribers,
        }
    }

    pub fn run(mut self, mut rx: mpsc::Receiver<Op>) {
        while let Some(first) = rx.blocking_recv() {
            let mut ops = vec![first];
            while ops.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(op) => ops.push(op),
                    Err(_) => break,
                }
            }
            self.commit_group(ops);
        }
    }

    fn commit_group(&mut self, ops: Vec<Op>) {
        let base = self.revision;
        let mut outcomes: Vec<Result<Event, StorageError>> = Vec::with_capacity(ops.len());
        let result = self.engine.write(&mut |txn| {
            outcomes.clear();
            let mut next = base;
            for op in &ops {
                let outcome = apply(txn, &op.write, next + 1);
                if outcome.is_ok() {
                    next += 1;
                }
                outcomes.push(outcome);
            }
            if next > base {
                txn.put(keys::META_REVISION, &next.to_be_bytes())?;
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "commit failed");
            for op in ops {
                let _ = op.reply.send(Err(StorageError::Engine(e.to_string())));
            }
            return;
        }
        let mut events = Vec::new();
        let mut replies = Vec::with_capacity(ops.len());
        for (op, outcome) in ops.into_iter().zip(outcomes) {
            match outcome {
                Ok(event) => {
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
        if !events.is_empty() {
            self.revision = events.last().map_or(self.revision, |e| e.revision);
            let batch = Arc::new(Batch {
                events,
                revision: self.revision,
            });
            let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
            subs.retain(|s| s.send(batch.clone()).is_ok());
            self.published.send_replace(self.revision);
        }
        // Acknowledge only now, so a client that saw its write can read it back.
        for (reply, result) in replies {
            let _ = reply.send(result);
        }
    }
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

/// Applies one write at revision `rev` inside the group's transaction.
fn apply(txn: &mut dyn WriteTxn, write: &Write, rev: Revision) -> Result<Event, StorageError> {
    let (kind, key, object, prev) = match write {
        Write::Create { key, object } => {
            if current(txn, key)?.is_some() {
                return Err(StorageError::AlreadyExists);
            }
            (EventType::Added, key, object.clone(), 0)
        }
        Write::Update {
            key,
            expected,
            object,
        } => match current(txn, key)? {
            None => return Err(StorageError::NotFound),
            Some(cur) if cur != *expected => return Err(StorageError::Conflict { current: cur }),
            Some(cur) => (EventType::Modified, key, object.clone(), cur),
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
                (EventType::Deleted, key, object, cur)
            }
        },
    };
    let mut object = object;
    set_resource_version(&mut object, rev)?;
    let json =
        Bytes::from(serde_json::to_vec(&object).map_err(|e| StorageError::Invalid(e.to_string()))?);
    let deleted = kind == EventType::Deleted;
    if !deleted && json.len() > super::MAX_OBJECT_BYTES {
        return Err(StorageError::TooLarge {
            size: json.len(),
            limit: super::MAX_OBJECT_BYTES,
        });
    }
    txn.put(&keys::latest(key), &keys::encode_latest(rev, deleted))?;
    // A deletion leaves an empty tombstone version so lists at later revisions skip it.
    txn.put(
        &keys::version(key, rev),
        if deleted { &[] } else { json.as_ref() },
    )?;
    txn.put(&keys::log(rev), &log_record(kind, key, prev))?;
    Ok(Event {
        kind,
        key: key.clone(),
        revision: rev,
        object: Arc::new(object),
        json,
    })
}
