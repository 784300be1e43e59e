//! Work estimator: how many seats a request occupies, and for how long its
//! final seats are held after the response.

use std::time::Duration;

/// Bytes one seat processes for a LIST: 100 kB.
pub const LIST_BYTES_PER_SEAT: u64 = 100_000;
/// LISTs served from the watch cache are cheap: at most 1 MB worth.
pub const WATCH_CACHE_LIST_MAX_SEATS: u32 = 10;
/// Absolute cap on any level's MaxSeats.
pub const MAX_SEATS_CAP: u32 = 100;
/// Watchers notified per final seat of a mutating request.
pub const WATCHES_PER_SEAT: u32 = 10;
/// Latency charged per final seat of a mutating request.
pub const EVENT_ADDITIONAL_DURATION: Duration = Duration::from_millis(5);

/// Seats and latency of one request, like kube's `WorkEstimate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkEstimate {
    pub initial_seats: u32,
    pub final_seats: u32,
    pub additional_latency: Duration,
}

impl Default for WorkEstimate {
    fn default() -> Self {
        WorkEstimate {
            initial_seats: 1,
            final_seats: 0,
            additional_latency: Duration::ZERO,
        }
    }
}

impl WorkEstimate {
    pub fn max_seats(&self) -> u32 {
        self.initial_seats.max(self.final_seats)
    }
}

/// What the caller knows about the request's cost. The storage/watch layers
/// fill it in; APF only does arithmetic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EstimateInputs {
    /// Single-object reads, non-resource requests, anything else: 1 seat.
    #[default]
    Simple,
    /// A LIST (or the initial LIST of a watch).
    List {
        /// Live object count of the resource in the scope listed (1 for a
        /// list restricted to a single name).
        object_count: u64,
        /// Average encoded object size in bytes.
        avg_object_size: u64,
        /// Served from the watch cache rather than storage.
        from_watch_cache: bool,
    },
    /// create/update/patch/delete: watchers interested in the object.
    Mutating { watchers: u32 },
}

/// Per-level seat cap: max(1, min(ceil(0.15·NominalCL), NominalCL/handSize)), ≤ 100.
pub fn level_max_seats(nominal_cl: u32, hand_size: u32) -> u32 {
    let fifteen_percent = (u64::from(nominal_cl) * 15).div_ceil(100) as u32;
    let per_hand = nominal_cl / hand_size.max(1);
    fifteen_percent.min(per_hand).clamp(1, MAX_SEATS_CAP)
}

/// Computes the work estimate for a request in a level with `max_seats`.
pub fn estimate(inputs: &EstimateInputs, max_seats: u32) -> WorkEstimate {
    let max_seats = max_seats.max(1);
    match *inputs {
        EstimateInputs::Simple => WorkEstimate::default(),
        EstimateInputs::List {
            object_count,
            avg_object_size,
            from_watch_cache,
        } => {
            let bytes = u128::from(object_count) * u128::from(avg_object_size);
            let seats = bytes
                .div_ceil(u128::from(LIST_BYTES_PER_SEAT))
                .min(u128::from(u32::MAX)) as u32;
            let mut cap = max_seats;
            if from_watch_cache {
                cap = cap.min(WATCH_CACHE_LIST_MAX_SEATS);
            }
            WorkEstimate {
                initial_seats: seats.clamp(1, cap.max(1)),
                ..WorkEstimate::default()
            }
        }
        EstimateInputs::Mutating { watchers } => {
            if watchers < WATCHES_PER_SEAT {
                return WorkEstimate::default();
            }
            let wanted = watchers.div_ceil(WATCHES_PER_SEAT);
            let final_seats = wanted.min(max_seats);
            // Capping reshapes the work (same seat-seconds, narrower and longer).
            let total = EVENT_ADDITIONAL_DURATION * wanted;
            WorkEstimate {
                initial_seats: 1,
                final_seats,
                additional_latency: total / final_seats,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_seats_formula() {
        // global-default at ServerCL 600: nominal 49, hand 6 → min(8, 8) = 8.
        assert_eq!(level_max_seats(49, 6), 8);
        // workload-low: nominal 245, hand 6 → min(37, 40) = 37.
        assert_eq!(level_max_seats(245, 6), 37);
        assert_eq!(level_max_seats(0, 6), 1);
        assert_eq!(level_max_seats(13, 1), 2);
        assert_eq!(level_max_seats(100_000, 1), 100);
    }

    #[test]
    fn list_seats() {
        let list = |n, size, cache| EstimateInputs::List {
            object_count: n,
            avg_object_size: size,
            from_watch_cache: cache,
        };
        assert_eq!(estimate(&list(0, 1000, false), 50).initial_seats, 1);
        assert_eq!(estimate(&list(1, 5_000_000, false), 50).initial_seats, 50);
        assert_eq!(estimate(&list(100, 1000, false), 50).initial_seats, 1);
        assert_eq!(estimate(&list(101, 1000, false), 50).initial_seats, 2);
        assert_eq!(estimate(&list(2_000, 1_000, false), 50).initial_seats, 20);
        assert_eq!(estimate(&list(2_000, 1_000, true), 50).initial_seats, 10);
        assert_eq!(estimate(&list(2_000, 1_000, true), 4).initial_seats, 4);
        assert_eq!(
            estimate(&list(u64::MAX, u64::MAX, false), 100).initial_seats,
            100
        );
        assert_eq!(
            estimate(&EstimateInputs::Simple, 50),
            WorkEstimate::default()
        );
    }

    #[test]
    fn mutating_seats() {
        assert_eq!(
            estimate(&EstimateInputs::Mutating { watchers: 9 }, 50),
            WorkEstimate::default()
        );
        let e = estimate(&EstimateInputs::Mutating { watchers: 10 }, 50);
        assert_eq!(
            e,
            WorkEstimate {
                initial_seats: 1,
                final_seats: 1,
                additional_latency: Duration::from_millis(5)
            }
        );
        let e = estimate(&EstimateInputs::Mutating { watchers: 95 }, 50);
        assert_eq!(
            (e.final_seats, e.additional_latency),
            (10, Duration::from_millis(5))
        );
        // Capped: 1000 watchers want 100 seats, the level allows 8 → longer latency.
        let e = estimate(&EstimateInputs::Mutating { watchers: 1000 }, 8);
        assert_eq!(e.final_seats, 8);
        assert_eq!(e.additional_latency, Duration::from_micros(62_500));
        assert_eq!(e.max_seats(), 8);
    }
}
