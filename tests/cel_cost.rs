//! CEL cost limits as kube-apiserver applies them (issue 15): a definition whose
//! `x-kubernetes-validations` rules are too expensive for their schema's bounds is
//! refused when it is loaded, through the CustomResourceDefinition API and from a
//! definitions directory, and a rule whose cost over one large object exceeds the
//! per-call limit is stopped with kube's error before it runs, while the server goes on
//! serving. Expected texts are apiextensions-apiserver's (`validation.go`,
//! `schema/cel/validation.go`).

mod common;

use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const HINT: &str = "(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)";

/// A `Thing` whose `spec.names` list carries `rule`; `bounds` are added to the list
/// schema and `item` bounds to its string items.
fn crd(rule: &str, bounds: Value, item: Value) -> Value {
    let mut names = json!({"type": "array", "items": {"type": "string"},
        "x-kubernetes-validations": [{"rule": rule, "message": "names must be unique"}]});
    for (k, v) in bounds.as_object().into_iter().flatten() {
        names[k] = v.clone();
    }
    for (k, v) in item.as_object().into_iter().flatten() {
        names["items"][k] = v.clone();
    }
    common::crd(
        "cel.kshard.dev",
        "costlies",
        "Costly",
        json!({"names": names}),
    )
}

const UNIQUE: &str = "self.all(x, self.exists_one(y, y == x))";

fn rule_field() -> &'static str {
    "spec.validation.openAPIV3Schema.properties[spec].properties[names].x-kubernetes-validations[0].rule"
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unbounded_quadratic_rule_is_refused_and_loads_once_bounded() {
    let s = common::start().await;
    let r = s.post_json(CRDS, &crd(UNIQUE, json!({}), json!({}))).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let st = r.json();
    assert_eq!(st["reason"], "Invalid");
    let listed = st["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let causes: Vec<(String, String, String)> = listed
        .iter()
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or("").to_string(),
                c["field"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        causes,
        vec![
            (
                "FieldValueForbidden".to_string(),
                rule_field().to_string(),
                format!("Forbidden: estimated rule cost exceeds budget by factor of more than 100x {HINT}"),
            ),
            (
                "FieldValueForbidden".to_string(),
                rule_field().to_string(),
                "Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema".to_string(),
            ),
            (
                "FieldValueForbidden".to_string(),
                "spec.validation.openAPIV3Schema".to_string(),
                format!("Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x {HINT}"),
            ),
        ]
    );
    assert_eq!(
        st["message"].as_str().unwrap_or(""),
        format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"costlies.cel.kshard.dev\" is invalid: [{}: Forbidden: estimated rule cost exceeds budget by factor of more than 100x {HINT}, {}: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema, spec.validation.openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x {HINT}]",
            rule_field(),
            rule_field()
        )
    );

    // Bounded (900 names of at most 10 characters) the estimate is 6485402: under
    // kube's 10M per rule, so it loads.
    let bounded = crd(UNIQUE, json!({"maxItems": 900}), json!({"maxLength": 10}));
    let r = s.post_json(CRDS, &bounded).await;
    assert_eq!(r.status, 201, "{}", r.text());
}

/// The definitions directory: the server refuses to start and names the document
/// with kube's field error.
#[test]
fn a_definitions_directory_with_an_unbounded_rule_does_not_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let crds = dir.path().join("crds");
    std::fs::create_dir_all(&crds).expect("mkdir");
    let doc = serde_json::to_string(&crd(UNIQUE, json!({}), json!({}))).expect("json");
    std::fs::write(crds.join("costly.yaml"), doc).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(&crds)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("run");
    assert!(!out.status.success(), "must refuse to start");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "costly.yaml: document 0: [{}: Forbidden: estimated rule cost exceeds budget by factor of more than 100x",
            rule_field()
        )),
        "{stderr}"
    );
}

/// A rule within the static limit whose cost over one large object is over the per-call
/// limit: kube's error at once (the rule never runs), other requests unaffected.
#[tokio::test(flavor = "multi_thread")]
async fn a_rule_over_the_per_call_limit_on_a_large_object_answers_at_once() {
    let s = common::start().await;
    let bounded = crd(UNIQUE, json!({"maxItems": 900}), json!({"maxLength": 10}));
    let r = s.post_json(CRDS, &bounded).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let things = "/apis/cel.kshard.dev/v1/namespaces/default/costlies";
    common::eventually("costlies are served", || async {
        s.get(things).await.status == 200
    })
    .await;
    let obj = |name: &str, n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        json!({"apiVersion": "cel.kshard.dev/v1", "kind": "Costly",
               "metadata": {"name": name}, "spec": {"names": names}})
    };
    // A small object runs the rule (and passes it).
    let r = s.post_json(things, &obj("small", 20)).await;
    assert_eq!(r.status, 201, "{}", r.text());

    // 900 names: 900 * (3 + 900 * 5 + 3) + 2 = 4055402 > 1M for one call.
    let hostile = obj("big", 900);
    let t = Instant::now();
    let (big, other) = tokio::join!(s.post_json(things, &hostile), async {
        let t = Instant::now();
        let r = s.get("/version").await;
        (r.status, t.elapsed())
    });
    let took = t.elapsed();
    assert_eq!(big.status, 422, "{}", big.text());
    let st = big.json();
    assert_eq!(
        st["message"].as_str().unwrap_or(""),
        "Costly.cel.kshard.dev \"big\" is invalid: spec.names: Invalid value: \"array\": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: names must be unique"
    );
    assert_eq!(st["details"]["causes"][0]["field"], "spec.names");
    assert_eq!(other.0, 200);
    assert!(took < Duration::from_secs(2), "refused in {took:?}");
    assert!(
        other.1 < Duration::from_secs(2),
        "/version took {:?}",
        other.1
    );
    eprintln!(
        "hostile create answered in {took:?}, /version beside it in {:?}",
        other.1
    );
}

/// kube never excuses a spent budget as ratcheting: the rules after it did not
/// run, on changed values too. An object stored before a costly rule existed
/// is not updatable past it, even when the update leaves the list alone.
#[tokio::test(flavor = "multi_thread")]
async fn a_spent_budget_is_not_excused_on_an_unchanged_value() {
    let s = common::start().await;
    let mut def = crd("true", json!({"maxItems": 900}), json!({"maxLength": 10}));
    let r = s.post_json(CRDS, &def).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let things = "/apis/cel.kshard.dev/v1/namespaces/default/costlies";
    common::eventually("costlies are served", || async {
        s.get(things).await.status == 200
    })
    .await;
    let names: Vec<String> = (0..900).map(|i| format!("n{i}")).collect();
    let obj = json!({"apiVersion": "cel.kshard.dev/v1", "kind": "Costly",
                     "metadata": {"name": "old"}, "spec": {"names": names}});
    let r = s.post_json(things, &obj).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The definition gains the costly rule.
    let current = s
        .get(&format!("{CRDS}/costlies.cel.kshard.dev"))
        .await
        .json();
    def["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    def["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["names"]["x-kubernetes-validations"][0]["rule"] = json!(UNIQUE);
    let r = s
        .raw(
            "PUT",
            &format!("{CRDS}/costlies.cel.kshard.dev"),
            &[("content-type", "application/json")],
            serde_json::to_vec(&def).expect("json"),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // A label change leaves spec.names as it was; the rule still runs out.
    let patch = br#"{"metadata":{"labels":{"touched":"yes"}}}"#.to_vec();
    // The change takes effect within moments (the catalog is replaced live).
    let mut last = String::new();
    let mut refused = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !refused && Instant::now() < deadline {
        let r = s
            .raw(
                "PATCH",
                &format!("{things}/old"),
                &[("content-type", "application/merge-patch+json")],
                patch.clone(),
            )
            .await;
        last = r.text();
        refused = r.status == 422;
        if !refused {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(refused, "{last}");
    assert!(
        last.contains("no further validation rules will be run due to call cost exceeds limit"),
        "{last}"
    );
}
