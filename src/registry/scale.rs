//! The scale subresource: an `autoscaling/v1` Scale view of the paths the CRD names.

use serde_json::{json, Value};

use super::jsonpath::JsonPath;
use crate::apiextensions::catalog::ScaleSpec;
use crate::status::{ApiError, FieldError};

fn pointer_of(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |mut acc, seg| {
            acc.push('/');
            acc.push_str(seg);
            acc
        })
}

/// The Scale of an object.
pub fn to_scale(spec: &ScaleSpec, obj: &Value) -> Value {
    let read = |p: &str| {
        JsonPath::parse(p)
            .ok()
            .and_then(|jp| jp.first(obj).and_then(Value::as_i64))
            .unwrap_or(0)
    };
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let mut m = serde_json::Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(f) {
            m.insert(f.into(), v.clone());
        }
    }
    let mut status = json!({"replicas": read(&spec.status_replicas_path)});
    if let Some(sel) = spec
        .label_selector_path
        .as_deref()
        .and_then(|p| JsonPath::parse(p).ok())
        .and_then(|jp| jp.first(obj).and_then(Value::as_str).map(str::to_string))
    {
        status["selector"] = json!(sel);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": m,
        "spec": {"replicas": read(&spec.spec_replicas_path)},
        "status": status,
    })
}

/// An applied Scale as the main resource's apply configuration: only the
/// replicas, at the CRD's `specReplicasPath` (kube's scale handler maps the
/// Scale's managed fields onto that path of the parent).
pub fn scale_as_apply_config(
    spec: &ScaleSpec,
    scale: &Value,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let is_scale = scale.get("kind").and_then(Value::as_str) == Some("Scale")
        && scale.get("apiVersion").and_then(Value::as_str) == Some("autoscaling/v1");
    if !is_scale {
        return Err(ApiError::bad_request(format!(
            "invalid object type: {}, Kind={}",
            scale
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or(""),
            scale.get("kind").and_then(Value::as_str).unwrap_or("")
        )));
    }
    let mut config = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
    if let Some(replicas) = scale.pointer("/spec/replicas") {
        let pointer = pointer_of(&spec.spec_replicas_path);
        let mut cur = &mut config;
        let segs: Vec<&str> = pointer.split('/').filter(|s| !s.is_empty()).collect();
        for (i, seg) in segs.iter().enumerate() {
            let Some(obj) = cur.as_object_mut() else {
                break;
            };
            if i + 1 == segs.len() {
                obj.insert((*seg).to_string(), replicas.clone());
                break;
            }
            cur = obj.entry((*seg).to_string()).or_insert_with(|| json!({}));
        }
    }
    Ok(config)
}

/// Writes a Scale's desired replicas into the object.
pub fn apply_scale(
    spec: &ScaleSpec,
    obj: &Value,
    scale: &Value,
    kind: &str,
    group: &str,
) -> Result<Value, ApiError> {
    if scale
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "Scale")
    {
        return Err(ApiError::bad_request(format!(
            "wrong object passed to Scale update: {scale}"
        )));
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let replicas = scale.pointer("/spec/replicas").cloned().unwrap_or(json!(0));
    let Some(n) = replicas.as_i64() else {
        return Err(ApiError::invalid(
            group,
            kind,
            name,
            &[FieldError::new(
                crate::status::FieldErrorKind::TypeInvalid,
                spec.spec_replicas_path.trim_start_matches('.'),
                Some(replicas.to_string()),
                "must be an integer",
            )],
        ));
    };
    // A negative count goes into the object: its validation reports both
    // the schema's bound and the scale paths' check, as kube's does.
    let mut out = obj.clone();
    let pointer = pointer_of(&spec.spec_replicas_path);
    let (parent, leaf) = pointer.rsplit_once('/').unwrap_or(("", &pointer));
    let mut cur = &mut out;
    for seg in parent.split('/').filter(|s| !s.is_empty()) {
        if !cur.get(seg).is_some_and(Value::is_object) {
            cur[seg] = json!({});
        }
        cur = &mut cur[seg];
    }
    cur[leaf] = json!(n);
    if let Some(rv) = scale
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        out["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok(out)
}

/// kube's checks of the replica counts and selector a CRD's scale paths
/// point at, on every write (`ValidateScaleSpec`/`ValidateScaleStatus` of the
/// CR validator; a `/status` write skips the spec). Field paths keep the
/// CRD's leading dot, as kube's `field.NewPath(scale.SpecReplicasPath)` does.
pub fn validate(spec: &ScaleSpec, obj: &Value, check_spec: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if check_spec {
        replicas_errors(&spec.spec_replicas_path, obj, &mut errs);
    }
    replicas_errors(&spec.status_replicas_path, obj, &mut errs);
    if let Some(path) = &spec.label_selector_path {
        if let Err(e) = nested(path, obj, "string", |v| v.is_string()) {
            errs.push(FieldError::new(
                crate::status::FieldErrorKind::Invalid,
                path.clone(),
                Some("\"\"".into()),
                e,
            ));
        }
    }
    errs
}

fn replicas_errors(path: &str, obj: &Value, errs: &mut Vec<FieldError>) {
    let invalid = |value: i64, detail: String| {
        FieldError::new(
            crate::status::FieldErrorKind::Invalid,
            path,
            Some(value.to_string()),
            detail,
        )
    };
    // Unstructured JSON holds int64 for integral numbers that fit, else float64.
    match nested(path, obj, "int64", |v| v.is_i64()) {
        Err(e) => errs.push(invalid(0, e)),
        Ok(Some(v)) => {
            let n = v.as_i64().unwrap_or(0);
            if n < 0 {
                errs.push(invalid(n, "should be a non-negative integer".into()));
            } else if n > i64::from(i32::MAX) {
                errs.push(invalid(
                    n,
                    format!("should be less than or equal to {}", i32::MAX),
                ));
            }
        }
        Ok(None) => {}
    }
}

/// `unstructured.NestedFieldNoCopy` plus the type check of `NestedInt64` /
/// `NestedString`, with their error texts.
fn nested<'a>(
    path: &str,
    obj: &'a Value,
    want: &str,
    is_want: impl Fn(&Value) -> bool,
) -> Result<Option<&'a Value>, String> {
    let fields: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    let mut cur = obj;
    for (i, f) in fields.iter().enumerate() {
        match cur {
            // A null on the way means "not found", as in kube.
            Value::Null => return Ok(None),
            Value::Object(m) => match m.get(*f) {
                Some(v) => cur = v,
                None => return Ok(None),
            },
            other => {
                return Err(format!(
                    ".{} accessor error: {} is of the type {}, expected map[string]interface{{}}",
                    fields[..=i].join("."),
                    go_v(other),
                    go_type(other)
                ))
            }
        }
    }
    if is_want(cur) {
        Ok(Some(cur))
    } else {
        Err(format!(
            ".{} accessor error: {} is of the type {}, expected {want}",
            fields.join("."),
            go_v(cur),
            go_type(cur)
        ))
    }
}

/// Go's `%T` of an unstructured value.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Go's `%v` of an unstructured value.
fn go_v(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => crate::schema::render::go_number(n),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_v).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", go_v(&m[k.as_str()])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_round_trip() {
        let spec = ScaleSpec {
            spec_replicas_path: ".spec.replicas".into(),
            status_replicas_path: ".status.replicas".into(),
            label_selector_path: Some(".status.selector".into()),
        };
        let obj = json!({"metadata": {"name": "a", "namespace": "n", "resourceVersion": "4", "labels": {"x": "y"}},
            "spec": {"replicas": 2}, "status": {"replicas": 1, "selector": "app=a"}});
        let s = to_scale(&spec, &obj);
        assert_eq!(s["spec"]["replicas"], 2);
        assert_eq!(s["status"], json!({"replicas": 1, "selector": "app=a"}));
        assert!(s["metadata"].get("labels").is_none());
        let new =
            apply_scale(&spec, &obj, &json!({"spec": {"replicas": 5}}), "W", "g").expect("apply");
        assert_eq!(new["spec"]["replicas"], 5);
        // A negative count goes into the object; its validation refuses it
        // (the schema's bound and the scale check together, as kube).
        let new = apply_scale(&spec, &obj, &json!({"spec": {"replicas": -1}}), "W", "g")
            .expect("negative is carried");
        assert_eq!(new["spec"]["replicas"], -1);
        assert!(!validate(&spec, &new, true).is_empty());
    }
}
