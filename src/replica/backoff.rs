//! Exponential backoff with jitter for retries against a peer that may be
//! gone (the leader's stream, forwarding to an unreachable leader), so that
//! followers do not hammer a dead address in step with each other.

use std::hash::BuildHasher;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            current: min,
        }
    }

    /// The next delay: half the current step plus a random part of the other
    /// half ("equal jitter"), then the step doubles up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.current;
        self.current = (self.current * 2).min(self.max);
        step / 2 + step.mul_f64(jitter() / 2.0)
    }

    /// After a success: the next failure waits the shortest delay again.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// A number in [0, 1): std's randomly keyed hasher over the time, which is
/// random enough to spread retries (no RNG dependency for this).
fn jitter() -> f64 {
    let h = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    (h % 1_000_000) as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(1));
        let mut b = Backoff::new(min, max);
        let mut steps = Vec::new();
        for _ in 0..8 {
            steps.push(b.next_delay());
        }
        // Each delay lies in [step/2, step) of its doubling step, capped.
        let mut step = min;
        for d in &steps {
            assert!(
                *d >= step / 2 && *d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(max);
        }
        assert!(steps[7] >= max / 2);
        b.reset();
        assert!(b.next_delay() <= min);
    }
}
