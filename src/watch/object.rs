//! An object as the watch cache holds it: its stored JSON bytes, once, and
//! the little that filtering needs without parsing them (labels, apiVersion).
//!
//! The parsed form is not kept: a `serde_json::Value` costs two to three
//! times its JSON, and the cache would hold it beside the bytes for every
//! object. Readers that need the value parse the bytes they are given (the
//! JSON answer in the storage version needs none), as kube's cache keeps
//! the decoded object plus precomputed label and field sets.

use crate::object::MetaField;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::storage::Revision;

#[derive(Debug)]
pub struct CachedObject {
    /// Key within the resource: `namespace/name` (namespace empty when cluster-scoped).
    pub key: String,
    pub revision: Revision,
    pub json: Bytes,
    /// Interned per resource: objects of one resource share a few versions.
    api_version: Arc<str>,
    /// `metadata.labels`, sorted by key.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// Whether `json` is not the stored encoding but the cache's rewrite of
    /// it (read defaults added): a writer comparing with what is stored
    /// must then read the store.
    rewritten: bool,
}

impl CachedObject {
    /// Builds the cached form of `value`, whose encoding is `json`.
    pub fn new(
        key: String,
        revision: Revision,
        value: &Value,
        json: Bytes,
        api_version: Arc<str>,
    ) -> Self {
        let mut labels: Vec<(Box<str>, Box<str>)> = value
            .meta_field("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                    .collect()
            })
            .unwrap_or_default();
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Self {
            key,
            revision,
            json,
            api_version,
            labels: labels.into_boxed_slice(),
            rewritten: false,
        }
    }

    /// Marks `json` as rewritten from the stored encoding.
    pub fn rewritten(mut self, rewritten: bool) -> Self {
        self.rewritten = rewritten;
        self
    }

    /// Whether `json` is exactly what the store holds.
    pub fn is_stored_form(&self) -> bool {
        !self.rewritten
    }

    pub fn namespace(&self) -> &str {
        self.key.split_once('/').map_or("", |(ns, _)| ns)
    }

    pub fn name(&self) -> &str {
        self.key.split_once('/').map_or(&self.key, |(_, n)| n)
    }

    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.labels[i].1.as_ref())
    }

    /// The object, parsed from its bytes. The bytes were parsed once on the
    /// way in (they come from a value), so this does not fail in practice;
    /// `Null` if it ever did.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// Memory this object holds, roughly (for the history's byte budget).
    pub fn cost(&self) -> u64 {
        let labels: usize = self
            .labels
            .iter()
            .map(|(k, v)| k.len() + v.len() + 32)
            .sum();
        (self.json.len() + self.key.len() + labels + 96) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_are_looked_up_without_the_value() {
        let v = json!({"metadata": {"labels": {"b": "2", "a": "1", "odd": 3}}});
        let o = CachedObject::new(
            "ns/x".into(),
            1,
            &v,
            Bytes::from(v.to_string()),
            "g/v1".into(),
        );
        assert_eq!(o.label("a"), Some("1"));
        assert_eq!(o.label("b"), Some("2"));
        assert_eq!(
            o.label("odd"),
            None,
            "a label value that is not a string is no label"
        );
        assert_eq!(o.label("c"), None);
        assert_eq!((o.namespace(), o.name()), ("ns", "x"));
        assert_eq!(o.value(), v);
    }
}
