//! Units as flags and clients write them: durations (`500ms`, `5m`, Go's
//! `1m0s`) and sizes (`64Mi`). One place, so every flag and query option
//! reads them alike.

use std::time::Duration;

/// Durations as the flags take them: `500ms`, `10s` (or a bare number of
/// seconds), `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}"))
}

/// A Go `time.Duration` string as clients send it (`?timeout=1m0s`, `30s`,
/// `1.5h`, `250ms`): one or more number-and-unit pairs, units ns, us, µs,
/// ms, s, m, h.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?}");
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * secs;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// Sizes as the flags take them: `1048576`, `512Ki`, `64Mi`, `1Gi`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.get(s.len().saturating_sub(2)..) {
        Some("Ki") => (&s[..s.len() - 2], 1u64 << 10),
        Some("Mi") => (&s[..s.len() - 2], 1 << 20),
        Some("Gi") => (&s[..s.len() - 2], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?} (bytes, or a number with Ki, Mi or Gi)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1m0s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "soon", "5", "s", "1d", "-1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("2Gi"), Ok(2 << 30));
        assert!(parse_bytes("Mi").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999999Gi").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("1e400").is_err());
    }
}
