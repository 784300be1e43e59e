//! The leader's ordered event stream to its followers, and the follower side
//! that feeds its store (and so its watch caches) from it.
//!
//! Wire format, one frame after another on a long-lived HTTP/2 response:
//! an event is a JSON header line `{"t":"ADDED","k":key,"r":rev,"n":len}`
//! followed by `len` bytes of the object's JSON and a newline; a watermark
//! is a line `{"w":rev,"c":compacted}` and says every revision up to `rev`
//! has been sent (it is also the heartbeat when nothing is written).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::Value;

use crate::storage::{Event, EventType, Revision, StorageError, Store};

/// How often an idle stream carries a watermark.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// A follower gives up on a stream that said nothing for this long.
pub const SILENCE: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("malformed stream frame: {0}")]
    Frame(String),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
}

pub fn encode_event(buf: &mut Vec<u8>, e: &Event) {
    let header = serde_json::json!({
        "t": e.kind.as_str(),
        "k": e.key,
        "r": e.revision,
        "n": e.json.len(),
    });
    // Serializing a json! value cannot fail.
    let _ = serde_json::to_writer(&mut *buf, &header);
    buf.push(b'\n');
    buf.extend_from_slice(&e.json);
    buf.push(b'\n');
}

pub fn encode_watermark(buf: &mut Vec<u8>, revision: Revision, compacted: Revision) {
    let _ = serde_json::to_writer(
        &mut *buf,
        &serde_json::json!({"w": revision, "c": compacted}),
    );
    buf.push(b'\n');
}

#[derive(Deserialize)]
struct Header {
    t: Option<String>,
    k: Option<String>,
    r: Option<Revision>,
    n: Option<usize>,
    w: Option<Revision>,
    c: Option<Revision>,
}

#[derive(Debug)]
pub enum Frame {
    Event(Event),
    Watermark {
        revision: Revision,
        compacted: Revision,
    },
}

/// Splits a byte stream into frames.
#[derive(Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, StreamError> {
        let Some(nl) = self.buf.iter().position(|b| *b == b'\n') else {
            return Ok(None);
        };
        let header: Header = serde_json::from_slice(&self.buf[..nl])
            .map_err(|e| StreamError::Frame(e.to_string()))?;
        if let Some(revision) = header.w {
            self.buf.advance(nl + 1);
            return Ok(Some(Frame::Watermark {
                revision,
                compacted: header.c.unwrap_or(0),
            }));
        }
        let (Some(t), Some(key), Some(revision), Some(n)) =
            (header.t, header.k, header.r, header.n)
        else {
            return Err(StreamError::Frame("event header incomplete".into()));
        };
        if self.buf.len() < nl + 1 + n + 1 {
            return Ok(None);
        }
        self.buf.advance(nl + 1);
        let json = self.buf.split_to(n).freeze();
        self.buf.advance(1);
        let kind = match t.as_str() {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            other => return Err(StreamError::Frame(format!("event type {other:?}"))),
        };
        let object: Value =
            serde_json::from_slice(&json).map_err(|e| StreamError::Frame(e.to_string()))?;
        Ok(Some(Frame::Event(Event {
            kind,
            key,
            revision,
            object: Arc::new(object),
            json,
        })))
    }
}

/// How long the leader waits on a follower whose stream buffer is full.
const SLOW_FOLLOWER: std::time::Duration = std::time::Duration::from_secs(5);

/// The leader side: the store's change feed from now on, with watermarks,
/// until `still_leader` says otherwise, the follower goes away, the server
/// stops (`stop`) or the leader resigns (`resigned`).
pub fn leader_stream(
    store: Arc<Store>,
    still_leader: impl Fn() -> bool + Send + 'static,
    stop: tokio_util::sync::CancellationToken,
    resigned: tokio_util::sync::CancellationToken,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let (start, mut feed) = store.subscribe();
        let mut sent = start;
        let mut buf = Vec::new();
        encode_watermark(&mut buf, sent, store.compacted_revision());
        if tx.send(Ok(Bytes::from(buf))).await.is_err() {
            return;
        }
        let mut tick = tokio::time::interval(HEARTBEAT);
        loop {
            let mut buf = Vec::new();
            tokio::select! {
                batch = feed.recv() => {
                    let Some(batch) = batch else { return };
                    for e in &batch.events {
                        encode_event(&mut buf, e);
                    }
                    sent = batch.revision;
                }
                // Shutting down: the stream ends cleanly; followers reconnect
                // to whoever leads next.
                _ = stop.cancelled() => return,
                // Handed over: followers find the next leader at once.
                _ = resigned.cancelled() => return,
                _ = tick.tick() => {
                    if !still_leader() {
                        // A deposed leader's stream ends; followers find the new one.
                        return;
                    }
                }
            }
            encode_watermark(&mut buf, sent, store.compacted_revision());
            // A follower that cannot keep up is cut off rather than letting the
            // change feed queue without bound; it reconnects and reads the gap
            // from the `l/` log, as after any other break.
            match tokio::time::timeout(SLOW_FOLLOWER, tx.send(Ok(Bytes::from(buf)))).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::warn!("follower too slow for the event stream; closing it");
                    return;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_across_chunk_boundaries() {
        let json = Bytes::from_static(br#"{"metadata":{"name":"a","resourceVersion":"7"}}"#);
        let e = Event {
            kind: EventType::Modified,
            key: "g/r/ns/a".into(),
            revision: 7,
            object: Arc::new(serde_json::from_slice(&json).expect("json")),
            json: json.clone(),
        };
        let mut wire = Vec::new();
        encode_event(&mut wire, &e);
        encode_watermark(&mut wire, 7, 3);
        let mut d = Decoder::default();
        let mut frames = Vec::new();
        for chunk in wire.chunks(5) {
            d.push(chunk);
            while let Some(f) = d.next_frame().expect("frame") {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 2);
        match &frames[0] {
            Frame::Event(got) => {
                assert_eq!(
                    (got.kind, got.key.as_str(), got.revision),
                    (e.kind, "g/r/ns/a", 7)
                );
                assert_eq!(got.json, json);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            frames[1],
            Frame::Watermark {
                revision: 7,
                compacted: 3
            }
        ));
    }
}
