//! Strict decoding checks serde_json cannot do on its own: JSON objects that
//! repeat a key (kube reports them as `duplicate field "spec.x"`).

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses a JSON document as `serde_json::from_slice::<Value>` does (the
/// last of repeated keys wins, the same errors and depth limit) and returns
/// the paths of repeated keys with it: one pass instead of a parse and a
/// walk, and no path is built unless a key repeats.
pub fn from_slice_with_duplicates(body: &[u8]) -> serde_json::Result<(Value, Vec<String>)> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut scan = Scan::default();
    let value = Building(&mut scan).deserialize(&mut de)?;
    de.end()?;
    Ok((value, scan.duplicates))
}

/// Where the parse is (one segment per open object or array) and what it found.
#[derive(Default)]
struct Scan {
    path: Vec<Segment>,
    duplicates: Vec<String>,
}

enum Segment {
    Key(String),
    Index(usize),
}

impl Scan {
    fn render(&self, key: &str) -> String {
        let mut out = String::new();
        for seg in &self.path {
            match seg {
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Index(i) => {
                    out.push('[');
                    out.push_str(&i.to_string());
                    out.push(']');
                }
            }
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(key);
        out
    }
}

struct Building<'s>(&'s mut Scan);

impl<'de> DeserializeSeed<'de> for Building<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Building<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let path = self.0.render(&key);
                self.0.duplicates.push(path);
            }
            // The key is the path's segment while its value is read.
            self.0.path.push(Segment::Key(key));
            let value = map.next_value_seed(Building(&mut *self.0))?;
            if let Some(Segment::Key(key)) = self.0.path.pop() {
                out.insert(key, value);
            }
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            self.0.path.push(Segment::Index(out.len()));
            let next = seq.next_element_seed(Building(&mut *self.0));
            self.0.path.pop();
            match next? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// Paths of repeated keys in a JSON document (empty when it is not JSON).
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    from_slice_with_duplicates(body)
        .map(|(_, dups)| dups)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{duplicate_fields, from_slice_with_duplicates};
    use proptest::prelude::*;

    #[test]
    fn finds_repeated_keys_with_paths() {
        let body = br#"{"spec":{"replicas":1,"replicas":2,"items":[{"a":1,"a":2}]},"kind":"W","kind":"W"}"#;
        assert_eq!(
            duplicate_fields(body),
            ["spec.replicas", "spec.items[0].a", "kind"]
        );
        assert!(duplicate_fields(br#"{"a":{"b":1},"c":[1,2]}"#).is_empty());
        assert!(duplicate_fields(b"not json").is_empty());
    }

    #[test]
    fn one_pass_parse_keeps_the_last_value_in_the_first_place_and_names_repeats() {
        let body = br#"{"spec":{"replicas":1,"x":0,"replicas":2,"items":[{"a":1,"a":2}]},"kind":"W","kind":"V"}"#;
        let (v, dups) = from_slice_with_duplicates(body).expect("JSON");
        assert_eq!(dups, ["spec.replicas", "spec.items[0].a", "kind"]);
        assert_eq!(
            v,
            serde_json::from_slice::<serde_json::Value>(body).expect("JSON")
        );
        assert_eq!(v["spec"]["replicas"], 2);
        assert_eq!(v["kind"], "V");
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(
            from_slice_with_duplicates(deep.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string()),
            serde_json::from_slice::<serde_json::Value>(deep.as_bytes())
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
        assert!(from_slice_with_duplicates(b"{} x").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any body: a list of paths (empty when it is not JSON), no panic.
        #[test]
        fn prop_duplicate_fields_never_panics(body in crate::fuzz::body_bytes()) {
            let _ = duplicate_fields(&body);
        }

        /// The one-pass parse is serde_json's parse (value or error message).
        #[test]
        fn prop_one_pass_parse_is_serde_json_and_the_walk(body in crate::fuzz::body_bytes()) {
            let plain = serde_json::from_slice::<serde_json::Value>(&body);
            match (from_slice_with_duplicates(&body), plain) {
                (Ok((v, _)), Ok(w)) => prop_assert_eq!(v, w),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "{:?} against {:?}", a.map(|x| x.0), b),
            }
        }
    }
}
