//! The double's storage: an in-memory Percolator MVCC store (locks plus write
//! records keyed by commit timestamp), enough of TiKV's transaction semantics
//! for tikv-client's optimistic transactions. Not a TiKV: no Raft, no
//! persistence, one mutex.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::proto::kvrpcpb;

/// What a lock will write when its transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOp {
    Put(Vec<u8>),
    Delete,
    /// A lock-only mutation (no value change).
    Lock,
}

#[derive(Debug, Clone)]
pub struct Lock {
    pub primary: Vec<u8>,
    pub start_ts: u64,
    pub ttl: u64,
    pub op: LockOp,
    pub min_commit_ts: u64,
    pub txn_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteKind {
    Put(Vec<u8>),
    Delete,
    Lock,
    Rollback,
}

/// A write record at a commit timestamp (a rollback is recorded at its start_ts).
#[derive(Debug, Clone)]
pub struct WriteRecord {
    pub start_ts: u64,
    pub kind: WriteKind,
}

#[derive(Debug, Default, Clone)]
struct KeyState {
    lock: Option<Lock>,
    writes: BTreeMap<u64, WriteRecord>,
}

/// Outcome of a status check on a transaction's primary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnStatus {
    Committed(u64),
    RolledBack,
    /// Still locked: remaining TTL.
    Locked(u64),
}

enum NewerWrite {
    None,
    Own,
    OwnRollback,
    /// A commit at (commit_ts, its start_ts) newer than our start.
    Conflict(u64, u64),
}

#[derive(Debug, Default)]
pub struct Mvcc {
    keys: BTreeMap<Vec<u8>, KeyState>,
    pub gc_safe_point: u64,
}

/// Physical milliseconds of a TSO timestamp.
pub fn physical_ms(ts: u64) -> u64 {
    ts >> 18
}

impl Lock {
    pub fn info(&self, key: &[u8]) -> kvrpcpb::LockInfo {
        kvrpcpb::LockInfo {
            primary_lock: self.primary.clone(),
            lock_version: self.start_ts,
            key: key.to_vec(),
            lock_ttl: self.ttl,
            txn_size: self.txn_size,
            lock_type: match self.op {
                LockOp::Put(_) => kvrpcpb::Op::Put as i32,
                LockOp::Delete => kvrpcpb::Op::Del as i32,
                LockOp::Lock => kvrpcpb::Op::Lock as i32,
            },
            min_commit_ts: self.min_commit_ts,
            ..Default::default()
        }
    }
}

pub fn locked_error(key: &[u8], lock: &Lock) -> kvrpcpb::KeyError {
    kvrpcpb::KeyError {
        locked: Some(lock.info(key)),
        ..Default::default()
    }
}

pub fn abort_error(msg: impl Into<String>) -> kvrpcpb::KeyError {
    kvrpcpb::KeyError {
        abort: msg.into(),
        ..Default::default()
    }
}

impl Mvcc {
    /// Snapshot read of one key at `ts`: a lock from an older transaction blocks it.
    pub fn get(&self, key: &[u8], ts: u64) -> Result<Option<Vec<u8>>, kvrpcpb::KeyError> {
        let Some(state) = self.keys.get(key) else {
            return Ok(None);
        };
        if let Some(lock) = &state.lock {
            if lock.start_ts <= ts && lock.op != LockOp::Lock {
                return Err(locked_error(key, lock));
            }
        }
        Ok(Self::visible(state, ts))
    }

    fn visible(state: &KeyState, ts: u64) -> Option<Vec<u8>> {
        for (_, w) in state.writes.range(..=ts).rev() {
            match &w.kind {
                WriteKind::Put(v) => return Some(v.clone()),
                WriteKind::Delete => return None,
                WriteKind::Lock | WriteKind::Rollback => continue,
            }
        }
        None
    }

    /// Snapshot scan of `[start, end)` (empty `end` = unbounded) at `ts`, at most
    /// `limit` pairs; a blocking lock is reported as that pair's error.
    pub fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        ts: u64,
        key_only: bool,
    ) -> Vec<kvrpcpb::KvPair> {
        let mut out = Vec::new();
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        for (k, state) in self
            .keys
            .range::<Vec<u8>, _>((Bound::Included(start.to_vec()), upper))
        {
            if out.len() >= limit {
                break;
            }
            if let Some(lock) = &state.lock {
                if lock.start_ts <= ts && lock.op != LockOp::Lock {
                    out.push(kvrpcpb::KvPair {
                        error: Some(locked_error(k, lock)),
                        key: k.clone(),
                        value: Vec::new(),
                    });
                    continue;
                }
            }
            if let Some(v) = Self::visible(state, ts) {
                out.push(kvrpcpb::KvPair {
                    error: None,
                    key: k.clone(),
                    value: if key_only { Vec::new() } else { v },
                });
            }
        }
        out
    }

    /// Optimistic prewrite: all mutations or none.
    pub fn prewrite(
        &mut self,
        mutations: &[kvrpcpb::Mutation],
        primary: &[u8],
        start_ts: u64,
        ttl: u64,
        min_commit_ts: u64,
        txn_size: u64,
    ) -> Vec<kvrpcpb::KeyError> {
        let mut errors = Vec::new();
        let mut todo = Vec::new();
        for m in mutations {
            let state = self.keys.get(&m.key);
            if let Some(lock) = state.and_then(|s| s.lock.as_ref()) {
                if lock.start_ts == start_ts {
                    continue; // A retried prewrite: already done.
                }
                errors.push(locked_error(&m.key, lock));
                continue;
            }
            if let Some(state) = state {
                match Self::newer_write(state, start_ts) {
                    NewerWrite::None => {}
                    NewerWrite::Own => continue, // Committed already: a late retry.
                    NewerWrite::OwnRollback => {
                        errors.push(abort_error("transaction already rolled back"));
                        continue;
                    }
                    NewerWrite::Conflict(commit_ts, w_start) => {
                        errors.push(kvrpcpb::KeyError {
                            conflict: Some(kvrpcpb::WriteConflict {
                                start_ts,
                                conflict_ts: w_start,
                                key: m.key.clone(),
                                primary: primary.to_vec(),
                                conflict_commit_ts: commit_ts,
                                reason: kvrpcpb::write_conflict::Reason::Optimistic as i32,
                            }),
                            ..Default::default()
                        });
                        continue;
                    }
                }
            }
            let op = match kvrpcpb::Op::try_from(m.op) {
                Ok(kvrpcpb::Op::Put) => LockOp::Put(m.value.clone()),
                Ok(kvrpcpb::Op::Insert) => {
                    if state.is_some_and(|s| Self::visible(s, u64::MAX).is_some()) {
                        errors.push(kvrpcpb::KeyError {
                            already_exist: Some(kvrpcpb::AlreadyExist { key: m.key.clone() }),
                            ..Default::default()
                        });
                        continue;
                    }
                    LockOp::Put(m.value.clone())
                }
                Ok(kvrpcpb::Op::Del) => LockOp::Delete,
                Ok(kvrpcpb::Op::Lock) => LockOp::Lock,
                Ok(kvrpcpb::Op::CheckNotExists) => {
                    if state.is_some_and(|s| Self::visible(s, u64::MAX).is_some()) {
                        errors.push(kvrpcpb::KeyError {
                            already_exist: Some(kvrpcpb::AlreadyExist { key: m.key.clone() }),
                            ..Default::default()
                        });
                    }
                    continue;
                }
                _ => {
                    errors.push(abort_error(format!("unsupported mutation op {}", m.op)));
                    continue;
                }
            };
            todo.push((m.key.clone(), op));
        }
        if !errors.is_empty() {
            return errors;
        }
        for (key, op) in todo {
            self.keys.entry(key).or_default().lock = Some(Lock {
                primary: primary.to_vec(),
                start_ts,
                ttl,
                op,
                min_commit_ts,
                txn_size,
            });
        }
        Vec::new()
    }

    /// Commits the locks of `start_ts` on `keys` at `commit_ts` (idempotent).
    pub fn commit(
        &mut self,
        keys: &[Vec<u8>],
        start_ts: u64,
        commit_ts: u64,
    ) -> Result<(), kvrpcpb::KeyError> {
        // Check everything first so a failed request changes nothing.
        for key in keys {
            let state = self.keys.get(key);
            match state.and_then(|s| s.lock.as_ref()) {
                Some(lock) if lock.start_ts == start_ts => {}
                _ => match state.and_then(|s| Self::find_write(s, start_ts)) {
                    Some((_, w)) if w.kind != WriteKind::Rollback => {}
                    _ => {
                        return Err(kvrpcpb::KeyError {
                            txn_not_found: Some(kvrpcpb::TxnNotFound {
                                start_ts,
                                primary_key: key.clone(),
                            }),
                            abort: "TxnLockNotFound".into(),
                            ..Default::default()
                        })
                    }
                },
            }
        }
        for key in keys {
            if let Some(state) = self.keys.get_mut(key) {
                if state.lock.as_ref().is_some_and(|l| l.start_ts == start_ts) {
                    Self::commit_lock(state, commit_ts);
                }
            }
        }
        Ok(())
    }

    fn commit_lock(state: &mut KeyState, commit_ts: u64) {
        if let Some(lock) = state.lock.take() {
            let kind = match lock.op {
                LockOp::Put(v) => WriteKind::Put(v),
                LockOp::Delete => WriteKind::Delete,
                LockOp::Lock => WriteKind::Lock,
            };
            state.writes.insert(
                commit_ts,
                WriteRecord {
                    start_ts: lock.start_ts,
                    kind,
                },
            );
        }
    }

    /// What a prewrite at `start_ts` finds at or above its start.
    fn newer_write(state: &KeyState, start_ts: u64) -> NewerWrite {
        for (&ts, w) in state.writes.range(start_ts..).rev() {
            match (&w.kind, w.start_ts == start_ts) {
                (WriteKind::Rollback, true) => return NewerWrite::OwnRollback,
                // Other transactions' rollbacks change no data.
                (WriteKind::Rollback, false) => continue,
                (_, true) => return NewerWrite::Own,
                (_, false) => return NewerWrite::Conflict(ts, w.start_ts),
            }
        }
        NewerWrite::None
    }

    fn find_write(state: &KeyState, start_ts: u64) -> Option<(u64, &WriteRecord)> {
        state
            .writes
            .range(start_ts..)
            .find(|(_, w)| w.start_ts == start_ts)
            .map(|(ts, w)| (*ts, w))
    }

    /// Rolls back `start_ts` on one key; refuses if it already committed there.
    fn rollback_key(&mut self, key: &[u8], start_ts: u64) -> Result<(), kvrpcpb::KeyError> {
        let state = self.keys.entry(key.to_vec()).or_default();
        if let Some((_, w)) = Self::find_write(state, start_ts) {
            if w.kind == WriteKind::Rollback {
                return Ok(());
            }
            return Err(abort_error(format!(
                "transaction {start_ts} already committed"
            )));
        }
        if state.lock.as_ref().is_some_and(|l| l.start_ts == start_ts) {
            state.lock = None;
        }
        // The rollback record stops a late prewrite of the same transaction.
        state.writes.insert(
            start_ts,
            WriteRecord {
                start_ts,
                kind: WriteKind::Rollback,
            },
        );
        Ok(())
    }

    pub fn batch_rollback(
        &mut self,
        keys: &[Vec<u8>],
        start_ts: u64,
    ) -> Result<(), kvrpcpb::KeyError> {
        for key in keys {
            let committed = self
                .keys
                .get(key)
                .and_then(|s| Self::find_write(s, start_ts))
                .is_some_and(|(_, w)| w.kind != WriteKind::Rollback);
            if committed {
                return Err(abort_error(format!(
                    "transaction {start_ts} already committed"
                )));
            }
        }
        for key in keys {
            self.rollback_key(key, start_ts)?;
        }
        Ok(())
    }

    /// TiKV's CheckTxnStatus on a primary key: rolls back an expired lock.
    pub fn check_txn_status(
        &mut self,
        primary: &[u8],
        lock_ts: u64,
        current_ts: u64,
        rollback_if_not_exist: bool,
    ) -> Result<(TxnStatus, kvrpcpb::Action, Option<kvrpcpb::LockInfo>), kvrpcpb::KeyError> {
        let state = self.keys.get(primary);
        if let Some(lock) = state.and_then(|s| s.lock.as_ref()) {
            if lock.start_ts == lock_ts {
                let age = physical_ms(current_ts).saturating_sub(physical_ms(lock_ts));
                if age >= lock.ttl {
                    self.rollback_key(primary, lock_ts)?;
                    return Ok((
                        TxnStatus::RolledBack,
                        kvrpcpb::Action::TtlExpireRollback,
                        None,
                    ));
                }
                let info = lock.info(primary);
                return Ok((
                    TxnStatus::Locked(lock.ttl),
                    kvrpcpb::Action::NoAction,
                    Some(info),
                ));
            }
        }
        match state.and_then(|s| Self::find_write(s, lock_ts)) {
            Some((_, w)) if w.kind == WriteKind::Rollback => {
                Ok((TxnStatus::RolledBack, kvrpcpb::Action::NoAction, None))
            }
            Some((commit_ts, _)) => Ok((
                TxnStatus::Committed(commit_ts),
                kvrpcpb::Action::NoAction,
                None,
            )),
            None if rollback_if_not_exist => {
                self.rollback_key(primary, lock_ts)?;
                Ok((
                    TxnStatus::RolledBack,
                    kvrpcpb::Action::LockNotExistRollback,
                    None,
                ))
            }
            None => Err(kvrpcpb::KeyError {
                txn_not_found: Some(kvrpcpb::TxnNotFound {
                    start_ts: lock_ts,
                    primary_key: primary.to_vec(),
                }),
                ..Default::default()
            }),
        }
    }

    /// Commits (commit_ts > 0) or rolls back the locks of `start_ts` in
    /// `[start, end)`, or only on `keys` when given.
    pub fn resolve(
        &mut self,
        start: &[u8],
        end: &[u8],
        keys: &[Vec<u8>],
        start_ts: u64,
        commit_ts: u64,
    ) -> Result<(), kvrpcpb::KeyError> {
        let targets: Vec<Vec<u8>> = if keys.is_empty() {
            self.locks_in(start, end, u64::MAX, usize::MAX)
                .into_iter()
                .filter(|(_, l)| l.start_ts == start_ts)
                .map(|(k, _)| k)
                .collect()
        } else {
            keys.to_vec()
        };
        for key in targets {
            let Some(state) = self.keys.get_mut(&key) else {
                continue;
            };
            if state.lock.as_ref().is_none_or(|l| l.start_ts != start_ts) {
                continue;
            }
            if commit_ts > 0 {
                Self::commit_lock(state, commit_ts);
            } else {
                self.rollback_key(&key, start_ts)?;
            }
        }
        Ok(())
    }

    /// Locks with start_ts <= `max_ts` in `[start, end)` (empty `end` = unbounded).
    pub fn locks_in(
        &self,
        start: &[u8],
        end: &[u8],
        max_ts: u64,
        limit: usize,
    ) -> Vec<(Vec<u8>, Lock)> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        self.keys
            .range::<Vec<u8>, _>((Bound::Included(start.to_vec()), upper))
            .filter_map(|(k, s)| {
                s.lock
                    .as_ref()
                    .filter(|l| l.start_ts <= max_ts)
                    .map(|l| (k.clone(), l.clone()))
            })
            .take(limit)
            .collect()
    }

    pub fn heartbeat(
        &mut self,
        primary: &[u8],
        start_ts: u64,
        advise_ttl: u64,
    ) -> Result<u64, kvrpcpb::KeyError> {
        match self
            .keys
            .get_mut(primary)
            .and_then(|s| s.lock.as_mut())
            .filter(|l| l.start_ts == start_ts)
        {
            Some(lock) => {
                lock.ttl = lock.ttl.max(advise_ttl);
                Ok(lock.ttl)
            }
            None => Err(kvrpcpb::KeyError {
                txn_not_found: Some(kvrpcpb::TxnNotFound {
                    start_ts,
                    primary_key: primary.to_vec(),
                }),
                ..Default::default()
            }),
        }
    }

    /// Async-commit secondaries: their locks, or the commit ts (0 = rolled back).
    pub fn check_secondary_locks(
        &mut self,
        keys: &[Vec<u8>],
        start_ts: u64,
    ) -> Result<(Vec<kvrpcpb::LockInfo>, u64), kvrpcpb::KeyError> {
        let mut locks = Vec::new();
        for key in keys {
            let state = self.keys.get(key);
            if let Some(lock) = state
                .and_then(|s| s.lock.as_ref())
                .filter(|l| l.start_ts == start_ts)
            {
                locks.push(lock.info(key));
                continue;
            }
            match state.and_then(|s| Self::find_write(s, start_ts)) {
                Some((_, w)) if w.kind == WriteKind::Rollback => return Ok((Vec::new(), 0)),
                Some((commit_ts, _)) => return Ok((Vec::new(), commit_ts)),
                None => {
                    self.rollback_key(key, start_ts)?;
                    return Ok((Vec::new(), 0));
                }
            }
        }
        Ok((locks, 0))
    }

    pub fn delete_range(&mut self, start: &[u8], end: &[u8]) {
        let doomed: Vec<Vec<u8>> = self
            .keys
            .range::<Vec<u8>, _>((
                Bound::Included(start.to_vec()),
                if end.is_empty() {
                    Bound::Unbounded
                } else {
                    Bound::Excluded(end.to_vec())
                },
            ))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.keys.remove(&k);
        }
    }

    /// Advances the GC safe point and drops what no read at or above it can see.
    pub fn gc(&mut self, safe_point: u64) -> u64 {
        if safe_point <= self.gc_safe_point {
            return self.gc_safe_point;
        }
        self.gc_safe_point = safe_point;
        for state in self.keys.values_mut() {
            // The newest data version at or below the safe point stays visible.
            let keep = state
                .writes
                .range(..=safe_point)
                .rev()
                .find(|(_, w)| matches!(w.kind, WriteKind::Put(_) | WriteKind::Delete))
                .map(|(ts, w)| (*ts, w.kind == WriteKind::Delete));
            state.writes.retain(|ts, _| {
                *ts > safe_point || keep.is_some_and(|(k, deleted)| *ts == k && !deleted)
            });
        }
        self.keys
            .retain(|_, s| s.lock.is_some() || !s.writes.is_empty());
        safe_point
    }

    /// Number of locks left anywhere (tests check nothing dangles).
    pub fn lock_count(&self) -> usize {
        self.keys.values().filter(|s| s.lock.is_some()).count()
    }

    /// Commit timestamps of the data versions of `key` (oldest first).
    pub fn versions(&self, key: &[u8]) -> Vec<u64> {
        self.keys
            .get(key)
            .map(|s| {
                s.writes
                    .iter()
                    .filter(|(_, w)| matches!(w.kind, WriteKind::Put(_) | WriteKind::Delete))
                    .map(|(ts, _)| *ts)
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], value: &[u8]) -> kvrpcpb::Mutation {
        kvrpcpb::Mutation {
            op: kvrpcpb::Op::Put as i32,
            key: key.to_vec(),
            value: value.to_vec(),
            assertion: 0,
        }
    }

    #[test]
    fn snapshot_reads_locks_and_conflicts() {
        let mut m = Mvcc::default();
        assert!(m
            .prewrite(&[put(b"a", b"1")], b"a", 10, 3000, 0, 1)
            .is_empty());
        // A reader newer than the lock is blocked; an older one is not.
        assert!(m.get(b"a", 11).unwrap_err().locked.is_some());
        assert_eq!(m.get(b"a", 9).unwrap(), None);
        m.commit(&[b"a".to_vec()], 10, 12).unwrap();
        // Idempotent commit.
        m.commit(&[b"a".to_vec()], 10, 12).unwrap();
        assert_eq!(m.get(b"a", 11).unwrap(), None);
        assert_eq!(m.get(b"a", 12).unwrap(), Some(b"1".to_vec()));
        // A transaction that started before the commit conflicts.
        let errs = m.prewrite(&[put(b"a", b"2")], b"a", 11, 3000, 0, 1);
        assert!(errs[0].conflict.is_some());
        // A rolled-back transaction cannot commit later.
        assert!(m
            .prewrite(&[put(b"a", b"3")], b"a", 20, 3000, 0, 1)
            .is_empty());
        m.batch_rollback(&[b"a".to_vec()], 20).unwrap();
        assert!(m.commit(&[b"a".to_vec()], 20, 21).is_err());
        assert_eq!(m.get(b"a", 30).unwrap(), Some(b"1".to_vec()));
        assert_eq!(m.lock_count(), 0);
    }

    #[test]
    fn expired_primary_rolls_back_and_gc_keeps_visible_version() {
        let mut m = Mvcc::default();
        let ts = |ms: u64| ms << 18;
        assert!(m
            .prewrite(&[put(b"p", b"1"), put(b"s", b"1")], b"p", ts(1), 10, 0, 2)
            .is_empty());
        let (st, _, _) = m.check_txn_status(b"p", ts(1), ts(5), true).unwrap();
        assert!(matches!(st, TxnStatus::Locked(_)));
        let (st, _, _) = m.check_txn_status(b"p", ts(1), ts(20), true).unwrap();
        assert_eq!(st, TxnStatus::RolledBack);
        m.resolve(b"", b"", &[], ts(1), 0).unwrap();
        assert_eq!(m.lock_count(), 0);
        assert_eq!(m.get(b"s", ts(30)).unwrap(), None);

        for (i, v) in [b"a", b"b", b"c"].iter().enumerate() {
            let start = ts(100 + 10 * i as u64);
            assert!(m
                .prewrite(&[put(b"k", *v)], b"k", start, 10, 0, 1)
                .is_empty());
            m.commit(&[b"k".to_vec()], start, start + 1).unwrap();
        }
        m.gc(ts(115));
        assert_eq!(m.versions(b"k").len(), 2);
        assert_eq!(m.get(b"k", ts(116)).unwrap(), Some(b"b".to_vec()));
    }
}
