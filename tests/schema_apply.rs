//! Schemas (pruning, defaulting, validation, CEL, fieldValidation, dry-run)
//! and server-side apply with managedFields, through kubectl and kube-rs.

mod common;

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;

const THING: &str = "apiVersion: test.kshard.dev/v1
kind: Thing
metadata:
  name: t1
spec:
  id: a1
  replicas: 2
  ports:
  - {name: http, port: 80}
";

fn things(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("test.kshard.dev", "v1", "Thing");
    Api::namespaced_with(client.clone(), "default", &ApiResource::from_gvk(&gvk))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn field_validation_defaults_and_dry_run_with_kubectl() {
    let s = common::start().await;
    let bogus = THING.replace("  id: a1\n", "  id: a1\n  bogus: 1\n");
    // kubectl's default --validate=strict: the server refuses unknown fields.
    let out = s.kubectl_stdin(&["create", "-f", "-"], &bogus);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("strict decoding error: unknown field \"spec.bogus\""),
        "{}",
        stderr(&out)
    );
    // --validate=warn: created, the field dropped, the warning shown.
    let out = s.kubectl_stdin(&["create", "--validate=warn", "-f", "-"], &bogus);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Warning: unknown field \"spec.bogus\""),
        "{}",
        stderr(&out)
    );
    let got: serde_json::Value = serde_json::from_str(&s.kubectl_ok(&[
        "get",
        "thing",
        "t1",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert!(got["spec"].get("bogus").is_none(), "pruned");
    assert_eq!(got["spec"]["size"], "M", "defaulted");
    // Server-side dry run persists nothing.
    let dry = THING.replace("name: t1", "name: t2");
    let out = s.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], &dry);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(server dry run)"));
    assert!(!s.kubectl(&["get", "thing", "t2"]).status.success());
    // create records an Update entry for the manager derived from the User-Agent.
    let managers: Vec<String> = got["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["manager"].as_str().unwrap_or(""),
                e["operation"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(managers, ["kubectl-create/Update"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn validation_errors_are_422_with_field_paths() {
    let s = common::start().await;
    let api = things(&s.client);
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.kshard.dev/v1", "kind": "Thing", "metadata": {"name": "bad"},
        "spec": {"id": "x", "replicas": -1, "size": "XL", "ports": [{"name": "a"}, {"name": "a"}]},
    }))
    .expect("obj");
    let e = api
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("invalid");
    let kube::Error::Api(st) = e else {
        panic!("{e:?}")
    };
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    for needle in ["spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
        "spec.size: Unsupported value: \"XL\"", "spec.ports[1]: Duplicate value"] {
        assert!(st.message.contains(needle), "{needle} in {}", st.message);
    }
    // CEL rule on spec, and a transition rule on update.
    let many: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.kshard.dev/v1", "kind": "Thing", "metadata": {"name": "many"},
        "spec": {"id": "x", "replicas": 7},
    }))
    .expect("obj");
    let kube::Error::Api(st) = api
        .create(&PostParams::default(), &many)
        .await
        .expect_err("cel")
    else {
        panic!()
    };
    assert!(
        st.message.contains("more than 5 replicas need size L"),
        "{}",
        st.message
    );
    let ok: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.kshard.dev/v1", "kind": "Thing", "metadata": {"name": "ok"}, "spec": {"id": "x"},
    }))
    .expect("obj");
    let created = api
        .create(&PostParams::default(), &ok)
        .await
        .expect("create");
    assert_eq!(created.data["spec"]["replicas"], 1, "default");
    let e = api
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"id": "y"}})),
        )
        .await
        .expect_err("immutable");
    let kube::Error::Api(st) = e else { panic!() };
    assert!(st.message.contains("id is immutable"), "{}", st.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn server_side_apply_ownership_and_conflicts() {
    let s = common::start().await;
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], THING);
    assert!(out.status.success(), "{}", stderr(&out));
    let api = things(&s.client);
    let live = api.get("t1").await.expect("get");
    let mf = live.metadata.managed_fields.clone().expect("managedFields");
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("kubectl"), Some("Apply"))
    );
    let fields = serde_json::to_value(&mf[0].fields_v1).expect("fieldsV1");
    assert!(
        fields["f:spec"]["f:ports"]
            .get("k:{\"name\":\"http\"}")
            .is_some(),
        "{fields}"
    );

    // Another manager applying a different replicas value conflicts...
    let other = PatchParams::apply("other");
    let cfg = json!({"apiVersion": "test.kshard.dev/v1", "kind": "Thing", "metadata": {"name": "t1"}, "spec": {"id": "a1", "replicas": 3}});
    let e = api
        .patch("t1", &other, &Patch::Apply(&cfg))
        .await
        .expect_err("conflict");
    let kube::Error::Api(st) = e else {
        panic!("{e:?}")
    };
    assert_eq!(st.code, 409);
    assert_eq!(
        st.message,
        "Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"
    );
    let causes = st.details.expect("details").causes;
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].field, ".spec.replicas");
    // ...unless forced, which moves ownership.
    let forced = api
        .patch("t1", &other.clone().force(), &Patch::Apply(&cfg))
        .await
        .expect("force");
    assert_eq!(forced.data["spec"]["replicas"], 3);
    let owners: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.manager.clone())
        .collect();
    assert!(owners.contains(&"other".to_string()));
    // The same value from two appliers is shared, not a conflict.
    let same = json!({"apiVersion": "test.kshard.dev/v1", "kind": "Thing", "metadata": {"name": "t1"}, "spec": {"id": "a1"}});
    api.patch("t1", &PatchParams::apply("third"), &Patch::Apply(&same))
        .await
        .expect("shared id");
    // kubectl re-applies without replicas: it no longer owns it, and `other` still does.
    let without = THING.replace("  replicas: 2\n", "");
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &without);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        api.get("t1").await.expect("get").data["spec"]["replicas"],
        3
    );
    // fieldManager is required for apply.
    let r = s
        .raw(
            "PATCH",
            "/apis/test.kshard.dev/v1/namespaces/default/things/t1",
            &[("content-type", "application/apply-patch+yaml")],
            b"apiVersion: test.kshard.dev/v1\nkind: Thing\n".to_vec(),
        )
        .await;
    assert_eq!(r.status, 422);
    assert!(r.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("fieldManager: Required value"));
    // Strategic merge patch is refused as for CRDs.
    let r = s
        .raw(
            "PATCH",
            "/apis/test.kshard.dev/v1/namespaces/default/things/t1",
            &[("content-type", "application/strategic-merge-patch+json")],
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(r.status, 415);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_side_apply_then_server_side() {
    let s = common::start().await;
    let out = s.kubectl_stdin(&["apply", "-f", "-"], THING);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("thing.test.kshard.dev/t1 created"));
    let changed = THING.replace("replicas: 2", "replicas: 4");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &changed);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("configured"));
    let live: serde_json::Value = serde_json::from_str(&s.kubectl_ok(&[
        "get",
        "thing",
        "t1",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert_eq!(live["spec"]["replicas"], 4);
    assert!(
        live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    // Moving to server-side apply takes over what client-side apply owned, without conflicts.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        &THING.replace("replicas: 2", "replicas: 5"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let live: serde_json::Value = serde_json::from_str(&s.kubectl_ok(&[
        "get",
        "thing",
        "t1",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert_eq!(live["spec"]["replicas"], 5);
    let ops: Vec<String> = live["metadata"]["managedFields"]
        .as_array()
        .expect("mf")
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["manager"].as_str().unwrap_or(""),
                e["operation"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(ops.contains(&"kubectl/Apply".to_string()), "{ops:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_server_side_apply_conflicts_force_and_edit() {
    let s = common::start().await;
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], THING);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("thing.test.kshard.dev/t1 serverside-applied"));
    // Change through the same manager: no conflict.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        &THING.replace("replicas: 2", "replicas: 3"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Another field manager wanting a different value: kubectl exits 1 with kube's message.
    let theirs = THING.replace("replicas: 2", "replicas: 4");
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=ops", "-f", "-"],
        &theirs,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("Apply failed with 1 conflict: conflict with \"kubectl\": .spec.replicas"),
        "{err}"
    );
    assert!(
        err.contains("Please review the fields above--they currently have other managers"),
        "{err}"
    );
    // --force-conflicts takes the field.
    let out = s.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=ops",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &theirs,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        s.kubectl_ok(&["get", "thing", "t1", "-o", "jsonpath={.spec.replicas}"]),
        "4"
    );
    // Now kubectl conflicts on that field in turn.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        &THING.replace("replicas: 2", "replicas: 5"),
    );
    assert!(
        stderr(&out).contains("conflict with \"ops\""),
        "{}",
        stderr(&out)
    );

    // kubectl patch and kubectl edit with a scripted editor.
    s.kubectl_ok(&[
        "patch",
        "thing",
        "t1",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/spec/tags","value":["a"]}]"#,
    ]);
    s.kubectl_ok(&[
        "patch",
        "thing",
        "t1",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":"S"}}"#,
    ]);
    let editor = s.dir.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/size: S/size: L/' \"$1\"\n").expect("editor");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut edit = std::process::Command::new("kubectl");
    edit.arg("--kubeconfig")
        .arg(&s.running.kubeconfig)
        .args(["edit", "thing", "t1"])
        .env("KUBE_EDITOR", &editor);
    let out = common::run_blocking(edit, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("thing.test.kshard.dev/t1 edited"));
    let got = s.kubectl_ok(&[
        "get",
        "thing",
        "t1",
        "-o",
        "jsonpath={.spec.size} {.spec.tags}",
    ]);
    assert_eq!(got, "L [\"a\"]");
    let managers = s.kubectl_ok(&[
        "get",
        "thing",
        "t1",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    for m in ["kubectl", "ops", "kubectl-patch", "kubectl-edit"] {
        assert!(
            managers.split_whitespace().any(|x| x == m),
            "{m} in {managers}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn updates_ratchet_over_values_they_do_not_change() {
    let s = common::start().await;
    // An object stored before today's rules (written below the API, as an old server would have).
    let legacy = json!({"apiVersion": "test.kshard.dev/v1", "kind": "Thing",
        "metadata": {"name": "legacy", "namespace": "default", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1},
        "spec": {"id": "l", "size": "L", "replicas": 50}});
    s.running
        .store
        .write(kshard::storage::Write::Create {
            key: "test.kshard.dev/things/default/legacy".into(),
            object: legacy,
        })
        .await
        .expect("seed");
    let api = things(&s.client);
    // Touching something else is fine: the invalid replicas value is unchanged.
    api.patch(
        "legacy",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .expect("ratcheted");
    // Changing it to another invalid value is not.
    let e = api
        .patch(
            "legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 60}})),
        )
        .await
        .expect_err("still validated");
    let kube::Error::Api(st) = e else { panic!() };
    assert!(st.message.contains("spec.replicas: Invalid value: 60: spec.replicas in body should be less than or equal to 10"), "{}", st.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_apply_on_read_too() {
    let s = common::start().await;
    // Stored before `size` and `replicas` had defaults.
    let old = json!({"apiVersion": "test.kshard.dev/v1", "kind": "Thing",
        "metadata": {"name": "old", "namespace": "default", "uid": "u-2", "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1},
        "spec": {"id": "o"}});
    let w = s
        .running
        .store
        .write(kshard::storage::Write::Create {
            key: "test.kshard.dev/things/default/old".into(),
            object: old,
        })
        .await
        .expect("seed");
    let got = things(&s.client).get("old").await.expect("get");
    assert_eq!(
        (
            got.data["spec"]["size"].as_str(),
            got.data["spec"]["replicas"].as_i64()
        ),
        (Some("M"), Some(1))
    );
    let r = s.get(&format!("/apis/test.kshard.dev/v1/namespaces/default/things?resourceVersion={}&resourceVersionMatch=Exact", w.revision)).await;
    assert_eq!(r.json()["items"][0]["spec"]["size"], "M");
}

/// Set lists after applies by two managers keep structured-merge-diff's
/// order (config items in order, live-only items where they were), and an
/// applier dropping an item removes it only if nobody else owns it.
#[tokio::test(flavor = "multi_thread")]
async fn set_lists_keep_smds_order_across_appliers() {
    let s = common::start().await;
    let api = things(&s.client);
    let thing = |tags: &[&str]| {
        json!({"apiVersion": "test.kshard.dev/v1", "kind": "Thing",
               "metadata": {"name": "t1"}, "spec": {"id": "a1", "tags": tags}})
    };
    let tags = |o: &DynamicObject| o.data["spec"]["tags"].clone();
    let one = PatchParams::apply("one");
    let two = PatchParams::apply("two");
    let got = api
        .patch("t1", &one, &Patch::Apply(&thing(&["a", "b", "c"])))
        .await
        .expect("one");
    assert_eq!(tags(&got), json!(["a", "b", "c"]));
    let got = api
        .patch("t1", &two, &Patch::Apply(&thing(&["d", "a"])))
        .await
        .expect("two");
    // smd walks both lists: "d" (config only) comes before the shared "a".
    assert_eq!(tags(&got), json!(["d", "a", "b", "c"]));
    let got = api
        .patch("t1", &one, &Patch::Apply(&thing(&["c"])))
        .await
        .expect("one again");
    // b is gone (only "one" owned it); a stays (two owns it).
    assert_eq!(tags(&got), json!(["d", "a", "c"]));
}
