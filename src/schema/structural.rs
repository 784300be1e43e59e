//! A CRD `openAPIV3Schema` parsed once into a typed tree (kube's `structuralschema.Structural`
//! plus the value validations), so pruning, defaulting and validation never re-read JSON.

use serde_json::{Map, Value};
use std::collections::HashMap;

/// What `additionalProperties` allows for keys not listed in `properties`.
#[derive(Debug, Clone, Default)]
pub enum Additional {
    /// Not set: unknown keys are pruned (structural schemas forbid `false` with properties).
    #[default]
    Unset,
    /// `true` or `false` (kube-openapi rejects unknown keys only for `false`).
    Allows(bool),
    /// A schema every unknown key's value must match.
    Schema(Box<Node>),
}

/// One schema node. Value validations are kept together so `validate` can run them in
/// kube-openapi's order.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// `type`; empty when unset (kube allows that under preserve-unknown and in junctors).
    pub types: Vec<String>,
    pub format: Option<String>,
    pub nullable: bool,
    pub int_or_string: bool,
    pub preserve_unknown: bool,
    pub embedded: bool,
    pub default: Option<Value>,
    /// `properties` in schema order (error order then follows the CRD author's order).
    pub properties: Vec<(String, Node)>,
    index: HashMap<String, usize>,
    pub additional: Additional,
    pub items: Option<Box<Node>>,
    pub required: Vec<String>,
    pub enumeration: Option<Vec<Value>>,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub multiple_of: Option<f64>,
    pub max_length: Option<i64>,
    pub min_length: Option<i64>,
    pub pattern: Option<regex::Regex>,
    pub max_items: Option<i64>,
    pub min_items: Option<i64>,
    pub unique_items: bool,
    pub max_properties: Option<i64>,
    pub min_properties: Option<i64>,
    pub all_of: Vec<Node>,
    pub any_of: Vec<Node>,
    pub one_of: Vec<Node>,
    pub not: Option<Box<Node>>,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub map_type: Option<String>,
    /// When this node has `x-kubernetes-validations`: its schema subtree with the rules of
    /// descendants removed, for the CEL module to compile (the subtree tells CEL how to
    /// type `self`, the descendants' rules are compiled at their own nodes).
    pub rules: Option<Value>,
}

/// Why a schema could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("{path}: must be an object")]
    NotAnObject { path: String },
    #[error("{path}.{keyword}: invalid value")]
    BadKeyword { path: String, keyword: String },
    #[error("{path}.pattern: {source}")]
    BadPattern {
        path: String,
        #[source]
        source: regex::Error,
    },
    #[error("{path}: {message}")]
    Cel { path: String, message: String },
}

/// Formats kube keeps after `StripUnsupportedFormats` (everything else is ignored, e.g.
/// `int32` or `double`, so they are not checked at all).
const SUPPORTED_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "k8s-short-name",
    "k8s-long-name",
];

/// strfmt normalises names by dropping dashes, so `date-time` is `datetime`; the two
/// k8s formats keep theirs.
pub fn normalize_format(f: &str) -> String {
    if f.starts_with("k8s-") {
        f.to_string()
    } else {
        f.replace('-', "").to_ascii_lowercase()
    }
}

impl Node {
    pub fn parse(v: &Value, path: &str) -> Result<Node, SchemaError> {
        let m = v.as_object().ok_or_else(|| SchemaError::NotAnObject {
            path: path.to_string(),
        })?;
        let mut n = Node::default();
        let bad = |k: &str| SchemaError::BadKeyword {
            path: path.to_string(),
            keyword: k.to_string(),
        };
        if let Some(t) = m.get("type") {
            match t {
                Value::String(s) if !s.is_empty() => n.types.push(s.clone()),
                Value::String(_) => {}
                _ => return Err(bad("type")),
            }
        }
        n.int_or_string = flag(m, "x-kubernetes-int-or-string");
        if n.int_or_string {
            // kube-openapi sees int-or-string as `type: [integer, string]`.
            n.types = vec!["integer".into(), "string".into()];
        }
        if let Some(f) = m.get("format").and_then(Value::as_str) {
            let norm = normalize_format(f);
            if SUPPORTED_FORMATS.contains(&norm.as_str()) {
                // Kept as written: kube's message names the format as the CRD spells it.
                n.format = Some(f.to_string());
            }
        }
        n.nullable = flag(m, "nullable");
        n.preserve_unknown = flag(m, "x-kubernetes-preserve-unknown-fields");
        n.embedded = flag(m, "x-kubernetes-embedded-resource");
        n.default = m.get("default").cloned();
        if let Some(props) = m.get("properties") {
            let props = props.as_object().ok_or_else(|| bad("properties"))?;
            for (k, pv) in props {
                let child = Node::parse(pv, &format!("{path}.properties[{k}]"))?;
                n.index.insert(k.clone(), n.properties.len());
                n.properties.push((k.clone(), child));
            }
        }
        match m.get("additionalProperties") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => n.additional = Additional::Allows(*b),
            Some(s) => {
                n.additional = Additional::Schema(Box::new(Node::parse(
                    s,
                    &format!("{path}.additionalProperties"),
                )?))
            }
        }
        if let Some(items) = m.get("items") {
            n.items = Some(Box::new(Node::parse(items, &format!("{path}.items"))?));
        }
        if let Some(req) = m.get("required") {
            n.required = strings(req).ok_or_else(|| bad("required"))?;
        }
        if let Some(e) = m.get("enum") {
            n.enumeration = Some(e.as_array().ok_or_else(|| bad("enum"))?.clone());
        }
        n.maximum = num(m, "maximum").map_err(|_| bad("maximum"))?;
        n.minimum = num(m, "minimum").map_err(|_| bad("minimum"))?;
        n.multiple_of = num(m, "multipleOf").map_err(|_| bad("multipleOf"))?;
        n.exclusive_maximum = flag(m, "exclusiveMaximum");
        n.exclusive_minimum = flag(m, "exclusiveMinimum");
        n.max_length = int(m, "maxLength").map_err(|_| bad("maxLength"))?;
        n.min_length = int(m, "minLength").map_err(|_| bad("minLength"))?;
        n.max_items = int(m, "maxItems").map_err(|_| bad("maxItems"))?;
        n.min_items = int(m, "minItems").map_err(|_| bad("minItems"))?;
        n.max_properties = int(m, "maxProperties").map_err(|_| bad("maxProperties"))?;
        n.min_properties = int(m, "minProperties").map_err(|_| bad("minProperties"))?;
        n.unique_items = flag(m, "uniqueItems");
        if let Some(p) = m.get("pattern").and_then(Value::as_str) {
            n.pattern = Some(
                regex::Regex::new(p).map_err(|source| SchemaError::BadPattern {
                    path: path.to_string(),
                    source,
                })?,
            );
        }
        for (kw, dst) in [
            ("allOf", &mut n.all_of),
            ("anyOf", &mut n.any_of),
            ("oneOf", &mut n.one_of),
        ] {
            if let Some(list) = m.get(kw) {
                let list = list.as_array().ok_or_else(|| bad(kw))?;
                for (i, s) in list.iter().enumerate() {
                    dst.push(Node::parse(s, &format!("{path}.{kw}[{i}]"))?);
                }
            }
        }
        if let Some(s) = m.get("not") {
            n.not = Some(Box::new(Node::parse(s, &format!("{path}.not"))?));
        }
        n.list_type = m
            .get("x-kubernetes-list-type")
            .and_then(Value::as_str)
            .map(String::from);
        if let Some(keys) = m.get("x-kubernetes-list-map-keys") {
            n.list_map_keys = strings(keys).ok_or_else(|| bad("x-kubernetes-list-map-keys"))?;
        }
        n.map_type = m
            .get("x-kubernetes-map-type")
            .and_then(Value::as_str)
            .map(String::from);
        if m.get("x-kubernetes-validations")
            .is_some_and(|r| r.as_array().is_some_and(|a| !a.is_empty()))
        {
            let mut own = v.clone();
            strip_descendant_rules(&mut own, true);
            n.rules = Some(own);
        }
        Ok(n)
    }

    /// The schema of property `k`, if declared.
    pub fn property(&self, k: &str) -> Option<&Node> {
        // A few names compare faster than one SipHash of the key.
        if self.properties.len() <= 8 {
            return self.properties.iter().find(|(n, _)| n == k).map(|(_, p)| p);
        }
        self.index.get(k).map(|&i| &self.properties[i].1)
    }

    /// Whether `pred` holds for this node or one under it that a walk of a
    /// value visits (properties, `additionalProperties`, items).
    pub fn any_in_tree(&self, pred: &impl Fn(&Node) -> bool) -> bool {
        pred(self)
            || self.properties.iter().any(|(_, p)| p.any_in_tree(pred))
            || self
                .additional_schema()
                .is_some_and(|a| a.any_in_tree(pred))
            || self.items.as_ref().is_some_and(|i| i.any_in_tree(pred))
    }

    /// The schema for the value of an undeclared key, if `additionalProperties` gives one.
    pub fn additional_schema(&self) -> Option<&Node> {
        match &self.additional {
            Additional::Schema(s) => Some(s),
            _ => None,
        }
    }

    /// kube's structural `type` (first entry), used as the "value" of CEL errors.
    pub fn type_name(&self) -> &str {
        if self.int_or_string {
            return "";
        }
        self.types.first().map(String::as_str).unwrap_or("")
    }

    pub fn has_rules_below(&self) -> bool {
        self.rules.is_some()
            || self.properties.iter().any(|(_, p)| p.has_rules_below())
            || self.items.as_ref().is_some_and(|i| i.has_rules_below())
            || self
                .additional_schema()
                .is_some_and(|a| a.has_rules_below())
    }
}

fn strip_descendant_rules(v: &mut Value, top: bool) {
    match v {
        Value::Object(m) => {
            if !top {
                m.remove("x-kubernetes-validations");
            }
            // `default`/`enum`/`example` hold data, not schemas.
            for (k, x) in m.iter_mut() {
                if !matches!(k.as_str(), "default" | "enum" | "example") {
                    strip_descendant_rules(x, false);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip_descendant_rules(x, false)),
        _ => {}
    }
}

fn flag(m: &Map<String, Value>, k: &str) -> bool {
    m.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn num(m: &Map<String, Value>, k: &str) -> Result<Option<f64>, ()> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or(()),
    }
}

fn int(m: &Map<String, Value>, k: &str) -> Result<Option<i64>, ()> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or(()),
    }
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(String::from))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_keywords() {
        let n = Node::parse(
            &json!({"type":"object","required":["a"],"properties":{
                "a":{"type":"integer","minimum":0,"format":"int32"},
                "b":{"type":"string","format":"date-time","pattern":"^x$"},
                "c":{"x-kubernetes-int-or-string":true}}}),
            "",
        )
        .unwrap();
        assert_eq!(n.required, vec!["a"]);
        let a = n.property("a").unwrap();
        assert_eq!(a.minimum, Some(0.0));
        assert_eq!(a.format, None, "int32 is stripped as kube does");
        assert_eq!(
            n.property("b").unwrap().format.as_deref(),
            Some("date-time")
        );
        assert_eq!(n.property("c").unwrap().types, vec!["integer", "string"]);
    }

    #[test]
    fn rejects_bad_pattern_and_type() {
        assert!(Node::parse(&json!({"type":"string","pattern":"("}), "").is_err());
        assert!(Node::parse(&json!({"type":5}), "").is_err());
        assert!(Node::parse(&json!([]), "").is_err());
    }
}
