//! End-to-end ownership scenarios through [`FieldManager`], with expected
//! managedFields written the way kube-apiserver writes them.

use serde_json::{json, Value};

use super::*;

const V1: &str = "demo.kshard.dev/v1";
const T0: &str = "2024-05-01T10:00:00Z";
const T1: &str = "2024-05-01T10:00:05Z";
const T2: &str = "2024-05-01T10:00:09Z";

fn widget_schema() -> MergeSchema {
    MergeSchema::from_openapi(Some(&json!({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "a": {"type": "string"},
                "b": {"type": "string"},
                "containers": {"type": "array", "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "image": {"type": "string"}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                    "additionalProperties": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "integer"}}}
        }
    })))
}

fn widget(spec: Value) -> Value {
    json!({"apiVersion": V1, "kind": "Widget", "metadata": {"name": "w", "namespace": "default"}, "spec": spec})
}

/// A stored object as the registry would hold it after create.
fn stored(mut obj: Value) -> Value {
    obj["metadata"]["uid"] = json!("u-1");
    obj["metadata"]["resourceVersion"] = json!("1");
    obj
}

fn entries(obj: &Value) -> &Vec<Value> {
    obj["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
}

fn entry<'v>(obj: &'v Value, manager: &str) -> &'v Value {
    entries(obj)
        .iter()
        .find(|e| e["manager"] == json!(manager))
        .expect("entry for manager")
}

fn fields(obj: &Value, manager: &str) -> String {
    serde_json::to_string(&entry(obj, manager)["fieldsV1"]).expect("json")
}

#[test]
fn create_on_apply_records_an_apply_entry() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg = widget(json!({
        "replicas": 3,
        "containers": [{"name": "nginx", "image": "nginx:1"}],
        "tags": ["x"],
        "labels": {"app": "web"}
    }));
    let obj = fm.apply(None, &cfg, "demo", false, T0).expect("apply");
    assert_eq!(obj["spec"]["replicas"], json!(3));
    assert_eq!(obj["metadata"]["name"], json!("w"));
    let e = &entries(&obj)[0];
    assert_eq!(
        serde_json::to_string(e).expect("json"),
        concat!(
            // Keys sorted, as kube-apiserver writes a custom resource's entries.
            r#"{"apiVersion":"demo.kshard.dev/v1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{}}},"#,
            r#""f:labels":{"f:app":{}},"f:replicas":{},"f:tags":{"v:\"x\"":{}}}},"manager":"demo","operation":"Apply","time":"2024-05-01T10:00:00Z"}"#
        )
    );
}

#[test]
fn create_by_update_owns_added_parents() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let mut obj = widget(json!({"replicas": 1}));
    obj["metadata"]["labels"] = json!({"app": "web"});
    fm.update(None, &mut obj, "kubectl-create", T0)
        .expect("update");
    let e = entry(&obj, "kubectl-create");
    assert_eq!(e["operation"], json!("Update"));
    assert_eq!(e["time"], json!(T0));
    assert_eq!(
        fields(&obj, "kubectl-create"),
        r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{".":{},"f:replicas":{}}}"#
    );
}

#[test]
fn two_appliers_share_a_field_with_the_same_value() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let obj = stored(
        fm.apply(
            None,
            &widget(json!({"replicas": 2, "a": "x"})),
            "one",
            false,
            T0,
        )
        .expect("one"),
    );
    let obj = fm
        .apply(
            Some(&obj),
            &widget(json!({"replicas": 2, "b": "y"})),
            "two",
            false,
            T1,
        )
        .expect("two");
    assert_eq!(
        fields(&obj, "one"),
        r#"{"f:spec":{"f:a":{},"f:replicas":{}}}"#
    );
    assert_eq!(
        fields(&obj, "two"),
        r#"{"f:spec":{"f:b":{},"f:replicas":{}}}"#
    );

    // "one" stops applying replicas: "two" still owns it, so it stays.
    let obj = fm
        .apply(Some(&obj), &widget(json!({"a": "x"})), "one", false, T2)
        .expect("drop");
    assert_eq!(obj["spec"]["replicas"], json!(2));
    assert_eq!(fields(&obj, "one"), r#"{"f:spec":{"f:a":{}}}"#);

    // "two" stops too: nobody owns it, so it is removed.
    let obj = fm
        .apply(Some(&obj), &widget(json!({"b": "y"})), "two", false, T2)
        .expect("drop2");
    assert_eq!(obj["spec"], json!({"a": "x", "b": "y"}));
}

#[test]
fn removing_an_unshared_field_from_the_config_removes_it() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg =
        widget(json!({"a": "x", "containers": [{"name": "c1", "image": "i"}, {"name": "c2"}]}));
    let obj = stored(fm.apply(None, &cfg, "m", false, T0).expect("apply"));
    let obj = fm
        .apply(
            Some(&obj),
            &widget(json!({"containers": [{"name": "c2"}]})),
            "m",
            false,
            T1,
        )
        .expect("again");
    assert_eq!(obj["spec"], json!({"containers": [{"name": "c2"}]}));
    assert_eq!(
        fields(&obj, "m"),
        r#"{"f:spec":{"f:containers":{"k:{\"name\":\"c2\"}":{".":{},"f:name":{}}}}}"#
    );
}

fn csa_created(fm: &FieldManager<'_>) -> Value {
    let mut obj = widget(json!({"replicas": 1}));
    fm.update(None, &mut obj, "kubectl-client-side-apply", T0)
        .expect("create");
    stored(obj)
}

#[test]
fn conflict_with_an_update_manager_has_kube_message_and_causes() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let live = csa_created(&fm);
    let err = fm
        .apply(Some(&live), &widget(json!({"replicas": 2})), "m", false, T1)
        .expect_err("conflict");
    assert_eq!(err.status_code(), 409);
    assert_eq!(
        err.to_string(),
        r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using demo.kshard.dev/v1: .spec.replicas"#
    );
    let ApplyError::Conflicts(cs) = err else {
        panic!("not conflicts")
    };
    assert_eq!(
        cs[0].cause_message(),
        r#"conflict with "kubectl-client-side-apply" using demo.kshard.dev/v1"#
    );
    assert_eq!(cs[0].field, ".spec.replicas");
    assert_eq!(cs[0].manager, "kubectl-client-side-apply");

    // The same value is no conflict: ownership is shared.
    let obj = fm
        .apply(Some(&live), &widget(json!({"replicas": 1})), "m", false, T1)
        .expect("same value");
    assert_eq!(fields(&obj, "m"), r#"{"f:spec":{"f:replicas":{}}}"#);
    assert_eq!(
        fields(&obj, "kubectl-client-side-apply"),
        r#"{"f:spec":{".":{},"f:replicas":{}}}"#
    );
}

#[test]
fn several_conflicts_are_grouped_by_manager() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let live = stored(
        fm.apply(None, &widget(json!({"a": "1", "b": "1"})), "x", false, T0)
            .expect("x"),
    );
    let live = fm
        .apply(Some(&live), &widget(json!({"replicas": 1})), "w", false, T0)
        .expect("w");
    let err = fm
        .apply(
            Some(&live),
            &widget(json!({"a": "2", "b": "2", "replicas": 2})),
            "m",
            false,
            T1,
        )
        .expect_err("conflicts");
    assert_eq!(
        err.to_string(),
        "Apply failed with 3 conflicts: conflicts with \"w\":\n- .spec.replicas\nconflicts with \"x\":\n- .spec.a\n- .spec.b"
    );
}

#[test]
fn force_takes_ownership() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let live = csa_created(&fm);
    let obj = fm
        .apply(Some(&live), &widget(json!({"replicas": 2})), "m", true, T1)
        .expect("force");
    assert_eq!(obj["spec"]["replicas"], json!(2));
    assert_eq!(fields(&obj, "m"), r#"{"f:spec":{"f:replicas":{}}}"#);
    // Only the parent it created is left; a member without children is `{}`.
    assert_eq!(
        fields(&obj, "kubectl-client-side-apply"),
        r#"{"f:spec":{}}"#
    );
}

#[test]
fn atomic_and_granular_maps() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg = widget(json!({"labels": {"a": "1"}, "selector": {"a": "1"}}));
    let live = stored(fm.apply(None, &cfg, "one", false, T0).expect("one"));
    assert_eq!(
        fields(&live, "one"),
        r#"{"f:spec":{"f:labels":{"f:a":{}},"f:selector":{}}}"#
    );
    let obj = fm
        .apply(
            Some(&live),
            &widget(json!({"labels": {"b": "2"}})),
            "two",
            false,
            T1,
        )
        .expect("granular");
    assert_eq!(obj["spec"]["labels"], json!({"a": "1", "b": "2"}));
    let err = fm
        .apply(
            Some(&live),
            &widget(json!({"selector": {"b": "2"}})),
            "two",
            false,
            T1,
        )
        .expect_err("atomic");
    assert!(err.to_string().ends_with(": .spec.selector"), "{err}");
}

#[test]
fn set_atomic_and_map_lists() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg =
        widget(json!({"tags": ["x"], "args": ["a"], "containers": [{"name": "c", "image": "1"}]}));
    let live = stored(fm.apply(None, &cfg, "one", false, T0).expect("one"));
    let obj = fm
        .apply(
            Some(&live),
            &widget(json!({"tags": ["y"], "containers": [{"name": "d"}]})),
            "two",
            false,
            T1,
        )
        .expect("associative");
    assert_eq!(obj["spec"]["tags"], json!(["x", "y"]));
    assert_eq!(
        obj["spec"]["containers"],
        json!([{"name": "c", "image": "1"}, {"name": "d"}])
    );
    assert_eq!(
        fields(&live, "one"),
        concat!(
            r#"{"f:spec":{"f:args":{},"f:containers":{"k:{\"name\":\"c\"}":{".":{},"f:image":{},"f:name":{}}},"#,
            r#""f:tags":{"v:\"x\"":{}}}}"#
        )
    );
    let err = fm
        .apply(
            Some(&live),
            &widget(json!({"args": ["b"]})),
            "two",
            false,
            T1,
        )
        .expect_err("atomic list");
    assert!(err.to_string().ends_with(": .spec.args"), "{err}");
    let err = fm
        .apply(
            Some(&live),
            &widget(json!({"containers": [{"name": "c", "image": "2"}]})),
            "two",
            false,
            T1,
        )
        .expect_err("item field");
    assert!(
        err.to_string()
            .ends_with(r#": .spec.containers[name="c"].image"#),
        "{err}"
    );
}

#[test]
fn preserve_unknown_subtrees_are_deduced() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg = widget(json!({"free": {"x": {"y": 1}, "l": [1, 2]}}));
    let obj = fm.apply(None, &cfg, "m", false, T0).expect("apply");
    assert_eq!(
        fields(&obj, "m"),
        r#"{"f:spec":{"f:free":{"f:l":{},"f:x":{".":{},"f:y":{}}}}}"#
    );
    let err = fm
        .apply(None, &widget(json!({"bogus": 1})), "m", false, T0)
        .expect_err("undeclared");
    assert_eq!(err.status_code(), 500);
    assert_eq!(
        err.to_string(),
        "failed to create typed patch object (default/w; demo.kshard.dev/v1, Kind=Widget): .spec.bogus: field not declared in schema"
    );
}

#[test]
fn schemaless_objects_are_fully_deduced() {
    let s = MergeSchema::from_openapi(None);
    let fm = FieldManager::new(&s, V1, None, false);
    let obj = fm
        .apply(
            None,
            &widget(json!({"m": {"k": "v"}, "l": [{"a": 1}]})),
            "m",
            false,
            T0,
        )
        .expect("apply");
    assert_eq!(
        fields(&obj, "m"),
        r#"{"f:spec":{".":{},"f:l":{},"f:m":{".":{},"f:k":{}}}}"#
    );
}

#[test]
fn update_entries_merge_by_manager_operation_version_and_subresource() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let mut obj = widget(json!({"a": "1"}));
    fm.update(None, &mut obj, "ctl", T0).expect("create");
    let old = stored(obj);
    let mut obj = old.clone();
    obj["spec"]["b"] = json!("2");
    fm.update(Some(&old), &mut obj, "ctl", T1).expect("update");
    assert_eq!(entries(&obj).len(), 1);
    assert_eq!(
        fields(&obj, "ctl"),
        r#"{"f:spec":{".":{},"f:a":{},"f:b":{}}}"#
    );
    assert_eq!(entry(&obj, "ctl")["time"], json!(T1));

    // A write that changes nothing keeps the old time.
    let old = obj.clone();
    let mut same = obj.clone();
    fm.update(Some(&old), &mut same, "ctl", T2).expect("noop");
    assert_eq!(entry(&same, "ctl")["time"], json!(T1));

    // Another version is another entry.
    let s2 = widget_schema();
    let fm2 = FieldManager::new(&s2, "demo.kshard.dev/v2", None, true);
    let mut v2 = at_v2(&obj);
    v2["spec"]["replicas"] = json!(4);
    fm2.update(Some(&obj), &mut v2, "ctl", T2).expect("v2");
    let versions: Vec<&Value> = entries(&v2).iter().map(|e| &e["apiVersion"]).collect();
    assert_eq!(versions, vec![&json!(V1), &json!("demo.kshard.dev/v2")]);

    // The status subresource writes its own entry and never owns spec.
    let fs = FieldManager::new(&s, V1, Some("status"), true);
    let mut st = obj.clone();
    st["status"] = json!({"ready": 1});
    st["spec"]["a"] = json!("ignored-by-strategy");
    fs.update(Some(&obj), &mut st, "ctl", T2).expect("status");
    let e = entries(&st)
        .iter()
        .find(|e| e["subresource"] == json!("status"))
        .expect("status entry");
    assert_eq!(
        serde_json::to_string(&e["fieldsV1"]).expect("json"),
        r#"{"f:status":{".":{},"f:ready":{}}}"#
    );
    assert_eq!(entries(&st).len(), 2);
}

fn at_v2(obj: &Value) -> Value {
    let mut o = obj.clone();
    o["apiVersion"] = json!("demo.kshard.dev/v2");
    o
}

#[test]
fn main_resource_does_not_own_status_when_the_subresource_is_on() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let mut obj = widget(json!({"a": "1"}));
    obj["status"] = json!({"ready": 1});
    fm.update(None, &mut obj, "ctl", T0).expect("create");
    assert_eq!(fields(&obj, "ctl"), r#"{"f:spec":{".":{},"f:a":{}}}"#);
    let off = FieldManager::new(&s, V1, None, false);
    let mut obj = widget(json!({"a": "1"}));
    obj["status"] = json!({"ready": 1});
    off.update(None, &mut obj, "ctl", T0).expect("create");
    assert!(fields(&obj, "ctl").contains("f:status"));
}

#[test]
fn clearing_managed_fields_with_an_empty_list_stops_tracking() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let live = csa_created(&fm);
    let mut cleared = live.clone();
    cleared["metadata"]["managedFields"] = json!([]);
    fm.update(Some(&live), &mut cleared, "ctl", T1)
        .expect("clear");
    assert!(cleared["metadata"].get("managedFields").is_none());

    // Later writes are not tracked...
    let mut next = cleared.clone();
    next["spec"]["a"] = json!("x");
    fm.update(Some(&cleared), &mut next, "ctl", T1)
        .expect("untracked");
    assert!(next["metadata"].get("managedFields").is_none());

    // ...until an apply credits existing fields to before-first-apply.
    let err = fm
        .apply(Some(&next), &widget(json!({"a": "y"})), "m", false, T2)
        .expect_err("conflict");
    assert_eq!(
        err.to_string(),
        r#"Apply failed with 1 conflict: conflict with "before-first-apply" using demo.kshard.dev/v1: .spec.a"#
    );
}

#[test]
fn invalid_managed_fields_in_a_request_fall_back_to_live() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let live = csa_created(&fm);
    let mut new = live.clone();
    new["metadata"]["managedFields"] =
        json!([{"manager": "x", "operation": "Bogus", "apiVersion": V1}]);
    new["spec"]["a"] = json!("1");
    fm.update(Some(&live), &mut new, "ctl", T1).expect("update");
    let names: Vec<&Value> = entries(&new).iter().map(|e| &e["manager"]).collect();
    assert_eq!(
        names,
        vec![&json!("kubectl-client-side-apply"), &json!("ctl")]
    );

    // A valid list from the client replaces the live one.
    let mut new = live.clone();
    new["metadata"]["managedFields"] = json!([{"manager": "x", "operation": "Update", "apiVersion": V1,
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]);
    fm.update(Some(&live), &mut new, "ctl", T1).expect("update");
    assert_eq!(entries(&new).len(), 1);
    assert_eq!(entries(&new)[0]["manager"], json!("x"));
}

#[test]
fn default_manager_from_user_agent() {
    assert_eq!(
        default_manager("kubectl/v1.30.0 (linux/amd64) kubernetes/abc"),
        "kubectl"
    );
    assert_eq!(
        default_manager("kube-controller-manager/v1.30"),
        "kube-controller-manager"
    );
    assert_eq!(default_manager("curl"), "curl");
    assert_eq!(default_manager("a\u{1}b/1"), "ab");
    assert_eq!(default_manager(&"x".repeat(300)).len(), 128);
}

#[test]
fn client_side_apply_migrates_to_kubectl_server_side() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let mut last = widget(json!({"replicas": 1}));
    last["metadata"] = json!({"name": "w", "namespace": "default"});
    let last_text = serde_json::to_string(&last).expect("json");
    let mut obj = widget(json!({"replicas": 1}));
    obj["metadata"]["annotations"] = json!({LAST_APPLIED_ANNOTATION: last_text});
    fm.update(None, &mut obj, "kubectl-client-side-apply", T0)
        .expect("csa");
    let live = stored(obj);

    // replicas still equals last-applied, so the conflict with the CSA manager is waived.
    let cfg = widget(json!({"replicas": 3}));
    let obj = fm
        .apply(Some(&live), &cfg, "kubectl", false, T1)
        .expect("migrated");
    assert_eq!(obj["spec"]["replicas"], json!(3));
    assert_eq!(fields(&obj, "kubectl"), r#"{"f:spec":{"f:replicas":{}}}"#);
    assert_eq!(
        obj["metadata"]["annotations"][LAST_APPLIED_ANNOTATION],
        json!(format!(
            "{}\n",
            r#"{"apiVersion":"demo.kshard.dev/v1","kind":"Widget","metadata":{"name":"w","namespace":"default"},"spec":{"replicas":3}}"#
        ))
    );
    // Another manager gets no such pass.
    assert!(fm.apply(Some(&live), &cfg, "other", false, T1).is_err());

    // Live drifted from last-applied: the conflict stays.
    let mut drifted = live.clone();
    drifted["spec"]["replicas"] = json!(5);
    let mut d2 = drifted.clone();
    fm.update(Some(&live), &mut d2, "kubectl-client-side-apply", T1)
        .expect("drift");
    let err = fm
        .apply(Some(&d2), &cfg, "kubectl", false, T2)
        .expect_err("conflict");
    assert!(err.to_string().ends_with(".spec.replicas"));
}

#[test]
fn apply_in_another_served_version() {
    let s = widget_schema();
    let fm1 = FieldManager::new(&s, V1, None, true);
    let live = csa_created(&fm1);
    let fm2 = FieldManager::new(&s, "demo.kshard.dev/v2", None, true);
    let cfg = at_v2(&widget(json!({"replicas": 7})));
    let err = fm2
        .apply(Some(&live), &cfg, "m", false, T1)
        .expect_err("conflict");
    assert!(err
        .to_string()
        .contains(r#""kubectl-client-side-apply" using demo.kshard.dev/v1"#));
    let obj = fm2
        .apply(
            Some(&live),
            &at_v2(&widget(json!({"a": "z"}))),
            "m",
            false,
            T1,
        )
        .expect("apply");
    assert_eq!(obj["apiVersion"], json!("demo.kshard.dev/v2"));
    assert_eq!(entry(&obj, "m")["apiVersion"], json!("demo.kshard.dev/v2"));
    assert_eq!(
        entry(&obj, "kubectl-client-side-apply")["apiVersion"],
        json!(V1)
    );
    let err = fm1
        .apply(Some(&live), &cfg, "m", false, T1)
        .expect_err("wrong version");
    assert_eq!(
        err.to_string(),
        "invalid object type: demo.kshard.dev/v2, Kind=Widget"
    );
}

#[test]
fn noop_apply_keeps_time_and_rejects_managed_fields_in_config() {
    let s = widget_schema();
    let fm = FieldManager::new(&s, V1, None, true);
    let cfg = widget(json!({"a": "1"}));
    let live = stored(fm.apply(None, &cfg, "m", false, T0).expect("apply"));
    let again = fm.apply(Some(&live), &cfg, "m", false, T2).expect("noop");
    assert_eq!(entry(&again, "m")["time"], json!(T0));
    assert_eq!(again, live);
    let mut bad = cfg.clone();
    bad["metadata"]["managedFields"] = json!([]);
    let err = fm
        .apply(Some(&live), &bad, "m", false, T1)
        .expect_err("managedFields");
    assert_eq!(
        err,
        ApplyError::BadRequest("metadata.managedFields must be nil".into())
    );
}

// ------------------------------------------------- managers at other versions

const G1: &str = "demo.kshard.dev/v1";
const G2: &str = "demo.kshard.dev/v2";

/// Two versions that name one field differently (v1 `spec.size`, v2
/// `spec.replicas`), converted as a webhook would, counting the calls.
struct Renaming {
    v1: MergeSchema,
    v2: MergeSchema,
    /// (objects, target version) of every conversion call.
    calls: std::sync::Mutex<Vec<(usize, String)>>,
    fail: bool,
}

impl Renaming {
    fn new() -> Renaming {
        let schema = |field: &str| {
            MergeSchema::from_openapi(Some(&json!({
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    field: {"type": "integer"}, "a": {"type": "string"}}}}
            })))
        };
        Renaming {
            v1: schema("size"),
            v2: schema("replicas"),
            calls: std::sync::Mutex::new(Vec::new()),
            fail: false,
        }
    }

    fn calls(&self) -> Vec<(usize, String)> {
        self.calls.lock().expect("lock").clone()
    }

    fn fm(&self, api_version: &str) -> FieldManager<'_> {
        let schema = if api_version == G1 {
            &self.v1
        } else {
            &self.v2
        };
        FieldManager::new(schema, api_version, None, false).with_versions(Box::new(self))
    }
}

fn rename(obj: &Value, to: &str) -> Value {
    let mut out = obj.clone();
    out["apiVersion"] = json!(to);
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
        let (from, into) = if to == G2 {
            ("size", "replicas")
        } else {
            ("replicas", "size")
        };
        if let Some(v) = spec.remove(from) {
            spec.insert(into.into(), v);
        }
    }
    out
}

impl Versions for &Renaming {
    fn schema(&self, api_version: &str) -> Option<&MergeSchema> {
        match api_version {
            G1 => Some(&self.v1),
            G2 => Some(&self.v2),
            _ => None,
        }
    }
    fn rewrites_only(&self) -> bool {
        false
    }
    fn convert(&self, objs: &[&Value], api_version: &str) -> Result<Vec<Value>, ConvertError> {
        self.calls
            .lock()
            .expect("lock")
            .push((objs.len(), api_version.to_string()));
        if self.fail {
            return Err(ConvertError::Failed("webhook down".into()));
        }
        if self.schema(api_version).is_none() {
            return Err(ConvertError::MissingVersion(api_version.into()));
        }
        Ok(objs.iter().map(|o| rename(o, api_version)).collect())
    }
}

fn gadget(api_version: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": "Gadget",
           "metadata": {"name": "g", "namespace": "default"}, "spec": spec})
}

/// "a" applies `size` through v1; the object as v2 readers see it.
fn applied_by_a_through_v1(r: &Renaming) -> Value {
    let obj = r
        .fm(G1)
        .apply(None, &gadget(G1, json!({"size": 1})), "a", false, T0)
        .expect("a applies");
    rename(&stored(obj), G2)
}

#[test]
fn conflicts_are_found_and_named_at_the_owners_version() {
    let r = Renaming::new();
    let live = applied_by_a_through_v1(&r);
    let cfg = gadget(G2, json!({"replicas": 2}));
    let err = r
        .fm(G2)
        .apply(Some(&live), &cfg, "b", false, T1)
        .expect_err("conflict");
    assert_eq!(
        err.to_string(),
        r#"Apply failed with 1 conflict: conflict with "a": .spec.size"#
    );
    // Old and new went to v1 in one call.
    assert_eq!(r.calls(), [(2, G1.to_string())]);

    // Forced: "b" owns replicas at v2, "a" loses size (its only field).
    let obj = r
        .fm(G2)
        .apply(Some(&live), &cfg, "b", true, T1)
        .expect("forced");
    assert_eq!(obj["spec"]["replicas"], json!(2));
    assert_eq!(entries(&obj).len(), 1, "{obj}");
    assert_eq!(entry(&obj, "b")["apiVersion"], json!(G2));
    assert_eq!(fields(&obj, "b"), r#"{"f:spec":{"f:replicas":{}}}"#);
}

#[test]
fn an_apply_with_the_same_value_at_another_version_shares_the_field() {
    let r = Renaming::new();
    let live = applied_by_a_through_v1(&r);
    let obj = r
        .fm(G2)
        .apply(
            Some(&live),
            &gadget(G2, json!({"replicas": 1})),
            "b",
            false,
            T1,
        )
        .expect("no conflict");
    assert_eq!(fields(&obj, "a"), r#"{"f:spec":{"f:size":{}}}"#);
    assert_eq!(fields(&obj, "b"), r#"{"f:spec":{"f:replicas":{}}}"#);
    // Nothing changed: old and new are one object, sent once.
    assert_eq!(r.calls(), [(1, G1.to_string())]);
}

#[test]
fn updates_at_another_version_take_and_remove_fields_in_the_owners_names() {
    let r = Renaming::new();
    let mut live = applied_by_a_through_v1(&r);
    live["metadata"]["managedFields"][0]["fieldsV1"] = json!({"f:spec": {"f:size": {}, "f:a": {}}});
    live["spec"]["a"] = json!("x");

    // A PUT through v2 changing replicas: "a" keeps only `a`.
    let mut new = live.clone();
    new["spec"]["replicas"] = json!(5);
    r.fm(G2)
        .update(Some(&live), &mut new, "editor", T1)
        .expect("update");
    assert_eq!(fields(&new, "a"), r#"{"f:spec":{"f:a":{}}}"#);
    assert_eq!(
        entry(&new, "editor")["apiVersion"],
        json!(G2),
        "the writer's entry is at its own version"
    );

    // Removing `a` through v2 drops it from "a" too.
    let live = stored(new);
    let mut new = live.clone();
    if let Some(spec) = new["spec"].as_object_mut() {
        spec.remove("a");
    }
    r.fm(G2)
        .update(Some(&live), &mut new, "editor", T2)
        .expect("update");
    assert!(
        entries(&new).iter().all(|e| e["manager"] != json!("a")),
        "{new}"
    );
}

#[test]
fn managers_at_missing_versions_are_dropped() {
    let r = Renaming::new();
    let mut live = applied_by_a_through_v1(&r);
    let mut stale = live["metadata"]["managedFields"][0].clone();
    stale["manager"] = json!("old");
    stale["apiVersion"] = json!("demo.kshard.dev/v0");
    stale["operation"] = json!("Update");
    if let Some(list) = live["metadata"]["managedFields"].as_array_mut() {
        list.push(stale);
    }
    let obj = r
        .fm(G2)
        .apply(Some(&live), &gadget(G2, json!({"a": "y"})), "b", false, T1)
        .expect("apply");
    let managers: Vec<&Value> = entries(&obj).iter().map(|e| &e["manager"]).collect();
    assert_eq!(managers, [&json!("a"), &json!("b")], "{obj}");
}

#[test]
fn the_last_applied_set_is_pruned_at_its_own_version() {
    let r = Renaming::new();
    let obj = r
        .fm(G1)
        .apply(
            None,
            &gadget(G1, json!({"size": 1, "a": "x"})),
            "a",
            false,
            T0,
        )
        .expect("a applies");
    let live = rename(&stored(obj), G2);
    // "a" applies again through v2 without the field it owned as `size`.
    let obj = r
        .fm(G2)
        .apply(Some(&live), &gadget(G2, json!({"a": "x"})), "a", false, T1)
        .expect("apply");
    assert!(obj["spec"].get("replicas").is_none(), "{obj}");
    assert_eq!(entry(&obj, "a")["apiVersion"], json!(G2));
    assert_eq!(fields(&obj, "a"), r#"{"f:spec":{"f:a":{}}}"#);
}

#[test]
fn a_failing_conversion_fails_an_apply_and_keeps_live_entries_on_update() {
    let mut r = Renaming::new();
    let live = applied_by_a_through_v1(&r);
    r.fail = true;
    let err = r
        .fm(G2)
        .apply(
            Some(&live),
            &gadget(G2, json!({"replicas": 2})),
            "b",
            true,
            T1,
        )
        .expect_err("fails");
    assert_eq!(err, ApplyError::Internal("webhook down".into()));
    let mut new = live.clone();
    new["spec"]["replicas"] = json!(3);
    r.fm(G2)
        .update(Some(&live), &mut new, "editor", T1)
        .expect("update");
    assert_eq!(
        new["metadata"]["managedFields"],
        live["metadata"]["managedFields"]
    );
}

/// The create path's direct walk owns exactly what the general comparison
/// against the live stub finds added, for every kind of field.
#[test]
fn create_walk_matches_the_comparison_with_the_stub() {
    let s = widget_schema();
    let stub = json!({"apiVersion": V1, "kind": "Widget"});
    let objects = [
        widget(json!({"replicas": 2, "a": "x", "labels": {}, "selector": {"k": "v"}})),
        widget(
            json!({"tags": ["x", "y", "x"], "args": ["a", "a"], "containers": [
            {"name": "c", "image": "1"}, {"name": "d"}, {"name": "d", "image": "2"}, {"image": "no-key"}, 3]}),
        ),
        widget(json!({"free": {"deep": {"er": [1, {"x": null}]}, "e": {}}, "labels": {"a": "b"}})),
        widget(json!({"containers": [], "tags": [], "unknown": {"n": [1, 2]}, "b": null})),
        json!({"apiVersion": V1, "kind": "Widget", "metadata": {"name": "w", "labels": {"a": "1"}},
            "status": {"ready": 1}, "spec": "not a map"}),
    ];
    for obj in &objects {
        let cmp = merge::compare(&s.root, &stub, obj);
        let mut expected = cmp.added;
        expected.union_with(cmp.modified);
        let walked = merge::added_over(&s.root, &stub, obj).expect("a map over its stub");
        assert_eq!(
            walked.to_fields_v1_string(),
            expected.to_fields_v1_string(),
            "{obj}"
        );
    }
    // Not over the stub: a differing or extra live field takes the general path.
    let other = json!({"apiVersion": "demo.kshard.dev/v2", "kind": "Widget"});
    assert!(merge::added_over(&s.root, &other, &objects[0]).is_none());
    assert!(merge::added_over(&s.root, &json!({"x": 1}), &objects[0]).is_none());
}
