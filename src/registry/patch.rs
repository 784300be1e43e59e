//! JSON patch (RFC 6902), JSON merge patch (RFC 7386) and, for the kinds
//! that are kube's built-in types, strategic merge patch (`strategic.rs`) on
//! an object's JSON. Server-side apply is separate; custom resources take no
//! strategic merge patch (415 upstream).

use serde_json::Value;

use crate::status::ApiError;
use crate::storage::{nesting_within, MAX_OBJECT_NESTING};

/// Most operations one JSON patch may hold (kube's `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Most bytes `copy` operations of one patch may add in total; kube uses its
/// request body limit (3 MiB) as evanphx/json-patch's `AccumulatedCopySizeLimit`.
/// Without it, 100 copies that each double a value need 2¹⁰⁰ bytes.
pub const MAX_ACCUMULATED_COPY_BYTES: usize = 3 * 1024 * 1024;

fn invalid(message: String) -> ApiError {
    let mut err = ApiError::bad_request(message);
    err.code = 422;
    err.reason = "Invalid".into();
    err
}

/// kube's answer when a JSON patch fails to apply (an unknown operation, a
/// path that does not exist, a failed `test`, the copy limit):
/// `NewGenericServerResponse(422, …)`, which keeps only a generic message.
/// The reason is logged for the operator.
fn rejected(reason: String) -> ApiError {
    tracing::debug!(%reason, "JSON patch refused");
    let mut e = invalid("the server rejected our request due to an error in our request".into());
    // NewGenericServerResponse always carries (empty) details.
    e.details = Some(Box::default());
    e
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

/// Refuses an operation that would put `value` at `path` nested deeper than
/// a stored object may be. Checked before each operation, the document never
/// gets deeper than that: copies into their own members could otherwise
/// double its depth each time, past what dropping or serializing it (both
/// recursive) can survive.
fn check_nesting(path: &json_patch::jsonptr::Pointer, value: &Value) -> Result<(), ApiError> {
    let room = MAX_OBJECT_NESTING.saturating_sub(path.count());
    if nesting_within(value, room).is_none() {
        return Err(invalid(format!(
            "the patched object would nest arrays and objects more than {MAX_OBJECT_NESTING} levels deep (at {path})"
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().map(str::trim) {
            Some("application/json-patch+json") => Some(Self::Json),
            Some("application/merge-patch+json") => Some(Self::Merge),
            Some("application/strategic-merge-patch+json") => Some(Self::Strategic),
            _ => None,
        }
    }
}

/// A patch that does not parse, in Go's words where they are known.
fn patch_error(e: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("error decoding patch: {}", go_json_error(&e)))
}

/// Go's `encoding/json` text for a syntax error: a truncated document is
/// "unexpected end of JSON input"; other syntax errors keep serde_json's
/// wording (a known difference, README).
pub fn go_json_error(e: &serde_json::Error) -> String {
    if e.is_eof() {
        "unexpected end of JSON input".to_string()
    } else {
        e.to_string()
    }
}

/// How Go's `encoding/json` names a JSON value's type in unmarshal errors.
pub fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Applies `body` to `current`, returning the patched object.
pub fn apply(kind: PatchType, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    apply_with(kind, current, body, None)
}

/// [`apply`] with the patch metadata a strategic merge patch follows
/// (`strategic.rs`; without it every list is replaced).
pub fn apply_with(
    kind: PatchType,
    current: &Value,
    body: &[u8],
    patch_meta: Option<&Value>,
) -> Result<Value, ApiError> {
    let mut doc = current.clone();
    match kind {
        PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(body).map_err(patch_error)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "error decoding patch: strategic merge patch must be a JSON object",
                ));
            }
            doc = super::strategic::apply(&doc, &patch, patch_meta)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            if nesting_within(&doc, MAX_OBJECT_NESTING).is_none() {
                return Err(invalid(format!(
                    "the patched object would nest arrays and objects more than {MAX_OBJECT_NESTING} levels deep"
                )));
            }
        }
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(body).map_err(patch_error)?;
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
            // Decoding only needs an array of objects (as evanphx/json-patch's
            // DecodePatch); what an operation means is checked as it applies.
            let ops: Vec<serde_json::Map<String, Value>> =
                serde_json::from_slice(body).map_err(|e| {
                    // Go's decoder names the JSON type that is not a list.
                    match serde_json::from_slice::<Value>(body) {
                        Ok(v) if !v.is_array() && !v.is_null() => ApiError::bad_request(format!(
                            "error decoding patch: json: cannot unmarshal {} into Go value of type []handlers.jsonPatchOp",
                            go_json_type(&v)
                        )),
                        _ => patch_error(e),
                    }
                })?;
            if ops.len() > MAX_JSON_PATCH_OPERATIONS {
                let mut e = ApiError::bad_request(format!(
                    "Request entity too large: The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    ops.len()
                ));
                e.code = 413;
                e.reason = "RequestEntityTooLarge".into();
                return Err(e);
            }
            // One operation at a time, so what `copy` adds is counted before it
            // is allocated. `doc` is a copy: a failed patch leaves nothing behind.
            let mut copied = 0usize;
            for op in ops {
                use json_patch::PatchOperation as Op;
                let op: Op = serde_json::from_value(Value::Object(op))
                    .map_err(|e| rejected(e.to_string()))?;
                match &op {
                    Op::Copy(c) => {
                        let from = doc.pointer(c.from.as_str());
                        let size = from.map_or(0, json_size);
                        copied = copied.saturating_add(size);
                        if copied > MAX_ACCUMULATED_COPY_BYTES {
                            return Err(rejected(format!(
                                "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_ACCUMULATED_COPY_BYTES}"
                            )));
                        }
                        if let Some(v) = from {
                            check_nesting(&c.path, v)?;
                        }
                    }
                    Op::Add(a) => check_nesting(&a.path, &a.value)?,
                    Op::Replace(r) => check_nesting(&r.path, &r.value)?,
                    // A move no deeper than its source cannot deepen the object;
                    // only deeper moves need the (possibly large) value walked.
                    Op::Move(m) if m.path.count() > m.from.count() => {
                        if let Some(v) = doc.pointer(m.from.as_str()) {
                            check_nesting(&m.path, v)?;
                        }
                    }
                    _ => {}
                }
                json_patch::patch(&mut doc, std::slice::from_ref(&op))
                    .map_err(|e| rejected(e.to_string()))?;
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
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
        assert_eq!(
            e.message,
            "the server rejected our request due to an error in our request"
        );
        // The limit itself, without growth in depth: copies of a 1 KiB value
        // pass while they add under 3 MiB in total and fail beyond it.
        let copies = |n: usize| {
            let ops: Vec<Value> = (0..n)
                .map(|i| json!({"op": "copy", "from": "/spec/a", "path": format!("/spec/c{i}")}))
                .collect();
            apply(
                PatchType::Json,
                &cur,
                &serde_json::to_vec(&ops).expect("json"),
            )
        };
        assert!(copies(2_900).is_ok(), "2.9 MiB of copies");
        assert_eq!(copies(3_100).map(|_| ()).map_err(|e| e.code), Err(422));
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
        assert_eq!((e.code, e.reason.as_ref()), (413, "RequestEntityTooLarge"));
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

    /// Whether a patch result could be stored: under 4 MiB, and JSON that
    /// kshard can read back (the store decodes with serde_json's limits).
    fn storable(v: &Value) -> Result<(), String> {
        let bytes = serde_json::to_vec(v).map_err(|e| e.to_string())?;
        if bytes.len() > 4 << 20 {
            return Err(format!("{} bytes", bytes.len()));
        }
        serde_json::from_slice::<Value>(&bytes)
            .map(drop)
            .map_err(|e| format!("unreadable: {e}"))
    }

    fn current() -> Value {
        json!({
            "apiVersion": "g/v1", "kind": "W",
            "metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"a": "x", "b": [1, 2, {"c": null}], "n": 1.5}
        })
    }

    const PATHS: &[&str] = &[
        "",
        "/",
        "/spec",
        "/spec/a",
        "/spec/b",
        "/spec/b/-",
        "/spec/b/0",
        "/spec/b/2/c",
        "/spec/b/99999999999999999999",
        "/spec/b/-1",
        "/spec/b/01",
        "/spec/x/y",
        "/metadata",
        "/metadata/labels/x",
        "/a~1b",
        "/spec/a/a",
        "/-",
        "/spec/c",
        "/spec/c/c",
        "/spec/c/c/c",
        "/spec/b/2/c/c",
    ];

    /// Pointers that do not parse: one fails the whole patch, so they are rare.
    const BAD_PATHS: &[&str] = &["spec", "/~2", "/~", "/a~"];

    /// One operation, mostly ones that can succeed (one failing operation
    /// fails the whole patch): adds and copies, also into their own source.
    fn op() -> impl Strategy<Value = Value> {
        let path = || {
            prop_oneof![
                40 => prop::sample::select(PATHS),
                1 => prop::sample::select(BAD_PATHS),
            ]
        };
        let value = prop_oneof![
            3 => Just(json!({"a": [1, 2, 3], "b": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"})),
            3 => crate::fuzz::json_value(),
            2 => (115..126usize).prop_map(|n| crate::fuzz::deep_value(n, true)),
        ];
        let kind = prop_oneof![
            4 => Just("add"),
            4 => Just("copy"),
            2 => Just("move"),
            2 => Just("replace"),
            1 => Just("remove"),
            1 => Just("test"),
        ];
        (kind, path(), path(), value).prop_map(|(op, path, from, value)| match op {
            "copy" | "move" => json!({"op": op, "from": from, "path": path}),
            "remove" => json!({"op": op, "path": path}),
            _ => json!({"op": op, "path": path, "value": value}),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any body, as JSON patch or merge patch: an error or a storable object.
        #[test]
        fn prop_patch_arbitrary_body_never_panics(
            json in any::<bool>(),
            body in crate::fuzz::body_bytes(),
        ) {
            let kind = if json { PatchType::Json } else { PatchType::Merge };
            if let Ok(v) = apply(kind, &current(), &body) {
                prop_assert_eq!(storable(&v), Ok(()));
            }
        }

    }

    proptest! {
        // Fewer cases: documents grow to megabytes here.
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Generated JSON patches, heavy on `copy` and `add`: an error or a
        /// storable object, never unbounded growth.
        #[test]
        fn prop_json_patch_ops_stay_bounded(
            ops in prop::collection::vec(op(), 1..24),
            doubling in prop_oneof![15 => Just(0usize), 1 => 0..40usize],
        ) {
            // As generated: most fail at some operation, which is an error.
            let body = serde_json::to_vec(&ops).unwrap_or_default();
            if let Ok(v) = apply(PatchType::Json, &current(), &body) {
                prop_assert_eq!(storable(&v), Ok(()));
            }
            // Only the operations that apply one after another, so the whole
            // patch gets far: this is where depth and size build up.
            let mut kept = Vec::new();
            let mut doc = current();
            for op in ops {
                let one = serde_json::to_vec(&[&op]).unwrap_or_default();
                if let Ok(next) = apply(PatchType::Json, &doc, &one) {
                    doc = next;
                    kept.push(op);
                }
            }
            // Copies that each double the document: only the copy limit stops them.
            for _ in 0..doubling {
                kept.push(json!({"op": "copy", "from": "/spec", "path": "/spec/b/-"}));
            }
            let body = serde_json::to_vec(&kept).unwrap_or_default();
            if let Ok(v) = apply(PatchType::Json, &current(), &body) {
                prop_assert_eq!(storable(&v), Ok(()));
            }
            let ops = kept;
            let merge = serde_json::to_vec(&json!({"spec": ops})).unwrap_or_default();
            if let Ok(v) = apply(PatchType::Merge, &current(), &merge) {
                prop_assert_eq!(storable(&v), Ok(()));
            }
        }
    }

    /// Regression: JSON patches could nest the object deeper than serde_json
    /// reads back (then stored, it was unreadable) and, by copying a chain
    /// into itself, deep enough to overflow the stack.
    #[test]
    fn json_patch_may_not_nest_deeper_than_a_body() {
        let deep = crate::fuzz::deep_value(125, true);
        let add = |path: &str| {
            let body = json!([{"op": "add", "path": path, "value": deep}]);
            apply(
                PatchType::Json,
                &current(),
                &serde_json::to_vec(&body).expect("json"),
            )
        };
        // Two levels above it: 127 in all, readable.
        assert_eq!(storable(&add("/spec/deep").expect("at the limit")), Ok(()));
        let e = add("/spec/b/2/c").expect_err("too deep");
        assert_eq!(e.code, 422);
        // `move` builds depth without any deep value in the patch.
        let mut ops = vec![json!({"op": "add", "path": "/d", "value": {}})];
        for _ in 0..200 {
            ops.push(json!({"op": "add", "path": "/t", "value": {}}));
            ops.push(json!({"op": "move", "from": "/d", "path": "/t/d"}));
            ops.push(json!({"op": "move", "from": "/t", "path": "/d"}));
        }
        let body = serde_json::to_vec(&ops).expect("json");
        let e = apply(PatchType::Json, &current(), &body).expect_err("too deep");
        assert_eq!(e.code, 422);
        // Copies of a chain into its own deepest member double its depth: 12
        // of them (a 490 kB body) reached 245,760 levels and overflowed the
        // stack, aborting the process.
        let mut ops =
            vec![json!({"op": "add", "path": "/c", "value": crate::fuzz::deep_value(60, false)})];
        let mut depth = 60;
        for _ in 0..12 {
            ops.push(
                json!({"op": "copy", "from": "/c", "path": format!("/c{}", "/a".repeat(depth))}),
            );
            depth *= 2;
        }
        let body = serde_json::to_vec(&ops).expect("json");
        let e = apply(PatchType::Json, &current(), &body).expect_err("too deep");
        assert_eq!(e.code, 422);
    }
}
