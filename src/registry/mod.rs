//! Resource semantics independent of HTTP: the catalog, reads with kube's
//! resourceVersion rules, the one write pipeline every resource shares
//! (create/update/delete/finalizers/generation), subresources, selectors,
//! tables and garbage collection.

mod continuation;
mod delete;
pub mod gc;
mod guaranteed;
pub mod jsonpath;
pub mod patch;
mod preconditions;
pub mod read;
pub mod resource_version;
pub mod scale;
pub mod selector;
pub mod strategic;
pub mod table;
mod write;
pub mod write_admission;

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

pub use crate::apiextensions::{Catalog, ResourceType};
pub use continuation::ContinueToken;
pub use delete::{DeleteOptions, DeleteOutcome, Propagation};
pub use preconditions::Preconditions;
pub use read::{Item, ListResult};
pub use resource_version::{ReadAt, Watch, WatchStart};
pub use write::{FieldValidation, Outcome, Subresource, WriteOptions};

use crate::status::ApiError;
use crate::storage::{Revision, StorageError, Store};
use crate::watch::{Cache, CachedObject, Filter};
use selector::{field_value, FieldSelector, LabelSelector};

/// What a request addresses: a resource type, the version asked for, a namespace.
#[derive(Clone)]
pub struct Target {
    pub rt: Arc<ResourceType>,
    pub version: String,
    /// Empty for cluster-scoped resources and all-namespace requests.
    pub namespace: String,
}

impl Target {
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.rt.group, self.version)
    }
    /// Whether `api_version` names the version asked for, without building
    /// the string (every write compares it at least twice).
    pub fn is_api_version(&self, api_version: &str) -> bool {
        is_group_version(api_version, &self.rt.group, &self.version)
    }
    /// Whether `api_version` is the resource's storage version.
    pub fn is_storage_version(&self, api_version: &str) -> bool {
        is_group_version(api_version, &self.rt.group, &self.rt.storage_version)
    }
    pub fn key(&self, name: &str) -> String {
        self.rt.storage_key(&self.namespace, name)
    }
    /// Key prefix of the collection this target names (one namespace or all).
    pub fn collection_prefix(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/", self.rt.id())
        } else {
            format!("{}/{}/", self.rt.id(), self.namespace)
        }
    }
    fn cache_key_prefix(&self) -> String {
        if self.namespace.is_empty() {
            String::new()
        } else {
            format!("{}/", self.namespace)
        }
    }
    pub fn cache_key(&self, name: &str) -> String {
        format!("{}/{}", self.namespace, name)
    }
    pub fn version_info(&self) -> Option<&crate::apiextensions::catalog::Version> {
        self.rt.version(&self.version)
    }
    pub fn has_status(&self) -> bool {
        self.version_info().is_some_and(|v| v.status_subresource)
    }
}

/// Label and field selectors of a list, watch or deletecollection.
#[derive(Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parses both selectors, checking field labels against what the type supports.
    pub fn parse(t: &Target, labels: &str, fields: &str) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(labels).map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(fields).map_err(ApiError::bad_request)?;
        let selectable: Vec<String> = t
            .version_info()
            .map(|v| {
                v.selectable_fields
                    .iter()
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect()
            })
            .unwrap_or_default();
        for f in fields.fields() {
            let ok = f == "metadata.name"
                || (f == "metadata.namespace" && t.rt.namespaced)
                || selectable.iter().any(|s| s == f);
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {f}"
                )));
            }
        }
        Ok(Self { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if !self.labels.matches_object(obj) {
            return false;
        }
        self.fields.is_empty()
            || self.fields.matches(|f| {
                let pointer = format!("/{}", f.replace('.', "/"));
                field_value(obj.pointer(&pointer))
            })
    }

    /// Matches a cached object: labels and name/namespace without parsing
    /// it, other selectable fields from its parsed value.
    pub fn matches_cached(&self, o: &CachedObject) -> bool {
        if !self.labels.matches_with(|k| o.label(k)) {
            return false;
        }
        if self.fields.is_empty() {
            return true;
        }
        if self
            .fields
            .fields()
            .all(|f| f == "metadata.name" || f == "metadata.namespace")
        {
            return self.fields.matches(|f| match f {
                "metadata.name" => o.name().to_string(),
                _ => o.namespace().to_string(),
            });
        }
        self.matches(&o.value())
    }
}

pub struct Registry {
    catalog: Arc<crate::apiextensions::live::LiveCatalog>,
    store: Arc<Store>,
    cache: Arc<Cache>,
    /// Checks every create passes (namespace lifecycle against a host).
    admission: Option<Arc<dyn write_admission::CreateAdmission>>,
    /// Admission webhooks, installed once the server has built them.
    webhooks: std::sync::OnceLock<Arc<dyn write_admission::Admission>>,
}

impl Registry {
    /// Marks a write request in flight for its whole handling (see
    /// `Store::writing`).
    pub fn writing(&self) -> crate::storage::Writing<'_> {
        self.store.writing()
    }

    pub fn new(
        catalog: Arc<crate::apiextensions::live::LiveCatalog>,
        store: Arc<Store>,
        cache: Arc<Cache>,
        admission: Option<Arc<dyn write_admission::CreateAdmission>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            catalog,
            store,
            cache,
            admission,
            webhooks: std::sync::OnceLock::new(),
        })
    }

    /// The served types, as they are now (definitions can change at any time;
    /// a request keeps the catalog it started with).
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.get()
    }

    /// The live catalog, to replace or to follow changes.
    pub fn live_catalog(&self) -> &Arc<crate::apiextensions::live::LiveCatalog> {
        &self.catalog
    }

    /// Whether another replica sequences writes (controllers that write
    /// leave the work to the leader).
    pub fn is_follower(&self) -> bool {
        self.store.is_follower()
    }

    /// The newest committed revision.
    pub fn revision(&self) -> Revision {
        self.store.revision()
    }

    /// The revision the watch cache is current to (watch bookmarks carry it).
    pub fn cache_revision(&self) -> Revision {
        self.cache.revision()
    }

    /// What listing `resource` costs: its live object count and average
    /// encoded size (flow control sizes LIST and WATCH seats by it).
    pub fn list_cost(&self, resource: &str) -> (usize, u64) {
        self.cache.stats(resource)
    }

    /// How many watchers `resource` has (a write's cost fans out to them).
    pub fn watchers_of(&self, resource: &str) -> usize {
        self.cache.watcher_count(resource)
    }

    /// A cache filter for a target collection (or one name) and selectors.
    pub fn filter(&self, t: &Target, name: Option<&str>, sel: &Selectors) -> Filter {
        let sel = sel.clone();
        let selects_all = sel.is_empty();
        let predicate: Arc<dyn Fn(&CachedObject) -> bool + Send + Sync> = if sel.is_empty() {
            Arc::new(|_| true)
        } else {
            Arc::new(move |o: &CachedObject| sel.matches_cached(o))
        };
        Filter {
            key_prefix: t.cache_key_prefix(),
            exact_key: name.map(|n| t.cache_key(n)),
            predicate,
            selects_all,
        }
    }
}

/// An object as kube decodes it from storage: with the defaults of the
/// schema of the version it is stored at (apiextensions' storage codec runs
/// its `unstructuredDefaulter` before converting to the requested version,
/// whose own defaults apply to request bodies only). Never persisted.
/// `None` when that adds nothing, the usual case: objects are defaulted when
/// written, so only defaults another version's schema lacks show up here.
pub fn read_defaults(rt: &ResourceType, stored: &Value) -> Option<Value> {
    let version = stored
        .get("apiVersion")
        .and_then(Value::as_str)
        .and_then(|av| av.strip_prefix(rt.group.as_str())?.strip_prefix('/'))
        .unwrap_or(&rt.storage_version);
    let schema = rt
        .versions
        .iter()
        .find(|v| v.name == version)?
        .validation
        .as_ref()?;
    if !schema.has_defaults() || !schema.defaults_needed(stored) {
        return None;
    }
    let mut value = stored.clone();
    schema.apply_defaults(&mut value);
    Some(value)
}

/// [`read_defaults`] for the watch cache, which sees resources by id
/// (`group/plural`): a lookup that misses for resources whose schemas have
/// no defaults at all, so their objects cost nothing more.
pub fn read_defaulter(live: Arc<crate::apiextensions::live::LiveCatalog>) -> crate::watch::OnLoad {
    Arc::new(move |resource: &str, obj: &Value| {
        let catalog = live.get();
        let (group, plural) = resource.split_once('/')?;
        let rt = catalog
            .resources
            .iter()
            .find(|rt| rt.has_defaults && rt.group == group && rt.plural == plural)?;
        read_defaults(rt, obj)
    })
}

/// Renders an object in the version a client asked for. Conversion strategy
/// None changes only `apiVersion`; strategy Webhook asks the definition's
/// webhook. As kube's schema-coercing converter does, an object moved to a
/// version whose schema differs is then pruned by it.
pub async fn convert_json(
    rt: &ResourceType,
    json: &Bytes,
    value: &Value,
    api_version: &str,
) -> Result<Bytes, ApiError> {
    if value.get("apiVersion").and_then(Value::as_str) == Some(api_version) {
        return Ok(json.clone());
    }
    let v = convert_value(rt, value, api_version).await?;
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(ApiError::internal)
}

/// [`convert_json`] for a value.
pub async fn convert_value(
    rt: &ResourceType,
    value: &Value,
    api_version: &str,
) -> Result<Value, ApiError> {
    let mut out = convert_values(rt, &[value], api_version).await?;
    out.pop()
        .ok_or_else(|| ApiError::internal("conversion returned no object"))
}

/// [`convert_value`] for many objects (a list, a watch's events): those
/// the webhook converts go to it in batches, as kube converts a list whole.
pub async fn convert_values(
    rt: &ResourceType,
    values: &[&Value],
    api_version: &str,
) -> Result<Vec<Value>, ApiError> {
    let mut out = match &rt.conversion {
        Some(webhook) if values.iter().any(|v| version_of(v) != api_version) => webhook
            .convert_all(values, api_version)
            .await
            .map_err(ApiError::internal)?,
        _ => values
            .iter()
            .map(|v| rewrite_version(v, api_version))
            .collect(),
    };
    for (o, from) in out.iter_mut().zip(values) {
        if let Some(schema) = rt.pruning_between(version_of(from), api_version) {
            schema.prune(o);
        }
    }
    Ok(out)
}

/// [`convert_value`] when it needs no webhook (strategy None, or already in
/// `api_version`), from synchronous code; `None` when it does.
pub fn convert_local(rt: &ResourceType, value: &Value, api_version: &str) -> Option<Value> {
    if needs_webhook(rt, value, api_version) {
        return None;
    }
    let mut v = rewrite_version(value, api_version);
    if let Some(schema) = rt.pruning_between(version_of(value), api_version) {
        schema.prune(&mut v);
    }
    Some(v)
}

/// Whether moving `value` to `api_version` needs the definition's webhook.
pub fn needs_webhook(rt: &ResourceType, value: &Value, api_version: &str) -> bool {
    rt.conversion.is_some() && version_of(value) != api_version
}

fn version_of(value: &Value) -> &str {
    value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Conversion strategy None: only `apiVersion` changes.
fn rewrite_version(value: &Value, api_version: &str) -> Value {
    let mut v = value.clone();
    if version_of(&v) != api_version {
        if let Some(o) = v.as_object_mut() {
            o.insert("apiVersion".into(), Value::String(api_version.to_string()));
        }
    }
    v
}

/// Maps storage failures that are not the caller's fault.
pub(crate) fn storage_error(e: StorageError) -> ApiError {
    match e {
        // A replica that lost the lease wrote nothing, and a transaction
        // rolled back (verified) wrote nothing: the client may retry.
        StorageError::NotLeader(_) | StorageError::Aborted(_) => {
            ApiError::unavailable(e.to_string())
        }
        // Maybe written: kube's answer when etcd leaves a write's outcome
        // open (the request's deadline passes), never a 500 that reads as
        // "not written".
        StorageError::OutcomeUnknown(why) => {
            tracing::warn!(error = %why, "a write's outcome is unknown");
            crate::scope::deadline_exceeded()
        }
        e => ApiError::internal(e),
    }
}

/// Whether `api_version` is `group/version`.
fn is_group_version(api_version: &str, group: &str, version: &str) -> bool {
    api_version
        .strip_prefix(group)
        .and_then(|rest| rest.strip_prefix('/'))
        == Some(version)
}

#[cfg(test)]
mod group_version_tests {
    use super::is_group_version;

    #[test]
    fn an_api_version_matches_its_group_and_version_exactly() {
        assert!(is_group_version("example.com/v1", "example.com", "v1"));
        assert!(!is_group_version(
            "example.com/v1beta1",
            "example.com",
            "v1"
        ));
        assert!(!is_group_version("example.com/v", "example.com", "v1"));
        assert!(!is_group_version("example.comx/v1", "example.com", "v1"));
        assert!(!is_group_version("example.com", "example.com", "v1"));
        assert!(!is_group_version("v1", "example.com", "v1"));
    }
}
