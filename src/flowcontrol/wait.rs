//! A queued request's wait: dispatch, time-out at the wait limit, or
//! cancellation, and a clean withdrawal when the waiting future is dropped.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::apf::Apf;
use super::estimator::WorkEstimate;
use super::queueset::{Execution, RejectReason};

/// A request in a queue; dropping it withdraws the request (or returns the
/// seats if it was dispatched in the meantime).
pub(super) struct WaitTicket<'a> {
    pub(super) apf: &'a Arc<Apf>,
    pub(super) level: Arc<str>,
    pub(super) schema: Arc<str>,
    pub(super) queue: usize,
    pub(super) id: u64,
    pub(super) work: WorkEstimate,
    pub(super) rx: Option<oneshot::Receiver<Instant>>,
    pub(super) armed: bool,
}

impl WaitTicket<'_> {
    pub(super) async fn wait<C: Future<Output = ()>>(
        &mut self,
        until: Instant,
        cancel: C,
    ) -> Result<Instant, (RejectReason, u64)> {
        let Some(mut rx) = self.rx.take() else {
            return Err((RejectReason::Cancelled, 1));
        };
        tokio::pin!(cancel);
        let reason = tokio::select! {
            biased;
            r = &mut rx => {
                self.armed = false;
                return r.map_err(|_| (RejectReason::Cancelled, 1));
            }
            _ = tokio::time::sleep_until(until) => RejectReason::TimeOut,
            _ = &mut cancel => RejectReason::Cancelled,
        };
        self.armed = false;
        let now = Instant::now();
        let secs = self.apf.seconds(now);
        let mut st = self.apf.lock();
        let removed = st.levels.get_mut(&self.level).map(|l| {
            l.qs.sync_time(now);
            let removed = l.qs.remove_waiting(self.queue, self.id, reason);
            let retry = if removed {
                l.retry.record_drop(secs)
            } else {
                0
            };
            l.note_demand(now);
            (removed, retry)
        });
        match removed {
            Some((true, retry)) => {
                drop(st);
                Err((reason, retry))
            }
            _ => {
                drop(st);
                // Dispatched while we were giving up: the seat is ours.
                rx.try_recv().map_err(|_| (reason, 1))
            }
        }
    }
}

impl Drop for WaitTicket<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let now = Instant::now();
        let mut dispatched = None;
        {
            let mut st = self.apf.lock();
            if let Some(l) = st.levels.get_mut(&self.level) {
                l.qs.sync_time(now);
                if !l
                    .qs
                    .remove_waiting(self.queue, self.id, RejectReason::Cancelled)
                {
                    dispatched = self.rx.as_mut().and_then(|rx| rx.try_recv().ok());
                }
                l.note_demand(now);
            }
        }
        if let Some(at) = dispatched {
            // Dispatched but nobody will run it: give the seats back.
            let exec = Execution {
                queue: Some(self.queue),
                work: self.work,
                dispatched_at: at,
            };
            self.apf.finish(&self.level, &exec, false);
        } else {
            self.apf.count_flow(&self.level, &self.schema, |c| {
                c.rejected[RejectReason::Cancelled.index()] += 1
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use crate::flowcontrol::estimator::EstimateInputs;
    use crate::flowcontrol::queueset::RejectReason;
    use std::future::pending;
    use tokio::sync::oneshot;

    #[tokio::test(start_paused = true)]
    async fn cancelled_by_client_and_by_dropping_the_future() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let held = futures_join(&apf, 4).await;
        let (tx, rx) = oneshot::channel::<()>();
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("a"), EstimateInputs::Simple, None, async {
                let _ = rx.await;
            })
            .await
        });
        tokio::task::yield_now().await;
        assert_eq!(level_snapshot(&apf, "test").waiting_requests, 1);
        tx.send(()).unwrap();
        assert_eq!(
            waiter.await.unwrap().unwrap_err().reason,
            RejectReason::Cancelled
        );
        // Dropping a waiting admit future withdraws the request.
        let apf3 = apf.clone();
        let aborted = tokio::spawn(async move {
            apf3.admit(&user("b"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        aborted.abort();
        let _ = aborted.await;
        let l = level_snapshot(&apf, "test");
        assert_eq!((l.waiting_requests, l.cancelled), (0, 2));
        drop(held);
        let l = level_snapshot(&apf, "test");
        assert_eq!((l.executing_requests, l.executing_seats), (0, 0));
    }
}
