//! The replica's state machine over a real (embedded) store shared by two
//! replicas: who leads after each election round, renewals, a lease that
//! lapses and is taken over, a hand-over on shutdown, and what each role
//! lets through (local writes, readiness, the `/readyz` line).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::storage::embedded::Embedded;

/// Two replicas' shared store.
pub(crate) fn shared_engine() -> (tempfile::TempDir, Arc<dyn Engine>) {
    let dir = tempfile::tempdir().expect("tmp");
    let engine = Embedded::open(&dir.path().join("db")).expect("open");
    (dir, Arc::new(engine))
}

/// A replica on `engine` with its own fenced store, not started: the tests
/// run its election rounds themselves.
pub(crate) async fn replica(engine: &Arc<dyn Engine>, id: &str, lease: Duration) -> Arc<Replica> {
    let cfg = ReplicaConfig {
        replica_id: id.into(),
        advertise_address: format!("{id}.invalid:1"),
        lease_duration: lease,
    };
    let fence = Replica::fence_for(&cfg);
    let store = Store::open_fenced(engine.clone(), Some(fence.clone())).expect("store");
    Replica::new(cfg, engine.clone(), fence, store)
        .await
        .expect("replica")
}

/// One election round, as the replica's loop runs it.
struct Rounds {
    replica: Arc<Replica>,
    observed: Option<Observed>,
}

impl Rounds {
    fn new(replica: &Arc<Replica>) -> Self {
        Self {
            replica: replica.clone(),
            observed: None,
        }
    }

    async fn round(&mut self) {
        self.replica.election_round(&mut self.observed).await;
    }
}

/// Replicas `a` and `b` of one store, before any round.
async fn two_replicas(lease: Duration) -> (tempfile::TempDir, Rounds, Rounds) {
    let (dir, engine) = shared_engine();
    let a = replica(&engine, "a", lease).await;
    let b = replica(&engine, "b", lease).await;
    (dir, Rounds::new(&a), Rounds::new(&b))
}

/// [`two_replicas`] after a round each: `a` leads, `b` follows it.
async fn leader_and_follower(lease: Duration) -> (tempfile::TempDir, Rounds, Rounds) {
    let (dir, mut ra, mut rb) = two_replicas(lease).await;
    ra.round().await;
    rb.round().await;
    (dir, ra, rb)
}

/// The lease this replica believes in: (holder, epoch).
fn leader_seen(r: &Replica) -> Option<(String, u64)> {
    r.view().lease.map(|l| (l.holder, l.epoch))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_replica_leads_and_the_second_follows_it() {
    let (_dir, mut ra, mut rb) = two_replicas(Duration::from_secs(30)).await;
    let (a, b) = (ra.replica.clone(), rb.replica.clone());
    assert!(!a.is_leader() && !a.caught_up(), "no role before a round");

    ra.round().await;
    assert!(a.is_leader());
    assert!(a.view().leading);
    assert_eq!(leader_seen(&a), Some(("a".into(), 1)));
    assert_eq!(a.fence.epoch(), 1, "its store writes under epoch 1");
    assert!(a.caught_up(), "a leader is ready");
    assert!(a.begin_local_write().is_some(), "a leader writes itself");
    assert_eq!(a.describe(), "replica a: leader (epoch 1)");

    rb.round().await;
    assert!(!b.is_leader() && !b.view().leading);
    assert_eq!(leader_seen(&b), Some(("a".into(), 1)));
    assert_eq!(
        b.view().lease.map(|l| l.address),
        Some("a.invalid:1".to_string()),
        "where writes are forwarded"
    );
    assert_eq!(b.fence.epoch(), 0, "a follower's store refuses writes");
    assert!(
        b.begin_local_write().is_none(),
        "a follower forwards writes"
    );
    assert_eq!(b.describe(), "replica b: follower; leader a (epoch 1)");
    assert!(
        rb.observed.as_ref().is_some_and(|o| o.lease.holder == "a"),
        "the follower times the leader's record from now"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn renewals_keep_the_epoch_and_a_leader_that_stops_renewing_stops_leading() {
    let (_dir, engine) = shared_engine();
    let lease = Duration::from_millis(1000);
    let a = replica(&engine, "a", lease).await;
    let mut ra = Rounds::new(&a);
    ra.round().await;
    assert!(a.is_leader());

    tokio::time::sleep(Duration::from_millis(600)).await;
    ra.round().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // 1.2 s after winning: the first lease alone would be over.
    assert!(a.is_leader(), "the renewal extended the lease");
    assert_eq!(leader_seen(&a), Some(("a".into(), 1)), "same epoch");
    assert_eq!(a.fence.epoch(), 1);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        !a.is_leader(),
        "a lease not renewed for its duration is not relied on"
    );
    assert!(a.begin_local_write().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lapsed_lease_is_taken_over_and_its_holder_steps_down() {
    let (_dir, mut ra, mut rb) = leader_and_follower(Duration::from_millis(500)).await;
    let (a, b) = (ra.replica.clone(), rb.replica.clone());
    assert_eq!(leader_seen(&b), Some(("a".into(), 1)));

    // Within the lease the follower does not take over.
    rb.round().await;
    assert!(!b.is_leader());

    // The leader stops renewing (frozen); the record stays unchanged for a
    // whole lease on the follower's clock.
    tokio::time::sleep(Duration::from_millis(650)).await;
    rb.round().await;
    assert!(b.is_leader(), "took over the lapsed lease");
    assert_eq!(leader_seen(&b), Some(("b".into(), 2)), "under a new epoch");
    assert_eq!(b.fence.epoch(), 2);
    assert_eq!(b.describe(), "replica b: leader (epoch 2)");

    // The old leader's next round finds the lease lost.
    ra.round().await;
    assert!(!a.is_leader() && !a.view().leading);
    assert_eq!(a.fence.epoch(), 0, "its store refuses writes from now");
    assert_eq!(leader_seen(&a), Some(("b".into(), 2)));
    assert!(a.begin_local_write().is_none());
    assert_eq!(a.describe(), "replica a: follower; leader b (epoch 2)");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_hands_over_after_its_writes_and_the_follower_takes_over_at_once() {
    let (_dir, mut ra, mut rb) = leader_and_follower(Duration::from_secs(30)).await;
    let (a, b) = (ra.replica.clone(), rb.replica.clone());

    let write = a.begin_local_write().expect("the leader writes");
    let handing = tokio::spawn({
        let a = a.clone();
        async move { a.hand_over(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!handing.is_finished(), "waits for the write in flight");
    assert!(!a.is_leader(), "takes no new writes meanwhile");
    assert!(a.begin_local_write().is_none());
    // Still the holder in the store: the follower does not take over yet.
    rb.round().await;
    assert_eq!(leader_seen(&b), Some(("a".into(), 1)));

    drop(write);
    tokio::time::timeout(Duration::from_secs(5), handing)
        .await
        .expect("hand-over ends once the write is done")
        .expect("hand-over");
    assert!(!a.view().leading);
    assert_eq!(a.fence.epoch(), 0);

    // The lease was given up: no wait for it to expire (30 s).
    rb.round().await;
    assert!(b.is_leader());
    assert_eq!(leader_seen(&b), Some(("b".into(), 2)));
    assert!(
        b.view().lease.is_some_and(|l| l.handed_over),
        "followers are told it was a hand-over"
    );

    // A resigned replica only reports the leader from now on.
    ra.round().await;
    assert!(!a.is_leader());
    assert_eq!(leader_seen(&a), Some(("b".into(), 2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_nobody_able_to_lead_a_resigned_replica_knows_no_leader() {
    let (_dir, engine) = shared_engine();
    let a = replica(&engine, "a", Duration::from_secs(30)).await;
    let mut ra = Rounds::new(&a);
    ra.round().await;
    a.resign().await;
    ra.round().await;
    assert!(!a.is_leader());
    assert_eq!(leader_seen(&a), None);
    assert_eq!(
        a.describe(),
        "replica a: follower; no leader (election in progress)"
    );
}
