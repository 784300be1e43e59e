//! kube-rs clients (Api<DynamicObject>, watcher) against a real kshard.

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, PropagationPolicy, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::json;

fn widgets(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn obj(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).expect("object")
}

#[tokio::test(flavor = "multi_thread")]
async fn crud_generation_status_and_conflicts() {
    let s = common::start().await;
    let api = widgets(&s.client, "ns1");
    let created = api
        .create(&PostParams::default(), &obj(common::widget("a", 1)))
        .await
        .expect("create");
    let uid = created.metadata.uid.clone().expect("uid");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1 = created.metadata.resource_version.clone().expect("rv");

    // generateName
    let mut g = common::widget("", 1);
    g["metadata"] = json!({"generateName": "gen-"});
    let generated = api
        .create(&PostParams::default(), &obj(g))
        .await
        .expect("generateName");
    let name = generated.metadata.name.clone().expect("name");
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Spec change bumps generation; label change does not.
    let p = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("patch spec");
    assert_eq!(p.metadata.generation, Some(2));
    let p = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("patch labels");
    assert_eq!(p.metadata.generation, Some(2));

    // Status goes through /status only, and does not bump generation.
    let ignored = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 5}})),
        )
        .await
        .expect("main patch");
    assert!(ignored.data.get("status").is_none());
    let st = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": 5}, "spec": {"replicas": 100}})),
        )
        .await
        .expect("status patch");
    assert_eq!(st.data["status"]["replicas"], 5);
    assert_eq!(
        st.data["spec"]["replicas"], 2,
        "status writes cannot change spec"
    );
    assert_eq!(st.metadata.generation, Some(2));

    // Scale subresource reads and writes spec.replicas.
    let scale = api.get_scale("a").await.expect("scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2));
    assert_eq!(scale.status.map(|s| s.replicas), Some(5));
    api.patch_scale(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 4}})),
    )
    .await
    .expect("scale patch");
    assert_eq!(api.get("a").await.expect("get").data["spec"]["replicas"], 4);

    // Stale resourceVersion on replace: 409 Conflict.
    let mut stale = created.clone();
    stale.metadata.resource_version = Some(rv1);
    let err = api
        .replace("a", &PostParams::default(), &stale)
        .await
        .expect_err("stale");
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
        }
        other => panic!("{other:?}"),
    }
    // Replace with the current version works; uid and creationTimestamp are kept.
    let mut cur = api.get("a").await.expect("get");
    cur.data["spec"]["color"] = json!("red");
    let replaced = api
        .replace("a", &PostParams::default(), &cur)
        .await
        .expect("replace");
    assert_eq!(replaced.metadata.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(replaced.metadata.generation, Some(4));

    // dryRun writes nothing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry, &obj(common::widget("dry", 1)))
        .await
        .expect("dry create");
    assert!(api.get_opt("dry").await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn list_selectors_and_all_namespaces() {
    let s = common::start().await;
    for (ns, name, color) in [("a", "w1", "red"), ("a", "w2", "blue"), ("b", "w3", "red")] {
        let mut w = common::widget(name, 1);
        w["spec"]["color"] = json!(color);
        w["metadata"]["labels"] = json!({"color": color, "ns": ns});
        widgets(&s.client, ns)
            .create(&PostParams::default(), &obj(w))
            .await
            .expect("create");
    }
    let all: Api<DynamicObject> = Api::all_with(
        s.client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget")),
    );
    let names = |l: kube::core::ObjectList<DynamicObject>| -> Vec<String> {
        l.items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect()
    };
    assert_eq!(
        names(all.list(&ListParams::default()).await.expect("all")),
        ["w1", "w2", "w3"]
    );
    assert_eq!(
        names(
            widgets(&s.client, "a")
                .list(&ListParams::default())
                .await
                .expect("ns")
        ),
        ["w1", "w2"]
    );
    let red = ListParams::default().labels("color=red");
    assert_eq!(names(all.list(&red).await.expect("labels")), ["w1", "w3"]);
    let set = ListParams::default().labels("color in (blue),ns notin (b)");
    assert_eq!(names(all.list(&set).await.expect("set")), ["w2"]);
    let field = ListParams::default().fields("spec.color=red,metadata.namespace=b");
    assert_eq!(names(all.list(&field).await.expect("fields")), ["w3"]);
    let by_name = ListParams::default().fields("metadata.name!=w1");
    assert_eq!(names(all.list(&by_name).await.expect("name")), ["w2", "w3"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_events_in_order_with_selectors() {
    let s = common::start().await;
    let api = widgets(&s.client, "default");
    let mut w = common::widget("a", 1);
    w["metadata"]["labels"] = json!({"team": "x"});
    let a = api
        .create(&PostParams::default(), &obj(w))
        .await
        .expect("create");
    let rv = a.metadata.resource_version.clone().expect("rv");

    // From an exact revision: no initial state, then every change in order.
    let wp = WatchParams::default().labels("team=x").timeout(10);
    let mut stream = api.watch(&wp, &rv).await.expect("watch").boxed();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 2}})),
    )
    .await
    .expect("p1");
    // Leaves the selector: the watcher sees DELETED.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "y"}}})),
    )
    .await
    .expect("p2");
    // Comes back: ADDED.
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "x"}}})),
    )
    .await
    .expect("p3");
    api.delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    let mut seen = Vec::new();
    let mut last_rv = 0u64;
    while seen.len() < 4 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("event in time")
            .expect("ok")
            .expect("open");
        let (kind, o) = match ev {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("{other:?}"),
        };
        let r: u64 = o
            .metadata
            .resource_version
            .clone()
            .expect("rv")
            .parse()
            .expect("num");
        assert!(r > last_rv, "revisions increase");
        last_rv = r;
        seen.push(kind);
    }
    assert_eq!(seen, ["MODIFIED", "DELETED", "ADDED", "DELETED"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn watcher_streaming_lists_and_bookmarks() {
    let s = common::start_with(|c| c.bookmark_interval = Duration::from_millis(300)).await;
    let api = widgets(&s.client, "default");
    for i in 0..3 {
        api.create(
            &PostParams::default(),
            &obj(common::widget(&format!("s{i}"), i)),
        )
        .await
        .expect("create");
    }
    // kube-rs starts streaming lists at resourceVersion "0", which reads the
    // watch cache as it is (kube's too); it may trail the acknowledged creates.
    common::eventually("the watch cache holds s2", || async {
        s.get("/apis/demo.kshard.dev/v1/namespaces/default/widgets/s2?resourceVersion=0")
            .await
            .status
            == 200
    })
    .await;
    // kube-rs watcher with streaming lists (sendInitialEvents + initial-events-end bookmark).
    let cfg = watcher::Config::default().streaming_lists();
    let mut events = watcher(api.clone(), cfg).boxed();
    let mut init = Vec::new();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open");
        match ev {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => init.push(o.metadata.name.expect("name")),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(init, ["s0", "s1", "s2"]);
    api.create(&PostParams::default(), &obj(common::widget("s3", 3)))
        .await
        .expect("create");
    let ev = tokio::time::timeout(Duration::from_secs(5), events.try_next())
        .await
        .expect("in time")
        .expect("ok")
        .expect("open");
    assert!(
        matches!(ev, watcher::Event::Apply(ref o) if o.metadata.name.as_deref() == Some("s3")),
        "{ev:?}"
    );

    // Raw watch with bookmarks: the initial-events-end bookmark, then periodic ones.
    let wp = WatchParams::streaming_lists().timeout(5);
    let mut raw = api.watch(&wp, "").await.expect("watch").boxed();
    let mut added = 0;
    let mut end_bookmark = false;
    let mut periodic = 0;
    while periodic < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(5), raw.try_next())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open");
        match ev {
            WatchEvent::Added(_) => added += 1,
            WatchEvent::Bookmark(b) => {
                if b.metadata
                    .annotations
                    .contains_key("k8s.io/initial-events-end")
                {
                    assert_eq!(added, 4);
                    end_bookmark = true;
                } else {
                    assert!(end_bookmark);
                    periodic += 1;
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A watcher whose events never pause still gets its periodic bookmarks and
/// still ends at its timeout: a steady feed must not starve the watch's
/// bookmark tick or its deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_under_a_steady_flow_of_events_gets_bookmarks_and_ends_on_time() {
    let s = common::start_with(|c| c.bookmark_interval = Duration::from_millis(300)).await;
    let api = widgets(&s.client, "default");
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (api, writing) = (api.clone(), writing.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                let w = obj(common::widget(&format!("steady-{i}"), 1));
                api.create(&PostParams::default(), &w)
                    .await
                    .expect("create");
                i += 1;
            }
            i
        })
    };
    let started = std::time::Instant::now();
    let mut raw = api
        .watch(&WatchParams::default().timeout(2), "0")
        .await
        .expect("watch")
        .boxed();
    let (mut events, mut bookmarks) = (0, 0);
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), raw.try_next())
            .await
            .expect("the watch ends at its timeout while events flow");
        match next.expect("ok") {
            Some(WatchEvent::Added(_)) => events += 1,
            Some(WatchEvent::Bookmark(_)) => bookmarks += 1,
            Some(other) => panic!("{other:?}"),
            None => break,
        }
    }
    let lasted = started.elapsed();
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.expect("writer");
    assert!(
        lasted >= Duration::from_millis(1900) && lasted < Duration::from_secs(5),
        "the watch lasted {lasted:?}"
    );
    assert!(events > 20, "{events} events of {written} written");
    assert!(bookmarks >= 3, "{bookmarks} bookmarks in {lasted:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn owner_references_cascade() {
    let s = common::start().await;
    let api = widgets(&s.client, "default");
    let child_of = |owner: &DynamicObject, name: &str| {
        let mut c = common::widget(name, 1);
        c["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
            "name": owner.metadata.name, "uid": owner.metadata.uid, "blockOwnerDeletion": true,
        }]);
        obj(c)
    };
    let exists = |api: Api<DynamicObject>, name: &'static str| async move {
        api.get_opt(name).await.expect("get").is_some()
    };

    // Background: the owner goes at once, the child after it.
    let p = api
        .create(&PostParams::default(), &obj(common::widget("bg", 1)))
        .await
        .expect("owner");
    api.create(&PostParams::default(), &child_of(&p, "bg-child"))
        .await
        .expect("child");
    api.delete("bg", &DeleteParams::background())
        .await
        .expect("delete");
    common::eventually("background child collected", || {
        let a = api.clone();
        async move { !exists(a, "bg-child").await }
    })
    .await;

    // Foreground: the owner waits (foregroundDeletion) until its children are gone.
    let p = api
        .create(&PostParams::default(), &obj(common::widget("fg", 1)))
        .await
        .expect("owner");
    api.create(&PostParams::default(), &child_of(&p, "fg-child"))
        .await
        .expect("child");
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    let pending = api.delete("fg", &dp).await.expect("delete");
    let marked = pending
        .left()
        .expect("owner still there while dependents exist");
    assert!(marked
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&"foregroundDeletion".to_string()));
    common::eventually("foreground owner and child gone", || {
        let a = api.clone();
        async move { !exists(a.clone(), "fg-child").await && !exists(a, "fg").await }
    })
    .await;

    // Orphan: the child stays, without the owner reference.
    let p = api
        .create(&PostParams::default(), &obj(common::widget("or", 1)))
        .await
        .expect("owner");
    api.create(&PostParams::default(), &child_of(&p, "or-child"))
        .await
        .expect("child");
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    api.delete("or", &dp).await.expect("delete");
    common::eventually("orphan owner gone", || {
        let a = api.clone();
        async move { !exists(a, "or").await }
    })
    .await;
    let child = api.get("or-child").await.expect("child kept");
    assert!(child
        .metadata
        .owner_references
        .unwrap_or_default()
        .is_empty());
}

/// The collector's finer rules, as kube's garbage collector has them: an
/// owner in foreground deletion waits only for dependents that block it
/// (`blockOwnerDeletion`), and is released when such a dependent drops its
/// reference; a dependent with another live owner is kept and only loses the
/// references to owners that are gone or waiting.
#[tokio::test(flavor = "multi_thread")]
async fn owner_references_blocking_and_shared_dependents() {
    let s = common::start().await;
    let api = widgets(&s.client, "default");
    let create = |name: &'static str, owners: Vec<(&DynamicObject, bool)>, hold: bool| {
        let mut w = common::widget(name, 1);
        w["metadata"]["ownerReferences"] = owners
            .iter()
            .map(|(o, block)| {
                json!({
                    "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
                    "name": o.metadata.name, "uid": o.metadata.uid, "blockOwnerDeletion": block,
                })
            })
            .collect();
        if hold {
            w["metadata"]["finalizers"] = json!(["example.com/hold"]);
        }
        let api = api.clone();
        async move {
            api.create(&PostParams::default(), &obj(w))
                .await
                .expect("create")
        }
    };
    let foreground = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..Default::default()
    };
    let gone = |name: &'static str| {
        let a = api.clone();
        async move { a.get_opt(name).await.expect("get").is_none() }
    };
    // Deleting, kept for its own finalizer.
    let deleting = |name: &'static str| {
        let a = api.clone();
        async move {
            a.get(name)
                .await
                .expect("kept for its finalizer")
                .metadata
                .deletion_timestamp
                .is_some()
        }
    };
    let release = |name: &'static str| {
        let a = api.clone();
        async move {
            a.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("drop finalizer");
        }
    };

    // A dependent that does not block: the owner goes at once, the
    // dependent is deleted too (it stays only for its own finalizer).
    let owner = create("nb", vec![], false).await;
    create("nb-child", vec![(&owner, false)], true).await;
    api.delete("nb", &foreground).await.expect("delete");
    common::eventually("owner with no blocking dependent gone", || gone("nb")).await;
    // The collector deletes the dependent and releases the owner in one
    // pass, in no promised order (kube's does both from separate queues).
    common::eventually(
        "the dependent of a foreground deletion is deleted too",
        || deleting("nb-child"),
    )
    .await;
    release("nb-child").await;
    common::eventually("non-blocking child gone", || gone("nb-child")).await;

    // A blocking dependent holds the owner until it drops the reference.
    let owner = create("rel", vec![], false).await;
    create("rel-child", vec![(&owner, true)], true).await;
    api.delete("rel", &foreground).await.expect("delete");
    common::eventually("blocking child deleting", || deleting("rel-child")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiting = api
        .get("rel")
        .await
        .expect("owner waits for its blocking dependent");
    assert!(waiting
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&"foregroundDeletion".to_string()));
    api.patch(
        "rel-child",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
    )
    .await
    .expect("drop the owner reference");
    common::eventually("owner released when its dependent let go", || gone("rel")).await;
    release("rel-child").await;

    // A dependent with a second, live owner stays and loses the reference
    // to the owner deleting in the foreground; that owner does not wait.
    let a = create("a", vec![], false).await;
    let b = create("b", vec![], false).await;
    create("shared", vec![(&a, true), (&b, true)], false).await;
    api.delete("a", &foreground).await.expect("delete");
    common::eventually("owner a gone", || gone("a")).await;
    let shared = api.get("shared").await.expect("kept: b still owns it");
    assert!(shared.metadata.deletion_timestamp.is_none());
    let refs: Vec<String> = shared
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(refs, vec!["b".to_string()]);

    // Its last owner deleted in the background, it is collected.
    api.delete("b", &DeleteParams::background())
        .await
        .expect("delete");
    common::eventually("shared dependent collected", || gone("shared")).await;

    // A reference to a namespaced owner is resolved in the dependent's own
    // namespace: the uid of an object elsewhere is an absent owner, so the
    // dependent is collected, and that object does not wait for it.
    let elsewhere = create("elsewhere", vec![], false).await;
    let other = widgets(&s.client, "other");
    let mut w = common::widget("stray", 1);
    w["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
        "name": "elsewhere", "uid": elsewhere.metadata.uid, "blockOwnerDeletion": true,
    }]);
    other
        .create(&PostParams::default(), &obj(w))
        .await
        .expect("stray dependent");
    common::eventually(
        "a dependent of an owner in another namespace is collected",
        || {
            let o = other.clone();
            async move { o.get_opt("stray").await.expect("get").is_none() }
        },
    )
    .await;
    assert!(api.get_opt("elsewhere").await.expect("get").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_preconditions_and_deletecollection() {
    let s = common::start().await;
    let api = widgets(&s.client, "default");
    for (n, l) in [("d1", "a"), ("d2", "a"), ("d3", "b")] {
        let mut w = common::widget(n, 1);
        w["metadata"]["labels"] = json!({"grp": l});
        api.create(&PostParams::default(), &obj(w))
            .await
            .expect("create");
    }
    let bad = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete("d1", &bad).await.expect_err("precondition") {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 409);
            assert!(
                st.message.contains(
                    "the UID in the precondition (nope) does not match the UID in record"
                ),
                "{}",
                st.message
            );
        }
        other => panic!("{other:?}"),
    }
    let deleted = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("grp=a"),
        )
        .await
        .expect("deletecollection");
    let names: Vec<String> = deleted
        .left()
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(names, ["d1", "d2"]);
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(left, ["d3"]);
}
