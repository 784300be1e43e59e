//! Backup and restore as an operator uses them: the real `kshard` binary
//! serving over HTTPS, `kshard snapshot save | restore | status` run as
//! commands, kube-rs clients and informers against the servers, and the
//! TiKV test double as the shared store a shard moves to and back from.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kshard::snapshot::format::{self, Entry, Header, Item};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{json, Value};

const KEY_PREFIX: &str = "demo.kshard.dev/widgets/default/";

fn widgets(client: kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget");
    Api::namespaced_with(client, "default", &ApiResource::from_gvk(&gvk))
}

fn rv_of(o: &DynamicObject) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// A widget with about `pad` bytes of extra spec (kept: the schema
/// preserves unknown fields under spec).
fn padded(name: &str, replicas: i64, pad: usize) -> DynamicObject {
    let mut w = common::widget(name, replicas);
    w["spec"]["notes"] = json!("n".repeat(pad));
    serde_json::from_value(w).expect("widget")
}

/// Runs `kshard <args>` to completion (off the runtime's workers).
fn kshard(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kshard"));
    cmd.args(args);
    common::run_blocking(cmd, None)
}

fn kshard_ok(args: &[&str]) -> String {
    let out = kshard(args);
    assert!(
        out.status.success(),
        "kshard {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kshard <args>` that must fail; returns its stderr.
fn kshard_fails(args: &[&str]) -> String {
    let out = kshard(args);
    assert!(
        !out.status.success(),
        "kshard {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `kshard serve` on `data_dir` listening on `listen` (`127.0.0.1:0` for
/// any port); returns once it serves.
fn serve_at(data_dir: &Path, listen: &str, extra: &[&str]) -> common::KillOnDrop {
    use std::io::{BufRead, BufReader};
    let log = std::fs::File::create(data_dir.with_extension("log")).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["serve", "--listen", listen, "--crds"])
        .arg(common::repo_path("crds/examples"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(log))
        .spawn()
        .expect("spawn kshard");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_else(|| {
        panic!(
            "kshard on {} did not start:\n{}",
            data_dir.display(),
            std::fs::read_to_string(data_dir.with_extension("log")).unwrap_or_default()
        )
    });
    assert!(
        first.starts_with("kshard is serving on https://"),
        "{first}"
    );
    std::thread::spawn(move || for _ in lines {});
    common::KillOnDrop(child)
}

/// Reads a snapshot file whole (checked): its header and objects.
fn read_snapshot(path: &Path) -> (Header, Vec<Entry>) {
    let file = std::fs::File::open(path).expect("snapshot file");
    let mut entries = Vec::new();
    let (header, _) = format::read_all(file, |_, item| {
        if let Item::Objects(o) = item {
            entries.extend(o);
        }
        Ok(())
    })
    .expect("a whole snapshot");
    (header, entries)
}

/// The widgets of a snapshot: name → (revision, uid).
fn widgets_in(entries: &[Entry]) -> BTreeMap<String, (u64, String)> {
    entries
        .iter()
        .filter_map(|e| {
            let name = e.key.strip_prefix(KEY_PREFIX)?;
            let v: Value = serde_json::from_slice(&e.json).expect("json");
            let uid = v["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            Some((name.to_string(), (e.revision, uid)))
        })
        .collect()
}

/// Every widget as served, in a list's order (the whole objects).
async fn list_items(api: &Api<DynamicObject>) -> (u64, Vec<Value>) {
    let client = api.clone().into_client();
    let (code, _, body) = common::send(
        &client,
        "GET",
        "/apis/demo.kshard.dev/v1/namespaces/default/widgets",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("list");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("list resourceVersion");
    (rv, list["items"].as_array().cloned().unwrap_or_default())
}

/// Objects of several field managers: created by one, applied by two more.
async fn populate(api: &Api<DynamicObject>, n: usize) {
    for i in 0..n {
        api.create(
            &PostParams::default(),
            &padded(&format!("w{i:03}"), i as i64, 64),
        )
        .await
        .expect("create");
    }
    for (i, manager) in [(0, "alpha"), (1, "beta"), (1, "alpha")] {
        let patch = json!({
            "apiVersion": "demo.kshard.dev/v1",
            "kind": "Widget",
            "metadata": {"name": format!("w{i:03}"), "labels": {manager: "yes"}},
            "spec": {"size": manager},
        });
        api.patch(
            &format!("w{i:03}"),
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .expect("apply");
    }
}

/// A write one of the writers had acknowledged.
#[derive(Debug, Clone)]
struct Ack {
    name: String,
    rv: u64,
    at: Instant,
}

/// One writer: creates, patches and deletes its own widgets until `stop`,
/// recording the resourceVersion of every create and patch acknowledged.
fn writer(
    api: Api<DynamicObject>,
    id: usize,
    stop: Arc<AtomicBool>,
    acks: Arc<Mutex<Vec<Ack>>>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut live: Vec<String> = Vec::new();
        let mut n = 0;
        let mut deletes = 0;
        while !stop.load(Ordering::Acquire) {
            n += 1;
            let name = format!("x{id}-{n}");
            let created = api
                .create(&PostParams::default(), &padded(&name, 1, 256))
                .await
                .expect("create");
            acks.lock().expect("acks").push(Ack {
                name: name.clone(),
                rv: rv_of(&created),
                at: Instant::now(),
            });
            live.push(name);
            if n % 2 == 0 {
                let target = live[live.len() / 2].clone();
                let patched = api
                    .patch(
                        &target,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"replicas": n}})),
                    )
                    .await
                    .expect("patch");
                acks.lock().expect("acks").push(Ack {
                    name: target,
                    rv: rv_of(&patched),
                    at: Instant::now(),
                });
            }
            if n % 3 == 0 {
                let gone = live.remove(0);
                api.delete(&gone, &DeleteParams::default())
                    .await
                    .expect("delete");
                deletes += 1;
            }
        }
        deletes
    })
}

/// A snapshot taken while eight writers create, patch and delete holds
/// exactly the state at its revision: every write acknowledged before the
/// save began is in, nothing after its revision is, and the objects equal
/// what a watch from before the writes says was there at that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_snapshot_under_eight_writers_is_the_state_at_its_revision() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let _server = serve_at(&data, "127.0.0.1:0", &[]);
    let api = widgets(common::client_for(&data.join("kubeconfig")).await);
    // Enough objects that reading them takes a while.
    let preload: Vec<_> = (0..8)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                for i in 0..200 {
                    api.create(
                        &PostParams::default(),
                        &padded(&format!("pre{w}-{i}"), i, 1024),
                    )
                    .await
                    .expect("preload");
                }
            })
        })
        .collect();
    for p in preload {
        p.await.expect("preload task");
    }
    let start = api.list(&ListParams::default()).await.expect("list");
    let from = start.metadata.resource_version.clone().expect("list rv");
    let mut state: BTreeMap<String, (u64, String)> = start
        .items
        .iter()
        .map(|o| {
            (
                o.metadata.name.clone().expect("name"),
                (rv_of(o), o.metadata.uid.clone().expect("uid")),
            )
        })
        .collect();

    // The record of every change, from before the writers start.
    let events = Arc::new(Mutex::new(Vec::<(String, String, u64, String)>::new()));
    let watcher = {
        let (api, events) = (api.clone(), events.clone());
        tokio::spawn(async move {
            let wp = WatchParams::default().timeout(290);
            let mut stream = api.watch(&wp, &from).await.expect("watch").boxed();
            while let Some(e) = stream.try_next().await.expect("watch stream") {
                let (kind, o) = match e {
                    WatchEvent::Added(o) => ("ADDED", o),
                    WatchEvent::Modified(o) => ("MODIFIED", o),
                    WatchEvent::Deleted(o) => ("DELETED", o),
                    WatchEvent::Bookmark(_) => continue,
                    WatchEvent::Error(e) => panic!("the oracle's watch failed: {e:?}"),
                };
                events.lock().expect("events").push((
                    kind.to_string(),
                    o.metadata.name.clone().expect("name"),
                    rv_of(&o),
                    o.metadata.uid.clone().expect("uid"),
                ));
            }
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..8)
        .map(|id| writer(api.clone(), id, stop.clone(), acks.clone()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let file = dir.path().join("under-load.snap");
    let asked = Instant::now();
    let acknowledged_before = acks
        .lock()
        .expect("acks")
        .iter()
        .map(|a| a.rv)
        .max()
        .expect("writes before the snapshot");
    let said = kshard_ok(&[
        "snapshot",
        "save",
        path_str(&file),
        "--data-dir",
        path_str(&data),
    ]);
    let saved_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Release);
    let mut deletes = 0;
    for w in writers {
        deletes += w.await.expect("writer");
    }
    assert!(deletes > 0, "the writers deleted nothing");

    let (header, entries) = read_snapshot(&file);
    let revision = header.revision;
    assert!(said.contains(&format!("revision {revision}")), "{said}");
    assert_eq!(header.engine, "embedded");
    let acks = acks.lock().expect("acks").clone();
    let newest = acks.iter().map(|a| a.rv).max().expect("acks");
    assert!(
        revision >= acknowledged_before,
        "the snapshot at {revision} misses writes acknowledged before it was asked for (up to {acknowledged_before})"
    );
    assert!(
        newest > revision,
        "no write after the snapshot's revision: the test proves nothing"
    );
    let during = acks
        .iter()
        .filter(|a| a.at > asked && a.at < saved_at)
        .count();
    eprintln!(
        "snapshot at {revision}: {} objects; {} writes acknowledged, {during} while it was taken",
        entries.len(),
        acks.len()
    );

    // The watch has seen every acknowledged write.
    common::eventually("the watch saw every write", || {
        let events = events.clone();
        async move {
            events
                .lock()
                .expect("events")
                .iter()
                .any(|(_, _, rv, _)| *rv >= newest)
        }
    })
    .await;
    watcher.abort();
    let events = events.lock().expect("events").clone();
    for a in acks.iter().filter(|a| a.rv <= revision) {
        assert!(
            events
                .iter()
                .any(|(_, n, rv, _)| *n == a.name && *rv == a.rv),
            "the watch never showed {} at {}",
            a.name,
            a.rv
        );
    }
    for (kind, name, rv, uid) in events.iter().filter(|e| e.2 <= revision) {
        if kind == "DELETED" {
            state.remove(name);
        } else {
            state.insert(name.clone(), (*rv, uid.clone()));
        }
    }
    let snap = widgets_in(&entries);
    let missing: Vec<_> = state.keys().filter(|k| !snap.contains_key(*k)).collect();
    let extra: Vec<_> = snap.keys().filter(|k| !state.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "at revision {revision}: missing {missing:?}, not there then {extra:?}"
    );
    assert_eq!(snap, state, "objects differ from the state at {revision}");
    for a in acks.iter().filter(|a| a.rv > revision) {
        assert!(
            snap.get(&a.name).is_none_or(|(rv, _)| *rv != a.rv),
            "{} at {} is after the snapshot's revision",
            a.name,
            a.rv
        );
    }
}

/// A write through the API; its resourceVersion.
async fn create_one(api: &Api<DynamicObject>, name: &str) -> u64 {
    rv_of(
        &api.create(&PostParams::default(), &padded(name, 7, 16))
            .await
            .expect("create"),
    )
}

/// Copies the dev PKI, so a server on the new data directory is trusted by
/// the old kubeconfig (an operator keeps the serving certificate).
fn copy_pki(from: &Path, to: &Path) {
    let (from, to) = (from.join("pki"), to.join("pki"));
    std::fs::create_dir_all(&to).expect("pki dir");
    for f in std::fs::read_dir(&from).expect("pki") {
        let f = f.expect("entry").path();
        std::fs::copy(&f, to.join(f.file_name().expect("name"))).expect("copy");
    }
}

/// Restored in place of the server it came from (same address and
/// certificates): the objects come back exactly, a kube-rs informer whose
/// watch resumes from a revision of the old server gets 410 and re-lists to
/// the restored state, old revisions are refused with 410, and new writes
/// continue above the restored revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_shard_serves_the_snapshot_and_informers_relist() {
    use kube::runtime::{reflector, watcher, WatchStreamExt};
    let dir = tempfile::tempdir().expect("tmp");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    let listen = format!("127.0.0.1:{}", common::real_host::free_port());
    let server = serve_at(&old, &listen, &[]);
    let client = common::client_for(&old.join("kubeconfig")).await;
    let api = widgets(client.clone());
    populate(&api, 20).await;

    // An informer, as a controller runs one.
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("demo.kshard.dev", "v1", "Widget"));
    let writer = reflector::store::Writer::<DynamicObject>::new(ar);
    let reader = writer.as_reader();
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let informer = {
        let (api, lists) = (api.clone(), lists.clone());
        tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer);
            let mut stream = std::pin::pin!(stream);
            while let Some(e) = stream.next().await {
                if let Ok(watcher::Event::Init) = e {
                    lists.fetch_add(1, Ordering::AcqRel);
                }
            }
        })
    };
    let names = move |reader: &reflector::Store<DynamicObject>| {
        let mut n: Vec<String> = reader
            .state()
            .iter()
            .filter_map(|o| o.metadata.name.clone())
            .collect();
        n.sort();
        n
    };
    common::eventually("the informer lists", || {
        let r = reader.clone();
        async move { names(&r).len() == 20 }
    })
    .await;

    let (_, before) = list_items(&api).await;
    let file = dir.path().join("s.snap");
    kshard_ok(&[
        "snapshot",
        "save",
        path_str(&file),
        "--data-dir",
        path_str(&old),
    ]);
    let (header, _) = read_snapshot(&file);
    // Changes after the snapshot, which the informer sees.
    create_one(&api, "after-snapshot").await;
    api.delete("w005", &DeleteParams::default())
        .await
        .expect("delete");
    common::eventually("the informer follows", || {
        let r = reader.clone();
        async move {
            let n = names(&r);
            n.contains(&"after-snapshot".to_string()) && !n.contains(&"w005".to_string())
        }
    })
    .await;
    assert_eq!(lists.load(Ordering::Acquire), 1);

    drop(server);
    let said = kshard_ok(&[
        "snapshot",
        "restore",
        path_str(&file),
        "--data-dir",
        path_str(&new),
    ]);
    let restored_rv = header.revision + kshard::snapshot::restore::DEFAULT_BUMP_REVISION;
    assert!(said.contains(&restored_rv.to_string()), "{said}");
    copy_pki(&old, &new);
    let _server = serve_at(&new, &listen, &[]);

    // The informer's watch resumes from a revision of the old server: 410,
    // a new list, and the restored state.
    common::eventually("the informer re-lists the restored state", || {
        let r = reader.clone();
        async move {
            let n = names(&r);
            n.len() == 20
                && n.contains(&"w005".to_string())
                && !n.contains(&"after-snapshot".to_string())
        }
    })
    .await;
    assert!(
        lists.load(Ordering::Acquire) >= 2,
        "the informer never re-listed"
    );
    informer.abort();

    // Exactly the objects saved: uid, resourceVersion, managedFields, all.
    let (list_rv, after) = list_items(&api).await;
    assert_eq!(after, before, "the restored objects differ");
    // Revisions continue from the bumped one; the server's own writes after
    // its start (flow-control status) may already have taken a few more.
    assert!(
        (restored_rv..restored_rv + 100).contains(&list_rv),
        "list at {list_rv}, restored at {restored_rv}"
    );
    let managers: Vec<&str> = after[1]["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(
        managers.contains(&"alpha") && managers.contains(&"beta"),
        "{managers:?}"
    );

    // Older revisions are gone (410), as after an etcd restore.
    let old_rv = header.revision;
    let (code, _, body) = common::send(
        &client,
        "GET",
        &format!("{}?watch=1&resourceVersion={old_rv}", common::WIDGETS),
        &[],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(r#""code":410"#) && body.contains("Expired"),
        "a watch from {old_rv}: {body}"
    );
    let (code, _, body) = common::send(
        &client,
        "GET",
        &format!(
            "{}?resourceVersion={old_rv}&resourceVersionMatch=Exact",
            common::WIDGETS
        ),
        &[],
        None,
    )
    .await;
    assert_eq!(code, 410, "{body}");

    // Writes continue above the restored revision.
    let next = create_one(&api, "after-restore").await;
    assert!(next > restored_rv, "{next} after {restored_rv}");
}

/// A dependent whose owner is gone when the server starts is collected,
/// wherever it is in the store: the garbage collector reads the store a
/// page at a time at start-up (2,048 objects), and this one is past the
/// first page. The store is made by restoring a snapshot without the owner.
#[tokio::test(flavor = "multi_thread")]
async fn a_dependent_whose_owner_is_gone_at_start_is_collected() {
    let dir = tempfile::tempdir().expect("tmp");
    let (source, restored) = (dir.path().join("source"), dir.path().join("restored"));
    let (saved, edited) = (
        dir.path().join("saved.snap"),
        dir.path().join("edited.snap"),
    );
    {
        let _server = serve_at(&source, "127.0.0.1:0", &[]);
        let api = widgets(common::client_for(&source.join("kubeconfig")).await);
        let owner = api
            .create(&PostParams::default(), &padded("a-owner", 1, 0))
            .await
            .expect("owner");
        let mut dependent = common::widget("zz-dependent", 1);
        dependent["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "demo.kshard.dev/v1", "kind": "Widget",
            "name": "a-owner", "uid": owner.metadata.uid,
        }]);
        api.create(
            &PostParams::default(),
            &serde_json::from_value(dependent).expect("widget"),
        )
        .await
        .expect("dependent");
        // More objects than a page of the collector's start-up read, keyed
        // between the owner and its dependent.
        futures::stream::iter(0..2100)
            .map(|i| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &padded(&format!("m{i:04}"), 1, 0))
                        .await
                        .expect("create")
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
    }
    kshard_ok(&[
        "snapshot",
        "save",
        "-q",
        "--store",
        "embedded",
        "--data-dir",
        path_str(&source),
        path_str(&saved),
    ]);
    let (header, entries) = read_snapshot(&saved);
    let owner_key = format!("{KEY_PREFIX}a-owner");
    assert!(entries.iter().any(|e| e.key == owner_key));
    let kept: Vec<Entry> = entries.into_iter().filter(|e| e.key != owner_key).collect();
    let mut enc = format::Encoder::new();
    let mut file = enc.start(&header).to_vec();
    for chunk in kept.chunks(500) {
        file.extend_from_slice(&enc.objects(chunk));
    }
    file.extend_from_slice(&enc.finish().0);
    std::fs::write(&edited, file).expect("write");
    kshard_ok(&[
        "snapshot",
        "restore",
        "-q",
        "--data-dir",
        path_str(&restored),
        path_str(&edited),
    ]);

    let _server = serve_at(&restored, "127.0.0.1:0", &[]);
    let api = widgets(common::client_for(&restored.join("kubeconfig")).await);
    common::eventually("the dependent of a missing owner is collected", || {
        let api = api.clone();
        async move { api.get_opt("zz-dependent").await.expect("get").is_none() }
    })
    .await;
    assert!(api.get_opt("m2099").await.expect("get").is_some());
}

/// The operator's protections: a non-empty target is refused unless
/// --force (which replaces it); a truncated or corrupted file is refused by
/// name before anything is written; `status` checks a file whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_files_and_non_empty_targets_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let server = serve_at(&data, "127.0.0.1:0", &[]);
    let api = widgets(common::client_for(&data.join("kubeconfig")).await);
    populate(&api, 300).await;
    let file = dir.path().join("good.snap");
    kshard_ok(&[
        "snapshot",
        "save",
        path_str(&file),
        "--data-dir",
        path_str(&data),
        "-q",
    ]);
    drop(server);
    let status = kshard_ok(&["snapshot", "status", path_str(&file), "-o", "json"]);
    let status: Value = serde_json::from_str(&status).expect("status json");
    assert_eq!(status["header"]["engine"], "embedded");
    assert_eq!(status["header"]["formatVersion"], 1);
    assert!(status["trailer"]["objects"]
        .as_u64()
        .is_some_and(|n| n >= 300));

    let good = std::fs::read(&file).expect("file");
    let bad = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    };
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    let cases = [
        (bad("half.snap", &good[..good.len() / 2]), "truncated"),
        (
            bad("no-trailer.snap", &good[..good.len() - 20]),
            "truncated",
        ),
        (bad("flipped.snap", &flipped), "corrupted"),
        (
            bad("garbage.snap", b"{\"not\": \"a snapshot\"}"),
            "not a kshard snapshot",
        ),
    ];
    for (path, why) in &cases {
        let target = dir.path().join(format!(
            "from-{}",
            path.file_stem().unwrap().to_string_lossy()
        ));
        let err = kshard_fails(&[
            "snapshot",
            "restore",
            path_str(path),
            "--data-dir",
            path_str(&target),
        ]);
        assert!(err.contains(why), "{}: {err}", path.display());
        // Nothing half-restored: no store, nothing being built.
        let left: Vec<_> = std::fs::read_dir(&target)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{}: left behind {left:?}", path.display());
        let err = kshard_fails(&["snapshot", "status", path_str(path)]);
        assert!(err.contains(why), "status of {}: {err}", path.display());
    }

    // A restored directory is not restored into again without --force.
    let target = dir.path().join("restored");
    let args = [
        "snapshot",
        "restore",
        path_str(&file),
        "--data-dir",
        path_str(&target),
    ];
    kshard_ok(&args);
    let err = kshard_fails(&args);
    assert!(
        err.contains("holds a store already") && err.contains("--force"),
        "{err}"
    );
    // Nor the data directory of a running server, even with --force.
    let server = serve_at(&target, "127.0.0.1:0", &[]);
    let err = kshard_fails(&[&args[..], &["--force"][..]].concat());
    assert!(err.contains("is a kshard serving it?"), "{err}");
    drop(server);
    // A server's writes there, then --force: exactly the snapshot again.
    let server = serve_at(&target, "127.0.0.1:0", &[]);
    let api = widgets(common::client_for(&target.join("kubeconfig")).await);
    create_one(&api, "extra").await;
    drop(server);
    kshard_ok(&[&args[..], &["--force", "--bump-revision", "0"][..]].concat());
    let _server = serve_at(&target, "127.0.0.1:0", &[]);
    let api = widgets(common::client_for(&target.join("kubeconfig")).await);
    let (rv, items) = list_items(&api).await;
    assert_eq!(rv, status["header"]["revision"].as_u64().expect("revision"));
    assert!(items.iter().all(|o| o["metadata"]["name"] != "extra"));
    assert_eq!(items.len(), 300);
}

/// Writes a kubeconfig for a user of the data directory's dev CA (a
/// certificate like the admin's, in other groups), straight at the server.
fn user_kubeconfig(data: &Path, user: Option<(&str, &[&str])>) -> PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let pki = data.join("pki");
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).expect("ca key"))
        .expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "kshard-ca");
    let issuer = Issuer::new(ca, &ca_key);
    let creds = user.map(|(user, groups)| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).expect("cert");
        (cert.pem(), key.serialize_pem())
    });
    let name = user.map_or("anonymous", |(u, _)| u);
    let path = data.with_file_name(format!("{name}.kubeconfig"));
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).expect("ca");
    let server = format!("https://{}", common::served_addr(data));
    common::tls::write_kubeconfig(&path, &server, &ca_pem, None, creds.as_ref());
    path
}

/// Standalone, only system:masters may take a snapshot: another user of
/// the server's own CA, and anonymous requests (which may read and write
/// everything on loopback), get kube's 403, and no file is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_administrator_may_take_a_snapshot() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let _server = serve_at(&data, "127.0.0.1:0", &[]);
    let alice = user_kubeconfig(&data, Some(("alice", &["devs"])));
    let nobody = user_kubeconfig(&data, None);

    // Alice may write widgets (the standalone authorizer allows every
    // authenticated user), but not take the whole store.
    let alice_api = widgets(common::client_for(&alice).await);
    create_one(&alice_api, "by-alice").await;
    let file = dir.path().join("s.snap");
    for (kubeconfig, user) in [(&alice, "alice"), (&nobody, "system:anonymous")] {
        let err = kshard_fails(&[
            "snapshot",
            "save",
            path_str(&file),
            "--kubeconfig",
            path_str(kubeconfig),
        ]);
        assert!(
            err.contains("403")
                && err.contains(&format!(
                    r#"User "{user}" cannot get path "/kshard/snapshot""#
                )),
            "{err}"
        );
        assert!(!file.exists() && !file.with_extension("snap.part").exists());
    }
    let (code, _, body) = common::send(
        &alice_api.clone().into_client(),
        "GET",
        "/kshard/snapshot",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
    let status: Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(
        (status["kind"].as_str(), status["reason"].as_str()),
        (Some("Status"), Some("Forbidden"))
    );

    // The data directory's own kubeconfig is the administrator's.
    kshard_ok(&[
        "snapshot",
        "save",
        path_str(&file),
        "--data-dir",
        path_str(&data),
    ]);
    let (_, entries) = read_snapshot(&file);
    assert!(widgets_in(&entries).contains_key("by-alice"));
}

/// Behind a real host, whoever the host's RBAC grants `get` on the
/// non-resource URL /kshard/snapshot may take a snapshot (a bearer token
/// reviewed by the host); others are refused with 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_host_rbac_grants_snapshots() {
    use common::real_host::{RealHost, ALICE, BOB};
    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    let kshard = host.install_kshard(&[]);
    host.apply(&[
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "kshard-snapshot"},
            "rules": [{"nonResourceURLs": ["/kshard/snapshot"], "verbs": ["get"]}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kshard-snapshot-alice"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kshard-snapshot"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ALICE.1}],
        }),
    ]);
    let server = format!("https://127.0.0.1:{}", kshard.port);
    let kubeconfig = |who: &str, token: &str| {
        let p = host.dir.join(format!("{who}.kubeconfig"));
        common::tls::write_kubeconfig(&p, &server, &kshard.ca.pem, Some(token), None);
        p
    };
    let (alice, bob) = (kubeconfig("alice", ALICE.0), kubeconfig("bob", BOB.0));
    let file = dir.path().join("s.snap");
    let err = kshard_fails(&[
        "snapshot",
        "save",
        path_str(&file),
        "--kubeconfig",
        path_str(&bob),
    ]);
    assert!(
        err.contains("403") && err.contains(r#"User "bob" cannot get path"#),
        "{err}"
    );
    let said = kshard_ok(&[
        "snapshot",
        "save",
        path_str(&file),
        "--kubeconfig",
        path_str(&alice),
    ]);
    assert!(said.contains("saved"), "{said}");
    let (header, _) = read_snapshot(&file);
    assert_eq!(header.engine, "embedded");
}

#[cfg(feature = "tikv")]
mod tikv {
    use super::*;
    use common::replicas::{shared_store, spawn_replica, wait_ready};

    /// The objects of a store (whole JSON, in key order), for comparing two.
    fn same_entries(a: &[Entry], b: &[Entry]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!((&x.key, x.revision), (&y.key, y.revision));
            assert_eq!(x.json, y.json, "{}", x.key);
        }
    }

    /// Every key of a TiKV shard prefix.
    fn keys_of(pd: &str, shard: &str) -> usize {
        let engine = kshard::storage::open_engine(
            Some(&format!("tikv://{pd}?prefix={shard}")),
            Path::new(""),
            0,
        )
        .expect("engine");
        let mut n = 0;
        engine
            .read()
            .expect("read")
            .scan(&[], &[0xff], &mut |_, _| {
                n += 1;
                std::ops::ControlFlow::Continue(())
            })
            .expect("scan");
        n
    }

    /// From the embedded store to TiKV (the test double) and back: the
    /// replicas on TiKV serve the same objects (uid, resourceVersion,
    /// managedFields, every byte), a snapshot of them through a replica's
    /// API and one read from TiKV directly are the same, and restored into
    /// a new embedded directory they come back again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_shard_moves_to_tikv_and_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let embedded = dir.path().join("embedded");
        let server = serve_at(&embedded, "127.0.0.1:0", &[]);
        let api = widgets(common::client_for(&embedded.join("kubeconfig")).await);
        populate(&api, 50).await;
        let (_, before) = list_items(&api).await;
        let out = dir.path().join("out.snap");
        kshard_ok(&[
            "snapshot",
            "save",
            path_str(&out),
            "--data-dir",
            path_str(&embedded),
        ]);
        // Stopped, its store is read directly too: the same objects.
        let busy = dir.path().join("busy.snap");
        let err = kshard_fails(&[
            "snapshot",
            "save",
            path_str(&busy),
            "--store",
            "embedded",
            "--data-dir",
            path_str(&embedded),
        ]);
        assert!(err.contains("is a kshard serving it?"), "{err}");
        drop(server);
        let offline = dir.path().join("offline.snap");
        kshard_ok(&[
            "snapshot",
            "save",
            path_str(&offline),
            "--store",
            "embedded",
            "--data-dir",
            path_str(&embedded),
        ]);
        let widgets_of = |p: &Path| {
            let (_, e) = read_snapshot(p);
            e.into_iter()
                .filter(|e| e.key.starts_with(KEY_PREFIX))
                .collect::<Vec<_>>()
        };
        same_entries(&widgets_of(&out), &widgets_of(&offline));

        let (_double, pd, shard) = shared_store();
        let store = format!("tikv://{pd}?prefix={shard}");
        kshard_ok(&["snapshot", "restore", path_str(&out), "--store", &store]);
        let err = kshard_fails(&["snapshot", "restore", path_str(&out), "--store", &store]);
        assert!(err.contains("holds this shard's data already"), "{err}");

        let replicas: Vec<_> = ["a", "b"]
            .iter()
            .map(|id| spawn_replica(dir.path(), id, &pd, &shard))
            .collect();
        let mut apis = Vec::new();
        for r in &replicas {
            let client = r.client().await;
            wait_ready(&client, Duration::from_secs(60)).await;
            apis.push(widgets(client));
        }
        for api in &apis {
            let (_, items) = list_items(api).await;
            assert_eq!(items, before, "a replica on TiKV serves other objects");
        }
        // Replicas running: not even --force replaces their store.
        let err = kshard_fails(&[
            "snapshot",
            "restore",
            path_str(&out),
            "--store",
            &store,
            "--force",
        ]);
        assert!(err.contains("leader lease"), "{err}");

        // Writes continue there (through a follower or the leader).
        create_one(&apis[1], "on-tikv").await;
        let (_, on_tikv) = list_items(&apis[0]).await;
        assert_eq!(on_tikv.len(), before.len() + 1);

        // Back: through a replica's API, and straight from TiKV.
        let back = dir.path().join("back.snap");
        kshard_ok(&[
            "snapshot",
            "save",
            path_str(&back),
            "--kubeconfig",
            path_str(&replicas[1].kubeconfig()),
        ]);
        let direct = dir.path().join("direct.snap");
        kshard_ok(&["snapshot", "save", path_str(&direct), "--store", &store]);
        let (h1, e1) = read_snapshot(&back);
        let (h2, e2) = read_snapshot(&direct);
        assert_eq!(
            (h1.engine.as_str(), h1.shard.as_deref()),
            ("tikv", Some(shard.as_str()))
        );
        assert_eq!(h1.revision, h2.revision);
        same_entries(&e1, &e2);
        drop(replicas);

        let returned = dir.path().join("returned");
        kshard_ok(&[
            "snapshot",
            "restore",
            path_str(&back),
            "--data-dir",
            path_str(&returned),
            "--bump-revision",
            "0",
        ]);
        let _server = serve_at(&returned, "127.0.0.1:0", &[]);
        let api = widgets(common::client_for(&returned.join("kubeconfig")).await);
        let (rv, items) = list_items(&api).await;
        assert_eq!(rv, h1.revision, "--bump-revision 0 keeps the revision");
        assert_eq!(items, on_tikv, "the shard came back from TiKV changed");
    }

    /// A damaged file is refused before anything reaches the TiKV prefix,
    /// and a store holding an interrupted restore is not served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_damaged_file_leaves_a_tikv_prefix_untouched() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = dir.path().join("data");
        let server = serve_at(&data, "127.0.0.1:0", &[]);
        let api = widgets(common::client_for(&data.join("kubeconfig")).await);
        populate(&api, 20).await;
        let file = dir.path().join("s.snap");
        kshard_ok(&[
            "snapshot",
            "save",
            path_str(&file),
            "--data-dir",
            path_str(&data),
        ]);
        drop(server);
        let mut bytes = std::fs::read(&file).expect("file");
        let at = bytes.len() - 100;
        bytes[at] ^= 0x40;
        std::fs::write(&file, &bytes).expect("write");

        let (_double, pd, shard) = shared_store();
        let store = format!("tikv://{pd}?prefix={shard}");
        let err = kshard_fails(&["snapshot", "restore", path_str(&file), "--store", &store]);
        assert!(err.contains("corrupted"), "{err}");
        assert_eq!(keys_of(&pd, &shard), 0, "the prefix was written to");

        // A restore that stopped half way (its marker left): not served.
        let engine = kshard::storage::open_engine(Some(&store), Path::new(""), 0).expect("engine");
        engine
            .write(&mut |txn| txn.put(b"m/restoring", b"1"))
            .expect("marker");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kshard"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--internal-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("replica"))
        .args(["--store", &store]);
        let out = common::run_blocking(cmd, None);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unfinished `kshard snapshot restore`"),
            "{err}"
        );
    }
}
