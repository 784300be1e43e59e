//! The CEL view of a schema node with the size bounds kube's cost estimator reads
//! (apiserver's `common.SchemaDeclType` and `DeclType`): every list, map and string carries
//! its largest possible size, from `maxItems`/`maxProperties`/`maxLength`, an enum, the
//! format, or else from what fits in one 3 MiB request; every node its smallest JSON size.

use super::structural::{Additional, Node};

/// kube's `MaxRequestSizeBytes`: the cost model derives unbounded sizes from it, fixed
/// whatever the server's own body limit is (so estimates do not depend on a flag).
pub const MAX_REQUEST_SIZE_BYTES: u64 = 3 * 1024 * 1024;

const MAX_DURATION_SIZE_JSON: u64 = 32;
const MAX_DATETIME_SIZE_JSON: u64 = 32;
const MIN_DURATION_SIZE_JSON: u64 = 3;
const JSON_DATE_SIZE: u64 = 12;
const MIN_DATETIME_SIZE_JSON: u64 = 21;
const MIN_STRING_SIZE: u64 = 2;
const MIN_BOOL_SIZE: u64 = 4;
const MIN_NUMBER_SIZE: u64 = 1;

#[derive(Debug, Clone, PartialEq)]
pub enum DeclKind {
    /// A structural object: fields under their CEL-escaped names.
    Object(Vec<(String, Decl)>),
    List(Box<Decl>),
    /// `additionalProperties` with a schema; keys are strings.
    Map(Box<Decl>),
    String,
    Bytes,
    Int,
    Double,
    Bool,
    Duration,
    Timestamp,
    /// `x-kubernetes-int-or-string`: `dyn` in CEL.
    IntOrString,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decl {
    pub kind: DeclKind,
    /// `DeclType.MaxElements`: list items, map entries or string length; 0 for the rest.
    pub max_elements: u64,
    /// `DeclType.MinSerializedSize`.
    pub min_size: u64,
}

impl Decl {
    fn simple(kind: DeclKind, min_size: u64, max_elements: u64) -> Decl {
        Decl {
            kind,
            max_elements,
            min_size,
        }
    }

    /// kube's `SchemaDeclType`; `None` where the schema is not visible to CEL (no type,
    /// an array without items, …). `resource_root` adds `apiVersion`, `kind` and
    /// `metadata.name`/`generateName` as kube does at the root and embedded resources.
    pub fn from_node(n: &Node, resource_root: bool) -> Option<Decl> {
        if n.int_or_string {
            let max = match n.max_length {
                Some(l) => non_negative(l) * 4,
                None => MAX_REQUEST_SIZE_BYTES - 2,
            };
            return Some(Decl::simple(DeclKind::IntOrString, 1, max));
        }
        match n.types.first().map(String::as_str) {
            Some("array") => {
                let items = n.items.as_deref()?;
                let elem = Decl::from_node(items, items.embedded)?;
                let max = match n.max_items {
                    Some(m) => non_negative(m),
                    None => (MAX_REQUEST_SIZE_BYTES - 2) / (elem.min_size + 1),
                };
                Some(Decl::simple(DeclKind::List(Box::new(elem)), 2, max))
            }
            Some("object") => {
                if let Additional::Schema(a) = &n.additional {
                    let elem = Decl::from_node(a, a.embedded)?;
                    let max = match n.max_properties {
                        Some(m) => non_negative(m),
                        None => (MAX_REQUEST_SIZE_BYTES - 2) / (elem.min_size + 6),
                    };
                    return Some(Decl::simple(DeclKind::Map(Box::new(elem)), 2, max));
                }
                let mut fields = Vec::new();
                let mut min_size = 2;
                let meta_ok = !resource_root || has_type_and_object_meta(n);
                for (name, p) in &n.properties {
                    if resource_root && !meta_ok && is_meta_field(name) {
                        continue;
                    }
                    let Some(t) = Decl::from_node(p, p.embedded) else {
                        continue;
                    };
                    // Required properties without a default are always serialized.
                    if n.required.iter().any(|r| r == name) && p.default.is_none() {
                        min_size += name.len() as u64 + t.min_size + 4;
                    }
                    if let Some(escaped) = escape(name) {
                        fields.push((escaped, t));
                    }
                }
                if resource_root && !meta_ok {
                    let string = || Decl::from_node(&string_node(), false);
                    let mut meta = Vec::new();
                    meta.extend(string().map(|s| ("name".to_string(), s)));
                    meta.extend(string().map(|s| ("generateName".to_string(), s)));
                    fields.extend(string().map(|s| ("kind".to_string(), s)));
                    fields.extend(string().map(|s| ("apiVersion".to_string(), s)));
                    fields.push((
                        "metadata".to_string(),
                        Decl::simple(DeclKind::Object(meta), 2, 0),
                    ));
                }
                Some(Decl::simple(DeclKind::Object(fields), min_size, 0))
            }
            Some("string") => Some(string_decl(n)),
            Some("boolean") => Some(Decl::simple(DeclKind::Bool, MIN_BOOL_SIZE, 0)),
            Some("number") => Some(Decl::simple(DeclKind::Double, MIN_NUMBER_SIZE, 0)),
            Some("integer") => Some(Decl::simple(DeclKind::Int, MIN_NUMBER_SIZE, 0)),
            _ => None,
        }
    }

    /// The field of an object by its CEL (escaped) name.
    pub fn field(&self, name: &str) -> Option<&Decl> {
        match &self.kind {
            DeclKind::Object(fields) => fields.iter().find(|(k, _)| k == name).map(|(_, d)| d),
            _ => None,
        }
    }

    /// Items of a list or values of a map.
    pub fn elem(&self) -> Option<&Decl> {
        match &self.kind {
            DeclKind::List(e) | DeclKind::Map(e) => Some(e),
            _ => None,
        }
    }
}

fn string_decl(n: &Node) -> Decl {
    let per_request = MAX_REQUEST_SIZE_BYTES - 2;
    match n.format.as_deref() {
        Some("byte") => {
            let max = n.max_length.map(non_negative).unwrap_or(per_request);
            Decl::simple(DeclKind::Bytes, MIN_STRING_SIZE, max)
        }
        Some("duration") => Decl::simple(
            DeclKind::Duration,
            MIN_DURATION_SIZE_JSON,
            MAX_DURATION_SIZE_JSON,
        ),
        Some("date") => Decl::simple(DeclKind::Timestamp, JSON_DATE_SIZE, JSON_DATE_SIZE),
        Some("date-time") => Decl::simple(
            DeclKind::Timestamp,
            MIN_DATETIME_SIZE_JSON,
            MAX_DATETIME_SIZE_JSON,
        ),
        _ => {
            let max = if let Some(l) = n.max_length {
                // maxLength counts code points; a code point is at most 4 bytes.
                non_negative(l) * 4
            } else if let Some(e) = n.enumeration.as_ref().filter(|e| !e.is_empty()) {
                e.iter()
                    .filter_map(|v| v.as_str())
                    .map(|s| s.len() as u64)
                    .max()
                    .unwrap_or(0)
            } else {
                per_request
            };
            Decl::simple(DeclKind::String, MIN_STRING_SIZE, max)
        }
    }
}

fn string_node() -> Node {
    let mut n = Node::default();
    n.types.push("string".to_string());
    n
}

fn is_meta_field(name: &str) -> bool {
    matches!(name, "kind" | "apiVersion" | "metadata")
}

/// kube keeps the schema's own `kind`, `apiVersion` and `metadata` only when all of
/// them are declared as it expects; otherwise it replaces the three.
fn has_type_and_object_meta(n: &Node) -> bool {
    let is = |p: Option<&Node>, t: &str| p.is_some_and(|p| p.types.first().is_some_and(|x| x == t));
    let meta = n.property("metadata");
    is(n.property("kind"), "string")
        && is(n.property("apiVersion"), "string")
        && is(meta, "object")
        && meta.is_some_and(|m| !m.properties.is_empty())
        && is(meta.and_then(|m| m.property("name")), "string")
        && is(meta.and_then(|m| m.property("generateName")), "string")
}

fn non_negative(v: i64) -> u64 {
    v.max(0) as u64
}

/// How many times each child of `n` can occur per occurrence of `n` (kube's
/// `extractMaxElements`): `maxItems`/`maxProperties` of lists and maps, `None` when
/// they are unbounded, 1 for everything else.
pub fn child_multiplicity(n: &Node) -> Option<u64> {
    match n.types.first().map(String::as_str) {
        Some("object") if matches!(n.additional, Additional::Schema(_) | Additional::Allows(_)) => {
            n.max_properties.map(non_negative)
        }
        Some("array") => n.max_items.map(non_negative),
        _ => Some(1),
    }
}

/// CEL's reserved words: no identifier or escaped property name may be one.
pub const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// kube's CEL property name escaping; `None` for names CEL cannot address.
pub fn escape(name: &str) -> Option<String> {
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || first == '_') {
        return None;
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')) {
        return None;
    }
    Some(
        name.replace("__", "__underscores__")
            .replace('.', "__dot__")
            .replace('-', "__dash__")
            .replace('/', "__slash__"),
    )
}

/// The JSON property name behind a CEL field name.
pub fn unescape(name: &str) -> String {
    if let Some(inner) = name.strip_prefix("__").and_then(|n| n.strip_suffix("__")) {
        if RESERVED.contains(&inner) {
            return inner.to_string();
        }
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while !rest.is_empty() {
        let mut matched = false;
        for (esc, plain) in [
            ("__underscores__", "__"),
            ("__dot__", "."),
            ("__dash__", "-"),
            ("__slash__", "/"),
        ] {
            if let Some(r) = rest.strip_prefix(esc) {
                out.push_str(plain);
                rest = r;
                matched = true;
                break;
            }
        }
        if !matched {
            let c = rest.chars().next().unwrap_or_default();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decl(schema: serde_json::Value) -> Decl {
        Decl::from_node(&Node::parse(&schema, "").unwrap(), false).unwrap()
    }

    #[test]
    fn sizes_follow_kube() {
        // Unbounded list of strings: (3 MiB - 2) / (2 + 1).
        let d = decl(json!({"type":"array","items":{"type":"string"}}));
        assert_eq!(d.max_elements, 1_048_575);
        assert_eq!(d.elem().unwrap().max_elements, 3_145_726);
        let d = decl(json!({"type":"string","maxLength":10}));
        assert_eq!(d.max_elements, 40);
        let d = decl(json!({"type":"string","enum":["a","bcd"]}));
        assert_eq!(d.max_elements, 3);
        let d = decl(json!({"type":"object","additionalProperties":{"type":"integer"}}));
        assert_eq!(d.max_elements, 3_145_726 / 7);
        let d = decl(
            json!({"type":"object","required":["name"],"properties":{"name":{"type":"string"}}}),
        );
        assert_eq!(d.min_size, 2 + 4 + 2 + 4);
    }

    #[test]
    fn escaping_round_trips() {
        assert_eq!(
            escape("a-b.c/d__e").as_deref(),
            Some("a__dash__b__dot__c__slash__d__underscores__e")
        );
        assert_eq!(
            unescape("a__dash__b__dot__c__slash__d__underscores__e"),
            "a-b.c/d__e"
        );
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(unescape("__namespace__"), "namespace");
        assert_eq!(escape("1a"), None);
    }
}
