//! Structural schemas (apiextensions' `NewStructural` and
//! `ValidateStructural`): every field specifies its type, the logic
//! junctors (`anyOf`, `allOf`, `oneOf`, `not`) only restrict what the
//! skeleton declares, metadata stays kube's own. kube sorts these errors by
//! their text, so their order here does not depend on how they are found.

use serde_json::{Map, Value};

use super::schema::is_set;
use super::{present, str_at};
use crate::status::FieldError;

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Item,
    Field,
}

fn flag(s: &Value, k: &str) -> bool {
    s.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn props(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

fn items(s: &Value) -> Option<&Value> {
    s.get("items").filter(|i| i.is_object())
}

fn list<'a>(s: &'a Value, k: &str) -> &'a [Value] {
    s.get(k)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// Why kube cannot read the schema as structural at all (`NewStructural`'s
/// error), the first one in its walk.
pub(super) fn unsupported(s: &Value) -> Option<String> {
    if !s.is_object() {
        return None;
    }
    for (k, name) in [("id", "id"), ("$schema", "schema"), ("$ref", "$ref")] {
        if s.get(k)
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
        {
            return Some(format!("OpenAPIV3Schema '{name}' is not supported"));
        }
    }
    for (k, name) in [
        ("patternProperties", "patternProperties"),
        ("dependencies", "dependencies"),
    ] {
        if s.get(k)
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty())
        {
            return Some(format!("OpenAPIV3Schema '{name}' is not supported"));
        }
    }
    if present(s.get("additionalItems")).is_some() {
        return Some("OpenAPIV3Schema 'additionalItems' is not supported".into());
    }
    if s.get("definitions")
        .and_then(Value::as_object)
        .is_some_and(|m| !m.is_empty())
    {
        return Some("OpenAPIV3Schema 'definitions' is not supported".into());
    }
    if let Some(n) = present(s.get("not")) {
        if let Some(e) = unsupported(n) {
            return Some(e);
        }
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        if let Some(e) = list(s, k).iter().find_map(unsupported) {
            return Some(e);
        }
    }
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        return Some(
            "internal error: 'x-kubernetes-preserve-unknown-fields' must be true or undefined"
                .into(),
        );
    }
    if s.get("items").is_some_and(Value::is_array) {
        return Some("OpenAPIV3Schema 'items' must be a schema, but is an array".into());
    }
    if let Some(e) = items(s).and_then(unsupported) {
        return Some(e);
    }
    if let Some(e) = props(s).and_then(|m| m.values().find_map(unsupported)) {
        return Some(e);
    }
    s.get("additionalProperties")
        .filter(|a| a.is_object())
        .and_then(unsupported)
}

/// Whether kube takes the schema as structural (old definitions that are
/// not may stay so).
pub(super) fn is_structural(s: &Value) -> bool {
    unsupported(s).is_none() && validate(s, "").is_empty()
}

/// `ValidateStructural`: the invariants and completeness, sorted by text.
pub(super) fn validate(s: &Value, at: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    invariants(s, Level::Root, at, &mut errs);
    completeness(s, at, &mut errs);
    errs.sort_by_key(|e| e.to_string());
    errs
}

fn join(at: &str, child: &str) -> String {
    if at.is_empty() {
        child.to_string()
    } else {
        format!("{at}.{child}")
    }
}

/// `validateStructuralInvariants`.
fn invariants(s: &Value, lvl: Level, at: &str, errs: &mut Vec<FieldError>) {
    let t = str_at(s, "type");
    if t == "array" && items(s).is_none() {
        errs.push(FieldError::required(join(at, "items"), "must be specified"));
    }
    if let Some(i) = items(s) {
        invariants(i, Level::Item, &join(at, "items"), errs);
    }
    for (k, p) in props(s).into_iter().flatten() {
        invariants(
            p,
            Level::Field,
            &format!("{}[{k}]", join(at, "properties")),
            errs,
        );
    }
    let ap = present(s.get("additionalProperties"));
    if let Some(ap) = ap {
        if lvl == Level::Root {
            errs.push(FieldError::forbidden(
                join(at, "additionalProperties"),
                "must not be used at the root",
            ));
        }
        if ap.is_object() {
            invariants(ap, Level::Field, &join(at, "additionalProperties"), errs);
        }
    }
    let (int_or_string, preserve, embedded) = (
        flag(s, "x-kubernetes-int-or-string"),
        flag(s, "x-kubernetes-preserve-unknown-fields"),
        flag(s, "x-kubernetes-embedded-resource"),
    );
    if int_or_string && preserve {
        errs.push(FieldError::new(
            crate::status::FieldErrorKind::Invalid,
            join(at, "x-kubernetes-preserve-unknown-fields"),
            Some("true".into()),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if int_or_string && embedded {
        errs.push(FieldError::new(
            crate::status::FieldErrorKind::Invalid,
            join(at, "x-kubernetes-embedded-resource"),
            Some("true".into()),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    let skip_any_of = is_int_or_string_any_of(list(s, "anyOf"));
    let skip_first_all_of = list(s, "allOf")
        .first()
        .is_some_and(|a| is_int_or_string_any_of(list(a, "anyOf")));
    value_validation(s, skip_any_of, skip_first_all_of, lvl, at, errs);

    let check_metadata = lvl == Level::Root || embedded;
    if embedded && t != "object" {
        let msg = "must be object if x-kubernetes-embedded-resource is true";
        if t.is_empty() {
            errs.push(FieldError::required(join(at, "type"), msg));
        } else {
            errs.push(FieldError::invalid(join(at, "type"), t, msg));
        }
    } else if t.is_empty() && !int_or_string && !preserve {
        let msg = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(FieldError::required(join(at, "type"), msg));
    }
    if embedded && ap.is_some() {
        errs.push(FieldError::forbidden(
            join(at, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !t.is_empty() && t != "object" {
        errs.push(FieldError::invalid(
            join(at, "type"),
            t,
            "must be object at the root",
        ));
    }
    let props_at = join(at, "properties");
    for k in ["kind", "apiVersion"] {
        if let Some(p) = props(s).and_then(|m| m.get(k)) {
            let pt = str_at(p, "type");
            if check_metadata && pt != "string" {
                errs.push(FieldError::invalid(
                    format!("{props_at}[{k}].type"),
                    pt,
                    "must be string",
                ));
            }
        }
    }
    if let Some(m) = props(s).and_then(|m| m.get("metadata")) {
        let mat = format!("{props_at}[metadata]");
        let mt = str_at(m, "type");
        if check_metadata && mt != "object" {
            errs.push(FieldError::invalid(
                join(&mat, "type"),
                mt,
                "must be object",
            ));
        }
        if lvl == Level::Root && !metadata_is_implicit(m) {
            errs.push(FieldError::forbidden(
                mat,
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    if embedded && !preserve && props(s).is_none_or(Map::is_empty) {
        errs.push(FieldError::required(
            join(at, "properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// Whether the root's metadata schema says nothing beyond its type, a
/// default and the `name`/`generateName` fields.
fn metadata_is_implicit(m: &Value) -> bool {
    let Some(map) = m.as_object() else {
        return true;
    };
    map.iter().all(|(k, v)| match k.as_str() {
        "type" | "default" => true,
        // Keywords kube's structural form does not keep.
        "example" | "externalDocs" => true,
        "properties" => v
            .as_object()
            .is_none_or(|p| p.is_empty() || p.keys().all(|k| k == "name" || k == "generateName")),
        // Lists the internal form keeps only when non-empty.
        "enum" | "allOf" | "anyOf" | "oneOf" => v.as_array().is_none_or(Vec::is_empty),
        "items" | "not" | "additionalProperties" => v.is_null(),
        _ => !is_set(Some(v)),
    })
}

/// The `anyOf: [{type: integer}, {type: string}]` of int-or-string fields,
/// which is allowed to name types.
fn is_int_or_string_any_of(any_of: &[Value]) -> bool {
    let only_type = |v: &Value, t: &str| {
        v.as_object().is_some_and(|m| {
            m.iter().all(|(k, x)| {
                if k == "type" {
                    x == t
                } else {
                    !is_set(Some(x))
                }
            }) && m.get("type").is_some_and(|x| x == t)
        })
    };
    any_of.len() == 2 && only_type(&any_of[0], "integer") && only_type(&any_of[1], "string")
}

/// `validateValueValidation`: the junctors below a node, and its pattern.
fn value_validation(
    s: &Value,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    lvl: Level,
    at: &str,
    errs: &mut Vec<FieldError>,
) {
    if !skip_any_of {
        for (i, v) in list(s, "anyOf").iter().enumerate() {
            nested(v, false, lvl, &format!("{}[{i}]", join(at, "anyOf")), errs);
        }
    }
    for (i, v) in list(s, "allOf").iter().enumerate() {
        let skip = skip_first_all_of_any_of && i == 0;
        nested(v, skip, lvl, &format!("{}[{i}]", join(at, "allOf")), errs);
    }
    for (i, v) in list(s, "oneOf").iter().enumerate() {
        nested(v, false, lvl, &format!("{}[{i}]", join(at, "oneOf")), errs);
    }
    if let Some(n) = present(s.get("not")) {
        nested(n, false, lvl, &join(at, "not"), errs);
    }
    let pattern = str_at(s, "pattern");
    if !pattern.is_empty() {
        if let Err(e) = regex::Regex::new(pattern) {
            errs.push(FieldError::invalid(
                join(at, "pattern"),
                pattern,
                format!(
                    "must be a valid regular expression, but isn't: {}",
                    go_regexp_error(pattern, &e)
                ),
            ));
        }
    }
}

/// Go's `regexp.Compile` message for the common mistakes (the Rust engine
/// says it differently).
fn go_regexp_error(p: &str, e: &regex::Error) -> String {
    let text = e.to_string();
    let code = if text.contains("unclosed character class") {
        let from = p.rfind('[').unwrap_or(0);
        return format!("error parsing regexp: missing closing ]: `{}`", &p[from..]);
    } else if text.contains("unclosed group") {
        "missing closing )"
    } else if text.contains("unopened group") {
        "unexpected )"
    } else if text.contains("repetition operator missing expression") {
        "missing argument to repetition operator"
    } else if text.contains("look-around") {
        "invalid or unsupported Perl syntax"
    } else {
        "invalid syntax"
    };
    format!("error parsing regexp: {code}: `{p}`")
}

/// `validateNestedValueValidation`: a junctor's schema may only restrict
/// values, not declare types, defaults or extensions.
fn nested(v: &Value, skip_any_of: bool, lvl: Level, at: &str, errs: &mut Vec<FieldError>) {
    if !v.is_object() {
        return;
    }
    value_validation(v, skip_any_of, false, lvl, at, errs);
    if let Some(i) = items(v) {
        nested(i, false, lvl, &join(at, "items"), errs);
    }
    let props_at = join(at, "properties");
    for (k, p) in props(v).into_iter().flatten() {
        nested(p, false, Level::Field, &format!("{props_at}[{k}]"), errs);
    }
    let forbid = |errs: &mut Vec<FieldError>, k: &str, msg: &str| {
        errs.push(FieldError::forbidden(join(at, k), msg));
    };
    if !str_at(v, "type").is_empty() {
        forbid(errs, "type", "must be empty to be structural");
    }
    match v.get("additionalProperties") {
        Some(Value::Bool(true)) | Some(Value::Object(_)) => forbid(
            errs,
            "additionalProperties",
            "must be undefined to be structural",
        ),
        _ => {}
    }
    if present(v.get("default")).is_some() {
        forbid(errs, "default", "must be undefined to be structural");
    }
    if !str_at(v, "title").is_empty() {
        forbid(errs, "title", "must be empty to be structural");
    }
    if !str_at(v, "description").is_empty() {
        forbid(errs, "description", "must be empty to be structural");
    }
    if flag(v, "nullable") {
        forbid(errs, "nullable", "must be false to be structural");
    }
    for k in [
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
    ] {
        if flag(v, k) {
            forbid(errs, k, "must be false to be structural");
        }
    }
    if !list(v, "x-kubernetes-list-map-keys").is_empty() {
        forbid(
            errs,
            "x-kubernetes-list-map-keys",
            "must be empty to be structural",
        );
    }
    for k in ["x-kubernetes-list-type", "x-kubernetes-map-type"] {
        if present(v.get(k)).is_some() {
            forbid(errs, k, "must be undefined to be structural");
        }
    }
    if !list(v, "x-kubernetes-validations").is_empty() {
        forbid(
            errs,
            "x-kubernetes-validations",
            "must be empty to be structural",
        );
    }
    if props(v).is_some_and(|m| m.contains_key("metadata")) {
        errs.push(FieldError::forbidden(
            format!("{props_at}[metadata]"),
            "must not be specified in a nested context",
        ));
    }
}

/// `validateStructuralCompleteness`: what the root's junctors name must be
/// declared by the skeleton too.
fn completeness(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    junctor_completeness(s, Some(s), at, at, errs);
}

fn junctor_completeness(
    v: &Value,
    s: Option<&Value>,
    s_at: &str,
    v_at: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(n) = present(v.get("not")) {
        nested_completeness(n, s, s_at, &join(v_at, "not"), errs);
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        for (i, c) in list(v, k).iter().enumerate() {
            nested_completeness(c, s, s_at, &format!("{}[{i}]", join(v_at, k)), errs);
        }
    }
}

fn nested_completeness(
    v: &Value,
    s: Option<&Value>,
    s_at: &str,
    v_at: &str,
    errs: &mut Vec<FieldError>,
) {
    let Some(s) = s else {
        errs.push(FieldError::required(
            s_at,
            format!("because it is defined in {v_at}"),
        ));
        return;
    };
    junctor_completeness(v, Some(s), s_at, v_at, errs);
    if let Some(vi) = items(v) {
        nested_completeness(
            vi,
            items(s),
            &join(s_at, "items"),
            &join(v_at, "items"),
            errs,
        );
    }
    for (k, vp) in props(v).into_iter().flatten() {
        let sp = format!("{}[{k}]", join(s_at, "properties"));
        let vpath = format!("{}[{k}]", join(v_at, "properties"));
        match props(s).and_then(|m| m.get(k)) {
            None => errs.push(FieldError::required(
                sp,
                format!("because it is defined in {vpath}"),
            )),
            Some(sf) => nested_completeness(vp, Some(sf), &sp, &vpath, errs),
        }
    }
}

/// A selectable field's path (`.spec.color`, no array notation) walked
/// through the schema: its segments and the schema it names (kube's
/// `cel.ValidFieldPath`).
pub(super) fn field_path<'a>(
    path: &str,
    schema: Option<&'a Value>,
) -> Result<(Vec<String>, Option<&'a Value>), String> {
    walk_path(path, schema, false)
}

/// The same walk with `['key']` allowed (a rule's `fieldPath`).
pub(super) fn field_path_with_arrays<'a>(
    path: &str,
    schema: Option<&'a Value>,
) -> Result<(Vec<String>, Option<&'a Value>), String> {
    walk_path(path, schema, true)
}

fn tokens(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b: Vec<char> = path.chars().collect();
    let mut i = 0;
    while i < b.len() {
        if b[i] == '\'' {
            // A quoted string up to the next unescaped quote.
            let mut j = i + 1;
            while j < b.len() && !(b[j] == '\'' && b[j - 1] != '\\') {
                j += 1;
            }
            let end = (j + 1).min(b.len());
            out.push(b[i..end].iter().collect());
            i = end;
            continue;
        }
        if matches!(b[i], '.' | '[' | ']') {
            out.push(b[i].to_string());
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && !matches!(b[j], '.' | '[' | ']') {
            j += 1;
        }
        out.push(b[i..j].iter().collect());
        i = j;
    }
    out
}

fn walk_path<'a>(
    path: &str,
    schema: Option<&'a Value>,
    arrays: bool,
) -> Result<(Vec<String>, Option<&'a Value>), String> {
    let mut cur = schema;
    let mut segments = Vec::new();
    let toks = tokens(path);
    let mut it = toks.iter();
    let step = |cur: Option<&'a Value>, name: &str| -> Result<Option<&'a Value>, String> {
        let s = cur.ok_or("does not refer to a valid field")?;
        if let Some(p) = props(s) {
            return p
                .get(name)
                .map(Some)
                .ok_or_else(|| "does not refer to a valid field".into());
        }
        match present(s.get("additionalProperties")) {
            Some(ap) => Ok(ap.is_object().then_some(ap)),
            None => Err("does not refer to a valid field".into()),
        }
    };
    while let Some(tok) = it.next() {
        match tok.as_str() {
            "[" => {
                if !arrays {
                    return Err("array notation is not allowed".into());
                }
                let t = it.next().ok_or("unexpected end of JSON path")?;
                if t.len() < 2 || !t.starts_with('\'') || !t.ends_with('\'') {
                    return Err(format!("expected single quoted string but got {t}"));
                }
                let key = t[1..t.len() - 1].replace("\\'", "'");
                cur = step(cur, &key)?;
                segments.push(key);
                match it.next() {
                    Some(c) if c == "]" => {}
                    Some(c) => return Err(format!("expected ] but got {c}")),
                    None => return Err("unexpected end of JSON path".into()),
                }
            }
            "." => {
                let t = it.next().ok_or("unexpected end of JSON path")?;
                cur = step(cur, t)?;
                segments.push(t.clone());
            }
            other => return Err(format!("expected [ or . but got: {other}")),
        }
    }
    Ok((segments, cur))
}
