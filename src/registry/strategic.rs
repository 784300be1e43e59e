//! Strategic merge patch (`application/strategic-merge-patch+json`) as
//! apimachinery's `strategicpatch` applies one to an object on the server
//! (`StrategicMergeMapPatch` with `MergeParallelList` and
//! `IgnoreUnmatchedNulls`), for the kinds kshard serves that are kube's
//! built-in types (the `admissionregistration.k8s.io` kinds standalone):
//! kubectl's client-side apply sends one. Custom resources take none (kube's
//! 415), as before.
//!
//! The patch metadata comes from the schema: a list whose node says
//! `x-kubernetes-patch-strategy: merge` merges by its
//! `x-kubernetes-patch-merge-key` (a list of objects) or as a set (a list of
//! scalars); any other list is replaced. ObjectMeta's (`finalizers` as a set,
//! `ownerReferences` by `uid`) apply under `metadata` whatever the schema
//! says. The directives kubectl's apply writes are understood: `$patch`
//! (`replace` and `delete` on maps; `delete` and `replace` elements in merged
//! lists), `$retainKeys`, `$deleteFromPrimitiveList/<field>` and
//! `$setElementOrder/<field>`.
//!
//! Written here because no maintained Rust crate implements kube's strategic
//! merge (json-patch covers RFC 6902 and RFC 7386 only); the semantics are
//! kube's, checked against a running kube-apiserver by the differential
//! scenarios.

use serde_json::{json, Map, Value};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Why a strategic merge patch cannot be applied (kube answers these 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StrategicError {
    #[error("unable to find api field in struct Unstructured for the json field \"{0}\"")]
    NotAnObject(String),
    #[error("unknown patch type: {0} in map: {1}")]
    BadPatchType(String, String),
    #[error("map: {0} does not contain declared merge key: {1}")]
    NoMergeKey(String, String),
    #[error("doesn't satisfy strategic merge patch format")]
    BadFormat,
    #[error("invalid patch format of retainKeys")]
    BadRetainKeys,
    #[error("patch content doesn't match retainKeys list")]
    NotInRetainKeys,
    #[error("invalid patch format of setElementOrder list")]
    BadSetElementOrder,
    #[error("merging lists cannot yet be specified in the patch")]
    MergeDirectiveInList,
    #[error("cannot merge lists without merge key for {0}")]
    NoMergeKeyDeclared(String),
}

/// The patch metadata of one field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Meta<'a> {
    merge: bool,
    merge_key: Option<&'a str>,
}

fn meta_of(schema: Option<&Value>) -> Meta<'_> {
    let strategies = schema
        .and_then(|s| s.get("x-kubernetes-patch-strategy"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Meta {
        merge: strategies.split(',').any(|s| s == "merge"),
        merge_key: schema
            .and_then(|s| s.get("x-kubernetes-patch-merge-key"))
            .and_then(Value::as_str),
    }
}

/// The schema of field `k` of an object node.
fn field<'a>(schema: Option<&'a Value>, k: &str) -> Option<&'a Value> {
    let s = schema?;
    s.get("properties")
        .and_then(|p| p.get(k))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

fn items(schema: Option<&Value>) -> Option<&Value> {
    schema?.get("items")
}

/// A value as Go's `%v` prints the decoded JSON kube's messages quote:
/// `map[k:v ...]` by sorted key, `[a b]`, `<nil>`.
fn rendered(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(rendered).collect::<Vec<_>>().join(" ")),
        Value::Object(o) => {
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let parts: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{k}:{}", rendered(v)))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// The patch metadata of kube's ObjectMeta.
fn object_meta() -> Value {
    json!({"type": "object", "properties": {
        "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-patch-strategy": "merge"},
        "ownerReferences": {"type": "array", "items": {"type": "object"},
            "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "uid"},
    }})
}

/// Applies `patch` to `current` under `schema` (the kind's structural
/// schema; `None` merges every list by replacing it).
pub fn apply(
    current: &Value,
    patch: &Value,
    schema: Option<&Value>,
) -> Result<Value, StrategicError> {
    let Value::Object(patch) = patch else {
        return Err(StrategicError::BadFormat);
    };
    let Value::Object(original) = current else {
        return Err(StrategicError::BadFormat);
    };
    let mut root = schema.cloned().unwrap_or_else(|| json!({"type": "object"}));
    if let Some(props) = root
        .as_object_mut()
        .map(|o| o.entry("properties").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        props.insert("metadata".into(), object_meta());
    }
    merge_map(original.clone(), patch.clone(), Some(&root)).map(Value::Object)
}

/// `mergeMap`: the map directive, `$retainKeys`, the ordered lists, then
/// every field of the patch.
fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: Option<&Value>,
) -> Result<Map<String, Value>, StrategicError> {
    if let Some(d) = patch.get(DIRECTIVE) {
        return match d.as_str() {
            Some("replace") => {
                patch.remove(DIRECTIVE);
                Ok(patch)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(StrategicError::BadPatchType(
                d.as_str().map_or_else(|| rendered(d), str::to_string),
                rendered(&Value::Object(patch.clone())),
            )),
        };
    }
    retain_keys(&mut original, &mut patch)?;
    set_element_orders(&mut original, &mut patch, schema)?;
    for (k, patch_v) in patch {
        if k.starts_with(SET_ELEMENT_ORDER) {
            continue;
        }
        let (k, delete_list) = match k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            Some(rest) => (rest.to_string(), true),
            None => (k, false),
        };
        if patch_v.is_null() {
            original.remove(&k);
            continue;
        }
        let Some(orig_v) = original.get(&k) else {
            if !delete_list {
                original.insert(k, without_nulls(patch_v));
            }
            continue;
        };
        let merged = match (orig_v, &patch_v) {
            (Value::Object(o), Value::Object(p)) => {
                let sub = field(schema, &k);
                if is_replace(sub) {
                    patch_v
                } else {
                    Value::Object(merge_map(o.clone(), p.clone(), sub)?)
                }
            }
            (Value::Array(o), Value::Array(p)) => {
                let sub = field(schema, &k);
                let meta = meta_of(sub);
                if meta.merge {
                    Value::Array(merge_slice(
                        o.clone(),
                        p.clone(),
                        sub,
                        &k,
                        meta,
                        delete_list,
                    )?)
                } else {
                    patch_v
                }
            }
            (o, p) if std::mem::discriminant(o) != std::mem::discriminant(p) => {
                if delete_list {
                    continue;
                }
                without_nulls(patch_v)
            }
            _ => patch_v,
        };
        original.insert(k, merged);
    }
    Ok(original)
}

/// A map field patched whole: kube's `replace` strategy on a struct field.
fn is_replace(schema: Option<&Value>) -> bool {
    schema
        .and_then(|s| s.get("x-kubernetes-patch-strategy"))
        .and_then(Value::as_str)
        .is_some_and(|s| s.split(',').any(|s| s == "replace"))
}

/// `discardNullValuesFromPatch`: a new value keeps no nulls.
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        v => v,
    }
}

/// `applyRetainKeysDirective`: the original keeps only the listed keys,
/// and the patch may set no other.
fn retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), StrategicError> {
    let Some(list) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(list) = list else {
        return Err(StrategicError::BadRetainKeys);
    };
    let keep: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
    for (k, v) in patch.iter() {
        if v.is_null()
            || k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            || k.starts_with(SET_ELEMENT_ORDER)
        {
            continue;
        }
        if !keep.contains(&k.as_str()) {
            return Err(StrategicError::NotInRetainKeys);
        }
    }
    original.retain(|k, _| keep.contains(&k.as_str()));
    Ok(())
}

/// `mergePatchIntoOriginal`: each list named by a `$setElementOrder/<k>`
/// is merged now and put in that order (items the order does not name keep
/// their places among the server's); the list leaves the patch.
fn set_element_orders(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    schema: Option<&Value>,
) -> Result<(), StrategicError> {
    let keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for key in keys {
        let field_name = key[SET_ELEMENT_ORDER.len()..].to_string();
        let Some(Value::Array(order)) = patch.get(&key).cloned() else {
            return Err(StrategicError::BadSetElementOrder);
        };
        let list = |v: Option<&Value>| -> Result<Option<Vec<Value>>, StrategicError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) => Ok(Some(a.clone())),
                Some(_) => Err(StrategicError::BadFormat),
            }
        };
        let orig = list(original.get(&field_name))?;
        let patched = list(patch.get(&field_name))?;
        let sub = field(schema, &field_name);
        let meta = meta_of(sub);
        let merged = match (&orig, patched) {
            (None, None) => continue,
            (Some(o), Some(p)) if meta.merge => {
                merge_slice(o.clone(), p, sub, &field_name, meta, false)?
            }
            (_, Some(p)) => p,
            (Some(o), None) => o.clone(),
        };
        let key_name = meta.merge_key;
        let (in_order, server_only): (Vec<Value>, Vec<Value>) = merged
            .into_iter()
            .partition(|v| position(&order, v, key_name).is_some());
        let both = normalize_order(
            in_order,
            server_only,
            &order,
            orig.as_deref().unwrap_or_default(),
            key_name,
        );
        original.insert(field_name.clone(), Value::Array(both));
        patch.remove(&field_name);
    }
    Ok(())
}

/// Where `v` is in `list`: by merge key for objects, by value for scalars.
fn position(list: &[Value], v: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        Some(k) if v.is_object() => {
            let want = v.get(k)?;
            list.iter().position(|x| x.get(k) == Some(want))
        }
        _ => list.iter().position(|x| x == v),
    }
}

/// `normalizeElementOrder`: the patch's items in the patch's order, the
/// server's own in the server's order, then the two interleaved so that of
/// two items the server has both of, its order wins (otherwise the patch's
/// item comes first).
fn normalize_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    patch_items.sort_by_key(|v| position(patch_order, v, key));
    server_only.sort_by_key(|v| position(server_order, v, key));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patch_items.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                match (
                    position(server_order, l, key),
                    position(server_order, r, key),
                ) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                }
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// `mergeSlice` for a list with the merge strategy.
fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    schema: Option<&Value>,
    name: &str,
    meta: Meta<'_>,
    delete_list: bool,
) -> Result<Vec<Value>, StrategicError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let of_objects = original.iter().chain(&patch).any(Value::is_object);
    if !of_objects {
        if delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.contains(v))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(&patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (in_patch, server_only): (Vec<Value>, Vec<Value>) =
            merged.into_iter().partition(|v| patch.contains(v));
        return Ok(normalize_order(
            in_patch,
            server_only,
            &patch,
            &original,
            None,
        ));
    }
    let Some(key) = meta.merge_key else {
        return Err(StrategicError::NoMergeKeyDeclared(name.to_string()));
    };
    let element = items(schema);
    // Special elements first: deletions by key, or a replacement of the list.
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    let mut base = original.clone();
    for v in &patch {
        let Some(d) = v.get(DIRECTIVE) else {
            plain.push(v.clone());
            continue;
        };
        match d.as_str() {
            Some("delete") => {
                let Some(want) = v.get(key) else {
                    return Err(StrategicError::NoMergeKey(rendered(v), key.to_string()));
                };
                base.retain(|x| x.get(key) != Some(want));
            }
            Some("replace") => replace = true,
            Some("merge") => return Err(StrategicError::MergeDirectiveInList),
            _ => {
                return Err(StrategicError::BadPatchType(
                    d.as_str().map_or_else(|| rendered(d), str::to_string),
                    rendered(v),
                ))
            }
        }
    }
    let (mut merged, patch_plain) = if replace {
        (plain, Vec::new())
    } else {
        (base, plain)
    };
    for v in &patch_plain {
        let Some(want) = v.get(key) else {
            return Err(StrategicError::NoMergeKey(rendered(v), key.to_string()));
        };
        match merged.iter().position(|x| x.get(key) == Some(want)) {
            Some(i) => {
                let (Value::Object(o), Value::Object(p)) = (&merged[i], v) else {
                    return Err(StrategicError::BadFormat);
                };
                merged[i] = Value::Object(merge_map(o.clone(), p.clone(), element)?);
            }
            None => merged.push(v.clone()),
        }
    }
    let order_by = if replace { &[][..] } else { &patch_plain[..] };
    let server_order = if replace { merged.clone() } else { original };
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| position(order_by, v, Some(key)).is_some());
    Ok(normalize_order(
        in_patch,
        server_only,
        order_by,
        &server_order,
        Some(key),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "webhooks": {"type": "array", "x-kubernetes-patch-strategy": "merge",
                "x-kubernetes-patch-merge-key": "name",
                "items": {"type": "object", "properties": {
                    "rules": {"type": "array", "items": {"type": "object"}},
                    "matchConditions": {"type": "array", "x-kubernetes-patch-strategy": "merge",
                        "x-kubernetes-patch-merge-key": "name", "items": {"type": "object"}},
                }}},
            "tags": {"type": "array", "x-kubernetes-patch-strategy": "merge", "items": {"type": "string"}},
            "keep": {"type": "object", "x-kubernetes-patch-strategy": "retainKeys"},
        }})
    }

    fn patched(current: Value, patch: Value) -> Value {
        apply(&current, &patch, Some(&schema())).expect("patch applies")
    }

    #[test]
    fn lists_with_a_merge_key_merge_by_it_and_others_are_replaced() {
        let cur = json!({"webhooks": [
            {"name": "a", "timeoutSeconds": 10, "rules": [{"x": 1}, {"x": 2}]},
            {"name": "b", "timeoutSeconds": 10}]});
        let out = patched(
            cur,
            json!({"webhooks": [{"name": "a", "timeoutSeconds": 5, "rules": [{"x": 3}]}]}),
        );
        assert_eq!(
            out,
            json!({"webhooks": [
                {"name": "a", "timeoutSeconds": 5, "rules": [{"x": 3}]},
                {"name": "b", "timeoutSeconds": 10}]})
        );
    }

    #[test]
    fn delete_and_replace_elements() {
        let cur = json!({"webhooks": [{"name": "a"}, {"name": "b"}, {"name": "c"}]});
        assert_eq!(
            patched(
                cur.clone(),
                json!({"webhooks": [{"name": "b", "$patch": "delete"}]})
            ),
            json!({"webhooks": [{"name": "a"}, {"name": "c"}]})
        );
        assert_eq!(
            patched(
                cur,
                json!({"webhooks": [{"name": "z"}, {"$patch": "replace"}]})
            ),
            json!({"webhooks": [{"name": "z"}]})
        );
    }

    #[test]
    fn set_element_order_orders_the_merged_list() {
        let cur = json!({"webhooks": [{"name": "a", "v": 1}, {"name": "b", "v": 1}]});
        let out = patched(
            cur,
            json!({"$setElementOrder/webhooks": [{"name": "b"}, {"name": "c"}, {"name": "a"}],
                   "webhooks": [{"name": "c", "v": 2}]}),
        );
        assert_eq!(
            out,
            json!({"webhooks": [{"name": "b", "v": 1}, {"name": "c", "v": 2}, {"name": "a", "v": 1}]})
        );
        // Items the order leaves out keep their places among the server's
        // (kube-apiserver: [c, a, x, b] ordered [b, a] is [c, x, b, a]).
        let cur = json!({"webhooks": [{"name": "c"}, {"name": "a"}, {"name": "x"}, {"name": "b"}]});
        let out = patched(
            cur,
            json!({"$setElementOrder/webhooks": [{"name": "b"}, {"name": "a"}], "webhooks": []}),
        );
        assert_eq!(
            out,
            json!({"webhooks": [{"name": "c"}, {"name": "x"}, {"name": "b"}, {"name": "a"}]})
        );
        // A new item without an order comes first, as kube-apiserver answers.
        let out = patched(
            json!({"webhooks": [{"name": "a"}]}),
            json!({"webhooks": [{"name": "c"}]}),
        );
        assert_eq!(out, json!({"webhooks": [{"name": "c"}, {"name": "a"}]}));
    }

    #[test]
    fn primitive_lists_merge_as_sets_and_delete_from_them() {
        let cur = json!({"tags": ["a", "b"], "metadata": {"finalizers": ["f1"]}});
        let out = patched(
            cur,
            json!({"tags": ["c", "a"], "$deleteFromPrimitiveList/tags": ["b"],
                   "metadata": {"finalizers": ["f2"]}}),
        );
        assert_eq!(out["tags"], json!(["c", "a"]));
        // The patch's items first, as kube-apiserver answers.
        assert_eq!(out["metadata"]["finalizers"], json!(["f2", "f1"]));
        let out = patched(
            json!({"tags": ["a", "b", "c"]}),
            json!({"$deleteFromPrimitiveList/tags": ["b"]}),
        );
        assert_eq!(out["tags"], json!(["a", "c"]));
    }

    #[test]
    fn maps_merge_nulls_delete_and_directives_replace_or_retain() {
        let cur = json!({"spec": {"a": 1, "b": {"c": 2, "d": 3}}, "keep": {"x": 1, "y": 2}});
        let out = patched(
            cur.clone(),
            json!({"spec": {"a": null, "b": {"d": 4, "e": null, "f": {"g": null, "h": 1}}}}),
        );
        assert_eq!(out["spec"], json!({"b": {"c": 2, "d": 4, "f": {"h": 1}}}));
        let out = patched(cur.clone(), json!({"spec": {"$patch": "replace", "z": 1}}));
        assert_eq!(out["spec"], json!({"z": 1}));
        let out = patched(
            cur.clone(),
            json!({"keep": {"$retainKeys": ["y", "z"], "z": 3}}),
        );
        assert_eq!(out["keep"], json!({"y": 2, "z": 3}));
        assert_eq!(
            apply(
                &cur,
                &json!({"keep": {"$retainKeys": ["y"], "z": 3}}),
                Some(&schema())
            ),
            Err(StrategicError::NotInRetainKeys)
        );
    }

    #[test]
    fn bad_patches_are_errors_not_panics() {
        let cur = json!({"webhooks": [{"name": "a"}], "spec": {}});
        assert!(matches!(
            apply(
                &cur,
                &json!({"webhooks": [{"timeoutSeconds": 1}]}),
                Some(&schema())
            ),
            Err(StrategicError::NoMergeKey(..))
        ));
        assert!(matches!(
            apply(&cur, &json!({"spec": {"$patch": "bogus"}}), Some(&schema())),
            Err(StrategicError::BadPatchType(..))
        ));
        assert!(apply(&cur, &json!([1]), Some(&schema())).is_err());
        assert!(apply(
            &cur,
            &json!({"$setElementOrder/webhooks": 5}),
            Some(&schema())
        )
        .is_err());
    }
}
