//! The one read-modify-write loop (k8s.io/apiserver's `GuaranteedUpdate`):
//! read the object, let the caller decide from it, write conditionally on the
//! revision read, and on a storage conflict (another writer in between) read
//! and decide again, a bounded number of times. The first read comes from the
//! watch cache, as kube's cacher hands its cached object to `GuaranteedUpdate`:
//! no store read for the usual write. Cached state may be stale, so an
//! answer that is not a conditional write (an error, a no-op, a dry run) is
//! confirmed against a fresh read first, as kube does. A resourceVersion the
//! client sent is a precondition the caller checks: a mismatch with the fresh
//! state is a 409, never retried (`preconditions.rs` holds those checks).

use serde_json::Value;

use super::read::Item;
use super::{convert_value, convert_values, storage_error, Registry, Target};
use crate::status::{ApiError, FieldError};
use crate::storage::{Revision, StorageError, Write};

/// Attempts before a write that keeps losing races gives up with 409.
const MAX_RETRIES: usize = 16;

/// How long a write waits for the watch cache to hold the revision its
/// client names before reading the store instead. The cache applies a
/// committed write within microseconds unless it is stalled. (Longer in
/// tests, which hold the cache back on purpose on loaded machines.)
#[cfg(not(test))]
const CACHE_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(200);
#[cfg(test)]
const CACHE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(5);

/// The object as stored: its revision and value (in the request's version,
/// with the defaults kube adds when decoding it).
pub(super) struct Current {
    pub rev: Revision,
    pub value: Value,
    /// The value without those defaults, when reading added any.
    stored: Option<Value>,
}

impl Current {
    /// Whether writing `new` would store what is stored already. kube compares
    /// the encoded object with the stored bytes, so a write that only keeps
    /// the defaults added on read still writes (and persists them).
    pub fn unchanged_by(&self, new: &Value) -> bool {
        new == self.stored.as_ref().unwrap_or(&self.value)
    }
}

/// What one attempt decided, from the object as read.
pub(super) enum Plan {
    /// No write: the answer is this (nothing changed, or a dry run).
    Done(Item),
    /// Store this object, if still at the revision read.
    Update(Value),
    /// Remove the object, if still at the revision read.
    Delete,
    /// An update that removed a deleting object's last finalizer: remove the
    /// object as stored (if still at the revision read) without storing the
    /// update, as kube does (watchers see DELETED only); the answer is the
    /// updated object with the resourceVersion read.
    Finalized(Value),
    /// What was read is gone already (an apply's create lost to another
    /// creator): read again and decide again.
    Again,
}

/// Where an attempt's object came from.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// The watch cache: possibly behind the store.
    Cache,
    /// The store, read for this attempt.
    Store,
}

/// One request's read-modify-write attempts (kube's `GuaranteedUpdate`),
/// driven by the caller's loop:
///
/// ```text
/// loop {
///     let read = attempts.read().await?;          // cache first, then the store
///     let decided = async { /* decide from read: a Plan */ }.await;
///     if let Some(item) = attempts.settle(read.as_ref(), decided).await? { break item }
/// }
/// ```
///
/// `decide` starts from scratch each time (admission included, as inside
/// kube's loop). (A closure-taking function would read better, but an async
/// closure borrowing the request's state cannot be proven `Send` for the
/// HTTP handler with today's compiler.)
pub(super) struct Attempts<'a> {
    reg: &'a Registry,
    t: &'a Target,
    name: &'a str,
    tries: usize,
    /// Where the last read came from.
    source: Source,
    /// What the next attempt decides from, when already read.
    next: Option<Option<Current>>,
    /// The revision the client's object names (an update's
    /// resourceVersion): the cache is read once it has caught up with it.
    named: Option<Revision>,
}

impl<'a> Attempts<'a> {
    pub fn new(reg: &'a Registry, t: &'a Target, name: &'a str) -> Self {
        Self {
            reg,
            t,
            name,
            tries: 0,
            source: Source::Store,
            next: None,
            named: None,
        }
    }

    /// Attempts at an object the client names at `rev` (the resourceVersion
    /// of its update). A client writing again right after its last write
    /// names a revision the watch cache may not hold yet (the answer does
    /// not wait for the cache): the first read waits for the cache to get
    /// there rather than deciding from a stale object and reading the store.
    pub fn named_at(mut self, rev: Option<Revision>) -> Self {
        self.named = rev;
        self
    }

    /// The object for the next attempt (`None`: absent): the first from the
    /// watch cache when it has it, the others from the store; 409 once the
    /// attempts are used up.
    pub async fn read(&mut self) -> Result<Option<Current>, ApiError> {
        let (reg, t, name) = (self.reg, self.t, self.name);
        if self.tries == MAX_RETRIES {
            return Err(ApiError::modified(&t.rt.group, &t.rt.plural, name));
        }
        self.tries += 1;
        if self.tries == 1 {
            if let Some(cached) = reg.cached_current(t, name, self.named).await? {
                self.source = Source::Cache;
                return Ok(Some(cached));
            }
        }
        self.source = Source::Store;
        match self.next.take() {
            Some(read) => Ok(read),
            None => reg.read_current(t, name).await,
        }
    }

    /// Carries out what was decided from `current`; `Ok(None)`: read and
    /// decide again (another writer came in between, or the cached object
    /// decided from was stale).
    pub async fn settle(
        &mut self,
        current: Option<&Current>,
        decided: Result<Plan, ApiError>,
    ) -> Result<Option<Item>, ApiError> {
        let (reg, t, name) = (self.reg, self.t, self.name);
        let conditional = matches!(
            decided,
            Ok(Plan::Update(_) | Plan::Delete | Plan::Finalized(_))
        );
        if self.source == Source::Cache && !conditional {
            // Only a conditional write checks the revision it was decided
            // from; any other answer stands only if the cache was current.
            let fresh = reg.read_current(t, name).await?;
            if fresh.as_ref().map(|c| c.rev) != current.map(|c| c.rev) {
                self.next = Some(fresh);
                return Ok(None);
            }
        }
        match decided? {
            Plan::Again => Ok(None),
            plan => reg.commit(t, name, current, plan).await,
        }
    }
}

impl Registry {
    /// Carries out what was decided from `current`. `Ok(None)`: another
    /// writer came in between; read and decide again.
    async fn commit(
        &self,
        t: &Target,
        name: &str,
        current: Option<&Current>,
        plan: Plan,
    ) -> Result<Option<Item>, ApiError> {
        let key = t.key(name);
        let write = match (plan, current.map(|c| c.rev)) {
            (Plan::Done(item), _) => return Ok(Some(item)),
            (Plan::Again, _) => return Ok(None),
            (Plan::Update(obj), Some(expected)) => Write::Update {
                key,
                expected,
                object: self.storage_of_owned(t, obj).await?,
            },
            (Plan::Delete, Some(expected)) => Write::Delete {
                key,
                expected: Some(expected),
            },
            (Plan::Finalized(obj), Some(expected)) => {
                // The update itself is never stored: the object as stored
                // goes (watchers see DELETED with its last stored content),
                // and the answer is the updated object at the revision read.
                let answer = self.dry_run_item(t, obj).await?;
                return match self
                    .store
                    .write(Write::Delete {
                        key,
                        expected: Some(expected),
                    })
                    .await
                {
                    Ok(_) => Ok(Some(answer)),
                    Err(StorageError::Conflict { .. }) => Ok(None),
                    Err(e) => Err(self.write_error(t, name, e)),
                };
            }
            (Plan::Update(_) | Plan::Delete | Plan::Finalized(_), None) => {
                return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name))
            }
        };
        match self.store.write(write).await {
            Ok(w) => Ok(Some(self.item(t, &w.object, &w.json).await?)),
            Err(StorageError::Conflict { .. }) => Ok(None),
            Err(e) => Err(self.write_error(t, name, e)),
        }
    }

    /// The object as the watch cache holds it, when that is the stored
    /// encoding (not one the cache rewrote with read defaults), once the
    /// cache holds revision `named` (when the store has it: a revision
    /// beyond the store's is a conflict to find out, not to wait for);
    /// `None` sends the attempt to the store (absent, or the cache lags on).
    async fn cached_current(
        &self,
        t: &Target,
        name: &str,
        named: Option<Revision>,
    ) -> Result<Option<Current>, ApiError> {
        let (id, key) = (t.rt.id(), t.cache_key(name));
        let (seen, mut cached) = self.cache.get(&id, &key);
        if let Some(named) = named.filter(|r| *r > seen && *r <= self.store.revision()) {
            if self.cache.wait_for(named, CACHE_CATCH_UP).await.is_err() {
                return Ok(None);
            }
            cached = self.cache.get(&id, &key).1;
        }
        let Some(obj) = cached.filter(|o| o.is_stored_form()) else {
            return Ok(None);
        };
        let value: Value = serde_json::from_slice(&obj.json).map_err(ApiError::internal)?;
        self.current(t, obj.revision, value).await.map(Some)
    }

    /// The stored object in the target's version, or `None` when absent.
    async fn read_current(&self, t: &Target, name: &str) -> Result<Option<Current>, ApiError> {
        let Some((rev, json)) = self.store.get(&t.key(name)).await.map_err(storage_error)? else {
            return Ok(None);
        };
        let value: Value = serde_json::from_slice(&json).map_err(ApiError::internal)?;
        self.current(t, rev, value).await.map(Some)
    }

    /// A stored object as a write decides from it: with read defaults, in
    /// the target's version.
    async fn current(&self, t: &Target, rev: Revision, value: Value) -> Result<Current, ApiError> {
        let api_version = t.api_version();
        let defaulted = super::read_defaults(&t.rt, &value);
        // Both forms in one review when the read added defaults.
        let (value, stored) = match &defaulted {
            Some(d) => {
                let mut both = convert_values(&t.rt, &[d, &value], &api_version).await?;
                let stored = both.pop();
                (both.pop(), stored)
            }
            None => (
                Some(convert_value(&t.rt, &value, &api_version).await?),
                None,
            ),
        };
        Ok(Current {
            rev,
            value: value.ok_or_else(|| ApiError::internal("conversion returned no object"))?,
            stored,
        })
    }

    /// Storage outcomes of a write that are not a race to retry.
    pub(super) fn write_error(&self, t: &Target, name: &str, e: StorageError) -> ApiError {
        match e {
            StorageError::NotFound => ApiError::not_found(&t.rt.group, &t.rt.plural, name),
            StorageError::Conflict { .. } => ApiError::modified(&t.rt.group, &t.rt.plural, name),
            StorageError::TooLarge { size, limit } => too_large(t, name, size, limit),
            StorageError::TooDeep { limit } => too_deep(t, name, limit),
            other => storage_error(other),
        }
    }
}

/// An object too large to store: 422, as kube answers for oversized custom resources.
pub(super) fn too_large(t: &Target, name: &str, size: usize, limit: usize) -> ApiError {
    ApiError::invalid(
        &t.rt.group,
        &t.rt.kind,
        name,
        &[FieldError::new(
            crate::status::FieldErrorKind::TooLong,
            "<root>",
            Some(size.to_string()),
            format!("may not be more than {limit} bytes"),
        )],
    )
}

/// An object nested too deeply to store (and read back): 422 as well.
pub(super) fn too_deep(t: &Target, name: &str, limit: usize) -> ApiError {
    ApiError::invalid(
        &t.rt.group,
        &t.rt.kind,
        name,
        &[FieldError::new(
            crate::status::FieldErrorKind::Invalid,
            "<root>",
            None,
            format!("may not nest arrays and objects more than {limit} levels deep"),
        )],
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use serde_json::json;

    use super::super::{Catalog, Subresource, Target, WriteOptions};
    use super::*;
    use crate::apiextensions::catalog::tests::WIDGET;
    use crate::storage::{embedded::Embedded, Store};
    use crate::watch::Cache;

    async fn registry(dir: &Path) -> (Arc<Registry>, Target) {
        registry_with(dir, None).await
    }

    /// A widget registry on an embedded store in `dir`, its watch cache
    /// loading through `on_load`.
    async fn registry_with(
        dir: &Path,
        on_load: Option<crate::watch::OnLoad>,
    ) -> (Arc<Registry>, Target) {
        let mut catalog = Catalog::default();
        catalog
            .add_manifests(Path::new("w.yaml"), WIDGET)
            .expect("crd");
        let rt = catalog
            .find("demo.kshard.dev", "v1", "widgets")
            .cloned()
            .expect("widgets");
        let engine = Arc::new(Embedded::open(&dir.join("db")).expect("open"));
        let store = Store::open(engine).expect("store");
        let cache = Cache::start_with(store.clone(), Default::default(), on_load)
            .await
            .expect("cache");
        let t = Target {
            rt,
            version: "v1".into(),
            namespace: "default".into(),
        };
        (
            Registry::new(
                crate::apiextensions::live::LiveCatalog::new(catalog),
                store,
                cache,
                None,
            ),
            t,
        )
    }

    fn widget() -> serde_json::Value {
        json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
            "metadata": {"name": "g"}, "spec": {"n": 0}})
    }

    fn opts() -> WriteOptions {
        WriteOptions {
            manager: "test".into(),
            ..Default::default()
        }
    }

    /// Concurrent read-modify-writes all land: each lost race reads again.
    #[tokio::test(flavor = "multi_thread")]
    async fn conflicts_are_retried_until_every_change_lands() {
        let dir = tempfile::tempdir().expect("dir");
        let (reg, t) = registry(dir.path()).await;
        reg.create(&t, widget(), &opts()).await.expect("create");
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (reg, t) = (reg.clone(), t.clone());
                tokio::spawn(async move {
                    reg.update_with(&t, "g", Subresource::Main, &opts(), |cur| {
                        let mut v = cur.clone();
                        let n = v["spec"]["n"].as_i64().unwrap_or(0);
                        v["spec"]["n"] = json!(n + 1);
                        Ok(v)
                    })
                    .await
                    .map(|_| ())
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("join").expect("update");
        }
        let got = reg
            .get(&t, "g", &super::super::ReadAt::Consistent)
            .await
            .expect("get");
        assert_eq!(got.value()["spec"]["n"], 8);
    }

    /// A client's resourceVersion is a precondition: a stale one is a 409 at once.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_stale_client_resource_version_is_a_conflict() {
        let dir = tempfile::tempdir().expect("dir");
        let (reg, t) = registry(dir.path()).await;
        let created = reg.create(&t, widget(), &opts()).await.expect("create");
        let mut stale = created.item.value().clone();
        stale["spec"]["n"] = json!(1);
        reg.update(&t, "g", stale.clone(), Subresource::Main, &opts())
            .await
            .expect("first update");
        stale["spec"]["n"] = json!(2);
        let e = reg
            .update(&t, "g", stale, Subresource::Main, &opts())
            .await
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(409));
    }

    /// The first read of a write comes from the watch cache, which may lag
    /// the store: a client's resourceVersion newer than the cached object's,
    /// or a no-op decided from stale state, is confirmed against the store
    /// instead of answered from the cache (kube's `GuaranteedUpdate`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stale_cached_object_is_confirmed_against_the_store() {
        let dir = tempfile::tempdir().expect("dir");
        let (reg, t, gate, rev0, mut latest) = written_past_the_cache(dir.path()).await;
        assert_ne!(latest["metadata"]["resourceVersion"], rev0);
        let (_, cached) = reg.cache.get(&t.rt.id(), &t.cache_key("g"));
        assert_eq!(
            cached.map(|o| o.value()["metadata"]["resourceVersion"].clone()),
            Some(rev0),
            "the cache is held back"
        );
        // A PUT carrying the resourceVersion the client just got: not a 409.
        latest["spec"]["n"] = json!(2);
        let put = reg
            .update(&t, "g", latest, Subresource::Main, &opts())
            .await
            .expect("a PUT at the newest resourceVersion succeeds");
        assert_eq!(put.item.value()["spec"]["n"], 2);
        // A no-op decided from the stale cache (n is 2 in the store, 0 in
        // the cache) must not answer the stale object.
        let noop = reg
            .update_with(&t, "g", Subresource::Main, &opts(), |cur| Ok(cur.clone()))
            .await
            .expect("no-op");
        assert_eq!(noop.item.value()["spec"]["n"], 2);
        assert_eq!(
            noop.item.value()["metadata"]["resourceVersion"],
            put.item.value()["metadata"]["resourceVersion"]
        );
        // A delete whose preconditions name the newest resourceVersion.
        let rv = put.item.value()["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        let deleted = reg
            .delete(
                &t,
                "g",
                &super::super::delete::DeleteOptions {
                    preconditions: super::super::Preconditions {
                        uid: None,
                        resource_version: rv,
                    },
                    ..Default::default()
                },
            )
            .await;
        assert!(deleted.is_ok(), "{:?}", deleted.err().map(|e| e.message));
        gate.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// A client writing again at the resourceVersion it was just answered
    /// decides from the watch cache once the cache has it, instead of
    /// deciding from the older cached object and reading the store: the
    /// PUT waits while the cache is held back and lands when it is let go.
    /// A resourceVersion the store does not have yet is a 409 at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_update_at_the_revision_just_written_waits_for_the_cache() {
        let dir = tempfile::tempdir().expect("dir");
        let (reg, t, gate, _, mut latest) = written_past_the_cache(dir.path()).await;
        latest["spec"]["n"] = json!(2);
        let mut beyond = latest.clone();
        beyond["metadata"]["resourceVersion"] = json!("999999");
        let started = std::time::Instant::now();
        let e = reg
            .update(&t, "g", beyond, Subresource::Main, &opts())
            .await
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(409));
        assert!(
            started.elapsed() < CACHE_CATCH_UP,
            "no wait for a revision the store lacks"
        );
        let put = tokio::spawn({
            let (reg, t) = (reg.clone(), t.clone());
            async move {
                reg.update(&t, "g", latest, Subresource::Main, &opts())
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!put.is_finished(), "the PUT waits for the cache");
        gate.store(false, std::sync::atomic::Ordering::SeqCst);
        let put = put.await.expect("join").expect("the PUT lands");
        assert_eq!(put.item.value()["spec"]["n"], 2);
    }

    /// A widget created (at the returned revision) and cached, then the
    /// cache held back (the gate set) and the widget updated (`spec.n` 1,
    /// the returned object): the cache still holds it as created.
    async fn written_past_the_cache(
        dir: &Path,
    ) -> (
        Arc<Registry>,
        Target,
        Arc<std::sync::atomic::AtomicBool>,
        serde_json::Value,
        serde_json::Value,
    ) {
        let (reg, t, gate) = gated_registry(dir).await;
        let created = reg.create(&t, widget(), &opts()).await.expect("create");
        let rev0 = created.item.value()["metadata"]["resourceVersion"].clone();
        until_cached(&reg, &t, &rev0).await;
        gate.store(true, std::sync::atomic::Ordering::SeqCst);
        let first = reg
            .update_with(&t, "g", Subresource::Main, &opts(), |cur| {
                let mut v = cur.clone();
                v["spec"]["n"] = json!(1);
                Ok(v)
            })
            .await
            .expect("update");
        let latest = first.item.value().clone();
        (reg, t, gate, rev0, latest)
    }

    /// A registry whose watch cache stops applying changes while the
    /// returned gate is set (its load hook waits for it to clear).
    async fn gated_registry(
        dir: &Path,
    ) -> (Arc<Registry>, Target, Arc<std::sync::atomic::AtomicBool>) {
        let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook = gate.clone();
        let on_load: crate::watch::OnLoad = Arc::new(move |_: &str, _: &serde_json::Value| {
            while hook.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            None
        });
        let (reg, t) = registry_with(dir, Some(on_load)).await;
        (reg, t, gate)
    }

    async fn until_cached(reg: &Registry, t: &Target, rv: &serde_json::Value) {
        for _ in 0..500 {
            let (_, o) = reg.cache.get(&t.rt.id(), &t.cache_key("g"));
            if o.is_some_and(|o| &o.value()["metadata"]["resourceVersion"] == rv) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the cache never saw {rv}");
    }

    /// Regression: a create body nested 122 levels parsed (serde_json allows
    /// 127), but its managedFields nest deeper than the object, so the stored
    /// object could not be read, deleted, or loaded by the watch cache at the
    /// next start. Objects that deep are refused before they are stored.
    #[tokio::test(flavor = "multi_thread")]
    async fn objects_too_deep_to_read_back_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let (reg, t) = registry(dir.path()).await;
        let nested = |name: &str, n: usize| {
            let mut w = widget();
            w["metadata"]["name"] = json!(name);
            w["spec"]["deep"] = crate::fuzz::deep_value(n, false);
            w
        };
        let e = reg
            .create(&t, nested("deep", 122), &opts())
            .await
            .err()
            .map(|e| (e.code, e.message));
        assert_eq!(
            e,
            Some((
                422,
                "Widget.demo.kshard.dev \"deep\" is invalid: <root>: Invalid value: may not nest arrays and objects more than 127 levels deep".into()
            ))
        );
        // Just under the limit with its managedFields: stored and readable.
        reg.create(&t, nested("ok", 118), &opts())
            .await
            .expect("create");
        let got = reg
            .get(&t, "ok", &super::super::ReadAt::Consistent)
            .await
            .expect("get");
        assert!(got.value()["metadata"]["managedFields"].is_array());
        let e = reg
            .update_with(&t, "ok", Subresource::Main, &opts(), |cur| {
                let mut v = cur.clone();
                v["spec"]["deep"] = crate::fuzz::deep_value(122, false);
                Ok(v)
            })
            .await
            .err()
            .map(|e| e.code);
        assert_eq!(e, Some(422));
    }
}
