//! Definitions that change while the server runs (issue 17): a definitions
//! directory laid out like a mounted ConfigMap (files reached through a
//! `..data` symlink that is swapped) is followed, and discovery, OpenAPI,
//! `kubectl explain`/`api-resources`, writes and watches follow it, with no
//! restart, while a kube-rs watcher of another resource keeps running.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::json;

const GADGETS: &str = "/apis/gadgets.kshard.dev/v1/namespaces/default/gadgets";

/// The gadgets CRD: `size` bounded by `max`, an optional `color`, and an
/// optional second served version.
fn gadget_crd(max: i64, with_color: bool, with_v2: bool) -> String {
    let color = if with_color {
        "\n              color: {type: string}"
    } else {
        ""
    };
    let version = |name: &str, storage: bool| {
        format!(
            r#"
  - name: {name}
    served: true
    storage: {storage}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {{type: integer, maximum: {max}}}{color}"#
        )
    };
    let mut versions = version("v1", true);
    if with_v2 {
        versions.push_str(&version("v2", false));
    }
    format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: gadgets.gadgets.kshard.dev}}
spec:
  group: gadgets.kshard.dev
  scope: Namespaced
  names: {{plural: gadgets, singular: gadget, kind: Gadget}}
  versions:{versions}
"#
    )
}

/// A ConfigMap-style mount: `<dir>/<file>` → `..data/<file>`, `..data` →
/// `..<n>`, replaced by an atomic rename of a new `..data` link.
struct ConfigMapDir {
    dir: PathBuf,
    generation: usize,
}

impl ConfigMapDir {
    fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        let mut d = Self {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        d.publish(&[]);
        d
    }

    fn publish(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let data = self.dir.join(format!("..gen{}", self.generation));
        std::fs::create_dir(&data).expect("data dir");
        for (name, text) in files {
            std::fs::write(data.join(name), text).expect("write");
            let visible = self.dir.join(name);
            if std::fs::symlink_metadata(&visible).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &visible)
                    .expect("symlink");
            }
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(format!("..gen{}", self.generation), &tmp).expect("link");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap");
        // Then, as kubelet does, the links of keys that are gone.
        for e in std::fs::read_dir(&self.dir).expect("read dir").flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') && !files.iter().any(|(f, _)| *f == name) {
                std::fs::remove_file(e.path()).expect("remove link");
            }
        }
    }
}

async fn until_status(s: &common::TestServer, uri: &str, status: u16) {
    common::eventually(&format!("{uri} answers {status}"), || async {
        s.get(uri).await.status == status
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn definitions_change_without_a_restart() {
    let defs = tempfile::tempdir().expect("tempdir");
    let mut mount = ConfigMapDir::new(&defs.path().join("mount"));
    let mount_path = mount.dir.clone();
    let s = common::start_with(|c| c.crds.push(mount_path)).await;

    // A kube-rs watcher of widgets runs through every change below.
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(s.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen_by_watcher = seen.clone();
    let watching = tokio::spawn(async move {
        let mut events = watcher(widgets, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            if let Ok(watcher::Event::Apply(o)) = ev {
                let name = o.metadata.name.clone().unwrap_or_default();
                seen_by_watcher.lock().expect("lock").push(name);
            }
        }
    });
    assert_eq!(s.get(GADGETS).await.status, 404);

    // Added: served, in discovery, explained, listed by api-resources.
    mount.publish(&[("gadgets.yaml", &gadget_crd(10, false, false))]);
    until_status(&s, GADGETS, 200).await;
    assert_eq!(s.get("/apis/gadgets.kshard.dev/v1").await.status, 200);
    let g1 = json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                    "metadata": {"name": "g1"}, "spec": {"size": 8}});
    let r = s.post_json(GADGETS, &g1).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let resources = s.kubectl_ok(&["api-resources", "--api-group=gadgets.kshard.dev"]);
    assert!(resources.contains("gadgets"), "{resources}");
    let explained = s.kubectl_ok(&["explain", "gadgets.spec"]);
    assert!(explained.contains("size"), "{explained}");

    // Changed: a new field, a tighter bound (ratcheting keeps g1 updatable),
    // a second version.
    let mut watch = s
        .client
        .send(
            http::Request::get(format!("{GADGETS}?watch=1"))
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("watch");
    assert_eq!(watch.status(), 200);
    mount.publish(&[("gadgets.yaml", &gadget_crd(5, true, true))]);
    until_status(
        &s,
        "/apis/gadgets.kshard.dev/v2/namespaces/default/gadgets",
        200,
    )
    .await;
    let mut g2 = g1.clone();
    g2["metadata"]["name"] = json!("g2");
    let r = s.post_json(GADGETS, &g2).await;
    assert_eq!(r.status, 422, "{}", r.text());
    let mut live = s.get(&format!("{GADGETS}/g1")).await.json();
    live["spec"]["color"] = json!("red");
    let r = s.put_json(&format!("{GADGETS}/g1"), &live).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["spec"]["color"], "red");
    let explained = s.kubectl_ok(&["explain", "gadgets.spec"]);
    assert!(explained.contains("color"), "{explained}");

    // A definition that does not load leaves the current one serving.
    mount.publish(&[(
        "gadgets.yaml",
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nspec: [",
    )]);
    common::eventually("the broken definition is tried and refused", || async {
        s.get("/metrics")
            .await
            .text()
            .contains("kshard_definitions_reloads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(s.get(&format!("{GADGETS}/g1")).await.status, 200);
    // Then removed: 404, gone from discovery, and the open watch ends cleanly.
    mount.publish(&[]);
    until_status(&s, GADGETS, 404).await;
    assert_eq!(s.get("/apis/gadgets.kshard.dev/v1").await.status, 404);
    let body = watch.body_mut();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(frame) = http_body_util::BodyExt::frame(body).await {
            if frame.is_err() {
                return false;
            }
        }
        true
    })
    .await;
    assert_eq!(
        ended,
        Ok(true),
        "the watch of a removed resource ends cleanly"
    );

    // The widget watcher never stopped.
    let r = s
        .post_json(common::WIDGETS, &common::widget("after", 1))
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    common::eventually(
        "the widget watcher sees a widget created at the end",
        || async { seen.lock().expect("lock").iter().any(|n| n == "after") },
    )
    .await;
    watching.abort();
}

/// Standalone, definitions are API objects: `kubectl apply -f crd.yaml`
/// serves the new resource within a second, the definition's status says so
/// (kube's conditions, accepted names, stored versions), an invalid one is
/// refused, and deleting it deletes its objects first.
#[tokio::test(flavor = "multi_thread")]
async fn definitions_applied_with_kubectl_are_served_and_deleted_with_their_objects() {
    let s = common::start().await;
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &gadget_crd(10, false, false));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_status(&s, GADGETS, 200).await;
    let r = s
        .post_json(
            GADGETS,
            &json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                    "metadata": {"name": "g1"}, "spec": {"size": 3}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.gadgets.kshard.dev";
    common::eventually("the definition is Established", || async {
        let d = s.get(crd).await.json();
        d["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
    })
    .await;
    let d = s.get(crd).await.json();
    let conditions = d["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names_accepted = conditions
        .iter()
        .find(|c| c["type"] == "NamesAccepted")
        .cloned()
        .unwrap_or_default();
    assert_eq!(names_accepted["status"], "True", "{d}");
    assert_eq!(names_accepted["reason"], "NoConflicts");
    assert_eq!(d["status"]["acceptedNames"]["kind"], "Gadget");
    assert_eq!(d["status"]["acceptedNames"]["listKind"], "GadgetList");
    assert_eq!(d["status"]["storedVersions"], json!(["v1"]));
    let listed = s.kubectl_ok(&["get", "crds"]);
    assert!(listed.contains("gadgets.gadgets.kshard.dev"), "{listed}");

    // A second version that becomes the storage version is recorded.
    let two = gadget_crd(10, false, true)
        .replace("storage: true", "storage: STORAGE_V1")
        .replace("storage: false", "storage: true")
        .replace("storage: STORAGE_V1", "storage: false");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &two);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::eventually("storedVersions lists both versions", || async {
        s.get(crd).await.json()["status"]["storedVersions"] == json!(["v1", "v2"])
    })
    .await;

    // A definition the catalog cannot take is refused when written.
    let bad = gadget_crd(10, false, false)
        .replace("group: gadgets.kshard.dev", "group: nodots")
        .replace("gadgets.gadgets.kshard.dev", "gadgets.nodots");
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("is invalid") && err.contains("nodots"),
        "{err}"
    );
    // One that clashes with a served definition is stored, not accepted.
    let clash = "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.demo.kshard.dev}\nspec:\n  group: demo.kshard.dev\n  scope: Namespaced\n  names: {plural: widgets, kind: Widget}\n  versions:\n  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}\n";
    let out = s.kubectl_stdin(&["apply", "-f", "-"], clash);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let clash_uri =
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.demo.kshard.dev";
    common::eventually(
        "the clashing definition's names are not accepted",
        || async {
            s.get(clash_uri).await.json()["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == "NamesAccepted" && c["status"] == "False")
                })
        },
    )
    .await;
    assert_eq!(s.get(common::WIDGETS).await.status, 200);

    // Deleted: its objects go first, then the definition, then the API.
    let mut watch = s
        .client
        .send(
            http::Request::get(format!("{GADGETS}?watch=1"))
                .body(kube::client::Body::empty())
                .expect("request"),
        )
        .await
        .expect("watch");
    let out = s.kubectl(&[
        "delete",
        "crd",
        "gadgets.gadgets.kshard.dev",
        "--timeout=30s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_status(&s, GADGETS, 404).await;
    assert_eq!(s.get(crd).await.status, 404);
    let mut events = String::new();
    let body = watch.body_mut();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(frame)) = http_body_util::BodyExt::frame(body).await {
            if let Ok(d) = frame.into_data() {
                events.push_str(&String::from_utf8_lossy(&d));
            }
        }
    })
    .await;
    assert!(
        events.contains("\"type\":\"DELETED\""),
        "g1 was deleted first: {events}"
    );
    // A new definition of the same name starts empty.
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &gadget_crd(10, false, false));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_status(&s, GADGETS, 200).await;
    let list = s.get(GADGETS).await.json();
    assert_eq!(list["items"], json!([]), "{list}");
}

#[cfg(feature = "tikv")]
async fn status_of(
    client: &kube::Client,
    method: &str,
    uri: &str,
    body: Option<&serde_json::Value>,
) -> u16 {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(
            body.map(|b| serde_json::to_vec(b).expect("json"))
                .unwrap_or_default(),
        ))
        .expect("request");
    match client.send(req).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// Two replicas of one shard (on the TiKV double): a definition applied
/// through one is served by the other within moments, objects written
/// through either are read through both, and its deletion reaches both.
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread")]
async fn replicas_agree_on_definitions_applied_through_either() {
    use common::replicas::{shared_store, spawn_replica, wait_ready};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_double, pd, prefix) = shared_store();
    let a = spawn_replica(dir.path(), "a", &pd, &prefix);
    let b = spawn_replica(dir.path(), "b", &pd, &prefix);
    let (ca, cb) = (a.client().await, b.client().await);
    wait_ready(&ca, Duration::from_secs(30)).await;
    wait_ready(&cb, Duration::from_secs(30)).await;

    let out = common::kubectl_with(
        &a.kubeconfig(),
        &["apply", "-f", "-"],
        Some(&gadget_crd(10, false, false)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::eventually("replica b serves gadgets", || async {
        status_of(&cb, "GET", GADGETS, None).await == 200
    })
    .await;
    let g1 = json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                    "metadata": {"name": "g1"}, "spec": {"size": 3}});
    common::eventually("a create through replica b succeeds", || async {
        matches!(status_of(&cb, "POST", GADGETS, Some(&g1)).await, 201 | 409)
    })
    .await;
    common::eventually("replica a reads g1", || async {
        status_of(&ca, "GET", &format!("{GADGETS}/g1"), None).await == 200
    })
    .await;

    let out = common::kubectl_with(
        &b.kubeconfig(),
        &[
            "delete",
            "crd",
            "gadgets.gadgets.kshard.dev",
            "--timeout=60s",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in [&ca, &cb] {
        common::eventually("both replicas stop serving gadgets", || async {
            status_of(c, "GET", GADGETS, None).await == 404
        })
        .await;
    }
}

/// A definition written through the API is stored with kube's defaults
/// (apiextensions v1 `SetDefaults_CustomResourceDefinitionSpec`).
#[tokio::test(flavor = "multi_thread")]
async fn a_stored_definition_carries_kubes_defaults() {
    let s = common::start().await;
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let def = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "sprockets.defaults.kshard.dev"},
        "spec": {
            "group": "defaults.kshard.dev", "scope": "Namespaced",
            "names": {"plural": "sprockets", "kind": "Sprocket"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    });
    let r = s.post_json(crds, &def).await;
    assert_eq!(r.status, 201, "{}", r.text());
    for got in [
        r.json(),
        s.get(&format!("{crds}/sprockets.defaults.kshard.dev"))
            .await
            .json(),
    ] {
        assert_eq!(got["spec"]["names"]["singular"], "sprocket", "{got}");
        assert_eq!(got["spec"]["names"]["listKind"], "SprocketList", "{got}");
        assert_eq!(
            got["spec"]["conversion"],
            json!({"strategy": "None"}),
            "{got}"
        );
    }
    // A webhook service without a port gets 443; given values stay.
    let mut hooked = def.clone();
    hooked["metadata"]["name"] = json!("cogs.defaults.kshard.dev");
    hooked["spec"]["names"] = json!({"plural": "cogs", "kind": "Cog", "singular": "cogwheel"});
    hooked["spec"]["versions"] = json!([
        {"name": "v1", "served": true, "storage": true,
         "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
        {"name": "v2", "served": true, "storage": false,
         "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]);
    hooked["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"service": {"namespace": "default", "name": "cogs", "path": "/convert"}}}});
    let r = s.post_json(crds, &hooked).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let got = r.json();
    assert_eq!(got["spec"]["names"]["singular"], "cogwheel", "{got}");
    assert_eq!(got["spec"]["names"]["listKind"], "CogList", "{got}");
    assert_eq!(
        got["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["port"], 443,
        "{got}"
    );
}
