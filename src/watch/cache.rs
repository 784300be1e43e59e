use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::storage::{Batch, Event, EventType, Revision, StorageError, Store};

use super::split_key;

/// How an object of a resource (`group/resource`) reads, as it enters the
/// cache (loaded or from a write): `Some` rewritten value, `None` unchanged.
pub type OnLoad = Arc<dyn Fn(&str, &Value) -> Option<Value> + Send + Sync>;

/// Events kept per resource before trimming (older than 75 s) may begin.
pub const DEFAULT_RING_CAPACITY: usize = 10_000;
/// Memory the event history of one resource may hold (estimated), whatever
/// the events' age: beyond it the oldest events go (watchers resuming from
/// them get 410 and re-list). Without it, a user with update rights could
/// grow memory by `capacity × object size` (10,000 updates of a 1 MB object).
pub const DEFAULT_RING_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// An event keeps its object alive twice over beside the JSON bytes (the
/// parsed value is about twice the JSON) and may cache its watch frame.
const EVENT_COST_FACTOR: u64 = 4;

/// How much event history each resource keeps.
#[derive(Debug, Clone, Copy)]
pub struct RingLimits {
    /// Events kept before those older than 75 s may be trimmed.
    pub events: usize,
    /// Estimated bytes the history may hold, whatever its age.
    pub bytes: u64,
}

impl From<usize> for RingLimits {
    fn from(events: usize) -> Self {
        RingLimits {
            events,
            bytes: DEFAULT_RING_MAX_BYTES,
        }
    }
}

fn event_cost(ev: &WatchEvent) -> u64 {
    (ev.object.json.len() as u64).saturating_mul(EVENT_COST_FACTOR)
}
/// Events younger than this are never trimmed unless the ring is far over capacity.
const MIN_HISTORY: Duration = Duration::from_secs(75);
/// Buffered events per watcher; a watcher that falls this far behind is closed.
const WATCHER_BUFFER: usize = 4096;

/// An object as the cache holds it: parsed once, encoded once.
#[derive(Debug)]
pub struct CachedObject {
    /// Key within the resource: `namespace/name` (namespace empty when cluster-scoped).
    pub key: String,
    pub revision: Revision,
    pub value: Arc<Value>,
    pub json: Bytes,
}

impl CachedObject {
    pub fn namespace(&self) -> &str {
        self.key.split_once('/').map_or("", |(ns, _)| ns)
    }
}

#[derive(Debug)]
pub struct WatchEvent {
    pub kind: EventType,
    pub revision: Revision,
    pub object: Arc<CachedObject>,
    /// The previous state for modifications and deletions (selector transitions need it).
    pub prev: Option<Arc<CachedObject>>,
    /// `{"type":...,"object":...}\n` for the storage version, built on first use and shared.
    frame: std::sync::OnceLock<Bytes>,
}

impl WatchEvent {
    pub fn new(
        kind: EventType,
        revision: Revision,
        object: Arc<CachedObject>,
        prev: Option<Arc<CachedObject>>,
    ) -> Self {
        Self {
            kind,
            revision,
            object,
            prev,
            frame: std::sync::OnceLock::new(),
        }
    }

    /// The JSON watch frame for this event's own type and object, encoded once.
    pub fn json_frame(&self) -> Bytes {
        self.frame
            .get_or_init(|| frame(self.kind.as_str(), &self.object.json))
            .clone()
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

/// Which objects a watcher or list wants: a key prefix (namespace, or one name)
/// and a predicate (selectors).
#[derive(Clone)]
pub struct Filter {
    pub key_prefix: String,
    /// When set, only this exact key.
    pub exact_key: Option<String>,
    pub predicate: Arc<dyn Fn(&CachedObject) -> bool + Send + Sync>,
}

impl Filter {
    pub fn everything() -> Self {
        Self {
            key_prefix: String::new(),
            exact_key: None,
            predicate: Arc::new(|_| true),
        }
    }

    fn in_scope(&self, key: &str) -> bool {
        match &self.exact_key {
            Some(k) => k == key,
            None => key.starts_with(&self.key_prefix),
        }
    }

    pub fn matches(&self, obj: &CachedObject) -> bool {
        self.in_scope(&obj.key) && (self.predicate)(obj)
    }
}

pub enum Start {
    /// Synthetic ADDED events for the current state, then changes.
    InitialState,
    /// Changes after this revision.
    After(Revision),
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("too old resource version: {requested} ({oldest})")]
    TooOld {
        requested: Revision,
        oldest: Revision,
    },
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLarge {
        requested: Revision,
        current: Revision,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub struct Subscription {
    /// Events to send before anything from `rx`, in order.
    pub initial: Vec<Arc<WatchEvent>>,
    /// The revision the initial events bring the watcher to.
    pub revision: Revision,
    pub rx: mpsc::Receiver<Arc<WatchEvent>>,
}

struct Watcher {
    after: Revision,
    filter: Filter,
    tx: mpsc::Sender<Arc<WatchEvent>>,
}

#[derive(Default)]
struct ResourceState {
    objects: BTreeMap<String, Arc<CachedObject>>,
    ring: VecDeque<(Instant, Arc<WatchEvent>)>,
    /// Every event of this resource after this revision is in `ring`.
    complete_after: Revision,
    /// Encoded size of all current objects (for cost estimates).
    bytes: u64,
    /// Estimated memory of the events in `ring`.
    ring_bytes: u64,
    watchers: Vec<Watcher>,
}

struct State {
    revision: Revision,
    resources: HashMap<String, ResourceState>,
}

pub struct Cache {
    state: RwLock<State>,
    revision: watch::Sender<Revision>,
    ring: RingLimits,
    /// The revision the cache loaded its objects at. A resource with no state
    /// yet has had no event since, so its history is complete from here.
    loaded_at: Revision,
    /// Applied to every object entering the cache, loaded or written.
    on_load: Option<OnLoad>,
}

impl Cache {
    /// Loads the current state from `store` and follows its change feed.
    pub async fn start(
        store: Arc<Store>,
        ring: impl Into<RingLimits>,
    ) -> Result<Arc<Self>, StorageError> {
        Self::start_with(store, ring, None).await
    }

    /// Like [`Cache::start`]; `on_load` may rewrite stored objects as they
    /// enter the cache, at load and from the change feed (the registry fills
    /// in the defaults kube applies when decoding from storage), so readers
    /// and watchers all share the rewritten bytes.
    pub async fn start_with(
        store: Arc<Store>,
        ring: impl Into<RingLimits>,
        on_load: Option<OnLoad>,
    ) -> Result<Arc<Self>, StorageError> {
        let ring = ring.into();
        let (rev, mut feed) = store.subscribe();
        let page = store.list("", rev, None, None, Arc::new(|_| true)).await?;
        let mut resources: HashMap<String, ResourceState> = HashMap::new();
        for (key, json) in page.items {
            let Some((resource, sub)) = split_key(&key) else {
                continue;
            };
            let mut value: Value =
                serde_json::from_slice(&json).map_err(|e| StorageError::Corrupt(e.to_string()))?;
            let mut json = json;
            if let Some(v) = on_load.as_ref().and_then(|f| f(resource, &value)) {
                json = Bytes::from(
                    serde_json::to_vec(&v).map_err(|e| StorageError::Corrupt(e.to_string()))?,
                );
                value = v;
            }
            let revision = object_revision(&value);
            let state = resources
                .entry(resource.to_string())
                .or_insert_with(|| ResourceState {
                    complete_after: rev,
                    ..Default::default()
                });
            state.bytes += json.len() as u64;
            state.objects.insert(
                sub.to_string(),
                Arc::new(CachedObject {
                    key: sub.to_string(),
                    revision,
                    value: Arc::new(value),
                    json,
                }),
            );
        }
        let (tx, _) = watch::channel(rev);
        let cache = Arc::new(Self {
            state: RwLock::new(State {
                revision: rev,
                resources,
            }),
            revision: tx,
            ring,
            loaded_at: rev,
            on_load,
        });
        let weak = Arc::downgrade(&cache);
        tokio::spawn(async move {
            while let Some(batch) = feed.recv().await {
                let Some(cache) = weak.upgrade() else { return };
                cache.apply(&batch);
            }
        });
        Ok(cache)
    }

    /// The revision everything in the cache is current to.
    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    /// Waits until the cache has caught up to `rev`, at most `timeout`.
    pub async fn wait_for(&self, rev: Revision, timeout: Duration) -> Result<(), WatchError> {
        let mut rx = self.revision.subscribe();
        let reached = tokio::time::timeout(timeout, rx.wait_for(|r| *r >= rev))
            .await
            .is_ok_and(|r| r.is_ok());
        if reached {
            Ok(())
        } else {
            Err(WatchError::TooLarge {
                requested: rev,
                current: self.revision(),
            })
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// An event's object as readers see it, when `on_load` rewrites it.
    fn rewrite(&self, event: &Event) -> Option<(Arc<Value>, Bytes)> {
        let (resource, _) = split_key(&event.key)?;
        let on_load = self.on_load.as_ref()?;
        let value = on_load(resource, &event.object)?;
        // Encoding a Value cannot fail (string keys only); keep the stored bytes if it did.
        let json = Bytes::from(serde_json::to_vec(&value).ok()?);
        Some((Arc::new(value), json))
    }

    fn apply(&self, batch: &Batch) {
        let now = Instant::now();
        // Rewritten before taking the lock, which readers and writers wait on.
        let rewritten: Vec<_> = batch.events.iter().map(|e| self.rewrite(e)).collect();
        let mut state = self.write();
        for (event, rewritten) in batch.events.iter().zip(rewritten) {
            let Some((resource, sub)) = split_key(&event.key) else {
                continue;
            };
            let (value, json) =
                rewritten.unwrap_or_else(|| (event.object.clone(), event.json.clone()));
            // First event of this resource since loading: nothing before it was missed.
            let complete_after = self.loaded_at;
            let res = state
                .resources
                .entry(resource.to_string())
                .or_insert_with(|| ResourceState {
                    complete_after,
                    ..Default::default()
                });
            let object = Arc::new(CachedObject {
                key: sub.to_string(),
                revision: event.revision,
                value,
                json,
            });
            let prev = if event.kind == EventType::Deleted {
                res.objects.remove(sub)
            } else {
                res.bytes += object.json.len() as u64;
                res.objects.insert(sub.to_string(), object.clone())
            };
            if let Some(p) = &prev {
                res.bytes = res.bytes.saturating_sub(p.json.len() as u64);
            }
            let ev = Arc::new(WatchEvent::new(event.kind, event.revision, object, prev));
            res.watchers.retain(|w| {
                if ev.revision <= w.after || !interested(&w.filter, &ev) {
                    return true;
                }
                // A watcher that cannot keep up is closed; its client re-watches.
                w.tx.try_send(ev.clone()).is_ok()
            });
            res.ring_bytes += event_cost(&ev);
            res.ring.push_back((now, ev));
            trim(res, self.ring, now);
        }
        state.revision = batch.revision;
        drop(state);
        self.revision.send_replace(batch.revision);
    }

    /// The current objects of `resource` that pass `filter`, and the revision they are at.
    pub fn list(&self, resource: &str, filter: &Filter) -> (Revision, Vec<Arc<CachedObject>>) {
        let state = self.read();
        let items = state.resources.get(resource).map_or_else(Vec::new, |res| {
            if let Some(k) = &filter.exact_key {
                return res
                    .objects
                    .get(k)
                    .filter(|o| (filter.predicate)(o))
                    .cloned()
                    .into_iter()
                    .collect();
            }
            res.objects
                .range(filter.key_prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&filter.key_prefix))
                .filter(|(_, o)| (filter.predicate)(o))
                .map(|(_, o)| o.clone())
                .collect()
        });
        (state.revision, items)
    }

    pub fn get(&self, resource: &str, key: &str) -> (Revision, Option<Arc<CachedObject>>) {
        let state = self.read();
        let obj = state
            .resources
            .get(resource)
            .and_then(|r| r.objects.get(key).cloned());
        (state.revision, obj)
    }

    /// Number of live objects of a resource (for cost estimates).
    pub fn count(&self, resource: &str) -> usize {
        self.read()
            .resources
            .get(resource)
            .map_or(0, |r| r.objects.len())
    }

    /// Live object count and average encoded size of a resource.
    pub fn stats(&self, resource: &str) -> (usize, u64) {
        self.read().resources.get(resource).map_or((0, 0), |r| {
            let n = r.objects.len();
            (n, if n == 0 { 0 } else { r.bytes / n as u64 })
        })
    }

    /// Number of watchers of a resource.
    pub fn watcher_count(&self, resource: &str) -> usize {
        self.read()
            .resources
            .get(resource)
            .map_or(0, |r| r.watchers.len())
    }

    pub fn watch(
        &self,
        resource: &str,
        start: Start,
        filter: Filter,
    ) -> Result<Subscription, WatchError> {
        let mut state = self.write();
        let current = state.revision;
        let loaded_at = self.loaded_at;
        let res = state
            .resources
            .entry(resource.to_string())
            .or_insert_with(|| ResourceState {
                complete_after: loaded_at,
                ..Default::default()
            });
        let (initial, after) = match start {
            Start::InitialState => {
                let initial = res
                    .objects
                    .values()
                    .filter(|o| filter.matches(o))
                    .map(|o| {
                        Arc::new(WatchEvent::new(
                            EventType::Added,
                            o.revision,
                            o.clone(),
                            None,
                        ))
                    })
                    .collect();
                (initial, current)
            }
            Start::After(rev) => {
                if rev < res.complete_after {
                    return Err(WatchError::TooOld {
                        requested: rev,
                        oldest: res.complete_after,
                    });
                }
                let replay = res
                    .ring
                    .iter()
                    .filter(|(_, e)| e.revision > rev && interested(&filter, e))
                    .map(|(_, e)| e.clone())
                    .collect();
                // Events between the cache and a future `rev` are skipped by `after`.
                (replay, rev.max(current))
            }
        };
        let (tx, rx) = mpsc::channel(WATCHER_BUFFER);
        res.watchers.push(Watcher { after, filter, tx });
        Ok(Subscription {
            initial,
            revision: after,
            rx,
        })
    }
}

/// An event concerns a watcher if the object passes its filter now or did before.
fn interested(filter: &Filter, ev: &WatchEvent) -> bool {
    filter.matches(&ev.object) || ev.prev.as_ref().is_some_and(|p| filter.matches(p))
}

fn trim(res: &mut ResourceState, limits: RingLimits, now: Instant) {
    while let Some((at, ev)) = res.ring.front() {
        let over_bytes = res.ring_bytes > limits.bytes && res.ring.len() > 1;
        let over_count = res.ring.len() > limits.events
            && (now.duration_since(*at) >= MIN_HISTORY || res.ring.len() > limits.events * 4);
        if !over_bytes && !over_count {
            break;
        }
        res.complete_after = ev.revision;
        res.ring_bytes = res.ring_bytes.saturating_sub(event_cost(ev));
        res.ring.pop_front();
    }
}

pub fn object_revision(value: &Value) -> Revision {
    value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::Embedded;
    use crate::storage::Write;
    use serde_json::json;

    async fn setup(capacity: usize) -> (tempfile::TempDir, Arc<Store>, Arc<Cache>) {
        let dir = tempfile::tempdir().expect("tmp");
        let engine = Arc::new(Embedded::open(&dir.path().join("db")).expect("open"));
        let store = Store::open(engine).expect("store");
        let cache = Cache::start(store.clone(), capacity).await.expect("cache");
        (dir, store, cache)
    }

    async fn create(store: &Store, name: &str) -> Revision {
        store
            .write(Write::Create {
                key: format!("g/r/ns/{name}"),
                object: json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": name}}),
            })
            .await
            .expect("create")
            .revision
    }

    #[tokio::test]
    async fn every_watcher_gets_the_same_encoded_bytes() {
        let (_d, store, cache) = setup(100).await;
        let mut a = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("a");
        let mut b = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("b");
        create(&store, "x").await;
        let ea = a.rx.recv().await.expect("a event");
        let eb = b.rx.recv().await.expect("b event");
        assert!(Arc::ptr_eq(&ea, &eb), "one event object shared");
        let (fa, fb) = (ea.json_frame(), eb.json_frame());
        assert_eq!(fa.as_ptr(), fb.as_ptr(), "frame encoded once, bytes shared");
        assert!(fa.starts_with(b"{\"type\":\"ADDED\",\"object\":{"));
    }

    #[tokio::test]
    async fn consistent_reads_wait_for_the_cache_and_too_large_times_out() {
        let (_d, store, cache) = setup(100).await;
        let rev = create(&store, "x").await;
        cache
            .wait_for(rev, Duration::from_secs(2))
            .await
            .expect("catches up");
        let (at, items) = cache.list("g/r", &Filter::everything());
        assert!(at >= rev);
        assert_eq!(items.len(), 1);
        let e = cache
            .wait_for(rev + 10, Duration::from_millis(50))
            .await
            .expect_err("future");
        assert!(matches!(e, WatchError::TooLarge { .. }));
    }

    #[tokio::test]
    async fn first_watch_of_a_never_written_resource_is_not_too_old() {
        let (_d, store, cache) = setup(100).await;
        // A client lists the empty resource g/empty at the current revision...
        let listed_at = cache.revision();
        // ...meanwhile other resources are written...
        for i in 0..3 {
            create(&store, &format!("other{i}")).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        // ...and its watch from the list's revision starts, as for any resource.
        let sub = cache
            .watch("g/empty", Start::After(listed_at), Filter::everything())
            .expect("not 410");
        assert!(sub.initial.is_empty());
    }

    #[tokio::test]
    async fn history_is_bounded_in_bytes_whatever_its_age() {
        let dir = tempfile::tempdir().expect("tmp");
        let engine = Arc::new(Embedded::open(&dir.path().join("db")).expect("open"));
        let store = Store::open(engine).expect("store");
        // Room for many events by count, for about 10 events of 10 KB by bytes.
        let limits = RingLimits {
            events: 10_000,
            bytes: 10 * 10_000 * EVENT_COST_FACTOR,
        };
        let cache = Cache::start(store.clone(), limits).await.expect("cache");
        let first = create(&store, "a").await;
        for i in 0..40 {
            store
                .write(Write::Create {
                    key: format!("g/r/ns/big{i}"),
                    object: json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": format!("big{i}")}, "data": "x".repeat(10_000)}),
                })
                .await
                .expect("create");
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        let kept = {
            let state = cache.read();
            let res = &state.resources["g/r"];
            assert!(
                res.ring_bytes <= limits.bytes,
                "{} > {}",
                res.ring_bytes,
                limits.bytes
            );
            res.ring.len()
        };
        assert!((5..=10).contains(&kept), "kept {kept} events");
        // Young events were dropped for their size: resuming from them is 410.
        assert!(matches!(
            cache.watch("g/r", Start::After(first), Filter::everything()),
            Err(WatchError::TooOld { .. })
        ));
        // Every object is still current.
        assert_eq!(cache.count("g/r"), 41);
    }

    #[tokio::test]
    async fn old_revisions_fall_out_of_a_full_ring() {
        let (_d, store, cache) = setup(1).await;
        let first = create(&store, "a").await;
        for i in 0..6 {
            create(&store, &format!("b{i}")).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        assert!(matches!(
            cache.watch("g/r", Start::After(first), Filter::everything()),
            Err(WatchError::TooOld { .. })
        ));
        // Recent history is still served, in order.
        let sub = cache
            .watch(
                "g/r",
                Start::After(store.revision() - 2),
                Filter::everything(),
            )
            .expect("recent");
        let revs: Vec<_> = sub.initial.iter().map(|e| e.revision).collect();
        assert_eq!(revs, [store.revision() - 1, store.revision()]);
    }

    #[tokio::test]
    async fn a_watcher_that_stops_reading_is_closed_not_buffered_forever() {
        let (_d, store, cache) = setup(100_000).await;
        let mut slow = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("slow");
        for i in 0..(WATCHER_BUFFER + 10) {
            create(&store, &format!("o{i}")).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(5))
            .await
            .expect("caught up");
        assert_eq!(cache.watcher_count("g/r"), 0, "dropped from fan-out");
        let mut n = 0;
        while slow.rx.recv().await.is_some() {
            n += 1;
        }
        assert_eq!(
            n, WATCHER_BUFFER,
            "the buffered events drain, then the stream ends"
        );
    }
}
