//! The HTTP side of watch: start the subscription the options ask for, then
//! stream frames (shared bytes on the fast path), bookmarks and the timeout.

use crate::object::MetaField;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::FutureExt;
use http::StatusCode;
use serde_json::{json, Value};

use super::encoding::{cbor, protobuf, typed_order};
use super::negotiate::{negotiate, Output};
use super::options::ListOptions;
use super::response::{bytes_response, JSON};
use super::ApiState;
use crate::registry::table::{partial_metadata, table, Columns, IncludeObject};
use crate::registry::{convert_local, convert_values, Registry, Selectors, Target, Watch};
use crate::status::ApiError;
use crate::storage::EventType;
use crate::watch::{frame, Conversion, EventRun, Filter, Subscription, WatchEvent};

/// How long a watch lasts: the client's `timeoutSeconds`, else (kube's
/// rule, which also treats 0 as unset) a random time in [min, 2×min) of `--min-request-timeout`, which
/// spreads reconnects out. A negative one is a deadline already past: kube
/// ends such a watch at once.
fn watch_timeout(asked: Option<i64>, min_request_timeout: Duration) -> Duration {
    match asked {
        Some(secs) if secs < 0 => Duration::ZERO,
        Some(secs) if secs > 0 => {
            Duration::from_secs(secs.unsigned_abs().min(MAX_WATCH_TIMEOUT_SECS))
        }
        _ => {
            let spread = f64::from(uuid::Uuid::new_v4().as_bytes()[0]) / 256.0;
            min_request_timeout
                .mul_f64(1.0 + spread)
                .min(Duration::from_secs(MAX_WATCH_TIMEOUT_SECS))
        }
    }
}

/// Longest watch a client can ask for with `timeoutSeconds` (one week).
const MAX_WATCH_TIMEOUT_SECS: u64 = 7 * 24 * 3600;

type Hook = Box<dyn FnOnce() + Send>;

/// Called once a watch has sent its initial events (flow control releases the
/// watch's seats then); dropping it unfired releases them too.
#[derive(Clone)]
pub struct InitialEventsSent(Arc<std::sync::Mutex<Option<Hook>>>);

impl InitialEventsSent {
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(Box::new(f)))))
    }

    pub fn fire(&self) {
        let hook = self.0.lock().map(|mut h| h.take()).unwrap_or(None);
        if let Some(h) = hook {
            h();
        }
    }
}

pub async fn serve(
    state: &ApiState,
    t: &Target,
    name: Option<&str>,
    opts: ListOptions,
    accept: Option<&str>,
    initial_events_sent: Option<InitialEventsSent>,
) -> Result<Response, ApiError> {
    let out = negotiate(accept, true)?;
    if out == Output::Yaml {
        return Err(ApiError::not_acceptable(&[
            "application/json;stream=watch",
            "application/vnd.kubernetes.protobuf;stream=watch",
            "application/cbor-seq",
        ]));
    }
    let out_kind = out.clone();
    let content_type = match &out {
        Output::Cbor => cbor::SEQ_MEDIA_TYPE,
        Output::ProtoMeta(_) => protobuf::WATCH_MEDIA_TYPE,
        _ => JSON,
    };
    let (start, end_bookmark) = opts.watch_start()?;
    let sel = Selectors::parse(t, &opts.label_selector, &opts.field_selector)?;
    if let (Some(n), Some(want)) = (name, sel.fields.required_value("metadata.name")) {
        if n != want {
            return Err(ApiError::bad_request(
                "fieldSelector metadata.name doesn't match requested name",
            ));
        }
    }
    let include = IncludeObject::parse("").unwrap_or_default();
    let reg = &state.registry;
    let filter = reg.filter(t, name, &sel);
    let sub = reg.watch(&t.rt.id(), filter.clone(), start).await?;
    let timeout = watch_timeout(opts.timeout_seconds, state.min_request_timeout);
    let stream = Stream {
        t: t.clone(),
        out,
        include,
        filter,
        allow_bookmarks: opts.allow_watch_bookmarks,
        end_bookmark,
        bookmark_every: state.bookmark_interval,
        headers_sent: false,
        registry: reg.clone(),
        initial_events_sent,
        stop: state.stop_watches.clone(),
        converted: Vec::new(),
        initial_budget: state.request_timeout,
    };
    let body = match sub {
        Watch::Started(sub) => Body::from_stream(stream.frames(sub, timeout)),
        Watch::Expired(status) => Body::from_stream(futures::stream::once(async move {
            Ok::<_, std::convert::Infallible>(error_frame(&out_kind, &status))
        })),
    };
    let mut r = bytes_response(StatusCode::OK, content_type, body);
    r.extensions_mut().insert(super::response::NoCompression);
    Ok(r)
}

/// Initial events converted together at most (as many as one review takes).
const CONVERT_AHEAD: usize = crate::apiextensions::conversion::BATCH_OBJECTS;

/// The object of `ev`, or (`left`: it left the watcher's selector) its old
/// state at the event's revision.
fn old_state(ev: &WatchEvent, left: bool) -> Option<Value> {
    if !left {
        return Some(ev.object.value());
    }
    let mut v = ev.prev.as_ref()?.value();
    v["metadata"]["resourceVersion"] = json!(ev.revision.to_string());
    Some(v)
}

/// One protobuf watch frame carrying PartialObjectMetadata.
fn proto_frame(kind: &str, api_version: &str, value: &Value) -> Option<Bytes> {
    let meta = protobuf::partial_object_metadata_from_json(value).ok()?;
    let inner = protobuf::encode_object(api_version, "PartialObjectMetadata", &meta);
    Some(Bytes::from(protobuf::watch_event_frame(kind, &inner)))
}

/// The ERROR event that ends a watch, in the stream's encoding.
fn error_frame(out: &Output, status: &ApiError) -> Bytes {
    let st = status.to_json();
    match out {
        Output::Cbor => Bytes::from(cbor::cbor_seq_frame(
            &json!({"type": "ERROR", "object": st}),
        )),
        Output::ProtoMeta(_) => match protobuf::status_from_json(&st) {
            Ok(s) => Bytes::from(protobuf::watch_event_frame(
                "ERROR",
                &protobuf::encode_object("v1", "Status", &s),
            )),
            Err(_) => Bytes::new(),
        },
        _ => frame("ERROR", &status.status_json()),
    }
}

/// Frames of queued events joined into one write (a watch body is a byte
/// stream: JSON frames are newline-delimited, protobuf ones length-prefixed).
/// The frames are the events' shared encodings, held until taken and then
/// copied once into a buffer of their exact size.
#[derive(Default)]
struct Batch {
    frames: Vec<Bytes>,
    bytes: usize,
    events: usize,
}

impl Batch {
    /// Events and bytes one write carries at most.
    const EVENTS: usize = 64;
    const BYTES: usize = 256 * 1024;

    /// Adds the frame of `events` events (`None`: none of them is sent).
    fn push(&mut self, frame: Option<Bytes>, events: usize) {
        self.events += events;
        if let Some(f) = frame {
            self.bytes += f.len();
            self.frames.push(f);
        }
    }

    fn full(&self) -> bool {
        self.events >= Self::EVENTS || self.bytes >= Self::BYTES
    }

    /// Whether a frame of `events` events and `bytes` bytes still fits.
    fn fits(&self, events: usize, bytes: usize) -> bool {
        self.events + events <= Self::EVENTS
            && (self.bytes + bytes <= Self::BYTES || (self.events == 0 && events == 1))
    }

    /// One frame stays the shared encoding itself: no copy.
    fn take(mut self) -> Option<Bytes> {
        if self.frames.len() <= 1 {
            return self.frames.pop();
        }
        Some(crate::watch::concat(&self.frames))
    }
}

struct Stream {
    t: Target,
    out: Output,
    include: IncludeObject,
    filter: Filter,
    allow_bookmarks: bool,
    end_bookmark: bool,
    bookmark_every: Duration,
    headers_sent: bool,
    registry: Arc<Registry>,
    initial_events_sent: Option<InitialEventsSent>,
    /// Server shutdown: the stream ends cleanly (the client resumes elsewhere).
    stop: tokio_util::sync::CancellationToken,
    /// The webhook conversions of the events about to be encoded (by event
    /// and whether it is the old state), awaited by [`Stream::prepare`].
    converted: Vec<((usize, bool), Bytes)>,
    /// Converting the initial events is bounded as a list is, by the
    /// request timeout: the time left of it (time spent waiting for the
    /// client to read is not counted).
    initial_budget: Duration,
}

/// A watch stream's state between two frames of its body.
struct Running {
    stream: Stream,
    sub: Subscription,
    initial: std::vec::IntoIter<Arc<WatchEvent>>,
    /// Initial events whose conversions are awaited already.
    initial_ready: usize,
    /// An ERROR event was sent: the watch ends (kube closes the stream).
    ended: bool,
    /// Frames due before anything else (the events drained before a bookmark, and it).
    queued: std::collections::VecDeque<Bytes>,
    /// Runs of events taken from the subscription and not yet written,
    /// the first of them from its event `offset` on.
    received: Vec<Arc<EventRun>>,
    offset: usize,
    last_sent: u64,
    /// When the last frame of events was handed to the connection.
    last_frame: Option<tokio::time::Instant>,
    tick: tokio::time::Interval,
    definitions: tokio::sync::watch::Receiver<u64>,
    expired: std::pin::Pin<Box<tokio::time::Sleep>>,
    stopped: std::pin::Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
}

impl Stream {
    /// The body: frames made as the connection asks for them. No task or
    /// channel of its own sits between the watch cache and the socket (each
    /// was one more wake-up per event per watcher); a watcher that does not
    /// read is bounded by its subscription's feed (in events and bytes),
    /// which the cache ends when the watcher stays behind. The watch ends at its timeout, at shutdown, when its
    /// definition stops being served, or when the client goes (the body is
    /// dropped).
    fn frames(
        self,
        mut sub: Subscription,
        timeout: Duration,
    ) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
        let now = tokio::time::Instant::now();
        let deadline = now.checked_add(timeout).unwrap_or(now);
        let initial = std::mem::take(&mut sub.initial).into_iter();
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + self.bookmark_every,
            self.bookmark_every,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let running = Running {
            definitions: self.registry.live_catalog().subscribe(),
            expired: Box::pin(tokio::time::sleep_until(deadline)),
            stopped: Box::pin(self.stop.clone().cancelled_owned()),
            last_sent: sub.revision,
            last_frame: None,
            stream: self,
            sub,
            initial,
            initial_ready: 0,
            ended: false,
            queued: std::collections::VecDeque::new(),
            received: Vec::new(),
            offset: 0,
            tick,
        };
        futures::stream::unfold(Some(running), |state| async move {
            let mut st = state?;
            let frame = st.next_frame().await?;
            Some((Ok(frame), Some(st)))
        })
    }
}

impl Running {
    /// The frame of the received events, in order, up to one write's worth
    /// (the rest wait for the next frame); `None` when the watcher's filter
    /// left nothing of them. A whole run this watcher sends as stored goes
    /// as the run's joined frame, shared with every other such watcher.
    fn take_batch(&mut self) -> Option<Bytes> {
        let Running {
            received,
            offset,
            stream,
            last_sent,
            ..
        } = self;
        let mut batch = Batch::default();
        let mut done = 0;
        // Whether every run taken goes whole, as stored.
        let mut all_whole = true;
        'runs: for run in received.iter() {
            if batch.full() {
                break;
            }
            let whole = *offset == 0
                && run.events.iter().all(|ev| stream.sends_stored(ev))
                && batch.fits(run.events.len(), run.json_len());
            if whole {
                batch.push(Some(run.joined_json()), run.events.len());
            } else {
                all_whole = false;
                for ev in &run.events[*offset..] {
                    if batch.full() {
                        break 'runs;
                    }
                    *offset += 1;
                    *last_sent = (*last_sent).max(ev.revision);
                    batch.push(stream.encode(ev), 1);
                }
            }
            if let Some(last) = run.events.last() {
                *last_sent = (*last_sent).max(last.revision);
            }
            *offset = 0;
            done += 1;
        }
        let frame = if all_whole && done > 1 {
            Some(EventRun::joined_runs(&received[..done]))
        } else {
            batch.take()
        };
        received.drain(..done);
        frame
    }

    /// Awaits the webhook conversions of every event received and not yet
    /// written.
    async fn prepare_received(&mut self) -> Result<(), ApiError> {
        let Running {
            received,
            offset,
            stream,
            ..
        } = self;
        let events = received
            .iter()
            .enumerate()
            .flat_map(|(i, run)| run.events[if i == 0 { *offset } else { 0 }..].iter());
        stream.prepare(events, None).await
    }

    /// [`Running::take_batch`] once the received events are converted.
    async fn take_prepared(&mut self) -> Result<Option<Bytes>, ApiError> {
        self.prepare_received().await?;
        Ok(self.take_batch())
    }

    /// Events that came within [`FRAME_GAP`] of the last frame wait for
    /// the rest of it, and go with those that come meanwhile (up to one
    /// frame's worth): one frame, where each commit was one.
    async fn gather_until_gap(&mut self) {
        let Some(at) = self.last_frame.and_then(|t| t.checked_add(FRAME_GAP)) else {
            return;
        };
        if at <= tokio::time::Instant::now() {
            return;
        }
        tokio::time::sleep_until(at).await;
        let have: usize = self.received.iter().map(|r| r.events.len()).sum();
        if let Some(room) = Batch::EVENTS.checked_sub(have).filter(|n| *n > 0) {
            // Only what is queued already; an ended feed is seen next time.
            let _ =
                futures::FutureExt::now_or_never(self.sub.rx.recv_runs(&mut self.received, room));
        }
    }

    fn sent(&mut self, frame: Bytes) -> Bytes {
        self.last_frame = Some(tokio::time::Instant::now());
        frame
    }

    /// The ERROR event ending the watch (kube sends one, then closes it).
    fn fail(&mut self, e: &ApiError) -> Option<Bytes> {
        self.ended = true;
        self.queued.clear();
        Some(error_frame(&self.stream.out, e))
    }

    /// The next frame of the body, or `None` when the watch ends.
    async fn next_frame(&mut self) -> Option<Bytes> {
        if self.ended {
            return None;
        }
        if let Some(f) = self.queued.pop_front() {
            return Some(f);
        }
        while self.initial.len() > 0 {
            if self.initial_ready == 0 {
                // The next initial events are converted together, as a
                // list's page is, under the deadline a list would have.
                let ahead = &self.initial.as_slice()[..self.initial.len().min(CONVERT_AHEAD)];
                let started = tokio::time::Instant::now();
                let deadline = Some(started + self.stream.initial_budget);
                if let Err(e) = self.stream.prepare(ahead.iter(), deadline).await {
                    return self.fail(&e);
                }
                let spent = started.elapsed();
                self.stream.initial_budget = self.stream.initial_budget.saturating_sub(spent);
                self.initial_ready = ahead.len();
            }
            let ev = self.initial.next()?;
            self.initial_ready -= 1;
            if let Some(f) = self.stream.encode(&ev) {
                return Some(f);
            }
        }
        if self.stream.end_bookmark {
            self.stream.end_bookmark = false;
            return Some(self.stream.bookmark(self.sub.revision, true));
        }
        // Asked for the frame after the initial events: they are sent.
        if let Some(h) = self.stream.initial_events_sent.take() {
            h.fire();
        }
        loop {
            // Events received beyond the last write's bytes go first.
            if !self.received.is_empty() {
                match self.take_prepared().await {
                    Ok(Some(f)) => return Some(self.sent(f)),
                    Ok(None) => continue,
                    Err(e) => return self.fail(&e),
                }
            }
            tokio::select! {
                // The resource's definition went away (or stopped serving this
                // version): the stream ends cleanly, as kube ends watches of a
                // removed CRD, and a client's re-list then gets 404.
                changed = self.definitions.changed() => {
                    if changed.is_err() || !self.stream.still_served() { return None; }
                }
                // Every event already queued comes at once (one wake, one
                // release of the channel's permits) and goes out as one
                // write: under load a watcher costs one DATA frame per batch
                // rather than per event.
                n = self.sub.rx.recv_runs(&mut self.received, Batch::EVENTS) => {
                    if n == 0 {
                        return None;
                    }
                    self.gather_until_gap().await;
                    match self.take_prepared().await {
                        Ok(Some(f)) => return Some(self.sent(f)),
                        Ok(None) => {}
                        Err(e) => return self.fail(&e),
                    }
                }
                _ = self.tick.tick(), if self.stream.allow_bookmarks => {
                    // Everything up to the cache revision is already queued for us: drain, then mark.
                    let epoch = self.sub.rx.behind_epoch();
                    let rev = self.stream.registry.cache_revision();
                    while let Some(run) = self.sub.rx.try_recv_run() {
                        self.received.push(run);
                    }
                    if let Err(e) = self.prepare_received().await {
                        return self.fail(&e);
                    }
                    while !self.received.is_empty() {
                        if let Some(f) = self.take_batch() {
                            self.queued.push_back(f);
                        }
                    }
                    // Behind (now or meanwhile), the cache held events not
                    // queued for us: its revision is not ours to claim.
                    let current = epoch.is_multiple_of(2) && self.sub.rx.behind_epoch() == epoch;
                    let rev = if current { rev.max(self.last_sent) } else { self.last_sent };
                    self.last_sent = rev;
                    self.queued.push_back(self.stream.bookmark(rev, false));
                    return self.queued.pop_front();
                }
                _ = &mut self.expired => return None,
                _ = &mut self.stopped => return None,
            }
        }
    }
}

/// The least time between two frames of events of one watch: events that
/// come sooner wait for the next frame, so a watcher of a busy resource
/// costs one frame (a task wake, an HTTP/2 DATA frame, a TLS record) per
/// millisecond rather than per commit. A watcher of a quieter resource gets
/// every event at once.
const FRAME_GAP: Duration = Duration::from_millis(1);

impl Stream {
    fn still_served(&self) -> bool {
        self.registry
            .catalog()
            .find(&self.t.rt.group, &self.t.version, &self.t.rt.plural)
            .is_some()
    }

    /// How this watcher sees one event (selector transitions applied): the
    /// frame type and whether the object left its selector; `None` when it
    /// does not see it.
    fn sees(&self, ev: &WatchEvent) -> Option<(&'static str, bool)> {
        let cur = self.filter.matches(&ev.object);
        let prev = ev.prev.as_ref().is_some_and(|p| self.filter.matches(p));
        // `left`: the object left the selector; the watcher sees its old state deleted.
        match ev.kind {
            EventType::Added if cur => Some(("ADDED", false)),
            EventType::Deleted if cur => Some(("DELETED", false)),
            EventType::Modified if cur && prev => Some(("MODIFIED", false)),
            EventType::Modified if cur => Some(("ADDED", false)),
            EventType::Modified if prev => Some(("DELETED", true)),
            _ => None,
        }
    }

    /// Whether this watcher's frame of `ev` is the event's stored JSON
    /// frame (its own type, the stored object, JSON at the storage
    /// version): the frame nearly every watcher sends.
    fn sends_stored(&self, ev: &WatchEvent) -> bool {
        self.sees(ev)
            .is_some_and(|(kind, left)| self.is_stored_form(ev, kind, left))
    }

    fn is_stored_form(&self, ev: &WatchEvent, kind: &str, left: bool) -> bool {
        self.out == Output::Json
            && !left
            && kind == ev.kind.as_str()
            && self.t.is_api_version(ev.object.api_version())
    }

    /// The frame for one event as this watcher sees it. Frames are built
    /// once per form and shared by every watcher of that form through the
    /// event; only a table's first frame, which carries this watcher's
    /// column headers, is its own.
    fn encode(&mut self, ev: &WatchEvent) -> Option<Bytes> {
        let (kind, left) = self.sees(ev)?;
        if self.is_stored_form(ev, kind, left) {
            return Some(ev.json_frame());
        }
        let api_version = self.t.api_version();
        if matches!(self.out, Output::Table(_)) && !self.headers_sent {
            self.headers_sent = true;
            return self.build(ev, kind, left, true);
        }
        let form = format!(
            "{kind} {left} {api_version} {:?} {:?}",
            self.out, self.include
        );
        ev.encoded(&form, || self.build(ev, kind, left, false))
    }

    /// Whether this watcher shows objects with their content (converted to
    /// its version), not their metadata alone.
    fn shows_content(&self) -> bool {
        !matches!(self.out, Output::PartialMeta(_) | Output::ProtoMeta(_))
    }

    /// Awaits the webhook conversions this watcher needs for `events`
    /// (each shared with every other watcher of its version, and started
    /// in batches for those no watcher started yet), for [`Stream::build`]
    /// to find. Nothing is locked or blocked while they run; a failure is
    /// kube's error, which ends the watch.
    async fn prepare<'a>(
        &mut self,
        events: impl Iterator<Item = &'a Arc<WatchEvent>>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), ApiError> {
        self.converted.clear();
        if self.t.rt.conversion.is_none() || !self.shows_content() {
            return Ok(());
        }
        let api_version = self.t.api_version();
        let mut waits: Vec<((usize, bool), Conversion)> = Vec::new();
        let mut todo: Vec<(&Arc<WatchEvent>, bool, Value)> = Vec::new();
        for ev in events {
            let Some((_, left)) = self.sees(ev) else {
                continue;
            };
            let id = (Arc::as_ptr(ev) as usize, left);
            let object = if left {
                ev.prev.as_ref()
            } else {
                Some(&ev.object)
            };
            if object.is_none_or(|o| o.api_version() == api_version) {
                continue;
            }
            match ev.conversion(&api_version, left) {
                Some(c) => waits.push((id, c)),
                None => todo.push((ev, left, old_state(ev, left).unwrap_or_default())),
            }
        }
        let what = todo.first().map(|(_, _, v)| {
            format!(
                "{}, Kind={}",
                v.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                self.t.rt.kind
            )
        });
        if !todo.is_empty() {
            let (rt, to) = (self.t.rt.clone(), api_version.clone());
            let values: Vec<Value> = todo.iter().map(|(_, _, v)| v.clone()).collect();
            // One conversion of them all (in the webhook's batches), shared
            // by the per-event conversions other watchers find.
            let all = async move {
                let refs: Vec<&Value> = values.iter().collect();
                let out = convert_values(&rt, &refs, &to).await?;
                out.iter()
                    .map(|v| serde_json::to_vec(v).map(Bytes::from))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Arc::new)
                    .map_err(ApiError::internal)
            }
            .boxed()
            .shared();
            for (i, (ev, left, _)) in todo.iter().enumerate() {
                let one = all
                    .clone()
                    .map(move |r| {
                        r.and_then(|v| {
                            v.get(i).cloned().ok_or_else(|| {
                                ApiError::internal("conversion returned too few objects")
                            })
                        })
                    })
                    .boxed();
                let c = ev.start_conversion(&api_version, *left, one);
                waits.push(((Arc::as_ptr(ev) as usize, *left), c));
            }
        }
        if waits.is_empty() {
            return Ok(());
        }
        let (ids, convs): (Vec<_>, Vec<_>) = waits.into_iter().unzip();
        let joined = futures::future::join_all(convs);
        let results = match deadline {
            Some(d) => tokio::time::timeout_at(d, joined).await.map_err(|_| {
                ApiError::internal(format!(
                    "conversion webhook for {} failed: context deadline exceeded",
                    what.unwrap_or_else(|| self.t.rt.kind.clone())
                ))
            })?,
            None => joined.await,
        };
        for (id, r) in ids.into_iter().zip(results) {
            self.converted.push((id, r?));
        }
        Ok(())
    }

    /// The object of `ev` (`left`: its old state) in this watcher's version,
    /// as JSON: as stored, converted by the webhook ([`Stream::prepare`]),
    /// or moved to it without one.
    fn object_json(&self, ev: &WatchEvent, left: bool) -> Option<Bytes> {
        let api_version = self.t.api_version();
        let object = if left { ev.prev.as_ref()? } else { &ev.object };
        if object.api_version() == api_version && !left {
            return Some(ev.object.json.clone());
        }
        let id = (ev as *const WatchEvent as usize, left);
        if let Some((_, json)) = self.converted.iter().find(|(k, _)| *k == id) {
            return Some(json.clone());
        }
        let v = convert_local(&self.t.rt, &old_state(ev, left)?, &api_version)?;
        serde_json::to_vec(&v).ok().map(Bytes::from)
    }

    /// Encodes one event in this watcher's form.
    fn build(&self, ev: &WatchEvent, kind: &str, left: bool, headers: bool) -> Option<Bytes> {
        let value = || old_state(ev, left);
        let in_version =
            || -> Option<Value> { serde_json::from_slice(&self.object_json(ev, left)?).ok() };
        match &self.out {
            Output::Json | Output::Yaml => Some(frame(kind, &self.object_json(ev, left)?)),
            Output::Table(v) => {
                let cols = Columns::for_target(&self.t);
                let obj = in_version()?;
                let mut doc = table(
                    headers.then_some(&cols),
                    vec![cols.row(&obj, self.include)],
                    json!({
                        "resourceVersion": obj.meta_field("resourceVersion").cloned().unwrap_or(Value::Null)
                    }),
                );
                doc["apiVersion"] = json!(v);
                Some(frame(kind, &typed_order::to_vec(&doc)))
            }
            Output::PartialMeta(v) => {
                let mut m = partial_metadata(&value()?);
                m["apiVersion"] = json!(v);
                Some(frame(kind, &typed_order::to_vec(&m)))
            }
            Output::Cbor => {
                let obj = in_version()?;
                Some(Bytes::from(cbor::cbor_seq_frame(
                    &json!({"type": kind, "object": obj}),
                )))
            }
            Output::ProtoMeta(v) => proto_frame(kind, v, &value()?),
        }
    }

    fn bookmark(&self, rev: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rev.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = match &self.out {
            Output::Json | Output::Yaml => json!({
                "apiVersion": self.t.api_version(), "kind": self.t.rt.kind, "metadata": metadata,
            }),
            Output::PartialMeta(v) => json!({
                "apiVersion": v, "kind": "PartialObjectMetadata", "metadata": metadata,
            }),
            Output::Table(v) => json!({
                "apiVersion": v, "kind": "Table", "metadata": {"resourceVersion": rev.to_string()},
                "rows": [{"cells": [], "object": {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata}}],
            }),
            Output::Cbor => {
                let obj = json!({"apiVersion": self.t.api_version(), "kind": self.t.rt.kind, "metadata": metadata});
                return Bytes::from(cbor::cbor_seq_frame(
                    &json!({"type": "BOOKMARK", "object": obj}),
                ));
            }
            Output::ProtoMeta(v) => {
                return proto_frame("BOOKMARK", v, &json!({"metadata": metadata}))
                    .unwrap_or_default();
            }
        };
        frame("BOOKMARK", &typed_order::to_vec(&obj))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn queued_frames_go_out_as_one_write_and_a_lone_frame_is_not_copied() {
        let lone = Bytes::from_static(b"{\"type\":\"ADDED\"}\n");
        let mut one = Batch::default();
        one.push(Some(lone.clone()), 1);
        let out = one.take().expect("frame");
        assert_eq!(out.as_ptr(), lone.as_ptr(), "the shared encoding itself");

        let mut many = Batch::default();
        many.push(Some(Bytes::from_static(b"a\n")), 1);
        many.push(None, 1); // filtered out for this watcher
        many.push(Some(Bytes::from_static(b"b\n")), 1);
        many.push(Some(Bytes::from_static(b"c\n")), 1);
        assert!(!many.full());
        assert_eq!(many.take().as_deref(), Some(&b"a\nb\nc\n"[..]));

        let mut capped = Batch::default();
        for _ in 0..Batch::EVENTS {
            capped.push(None, 1);
        }
        assert!(capped.full(), "at most {} events a write", Batch::EVENTS);
        assert!(capped.take().is_none());
        let mut big = Batch::default();
        big.push(Some(Bytes::from(vec![b'x'; Batch::BYTES])), 1);
        assert!(big.full());
    }

    use super::*;

    #[test]
    fn watch_timeout_is_the_clients_or_spread_over_min_to_twice_min() {
        let min = Duration::from_secs(1800);
        assert_eq!(watch_timeout(Some(5), min), Duration::from_secs(5));
        assert_eq!(watch_timeout(Some(-1), min), Duration::ZERO);
        assert_eq!(watch_timeout(Some(i64::MIN), min), Duration::ZERO);
        assert_eq!(
            watch_timeout(Some(i64::MAX), min),
            Duration::from_secs(MAX_WATCH_TIMEOUT_SECS),
            "huge values are capped, not overflowed"
        );
        let spread: std::collections::BTreeSet<Duration> = (0..200)
            .flat_map(|_| [watch_timeout(None, min), watch_timeout(Some(0), min)])
            .collect();
        assert!(
            spread.iter().all(|d| *d >= min && *d < min * 2),
            "{spread:?}"
        );
        assert!(spread.len() > 20, "reconnects are spread: {spread:?}");
    }
}
