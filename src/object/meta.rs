//! ObjectMeta validation with kube's rules and messages.

use serde_json::Value;

use crate::status::{quote, FieldError, FieldErrorKind};

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_KEY_SLASHES_MSG: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const ANNOTATIONS_MAX: usize = 256 * 1024;

fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(is_dns_label)
}

/// Messages for a DNS-1123 subdomain (object names).
pub fn dns_subdomain_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if !is_dns_subdomain(s) {
        out.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    out
}

/// Messages for a DNS-1123 label (namespace names).
pub fn dns_label_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !is_dns_label(s) {
        if s.contains('.') {
            out.push("must not contain dots".to_string());
        }
        out.push(DNS1123_LABEL_MSG.to_string());
    }
    out
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Validates a label key (qualified name); `Err` carries kube's messages
/// joined with "; ", as its label selector parser reports them.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let errs = label_key_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// kube's `IsQualifiedName`: every message, prefix part before name part
/// (an empty or over-long name part also fails the pattern).
pub fn label_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns_subdomain_errors(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => return vec![LABEL_KEY_SLASHES_MSG.into()],
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 bytes".into());
    }
    if !is_qualified_name_part(name) {
        errs.push(QUALIFIED_NAME_MSG.into());
    }
    errs
}

pub fn validate_label_value(v: &str) -> Result<(), String> {
    let errs = label_value_errors(v);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

/// kube's `IsValidLabelValue`: every message.
pub fn label_value_errors(v: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if v.len() > 63 {
        errs.push("must be no more than 63 bytes".into());
    }
    if !v.is_empty() && !is_qualified_name_part(v) {
        errs.push(LABEL_VALUE_MSG.into());
    }
    errs
}

/// kube's warnings for one added finalizer name (`validateKubeFinalizerName`).
pub fn finalizer_name_warnings(name: &str) -> Vec<String> {
    let quoted = crate::apply::fieldpath::go_quote(name);
    let mut out: Vec<String> = label_key_errors(name)
        .into_iter()
        .map(|m| format!("metadata.finalizers: {quoted}: {m}"))
        .collect();
    let standard = ["orphan", "foregroundDeletion", "kubernetes"];
    if !name.contains('/') && !standard.contains(&name) {
        let advice = if name.contains('.') {
            "prefer a domain-qualified finalizer name including a path (/) to avoid accidental conflicts with other finalizer writers"
        } else {
            "prefer a domain-qualified finalizer name to avoid accidental conflicts with other finalizer writers"
        };
        out.push(format!("metadata.finalizers: {quoted}: {advice}"));
    }
    out
}

/// Path segment rules every name must meet (URL names included).
pub fn path_segment_errors(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    if name == "." || name == ".." {
        out.push(format!("may not be '{name}'"));
    }
    if name.contains('/') {
        out.push("may not contain '/'".into());
    }
    if name.contains('%') {
        out.push("may not contain '%'".into());
    }
    out
}

/// Validates `metadata` of an object about to be stored.
pub fn validate_object_meta(
    meta: &serde_json::Map<String, Value>,
    namespaced: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
    let generate = meta
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !generate.is_empty() {
        // kube's maskTrailingDash: a prefix may end in '-'.
        let masked = match generate.strip_suffix('-') {
            Some(_) if generate.len() > 1 => {
                // Not a char boundary: non-ASCII, which fails the pattern anyway.
                let mut m = generate
                    .get(..generate.len() - 2)
                    .unwrap_or(generate)
                    .to_string();
                m.push('a');
                m
            }
            _ => generate.to_string(),
        };
        for m in dns_subdomain_errors(&masked) {
            errs.push(FieldError::invalid("metadata.generateName", generate, m));
        }
    }
    if name.is_empty() {
        if generate.is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        }
    } else {
        for m in dns_subdomain_errors(name) {
            errs.push(FieldError::invalid("metadata.name", name, m));
        }
    }
    let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    if namespaced {
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for m in dns_label_errors(ns) {
                errs.push(FieldError::invalid("metadata.namespace", ns, m));
            }
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    match meta.get("labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(labels)) => {
            for (k, v) in labels {
                for m in label_key_errors(k) {
                    errs.push(FieldError::invalid("metadata.labels", k, m));
                }
                match v {
                    Value::String(v) => {
                        for m in label_value_errors(v) {
                            errs.push(FieldError::invalid("metadata.labels", v, m));
                        }
                    }
                    _ => errs.push(FieldError::new(
                        FieldErrorKind::TypeInvalid,
                        format!("metadata.labels.{k}"),
                        Some(v.to_string()),
                        "must be a string",
                    )),
                }
            }
        }
        Some(_) => errs.push(FieldError::new(
            FieldErrorKind::TypeInvalid,
            "metadata.labels",
            None,
            "must be a map of strings",
        )),
    }
    match meta.get("annotations") {
        None | Some(Value::Null) => {}
        Some(Value::Object(ann)) => {
            let mut total = 0usize;
            for (k, v) in ann {
                for m in label_key_errors(&k.to_lowercase()) {
                    errs.push(FieldError::invalid("metadata.annotations", k, m));
                }
                total += k.len() + v.as_str().map_or(0, str::len);
                if !v.is_string() {
                    errs.push(FieldError::new(
                        FieldErrorKind::TypeInvalid,
                        format!("metadata.annotations.{k}"),
                        Some(v.to_string()),
                        "must be a string",
                    ));
                }
            }
            if total > ANNOTATIONS_MAX {
                errs.push(FieldError::new(
                    FieldErrorKind::TooLong,
                    "metadata.annotations",
                    None,
                    format!("may not be more than {ANNOTATIONS_MAX} bytes"),
                ));
            }
        }
        Some(_) => errs.push(FieldError::new(
            FieldErrorKind::TypeInvalid,
            "metadata.annotations",
            None,
            "must be a map of strings",
        )),
    }
    if let Some(f) = meta.get("finalizers") {
        match f.as_array() {
            Some(list) => {
                let names: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
                // kube names the list, not the item, in each cause.
                for n in &names {
                    for m in label_key_errors(n) {
                        errs.push(FieldError::invalid("metadata.finalizers", n, m));
                    }
                }
                if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
                    errs.push(FieldError::new(
                        FieldErrorKind::Invalid,
                        "metadata.finalizers",
                        Some(serde_json::to_string(&names).unwrap_or_default()),
                        "finalizer orphan and foregroundDeletion cannot be both set",
                    ));
                }
            }
            None if f.is_null() => {}
            None => errs.push(FieldError::new(
                FieldErrorKind::TypeInvalid,
                "metadata.finalizers",
                None,
                "must be a list of strings",
            )),
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = Vec::new();
        for (i, r) in refs.iter().enumerate() {
            let path = format!("metadata.ownerReferences[{i}]");
            for field in ["apiVersion", "kind", "name", "uid"] {
                if r.get(field)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    errs.push(FieldError::required(
                        format!("{path}.{field}"),
                        "must not be empty",
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers.push(
                    r.get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                );
            }
        }
        if controllers.len() > 1 {
            errs.push(FieldError::new(
                FieldErrorKind::Invalid,
                "metadata.ownerReferences",
                Some(serde_json::to_string(refs).unwrap_or_default()),
                format!(
                    "Only one reference can have Controller set to true. Found \"true\" in references for {} and {}",
                    controllers[0], controllers[1]
                ),
            ));
        }
    }
    errs
}

/// Quoted-list rendering of finalizers as Go's `%#v` of a `[]string`.
pub fn go_string_slice(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// A random (version 4) UUID from the thread's CSPRNG: `Uuid::new_v4`
/// asks the kernel (a `getrandom` call) for every one, which showed in the
/// profile of creates, each of which takes two (uid and audit ID).
pub fn new_uid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random::<[u8; 16]>()).into_uuid()
}

#[cfg(test)]
mod tests {
    #[test]
    fn new_uids_are_random_version_4_uuids() {
        let (a, b) = (super::new_uid(), super::new_uid());
        assert_ne!(a, b);
        for u in [a, b] {
            assert_eq!(u.get_version(), Some(uuid::Version::Random));
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
        }
    }

    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn names_follow_dns_subdomain_rules() {
        assert!(
            validate_object_meta(&meta(json!({"name": "a.b-c", "namespace": "ns"})), true)
                .is_empty()
        );
        let errs =
            validate_object_meta(&meta(json!({"name": "Bad_Name", "namespace": "ns"})), true);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.name");
        assert!(errs[0]
            .body()
            .starts_with("Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"));
        let errs = validate_object_meta(&meta(json!({"namespace": "ns"})), true);
        assert_eq!(
            errs[0].to_string(),
            "metadata.name: Required value: name or generateName is required"
        );
        assert!(validate_object_meta(
            &meta(json!({"generateName": "w-", "namespace": "ns"})),
            true
        )
        .is_empty());
    }

    #[test]
    fn labels_and_annotations() {
        let errs = validate_object_meta(
            &meta(
                json!({"name": "a", "namespace": "ns", "labels": {"ok/k": "v", "bad key": "v", "k": "-bad"}}),
            ),
            true,
        );
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs.iter().all(|e| e.field == "metadata.labels"));
        let big = "x".repeat(ANNOTATIONS_MAX);
        let errs = validate_object_meta(
            &meta(json!({"name": "a", "namespace": "ns", "annotations": {"k": big}})),
            true,
        );
        assert_eq!(
            errs[0].to_string(),
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
    }

    #[test]
    fn scope_rules() {
        let errs = validate_object_meta(&meta(json!({"name": "a", "namespace": "ns"})), false);
        assert_eq!(
            errs[0].to_string(),
            "metadata.namespace: Forbidden: not allowed on this type"
        );
        let errs = validate_object_meta(&meta(json!({"name": "a", "namespace": "No.Dots"})), true);
        assert!(errs.iter().any(|e| e.detail == "must not contain dots"));
    }
}

/// The fields of kube's ObjectMeta (JSON names), in its declaration order.
pub const OBJECT_META_FIELDS: [&str; 15] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// The fields of an OwnerReference.
const OWNER_REFERENCE_FIELDS: [&str; 6] = [
    "apiVersion",
    "kind",
    "name",
    "uid",
    "controller",
    "blockOwnerDeletion",
];

/// Drops what kube's typed ObjectMeta has no field for (kube decodes a custom
/// resource's metadata into ObjectMeta, so unknown fields never reach
/// storage) and returns their paths, sorted as kube reports them
/// (`metadata.foo`, `metadata.ownerReferences[0].bar`).
pub fn drop_unknown_metadata(obj: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return dropped;
    };
    meta.retain(|k, _| {
        let known = OBJECT_META_FIELDS.contains(&k.as_str());
        if !known {
            dropped.push(format!("metadata.{k}"));
        }
        known
    });
    if let Some(refs) = meta
        .get_mut("ownerReferences")
        .and_then(Value::as_array_mut)
    {
        for (i, r) in refs.iter_mut().enumerate() {
            if let Some(r) = r.as_object_mut() {
                r.retain(|k, _| {
                    let known = OWNER_REFERENCE_FIELDS.contains(&k.as_str());
                    if !known {
                        dropped.push(format!("metadata.ownerReferences[{i}].{k}"));
                    }
                    known
                });
            }
        }
    }
    // kube decodes metadata into its ObjectMeta type, whose empty maps and
    // lists are left out when encoded: `labels: {}` or `finalizers: []` are
    // neither stored nor seen by the field manager.
    for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
        let empty = match meta.get(field) {
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Null) => true,
            _ => false,
        };
        if empty {
            meta.remove(field);
        }
    }
    dropped.sort();
    dropped
}

/// Numbers as kube-apiserver stores them: it decodes a JSON number as an
/// int64 when it can, else a float64, and Go writes a whole float64 without a
/// fraction, so `1e2` and `100.0` are stored as `100`. Whole floats in the
/// int64 range become integers here for the same result; `2.5` stays.
pub fn whole_numbers_as_integers(v: &mut Value) {
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64() {
                // Exactly representable and in range: -2^63 ≤ f < 2^63.
                if f.fract() == 0.0
                    && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f)
                    && !(f == 0.0 && f.is_sign_negative())
                {
                    *v = Value::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

#[cfg(test)]
mod number_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_floats_become_integers_as_in_kube() {
        let mut v: Value = serde_json::from_str(
            r#"{"a": 1e2, "b": 100.0, "c": 2.5, "d": [3.0, -4e0, 1e300], "e": 7, "f": -0.0}"#,
        )
        .expect("json");
        whole_numbers_as_integers(&mut v);
        assert_eq!(v["a"], json!(100));
        assert!(v["a"].is_i64() && v["b"].is_i64());
        assert_eq!(v["c"], json!(2.5));
        assert_eq!(v["d"][0], json!(3));
        assert_eq!(v["d"][1], json!(-4));
        assert!(v["d"][2].is_f64(), "out of int64 range stays a float");
        assert_eq!(v["e"], json!(7));
        assert_eq!(serde_json::to_string(&v["a"]).expect("json"), "100");
    }
}
