//! Strict decoding checks serde_json cannot do on its own: JSON objects that
//! repeat a key (kube reports them as `duplicate field "spec.x"`).

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Paths of repeated keys in a JSON document (empty when it is not JSON).
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let walker = Walker {
        path: String::new(),
        out: &mut out,
    };
    if walker.deserialize(&mut de).is_err() {
        return Vec::new();
    }
    out
}

struct Walker<'a> {
    path: String,
    out: &'a mut Vec<String>,
}

impl<'de> DeserializeSeed<'de> for Walker<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walker<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            if !seen.insert(key) {
                self.out.push(path.clone());
            }
            map.next_value_seed(Walker {
                path,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(Walker {
                path: format!("{}[{i}]", self.path),
                out: &mut *self.out,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::duplicate_fields;
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any body: a list of paths (empty when it is not JSON), no panic.
        #[test]
        fn prop_duplicate_fields_never_panics(body in crate::fuzz::body_bytes()) {
            let _ = duplicate_fields(&body);
        }
    }
}
