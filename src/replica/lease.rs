//! The leader lease: one record under `m/leader` naming the holder, how peers
//! reach it, its epoch and when it expires. It is taken and renewed in engine
//! write transactions, and the epoch fences every write of the leader.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::storage::engine::{Engine, WriteTxn};
use crate::storage::{keys, Fence, Revision, StorageError};

pub const LEASE_KEY: &[u8] = b"m/leader";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: String,
    /// `host:port` of the holder's internal endpoint.
    pub address: String,
    /// Bumped by every takeover; a write commits only under the epoch it was fenced with.
    pub epoch: u64,
    /// Unix milliseconds on the holder's clock (replicas' clocks are assumed
    /// roughly in step; the epoch, not the clock, keeps writes safe).
    pub expires_ms: u64,
    /// The previous epoch's holder gave its lease up (a hand-over) rather
    /// than letting it lapse: its last answers to forwarded writes may still
    /// be on their way, so followers wait longer for them. Absent in records
    /// written before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handed_over: bool,
}

/// What one election round found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This replica holds the lease under `epoch`; `took_over` on a new epoch,
    /// with the revision counter at `revision`.
    Leader {
        epoch: u64,
        took_over: bool,
        revision: Revision,
        /// The epoch was taken over from a holder that gave it up.
        handed_over: bool,
    },
    /// Another replica holds a live lease.
    Follower(Lease),
    /// Nobody holds a live lease, and this replica may not take it (it has
    /// resigned: shutting down).
    Vacant,
}

/// A lease record as a follower last saw it change, by its own monotonic
/// clock: a record that has not changed for a whole lease duration is
/// expired, whatever the holder's wall clock wrote into it (as client-go's
/// leader election does, so clock skew between replicas cannot cause a
/// takeover of a live lease).
#[derive(Debug, Clone)]
pub struct Observed {
    pub lease: Lease,
    pub since: Instant,
}

impl Observed {
    /// Whether `lease` is the record observed, unchanged for `ttl`.
    pub fn expired(&self, lease: &Lease, ttl: Duration) -> bool {
        self.lease == *lease && self.since.elapsed() >= ttl
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn corrupt(e: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(format!("leader lease: {e}"))
}

pub fn read_lease(
    txn: &dyn crate::storage::engine::ReadTxn,
) -> Result<Option<Lease>, StorageError> {
    txn.get(LEASE_KEY)?
        .map(|v| serde_json::from_slice(&v).map_err(corrupt))
        .transpose()
}

/// Whether a lease record was given up (its holder resigned).
pub fn released(lease: &Lease) -> bool {
    lease.expires_ms == 0
}

/// One election round: renews the lease if this replica holds it under
/// `current_epoch`, takes it over if it is free, given up, expired (the
/// record `observed` unchanged for `ttl` on this replica's clock) or held by
/// an earlier incarnation of this replica, and otherwise reports the holder.
/// With `may_lead` false (resigned) it only reports.
pub fn elect(
    engine: &dyn Engine,
    me: &str,
    address: &str,
    ttl: Duration,
    current_epoch: u64,
    observed: Option<&Observed>,
    may_lead: bool,
) -> Result<Outcome, StorageError> {
    let mut outcome = None;
    engine.write(&mut |txn| {
        let now = now_ms();
        let lease = read_lease(txn)?;
        let expires_ms = now + ttl.as_millis() as u64;
        let live = |l: &Lease| !released(l) && !observed.is_some_and(|o| o.expired(l, ttl));
        if !may_lead {
            outcome = Some(match &lease {
                Some(l) if l.holder != me && live(l) => Outcome::Follower(l.clone()),
                _ => Outcome::Vacant,
            });
            return Ok(());
        }
        let (epoch, took_over) = match &lease {
            Some(l) if l.holder == me && l.epoch == current_epoch && current_epoch != 0 => {
                (l.epoch, false)
            }
            Some(l) if l.holder != me && live(l) => {
                outcome = Some(Outcome::Follower(l.clone()));
                return Ok(());
            }
            // Free, expired, or ours from before a restart: a new epoch.
            other => (other.as_ref().map_or(0, |l| l.epoch) + 1, true),
        };
        // Every renewal changes the record (even if the wall clock stood
        // still), which is what followers watch for.
        let expires_ms = match &lease {
            Some(l) if !took_over => expires_ms.max(l.expires_ms + 1),
            _ => expires_ms,
        };
        let revision = if took_over { start_above_used(txn)? } else { 0 };
        // Kept through renewals: a follower may first see the epoch later.
        let handed_over = match &lease {
            Some(l) if took_over => released(l),
            Some(l) => l.handed_over,
            None => false,
        };
        let record = Lease {
            holder: me.to_string(),
            address: address.to_string(),
            epoch,
            expires_ms,
            handed_over,
        };
        txn.put(
            LEASE_KEY,
            &serde_json::to_vec(&record).map_err(|e| StorageError::Invalid(e.to_string()))?,
        )?;
        outcome = Some(Outcome::Leader {
            epoch,
            took_over,
            revision,
            handed_over,
        });
        Ok(())
    })?;
    outcome.ok_or_else(|| StorageError::Engine("election transaction did not run".into()))
}

/// Gives the lease up (shutdown): if this replica still holds it under
/// `epoch`, it is marked expired so a peer takes over at its next round
/// instead of waiting for it to run out.
pub fn resign(engine: &dyn Engine, me: &str, epoch: u64) -> Result<bool, StorageError> {
    let mut resigned = false;
    engine.write(&mut |txn| {
        let Some(mut lease) = read_lease(txn)? else {
            return Ok(());
        };
        if lease.holder != me || lease.epoch != epoch || epoch == 0 {
            return Ok(());
        }
        lease.expires_ms = 0;
        txn.put(
            LEASE_KEY,
            &serde_json::to_vec(&lease).map_err(|e| StorageError::Invalid(e.to_string()))?,
        )?;
        resigned = true;
        Ok(())
    })?;
    Ok(resigned)
}

/// On takeover: sets the revision counter to the highest revision ever used
/// (the counter, or any event logged above it) and rewrites it, so that a
/// write of the previous leader still in flight conflicts with this
/// transaction instead of committing beside it.
fn start_above_used(txn: &mut dyn WriteTxn) -> Result<Revision, StorageError> {
    let stored = txn
        .get(keys::META_REVISION)?
        .and_then(|v| keys::decode_u64(&v))
        .unwrap_or(0);
    let mut highest = stored;
    txn.scan(
        &keys::log(stored.saturating_add(1)),
        &keys::prefix_end(b"l/"),
        &mut |k, _| {
            if let Some(rev) = k.get(2..).and_then(keys::decode_u64) {
                highest = highest.max(rev);
            }
            ControlFlow::Continue(())
        },
    )?;
    txn.put(keys::META_REVISION, &highest.to_be_bytes())?;
    Ok(highest)
}

/// The fence of this replica's store: a write commits only while the stored
/// lease names this replica under the epoch it won (0: not the leader).
pub struct EpochFence {
    pub replica_id: String,
    pub epoch: AtomicU64,
}

impl EpochFence {
    pub fn new(replica_id: &str) -> Self {
        Self {
            replica_id: replica_id.to_string(),
            epoch: AtomicU64::new(0),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Release);
    }
}

impl Fence for EpochFence {
    fn check(&self, txn: &mut dyn WriteTxn) -> Result<(), StorageError> {
        let mine = self.epoch();
        if mine == 0 {
            return Err(StorageError::NotLeader(format!(
                "replica {} does not hold the lease",
                self.replica_id
            )));
        }
        match read_lease(txn)? {
            Some(l) if l.holder == self.replica_id && l.epoch == mine => Ok(()),
            Some(l) => Err(StorageError::NotLeader(format!(
                "lease epoch {} is held by {} (this replica had epoch {mine})",
                l.epoch, l.holder
            ))),
            None => Err(StorageError::NotLeader("no lease".into())),
        }
    }

    fn sequencing(&self) -> bool {
        self.epoch() != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::Embedded;

    fn engine() -> (tempfile::TempDir, Embedded) {
        let dir = tempfile::tempdir().expect("tmp");
        let e = Embedded::open(&dir.path().join("db")).expect("open");
        (dir, e)
    }

    #[test]
    fn first_takes_over_second_follows_and_takeover_bumps_epoch_and_counter() {
        let (_d, e) = engine();
        let ttl = Duration::from_secs(30);
        let a = elect(&e, "a", "a:1", ttl, 0, None, true).expect("elect");
        assert_eq!(
            a,
            Outcome::Leader {
                epoch: 1,
                took_over: true,
                revision: 0,
                handed_over: false,
            }
        );
        match elect(&e, "b", "b:1", ttl, 0, None, true).expect("elect") {
            Outcome::Follower(l) => assert_eq!((l.holder.as_str(), l.epoch), ("a", 1)),
            other => panic!("{other:?}"),
        }
        // Renewal keeps the epoch.
        assert!(matches!(
            elect(&e, "a", "a:1", ttl, 1, None, true).expect("renew"),
            Outcome::Leader {
                epoch: 1,
                took_over: false,
                ..
            }
        ));
        // Revisions were used above the counter (a log entry past it): the
        // next leader starts above them. The lease expires to let b in.
        e.write(&mut |txn| {
            txn.put(keys::META_REVISION, &5u64.to_be_bytes())?;
            txn.put(&keys::log(7), b"x")?;
            let mut l = read_lease(txn)?.expect("lease");
            l.expires_ms = 0;
            txn.put(LEASE_KEY, &serde_json::to_vec(&l).expect("json"))
        })
        .expect("write");
        assert_eq!(
            elect(&e, "b", "b:1", ttl, 0, None, true).expect("takeover"),
            Outcome::Leader {
                epoch: 2,
                took_over: true,
                revision: 7,
                // Given up (expires_ms 0), not lapsed.
                handed_over: true,
            }
        );
        // a is fenced out now.
        let fence = EpochFence::new("a");
        fence.set_epoch(1);
        let err = e.write(&mut |txn| fence.check(txn)).expect_err("fenced");
        assert!(matches!(err, StorageError::NotLeader(_)), "{err}");
        let fence_b = EpochFence::new("b");
        fence_b.set_epoch(2);
        e.write(&mut |txn| fence_b.check(txn)).expect("b may write");
    }

    fn current(e: &Embedded) -> Lease {
        let mut l = None;
        e.write(&mut |txn| {
            l = read_lease(txn)?;
            Ok(())
        })
        .expect("read");
        l.expect("lease")
    }

    #[test]
    fn a_record_unchanged_for_a_lease_on_the_followers_clock_is_expired() {
        let (_d, e) = engine();
        // Long on the wall clock: only the follower's observation expires it.
        let ttl = Duration::from_secs(3600);
        elect(&e, "a", "a:1", ttl, 0, None, true).expect("elect");
        let seen = current(&e);
        let long_ago = Instant::now()
            .checked_sub(ttl + Duration::from_secs(1))
            .unwrap_or_else(Instant::now);
        let fresh = Observed {
            lease: seen.clone(),
            since: Instant::now(),
        };
        assert!(matches!(
            elect(&e, "b", "b:1", ttl, 0, Some(&fresh), true).expect("elect"),
            Outcome::Follower(_)
        ));
        // Renewed since the observation: the holder is alive.
        elect(&e, "a", "a:1", ttl, 1, None, true).expect("renew");
        assert_ne!(current(&e), seen, "a renewal changes the record");
        let stale = Observed {
            lease: seen,
            since: long_ago,
        };
        assert!(matches!(
            elect(&e, "b", "b:1", ttl, 0, Some(&stale), true).expect("elect"),
            Outcome::Follower(_)
        ));
        // Unchanged since an observation a lease ago: taken over.
        let stale = Observed {
            lease: current(&e),
            since: long_ago,
        };
        // A resigned replica only reports.
        assert_eq!(
            elect(&e, "b", "b:1", ttl, 0, Some(&stale), false).expect("elect"),
            Outcome::Vacant
        );
        // Lapsed, not given up: no hand-over.
        assert!(matches!(
            elect(&e, "b", "b:1", ttl, 0, Some(&stale), true).expect("elect"),
            Outcome::Leader {
                epoch: 2,
                took_over: true,
                handed_over: false,
                ..
            }
        ));
        assert!(!current(&e).handed_over);
        // Given up: taken over at once, without an observation, as a hand-over
        // the record keeps through renewals.
        assert!(resign(&e, "b", 2).expect("resign"));
        assert!(matches!(
            elect(&e, "c", "c:1", ttl, 0, None, true).expect("elect"),
            Outcome::Leader {
                epoch: 3,
                handed_over: true,
                ..
            }
        ));
        elect(&e, "c", "c:1", ttl, 3, None, true).expect("renew");
        assert!(current(&e).handed_over);
        match elect(&e, "d", "d:1", ttl, 0, None, true).expect("elect") {
            Outcome::Follower(l) => assert!(l.handed_over),
            other => panic!("{other:?}"),
        }
    }
}
