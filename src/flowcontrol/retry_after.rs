//! Per-level adaptive Retry-After, like kube's dropped-requests tracker:
//! TCP-like multiplicative increase on heavy drops, additive decrease.

use std::collections::VecDeque;

pub const MAX_RETRY_AFTER: u64 = 32;

#[derive(Clone, Debug)]
pub struct RetryAfter {
    retry_after: u64,
    last_update: Option<u64>,
    /// When the adaptation was last evaluated.
    last_eval: u64,
    /// (second, drops in that second), oldest first, covering at most
    /// MAX_RETRY_AFTER seconds.
    history: VecDeque<(u64, u64)>,
}

impl Default for RetryAfter {
    fn default() -> Self {
        RetryAfter {
            retry_after: 1,
            last_update: None,
            last_eval: 0,
            history: VecDeque::new(),
        }
    }
}

impl RetryAfter {
    /// Records one rejection at `now` (whole seconds) and returns the value
    /// to send in its Retry-After header.
    pub fn record_drop(&mut self, now: u64) -> u64 {
        match self.history.back_mut() {
            Some((sec, n)) if *sec == now => *n += 1,
            _ => self.history.push_back((now, 1)),
        }
        self.update(now);
        self.retry_after
    }

    /// Current value after applying the adaptation due at `now`.
    pub fn get(&mut self, now: u64) -> u64 {
        self.update(now);
        self.retry_after
    }

    fn update(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.last_eval);
        self.last_eval = self.last_eval.max(now);
        while self
            .history
            .front()
            .is_some_and(|(s, _)| now.saturating_sub(*s) > MAX_RETRY_AFTER)
        {
            self.history.pop_front();
        }
        let window = self.retry_after;
        let drops: u64 = self
            .history
            .iter()
            .rev()
            .take_while(|(s, _)| now.saturating_sub(*s) < window)
            .map(|(_, n)| n)
            .sum();
        // Double when ≥3N drops happened in the last N seconds, at most once
        // per N seconds so that one burst cannot escalate straight to the cap.
        if self
            .last_update
            .is_none_or(|t| now.saturating_sub(t) >= window)
            && drops >= 3 * window
        {
            self.retry_after = (window * 2).min(MAX_RETRY_AFTER);
            self.last_update = Some(now);
            return;
        }
        // Back off by one per second elapsed while the drop rate is under 1/s.
        if drops < window && window > 1 && elapsed > 0 {
            self.retry_after = window.saturating_sub(elapsed).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_one() {
        assert_eq!(RetryAfter::default().get(100), 1);
    }

    #[test]
    fn doubles_to_cap_then_decreases_by_one() {
        let mut r = RetryAfter::default();
        let mut seen = Vec::new();
        // A flood: 100 drops every second for 40 seconds.
        for sec in 1..=40 {
            for _ in 0..100 {
                r.record_drop(sec);
            }
            seen.push(r.get(sec));
        }
        let mut distinct = seen.clone();
        distinct.dedup();
        assert_eq!(distinct, vec![2, 4, 8, 16, 32]);
        // Quiet afterwards: one step down per second.
        let after: Vec<u64> = (41..=80).map(|s| r.get(s)).collect();
        // The last 32 s of the flood are still within the window at first.
        let tail: Vec<u64> = after
            .iter()
            .copied()
            .skip_while(|&v| v == 32)
            .take(5)
            .collect();
        assert_eq!(tail, vec![31, 30, 29, 28, 27]);
        assert_eq!(r.get(200), 1);
    }

    #[test]
    fn few_drops_do_not_escalate() {
        let mut r = RetryAfter::default();
        for sec in 1..50 {
            assert_eq!(r.record_drop(sec), 1);
        }
        // 3 drops within one second at N=1 doubles.
        let mut r = RetryAfter::default();
        r.record_drop(10);
        r.record_drop(10);
        assert_eq!(r.record_drop(10), 2);
    }
}
