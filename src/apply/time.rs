//! managedFields timestamps: RFC 3339 as Go's `time.RFC3339` reads it, and
//! `metav1.Time`'s second-precision UTC form, over unix seconds; the
//! calendar is chrono's.

use chrono::NaiveDate;

/// Unix seconds at the start of a day; `None` for a day that does not exist.
fn day_start(y: i64, m: i64, d: i64) -> Option<i64> {
    let date = NaiveDate::from_ymd_opt(
        i32::try_from(y).ok()?,
        u32::try_from(m).ok()?,
        u32::try_from(d).ok()?,
    )?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp())
}

/// Parses RFC 3339 (as Go's `time.RFC3339` accepts) into unix seconds.
pub(super) fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d, h, mi, se) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 59 {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let off = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if *sign == b'+' {
                off
            } else {
                -off
            }
        }
        _ => return None,
    };
    let secs = day_start(y, mo, d)? + h * 3600 + mi * 60 + se - offset;
    // An offset can move the instant out of years 0000-9999, which
    // format_time could not write in a form this function reads back.
    let first = day_start(0, 1, 1)?;
    let last = day_start(9999, 12, 31)? + 86_399;
    (first..=last).contains(&secs).then_some(secs)
}

/// Formats unix seconds as kube writes `metav1.Time`: UTC, second precision.
/// Every time `parse_time` gives lies within years 0000-9999.
pub(super) fn format_time(secs: i64) -> String {
    crate::timestamps::rfc3339_secs(secs).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trip() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        let t = parse_time("2024-02-29T12:34:56Z").expect("time");
        assert_eq!(format_time(t), "2024-02-29T12:34:56Z");
        assert_eq!(parse_time("2024-02-29T14:34:56.123+02:00"), Some(t));
        assert_eq!(parse_time("2024-02-29 12:34:56Z"), None);
        // Days a month does not have, as Go's time.Parse refuses them.
        assert_eq!(parse_time("2023-02-29T00:00:00Z"), None);
        assert_eq!(parse_time("2024-04-31T00:00:00Z"), None);
        assert_eq!(
            format_time(parse_time("2024-12-31T23:59:59Z").expect("time")),
            "2024-12-31T23:59:59Z"
        );
        // The years format_time can write, whatever the offset.
        assert_eq!(parse_time("0000-01-01T00:30:00+01:00"), None);
        assert_eq!(
            format_time(parse_time("0000-01-01T00:00:00Z").expect("time")),
            "0000-01-01T00:00:00Z"
        );
        assert_eq!(parse_time("9999-12-31T23:30:00-01:00"), None);
    }
}
