//! Schema-aware walks over JSON objects: validation of an applied
//! configuration, the field set of a value, merging a configuration onto a
//! live object, comparing two objects and removing a set of fields.
//!
//! Each walk follows structured-merge-diff's `typed` package closely, quirks
//! included (e.g. an empty map or list is a leaf, a granular map given `null`
//! keeps the other side's keys), because ownership results must match kube.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::fieldpath::{path_string, values_equal, Path, PathElement, Set};
use super::schema::{ListType, MapType, ScalarKind, Shape, TypeRef};

static DEDUCED: TypeRef = TypeRef::Deduced;

/// Undeclared fields of stored objects are tolerated (they were accepted
/// before); walking them as deduced keeps merging total.
fn lenient(ty: &TypeRef) -> &TypeRef {
    if ty.is_undeclared() {
        &DEDUCED
    } else {
        ty
    }
}

fn shape<'a>(ty: &'a TypeRef, lhs: Option<&Value>, rhs: Option<&Value>) -> Shape<'a> {
    let atom = lenient(ty).atom();
    match rhs {
        Some(_) => atom.shape_for(rhs),
        None => atom.shape_for(lhs),
    }
}

/// The path element of a list item: its keys (map list) or itself (set list).
pub(crate) fn list_item_element(list: &ListType, item: &Value) -> Result<PathElement, String> {
    if list.atomic {
        return Err("invalid indexing of non-associative list".into());
    }
    if !list.keys.is_empty() {
        let Value::Object(m) = item else {
            return Err(if item.is_null() {
                "associative list with keys may not have a null element".into()
            } else {
                "associative list with keys may not have non-map elements".into()
            });
        };
        let elem_map = list.elem.atom().map.as_ref();
        let mut fields = Vec::new();
        for key in &list.keys {
            if let Some(v) = m.get(key) {
                fields.push((key.clone(), v.clone()));
            } else if let Some(d) = elem_map
                .and_then(|em| em.fields.get(key))
                .and_then(|f| f.default.clone())
            {
                fields.push((key.clone(), d));
            }
        }
        if fields.is_empty() {
            let quoted: Vec<String> = list
                .keys
                .iter()
                .map(|k| super::fieldpath::go_quote(k))
                .collect();
            return Err(format!(
                "associative list with keys has an element that omits all key fields [{}] (and doesn't have default values for any key fields)",
                quoted.join(" ")
            ));
        }
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        return Ok(PathElement::Key(fields));
    }
    match item {
        Value::Object(_) => {
            Err("associative list without keys has an element that's a map type".into())
        }
        Value::Array(_) => Err("not supported: associative list with lists as elements".into()),
        Value::Null => {
            Err("associative list without keys has an element that's an explicit null".into())
        }
        v => Ok(PathElement::Value(v.clone())),
    }
}

// ---------------------------------------------------------------- validation

/// Validates an applied configuration against the schema (kube's
/// `FromUnstructured` without AllowDuplicates). Messages are kube's,
/// prefixed by the path: `.spec.foo: field not declared in schema`.
pub(crate) fn validate(ty: &TypeRef, v: &Value) -> Result<(), String> {
    let mut errs = Vec::new();
    validate_at(ty, v, "", &mut errs);
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(format!("errors:\n  {}", errs.join("\n  "))),
    }
}

fn at(path: &str, msg: impl std::fmt::Display) -> String {
    if path.is_empty() {
        msg.to_string()
    } else {
        format!("{path}: {msg}")
    }
}

fn validate_at(ty: &TypeRef, v: &Value, path: &str, errs: &mut Vec<String>) {
    match ty.atom().shape_for(Some(v)) {
        Shape::Scalar(kind) => {
            let ok = matches!(
                (kind, v),
                (_, Value::Null)
                    | (ScalarKind::Numeric, Value::Number(_))
                    | (ScalarKind::String, Value::String(_))
                    | (ScalarKind::Boolean, Value::Bool(_))
                    | (
                        ScalarKind::Untyped,
                        Value::Number(_) | Value::String(_) | Value::Bool(_)
                    )
            );
            if !ok {
                let want = match kind {
                    ScalarKind::Numeric => "numeric (int or float)",
                    ScalarKind::String => "string",
                    ScalarKind::Boolean => "boolean",
                    ScalarKind::Untyped => "any scalar",
                };
                // kube prints the Go type of the value for numeric fields (`%T`).
                let got = match (kind, v) {
                    (ScalarKind::Numeric, Value::String(_)) => "string".to_string(),
                    (ScalarKind::Numeric, Value::Bool(_)) => "bool".to_string(),
                    (ScalarKind::Numeric, Value::Array(_)) => "[]interface {}".to_string(),
                    (ScalarKind::Numeric, Value::Object(_)) => {
                        "map[string]interface {}".to_string()
                    }
                    _ => v.to_string(),
                };
                errs.push(at(path, format!("expected {want}, got {got}")));
            }
        }
        Shape::List(list) => {
            let items = match v {
                Value::Null => return,
                Value::Array(items) => items,
                other => return errs.push(at(path, format!("expected list, got {other}"))),
            };
            let mut seen = BTreeSet::new();
            for (i, item) in items.iter().enumerate() {
                let pe = if list.atomic {
                    PathElement::Index(i as i64)
                } else {
                    match list_item_element(list, item) {
                        Ok(pe) => pe,
                        Err(e) => return errs.push(at(path, format!("element {i}: {e}"))),
                    }
                };
                if !list.atomic && !seen.insert(pe.clone()) {
                    errs.push(at(path, format!("duplicate entries for key {pe}")));
                }
                validate_at(&list.elem, item, &format!("{path}{pe}"), errs);
            }
        }
        Shape::Map(map) => {
            let m = match v {
                Value::Null => return,
                Value::Object(m) => m,
                other => return errs.push(at(path, format!("expected map, got {other}"))),
            };
            for (k, child) in m {
                let child_path = format!("{path}.{k}");
                let child_ty = map.field_type(k);
                if child_ty.is_undeclared() {
                    // kube stops at the first undeclared field of a map.
                    return errs.push(at(&child_path, "field not declared in schema"));
                }
                validate_at(child_ty, child, &child_path, errs);
            }
        }
        Shape::Invalid => errs.push(at(path, "schema error: invalid atom")),
    }
}

// ----------------------------------------------------------------- field set

/// The set of fields a value sets (kube's `ToFieldSet`): leaves, atomic
/// lists/maps, map keys that are not struct fields, list items, and empty or
/// null values.
pub(crate) fn field_set(ty: &TypeRef, v: &Value) -> Set {
    let mut set = Set::new();
    field_set_at(ty, v, &mut Vec::new(), &mut set);
    set
}

fn field_set_at(ty: &TypeRef, v: &Value, path: &mut Path, set: &mut Set) {
    match lenient(ty).atom().shape_for(Some(v)) {
        Shape::Scalar(_) | Shape::Invalid => set.insert(path),
        Shape::List(list) => {
            if list.atomic {
                return set.insert(path);
            }
            let Value::Array(items) = v else { return };
            let pes: Vec<Option<PathElement>> = items
                .iter()
                .map(|i| list_item_element(list, i).ok())
                .collect();
            // Duplicated keys (tolerated in live objects) are owned as a whole.
            let mut seen = BTreeSet::new();
            let mut dups = BTreeSet::new();
            for pe in pes.iter().flatten() {
                if !seen.insert(pe) {
                    dups.insert(pe);
                }
            }
            for pe in &dups {
                path.push((*pe).clone());
                set.insert(path);
                path.pop();
            }
            for (item, pe) in items.iter().zip(&pes) {
                let Some(pe) = pe else { continue };
                if dups.contains(pe) {
                    continue;
                }
                path.push(pe.clone());
                field_set_at(&list.elem, item, path, set);
                set.insert(path);
                path.pop();
            }
        }
        Shape::Map(map) => {
            if map.atomic {
                return set.insert(path);
            }
            let Value::Object(m) = v else { return };
            for (k, child) in m {
                path.push(PathElement::Field(k.clone()));
                field_set_at(map.field_type(k), child, path, set);
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !map.fields.contains_key(k) {
                    set.insert(path);
                }
                path.pop();
            }
        }
    }
}

// --------------------------------------------------------------------- merge

/// Merges `rhs` (the applied configuration) onto `lhs` (the live object):
/// leaves and atomic values come from `rhs`, granular maps and associative
/// lists are merged item by item. Key order: `lhs` first, new keys after.
pub(crate) fn merge(ty: &TypeRef, lhs: Option<&Value>, rhs: Option<&Value>) -> Option<Value> {
    if lhs.is_none() && rhs.is_none() {
        return None;
    }
    let leaf = || rhs.or(lhs).cloned();
    match shape(ty, lhs, rhs) {
        Shape::Scalar(_) | Shape::Invalid => leaf(),
        Shape::List(list) => {
            let l = lhs.and_then(Value::as_array);
            let r = rhs.and_then(Value::as_array);
            let empty = l.is_none_or(|l| l.is_empty()) && r.is_none_or(|r| r.is_empty());
            if list.atomic || empty {
                return leaf();
            }
            merge_list(list, l.map_or(&[][..], |v| v), r.map_or(&[][..], |v| v))
        }
        Shape::Map(map) => {
            let l = lhs.and_then(Value::as_object);
            let r = rhs.and_then(Value::as_object);
            let empty = l.is_none_or(Map::is_empty) && r.is_none_or(Map::is_empty);
            if map.atomic || empty {
                return leaf();
            }
            merge_map(map, l, r)
        }
    }
}

fn merge_map(
    map: &MapType,
    l: Option<&Map<String, Value>>,
    r: Option<&Map<String, Value>>,
) -> Option<Value> {
    let mut out = Map::new();
    let keys = l.into_iter().flat_map(Map::keys).chain(
        r.into_iter()
            .flat_map(Map::keys)
            .filter(|k| !l.is_some_and(|l| l.contains_key(*k))),
    );
    for k in keys {
        let merged = merge(
            map.field_type(k),
            l.and_then(|m| m.get(k)),
            r.and_then(|m| m.get(k)),
        );
        if let Some(v) = merged {
            out.insert(k.clone(), v);
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// Indexes list items by path element. Duplicates are an error on the applied
/// side; on the live side they map to `null`, as kube does.
fn index_items<'a>(
    list: &ListType,
    items: &'a [Value],
    allow_dups: bool,
) -> (Vec<PathElement>, BTreeMap<PathElement, &'a Value>) {
    static NULL: Value = Value::Null;
    let mut pes = Vec::new();
    let mut observed: BTreeMap<PathElement, &Value> = BTreeMap::new();
    for item in items {
        let Ok(pe) = list_item_element(list, item) else {
            continue;
        };
        if observed.contains_key(&pe) {
            if !allow_dups {
                continue;
            }
            observed.insert(pe.clone(), &NULL);
        } else {
            observed.insert(pe.clone(), item);
        }
        pes.push(pe);
    }
    (pes, observed)
}

/// Merges associative lists keeping live order for live items and placing new
/// items after the shared item that precedes them in the applied order
/// (kube's `visitListItems`).
fn merge_list(list: &ListType, lhs: &[Value], rhs: &[Value]) -> Option<Value> {
    let (rhs_pes, observed_rhs) = index_items(list, rhs, false);
    let (lhs_pes, observed_lhs) = index_items(list, lhs, true);
    let mut shared: std::collections::VecDeque<&PathElement> = rhs_pes
        .iter()
        .filter(|pe| observed_lhs.contains_key(*pe))
        .collect();
    let mut next_shared = shared.pop_front();
    let mut merged_rhs = BTreeSet::new();
    let mut out = Vec::new();
    let item = |l: Option<&Value>, r: Option<&Value>, out: &mut Vec<Value>| {
        if let Some(v) = merge(&list.elem, l, r) {
            out.push(v);
        }
    };
    let (mut li, mut ri) = (0, 0);
    while li < lhs_pes.len() || ri < rhs_pes.len() {
        if li < lhs_pes.len() && ri < rhs_pes.len() {
            let pe = &lhs_pes[li];
            if *pe == rhs_pes[ri] {
                merged_rhs.insert(pe.clone());
                item(
                    observed_lhs.get(pe).copied(),
                    observed_rhs.get(pe).copied(),
                    &mut out,
                );
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if observed_rhs.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lhs_pes.len() {
            let pe = &lhs_pes[li];
            if !observed_rhs.contains_key(pe) {
                item(lhs.get(lhs_index(list, lhs, li)), None, &mut out);
                li += 1;
                continue;
            } else if merged_rhs.contains(pe) {
                li += 1;
            }
        }
        if ri < rhs_pes.len() {
            let pe = &rhs_pes[ri];
            merged_rhs.insert(pe.clone());
            item(
                observed_lhs.get(pe).copied(),
                observed_rhs.get(pe).copied(),
                &mut out,
            );
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        }
    }
    (!out.is_empty()).then_some(Value::Array(out))
}

/// Position in `items` of the `n`th item that has a valid path element
/// (items without one were skipped while indexing).
fn lhs_index(list: &ListType, items: &[Value], n: usize) -> usize {
    items
        .iter()
        .enumerate()
        .filter(|(_, i)| list_item_element(list, i).is_ok())
        .nth(n)
        .map_or(items.len(), |(i, _)| i)
}

// ------------------------------------------------------------------- compare

/// What changed between two objects, as sets of fields.
#[derive(Clone, Debug, Default)]
pub(crate) struct Comparison {
    pub added: Set,
    pub modified: Set,
    pub removed: Set,
}

impl Comparison {
    pub fn filter(self, exclude: &Set) -> Comparison {
        Comparison {
            added: self.added.recursive_difference(exclude),
            modified: self.modified.recursive_difference(exclude),
            removed: self.removed.recursive_difference(exclude),
        }
    }
}

/// Compares `lhs` (before) to `rhs` (after), kube's `TypedValue.Compare`.
pub(crate) fn compare(ty: &TypeRef, lhs: &Value, rhs: &Value) -> Comparison {
    let mut c = Comparison::default();
    compare_at(ty, Some(lhs), Some(rhs), &mut Vec::new(), &mut c);
    c
}

/// `compare(ty, lhs, rhs).added` when `lhs` is a map whose every field
/// `rhs` has with the same value, so nothing is modified or removed: every
/// create, whose live stub holds only apiVersion and kind. Built straight
/// into the set, without a path per leaf. `None` when that does not hold.
pub(crate) fn added_over(ty: &TypeRef, lhs: &Value, rhs: &Value) -> Option<Set> {
    let Shape::Map(map) = shape(ty, Some(lhs), Some(rhs)) else {
        return None;
    };
    let (l, r) = (lhs.as_object()?, rhs.as_object()?);
    if map.atomic
        || l.iter()
            .any(|(k, v)| !r.get(k).is_some_and(|w| values_equal(v, w)))
    {
        return None;
    }
    let mut set = Set::new();
    for (k, v) in r {
        if !l.contains_key(k) {
            add_new(
                map.field_type(k),
                v,
                PathElement::Field(k.clone()),
                &mut set,
            );
        }
    }
    Some(set)
}

/// What `compare_at(ty, None, Some(v))` adds at `pe`, added under `set`.
fn add_new(ty: &TypeRef, v: &Value, pe: PathElement, set: &mut Set) {
    let mut child = Set::new();
    match shape(ty, None, Some(v)) {
        Shape::Scalar(_) | Shape::Invalid => {}
        Shape::List(list) => {
            let items = v.as_array().map_or(&[][..], Vec::as_slice);
            if !list.atomic && !items.is_empty() {
                // Items grouped by element; a repeated element is owned whole.
                let mut groups: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
                for item in items {
                    if let Ok(e) = list_item_element(list, item) {
                        groups.entry(e).or_default().push(item);
                    }
                }
                for (e, group) in groups {
                    match group.as_slice() {
                        [item] => add_new(&list.elem, item, e, &mut child),
                        _ => child.add_member(e),
                    }
                }
            }
        }
        Shape::Map(map) => {
            if let Some(m) = v.as_object().filter(|_| !map.atomic) {
                for (k, w) in m {
                    add_new(
                        map.field_type(k),
                        w,
                        PathElement::Field(k.clone()),
                        &mut child,
                    );
                }
            }
        }
    }
    if !child.is_empty() {
        set.set_child(pe.clone(), child);
    }
    set.add_member(pe);
}

fn compare_at(
    ty: &TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Path,
    c: &mut Comparison,
) {
    if lhs.is_none() && rhs.is_none() {
        return;
    }
    let leaf = |c: &mut Comparison, path: &Path| match (lhs, rhs) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        (Some(l), Some(r)) => {
            if !values_equal(l, r) {
                c.modified.insert(path)
            }
        }
    };
    let in_leaf = match shape(ty, lhs, rhs) {
        Shape::Scalar(_) | Shape::Invalid => {
            leaf(c, path);
            true
        }
        Shape::List(list) => {
            let l = lhs.and_then(Value::as_array);
            let r = rhs.and_then(Value::as_array);
            let empty = l.is_none_or(|l| l.is_empty()) && r.is_none_or(|r| r.is_empty());
            if list.atomic || empty {
                leaf(c, path);
                true
            } else {
                compare_list(
                    list,
                    l.map_or(&[][..], |v| v),
                    r.map_or(&[][..], |v| v),
                    path,
                    c,
                );
                false
            }
        }
        Shape::Map(map) => {
            let l = lhs.and_then(Value::as_object);
            let r = rhs.and_then(Value::as_object);
            let empty = l.is_none_or(Map::is_empty) && r.is_none_or(Map::is_empty);
            if map.atomic || empty {
                leaf(c, path);
                true
            } else {
                let keys: BTreeSet<&String> = l
                    .into_iter()
                    .flat_map(Map::keys)
                    .chain(r.into_iter().flat_map(Map::keys))
                    .collect();
                for k in keys {
                    path.push(PathElement::Field(k.clone()));
                    compare_at(
                        map.field_type(k),
                        l.and_then(|m| m.get(k)),
                        r.and_then(|m| m.get(k)),
                        path,
                        c,
                    );
                    path.pop();
                }
                false
            }
        }
    };
    if !in_leaf {
        if lhs.is_none() {
            c.added.insert(path);
        } else if rhs.is_none() {
            c.removed.insert(path);
        }
    }
}

fn compare_list(
    list: &ListType,
    lhs: &[Value],
    rhs: &[Value],
    path: &mut Path,
    c: &mut Comparison,
) {
    let mut order: Vec<PathElement> = Vec::new();
    let mut lvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    let mut rvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    for item in lhs {
        let Ok(pe) = list_item_element(list, item) else {
            continue;
        };
        let e = lvals.entry(pe.clone()).or_default();
        if e.is_empty() {
            order.push(pe);
        }
        e.push(item);
    }
    for item in rhs {
        let Ok(pe) = list_item_element(list, item) else {
            continue;
        };
        let e = rvals.entry(pe.clone()).or_default();
        if e.is_empty() && !lvals.contains_key(&pe) {
            order.push(pe);
        }
        e.push(item);
    }
    for pe in order {
        let l = lvals.get(&pe).map_or(&[][..], Vec::as_slice);
        let r = rvals.get(&pe).map_or(&[][..], Vec::as_slice);
        path.push(pe);
        match (l.len(), r.len()) {
            (0, 0) => {}
            (0..=1, 0..=1) => {
                compare_at(&list.elem, l.first().copied(), r.first().copied(), path, c)
            }
            (2.., 2..) => {
                let same = l.len() == r.len() && l.iter().zip(r).all(|(a, b)| values_equal(a, b));
                if !same {
                    c.modified.insert(path);
                }
            }
            (2.., _) => {
                if let Some(first) = r.first() {
                    compare_at(&list.elem, None, Some(first), path, c);
                }
                c.removed.insert(path);
            }
            (_, _) => {
                if let Some(first) = l.first() {
                    compare_at(&list.elem, Some(first), None, path, c);
                }
                c.added.insert(path);
            }
        }
        path.pop();
    }
}

// -------------------------------------------------------------------- remove

/// Removes the fields in `to_remove` from a value (kube's `RemoveItems`).
/// A granular map or list left empty becomes `null`, as in kube.
pub(crate) fn remove_items(ty: &TypeRef, v: &Value, to_remove: &Set) -> Value {
    match lenient(ty).atom().shape_for(Some(v)) {
        Shape::Scalar(_) => v.clone(),
        Shape::Invalid => Value::Null,
        Shape::List(list) => {
            let Value::Array(items) = v else {
                return Value::Null;
            };
            if items.is_empty() || list.atomic {
                return Value::Null;
            }
            let mut out = Vec::new();
            for item in items {
                let Ok(pe) = list_item_element(list, item) else {
                    out.push(item.clone());
                    continue;
                };
                if to_remove.has(std::slice::from_ref(&pe)) {
                    continue;
                }
                match to_remove.with_prefix(&pe).filter(|s| !s.is_empty()) {
                    Some(sub) => out.push(remove_items(&list.elem, item, sub)),
                    None => out.push(item.clone()),
                }
            }
            if out.is_empty() {
                Value::Null
            } else {
                Value::Array(out)
            }
        }
        Shape::Map(map) => {
            let Value::Object(m) = v else {
                return Value::Null;
            };
            if m.is_empty() || map.atomic {
                return Value::Null;
            }
            let mut out = Map::new();
            for (k, child) in m {
                let pe = PathElement::Field(k.clone());
                if to_remove.has(std::slice::from_ref(&pe)) {
                    continue;
                }
                match to_remove.with_prefix(&pe).filter(|s| !s.is_empty()) {
                    Some(sub) => out.insert(k.clone(), remove_items(map.field_type(k), child, sub)),
                    None => out.insert(k.clone(), child.clone()),
                };
            }
            if out.is_empty() {
                Value::Null
            } else {
                Value::Object(out)
            }
        }
    }
}

/// Adds every struct field that has owned children as a member itself, so
/// removing a set also removes the now-unowned parents (kube's
/// `EnsureNamedFieldsAreMembers`).
pub(crate) fn ensure_named_fields_are_members(ty: &TypeRef, set: &Set) -> Set {
    let atom = ty.atom();
    let mut out = Set::new();
    for m in set.members() {
        out.add_member(m.clone());
    }
    for (pe, child) in set.children() {
        let child_ty = match (pe, &atom.map, &atom.list) {
            (PathElement::Field(name), Some(map), _) => {
                if map.fields.contains_key(name) {
                    out.add_member(pe.clone());
                }
                map.field_type(name)
            }
            (PathElement::Key(_), _, Some(list)) => &list.elem,
            _ => &TypeRef::Undeclared,
        };
        out.set_child(pe.clone(), ensure_named_fields_are_members(child_ty, child));
    }
    out
}

/// Conflict and error messages name paths the way kube prints them.
pub(crate) fn describe(path: &[PathElement]) -> String {
    path_string(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::schema::MergeSchema;
    use serde_json::json;

    fn schema() -> MergeSchema {
        MergeSchema::from_openapi(Some(&json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "items": {"type": "array", "x-kubernetes-list-type": "map",
                          "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object", "properties": {
                              "name": {"type": "string"}, "v": {"type": "string"}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
            }}}
        })))
    }

    #[test]
    fn map_list_merge_keeps_live_order_and_appends_new_items() {
        let s = schema();
        let live = json!({"spec": {"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let cfg = json!({"spec": {"items": [{"name": "b", "v": "1"}, {"name": "x"}]}});
        let out = merge(&s.root, Some(&live), Some(&cfg)).expect("merged");
        let names: Vec<&str> = out["spec"]["items"]
            .as_array()
            .expect("list")
            .iter()
            .map(|i| i["name"].as_str().expect("name"))
            .collect();
        // Live items not in the config keep their place; new items follow.
        assert_eq!(names, vec!["a", "b", "c", "x"]);
        assert_eq!(out["spec"]["items"][1]["v"], json!("1"));
    }

    /// structured-merge-diff's own merge cases (typed/merge_test.go): config
    /// items in their order, live-only items kept where they were.
    #[test]
    fn set_list_merge_order_is_smds() {
        let s = schema();
        let cases: &[(&[&str], &[&str], &[&str])] = &[
            (
                &["a", "b", "c"],
                &["c", "d", "e", "f"],
                &["a", "b", "c", "d", "e", "f"],
            ),
            (
                &["a", "b", "c", "g", "f"],
                &["c", "d", "e", "f"],
                &["a", "b", "c", "g", "d", "e", "f"],
            ),
            (
                &["a", "b", "c", "d"],
                &["d", "e", "f", "a"],
                &["b", "c", "d", "e", "f", "a"],
            ),
            (
                &["c", "d", "e", "f"],
                &["a", "c", "e"],
                &["a", "c", "d", "e", "f"],
            ),
            (&["a", "b", "c"], &["c", "d"], &["a", "b", "c", "d"]),
        ];
        for (live, cfg, want) in cases {
            let out = merge(
                &s.root,
                Some(&json!({"spec": {"tags": live}})),
                Some(&json!({"spec": {"tags": cfg}})),
            )
            .expect("merged");
            assert_eq!(out["spec"]["tags"], json!(want), "{live:?} + {cfg:?}");
        }
        // Map lists follow the same order: [a,b,c] + [c,a] is [b,c,a].
        let names = |v: &Value| -> Vec<String> {
            v["spec"]["items"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|i| i["name"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let live = json!({"spec": {"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}});
        let out = merge(
            &s.root,
            Some(&live),
            Some(&json!({"spec": {"items": [{"name": "c"}, {"name": "a"}]}})),
        )
        .expect("merged");
        assert_eq!(names(&out), vec!["b", "c", "a"]);
        let out = merge(
            &s.root,
            Some(&live),
            Some(&json!({"spec": {"items": [{"name": "c"}, {"name": "b"}]}})),
        )
        .expect("merged");
        assert_eq!(names(&out), vec!["a", "c", "b"]);
    }

    #[test]
    fn validation_messages() {
        let s = schema();
        let e = validate(&s.root, &json!({"spec": {"bogus": 1}})).expect_err("undeclared");
        assert_eq!(e, ".spec.bogus: field not declared in schema");
        let e = validate(
            &s.root,
            &json!({"spec": {"items": [{"name": "a"}, {"name": "a"}]}}),
        )
        .expect_err("dup");
        assert_eq!(e, r#".spec.items: duplicate entries for key [name="a"]"#);
        let e = validate(&s.root, &json!({"spec": {"items": [{"v": "a"}]}})).expect_err("nokey");
        assert!(e.starts_with(".spec.items: element 0: associative list with keys has an element that omits all key fields [\"name\"]"));
        assert!(validate(&s.root, &json!({"spec": {"replicas": "x"}})).is_err());
    }

    #[test]
    fn compare_and_remove() {
        let s = schema();
        let a = json!({"spec": {"replicas": 1, "tags": ["x", "y"]}});
        let b = json!({"spec": {"replicas": 2, "tags": ["y", "z"]}});
        let c = compare(&s.root, &a, &b);
        let f = |n: &str| PathElement::Field(n.into());
        assert!(c.modified.has(&[f("spec"), f("replicas")]));
        assert!(c
            .added
            .has(&[f("spec"), f("tags"), PathElement::Value(json!("z"))]));
        assert!(c
            .removed
            .has(&[f("spec"), f("tags"), PathElement::Value(json!("x"))]));
        let mut rm = Set::new();
        rm.insert(&[f("spec"), f("tags"), PathElement::Value(json!("x"))]);
        let out = remove_items(&s.root, &a, &rm);
        assert_eq!(out, json!({"spec": {"replicas": 1, "tags": ["y"]}}));
    }
}
