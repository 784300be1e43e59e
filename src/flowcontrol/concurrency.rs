//! How the server's concurrency limit (ServerCL) is split among priority
//! levels, and how levels lend and borrow seats every 10 s.

use std::time::Duration;

use tokio::time::Instant;

/// How often the borrowing adjustment runs.
pub const BORROWING_PERIOD: Duration = Duration::from_secs(10);
/// Weight of the old smoothed demand in each period.
pub const DEMAND_SMOOTHING: f64 = 0.977;

/// kube's rounding: half away from zero (Rust's `f64::round`).
pub fn round_half_away(x: f64) -> i64 {
    x.round() as i64
}

/// A level's static limits derived from its configuration and ServerCL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LevelLimits {
    pub nominal: u32,
    pub lendable: u32,
    pub min: u32,
    pub max: u32,
}

impl LevelLimits {
    /// CurrentCL for a level that has just appeared: half of what it may lend
    /// is lent out.
    pub fn initial_current(&self) -> u32 {
        self.nominal - self.lendable / 2
    }
}

/// Shares, lendable percent and borrowing-limit percent of one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelShares {
    pub shares: u32,
    pub lendable_percent: u32,
    pub borrowing_limit_percent: Option<u32>,
}

/// NominalCL = ceil(ServerCL·shares/Σshares); LendableCL = round(Nominal·lendable%);
/// MinCL = Nominal − Lendable; MaxCL = Nominal + (ServerCL | round(Nominal·blp%)).
pub fn split(server_cl: u32, levels: &[LevelShares]) -> Vec<LevelLimits> {
    let sum: u64 = levels.iter().map(|l| u64::from(l.shares)).sum();
    levels
        .iter()
        .map(|l| {
            let nominal = if sum == 0 {
                0
            } else {
                // Integer ceil avoids float error on exact multiples.
                (u64::from(server_cl) * u64::from(l.shares)).div_ceil(sum) as u32
            };
            let lendable = round_half_away(
                f64::from(nominal) * f64::from(l.lendable_percent.min(100)) / 100.0,
            ) as u32;
            let borrow = match l.borrowing_limit_percent {
                None => server_cl,
                Some(p) => round_half_away(f64::from(nominal) * f64::from(p) / 100.0) as u32,
            };
            LevelLimits {
                nominal,
                lendable,
                min: nominal - lendable,
                max: nominal.saturating_add(borrow),
            }
        })
        .collect()
}

/// Time integral of a level's seat demand (seats in use + max seats of the
/// waiting requests), reset each borrowing period.
#[derive(Clone, Debug)]
pub struct SeatDemandIntegrator {
    value: f64,
    last: Instant,
    start: Instant,
    integral: f64,
    integral_sq: f64,
    high_water: f64,
}

/// The statistics of one period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemandPeriod {
    pub avg: f64,
    pub stddev: f64,
    pub high_water: f64,
}

impl SeatDemandIntegrator {
    pub fn new(now: Instant) -> Self {
        SeatDemandIntegrator {
            value: 0.0,
            last: now,
            start: now,
            integral: 0.0,
            integral_sq: 0.0,
            high_water: 0.0,
        }
    }

    fn advance(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.integral += self.value * dt;
        self.integral_sq += self.value * self.value * dt;
        self.last = self.last.max(now);
    }

    pub fn set(&mut self, value: f64, now: Instant) {
        self.advance(now);
        self.value = value;
        self.high_water = self.high_water.max(value);
    }

    pub fn current(&self) -> f64 {
        self.value
    }

    /// Ends the period: average, standard deviation and high-water mark, and
    /// starts a new period at the current value.
    pub fn reset(&mut self, now: Instant) -> DemandPeriod {
        self.advance(now);
        let span = now.saturating_duration_since(self.start).as_secs_f64();
        let (avg, stddev) = if span > 0.0 {
            let avg = self.integral / span;
            let var = (self.integral_sq / span - avg * avg).max(0.0);
            (avg, var.sqrt())
        } else {
            (self.value, 0.0)
        };
        let out = DemandPeriod {
            avg,
            stddev,
            high_water: self.high_water,
        };
        self.start = now;
        self.integral = 0.0;
        self.integral_sq = 0.0;
        self.high_water = self.value;
        out
    }
}

/// Smoothed demand: max(envelope, 0.977·old + 0.023·envelope), envelope = avg + stddev.
pub fn smooth_demand(previous: f64, period: &DemandPeriod) -> f64 {
    let envelope = period.avg + period.stddev;
    envelope.max(DEMAND_SMOOTHING * previous + (1.0 - DEMAND_SMOOTHING) * envelope)
}

/// One level in the fair allocation problem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocItem {
    pub target: f64,
    pub lower: f64,
    pub upper: f64,
}

/// Finds one proportion p so that Σ clamp(p·target_i, lower_i, upper_i) = total
/// and returns the clamped values. When the bounds cannot reach the total the
/// nearest feasible bound set is returned.
pub fn fair_allocation(total: f64, items: &[AllocItem]) -> Vec<f64> {
    let alloc = |p: f64| -> Vec<f64> {
        items
            .iter()
            .map(|i| (p * i.target).clamp(i.lower, i.upper.max(i.lower)))
            .collect()
    };
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    let lower_sum: f64 = items.iter().map(|i| i.lower).sum();
    let upper_sum: f64 = items.iter().map(|i| i.upper.max(i.lower)).sum();
    if total <= lower_sum {
        return items.iter().map(|i| i.lower).collect();
    }
    if total >= upper_sum {
        return items.iter().map(|i| i.upper.max(i.lower)).collect();
    }
    // Σ clamp(p·t) is continuous and non-decreasing in p: bisect.
    let mut lo = 0.0_f64;
    let mut hi = 1.0_f64;
    while sum(&alloc(hi)) < total && hi < 1e18 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = (lo + hi) / 2.0;
        if sum(&alloc(mid)) < total {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    alloc(hi)
}

/// Input of one borrowing round for one level.
#[derive(Clone, Copy, Debug)]
pub struct BorrowInput {
    pub exempt: bool,
    pub limits: LevelLimits,
    pub period: DemandPeriod,
    pub smoothed: f64,
}

/// Output of one borrowing round for one level.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BorrowOutput {
    pub current: u32,
    pub smoothed: f64,
    pub target: f64,
}

/// One borrowing round: exempt levels take max(MinCL, hwm) first; the rest
/// share what is left by a fair allocation with bounds
/// [max(MinCL, min(NominalCL, hwm)), MaxCL].
pub fn borrow(nominal_sum: u32, levels: &[BorrowInput]) -> Vec<BorrowOutput> {
    let mut remaining = f64::from(nominal_sum);
    let mut out = vec![
        BorrowOutput {
            current: 0,
            smoothed: 0.0,
            target: 0.0
        };
        levels.len()
    ];
    let mut items = Vec::new();
    let mut item_index = Vec::new();
    for (i, l) in levels.iter().enumerate() {
        let smoothed = smooth_demand(l.smoothed, &l.period);
        let hwm = l.period.high_water.ceil();
        let min = f64::from(l.limits.min);
        if l.exempt {
            let current = min.max(hwm);
            remaining -= current;
            out[i] = BorrowOutput {
                current: current as u32,
                smoothed,
                target: current,
            };
            continue;
        }
        let lower = min.max(f64::from(l.limits.nominal).min(hwm));
        let target = lower.max(smoothed);
        items.push(AllocItem {
            target,
            lower,
            upper: f64::from(l.limits.max),
        });
        item_index.push(i);
        out[i] = BorrowOutput {
            current: 0,
            smoothed,
            target,
        };
    }
    let allocs = fair_allocation(remaining.max(0.0), &items);
    for (k, &i) in item_index.iter().enumerate() {
        out[i].current = round_half_away(allocs[k]).max(0) as u32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(s: u32, l: u32) -> LevelShares {
        LevelShares {
            shares: s,
            lendable_percent: l,
            borrowing_limit_percent: None,
        }
    }

    #[test]
    fn nominal_table_at_600() {
        // exempt, catch-all, system, node-high, leader-election, workload-high, workload-low, global-default
        let input = [
            shares(0, 0),
            shares(5, 0),
            shares(30, 33),
            shares(40, 25),
            shares(10, 0),
            shares(40, 50),
            shares(100, 90),
            shares(20, 50),
        ];
        let got = split(600, &input);
        let nominal: Vec<u32> = got.iter().map(|l| l.nominal).collect();
        assert_eq!(nominal, vec![0, 13, 74, 98, 25, 98, 245, 49]);
        let lendable: Vec<u32> = got.iter().map(|l| l.lendable).collect();
        // 74·33% = 24.42 → 24; 98·25% = 24.5 → 25 (half away from zero); 245·90% = 220.5 → 221.
        assert_eq!(lendable, vec![0, 0, 24, 25, 0, 49, 221, 25]);
        assert_eq!(got[6].min, 24);
        assert_eq!(got[6].max, 245 + 600);
        assert_eq!(got[6].initial_current(), 245 - 110);
        assert_eq!(got[2].initial_current(), 74 - 12);
    }

    #[test]
    fn rounding_is_half_away_from_zero() {
        assert_eq!(round_half_away(0.5), 1);
        assert_eq!(round_half_away(1.5), 2);
        assert_eq!(round_half_away(2.5), 3);
        assert_eq!(round_half_away(-2.5), -3);
        assert_eq!(round_half_away(2.4999), 2);
    }

    #[test]
    fn borrowing_limit_percent() {
        let got = split(
            100,
            &[
                LevelShares {
                    shares: 1,
                    lendable_percent: 0,
                    borrowing_limit_percent: Some(50),
                },
                shares(1, 0),
            ],
        );
        assert_eq!(
            got[0],
            LevelLimits {
                nominal: 50,
                lendable: 0,
                min: 50,
                max: 75
            }
        );
        assert_eq!(got[1].max, 150);
        assert!(split(600, &[shares(0, 0)]).iter().all(|l| l.nominal == 0));
    }

    #[tokio::test(start_paused = true)]
    async fn integrator_avg_stddev_hwm() {
        let t0 = Instant::now();
        let mut i = SeatDemandIntegrator::new(t0);
        i.set(10.0, t0);
        i.set(0.0, t0 + Duration::from_secs(5));
        let p = i.reset(t0 + Duration::from_secs(10));
        assert!((p.avg - 5.0).abs() < 1e-9);
        assert!((p.stddev - 5.0).abs() < 1e-9);
        assert_eq!(p.high_water, 10.0);
        // The new period starts at the current value (0).
        let p = i.reset(t0 + Duration::from_secs(20));
        assert_eq!(
            p,
            DemandPeriod {
                avg: 0.0,
                stddev: 0.0,
                high_water: 0.0
            }
        );
    }

    #[test]
    fn smoothing() {
        let p = DemandPeriod {
            avg: 10.0,
            stddev: 2.0,
            high_water: 20.0,
        };
        assert_eq!(smooth_demand(0.0, &p), 12.0);
        let decayed = smooth_demand(100.0, &p);
        assert!((decayed - (0.977 * 100.0 + 0.023 * 12.0)).abs() < 1e-9);
    }

    #[test]
    fn fair_allocation_respects_bounds_and_total() {
        let items = [
            AllocItem {
                target: 10.0,
                lower: 5.0,
                upper: 100.0,
            },
            AllocItem {
                target: 30.0,
                lower: 5.0,
                upper: 20.0,
            },
            AllocItem {
                target: 0.0,
                lower: 2.0,
                upper: 50.0,
            },
        ];
        let got = fair_allocation(40.0, &items);
        assert!((got.iter().sum::<f64>() - 40.0).abs() < 1e-6, "{got:?}");
        assert_eq!(got[1], 20.0); // capped at upper
        assert_eq!(got[2], 2.0); // zero target stays at lower
        assert!((got[0] - 18.0).abs() < 1e-6);
        assert_eq!(fair_allocation(1.0, &items), vec![5.0, 5.0, 2.0]);
        assert_eq!(fair_allocation(1000.0, &items), vec![100.0, 20.0, 50.0]);
    }

    #[test]
    fn borrowing_round() {
        let limits = split(100, &[shares(50, 50), shares(50, 50)]);
        // Level 0 idle, level 1 saturated with demand far above its nominal.
        let idle = DemandPeriod {
            avg: 0.0,
            stddev: 0.0,
            high_water: 0.0,
        };
        let busy = DemandPeriod {
            avg: 90.0,
            stddev: 0.0,
            high_water: 90.0,
        };
        let got = borrow(
            100,
            &[
                BorrowInput {
                    exempt: false,
                    limits: limits[0],
                    period: idle,
                    smoothed: 0.0,
                },
                BorrowInput {
                    exempt: false,
                    limits: limits[1],
                    period: busy,
                    smoothed: 0.0,
                },
            ],
        );
        // Idle level keeps MinCL = 25; the busy one gets the rest (75).
        assert_eq!(got[0].current, 25);
        assert_eq!(got[1].current, 75);
        // An exempt level takes its high-water mark off the top.
        let steady = DemandPeriod {
            avg: 90.0,
            stddev: 0.0,
            high_water: 20.0,
        };
        let ex = LevelLimits {
            nominal: 0,
            lendable: 0,
            min: 0,
            max: 100,
        };
        let got = borrow(
            100,
            &[
                BorrowInput {
                    exempt: true,
                    limits: ex,
                    period: DemandPeriod {
                        avg: 1.0,
                        stddev: 0.0,
                        high_water: 30.0,
                    },
                    smoothed: 0.0,
                },
                BorrowInput {
                    exempt: false,
                    limits: limits[0],
                    period: steady,
                    smoothed: 0.0,
                },
                BorrowInput {
                    exempt: false,
                    limits: limits[1],
                    period: steady,
                    smoothed: 0.0,
                },
            ],
        );
        assert_eq!(got[0].current, 30);
        assert_eq!(got[1].current + got[2].current, 70);
        assert_eq!(got[1].current, 35);
        // Bounds: demand of a level never lowers it below max(MinCL, min(Nominal, hwm)).
        let got = borrow(
            100,
            &[
                BorrowInput {
                    exempt: false,
                    limits: limits[0],
                    period: DemandPeriod {
                        avg: 0.0,
                        stddev: 0.0,
                        high_water: 40.0,
                    },
                    smoothed: 0.0,
                },
                BorrowInput {
                    exempt: false,
                    limits: limits[1],
                    period: busy,
                    smoothed: 0.0,
                },
            ],
        );
        assert!(got[0].current >= 40, "{got:?}");
    }
}
