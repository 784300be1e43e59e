//! JSON patch (RFC 6902) and JSON merge patch (RFC 7386) on an object's JSON.
//! Server-side apply is separate; strategic merge patch is refused upstream (415).

use serde_json::Value;

use crate::status::ApiError;

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
            json_patch::patch(&mut doc, &patch).map_err(|e| {
                let mut err = ApiError::bad_request(e.to_string());
                err.code = 422;
                err.reason = "Invalid";
                err
            })?;
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
        assert_eq!(
            apply(PatchType::Merge, &cur, b"[1]")
                .expect_err("not object")
                .code,
            400
        );
    }
}
