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

/// A definitions directory with other objects beside the CRDs (as projects
/// ship them): the CRDs are served, the rest named once in the log.
#[tokio::test(flavor = "multi_thread")]
async fn documents_that_are_not_crds_are_skipped_and_named() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tmp");
    let crds = dir.path().join("crds");
    std::fs::create_dir_all(&crds).expect("mkdir");
    let good =
        std::fs::read_to_string(common::repo_path("crds/examples/widgets.yaml")).expect("example");
    let policy = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: widgets-policy}\nspec: {validations: [{expression: 'true'}]}\n";
    let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: widget-editor}\nrules: []\n";
    std::fs::write(
        crds.join("all.yaml"),
        format!("{policy}---\n{good}\n---\n{role}"),
    )
    .expect("write");
    let log = dir.path().join("stderr.log");
    let mut child = common::KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_kshard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--crds"])
            .arg(&crds)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    let stdout = child.stdout.take().expect("stdout");
    let first = BufReader::new(stdout)
        .lines()
        .next()
        .expect("a line")
        .expect("utf8");
    assert!(first.starts_with("kshard is serving"), "{first}");
    let client = common::client_for(&dir.path().join("data/kubeconfig")).await;
    let req = http::Request::get(common::WIDGETS)
        .body(Vec::new())
        .expect("req");
    client.request_text(req).await.expect("the CRD is served");
    let stderr = std::fs::read_to_string(&log).expect("log");
    let skipped: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("were skipped"))
        .collect();
    assert_eq!(skipped.len(), 1, "one line: {stderr}");
    assert!(
        skipped[0]
            .contains("document 0 (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy)")
            && skipped[0].contains("document 2 (rbac.authorization.k8s.io/v1 ClusterRole)"),
        "{stderr}"
    );
}

/// `--logging-format=json` writes one JSON object per line with kube's keys
/// (what log pipelines built for kube-apiserver parse); text stays the
/// default.
#[test]
fn json_logs_carry_kubes_keys() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tmp");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--logging-format=json",
            "--crds",
        ])
        .arg(common::repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kshard");
    let stderr = child.stderr.take().expect("stderr");
    let mut serving = None;
    let mut serving_line = String::new();
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        lines.push(v.clone());
        if v["msg"] == "kshard is serving" {
            serving_line = line.clone();
            serving = Some(v);
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let serving = serving.unwrap_or_else(|| panic!("no 'kshard is serving' line: {lines:?}"));
    // Milliseconds since the epoch, as component-base writes them.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as f64;
    assert!(
        serving["ts"]
            .as_f64()
            .is_some_and(|t| t > now_ms - 600_000.0 && t <= now_ms),
        "{serving}"
    );
    assert_eq!(serving["logger"], "kshard::server", "{serving}");
    assert_eq!(serving["v"], 0, "{serving}");
    assert!(
        serving["caller"]
            .as_str()
            .is_some_and(|c| c.starts_with("server/mod.rs:")),
        "{serving}"
    );
    // The event's own fields follow by name.
    assert!(serving["addr"].as_str().is_some(), "{serving}");
    // kube's order, in the line as written (a parsed `Value`'s keys sort).
    let line = &serving_line;
    let at: Vec<usize> = ["ts", "logger", "caller", "msg", "v"]
        .iter()
        .map(|k| line.find(&format!("\"{k}\":")).expect("key"))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
}

/// The server runs with transparent huge pages off: with them, mimalloc's
/// arenas were faulted in 2 MiB at a time, each zeroed whole inside the
/// request that touched it (6 % of a create's CPU at 64 clients, and twice
/// the p99).
#[cfg(target_os = "linux")]
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().expect("tmp");
    let child = common::spawn_kshard(dir.path(), &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "THP_enabled in /proc/<pid>/status");
}
