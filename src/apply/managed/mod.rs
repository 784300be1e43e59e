//! managedFields: the ownership bookkeeping kube layers around the merge
//! (apimachinery `managedfields/internal`), one concern per module as kube's
//! decorator managers are, applied here in kube's order:
//!
//! - `entries`: managedFields decoded and encoded, manager identifiers;
//! - version check (here): an apply's configuration is of the request's
//!   type and carries no managedFields;
//! - `last_applied`: kubectl's migration from client-side apply, and the
//!   last-applied annotation kept in step;
//! - `cap`: the oldest Update managers folded into "ancient-changes";
//! - skip non-applied (here): an existing object without managers is not
//!   tracked until it is applied to; before the first apply its fields go
//!   to "before-first-apply";
//! - build manager info (here): the writer's identifier;
//! - `updater`: a write's fields join its writer's entry, stamped with the time;
//! - `strip`: server-set metadata is owned by nobody;
//! - `versions`: objects converted to each manager's version;
//! - `structured`: the merge and ownership itself (structured-merge-diff).

mod cap;
mod entries;
mod last_applied;
mod strip;
mod structured;
mod updater;
pub(super) mod versions;

use serde_json::{Map, Value};

use super::fieldpath::Path;
use super::merge::{compare, describe, validate};
use super::{ApplyError, Conflict, FieldManager};
use cap::CAP_MANAGERS;
use entries::{decode, describe_manager, encode, manager_id, parse_id, with_api_version};
pub(super) use entries::{Managed, VersionedSet};
pub use last_applied::LAST_APPLIED_ANNOTATION;
use strip::STRIP_META;
use updater::{Stamp, CURRENT_OPERATION};
use versions::at_version;

const BEFORE_FIRST_APPLY: &str = "before-first-apply";

pub(super) fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn set_managed_fields(obj: &mut Value, encoded: Option<Value>) {
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    match encoded {
        Some(list) => {
            let meta = root
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if !meta.is_object() {
                *meta = Value::Object(Map::new());
            }
            if let Some(m) = meta.as_object_mut() {
                m.insert("managedFields".into(), list);
            }
        }
        None => {
            if let Some(m) = root.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
        }
    }
}

/// `[]` or `[{}]` from a client asks for managedFields to be reset.
fn is_reset_request(entries: Option<&Value>) -> bool {
    match entries {
        Some(Value::Array(items)) => match items.as_slice() {
            [] => true,
            [Value::Object(m)] => m.is_empty(),
            _ => false,
        },
        _ => false,
    }
}

fn has_uid(obj: &Value) -> bool {
    metadata(obj)
        .and_then(|m| m.get("uid"))
        .and_then(Value::as_str)
        .is_some_and(|u| !u.is_empty())
}

/// The object kube starts from when there is none (`New()` with the GVK set).
fn empty_object(like: &Value) -> Value {
    let mut m = Map::new();
    for k in ["apiVersion", "kind"] {
        if let Some(v) = like.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    Value::Object(m)
}

fn gvk_string(obj: &Value) -> String {
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    format!("{group}/{version}, Kind={kind}")
}

fn object_gvknn(obj: &Value) -> String {
    let get = |k: &str| {
        metadata(obj)
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    format!("{}/{}; {}", get("namespace"), get("name"), gvk_string(obj))
}

pub(super) type Conflicts = Vec<(String, Path)>;

/// Why ownership could not be settled.
#[derive(Debug)]
pub(super) enum Failure {
    /// Fields other managers own with other values (`merge.Conflicts`).
    Conflicts(Conflicts),
    /// Converting to a manager's version failed for another reason than a
    /// missing version (a failing webhook).
    Convert(String),
}

impl FieldManager<'_> {
    /// kube's build-manager-info: the identifier of the writer's Update entry.
    fn update_id(&self, manager: &str) -> String {
        let manager = if manager.is_empty() {
            "unknown"
        } else {
            manager
        };
        manager_id(
            manager,
            "Update",
            &self.api_version,
            self.subresource.as_deref().unwrap_or(""),
        )
    }

    /// Non-apply write through kube's layers: strip meta, merge the fields
    /// into the writer's entry with a fresh time, cap Update managers.
    fn layered_update(
        &self,
        live: &Value,
        new: &Value,
        managed: Managed,
        manager: &str,
        stamp: &Stamp,
    ) -> Result<Managed, Failure> {
        if managed.fields.is_empty() {
            return Ok(self.first_update(live, new, managed, manager, stamp));
        }
        self.layered_update_general(live, new, managed, manager, stamp)
    }

    /// [`Self::layered_update`] when no manager owns anything yet (every
    /// create): the writer owns what it added or changed. This is the set
    /// the general path reaches through update_owners, without its copies.
    fn first_update(
        &self,
        live: &Value,
        new: &Value,
        mut managed: Managed,
        manager: &str,
        stamp: &Stamp,
    ) -> Managed {
        let id = self.update_id(manager);
        let mut set = match super::merge::added_over(self.root(), live, new) {
            Some(added) => added,
            None => {
                let cmp = compare(self.root(), live, new);
                let mut set = cmp.added;
                set.union_with(cmp.modified);
                set
            }
        };
        set.subtract_recursive(&self.reset);
        STRIP_META.strip_set(&mut set);
        if !set.is_empty() {
            managed.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: self.api_version.clone(),
                    applied: false,
                },
            );
            stamp.record(&mut managed, id);
        }
        managed
    }

    /// [`Self::layered_update`] once managers exist: the structured merge
    /// settles ownership for the current operation, whose fields then join
    /// the writer's entry.
    fn layered_update_general(
        &self,
        live: &Value,
        new: &Value,
        mut managed: Managed,
        manager: &str,
        stamp: &Stamp,
    ) -> Result<Managed, Failure> {
        let id = self.update_id(manager);
        self.structured_update(live, new, &mut managed.fields, CURRENT_OPERATION)?;
        STRIP_META.strip(&mut managed.fields, CURRENT_OPERATION);
        stamp.record_current_operation(&mut managed, id);
        CAP_MANAGERS.cap(&mut managed);
        Ok(managed)
    }

    /// Apply through kube's layers. Objects that have fields but no managers
    /// first credit those fields to "before-first-apply" (kube's
    /// skip-non-applied manager).
    fn layered_apply(
        &self,
        live: &Value,
        config: &Value,
        mut managed: Managed,
        manager: &str,
        force: bool,
        stamp: &Stamp,
    ) -> Result<(Value, Managed), Failure> {
        if managed.fields.is_empty() {
            managed = self.layered_update(
                &self.empty_like(live),
                live,
                managed,
                BEFORE_FIRST_APPLY,
                stamp,
            )?;
        }
        let id = manager_id(
            manager,
            "Apply",
            "",
            self.subresource.as_deref().unwrap_or(""),
        );
        let new = self.structured_apply(live, config, &mut managed.fields, &id, force)?;
        STRIP_META.strip(&mut managed.fields, &id);
        let obj = match new {
            Some(obj) => {
                stamp.record(&mut managed, id);
                obj
            }
            None => live.clone(),
        };
        Ok((obj, managed))
    }

    /// The object a create starts from: the kind's type with nothing set,
    /// plus the fields its kind always carries (see `with_present_fields`).
    fn empty_like(&self, like: &Value) -> Value {
        let mut empty = empty_object(like);
        if let Some(o) = empty.as_object_mut() {
            for f in self.present {
                o.insert((*f).to_string(), Value::Object(Map::new()));
            }
        }
        empty
    }

    /// Records a non-apply write by `manager` (operation Update): sets
    /// `new.metadata.managedFields`. `old` is `None` on create. A request
    /// list of `[]` or `[{}]` resets tracking (the object then has none until
    /// applied to); an invalid request list is ignored in favour of the live
    /// one. `now` is RFC 3339.
    pub fn update(
        &self,
        old: Option<&Value>,
        new: &mut Value,
        manager: &str,
        now: &str,
    ) -> Result<(), ApplyError> {
        if !new.is_object() {
            return Err(ApplyError::BadRequest(
                "object must be a JSON object".into(),
            ));
        }
        let stamp = Stamp::new(now, self.subresource.as_deref())?;
        let live = match old {
            Some(o) => at_version(o, &self.api_version),
            None => self.empty_like(new),
        };
        let live_entries = metadata(&live).and_then(|m| m.get("managedFields"));
        let new_entries = metadata(new).and_then(|m| m.get("managedFields"));
        // Subresources never take managedFields from the request. A valid,
        // non-empty list from the request replaces the live one; anything
        // else falls back to the live list, and an undecodable live list to none.
        let managed = if self.subresource.is_some() {
            decode(live_entries).unwrap_or_default()
        } else if is_reset_request(new_entries) {
            Managed::default()
        } else {
            match decode(new_entries) {
                Ok(m) if !m.fields.is_empty() => m,
                _ => decode(live_entries).unwrap_or_default(),
            }
        };
        set_managed_fields(new, None);
        // An existing object without managers is not tracked until it is applied to.
        if managed.fields.is_empty() && has_uid(&live) {
            return Ok(());
        }
        match self.layered_update(&live, new, managed, manager, &stamp) {
            Ok(managed) => set_managed_fields(new, encode(&managed)),
            // As kube's UpdateNoErrors: a write is not failed for its
            // managedFields (a conversion webhook down); the live ones stay.
            Err(_) => set_managed_fields(new, live_entries.cloned()),
        }
        Ok(())
    }

    /// Applies `config` for `manager` onto `live` (`None` creates) and
    /// returns the merged object with its managedFields. Conflicts with other
    /// managers fail unless `force`, which takes the fields over.
    pub fn apply(
        &self,
        live: Option<&Value>,
        config: &Value,
        manager: &str,
        force: bool,
        now: &str,
    ) -> Result<Value, ApplyError> {
        if !config.is_object() {
            return Err(ApplyError::BadRequest(
                "apply configuration must be an object".into(),
            ));
        }
        let stamp = Stamp::new(now, self.subresource.as_deref())?;
        self.check_apply_config(live, config)?;
        let live = match live {
            Some(l) => at_version(l, &self.api_version),
            None => self.empty_like(config),
        };
        let managed = decode(metadata(&live).and_then(|m| m.get("managedFields")))
            .map_err(|e| ApplyError::Internal(format!("failed to decode managed fields: {e}")))?;
        let (mut obj, managed) = self
            .apply_with_last_applied(&live, config, managed, manager, force, &stamp)
            .map_err(|f| match f {
                Failure::Conflicts(c) => ApplyError::Conflicts(self.to_conflicts(c)),
                // kube answers the converter's error as is (500).
                Failure::Convert(m) => ApplyError::Internal(m),
            })?;
        last_applied::update_annotation(&mut obj, config, manager);
        set_managed_fields(&mut obj, encode(&managed));
        Ok(obj)
    }

    /// kube's version check, and what an apply's configuration must be: of
    /// the request's type, without managedFields, valid for the schema.
    fn check_apply_config(&self, live: Option<&Value>, config: &Value) -> Result<(), ApplyError> {
        let kind_matches = live.is_none_or(|l| l.get("kind") == config.get("kind"));
        if config.get("apiVersion").and_then(Value::as_str) != Some(self.api_version.as_str())
            || !kind_matches
        {
            return Err(ApplyError::BadRequest(format!(
                "invalid object type: {}",
                gvk_string(config)
            )));
        }
        if metadata(config).is_some_and(|m| m.contains_key("managedFields")) {
            return Err(ApplyError::BadRequest(
                "metadata.managedFields must be nil".into(),
            ));
        }
        if let Err(e) = validate(self.root(), config) {
            return Err(ApplyError::Internal(format!(
                "failed to create typed patch object ({}): {e}",
                object_gvknn(config)
            )));
        }
        Ok(())
    }

    /// Conflicts as kube names them.
    fn to_conflicts(&self, mut raw: Conflicts) -> Vec<Conflict> {
        // kube walks a Go map here (random order); sort by manager for stable output.
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        raw.into_iter()
            .map(|(id, path)| {
                let (manager, operation, api_version, subresource) = parse_id(&id);
                // Through /scale kube's field manager works on the Scale
                // object: every manager it names is at the Scale's version.
                let description = if self.subresource.as_deref() == Some("scale") {
                    describe_manager(&with_api_version(&id, SCALE_API_VERSION))
                } else {
                    describe_manager(&id)
                };
                Conflict {
                    manager,
                    operation,
                    api_version,
                    subresource,
                    field: describe(&path),
                    description,
                    id,
                }
            })
            .collect()
    }
}

const SCALE_API_VERSION: &str = "autoscaling/v1";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// Objects with maps, associative and set lists, atomic maps, free-form
    /// fields and status, with arbitrary values mixed in.
    fn widget_like() -> impl Strategy<Value = Value> {
        let name = prop::sample::select(vec!["a", "b", "c"]);
        let container = (name.clone(), prop::option::of("[a-z]{0,3}"))
            .prop_map(|(n, img)| json!({"name": n, "image": img}));
        (
            prop::collection::vec(container, 0..4),
            prop::collection::vec(name, 0..4),
            prop::option::of(crate::fuzz::json_value()),
            prop::option::of(crate::fuzz::json_value()),
            prop::option::of(0i64..3),
            any::<bool>(),
        )
            .prop_map(|(containers, tags, free, odd, ready, labels)| {
                let mut obj = json!({"apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
                    "metadata": {"name": "w", "namespace": "default", "generation": 1},
                    "spec": {"replicas": 1, "containers": containers, "tags": tags,
                             "selector": {"x": "y"}, "free": free, "odd": odd}});
                if let Some(r) = ready {
                    obj["status"] = json!({"ready": r});
                }
                if labels {
                    obj["metadata"]["labels"] = json!({"app": "w"});
                }
                obj
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        /// A first update (no managers yet, as on every create) records the
        /// same entry through its short path as through the general one.
        #[test]
        fn prop_first_update_matches_the_general_path(new in widget_like(), status in any::<bool>()) {
            let schema = crate::apply::MergeSchema::from_openapi(Some(&json!({
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "replicas": {"type": "integer"},
                    "containers": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": {"type": "string"}, "image": {"type": "string"}}}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                    "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}}
            })));
            let fm = FieldManager::new(&schema, "demo.kshard.dev/v1", None, status);
            let live = empty_object(&new);
            let short = fm.first_update(&live, &new, Managed::default(), "m", &Stamp::at(7));
            let general = fm
                .layered_update_general(&live, &new, Managed::default(), "m", &Stamp::at(7))
                .map_err(|_| TestCaseError::fail("general path failed"))?;
            prop_assert_eq!(&short.fields, &general.fields);
            prop_assert_eq!(&short.times, &general.times);
            prop_assert_eq!(encode(&short), encode(&general));
        }
    }
}
