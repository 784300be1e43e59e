//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on an object's JSON.
//! Server-side apply is separate; strategic merge patch is refused upstream (415).

use serde_json::Value;

use crate::status::ApiError;

/// Most operations one JSON patch may hold (kube's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Most bytes `copy` operations of one patch may add in total; kube uses its
/// request body limit (3 MiB) as evanphx/json-patch's `AccumulatedCopySizeLimit`.
/// Without it, 100 copies that each double a value need 2¹⁰⁰ bytes.
pub const MAX_ACCUMULATED_COPY_BYTES: usize = 3 * 1024 * 1024;

fn invalid(message: String) -> ApiError {
    let mut err = ApiError::bad_request(message);
    err.code = 422;
    err.reason = "Invalid";
    err
}

/// The JSON size of a value, counted without building it.
fn json_size(v: &Value) -> usize {
    match v {
        Value::Null => 4,
        Value::Bool(b) => {
            if *b {
                4
            } else {
                5
            }
        }
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => s.len() + 2,
        Value::Array(a) => 2 + a.len().saturating_sub(1) + a.iter().map(json_size).sum::<usize>(),
        Value::Object(o) => {
            2 + o.len().saturating_sub(1)
                + o.iter()
                    .map(|(k, v)| k.len() + 3 + json_size(v))
                    .sum::<usize>()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().map(str::trim) {
            Some("application/json-patch+json") => Some(Self::Json),
            Some("application/merge-patch+json") => Some(Self::Merge),
            _ => None,
        }
    }
}

/// Applies `body` to `current`, returning the patched object.
pub fn apply(kind: PatchType, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match kind {
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "error decoding patch: merge patch must be a JSON object",
                ));
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchType::Json => {
            if body.iter().all(u8::is_ascii_whitespace) {
                // kube treats an empty JSON patch as a no-op.
                return Ok(doc);
            }
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if patch.0.len() > MAX_JSON_PATCH_OPERATIONS {
                let mut e = ApiError::bad_request(format!(
                    "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    patch.0.len()
                ));
                e.code = 413;
                e.reason = "RequestEntityTooLarge";
                return Err(e);
            }
            // One operation at a time, so what `copy` adds is counted before it
            // is allocated. `doc` is a copy: a failed patch leaves nothing behind.
            let mut copied = 0usize;
            for op in &patch.0 {
                if let json_patch::PatchOperation::Copy(c) = op {
                    let size = doc.pointer(c.from.as_str()).map_or(0, json_size);
                    copied = copied.saturating_add(size);
                    if copied > MAX_ACCUMULATED_COPY_BYTES {
                        return Err(invalid(format!(
                            "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_ACCUMULATED_COPY_BYTES}"
                        )));
                    }
                }
                json_patch::patch(&mut doc, std::slice::from_ref(op))
                    .map_err(|e| invalid(e.to_string()))?;
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_and_json_patch() {
        let cur = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"r": 1}});
        let m = apply(
            PatchType::Merge,
            &cur,
            br#"{"metadata":{"labels":{"x":null,"y":"2"}}}"#,
        )
        .expect("merge");
        assert_eq!(m["metadata"]["labels"], json!({"y": "2"}));
        let j = apply(PatchType::Json, &cur, br#"[{"op":"test","path":"/spec/r","value":1},{"op":"replace","path":"/spec/r","value":5}]"#).expect("json");
        assert_eq!(j["spec"]["r"], 5);
        let e = apply(
            PatchType::Json,
            &cur,
            br#"[{"op":"test","path":"/spec/r","value":2}]"#,
        )
        .expect_err("test op fails");
        assert_eq!(e.code, 422);
        assert_eq!(apply(PatchType::Json, &cur, b"").expect("empty"), cur);
        // Atomic: an operation that fails leaves the object as it was.
        let e = apply(
            PatchType::Json,
            &cur,
            br#"[{"op":"replace","path":"/spec/r","value":7},{"op":"remove","path":"/nope"}]"#,
        )
        .expect_err("second op fails");
        assert_eq!(e.code, 422);
        assert_eq!(
            apply(PatchType::Merge, &cur, b"[1]")
                .expect_err("not object")
                .code,
            400
        );
    }

    #[test]
    fn copies_that_double_a_value_stop_at_the_limit() {
        let cur = json!({"spec": {"a": "x".repeat(1024)}});
        let mut ops = vec![json!({"op": "add", "path": "/spec/b", "value": []})];
        for _ in 0..100 {
            // Each copy of /spec doubles it.
            ops.push(json!({"op": "copy", "from": "/spec", "path": "/spec/b/-"}));
        }
        let body = serde_json::to_vec(&ops).expect("json");
        let e = apply(PatchType::Json, &cur, &body).expect_err("refused");
        assert_eq!(e.code, 422);
        assert!(
            e.message.starts_with(
                "Unable to complete the copy, the accumulated size increase of copy is"
            ),
            "{}",
            e.message
        );
        // A few small copies are fine.
        let ok = apply(
            PatchType::Json,
            &cur,
            br#"[{"op":"copy","from":"/spec/a","path":"/spec/c"}]"#,
        )
        .expect("copy");
        assert_eq!(ok["spec"]["c"], ok["spec"]["a"]);
    }

    #[test]
    fn at_most_ten_thousand_operations() {
        let cur = json!({"spec": {}});
        let op = json!({"op": "test", "path": "/spec", "value": {}});
        let ops = vec![op; MAX_JSON_PATCH_OPERATIONS + 1];
        let e = apply(
            PatchType::Json,
            &cur,
            &serde_json::to_vec(&ops).expect("json"),
        )
        .expect_err("too many");
        assert_eq!((e.code, e.reason), (413, "RequestEntityTooLarge"));
        assert_eq!(
            e.message,
            "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
        let ops =
            vec![json!({"op": "test", "path": "/spec", "value": {}}); MAX_JSON_PATCH_OPERATIONS];
        assert!(apply(
            PatchType::Json,
            &cur,
            &serde_json::to_vec(&ops).expect("json")
        )
        .is_ok());
    }

    #[test]
    fn json_size_matches_serialization() {
        let v = json!({"a": [1, 2.5, null, true, false, "x\"y"], "b": {}, "c": []});
        // Escapes aside (counted once), the estimate is the compact encoding's length.
        let exact = serde_json::to_vec(&v).expect("json").len();
        assert!(
            json_size(&v) <= exact && exact - json_size(&v) <= 1,
            "{} vs {exact}",
            json_size(&v)
        );
    }
}
