//! kshard behind the REAL HOST (`common::real_host`: etcd and the reference
//! kube-apiserver v1.36.2 on loopback), installed from the shipped
//! manifests and used as an operator and their users would: kubectl and
//! kube-rs pointed at the **host's** address, every request to kshard's
//! group going through kube-aggregator.

mod common;

use common::send;

use std::time::Duration;

use common::real_host::{poll, RealHost, ALICE, BOB, NAMESPACE};
use serde_json::{json, Value};

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn widget_yaml(name: &str, ns: &str, replicas: i64) -> String {
    json!({
        "apiVersion": "demo.kshard.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "color": "blue"},
    })
    .to_string()
}

/// The whole path a user takes: install from `manifests/base`, the
/// APIService Available, discovery and explain through the host, and every
/// verb kubectl has for a custom resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_from_the_shipped_manifests_and_serves_every_verb_through_the_host() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);

    // Ready, with nothing missing: the shipped RBAC lets kshard follow
    // everything it follows on the host.
    let direct = host.dir.join("direct.kubeconfig");
    kshard.direct_kubeconfig(&direct, None);
    assert!(
        poll(Duration::from_secs(30), || {
            // /readyz is open to everyone, as kube's is.
            common::kubectl_with(&direct, &["get", "--raw", "/readyz"], None)
                .status
                .success()
        }),
        "kshard's /readyz never passed: {}\n{}",
        stdout(&common::kubectl_with(
            &direct,
            &["get", "--raw", "/readyz?verbose"],
            None
        )),
        kshard.log_tail()
    );

    // Discovery and explain through the host.
    // The aggregator's discovery takes kshard's in a moment after the
    // APIService is Available.
    let mut resources = String::new();
    assert!(
        poll(Duration::from_secs(30), || {
            resources = stdout(&host.kubectl(&["api-resources", "--api-group=demo.kshard.dev"]));
            resources.contains("widgets")
        }),
        "{resources}"
    );
    // The host's OpenAPI aggregation fetches kshard's documents on its own
    // schedule after the APIService becomes Available.
    let mut explain = String::new();
    assert!(
        poll(Duration::from_secs(90), || {
            let out = host.kubectl(&["explain", "widgets.spec.replicas"]);
            explain = format!("{}{}", stdout(&out), stderr(&out));
            out.status.success()
        }),
        "kubectl explain through the host: {explain}"
    );
    assert!(explain.contains("Number of desired replicas"), "{explain}");

    // Create, get, list.
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml("w1", "team-a", 1));
    assert!(out.status.success(), "create: {}", stderr(&out));
    let got: Value = serde_json::from_str(
        &host.kubectl_ok(&["get", "widget", "w1", "-n", "team-a", "-o", "json"]),
    )
    .expect("json");
    assert_eq!(got["spec"]["replicas"], 1);
    assert!(got["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty()));
    let table = host.kubectl_ok(&["get", "widgets", "-n", "team-a"]);
    assert!(table.contains("w1"), "{table}");

    // Server-side apply with a field manager, then a conflicting manager.
    let applied = json!({
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "team-a"},
        "spec": {"size": "M"},
    })
    .to_string();
    let out = host.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=gitops",
            "-f",
            "-",
        ],
        &applied,
    );
    assert!(out.status.success(), "apply: {}", stderr(&out));
    let other = applied.replace("\"M\"", "\"S\"");
    let out = host.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        &other,
    );
    assert!(!out.status.success(), "a conflicting apply must fail");
    assert!(
        stderr(&out).contains("conflict") && stderr(&out).contains("gitops"),
        "{}",
        stderr(&out)
    );
    let managers = host.kubectl_ok(&[
        "get",
        "widget",
        "w1",
        "-n",
        "team-a",
        "--show-managed-fields",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(managers.contains("gitops"), "{managers}");

    // Merge and JSON patches.
    host.kubectl_ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "team-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":"L"}}"#,
    ]);
    host.kubectl_ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        "team-a",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":2}]"#,
    ]);
    let spec = host.kubectl_ok(&[
        "get",
        "widget",
        "w1",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.spec.size}/{.spec.replicas}/{.spec.color}",
    ]);
    assert_eq!(spec, "L/2/blue");

    // The scale subresource.
    host.kubectl_ok(&["scale", "widget", "w1", "-n", "team-a", "--replicas=5"]);
    let replicas = host.kubectl_ok(&[
        "get",
        "widget",
        "w1",
        "-n",
        "team-a",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert_eq!(replicas, "5");

    // A namespace the host does not have: 404 naming it, as kube answers.
    let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml("w", "nowhere", 1));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(r#"namespaces "nowhere" not found"#),
        "{}",
        stderr(&out)
    );

    // Delete.
    host.kubectl_ok(&["delete", "widget", "w1", "-n", "team-a"]);
    let out = host.kubectl(&["get", "widget", "w1", "-n", "team-a"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("NotFound") || stderr(&out).contains("not found"));
    drop(kshard);
}

/// Who may do what is the host's RBAC: an ordinary user may list but not
/// create, the refusal names them, and `kubectl auth can-i` agrees (through
/// the host, kube-apiserver applies its RBAC before it proxies, and kshard
/// asks the same RBAC with SubjectAccessReviews: `tests/aggregation.rs`
/// reaches kshard's own decisions straight). A terminating namespace refuses
/// new objects with kube's 403 and cause, and the host's namespace
/// controller's clean-up requests (a metadata list in protobuf, then a
/// delete of the collection) are served through the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_rbac_and_namespaces_govern_kshards_resources() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    host.kubectl_ok(&[
        "create",
        "role",
        "widget-reader",
        "-n",
        "team-a",
        "--verb=get,list,watch",
        "--resource=widgets.demo.kshard.dev",
    ]);
    host.kubectl_ok(&[
        "create",
        "rolebinding",
        "devs-read",
        "-n",
        "team-a",
        "--role=widget-reader",
        "--group=devs",
    ]);
    let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml("w1", "team-a", 1));
    assert!(out.status.success(), "{}", stderr(&out));

    let alice = host.kubeconfig_for(ALICE.0);
    let alice_kubectl = |args: &[&str]| common::kubectl_with(&alice, args, None);
    let listed = alice_kubectl(&["get", "widgets", "-n", "team-a", "-o", "name"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(stdout(&listed).trim(), "widget.demo.kshard.dev/w1");
    let created = common::kubectl_with(
        &alice,
        &["create", "-f", "-"],
        Some(&widget_yaml("w2", "team-a", 1)),
    );
    assert!(!created.status.success());
    assert!(
        stderr(&created).contains(
            r#"widgets.demo.kshard.dev is forbidden: User "alice" cannot create resource "widgets" in API group "demo.kshard.dev" in the namespace "team-a""#
        ),
        "{}",
        stderr(&created)
    );
    let can = |verb: &str| {
        stdout(&alice_kubectl(&[
            "auth",
            "can-i",
            verb,
            "widgets.demo.kshard.dev",
            "-n",
            "team-a",
        ]))
        .trim()
        .to_string()
    };
    assert_eq!(can("list"), "yes");
    assert_eq!(can("create"), "no");
    // Bob has no binding at all.
    let bob = host.kubeconfig_for(BOB.0);
    let out = common::kubectl_with(&bob, &["get", "widgets", "-n", "team-a"], None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(r#"User "bob" cannot list resource "widgets""#),
        "{}",
        stderr(&out)
    );

    // A terminating namespace (no namespace controller runs on this host,
    // so it stays terminating) takes no new objects: kube's 403, with its
    // cause.
    host.kubectl_ok(&["create", "namespace", "doomed"]);
    let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml("early", "doomed", 1));
    assert!(out.status.success(), "{}", stderr(&out));
    host.kubectl_ok(&["delete", "namespace", "doomed", "--wait=false"]);
    let admin = host.client().await;
    let doomed = "/apis/demo.kshard.dev/v1/namespaces/doomed/widgets";
    let late: Value = serde_json::from_str(&widget_yaml("late", "doomed", 1)).expect("w");
    let mut last = (0, String::new());
    for _ in 0..80 {
        let (code, _, body) = send(&admin, "POST", doomed, &[], Some(&late)).await;
        last = (code, body);
        if code != 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        last.0, 403,
        "a create in a terminating namespace: {}",
        last.1
    );
    let status: Value = serde_json::from_str(&last.1).expect("a Status");
    assert_eq!(
        status["message"],
        "widgets.demo.kshard.dev \"late\" is forbidden: unable to create new content in namespace doomed because it is being terminated"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "NamespaceTerminating", "message": "namespace doomed is being terminated",
                "field": "metadata.namespace"}])
    );
    // The host's namespace controller (kube-controller-manager, not run
    // here) empties the namespace through the host with the metadata
    // client: a protobuf-then-JSON PartialObjectMetadataList, then a delete
    // of the collection. Its requests, as it sends them:
    let meta_accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let (code, headers, _) = send(&admin, "GET", doomed, &[("accept", meta_accept)], None).await;
    assert_eq!(code, 200);
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf")
    );
    let (code, _, body) = send(&admin, "DELETE", doomed, &[("accept", meta_accept)], None).await;
    assert_eq!(code, 200, "{body}");
    let names = host.kubectl_ok(&["get", "widgets", "-n", "doomed", "-o", "name"]);
    assert_eq!(names.trim(), "", "the namespace was not emptied");
    drop(kshard);
}

/// Flow control from git: `kubectl apply -k manifests/flowcontrol` against
/// the host is accepted by the real API server and takes effect in kshard's
/// APF (a tenant-a user's requests are classified by the new FlowSchema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_from_git_applies_to_the_host_and_takes_effect() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    let out = host.kubectl(&[
        "apply",
        "-k",
        &common::repo_path("manifests/flowcontrol")
            .display()
            .to_string(),
    ]);
    assert!(
        out.status.success(),
        "apply -k manifests/flowcontrol: {}",
        stderr(&out)
    );
    let uid = host.kubectl_ok(&[
        "get",
        "flowschemas.flowcontrol.kshard.dev",
        "tenant-a-controller",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let level_uid = host.kubectl_ok(&[
        "get",
        "prioritylevelconfigurations.flowcontrol.kshard.dev",
        "tenant-a",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    assert!(!uid.is_empty() && !level_uid.is_empty());
    host.kubectl_ok(&[
        "create",
        "clusterrole",
        "widget-reader",
        "--verb=get,list,watch",
        "--resource=widgets.demo.kshard.dev",
    ]);
    host.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "tenant-a-read",
        "--clusterrole=widget-reader",
        "--group=tenant-a",
    ]);
    // A denial before the host's authorizer sees the binding would be
    // cached by kshard.
    host.wait_can_i(&[
        "list",
        "widgets.demo.kshard.dev",
        "--as=rbac-probe",
        "--as-group=tenant-a",
    ]);
    let carol = common::client_for(&host.kubeconfig_for(common::real_host::CAROL.0)).await;
    let mut seen = Vec::new();
    let mut took = false;
    for _ in 0..80 {
        let (code, headers, body) =
            send(&carol, "GET", "/apis/demo.kshard.dev/v1/widgets", &[], None).await;
        assert_eq!(code, 200, "{body}");
        seen = headers
            .get_all("x-kubernetes-pf-prioritylevel-uid")
            .iter()
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .collect();
        if seen.iter().any(|v| v == &level_uid) {
            took = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        took,
        "kshard never classified tenant-a's request at level {level_uid}; priority-level uids seen: {seen:?}\n{}",
        kshard.log_tail()
    );
    // kshard's controller reports on the host object, as kube's does.
    assert!(poll(Duration::from_secs(20), || {
        host.kubectl_ok(&[
            "get",
            "flowschemas.flowcontrol.kshard.dev",
            "tenant-a-controller",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Dangling\")].status}",
        ]) == "False"
    }));
    let _ = NAMESPACE;
}

/// Objects of a multi-document YAML stream.
fn parse_yaml(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn kshard_cli(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kshard");
    assert!(out.status.success(), "kshard {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Everything the project ships is accepted by a real API server: every
/// object of every kustomization under `manifests/` and of `kshard
/// manifests` / `kshard crds` passes a server-side dry run (after the
/// CustomResourceDefinitions and namespaces they need exist, as `kubectl
/// apply` on a cluster would have them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_object_passes_a_server_side_dry_run_on_a_real_api_server() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let repo = |p: &str| common::repo_path(p);
    let sets: Vec<(String, Vec<Value>)> = vec![
        (
            "manifests/base".into(),
            common::real_host::kustomize(&repo("manifests/base")),
        ),
        (
            "manifests/overlays/single".into(),
            common::real_host::kustomize(&repo("manifests/overlays/single")),
        ),
        (
            "manifests/flowcontrol".into(),
            common::real_host::kustomize(&repo("manifests/flowcontrol")),
        ),
        (
            "kshard manifests".into(),
            parse_yaml(&kshard_cli(&["manifests"])),
        ),
        (
            "kshard manifests --self-signed --single --namespace other".into(),
            parse_yaml(&kshard_cli(&[
                "manifests",
                "--self-signed",
                "--single",
                "--namespace",
                "other",
            ])),
        ),
        ("kshard crds".into(), parse_yaml(&kshard_cli(&["crds"]))),
        (
            "crds/".into(),
            [
                "crds/apiextensions/apiextensions.kshard.dev.yaml",
                "crds/flowcontrol/flowcontrol.kshard.dev.yaml",
            ]
            .iter()
            .flat_map(|f| parse_yaml(&std::fs::read_to_string(repo(f)).expect("read")))
            .collect(),
        ),
    ];

    // cert-manager does not run here: its two kinds are served by STAND-IN
    // CRDs (no schema) so that the base's Issuer and Certificate are checked
    // for shape (apiVersion, kind, namespace) only; everything else is
    // checked by the real API server's own validation.
    for (plural, kind) in [("issuers", "Issuer"), ("certificates", "Certificate")] {
        host.apply(&[json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {
                "group": "cert-manager.io", "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}],
            },
        })]);
    }
    // What must exist before the rest: every CRD and namespace, applied for
    // real (the real API server's CRD validation is itself the check).
    for (name, objects) in &sets {
        let first: Vec<Value> = objects
            .iter()
            .filter(|o| {
                matches!(
                    o["kind"].as_str(),
                    Some("CustomResourceDefinition" | "Namespace")
                )
            })
            .cloned()
            .collect();
        if first.is_empty() {
            continue;
        }
        let list = json!({"apiVersion": "v1", "kind": "List", "items": first});
        let out = host.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &list.to_string());
        assert!(
            out.status.success(),
            "{name}: the real API server refused: {}",
            stderr(&out)
        );
    }
    host.wait_crds_served();
    for (name, objects) in &sets {
        for o in objects {
            let out = host.kubectl_stdin(
                &[
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    "--field-manager=ci",
                    "-f",
                    "-",
                ],
                &o.to_string(),
            );
            assert!(
                out.status.success(),
                "{name}: {} {} refused by the real API server: {}",
                o["kind"],
                o["metadata"]["name"],
                stderr(&out)
            );
        }
    }
}

/// Watches and large lists through the host: a watch receives another
/// client's change and stays open past a minute (kube-aggregator's proxy
/// and kshard's own deadlines allow it); a list of a few thousand objects
/// and a paged list come back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_stay_open_and_large_lists_page_through_the_host() {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    host.kubectl_ok(&["create", "namespace", "bulk"]);
    let client = host.client().await;
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "bulk", &ar);
    let obj = |name: String| -> DynamicObject {
        serde_json::from_str(&widget_yaml(&name, "bulk", 1)).expect("widget")
    };

    // A few thousand objects through the host, 16 at a time.
    const N: usize = 3000;
    futures::stream::iter(0..N)
        .map(|i| {
            let widgets = widgets.clone();
            let o = obj(format!("w{i:05}"));
            async move { widgets.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("creates through the host");
    let all = widgets.list(&ListParams::default()).await.expect("list");
    assert_eq!(all.items.len(), N);
    let mut paged = 0;
    let mut pages = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = widgets.list(&params).await.expect("page");
        paged += page.items.len();
        pages += 1;
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => params = params.continue_token(&c),
            None => break,
        }
    }
    assert_eq!((paged, pages), (N, N / 500));
    let out = host.kubectl(&[
        "get",
        "widgets",
        "-n",
        "bulk",
        "--chunk-size=700",
        "-o",
        "name",
    ]);
    assert_eq!(stdout(&out).lines().count(), N, "{}", stderr(&out));

    // A watch through the host, open past a minute.
    let rv = all.metadata.resource_version.clone().expect("rv");
    let watcher_client = host.client().await;
    let watched: Api<DynamicObject> = Api::namespaced_with(watcher_client, "bulk", &ar);
    let mut events = watched
        .watch(&WatchParams::default().timeout(150), &rv)
        .await
        .expect("watch")
        .boxed();
    let next_added = async |events: &mut futures::stream::BoxStream<
        '_,
        kube::Result<WatchEvent<DynamicObject>>,
    >| loop {
        match tokio::time::timeout(Duration::from_secs(30), events.next()).await {
            Ok(Some(Ok(WatchEvent::Added(o)))) => return o.metadata.name.unwrap_or_default(),
            Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
            other => panic!("watch through the host: {other:?}"),
        }
    };
    widgets
        .create(&PostParams::default(), &obj("early".into()))
        .await
        .expect("create");
    assert_eq!(next_added(&mut events).await, "early");
    tokio::time::sleep(Duration::from_secs(65)).await;
    widgets
        .create(&PostParams::default(), &obj("late".into()))
        .await
        .expect("create");
    assert_eq!(next_added(&mut events).await, "late");
    drop(kshard);
}

/// kshard restarted (killed, as a node loss would) while a kubectl watch and
/// a kube-rs informer watch through the host: the informer resumes from its
/// resourceVersion and nothing is lost; kubectl's watch ends cleanly, as it
/// does when kube-apiserver restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_through_the_host_resumes_across_a_kshard_restart() {
    use futures::StreamExt;
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::runtime::{watcher, WatchStreamExt};
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let mut kshard = host.install_kshard(&[]);
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget"),
        "widgets",
    );
    let writer: Api<DynamicObject> = Api::namespaced_with(host.client().await, "team-a", &ar);
    let create = |name: &str| {
        let writer = writer.clone();
        let o: DynamicObject = serde_json::from_str(&widget_yaml(name, "team-a", 1)).expect("w");
        async move { writer.create(&PostParams::default(), &o).await }
    };
    create("before").await.expect("create");

    let watched: Api<DynamicObject> = Api::namespaced_with(host.client().await, "team-a", &ar);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let informer = tokio::spawn(async move {
        let mut stream = watcher::watcher(watched, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(e) = stream.next().await {
            if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = e {
                let _ = tx.send(o.metadata.name.unwrap_or_default());
            }
        }
    });
    let kubectl = common::KubectlStream::spawn(
        &host.admin_kubeconfig,
        &[
            "get",
            "widgets",
            "-n",
            "team-a",
            "-w",
            "-o",
            "name",
            "--request-timeout=0",
        ],
    );
    let wait_name = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>, want: &str| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(n)) if n == want => return,
                Ok(Some(_)) => continue,
                other => panic!("the informer never saw {want}: {other:?}"),
            }
        }
    };
    wait_name(&mut rx, "before").await;
    let first = kubectl.next_row();
    assert_eq!(first, ["widget.demo.kshard.dev/before"]);

    // kill -9 and start again on the same data and port.
    if let Some(p) = kshard.process.as_mut() {
        let _ = p.0.kill();
        let _ = p.0.wait();
    }
    kshard.restart();
    assert!(
        poll(Duration::from_secs(60), || host
            .apiservice_available("v1.demo.kshard.dev")),
        "kshard did not come back"
    );
    // Writes may fail while the aggregator notices the new process.
    let mut created = false;
    for _ in 0..120 {
        if create("after").await.is_ok() {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(created, "no write after the restart\n{}", kshard.log_tail());
    wait_name(&mut rx, "after").await;
    // kubectl's own `get -w` (1.32) does not re-watch: when the backend goes
    // away kube-aggregator ends the proxied stream and kubectl exits, as it
    // does when kube-apiserver itself restarts. It must end, not hang.
    let (ended, _) = kubectl.ends_within(Duration::from_secs(30));
    assert!(ended, "kubectl's watch neither resumed nor ended");
    informer.abort();
    drop(kubectl);
}

/// The host's admission configuration governs kshard's resources, followed
/// live (each change takes effect without a restart): a
/// ValidatingAdmissionPolicy with its binding, a validating webhook, a
/// webhook whose namespaceSelector matches the host's namespace labels (and
/// sees the user the host authenticated), a configuration deleted from the
/// host no longer applied, and a policy whose params are a host ConfigMap
/// (read with the extra RBAC the README says such a policy needs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_admission_policies_and_webhooks_are_enforced_by_kshard() {
    use common::webhook::{Reply, WebhookServer};
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    host.kubectl_ok(&["create", "namespace", "strict"]);
    host.kubectl_ok(&["label", "namespace", "strict", "admission=strict"]);

    host.apply(&[
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "few-replicas"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["demo.kshard.dev"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["widgets"]}]},
                "validations": [{"expression": "!has(object.spec.replicas) || object.spec.replicas <= 10",
                                 "message": "at most 10 replicas"}],
            },
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "few-replicas"},
            "spec": {"policyName": "few-replicas", "validationActions": ["Deny"]},
        }),
    ]);
    let hooks = WebhookServer::start().await;
    hooks.handle("/validate", |review| {
        let name = review["request"]["name"].as_str().unwrap_or_default();
        if name.starts_with("bad-") {
            Reply::deny(review, json!({"code": 403, "message": "no bad names"}))
        } else {
            Reply::allow(review)
        }
    });
    hooks.handle("/strict", |review| {
        Reply::deny(
            review,
            json!({"code": 403, "reason": "Forbidden", "message": "strict namespace"}),
        )
    });
    let by_url = |name: &str, path: &str| {
        let mut webhook = hooks.webhook(name, path);
        webhook["clientConfig"] = json!({
            "url": format!("https://127.0.0.1:{}{path}", hooks.addr.port()),
            "caBundle": hooks.ca_bundle(),
        });
        webhook
    };
    let mut strict = by_url("strict.test.kshard.dev", "/strict");
    strict["namespaceSelector"] = json!({"matchLabels": {"admission": "strict"}});
    host.apply(&[
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "names"},
            "webhooks": [by_url("names.test.kshard.dev", "/validate")],
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "strict"},
            "webhooks": [strict],
        }),
    ]);

    // Each in force once kshard has seen it (it follows the host's objects).
    let refused = |name: &str, ns: &str, replicas: i64, what: &str| {
        let mut last = String::new();
        let ok = poll(Duration::from_secs(30), || {
            let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml(name, ns, replicas));
            last = stderr(&out);
            !out.status.success()
        });
        assert!(ok, "{what} was never enforced\n{}", kshard.log_tail());
        last
    };
    let last = refused("many", "team-a", 20, "the policy");
    assert!(
        last.contains(
            "ValidatingAdmissionPolicy 'few-replicas' with binding 'few-replicas' denied request"
        ) && last.contains("at most 10 replicas"),
        "{last}"
    );
    let last = refused("bad-1", "team-a", 1, "the webhook");
    assert!(
        last.contains(
            r#"admission webhook "names.test.kshard.dev" denied the request: no bad names"#
        ),
        "{last}"
    );
    let out = host.kubectl_stdin(&["create", "-f", "-"], &widget_yaml("good", "team-a", 3));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!hooks.received("/validate").is_empty());
    // The namespace selector reads the host's labels: `strict` is refused,
    // `team-a` (unlabelled) never reaches that webhook.
    assert!(hooks.take("/strict").is_empty());
    let last = refused("s1", "strict", 1, "the strict webhook");
    assert!(
        last.contains(
            r#"admission webhook "strict.test.kshard.dev" denied the request: strict namespace"#
        ),
        "{last}"
    );
    let reviews = hooks.take("/strict");
    let review = &reviews.last().expect("a review").review["request"];
    assert_eq!(review["namespace"], "strict");
    assert_eq!(review["userInfo"]["username"], "admin");
    assert!(reviews
        .iter()
        .all(|r| r.review["request"]["namespace"] == "strict"));

    // Deleted from the host: no longer applied.
    host.kubectl_ok(&["delete", "validatingwebhookconfiguration", "names"]);
    let created =
        host.create_until_accepted(&widget_yaml("bad-2", "team-a", 1), Duration::from_secs(30));
    assert!(
        created.is_ok(),
        "the deleted webhook was still applied: {created:?}"
    );

    // A policy whose params are the host's ConfigMap (kshard serves no
    // ConfigMaps: it reads the host's, with the RBAC granted for it).
    host.apply(&[
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "kshard:policy-params"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kshard:policy-params"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kshard:policy-params"},
            "subjects": [{"kind": "ServiceAccount", "name": "kshard", "namespace": NAMESPACE}]}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "widget-limits", "namespace": "team-a"}, "data": {"max": "3"}}),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "replica-cap"},
            "spec": {
                "failurePolicy": "Fail",
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["demo.kshard.dev"], "apiVersions": ["*"],
                    "operations": ["CREATE"], "resources": ["widgets"]}]},
                "validations": [{"expression": "object.spec.replicas <= int(params.data.max)",
                                 "message": "too many replicas"}],
            },
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "replica-cap"},
            "spec": {"policyName": "replica-cap", "validationActions": ["Deny"],
                     "paramRef": {"name": "widget-limits", "namespace": "team-a",
                                  "parameterNotFoundAction": "Deny"}},
        }),
    ]);
    let client = host.client().await;
    let post = |name: &str, replicas: i64| {
        let client = client.clone();
        let body: Value = serde_json::from_str(&widget_yaml(name, "team-a", replicas)).expect("w");
        async move {
            send(
                &client,
                "POST",
                "/apis/demo.kshard.dev/v1/namespaces/team-a/widgets?dryRun=All",
                &[],
                Some(&body),
            )
            .await
        }
    };
    let mut last = (0, String::new());
    for _ in 0..120 {
        let (code, _, body) = post("big", 5).await;
        last = (code, body);
        if code != 201 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(last.0, 422, "{}\n{}", last.1, kshard.log_tail());
    assert_eq!(
        serde_json::from_str::<Value>(&last.1).expect("a Status")["message"],
        "widgets.demo.kshard.dev \"big\" is forbidden: ValidatingAdmissionPolicy 'replica-cap' with binding 'replica-cap' denied request: too many replicas"
    );
    let (code, _, body) = post("small", 2).await;
    assert_eq!(code, 201, "{body}");
}

/// Definitions managed through the host: a ShardResourceDefinition applied
/// to the real host is served by kshard through the host (kshard registers
/// its APIService), and deleting it removes the APIService and the
/// definition (kshard's cleanup finalizer is released).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_resource_definitions_on_the_host_are_served_and_cleaned_up() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    let srd = json!({
        "apiVersion": "apiextensions.kshard.dev/v1", "kind": "ShardResourceDefinition",
        "metadata": {"name": "gadgets.things.kshard.dev"},
        "spec": {"group": "things.kshard.dev", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]},
    });
    host.apply(&[srd]);
    assert!(
        poll(Duration::from_secs(60), || host
            .apiservice_available("v1.things.kshard.dev")),
        "APIService v1.things.kshard.dev never Available\n{}",
        kshard.log_tail()
    );
    let labels = host.kubectl_ok(&[
        "get",
        "apiservice",
        "v1.things.kshard.dev",
        "-o",
        "jsonpath={.metadata.labels.app\\.kubernetes\\.io/managed-by}",
    ]);
    assert_eq!(labels, "kshard");
    let gadget = json!({"apiVersion": "things.kshard.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g1", "namespace": "default"}, "spec": {"size": 3}});
    if let Err(last) = host.create_until_accepted(&gadget.to_string(), Duration::from_secs(30)) {
        panic!("{last}");
    }
    let got = host.kubectl_ok(&["get", "gadget", "g1", "-o", "jsonpath={.spec}"]);
    assert_eq!(
        serde_json::from_str::<Value>(&got).expect("json"),
        json!({"size": 3})
    );
    // kshard serves a definition before it writes its status.
    let mut status = String::new();
    assert!(
        poll(Duration::from_secs(10), || {
            status = stdout(&host.kubectl(&[
                "get",
                "shardresourcedefinition",
                "gadgets.things.kshard.dev",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
            ]));
            status.trim() == "True"
        }),
        "Established: {status}"
    );

    host.kubectl_ok(&[
        "delete",
        "shardresourcedefinition",
        "gadgets.things.kshard.dev",
        "--wait=false",
    ]);
    assert!(
        poll(Duration::from_secs(60), || {
            !host
                .kubectl(&[
                    "get",
                    "shardresourcedefinition",
                    "gadgets.things.kshard.dev",
                ])
                .status
                .success()
        }),
        "the definition was never released\n{}",
        kshard.log_tail()
    );
    assert!(
        poll(Duration::from_secs(30), || {
            !host
                .kubectl(&["get", "apiservice", "v1.things.kshard.dev"])
                .status
                .success()
        }),
        "the APIService stayed"
    );
}

/// Readiness says what is missing and degrades sensibly: without read access
/// to the host's admission objects, kshard still becomes ready and serves
/// writes (enforcing what it can read), `/readyz?verbose` names each kind
/// it does not follow with the RBAC rule it needs, and granting the rule
/// later is picked up without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rbac_for_admission_objects_kshard_serves_and_says_what_is_missing() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let mut kshard = host.install_kshard(&[]);
    let role: Value =
        serde_json::from_str(&host.kubectl_ok(&["get", "clusterrole", "kshard", "-o", "json"]))
            .expect("role");
    let mut reduced = role.clone();
    if let Some(rules) = reduced["rules"].as_array_mut() {
        rules.retain(|r| r["apiGroups"] != json!(["admissionregistration.k8s.io"]));
    }
    assert_ne!(
        reduced["rules"], role["rules"],
        "the shipped role grants admissionregistration"
    );
    reduced["metadata"] = json!({"name": "kshard", "labels": role["metadata"]["labels"]});
    host.kubectl_stdin(&["replace", "-f", "-"], &reduced.to_string());
    kshard.restart();

    let direct = host.dir.join("direct.kubeconfig");
    kshard.direct_kubeconfig(&direct, None);
    let verbose = || {
        let out = common::kubectl_with(&direct, &["get", "--raw", "/readyz?verbose"], None);
        (out.status.success(), stdout(&out))
    };
    let mut last = (false, String::new());
    assert!(
        poll(Duration::from_secs(60), || {
            last = verbose();
            last.0
        }),
        "kshard never became ready without the admission rule: {}\n{}",
        last.1,
        kshard.log_tail()
    );
    for kind in [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        assert!(
            last.1.contains(&format!("info: admission: not following the host's {kind}: forbidden: kshard's ServiceAccount needs get, list and watch on admissionregistration.k8s.io {kind}")),
            "{}",
            last.1
        );
    }
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    // The host's aggregator marks the APIService available again on its own
    // schedule after the restart; until then its discovery omits the group.
    if let Err(last) =
        host.create_until_accepted(&widget_yaml("w1", "team-a", 1), Duration::from_secs(30))
    {
        panic!("a write while degraded: {last}");
    }

    // Granted again: followed without a restart (the reflectors retry).
    let mut restored = role.clone();
    restored["metadata"] = reduced["metadata"].clone();
    host.kubectl_stdin(&["replace", "-f", "-"], &restored.to_string());
    assert!(
        poll(Duration::from_secs(90), || !verbose()
            .1
            .contains("not following")),
        "the restored rule was not picked up: {}",
        verbose().1
    );
    assert!(kshard
        .log_tail()
        .contains("not enforcing the host's admission objects of this kind"));
}
