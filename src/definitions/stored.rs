//! Definitions stored as objects (the CustomResourceDefinition API that
//! standalone kshard serves itself, `apiextensions.k8s.io/v1`): they join the
//! catalog next to the definition files, and their status (names accepted,
//! established, terminating, stored versions) and cleanup are kept here, as
//! apiextensions-apiserver's naming, establishing and finalizer controllers
//! keep them.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::apiextensions::catalog::Catalog;
use crate::apiextensions::crd_resource::{
    deleting, desired_status, name_of, set_deletion_in_progress, CLEANUP_FINALIZER, GROUP, PLURAL,
};
use crate::registry::{
    DeleteOptions, Propagation, ReadAt, Registry, Selectors, Subresource, Target, WriteOptions,
};

const MANAGER: &str = "kshard-apiextensions-controller";

/// The stored definitions, from the watch cache.
pub async fn stored(registry: &Registry) -> Vec<Value> {
    let catalog = registry.catalog();
    let Some(rt) = catalog.find(GROUP, "v1", PLURAL).cloned() else {
        return Vec::new();
    };
    let t = Target {
        version: "v1".into(),
        namespace: String::new(),
        rt,
    };
    match registry
        .list(&t, &Selectors::default(), &ReadAt::Any, None)
        .await
    {
        Ok(l) => l.items.iter().map(|i| i.value().clone()).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "listing stored definitions failed");
            Vec::new()
        }
    }
}

/// The stored definitions, read from the store itself (at start, before
/// the watch cache loads the objects they define).
pub async fn stored_in(store: &crate::storage::Store) -> Vec<Value> {
    let all: crate::storage::ValueFilter = std::sync::Arc::new(|_| true);
    match store
        .list(
            &format!("{GROUP}/{PLURAL}/"),
            store.revision(),
            None,
            None,
            all,
        )
        .await
    {
        Ok(page) => page
            .items
            .iter()
            .filter_map(|(_, json)| serde_json::from_slice(json).ok())
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "reading stored definitions failed");
            Vec::new()
        }
    }
}

/// Keeps every stored definition's status, and deletes the objects of a
/// definition being deleted before letting it go. Leader only (followers'
/// writes would be refused).
pub async fn reconcile(registry: &Registry, catalog: &Catalog, rejected: &HashMap<String, String>) {
    if registry.is_follower() {
        return;
    }
    let Some(rt) = catalog.find(GROUP, "v1", PLURAL).cloned() else {
        return;
    };
    let t = Target {
        version: "v1".into(),
        namespace: String::new(),
        rt,
    };
    let opts = WriteOptions {
        manager: MANAGER.into(),
        ..Default::default()
    };
    for def in stored(registry).await {
        let name = name_of(&def).to_string();
        if deleting(&def) {
            cleanup(registry, catalog, &t, &def, &opts).await;
            continue;
        }
        let want = desired_status(&def, rejected.get(&name).map(String::as_str));
        if def.get("status") == Some(&want) {
            continue;
        }
        let result = registry
            .update_with(&t, &name, Subresource::Status, &opts, |cur| {
                let mut v = cur.clone();
                v["status"] = desired_status(cur, rejected.get(&name).map(String::as_str));
                Ok(v)
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(definition = %name, error = %e, "updating a definition's status failed");
        }
    }
}

/// Deletes the objects of a definition being deleted, then its finalizer.
async fn cleanup(
    registry: &Registry,
    catalog: &Catalog,
    t: &Target,
    def: &Value,
    opts: &WriteOptions,
) {
    let name = name_of(def).to_string();
    match delete_objects(registry, catalog, &source_of(&name), def).await {
        Ok(true) => {}
        Ok(false) => {
            let _ = registry
                .update_with(t, &name, Subresource::Status, opts, |cur| {
                    let mut v = cur.clone();
                    set_deletion_in_progress(&mut v);
                    Ok(v)
                })
                .await;
            return;
        }
        Err(e) => {
            tracing::warn!(definition = %name, error = %e, "listing a definition's objects failed");
            return;
        }
    }
    let result = registry
        .update_with(t, &name, Subresource::Main, opts, |cur| {
            let mut v = cur.clone();
            if let Some(list) = v
                .pointer_mut("/metadata/finalizers")
                .and_then(Value::as_array_mut)
            {
                list.retain(|f| f != CLEANUP_FINALIZER);
            }
            Ok(v)
        })
        .await;
    if let Err(e) = result {
        tracing::warn!(definition = %name, error = %e, "removing the cleanup finalizer failed");
    }
}

/// Deletes the objects of the resource that `def` (catalog source `source`)
/// defines, as kube's CRD finalizer does; `Ok(true)` once none are left (or
/// it was never served), `Ok(false)` while some remain (finalizers, failed
/// deletes).
pub(crate) async fn delete_objects(
    registry: &Registry,
    catalog: &Catalog,
    source: &str,
    def: &Value,
) -> Result<bool, crate::status::ApiError> {
    let group = def
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = def
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(rt) = catalog
        .resources
        .iter()
        .find(|r| r.group == group && r.plural == plural && r.source == source)
        .cloned()
    else {
        return Ok(true);
    };
    let objects = Target {
        version: rt.storage_version.clone(),
        namespace: String::new(),
        rt,
    };
    let list = registry
        .list(&objects, &Selectors::default(), &ReadAt::Consistent, None)
        .await?;
    let mut remaining = 0;
    for item in &list.items {
        let ns = item
            .value()
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let one = Target {
            namespace: ns.to_string(),
            ..objects.clone()
        };
        let del = DeleteOptions {
            propagation: Some(Propagation::Background),
            ..Default::default()
        };
        if registry
            .delete(&one, name_of(item.value()), &del)
            .await
            .is_err()
        {
            remaining += 1;
        }
    }
    remaining += list
        .items
        .iter()
        .filter(|i| {
            i.value()
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty())
        })
        .count();
    Ok(remaining == 0 && list_empty(registry, &objects).await)
}

async fn list_empty(registry: &Registry, t: &Target) -> bool {
    registry
        .list(t, &Selectors::default(), &ReadAt::Consistent, Some(1))
        .await
        .is_ok_and(|l| l.items.is_empty())
}

/// The catalog source name of a stored definition.
pub fn source_of(name: &str) -> String {
    format!("customresourcedefinitions/{name}")
}

/// Adds the stored definitions to a catalog; the ones it cannot take are
/// returned with the reason (their status says it).
pub fn add_stored(catalog: &mut Catalog, stored: &[Value]) -> HashMap<String, String> {
    add_definitions(catalog, stored, source_of, true)
}

/// Adds definition objects (CustomResourceDefinitions, or kinds with the same
/// spec) to a catalog, each under `source(name)`, terminating while deleted;
/// the ones it cannot take are returned by name with the reason. `stored`:
/// kshard checked them when they were written (its own CRD API), so the
/// static CEL cost limits are not rerun; the host's objects were written
/// without kshard's checks and get every one of them.
pub fn add_definitions(
    catalog: &mut Catalog,
    defs: &[Value],
    source: fn(&str) -> String,
    stored: bool,
) -> HashMap<String, String> {
    let mut rejected = HashMap::new();
    for def in defs {
        let name = name_of(def).to_string();
        let mut doc = def.clone();
        if let Some(m) = doc.as_object_mut() {
            m.remove("status");
            // Read as the CustomResourceDefinition it carries.
            m.insert("apiVersion".into(), json!(format!("{GROUP}/v1")));
            m.insert("kind".into(), json!("CustomResourceDefinition"));
        }
        let added = if stored {
            catalog.add_stored_definition(&source(&name), doc)
        } else {
            catalog.add_definition(&source(&name), doc)
        };
        match added {
            Ok(()) => {
                if deleting(def) {
                    catalog.mark_terminating(&source(&name));
                }
            }
            Err(e) => {
                rejected.insert(name, e.to_string());
            }
        }
    }
    rejected
}
