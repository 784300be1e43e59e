use std::sync::Arc;

use serde_json::json;

use super::embedded::Embedded;
use super::*;

fn open(dir: &std::path::Path) -> Arc<Store> {
    let engine = Arc::new(Embedded::open(&dir.join("db")).expect("open"));
    Store::open(engine).expect("store")
}

/// The store in `dir` opened again once a dropped one let it go: its
/// writer thread holds the database until its channel closes.
async fn reopen(dir: &std::path::Path) -> Arc<Store> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let engine = loop {
        match Embedded::open(&dir.join("db")) {
            Ok(e) => break Arc::new(e),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the database was never released: {e}"),
        }
    };
    Store::open(engine).expect("store")
}

fn obj(name: &str, n: i64) -> Value {
    json!({"apiVersion": "demo/v1", "kind": "W", "metadata": {"name": name}, "spec": {"n": n}})
}

fn all() -> ValueFilter {
    Arc::new(|_| true)
}

#[tokio::test]
async fn writes_get_consecutive_revisions_and_cas_is_enforced() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let a = store
        .write(Write::Create {
            key: "g/r/ns/a".into(),
            object: obj("a", 1),
        })
        .await
        .expect("create");
    assert_eq!(a.revision, 1);
    assert_eq!(a.object["metadata"]["resourceVersion"], "1");
    let dup = store
        .write(Write::Create {
            key: "g/r/ns/a".into(),
            object: obj("a", 1),
        })
        .await;
    assert!(matches!(dup, Err(StorageError::AlreadyExists)));
    let stale = store
        .write(Write::Update {
            key: "g/r/ns/a".into(),
            expected: 7,
            object: obj("a", 2),
        })
        .await;
    assert!(matches!(stale, Err(StorageError::Conflict { current: 1 })));
    let b = store
        .write(Write::Update {
            key: "g/r/ns/a".into(),
            expected: 1,
            object: obj("a", 2),
        })
        .await
        .expect("update");
    // The failed writes consumed no revision.
    assert_eq!(b.revision, 2);
    let d = store
        .write(Write::Delete {
            key: "g/r/ns/a".into(),
            expected: None,
        })
        .await
        .expect("delete");
    assert_eq!(d.revision, 3);
    assert_eq!(d.object["spec"]["n"], 2);
    assert!(store.get("g/r/ns/a").await.expect("get").is_none());
}

#[tokio::test]
async fn list_at_revision_sees_history_and_pages() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        store
            .write(Write::Create {
                key: format!("g/r/ns/{name}"),
                object: obj(name, i as i64),
            })
            .await
            .expect("create");
    }
    // rev 5: delete b; rev 6: update c
    store
        .write(Write::Delete {
            key: "g/r/ns/b".into(),
            expected: None,
        })
        .await
        .expect("delete");
    store
        .write(Write::Update {
            key: "g/r/ns/c".into(),
            expected: 3,
            object: obj("c", 99),
        })
        .await
        .expect("update");
    let at4 = store
        .list("g/r/", 4, None, None, all())
        .await
        .expect("list");
    assert_eq!(at4.items.len(), 4);
    let now = store
        .list("g/r/", 6, None, None, all())
        .await
        .expect("list");
    let names: Vec<_> = now.items.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["g/r/ns/a", "g/r/ns/c", "g/r/ns/d"]);
    let page1 = store
        .list("g/r/", 4, None, Some(2), all())
        .await
        .expect("page");
    assert_eq!(page1.items.len(), 2);
    assert_eq!(page1.remaining, 2);
    let page2 = store
        .list("g/r/", 4, page1.continue_after.clone(), Some(2), all())
        .await
        .expect("page");
    let names: Vec<_> = page2.items.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["g/r/ns/c", "g/r/ns/d"]);
    assert!(page2.continue_after.is_none());
    // Value of c at revision 4 is the old one.
    let c: Value = serde_json::from_slice(&page2.items[0].1).expect("json");
    assert_eq!(c["spec"]["n"], 2);
    // What follows a page is counted by liveness at the list's revision: b
    // is gone at 6 (c, d follow a), there at 4 (b, c, d).
    for (rev, rest) in [(6, 2), (4, 3), (3, 2)] {
        let page = store
            .list("g/r/", rev, None, Some(1), all())
            .await
            .expect("page");
        assert_eq!(page.items[0].0, "g/r/ns/a");
        assert_eq!(page.remaining, rest, "at {rev}");
        assert_eq!(page.continue_after.as_deref(), Some("g/r/ns/a"));
    }
    // A filtered list stops at the first match past its page: only "more".
    let page = store
        .list_counting("g/r/", 4, None, Some(1), all(), false)
        .await
        .expect("filtered page");
    assert_eq!((page.items.len(), page.remaining), (1, 1));
    assert_eq!(page.continue_after.as_deref(), Some("g/r/ns/a"));
    let last = store
        .list_counting("g/r/", 6, Some("g/r/ns/c".into()), Some(1), all(), false)
        .await
        .expect("last page");
    assert_eq!((last.items.len(), last.remaining), (1, 0));
    assert!(last.continue_after.is_none());
}

#[tokio::test]
async fn compaction_refuses_old_revisions_but_keeps_current_state() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    for i in 0..5 {
        let w = Write::Create {
            key: format!("g/r/ns/o{i}"),
            object: obj("o", i),
        };
        store.write(w).await.expect("create");
    }
    store
        .write(Write::Delete {
            key: "g/r/ns/o0".into(),
            expected: None,
        })
        .await
        .expect("delete");
    store.compact(6).await.expect("compact");
    let old = store.list("g/r/", 3, None, None, all()).await;
    assert!(matches!(
        old,
        Err(StorageError::Compacted {
            requested: 3,
            compacted: 6
        })
    ));
    let now = store
        .list("g/r/", 6, None, None, all())
        .await
        .expect("list");
    assert_eq!(now.items.len(), 4);
    // The deleted object can be created again after its tombstone is gone.
    store
        .write(Write::Create {
            key: "g/r/ns/o0".into(),
            object: obj("o", 7),
        })
        .await
        .expect("recreate");
}

#[tokio::test]
async fn state_and_revision_survive_reopen() {
    let dir = tempfile::tempdir().expect("tmp");
    {
        let store = open(dir.path());
        for i in 0..3 {
            let w = Write::Create {
                key: format!("g/r/ns/o{i}"),
                object: obj("o", i),
            };
            store.write(w).await.expect("create");
        }
    }
    let store = reopen(dir.path()).await;
    assert_eq!(store.revision(), 3);
    let w = store
        .write(Write::Create {
            key: "g/r/ns/x".into(),
            object: obj("x", 0),
        })
        .await
        .expect("create");
    assert_eq!(w.revision, 4);
}

#[tokio::test]
async fn change_feed_delivers_batches_in_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let (start, mut feed) = store.subscribe();
    assert_eq!(start, 0);
    let mut handles = Vec::new();
    for i in 0..50 {
        let s = store.clone();
        handles.push(tokio::spawn(async move {
            s.write(Write::Create {
                key: format!("g/r/ns/o{i}"),
                object: obj("o", i),
            })
            .await
        }));
    }
    for h in handles {
        h.await.expect("join").expect("write");
    }
    let mut seen = Vec::new();
    while seen.len() < 50 {
        let batch = feed.recv().await.expect("batch");
        seen.extend(batch.events.iter().map(|e| e.revision));
    }
    assert_eq!(seen, (1..=50).collect::<Vec<_>>());
}

#[test]
fn store_flag_selects_the_engine() {
    let dir = tempfile::tempdir().expect("tmp");
    assert!(open_engine(None, &dir.path().join("a.redb"), 1 << 20).is_ok());
    assert!(open_engine(Some("embedded"), &dir.path().join("b.redb"), 1 << 20).is_ok());
    let path = dir.path().join("c.redb");
    assert!(matches!(
        open_engine(
            Some("etcd://127.0.0.1:2379"),
            &path,
            embedded::DEFAULT_CACHE_BYTES
        ),
        Err(StorageError::Invalid(_))
    ));
    // A prefix that could reach into another shard's keys is refused.
    assert!(matches!(
        open_engine(
            Some("tikv://127.0.0.1:1?prefix=a/b"),
            &path,
            embedded::DEFAULT_CACHE_BYTES
        ),
        Err(StorageError::Invalid(_))
    ));
    #[cfg(not(feature = "tikv"))]
    assert!(matches!(
        open_engine(Some("tikv://127.0.0.1:1?prefix=a"), &path, embedded::DEFAULT_CACHE_BYTES),
        Err(StorageError::Invalid(m)) if m.contains("feature `tikv`")
    ));
}

/// Every raw key of the engine, printable (revisions as numbers).
fn raw_keys(store: &Store) -> Vec<String> {
    let r = store.engine().read().expect("read");
    let mut out = Vec::new();
    r.scan(b"", &[0xff], &mut |k, _| {
        out.push(if let Some((key, rev)) = keys::parse_version(k) {
            format!("v/{key}@{rev}")
        } else if let Some(rev) = k.strip_prefix(b"l/").and_then(keys::decode_u64) {
            format!("l/{rev}")
        } else {
            String::from_utf8_lossy(k).into_owned()
        });
        ControlFlow::Continue(())
    })
    .expect("scan");
    out.retain(|k| !k.starts_with("m/"));
    out
}

async fn put(store: &Store, name: &str, expected: Option<Revision>, n: i64) -> Revision {
    let key = format!("g/r/ns/{name}");
    let w = match expected {
        None => Write::Create {
            key,
            object: obj(name, n),
        },
        Some(expected) => Write::Update {
            key,
            expected,
            object: obj(name, n),
        },
    };
    store.write(w).await.expect("write").revision
}

async fn delete(store: &Store, name: &str) -> Revision {
    let w = Write::Delete {
        key: format!("g/r/ns/{name}"),
        expected: None,
    };
    store.write(w).await.expect("delete").revision
}

#[tokio::test]
async fn compaction_removes_exactly_the_history_at_or_below_its_revision() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let a1 = put(&store, "a", None, 1).await; // 1
    let b1 = put(&store, "b", None, 1).await; // 2
    let a2 = put(&store, "a", Some(a1), 2).await; // 3
    let _b_gone = delete(&store, "b").await; // 4
    let c1 = put(&store, "c", None, 1).await; // 5
    let a3 = put(&store, "a", Some(a2), 3).await; // 6
    let d_gone = {
        put(&store, "d", None, 1).await; // 7
        delete(&store, "d").await // 8
    };
    let d2 = put(&store, "d", None, 2).await; // 9: created again after the compaction's revision
    assert_eq!((b1, c1, a3, d_gone, d2), (2, 5, 6, 8, 9));

    store.compact(4).await.expect("compact");
    // a's version 1 was replaced at 3; b's were deleted at 4 (and nothing
    // newer). Everything above 4 stays, and so does the log above it.
    assert_eq!(
        raw_keys(&store),
        [
            "k/g/r/ns/a",
            "k/g/r/ns/c",
            "k/g/r/ns/d",
            "l/5",
            "l/6",
            "l/7",
            "l/8",
            "l/9",
            "v/g/r/ns/a@3",
            "v/g/r/ns/a@6",
            "v/g/r/ns/c@5",
            "v/g/r/ns/d@7",
            "v/g/r/ns/d@8",
            "v/g/r/ns/d@9",
        ]
    );

    // The next compaction takes only its own window: a@3, kept above, is
    // replaced at 6; d's first life and its tombstone go, its second stays.
    store.compact(8).await.expect("compact");
    assert_eq!(
        raw_keys(&store),
        [
            "k/g/r/ns/a",
            "k/g/r/ns/c",
            "k/g/r/ns/d",
            "l/9",
            "v/g/r/ns/a@6",
            "v/g/r/ns/c@5",
            "v/g/r/ns/d@9",
        ]
    );
    assert_eq!(store.compacted_revision(), 8);
    let now = store
        .list("g/r/", 9, None, None, all())
        .await
        .expect("list");
    assert_eq!(now.items.len(), 3);
}

#[tokio::test]
async fn a_compaction_of_many_batches_leaves_only_the_newest_versions() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let n = 2 * COMPACTION_BATCH + 7;
    let mut revs = Vec::new();
    for i in 0..n {
        revs.push(put(&store, &format!("o{i}"), None, 0).await);
    }
    for (i, rev) in revs.iter_mut().enumerate() {
        *rev = put(&store, &format!("o{i}"), Some(*rev), 1).await;
    }
    let to = store.revision();
    store.compact(to).await.expect("compact");
    let left = raw_keys(&store);
    let versions: Vec<_> = left.iter().filter(|k| k.starts_with("v/")).collect();
    assert_eq!(versions.len(), n, "one version per object");
    assert!(
        left.iter().all(|k| !k.starts_with("l/")),
        "no log record left"
    );
    for (i, rev) in revs.iter().enumerate() {
        assert!(left.contains(&format!("v/g/r/ns/o{i}@{rev}")), "o{i}@{rev}");
    }
    // The store reopens at the compacted revision with every object.
    drop(store);
    let store = reopen(dir.path()).await;
    assert_eq!(store.compacted_revision(), to);
    let list = store
        .list("g/r/", to, None, None, all())
        .await
        .expect("list");
    assert_eq!(list.items.len(), n);
}

/// Bytes of the value log's segments beside the store in `dir`.
fn value_log_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for d in super::vlog::dirs_of(&dir.join("db")).expect("dirs") {
        for f in std::fs::read_dir(d).expect("list") {
            total += f.expect("entry").metadata().expect("meta").len();
        }
    }
    total
}

/// Objects' JSON lives in the value log; the versions a compaction drops
/// leave garbage there, which the compaction then collects.
#[tokio::test]
async fn compaction_gives_back_the_value_logs_space() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let big = |name: &str, n: i64| {
        json!({"apiVersion": "demo/v1", "kind": "W", "metadata": {"name": name},
               "spec": {"n": n, "pad": "p".repeat(1000)}})
    };
    let mut revs = Vec::new();
    for i in 0..200 {
        let w = Write::Create {
            key: format!("g/r/ns/o{i}"),
            object: big(&format!("o{i}"), 0),
        };
        revs.push(store.write(w).await.expect("create").revision);
    }
    for round in 1..=4 {
        for (i, rev) in revs.iter_mut().enumerate() {
            let w = Write::Update {
                key: format!("g/r/ns/o{i}"),
                expected: *rev,
                object: big(&format!("o{i}"), round),
            };
            *rev = store.write(w).await.expect("update").revision;
        }
    }
    let before = value_log_bytes(dir.path());
    assert!(
        before > 5 * 200 * 1000,
        "every version is in the log: {before}"
    );
    store.compact(store.revision()).await.expect("compact");
    let after = value_log_bytes(dir.path());
    assert!(
        after < before / 2,
        "compaction left {after} of {before} bytes in the value log"
    );
    drop(store);
    let store = reopen(dir.path()).await;
    let list = store
        .list("g/r/", store.revision(), None, None, all())
        .await
        .expect("list");
    assert_eq!(list.items.len(), 200);
    for (key, bytes) in &list.items {
        let v: Value = serde_json::from_slice(bytes).expect("json");
        assert_eq!(
            v.pointer("/spec/n"),
            Some(&json!(4)),
            "{key}: the newest version"
        );
    }
}

/// The count of objects past a page reads lengths only: with objects'
/// JSON in the value log it still tells deleted keys from live ones, at
/// the current revision and at an older one.
#[tokio::test]
async fn a_page_counts_the_rest_from_the_value_logs_lengths() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = open(dir.path());
    let big = |name: &str, n: i64| {
        json!({"apiVersion": "demo/v1", "kind": "W", "metadata": {"name": name},
               "spec": {"n": n, "pad": "p".repeat(500)}})
    };
    let mut revs = std::collections::BTreeMap::new();
    for name in ["a", "b", "c", "d", "e"] {
        let w = Write::Create {
            key: format!("g/r/ns/{name}"),
            object: big(name, 0),
        };
        revs.insert(name, store.write(w).await.expect("create").revision);
    }
    let before = store.revision();
    delete(&store, "c").await;
    let w = Write::Update {
        key: "g/r/ns/d".into(),
        expected: revs["d"],
        object: big("d", 1),
    };
    store.write(w).await.expect("update");
    for (rev, rest) in [(before, 4), (store.revision(), 3)] {
        let page = store
            .list("g/r/", rev, None, Some(1), all())
            .await
            .expect("list");
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.remaining, rest, "at {rev}");
        let after = store
            .list("g/r/", rev, page.continue_after.clone(), Some(2), all())
            .await
            .expect("second page");
        assert_eq!(after.remaining, rest - 2, "after two more at {rev}");
    }
}
