//! The watch cache of each resource: its current objects, its watchers and
//! the fan-out of the store's change feed to them (the event history, a
//! watcher's queue and the event itself are their own files). About 800
//! lines; the rest of the file is its tests.

use crate::object::MetaField;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use crate::storage::{Batch, Event, EventType, Revision, StorageError, Store};

use super::feed::{feed, EventRun, Feed, FeedLimits, FeedSender, Sent};
use super::history::{History, HistoryLimits};
use super::{split_key, CachedObject, WatchEvent};

/// How an object of a resource (`group/resource`) reads, as it enters the
/// cache (loaded or from a write): `Some` rewritten value, `None` unchanged.
pub type OnLoad = Arc<dyn Fn(&str, &Value) -> Option<Value> + Send + Sync>;

/// Buffered events per watcher (besides its byte budget); beyond them it
/// falls behind and is caught up from the history.
const WATCHER_BUFFER: usize = 4096;
/// Events and bytes one catch-up run carries at most.
const CATCH_UP_EVENTS: usize = 64;
const CATCH_UP_BYTES: u64 = 512 * 1024;
/// How often expired history is dropped, and watchers that fell behind are
/// caught up or ended, when no write comes to do it.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Which objects a watcher or list wants: a key prefix (namespace, or one name)
/// and a predicate (selectors).
#[derive(Clone)]
pub struct Filter {
    pub key_prefix: String,
    /// When set, only this exact key.
    pub exact_key: Option<String>,
    pub predicate: Arc<dyn Fn(&CachedObject) -> bool + Send + Sync>,
    /// The predicate passes every object (no selector): the rest of a page
    /// is then counted by walking keys, without calling it.
    pub selects_all: bool,
}

impl Filter {
    pub fn everything() -> Self {
        Self {
            key_prefix: String::new(),
            exact_key: None,
            predicate: Arc::new(|_| true),
            selects_all: true,
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

/// One page of a cached list.
pub struct Page {
    pub revision: Revision,
    pub items: Vec<Arc<CachedObject>>,
    /// Objects that pass the filter after the page.
    pub more: usize,
}

pub struct Subscription {
    /// Events to send before anything from `rx`, in order.
    pub initial: Vec<Arc<WatchEvent>>,
    /// The revision the initial events bring the watcher to.
    pub revision: Revision,
    pub rx: Feed,
}

struct Watcher {
    after: Revision,
    filter: Filter,
    tx: FeedSender,
    /// Every event this watcher wants up to here is in its feed (or read).
    queued_to: Revision,
    /// Since when events it wants are not in its feed (it was full): they
    /// are in the history, or it is ended.
    behind_since: Option<Instant>,
}

struct ResourceState {
    objects: BTreeMap<String, Arc<CachedObject>>,
    history: History,
    /// Encoded size of all current objects (for cost estimates).
    bytes: u64,
    watchers: Vec<Watcher>,
    /// The apiVersions of its objects, shared by them.
    api_versions: Vec<Arc<str>>,
    /// The revision of its last event (or the cache's start): its objects
    /// are as they were at any revision from here to the cache's.
    changed: Revision,
    /// Objects per namespace (key prefix `ns/`), so that a first page of a
    /// namespace knows how many follow without walking them.
    per_namespace: HashMap<String, usize>,
    /// How many objects follow a page's last key, by (list prefix, key),
    /// with the `changed` it was counted at: the next page of a pager knows
    /// its count from its predecessor's instead of walking the rest.
    after_counts: std::sync::Mutex<HashMap<(String, String), (Revision, usize)>>,
}

/// Pages whose following count is remembered, per resource.
const AFTER_COUNTS: usize = 1024;

/// The namespace prefix of a key within a resource (`ns/`, `/` when cluster-scoped).
fn namespace_of(key: &str) -> &str {
    key.find('/').map_or("", |i| &key[..=i])
}

impl ResourceState {
    fn new(complete_after: Revision) -> Self {
        Self {
            objects: BTreeMap::new(),
            history: History::new(complete_after),
            bytes: 0,
            watchers: Vec::new(),
            api_versions: Vec::new(),
            changed: complete_after,
            per_namespace: HashMap::new(),
            after_counts: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn insert(&mut self, key: &str, object: Arc<CachedObject>) -> Option<Arc<CachedObject>> {
        let prev = self.objects.insert(key.to_string(), object);
        if prev.is_none() {
            *self
                .per_namespace
                .entry(namespace_of(key).to_string())
                .or_default() += 1;
        }
        prev
    }

    fn remove(&mut self, key: &str) -> Option<Arc<CachedObject>> {
        let prev = self.objects.remove(key);
        if prev.is_some() {
            let ns = namespace_of(key);
            if let Some(n) = self.per_namespace.get_mut(ns) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_namespace.remove(ns);
                }
            }
        }
        prev
    }

    /// Objects under a list prefix (`""` or `ns/`).
    fn count_under(&self, prefix: &str) -> usize {
        if prefix.is_empty() {
            self.objects.len()
        } else {
            self.per_namespace.get(prefix).copied().unwrap_or(0)
        }
    }

    fn api_version(&mut self, value: &Value) -> Arc<str> {
        let av = value
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(known) = self.api_versions.iter().find(|a| a.as_ref() == av) {
            return known.clone();
        }
        let new: Arc<str> = av.into();
        self.api_versions.push(new.clone());
        new
    }

    fn object(
        &mut self,
        key: &str,
        revision: Revision,
        value: &Value,
        json: Bytes,
        rewritten: bool,
    ) -> Arc<CachedObject> {
        let api_version = self.api_version(value);
        Arc::new(
            CachedObject::new(key.to_string(), revision, value, json, api_version)
                .rewritten(rewritten),
        )
    }
}

struct State {
    revision: Revision,
    resources: HashMap<String, ResourceState>,
}

pub struct Cache {
    state: RwLock<State>,
    revision: watch::Sender<Revision>,
    limits: HistoryLimits,
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
        limits: HistoryLimits,
    ) -> Result<Arc<Self>, StorageError> {
        Self::start_with(store, limits, None).await
    }

    /// Like [`Cache::start`]; `on_load` may rewrite stored objects as they
    /// enter the cache, at load and from the change feed (the registry fills
    /// in the defaults kube applies when decoding from storage), so readers
    /// and watchers all share the rewritten bytes.
    pub async fn start_with(
        store: Arc<Store>,
        limits: HistoryLimits,
        on_load: Option<OnLoad>,
    ) -> Result<Arc<Self>, StorageError> {
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
            let mut rewritten = false;
            if let Some(v) = on_load.as_ref().and_then(|f| f(resource, &value)) {
                json = crate::storage::json_bytes(&v)
                    .map_err(|e| StorageError::Corrupt(e.to_string()))?;
                value = v;
                rewritten = true;
            }
            let revision = object_revision(&value);
            let state = resources
                .entry(resource.to_string())
                .or_insert_with(|| ResourceState::new(rev));
            state.bytes += json.len() as u64;
            let object = state.object(sub, revision, &value, json, rewritten);
            state.insert(sub, object);
        }
        let (tx, _) = watch::channel(rev);
        let cache = Arc::new(Self {
            state: RwLock::new(State {
                revision: rev,
                resources,
            }),
            revision: tx,
            limits,
            loaded_at: rev,
            on_load,
        });
        let weak = Arc::downgrade(&cache);
        tokio::spawn(async move {
            let mut sweep = tokio::time::interval(SWEEP_EVERY);
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    batch = feed.recv() => {
                        let Some(batch) = batch else { return };
                        let Some(cache) = weak.upgrade() else { return };
                        cache.apply(&batch);
                    }
                    _ = sweep.tick() => {
                        let Some(cache) = weak.upgrade() else { return };
                        cache.sweep();
                    }
                }
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
        let json = crate::storage::json_bytes(&value).ok()?;
        Some((Arc::new(value), json))
    }

    fn apply(&self, batch: &Batch) {
        let now = Instant::now();
        // Rewritten before taking the lock, which readers and writers wait on.
        let rewritten: Vec<_> = batch.events.iter().map(|e| self.rewrite(e)).collect();
        let mut state = self.write();
        // The commit's events per resource, in order: each resource's run
        // goes to its watchers once they are all made.
        let mut runs: Vec<(String, Vec<Arc<WatchEvent>>)> = Vec::new();
        for (event, rewritten) in batch.events.iter().zip(rewritten) {
            let Some((resource, sub)) = split_key(&event.key) else {
                continue;
            };
            let was_rewritten = rewritten.is_some();
            let (value, json) =
                rewritten.unwrap_or_else(|| (event.object.clone(), event.json.clone()));
            // First event of this resource since loading: nothing before it was missed.
            let complete_after = self.loaded_at;
            let res = state
                .resources
                .entry(resource.to_string())
                .or_insert_with(|| ResourceState::new(complete_after));
            res.changed = event.revision;
            let object = res.object(sub, event.revision, &value, json, was_rewritten);
            let prev = if event.kind == EventType::Deleted {
                res.remove(sub)
            } else {
                res.bytes += object.json.len() as u64;
                res.insert(sub, object.clone())
            };
            if let Some(p) = &prev {
                res.bytes = res.bytes.saturating_sub(p.json.len() as u64);
            }
            let ev = Arc::new(WatchEvent::new(
                event.kind,
                event.revision,
                object,
                prev,
                res.history.ledger(),
            ));
            res.history.push(now, ev.clone(), &self.limits);
            match runs.iter_mut().find(|(r, _)| r == resource) {
                Some((_, events)) => events.push(ev),
                None => runs.push((resource.to_string(), vec![ev])),
            }
        }
        for (resource, events) in runs {
            if let Some(res) = state.resources.get_mut(&resource) {
                fan_out(res, events, now, &self.limits);
            }
        }
        state.revision = batch.revision;
        drop(state);
        self.revision.send_replace(batch.revision);
    }

    /// Drops history that expired while nothing was written, and watchers
    /// whose clients went away. A sending fan-out notices a gone watcher,
    /// but one whose filter no event passes (a quiet namespace) would
    /// otherwise stay registered for good: memory, and a filter check on
    /// every later event, for each watch a client ever opened there.
    fn sweep(&self) {
        let now = Instant::now();
        let mut state = self.write();
        for res in state.resources.values_mut() {
            res.history.trim(now, &self.limits);
            let history = &res.history;
            res.watchers.retain_mut(|w| {
                if w.tx.is_closed() {
                    return false;
                }
                w.behind_since.is_none() || catch_up(w, history, now, &self.limits)
            });
        }
    }

    /// The current objects of `resource` that pass `filter`, and the revision they are at.
    pub fn list(&self, resource: &str, filter: &Filter) -> (Revision, Vec<Arc<CachedObject>>) {
        let page = self.list_page(resource, filter, usize::MAX);
        (page.revision, page.items)
    }

    /// The first `limit` objects of `resource` that pass `filter`, and how
    /// many more pass it. Only the page is copied out: the rest is counted.
    pub fn list_page(&self, resource: &str, filter: &Filter, limit: usize) -> Page {
        let state = self.read();
        let mut page = Page {
            revision: state.revision,
            items: Vec::new(),
            more: 0,
        };
        if let Some(res) = state.resources.get(resource) {
            page_of(res, filter, limit, None, &mut page);
        }
        page
    }

    /// The page after `after` as it was at revision `at` (a continue
    /// token's), if the cache can tell: it has reached `at` and the
    /// resource has not changed since. A pager walking a quiet resource is
    /// served here, from memory, instead of by a scan of the store's history.
    pub fn list_page_at(
        &self,
        resource: &str,
        filter: &Filter,
        limit: usize,
        after: &str,
        at: Revision,
    ) -> Option<Page> {
        let state = self.read();
        if state.revision < at {
            return None;
        }
        let mut page = Page {
            revision: at,
            items: Vec::new(),
            more: 0,
        };
        match state.resources.get(resource) {
            Some(res) if res.changed <= at => page_of(res, filter, limit, Some(after), &mut page),
            Some(_) => return None,
            // No object and no event since the cache loaded.
            None if self.loaded_at <= at => {}
            None => return None,
        }
        Some(page)
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
            .or_insert_with(|| ResourceState::new(loaded_at));
        let (initial, after) = match start {
            Start::InitialState => {
                // Synthetic events are not history: their frames are this watch's own.
                let ledger = Arc::new(std::sync::atomic::AtomicU64::new(0));
                // Only the filter's keys are visited: this runs under the
                // write lock, and a namespace's watch must not walk every
                // other namespace's objects while writes wait.
                let initial = in_scope(&res.objects, &filter)
                    .filter(|o| (filter.predicate)(o))
                    .map(|o| {
                        Arc::new(WatchEvent::new(
                            EventType::Added,
                            o.revision,
                            o.clone(),
                            None,
                            ledger.clone(),
                        ))
                    })
                    .collect();
                (initial, current)
            }
            Start::After(rev) => {
                let replay =
                    res.history
                        .since(rev, &filter)
                        .map_err(|oldest| WatchError::TooOld {
                            requested: rev,
                            oldest,
                        })?;
                // Events between the cache and a future `rev` are skipped by `after`.
                (replay, rev.max(current))
            }
        };
        let (tx, rx) = feed(FeedLimits {
            events: WATCHER_BUFFER,
            bytes: self.limits.watcher_bytes,
        });
        res.watchers.push(Watcher {
            after,
            filter,
            tx,
            queued_to: after,
            behind_since: None,
        });
        Ok(Subscription {
            initial,
            revision: after,
            rx,
        })
    }
}

/// The objects under a filter's key (one name) or key prefix, in key order.
fn in_scope<'a>(
    objects: &'a BTreeMap<String, Arc<CachedObject>>,
    filter: &'a Filter,
) -> Box<dyn Iterator<Item = &'a Arc<CachedObject>> + 'a> {
    if let Some(k) = &filter.exact_key {
        return Box::new(objects.get(k).into_iter());
    }
    let prefix = filter.key_prefix.as_str();
    Box::new(
        objects
            .range((Bound::Included(prefix.to_string()), prefix_end(prefix)))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, o)| o),
    )
}

/// Where the keys under `prefix` end: keys under a prefix ending in '/'
/// end before the prefix with '0'; others are not bounded.
fn prefix_end(prefix: &str) -> Bound<String> {
    match prefix.strip_suffix('/') {
        Some(p) => Bound::Excluded(format!("{p}0")),
        None => Bound::Unbounded,
    }
}

/// Fills `page` with up to `limit` objects of `res` passing `filter`, from
/// just after `after` (or from the start), and says how many follow. With
/// no selector the rest is counted by walking the key range alone (kube
/// reports the count then); with one, only whether one more passes (kube
/// reports no count).
fn page_of(
    res: &ResourceState,
    filter: &Filter,
    limit: usize,
    after: Option<&str>,
    page: &mut Page,
) {
    if let Some(k) = &filter.exact_key {
        if after.is_some_and(|a| k.as_str() <= a) {
            return;
        }
        page.items.extend(
            res.objects
                .get(k)
                .filter(|o| (filter.predicate)(o))
                .cloned(),
        );
        if page.items.len() > limit {
            page.items.clear();
            page.more = 1;
        }
        return;
    }
    let prefix = filter.key_prefix.as_str();
    let start = match after {
        Some(a) if a >= prefix => Bound::Excluded(a.to_string()),
        _ => Bound::Included(prefix.to_string()),
    };
    let end = prefix_end(prefix);
    // A token's key past the prefix (kube resumes after it as given): nothing
    // follows; `range` would panic on bounds in the wrong order.
    if let (Bound::Excluded(a), Bound::Excluded(e)) = (&start, &end) {
        if a >= e {
            return;
        }
    }
    // A bounded range holds only keys under the prefix: their strings need
    // not be read (one memory access per object fewer on a long list).
    let bounded = matches!(end, Bound::Excluded(_));
    let mut range = res
        .objects
        .range((start, end))
        .filter(move |(k, _)| bounded || k.starts_with(prefix));
    if filter.selects_all {
        page.items
            .extend(range.by_ref().take(limit).map(|(_, o)| o.clone()));
        // How many follow: known without a walk for a first page (the count
        // under the prefix) and for a page after a remembered one.
        let known_after = match after {
            None => Some(res.count_under(prefix)),
            Some(a) => res
                .after_counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(prefix.to_string(), a.to_string()))
                .filter(|(changed, _)| *changed == res.changed)
                .map(|(_, n)| *n),
        };
        page.more = match known_after {
            Some(n) => n.saturating_sub(page.items.len()),
            None => range.count(),
        };
        if let (Some(last), true) = (page.items.last(), page.more > 0) {
            let mut counts = res.after_counts.lock().unwrap_or_else(|e| e.into_inner());
            if counts.len() >= AFTER_COUNTS {
                counts.clear();
            }
            counts.insert(
                (prefix.to_string(), last.key.clone()),
                (res.changed, page.more),
            );
        }
    } else {
        let mut matching = range.map(|(_, o)| o).filter(|o| (filter.predicate)(o));
        page.items.extend(matching.by_ref().take(limit).cloned());
        page.more = usize::from(matching.next().is_some());
    }
}

/// Hands a resource's run of events to each watcher: the run itself to
/// every watcher that wants all of it (shared, frames and all), its own
/// subset to one that wants part. A watcher whose feed is full falls behind
/// (the history keeps what it misses) rather than holding more.
fn fan_out(
    res: &mut ResourceState,
    events: Vec<Arc<WatchEvent>>,
    now: Instant,
    limits: &HistoryLimits,
) {
    if res.watchers.is_empty() {
        return;
    }
    let run = Arc::new(EventRun::new(events));
    let history = &res.history;
    res.watchers.retain_mut(|w| {
        if w.behind_since.is_some() {
            // This run is in the history already: caught up with the rest.
            return catch_up(w, history, now, limits);
        }
        let wants = |ev: &&Arc<WatchEvent>| ev.revision > w.after && interested(&w.filter, ev);
        let wanted = run.events.iter().filter(wants).count();
        let sent = if wanted == run.events.len() {
            w.tx.send(run.clone())
        } else if wanted > 0 {
            let own = run.events.iter().filter(wants).cloned().collect();
            w.tx.send(Arc::new(EventRun::new(own)))
        } else {
            Sent::Queued
        };
        match sent {
            Sent::Queued => {
                if let Some(last) = run.events.last() {
                    w.queued_to = w.queued_to.max(last.revision);
                }
                true
            }
            Sent::Full => {
                w.behind_since = Some(now);
                w.tx.set_behind(true);
                true
            }
            Sent::Closed => false,
        }
    });
}

/// Queues what a watcher that fell behind missed, from the history, once
/// its reader has made room; `false` (the watcher is dropped) when it has
/// been behind past the grace or the history no longer has what it missed.
/// Ending it frees its feed at once; its client sees the watch end and
/// re-watches from the last revision it got (kube-apiserver likewise
/// closes a watcher that stays unresponsive, and a 410 then makes the client
/// re-list).
fn catch_up(w: &mut Watcher, history: &History, now: Instant, limits: &HistoryLimits) -> bool {
    let Some(since) = w.behind_since else {
        return true;
    };
    let end = |why: &str| {
        tracing::info!(reason = why, "ending a watcher that fell behind");
        metrics::counter!("apiserver_terminated_watchers_total").increment(1);
        w.tx.terminate();
        false
    };
    if now.saturating_duration_since(since) > limits.watcher_grace {
        return end("it stayed behind past the grace");
    }
    if !w.tx.has_room() {
        return true;
    }
    let missed = match history.since(w.queued_to.max(w.after), &w.filter) {
        Ok(missed) => missed,
        Err(_) => return end("the history no longer has what it missed"),
    };
    let mut chunk: Vec<Arc<WatchEvent>> = Vec::new();
    let mut bytes = 0;
    let mut missed = missed.into_iter().peekable();
    while let Some(ev) = missed.next() {
        bytes += super::feed::event_cost(&ev);
        chunk.push(ev);
        let last = missed.peek().is_none();
        if !last && chunk.len() < CATCH_UP_EVENTS && bytes < CATCH_UP_BYTES {
            continue;
        }
        let to = chunk.last().map_or(w.queued_to, |e| e.revision);
        match w
            .tx
            .send(Arc::new(EventRun::new(std::mem::take(&mut chunk))))
        {
            Sent::Queued => w.queued_to = w.queued_to.max(to),
            Sent::Full => return true,
            Sent::Closed => return false,
        }
        bytes = 0;
    }
    w.behind_since = None;
    w.tx.set_behind(false);
    true
}

/// An event concerns a watcher if the object passes its filter now or did before.
pub(super) fn interested(filter: &Filter, ev: &WatchEvent) -> bool {
    filter.matches(&ev.object) || ev.prev.as_ref().is_some_and(|p| filter.matches(p))
}

pub fn object_revision(value: &Value) -> Revision {
    value
        .meta_field("resourceVersion")
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

    async fn setup(events: usize) -> (tempfile::TempDir, Arc<Store>, Arc<Cache>) {
        setup_with(HistoryLimits {
            events,
            ..Default::default()
        })
        .await
    }

    async fn setup_with(limits: HistoryLimits) -> (tempfile::TempDir, Arc<Store>, Arc<Cache>) {
        let dir = tempfile::tempdir().expect("tmp");
        let engine = Arc::new(Embedded::open(&dir.path().join("db")).expect("open"));
        let store = Store::open(engine).expect("store");
        let cache = Cache::start(store.clone(), limits).await.expect("cache");
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

    /// The ADDED event of `g/r` object `ns/name` at `rev`.
    fn added(ns: &str, name: &str, rev: Revision) -> Event {
        let object = json!({"apiVersion": "g/v1", "kind": "K",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rev.to_string()}});
        Event {
            kind: EventType::Added,
            key: format!("g/r/{ns}/{name}"),
            revision: rev,
            json: crate::storage::json_bytes(&object).expect("json"),
            object: Arc::new(object),
        }
    }

    /// A watcher of every object of `g/r` from the start.
    fn watch_all(cache: &Cache) -> Subscription {
        cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("watch")
    }

    #[tokio::test]
    async fn a_commit_reaches_each_watcher_as_one_run_shared_with_its_frames() {
        let (_d, _store, cache) = setup(100).await;
        let (mut a, mut b) = (watch_all(&cache), watch_all(&cache));
        let only_x = Filter {
            key_prefix: "x/".into(),
            ..Filter::everything()
        };
        let mut x = cache.watch("g/r", Start::After(0), only_x).expect("x");
        // One commit of three creates, the second in namespace x.
        let events = (1..=3u64)
            .map(|rev| {
                let ns = if rev == 2 { "x" } else { "y" };
                added(ns, &format!("o{rev}"), rev)
            })
            .collect();
        cache.apply(&Batch {
            events,
            revision: 3,
        });
        let (mut ra, mut rb, mut rx) = (Vec::new(), Vec::new(), Vec::new());
        assert_eq!(a.rx.recv_runs(&mut ra, 16).await, 1, "one item per commit");
        assert_eq!(b.rx.recv_runs(&mut rb, 16).await, 1);
        assert_eq!(x.rx.recv_runs(&mut rx, 16).await, 1);
        assert_eq!(ra[0].events.len(), 3);
        assert!(Arc::ptr_eq(&ra[0], &rb[0]), "the same run, not a copy");
        let joined = ra[0].joined_json();
        assert_eq!(
            joined.as_ptr(),
            rb[0].joined_json().as_ptr(),
            "joined once for every watcher"
        );
        let frames: Vec<u8> = ra[0]
            .events
            .iter()
            .flat_map(|e| e.json_frame().to_vec())
            .collect();
        assert_eq!(&joined[..], &frames[..], "the events' frames, in order");
        let revs: Vec<_> = rx[0].events.iter().map(|e| e.revision).collect();
        assert_eq!(revs, [2], "a filtered watcher gets only its part");
        assert!(!Arc::ptr_eq(&rx[0], &ra[0]));
    }

    #[tokio::test]
    async fn watchers_whose_clients_left_a_quiet_namespace_are_dropped() {
        let (_d, store, cache) = setup(100).await;
        let quiet = Filter {
            key_prefix: "quiet/".into(),
            ..Filter::everything()
        };
        let subs: Vec<_> = (0..50)
            .map(|_| {
                cache
                    .watch("g/r", Start::After(0), quiet.clone())
                    .expect("watch")
            })
            .collect();
        let kept = cache
            .watch("g/r", Start::After(0), quiet.clone())
            .expect("watch");
        assert_eq!(cache.watcher_count("g/r"), 51);
        drop(subs);
        // Events elsewhere are never sent to them, so no send finds them
        // gone: the periodic sweep must.
        create(&store, "elsewhere").await;
        let deadline = Instant::now() + SWEEP_EVERY * 3;
        while cache.watcher_count("g/r") > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(cache.watcher_count("g/r"), 1, "only the open watch is left");
        drop(kept);
        cache.sweep();
        assert_eq!(cache.watcher_count("g/r"), 0);
    }

    #[tokio::test]
    async fn an_initial_state_holds_the_filters_objects_only() {
        let (_d, _store, cache) = setup(100).await;
        let events = ["a", "b", "b0", "c"]
            .iter()
            .enumerate()
            .flat_map(|(i, ns)| {
                (0..2).map(move |j| added(ns, &format!("o{j}"), (i * 2 + j + 1) as u64))
            })
            .collect();
        cache.apply(&Batch {
            events,
            revision: 8,
        });
        let keys = |filter: Filter| -> Vec<String> {
            let sub = cache
                .watch("g/r", Start::InitialState, filter)
                .expect("watch");
            sub.initial.iter().map(|e| e.object.key.clone()).collect()
        };
        let ns_b = Filter {
            key_prefix: "b/".into(),
            ..Filter::everything()
        };
        // "b0/" sorts right after "b/": the range must stop before it.
        assert_eq!(keys(ns_b), ["b/o0", "b/o1"]);
        let one = Filter {
            key_prefix: "c/".into(),
            exact_key: Some("c/o1".into()),
            ..Filter::everything()
        };
        assert_eq!(keys(one), ["c/o1"]);
        assert_eq!(keys(Filter::everything()).len(), 8);
        let selected = Filter {
            key_prefix: "a/".into(),
            predicate: Arc::new(|o: &CachedObject| o.key.ends_with("o1")),
            selects_all: false,
            ..Filter::everything()
        };
        assert_eq!(keys(selected), ["a/o1"]);
    }

    #[tokio::test]
    async fn every_watcher_gets_the_same_encoded_bytes() {
        let (_d, store, cache) = setup(100).await;
        let (mut a, mut b) = (watch_all(&cache), watch_all(&cache));
        create(&store, "x").await;
        let ea = a.rx.recv().await.expect("a event");
        let eb = b.rx.recv().await.expect("b event");
        assert!(Arc::ptr_eq(&ea, &eb), "one event object shared");
        let (fa, fb) = (ea.json_frame(), eb.json_frame());
        assert_eq!(fa.as_ptr(), fb.as_ptr(), "frame encoded once, bytes shared");
        assert!(fa.starts_with(b"{\"type\":\"ADDED\",\"object\":{"));
        // Another form (a version, a media type) is encoded once too.
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let encode = || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Some(Bytes::from_static(b"other"))
        };
        let (oa, ob) = (ea.encoded("v2 cbor", encode), eb.encoded("v2 cbor", encode));
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(oa.expect("a").as_ptr(), ob.expect("b").as_ptr());
    }

    #[tokio::test]
    async fn continue_pages_come_from_the_cache_only_while_the_resource_is_unchanged() {
        let (_d, store, cache) = setup(100).await;
        let mut rev = 0;
        for i in 0..7 {
            rev = create(&store, &format!("o{i}")).await;
        }
        cache
            .wait_for(rev, Duration::from_secs(2))
            .await
            .expect("caught up");
        let ns = Filter {
            key_prefix: "ns/".into(),
            ..Filter::everything()
        };
        let first = cache.list_page("g/r", &ns, 3);
        let keys = |p: &Page| p.items.iter().map(|o| o.key.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&first), ["ns/o0", "ns/o1", "ns/o2"]);
        assert_eq!(first.more, 4);
        // Another resource's write does not stop the page being served...
        store
            .write(Write::Create {
                key: "g/other/ns/x".into(),
                object: json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "x"}}),
            })
            .await
            .expect("create");
        let next = cache
            .list_page_at("g/r", &ns, 3, "ns/o2", first.revision)
            .expect("served from the cache");
        assert_eq!(next.revision, first.revision, "the token's revision");
        assert_eq!(keys(&next), ["ns/o3", "ns/o4", "ns/o5"]);
        assert_eq!(next.more, 1);
        let last = cache
            .list_page_at("g/r", &ns, 3, "ns/o5", first.revision)
            .expect("served");
        assert_eq!((keys(&last), last.more), (vec!["ns/o6".to_string()], 0));
        // A key past the namespace: an empty page, not a panic.
        let past = cache
            .list_page_at("g/r", &ns, 3, "zz/a", first.revision)
            .expect("served");
        assert!(past.items.is_empty() && past.more == 0);
        // A selector reports only whether more follow.
        let odd = Filter {
            key_prefix: "ns/".into(),
            exact_key: None,
            predicate: Arc::new(|o: &CachedObject| o.key.ends_with(['1', '3', '5'])),
            selects_all: false,
        };
        let p = cache
            .list_page_at("g/r", &odd, 1, "ns/o0", first.revision)
            .expect("served");
        assert_eq!((keys(&p), p.more), (vec!["ns/o1".to_string()], 1));
        // ...but a write to the resource itself does: the store answers.
        let changed = create(&store, "o2a").await;
        cache
            .wait_for(changed, Duration::from_secs(2))
            .await
            .expect("caught up");
        assert!(cache
            .list_page_at("g/r", &ns, 3, "ns/o2", first.revision)
            .is_none());
        assert!(cache
            .list_page_at("g/r", &ns, 3, "ns/o2", changed)
            .is_some());
        // A revision the cache has not reached is not guessed at.
        assert!(cache
            .list_page_at("g/r", &ns, 3, "ns/o2", changed + 5)
            .is_none());
    }

    #[tokio::test]
    async fn page_counts_follow_creates_and_deletes_per_namespace() {
        let (_d, store, cache) = setup(100).await;
        for i in 0..5 {
            create(&store, &format!("a{i}")).await;
            store
                .write(Write::Create {
                    key: format!("g/r/other/b{i}"),
                    object: json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "b"}}),
                })
                .await
                .expect("create");
        }
        let rev = store
            .write(Write::Delete {
                key: "g/r/ns/a1".into(),
                expected: None,
            })
            .await
            .expect("delete")
            .revision;
        cache
            .wait_for(rev, Duration::from_secs(2))
            .await
            .expect("caught up");
        let ns = Filter {
            key_prefix: "ns/".into(),
            ..Filter::everything()
        };
        let first = cache.list_page("g/r", &ns, 2);
        assert_eq!(first.more, 2, "4 left in ns, 2 on the page");
        let all = cache.list_page("g/r", &Filter::everything(), 2);
        assert_eq!(all.more, 7);
        // Each following page's count comes from the one before it.
        let mut after = all.items.last().expect("item").key.clone();
        let mut seen = 2;
        while let Some(p) =
            cache.list_page_at("g/r", &Filter::everything(), 2, &after, all.revision)
        {
            seen += p.items.len();
            assert_eq!(p.more, 9 - seen, "after {after}");
            match p.items.last() {
                Some(last) if p.more > 0 => after = last.key.clone(),
                _ => break,
            }
        }
        assert_eq!(seen, 9);
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

    async fn create_big(store: &Store, name: &str, bytes: usize) -> Revision {
        store
            .write(Write::Create {
                key: format!("g/r/ns/{name}"),
                object: json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": name}, "data": "x".repeat(bytes)}),
            })
            .await
            .expect("create")
            .revision
    }

    fn history_of(cache: &Cache, resource: &str) -> (usize, u64) {
        let state = cache.read();
        let h = &state.resources[resource].history;
        (h.len(), h.bytes())
    }

    #[tokio::test]
    async fn history_is_bounded_in_bytes_whatever_its_age() {
        // Room for many events by count and time, for about 10 of 10 KB by bytes.
        let limits = HistoryLimits {
            bytes: 10 * 10_300,
            ..Default::default()
        };
        let (_d, store, cache) = setup_with(limits).await;
        let first = create(&store, "a").await;
        for i in 0..40 {
            create_big(&store, &format!("big{i}"), 10_000).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        let (kept, bytes) = history_of(&cache, "g/r");
        assert!(bytes <= limits.bytes, "{bytes} > {}", limits.bytes);
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
    async fn frames_built_for_watchers_count_against_the_byte_budget() {
        let limits = HistoryLimits {
            bytes: 20 * 10_300,
            ..Default::default()
        };
        let (_d, store, cache) = setup_with(limits).await;
        for i in 0..10 {
            create_big(&store, &format!("big{i}"), 10_000).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        let (_, before) = history_of(&cache, "g/r");
        let sub = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("replay");
        for ev in &sub.initial {
            ev.json_frame();
            ev.encoded("v2 json", || Some(Bytes::from(vec![b'y'; 10_000])));
        }
        let (_, after) = history_of(&cache, "g/r");
        assert!(after >= before + 10 * 20_000, "{before} → {after}");
        // Over budget now: the next write trims the oldest events, frames included.
        create_big(&store, "more", 10_000).await;
        cache
            .wait_for(store.revision(), Duration::from_secs(2))
            .await
            .expect("caught up");
        let (kept, bytes) = history_of(&cache, "g/r");
        assert!(bytes <= limits.bytes, "{bytes} > {}", limits.bytes);
        assert!(kept < 11, "kept {kept}");
    }

    #[tokio::test]
    async fn history_older_than_the_window_goes_even_when_nothing_is_written() {
        let limits = HistoryLimits {
            window: Duration::from_millis(300),
            ..Default::default()
        };
        let (_d, store, cache) = setup_with(limits).await;
        let first = create(&store, "a").await;
        let second = create(&store, "b").await;
        cache
            .wait_for(second, Duration::from_secs(2))
            .await
            .expect("caught up");
        assert_eq!(history_of(&cache, "g/r").0, 2);
        // Within the window, a watch resumes from the first event.
        let sub = cache
            .watch("g/r", Start::After(first - 1), Filter::everything())
            .expect("within the window");
        assert_eq!(sub.initial.len(), 2);
        // The periodic sweep drops both, with no write to trigger it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while history_of(&cache, "g/r").0 > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            history_of(&cache, "g/r"),
            (0, 0),
            "history empty, bytes returned"
        );
        assert!(matches!(
            cache.watch("g/r", Start::After(first - 1), Filter::everything()),
            Err(WatchError::TooOld { .. })
        ));
        // Resuming from the newest revision needs nothing that was dropped.
        cache
            .watch("g/r", Start::After(second), Filter::everything())
            .expect("nothing missed");
    }

    #[tokio::test]
    async fn old_revisions_fall_out_of_a_full_history() {
        let (_d, store, cache) = setup(2).await;
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
    async fn a_watcher_that_falls_behind_is_caught_up_from_the_history_in_order() {
        let (_d, store, cache) = setup(100_000).await;
        let mut slow = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("slow");
        let n = WATCHER_BUFFER + 10;
        for i in 0..n {
            create(&store, &format!("o{i}")).await;
        }
        cache
            .wait_for(store.revision(), Duration::from_secs(5))
            .await
            .expect("caught up");
        assert!(slow.rx.is_behind(), "the feed held only its bound");
        assert_eq!(
            cache.watcher_count("g/r"),
            1,
            "not dropped within the grace"
        );
        let mut revs = Vec::new();
        while revs.len() < n {
            let ev = tokio::time::timeout(Duration::from_secs(5), slow.rx.recv())
                .await
                .expect("the rest comes from the history")
                .expect("event");
            revs.push(ev.revision);
        }
        assert!(revs.windows(2).all(|w| w[0] < w[1]), "in order, no repeats");
        assert_eq!(revs.last().copied(), Some(store.revision()));
        assert!(!slow.rx.is_behind());
    }

    #[tokio::test]
    async fn a_watcher_that_stays_behind_past_the_grace_is_ended_and_lets_go_of_its_events() {
        let limits = HistoryLimits {
            watcher_bytes: 3 * 400,
            watcher_grace: Duration::from_millis(100),
            ..Default::default()
        };
        let (_d, store, cache) = setup_with(limits).await;
        let mut stalled = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("stalled");
        let mut reading = cache
            .watch("g/r", Start::After(0), Filter::everything())
            .expect("reading");
        let mut got = 0;
        for i in 0..10 {
            create(&store, &format!("o{i}")).await;
            while tokio::time::timeout(Duration::from_millis(50), reading.rx.recv())
                .await
                .is_ok()
            {
                got += 1;
            }
        }
        assert_eq!(got, 10, "a watcher that reads gets everything");
        assert!(stalled.rx.is_behind());
        // The sweep ends it once the grace has passed, with no write needed.
        tokio::time::sleep(SWEEP_EVERY * 2).await;
        assert_eq!(cache.watcher_count("g/r"), 1, "only the reader is left");
        let end = tokio::time::timeout(Duration::from_millis(100), stalled.rx.recv()).await;
        assert!(
            matches!(end, Ok(None)),
            "its feed holds nothing and ends at once"
        );
    }
}
