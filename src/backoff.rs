//! The one exponential backoff of every retry loop: the leader's stream and
//! forwarding (`replica/`), the controller's failed passes, opening a store
//! that is not up yet, accept errors, the audit webhook's sends, the host's
//! APIServices and following webhook configurations. Each caller keeps its
//! own first delay, cap, growth and jitter; the arithmetic lives here once.

use std::time::Duration;

/// How a delay is spread so that peers retrying together drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The steps exactly as they grow.
    None,
    /// Half the step plus a random part of the other half, in [step/2, step)
    /// ("equal jitter").
    Equal,
    /// The step plus a random part of itself, in [step, 2·step), as
    /// kube-runtime's `DefaultBackoff` spreads its watchers' retries.
    Added,
}

/// Delays that start at `first` and grow by a factor up to `max`; `reset`
/// after a success starts over.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// The growth factor as a ratio, so steps stay exact in nanoseconds.
    growth: (u32, u32),
    jitter: Jitter,
    step: Duration,
}

impl Backoff {
    /// Doubling from `first` to `max`, without jitter.
    pub const fn new(first: Duration, max: Duration) -> Self {
        let max = if max.as_nanos() < first.as_nanos() {
            first
        } else {
            max
        };
        Self {
            first,
            max,
            growth: (2, 1),
            jitter: Jitter::None,
            step: first,
        }
    }

    /// Each step is the last times `numerator / denominator` (at least 1).
    pub const fn growth(mut self, numerator: u32, denominator: u32) -> Self {
        self.growth = (numerator, if denominator == 0 { 1 } else { denominator });
        self
    }

    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The next delay; the step then grows, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        self.next_with(rand::random::<f64>())
    }

    /// `next_delay` with the random part given: a number in [0, 1).
    fn next_with(&mut self, random: f64) -> Duration {
        let step = self.step;
        let (num, den) = self.growth;
        self.step = (step.saturating_mul(num) / den).clamp(self.first, self.max);
        match self.jitter {
            Jitter::None => step,
            Jitter::Equal => step / 2 + step.mul_f64(random / 2.0),
            Jitter::Added => step.saturating_add(step.mul_f64(random)),
        }
    }

    /// After a success: the next failure waits the first delay again.
    pub fn reset(&mut self) {
        self.step = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn steps(b: &mut Backoff, random: f64, n: usize) -> Vec<Duration> {
        (0..n).map(|_| b.next_with(random)).collect()
    }

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(5 * MS, 50 * MS);
        assert_eq!(
            steps(&mut b, 0.9, 6),
            [5 * MS, 10 * MS, 20 * MS, 40 * MS, 50 * MS, 50 * MS]
        );
        b.reset();
        assert_eq!(b.next_delay(), 5 * MS);
        assert_eq!(b.next_delay(), 10 * MS);
    }

    #[test]
    fn grows_by_a_ratio_without_a_cap() {
        let mut b = Backoff::new(10 * MS, Duration::MAX).growth(3, 2);
        assert_eq!(
            steps(&mut b, 0.5, 4),
            [10 * MS, 15 * MS, 22_500 * MS / 1000, 33_750 * MS / 1000]
        );
        // Saturates rather than overflowing.
        let mut b = Backoff::new(Duration::MAX / 2, Duration::MAX);
        assert_eq!(steps(&mut b, 0.0, 3)[2], Duration::MAX);
    }

    #[test]
    fn equal_jitter_lies_in_the_upper_half_of_each_step() {
        let mut low = Backoff::new(50 * MS, 1000 * MS).jitter(Jitter::Equal);
        assert_eq!(
            steps(&mut low, 0.0, 6),
            [25 * MS, 50 * MS, 100 * MS, 200 * MS, 400 * MS, 500 * MS]
        );
        let mut high = Backoff::new(50 * MS, 1000 * MS).jitter(Jitter::Equal);
        assert_eq!(steps(&mut high, 0.5, 2), [37_500 * MS / 1000, 75 * MS]);
        // Random draws stay within [step/2, step).
        let mut b = Backoff::new(50 * MS, 1000 * MS).jitter(Jitter::Equal);
        let mut step = 50 * MS;
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d < step,
                "{d:?} outside [{:?}, {step:?})",
                step / 2
            );
            step = (step * 2).min(1000 * MS);
        }
    }

    #[test]
    fn added_jitter_lies_between_one_and_two_steps() {
        let mut b = Backoff::new(800 * MS, 30_000 * MS).jitter(Jitter::Added);
        assert_eq!(steps(&mut b, 0.0, 2), [800 * MS, 1600 * MS]);
        assert_eq!(steps(&mut b, 0.5, 1), [4800 * MS]);
        let mut b = Backoff::new(800 * MS, 30_000 * MS).jitter(Jitter::Added);
        let mut step = 800 * MS;
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= step && d < step * 2,
                "{d:?} outside [{step:?}, {:?})",
                step * 2
            );
            step = (step * 2).min(30_000 * MS);
        }
    }

    #[test]
    fn a_cap_below_the_first_delay_is_the_first_delay() {
        let mut b = Backoff::new(100 * MS, 10 * MS);
        assert_eq!(steps(&mut b, 0.0, 3), [100 * MS; 3]);
    }
}
