//! Reading and setting object metadata fields: the ground floor that the
//! registry, the watch cache, admission and the API handlers share.

pub mod meta;

use serde_json::{json, Map, Value};

/// `metadata.<field>` of an object. `Value::pointer` would build a string
/// per path token (for its `~` escapes) and look each up anew; this is on
/// every write's path (garbage collector, finalizers, selectors).
pub trait MetaField {
    fn meta_field(&self, field: &str) -> Option<&Value>;
}

impl MetaField for Value {
    fn meta_field(&self, field: &str) -> Option<&Value> {
        self.get("metadata")?.get(field)
    }
}

pub(super) fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let o = obj.as_object_mut()?;
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut()
}

pub(super) fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.meta_field(field).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    obj.meta_field("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn set_finalizers(obj: &mut Value, list: &[String]) {
    if let Some(m) = meta_mut(obj) {
        if list.is_empty() {
            m.remove("finalizers");
        } else {
            m.insert("finalizers".into(), json!(list));
        }
    }
}

pub(super) fn is_deleting(obj: &Value) -> bool {
    obj.meta_field("deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Everything but metadata (and status, when it has its own subresource).
pub(super) fn spec_part(obj: &Value, skip_status: bool) -> Map<String, Value> {
    obj.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    let system = matches!(k.as_str(), "metadata" | "apiVersion" | "kind");
                    !(system || (skip_status && k.as_str() == "status"))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn generation(obj: &Value) -> i64 {
    obj.meta_field("generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Sets `field` in `to` as it is in `from`, removing it when `from` lacks it
/// (system fields and status keep their stored values this way).
pub(super) fn copy_field(
    to: &mut Map<String, Value>,
    from: Option<&Map<String, Value>>,
    field: &str,
) {
    match from.and_then(|f| f.get(field)) {
        Some(v) => {
            to.insert(field.into(), v.clone());
        }
        None => {
            to.remove(field);
        }
    }
}

/// Now as kube writes `metav1.Time`: UTC, second precision.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
