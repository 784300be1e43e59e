//! What `/metrics` reads: counters and gauges ([`Apf::snapshot`]) and the
//! observer hooks for the histograms.

use std::time::Duration;

use tokio::time::Instant;

use super::apf::Apf;
use super::queueset::RejectReason;

/// Hooks for the `apiserver_flowcontrol_*` histograms; counters and gauges
/// are read with [`Apf::snapshot`]. Called outside the APF lock.
pub trait ApfObserver: Send + Sync {
    /// `request_wait_duration_seconds{execute}`.
    fn wait_finished(
        &self,
        _priority_level: &str,
        _flow_schema: &str,
        _waited: Duration,
        _executed: bool,
    ) {
    }
    /// `request_execution_seconds{type}`; type is "regular" or "watch".
    fn execution_finished(
        &self,
        _priority_level: &str,
        _flow_schema: &str,
        _kind: &str,
        _took: Duration,
    ) {
    }
    /// `request_queue_length_after_enqueue`.
    fn enqueued(&self, _priority_level: &str, _flow_schema: &str, _queue_length: usize) {}
    /// `work_estimated_seats`.
    fn work_estimated(&self, _priority_level: &str, _flow_schema: &str, _seats: u32) {}
    /// `rejected_requests_total{reason}` as an event (also in snapshots).
    fn rejected(&self, _priority_level: &str, _flow_schema: &str, _reason: RejectReason) {}
}

/// Per-(level, schema) counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    pub priority_level: String,
    pub flow_schema: String,
    pub dispatched: u64,
    /// Indexed by `RejectReason::index()`.
    pub rejected: [u64; 4],
}

/// Gauges and counters of one level.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LevelSnapshot {
    pub name: String,
    pub uid: String,
    pub exempt: bool,
    pub quiescing: bool,
    pub nominal_limit_seats: u32,
    pub lendable_seats: u32,
    pub lower_limit_seats: u32,
    pub upper_limit_seats: u32,
    pub current_limit_seats: u32,
    pub max_seats_per_request: u32,
    pub waiting_requests: u32,
    pub executing_requests: u32,
    pub executing_seats: u32,
    pub demand_seats: u64,
    pub smoothed_demand_seats: f64,
    pub target_seats: f64,
    pub dispatched: u64,
    pub rejected: u64,
    pub timed_out: u64,
    pub cancelled: u64,
    pub retry_after_secs: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApfSnapshot {
    pub server_concurrency_limit: u32,
    pub levels: Vec<LevelSnapshot>,
    pub flows: Vec<FlowCounters>,
}

impl Apf {
    /// Counters and gauges for `apiserver_flowcontrol_*`.
    pub fn snapshot(&self) -> ApfSnapshot {
        let now = Instant::now();
        let secs = self.seconds(now);
        let mut st = self.lock();
        let server_cl = st.server_cl;
        let levels = st
            .levels
            .values_mut()
            .map(|l| LevelSnapshot {
                name: l.name.to_string(),
                uid: l.uid.to_string(),
                exempt: l.exempt,
                quiescing: l.quiescing,
                nominal_limit_seats: l.limits.nominal,
                lendable_seats: l.limits.lendable,
                lower_limit_seats: l.limits.min,
                upper_limit_seats: l.limits.max,
                current_limit_seats: l.qs.concurrency_limit(),
                max_seats_per_request: l.max_seats,
                waiting_requests: l.qs.waiting,
                executing_requests: l.qs.executing,
                executing_seats: l.qs.seats_in_use,
                demand_seats: l.qs.seat_demand(),
                smoothed_demand_seats: l.smoothed,
                target_seats: l.target,
                dispatched: l.qs.counters.dispatched,
                rejected: l.qs.counters.rejected,
                timed_out: l.qs.counters.timed_out,
                cancelled: l.qs.counters.cancelled,
                retry_after_secs: l.retry.get(secs),
            })
            .collect();
        let mut flows: Vec<FlowCounters> = st.flows.values().cloned().collect();
        flows.sort_by(|a, b| {
            (&a.priority_level, &a.flow_schema).cmp(&(&b.priority_level, &b.flow_schema))
        });
        ApfSnapshot {
            server_concurrency_limit: server_cl,
            levels,
            flows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::flowcontrol::apf::ServerConfig;
    use crate::flowcontrol::classifier::RequestDigest;
    use crate::flowcontrol::estimator::EstimateInputs;
    use std::future::pending;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct CountingObserver(AtomicUsize, AtomicUsize);
    impl ApfObserver for CountingObserver {
        fn wait_finished(&self, _: &str, _: &str, _: Duration, executed: bool) {
            if executed {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn execution_finished(&self, _: &str, _: &str, _: &str, _: Duration) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn observer_hooks_and_long_running_bypass() {
        let apf = Apf::new(ServerConfig::default());
        let obs = Arc::new(CountingObserver(AtomicUsize::new(0), AtomicUsize::new(0)));
        apf.set_observer(obs.clone());
        apf.admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap()
            .finish();
        let exec = RequestDigest {
            is_long_running_non_watch: true,
            subresource: "exec".into(),
            ..user("a")
        };
        let g = apf
            .admit(&exec, EstimateInputs::Simple, None, pending())
            .await
            .unwrap();
        assert_eq!(g.priority_level_name(), "global-default");
        let gd = |apf: &Apf| level_snapshot(apf, "global-default");
        assert_eq!(gd(&apf).executing_requests, 0);
        g.finish();
        assert_eq!(gd(&apf).dispatched, 1);
        assert_eq!(obs.0.load(Ordering::Relaxed), 1);
        assert_eq!(obs.1.load(Ordering::Relaxed), 1);
    }
}
