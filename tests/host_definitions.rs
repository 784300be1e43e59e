//! Definitions managed through the host (issue 17, "Through the host"):
//! `apiextensions.kshard.dev/v1` ShardResourceDefinitions written to the REAL
//! HOST (`common::real_host`: etcd and the reference kube-apiserver, kshard
//! installed from `manifests/base` with its own ServiceAccount's RBAC) are
//! served by kshard without a restart; kshard keeps their status and cleanup
//! finalizer on the host, and the host's APIServices for its group-versions
//! (with the serving CA), leaving alone the APIServices that are not its own.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::real_host::{Installed, RealHost};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{json, Value};

/// How long `wait` took (printed: how quickly kshard follows the host).
async fn timed(wait: impl std::future::Future<Output = ()>) -> Duration {
    let start = Instant::now();
    wait.await;
    start.elapsed()
}

const GROUP: &str = "things.kshard.dev";
const GADGETS: &str = "/apis/things.kshard.dev/v1/namespaces/default/gadgets";

struct Setup {
    host: RealHost,
    kshard: Installed,
    /// kube-aggregator's connection to kshard (front-proxy certificate).
    aggregator: kube::Client,
    /// A cluster admin of the host (what `kubectl apply` to the host uses).
    admin: kube::Client,
    _dir: tempfile::TempDir,
}

/// A host with two APIServices already there: an unlabelled one for a group
/// kshard serves from its files (written by hand or GitOps: not kshard's)
/// and one kshard registered earlier for a group it no longer serves.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let admin = host.client().await;
    let apiservices: Api<DynamicObject> = Api::all_with(admin.clone(), &apiservice_resource());
    let apiservice = |name: &str, group: &str, labels: Value, service: &str| {
        serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": name, "labels": labels},
            "spec": {"group": group, "version": "v1", "groupPriorityMinimum": 1000,
                     "versionPriority": 100,
                     "service": {"namespace": "kshard-system", "name": service, "port": 443}},
        }))
        .expect("apiservice")
    };
    let pp = PostParams::default();
    // Two APIServices already there: one kshard registered earlier for a
    // group it no longer serves (it removes it), one of another shard (not
    // its own). The base's v1.demo.kshard.dev comes from the installer,
    // without kshard's managed-by label: not kshard's either.
    for a in [
        apiservice(
            "v1.gone.kshard.dev",
            "gone.kshard.dev",
            json!({"app.kubernetes.io/managed-by": "kshard"}),
            "kshard",
        ),
        apiservice(
            "v1.other.kshard.dev",
            "other.kshard.dev",
            json!({"app.kubernetes.io/managed-by": "kshard"}),
            "another-shard",
        ),
    ] {
        apiservices
            .create(&pp, &a)
            .await
            .expect("create apiservice");
    }
    let kshard = host.install_kshard(&[]);
    // kube-aggregator's identity, straight at kshard.
    let cert = host.front_proxy_ca.client("front-proxy-client", &[]);
    let agg_kc = host.dir.join("aggregator.kubeconfig");
    kshard.direct_kubeconfig(&agg_kc, Some(&cert));
    let aggregator = common::client_for(&agg_kc).await;
    let s = Setup {
        host,
        kshard,
        aggregator,
        admin,
        _dir: dir,
    };
    common::eventually("kshard ready", || async {
        s.send("GET", "/readyz", None).await.0 == 200
    })
    .await;
    s
}

fn apiservice_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    )
}

impl Setup {
    /// A request to kshard as the aggregator sends it for a cluster admin.
    async fn send(&self, method: &str, uri: &str, body: Option<&Value>) -> (u16, Value) {
        let (code, text) = self.send_text(method, uri, body).await;
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn send_text(&self, method: &str, uri: &str, body: Option<&Value>) -> (u16, String) {
        let mut b = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("x-remote-user", "admin")
            .header("x-remote-group", "system:masters");
        if body.is_some() {
            b = b.header("content-type", "application/json");
        }
        let body = body
            .map(|v| serde_json::to_vec(v).expect("json"))
            .unwrap_or_default();
        let resp = self
            .aggregator
            .send(b.body(kube::client::Body::from(body)).expect("request"))
            .await
            .expect("send");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect_bytes().await.expect("body");
        (code, String::from_utf8_lossy(&bytes).into_owned())
    }

    fn definitions(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.admin.clone(),
            &kshard::definitions::host::api_resource(),
        )
    }

    async fn apply(&self, def: Value) {
        let api = self.definitions();
        let name = def["metadata"]["name"].as_str().expect("name").to_string();
        let mut obj: DynamicObject = serde_json::from_value(def).expect("definition");
        match api.get_opt(&name).await.expect("get") {
            None => {
                api.create(&PostParams::default(), &obj)
                    .await
                    .expect("create");
            }
            Some(cur) => {
                obj.metadata = cur.metadata;
                api.replace(&name, &PostParams::default(), &obj)
                    .await
                    .expect("replace");
            }
        }
    }

    /// A host object as the host serves it now.
    async fn host_object(&self, ar: &kube::api::ApiResource, name: &str) -> Option<Value> {
        let api: Api<DynamicObject> = Api::all_with(self.admin.clone(), ar);
        api.get_opt(name)
            .await
            .expect("get from the host")
            .map(|o| serde_json::to_value(o).expect("json"))
    }

    async fn srd(&self, name: &str) -> Option<Value> {
        self.host_object(&kshard::definitions::host::api_resource(), name)
            .await
    }

    async fn apiservice(&self, name: &str) -> Option<Value> {
        self.host_object(&apiservice_resource(), name).await
    }

    async fn condition(&self, name: &str, kind: &str) -> Value {
        let def = self.srd(name).await.unwrap_or(Value::Null);
        def["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind).cloned())
            .unwrap_or(Value::Null)
    }
}

/// The gadgets definition: `size`, and with `v2` a second served version
/// and a `color` field.
fn gadgets(v2: bool) -> Value {
    let mut props = json!({"size": {"type": "integer"}});
    if v2 {
        props["color"] = json!({"type": "string"});
    }
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": props.clone()}}}}})
    };
    let mut versions = vec![version("v1", true)];
    if v2 {
        versions.push(version("v2", false));
    }
    json!({
        "apiVersion": "apiextensions.kshard.dev/v1", "kind": "ShardResourceDefinition",
        "metadata": {"name": format!("gadgets.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                 "versions": versions},
    })
}

fn gadget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Gadget",
           "metadata": {"name": name}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread")]
async fn definitions_on_the_host_are_served_changed_and_removed() {
    let s = setup().await;
    let (_, readyz) = s.send_text("GET", "/readyz?verbose", None).await;
    assert!(readyz.contains("[+]host-definitions-sync ok"), "{readyz}");

    // Applied on the host: served through kshard, with no restart.
    s.apply(gadgets(false)).await;
    let served = timed(common::until(
        "gadgets in kshard's discovery",
        Duration::from_secs(5),
        || async {
            let (code, body) = s.send("GET", "/apis/things.kshard.dev/v1", None).await;
            (code == 200 && body.to_string().contains("\"gadgets\"")).then_some(())
        },
    ))
    .await;
    println!("host apply → served: {served:?}");
    assert!(served < Duration::from_secs(2), "{served:?}");
    let (code, body) = s
        .send(
            "POST",
            GADGETS,
            Some(&gadget("g1", json!({"size": 1, "color": "red"}))),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    // `color` is not in this schema yet: pruned.
    let (code, body) = s.send("GET", &format!("{GADGETS}/g1"), None).await;
    assert_eq!((code, &body["spec"]), (200, &json!({"size": 1})), "{body}");

    // kshard keeps the host object: cleanup finalizer and CRD status.
    let name = format!("gadgets.{GROUP}");
    common::eventually("the definition's status on the host", || async {
        s.condition(&name, "Established").await["status"] == "True"
    })
    .await;
    let def = s.srd(&name).await.expect("definition");
    assert_eq!(
        def["metadata"]["finalizers"],
        json!(["customresourcecleanup.apiextensions.kshard.dev"])
    );
    assert_eq!(
        s.condition(&name, "NamesAccepted").await["reason"],
        "NoConflicts"
    );
    assert_eq!(def["status"]["acceptedNames"]["kind"], "Gadget");
    assert_eq!(def["status"]["acceptedNames"]["listKind"], "GadgetList");
    assert_eq!(def["status"]["storedVersions"], json!(["v1"]));

    // The APIService for the new group-version, with kshard's CA.
    let ca = base64::engine::general_purpose::STANDARD.encode(s.kshard.ca.pem.clone());
    common::eventually("APIService v1.things.kshard.dev", || async {
        s.apiservice("v1.things.kshard.dev").await.is_some()
    })
    .await;
    let a = s
        .apiservice("v1.things.kshard.dev")
        .await
        .expect("apiservice");
    assert_eq!(
        a["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kshard"
    );
    assert_eq!(
        a["spec"],
        json!({"group": GROUP, "version": "v1", "groupPriorityMinimum": 1000,
               "versionPriority": 100, "caBundle": ca,
               "service": {"namespace": "kshard-system", "name": "kshard", "port": s.kshard.port}})
    );
    // One it registered for a group it no longer serves goes; one it did not
    // label, and one of another shard's Service, stay as they were.
    common::eventually("the stale APIService removed", || async {
        s.apiservice("v1.gone.kshard.dev").await.is_none()
    })
    .await;
    let hand = s
        .apiservice("v1.demo.kshard.dev")
        .await
        .expect("unlabelled apiservice");
    // The installer's, left as the installer wrote it: no managed-by label
    // added, and every field of it still the installer's alone.
    assert!(
        hand["metadata"]["labels"]
            .get("app.kubernetes.io/managed-by")
            .is_none(),
        "{hand}"
    );
    let mut writers: Vec<&str> = hand["metadata"]["managedFields"]
        .as_array()
        .map(|m| m.iter().filter_map(|e| e["manager"].as_str()).collect())
        .unwrap_or_default();
    writers.sort();
    assert_eq!(
        writers,
        ["kube-apiserver", "kubectl-client-side-apply"],
        "{hand}"
    );
    assert!(s.apiservice("v1.other.kshard.dev").await.is_some());

    // Changed on the host: a second version and a new field, no restart.
    s.apply(gadgets(true)).await;
    let changed = timed(common::until(
        "gadgets v2 served",
        Duration::from_secs(5),
        || async {
            (s.send("GET", "/apis/things.kshard.dev/v2", None).await.0 == 200).then_some(())
        },
    ))
    .await;
    println!("host change → served: {changed:?}");
    let (code, body) = s
        .send(
            "POST",
            GADGETS,
            Some(&gadget("g2", json!({"size": 2, "color": "blue"}))),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["spec"]["color"], "blue", "the new field is kept now");
    let (code, body) = s
        .send(
            "GET",
            "/apis/things.kshard.dev/v2/namespaces/default/gadgets/g2",
            None,
        )
        .await;
    assert_eq!(
        (code, body["apiVersion"].as_str()),
        (200, Some("things.kshard.dev/v2"))
    );
    common::eventually("APIService v2.things.kshard.dev", || async {
        s.apiservice("v2.things.kshard.dev").await.is_some()
    })
    .await;
    // kubectl, talking to the host, finds the resource through the
    // aggregator, once the host has found the new APIService available.
    let out = common::until(
        "kubectl through the host to list v2 gadgets",
        Duration::from_secs(30),
        || async {
            let out = common::kubectl_with(
                &s.host.admin_kubeconfig,
                &["get", "gadgets.v2.things.kshard.dev", "-o", "name"],
                None,
            );
            out.status.success().then_some(out)
        },
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "gadget.things.kshard.dev/g1\ngadget.things.kshard.dev/g2"
    );

    // Deleted on the host: kshard deletes the objects first, then lets the
    // host object go; the group and its APIServices go with it.
    s.definitions()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let gone = timed(common::until(
        "the definition released",
        Duration::from_secs(10),
        || async { s.srd(&name).await.is_none().then_some(()) },
    ))
    .await;
    println!("host delete → objects deleted, finalizer removed: {gone:?}");
    common::eventually("the group no longer served", || async {
        s.send("GET", "/apis/things.kshard.dev/v1", None).await.0 == 404
    })
    .await;
    common::eventually("the group's APIServices removed", || async {
        s.apiservice("v1.things.kshard.dev").await.is_none()
            && s.apiservice("v2.things.kshard.dev").await.is_none()
    })
    .await;
    // Applied again: the objects were deleted, not just hidden.
    s.apply(gadgets(false)).await;
    common::eventually("gadgets served again", || async {
        s.send("GET", GADGETS, None).await.0 == 200
    })
    .await;
    let (_, list) = s.send("GET", GADGETS, None).await;
    assert_eq!(list["items"], json!([]), "{list}");
    // The file-served group was never unregistered or touched.
    assert!(s.apiservice("v1.demo.kshard.dev").await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_definition_kshard_cannot_serve_says_why_and_the_others_still_serve() {
    let s = setup().await;
    s.apply(gadgets(false)).await;
    // Widgets are served from kshard's definition files already.
    let mut conflicting = gadgets(false);
    conflicting["metadata"]["name"] = json!("widgets.demo.kshard.dev");
    conflicting["spec"]["group"] = json!("demo.kshard.dev");
    conflicting["spec"]["names"] = json!({"plural": "widgets", "kind": "Widget"});
    s.apply(conflicting).await;
    // Two storage versions: no CustomResourceDefinition may have that.
    let mut invalid = gadgets(true);
    invalid["metadata"]["name"] = json!("bolts.things.kshard.dev");
    invalid["spec"]["names"] = json!({"plural": "bolts", "kind": "Bolt"});
    invalid["spec"]["versions"][1]["storage"] = json!(true);
    s.apply(invalid).await;

    common::eventually("the conflicting definition's status", || async {
        s.condition("widgets.demo.kshard.dev", "NamesAccepted")
            .await["status"]
            == "False"
    })
    .await;
    let c = s
        .condition("widgets.demo.kshard.dev", "NamesAccepted")
        .await;
    assert_eq!(c["reason"], "NameConflict", "{c}");
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|m| m.contains("already defined")),
        "{c}"
    );
    assert_eq!(
        s.condition("widgets.demo.kshard.dev", "Established").await["status"],
        "False"
    );
    common::eventually("the invalid definition's status", || async {
        s.condition("bolts.things.kshard.dev", "Established").await["status"] == "False"
    })
    .await;
    let c = s.condition("bolts.things.kshard.dev", "Established").await;
    assert_eq!(c["reason"], "InvalidDefinition", "{c}");
    assert!(
        c["message"].as_str().is_some_and(|m| m.contains("storage")),
        "{c}"
    );

    // The others serve: the file's widgets and the host's gadgets.
    common::eventually("gadgets served", || async {
        s.send("GET", GADGETS, None).await.0 == 200
    })
    .await;
    assert_eq!(s.send("GET", common::WIDGETS, None).await.0, 200);
    assert_eq!(
        s.condition("gadgets.things.kshard.dev", "Established")
            .await["status"],
        "True"
    );
    // Fixed on the host: served at once.
    let mut fixed = gadgets(true);
    fixed["metadata"]["name"] = json!("bolts.things.kshard.dev");
    fixed["spec"]["names"] = json!({"plural": "bolts", "kind": "Bolt"});
    s.apply(fixed).await;
    common::eventually("bolts served once fixed", || async {
        s.send(
            "GET",
            "/apis/things.kshard.dev/v1/namespaces/default/bolts",
            None,
        )
        .await
        .0 == 200
    })
    .await;
    common::eventually("the fixed definition established", || async {
        s.condition("bolts.things.kshard.dev", "Established").await["status"] == "True"
    })
    .await;
}

/// The host-side CRD (`crds/apiextensions/`) takes a real definition's spec
/// unchanged: served by kshard itself (its schema engine prunes and
/// validates as the host's apiextensions-apiserver does), a CRD turned into
/// a ShardResourceDefinition by changing apiVersion and kind reads back with
/// the same spec, and kube's name rule holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_crd_becomes_a_shard_resource_definition_by_its_apiversion_and_kind() {
    let s = common::start_with(|c| c.crds.push(common::repo_path("crds/apiextensions"))).await;
    let text =
        std::fs::read_to_string(common::repo_path("crds/examples/widgets.yaml")).expect("crd");
    let mut def: Value = serde_saphyr::from_str(&text).expect("yaml");
    def["apiVersion"] = json!("apiextensions.kshard.dev/v1");
    def["kind"] = json!("ShardResourceDefinition");
    let uri = "/apis/apiextensions.kshard.dev/v1/shardresourcedefinitions";
    let r = s.post_json(uri, &def).await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["spec"], def["spec"], "the spec is kept whole");

    let mut misnamed = def.clone();
    misnamed["metadata"]["name"] = json!("widgets.elsewhere.dev");
    let r = s.post_json(uri, &misnamed).await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(
        r.text()
            .contains("metadata.name must be spec.names.plural+\\\".\\\"+spec.group"),
        "{}",
        r.text()
    );
}
