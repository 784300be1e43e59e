//! The CustomResourceDefinition resource itself, as apiextensions-apiserver
//! defines it: its built-in definition (served standalone, so `kubectl apply
//! -f crd.yaml` works against kshard), its strategy (defaults, validation of
//! a definition being written, the cleanup finalizer and Terminating
//! condition on delete) and the status its controllers keep. Where the
//! definitions come from and how their status is reconciled is
//! `crate::definitions`.

use serde_json::{json, Value};

use super::catalog::{check_definition, ResourceType};
use crate::status::{FieldError, FieldErrorKind};

pub const GROUP: &str = "apiextensions.k8s.io";
pub const PLURAL: &str = "customresourcedefinitions";
/// kube's finalizer: a definition's objects are deleted before it is.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

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

/// Whether `rt` is the CustomResourceDefinition resource itself.
pub fn is_definition(rt: &ResourceType) -> bool {
    rt.group == GROUP && rt.plural == PLURAL
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
        Some(old) => super::validation::validate_update(obj, old),
        None => super::validation::validate_create(obj),
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
        _ => json!(crate::object::now_rfc3339()),
    };
    let cond = json!({"type": kind, "status": status, "lastTransitionTime": since,
                      "reason": reason, "message": message});
    match existing {
        Some(c) => *c = cond,
        None => list.push(cond),
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

/// The CustomResourceDefinition resource's strategy.
#[derive(Debug)]
pub struct DefinitionStrategy;

impl super::strategy::Strategy for DefinitionStrategy {
    fn prepare(&self, obj: &mut Value) {
        set_defaults(obj);
    }

    /// kube's status strategy for definitions checks the status alone, so a
    /// definition stored before a check existed still gets its status written.
    fn validate(&self, obj: &Value, old: Option<&Value>, status_only: bool) -> Vec<FieldError> {
        if status_only {
            return Vec::new();
        }
        check(obj, old)
    }

    /// A definition's objects go first: kube's CRD delete adds the cleanup
    /// finalizer and marks the definition Terminating.
    fn deletion_finalizer(&self) -> Option<&'static str> {
        Some(CLEANUP_FINALIZER)
    }

    fn mark_deleting(&self, obj: &mut Value) {
        mark_terminating(obj);
    }
}
