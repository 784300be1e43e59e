//! Key layout shared by every engine (see DESIGN.md, storage model):
//! `k/<key>` latest state, `v/<key>\0<rev>` history, `l/<rev>` event log,
//! `m/...` metadata. Revisions are big-endian so byte order is numeric order.

use super::Revision;

pub const META_REVISION: &[u8] = b"m/revision";
pub const META_COMPACT: &[u8] = b"m/compact";
/// Present while `kshard snapshot restore` writes a store: a store holding
/// it is incomplete and is not served (see `crate::snapshot`).
pub const META_RESTORING: &[u8] = b"m/restoring";
/// Where the latest-state records begin.
pub const LATEST: &[u8] = b"k/";

pub fn latest(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + key.len());
    k.extend_from_slice(b"k/");
    k.extend_from_slice(key.as_bytes());
    k
}

/// The object key of a `k/` record.
pub fn parse_latest(k: &[u8]) -> Option<&str> {
    std::str::from_utf8(k.strip_prefix(LATEST)?).ok()
}

pub fn version(key: &str, rev: Revision) -> Vec<u8> {
    let mut k = version_prefix(key);
    k.extend_from_slice(&rev.to_be_bytes());
    k
}

/// All versions of one object key.
pub fn version_prefix(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + key.len() + 8);
    k.extend_from_slice(b"v/");
    k.extend_from_slice(key.as_bytes());
    k.push(0);
    k
}

/// Start of the versions of every object key beginning with `prefix`.
pub fn versions_from(prefix: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + prefix.len());
    k.extend_from_slice(b"v/");
    k.extend_from_slice(prefix.as_bytes());
    k
}

/// Exclusive end of the keys starting with `start` (which never ends in 0xff here).
pub fn prefix_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; 1]
}

/// Splits a `v/` key into the object key and the revision.
pub fn parse_version(k: &[u8]) -> Option<(&str, Revision)> {
    let body = k.strip_prefix(b"v/")?;
    if body.len() < 9 {
        return None;
    }
    let (key, rest) = body.split_at(body.len() - 9);
    if rest[0] != 0 {
        return None;
    }
    let rev = Revision::from_be_bytes(rest[1..].try_into().ok()?);
    Some((std::str::from_utf8(key).ok()?, rev))
}

pub fn log(rev: Revision) -> Vec<u8> {
    let mut k = b"l/".to_vec();
    k.extend_from_slice(&rev.to_be_bytes());
    k
}

/// Latest-state record: revision, then a deleted flag.
pub fn encode_latest(rev: Revision, deleted: bool) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[..8].copy_from_slice(&rev.to_be_bytes());
    v[8] = u8::from(deleted);
    v
}

pub fn decode_latest(v: &[u8]) -> Option<(Revision, bool)> {
    if v.len() != 9 {
        return None;
    }
    Some((Revision::from_be_bytes(v[..8].try_into().ok()?), v[8] != 0))
}

pub fn decode_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_keys_round_trip_and_sort_numerically() {
        let a = version("g/r/ns/a", 9);
        let b = version("g/r/ns/a", 10);
        assert!(a < b);
        assert_eq!(parse_version(&b), Some(("g/r/ns/a", 10)));
        // "a" sorts before "ab": the NUL separator keeps keys apart.
        assert!(version("g/r/ns/a", u64::MAX) < version("g/r/ns/ab", 1));
    }

    #[test]
    fn prefix_end_is_exclusive_upper_bound() {
        assert_eq!(prefix_end(b"v/a"), b"v/b".to_vec());
        assert!(version("x/y", 5) < prefix_end(&versions_from("x/")));
    }
}
