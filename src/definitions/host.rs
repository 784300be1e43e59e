//! Definitions kept in the host: `apiextensions.kshard.dev/v1`
//! ShardResourceDefinitions, whose spec is a CustomResourceDefinitionSpec.
//! A plain CustomResourceDefinition applied to the host would make the
//! host's apiextensions-apiserver serve (and store) the group itself, in
//! competition with kshard's APIService; a kind of kshard's own carries the
//! same spec without that effect.
//!
//! Every replica follows them with a kube-rs reflector and serves what they
//! define (the live catalog loads them beside the definition files); the
//! leader keeps their status, and their cleanup finalizer: a deleted
//! definition's objects are deleted before the host object may go, as
//! apiextensions-apiserver does for a CRD.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::Value;
use tokio::sync::watch;

use crate::apiextensions::catalog::{check_definition, Catalog};
use crate::apiextensions::crd_resource as crds;
use crate::definitions::stored;
use crate::registry::Registry;

pub const GROUP: &str = "apiextensions.kshard.dev";
pub const VERSION: &str = "v1";
pub const KIND: &str = "ShardResourceDefinition";
pub const PLURAL: &str = "shardresourcedefinitions";
/// kshard's counterpart of kube's `customresourcecleanup.apiextensions.k8s.io`.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.kshard.dev";

/// The CustomResourceDefinition to install in the host.
pub const MANIFEST: &str = include_str!("../../crds/apiextensions/apiextensions.kshard.dev.yaml");

pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The catalog source name of a host definition.
pub fn source_of(name: &str) -> String {
    format!("{PLURAL}.{GROUP}/{name}")
}

/// The host's definitions as last listed (`None` until the first list),
/// and whether the live catalog has loaded them yet.
#[derive(Clone)]
pub struct HostDefinitions {
    api: kube::Api<DynamicObject>,
    objects: watch::Receiver<Option<Arc<Vec<Value>>>>,
    loaded: Arc<AtomicBool>,
}

impl HostDefinitions {
    /// Starts following the host's definitions (those matching `selector`,
    /// a label selector, when several shards share one host).
    pub fn spawn(
        client: kube::Client,
        selector: Option<&str>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let ar = api_resource();
        let api = kube::Api::<DynamicObject>::all_with(client, &ar);
        let (tx, objects) = watch::channel(None);
        let mut config = watcher::Config::default();
        if let Some(s) = selector.filter(|s| !s.is_empty()) {
            config = config.labels(s);
        }
        let task = tokio::spawn(follow(api.clone(), ar, config, tx));
        let me = Self {
            api,
            objects,
            loaded: Arc::new(AtomicBool::new(false)),
        };
        (me, task)
    }

    /// The definitions now, sorted by name; `None` before the first list.
    pub fn current(&self) -> Option<Arc<Vec<Value>>> {
        self.objects.borrow().clone()
    }

    /// Wakes when the definitions change.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Vec<Value>>>> {
        self.objects.clone()
    }

    /// Called once the live catalog serves the first list.
    pub fn mark_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    /// Whether the catalog serves the host's definitions (readiness, and
    /// the APIService sync, which must not remove a group not yet loaded).
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Keeps each definition's finalizer and status, and cleans up the
    /// objects of one being deleted. Leader only: followers' deletes would
    /// be refused, and two writers of one status would fight.
    pub async fn reconcile(
        &self,
        registry: &Registry,
        catalog: &Catalog,
        rejected: &HashMap<String, String>,
    ) {
        if registry.is_follower() {
            return;
        }
        let Some(defs) = self.current() else {
            return;
        };
        for def in defs.iter() {
            let name = crds::name_of(def).to_string();
            if let Err(e) = self.reconcile_one(registry, catalog, rejected, def).await {
                // A conflict is a newer version on its way through the watch.
                if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                    tracing::debug!(definition = %name, "host definition changed meanwhile; next pass");
                } else {
                    tracing::warn!(definition = %name, error = %e, "keeping a host definition");
                }
            }
        }
    }

    async fn reconcile_one(
        &self,
        registry: &Registry,
        catalog: &Catalog,
        rejected: &HashMap<String, String>,
        def: &Value,
    ) -> Result<(), kube::Error> {
        let name = crds::name_of(def).to_string();
        let pp = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        if crds::deleting(def) {
            if !has_finalizer(def) {
                return Ok(());
            }
            match stored::delete_objects(registry, catalog, &source_of(&name), def).await {
                Ok(true) => {
                    let mut v = def.clone();
                    if let Some(list) = v
                        .pointer_mut("/metadata/finalizers")
                        .and_then(Value::as_array_mut)
                    {
                        list.retain(|f| f != CLEANUP_FINALIZER);
                    }
                    self.api.replace(&name, &pp, &as_object(v)?).await?;
                    tracing::info!(definition = %name, "objects deleted; host definition released");
                }
                Ok(false) => {
                    let mut v = def.clone();
                    crds::set_deletion_in_progress(&mut v);
                    if v.get("status") != def.get("status") {
                        self.api.replace_status(&name, &pp, &as_object(v)?).await?;
                    }
                }
                Err(e) => {
                    tracing::warn!(definition = %name, error = %e, "deleting a definition's objects")
                }
            }
            return Ok(());
        }
        let mut current = def.clone();
        if !has_finalizer(def) {
            let mut v = def.clone();
            let meta = v
                .get_mut("metadata")
                .and_then(Value::as_object_mut)
                .ok_or_else(|| bad_object("no metadata"))?;
            let list = meta
                .entry("finalizers")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Some(list) = list.as_array_mut() {
                list.push(Value::String(CLEANUP_FINALIZER.into()));
            }
            let written = self.api.replace(&name, &pp, &as_object(v)?).await?;
            current = serde_json::to_value(&written).map_err(kube::Error::SerdeError)?;
        }
        let want = status_for(&current, rejected.get(&name).map(String::as_str));
        if current.get("status") != Some(&want) {
            current["status"] = want;
            self.api
                .replace_status(&name, &pp, &as_object(current)?)
                .await?;
        }
        Ok(())
    }
}

const MANAGER: &str = "kshard-apiextensions-controller";

fn has_finalizer(def: &Value) -> bool {
    def.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER))
}

fn bad_object(why: &str) -> kube::Error {
    kube::Error::SerdeError(serde::de::Error::custom(why))
}

fn as_object(v: Value) -> Result<DynamicObject, kube::Error> {
    serde_json::from_value(v).map_err(kube::Error::SerdeError)
}

/// The status apiextensions-apiserver would give the CRD this carries. A
/// definition the catalog refused says why: `NameConflict` when another
/// definition serves its names, `InvalidDefinition` when kshard cannot serve
/// its spec at all (the host checked only the outline of the spec).
pub fn status_for(def: &Value, rejected: Option<&str>) -> Value {
    let mut status = crds::desired_status(def, rejected);
    let Some(reason) = rejected else {
        return status;
    };
    let mut crd = def.clone();
    crd["apiVersion"] = Value::String(format!("{}/v1", crds::GROUP));
    crd["kind"] = Value::String("CustomResourceDefinition".into());
    if let Some(m) = crd.as_object_mut() {
        m.remove("status");
    }
    if check_definition(&crd).is_err() {
        if let Some(conds) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in conds.iter_mut() {
                c["reason"] = Value::String("InvalidDefinition".into());
                c["message"] = Value::String(reason.to_string());
            }
        }
    }
    status
}

/// Follows the host's definitions into `tx`: the whole set after every
/// change, once the first list is in. A host without the kind (its CRD not
/// installed) counts as having none, so kshard still gets ready; the watch
/// keeps retrying and picks the kind up once installed.
async fn follow(
    api: kube::Api<DynamicObject>,
    ar: ApiResource,
    config: watcher::Config,
    tx: watch::Sender<Option<Arc<Vec<Value>>>>,
) {
    let writer = reflector::store::Writer::new(ar);
    let store = writer.as_reader();
    let mut events =
        reflector::reflector(writer, watcher::watcher(api, config).default_backoff()).boxed();
    let mut listed = false;
    let mut said_missing = false;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 404 => {
                if !said_missing {
                    tracing::warn!(
                        "the host has no {PLURAL}.{GROUP} (install crds/apiextensions/); \
                         no definitions from the host until it does"
                    );
                    said_missing = true;
                }
                if tx.borrow().as_ref().is_none_or(|d| !d.is_empty()) {
                    tx.send_replace(Some(Arc::new(Vec::new())));
                }
                listed = false;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching the host's {PLURAL}");
                continue;
            }
        }
        if !listed {
            continue;
        }
        said_missing = false;
        let mut defs: Vec<Value> = store
            .state()
            .iter()
            .filter_map(|o| serde_json::to_value(&**o).ok())
            .collect();
        defs.sort_by(|a, b| crds::name_of(a).cmp(crds::name_of(b)));
        let changed = tx.borrow().as_deref() != Some(&defs);
        if changed {
            tx.send_replace(Some(Arc::new(defs)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_host_crd_is_a_definition_kshard_itself_can_serve() {
        let mut catalog = Catalog::default();
        catalog
            .add_manifests(std::path::Path::new("srd.yaml"), MANIFEST)
            .expect("the ShardResourceDefinition CRD loads");
        let rt = catalog
            .find(GROUP, VERSION, PLURAL)
            .expect("shardresourcedefinitions served");
        assert_eq!(rt.kind, KIND);
    }

    #[test]
    fn a_refused_definition_says_whether_it_conflicts_or_is_invalid() {
        let def = |storage2: bool| {
            json!({"metadata": {"name": "gadgets.things.dev"}, "spec": {
                "group": "things.dev", "scope": "Namespaced",
                "names": {"plural": "gadgets", "kind": "Gadget"},
                "versions": [
                    {"name": "v1", "served": true, "storage": true},
                    {"name": "v2", "served": true, "storage": storage2}]}})
        };
        let reason_of = |status: &Value, kind: &str| {
            status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
                .map(|c| c["reason"].clone())
        };
        let ok = status_for(&def(false), None);
        assert_eq!(
            reason_of(&ok, "Established"),
            Some(json!("InitialNamesAccepted"))
        );
        assert_eq!(ok["storedVersions"], json!(["v1"]));
        let conflict = status_for(&def(false), Some("already defined by widgets.yaml"));
        assert_eq!(
            reason_of(&conflict, "NamesAccepted"),
            Some(json!("NameConflict"))
        );
        let invalid = status_for(&def(true), Some("two storage versions"));
        assert_eq!(
            reason_of(&invalid, "Established"),
            Some(json!("InvalidDefinition"))
        );
    }
}
