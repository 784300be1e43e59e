//! Admission: classify a request, estimate its work, and decide whether it
//! runs now, waits in a queue (see `wait`), or is rejected with 429.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::apf::Apf;
use super::bootstrap;
use super::classifier::{Classification, RequestDigest};
use super::estimator::{self, EstimateInputs, WorkEstimate};
use super::level::uid_or_stable;
use super::queueset::{Execution, RejectReason, WaitingRequest};
use super::seats::SeatGuard;
use super::snapshot::FlowCounters;
use super::types::CATCH_ALL;
use super::wait::WaitTicket;

/// Queue wait limit for requests without a deadline.
pub const DEFAULT_WAIT_LIMIT: Duration = Duration::from_secs(15);
/// Upper bound of the queue wait limit.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A refused request: answer 429 with `Retry-After: retry_after_secs` and the
/// body "Too many requests, please try again later.".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request rejected by priority level {priority_level:?} ({reason:?}), retry after {retry_after_secs}s")]
pub struct Rejected {
    pub reason: RejectReason,
    pub retry_after_secs: u64,
    pub flow_schema: String,
    pub flow_schema_uid: String,
    pub priority_level: String,
    pub priority_level_uid: String,
}

pub const TOO_MANY_REQUESTS_BODY: &str = "Too many requests, please try again later.";

/// Where a request was classified; its seats are accounted there.
pub(super) struct Admitted {
    pub(super) level: Arc<str>,
    pub(super) level_uid: Arc<str>,
    pub(super) schema: Arc<str>,
    pub(super) schema_uid: Arc<str>,
}

enum Decision {
    /// `gated` is false for long-running requests that bypass APF.
    Run {
        exec: Execution,
        exempt: bool,
        gated: bool,
    },
    Wait {
        queue: usize,
        id: u64,
        rx: oneshot::Receiver<Instant>,
        arrive: Instant,
        queue_len: usize,
    },
    Reject(RejectReason, u64),
}

impl Apf {
    /// Classifies, estimates, queues and waits for a seat.
    ///
    /// `deadline` is the request's deadline (the wait limit is a quarter of
    /// the time left, at most 60 s; 15 s without deadline); `cancel`
    /// completes when the client goes away. Dropping the returned future
    /// withdraws the request cleanly.
    pub async fn admit<C>(
        self: &Arc<Self>,
        digest: &RequestDigest,
        inputs: EstimateInputs,
        deadline: Option<Instant>,
        cancel: C,
    ) -> Result<SeatGuard, Rejected>
    where
        C: Future<Output = ()>,
    {
        let now = Instant::now();
        let (admitted, work, decision) = self.decide(digest, &inputs, now);
        let observer = self.observer();
        if let Some(o) = &observer {
            o.work_estimated(&admitted.level, &admitted.schema, work.max_seats());
        }
        match decision {
            Decision::Run {
                exec,
                exempt,
                gated,
            } => {
                if let (Some(o), true) = (&observer, gated) {
                    o.wait_finished(&admitted.level, &admitted.schema, Duration::ZERO, true);
                }
                Ok(SeatGuard::new(
                    self.clone(),
                    admitted,
                    exec,
                    exempt,
                    gated,
                    digest.verb == "watch",
                ))
            }
            Decision::Reject(reason, retry) => {
                if let Some(o) = &observer {
                    o.rejected(&admitted.level, &admitted.schema, reason);
                    o.wait_finished(&admitted.level, &admitted.schema, Duration::ZERO, false);
                }
                Err(self.rejected(&admitted, reason, retry))
            }
            Decision::Wait {
                queue,
                id,
                rx,
                arrive,
                queue_len,
            } => {
                if let Some(o) = &observer {
                    o.enqueued(&admitted.level, &admitted.schema, queue_len);
                }
                let limit = match deadline {
                    Some(d) => (d.saturating_duration_since(now) / 4).min(MAX_WAIT_LIMIT),
                    None => DEFAULT_WAIT_LIMIT,
                };
                let mut ticket = WaitTicket {
                    apf: self,
                    level: admitted.level.clone(),
                    schema: admitted.schema.clone(),
                    queue,
                    id,
                    work,
                    rx: Some(rx),
                    armed: true,
                };
                let outcome = ticket.wait(now + limit, cancel).await;
                let waited = Instant::now().saturating_duration_since(arrive);
                match outcome {
                    Ok(dispatched_at) => {
                        self.count_flow(&admitted.level, &admitted.schema, |c| c.dispatched += 1);
                        if let Some(o) = &observer {
                            o.wait_finished(&admitted.level, &admitted.schema, waited, true);
                        }
                        let exec = Execution {
                            queue: Some(queue),
                            work,
                            dispatched_at,
                        };
                        Ok(SeatGuard::new(
                            self.clone(),
                            admitted,
                            exec,
                            false,
                            true,
                            digest.verb == "watch",
                        ))
                    }
                    Err((reason, retry)) => {
                        self.count_flow(&admitted.level, &admitted.schema, |c| {
                            c.rejected[reason.index()] += 1
                        });
                        if let Some(o) = &observer {
                            o.rejected(&admitted.level, &admitted.schema, reason);
                            o.wait_finished(&admitted.level, &admitted.schema, waited, false);
                        }
                        Err(self.rejected(&admitted, reason, retry))
                    }
                }
            }
        }
    }

    fn rejected(&self, a: &Admitted, reason: RejectReason, retry_after_secs: u64) -> Rejected {
        Rejected {
            reason,
            retry_after_secs,
            flow_schema: a.schema.to_string(),
            flow_schema_uid: a.schema_uid.to_string(),
            priority_level: a.level.to_string(),
            priority_level_uid: a.level_uid.to_string(),
        }
    }

    fn decide(
        &self,
        digest: &RequestDigest,
        inputs: &EstimateInputs,
        now: Instant,
    ) -> (Admitted, WorkEstimate, Decision) {
        let secs = self.seconds(now);
        let mut guard = self.lock();
        let st = &mut *guard;
        let class = match st.classifier.classify(digest) {
            Some(c) => c,
            // Only a request without the usual authenticated/unauthenticated
            // group misses the mandatory catch-all; treat it as catch-all traffic.
            None => Classification {
                flow_schema: Arc::new(bootstrap::catch_all_flow_schema()),
                priority_level: Arc::from(CATCH_ALL),
                distinguisher: digest.user.clone(),
                flow_hash: 0,
            },
        };
        let schema: Arc<str> = Arc::from(class.flow_schema.metadata.name.as_str());
        let schema_uid = st
            .schema_uids
            .get(schema.as_ref())
            .cloned()
            .unwrap_or_else(|| uid_or_stable(&class.flow_schema.metadata, "flowschemas"));
        let level_name = if st.levels.contains_key(&class.priority_level) {
            class.priority_level.clone()
        } else {
            Arc::from(CATCH_ALL)
        };
        let next_id = st.next_id;
        st.next_id += 1;
        let Some(level) = st.levels.get_mut(&level_name) else {
            // No catch-all level either: cannot happen, mandatory levels are
            // always configured. Reject rather than panic.
            let admitted = Admitted {
                level: level_name.clone(),
                level_uid: Arc::from(""),
                schema,
                schema_uid,
            };
            return (
                admitted,
                WorkEstimate::default(),
                Decision::Reject(RejectReason::ConcurrencyLimit, 1),
            );
        };
        let admitted = Admitted {
            level: level.name.clone(),
            level_uid: level.uid.clone(),
            schema: schema.clone(),
            schema_uid,
        };
        let flow_key = (level.name.clone(), schema.clone());
        let work = if level.exempt {
            WorkEstimate::default()
        } else {
            estimator::estimate(inputs, level.max_seats)
        };
        level.qs.sync_time(now);

        // Starts now: run(queue, exempt, gated).
        let run = |queue: Option<usize>, exempt: bool, gated: bool| Decision::Run {
            exec: Execution {
                queue,
                work,
                dispatched_at: now,
            },
            exempt,
            gated,
        };
        let decision = if digest.is_long_running_non_watch {
            // Not gated, not counted: only classified for the headers.
            run(None, true, false)
        } else if level.exempt {
            level.qs.start_unbounded(&work);
            level.note_demand(now);
            run(None, true, true)
        } else if !level.qs.has_queues() {
            if level.qs.try_start_now(None, &work) {
                level.note_demand(now);
                run(None, false, true)
            } else {
                level.qs.record_rejection();
                Decision::Reject(
                    RejectReason::ConcurrencyLimit,
                    level.retry.record_drop(secs),
                )
            }
        } else {
            let q = level.qs.choose_queue(class.flow_hash).unwrap_or(0);
            if level.qs.try_start_now(Some(q), &work) {
                level.note_demand(now);
                run(Some(q), false, true)
            } else if level.qs.is_queue_full(q, work.max_seats()) {
                level.qs.record_rejection();
                Decision::Reject(RejectReason::QueueFull, level.retry.record_drop(secs))
            } else {
                let (tx, rx) = oneshot::channel();
                let req = WaitingRequest {
                    id: next_id,
                    work,
                    arrive: now,
                    arrive_wall: self.wall(now),
                    arrival_r: 0.0,
                    flow_schema: schema.clone(),
                    distinguisher: class.distinguisher.clone(),
                    digest: Arc::new(digest.clone()),
                    wake: tx,
                };
                let queue_len = level.qs.enqueue(q, req);
                level.qs.dispatch(now);
                level.note_demand(now);
                Decision::Wait {
                    queue: q,
                    id: next_id,
                    rx,
                    arrive: now,
                    queue_len,
                }
            }
        };
        let counters = st.flows.entry(flow_key).or_insert_with(|| FlowCounters {
            priority_level: admitted.level.to_string(),
            flow_schema: admitted.schema.to_string(),
            ..Default::default()
        });
        match &decision {
            Decision::Run { gated: true, .. } => counters.dispatched += 1,
            Decision::Run { .. } => {}
            Decision::Reject(r, _) => counters.rejected[r.index()] += 1,
            Decision::Wait { .. } => {}
        }
        (admitted, work, decision)
    }

    pub(super) fn count_flow(
        &self,
        level: &Arc<str>,
        schema: &Arc<str>,
        f: impl FnOnce(&mut FlowCounters),
    ) {
        let mut st = self.lock();
        if let Some(c) = st.flows.get_mut(&(level.clone(), schema.clone())) {
            f(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::flowcontrol::apf::ServerConfig;
    use std::future::pending;

    #[tokio::test(start_paused = true)]
    async fn reject_level_with_zero_seats_rejects_even_when_idle() {
        let apf = Apf::new(ServerConfig::default());
        let mut zero = level("nothing", 0, None);
        zero.spec.limited.as_mut().unwrap().borrowing_limit_percent = Some(0);
        let fs = bootstrap::global_default_like("to-nothing", 50, "nothing");
        let mut levels = bootstrap::all_priority_levels();
        levels.push(zero);
        let mut schemas = bootstrap::all_flow_schemas();
        schemas.push(fs);
        apf.replace_config(schemas, levels);
        let err = apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::ConcurrencyLimit);
        assert_eq!(err.priority_level, "nothing");
        assert_eq!(err.retry_after_secs, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_limit_rejection_on_full_reject_level() {
        let apf = apf_with(level("test", 1, None));
        let mut guards = futures_join(&apf, 4).await;
        let err = apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::ConcurrencyLimit);
        drop(guards.pop());
        assert!(apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .is_ok());
        let snap = apf.snapshot();
        let flow = snap.flows.iter().find(|f| f.flow_schema == "test").unwrap();
        assert_eq!(flow.dispatched, 5);
        assert_eq!(flow.rejected[RejectReason::ConcurrencyLimit.index()], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_full_rejection() {
        // One queue of length 1, 4 seats.
        let apf = apf_with(level("test", 1, Some((1, 1, 1))));
        let mut guards = futures_join(&apf, 4).await;
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("b"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        let err = apf
            .admit(&user("c"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::QueueFull);
        // Finishing one request dispatches the waiter.
        guards.pop().unwrap().finish();
        let g = waiter.await.unwrap().unwrap();
        assert_eq!(g.priority_level_name(), "test");
    }

    #[tokio::test(start_paused = true)]
    async fn time_out_at_wait_limit() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let _held: Vec<_> = futures_join(&apf, 4).await;
        // (deadline from now, wait limit): a quarter of the time left, 15 s
        // without a deadline, at most 60 s.
        for (deadline, limit) in [
            (Some(Duration::from_secs(40)), Duration::from_secs(10)),
            (None, DEFAULT_WAIT_LIMIT),
            (Some(Duration::from_secs(3600)), MAX_WAIT_LIMIT),
        ] {
            let start = Instant::now();
            let err = apf
                .admit(
                    &user("a"),
                    EstimateInputs::Simple,
                    deadline.map(|d| start + d),
                    pending(),
                )
                .await
                .unwrap_err();
            assert_eq!(err.reason, RejectReason::TimeOut);
            assert_eq!(Instant::now() - start, limit);
        }
        let l = level_snapshot(&apf, "test");
        assert_eq!((l.timed_out, l.waiting_requests), (3, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_grows_under_rejections() {
        let apf = apf_with(level("test", 0, None));
        let mut last = 0;
        for _ in 0..3 {
            last = apf
                .admit(&user("a"), EstimateInputs::Simple, None, pending())
                .await
                .unwrap_err()
                .retry_after_secs;
        }
        assert_eq!(last, 2);
    }
}
