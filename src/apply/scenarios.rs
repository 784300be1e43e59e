// A test table (a test-only module): long because it lists scenarios, not logic; nothing to split.
//! Table-driven apply scenarios: shared CRD schemas, a list of operations per
//! scenario (Apply / Update, main resource or `/status`, any served version),
//! and for every step the exact object and managedFields kube-apiserver
//! produces, or the exact conflict. Derived from the behaviour of
//! structured-merge-diff's merge tests and kube's apply integration tests.

use serde_json::{json, Map, Value};

use super::*;

const V1: &str = "demo.kshard.dev/v1";
const V1B1: &str = "demo.kshard.dev/v1beta1";
const KIND: &str = "Widget";

// ------------------------------------------------------------------ schemas

#[derive(Clone, Copy, Debug)]
enum Sch {
    /// Struct fields, nested structs; a status subresource with conditions.
    Widget,
    /// Atomic, set and map lists (single and multiple keys, nested).
    Lists,
    /// Granular, atomic and nested maps; preserve-unknown subtrees.
    Maps,
    /// No schema at all: everything deduced.
    Deduced,
}

impl Sch {
    fn status_subresource(self) -> bool {
        matches!(self, Sch::Widget)
    }

    fn openapi(self) -> Option<Value> {
        let s = json!({"type": "string"});
        let i = json!({"type": "integer"});
        match self {
            Sch::Widget => Some(json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "replicas": i, "a": s, "b": s, "c": s,
                    "nested": {"type": "object", "properties": {
                        "x": s, "y": s,
                        "inner": {"type": "object", "properties": {"z": s}}}}}},
                "status": {"type": "object", "properties": {
                    "ready": i, "phase": s,
                    "conditions": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                        "items": {"type": "object", "properties": {
                            "type": s, "status": s, "reason": s}}}}}}})),
            Sch::Lists => Some(json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "args": {"type": "array", "items": s},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": s},
                    "nums": {"type": "array", "x-kubernetes-list-type": "set", "items": i},
                    "containers": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": s, "image": s,
                            "env": {"type": "array", "x-kubernetes-list-type": "set", "items": s},
                            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                                "items": {"type": "object", "properties": {
                                    "containerPort": i,
                                    "protocol": {"type": "string", "default": "TCP"},
                                    "hostPort": i}}}}}},
                    "groups": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {
                            "name": s,
                            "value": {"type": "array", "x-kubernetes-list-type": "set", "items": s}}}}}}}})),
            Sch::Maps => Some(json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "labels": {"type": "object", "additionalProperties": s},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "additionalProperties": s},
                    "target": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "properties": {"kind": s, "name": s}},
                    "mapOfMaps": {"type": "object", "additionalProperties": {
                        "type": "object", "additionalProperties": s}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"known": s}}}}}})),
            Sch::Deduced => None,
        }
    }
}

// --------------------------------------------------------------- table rows

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Apply,
    Update,
}

/// One request. `body` is the applied configuration (Apply) or, for Update,
/// the top-level fields the client changes: `spec`/`status` replace the live
/// ones (`null` deletes), `metadata` keys are merged into the live metadata.
#[derive(Clone, Debug)]
struct Op {
    kind: Kind,
    manager: &'static str,
    version: &'static str,
    status: bool,
    force: bool,
    body: Value,
}

/// One expected managedFields entry; `time` says whether it carries a time.
#[derive(Clone, Debug)]
struct Mf {
    manager: &'static str,
    operation: &'static str,
    version: &'static str,
    subresource: &'static str,
    time: bool,
    fields: &'static str,
}

#[derive(Clone, Debug)]
enum Want {
    /// The stored object without identity metadata (apiVersion is checked
    /// against the request version) and its exact managedFields.
    Ok(Value, Vec<Mf>),
    /// 409: message and (field, cause message) pairs.
    Conflict(&'static str, Vec<(&'static str, &'static str)>),
    /// Another error: status code and message.
    Error(u16, &'static str),
}

#[derive(Clone, Debug)]
struct Step {
    op: Op,
    want: Want,
}

struct Scenario {
    name: &'static str,
    schema: Sch,
    steps: Vec<Step>,
}

fn apply(manager: &'static str, body: Value) -> Op {
    Op {
        kind: Kind::Apply,
        manager,
        version: V1,
        status: false,
        force: false,
        body,
    }
}

fn update(manager: &'static str, body: Value) -> Op {
    Op {
        kind: Kind::Update,
        ..apply(manager, body)
    }
}

impl Op {
    fn at(mut self, version: &'static str) -> Op {
        self.version = version;
        self
    }
    fn force(mut self) -> Op {
        self.force = true;
        self
    }
    fn status(mut self) -> Op {
        self.status = true;
        self
    }
    fn ok(self, object: Value, managed: Vec<Mf>) -> Step {
        Step {
            op: self,
            want: Want::Ok(object, managed),
        }
    }
    fn conflict(self, message: &'static str, causes: Vec<(&'static str, &'static str)>) -> Step {
        Step {
            op: self,
            want: Want::Conflict(message, causes),
        }
    }
    fn err(self, code: u16, message: &'static str) -> Step {
        Step {
            op: self,
            want: Want::Error(code, message),
        }
    }
}

/// An Apply entry at v1 on the main resource.
fn a(manager: &'static str, fields: &'static str) -> Mf {
    Mf {
        manager,
        operation: "Apply",
        version: V1,
        subresource: "",
        time: true,
        fields,
    }
}

/// An Update entry at v1 on the main resource.
fn u(manager: &'static str, fields: &'static str) -> Mf {
    Mf {
        operation: "Update",
        ..a(manager, fields)
    }
}

impl Mf {
    fn at(mut self, version: &'static str) -> Mf {
        self.version = version;
        self
    }
    fn status(mut self) -> Mf {
        self.subresource = "status";
        self
    }
    fn no_time(mut self) -> Mf {
        self.time = false;
        self
    }
}

fn spec(v: Value) -> Value {
    json!({ "spec": v })
}

fn sc(name: &'static str, schema: Sch, steps: Vec<Step>) -> Scenario {
    Scenario {
        name,
        schema,
        steps,
    }
}

// ------------------------------------------------------------------ harness

fn time_of(step: usize) -> String {
    format!("2024-05-01T10:{:02}:{:02}Z", step / 60, step % 60)
}

fn full_config(op: &Op) -> Value {
    let mut obj = json!({"apiVersion": op.version, "kind": KIND,
        "metadata": {"name": "w", "namespace": "default"}});
    if let Value::Object(body) = &op.body {
        for (k, v) in body {
            if k == "metadata" {
                if let (Some(meta), Value::Object(extra)) = (obj["metadata"].as_object_mut(), v) {
                    for (mk, mv) in extra {
                        meta.insert(mk.clone(), mv.clone());
                    }
                }
            } else {
                obj[k.as_str()] = v.clone();
            }
        }
    }
    obj
}

fn updated_object(live: Option<&Value>, op: &Op) -> Value {
    let mut obj = match live {
        Some(l) => l.clone(),
        None => json!({"metadata": {"name": "w", "namespace": "default"}}),
    };
    obj["apiVersion"] = json!(op.version);
    obj["kind"] = json!(KIND);
    if let (Some(root), Value::Object(body)) = (obj.as_object_mut(), &op.body) {
        for (k, v) in body {
            if k == "metadata" {
                if let (Some(meta), Value::Object(extra)) =
                    (root.get_mut("metadata").and_then(Value::as_object_mut), v)
                {
                    for (mk, mv) in extra {
                        if mv.is_null() {
                            meta.remove(mk);
                        } else {
                            meta.insert(mk.clone(), mv.clone());
                        }
                    }
                }
            } else if v.is_null() {
                root.remove(k);
            } else {
                root.insert(k.clone(), v.clone());
            }
        }
    }
    obj
}

fn copy_field(to: &mut Value, from: &Value, key: &str) {
    let Some(root) = to.as_object_mut() else {
        return;
    };
    match from.get(key) {
        Some(v) => root.insert(key.into(), v.clone()),
        None => root.remove(key),
    };
}

/// What the CRD strategy does after the field manager: create drops status
/// (with the subresource on), main-resource updates keep the live status,
/// status updates keep everything of the live object but status and
/// managedFields. Then the object is stored.
fn strategy(live: Option<&Value>, mut obj: Value, status_on: bool, status_req: bool) -> Value {
    match live {
        None => {
            if status_on {
                if let Some(root) = obj.as_object_mut() {
                    root.remove("status");
                }
            }
            obj["metadata"]["uid"] = json!("uid-1");
        }
        Some(l) if status_req => {
            let mut kept = l.clone();
            copy_field(&mut kept, &obj, "status");
            kept["apiVersion"] = obj["apiVersion"].clone();
            let mf = obj["metadata"].get("managedFields").cloned();
            if let Some(meta) = kept["metadata"].as_object_mut() {
                match mf {
                    Some(mf) => meta.insert("managedFields".into(), mf),
                    None => meta.remove("managedFields"),
                };
            }
            obj = kept;
        }
        Some(l) if status_on => copy_field(&mut obj, l, "status"),
        Some(_) => {}
    }
    obj
}

fn visible(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(root) = out.as_object_mut() {
        root.remove("apiVersion");
        root.remove("kind");
        let empty = match root.get_mut("metadata").and_then(Value::as_object_mut) {
            Some(meta) => {
                for k in ["name", "namespace", "uid", "managedFields"] {
                    meta.remove(k);
                }
                meta.is_empty()
            }
            None => false,
        };
        if empty {
            root.remove("metadata");
        }
    }
    out
}

fn check_managed(obj: &Value, want: &[Mf]) -> Result<(), String> {
    let got: &[Value] = match obj["metadata"].get("managedFields") {
        None => &[],
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("managedFields is not a list: {other}")),
    };
    let render = |e: &Value| {
        let had_time = e.get("time").is_some();
        let rest: Map<String, Value> = e
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k != "time")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        format!("{} time={had_time}", Value::Object(rest))
    };
    let got_text: Vec<String> = got.iter().map(render).collect();
    let want_text: Vec<String> = want
        .iter()
        .map(|w| {
            let mut m = Map::new();
            m.insert("manager".into(), json!(w.manager));
            m.insert("operation".into(), json!(w.operation));
            m.insert("apiVersion".into(), json!(w.version));
            m.insert("fieldsType".into(), json!("FieldsV1"));
            let fields: Value = serde_json::from_str(w.fields).unwrap_or(Value::Null);
            m.insert("fieldsV1".into(), fields);
            if !w.subresource.is_empty() {
                m.insert("subresource".into(), json!(w.subresource));
            }
            format!("{} time={}", Value::Object(m), w.time)
        })
        .collect();
    if got_text != want_text {
        return Err(format!(
            "managedFields differ\n  got:\n    {}\n  want:\n    {}",
            got_text.join("\n    "),
            want_text.join("\n    ")
        ));
    }
    Ok(())
}

fn run_step(
    schema: &MergeSchema,
    status_on: bool,
    live: Option<&Value>,
    op: &Op,
    now: &str,
) -> Result<Value, ApplyError> {
    let sub = op.status.then_some("status");
    let fm = FieldManager::new(schema, op.version, sub, status_on);
    let obj = match op.kind {
        Kind::Apply => fm.apply(live, &full_config(op), op.manager, op.force, now)?,
        Kind::Update => {
            let mut new = updated_object(live, op);
            fm.update(live, &mut new, op.manager, now)?;
            new
        }
    };
    Ok(strategy(live, obj, status_on, op.status))
}

fn run(sc: &Scenario) -> Result<(), String> {
    let schema = MergeSchema::from_openapi(sc.schema.openapi().as_ref());
    let status_on = sc.schema.status_subresource();
    let mut live: Option<Value> = None;
    for (i, step) in sc.steps.iter().enumerate() {
        let fail = |msg: String| {
            Err(format!(
                "step {i} ({:?} by {}): {msg}",
                step.op.kind, step.op.manager
            ))
        };
        let got = run_step(&schema, status_on, live.as_ref(), &step.op, &time_of(i));
        match (&step.want, got) {
            (Want::Ok(object, managed), Ok(obj)) => {
                if obj["apiVersion"] != json!(step.op.version) {
                    return fail(format!("apiVersion {}", obj["apiVersion"]));
                }
                let vis = visible(&obj);
                // JSON equality: list order matters, map key order does not.
                if vis != *object {
                    return fail(format!("object differs\n  got:  {vis}\n  want: {object}"));
                }
                if let Err(e) = check_managed(&obj, managed) {
                    return fail(e);
                }
                live = Some(obj);
            }
            (Want::Conflict(message, causes), Err(ApplyError::Conflicts(cs))) => {
                let err = ApplyError::Conflicts(cs.clone());
                if err.status_code() != 409 || err.to_string() != *message {
                    return fail(format!(
                        "conflict message\n  got:  {err}\n  want: {message}"
                    ));
                }
                let got: Vec<(String, String)> = cs
                    .iter()
                    .map(|c| (c.field.clone(), c.cause_message()))
                    .collect();
                let want: Vec<(String, String)> = causes
                    .iter()
                    .map(|(f, m)| (f.to_string(), m.to_string()))
                    .collect();
                if got != want {
                    return fail(format!("causes\n  got:  {got:?}\n  want: {want:?}"));
                }
            }
            (Want::Error(code, message), Err(e)) => {
                if e.status_code() != *code || e.to_string() != *message {
                    return fail(format!(
                        "error {} {e}, want {code} {message}",
                        e.status_code()
                    ));
                }
            }
            (want, got) => return fail(format!("want {want:?}, got {got:?}")),
        }
    }
    Ok(())
}

#[test]
fn apply_scenarios() {
    let all = scenarios();
    assert!(all.len() >= 60, "only {} scenarios", all.len());
    let mut names = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for sc in &all {
        assert!(names.insert(sc.name), "duplicate scenario {}", sc.name);
        if let Err(e) = run(sc) {
            failures.push(format!("{}: {e}", sc.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------- scenarios

const CONFLICTS_WITH_M1: &str = r#"conflict with "m1""#;

fn scenarios() -> Vec<Scenario> {
    let mut all = widget_scenarios();
    all.extend(edge_scenarios());
    all.push(cap_scenario());
    all.extend(status_scenarios());
    all.extend(tracking_scenarios());
    all.extend(list_scenarios());
    all.extend(map_scenarios());
    all
}

fn widget_scenarios() -> Vec<Scenario> {
    use Sch::Widget as W;
    vec![
        sc("create_on_apply", W, vec![
            apply("m1", spec(json!({"replicas": 1, "a": "x"})))
                .ok(spec(json!({"replicas": 1, "a": "x"})),
                    vec![a("m1", r#"{"f:spec":{"f:a":{},"f:replicas":{}}}"#)]),
        ]),
        sc("apply_twice_changes_value", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "z", "b": "y"})))
                .ok(spec(json!({"a": "z", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
        ]),
        sc("dropped_field_owned_by_nobody_else_is_removed", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y", "replicas": 3})))
                .ok(spec(json!({"a": "x", "b": "y", "replicas": 3})),
                    vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{},"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
        ]),
        sc("dropped_field_co_owned_by_applier_is_kept", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            apply("m2", spec(json!({"b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    a("m2", r#"{"f:spec":{"f:b":{}}}"#).no_time(),
                    a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    a("m2", r#"{"f:spec":{"f:b":{}}}"#).no_time(),
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            // The last owner drops it too: now it goes.
            apply("m2", spec(json!({"c": "z"})))
                .ok(spec(json!({"a": "x", "c": "z"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    a("m2", r#"{"f:spec":{"f:c":{}}}"#)]),
        ]),
        sc("dropped_field_co_owned_by_updater_is_kept", W, vec![
            update("ctl", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})),
                    vec![u("ctl", r#"{"f:spec":{".":{},"f:a":{},"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#).no_time(),
                    u("ctl", r#"{"f:spec":{".":{},"f:a":{},"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#).no_time(),
                    u("ctl", r#"{"f:spec":{".":{},"f:a":{},"f:b":{}}}"#)]),
        ]),
        sc("apply_vs_apply_conflict", W, vec![
            apply("m1", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"replicas": 2, "a": "x"})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.replicas"#,
                    vec![(".spec.replicas", CONFLICTS_WITH_M1)]),
        ]),
        sc("force_takes_a_field_from_another_applier", W, vec![
            apply("m1", spec(json!({"replicas": 1, "a": "x"})))
                .ok(spec(json!({"replicas": 1, "a": "x"})),
                    vec![a("m1", r#"{"f:spec":{"f:a":{},"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"replicas": 2}))).force()
                .ok(spec(json!({"replicas": 2, "a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    a("m2", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            // The loser no longer owns it: dropping it from its config keeps it.
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"replicas": 2, "a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    a("m2", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("force_removes_the_losers_empty_entry", W, vec![
            apply("m1", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"replicas": 5}))).force()
                .ok(spec(json!({"replicas": 5})), vec![a("m2", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("apply_vs_update_conflict_then_force", W, vec![
            update("ctl", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![u("ctl", r#"{"f:spec":{".":{},"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"replicas": 2})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "ctl" using demo.kshard.dev/v1: .spec.replicas"#,
                    vec![(".spec.replicas", r#"conflict with "ctl" using demo.kshard.dev/v1"#)]),
            apply("m1", spec(json!({"replicas": 2}))).force()
                .ok(spec(json!({"replicas": 2})), vec![
                    a("m1", r#"{"f:spec":{"f:replicas":{}}}"#),
                    u("ctl", r#"{"f:spec":{}}"#)]),
        ]),
        sc("update_after_apply_takes_ownership", W, vec![
            apply("m1", spec(json!({"replicas": 1, "a": "x"})))
                .ok(spec(json!({"replicas": 1, "a": "x"})),
                    vec![a("m1", r#"{"f:spec":{"f:a":{},"f:replicas":{}}}"#)]),
            update("hpa", spec(json!({"replicas": 5, "a": "x"})))
                .ok(spec(json!({"replicas": 5, "a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    u("hpa", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"replicas": 1, "a": "x"})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "hpa" using demo.kshard.dev/v1: .spec.replicas"#,
                    vec![(".spec.replicas", r#"conflict with "hpa" using demo.kshard.dev/v1"#)]),
            // Leaving the field out lets the updater keep it.
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"replicas": 5, "a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    u("hpa", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("update_changing_an_applied_field_then_forced_back", W, vec![
            apply("m1", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            update("hpa", spec(json!({"replicas": 4})))
                .ok(spec(json!({"replicas": 4})), vec![u("hpa", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"replicas": 1}))).force()
                .ok(spec(json!({"replicas": 1})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("update_removing_an_applied_field_drops_ownership", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            update("ctl", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            // Re-applying b takes it back without conflict.
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
        ]),
        sc("update_then_apply_without_the_field_keeps_updaters_value", W, vec![
            apply("m1", spec(json!({"replicas": 2})))
                .ok(spec(json!({"replicas": 2})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            update("ctl", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![u("ctl", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            // An empty struct in the config is a field of its own.
            apply("m1", spec(json!({})))
                .ok(spec(json!({"replicas": 1})), vec![
                    a("m1", r#"{"f:spec":{}}"#).no_time(),
                    u("ctl", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("several_conflicts_grouped_by_manager", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            update("ctl", spec(json!({"a": "x", "b": "y", "c": "z", "replicas": 3})))
                .ok(spec(json!({"a": "x", "b": "y", "c": "z", "replicas": 3})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#),
                    u("ctl", r#"{"f:spec":{"f:c":{},"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"a": "1", "b": "2", "c": "3", "replicas": 4})))
                .conflict(concat!(
                    "Apply failed with 4 conflicts: conflicts with \"ctl\" using demo.kshard.dev/v1:\n",
                    "- .spec.c\n- .spec.replicas\nconflicts with \"m1\":\n- .spec.a\n- .spec.b"),
                    vec![(".spec.c", r#"conflict with "ctl" using demo.kshard.dev/v1"#),
                         (".spec.replicas", r#"conflict with "ctl" using demo.kshard.dev/v1"#),
                         (".spec.a", CONFLICTS_WITH_M1),
                         (".spec.b", CONFLICTS_WITH_M1)]),
        ]),
        sc("shared_equal_values_then_one_changes", W, vec![
            apply("m1", spec(json!({"replicas": 2})))
                .ok(spec(json!({"replicas": 2})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"replicas": 2})))
                .ok(spec(json!({"replicas": 2})), vec![
                    a("m2", r#"{"f:spec":{"f:replicas":{}}}"#).no_time(),
                    a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"replicas": 3})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m2": .spec.replicas"#,
                    vec![(".spec.replicas", r#"conflict with "m2""#)]),
        ]),
        sc("nested_struct_dropped_subtree_is_removed", W, vec![
            apply("m1", spec(json!({"nested": {"x": "1", "inner": {"z": "2"}}})))
                .ok(spec(json!({"nested": {"x": "1", "inner": {"z": "2"}}})),
                    vec![a("m1", r#"{"f:spec":{"f:nested":{"f:inner":{"f:z":{}},"f:x":{}}}}"#)]),
            apply("m1", spec(json!({"nested": {"x": "1"}})))
                .ok(spec(json!({"nested": {"x": "1"}})),
                    vec![a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#)]),
        ]),
        sc("nested_parent_kept_while_another_applier_owns_a_child", W, vec![
            apply("m1", spec(json!({"nested": {"x": "1"}})))
                .ok(spec(json!({"nested": {"x": "1"}})), vec![a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#)]),
            apply("m2", spec(json!({"nested": {"y": "2"}})))
                .ok(spec(json!({"nested": {"x": "1", "y": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#),
                    a("m2", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#)]),
            apply("m1", spec(json!({"a": "q"})))
                .ok(spec(json!({"a": "q", "nested": {"y": "2"}})), vec![
                    a("m2", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#),
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
        ]),
        sc("apply_empty_struct_keeps_updaters_children", W, vec![
            apply("m1", spec(json!({"nested": {"x": "1"}})))
                .ok(spec(json!({"nested": {"x": "1"}})), vec![a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#)]),
            update("ctl", spec(json!({"nested": {"x": "1", "y": "2"}})))
                .ok(spec(json!({"nested": {"x": "1", "y": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#)]),
            apply("m1", spec(json!({"nested": {}})))
                .ok(spec(json!({"nested": {"y": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#)]),
        ]),
        sc("apply_nothing_removes_everything_and_the_entry", W, vec![
            apply("m1", spec(json!({"a": "x", "nested": {"x": "1"}})))
                .ok(spec(json!({"a": "x", "nested": {"x": "1"}})),
                    vec![a("m1", r#"{"f:spec":{"f:a":{},"f:nested":{"f:x":{}}}}"#)]),
            apply("m1", json!({})).ok(json!({}), vec![]),
        ]),
        sc("apply_keeps_fields_an_updater_added_in_the_same_struct", W, vec![
            apply("m1", spec(json!({"nested": {"x": "1"}})))
                .ok(spec(json!({"nested": {"x": "1"}})), vec![a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#)]),
            update("ctl", spec(json!({"nested": {"x": "1", "inner": {"z": "9"}}})))
                .ok(spec(json!({"nested": {"x": "1", "inner": {"z": "9"}}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:inner":{".":{},"f:z":{}}}}}"#)]),
            apply("m1", spec(json!({"b": "b"})))
                .ok(spec(json!({"b": "b", "nested": {"inner": {"z": "9"}}})), vec![
                    a("m1", r#"{"f:spec":{"f:b":{}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:inner":{".":{},"f:z":{}}}}}"#)]),
        ]),
        sc("metadata_labels_and_finalizers_are_tracked", W, vec![
            apply("m1", json!({"metadata": {"labels": {"app": "web"}, "finalizers": ["demo/x"]}, "spec": {"a": "x"}}))
                .ok(json!({"metadata": {"labels": {"app": "web"}, "finalizers": ["demo/x"]}, "spec": {"a": "x"}}),
                    vec![a("m1", r#"{"f:metadata":{"f:finalizers":{"v:\"demo/x\"":{}},"f:labels":{"f:app":{}}},"f:spec":{"f:a":{}}}"#)]),
            apply("m2", json!({"metadata": {"labels": {"tier": "db"}, "finalizers": ["demo/y"]}}))
                .ok(json!({"metadata": {"labels": {"app": "web", "tier": "db"}, "finalizers": ["demo/x", "demo/y"]}, "spec": {"a": "x"}}), vec![
                    a("m1", r#"{"f:metadata":{"f:finalizers":{"v:\"demo/x\"":{}},"f:labels":{"f:app":{}}},"f:spec":{"f:a":{}}}"#),
                    a("m2", r#"{"f:metadata":{"f:finalizers":{"v:\"demo/y\"":{}},"f:labels":{"f:tier":{}}}}"#)]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(json!({"metadata": {"labels": {"tier": "db"}, "finalizers": ["demo/y"]}, "spec": {"a": "x"}}), vec![
                    a("m2", r#"{"f:metadata":{"f:finalizers":{"v:\"demo/y\"":{}},"f:labels":{"f:tier":{}}}}"#),
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
        ]),
        sc("version_change_prunes_across_versions", W, vec![
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "x"}))).at(V1B1)
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#).at(V1B1)]),
        ]),
        sc("version_change_conflicts_name_the_other_version", W, vec![
            update("ctl", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![u("ctl", r#"{"f:spec":{".":{},"f:replicas":{}}}"#)]),
            apply("m1", spec(json!({"replicas": 2}))).at(V1B1)
                .conflict(r#"Apply failed with 1 conflict: conflict with "ctl" using demo.kshard.dev/v1: .spec.replicas"#,
                    vec![(".spec.replicas", r#"conflict with "ctl" using demo.kshard.dev/v1"#)]),
            apply("m1", spec(json!({"replicas": 1, "a": "x"}))).at(V1B1)
                .ok(spec(json!({"replicas": 1, "a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{},"f:replicas":{}}}"#).at(V1B1),
                    u("ctl", r#"{"f:spec":{".":{},"f:replicas":{}}}"#)]),
        ]),
        sc("updates_at_two_versions_are_two_entries", W, vec![
            update("ctl", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![u("ctl", r#"{"f:spec":{".":{},"f:a":{}}}"#)]),
            update("ctl", spec(json!({"a": "x", "b": "y"}))).at(V1B1)
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    u("ctl", r#"{"f:spec":{".":{},"f:a":{}}}"#),
                    u("ctl", r#"{"f:spec":{"f:b":{}}}"#).at(V1B1)]),
            // Same manager, first version again: merged into the v1 entry.
            update("ctl", spec(json!({"a": "x", "b": "y", "c": "z"})))
                .ok(spec(json!({"a": "x", "b": "y", "c": "z"})), vec![
                    u("ctl", r#"{"f:spec":{"f:b":{}}}"#).at(V1B1),
                    u("ctl", r#"{"f:spec":{".":{},"f:a":{},"f:c":{}}}"#)]),
        ]),
        sc("apply_at_two_versions_is_one_entry", W, vec![
            apply("m1", spec(json!({"a": "x"}))).at(V1B1)
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#).at(V1B1)]),
            apply("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![a("m1", r#"{"f:spec":{"f:a":{},"f:b":{}}}"#)]),
        ]),
        sc("noop_apply_of_updaters_values_has_no_time", W, vec![
            update("ctl", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![u("ctl", r#"{"f:spec":{".":{},"f:a":{}}}"#)]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#).no_time(),
                    u("ctl", r#"{"f:spec":{".":{},"f:a":{}}}"#)]),
        ]),
        sc("update_that_changes_nothing_adds_no_entry", W, vec![
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            update("ctl", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
        ]),
    ]
}

fn status_scenarios() -> Vec<Scenario> {
    use Sch::Widget as W;
    const SPEC_A: &str = r#"{"f:spec":{"f:a":{}}}"#;
    vec![
        sc("status_apply_is_a_separate_entry", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            apply("st", json!({"status": {"ready": 1}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 1}}), vec![
                    a("m1", SPEC_A),
                    a("st", r#"{"f:status":{"f:ready":{}}}"#).status()]),
            // The same manager on the main resource is another entry.
            apply("st", spec(json!({"b": "y"})))
                .ok(json!({"spec": {"a": "x", "b": "y"}, "status": {"ready": 1}}), vec![
                    a("m1", SPEC_A),
                    a("st", r#"{"f:status":{"f:ready":{}}}"#).status(),
                    a("st", r#"{"f:spec":{"f:b":{}}}"#)]),
        ]),
        sc("main_apply_does_not_own_or_create_status", W, vec![
            apply("m1", json!({"spec": {"a": "x"}, "status": {"ready": 5}}))
                .ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
        ]),
        sc("main_apply_cannot_change_status", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            apply("st", json!({"status": {"ready": 1}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 1}}), vec![
                    a("m1", SPEC_A), a("st", r#"{"f:status":{"f:ready":{}}}"#).status()]),
            // No conflict with the status owner: status is reset on this endpoint.
            apply("m1", json!({"spec": {"a": "x"}, "status": {"ready": 9}}))
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 1}}), vec![
                    a("st", r#"{"f:status":{"f:ready":{}}}"#).status(), a("m1", SPEC_A)]),
        ]),
        sc("status_apply_cannot_change_spec", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            apply("st", json!({"spec": {"a": "changed"}, "status": {"phase": "Up"}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"phase": "Up"}}), vec![
                    a("m1", SPEC_A), a("st", r#"{"f:status":{"f:phase":{}}}"#).status()]),
        ]),
        sc("status_update_conflicts_with_status_apply", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            update("ctl", json!({"status": {"ready": 1, "phase": "Running"}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 1, "phase": "Running"}}), vec![
                    a("m1", SPEC_A),
                    u("ctl", r#"{"f:status":{".":{},"f:phase":{},"f:ready":{}}}"#).status()]),
            apply("st", json!({"status": {"ready": 2}})).status()
                .conflict(r#"Apply failed with 1 conflict: conflict with "ctl" with subresource "status" using demo.kshard.dev/v1: .status.ready"#,
                    vec![(".status.ready", r#"conflict with "ctl" with subresource "status" using demo.kshard.dev/v1"#)]),
            apply("st", json!({"status": {"ready": 2}})).status().force()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 2, "phase": "Running"}}), vec![
                    a("m1", SPEC_A),
                    a("st", r#"{"f:status":{"f:ready":{}}}"#).status(),
                    u("ctl", r#"{"f:status":{".":{},"f:phase":{}}}"#).status()]),
        ]),
        sc("status_conditions_are_a_map_list", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            apply("s1", json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}), vec![
                    a("m1", SPEC_A),
                    a("s1", r#"{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{},"f:type":{}}}}}"#).status()]),
            apply("s2", json!({"status": {"conditions": [{"type": "Synced", "status": "False", "reason": "Wait"}]}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "Synced", "status": "False", "reason": "Wait"}]}}), vec![
                    a("m1", SPEC_A),
                    a("s1", r#"{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{},"f:type":{}}}}}"#).status(),
                    a("s2", r#"{"f:status":{"f:conditions":{"k:{\"type\":\"Synced\"}":{".":{},"f:reason":{},"f:status":{},"f:type":{}}}}}"#).status()]),
            apply("s2", json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})).status()
                .conflict(r#"Apply failed with 1 conflict: conflict with "s1" with subresource "status": .status.conditions[type="Ready"].status"#,
                    vec![(r#".status.conditions[type="Ready"].status"#, r#"conflict with "s1" with subresource "status""#)]),
        ]),
        sc("main_update_does_not_own_status", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            update("ctl", json!({"spec": {"a": "x"}, "status": {"ready": 3}}))
                .ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
        ]),
        sc("status_update_does_not_own_spec", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", SPEC_A)]),
            update("ctl", json!({"spec": {"a": "y", "b": "z"}, "status": {"ready": 3}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 3}}), vec![
                    a("m1", SPEC_A),
                    u("ctl", r#"{"f:status":{".":{},"f:ready":{}}}"#).status()]),
        ]),
        sc("status_apply_before_first_apply_is_a_status_entry", W, vec![
            update("ctl", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![u("ctl", r#"{"f:spec":{".":{},"f:a":{}}}"#)]),
            update("ctl", json!({"spec": {"a": "x", "b": "y"}, "metadata": {"managedFields": []}}))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![]),
            update("ctl", json!({"status": {"ready": 1}})).status()
                .ok(json!({"spec": {"a": "x", "b": "y"}, "status": {"ready": 1}}), vec![]),
            apply("st", json!({"status": {"ready": 2}})).status()
                .conflict(r#"Apply failed with 1 conflict: conflict with "before-first-apply" with subresource "status" using demo.kshard.dev/v1: .status.ready"#,
                    vec![(".status.ready", r#"conflict with "before-first-apply" with subresource "status" using demo.kshard.dev/v1"#)]),
            apply("st", json!({"status": {"phase": "Up"}})).status()
                .ok(json!({"spec": {"a": "x", "b": "y"}, "status": {"ready": 1, "phase": "Up"}}), vec![
                    a("st", r#"{"f:status":{"f:phase":{}}}"#).status(),
                    u("before-first-apply", r#"{"f:status":{".":{},"f:ready":{}}}"#).status()]),
        ]),
    ]
}

fn tracking_scenarios() -> Vec<Scenario> {
    use Sch::Widget as W;
    const CTL_A: &str = r#"{"f:spec":{".":{},"f:a":{}}}"#;
    vec![
        sc("managed_fields_cleared_with_empty_list", W, vec![
            update("ctl", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![u("ctl", CTL_A)]),
            update("ctl", json!({"spec": {"a": "x", "b": "y"}, "metadata": {"managedFields": []}}))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![]),
            // Untracked until an apply.
            update("ctl", spec(json!({"a": "x", "b": "y", "c": "z"})))
                .ok(spec(json!({"a": "x", "b": "y", "c": "z"})), vec![]),
            apply("m1", spec(json!({"a": "new"})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "before-first-apply" using demo.kshard.dev/v1: .spec.a"#,
                    vec![(".spec.a", r#"conflict with "before-first-apply" using demo.kshard.dev/v1"#)]),
            apply("m1", spec(json!({"a": "new"}))).force()
                .ok(spec(json!({"a": "new", "b": "y", "c": "z"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#),
                    u("before-first-apply", r#"{"f:spec":{".":{},"f:b":{},"f:c":{}}}"#)]),
        ]),
        sc("managed_fields_cleared_with_one_empty_entry", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            update("ctl", json!({"metadata": {"managedFields": [{}]}, "spec": {"a": "x"}}))
                .ok(spec(json!({"a": "x"})), vec![]),
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#).no_time(),
                    u("before-first-apply", CTL_A)]),
        ]),
        sc("invalid_managed_fields_in_update_fall_back_to_live", W, vec![
            update("ctl", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![u("ctl", CTL_A)]),
            update("other", json!({"spec": {"a": "x", "b": "y"}, "metadata": {"managedFields": [
                    {"manager": "x", "operation": "Bogus", "apiVersion": V1, "fieldsType": "FieldsV1", "fieldsV1": {}}]}}))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    u("ctl", CTL_A), u("other", r#"{"f:spec":{"f:b":{}}}"#)]),
        ]),
        sc("undecodable_fields_v1_in_create_is_replaced", W, vec![
            update("ctl", json!({"spec": {"a": "x"}, "metadata": {"managedFields": [
                    {"manager": "x", "operation": "Update", "apiVersion": V1, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"k:notjson": {}}}}]}}))
                .ok(spec(json!({"a": "x"})), vec![u("ctl", CTL_A)]),
        ]),
        sc("wrong_fields_type_in_update_falls_back_to_live", W, vec![
            apply("m1", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            update("ctl", json!({"spec": {"a": "x", "c": "z"}, "metadata": {"managedFields": [
                    {"manager": "x", "operation": "Update", "apiVersion": V1, "fieldsType": "FieldsV2", "fieldsV1": {}}]}}))
                .ok(spec(json!({"a": "x", "c": "z"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#), u("ctl", r#"{"f:spec":{"f:c":{}}}"#)]),
        ]),
        sc("valid_managed_fields_in_update_replace_live", W, vec![
            update("ctl", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![u("ctl", CTL_A)]),
            update("ctl2", json!({"spec": {"a": "x", "c": "z"}, "metadata": {"managedFields": [
                    {"manager": "x", "operation": "Apply", "apiVersion": V1, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:a": {}}}}]}}))
                .ok(spec(json!({"a": "x", "c": "z"})), vec![
                    a("x", r#"{"f:spec":{"f:a":{}}}"#).no_time(), u("ctl2", r#"{"f:spec":{"f:c":{}}}"#)]),
            apply("m1", spec(json!({"a": "y"})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "x": .spec.a"#,
                    vec![(".spec.a", r#"conflict with "x""#)]),
        ]),
        sc("status_update_ignores_managed_fields_in_request", W, vec![
            update("ctl", spec(json!({"a": "x"}))).ok(spec(json!({"a": "x"})), vec![u("ctl", CTL_A)]),
            update("st", json!({"status": {"ready": 1}, "metadata": {"managedFields": []}})).status()
                .ok(json!({"spec": {"a": "x"}, "status": {"ready": 1}}), vec![
                    u("ctl", CTL_A), u("st", r#"{"f:status":{".":{},"f:ready":{}}}"#).status()]),
        ]),
        sc("apply_rejects_managed_fields_in_config", W, vec![
            apply("m1", json!({"metadata": {"managedFields": []}, "spec": {"a": "x"}}))
                .err(400, "metadata.managedFields must be nil"),
        ]),
        sc("apply_rejects_undeclared_fields", W, vec![
            apply("m1", spec(json!({"a": "x", "bogus": 1})))
                .err(500, "failed to create typed patch object (default/w; demo.kshard.dev/v1, Kind=Widget): .spec.bogus: field not declared in schema"),
        ]),
        sc("apply_rejects_wrong_scalar_type", W, vec![
            apply("m1", spec(json!({"replicas": "many"})))
                .err(500, r#"failed to create typed patch object (default/w; demo.kshard.dev/v1, Kind=Widget): .spec.replicas: expected numeric (int or float), got string"#),
        ]),
        sc("create_by_update_then_apply_shares_ownership", W, vec![
            update("ctl", json!({"spec": {"a": "x", "nested": {"x": "1"}}, "metadata": {"labels": {"k": "v"}}}))
                .ok(json!({"spec": {"a": "x", "nested": {"x": "1"}}, "metadata": {"labels": {"k": "v"}}}),
                    vec![u("ctl", r#"{"f:metadata":{"f:labels":{".":{},"f:k":{}}},"f:spec":{".":{},"f:a":{},"f:nested":{".":{},"f:x":{}}}}"#)]),
            apply("m1", json!({"spec": {"nested": {"x": "1"}}, "metadata": {"labels": {"k": "v"}}}))
                .ok(json!({"spec": {"a": "x", "nested": {"x": "1"}}, "metadata": {"labels": {"k": "v"}}}), vec![
                    a("m1", r#"{"f:metadata":{"f:labels":{"f:k":{}}},"f:spec":{"f:nested":{"f:x":{}}}}"#).no_time(),
                    u("ctl", r#"{"f:metadata":{"f:labels":{".":{},"f:k":{}}},"f:spec":{".":{},"f:a":{},"f:nested":{".":{},"f:x":{}}}}"#)]),
        ]),
    ]
}

fn list_scenarios() -> Vec<Scenario> {
    use Sch::Lists as L;
    let tags = |t: Value| spec(json!({ "tags": t }));
    const T_AC: &str = r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"c\"":{}}}}"#;
    const T_ABCD: &str =
        r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"b\"":{},"v:\"c\"":{},"v:\"d\"":{}}}}"#;
    const T_BD: &str = r#"{"f:spec":{"f:tags":{"v:\"b\"":{},"v:\"d\"":{}}}}"#;
    let c = |items: Value| spec(json!({ "containers": items }));
    let g = |items: Value| spec(json!({ "groups": items }));
    vec![
        sc("set_apply_twice_inserts_in_order", L, vec![
            apply("m1", tags(json!(["a", "c"]))).ok(tags(json!(["a", "c"])), vec![a("m1", T_AC)]),
            apply("m1", tags(json!(["a", "b", "c", "d"]))).ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_ABCD)]),
        ]),
        sc("set_apply_update_apply_without_overlap", L, vec![
            apply("m1", tags(json!(["a", "c"]))).ok(tags(json!(["a", "c"])), vec![a("m1", T_AC)]),
            update("ctl", tags(json!(["a", "b", "c", "d"])))
                .ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_AC), u("ctl", T_BD)]),
            apply("m1", tags(json!(["a", "aprime", "c", "cprime"])))
                .ok(tags(json!(["a", "b", "aprime", "c", "d", "cprime"])), vec![
                    a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"aprime\"":{},"v:\"c\"":{},"v:\"cprime\"":{}}}}"#),
                    u("ctl", T_BD)]),
        ]),
        sc("set_apply_update_apply_with_overlap", L, vec![
            apply("m1", tags(json!(["a", "c"]))).ok(tags(json!(["a", "c"])), vec![a("m1", T_AC)]),
            update("ctl", tags(json!(["a", "b", "c", "d"])))
                .ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_AC), u("ctl", T_BD)]),
            apply("m1", tags(json!(["a", "b", "c"])))
                .ok(tags(json!(["a", "b", "c", "d"])), vec![
                    a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"b\"":{},"v:\"c\"":{}}}}"#),
                    u("ctl", T_BD)]),
        ]),
        sc("set_overlap_across_versions_keeps_each_version", L, vec![
            apply("m1", tags(json!(["a", "c"]))).ok(tags(json!(["a", "c"])), vec![a("m1", T_AC)]),
            update("ctl", tags(json!(["a", "b", "c", "d"]))).at(V1B1)
                .ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_AC), u("ctl", T_BD).at(V1B1)]),
            apply("m1", tags(json!(["a", "b", "c"])))
                .ok(tags(json!(["a", "b", "c", "d"])), vec![
                    a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"b\"":{},"v:\"c\"":{}}}}"#),
                    u("ctl", T_BD).at(V1B1)]),
        ]),
        sc("set_reordered_by_its_only_applier", L, vec![
            apply("m1", tags(json!(["a", "b", "c", "d"]))).ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_ABCD)]),
            apply("m1", tags(json!(["a", "d", "c", "b"]))).ok(tags(json!(["a", "d", "c", "b"])), vec![a("m1", T_ABCD)]),
        ]),
        sc("set_reorder_by_update_is_undone_by_apply", L, vec![
            apply("m1", tags(json!(["a", "b", "c", "d"]))).ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_ABCD)]),
            update("ctl", tags(json!(["a", "d", "c", "b"]))).ok(tags(json!(["a", "d", "c", "b"])), vec![a("m1", T_ABCD)]),
            apply("m1", tags(json!(["a", "b", "c", "d"]))).at(V1B1)
                .ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_ABCD).at(V1B1)]),
        ]),
        sc("set_items_dropped_are_removed", L, vec![
            apply("m1", tags(json!(["a", "b", "c", "d"]))).ok(tags(json!(["a", "b", "c", "d"])), vec![a("m1", T_ABCD)]),
            apply("m1", tags(json!(["a", "c", "e"]))).at(V1B1)
                .ok(tags(json!(["a", "c", "e"])), vec![
                    a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{},"v:\"c\"":{},"v:\"e\"":{}}}}"#).at(V1B1)]),
        ]),
        sc("set_of_integers_shared_by_two_appliers", L, vec![
            apply("m1", spec(json!({"nums": [1, 2]})))
                .ok(spec(json!({"nums": [1, 2]})), vec![a("m1", r#"{"f:spec":{"f:nums":{"v:1":{},"v:2":{}}}}"#)]),
            apply("m2", spec(json!({"nums": [3, 2]})))
                .ok(spec(json!({"nums": [1, 3, 2]})), vec![
                    a("m1", r#"{"f:spec":{"f:nums":{"v:1":{},"v:2":{}}}}"#),
                    a("m2", r#"{"f:spec":{"f:nums":{"v:2":{},"v:3":{}}}}"#)]),
            apply("m1", spec(json!({"nums": [1]})))
                .ok(spec(json!({"nums": [1, 3, 2]})), vec![
                    a("m1", r#"{"f:spec":{"f:nums":{"v:1":{}}}}"#),
                    a("m2", r#"{"f:spec":{"f:nums":{"v:2":{},"v:3":{}}}}"#)]),
            apply("m2", spec(json!({"nums": [3]})))
                .ok(spec(json!({"nums": [1, 3]})), vec![
                    a("m1", r#"{"f:spec":{"f:nums":{"v:1":{}}}}"#),
                    a("m2", r#"{"f:spec":{"f:nums":{"v:3":{}}}}"#)]),
        ]),
        sc("set_emptied_by_its_only_applier_disappears", L, vec![
            apply("m1", spec(json!({"tags": ["a"], "args": ["x"]})))
                .ok(spec(json!({"tags": ["a"], "args": ["x"]})), vec![a("m1", r#"{"f:spec":{"f:args":{},"f:tags":{"v:\"a\"":{}}}}"#)]),
            apply("m1", spec(json!({"args": ["x"]})))
                .ok(spec(json!({"args": ["x"]})), vec![a("m1", r#"{"f:spec":{"f:args":{}}}"#)]),
        ]),
        sc("atomic_list_conflicts_and_is_replaced_whole", L, vec![
            apply("m1", spec(json!({"args": ["a", "b"]})))
                .ok(spec(json!({"args": ["a", "b"]})), vec![a("m1", r#"{"f:spec":{"f:args":{}}}"#)]),
            apply("m2", spec(json!({"args": ["c"]})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.args"#,
                    vec![(".spec.args", CONFLICTS_WITH_M1)]),
            apply("m2", spec(json!({"args": ["c"]}))).force()
                .ok(spec(json!({"args": ["c"]})), vec![a("m2", r#"{"f:spec":{"f:args":{}}}"#)]),
        ]),
        sc("atomic_list_with_equal_value_is_shared", L, vec![
            apply("m1", spec(json!({"args": ["a", "b"]})))
                .ok(spec(json!({"args": ["a", "b"]})), vec![a("m1", r#"{"f:spec":{"f:args":{}}}"#)]),
            apply("m2", spec(json!({"args": ["a", "b"]})))
                .ok(spec(json!({"args": ["a", "b"]})), vec![
                    a("m2", r#"{"f:spec":{"f:args":{}}}"#).no_time(), a("m1", r#"{"f:spec":{"f:args":{}}}"#)]),
            apply("m1", json!({}))
                .ok(spec(json!({"args": ["a", "b"]})), vec![a("m2", r#"{"f:spec":{"f:args":{}}}"#).no_time()]),
        ]),
        sc("atomic_list_reordered_is_a_change", L, vec![
            apply("m1", spec(json!({"args": ["a", "b"]})))
                .ok(spec(json!({"args": ["a", "b"]})), vec![a("m1", r#"{"f:spec":{"f:args":{}}}"#)]),
            update("ctl", spec(json!({"args": ["b", "a"]})))
                .ok(spec(json!({"args": ["b", "a"]})), vec![u("ctl", r#"{"f:spec":{"f:args":{}}}"#)]),
        ]),
        sc("map_list_items_from_two_appliers", L, vec![
            apply("m1", c(json!([{"name": "a", "image": "1"}])))
                .ok(c(json!([{"name": "a", "image": "1"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([{"name": "b", "image": "2"}])))
                .ok(c(json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:image":{},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([{"name": "a", "image": "2"}])))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.containers[name="a"].image"#,
                    vec![(r#".spec.containers[name="a"].image"#, CONFLICTS_WITH_M1)]),
        ]),
        sc("map_list_new_item_goes_after_the_shared_one_before_it", L, vec![
            apply("m1", c(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])))
                .ok(c(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([{"name": "x"}, {"name": "b"}])))
                .ok(c(json!([{"name": "a"}, {"name": "x"}, {"name": "b"}, {"name": "c"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"x\"}":{".":{},"f:name":{}}}}}"#)]),
            apply("m3", c(json!([{"name": "b"}, {"name": "y"}])))
                .ok(c(json!([{"name": "a"}, {"name": "x"}, {"name": "b"}, {"name": "c"}, {"name": "y"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"x\"}":{".":{},"f:name":{}}}}}"#),
                    a("m3", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"y\"}":{".":{},"f:name":{}}}}}"#)]),
        ]),
        sc("map_list_reordered_by_its_only_applier", L, vec![
            apply("m1", c(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])))
                .ok(c(json!([{"name": "a"}, {"name": "b"}, {"name": "c"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}"#)]),
            apply("m1", c(json!([{"name": "c"}, {"name": "b"}, {"name": "a"}])))
                .ok(c(json!([{"name": "c"}, {"name": "b"}, {"name": "a"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}"#)]),
        ]),
        sc("map_list_dropped_item_kept_while_co_owned", L, vec![
            apply("m1", c(json!([{"name": "a"}, {"name": "b"}])))
                .ok(c(json!([{"name": "a"}, {"name": "b"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([{"name": "b", "image": "2"}])))
                .ok(c(json!([{"name": "a"}, {"name": "b", "image": "2"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            apply("m1", c(json!([{"name": "a"}])))
                .ok(c(json!([{"name": "a"}, {"name": "b", "image": "2"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"b\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([])))
                .ok(c(json!([{"name": "a"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}}}}}"#)]),
        ]),
        sc("map_list_item_added_by_update_survives_apply", L, vec![
            apply("m1", c(json!([{"name": "a", "image": "1"}])))
                .ok(c(json!([{"name": "a", "image": "1"}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            update("inj", c(json!([{"name": "a", "image": "1", "env": ["E=1"]}, {"name": "sidecar", "image": "s"}])))
                .ok(c(json!([{"name": "a", "image": "1", "env": ["E=1"]}, {"name": "sidecar", "image": "s"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:image":{},"f:name":{}}}}}"#),
                    u("inj", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{"f:env":{".":{},"v:\"E=1\"":{}}},"k:{\"name\":\"sidecar\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
            apply("m1", c(json!([{"name": "a", "image": "2"}])))
                .ok(c(json!([{"name": "a", "image": "2", "env": ["E=1"]}, {"name": "sidecar", "image": "s"}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:image":{},"f:name":{}}}}}"#),
                    u("inj", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{"f:env":{".":{},"v:\"E=1\"":{}}},"k:{\"name\":\"sidecar\"}":{".":{},"f:image":{},"f:name":{}}}}}"#)]),
        ]),
        sc("map_list_with_two_keys_and_a_defaulted_key", L, vec![
            apply("m1", c(json!([{"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 80, "protocol": "UDP"}]}])))
                .ok(c(json!([{"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 80, "protocol": "UDP"}]}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}},"k:{\"containerPort\":80,\"protocol\":\"UDP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}}}}}}"#)]),
            apply("m2", c(json!([{"name": "a", "ports": [{"containerPort": 443, "hostPort": 8443}]}])))
                .ok(c(json!([{"name": "a", "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 80, "protocol": "UDP"}, {"containerPort": 443, "hostPort": 8443}]}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}},"k:{\"containerPort\":80,\"protocol\":\"UDP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:ports":{"k:{\"containerPort\":443,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:hostPort":{}}}}}}}"#)]),
            apply("m3", c(json!([{"name": "a", "ports": [{"containerPort": 443, "protocol": "TCP", "hostPort": 9443}]}])))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m2": .spec.containers[name="a"].ports[containerPort=443,protocol="TCP"].hostPort"#,
                    vec![(r#".spec.containers[name="a"].ports[containerPort=443,protocol="TCP"].hostPort"#, r#"conflict with "m2""#)]),
        ]),
        sc("nested_list_map_drops_dangling_subitem_kept_by_others", L, vec![
            apply("one", g(json!([{"name": "a"}, {"name": "b", "value": ["c"]}])))
                .ok(g(json!([{"name": "a"}, {"name": "b", "value": ["c"]}])),
                    vec![a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#)]),
            apply("two", g(json!([{"name": "b", "value": ["d"]}]))).at(V1B1)
                .ok(g(json!([{"name": "a"}, {"name": "b", "value": ["c", "d"]}])), vec![
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#),
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"d\"":{}}}}}}"#).at(V1B1)]),
            update("ctl", g(json!([{"name": "a"}, {"name": "b", "value": ["c", "d", "e"]}]))).at(V1B1)
                .ok(g(json!([{"name": "a"}, {"name": "b", "value": ["c", "d", "e"]}])), vec![
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#),
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"d\"":{}}}}}}"#).at(V1B1),
                    u("ctl", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{"f:value":{"v:\"e\"":{}}}}}}"#).at(V1B1)]),
            apply("one", g(json!([{"name": "a"}])))
                .ok(g(json!([{"name": "a"}, {"name": "b", "value": ["d", "e"]}])), vec![
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"d\"":{}}}}}}"#).at(V1B1),
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{"f:value":{"v:\"e\"":{}}}}}}"#).at(V1B1)]),
        ]),
        sc("nested_list_map_item_removed_with_updaters_subitems", L, vec![
            apply("one", g(json!([{"name": "a"}, {"name": "b", "value": ["c"]}])))
                .ok(g(json!([{"name": "a"}, {"name": "b", "value": ["c"]}])),
                    vec![a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#)]),
            apply("two", g(json!([{"name": "a", "value": ["b"]}])))
                .ok(g(json!([{"name": "a", "value": ["b"]}, {"name": "b", "value": ["c"]}])), vec![
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#),
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:value":{"v:\"b\"":{}}}}}}"#)]),
            update("ctl", g(json!([{"name": "a", "value": ["b"]}, {"name": "b", "value": ["c", "d"]}])))
                .ok(g(json!([{"name": "a", "value": ["b"]}, {"name": "b", "value": ["c", "d"]}])), vec![
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}},"k:{\"name\":\"b\"}":{".":{},"f:name":{},"f:value":{"v:\"c\"":{}}}}}}"#),
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:value":{"v:\"b\"":{}}}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"b\"}":{"f:value":{"v:\"d\"":{}}}}}}"#)]),
            apply("one", g(json!([{"name": "a"}])))
                .ok(g(json!([{"name": "a", "value": ["b"]}])), vec![
                    a("two", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{},"f:value":{"v:\"b\"":{}}}}}}"#),
                    a("one", r#"{"f:spec":{"f:groups":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}}}}}"#)]),
        ]),
        sc("set_inside_map_list_item_merges_per_value", L, vec![
            apply("m1", c(json!([{"name": "a", "env": ["X=1"]}])))
                .ok(c(json!([{"name": "a", "env": ["X=1"]}])),
                    vec![a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:env":{"v:\"X=1\"":{}},"f:name":{}}}}}"#)]),
            apply("m2", c(json!([{"name": "a", "env": ["Y=2"]}])))
                .ok(c(json!([{"name": "a", "env": ["X=1", "Y=2"]}])), vec![
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:env":{"v:\"X=1\"":{}},"f:name":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:env":{"v:\"Y=2\"":{}},"f:name":{}}}}}"#)]),
            apply("m1", c(json!([{"name": "a"}])))
                .ok(c(json!([{"name": "a", "env": ["Y=2"]}])), vec![
                    a("m2", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:env":{"v:\"Y=2\"":{}},"f:name":{}}}}}"#),
                    a("m1", r#"{"f:spec":{"f:containers":{"k:{\"name\":\"a\"}":{".":{},"f:name":{}}}}}"#)]),
        ]),
    ]
}

fn map_scenarios() -> Vec<Scenario> {
    use Sch::Maps as M;
    vec![
        sc("granular_map_keys_from_two_appliers", M, vec![
            apply("m1", spec(json!({"labels": {"a": "1"}})))
                .ok(spec(json!({"labels": {"a": "1"}})), vec![a("m1", r#"{"f:spec":{"f:labels":{"f:a":{}}}}"#)]),
            apply("m2", spec(json!({"labels": {"b": "2"}})))
                .ok(spec(json!({"labels": {"a": "1", "b": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:labels":{"f:a":{}}}}"#), a("m2", r#"{"f:spec":{"f:labels":{"f:b":{}}}}"#)]),
            apply("m2", spec(json!({"labels": {"a": "2"}})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.labels.a"#,
                    vec![(".spec.labels.a", CONFLICTS_WITH_M1)]),
            apply("m1", spec(json!({})))
                .ok(spec(json!({"labels": {"b": "2"}})), vec![
                    a("m2", r#"{"f:spec":{"f:labels":{"f:b":{}}}}"#), a("m1", r#"{"f:spec":{}}"#)]),
        ]),
        sc("granular_map_key_changed_by_update", M, vec![
            apply("m1", spec(json!({"labels": {"a": "1", "b": "1"}})))
                .ok(spec(json!({"labels": {"a": "1", "b": "1"}})), vec![a("m1", r#"{"f:spec":{"f:labels":{"f:a":{},"f:b":{}}}}"#)]),
            update("ctl", spec(json!({"labels": {"a": "1", "b": "2", "c": "3"}})))
                .ok(spec(json!({"labels": {"a": "1", "b": "2", "c": "3"}})), vec![
                    a("m1", r#"{"f:spec":{"f:labels":{"f:a":{}}}}"#), u("ctl", r#"{"f:spec":{"f:labels":{"f:b":{},"f:c":{}}}}"#)]),
        ]),
        sc("atomic_map_conflicts_and_is_replaced_whole", M, vec![
            apply("m1", spec(json!({"selector": {"a": "1"}})))
                .ok(spec(json!({"selector": {"a": "1"}})), vec![a("m1", r#"{"f:spec":{"f:selector":{}}}"#)]),
            apply("m2", spec(json!({"selector": {"b": "2"}})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.selector"#,
                    vec![(".spec.selector", CONFLICTS_WITH_M1)]),
            apply("m2", spec(json!({"selector": {"b": "2"}}))).force()
                .ok(spec(json!({"selector": {"b": "2"}})), vec![a("m2", r#"{"f:spec":{"f:selector":{}}}"#)]),
        ]),
        sc("atomic_map_with_equal_value_is_shared", M, vec![
            apply("m1", spec(json!({"selector": {"a": "1"}})))
                .ok(spec(json!({"selector": {"a": "1"}})), vec![a("m1", r#"{"f:spec":{"f:selector":{}}}"#)]),
            apply("m2", spec(json!({"selector": {"a": "1"}})))
                .ok(spec(json!({"selector": {"a": "1"}})), vec![
                    a("m2", r#"{"f:spec":{"f:selector":{}}}"#).no_time(), a("m1", r#"{"f:spec":{"f:selector":{}}}"#)]),
            apply("m1", json!({}))
                .ok(spec(json!({"selector": {"a": "1"}})), vec![a("m2", r#"{"f:spec":{"f:selector":{}}}"#).no_time()]),
            apply("m2", json!({})).ok(json!({}), vec![]),
        ]),
        sc("atomic_struct_is_owned_whole", M, vec![
            apply("m1", spec(json!({"target": {"kind": "A", "name": "x"}})))
                .ok(spec(json!({"target": {"kind": "A", "name": "x"}})), vec![a("m1", r#"{"f:spec":{"f:target":{}}}"#)]),
            update("ctl", spec(json!({"target": {"kind": "A", "name": "y"}})))
                .ok(spec(json!({"target": {"kind": "A", "name": "y"}})), vec![u("ctl", r#"{"f:spec":{"f:target":{}}}"#)]),
            apply("m1", spec(json!({"target": {"kind": "A"}}))).force()
                .ok(spec(json!({"target": {"kind": "A"}})), vec![a("m1", r#"{"f:spec":{"f:target":{}}}"#)]),
        ]),
        sc("map_of_maps_is_granular_at_both_levels", M, vec![
            apply("m1", spec(json!({"mapOfMaps": {"k1": {"x": "1"}}})))
                .ok(spec(json!({"mapOfMaps": {"k1": {"x": "1"}}})), vec![a("m1", r#"{"f:spec":{"f:mapOfMaps":{"f:k1":{".":{},"f:x":{}}}}}"#)]),
            apply("m2", spec(json!({"mapOfMaps": {"k1": {"y": "2"}, "k2": {}}})))
                .ok(spec(json!({"mapOfMaps": {"k1": {"x": "1", "y": "2"}, "k2": {}}})), vec![
                    a("m1", r#"{"f:spec":{"f:mapOfMaps":{"f:k1":{".":{},"f:x":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:mapOfMaps":{"f:k1":{".":{},"f:y":{}},"f:k2":{}}}}"#)]),
            apply("m1", json!({}))
                .ok(spec(json!({"mapOfMaps": {"k1": {"y": "2"}, "k2": {}}})), vec![
                    a("m2", r#"{"f:spec":{"f:mapOfMaps":{"f:k1":{".":{},"f:y":{}},"f:k2":{}}}}"#)]),
        ]),
        sc("preserve_unknown_subtree_is_deduced", M, vec![
            apply("m1", spec(json!({"free": {"known": "k", "x": {"y": 1}, "l": [1, 2]}})))
                .ok(spec(json!({"free": {"known": "k", "x": {"y": 1}, "l": [1, 2]}})),
                    vec![a("m1", r#"{"f:spec":{"f:free":{"f:known":{},"f:l":{},"f:x":{".":{},"f:y":{}}}}}"#)]),
            apply("m2", spec(json!({"free": {"x": {"z": true}}})))
                .ok(spec(json!({"free": {"known": "k", "x": {"y": 1, "z": true}, "l": [1, 2]}})), vec![
                    a("m1", r#"{"f:spec":{"f:free":{"f:known":{},"f:l":{},"f:x":{".":{},"f:y":{}}}}}"#),
                    a("m2", r#"{"f:spec":{"f:free":{"f:x":{".":{},"f:z":{}}}}}"#)]),
            apply("m2", spec(json!({"free": {"l": [3]}})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1": .spec.free.l"#,
                    vec![(".spec.free.l", CONFLICTS_WITH_M1)]),
            apply("m1", spec(json!({"free": {"known": "k"}})))
                .ok(spec(json!({"free": {"known": "k", "x": {"z": true}}})), vec![
                    a("m2", r#"{"f:spec":{"f:free":{"f:x":{".":{},"f:z":{}}}}}"#),
                    a("m1", r#"{"f:spec":{"f:free":{"f:known":{}}}}"#)]),
        ]),
        sc("preserve_unknown_fields_written_by_update", M, vec![
            apply("m1", spec(json!({"free": {"known": "k"}})))
                .ok(spec(json!({"free": {"known": "k"}})), vec![a("m1", r#"{"f:spec":{"f:free":{"f:known":{}}}}"#)]),
            update("ctl", spec(json!({"free": {"known": "k", "extra": {"deep": {"v": 1}}}})))
                .ok(spec(json!({"free": {"known": "k", "extra": {"deep": {"v": 1}}}})), vec![
                    a("m1", r#"{"f:spec":{"f:free":{"f:known":{}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:free":{"f:extra":{".":{},"f:deep":{".":{},"f:v":{}}}}}}"#)]),
        ]),
        sc("schemaless_resource_deduces_everything", Sch::Deduced, vec![
            apply("m1", spec(json!({"m": {"k": "v"}, "l": [{"a": 1}]})))
                .ok(spec(json!({"m": {"k": "v"}, "l": [{"a": 1}]})),
                    vec![a("m1", r#"{"f:spec":{".":{},"f:l":{},"f:m":{".":{},"f:k":{}}}}"#)]),
            apply("m2", spec(json!({"m": {"j": "w"}})))
                .ok(spec(json!({"m": {"k": "v", "j": "w"}, "l": [{"a": 1}]})), vec![
                    a("m1", r#"{"f:spec":{".":{},"f:l":{},"f:m":{".":{},"f:k":{}}}}"#),
                    a("m2", r#"{"f:spec":{".":{},"f:m":{".":{},"f:j":{}}}}"#)]),
            apply("m1", spec(json!({"l": [{"a": 1}]})))
                .ok(spec(json!({"m": {"j": "w"}, "l": [{"a": 1}]})), vec![
                    a("m2", r#"{"f:spec":{".":{},"f:m":{".":{},"f:j":{}}}}"#),
                    a("m1", r#"{"f:spec":{".":{},"f:l":{}}}"#)]),
        ]),
    ]
}

fn edge_scenarios() -> Vec<Scenario> {
    use Sch::{Lists as L, Widget as W};
    vec![
        sc("apply_null_struct_keeps_updaters_children", W, vec![
            apply("m1", spec(json!({"nested": {"x": "1"}})))
                .ok(spec(json!({"nested": {"x": "1"}})), vec![a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#)]),
            update("ctl", spec(json!({"nested": {"x": "1", "y": "2"}})))
                .ok(spec(json!({"nested": {"x": "1", "y": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{"f:x":{}}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#)]),
            apply("m1", spec(json!({"nested": null})))
                .ok(spec(json!({"nested": {"y": "2"}})), vec![
                    a("m1", r#"{"f:spec":{"f:nested":{}}}"#),
                    u("ctl", r#"{"f:spec":{"f:nested":{"f:y":{}}}}"#)]),
        ]),
        sc("int_and_float_of_equal_value_do_not_conflict", W, vec![
            apply("m1", spec(json!({"replicas": 1})))
                .ok(spec(json!({"replicas": 1})), vec![a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
            apply("m2", spec(json!({"replicas": 1.0})))
                .ok(spec(json!({"replicas": 1})), vec![
                    a("m2", r#"{"f:spec":{"f:replicas":{}}}"#).no_time(),
                    a("m1", r#"{"f:spec":{"f:replicas":{}}}"#)]),
        ]),
        sc("same_manager_apply_and_update_are_separate_entries", W, vec![
            apply("m1", spec(json!({"a": "x"})))
                .ok(spec(json!({"a": "x"})), vec![a("m1", r#"{"f:spec":{"f:a":{}}}"#)]),
            update("m1", spec(json!({"a": "x", "b": "y"})))
                .ok(spec(json!({"a": "x", "b": "y"})), vec![
                    a("m1", r#"{"f:spec":{"f:a":{}}}"#), u("m1", r#"{"f:spec":{"f:b":{}}}"#)]),
            apply("m1", spec(json!({"a": "x", "b": "z"})))
                .conflict(r#"Apply failed with 1 conflict: conflict with "m1" using demo.kshard.dev/v1: .spec.b"#,
                    vec![(".spec.b", r#"conflict with "m1" using demo.kshard.dev/v1"#)]),
        ]),
        // OwnerReference is atomic (`+structType=atomic`): an entry is owned
        // whole under its uid key; applying the same entry shares it.
        sc("owner_references_are_keyed_by_uid", W, vec![
            apply("m1", json!({"metadata": {"ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-9"}]}}))
                .ok(json!({"metadata": {"ownerReferences": [
                        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-9"}]}}),
                    vec![a("m1", r#"{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"u-9\"}":{}}}}"#)]),
            apply("m2", json!({"metadata": {"ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-9"}]}}))
                .ok(json!({"metadata": {"ownerReferences": [
                        {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-9"}]}}), vec![
                    a("m2", r#"{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"u-9\"}":{}}}}"#).no_time(),
                    a("m1", r#"{"f:metadata":{"f:ownerReferences":{"k:{\"uid\":\"u-9\"}":{}}}}"#)]),
            apply("m3", json!({"metadata": {"ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u-9", "controller": true}]}}))
                .conflict(r#"Apply failed with 2 conflicts: conflicts with "m1":
- .metadata.ownerReferences[uid="u-9"]
conflicts with "m2":
- .metadata.ownerReferences[uid="u-9"]"#,
                    vec![(".metadata.ownerReferences[uid=\"u-9\"]", r#"conflict with "m1""#),
                         (".metadata.ownerReferences[uid=\"u-9\"]", r#"conflict with "m2""#)]),
        ]),
        sc("applying_an_empty_set_owns_nothing_and_keeps_items", L, vec![
            apply("m1", spec(json!({"tags": ["a"]})))
                .ok(spec(json!({"tags": ["a"]})), vec![a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{}}}}"#)]),
            apply("m2", spec(json!({"tags": []})))
                .ok(spec(json!({"tags": ["a"]})), vec![a("m1", r#"{"f:spec":{"f:tags":{"v:\"a\"":{}}}}"#)]),
        ]),
        sc("apply_rejects_duplicate_set_items", L, vec![
            apply("m1", spec(json!({"tags": ["a", "a"]})))
                .err(500, r#"failed to create typed patch object (default/w; demo.kshard.dev/v1, Kind=Widget): .spec.tags: duplicate entries for key [="a"]"#),
        ]),
        sc("apply_rejects_map_list_items_without_keys", L, vec![
            apply("m1", spec(json!({"containers": [{"image": "i"}]})))
                .err(500, r#"failed to create typed patch object (default/w; demo.kshard.dev/v1, Kind=Widget): .spec.containers: element 0: associative list with keys has an element that omits all key fields ["name"] (and doesn't have default values for any key fields)"#),
        ]),
    ]
}

/// More than ten Update managers: the oldest are folded into "ancient-changes".
fn cap_scenario() -> Scenario {
    fn leak(s: String) -> &'static str {
        Box::leak(s.into_boxed_str())
    }
    let mut steps = Vec::new();
    let mut labels = Map::new();
    for i in 0..11 {
        labels.insert(format!("k{i:02}"), json!("v"));
        let manager = leak(format!("u{i:02}"));
        let body = spec(json!({ "labels": labels.clone() }));
        let mut want = Vec::new();
        if i == 10 {
            want.push(u(
                "ancient-changes",
                r#"{"f:spec":{".":{},"f:labels":{".":{},"f:k00":{},"f:k01":{}}}}"#,
            ));
        } else {
            want.push(u(
                "u00",
                r#"{"f:spec":{".":{},"f:labels":{".":{},"f:k00":{}}}}"#,
            ));
        }
        for j in if i == 10 { 2..=i } else { 1..=i } {
            want.push(u(
                leak(format!("u{j:02}")),
                leak(format!(
                    r#"{{"f:spec":{{"f:labels":{{"f:k{j:02}":{{}}}}}}}}"#
                )),
            ));
        }
        steps.push(update(manager, body.clone()).ok(body, want));
    }
    sc("update_managers_beyond_ten_are_capped", Sch::Maps, steps)
}
