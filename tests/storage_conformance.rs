//! One storage conformance suite, run unchanged against every engine: the
//! embedded engine (redb) and, with the `tikv` feature, the TiKV engine on the
//! in-process TiKV + PD test double (or on a real cluster named by
//! `KSHARD_TEST_PD`, see e2e/tikv.sh). Everything is exercised through the
//! public `storage::Store` API.

mod conformance;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use conformance::Fixture;
use kshard::storage::{Batch, EventType, Revision, StorageError, Store, ValueFilter, Write};
use serde_json::{json, Value};
use tokio::sync::mpsc;

fn obj(name: &str, n: i64) -> Value {
    json!({"apiVersion": "demo/v1", "kind": "W", "metadata": {"name": name}, "spec": {"n": n}})
}

fn key(name: &str) -> String {
    format!("g/r/ns/{name}")
}

fn all() -> ValueFilter {
    Arc::new(|_| true)
}

async fn create(store: &Store, name: &str, n: i64) -> Revision {
    store
        .write(Write::Create {
            key: key(name),
            object: obj(name, n),
        })
        .await
        .expect("create")
        .revision
}

async fn update(store: &Store, name: &str, expected: Revision, n: i64) -> Revision {
    store
        .write(Write::Update {
            key: key(name),
            expected,
            object: obj(name, n),
        })
        .await
        .expect("update")
        .revision
}

/// (name, spec.n) of every object of the list, in order.
async fn list_at(store: &Store, revision: Revision) -> Vec<(String, i64)> {
    let page = store
        .list("g/r/", revision, None, None, all())
        .await
        .expect("list");
    page.items.iter().map(|(k, v)| decode(k, v)).collect()
}

fn decode(k: &str, v: &[u8]) -> (String, i64) {
    let v: Value = serde_json::from_slice(v).expect("json");
    (
        k.rsplit('/').next().unwrap_or_default().to_string(),
        v["spec"]["n"].as_i64().expect("n"),
    )
}

/// Receives batches until the feed reaches `revision`; returns their events' (revision, key, type).
async fn drain(
    rx: &mut mpsc::UnboundedReceiver<Arc<Batch>>,
    revision: Revision,
) -> Vec<(Revision, String, EventType)> {
    let mut out = Vec::new();
    let mut last = 0;
    while last < revision {
        let batch = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("change feed stalled")
            .expect("feed closed");
        assert_eq!(
            batch.revision,
            batch.events.last().expect("empty batch").revision,
            "a batch's watermark is its last event"
        );
        for e in &batch.events {
            assert_eq!(
                e.object["metadata"]["resourceVersion"],
                e.revision.to_string()
            );
            out.push((e.revision, e.key.clone(), e.kind));
        }
        last = batch.revision;
    }
    out
}

async fn crud_and_compare_and_set(f: &dyn Fixture) {
    let store = f.store();
    let a = store
        .write(Write::Create {
            key: key("a"),
            object: obj("a", 1),
        })
        .await
        .expect("create");
    assert_eq!(a.revision, 1);
    assert_eq!(a.object["metadata"]["resourceVersion"], "1");
    let dup = store
        .write(Write::Create {
            key: key("a"),
            object: obj("a", 9),
        })
        .await;
    assert!(matches!(dup, Err(StorageError::AlreadyExists)), "{dup:?}");
    let stale = store
        .write(Write::Update {
            key: key("a"),
            expected: 7,
            object: obj("a", 2),
        })
        .await;
    assert!(
        matches!(stale, Err(StorageError::Conflict { current: 1 })),
        "{stale:?}"
    );
    let missing = store
        .write(Write::Update {
            key: key("zz"),
            expected: 1,
            object: obj("zz", 2),
        })
        .await;
    assert!(
        matches!(missing, Err(StorageError::NotFound)),
        "{missing:?}"
    );
    // Failed writes consume no revision.
    assert_eq!(update(&store, "a", 1, 2).await, 2);
    let (rev, json) = store.get(&key("a")).await.expect("get").expect("present");
    assert_eq!(rev, 2);
    assert_eq!(decode("a", &json), ("a".into(), 2));
    let wrong = store
        .write(Write::Delete {
            key: key("a"),
            expected: Some(1),
        })
        .await;
    assert!(
        matches!(wrong, Err(StorageError::Conflict { current: 2 })),
        "{wrong:?}"
    );
    let d = store
        .write(Write::Delete {
            key: key("a"),
            expected: Some(2),
        })
        .await
        .expect("delete");
    assert_eq!(d.revision, 3);
    assert_eq!(
        d.object["spec"]["n"], 2,
        "a deletion returns the last state"
    );
    assert!(store.get(&key("a")).await.expect("get").is_none());
    let again = store
        .write(Write::Delete {
            key: key("a"),
            expected: None,
        })
        .await;
    assert!(matches!(again, Err(StorageError::NotFound)), "{again:?}");
    // A deleted name can be created again.
    assert_eq!(create(&store, "a", 5).await, 4);
    assert_eq!(store.revision(), 4);
}

async fn list_at_revision_sees_history_and_tombstones(f: &dyn Fixture) {
    let store = f.store();
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        create(&store, name, i as i64).await;
    }
    update(&store, "b", 2, 10).await; // 5
    store
        .write(Write::Delete {
            key: key("c"),
            expected: None,
        })
        .await
        .expect("delete"); // 6
    create(&store, "e", 4).await; // 7
    let n = |v: &[(&str, i64)]| {
        v.iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect::<Vec<_>>()
    };
    assert_eq!(list_at(&store, 2).await, n(&[("a", 0), ("b", 1)]));
    assert_eq!(
        list_at(&store, 4).await,
        n(&[("a", 0), ("b", 1), ("c", 2), ("d", 3)])
    );
    assert_eq!(
        list_at(&store, 5).await,
        n(&[("a", 0), ("b", 10), ("c", 2), ("d", 3)])
    );
    assert_eq!(
        list_at(&store, 7).await,
        n(&[("a", 0), ("b", 10), ("d", 3), ("e", 4)])
    );
    // The prefix bounds the list.
    let only_a = store
        .list("g/r/ns/a", 7, None, None, all())
        .await
        .expect("list");
    assert_eq!(only_a.items.len(), 1);
    // A filter applies to the state at the revision.
    let big: ValueFilter = Arc::new(|v: &[u8]| {
        serde_json::from_slice::<Value>(v).is_ok_and(|v| v["spec"]["n"].as_i64() >= Some(3))
    });
    let page = store.list("g/r/", 7, None, None, big).await.expect("list");
    assert_eq!(page.items.len(), 3);
}

async fn continue_pages_are_consistent_at_their_revision(f: &dyn Fixture) {
    let store = f.store();
    // Names on both sides of the double's region split (…/m).
    let names = ["a", "c", "h", "k", "n", "q", "x"];
    for (i, name) in names.iter().enumerate() {
        create(&store, name, i as i64).await;
    }
    let at = store.revision();
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = store
            .list("g/r/", at, after.clone(), Some(3), all())
            .await
            .expect("page");
        pages += 1;
        assert_eq!(page.revision, at);
        seen.extend(page.items.iter().map(|(k, v)| decode(k, v).0));
        // Writes between pages never show up in later pages of the same list.
        if pages == 1 {
            create(&store, "b", 100).await;
            store
                .write(Write::Delete {
                    key: key("x"),
                    expected: None,
                })
                .await
                .expect("delete");
            assert_eq!(page.remaining, 4);
        }
        match page.continue_after {
            Some(c) => after = Some(c),
            None => {
                assert_eq!(page.remaining, 0);
                break;
            }
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        names.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    );
}

async fn compaction_refuses_old_revisions_and_keeps_current_state(f: &dyn Fixture) {
    let store = f.store();
    create(&store, "a", 1).await; // 1
    create(&store, "b", 1).await; // 2
    update(&store, "a", 1, 2).await; // 3
    store
        .write(Write::Delete {
            key: key("b"),
            expected: None,
        })
        .await
        .expect("delete"); // 4
    create(&store, "c", 1).await; // 5
    update(&store, "a", 3, 3).await; // 6
    store.compact(4).await.expect("compact");
    assert_eq!(store.compacted_revision(), 4);
    for old in [1, 3] {
        match store.list("g/r/", old, None, None, all()).await {
            Err(StorageError::Compacted {
                requested,
                compacted,
            }) => {
                assert_eq!((requested, compacted), (old, 4));
            }
            other => panic!("list at {old} after compaction: {other:?}"),
        }
    }
    // State at and after the compaction revision is intact.
    assert_eq!(list_at(&store, 4).await, vec![("a".to_string(), 2)]);
    assert_eq!(
        list_at(&store, 6).await,
        vec![("a".to_string(), 3), ("c".to_string(), 1)]
    );
    // The deleted object is gone for good and can be created again.
    assert!(store.get(&key("b")).await.expect("get").is_none());
    assert_eq!(create(&store, "b", 7).await, 7);
    // Compacting again (and not going backwards) works.
    store.compact(2).await.expect("no-op");
    assert_eq!(store.compacted_revision(), 4);
    store.compact(7).await.expect("compact");
    assert_eq!(
        list_at(&store, 7).await,
        vec![
            ("a".to_string(), 3),
            ("b".to_string(), 7),
            ("c".to_string(), 1)
        ]
    );
    // The compaction revision survives a restart.
    drop(store);
    let store = f.store();
    assert_eq!(store.compacted_revision(), 7);
    assert!(matches!(
        store.list("g/r/", 6, None, None, all()).await,
        Err(StorageError::Compacted { .. })
    ));
}

/// Concurrent writers; returns every acknowledged (revision, key).
async fn concurrent_writes(
    store: &Arc<Store>,
    writers: usize,
    each: usize,
) -> Vec<(Revision, String)> {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..each {
                let name = format!("w{w}-{i}");
                let rev = create(&store, &name, i as i64).await;
                acked.push((rev, key(&name)));
                if i % 3 == 0 {
                    let rev = update(&store, &name, rev, 100).await;
                    acked.push((rev, key(&name)));
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.expect("writer"));
    }
    acked
}

async fn change_feed_is_ordered_without_gaps(f: &dyn Fixture) {
    let store = f.store();
    create(&store, "before", 0).await;
    let (from, mut rx) = store.subscribe();
    assert_eq!(from, 1);
    let acked = concurrent_writes(&store, 6, 8).await;
    let last = store.revision();
    assert_eq!(last as usize, 1 + acked.len());
    let events = drain(&mut rx, last).await;
    let revisions: Vec<Revision> = events.iter().map(|e| e.0).collect();
    assert_eq!(
        revisions,
        (2..=last).collect::<Vec<_>>(),
        "ordered, no gaps, no repeats"
    );
    let by_rev: BTreeMap<Revision, &String> = events.iter().map(|(r, k, _)| (*r, k)).collect();
    for (rev, k) in &acked {
        assert_eq!(
            by_rev.get(rev),
            Some(&k),
            "acknowledged write {rev} in the feed"
        );
    }
    let adds = events.iter().filter(|e| e.2 == EventType::Added).count();
    assert_eq!(adds, 48);
}

async fn list_at_current_revision_never_misses_an_acknowledged_write(f: &dyn Fixture) {
    let store = f.store();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..8 {
                let name = format!("w{w}-{i}");
                let rev = create(&store, &name, i).await;
                // The watermark covers the write as soon as it is acknowledged…
                let now = store.revision();
                assert!(now >= rev, "watermark {now} behind acknowledged {rev}");
                // …and a list at it sees the object.
                let page = store
                    .list(&key(&name), now, None, None, all())
                    .await
                    .expect("list");
                assert_eq!(page.items.len(), 1, "{name} missing at {now}");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    assert_eq!(list_at(&store, store.revision()).await.len(), 32);
}

async fn acknowledged_writes_survive_reopen(f: &dyn Fixture) {
    let store = f.store();
    let acked = concurrent_writes(&store, 3, 5).await;
    let last = store.revision();
    let expected = list_at(&store, last).await;
    drop(store);
    // A new engine instance on the same data, as after a crash and restart.
    let store = f.store();
    assert_eq!(store.revision(), last, "the counter resumes where it was");
    assert_eq!(list_at(&store, last).await, expected);
    for (_, k) in &acked {
        assert!(store.get(k).await.expect("get").is_some(), "{k} lost");
    }
    let (from, mut rx) = store.subscribe();
    assert_eq!(from, last);
    // New revisions continue above every used one.
    let next = create(&store, "after-restart", 1).await;
    assert_eq!(next, last + 1);
    let events = drain(&mut rx, next).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, next);
    let used: HashSet<Revision> = acked.iter().map(|(r, _)| *r).collect();
    assert_eq!(used.len(), acked.len(), "no revision acknowledged twice");
}

async fn oversized_objects_are_refused_without_using_a_revision(f: &dyn Fixture) {
    let store = f.store();
    create(&store, "a", 1).await;
    let mut big = obj("big", 1);
    big["spec"]["blob"] = Value::String("x".repeat(kshard::storage::MAX_OBJECT_BYTES + 1));
    let r = store
        .write(Write::Create {
            key: key("big"),
            object: big,
        })
        .await;
    assert!(matches!(r, Err(StorageError::TooLarge { .. })), "{r:?}");
    assert_eq!(create(&store, "b", 1).await, 2);
}

/// A list of large objects reads them all: more than a gRPC message holds
/// (tikv-client refuses an answer over 4 MiB; TiKV sends 10 MiB at most)
/// is read in several scans, however many objects fit one.
async fn large_objects_are_listed_whole(f: &dyn Fixture) {
    let store = f.store();
    let blob = "x".repeat(200 * 1024);
    let mut names = Vec::new();
    for i in 0..40 {
        let name = format!("large-{i:02}");
        let mut o = obj(&name, i);
        o["spec"]["blob"] = Value::String(blob.clone());
        store
            .write(Write::Create {
                key: key(&name),
                object: o,
            })
            .await
            .expect("create");
        names.push((name, i));
    }
    // A small object after them, so a scan's batch size grows back.
    create(&store, "small", 100).await;
    names.push(("small".into(), 100));
    assert_eq!(list_at(&store, store.revision()).await, names);
}

/// A snapshot's source (`kshard::snapshot::save::Source`) reads one engine
/// view: it sees every write acknowledged before it opened (the embedded
/// engine's unsettled log included), none made while it reads, exactly the
/// store's list at its revision, in bounded chunks in key order.
async fn a_snapshot_source_reads_one_view(f: &dyn Fixture) {
    use kshard::snapshot::format::CHUNK_BYTES;
    use kshard::snapshot::save::Source;
    let store = f.store();
    let mut revs = BTreeMap::new();
    for i in 0..600 {
        let name = format!("o{i:04}");
        let mut o = obj(&name, i);
        // Sizes from a few bytes to 4 KiB, so chunks close at various
        // points, and one object larger than a chunk. (Larger objects on
        // average overflow the 4 MiB gRPC message of the TiKV engine's
        // 512-pair scans, which the list below uses.)
        let pad = if i == 300 {
            1_200_000
        } else {
            (i as usize * 977) % 4_096
        };
        o["spec"]["pad"] = json!("p".repeat(pad));
        let rev = store
            .write(Write::Create {
                key: key(&name),
                object: o,
            })
            .await
            .expect("create")
            .revision;
        revs.insert(name, rev);
    }
    for i in (0..600).step_by(7) {
        let name = format!("o{i:04}");
        let rev = update(&store, &name, revs[&name], -1).await;
        revs.insert(name, rev);
    }
    for i in (0..600).step_by(11) {
        let name = format!("o{i:04}");
        store
            .write(Write::Delete {
                key: key(&name),
                expected: None,
            })
            .await
            .expect("delete");
    }
    // Acknowledged just now: the view must hold it.
    let last = create(&store, "last", 1).await;
    let engine = store.engine().clone();
    let expected = list_at(&store, last).await;
    let (seen, revision) = tokio::task::spawn_blocking({
        let store = store.clone();
        move || {
            let mut source = Source::open(&*engine).expect("open");
            let revision = source.revision;
            let mut seen = Vec::new();
            let mut previous: Option<String> = None;
            let rt = tokio::runtime::Handle::current();
            let mut i = 0;
            while let Some(chunk) = source.next_chunk().expect("chunk") {
                let bytes: usize = chunk.iter().map(|e| e.json.len()).sum();
                assert!(
                    bytes <= CHUNK_BYTES || chunk.len() == 1,
                    "a chunk of {} objects holds {bytes} bytes",
                    chunk.len()
                );
                for e in chunk {
                    assert!(
                        previous.as_ref().is_none_or(|p| *p < e.key),
                        "order at {}",
                        e.key
                    );
                    previous = Some(e.key.clone());
                    seen.push(decode(&e.key, &e.json));
                }
                // Writes while the view is read: none of them may show.
                i += 1;
                let name = format!("during-{i}");
                rt.block_on(async {
                    create(&store, &name, 1).await;
                    let victim = key(&format!("o{:04}", i * 13 % 600));
                    let _ = store
                        .write(Write::Delete {
                            key: victim,
                            expected: None,
                        })
                        .await;
                });
            }
            (seen, revision)
        }
    })
    .await
    .expect("reader");
    assert_eq!(
        revision, last,
        "the view's counter is the last acknowledged write"
    );
    assert_eq!(
        seen, expected,
        "the source differs from the list at its revision"
    );
    assert!(
        store.revision() > last + 2,
        "no writes while reading: the test proves nothing"
    );
}

/// Instantiates every test body for one engine fixture.
macro_rules! suite {
    ($fixture:expr; $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let f = $fixture;
            super::$name(&f).await;
        }
    )*};
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            suite!(crate::conformance::embedded(); $($name),*);
        }
        #[cfg(feature = "tikv")]
        mod tikv {
            suite!(crate::conformance::tikv(); $($name),*);
        }
    };
}

conformance!(
    crud_and_compare_and_set,
    list_at_revision_sees_history_and_tombstones,
    continue_pages_are_consistent_at_their_revision,
    compaction_refuses_old_revisions_and_keeps_current_state,
    change_feed_is_ordered_without_gaps,
    list_at_current_revision_never_misses_an_acknowledged_write,
    acknowledged_writes_survive_reopen,
    oversized_objects_are_refused_without_using_a_revision,
    a_snapshot_source_reads_one_view,
    large_objects_are_listed_whole,
);

#[cfg(feature = "tikv")]
#[path = "conformance/tikv_only.rs"]
mod tikv_only;
