//! `SeatGuard`: the seats a running request holds, and their release
//! (final seats stay taken for the estimate's additional latency).

use std::sync::{Arc, Weak};

use tokio::time::Instant;

use super::apf::Apf;
use super::decide::Admitted;
use super::estimator::WorkEstimate;
use super::queueset::Execution;

/// Holds a request's seats; release with [`SeatGuard::finish`] (dropping it
/// also releases).
pub struct SeatGuard {
    apf: Arc<Apf>,
    admitted: Admitted,
    exec: Execution,
    exempt: bool,
    /// False for long-running requests that bypass APF: nothing to release.
    gated: bool,
    watch: bool,
    finished: bool,
}

impl std::fmt::Debug for SeatGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeatGuard")
            .field("priority_level", &self.admitted.level)
            .field("flow_schema", &self.admitted.schema)
            .field("work", &self.exec.work)
            .finish()
    }
}

impl SeatGuard {
    pub(super) fn new(
        apf: Arc<Apf>,
        admitted: Admitted,
        exec: Execution,
        exempt: bool,
        gated: bool,
        watch: bool,
    ) -> Self {
        SeatGuard {
            apf,
            admitted,
            exec,
            exempt,
            gated,
            watch,
            finished: false,
        }
    }

    /// Value of `X-Kubernetes-PF-FlowSchema-UID`.
    pub fn flow_schema_uid(&self) -> &str {
        &self.admitted.schema_uid
    }

    /// Value of `X-Kubernetes-PF-PriorityLevel-UID`.
    pub fn priority_level_uid(&self) -> &str {
        &self.admitted.level_uid
    }

    pub fn flow_schema_name(&self) -> &str {
        &self.admitted.schema
    }

    pub fn priority_level_name(&self) -> &str {
        &self.admitted.level
    }

    pub fn work_estimate(&self) -> WorkEstimate {
        self.exec.work
    }

    /// The request is done: release its seats (final seats after their latency).
    pub fn finish(mut self) {
        self.release();
    }

    /// For a watch: the initial events have been sent; it stops holding seats.
    pub fn release_initial_seats(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if !self.gated {
            return;
        }
        let took = Instant::now().saturating_duration_since(self.exec.dispatched_at);
        self.apf
            .finish(&self.admitted.level, &self.exec, self.exempt);
        if let Some(o) = self.apf.observer() {
            o.execution_finished(
                &self.admitted.level,
                &self.admitted.schema,
                if self.watch { "watch" } else { "regular" },
                took,
            );
        }
    }
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        self.release();
    }
}

impl Apf {
    pub(super) fn finish(self: &Arc<Self>, level: &Arc<str>, exec: &Execution, exempt: bool) {
        let now = Instant::now();
        let mut hold = None;
        self.with_level(level, now, |l| {
            if exempt {
                l.qs.finish_unbounded(&exec.work);
            } else {
                hold = l.qs.finish(now, exec);
            }
        });
        if let Some((seats, latency)) = hold {
            let queue = exec.queue;
            let weak: Weak<Apf> = Arc::downgrade(self);
            let level = level.clone();
            let release = move || {
                if let Some(apf) = weak.upgrade() {
                    apf.with_level(&level, Instant::now(), |l| l.qs.release_held(queue, seats));
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(async move {
                        tokio::time::sleep(latency).await;
                        release();
                    });
                }
                Err(_) => release(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::flowcontrol::apf::{Apf, ServerConfig};
    use crate::flowcontrol::estimator::{EstimateInputs, WorkEstimate};
    use std::future::pending;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn final_seats_held_after_finish() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let g = apf
            .admit(
                &user("a"),
                EstimateInputs::Mutating { watchers: 20 },
                None,
                pending(),
            )
            .await
            .unwrap();
        assert_eq!(
            g.work_estimate(),
            WorkEstimate {
                initial_seats: 1,
                final_seats: 1,
                additional_latency: Duration::from_millis(10)
            }
        );
        g.finish();
        let seats = |apf: &Apf| level_snapshot(apf, "test").executing_seats;
        assert_eq!(seats(&apf), 1);
        tokio::time::sleep(Duration::from_millis(11)).await;
        assert_eq!(seats(&apf), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fast_path_is_cheap() {
        // Not a benchmark: guards against accidental O(queues) or allocation
        // blowups on the idle path by bounding the virtual-time-free cost
        // loosely (the paused clock does not move).
        let apf = Apf::new(ServerConfig::default());
        let d = user("alice");
        let started = std::time::Instant::now();
        for _ in 0..10_000 {
            apf.admit(&d, EstimateInputs::Simple, None, pending())
                .await
                .unwrap()
                .finish();
        }
        let per = started.elapsed() / 10_000;
        eprintln!("idle classify+admit+finish: {per:?} per request");
        assert!(per < Duration::from_millis(1), "{per:?} per request");
    }
}
