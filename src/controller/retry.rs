//! When a failed step runs again: as kube-runtime's default watcher backoff
//! (0.8 s doubling to 30 s, each delay plus up to itself again), reset by a
//! success.

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::{Backoff, Jitter};

/// A step that runs when due: now (something changed) or after a backoff
/// (it failed).
pub(super) struct Retry {
    backoff: Backoff,
    due: Option<Instant>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            backoff: Backoff::new(Duration::from_millis(800), Duration::from_secs(30))
                .jitter(Jitter::Added),
            due: None,
        }
    }
}

impl Retry {
    /// Something asks for the step: it runs at once.
    pub(super) fn now(&mut self) {
        self.due = Some(Instant::now());
    }

    pub(super) fn succeeded(&mut self) {
        self.backoff.reset();
        self.due = None;
    }

    /// Schedules the next attempt; returns how long until then.
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.backoff.next_delay();
        self.due = Some(Instant::now() + wait);
        wait
    }

    pub(super) fn due(&self) -> Option<Instant> {
        self.due
    }
}

/// Completes at `at`; never without one (`select!` then waits on the other
/// branches).
pub(super) async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_success_resets() {
        let mut r = Retry::default();
        assert_eq!(r.due(), None);
        let first = r.failed();
        let second = r.failed();
        let third = r.failed();
        assert!(
            first < third && second < third,
            "{first:?} {second:?} {third:?}"
        );
        assert!(first >= Duration::from_millis(800), "{first:?}");
        r.succeeded();
        assert_eq!(r.due(), None);
        assert!(r.failed() < third);
        r.now();
        assert_eq!(r.due(), Some(Instant::now()));
    }
}
