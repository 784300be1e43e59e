//! The `kshard` binary's start-up contract.

mod common;

use std::process::Command;

#[test]
fn malformed_crd_refuses_to_start_and_names_the_document() {
    let dir = tempfile::tempdir().expect("tmp");
    let crds = dir.path().join("crds");
    std::fs::create_dir_all(&crds).expect("mkdir");
    let good =
        std::fs::read_to_string(common::repo_path("crds/examples/widgets.yaml")).expect("example");
    let bad = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: things.x.dev}\nspec:\n  group: x.dev\n  scope: Sideways\n  names: {plural: things, kind: Thing}\n  versions: [{name: v1, served: true, storage: true}]\n";
    std::fs::write(crds.join("bad.yaml"), format!("{good}\n---\n{bad}")).expect("write");
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
        stderr.contains(
            "bad.yaml: document 1: spec.scope \"Sideways\" must be Namespaced or Cluster"
        ),
        "{stderr}"
    );
    assert!(
        !dir.path().join("data/kubeconfig").exists(),
        "nothing was served"
    );
}

#[test]
fn yaml_syntax_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("broken.yaml"), "kind: [unclosed\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
        .arg(dir.path())
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml: invalid YAML"), "{stderr}");
}
