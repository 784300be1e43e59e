//! TiKV's memcomparable byte encoding, which PD uses for region boundaries in
//! transactional mode (tikv-client encodes keys it sends to PD and decodes the
//! region bounds it gets back; TiKV itself sees raw keys).

const GROUP: usize = 8;
const MARKER: u8 = 0xff;

pub fn encode(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity((key.len() / GROUP + 1) * (GROUP + 1));
    let mut chunks = key.chunks_exact(GROUP);
    for chunk in &mut chunks {
        out.extend_from_slice(chunk);
        out.push(MARKER);
    }
    let rest = chunks.remainder();
    let pad = GROUP - rest.len();
    out.extend_from_slice(rest);
    out.extend(std::iter::repeat_n(0u8, pad));
    out.push(MARKER - pad as u8);
    out
}

/// Decodes an encoded key; `None` if it is not a valid encoding.
pub fn decode(encoded: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(encoded.len());
    for group in encoded.chunks(GROUP + 1) {
        if group.len() != GROUP + 1 {
            return None;
        }
        let pad = (MARKER - group[GROUP]) as usize;
        if pad > GROUP {
            return None;
        }
        out.extend_from_slice(&group[..GROUP - pad]);
        if pad > 0 {
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_order() {
        for k in [&b""[..], b"a", b"12345678", b"123456789", b"kshard/t/v/x"] {
            assert_eq!(decode(&encode(k)).as_deref(), Some(k));
        }
        assert!(encode(b"a") < encode(b"a\0"));
        assert!(encode(b"12345678") < encode(b"123456789"));
    }
}
