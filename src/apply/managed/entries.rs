//! managedFields as stored: the entries decoded into field sets and times
//! by manager identifier, and encoded back in kube's order (apimachinery
//! `managedfields/internal/managedfields.go`), and the identifiers
//! themselves (`BuildManagerIdentifier`).
//!
//! Managers are keyed, as in kube, by an identifier that is the JSON of the
//! entry without fields and time (and without apiVersion for Apply), so two
//! Update entries of one manager at different versions or subresources stay
//! separate while Apply entries are one per manager and subresource.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::apply::fieldpath::{go_json_string, go_quote, Set};
use crate::apply::time::{format_time, parse_time};

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
pub(super) fn parse_id(id: &str) -> (String, String, String, String) {
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

/// A manager identifier with another apiVersion (identifiers are JSON).
pub(super) fn with_api_version(id: &str, api_version: &str) -> String {
    match serde_json::from_str::<Value>(id) {
        Ok(Value::Object(mut o)) if o.contains_key("apiVersion") => {
            o.insert("apiVersion".into(), Value::String(api_version.into()));
            Value::Object(o).to_string()
        }
        _ => id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

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
        // A custom resource's entry as kube-apiserver writes it: from a map, keys sorted.
        assert_eq!(
            serde_json::to_string(&out[1]).expect("json"),
            r#"{"apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:a":{}}},"manager":"a","operation":"Update","time":"2024-01-01T00:00:02Z"}"#
        );
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
