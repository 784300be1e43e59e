//! Three `kshard serve` processes as replicas of one shard on the TiKV test
//! double (the double is not TiKV; `KSHARD_TEST_PD=host:port` runs them on a
//! real cluster): writes sent round-robin to all of them, identical watch
//! streams everywhere, and `kill -9` of the leader mid-load.
#![cfg(feature = "tikv")]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::replicas::{shared_store, spawn_replica, spawn_replica_with_lease, wait_ready};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent,
    WatchParams,
};

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

type Seen = (String, String, u64);

/// What one replica's watch delivered.
#[derive(Default)]
struct Watched {
    events: Vec<Seen>,
    /// Had to re-list after 410 Gone (then its sequence is not compared).
    relisted: bool,
}

/// Watches widgets on one replica from `from`, resuming after the stream ends
/// (re-listing on 410 Gone), until `stop`.
fn watch(
    api: Api<DynamicObject>,
    from: String,
    out: Arc<Mutex<Watched>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rv = from;
        let mut failures = 0;
        while !stop.load(Ordering::Acquire) {
            let wp = WatchParams::default().timeout(30);
            let stream = match api.watch(&wp, &rv).await {
                Ok(s) => s,
                Err(_) => {
                    failures += 1;
                    if failures > 50 {
                        return; // This replica is gone.
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                let (kind, obj) = match ev {
                    WatchEvent::Added(o) => ("ADDED", o),
                    WatchEvent::Modified(o) => ("MODIFIED", o),
                    WatchEvent::Deleted(o) => ("DELETED", o),
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) if e.code == 410 => {
                        let list = api.list(&ListParams::default()).await;
                        let mut w = out.lock().expect("lock");
                        w.relisted = true;
                        if let Ok(l) = list {
                            rv = l.metadata.resource_version.unwrap_or_default();
                        }
                        break;
                    }
                    WatchEvent::Error(_) => break,
                };
                let r = rv_of(&obj);
                rv = r.to_string();
                out.lock().expect("lock").events.push((
                    kind.to_string(),
                    obj.metadata.name.clone().unwrap_or_default(),
                    r,
                ));
            }
        }
    })
}

#[derive(Debug, Clone)]
struct Acked {
    kind: &'static str,
    name: String,
    rv: u64,
}

/// `n` writers: create then update, each request to the next live replica.
fn start_writers(
    apis: &[Api<DynamicObject>],
    alive: &Arc<Vec<AtomicBool>>,
    acked: &Arc<Mutex<Vec<Acked>>>,
    writing: &Arc<AtomicBool>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut writers = Vec::new();
    for w in 0..n {
        let (apis, alive, acked, writing) =
            (apis.to_vec(), alive.clone(), acked.clone(), writing.clone());
        writers.push(tokio::spawn(async move {
            let count = apis.len();
            let mut turn = w;
            let mut next_api = || loop {
                turn += 1;
                if alive[turn % count].load(Ordering::Acquire) {
                    return apis[turn % count].clone();
                }
            };
            let mut i = 0;
            while writing.load(Ordering::Acquire) {
                i += 1;
                let name = format!("w{w}-{i}");
                let obj: DynamicObject =
                    serde_json::from_value(common::widget(&name, 1)).expect("obj");
                let Ok(created) = next_api().create(&PostParams::default(), &obj).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                acked.lock().expect("lock").push(Acked {
                    kind: "ADDED",
                    name: name.clone(),
                    rv: rv_of(&created),
                });
                let mut changed = created.clone();
                changed.data["spec"]["replicas"] = serde_json::json!(2);
                if let Ok(updated) = next_api()
                    .replace(&name, &PostParams::default(), &changed)
                    .await
                {
                    acked.lock().expect("lock").push(Acked {
                        kind: "MODIFIED",
                        name,
                        rv: rv_of(&updated),
                    });
                }
            }
        }));
    }
    writers
}

async fn wait_acked(acked: &Mutex<Vec<Acked>>, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    while acked.lock().expect("lock").len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} writes acknowledged",
            acked.lock().expect("lock").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every watch in `watched` has delivered revision `rev`.
async fn wait_watched(watched: &[Arc<Mutex<Watched>>], rev: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for out in watched {
        while out
            .lock()
            .expect("lock")
            .events
            .last()
            .is_none_or(|e| e.2 < rev)
        {
            assert!(Instant::now() < deadline, "a watch never reached {rev}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// No revision used twice; every acknowledged write in `reference` exactly
/// once, at its revision.
fn check_acked(acked: &[Acked], sequences: &[Vec<Seen>], reference: &[Seen]) {
    let mut revs = HashSet::new();
    for a in acked {
        assert!(revs.insert(a.rv), "revision {} acknowledged twice", a.rv);
    }
    for (i, seq) in sequences.iter().enumerate() {
        for pair in seq.windows(2) {
            assert!(
                pair[0].2 < pair[1].2,
                "watch {i}: revisions out of order: {pair:?}"
            );
        }
    }
    let mut at: HashMap<u64, (&str, &str)> = HashMap::new();
    for (kind, name, rv) in reference {
        at.insert(*rv, (kind.as_str(), name.as_str()));
    }
    for a in acked {
        assert_eq!(
            at.get(&a.rv),
            Some(&(a.kind, a.name.as_str())),
            "acknowledged write missing from the watch: {a:?}"
        );
    }
    let mut added: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, name, _) in reference {
        if kind == "ADDED" {
            *added.entry(name.as_str()).or_default() += 1;
        }
    }
    for a in acked.iter().filter(|a| a.kind == "ADDED") {
        assert_eq!(
            added.get(a.name.as_str()),
            Some(&1),
            "{} not created exactly once",
            a.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_identical_watches_and_leader_kill_9() {
    let (_double, pd, shard) = shared_store();
    let dir = tempfile::tempdir().expect("tmp");

    // The first replica starts alone and so leads; the others follow it.
    let mut replicas = vec![spawn_replica(dir.path(), "r0", &pd, &shard)];
    replicas.push(spawn_replica(dir.path(), "r1", &pd, &shard));
    replicas.push(spawn_replica(dir.path(), "r2", &pd, &shard));
    let mut apis = Vec::new();
    for r in &replicas {
        let client = r.client().await;
        wait_ready(&client, Duration::from_secs(30)).await;
        apis.push(widgets(client));
    }

    // A watch on every replica, each from the revision its own list reports.
    let stop = Arc::new(AtomicBool::new(false));
    let watched: Vec<Arc<Mutex<Watched>>> = (0..3).map(|_| Arc::default()).collect();
    let mut watchers = Vec::new();
    for (api, out) in apis.iter().zip(&watched) {
        let list = api.list(&ListParams::default()).await.expect("list");
        assert!(list.items.is_empty());
        let from = list.metadata.resource_version.unwrap_or_default();
        watchers.push(watch(api.clone(), from, out.clone(), stop.clone()));
    }

    // Writers: create then update, each request to the next replica in turn.
    let alive: Arc<Vec<AtomicBool>> = Arc::new((0..3).map(|_| AtomicBool::new(true)).collect());
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let writing = Arc::new(AtomicBool::new(true));
    let writers = start_writers(&apis, &alive, &acked, &writing, 6);

    wait_acked(&acked, 150, Duration::from_secs(60)).await;

    // kill -9 the leader while writes are in flight.
    alive[0].store(false, Ordering::Release);
    replicas[0].kill();
    let before_kill = acked.lock().expect("lock").len();
    wait_acked(&acked, before_kill + 150, Duration::from_secs(60)).await;
    writing.store(false, Ordering::Release);
    for w in writers {
        w.await.expect("writer");
    }

    // A last write through one survivor, then a consistent list on the other
    // must show it (a follower's consistent read waits for the leader's watermark).
    let last: DynamicObject = serde_json::from_value(common::widget("sentinel", 1)).expect("obj");
    let last = apis[1]
        .create(&PostParams::default(), &last)
        .await
        .expect("write after takeover");
    let listed = apis[2].list(&ListParams::default()).await.expect("list");
    assert!(
        listed
            .items
            .iter()
            .any(|o| o.metadata.name.as_deref() == Some("sentinel")),
        "consistent list on a follower misses a write acknowledged before it"
    );
    wait_watched(&watched[1..], rv_of(&last)).await;
    stop.store(true, Ordering::Release);
    for w in watchers {
        w.abort();
    }

    let acked = acked.lock().expect("lock").clone();
    let sequences: Vec<Vec<Seen>> = watched
        .iter()
        .map(|w| w.lock().expect("lock").events.clone())
        .collect();

    // Every survivor (that did not need to re-list) saw exactly the same
    // sequence; the killed leader's is a prefix of it.
    let reference = &sequences[1];
    for (i, seq) in sequences.iter().enumerate().skip(1) {
        if !watched[i].lock().expect("lock").relisted {
            assert_eq!(seq, reference, "replica {i} saw a different sequence");
        }
    }
    assert!(
        reference.starts_with(&sequences[0]),
        "the killed leader's watch is not a prefix of the survivors'"
    );

    // No revision used twice; every acknowledged write there exactly once.
    check_acked(&acked, &sequences, reference);

    // Both survivors list the same objects, including every acknowledged create.
    let l1 = apis[1].list(&ListParams::default()).await.expect("list");
    let l2 = apis[2].list(&ListParams::default()).await.expect("list");
    let names = |l: &kube::api::ObjectList<DynamicObject>| -> Vec<(String, u64)> {
        let mut v: Vec<_> = l
            .items
            .iter()
            .map(|o| (o.metadata.name.clone().unwrap_or_default(), rv_of(o)))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&l1), names(&l2));
    let present: HashSet<String> = names(&l1).into_iter().map(|(n, _)| n).collect();
    for a in &acked {
        assert!(present.contains(&a.name), "{} lost", a.name);
    }

    // Another replica took over the lease.
    let logs: String = ["r1", "r2"]
        .iter()
        .map(|id| std::fs::read_to_string(dir.path().join(format!("{id}.log"))).unwrap_or_default())
        .collect();
    assert!(logs.contains("took over the leader lease"));
    if std::env::var_os("KSHARD_KEEP_TEST_DIR").is_some() {
        eprintln!("logs kept in {}", dir.keep().display());
    }
    eprintln!(
        "{} writes acknowledged ({} before kill -9 of the leader), {} events in each \
         survivor's watch, {} in the killed leader's",
        acked.len(),
        before_kill,
        reference.len(),
        sequences[0].len()
    );
}

fn signal(child: &std::process::Child, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig}");
}

/// A leader that stops (SIGSTOP) for longer than its lease, with writes in
/// flight, comes back deposed: another replica took over under a new epoch,
/// the old leader's pending writes are fenced (no revision used twice, every
/// acknowledged write once), and it rejoins as a follower with the same
/// watch stream as the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_is_fenced_and_rejoins_as_a_follower() {
    let (_double, pd, shard) = shared_store();
    let dir = tempfile::tempdir().expect("tmp");
    let replicas = [
        spawn_replica(dir.path(), "p0", &pd, &shard),
        spawn_replica(dir.path(), "p1", &pd, &shard),
    ];
    let mut apis = Vec::new();
    for r in &replicas {
        let client = r.client().await;
        wait_ready(&client, Duration::from_secs(30)).await;
        apis.push(widgets(client));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watched: Vec<Arc<Mutex<Watched>>> = (0..2).map(|_| Arc::default()).collect();
    let mut watchers = Vec::new();
    for (api, out) in apis.iter().zip(&watched) {
        let list = api.list(&ListParams::default()).await.expect("list");
        let from = list.metadata.resource_version.unwrap_or_default();
        watchers.push(watch(api.clone(), from, out.clone(), stop.clone()));
    }
    let alive: Arc<Vec<AtomicBool>> = Arc::new((0..2).map(|_| AtomicBool::new(true)).collect());
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let writing = Arc::new(AtomicBool::new(true));
    let writers = start_writers(&apis, &alive, &acked, &writing, 6);
    wait_acked(&acked, 60, Duration::from_secs(60)).await;

    // Freeze the leader mid-load for twice its lease; the follower takes over.
    signal(&replicas[0].child, "-STOP");
    let paused = acked.lock().expect("lock").len();
    // Paused until another replica has taken the lease over.
    let took_over = |id: &str| {
        std::fs::read_to_string(dir.path().join(format!("{id}.log")))
            .unwrap_or_default()
            .contains("took over the leader lease")
    };
    common::eventually("a follower takes over from the paused leader", || async {
        took_over("p1")
    })
    .await;
    signal(&replicas[0].child, "-CONT");
    wait_acked(&acked, paused + 100, Duration::from_secs(60)).await;
    writing.store(false, Ordering::Release);
    for w in writers {
        w.await.expect("writer");
    }

    // Written through the old leader (now forwarding), seen by both watches.
    let last: DynamicObject = serde_json::from_value(common::widget("sentinel", 1)).expect("obj");
    let last = apis[0]
        .create(&PostParams::default(), &last)
        .await
        .expect("write through the deposed leader");
    wait_watched(&watched, rv_of(&last)).await;
    stop.store(true, Ordering::Release);
    for w in watchers {
        w.abort();
    }

    let acked = acked.lock().expect("lock").clone();
    let sequences: Vec<Vec<Seen>> = watched
        .iter()
        .map(|w| w.lock().expect("lock").events.clone())
        .collect();
    if !watched[0].lock().expect("lock").relisted {
        assert_eq!(
            sequences[0], sequences[1],
            "the two replicas' watches differ"
        );
    }
    check_acked(&acked, &sequences, &sequences[1]);
    let log = |id: &str| {
        std::fs::read_to_string(dir.path().join(format!("{id}.log"))).unwrap_or_default()
    };
    assert!(log("p1").contains("took over the leader lease"));
    let old = log("p0");
    assert!(
        old.contains("lost the leader lease") || old.contains("stepping down"),
        "the paused leader never noticed it was deposed"
    );
    eprintln!(
        "{} writes acknowledged ({paused} before the pause), {} events in each watch",
        acked.len(),
        sequences[1].len()
    );
}

/// A leader stopped with SIGTERM gives its lease up on the way out, and a
/// follower whose stream from it ended runs an election round at once: it
/// takes over long before the lease (60 s here, renewed every 12 s) would
/// have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_stopped_with_sigterm_hands_over_without_waiting_for_its_lease() {
    let (_double, pd, shard) = shared_store();
    let dir = tempfile::tempdir().expect("tmp");
    let mut leader = spawn_replica_with_lease(dir.path(), "r0", &pd, &shard, "60s");
    let follower = spawn_replica_with_lease(dir.path(), "r1", &pd, &shard, "60s");
    let client = follower.client().await;
    wait_ready(&client, Duration::from_secs(30)).await;
    let api = widgets(client);
    let obj: DynamicObject = serde_json::from_value(common::widget("before", 1)).expect("obj");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("a write through the follower reaches the leader");

    let stopped = Instant::now();
    signal(&leader.child, "-TERM");
    let status = leader.child.wait().expect("wait");
    assert!(status.success(), "the leader exits cleanly: {status}");
    // Writes through the survivor succeed again once it leads.
    let mut n = 0;
    let took_over = loop {
        n += 1;
        let obj: DynamicObject =
            serde_json::from_value(common::widget(&format!("after{n}"), 1)).expect("obj");
        if api.create(&PostParams::default(), &obj).await.is_ok() {
            break stopped.elapsed();
        }
        if stopped.elapsed() > Duration::from_secs(30) {
            let log = |id: &str| {
                std::fs::read_to_string(dir.path().join(format!("{id}.log"))).unwrap_or_default()
            };
            panic!(
                "no leader 30 s after SIGTERM\n--- r0\n{}\n--- r1\n{}",
                log("r0"),
                log("r1")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = std::fs::read_to_string(dir.path().join("r1.log")).unwrap_or_default();
    assert!(log.contains("took over the leader lease"), "{log}");
    eprintln!("SIGTERM of the leader: the follower took writes again after {took_over:?}");
}
