//! The CustomResourceDefinition API that standalone kshard serves itself
//! (`apiextensions.k8s.io/v1`): definitions stored as objects join the
//! catalog next to the definition files, and their status (names accepted,
//! established, terminating, stored versions) and cleanup are kept here, as
//! apiextensions-apiserver's naming, establishing and finalizer controllers
//! keep them.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::catalog::{check_definition, Catalog};
use super::resource_version::ReadAt;
use super::{
    now_rfc3339, DeleteOptions, Propagation, Registry, Selectors, Subresource, Target, WriteOptions,
};
use crate::status::{FieldError, FieldErrorKind};

pub const GROUP: &str = "apiextensions.k8s.io";
pub const PLURAL: &str = "customresourcedefinitions";
/// kube's finalizer: a definition's objects are deleted before it is.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";
const MANAGER: &str = "kshard-apiextensions-controller";

/// The definition of the definitions: served standalone so that `kubectl
/// apply -f crd.yaml` works against kshard. Its schema keeps spec and status
/// whole; [`check`] validates a definition the way the catalog reads it.
pub fn api_manifest() -> String {
    r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: customresourcedefinitions.apiextensions.k8s.io
  annotations: {api-approved.kubernetes.io: "https://github.com/kubernetes/kubernetes/pull/78458"}
spec:
  group: apiextensions.k8s.io
  scope: Cluster
  names:
    plural: customresourcedefinitions
    singular: customresourcedefinition
    kind: CustomResourceDefinition
    listKind: CustomResourceDefinitionList
    shortNames: [crd, crds]
    categories: [api-extensions]
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#
    .to_string()
}

/// kube's defaults for a CustomResourceDefinition, written into the stored
/// object as apiextensions' v1 defaulting writes them: `singular` is the
/// lower-cased kind, `listKind` the kind and `List`, conversion `None`, a
/// webhook service's port 443. They cannot be schema defaults (two are
/// computed from the kind).
pub fn set_defaults(def: &mut Value) {
    let Some(spec) = def.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
        let kind = names
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let unset = |names: &serde_json::Map<String, Value>, k: &str| {
            names
                .get(k)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        };
        if unset(names, "singular") {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if unset(names, "listKind") && !kind.is_empty() {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if spec.get("conversion").is_none_or(Value::is_null) {
        spec.insert("conversion".into(), json!({"strategy": "None"}));
    }
    if let Some(service) = spec
        .get_mut("conversion")
        .and_then(|c| c.pointer_mut("/webhook/clientConfig/service"))
        .and_then(Value::as_object_mut)
    {
        if service.get("port").is_none_or(Value::is_null) {
            service.insert("port".into(), json!(443));
        }
    }
}

pub fn is_definition(t: &Target) -> bool {
    t.rt.group == GROUP && t.rt.plural == PLURAL
}

/// kube's validation of a definition being written (`old`: the stored one,
/// on update), then the catalog's: what kube accepts but kshard cannot
/// serve (or whose CEL rules do not compile) is refused too.
pub fn check(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let errs = match old {
        // A spec left as stored was accepted when written (perhaps by an
        // older kshard that checked less): writes of metadata alone, such as
        // the cleanup finalizer's removal, must still go through.
        Some(old) if old.get("spec") == obj.get("spec") => Vec::new(),
        Some(old) => super::crd_validation::validate_update(obj, old),
        None => super::crd_validation::validate_create(obj),
    };
    if !errs.is_empty() {
        return errs;
    }
    match check_definition(obj) {
        Ok(()) => Vec::new(),
        Err(super::catalog::DefinitionError::Fields(errs)) => errs,
        Err(reason) => vec![FieldError::new(
            FieldErrorKind::Invalid,
            "spec",
            None,
            reason.to_string(),
        )],
    }
}

/// kube's CRD delete: Terminating until the definition's objects are gone.
pub fn mark_terminating(obj: &mut Value) {
    set_condition(
        obj,
        "Terminating",
        "True",
        "InstanceDeletionPending",
        "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
    );
}

fn set_condition(obj: &mut Value, kind: &str, status: &str, reason: &str, message: &str) {
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    let conditions = obj["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    let Some(list) = conditions.and_then(Value::as_array_mut) else {
        return;
    };
    let existing = list.iter_mut().find(|c| c["type"] == kind);
    let since = match &existing {
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    let cond = json!({"type": kind, "status": status, "lastTransitionTime": since,
                      "reason": reason, "message": message});
    match existing {
        Some(c) => *c = cond,
        None => list.push(cond),
    }
}

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

pub(crate) fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

pub(crate) fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// The status the controllers would write for `def`, given whether the
/// catalog took it (`rejected` holds the reason when not).
pub(crate) fn desired_status(def: &Value, rejected: Option<&str>) -> Value {
    let mut out = def.clone();
    match rejected {
        None => {
            set_condition(
                &mut out,
                "NamesAccepted",
                "True",
                "NoConflicts",
                "no conflicts found",
            );
            set_condition(
                &mut out,
                "Established",
                "True",
                "InitialNamesAccepted",
                "the initial names have been accepted",
            );
            let names = def.pointer("/spec/names").cloned().unwrap_or(json!({}));
            let kind = names["kind"].as_str().unwrap_or_default().to_string();
            let mut accepted = names.as_object().cloned().unwrap_or_default();
            accepted
                .entry("singular")
                .or_insert_with(|| json!(kind.to_lowercase()));
            accepted
                .entry("listKind")
                .or_insert_with(|| json!(format!("{kind}List")));
            out["status"]["acceptedNames"] = Value::Object(accepted);
            let storage = def
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .and_then(|vs| vs.iter().find(|v| v["storage"] == true))
                .and_then(|v| v["name"].as_str())
                .unwrap_or_default()
                .to_string();
            let mut stored: Vec<Value> = def
                .pointer("/status/storedVersions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if !storage.is_empty() && !stored.iter().any(|v| v == storage.as_str()) {
                stored.push(json!(storage));
            }
            out["status"]["storedVersions"] = Value::Array(stored);
        }
        Some(reason) => {
            set_condition(&mut out, "NamesAccepted", "False", "NameConflict", reason);
            set_condition(
                &mut out,
                "Established",
                "False",
                "NotAccepted",
                "not all names are accepted",
            );
            if out["status"].get("acceptedNames").is_none() {
                out["status"]["acceptedNames"] = json!({"plural": "", "kind": ""});
            }
        }
    }
    out.get("status").cloned().unwrap_or(json!({}))
}

/// Keeps every stored definition's status, and deletes the objects of a
/// definition being deleted before letting it go. Leader only (followers'
/// writes would be refused).
pub async fn reconcile(registry: &Registry, catalog: &Catalog, rejected: &HashMap<String, String>) {
    if registry.store.is_follower() {
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

/// The condition of a definition whose objects are being deleted.
pub(crate) fn set_deletion_in_progress(def: &mut Value) {
    set_condition(
        def,
        "Terminating",
        "True",
        "InstanceDeletionInProgress",
        "CustomResource deletion is in progress",
    );
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
