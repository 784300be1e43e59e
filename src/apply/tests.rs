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
            r#"{"manager":"demo","operation":"Apply","apiVersion":"demo.kshard.dev/v1","time":"2024-05-01T10:00:00Z","#,
            r#""fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{}}},"#,
            r#""f:labels":{"f:app":{}},"f:replicas":{},"f:tags":{"v:\"x\"":{}}}}}"#
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
