//! One priority level at run time: its configuration, limits, queue set,
//! demand integrator and Retry-After state.

use std::sync::Arc;

use tokio::time::Instant;

use super::apf::Apf;
use super::bootstrap;
use super::concurrency::{LevelLimits, SeatDemandIntegrator};
use super::queueset::QueueSet;
use super::retry_after::RetryAfter;
use super::types::{ObjectMeta, PriorityLevelConfiguration};

pub(super) struct Level {
    pub(super) name: Arc<str>,
    pub(super) uid: Arc<str>,
    pub(super) config: PriorityLevelConfiguration,
    pub(super) exempt: bool,
    pub(super) limits: LevelLimits,
    pub(super) max_seats: u32,
    pub(super) qs: QueueSet,
    pub(super) integrator: SeatDemandIntegrator,
    pub(super) smoothed: f64,
    pub(super) target: f64,
    pub(super) quiescing: bool,
    pub(super) retry: RetryAfter,
}

impl Level {
    pub(super) fn new(pl: PriorityLevelConfiguration, now: Instant) -> Self {
        let name: Arc<str> = Arc::from(pl.metadata.name.as_str());
        let uid = uid_or_stable(&pl.metadata, "prioritylevelconfigurations");
        Level {
            name,
            uid,
            exempt: pl.is_exempt(),
            config: pl,
            limits: LevelLimits::default(),
            max_seats: 1,
            qs: QueueSet::new(now),
            integrator: SeatDemandIntegrator::new(now),
            smoothed: 0.0,
            target: 0.0,
            quiescing: false,
            retry: RetryAfter::default(),
        }
    }

    pub(super) fn queue_count(&self) -> usize {
        if self.exempt {
            return 1;
        }
        self.config
            .queuing()
            .map_or(1, |q| q.queues.max(1) as usize)
    }

    pub(super) fn note_demand(&mut self, now: Instant) {
        self.integrator.set(self.qs.seat_demand() as f64, now);
    }

    pub(super) fn is_drained(&self) -> bool {
        self.qs.is_idle()
    }
}

/// The object's uid, or a stable one derived from kind and name for objects
/// that have none (the built-in configuration before the controller runs).
pub(super) fn uid_or_stable(meta: &ObjectMeta, kind: &str) -> Arc<str> {
    if meta.uid.is_empty() {
        Arc::from(bootstrap::stable_uid(kind, &meta.name))
    } else {
        Arc::from(meta.uid.as_str())
    }
}

impl Apf {
    /// Runs `f` on a level and then dispatches what fits and drops the level
    /// if it is quiescing and drained.
    pub(super) fn with_level(&self, name: &str, now: Instant, f: impl FnOnce(&mut Level)) {
        let mut st = self.lock();
        let Some(level) = st.levels.get_mut(name) else {
            return;
        };
        level.qs.sync_time(now);
        f(level);
        level.qs.dispatch(now);
        level.note_demand(now);
        if level.quiescing && level.is_drained() {
            st.levels.remove(name);
        }
    }
}
