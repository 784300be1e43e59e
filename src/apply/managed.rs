//! managedFields: decoding and encoding the entries, and the ownership
//! bookkeeping kube layers around the merge (apimachinery
//! `managedfields/internal`: structured merge, strip meta, managed fields
//! updater, build manager info, cap managers, skip non-applied, last-applied
//! manager and updater).
//!
//! Managers are keyed, as in kube, by an identifier that is the JSON of the
//! entry without fields and time (and without apiVersion for Apply), so two
//! Update entries of one manager at different versions or subresources stay
//! separate while Apply entries are one per manager and subresource.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::fieldpath::{go_json, go_json_string, go_quote, Path, PathElement, Set};
use super::merge::{
    compare, describe, ensure_named_fields_are_members, field_set, merge, remove_items, validate,
    Comparison,
};
use super::time::{format_time, parse_time};
use super::{ApplyError, Conflict, ConvertError, FieldManager};

/// kubectl's client-side apply annotation.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Update managers beyond this many are folded into "ancient-changes".
const MAX_UPDATE_MANAGERS: usize = 10;
/// Temporary name for the fields a non-apply write touches, before they are
/// merged into the writer's entry (kube's managedFieldsUpdater).
const CURRENT_OPERATION: &str = "current-operation";
const BEFORE_FIRST_APPLY: &str = "before-first-apply";
const ANCIENT_CHANGES: &str = "ancient-changes";

/// The fields one manager owns, at the version it wrote them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct VersionedSet {
    pub set: Set,
    pub api_version: String,
    pub applied: bool,
}

/// Decoded managedFields: sets and times (unix seconds) by manager identifier.
#[derive(Clone, Debug, Default)]
pub(crate) struct Managed {
    pub fields: BTreeMap<String, VersionedSet>,
    pub times: BTreeMap<String, i64>,
}

// ---------------------------------------------------------------- identifiers

/// The identifier kube derives from an entry (`BuildManagerIdentifier`).
pub(crate) fn manager_id(
    manager: &str,
    operation: &str,
    api_version: &str,
    subresource: &str,
) -> String {
    let mut s = String::from("{");
    let mut first = true;
    let mut field = |name: &str, value: &str, s: &mut String| {
        if value.is_empty() {
            return; // omitempty
        }
        if !first {
            s.push(',');
        }
        first = false;
        s.push('"');
        s.push_str(name);
        s.push_str("\":");
        go_json_string(value, s);
    };
    field("manager", manager, &mut s);
    field("operation", operation, &mut s);
    if operation != "Apply" {
        field("apiVersion", api_version, &mut s);
    }
    field("subresource", subresource, &mut s);
    s.push('}');
    s
}

/// The parts of an identifier: (manager, operation, apiVersion, subresource).
fn parse_id(id: &str) -> (String, String, String, String) {
    if let Some(parts) = parse_plain_id(id) {
        return parts;
    }
    let v: Value = serde_json::from_str(id).unwrap_or(Value::Null);
    let get = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    (
        get("manager"),
        get("operation"),
        get("apiVersion"),
        get("subresource"),
    )
}

/// [`parse_id`] without a JSON parser for an identifier with no escapes
/// (every one in practice): its strings then hold no `"`, so `","` and
/// `":"` occur only between fields. Encoding managedFields parses every
/// entry's identifier on every write.
fn parse_plain_id(id: &str) -> Option<(String, String, String, String)> {
    if id.contains('\\') {
        return None;
    }
    let inner = id.strip_prefix('{')?.strip_suffix('}')?;
    let mut parts: [String; 4] = Default::default();
    if !inner.is_empty() {
        let inner = inner.strip_prefix('"')?.strip_suffix('"')?;
        for field in inner.split("\",\"") {
            let (key, value) = field.split_once("\":\"")?;
            let slot = match key {
                "manager" => 0,
                "operation" => 1,
                "apiVersion" => 2,
                "subresource" => 3,
                _ => return None,
            };
            parts[slot] = value.to_string();
        }
    }
    let [manager, operation, api_version, subresource] = parts;
    Some((manager, operation, api_version, subresource))
}

/// kube's `printManager`: `"m"`, `"m" with subresource "status"`, and for
/// Update entries ` using <apiVersion>`.
pub(crate) fn describe_manager(id: &str) -> String {
    let v: Value = match serde_json::from_str(id) {
        Ok(v @ Value::Object(_)) => v,
        _ => return go_quote(id),
    };
    let get = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
    let mut s = go_quote(get("manager"));
    if !get("subresource").is_empty() {
        s.push_str(&format!(
            " with subresource {}",
            go_quote(get("subresource"))
        ));
    }
    if get("operation") == "Update" {
        s.push_str(&format!(" using {}", get("apiVersion")));
    }
    s
}

// ------------------------------------------------------------ encode / decode

/// Decodes `metadata.managedFields` (kube's `DecodeManagedFields`). Absent or
/// null is empty; anything malformed is an error.
pub(crate) fn decode(entries: Option<&Value>) -> Result<Managed, String> {
    let mut managed = Managed::default();
    let items = match entries {
        None | Some(Value::Null) => return Ok(managed),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("managedFields must be a list, got {other}")),
    };
    for (i, entry) in items.iter().enumerate() {
        let Value::Object(e) = entry else {
            return Err(format!("managed fields entry {i} is not an object"));
        };
        let text = |k: &str| -> Result<String, String> {
            match e.get(k) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(format!("{k} must be a string, got {other}")),
            }
        };
        let operation = text("operation")?;
        if operation != "Apply" && operation != "Update" {
            return Err("operation must be `Apply` or `Update`".into());
        }
        let api_version = text("apiVersion")?;
        if api_version.is_empty() {
            return Err("apiVersion must not be empty".into());
        }
        match text("fieldsType")?.as_str() {
            "FieldsV1" => {}
            "" => return Err(format!("missing fieldsType in managed fields entry {i}")),
            other => {
                return Err(format!(
                    "invalid fieldsType {} in managed fields entry {i}",
                    go_quote(other)
                ))
            }
        }
        let time = match e.get("time") {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(parse_time(t).ok_or_else(|| {
                format!("invalid time {} in managed fields entry {i}", go_quote(t))
            })?),
            Some(other) => return Err(format!("invalid time {other} in managed fields entry {i}")),
        };
        let set = match e.get("fieldsV1") {
            None | Some(Value::Null) => Set::new(),
            Some(v) => {
                Set::from_fields_v1(v).map_err(|err| format!("error decoding set: {err}"))?
            }
        };
        let manager = text("manager")?;
        let subresource = text("subresource")?;
        let id = manager_id(&manager, &operation, &api_version, &subresource);
        let applied = operation == "Apply";
        managed.fields.insert(
            id.clone(),
            VersionedSet {
                set,
                api_version,
                applied,
            },
        );
        match time {
            Some(t) => managed.times.insert(id, t),
            None => managed.times.remove(&id),
        };
    }
    Ok(managed)
}

/// Encodes entries sorted as kube sorts them (operation, time, manager,
/// apiVersion, subresource); `None` when nothing is managed.
pub(crate) fn encode(managed: &Managed) -> Option<Value> {
    if managed.fields.is_empty() {
        return None;
    }
    struct Entry {
        manager: String,
        operation: String,
        api_version: String,
        subresource: String,
        time: Option<i64>,
        fields: Value,
    }
    let mut entries: Vec<Entry> = managed
        .fields
        .iter()
        .map(|(id, vs)| {
            let (manager, operation, _, subresource) = parse_id(id);
            Entry {
                manager,
                operation: if vs.applied {
                    "Apply".into()
                } else {
                    operation
                },
                api_version: vs.api_version.clone(),
                subresource,
                time: managed.times.get(id).copied(),
                fields: vs.set.to_fields_v1(),
            }
        })
        .collect();
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then(p.time.unwrap_or(0).cmp(&q.time.unwrap_or(0)))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    let list = entries
        .into_iter()
        .map(|e| {
            // Key order follows metav1.ManagedFieldsEntry, with omitempty.
            let mut m = Map::new();
            if !e.manager.is_empty() {
                m.insert("manager".into(), Value::String(e.manager));
            }
            m.insert("operation".into(), Value::String(e.operation));
            m.insert("apiVersion".into(), Value::String(e.api_version));
            if let Some(t) = e.time {
                m.insert("time".into(), Value::String(format_time(t)));
            }
            m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
            m.insert("fieldsV1".into(), e.fields);
            if !e.subresource.is_empty() {
                m.insert("subresource".into(), Value::String(e.subresource));
            }
            Value::Object(m)
        })
        .collect();
    Some(Value::Array(list))
}

fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
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

/// Fields kube never tracks (`stripmeta`).
static STRIP_SET: std::sync::LazyLock<Set> = std::sync::LazyLock::new(strip_set);

fn strip_set() -> Set {
    let f = |s: &str| PathElement::Field(s.into());
    let mut s = Set::new();
    s.insert(&[f("apiVersion")]);
    s.insert(&[f("kind")]);
    s.insert(&[f("metadata")]);
    for name in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        s.insert(&[f("metadata"), f(name)]);
    }
    s
}

fn strip(fields: &mut BTreeMap<String, VersionedSet>, id: &str) {
    if let Some(vs) = fields.get_mut(id) {
        vs.set.subtract(&STRIP_SET);
        if vs.set.is_empty() {
            fields.remove(id);
        }
    }
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

/// `obj` with its apiVersion set to `api_version` (the whole of a strategy
/// None conversion).
fn at_version(obj: &Value, api_version: &str) -> Value {
    let mut out = obj.clone();
    if let Some(m) = out.as_object_mut() {
        if m.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
            m.insert("apiVersion".into(), Value::String(api_version.into()));
        }
    }
    out
}

fn api_version_of(obj: &Value) -> &str {
    obj.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

type Conflicts = Vec<(String, Path)>;

/// Why ownership could not be settled.
#[derive(Debug)]
enum Failure {
    /// Fields other managers own with other values (`merge.Conflicts`).
    Conflicts(Conflicts),
    /// Converting to a manager's version failed for another reason than a
    /// missing version (a failing webhook).
    Convert(String),
}

impl FieldManager<'_> {
    fn root(&self) -> &super::schema::TypeRef {
        &self.schema.root
    }

    // ------------------------------------------------------------- versions

    /// Conversion only rewrites apiVersion: objects are compared as they
    /// are (apiVersion is equal on both sides, and field sets ignore values).
    fn rewrites(&self) -> bool {
        self.versions.as_deref().is_none_or(|v| v.rewrites_only())
    }

    /// The merge schema of a manager's version; `None` when the resource has
    /// no such version.
    fn schema_at(&self, api_version: &str) -> Option<&super::MergeSchema> {
        if api_version == self.api_version {
            return Some(self.schema);
        }
        match &self.versions {
            Some(v) => v.schema(api_version),
            None => Some(self.schema),
        }
    }

    /// Drops managers recorded at versions the resource no longer has, as
    /// `Updater.reconcileManagedFieldsWithSchemaChanges` skips them on a
    /// missing-version error before every Update and Apply.
    fn drop_missing_versions(&self, fields: &mut BTreeMap<String, VersionedSet>) {
        if self.versions.is_some() {
            fields.retain(|_, vs| self.schema_at(&vs.api_version).is_some());
        }
    }

    /// Converts `objs` to `api_version` (kube's versionConverter: for a
    /// custom resource, straight from the request's version). Objects
    /// already there are kept; a rewrite-only resource keeps them all; the
    /// rest go to the webhook in one review, each object once per request.
    /// `Ok(None)`: the resource has no such version.
    fn convert(&self, objs: Vec<Value>, api_version: &str) -> Result<Option<Vec<Value>>, Failure> {
        let versions = match self.versions.as_deref() {
            Some(v) if !v.rewrites_only() => v,
            _ => return Ok(Some(objs)),
        };
        let mut out: Vec<Option<Value>> = Vec::with_capacity(objs.len());
        {
            let done = self.converted.lock().unwrap_or_else(|p| p.into_inner());
            for o in &objs {
                if api_version_of(o) == api_version {
                    out.push(Some(o.clone()));
                    continue;
                }
                let hit = done
                    .iter()
                    .find(|(v, src, _)| v == api_version && super::fieldpath::values_equal(src, o));
                out.push(hit.map(|(_, _, r)| r.clone()));
            }
        }
        // Each distinct object still to convert, once (old and new are often equal).
        let mut todo: Vec<&Value> = Vec::new();
        for (o, got) in objs.iter().zip(&out) {
            if got.is_none() && !todo.iter().any(|t| super::fieldpath::values_equal(t, o)) {
                todo.push(o);
            }
        }
        if !todo.is_empty() {
            let results = match versions.convert(&todo, api_version) {
                Ok(r) => r,
                Err(ConvertError::MissingVersion(_)) => return Ok(None),
                Err(ConvertError::Failed(m)) => return Err(Failure::Convert(m)),
            };
            if results.len() != todo.len() {
                return Err(Failure::Convert(format!(
                    "converting {} objects to {api_version} returned {}",
                    todo.len(),
                    results.len()
                )));
            }
            let mut done = self.converted.lock().unwrap_or_else(|p| p.into_inner());
            for (src, res) in todo.iter().zip(results) {
                for (o, got) in objs.iter().zip(out.iter_mut()) {
                    if got.is_none() && super::fieldpath::values_equal(src, o) {
                        *got = Some(res.clone());
                    }
                }
                done.push((api_version.to_string(), (*src).clone(), res));
            }
        }
        Ok(Some(out.into_iter().flatten().collect()))
    }

    /// The comparison of `old` and `new` at another manager's version, with
    /// that version's schema (`Updater.update`); `None` for a missing version.
    fn compare_at(
        &self,
        old: &Value,
        new: &Value,
        api_version: &str,
        here: &Comparison,
    ) -> Result<Option<Comparison>, Failure> {
        let Some(schema) = self.schema_at(api_version) else {
            return Ok(None);
        };
        if self.rewrites() {
            if std::ptr::eq(schema, self.schema) {
                return Ok(Some(here.clone()));
            }
            return Ok(Some(compare(&schema.root, old, new).filter(&self.reset)));
        }
        let Some(objs) = self.convert(vec![old.clone(), new.clone()], api_version)? else {
            return Ok(None);
        };
        let [old_v, new_v] = objs.as_slice() else {
            return Err(Failure::Convert(format!(
                "converting to {api_version} lost objects"
            )));
        };
        // kube keys reset fields by the request's version only; here they are
        // filtered at every version (the same top-level spec/status), so a
        // status write through one version cannot take spec from another's managers.
        Ok(Some(
            compare(&schema.root, old_v, new_v).filter(&self.reset),
        ))
    }

    // ------------------------------------------------ structured-merge-diff

    /// Shared core of Update and Apply (`Updater.update`): fields whose value
    /// changed are taken from every other manager (or reported as conflicts
    /// when not forced), removed fields are dropped from everyone. Each
    /// manager is judged at its own version: old and new are converted there
    /// once per version, and conflicts name fields as that manager owns them.
    fn update_owners(
        &self,
        old: &Value,
        new: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        workflow: &str,
        force: bool,
    ) -> Result<Comparison, Failure> {
        let cmp = compare(self.root(), old, new).filter(&self.reset);
        let mut others: Vec<&str> = fields
            .iter()
            .filter(|(id, vs)| *id != workflow && vs.api_version != self.api_version)
            .map(|(_, vs)| vs.api_version.as_str())
            .collect();
        others.sort_unstable();
        others.dedup();
        let mut at: BTreeMap<String, Comparison> = BTreeMap::new();
        let mut missing: Vec<String> = Vec::new();
        for v in others {
            match self.compare_at(old, new, v, &cmp)? {
                Some(c) => at.insert(v.to_string(), c),
                None => {
                    missing.push(v.to_string());
                    None
                }
            };
        }
        // Managers at a missing version are dropped (`IsMissingVersionError`).
        fields.retain(|id, vs| id == workflow || !missing.contains(&vs.api_version));
        let changed_here = cmp.modified.union(&cmp.added);
        let changed_at: BTreeMap<&str, Set> = at
            .iter()
            .map(|(v, c)| (v.as_str(), c.modified.union(&c.added)))
            .collect();
        let mut conflicts: Vec<(String, Set)> = Vec::new();
        let mut removed: Vec<(String, &Set)> = Vec::new();
        for (id, vs) in fields.iter() {
            if id == workflow {
                continue;
            }
            let (changed, c) = match at.get(&vs.api_version) {
                Some(c) => (
                    changed_at
                        .get(vs.api_version.as_str())
                        .unwrap_or(&changed_here),
                    c,
                ),
                None => (&changed_here, &cmp),
            };
            let conflict = vs.set.intersection(changed);
            if !conflict.is_empty() {
                conflicts.push((id.clone(), conflict));
            }
            if !c.removed.is_empty() {
                removed.push((id.clone(), &c.removed));
            }
        }
        if !force && !conflicts.is_empty() {
            let mut out = Vec::new();
            for (id, set) in conflicts {
                for p in set.paths() {
                    out.push((id.clone(), p));
                }
            }
            return Err(Failure::Conflicts(out));
        }
        for (id, c) in &conflicts {
            if let Some(vs) = fields.get_mut(id) {
                vs.set = vs.set.difference(c);
            }
        }
        for (id, r) in removed {
            if let Some(vs) = fields.get_mut(&id) {
                vs.set = vs.set.difference(r);
            }
        }
        fields.retain(|_, vs| !vs.set.is_empty());
        Ok(cmp)
    }

    /// `Updater.Update`: the writer owns what it added or changed.
    fn structured_update(
        &self,
        live: &Value,
        new: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        id: &str,
    ) -> Result<(), Failure> {
        self.drop_missing_versions(fields);
        let cmp = self.update_owners(live, new, fields, id, true)?;
        let mut set = fields.remove(id).map(|vs| vs.set).unwrap_or_default();
        set.subtract(&cmp.removed);
        set.union_with(cmp.modified);
        set.union_with(cmp.added);
        set.subtract_recursive(&self.reset);
        if !set.is_empty() {
            fields.insert(
                id.into(),
                VersionedSet {
                    set,
                    api_version: self.api_version.clone(),
                    applied: false,
                },
            );
        }
        Ok(())
    }

    /// `Updater.Apply`: merge, take ownership of the configuration's fields,
    /// prune what this manager stopped applying, then settle ownership.
    /// Returns `None` for the object when nothing changed.
    fn structured_apply(
        &self,
        live: &Value,
        config: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        id: &str,
        force: bool,
    ) -> Result<Option<Value>, Failure> {
        self.drop_missing_versions(fields);
        let merged = merge(self.root(), Some(live), Some(config)).unwrap_or(Value::Null);
        let last = fields.get(id).cloned();
        let set = field_set(self.root(), config).recursive_difference(&self.reset);
        fields.insert(
            id.into(),
            VersionedSet {
                set,
                api_version: self.api_version.clone(),
                applied: true,
            },
        );
        let merged = self.prune(merged, fields, last.as_ref())?;
        self.update_owners(live, &merged, fields, id, force)?;
        Ok((!super::fieldpath::values_equal(live, &merged)).then_some(merged))
    }

    /// Removes fields the applier owned last time and no longer applies,
    /// unless another manager (or the new configuration) still owns them
    /// (`Updater.prune`). It works at the version of the last applied set:
    /// the merged object is converted there, owned items are added back at
    /// each owner's version (the last applied version first), and the result
    /// is converted back to the request's version.
    fn prune(
        &self,
        merged: Value,
        fields: &BTreeMap<String, VersionedSet>,
        last: Option<&VersionedSet>,
    ) -> Result<Value, Failure> {
        let Some(last) = last.filter(|l| !l.set.is_empty()) else {
            return Ok(merged);
        };
        let lv = last.api_version.as_str();
        let Some(last_schema) = self.schema_at(lv) else {
            return Ok(merged);
        };
        let merged_l = match self.convert(vec![merged], lv)? {
            Some(mut v) if v.len() == 1 => v.remove(0),
            _ => return Err(Failure::Convert(format!("no version {lv}"))),
        };
        let lroot = &last_schema.root;
        let ensure_l = |s: &Set| ensure_named_fields_are_members(lroot, s);
        let mut pruned = remove_items(lroot, &merged_l, &ensure_l(&last.set));
        // Add back what anybody owns, each version's owners at that version.
        let mut owned: BTreeMap<&str, Set> = BTreeMap::new();
        for vs in fields.values() {
            let acc = owned.entry(vs.api_version.as_str()).or_default();
            *acc = acc.union(&vs.set);
        }
        let mut order: Vec<&str> = owned.keys().copied().filter(|v| *v != lv).collect();
        if owned.contains_key(lv) {
            order.insert(0, lv);
        }
        // The merged object at the version `pruned` is at (`None`: merged_l).
        let mut moved: Option<Value> = None;
        let mut at = lv.to_string();
        for v in order {
            let Some(schema) = self.schema_at(v) else {
                continue;
            };
            if v != at && !self.rewrites() {
                let m = moved.take().unwrap_or_else(|| merged_l.clone());
                match self.convert(vec![m, pruned.clone()], v)? {
                    Some(objs) if objs.len() == 2 => {
                        let mut it = objs.into_iter();
                        moved = it.next();
                        pruned = it.next().unwrap_or_default();
                        at = v.to_string();
                    }
                    // A missing version adds nothing back.
                    _ => continue,
                }
            }
            let m = moved.as_ref().unwrap_or(&merged_l);
            let root = &schema.root;
            let ensure = |s: &Set| ensure_named_fields_are_members(root, s);
            let keep = ensure(&field_set(root, &pruned)).union(&ensure(&owned[v]));
            pruned = remove_items(root, m, &ensure(&field_set(root, m)).difference(&keep));
        }
        // Only drop what the applier itself had owned; parents emptied as a
        // side effect come back.
        let pruned_l = if at == lv {
            pruned
        } else {
            match self.convert(vec![pruned], lv)? {
                Some(mut v) if v.len() == 1 => v.remove(0),
                _ => return self.back_to_request_version(merged_l),
            }
        };
        let merged_set = ensure_l(&field_set(lroot, &merged_l));
        let pruned_set = ensure_l(&field_set(lroot, &pruned_l));
        let dangling = merged_set
            .difference(&pruned_set)
            .intersection(&ensure_l(&last.set));
        self.back_to_request_version(remove_items(lroot, &merged_l, &dangling))
    }

    fn back_to_request_version(&self, obj: Value) -> Result<Value, Failure> {
        let v = self.api_version.clone();
        match self.convert(vec![obj], &v)? {
            Some(mut objs) if objs.len() == 1 => Ok(objs.remove(0)),
            _ => Err(Failure::Convert(format!("no version {v}"))),
        }
    }

    // ------------------------------------------------------ manager layers

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
        now: i64,
    ) -> Result<Managed, Failure> {
        if managed.fields.is_empty() {
            return Ok(self.first_update(live, new, managed, manager, now));
        }
        self.layered_update_general(live, new, managed, manager, now)
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
        now: i64,
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
        set.subtract(&STRIP_SET);
        if !set.is_empty() {
            managed.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: self.api_version.clone(),
                    applied: false,
                },
            );
            self.stamp(&mut managed, id, now);
        }
        managed
    }

    fn layered_update_general(
        &self,
        live: &Value,
        new: &Value,
        mut managed: Managed,
        manager: &str,
        now: i64,
    ) -> Result<Managed, Failure> {
        let id = self.update_id(manager);
        self.structured_update(live, new, &mut managed.fields, CURRENT_OPERATION)?;
        strip(&mut managed.fields, CURRENT_OPERATION);
        if let Some(vs) = managed.fields.remove(CURRENT_OPERATION) {
            let mut set = vs.set;
            if let Some(prev) = managed.fields.remove(&id) {
                set.union_with(prev.set);
            }
            managed.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: vs.api_version,
                    applied: vs.applied,
                },
            );
            self.stamp(&mut managed, id, now);
        }
        cap_update_managers(&mut managed);
        Ok(managed)
    }

    /// Apply through kube's layers. Objects that have fields but no managers
    /// first credit those fields to "before-first-apply".
    fn layered_apply(
        &self,
        live: &Value,
        config: &Value,
        mut managed: Managed,
        manager: &str,
        force: bool,
        now: i64,
    ) -> Result<(Value, Managed), Failure> {
        if managed.fields.is_empty() {
            managed = self.layered_update(
                &self.empty_like(live),
                live,
                managed,
                BEFORE_FIRST_APPLY,
                now,
            )?;
        }
        let id = manager_id(
            manager,
            "Apply",
            "",
            self.subresource.as_deref().unwrap_or(""),
        );
        let new = self.structured_apply(live, config, &mut managed.fields, &id, force)?;
        strip(&mut managed.fields, &id);
        let obj = match new {
            Some(obj) => {
                self.stamp(&mut managed, id, now);
                obj
            }
            None => live.clone(),
        };
        Ok((obj, managed))
    }

    /// kubectl's migration from client-side apply: when "kubectl" applies and
    /// conflicts only on fields whose live value still equals the
    /// last-applied annotation, the apply is forced.
    fn apply_with_last_applied(
        &self,
        live: &Value,
        config: &Value,
        managed: Managed,
        manager: &str,
        force: bool,
        now: i64,
    ) -> Result<(Value, Managed), Failure> {
        let conflicts = match self.layered_apply(live, config, managed.clone(), manager, force, now)
        {
            Err(Failure::Conflicts(c)) if manager == "kubectl" => c,
            other => return other,
        };
        let Some(allowed) = self.allowed_from_last_applied(live) else {
            return Err(Failure::Conflicts(conflicts));
        };
        let remaining: Conflicts = conflicts
            .iter()
            .filter(|(_, p)| !allowed.has(p))
            .cloned()
            .collect();
        if !remaining.is_empty() {
            return Err(Failure::Conflicts(remaining));
        }
        self.layered_apply(live, config, managed, manager, true, now)
    }

    /// Fields of the last-applied annotation whose live value is unchanged.
    fn allowed_from_last_applied(&self, live: &Value) -> Option<Set> {
        let text = metadata(live)?
            .get("annotations")?
            .get(LAST_APPLIED_ANNOTATION)?
            .as_str()?;
        if text.is_empty() {
            return None;
        }
        let last: Value = serde_json::from_str(text).ok()?;
        if last.get("apiVersion").and_then(Value::as_str) != Some(self.api_version.as_str()) {
            return None;
        }
        validate(self.root(), &last).ok()?;
        let cmp = compare(self.root(), &last, live);
        Some(
            field_set(self.root(), &last)
                .difference(&cmp.modified)
                .difference(&cmp.added)
                .difference(&cmp.removed),
        )
    }

    // ---------------------------------------------------------- entry points

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

    pub(super) fn do_update(
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
        let now =
            parse_time(now).ok_or_else(|| ApplyError::Internal(format!("invalid time {now:?}")))?;
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
        match self.layered_update(&live, new, managed, manager, now) {
            Ok(managed) => set_managed_fields(new, encode(&managed)),
            // As kube's UpdateNoErrors: a write is not failed for its
            // managedFields (a conversion webhook down); the live ones stay.
            Err(_) => set_managed_fields(new, live_entries.cloned()),
        }
        Ok(())
    }

    pub(super) fn do_apply(
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
        let now =
            parse_time(now).ok_or_else(|| ApplyError::Internal(format!("invalid time {now:?}")))?;
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
        let live = match live {
            Some(l) => at_version(l, &self.api_version),
            None => self.empty_like(config),
        };
        let managed = decode(metadata(&live).and_then(|m| m.get("managedFields")))
            .map_err(|e| ApplyError::Internal(format!("failed to decode managed fields: {e}")))?;
        let (mut obj, managed) = self
            .apply_with_last_applied(&live, config, managed, manager, force, now)
            .map_err(|f| match f {
                Failure::Conflicts(c) => ApplyError::Conflicts(self.to_conflicts(c)),
                // kube answers the converter's error as is (500).
                Failure::Convert(m) => ApplyError::Internal(m),
            })?;
        if manager == "kubectl" && has_last_applied(&obj) {
            set_last_applied(&mut obj, build_last_applied(config));
        }
        set_managed_fields(&mut obj, encode(&managed));
        Ok(obj)
    }
}

impl FieldManager<'_> {
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

    /// Records when `id` last wrote. Through /scale kube rebuilds the
    /// writer's entry from the Scale object's, which carries no time.
    fn stamp(&self, managed: &mut Managed, id: String, now: i64) {
        if self.subresource.as_deref() == Some("scale") {
            managed.times.remove(&id);
        } else {
            managed.times.insert(id, now);
        }
    }
}

const SCALE_API_VERSION: &str = "autoscaling/v1";

/// A manager identifier with another apiVersion (identifiers are JSON).
fn with_api_version(id: &str, api_version: &str) -> String {
    match serde_json::from_str::<Value>(id) {
        Ok(Value::Object(mut o)) if o.contains_key("apiVersion") => {
            o.insert("apiVersion".into(), Value::String(api_version.into()));
            Value::Object(o).to_string()
        }
        _ => id.to_string(),
    }
}

fn has_last_applied(obj: &Value) -> bool {
    metadata(obj)
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(LAST_APPLIED_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
}

/// The applied configuration as kube stores it in the annotation: Go JSON
/// (sorted keys, HTML-escaped) plus newline, without the annotation itself.
fn build_last_applied(config: &Value) -> String {
    let mut c = config.clone();
    if let Some(a) = c
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
    let mut out = String::new();
    go_json(&c, &mut out);
    out.push('\n');
    out
}

fn set_last_applied(obj: &mut Value, text: String) {
    if let Some(a) = obj
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.insert(LAST_APPLIED_ANNOTATION.into(), Value::String(text));
    }
}

/// Folds the oldest Update managers into one "ancient-changes" entry per
/// version once there are more than ten (kube's capManagers).
fn cap_update_managers(managed: &mut Managed) {
    let mut updaters: Vec<String> = managed
        .fields
        .iter()
        .filter(|(_, vs)| !vs.applied)
        .map(|(id, _)| id.clone())
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    let time = |id: &String| managed.times.get(id).copied().unwrap_or(0);
    updaters.sort_by(|a, b| time(a).cmp(&time(b)).then_with(|| a.cmp(b)));
    let mut first_by_version: BTreeMap<String, String> = BTreeMap::new();
    let mut length = updaters.len();
    for id in updaters {
        if length <= MAX_UPDATE_MANAGERS {
            break;
        }
        let Some(vs) = managed.fields.get(&id).cloned() else {
            continue;
        };
        let t = managed.times.get(&id).copied();
        let bucket = manager_id(ANCIENT_CHANGES, "Update", &vs.api_version, "");
        match first_by_version.get(&vs.api_version) {
            Some(first) => {
                if !managed.fields.contains_key(&bucket) {
                    if let Some(s) = managed.fields.remove(first) {
                        managed.fields.insert(bucket.clone(), s);
                    }
                }
                let prev = managed
                    .fields
                    .get(&bucket)
                    .map(|b| b.set.clone())
                    .unwrap_or_default();
                let merged = VersionedSet {
                    set: vs.set.union(&prev),
                    api_version: vs.api_version,
                    applied: vs.applied,
                };
                managed.fields.insert(bucket.clone(), merged);
                managed.fields.remove(&id);
                length -= 1;
                match t {
                    Some(t) => managed.times.insert(bucket, t),
                    None => managed.times.remove(&bucket),
                };
            }
            None => {
                first_by_version.insert(vs.api_version, id);
            }
        }
    }
}

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
            let short = fm.first_update(&live, &new, Managed::default(), "m", 7);
            let general = fm
                .layered_update_general(&live, &new, Managed::default(), "m", 7)
                .map_err(|_| TestCaseError::fail("general path failed"))?;
            prop_assert_eq!(&short.fields, &general.fields);
            prop_assert_eq!(&short.times, &general.times);
            prop_assert_eq!(encode(&short), encode(&general));
        }
    }

    proptest! {
        /// Identifiers read back to their parts, escaped or not.
        #[test]
        fn prop_identifiers_read_back(
            manager in "[a-z<>&\"\\\\ ,:{}é]{0,12}",
            apply in any::<bool>(),
            api_version in "[a-z./0-9]{1,12}",
            subresource in prop::sample::select(vec!["", "status", "scale"]),
        ) {
            let operation = if apply { "Apply" } else { "Update" };
            let id = manager_id(&manager, operation, &api_version, subresource);
            let (m, o, v, s) = parse_id(&id);
            prop_assert_eq!(m, manager);
            prop_assert_eq!(o, operation);
            prop_assert_eq!(v, if apply { String::new() } else { api_version });
            prop_assert_eq!(s, subresource);
        }
    }

    #[test]
    fn identifiers_and_descriptions() {
        let id = manager_id("kubectl", "Update", "demo.kshard.dev/v1", "");
        assert_eq!(
            id,
            r#"{"manager":"kubectl","operation":"Update","apiVersion":"demo.kshard.dev/v1"}"#
        );
        assert_eq!(
            describe_manager(&id),
            r#""kubectl" using demo.kshard.dev/v1"#
        );
        let id = manager_id("m", "Apply", "v1", "status");
        assert_eq!(
            id,
            r#"{"manager":"m","operation":"Apply","subresource":"status"}"#
        );
        assert_eq!(describe_manager(&id), r#""m" with subresource "status""#);
    }

    #[test]
    fn decode_rejects_bad_entries_and_encode_sorts() {
        assert!(decode(Some(
            &json!([{"operation": "Patch", "apiVersion": "v1", "fieldsType": "FieldsV1"}])
        ))
        .is_err());
        assert!(decode(Some(
            &json!([{"operation": "Update", "fieldsType": "FieldsV1"}])
        ))
        .is_err());
        assert!(decode(Some(&json!([{"operation": "Update", "apiVersion": "v1"}]))).is_err());
        assert!(decode(Some(
            &json!([{"operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV2"}])
        ))
        .is_err());
        let entries = json!([
            {"manager": "b", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:02Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:b": {}}}},
            {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:02Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:a": {}}}},
            {"manager": "z", "operation": "Apply", "apiVersion": "v1", "time": "2024-01-01T00:00:09+00:00",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:z": {}}}}
        ]);
        let m = decode(Some(&entries)).expect("decode");
        let out = encode(&m).expect("encode");
        let names: Vec<&str> = out
            .as_array()
            .expect("list")
            .iter()
            .map(|e| e["manager"].as_str().expect("m"))
            .collect();
        assert_eq!(names, vec!["z", "a", "b"]);
        assert_eq!(out[0]["time"], json!("2024-01-01T00:00:09Z"));
        assert_eq!(
            serde_json::to_string(&out[1]).expect("json"),
            r#"{"manager":"a","operation":"Update","apiVersion":"v1","time":"2024-01-01T00:00:02Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:a":{}}}}"#
        );
    }

    #[test]
    fn caps_update_managers_into_ancient_changes() {
        let mut m = Managed::default();
        for i in 0..12 {
            let id = manager_id(&format!("m{i:02}"), "Update", "v1", "");
            let mut set = Set::new();
            set.insert(&[PathElement::Field(format!("f{i}"))]);
            m.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: "v1".into(),
                    applied: false,
                },
            );
            m.times.insert(id, i);
        }
        cap_update_managers(&mut m);
        assert_eq!(m.fields.len(), 10);
        let bucket = manager_id(ANCIENT_CHANGES, "Update", "v1", "");
        let b = &m.fields[&bucket];
        for i in 0..3 {
            assert!(b.set.has(&[PathElement::Field(format!("f{i}"))]));
        }
        assert_eq!(m.times[&bucket], 2);
    }

    /// Fields of a managedFields entry: valid, near-valid or of the wrong type.
    fn entry_field(valid: &'static [&'static str]) -> BoxedStrategy<Option<Value>> {
        prop_oneof![
            4 => prop::sample::select(valid).prop_map(|s| Some(Value::from(s))),
            1 => Just(None),
            1 => crate::fuzz::json_value().prop_map(Some),
        ]
        .boxed()
    }

    fn entry() -> impl Strategy<Value = Value> {
        (
            entry_field(&["m", "kubectl", "", "é\"<"]),
            entry_field(&["Apply", "Update", "apply", ""]),
            entry_field(&["v1", "g/v1", ""]),
            entry_field(&[
                "2024-02-29T12:34:56Z",
                "2024-02-29T12:34:56.5+02:00",
                "9999-12-31T23:59:59-23:59",
                "0000-01-01T00:00:00Z",
                "2024-13-01T00:00:00Z",
                "x",
            ]),
            entry_field(&["FieldsV1", "", "FieldsV2"]),
            entry_field(&["", "status", "scale"]),
            prop_oneof![
                3 => Just(Some(json!({"f:spec": {"f:a": {}, ".": {}}}))),
                1 => crate::fuzz::json_value().prop_map(Some),
                1 => Just(None),
            ],
        )
            .prop_map(|(m, op, av, time, ft, sub, fields)| {
                let mut e = Map::new();
                for (k, v) in [
                    ("manager", m),
                    ("operation", op),
                    ("apiVersion", av),
                    ("time", time),
                    ("fieldsType", ft),
                    ("subresource", sub),
                    ("fieldsV1", fields),
                ] {
                    if let Some(v) = v {
                        e.insert(k.into(), v);
                    }
                }
                Value::Object(e)
            })
    }

    /// Regression (found by `prop_managed_fields_never_panics`): a time whose
    /// offset puts it past year 9999 was accepted, then written back as
    /// `10000-01-01T23:58:59Z`, which no later write could decode.
    #[test]
    fn times_outside_years_0_to_9999_are_refused() {
        for (time, ok) in [
            ("9999-12-31T23:59:59-23:59", false),
            ("0000-01-01T00:00:00+00:01", false),
            ("9999-12-31T23:59:59Z", true),
            ("0000-01-01T00:00:00Z", true),
        ] {
            let entries = json!([{
                "manager": "m", "operation": "Update", "apiVersion": "v1", "time": time,
                "fieldsType": "FieldsV1", "fieldsV1": {}
            }]);
            let got = decode(Some(&entries));
            assert_eq!(got.is_ok(), ok, "{time}: {:?}", got.err());
            if let Ok(m) = got {
                assert!(decode(encode(&m).as_ref()).is_ok(), "{time}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        /// Any managedFields value decodes or is an error; decoded entries
        /// encode to entries that decode again.
        #[test]
        fn prop_managed_fields_never_panics(
            entries in prop_oneof![
                4 => prop::collection::vec(entry(), 0..5).prop_map(Value::Array),
                1 => crate::fuzz::json_value(),
            ],
            id in ".{0,40}",
        ) {
            let _ = describe_manager(&id);
            let _ = parse_id(&id);
            if let Ok(managed) = decode(Some(&entries)) {
                let encoded = encode(&managed);
                let again = decode(encoded.as_ref());
                prop_assert!(again.is_ok(), "{:?}", again.err());
                for id in managed.fields.keys() {
                    let _ = describe_manager(id);
                }
            }
        }
    }
}
