//! Text of the `/debug/api_priority_and_fairness/dump_*` endpoints in
//! kube's layout: cells joined by ",\t" and aligned like Go's
//! `tabwriter.NewWriter(w, 8, 0, 1, ' ', 0)`; the `Apf::dump_*` methods
//! that fill them are at the end.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use super::apf::Apf;

pub const PRIORITY_LEVEL_HEADERS: [&str; 10] = [
    "PriorityLevelName",
    "ActiveQueues",
    "IsIdle",
    "IsQuiescing",
    "WaitingRequests",
    "ExecutingRequests",
    "DispatchedRequests",
    "RejectedRequests",
    "TimedoutRequests",
    "CancelledRequests",
];

pub const QUEUE_HEADERS: [&str; 9] = [
    "PriorityLevelName",
    "Index",
    "PendingRequests",
    "ExecutingRequests",
    "SeatsInUse",
    "NextDispatchR",
    "InitialSeatsSum",
    "MaxSeatsSum",
    "TotalWorkSum",
];

pub const REQUEST_HEADERS: [&str; 10] = [
    "PriorityLevelName",
    "FlowSchemaName",
    "QueueIndex",
    "RequestIndexInQueue",
    "FlowDistingsher",
    "ArriveTime",
    "InitialSeats",
    "FinalSeats",
    "AdditionalLatency",
    "StartTime",
];

pub const REQUEST_DETAIL_HEADERS: [&str; 8] = [
    "UserName",
    "Verb",
    "APIPath",
    "Namespace",
    "Name",
    "APIVersion",
    "Resource",
    "SubResource",
];

/// Go tabwriter with minwidth 8, tabwidth 0, padding 1, pad ' ', no flags.
/// Each line is a list of cells; all but the last are tab-terminated.
pub fn tabwrite(lines: &[Vec<String>]) -> String {
    let mut out = String::new();
    let mut widths = Vec::new();
    format_block(&mut out, lines, &mut widths, 0, lines.len());
    out
}

const MIN_WIDTH: usize = 8;
const PADDING: usize = 1;

fn format_block(
    out: &mut String,
    lines: &[Vec<String>],
    widths: &mut Vec<usize>,
    mut line0: usize,
    line1: usize,
) {
    let column = widths.len();
    let mut this = line0;
    while this < line1 {
        if column + 1 >= lines[this].len() {
            this += 1;
            continue;
        }
        // A column block starts here: print the lines before it.
        write_lines(out, lines, widths, line0, this);
        line0 = this;
        let mut width = MIN_WIDTH;
        while this < line1 && column + 1 < lines[this].len() {
            width = width.max(lines[this][column].chars().count() + PADDING);
            this += 1;
        }
        widths.push(width);
        format_block(out, lines, widths, line0, this);
        widths.pop();
        line0 = this;
    }
    write_lines(out, lines, widths, line0, line1);
}

fn write_lines(out: &mut String, lines: &[Vec<String>], widths: &[usize], from: usize, to: usize) {
    for line in &lines[from..to] {
        for (j, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if j < widths.len() && j + 1 < line.len() {
                let pad = widths[j].saturating_sub(cell.chars().count());
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
}

/// Splits a row as kube writes it (`strings.Join(cols, ",\t")`) into
/// tabwriter cells: every cell but the last carries its trailing comma.
pub fn row<S: AsRef<str>>(columns: &[S]) -> Vec<String> {
    let n = columns.len();
    columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if i + 1 < n {
                format!("{},", c.as_ref())
            } else {
                c.as_ref().to_string()
            }
        })
        .collect()
}

/// Go's `time.Duration.String()`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = nanos / 1_000_000_000;
    let frac = nanos % 1_000_000_000;
    let (h, m, s) = (total_secs / 3600, (total_secs / 60) % 60, total_secs % 60);
    let secs = trim_fraction(u128::from(s as u64) * 1_000_000_000 + frac, 1_000_000_000);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h{m}m");
    } else if m > 0 {
        let _ = write!(out, "{m}m");
    }
    let _ = write!(out, "{secs}s");
    out
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = unit.to_string().len() - 1;
    let s = format!("{frac:0digits$}");
    format!("{whole}.{}", s.trim_end_matches('0'))
}

/// Go's `t.UTC().Format(time.RFC3339Nano)`.
pub fn rfc3339_nano(t: SystemTime) -> String {
    crate::timestamps::rfc3339_nano(&chrono::DateTime::<chrono::Utc>::from(t))
}

/// Seat-seconds the way kube prints them: 8 decimals and "ss".
pub fn seat_seconds(v: f64) -> String {
    // kube stores seat-seconds as fixed point with 1e8 scale.
    let fixed = (v.max(0.0) * 1e8).round() as u128;
    format!("{}.{:08}ss", fixed / 100_000_000, fixed % 100_000_000)
}

impl Apf {
    /// `/debug/api_priority_and_fairness/dump_priority_levels`.
    pub fn dump_priority_levels(&self) -> String {
        let st = self.lock();
        let mut lines = vec![row(&PRIORITY_LEVEL_HEADERS)];
        for l in st.levels.values() {
            let active =
                l.qs.queues()
                    .iter()
                    .filter(|q| !q.waiting.is_empty())
                    .count();
            let c = l.qs.counters;
            lines.push(row(&[
                l.name.to_string(),
                active.to_string(),
                l.qs.is_idle().to_string(),
                l.quiescing.to_string(),
                l.qs.waiting.to_string(),
                l.qs.executing.to_string(),
                c.dispatched.to_string(),
                c.rejected.to_string(),
                c.timed_out.to_string(),
                c.cancelled.to_string(),
            ]));
        }
        tabwrite(&lines)
    }

    /// `/debug/api_priority_and_fairness/dump_queues`. Levels without queues
    /// (exempt, Reject) show one row of `<none>`.
    pub fn dump_queues(&self) -> String {
        let st = self.lock();
        let mut lines = vec![row(&QUEUE_HEADERS)];
        for l in st.levels.values() {
            if l.qs.queues().is_empty() {
                let mut cells = vec![l.name.to_string()];
                cells.extend(std::iter::repeat_n("<none>".to_string(), 8));
                lines.push(row(&cells));
                continue;
            }
            for (i, q) in l.qs.queues().iter().enumerate() {
                lines.push(row(&[
                    l.name.to_string(),
                    i.to_string(),
                    q.waiting.len().to_string(),
                    q.executing.to_string(),
                    q.seats_in_use.to_string(),
                    seat_seconds(q.next_dispatch_r),
                    q.initial_seats_sum.to_string(),
                    q.max_seats_sum.to_string(),
                    seat_seconds(q.total_work_sum),
                ]));
            }
        }
        tabwrite(&lines)
    }

    /// `/debug/api_priority_and_fairness/dump_requests[?includeRequestDetails=1]`:
    /// one row per waiting request; StartTime is `<none>` because a waiting
    /// request has not started.
    pub fn dump_requests(&self, include_details: bool) -> String {
        let st = self.lock();
        let mut header: Vec<&str> = REQUEST_HEADERS.to_vec();
        if include_details {
            header.extend(REQUEST_DETAIL_HEADERS);
        }
        let mut lines = vec![row(&header)];
        for l in st.levels.values() {
            for (qi, q) in l.qs.queues().iter().enumerate() {
                for (ri, r) in q.waiting.iter().enumerate() {
                    let mut cells = vec![
                        l.name.to_string(),
                        r.flow_schema.to_string(),
                        qi.to_string(),
                        ri.to_string(),
                        r.distinguisher.clone(),
                        rfc3339_nano(r.arrive_wall),
                        r.work.initial_seats.to_string(),
                        r.work.final_seats.to_string(),
                        go_duration(r.work.additional_latency),
                        "<none>".to_string(),
                    ];
                    if include_details {
                        let d = &r.digest;
                        let gv = if d.api_group.is_empty() {
                            d.api_version.clone()
                        } else {
                            format!("{}/{}", d.api_group, d.api_version)
                        };
                        cells.extend([
                            d.user.clone(),
                            d.verb.clone(),
                            d.path.clone(),
                            d.namespace.clone(),
                            d.name.clone(),
                            gv,
                            d.resource.clone(),
                            d.subresource.clone(),
                        ]);
                    }
                    lines.push(row(&cells));
                }
            }
        }
        tabwrite(&lines)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::flowcontrol::estimator::EstimateInputs;
    use std::future::pending;

    #[test]
    fn tabwriter_aligns_like_go() {
        let lines = vec![
            row(&["PriorityLevelName", "ActiveQueues", "IsIdle"]),
            row(&["exempt", "0", "true"]),
        ];
        let got = tabwrite(&lines);
        // Column width = max(cell)+1, at least 8; the last cell is not padded.
        assert_eq!(
            got,
            "PriorityLevelName, ActiveQueues, IsIdle\nexempt,            0,            true\n"
        );
    }

    #[test]
    fn tabwriter_blocks_follow_cell_counts() {
        // A line with fewer cells ends the column block, like Go.
        let lines = vec![
            vec!["a".to_string(), "b".into()],
            vec!["only".into()],
            vec!["ccccccccccc".into(), "d".into()],
        ];
        assert_eq!(tabwrite(&lines), "a       b\nonly\nccccccccccc d\n");
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_millis(5)), "5ms");
        assert_eq!(go_duration(Duration::from_micros(62_500)), "62.5ms");
        assert_eq!(go_duration(Duration::from_micros(1)), "1µs");
        assert_eq!(go_duration(Duration::from_nanos(15)), "15ns");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
    }

    #[test]
    fn timestamps() {
        use std::time::UNIX_EPOCH;
        assert_eq!(rfc3339_nano(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 120_000_000);
        assert_eq!(rfc3339_nano(t), "2023-11-14T22:13:20.12Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_nano(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn seat_seconds_format() {
        assert_eq!(seat_seconds(0.0), "0.00000000ss");
        assert_eq!(seat_seconds(0.018), "0.01800000ss");
        assert_eq!(seat_seconds(12.5), "12.50000000ss");
    }

    #[tokio::test(start_paused = true)]
    async fn dumps_have_kube_columns() {
        let apf = apf_with(level("test", 1, Some((2, 1, 10))));
        let _held = futures_join(&apf, 4).await;
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("w"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        let levels = apf.dump_priority_levels();
        let first = levels.lines().next().unwrap();
        assert!(
            first.starts_with(
                "PriorityLevelName, ActiveQueues, IsIdle, IsQuiescing, WaitingRequests,"
            ),
            "{first}"
        );
        assert!(
            levels
                .lines()
                .any(|l| l.starts_with("test,") && l.split(",").nth(4).unwrap().trim() == "1"),
            "{levels}"
        );
        let queues = apf.dump_queues();
        assert!(queues.starts_with("PriorityLevelName, Index,  PendingRequests, ExecutingRequests, SeatsInUse, NextDispatchR,"), "{queues}");
        assert!(queues
            .lines()
            .any(|l| l.starts_with("exempt,") && l.contains("<none>")));
        let reqs = apf.dump_requests(false);
        let lines: Vec<&str> = reqs.lines().collect();
        assert_eq!(lines.len(), 2, "{reqs}");
        assert!(lines[0].ends_with("AdditionalLatency, StartTime"), "{reqs}");
        let cells: Vec<&str> = lines[1].split(",\t").collect();
        let cells: Vec<&str> = if cells.len() > 1 {
            cells
        } else {
            lines[1].split(',').map(str::trim).collect()
        };
        assert_eq!(&cells[..5], &["test", "test", "0", "0", "w"], "{reqs}");
        assert_eq!(&cells[6..], &["1", "0", "0s", "<none>"], "{reqs}");
        let detailed = apf.dump_requests(true);
        assert!(
            detailed
                .lines()
                .next()
                .unwrap()
                .ends_with("APIVersion, Resource, SubResource"),
            "{detailed}"
        );
        assert!(detailed
            .lines()
            .nth(1)
            .unwrap()
            .contains("/api/v1/namespaces/default/pods/p"));
        waiter.abort();
    }
}
