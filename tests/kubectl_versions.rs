//! Older kubectl releases against kshard: 1.27 and 1.28 read `/openapi/v2` as
//! protobuf for `explain` and for server-side apply (newer ones use v3), so
//! they work only if that document is served as kube serves it. The
//! versioned binaries ship beside `kubectl` on these machines (the Google
//! Cloud SDK's `kubectl.1.27`, `kubectl.1.28`, …).

mod common;

use std::path::{Path, PathBuf};

/// `kubectl.<version>` next to the `kubectl` on PATH (through its symlink).
fn versioned_kubectl(version: &str) -> PathBuf {
    let which = std::process::Command::new("sh")
        .args(["-c", "command -v kubectl"])
        .output()
        .expect("sh");
    let path = PathBuf::from(String::from_utf8_lossy(&which.stdout).trim());
    let real = std::fs::canonicalize(&path).unwrap_or(path);
    let candidate = real.with_file_name(format!("kubectl.{version}"));
    assert!(
        candidate.exists(),
        "kubectl {version} is expected beside {} (the image ships versioned kubectl binaries)",
        real.display()
    );
    candidate
}

fn run(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=60s")
        .args(args)
        .env(
            "KUBECACHEDIR",
            kubeconfig.with_file_name(format!(
                "kubecache-{}",
                bin.display().to_string().replace('/', "_")
            )),
        );
    let out = common::run_blocking(cmd, stdin);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn widget_yaml(name: &str, replicas: u32, color: &str) -> String {
    format!(
        "apiVersion: demo.kshard.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  replicas: {replicas}\n  color: {color}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_1_27_and_1_28_explain_and_apply_server_side() {
    let s = common::start().await;
    let kubeconfig = s.running.kubeconfig.clone();
    for version in ["1.27", "1.28"] {
        let bin = versioned_kubectl(version);
        let (ok, out) = run(&bin, &kubeconfig, &["version", "--client"], None);
        assert!(ok && out.contains(&format!("v{version}")), "{out}");

        let (ok, out) = run(&bin, &kubeconfig, &["explain", "widgets.spec"], None);
        assert!(ok, "kubectl {version} explain: {out}");
        assert!(out.contains("KIND:") && out.contains("Widget"), "{out}");
        assert!(out.contains("replicas") && out.contains("color"), "{out}");

        let name = format!("w{}", version.replace('.', ""));
        let apply = [
            "apply",
            "--server-side",
            "--field-manager",
            "old-kubectl",
            "-f",
            "-",
        ];
        let (ok, out) = run(
            &bin,
            &kubeconfig,
            &apply,
            Some(&widget_yaml(&name, 1, "blue")),
        );
        assert!(ok, "kubectl {version} apply --server-side: {out}");
        assert!(out.contains("serverside-applied"), "{out}");
        // A changed configuration is applied, and its manager owns the fields.
        let (ok, out) = run(
            &bin,
            &kubeconfig,
            &apply,
            Some(&widget_yaml(&name, 3, "red")),
        );
        assert!(ok, "kubectl {version} second apply: {out}");
        let got = s.get(&format!("{}/{name}", common::WIDGETS)).await.json();
        assert_eq!(got["spec"]["replicas"], 3, "{got}");
        assert_eq!(got["spec"]["color"], "red", "{got}");
        let managers: Vec<&str> = got["metadata"]["managedFields"]
            .as_array()
            .expect("managedFields")
            .iter()
            .filter_map(|m| m["manager"].as_str())
            .collect();
        assert_eq!(managers, ["old-kubectl"], "{got}");
        // Another manager changing an owned field is a conflict, as kube reports it.
        let (ok, out) = run(
            &bin,
            &kubeconfig,
            &[
                "apply",
                "--server-side",
                "--field-manager",
                "other",
                "-f",
                "-",
            ],
            Some(&widget_yaml(&name, 5, "red")),
        );
        assert!(!ok, "a conflict: {out}");
        assert!(
            out.contains("conflict") && out.contains(".spec.replicas"),
            "{out}"
        );
    }
}
