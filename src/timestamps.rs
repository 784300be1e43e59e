//! Times as kube writes them (Go's `time` layouts), formatted by chrono:
//! `metav1.Time`'s second-precision form and Go's `RFC3339Nano`.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};

/// Unix seconds as `metav1.Time` writes them: UTC, whole seconds, `Z`
/// (`2024-02-29T12:34:56Z`). `None` beyond what chrono can represent.
pub fn rfc3339_secs(secs: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp(secs, 0).map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
}

/// Go's `Format(time.RFC3339Nano)`: the fraction of a second without
/// trailing zeros (none when whole), `Z` for UTC, else the offset.
pub fn rfc3339_nano<Tz: TimeZone>(t: &DateTime<Tz>) -> String
where
    Tz::Offset: std::fmt::Display,
{
    // chrono prints 3, 6 or 9 digits; Go only the significant ones.
    let text = t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
    let Some(dot) = text.find('.') else {
        return text;
    };
    let zone = text[dot..]
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or(text.len(), |i| dot + i);
    let fraction = text[dot + 1..zone].trim_end_matches('0');
    if fraction.is_empty() {
        format!("{}{}", &text[..dot], &text[zone..])
    } else {
        format!("{}.{}{}", &text[..dot], fraction, &text[zone..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::FixedOffset;

    #[test]
    fn seconds_as_metav1_time() {
        assert_eq!(rfc3339_secs(0).as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(
            rfc3339_secs(951_827_696).as_deref(),
            Some("2000-02-29T12:34:56Z")
        );
        assert_eq!(
            rfc3339_secs(-62_167_219_200).as_deref(),
            Some("0000-01-01T00:00:00Z")
        );
        assert_eq!(rfc3339_secs(i64::MAX), None);
    }

    #[test]
    fn nano_drops_trailing_zeros_as_go_does() {
        let at = |secs, nanos| DateTime::<Utc>::from_timestamp(secs, nanos).expect("time");
        assert_eq!(rfc3339_nano(&at(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_nano(&at(1_700_000_000, 120_000_000)),
            "2023-11-14T22:13:20.12Z"
        );
        assert_eq!(rfc3339_nano(&at(1, 1)), "1970-01-01T00:00:01.000000001Z");
        assert_eq!(rfc3339_nano(&at(1, 500_000)), "1970-01-01T00:00:01.0005Z");
        let plus_one = FixedOffset::east_opt(3600).expect("offset");
        assert_eq!(
            rfc3339_nano(&at(0, 250_000_000).with_timezone(&plus_one)),
            "1970-01-01T01:00:00.25+01:00"
        );
        assert_eq!(
            rfc3339_nano(&at(0, 0).with_timezone(&plus_one)),
            "1970-01-01T01:00:00+01:00"
        );
    }
}
