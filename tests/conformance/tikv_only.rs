//! TiKV-only behaviour: conflicts between engine instances, keyspace
//! isolation, the GC safe point, and faults injected into the double.

use std::collections::{BTreeMap, HashSet};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use kshard::storage::engine::Engine;
use kshard::storage::tikv::{Tikv, TikvUrl};
use kshard::storage::{EventType, Revision, StorageError, Store, Write};

use super::conformance::{tikv, Fixture};
use super::{all, create, drain, key, list_at, obj};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_conflict_between_two_engines_is_a_conflict() {
    let f = tikv();
    let a = f.tikv_engine();
    let b = f.tikv_engine();
    let (ready_tx, ready_rx) = std_mpsc::channel();
    let (go_tx, go_rx) = std_mpsc::channel::<()>();
    let loser = std::thread::spawn(move || {
        a.write(&mut |txn| {
            // Read at the start timestamp, then let the other engine commit.
            let _ = txn.get(b"k/x")?;
            let _ = ready_tx.send(());
            let _ = go_rx.recv();
            txn.put(b"k/x", b"from a")
        })
    });
    tokio::task::spawn_blocking(move || {
        ready_rx.recv().expect("a started");
        b.write(&mut |txn| txn.put(b"k/x", b"from b"))
            .expect("b commits first");
        go_tx.send(()).expect("go");
    })
    .await
    .expect("b");
    let result = tokio::task::spawn_blocking(move || loser.join().expect("a thread"))
        .await
        .expect("join");
    assert!(
        matches!(result, Err(StorageError::Conflict { .. })),
        "{result:?}"
    );
    let check = f.tikv_engine();
    let value = tokio::task::spawn_blocking(move || check.read()?.get(b"k/x"))
        .await
        .expect("read")
        .expect("get");
    assert_eq!(value.as_deref(), Some(&b"from b"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_prefix_never_reuse_a_revision() {
    let f = tikv();
    let a = f.store();
    let b = f.store();
    let (_, mut feed_b) = b.subscribe();
    assert_eq!(create(&a, "x", 1).await, 1);
    // B's counter is stale: the fence makes it publish revision 1 first.
    assert_eq!(create(&b, "y", 1).await, 2);
    let events = drain(&mut feed_b, 2).await;
    assert_eq!(
        events
            .iter()
            .map(|e| (e.0, e.1.clone()))
            .collect::<Vec<_>>(),
        vec![(1, key("x")), (2, key("y"))]
    );
    // Concurrent writes on both: each is acknowledged with a unique revision
    // or refused as a conflict, never a 500.
    let mut tasks = Vec::new();
    for (s, store) in [a.clone(), b.clone()].into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..10 {
                let name = format!("s{s}-{i}");
                match store
                    .write(Write::Create {
                        key: key(&name),
                        object: obj(&name, i),
                    })
                    .await
                {
                    Ok(w) => acked.push((w.revision, key(&name))),
                    Err(StorageError::Conflict { .. }) => {}
                    Err(e) => panic!("write {name}: {e}"),
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.expect("writer"));
    }
    let revs: HashSet<Revision> = acked.iter().map(|(r, _)| *r).collect();
    assert_eq!(revs.len(), acked.len(), "a revision was acknowledged twice");
    assert!(revs.iter().all(|r| *r > 2));
    // A fresh store sees every acknowledged write at its revision.
    let c = f.store();
    let last = c.revision();
    let present: BTreeMap<String, Revision> = {
        let page = c.list("g/r/", last, None, None, all()).await.expect("list");
        page.items
            .iter()
            .map(|(k, v)| {
                let v: serde_json::Value = serde_json::from_slice(v).expect("json");
                let rv = v["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .expect("rv");
                (k.clone(), rv)
            })
            .collect()
    };
    for (rev, k) in &acked {
        assert_eq!(present.get(k), Some(rev), "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_sharing_a_cluster_are_isolated() {
    let f = tikv();
    let other = TikvUrl::parse(&format!(
        "tikv://{}?prefix=other-shard",
        f.url.pd_endpoints.join(",")
    ))
    .expect("url");
    let a = f.store();
    let b = Store::open(Arc::new(Tikv::connect(&other).expect("connect"))).expect("store");
    create(&a, "only-a", 1).await;
    create(&a, "only-a2", 1).await;
    assert_eq!(
        create(&b, "only-b", 1).await,
        1,
        "each shard has its own counter"
    );
    assert_eq!(list_at(&a, 2).await.len(), 2);
    assert_eq!(list_at(&b, 1).await, vec![("only-b".to_string(), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_safepoint_advances_and_older_snapshots_are_refused() {
    let f = tikv();
    let engine = f.tikv_engine();
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.write(&mut |txn| txn.put(b"k/a", b"1")).expect("write");
        let old = e.read().expect("snapshot");
        assert_eq!(old.get(b"k/a").expect("get").as_deref(), Some(&b"1"[..]));
        // The first call only takes the timestamp the next one will use.
        assert_eq!(e.advance_gc_safepoint().expect("gc"), 0);
        std::thread::sleep(Duration::from_millis(5));
        let sp = e.advance_gc_safepoint().expect("gc");
        assert!(sp > 0);
        assert!(
            matches!(old.get(b"k/a"), Err(StorageError::Engine(_))),
            "a snapshot older than the safe point must be refused"
        );
        let fresh = e.read().expect("snapshot");
        assert_eq!(fresh.get(b"k/a").expect("get").as_deref(), Some(&b"1"[..]));
        sp
    })
    .await
    .map(|sp| {
        if let Some(d) = f.double() {
            assert_eq!(d.gc_safe_point(), sp, "PD recorded the safe point");
        }
    })
    .expect("blocking");
    // The store's compaction drives it too.
    let store = Store::open(engine.clone()).expect("store");
    create(&store, "x", 1).await;
    create(&store, "y", 1).await;
    let before = engine.gc_safepoint();
    store.compact(1).await.expect("compact");
    store.compact(2).await.expect("compact");
    assert!(engine.gc_safepoint() > before);
}

/// Writes under injected faults: every write either fails with an error or is
/// applied exactly once, and no revision is ever used twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_never_duplicate_or_lose_acknowledged_writes() {
    let f = tikv();
    let Some(double) = f.double() else {
        eprintln!("skipped: fault injection needs the double");
        return;
    };
    let store = f.store();
    let (_, mut feed) = store.subscribe();
    let mut acked: Vec<(Revision, String)> = Vec::new();
    let mut failed: Vec<String> = Vec::new(); // "name: error"
    for i in 0..24 {
        match i {
            // Lost responses the client retries (commit and prewrite are idempotent).
            2 => double.drop_responses("KvCommit", 1),
            4 => double.drop_responses("KvPrewrite", 2),
            6 => double.kill_connections(),
            8 => double.drop_responses("KvGet", 1),
            // More lost commit responses than the client retries: the outcome is
            // undetermined for the client, the engine must settle it.
            10 => double.drop_responses("KvCommit", 100),
            // Every prewrite answer lost: the transaction cannot commit.
            14 => double.drop_responses("KvPrewrite", 100),
            16 => double.set_delay("KvCommit", Duration::from_millis(50)),
            18 => double.kill_connections(),
            _ => {}
        }
        let name = format!("f{i}");
        let result = store
            .write(Write::Create {
                key: key(&name),
                object: obj(&name, i),
            })
            .await;
        match result {
            Ok(w) => acked.push((w.revision, key(&name))),
            Err(e) => {
                assert!(
                    !matches!(e, StorageError::Conflict { .. }),
                    "a fault is not a conflict: {e}"
                );
                failed.push(format!("{name}: {e}"));
            }
        }
        if matches!(i, 10 | 14) {
            double.clear_faults();
        }
    }
    double.clear_faults();
    // Write 10's commit response never arrived, but it did commit: the engine
    // found that out by reading its writes back. Write 14 never prewrote.
    assert!(acked.iter().any(|(_, k)| *k == key("f10")), "{acked:?}");
    assert!(failed.iter().any(|e| e.starts_with("f14:")), "{failed:?}");
    assert!(
        acked.len() >= 20,
        "most writes succeed: {acked:?} / {failed:?}"
    );
    // The feed and a fresh reader agree: consecutive revisions, each used once.
    let last = store.revision();
    let events = drain(&mut feed, last).await;
    let revs: Vec<Revision> = events.iter().map(|e| e.0).collect();
    assert_eq!(revs, (1..=last).collect::<Vec<_>>());
    let added: Vec<&String> = events
        .iter()
        .filter(|e| e.2 == EventType::Added)
        .map(|e| &e.1)
        .collect();
    let unique: HashSet<&&String> = added.iter().collect();
    assert_eq!(unique.len(), added.len(), "a write was applied twice");
    let by_rev: BTreeMap<Revision, &String> = events.iter().map(|e| (e.0, &e.1)).collect();
    for (rev, k) in &acked {
        assert_eq!(by_rev.get(rev), Some(&k));
    }
    drop(store);
    let reopened = f.store();
    assert_eq!(reopened.revision(), last);
    let names = list_at(&reopened, last).await;
    assert_eq!(names.len() as u64, last);
    for (_, k) in &acked {
        assert!(reopened.get(k).await.expect("get").is_some(), "{k} lost");
    }
    assert_eq!(create(&reopened, "after", 0).await, last + 1);
}

/// A replica taking over from a lapsed leader resolves the transactions it
/// left half committed instead of waiting out their locks' TTL (3 s): here
/// a commit held at the store keeps a writer's locks in place; another
/// engine's `abandon_locks` rolls them back at once, reads go through, and
/// the writer learns that nothing was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_locks_are_resolved_at_once_and_their_writer_wrote_nothing() {
    let f = tikv();
    let Some(double) = f.double() else {
        return; // Needs the double's fault injection.
    };
    let (a, b) = (f.tikv_engine(), f.tikv_engine());
    double.set_delay("KvCommit", Duration::from_secs(4));
    let writer = std::thread::spawn(move || a.write(&mut |txn| txn.put(b"k/x", b"from a")));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while double.lock_count() == 0 {
        assert!(std::time::Instant::now() < deadline, "no lock was taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = std::time::Instant::now();
    let value = tokio::task::spawn_blocking(move || {
        b.abandon_locks()?;
        b.read()?.get(b"k/x")
    })
    .await
    .expect("join")
    .expect("abandon and read");
    let took = started.elapsed();
    assert_eq!(value, None);
    assert_eq!(double.lock_count(), 0);
    assert!(took < Duration::from_secs(2), "took {took:?}");
    double.clear_faults();
    let result = tokio::task::spawn_blocking(move || writer.join().expect("writer thread"))
        .await
        .expect("join");
    assert!(
        matches!(
            result,
            Err(StorageError::Aborted(_) | StorageError::Conflict { .. })
        ),
        "{result:?}"
    );
}
