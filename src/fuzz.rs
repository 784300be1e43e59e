//! Shared proptest strategies for the `prop_` tests of every request decoder
//! and parser: random input plus structured near-valid input (token soups,
//! JSON-like text, deep nesting), so the tests reach past the first check.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Strings made of `tokens`, with runs of one token now and then so limits on
/// length and repetition are exercised too.
pub fn token_soup(tokens: &'static [&'static str], max: usize) -> BoxedStrategy<String> {
    let piece = prop_oneof![
        8 => prop::sample::select(tokens).prop_map(str::to_string),
        1 => (prop::sample::select(tokens), 1..300usize).prop_map(|(t, n)| t.repeat(n)),
    ];
    prop::collection::vec(piece, 0..max)
        .prop_map(|v| v.concat())
        .boxed()
}

/// Any string: arbitrary Unicode, or a soup of the given tokens.
pub fn text(tokens: &'static [&'static str], max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        1 => any::<String>(),
        3 => token_soup(tokens, max),
    ]
    .boxed()
}

/// `n` opening brackets, an optional core, and (sometimes) the closings.
pub fn nested(open: &'static str, close: &'static str) -> BoxedStrategy<String> {
    (
        1..12_000usize,
        any::<bool>(),
        prop::sample::select(&["", "1", "\"a\"", "{}"][..]),
    )
        .prop_map(move |(n, closed, core)| {
            let mut s = open.repeat(n);
            s.push_str(core);
            if closed {
                s.push_str(&close.repeat(n));
            }
            s
        })
        .boxed()
}

const KEYS: &[&str] = &[
    "metadata", "spec", "status", "name", "labels", "a", "b", "", "-", "0", "~", "/", "é",
];

fn scalar() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(KEYS).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => ".{0,8}",
    ]
    .boxed()
}

/// A JSON value, now and then one nested close to serde_json's depth limit.
pub fn json_value() -> BoxedStrategy<Value> {
    let tree = scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    });
    prop_oneof![
        20 => tree,
        1 => (100..130usize, any::<bool>()).prop_map(|(n, arrays)| deep_value(n, arrays)),
    ]
    .boxed()
}

/// `n` nested arrays (or single-key objects) around `1`.
pub fn deep_value(n: usize, arrays: bool) -> Value {
    let mut v = Value::from(1);
    for _ in 0..n {
        v = if arrays {
            Value::Array(vec![v])
        } else {
            Value::Object(Map::from_iter([("a".to_string(), v)]))
        };
    }
    v
}

const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\"a\"",
    "\"spec\"",
    "1",
    "-0",
    "1e999",
    "-1e-999",
    "18446744073709551616",
    "0.5",
    "true",
    "false",
    "null",
    " ",
    "\n",
    "\\",
    "\\u0000",
    "\\ud800",
    "\"\\ud800\"",
    "é",
    "\u{0}",
    "nul",
];

/// JSON-like text: a serialized value, a token soup, deep brackets, or anything.
pub fn json_text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => json_value().prop_map(|v| v.to_string()),
        4 => token_soup(JSON_TOKENS, 40),
        1 => nested("[", "]"),
        1 => nested("{\"a\":", "}"),
        1 => any::<String>(),
    ]
    .boxed()
}

/// Request body bytes: random bytes or JSON-like text.
pub fn body_bytes() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        3 => json_text().prop_map(String::into_bytes),
    ]
    .boxed()
}

const QUERY_KEYS: &[&str] = &[
    "limit",
    "timeoutSeconds",
    "watch",
    "allowWatchBookmarks",
    "resourceVersion",
    "resourceVersionMatch",
    "continue",
    "sendInitialEvents",
    "labelSelector",
    "fieldSelector",
    "dryRun",
    "fieldValidation",
    "fieldManager",
    "propagationPolicy",
    "orphanDependents",
    "force",
    "x",
    "",
];

const QUERY_VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "5",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "1e3",
    "true",
    "false",
    "FaLsE",
    "All",
    "Strict",
    "Warn",
    "NotOlderThan",
    "Exact",
    "Foreground",
    "Orphan",
    "a=b",
    "metadata.name%3Dx",
    "%",
    "%ZZ",
    "%C3%A9",
    "%FF",
    "%00",
    "+",
    "&",
    "=",
    "é",
    "%5C%C3%A9%3Dx",
    "metadata.name%3D%5C",
    "a%20in%20(b%2Cc)",
    "!a",
    "a!%3Db",
    "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJhXHUwMDAwIn0",
];

/// A query string: `key=value` pairs from kube's parameters and awkward
/// values, or arbitrary text.
pub fn query() -> BoxedStrategy<String> {
    let pair = (
        prop::sample::select(QUERY_KEYS),
        prop_oneof![
            4 => prop::sample::select(QUERY_VALUES).prop_map(str::to_string),
            1 => ".{0,10}",
            1 => prop::sample::select(QUERY_VALUES).prop_map(|v| v.repeat(200)),
        ],
    )
        .prop_map(|(k, v)| format!("{k}={v}"));
    prop_oneof![
        4 => prop::collection::vec(pair, 0..8).prop_map(|p| p.join("&")),
        1 => any::<String>(),
    ]
    .boxed()
}
