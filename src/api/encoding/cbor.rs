// Kept whole: one codec (encoder, decoder and their shared rules), and 400 of its lines are its tests.
//! CBOR encoding (`application/cbor`, `application/cbor-seq`) with
//! kube-apiserver's rules (k8s.io/apimachinery `pkg/runtime/serializer/cbor`).
//!
//! Encoding, as kube's serializer writes unstructured content:
//! - every body starts with the self-described CBOR tag 55799 (`d9 d9 f7`),
//!   which kube also uses as the magic number to recognise CBOR;
//! - strings *and map keys* are CBOR byte strings (major type 2), not text
//!   strings: kube sets `String: StringToByteString` and validates UTF-8 only
//!   when decoding text strings;
//! - map entries are sorted bytewise by their encoded keys (RFC 8949 §4.2.1
//!   core deterministic encoding), which for short keys means shorter first;
//! - integers use the shortest head; floats the shortest of float16, float32
//!   and float64 that preserves the value; `null` is `f6`.
//!
//! Decoding accepts what kube's decoder accepts into `interface{}`: with or
//! without tag 55799 (any unrecognised tag is transparent), text or byte
//! strings, definite or indefinite lengths. It rejects duplicate map keys
//! (a byte string and a text string with the same content are duplicates),
//! non-string map keys, invalid UTF-8 in text strings, integers outside
//! int64, NaN and infinities, bignum tags, simple values other than
//! false/true/null, and trailing bytes. Time tags 0 and 1 become RFC 3339
//! strings; byte strings under the "expected later encoding" tags 21/22/23
//! become base64url/base64/base16 text.
//!
//! Deliberate differences from kube, forced by `serde_json::Value`:
//! - a byte string that is not valid UTF-8 is converted lossily (U+FFFD);
//!   kube keeps the raw bytes in a Go string and its JSON output then shows
//!   U+FFFD as well;
//! - nesting is limited to [`MAX_NESTING`] arrays/maps, the depth kshard's JSON
//!   parser (serde_json) accepts, so that nothing accepted as CBOR becomes
//!   unreadable as stored JSON. Kube allows 10000 levels.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::{Map, Number, Value};

/// Media type of single CBOR bodies.
pub const MEDIA_TYPE: &str = "application/cbor";
/// Media type of CBOR watch streams (RFC 8742 sequences).
pub const SEQ_MEDIA_TYPE: &str = "application/cbor-seq";
/// Head of tag 55799, "self-described CBOR"; prefixes everything kube writes.
pub const SELF_DESCRIBED: [u8; 3] = [0xd9, 0xd9, 0xf7];
/// Deepest array/map nesting accepted by [`from_cbor`]; equal to what
/// serde_json's default recursion limit accepts for JSON bodies.
pub const MAX_NESTING: usize = 127;

const TAG_RFC3339: u64 = 0;
const TAG_EPOCH: u64 = 1;
const TAG_BIGNUM_POS: u64 = 2;
const TAG_BIGNUM_NEG: u64 = 3;
const TAG_LATER_BASE64URL: u64 = 21;
const TAG_LATER_BASE64: u64 = 22;
const TAG_LATER_BASE16: u64 = 23;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CborError {
    #[error("cbor: unexpected end of input")]
    UnexpectedEof,
    #[error("cbor: {len} bytes of extraneous data starting at index {offset}")]
    ExtraneousData { len: usize, offset: usize },
    #[error("cbor: malformed input at index {offset}: {message}")]
    Malformed { offset: usize, message: String },
    #[error("cbor: invalid UTF-8 string")]
    InvalidUtf8,
    #[error("cbor: found duplicate map key {0:?}")]
    DuplicateMapKey(String),
    #[error("cbor: map key must be a string, got {0}")]
    NonStringMapKey(&'static str),
    #[error("cbor: integer {0} overflows int64")]
    IntegerOverflow(String),
    #[error("cbor: floating-point {0} is not accepted")]
    NonFiniteFloat(&'static str),
    #[error("cbor: simple value {0} is not recognized")]
    UnrecognizedSimpleValue(u8),
    #[error("cbor: bignum tags are not accepted")]
    Bignum,
    #[error("cbor: tag number {tag} must be followed by {expected}")]
    InadmissibleTagContent { tag: u64, expected: &'static str },
    #[error("cbor: invalid time: {0}")]
    InvalidTime(String),
    #[error("cbor: exceeded max nested level {0}")]
    NestingTooDeep(usize),
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

/// Encodes a JSON value the way kube's CBOR serializer encodes unstructured
/// content, including the self-described tag prefix.
pub fn to_cbor(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&SELF_DESCRIBED);
    encode_value(v, &mut out);
    out
}

/// One item of an `application/cbor-seq` watch stream. CBOR items delimit
/// themselves, so a frame is just the item; kube's framer adds nothing.
///
/// For a watch event (`{"type": .., "object": ..}` and nothing else) the
/// object is written with its own self-described tag, as kube does: it
/// encodes the object separately and embeds those bytes as the event's
/// `RawExtension`.
pub fn cbor_seq_frame(v: &Value) -> Vec<u8> {
    let Value::Object(map) = v else {
        return to_cbor(v);
    };
    let (Some(event_type @ Value::String(_)), Some(object), 2) =
        (map.get("type"), map.get("object"), map.len())
    else {
        return to_cbor(v);
    };
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&SELF_DESCRIBED);
    write_head(&mut out, 5, 2);
    // "type" sorts before "object": its encoded key is shorter.
    encode_str("type", &mut out);
    encode_value(event_type, &mut out);
    encode_str("object", &mut out);
    out.extend_from_slice(&SELF_DESCRIBED);
    encode_value(object, &mut out);
    out
}

fn write_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if let Ok(a) = u8::try_from(arg) {
        out.extend_from_slice(&[m | 24, a]);
    } else if let Ok(a) = u16::try_from(arg) {
        out.push(m | 25);
        out.extend_from_slice(&a.to_be_bytes());
    } else if let Ok(a) = u32::try_from(arg) {
        out.push(m | 26);
        out.extend_from_slice(&a.to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

fn encode_str(s: &str, out: &mut Vec<u8>) {
    write_head(out, 2, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(0xf6),
        Value::Bool(false) => out.push(0xf4),
        Value::Bool(true) => out.push(0xf5),
        Value::Number(n) => encode_number(n, out),
        Value::String(s) => encode_str(s, out),
        Value::Array(items) => {
            write_head(out, 4, items.len() as u64);
            for item in items {
                encode_value(item, out);
            }
        }
        Value::Object(map) => {
            let mut entries: Vec<(Vec<u8>, &Value)> = map
                .iter()
                .map(|(k, v)| {
                    let mut key = Vec::with_capacity(k.len() + 2);
                    encode_str(k, &mut key);
                    (key, v)
                })
                .collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            write_head(out, 5, entries.len() as u64);
            for (key, value) in entries {
                out.extend_from_slice(&key);
                encode_value(value, out);
            }
        }
    }
}

fn encode_number(n: &Number, out: &mut Vec<u8>) {
    if let Some(i) = n.as_i64() {
        if i >= 0 {
            write_head(out, 0, i as u64);
        } else {
            // -1 - i, computed without overflow for i64::MIN.
            write_head(out, 1, !(i as u64));
        }
    } else if let Some(u) = n.as_u64() {
        write_head(out, 0, u);
    } else if let Some(f) = n.as_f64() {
        encode_float(f, out);
    }
}

/// Shortest float width that preserves the value (kube: `ShortestFloat16`).
fn encode_float(f: f64, out: &mut Vec<u8>) {
    if let Some(half) = f16_exact(f) {
        out.push(0xf9);
        out.extend_from_slice(&half.to_be_bytes());
    } else if f64::from(f as f32).to_bits() == f.to_bits() {
        out.push(0xfa);
        out.extend_from_slice(&(f as f32).to_be_bytes());
    } else {
        out.push(0xfb);
        out.extend_from_slice(&f.to_be_bytes());
    }
}

/// The IEEE 754 half-precision bits of `f` if `f` is exactly representable
/// (finite values only; serde_json cannot hold NaN or infinities).
fn f16_exact(f: f64) -> Option<u16> {
    let bits = f.to_bits();
    let sign = ((bits >> 63) as u16) << 15;
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let mantissa = bits & ((1 << 52) - 1);
    if biased == 0 {
        // Zero stays zero; float64 subnormals are far below float16's range.
        return (mantissa == 0).then_some(sign);
    }
    let exp = biased - 1023;
    if (-14..=15).contains(&exp) {
        // Normal half: 10 mantissa bits, so the low 42 must be zero.
        if mantissa & ((1 << 42) - 1) != 0 {
            return None;
        }
        return Some(sign | (((exp + 15) as u16) << 10) | (mantissa >> 42) as u16);
    }
    if (-24..-14).contains(&exp) {
        // Subnormal half: value = k * 2^-24 with k < 1024.
        let significand = (1u64 << 52) | mantissa;
        let shift = (28 - exp) as u32;
        if significand & ((1 << shift) - 1) != 0 {
            return None;
        }
        return Some(sign | (significand >> shift) as u16);
    }
    None
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

/// Decodes one CBOR data item (a request body) into JSON form.
pub fn from_cbor(bytes: &[u8]) -> Result<Value, CborError> {
    let mut d = Decoder {
        data: bytes,
        off: 0,
    };
    let v = d.item(0, None)?;
    if d.off != bytes.len() {
        return Err(CborError::ExtraneousData {
            len: bytes.len() - d.off,
            offset: d.off,
        });
    }
    Ok(v)
}

/// Text encoding announced by tags 21-23 for the byte strings they enclose.
#[derive(Clone, Copy)]
enum LaterEncoding {
    Base64Url,
    Base64,
    Base16,
}

#[derive(Clone, Copy)]
struct Head {
    major: u8,
    info: u8,
    /// The argument; meaningless when `indefinite`.
    arg: u64,
    indefinite: bool,
}

struct Decoder<'a> {
    data: &'a [u8],
    off: usize,
}

impl Decoder<'_> {
    fn malformed(&self, message: impl Into<String>) -> CborError {
        CborError::Malformed {
            offset: self.off,
            message: message.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], CborError> {
        let end = self
            .off
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or(CborError::UnexpectedEof)?;
        let s = &self.data[self.off..end];
        self.off = end;
        Ok(s)
    }

    fn peek(&self) -> Result<u8, CborError> {
        self.data
            .get(self.off)
            .copied()
            .ok_or(CborError::UnexpectedEof)
    }

    /// Consumes a break code if one is next.
    fn at_break(&mut self) -> Result<bool, CborError> {
        if self.peek()? == 0xff {
            self.off += 1;
            return Ok(true);
        }
        Ok(false)
    }

    fn head(&mut self) -> Result<Head, CborError> {
        let initial = self.peek()?;
        let (major, info) = (initial >> 5, initial & 0x1f);
        self.off += 1;
        let arg = match info {
            0..=23 => u64::from(info),
            24 => {
                let v = u64::from(self.take(1)?[0]);
                if major == 7 && v < 32 {
                    return Err(self.malformed(format!("invalid simple value {v}")));
                }
                v
            }
            25 => {
                let b = self.take(2)?;
                u64::from(u16::from_be_bytes([b[0], b[1]]))
            }
            26 => {
                let b = self.take(4)?;
                u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            }
            27 => {
                let b = self.take(8)?;
                u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
            }
            28..=30 => {
                return Err(self.malformed(format!("invalid additional information {info}")));
            }
            _ => match major {
                2..=5 => {
                    return Ok(Head {
                        major,
                        info,
                        arg: 0,
                        indefinite: true,
                    })
                }
                7 => return Err(self.malformed("unexpected \"break\" code")),
                _ => {
                    return Err(self.malformed(format!(
                        "invalid additional information 31 for major type {major}"
                    )))
                }
            },
        };
        Ok(Head {
            major,
            info,
            arg,
            indefinite: false,
        })
    }

    /// One data item, including any tags in front of it. Tags are read in a
    /// loop rather than by recursion so a long chain cannot exhaust the stack.
    fn item(&mut self, depth: usize, later: Option<LaterEncoding>) -> Result<Value, CborError> {
        let mut tags = Vec::new();
        let mut head = self.head()?;
        while head.major == 6 {
            let tag = head.arg;
            head = self.head()?;
            check_tag_content(tag, &head)?;
            tags.push(tag);
        }
        // The innermost expected-later-encoding tag governs nested byte strings.
        let later = tags
            .iter()
            .rev()
            .find_map(|&t| match t {
                TAG_LATER_BASE64URL => Some(LaterEncoding::Base64Url),
                TAG_LATER_BASE64 => Some(LaterEncoding::Base64),
                TAG_LATER_BASE16 => Some(LaterEncoding::Base16),
                _ => None,
            })
            .or(later);
        let value = self.content(head, depth, later)?;
        // check_tag_content guarantees time tags sit directly on their content,
        // so only the innermost tag can be 0 or 1; other tags are transparent.
        match tags.last() {
            Some(&TAG_RFC3339) => rfc3339_tag(&value),
            Some(&TAG_EPOCH) => epoch_tag(&value),
            _ => Ok(value),
        }
    }

    fn content(
        &mut self,
        head: Head,
        depth: usize,
        later: Option<LaterEncoding>,
    ) -> Result<Value, CborError> {
        match head.major {
            0 => i64::try_from(head.arg)
                .map(Value::from)
                .map_err(|_| CborError::IntegerOverflow(head.arg.to_string())),
            1 => i64::try_from(head.arg)
                .map(|n| Value::from(!n))
                .map_err(|_| CborError::IntegerOverflow(format!("-1-{}", head.arg))),
            2 => {
                let bytes = self.string_bytes(head, false)?;
                Ok(Value::String(bytes_to_string(bytes, later)))
            }
            3 => {
                let bytes = self.string_bytes(head, true)?;
                // Chunks were validated one by one; the concatenation is valid.
                String::from_utf8(bytes)
                    .map(Value::String)
                    .map_err(|_| CborError::InvalidUtf8)
            }
            4 => self.array(head, depth + 1, later),
            5 => self.map(head, depth + 1, later),
            _ => simple_or_float(head),
        }
    }

    /// Bytes of a definite or indefinite byte/text string. Text chunks are
    /// each checked for UTF-8, as kube's decoder does.
    fn string_bytes(&mut self, head: Head, text: bool) -> Result<Vec<u8>, CborError> {
        let check = |chunk: &[u8]| {
            if text && std::str::from_utf8(chunk).is_err() {
                return Err(CborError::InvalidUtf8);
            }
            Ok(())
        };
        if !head.indefinite {
            let len = usize::try_from(head.arg).map_err(|_| CborError::UnexpectedEof)?;
            let chunk = self.take(len)?;
            check(chunk)?;
            return Ok(chunk.to_vec());
        }
        let mut out = Vec::new();
        while !self.at_break()? {
            let chunk_head = self.head()?;
            if chunk_head.major != head.major || chunk_head.indefinite {
                return Err(self.malformed("indefinite-length string chunk has the wrong type"));
            }
            let len = usize::try_from(chunk_head.arg).map_err(|_| CborError::UnexpectedEof)?;
            let chunk = self.take(len)?;
            check(chunk)?;
            out.extend_from_slice(chunk);
        }
        Ok(out)
    }

    fn enter(&self, depth: usize) -> Result<(), CborError> {
        if depth > MAX_NESTING {
            return Err(CborError::NestingTooDeep(MAX_NESTING));
        }
        Ok(())
    }

    /// Capacity to reserve for `n` declared elements: every element takes at
    /// least one byte, so a bogus huge length cannot force a huge allocation.
    fn capacity(&self, n: u64) -> usize {
        let remaining = self.data.len() - self.off;
        usize::try_from(n).map_or(remaining, |n| n.min(remaining))
    }

    fn array(
        &mut self,
        head: Head,
        depth: usize,
        later: Option<LaterEncoding>,
    ) -> Result<Value, CborError> {
        self.enter(depth)?;
        if head.indefinite {
            let mut items = Vec::new();
            while !self.at_break()? {
                items.push(self.item(depth, later)?);
            }
            return Ok(Value::Array(items));
        }
        let mut items = Vec::with_capacity(self.capacity(head.arg));
        for _ in 0..head.arg {
            items.push(self.item(depth, later)?);
        }
        Ok(Value::Array(items))
    }

    fn map(
        &mut self,
        head: Head,
        depth: usize,
        later: Option<LaterEncoding>,
    ) -> Result<Value, CborError> {
        self.enter(depth)?;
        let mut map = Map::with_capacity(if head.indefinite {
            0
        } else {
            self.capacity(head.arg)
        });
        let mut remaining = head.arg;
        loop {
            if head.indefinite {
                if self.at_break()? {
                    break;
                }
            } else if remaining == 0 {
                break;
            } else {
                remaining -= 1;
            }
            let key = match self.item(depth, later)? {
                Value::String(k) => k,
                other => return Err(CborError::NonStringMapKey(json_type(&other))),
            };
            if map.contains_key(&key) {
                return Err(CborError::DuplicateMapKey(key));
            }
            let value = self.item(depth, later)?;
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }
}

/// Tags whose content kube checks before decoding (fxamacker's
/// `validBuiltinTag` plus `BignumTagForbidden`).
fn check_tag_content(tag: u64, content: &Head) -> Result<(), CborError> {
    match tag {
        TAG_RFC3339 if content.major != 3 => Err(CborError::InadmissibleTagContent {
            tag,
            expected: "text string",
        }),
        TAG_EPOCH
            if !(content.major <= 1
                || (content.major == 7 && (25..=27).contains(&content.info))) =>
        {
            Err(CborError::InadmissibleTagContent {
                tag,
                expected: "integer or floating-point number",
            })
        }
        TAG_BIGNUM_POS | TAG_BIGNUM_NEG => Err(CborError::Bignum),
        _ => Ok(()),
    }
}

fn simple_or_float(head: Head) -> Result<Value, CborError> {
    let f = match head.info {
        20 => return Ok(Value::Bool(false)),
        21 => return Ok(Value::Bool(true)),
        22 => return Ok(Value::Null),
        25 => f16_to_f64(head.arg as u16),
        26 => f64::from(f32::from_bits(head.arg as u32)),
        27 => f64::from_bits(head.arg),
        // 0..=19, 23 (undefined) and two-byte simple values 32..=255.
        _ => return Err(CborError::UnrecognizedSimpleValue(head.arg as u8)),
    };
    if f.is_nan() {
        return Err(CborError::NonFiniteFloat("NaN"));
    }
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or(CborError::NonFiniteFloat("infinity"))
}

fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let mantissa = f64::from(bits & 0x3ff);
    match exp {
        0 => sign * mantissa * 2f64.powi(-24),
        31 if mantissa == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        _ => sign * (1.0 + mantissa / 1024.0) * 2f64.powi(exp - 15),
    }
}

fn bytes_to_string(bytes: Vec<u8>, later: Option<LaterEncoding>) -> String {
    match later {
        Some(LaterEncoding::Base64Url) => {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        }
        Some(LaterEncoding::Base64) => base64::engine::general_purpose::STANDARD.encode(bytes),
        Some(LaterEncoding::Base16) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
        None => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "map",
    }
}

/// Tag 0: the text must be an RFC 3339 timestamp; kube re-formats it as
/// Go's RFC3339Nano (fraction without trailing zeros, `Z` for UTC).
fn rfc3339_tag(v: &Value) -> Result<Value, CborError> {
    let s = v.as_str().unwrap_or_default();
    let t = DateTime::parse_from_rfc3339(s)
        .map_err(|e| CborError::InvalidTime(format!("{s:?}: {e}")))?;
    if !(0..=9999).contains(&chrono::Datelike::year(&t)) {
        return Err(CborError::InvalidTime(format!(
            "{s:?}: year outside of range [0,9999]"
        )));
    }
    Ok(Value::String(crate::timestamps::rfc3339_nano(&t)))
}

/// Tag 1: seconds since the epoch (integer or float) as an RFC3339Nano UTC
/// string.
fn epoch_tag(v: &Value) -> Result<Value, CborError> {
    let (secs, nanos) = if let Some(i) = v.as_i64() {
        (i, 0)
    } else {
        let f = v.as_f64().unwrap_or_default();
        let whole = f.trunc();
        if !(-9.2e18..=9.2e18).contains(&whole) {
            return Err(CborError::InvalidTime(format!("{f} overflows int64")));
        }
        // Same arithmetic as Go's time.Unix(int64(sec), int64(frac*1e9)).
        let total = i128::from(whole as i64) * 1_000_000_000 + ((f - whole) * 1e9) as i128;
        (
            total.div_euclid(1_000_000_000) as i64,
            total.rem_euclid(1_000_000_000) as u32,
        )
    };
    let t = DateTime::<Utc>::from_timestamp(secs, nanos)
        .filter(|t| (0..=9999).contains(&chrono::Datelike::year(t)))
        .ok_or_else(|| CborError::InvalidTime(format!("{secs}: year outside of range [0,9999]")))?;
    Ok(Value::String(crate::timestamps::rfc3339_nano(&t)))
}

#[cfg(test)]
mod tests {
    /// A CBOR body nests no deeper than what the store reads back (and JSON
    /// patches are held to).
    #[test]
    fn cbor_nesting_is_the_stores() {
        assert_eq!(super::MAX_NESTING, crate::storage::MAX_OBJECT_NESTING);
    }

    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Encoded item without the self-described prefix.
    fn item(v: &Value) -> String {
        let bytes = to_cbor(v);
        assert_eq!(bytes[..3], SELF_DESCRIBED);
        hex(&bytes[3..])
    }

    // Expected bytes from k8s.io/apimachinery pkg/runtime/serializer/cbor/cbor_test.go
    // ("unstructuredlist"): keys sorted by encoded bytes, strings as byte strings.
    #[test]
    fn encodes_like_kube_unstructured_list() {
        let v = json!({"apiVersion": "v", "kind": "kList", "items": [{"foo": 1}, {"foo": 2}]});
        let want = b"\xd9\xd9\xf7\xa3\x44kind\x45kList\x45items\x82\xa1\x43foo\x01\xa1\x43foo\x02\x4aapiVersion\x41v";
        assert_eq!(to_cbor(&v), want);
    }

    // From kube's encode_test.go: "string marshalled to byte string".
    #[test]
    fn strings_are_byte_strings() {
        assert_eq!(item(&json!("hello")), "4568656c6c6f");
        assert_eq!(item(&json!({"": "test"})), "a1404474657374");
    }

    // RFC 8949 Appendix A (kube runs the same table in appendixa_test.go).
    #[test]
    fn rfc8949_appendix_a_numbers() {
        let cases: &[(Value, &str)] = &[
            (json!(0), "00"),
            (json!(1), "01"),
            (json!(10), "0a"),
            (json!(23), "17"),
            (json!(24), "1818"),
            (json!(25), "1819"),
            (json!(100), "1864"),
            (json!(1000), "1903e8"),
            (json!(1000000), "1a000f4240"),
            (json!(1000000000000_u64), "1b000000e8d4a51000"),
            (json!(18446744073709551615_u64), "1bffffffffffffffff"),
            (json!(-1), "20"),
            (json!(-10), "29"),
            (json!(-100), "3863"),
            (json!(-1000), "3903e7"),
            (json!(i64::MIN), "3b7fffffffffffffff"),
            (json!(0.0), "f90000"),
            (json!(-0.0), "f98000"),
            (json!(1.0), "f93c00"),
            (json!(1.1), "fb3ff199999999999a"),
            (json!(1.5), "f93e00"),
            (json!(65504.0), "f97bff"),
            (json!(100000.0), "fa47c35000"),
            (json!(3.4028234663852886e38), "fa7f7fffff"),
            (json!(1.0e300), "fb7e37e43c8800759c"),
            (json!(5.960464477539063e-8), "f90001"),
            (json!(0.00006103515625), "f90400"),
            (json!(-4.0), "f9c400"),
            (json!(-4.1), "fbc010666666666666"),
            (json!(false), "f4"),
            (json!(true), "f5"),
            (json!(null), "f6"),
            (json!([]), "80"),
            (json!([1, [2, 3], [4, 5]]), "8301820203820405"),
            (json!({}), "a0"),
        ];
        for (v, want) in cases {
            assert_eq!(&item(v), want, "{v}");
        }
    }

    #[test]
    fn long_strings_and_arrays_use_wider_heads() {
        let s = "x".repeat(300);
        assert!(item(&json!(s)).starts_with("59012c"));
        let arr: Vec<u8> = vec![0; 24];
        assert!(item(&json!(arr)).starts_with("9818"));
    }

    #[test]
    fn round_trip() {
        let v = json!({
            "apiVersion": "g/v1", "kind": "Foo",
            "metadata": {"name": "a", "labels": {"x": "y"}, "creationTimestamp": null},
            "spec": {"n": -5, "f": 0.25, "big": 9007199254740993_i64, "list": [true, false, null, "ü"]}
        });
        assert_eq!(from_cbor(&to_cbor(&v)).unwrap(), v);
    }

    #[test]
    fn self_described_tag_is_optional() {
        // From kube's cbor_test.go "self-described cbor tag accepted".
        let tagged =
            b"\xd9\xd9\xf7\xa3\x4aapiVersion\x41v\x44kind\x41k\x48metadata\xa1\x44name\x43foo";
        let want = json!({"apiVersion": "v", "kind": "k", "metadata": {"name": "foo"}});
        assert_eq!(from_cbor(tagged).unwrap(), want);
        assert_eq!(from_cbor(&tagged[3..]).unwrap(), want);
        // Text-string keys and values are accepted too.
        assert_eq!(from_cbor(&unhex("a161616162")).unwrap(), json!({"a": "b"}));
    }

    // Vectors from kube's internal/modes/decode_test.go.
    #[test]
    fn rejects_duplicate_keys() {
        for input in [
            "a2614101614102",                             // {"A": 1, "A": 2}
            "a2414101414102",                             // {'A': 1, 'A': 2}
            "a2414101614102",                             // {'A': 1, "A": 2}
            "a25f426865436c6c6fff015f416844656c6c6fff02", // chunked 'hello' twice
            "a27f626865636c6c6fff017f616864656c6c6fff02", // chunked "hello" twice
        ] {
            assert!(
                matches!(from_cbor(&unhex(input)), Err(CborError::DuplicateMapKey(_))),
                "{input}"
            );
        }
        assert_eq!(
            from_cbor(&unhex("a2414101614102")),
            Err(CborError::DuplicateMapKey("A".into()))
        );
    }

    #[test]
    fn rejects_non_string_keys() {
        assert_eq!(
            from_cbor(&unhex("a1fb40091eb851eb851f63706965")), // {3.14: "pie"}
            Err(CborError::NonStringMapKey("number"))
        );
        assert!(from_cbor(&unhex("a201010102")).is_err()); // {1: 1, 1: 2}
        assert!(from_cbor(&unhex("a18001")).is_err()); // {[]: 1}
    }

    #[test]
    fn rejects_invalid_utf8_text() {
        assert_eq!(from_cbor(&unhex("6180")), Err(CborError::InvalidUtf8));
        // Each chunk of an indefinite text string must be valid on its own.
        assert_eq!(
            from_cbor(&unhex("7f61c361a9ff")),
            Err(CborError::InvalidUtf8)
        );
        assert_eq!(from_cbor(&unhex("7f616161626163ff")).unwrap(), json!("abc"));
        // Byte strings are not validated by kube; we convert lossily.
        assert_eq!(from_cbor(&unhex("4180")).unwrap(), json!("\u{fffd}"));
    }

    #[test]
    fn integers_must_fit_int64() {
        assert_eq!(
            from_cbor(&unhex("1b7fffffffffffffff")).unwrap(),
            json!(i64::MAX)
        );
        assert_eq!(
            from_cbor(&unhex("3b7fffffffffffffff")).unwrap(),
            json!(i64::MIN)
        );
        assert!(matches!(
            from_cbor(&unhex("1bffffffffffffffff")),
            Err(CborError::IntegerOverflow(_))
        ));
        assert!(matches!(
            from_cbor(&unhex("3bffffffffffffffff")),
            Err(CborError::IntegerOverflow(_))
        ));
    }

    #[test]
    fn floats() {
        assert_eq!(from_cbor(&unhex("f94200")).unwrap(), json!(3.0));
        assert_eq!(
            from_cbor(&unhex("f90001")).unwrap(),
            json!(5.960464477539063e-8)
        );
        assert_eq!(
            from_cbor(&unhex("fa7f7fffff")).unwrap(),
            json!(f32::MAX as f64)
        );
        assert_eq!(
            from_cbor(&unhex("fb0000000000000001")).unwrap(),
            json!(5e-324)
        );
        for bad in [
            "f97c00",
            "fa7f800000",
            "fb7ff0000000000000",
            "f9fc00",
            "f97e00",
            "fb7ff8000000000000",
        ] {
            assert!(
                matches!(from_cbor(&unhex(bad)), Err(CborError::NonFiniteFloat(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn f16_encoding_agrees_with_decoding() {
        for bits in 0..=0xffffu16 {
            let f = f16_to_f64(bits);
            if !f.is_finite() {
                continue;
            }
            assert_eq!(f16_exact(f), Some(bits), "{bits:04x}");
        }
    }

    #[test]
    fn simple_values() {
        assert_eq!(from_cbor(&[0xf4]).unwrap(), json!(false));
        assert_eq!(from_cbor(&[0xf5]).unwrap(), json!(true));
        assert_eq!(from_cbor(&[0xf6]).unwrap(), json!(null));
        assert_eq!(
            from_cbor(&[0xf7]),
            Err(CborError::UnrecognizedSimpleValue(23))
        );
        for sv in 0..20u8 {
            assert_eq!(
                from_cbor(&[0xe0 | sv]),
                Err(CborError::UnrecognizedSimpleValue(sv))
            );
        }
        for sv in 24..32u8 {
            assert!(matches!(
                from_cbor(&[0xf8, sv]),
                Err(CborError::Malformed { .. })
            ));
        }
        for sv in 32..=255u8 {
            assert_eq!(
                from_cbor(&[0xf8, sv]),
                Err(CborError::UnrecognizedSimpleValue(sv))
            );
        }
    }

    #[test]
    fn time_tags() {
        let cases = [
            (
                "c074323030362d30312d30325431353a30343a30355a",
                "2006-01-02T15:04:05Z",
            ),
            ("c11a43b940e5", "2006-01-02T15:04:05Z"),
            ("c1f93c00", "1970-01-01T00:00:01Z"),
            ("c1fa3f800000", "1970-01-01T00:00:01Z"),
            ("c1fb3ff0000000000000", "1970-01-01T00:00:01Z"),
            ("c120", "1969-12-31T23:59:59Z"),
            ("c1fbbff0000000000000", "1969-12-31T23:59:59Z"),
            ("c1fb3ff8000000000000", "1970-01-01T00:00:01.5Z"),
        ];
        for (input, want) in cases {
            assert_eq!(from_cbor(&unhex(input)).unwrap(), json!(want), "{input}");
        }
        for bad in [
            "c054323030362d30312d30325431353a30343a30355a", // 0('...') byte string
            "c06474657874",                                 // 0("text")
            "c11b0000003afff44181",                         // year 10000
            "c1f97c00",                                     // 1(Infinity)
            "c16161",                                       // 1("a")
        ] {
            assert!(from_cbor(&unhex(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn rfc3339_tag_reformats_like_go() {
        // Offset kept, fraction trimmed to its significant digits.
        let s = "2006-01-02T15:04:05.100+01:00";
        let mut input = vec![0xc0];
        write_head(&mut input, 3, s.len() as u64);
        input.extend_from_slice(s.as_bytes());
        assert_eq!(
            from_cbor(&input).unwrap(),
            json!("2006-01-02T15:04:05.1+01:00")
        );
    }

    #[test]
    fn other_tags() {
        assert_eq!(
            from_cbor(&unhex("c249010000000000000000")),
            Err(CborError::Bignum)
        );
        assert_eq!(
            from_cbor(&unhex("c349010000000000000000")),
            Err(CborError::Bignum)
        );
        // Unrecognised tags are transparent.
        assert_eq!(
            from_cbor(&unhex("c48221196ab3")).unwrap(),
            json!([-2, 27315])
        );
        assert_eq!(from_cbor(&unhex("c5822003")).unwrap(), json!([-1, 3]));
        // Expected later encodings apply to enclosed byte strings.
        assert_eq!(
            from_cbor(&unhex("d64401020304")).unwrap(),
            json!("AQIDBA==")
        );
        assert_eq!(from_cbor(&unhex("d54401020304")).unwrap(), json!("AQIDBA"));
        assert_eq!(
            from_cbor(&unhex("d74401020304")).unwrap(),
            json!("01020304")
        );
        assert_eq!(
            from_cbor(&unhex("d6a1416b82414dd74101")).unwrap(),
            json!({"aw==": ["TQ==", "01"]})
        );
        // Chains of tags do not recurse.
        let mut deep = SELF_DESCRIBED.repeat(100_000);
        deep.push(0x01);
        assert_eq!(from_cbor(&deep).unwrap(), json!(1));
    }

    #[test]
    fn indefinite_lengths() {
        assert_eq!(
            from_cbor(&unhex("9f9f8080ff9f8080ffff")).unwrap(),
            json!([[[], []], [[], []]])
        );
        assert_eq!(
            from_cbor(&unhex("bf6141bf616101616202ff6142bf616901616a02ffff")).unwrap(),
            json!({"A": {"a": 1, "b": 2}, "B": {"i": 1, "j": 2}})
        );
        assert!(from_cbor(&unhex("bf616101ff")).is_ok());
        assert!(from_cbor(&unhex("bf6161ff")).is_err()); // key without value
        assert!(from_cbor(&unhex("5f6161ff")).is_err()); // text chunk in byte string
    }

    #[test]
    fn malformed_input() {
        assert_eq!(from_cbor(&[]), Err(CborError::UnexpectedEof));
        assert_eq!(from_cbor(&unhex("d9d9f7")), Err(CborError::UnexpectedEof));
        assert_eq!(from_cbor(&unhex("62ff")), Err(CborError::UnexpectedEof));
        assert_eq!(
            from_cbor(&unhex("9bffffffffffffffff")),
            Err(CborError::UnexpectedEof)
        );
        assert_eq!(
            from_cbor(&unhex("0102")),
            Err(CborError::ExtraneousData { len: 1, offset: 1 })
        );
        assert!(matches!(
            from_cbor(&[0xff]),
            Err(CborError::Malformed { .. })
        ));
        assert!(matches!(
            from_cbor(&[0x1c]),
            Err(CborError::Malformed { .. })
        ));
        assert!(matches!(
            from_cbor(&[0x1f]),
            Err(CborError::Malformed { .. })
        ));
    }

    #[test]
    fn nesting_limit_matches_serde_json() {
        let json_nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<Value>(&json_nested(MAX_NESTING)).is_ok());
        assert!(serde_json::from_str::<Value>(&json_nested(MAX_NESTING + 1)).is_err());

        let cbor_nested = |n: usize| {
            let mut b = vec![0x81; n - 1];
            b.push(0x80);
            b
        };
        assert!(from_cbor(&cbor_nested(MAX_NESTING)).is_ok());
        assert_eq!(
            from_cbor(&cbor_nested(MAX_NESTING + 1)),
            Err(CborError::NestingTooDeep(MAX_NESTING))
        );
    }

    #[test]
    fn seq_frame_embeds_tagged_object_like_kube() {
        let event = json!({"type": "ADDED", "object": {"kind": "Foo"}});
        let frame = cbor_seq_frame(&event);
        let mut want = SELF_DESCRIBED.to_vec();
        want.extend_from_slice(b"\xa2\x44type\x45ADDED\x46object");
        want.extend_from_slice(&SELF_DESCRIBED);
        want.extend_from_slice(b"\xa1\x44kind\x43Foo");
        assert_eq!(frame, want);
        assert_eq!(from_cbor(&frame).unwrap(), event);

        // A sequence is plain concatenation; each item decodes alone.
        let other = json!({"n": 1});
        let mut seq = frame.clone();
        seq.extend(cbor_seq_frame(&other));
        assert_eq!(from_cbor(&seq[..frame.len()]).unwrap(), event);
        assert_eq!(from_cbor(&seq[frame.len()..]).unwrap(), other);
        assert_eq!(cbor_seq_frame(&other), to_cbor(&other));
    }

    /// Pieces of CBOR: heads of every major type and width, lengths that
    /// claim far more than the input holds, breaks, tags and small items.
    const CBOR_PIECES: &[&[u8]] = &[
        &[0x00],
        &[0x17],
        &[0x18, 0xff],
        &[0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0x20],
        &[0x3b, 0x80, 0, 0, 0, 0, 0, 0, 0],
        &[0x40],
        &[0x41, b'a'],
        &[0x5f],
        &[0x5f, 0x41, b'a', 0xff],
        &[0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0x5a, 0x7f, 0xff, 0xff, 0xff],
        &[0x60],
        &[0x61, b'a'],
        &[0x62, 0xc3, 0xa9],
        &[0x61, 0xff],
        &[0x7f],
        &[0x7b, 0, 0, 0, 1, 0, 0, 0, 0],
        &[0x80],
        &[0x81],
        &[0x83],
        &[0x9f],
        &[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0xa0],
        &[0xa1],
        &[0xbf],
        &[0xbb, 0, 0, 0, 1, 0, 0, 0, 0],
        &[0xc0],
        &[0xc1],
        &[0xc2],
        &[0xc3],
        &[0xd5],
        &[0xd6],
        &[0xd7],
        &[0xd9, 0xd9, 0xf7],
        &[0xdb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0xf4],
        &[0xf5],
        &[0xf6],
        &[0xf7],
        &[0xf8, 0x10],
        &[0xf8, 0xff],
        &[0xf9, 0x7c, 0x00],
        &[0xf9, 0x7e, 0x00],
        &[0xfa, 0x7f, 0x80, 0, 0],
        &[0xfb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 1],
        &[0xfb, 0x43, 0xe0, 0, 0, 0, 0, 0, 0],
        &[0xfb, 0xc3, 0xe0, 0, 0, 0, 0, 0, 1],
        &[0x1c],
        &[0x3f],
        &[0xff],
        &[0x74],
        b"2024-02-29T12:34:56.5+02:00",
        &[0x74],
        b"0000-01-01T00:00:00Z",
    ];

    fn cbor_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            6 => prop::sample::select(CBOR_PIECES).prop_map(<[u8]>::to_vec),
            1 => prop::collection::vec(any::<u8>(), 0..4),
            1 => (prop::sample::select(&[0x81u8, 0x9f, 0xa1, 0xc6][..]), 1..400usize)
                .prop_map(|(b, n)| vec![b; n]),
        ];
        prop_oneof![
            1 => prop::collection::vec(any::<u8>(), 0..128),
            4 => (any::<bool>(), prop::collection::vec(piece, 0..24)).prop_map(|(tagged, v)| {
                let mut out = if tagged { SELF_DESCRIBED.to_vec() } else { Vec::new() };
                out.extend(v.concat());
                out
            }),
            1 => crate::fuzz::json_value().prop_map(|v| to_cbor(&v)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10000, ..ProptestConfig::default() })]

        /// Any bytes decode to a value or a `CborError`; what decodes encodes
        /// and decodes to the same value.
        #[test]
        fn prop_from_cbor_never_panics(bytes in cbor_bytes()) {
            if let Ok(v) = from_cbor(&bytes) {
                prop_assert_eq!(from_cbor(&to_cbor(&v)), Ok(v));
            }
        }
    }

    /// 10,000 levels of every kind of nesting are refused, not recursed into.
    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let deep = |prefix: &[u8], n: usize| {
            let mut b = prefix.repeat(n);
            b.push(0x00);
            b
        };
        for prefix in [
            &[0x81][..],
            &[0x9f],
            &[0xa1, 0x61, b'a'],
            &[0xbf, 0x41, b'a'],
        ] {
            assert_eq!(
                from_cbor(&deep(prefix, 10_000)),
                Err(CborError::NestingTooDeep(MAX_NESTING)),
                "{prefix:x?}"
            );
        }
        // Tags are read in a loop: a long chain around one item is fine.
        assert_eq!(from_cbor(&deep(&[0xc6], 100_000)), Ok(json!(0)));
    }
}
