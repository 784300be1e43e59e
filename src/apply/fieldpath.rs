//! Field paths and field sets, and their FieldsV1 wire form.
//!
//! Mirrors structured-merge-diff's `fieldpath` package: a [`Set`] is a tree of
//! [`PathElement`]s where a node may be a *member* (the field itself is owned)
//! and/or have *children* (fields below it are owned). The ordering of path
//! elements matters because kube serialises FieldsV1 in that order and users
//! diff managedFields byte for byte.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// One step of a path into an object.
#[derive(Clone, Debug)]
pub enum PathElement {
    /// A struct field or a map key: `f:name`, printed `.name`.
    Field(String),
    /// An associative-list item identified by its key fields, sorted by name:
    /// `k:{"name":"nginx"}`, printed `[name="nginx"]`.
    Key(Vec<(String, Value)>),
    /// A set-list item identified by its value: `v:"a"`, printed `[="a"]`.
    Value(Value),
    /// A list item by position: `i:0`, printed `[0]`. Only read, kube never writes it for CRs.
    Index(i64),
}

/// A path from the object root.
pub type Path = Vec<PathElement>;

impl PathElement {
    fn rank(&self) -> u8 {
        // kube orders field names before keys before values before indexes.
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }
}

impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.as_bytes().cmp(b.as_bytes()),
            (PathElement::Key(a), PathElement::Key(b)) => compare_key_lists(a, b),
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}
impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for PathElement {}

fn compare_key_lists(a: &[(String, Value)], b: &[(String, Value)]) -> Ordering {
    for i in 0.. {
        match (a.get(i), b.get(i)) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((an, av)), Some((bn, bv))) => {
                let c = an
                    .as_bytes()
                    .cmp(bn.as_bytes())
                    .then_with(|| compare_values(av, bv));
                if c != Ordering::Equal {
                    return c;
                }
            }
        }
    }
    Ordering::Equal
}

fn as_f64(n: &serde_json::Number) -> f64 {
    n.as_f64().unwrap_or(0.0)
}

fn is_float(n: &serde_json::Number) -> bool {
    !(n.is_i64() || n.is_u64())
}

/// Total order on JSON values, as structured-merge-diff's `value.Compare`:
/// numbers < strings < bools < lists < maps < null; ints and floats compare numerically.
pub fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if is_float(x) || is_float(y) {
                as_f64(x).partial_cmp(&as_f64(y)).unwrap_or(Ordering::Equal)
            } else if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x.cmp(&y)
            } else {
                as_f64(x).partial_cmp(&as_f64(y)).unwrap_or(Ordering::Equal)
            }
        }
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for i in 0.. {
                match (x.get(i), y.get(i)) {
                    (None, None) => return Ordering::Equal,
                    (None, Some(_)) => return Ordering::Less,
                    (Some(_), None) => return Ordering::Greater,
                    (Some(l), Some(r)) => {
                        let c = compare_values(l, r);
                        if c != Ordering::Equal {
                            return c;
                        }
                    }
                }
            }
            Ordering::Equal
        }
        (Value::Object(x), Value::Object(y)) => compare_maps(x, y),
        (Value::Null, Value::Null) => Ordering::Equal,
        _ => rank(a).cmp(&rank(b)),
    }
}

// Follows kube's MapCompare: walk the union of keys in lexical order.
fn compare_maps(x: &Map<String, Value>, y: &Map<String, Value>) -> Ordering {
    if x.is_empty() && y.is_empty() {
        return Ordering::Equal;
    }
    let keys: BTreeSet<&str> = x.keys().chain(y.keys()).map(String::as_str).collect();
    for (i, k) in keys.into_iter().enumerate() {
        let c = if i == x.len() {
            Ordering::Less
        } else if i == y.len() {
            Ordering::Greater
        } else {
            match (x.get(k), y.get(k)) {
                (None, _) => Ordering::Greater,
                (_, None) => Ordering::Less,
                (Some(l), Some(r)) => compare_values(l, r),
            }
        };
        if c != Ordering::Equal {
            return c;
        }
    }
    Ordering::Equal
}

/// Deep equality with kube's numeric semantics (`1` equals `1.0`).
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| values_equal(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(l, r)| values_equal(l, r))
        }
        _ => compare_values(a, b) == Ordering::Equal,
    }
}

impl std::fmt::Display for PathElement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", go_value_string(v)))
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={}]", go_value_string(v)),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// kube's path string, e.g. `.spec.containers[name="nginx"].image`.
pub fn path_string(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// structured-merge-diff's `value.ToString`, which prints strings with Go's `%q`.
fn go_value_string(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if is_float(n) => go_float(as_f64(n), false),
        Value::Number(n) => n.to_string(),
        Value::String(s) => go_quote(s),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(go_value_string).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            keys.iter()
                .map(|k| format!("{k}={}", go_value_string(&m[k.as_str()])))
                .collect()
        }
    }
}

/// Go's `strconv.Quote` for the characters that occur in practice.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Formats a float as Go does: `%v` (exponent from 1e21 or below 1e-4) or
/// encoding/json (exponent from 1e21 or below 1e-6).
fn go_float(f: f64, json: bool) -> String {
    let abs = f.abs();
    let small = if json { 1e-6 } else { 1e-4 };
    if abs != 0.0 && !(small..1e21).contains(&abs) {
        let s = format!("{f:e}");
        // Rust prints `1e21` / `1e-7`; Go prints `1e+21` and, for %v, `1e-07`.
        match s.split_once('e') {
            Some((mant, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                if json {
                    format!("{mant}e{sign}{digits}")
                } else {
                    format!("{mant}e{sign}{digits:0>2}")
                }
            }
            None => s,
        }
    } else {
        // Rust's Display is the shortest round-trip form without exponent, as Go's 'f' with -1.
        format!("{f}")
    }
}

/// Go `encoding/json` string escaping (HTML-safe), used where kube emits JSON
/// through Go's encoder: key values inside `k:`/`v:` elements, manager
/// identifiers and the last-applied annotation.
pub fn go_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go `encoding/json` encoding of a value: object keys sorted, no whitespace.
pub fn go_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) if is_float(n) => out.push_str(&go_float(as_f64(n), true)),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => go_json_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_json(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                go_json_string(k, out);
                out.push(':');
                go_json(&m[k.as_str()], out);
            }
            out.push('}');
        }
    }
}

impl PathElement {
    /// The FieldsV1 key for this element (`f:`, `k:`, `v:`, `i:`).
    pub fn to_fields_key(&self) -> String {
        match self {
            PathElement::Field(name) => {
                // Not `format!`: this runs for every field of every write.
                let mut s = String::with_capacity(2 + name.len());
                s.push_str("f:");
                s.push_str(name);
                s
            }
            PathElement::Key(fields) => {
                let mut s = String::from("k:{");
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        s.push(',');
                    }
                    go_json_string(k, &mut s);
                    s.push(':');
                    go_json(v, &mut s);
                }
                s.push('}');
                s
            }
            PathElement::Value(v) => {
                let mut s = String::from("v:");
                go_json(v, &mut s);
                s
            }
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a FieldsV1 key. `Ok(None)` is an unknown prefix, which kube skips
    /// so newer servers' keys do not break older readers.
    pub fn from_fields_key(key: &str) -> Result<Option<PathElement>, String> {
        let bytes = key.as_bytes();
        if bytes.len() < 2 {
            return Err(format!("key must be 2 characters long: {key}"));
        }
        if bytes[1] != b':' {
            return Err(format!("missing colon: {key}"));
        }
        let rest = &key[2..];
        match bytes[0] {
            b'f' => Ok(Some(PathElement::Field(rest.to_string()))),
            b'v' => serde_json::from_str::<Value>(rest)
                .map(|v| Some(PathElement::Value(v)))
                .map_err(|e| e.to_string()),
            b'k' => {
                let parsed: Value = serde_json::from_str(rest).map_err(|e| e.to_string())?;
                let Value::Object(m) = parsed else {
                    return Err(format!("key element is not an object: {key}"));
                };
                let mut fields: Vec<(String, Value)> = m.into_iter().collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(Some(PathElement::Key(fields)))
            }
            b'i' => rest
                .parse::<i64>()
                .map(|i| Some(PathElement::Index(i)))
                .map_err(|e| e.to_string()),
            _ => Ok(None),
        }
    }
}

/// A set of paths, stored as a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Set {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, Set>,
}

impl Set {
    pub fn new() -> Set {
        Set::default()
    }

    pub fn from_paths<'a>(paths: impl IntoIterator<Item = &'a [PathElement]>) -> Set {
        let mut s = Set::new();
        for p in paths {
            s.insert(p);
        }
        s
    }

    /// Inserts a path; the empty path is ignored, as in kube.
    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                if !self.members.contains(last) {
                    self.members.insert(last.clone());
                }
            }
            // The element is cloned only when its level is new.
            [first, rest @ ..] => match self.children.get_mut(first) {
                Some(child) => child.insert(rest),
                None => {
                    let mut child = Set::new();
                    child.insert(rest);
                    self.children.insert(first.clone(), child);
                }
            },
        }
    }

    /// `self ∪ other`, in place, taking `other`'s elements without copies.
    pub fn union_with(&mut self, other: Set) {
        if self.members.is_empty() && self.children.is_empty() {
            *self = other;
            return;
        }
        self.members.extend(other.members);
        for (pe, child) in other.children {
            match self.children.get_mut(&pe) {
                Some(mine) => mine.union_with(child),
                None => {
                    self.children.insert(pe, child);
                }
            }
        }
    }

    /// `self − other` in place (see [`Set::difference`]).
    pub fn subtract(&mut self, other: &Set) {
        self.members.retain(|m| !other.members.contains(m));
        self.children
            .retain(|pe, child| match other.children.get(pe) {
                Some(theirs) => {
                    child.subtract(theirs);
                    !child.is_empty()
                }
                None => true,
            });
    }

    /// [`Set::recursive_difference`] in place.
    pub fn subtract_recursive(&mut self, other: &Set) {
        self.members.retain(|m| !other.members.contains(m));
        self.children.retain(|pe, child| {
            if other.members.contains(pe) {
                return false;
            }
            match other.children.get(pe) {
                Some(theirs) => {
                    child.subtract_recursive(theirs);
                    !child.is_empty()
                }
                None => true,
            }
        });
    }

    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(Set::is_empty)
    }

    /// The subtree below one element, if any.
    pub fn with_prefix(&self, pe: &PathElement) -> Option<&Set> {
        self.children.get(pe)
    }

    pub(crate) fn members(&self) -> &BTreeSet<PathElement> {
        &self.members
    }

    pub(crate) fn children(&self) -> &BTreeMap<PathElement, Set> {
        &self.children
    }

    pub(crate) fn add_member(&mut self, pe: PathElement) {
        self.members.insert(pe);
    }

    pub(crate) fn set_child(&mut self, pe: PathElement, child: Set) {
        if child.is_empty() {
            self.children.remove(&pe);
        } else {
            self.children.insert(pe, child);
        }
    }

    pub fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, child) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.set_child(pe.clone(), merged);
        }
        out
    }

    /// Members present in both, and children intersected level by level
    /// (a member on one side does not match children on the other, as in kube).
    pub fn intersection(&self, other: &Set) -> Set {
        let mut out = Set::new();
        out.members = self.members.intersection(&other.members).cloned().collect();
        for (pe, child) in &self.children {
            if let Some(theirs) = other.children.get(pe) {
                out.set_child(pe.clone(), child.intersection(theirs));
            }
        }
        out
    }

    pub fn difference(&self, other: &Set) -> Set {
        let mut out = Set::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (pe, child) in &self.children {
            let rest = match other.children.get(pe) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            out.set_child(pe.clone(), rest);
        }
        out
    }

    /// Like [`Set::difference`], but a member of `other` also removes everything below it.
    pub fn recursive_difference(&self, other: &Set) -> Set {
        let mut out = Set::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (pe, child) in &self.children {
            if other.members.contains(pe) {
                continue;
            }
            let rest = match other.children.get(pe) {
                Some(theirs) => child.recursive_difference(theirs),
                None => child.clone(),
            };
            out.set_child(pe.clone(), rest);
        }
        out
    }

    /// All paths, members of a level before its children, in element order (kube's Iterate).
    pub fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        for m in &self.members {
            let mut p = prefix.clone();
            p.push(m.clone());
            out.push(p);
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// The FieldsV1 object, keys in kube's order (`.` first, then elements in order).
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.fields_v1_level(false))
    }

    fn fields_v1_level(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self && !(self.members.is_empty() && self.children.is_empty()) {
            out.insert(".".into(), Value::Object(Map::new()));
        }
        // Members and children are interleaved by element order; an element
        // that is both is written once with a "." entry inside.
        // Both are sorted: a merge, without a set of their union.
        let mut members = self.members.iter().peekable();
        let mut children = self.children.iter().peekable();
        loop {
            let (pe, body) = match (members.peek(), children.peek()) {
                (None, None) => return out,
                (Some(m), Some((c, child))) if *m == *c => {
                    let level = child.fields_v1_level(true);
                    let pe = *c;
                    members.next();
                    children.next();
                    (pe, level)
                }
                (Some(m), Some((c, _))) if *m < *c => {
                    let pe = *m;
                    members.next();
                    (pe, Map::new())
                }
                (Some(m), None) => {
                    let pe = *m;
                    members.next();
                    (pe, Map::new())
                }
                (_, Some((c, child))) => {
                    let level = child.fields_v1_level(false);
                    let pe = *c;
                    children.next();
                    (pe, level)
                }
            };
            out.insert(pe.to_fields_key(), Value::Object(body));
        }
    }

    /// The exact bytes kube writes for this set.
    pub fn to_fields_v1_string(&self) -> String {
        let mut out = String::new();
        write_fields_json(&self.to_fields_v1(), &mut out);
        out
    }

    /// Parses FieldsV1 as kube does: `{}` under a key marks a leaf member,
    /// `"."` marks a member that also has children, unknown prefixes are skipped.
    pub fn from_fields_v1(v: &Value) -> Result<Set, String> {
        let (children, _) = read_fields_level(v)?;
        Ok(children.unwrap_or_default())
    }
}

// jsoniter's writer escapes object keys like encoding/json but without the
// HTML escaping (the k:/v: payload inside the key was already Go-encoded).
fn write_fields_json(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            out.push('{');
            for (i, (k, child)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('"');
                for c in k.chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        '\n' => out.push_str("\\n"),
                        '\r' => out.push_str("\\r"),
                        '\t' => out.push_str("\\t"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push_str("\":");
                write_fields_json(child, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn read_fields_level(v: &Value) -> Result<(Option<Set>, bool), String> {
    let Value::Object(m) = v else {
        return Err(format!("expected an object in FieldsV1, got {v}"));
    };
    let mut children: Option<Set> = None;
    let mut is_member = false;
    for (key, child) in m {
        if key == "." {
            is_member = true;
            continue;
        }
        let Some(pe) = PathElement::from_fields_key(key)
            .map_err(|e| format!("parsing key as path element: {e}"))?
        else {
            continue;
        };
        let (grandchildren, child_is_member) = read_fields_level(child)?;
        let level = children.get_or_insert_with(Set::new);
        if child_is_member {
            level.members.insert(pe.clone());
        }
        if let Some(g) = grandchildren {
            level.children.insert(pe, g);
        }
    }
    if children.is_none() {
        is_member = true;
    }
    Ok((children, is_member))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn f(s: &str) -> PathElement {
        PathElement::Field(s.into())
    }

    #[test]
    fn deployment_like_fields_v1_is_byte_exact() {
        let key = PathElement::Key(vec![("name".into(), json!("nginx"))]);
        let mut s = Set::new();
        s.insert(&[f("spec"), f("replicas")]);
        s.insert(&[
            f("spec"),
            f("template"),
            f("spec"),
            f("containers"),
            key.clone(),
        ]);
        s.insert(&[
            f("spec"),
            f("template"),
            f("spec"),
            f("containers"),
            key.clone(),
            f("image"),
        ]);
        s.insert(&[
            f("spec"),
            f("template"),
            f("spec"),
            f("containers"),
            key.clone(),
            f("name"),
        ]);
        s.insert(&[
            f("metadata"),
            f("finalizers"),
            PathElement::Value(json!("a/b")),
        ]);
        let out = s.to_fields_v1_string();
        assert_eq!(
            out,
            r#"{"f:metadata":{"f:finalizers":{"v:\"a/b\"":{}}},"f:spec":{"f:replicas":{},"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{}}}}}}}"#
        );
        assert_eq!(serde_json::to_string(&s.to_fields_v1()).expect("json"), out);
        let back =
            Set::from_fields_v1(&serde_json::from_str(&out).expect("parse")).expect("decode");
        assert_eq!(back, s);
    }

    #[test]
    fn multi_key_elements_sort_fields_and_compare_numbers() {
        let pe = PathElement::from_fields_key(r#"k:{"protocol":"TCP","containerPort":80}"#)
            .expect("parse")
            .expect("known");
        assert_eq!(
            pe.to_fields_key(),
            r#"k:{"containerPort":80,"protocol":"TCP"}"#
        );
        assert_eq!(pe.to_string(), r#"[containerPort=80,protocol="TCP"]"#);
        let float = PathElement::Key(vec![
            ("containerPort".into(), json!(80.0)),
            ("protocol".into(), json!("TCP")),
        ]);
        assert_eq!(pe, float);
        assert_eq!(
            PathElement::from_fields_key("x:foo").expect("unknown"),
            None
        );
        assert!(PathElement::from_fields_key("f").is_err());
        assert!(PathElement::from_fields_key("fx").is_err());
    }

    #[test]
    fn element_order_matches_kube() {
        let mut v = [
            PathElement::Index(0),
            PathElement::Value(json!("a")),
            PathElement::Value(json!(1)),
            PathElement::Key(vec![("a".into(), json!("b"))]),
            f("z"),
            f("B"),
        ];
        v.sort();
        let keys: Vec<String> = v.iter().map(PathElement::to_fields_key).collect();
        assert_eq!(
            keys,
            vec!["f:B", "f:z", r#"k:{"a":"b"}"#, "v:1", r#"v:"a""#, "i:0"]
        );
    }

    #[test]
    fn set_algebra() {
        let mut a = Set::new();
        a.insert(&[f("spec"), f("a")]);
        a.insert(&[f("spec"), f("b")]);
        a.insert(&[f("status")]);
        let mut b = Set::new();
        b.insert(&[f("spec"), f("b")]);
        b.insert(&[f("status"), f("x")]);
        assert_eq!(path_string(&a.paths()[0]), ".status");
        assert!(a.intersection(&b).has(&[f("spec"), f("b")]));
        assert!(!a.intersection(&b).has(&[f("status")]));
        let d = a.difference(&b);
        assert!(
            d.has(&[f("spec"), f("a")]) && !d.has(&[f("spec"), f("b")]) && d.has(&[f("status")])
        );
        let mut x = Set::new();
        x.insert(&[f("spec")]);
        let r = a.recursive_difference(&x);
        assert!(!r.has(&[f("spec"), f("a")]) && r.has(&[f("status")]));
        assert!(a.union(&b).has(&[f("status"), f("x")]));
        assert!(Set::new().is_empty());
    }

    #[test]
    fn fields_v1_decoding_quirks() {
        // Unknown prefixes are skipped; a node with only "." is a member.
        let v = json!({"f:a": {".": {}, "f:b": {}}, "z:zz": {}, "f:c": {}});
        let s = Set::from_fields_v1(&v).expect("decode");
        assert!(s.has(&[f("a")]) && s.has(&[f("a"), f("b")]) && s.has(&[f("c")]));
        assert_eq!(
            s.to_fields_v1_string(),
            r#"{"f:a":{".":{},"f:b":{}},"f:c":{}}"#
        );
        assert!(Set::from_fields_v1(&json!({"f:a": 1})).is_err());
        assert!(Set::from_fields_v1(&json!({"k:notjson": {}})).is_err());
        assert!(Set::from_fields_v1(&json!({})).expect("empty").is_empty());
    }

    #[test]
    fn html_and_quotes_escape_like_go() {
        let pe = PathElement::Value(json!("a<b"));
        assert_eq!(pe.to_fields_key(), r#"v:"a\u003cb""#);
        assert_eq!(go_quote("a\"b"), r#""a\"b""#);
        assert_eq!(go_float(1e21, true), "1e+21");
        assert_eq!(go_float(1.5, true), "1.5");
        assert_eq!(go_float(80.0, true), "80");
    }

    const FIELD_KEYS: &[&str] = &[
        ".",
        "f:a",
        "f:spec",
        "f:",
        "f:é",
        "k:{\"name\":\"a\"}",
        "k:{\"a\":1,\"b\":[1]}",
        "k:{}",
        "k:[]",
        "k:{",
        "k:{\"a\":1e999}",
        "v:1",
        "v:\"x\"",
        "v:[1,{}]",
        "v:",
        "v:nul",
        "i:0",
        "i:-1",
        "i:99999999999999999999",
        "i:x",
        "z:unknown",
        "é:",
        "f",
        "",
        ":",
        "ff:a",
    ];

    /// FieldsV1-like JSON: objects keyed by (mostly) element keys, with
    /// arbitrary values here and there.
    fn fields_v1() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            6 => prop::sample::select(FIELD_KEYS).prop_map(str::to_string),
            1 => any::<String>(),
        ];
        let leaf = prop_oneof![
            8 => Just(json!({})),
            1 => crate::fuzz::json_value(),
        ];
        leaf.prop_recursive(6, 64, 6, move |inner| {
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any JSON decodes to a set or an error; a decoded set encodes to
        /// FieldsV1 that decodes again.
        #[test]
        fn prop_fields_v1_never_panics(
            v in prop_oneof![4 => fields_v1(), 1 => crate::fuzz::json_value()],
            key in crate::fuzz::text(FIELD_KEYS, 4),
        ) {
            let _ = PathElement::from_fields_key(&key);
            if let Ok(set) = Set::from_fields_v1(&v) {
                let _ = set.to_fields_v1_string();
                let again = Set::from_fields_v1(&set.to_fields_v1());
                prop_assert!(again.is_ok(), "{:?}", again);
                for p in set.paths() {
                    let _ = path_string(&p);
                }
            }
        }

        /// The in-place set operations give exactly what the copying ones give.
        #[test]
        fn prop_in_place_operations_match_the_copying_ones(a in fields_v1(), b in fields_v1()) {
            let (Ok(a), Ok(b)) = (Set::from_fields_v1(&a), Set::from_fields_v1(&b)) else {
                return Ok(());
            };
            let mut u = a.clone();
            u.union_with(b.clone());
            prop_assert_eq!(u, a.union(&b));
            let mut d = a.clone();
            d.subtract(&b);
            prop_assert_eq!(d, a.difference(&b));
            let mut r = a.clone();
            r.subtract_recursive(&b);
            prop_assert_eq!(r, a.recursive_difference(&b));
            let mut built = Set::new();
            for p in a.paths() {
                built.insert(&p);
            }
            prop_assert_eq!(built.paths(), a.paths());
        }
    }
}
