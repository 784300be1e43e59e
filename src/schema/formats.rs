//! The string formats kube validates for CRDs (kube-openapi's strfmt registry, after
//! apiextensions strips the unsupported ones). Approximations are noted where Go's
//! parsers are looser or stricter than a regex.

use base64::Engine;
use std::sync::OnceLock;

fn re(cell: &'static OnceLock<Option<regex::Regex>>, pat: &str) -> Option<&'static regex::Regex> {
    cell.get_or_init(|| regex::Regex::new(pat).ok()).as_ref()
}

macro_rules! matches_re {
    ($pat:expr, $s:expr) => {{
        static CELL: OnceLock<Option<regex::Regex>> = OnceLock::new();
        re(&CELL, $pat).is_some_and(|r| r.is_match($s))
    }};
}

/// Whether `s` is valid for the (normalised) format `format`.
pub fn is_valid(format: &str, s: &str) -> bool {
    match format {
        "bsonobjectid" => s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => is_request_uri(s),
        "email" => {
            matches_re!(r"^[^@\s<>]+@[^@\s<>]+$", s)
                || matches_re!(r"^[^<>]*<[^@\s<>]+@[^@\s<>]+>$", s)
        }
        "hostname" => is_hostname(s),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        // Go's net.ParseIP accepts IPv4 too; strfmt only checks ParseIP succeeds.
        "ipv6" => s.parse::<std::net::IpAddr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => matches_re!(
            r"^([0-9A-Fa-f]{2}([:-])){5}[0-9A-Fa-f]{2}$|^([0-9A-Fa-f]{2}([:-])){7}[0-9A-Fa-f]{2}$|^([0-9A-Fa-f]{2}([:-])){19}[0-9A-Fa-f]{2}$|^([0-9A-Fa-f]{4}\.){2}[0-9A-Fa-f]{4}$|^([0-9A-Fa-f]{4}\.){3}[0-9A-Fa-f]{4}$|^([0-9A-Fa-f]{4}\.){9}[0-9A-Fa-f]{4}$",
            s
        ),
        "uuid" => matches_re!(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s
        ),
        "uuid3" => matches_re!(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$",
            s
        ),
        "uuid4" => matches_re!(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s
        ),
        "uuid5" => matches_re!(
            r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$",
            s
        ),
        "isbn" => is_isbn10(s) || is_isbn13(s),
        "isbn10" => is_isbn10(s),
        "isbn13" => is_isbn13(s),
        "creditcard" => {
            let digits: String = s.chars().filter(char::is_ascii_digit).collect();
            matches_re!(
                r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11})$",
                &digits
            )
        }
        "ssn" => matches_re!(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$", s),
        "hexcolor" => matches_re!(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$", s),
        "rgbcolor" => matches_re!(
            r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$",
            s
        ),
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "password" => true,
        "date" => chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() && s.len() == 10,
        "duration" => is_duration(s),
        "datetime" => is_datetime(s),
        "k8s-short-name" => is_dns1123_label(s),
        "k8s-long-name" => is_dns1123_subdomain(s),
        _ => true,
    }
}

/// Go's `url.ParseRequestURI`: an absolute URI or an absolute path, no fragment.
fn is_request_uri(s: &str) -> bool {
    if s.is_empty() || s.contains(char::is_whitespace) {
        return false;
    }
    if s.starts_with('/') {
        return true;
    }
    matches_re!(r"^[A-Za-z][A-Za-z0-9+.-]*:[^#]*(#.*)?$", s)
}

/// strfmt's hostname regex, spelled out (with `{0,63}` over Unicode classes the regex
/// would exceed the regex crate's size limit): dot-separated labels that start with a
/// letter, digit or symbol and continue with those or `-`, 255 bytes at most.
fn is_hostname(s: &str) -> bool {
    if s.is_empty() || s.len() > 255 {
        return false;
    }
    let body = s.strip_suffix('.').unwrap_or(s);
    let ok_char = |c: char| c.is_alphanumeric() || is_symbol(c);
    body.split('.').all(|label| {
        let mut chars = label.chars();
        match chars.next() {
            Some(c) if ok_char(c) => {}
            _ => return false,
        }
        let rest: Vec<char> = chars.collect();
        rest.len() <= 63 && rest.iter().all(|&c| ok_char(c) || c == '-')
    })
}

fn is_symbol(c: char) -> bool {
    matches_re!(r"^\p{S}$", c.encode_utf8(&mut [0u8; 4]))
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => bits <= 32,
        Ok(std::net::IpAddr::V6(_)) => bits <= 128,
        Err(_) => false,
    }
}

fn is_isbn10(s: &str) -> bool {
    let c: Vec<char> = s.chars().filter(|c| *c != '-' && *c != ' ').collect();
    if c.len() != 10 {
        return false;
    }
    let mut sum = 0;
    for (i, ch) in c.iter().enumerate() {
        let v = match ch.to_digit(10) {
            Some(d) => d,
            None if i == 9 && (*ch == 'X' || *ch == 'x') => 10,
            None => return false,
        };
        sum += (10 - i as u32) * v;
    }
    sum.is_multiple_of(11)
}

fn is_isbn13(s: &str) -> bool {
    let c: Vec<u32> = s
        .chars()
        .filter(|c| *c != '-' && *c != ' ')
        .map(|c| c.to_digit(10).unwrap_or(99))
        .collect();
    if c.len() != 13 || c.contains(&99) {
        return false;
    }
    let sum: u32 = c
        .iter()
        .enumerate()
        .map(|(i, d)| if i % 2 == 0 { *d } else { d * 3 })
        .sum();
    sum.is_multiple_of(10)
}

/// strfmt's duration: Go `time.ParseDuration`, or its own `<n> <unit>` form.
fn is_duration(s: &str) -> bool {
    matches_re!(
        r"^([+-]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$|^0$",
        s
    ) || matches_re!(
        r"^[+-]?\d+\s*(ns|nano|nanos|nanosecond|nanoseconds|us|µs|micro|micros|microsecond|microseconds|ms|milli|millis|millisecond|milliseconds|s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hrs|hour|hours|d|day|days|w|wk|wks|week|weeks)$",
        s
    )
}

/// strfmt's date-time: RFC 3339 (with or without fractional seconds), also lower-case
/// `t`/`z` and a space is not accepted.
fn is_datetime(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
        || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
}

pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && matches_re!(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", s)
}

pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && matches_re!(
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
            s
        )
}

/// The DNS-1035 label pattern alone (kube reports the length separately).
pub fn matches_dns1035(s: &str) -> bool {
    matches_re!(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_table() {
        let cases = [
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "nope", false),
            ("datetime", "2024-01-02T03:04:05Z", true),
            ("datetime", "2024-01-02T03:04:05.123+02:00", true),
            ("datetime", "yesterday", false),
            ("date", "2024-02-29", true),
            ("date", "2023-02-29", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "!!", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "10.0.0.300", false),
            ("ipv6", "::1", true),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "10.0.0.0/33", false),
            ("mac", "00:1a:2b:3c:4d:5e", true),
            ("hostname", "example.com", true),
            ("hostname", "-bad", false),
            ("uri", "https://example.com/x", true),
            ("uri", "not a uri", false),
            ("email", "a@b.c", true),
            ("email", "nope", false),
            ("duration", "1h30m", true),
            ("duration", "3 days", true),
            ("duration", "soon", false),
            ("bsonobjectid", "507f1f77bcf86cd799439011", true),
            ("hexcolor", "#fff", true),
            ("rgbcolor", "rgb(1,2,3)", true),
            ("isbn10", "0321751043", true),
            ("isbn13", "978-0321751041", true),
            ("k8s-short-name", "my-name", true),
            ("k8s-short-name", "My", false),
            ("k8s-long-name", "a.b-c", true),
            ("password", "anything", true),
        ];
        for (f, s, ok) in cases {
            assert_eq!(is_valid(f, s), ok, "{f} {s}");
        }
    }
}
