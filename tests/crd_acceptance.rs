//! Which CustomResourceDefinitions are accepted is what the real
//! kube-apiserver says, not our reading of it: every definition here is
//! sent to the reference kube-apiserver v1.36.2 (a server-side dry run) and
//! to kshard's own CRD validation, and both must agree, field path and
//! all for the refusals. The set: the public projects' CRDs in
//! `../shared/realworld-crds`, kshard's own, and definitions made to sit on
//! either side of kube's limits (CEL cost, defaults against their schema).

mod common;

use common::real_host::RealHost;
use serde_json::{json, Value};

/// kshard's verdict: the errors of its CRD validation and of the catalog's
/// own check (schema compilation, CEL cost), as a create through its API
/// runs them (empty: accepted).
fn kshard_errors(crd: &Value) -> Vec<String> {
    let mut d = crd.clone();
    kshard::apiextensions::crd_resource::set_defaults(&mut d);
    let mut errs: Vec<String> = kshard::apiextensions::validation::validate_create(&d)
        .iter()
        .map(|e| e.to_string())
        .collect();
    if errs.is_empty() {
        match kshard::apiextensions::catalog::check_definition(&d) {
            Ok(()) => {}
            Err(kshard::apiextensions::catalog::DefinitionError::Fields(f)) => {
                errs.extend(f.iter().map(|e| e.to_string()))
            }
            Err(e) => errs.push(e.to_string()),
        }
    }
    errs
}

/// kube's verdict: the dry run's stderr (empty: accepted).
fn kube_errors(host: &RealHost, crd: &Value) -> String {
    let out = host.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], &crd.to_string());
    if out.status.success() {
        String::new()
    } else {
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn definitions(dir: &std::path::Path) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for p in files {
        let text = std::fs::read_to_string(&p).expect("read");
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("yaml");
        for d in docs {
            if d["kind"] == "CustomResourceDefinition" {
                out.push((p.display().to_string(), d));
            }
        }
    }
    out
}

/// A definition whose list items (objects, no `maxItems`) carry one rule.
fn list_rule_crd(name: &str, rule: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{name}s.edge.kshard.dev")},
        "spec": {"group": "edge.kshard.dev", "scope": "Namespaced",
            "names": {"plural": format!("{name}s"), "kind": name.to_uppercase()},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "items": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                            "x-kubernetes-validations": [{"rule": rule}],
                        }},
                    }},
                }}}}]},
    })
}

/// A definition with a `default` outside its field's `enum`.
fn default_outside_enum() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "levels.edge.kshard.dev"},
        "spec": {"group": "edge.kshard.dev", "scope": "Cluster",
            "names": {"plural": "levels", "kind": "Level"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "type": {"type": "string", "enum": ["Exempt", "Limited"], "default": ""},
                        "limit": {"type": "object", "default": {"kind": ""}, "properties": {
                            "kind": {"type": "string", "enum": ["Queue", "Reject"]}}},
                        "fine": {"type": "string", "enum": ["a", "b"], "default": "a"},
                    }},
                }}}}]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kshard_accepts_and_refuses_definitions_as_the_real_api_server_does() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());

    let mut cases = definitions(&common::repo_path("../shared/realworld-crds"));
    assert!(cases.len() >= 8, "the real-world CRDs are missing");
    cases.extend(definitions(&common::repo_path("crds/flowcontrol")));
    cases.extend(definitions(&common::repo_path("crds/apiextensions")));
    cases.extend(definitions(&common::repo_path("crds/examples")));
    // Cost at kube's edge: items of an unbounded list of objects count
    // 1,048,575 times against the 10,000,000 a rule may cost, so a rule
    // costing 9 passes and 10 does not. `has(self.x)` costs its operand
    // alone in kube (the presence test is free).
    let has_chain = |n: usize| {
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    "has(self.a)"
                } else {
                    "has(self.b)"
                }
            })
            .collect::<Vec<_>>()
            .join(" && ")
    };
    cases.push(("cost 9".into(), list_rule_crd("nine", &has_chain(9))));
    cases.push(("cost 10".into(), list_rule_crd("ten", &has_chain(10))));
    cases.push((
        "kyverno's pattern".into(),
        list_rule_crd(
            "onlyone",
            "(has(self.a) && !has(self.b)) || (!has(self.a) && has(self.b))",
        ),
    ));
    cases.push(("default outside enum".into(), default_outside_enum()));

    let mut disagreements = Vec::new();
    for (name, crd) in &cases {
        let kube = kube_errors(&host, crd);
        let ours = kshard_errors(crd);
        let agree = if kube.is_empty() {
            ours.is_empty()
        } else {
            // Refused by both, in kube's words: every error kshard gives
            // (field path, kind and detail) appears in kube's answer.
            !ours.is_empty() && ours.iter().all(|e| kube.contains(e.as_str()))
        };
        println!(
            "{name} {}: kube {}, kshard {}",
            crd["metadata"]["name"],
            if kube.is_empty() {
                "accepts"
            } else {
                "refuses"
            },
            if ours.is_empty() {
                "accepts"
            } else {
                "refuses"
            }
        );
        if !agree {
            disagreements.push(format!(
                "{name} ({}):\n  kube: {}\n  kshard: {ours:?}",
                crd["metadata"]["name"],
                if kube.is_empty() {
                    "accepted"
                } else {
                    kube.trim()
                }
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "kshard and kube-apiserver disagree on {} of {} definitions:\n{}",
        disagreements.len(),
        cases.len(),
        disagreements.join("\n")
    );
}
