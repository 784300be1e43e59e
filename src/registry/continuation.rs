//! Continue tokens in kube's encoding: unpadded URL-safe base64 of
//! `{"v":"meta.k8s.io/v1","rv":N,"start":"<key after the resource prefix>\u0000"}`.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::status::ApiError;

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContinueToken {
    #[serde(rename = "v")]
    version: String,
    /// The revision of the list; -1 means "the latest" (an inconsistent continuation).
    pub rv: i64,
    /// Key within the resource to continue from (exclusive when it ends in NUL).
    pub start: String,
}

impl ContinueToken {
    pub fn new(rv: u64, last_key_in_resource: &str) -> Self {
        Self {
            version: TOKEN_VERSION.into(),
            rv: i64::try_from(rv).unwrap_or(i64::MAX),
            start: format!("{last_key_in_resource}\u{0}"),
        }
    }

    pub fn latest(start: &str) -> Self {
        Self {
            version: TOKEN_VERSION.into(),
            rv: -1,
            start: start.to_string(),
        }
    }

    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    pub fn decode(s: &str) -> Result<Self, ApiError> {
        let bad = |why: String| {
            ApiError::bad_request(format!(
                "invalid continue token: continue key is not valid: {why}"
            ))
        };
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .map_err(|e| bad(e.to_string()))?;
        let token: ContinueToken = serde_json::from_slice(&raw).map_err(|e| bad(e.to_string()))?;
        if token.version != TOKEN_VERSION {
            return Err(bad(format!(
                "server does not recognize this encoded version {}",
                token.version
            )));
        }
        if token.rv == 0 {
            return Err(bad(format!(
                "incorrect encoded start resourceVersion (version {TOKEN_VERSION})"
            )));
        }
        if token.start.is_empty() {
            return Err(bad(format!(
                "encoded start key empty (version {TOKEN_VERSION})"
            )));
        }
        if token.start.split('/').any(|seg| seg == ".." || seg == ".") {
            return Err(bad(token.start.clone()));
        }
        Ok(token)
    }

    /// The key within the resource after which listing resumes.
    pub fn after(&self) -> &str {
        self.start.strip_suffix('\u{0}').unwrap_or(&self.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let t = ContinueToken::new(42, "ns/a");
        let s = t.encode();
        assert!(!s.contains('='));
        let back = ContinueToken::decode(&s).expect("decode");
        assert_eq!(back, t);
        assert_eq!(back.after(), "ns/a");
        let err = ContinueToken::decode("!!!").expect_err("garbage");
        assert_eq!(err.code, 400);
        assert!(err
            .message
            .starts_with("invalid continue token: continue key is not valid"));
    }

    const TOKEN_JSON: &[&str] = &[
        "{",
        "}",
        ",",
        ":",
        "\"v\"",
        "\"rv\"",
        "\"start\"",
        "\"meta.k8s.io/v1\"",
        "\"v2\"",
        "0",
        "-1",
        "42",
        "9223372036854775808",
        "1.5",
        "\"ns/a\\u0000\"",
        "\"\"",
        "\"../x\"",
        "\"a/./b\"",
        "null",
        "[",
        "]",
        " ",
    ];

    /// A continue token: text as sent, or base64 of random bytes or of
    /// near-valid token JSON (so decoding gets past base64 and JSON).
    fn token() -> impl Strategy<Value = String> {
        let b64 = |b: Vec<u8>| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        prop_oneof![
            1 => crate::fuzz::text(&["A", "a", "-", "_", "+", "/", "=", "==", "!", " "], 40),
            1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(b64),
            3 => crate::fuzz::token_soup(TOKEN_JSON, 16).prop_map(move |j| b64(j.into_bytes())),
            2 => (any::<i64>(), ".{0,12}", prop::sample::select(&["meta.k8s.io/v1", "x"][..]))
                .prop_map(move |(rv, start, v)| {
                    b64(serde_json::to_vec(&serde_json::json!({"v": v, "rv": rv, "start": start}))
                        .unwrap_or_default())
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10000, ..ProptestConfig::default() })]

        /// Any token decodes or is a 400; a decoded one re-encodes to itself.
        #[test]
        fn prop_continue_token_never_panics(s in token()) {
            match ContinueToken::decode(&s) {
                Ok(t) => {
                    let _ = t.after();
                    prop_assert_eq!(ContinueToken::decode(&t.encode()).ok(), Some(t));
                }
                Err(e) => prop_assert_eq!(e.code, 400),
            }
        }
    }
}
