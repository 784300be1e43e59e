use std::sync::Arc;

use serde_json::json;

use super::embedded::Embedded;
use super::*;

fn open(dir: &std::path::Path) -> Arc<Store> {
    let engine = Arc::new(Embedded::open(&dir.join("db")).expect("open"));
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
    // The writer thread holds the database until its channel closes: wait
    // until the file can be opened again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let engine = loop {
        match Embedded::open(&dir.path().join("db")) {
            Ok(e) => break Arc::new(e),
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the database was never released: {e}"),
        }
    };
    let store = Store::open(engine).expect("store");
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
