//! The real kubectl against a real kshard.

mod common;

const W1: &str = "apiVersion: demo.kshard.dev/v1
kind: Widget
metadata:
  name: w1
  labels: {app: demo}
spec:
  replicas: 3
  color: blue
";

fn widget_yaml(name: &str, replicas: i64) -> String {
    W1.replace("name: w1", &format!("name: {name}"))
        .replace("replicas: 3", &format!("replicas: {replicas}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn api_resources_and_discovery() {
    let s = common::start().await;
    let out = s.kubectl_ok(&["api-resources", "--api-group=demo.kshard.dev"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("widgets"))
        .expect("widgets listed");
    assert!(
        line.contains("wd")
            && line.contains("demo.kshard.dev/v1")
            && line.contains("true")
            && line.contains("Widget"),
        "{line}"
    );
    let out = s.kubectl_ok(&["api-resources", "--api-group=test.kshard.dev", "-o", "wide"]);
    assert!(out.contains("gadgets") && out.contains("false"), "{out}");
    let versions = s.kubectl_ok(&["api-versions"]);
    assert!(
        versions.contains("demo.kshard.dev/v1") && versions.contains("test.kshard.dev/v1beta1")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn create_get_tables_yaml_json() {
    let s = common::start().await;
    let out = s.kubectl_stdin(&["create", "-f", "-"], W1);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "widget.demo.kshard.dev/w1 created"
    );

    // Server-side table with the CRD's printer columns (priority 1 only with -o wide).
    let table = s.kubectl_ok(&["get", "widgets"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "REPLICAS", "COLOR", "AGE"]);
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(&row[..3], ["w1", "3", "blue"]);
    let wide = s.kubectl_ok(&["get", "wd", "-o", "wide"]);
    assert!(wide.lines().next().expect("header").contains("READY"));

    let yaml = s.kubectl_ok(&["get", "widget", "w1", "-o", "yaml"]);
    assert!(
        yaml.contains("kind: Widget") && yaml.contains("replicas: 3") && yaml.contains("uid:"),
        "{yaml}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&s.kubectl_ok(&["get", "wd", "w1", "-o", "json"])).expect("json");
    assert_eq!(json["metadata"]["generation"], 1);
    assert_eq!(json["metadata"]["namespace"], "default");

    let dup = s.kubectl_stdin(&["create", "-f", "-"], W1);
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr)
        .contains("widgets.demo.kshard.dev \"w1\" already exists"));
    let missing = s.kubectl(&["get", "wd", "nope"]);
    assert!(String::from_utf8_lossy(&missing.stderr)
        .contains("widgets.demo.kshard.dev \"nope\" not found"));
}

#[tokio::test(flavor = "multi_thread")]
async fn chunked_get_over_many_objects() {
    let s = common::start().await;
    for i in 0..9 {
        let out = s.kubectl_stdin(&["create", "-f", "-"], &widget_yaml(&format!("c{i}"), i));
        assert!(out.status.success());
    }
    let out = s.kubectl(&["get", "wd", "--chunk-size=2", "-v=6"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, (0..9).map(|i| format!("c{i}")).collect::<Vec<_>>());
    // Five pages of two: the pager really followed continue tokens.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("continue=").count(), 4, "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replace_label_annotate_scale() {
    let s = common::start().await;
    assert!(s.kubectl_stdin(&["create", "-f", "-"], W1).status.success());
    s.kubectl_ok(&["label", "wd", "w1", "tier=front"]);
    s.kubectl_ok(&["annotate", "wd", "w1", "note=hello"]);
    let got = s.kubectl_ok(&[
        "get",
        "wd",
        "w1",
        "-o",
        "jsonpath={.metadata.labels.tier} {.metadata.annotations.note} {.metadata.generation}",
    ]);
    assert_eq!(got, "front hello 1");
    // Selecting by the new label.
    let sel = s.kubectl_ok(&["get", "wd", "-l", "tier=front", "-o", "name"]);
    assert_eq!(sel.trim(), "widget.demo.kshard.dev/w1");
    assert_eq!(
        s.kubectl_ok(&["get", "wd", "-l", "tier!=front", "-o", "name"])
            .trim(),
        ""
    );

    let current = s.kubectl_ok(&["get", "wd", "w1", "-o", "yaml"]);
    let replaced = current.replace("replicas: 3", "replicas: 5");
    let out = s.kubectl_stdin(&["replace", "-f", "-"], &replaced);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = s.kubectl_ok(&[
        "get",
        "wd",
        "w1",
        "-o",
        "jsonpath={.spec.replicas} {.metadata.generation}",
    ]);
    assert_eq!(got, "5 2");
    // The same stale manifest again: optimistic concurrency says no.
    let stale = s.kubectl_stdin(&["replace", "-f", "-"], &replaced);
    assert!(!stale.status.success());
    assert!(String::from_utf8_lossy(&stale.stderr).contains("the object has been modified"));

    s.kubectl_ok(&["scale", "wd", "w1", "--replicas=7"]);
    assert_eq!(
        s.kubectl_ok(&["get", "wd", "w1", "-o", "jsonpath={.spec.replicas}"]),
        "7"
    );
    let fs = s.kubectl_ok(&[
        "get",
        "wd",
        "--field-selector",
        "spec.color=blue",
        "-o",
        "name",
    ]);
    assert_eq!(fs.trim(), "widget.demo.kshard.dev/w1");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_with_finalizer_then_wait_for_delete() {
    let s = common::start().await;
    let with_finalizer = W1.replace(
        "  labels: {app: demo}\n",
        "  finalizers: [demo.kshard.dev/hold]\n",
    );
    assert!(s
        .kubectl_stdin(&["create", "-f", "-"], &with_finalizer)
        .status
        .success());
    let out = s.kubectl_ok(&["delete", "wd", "w1", "--wait=false"]);
    assert_eq!(out.trim(), "widget.demo.kshard.dev \"w1\" deleted");
    // Still there, marked for deletion.
    let ts = s.kubectl_ok(&[
        "get",
        "wd",
        "w1",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ]);
    assert!(!ts.is_empty());
    // No new finalizers while deleting.
    let add = s.kubectl(&[
        "patch",
        "wd",
        "w1",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["demo.kshard.dev/hold","x.dev/more"]}}"#,
    ]);
    assert!(String::from_utf8_lossy(&add.stderr)
        .contains("no new finalizers can be added if the object is being deleted"));

    let kubeconfig = s.running.kubeconfig.clone();
    let waiter = std::thread::spawn(move || {
        common::kubectl_with(
            &kubeconfig,
            &["wait", "--for=delete", "wd/w1", "--timeout=30s"],
            None,
        )
    });
    common::eventually("kubectl wait is watching", || async {
        s.running.registry.watchers_of("demo.kshard.dev/widgets") > 0
    })
    .await;
    s.kubectl_ok(&[
        "patch",
        "wd",
        "w1",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    let waited = tokio::task::spawn_blocking(move || waiter.join().expect("join"))
        .await
        .expect("wait");
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert!(String::from_utf8_lossy(&waited.stdout).contains("condition met"));
    let gone = s.kubectl(&["get", "wd", "w1"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not found"));
}

#[tokio::test(flavor = "multi_thread")]
async fn get_watch_streams_changes() {
    let s = common::start().await;
    assert!(s.kubectl_stdin(&["create", "-f", "-"], W1).status.success());
    let watch = common::KubectlStream::spawn(
        &s.running.kubeconfig,
        &[
            "get",
            "wd",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,R:.spec.replicas",
        ],
    );
    // The initial list (header, then w1 at 3 replicas) means the watch is open.
    watch.wait_for_row(&["w1", "3"]);
    s.kubectl_ok(&["scale", "wd", "w1", "--replicas=9"]);
    watch.wait_for_row(&["w1", "9"]);
    assert!(s
        .kubectl_stdin(&["create", "-f", "-"], &widget_yaml("w2", 1))
        .status
        .success());
    watch.wait_for_row(&["w2", "1"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_and_other_versions() {
    let s = common::start().await;
    let g =
        "apiVersion: test.kshard.dev/v1beta1\nkind: Gadget\nmetadata:\n  name: g1\nspec:\n  x: 1\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], g);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v1 = s.kubectl_ok(&[
        "get",
        "gadgets.v1.test.kshard.dev",
        "g1",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert_eq!(v1, "test.kshard.dev/v1");
    let beta = s.kubectl_ok(&[
        "get",
        "gadgets.v1beta1.test.kshard.dev",
        "g1",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert_eq!(beta, "test.kshard.dev/v1beta1");
    let table = s.kubectl_ok(&["get", "gd"]);
    assert!(
        table.starts_with("NAME") && table.contains("AGE") && table.contains("g1"),
        "{table}"
    );
    s.kubectl_ok(&["delete", "gd", "g1"]);
}
