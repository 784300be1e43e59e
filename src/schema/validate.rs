//! OpenAPI value validation as kube-openapi's `SchemaValidator` runs it for CRDs, with
//! its errors converted to field errors the way apiextensions'
//! `kubeOpenAPIResultToFieldErrors` does (so messages read
//! `spec.x in body should be ...`).
//!
//! Per node the validators run in kube-openapi's order: type, junctors (allOf/anyOf/
//! oneOf/not), string, format, number, array, enum, object. Every validator runs even
//! after the type check failed, as in kube.

use super::formats;
use super::render::{field_value, go_float, json_type};
use super::structural::{normalize_format, Additional, Node};
use crate::status::{quote, FieldError, FieldErrorKind};
use serde_json::Value;

/// kube-openapi names a child `parent.key` (or `key` at the root).
pub fn child(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

pub fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// The field path of an error named `name`: kube trims the leading dot of root children
/// and prints a nil path as `<nil>`.
fn field_of(name: &str) -> String {
    let f = name.trim_start_matches('.');
    if f.is_empty() {
        "<nil>".to_string()
    } else {
        f.to_string()
    }
}

fn invalid(name: &str, value: String, detail: String) -> FieldError {
    FieldError::new(FieldErrorKind::Invalid, field_of(name), Some(value), detail)
}

fn type_invalid(name: &str, type_name: &str, got: &str) -> FieldError {
    FieldError::new(
        FieldErrorKind::TypeInvalid,
        field_of(name),
        Some(quote(got)),
        format!("{name} in body must be of type {type_name}: {}", quote(got)),
    )
}

/// Validates `v` against `n`, appending errors.
pub fn value(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        // kube runs only the type and enum validators on null.
        if !n.types.is_empty() && !n.nullable {
            errs.push(type_invalid(path, &n.types.join(","), "null"));
        }
        enumeration(n, v, path, errs);
        return;
    }
    check_type(n, v, path, errs);
    junctors(n, v, path, errs);
    if let Value::String(s) = v {
        string(n, s, path, errs);
        if let Some(f) = &n.format {
            if !formats::is_valid(&normalize_format(f), s) {
                errs.push(type_invalid(path, f, s));
            }
        }
    }
    if let Value::Number(num) = v {
        number(n, num, path, errs);
    }
    if let Value::Array(a) = v {
        array(n, a, path, errs);
    }
    enumeration(n, v, path, errs);
    if let Value::Object(m) = v {
        object(n, m, path, errs);
    }
}

fn check_type(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if n.types.is_empty() {
        return;
    }
    let got = json_type(v);
    let has = |t: &str| n.types.iter().any(|x| x == t);
    let float_int =
        got == "number" && v.as_f64().is_some_and(|f| f.fract() == 0.0) && has("integer");
    let int_float = got == "integer" && has("number");
    let ok = has(got) || float_int || int_float;
    if let Some(f) = &n.format {
        if !v.is_string() && !v.is_array() && !ok {
            // The format check comes first and names Go's format of the decoded value.
            let data_format = match got {
                "integer" => "int64",
                "number" => "float64",
                _ => "",
            };
            errs.push(type_invalid(path, f, data_format));
            return;
        }
    }
    if !ok {
        errs.push(type_invalid(path, &n.types.join(","), got));
    }
}

/// Runs `n` on `v` into a fresh list, for the junctors that need pass/fail per branch.
fn trial(n: &Node, v: &Value, path: &str) -> Vec<FieldError> {
    let mut e = Vec::new();
    value(n, v, path, &mut e);
    e
}

fn junctors(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let junctor_error =
        |msg: String| FieldError::new(FieldErrorKind::Invalid, "<nil>", Some(quote("")), msg);
    if !n.any_of.is_empty() {
        let results: Vec<Vec<FieldError>> = n.any_of.iter().map(|b| trial(b, v, path)).collect();
        if !results.iter().any(Vec::is_empty) {
            errs.push(junctor_error(format!(
                "{} must validate at least one schema (anyOf)",
                quote(path)
            )));
            // kube adds the failures of the closest branch; we take the one with fewest errors.
            if let Some(best) = results.iter().min_by_key(|r| r.len()) {
                errs.extend(best.iter().cloned());
            }
        }
    }
    if !n.one_of.is_empty() {
        let results: Vec<Vec<FieldError>> = n.one_of.iter().map(|b| trial(b, v, path)).collect();
        let valid = results.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let extra = if valid == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {valid} valid alternatives")
            };
            errs.push(junctor_error(format!(
                "{} must validate one and only one schema (oneOf). {extra}",
                quote(path)
            )));
            if valid == 0 {
                if let Some(best) = results.iter().min_by_key(|r| r.len()) {
                    errs.extend(best.iter().cloned());
                }
            }
        }
    }
    if !n.all_of.is_empty() {
        let mut valid = 0;
        for b in &n.all_of {
            let r = trial(b, v, path);
            if r.is_empty() {
                valid += 1;
            }
            errs.extend(r);
        }
        if valid != n.all_of.len() {
            let extra = if valid == 0 { ". None validated" } else { "" };
            errs.push(junctor_error(format!(
                "{} must validate all the schemas (allOf){extra}",
                quote(path)
            )));
        }
    }
    if let Some(not) = &n.not {
        if trial(not, v, path).is_empty() {
            errs.push(junctor_error(format!(
                "{} must not validate the schema (not)",
                quote(path)
            )));
        }
    }
}

fn string(n: &Node, s: &str, path: &str, errs: &mut Vec<FieldError>) {
    // kube-openapi counts runes and stops at the first failing string check.
    let len = s.chars().count() as i64;
    if let Some(max) = n.max_length {
        if len > max {
            let unit = if max == 1 { "byte" } else { "bytes" };
            errs.push(FieldError::new(
                FieldErrorKind::TooLong,
                field_of(path),
                None,
                format!("may not be more than {max} {unit}"),
            ));
            return;
        }
    }
    if let Some(min) = n.min_length {
        if len < min {
            errs.push(invalid(
                path,
                quote(s),
                format!("{path} in body should be at least {min} chars long"),
            ));
            return;
        }
    }
    if let Some(p) = &n.pattern {
        if !p.is_match(s) {
            errs.push(invalid(
                path,
                quote(s),
                format!("{path} in body should match '{}'", p.as_str()),
            ));
        }
    }
}

/// A bound as kube-openapi compares it against integer data: natively (the bound
/// truncated to int64) unless the schema is `integer` and the bound is fractional.
fn int_bound(n: &Node, bound: f64) -> Option<i64> {
    let first = n.types.first().map(String::as_str).unwrap_or("");
    if first == "integer" && bound.fract() != 0.0 {
        None
    } else {
        Some(bound as i64)
    }
}

fn is_json_integer(f: f64) -> bool {
    if !f.is_finite() {
        return false;
    }
    if f == f.trunc() {
        return true;
    }
    let diff = (f - f.round()).abs();
    diff / (f.abs() + f.round().abs()) < 1e-9
}

fn number(n: &Node, num: &serde_json::Number, path: &str, errs: &mut Vec<FieldError>) {
    let shown = field_value(&Value::Number(num.clone()));
    let int = num.as_i64();
    let data = num.as_f64().unwrap_or(0.0);
    if let Some(factor) = n.multiple_of {
        match (int, int_bound(n, factor)) {
            (Some(i), Some(f)) if f > 0 => {
                if i % f != 0 {
                    errs.push(invalid(
                        path,
                        shown.clone(),
                        format!("{path} in body should be a multiple of {f}"),
                    ));
                }
            }
            _ if factor <= 0.0 => errs.push(invalid(
                path,
                shown.clone(),
                format!(
                    "factor MultipleOf declared for {path} must be positive: {}",
                    go_float(factor)
                ),
            )),
            _ => {
                let mult = if factor < 1.0 {
                    1.0 / factor * data
                } else {
                    data / factor
                };
                if !is_json_integer(mult) {
                    errs.push(invalid(
                        path,
                        shown.clone(),
                        format!(
                            "{path} in body should be a multiple of {}",
                            go_float(factor)
                        ),
                    ));
                }
            }
        }
    }
    if let Some(min) = n.minimum {
        let exclusive = n.exclusive_minimum;
        let (fails, bound) = match (int, int_bound(n, min)) {
            (Some(i), Some(b)) => (if exclusive { i <= b } else { i < b }, b.to_string()),
            _ => (
                if exclusive { data <= min } else { data < min },
                go_float(min),
            ),
        };
        if fails {
            let op = if exclusive {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errs.push(invalid(
                path,
                shown.clone(),
                format!("{path} in body should be {op} {bound}"),
            ));
        }
    }
    if let Some(max) = n.maximum {
        let exclusive = n.exclusive_maximum;
        let (fails, bound) = match (int, int_bound(n, max)) {
            (Some(i), Some(b)) => (if exclusive { i >= b } else { i > b }, b.to_string()),
            _ => (
                if exclusive { data >= max } else { data > max },
                go_float(max),
            ),
        };
        if fails {
            let op = if exclusive {
                "less than"
            } else {
                "less than or equal to"
            };
            errs.push(invalid(
                path,
                shown,
                format!("{path} in body should be {op} {bound}"),
            ));
        }
    }
}

fn array(n: &Node, a: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    if let Some(items) = &n.items {
        for (i, x) in a.iter().enumerate() {
            value(items, x, &index(path, i), errs);
        }
    }
    let size = a.len() as i64;
    if let Some(min) = n.min_items {
        if size < min {
            errs.push(invalid(
                path,
                size.to_string(),
                format!("{path} in body should have at least {min} items"),
            ));
        }
    }
    if let Some(max) = n.max_items {
        if size > max {
            let unit = if max == 1 { "item" } else { "items" };
            errs.push(FieldError::new(
                FieldErrorKind::TooMany,
                field_of(path),
                Some(size.to_string()),
                format!("must have at most {max} {unit}"),
            ));
        }
    }
    if n.unique_items {
        let dup = a
            .iter()
            .enumerate()
            .any(|(i, x)| a[..i].iter().any(|y| json_equal(x, y)));
        if dup {
            errs.push(invalid(
                path,
                quote(""),
                format!("{path} in body shouldn't contain duplicates"),
            ));
        }
    }
}

/// Deep equality with numbers compared by value (Go converts the data to the enum's type).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_equal(p, q)))
        }
        _ => a == b,
    }
}

fn enumeration(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let Some(allowed) = &n.enumeration else {
        return;
    };
    if allowed.is_empty() || (!v.is_null() && allowed.iter().any(|e| json_equal(v, e))) {
        return;
    }
    let supported: Vec<String> = allowed
        .iter()
        .map(|e| match e {
            Value::String(s) => quote(s),
            other => quote(&super::render::go_json(other)),
        })
        .collect();
    errs.push(FieldError::new(
        FieldErrorKind::NotSupported,
        field_of(path),
        Some(field_value(v)),
        format!("supported values: {}", supported.join(", ")),
    ));
}

fn object(n: &Node, m: &serde_json::Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    let size = m.len() as i64;
    if let Some(min) = n.min_properties {
        if size < min {
            errs.push(invalid(
                path,
                size.to_string(),
                format!("{path} in body should have at least {min} properties"),
            ));
        }
    }
    if let Some(max) = n.max_properties {
        if size > max {
            // apiextensions reuses field.TooMany, whose text says "items".
            let unit = if max == 1 { "item" } else { "items" };
            errs.push(FieldError::new(
                FieldErrorKind::TooMany,
                field_of(path),
                Some(size.to_string()),
                format!("must have at most {max} {unit}"),
            ));
        }
    }
    match &n.additional {
        Additional::Allows(false) => {
            for k in m.keys() {
                if n.property(k).is_none() {
                    errs.push(invalid(
                        path,
                        quote(k),
                        format!("{path}.{k} in body is a forbidden property"),
                    ));
                }
            }
        }
        Additional::Schema(s) => {
            for (k, x) in m {
                if n.property(k).is_none() {
                    value(s, x, &format!("{path}.{k}"), errs);
                }
            }
        }
        _ => {}
    }
    for (k, p) in &n.properties {
        if let Some(x) = m.get(k) {
            value(p, x, &child(path, k), errs);
        }
    }
    for k in &n.required {
        if !m.contains_key(k) {
            errs.push(FieldError::new(
                FieldErrorKind::Required,
                field_of(&format!("{path}.{k}")),
                None,
                "",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(schema: Value, obj: Value) -> Vec<String> {
        let n = Node::parse(&schema, "").unwrap();
        let mut e = Vec::new();
        value(&n, &obj, "", &mut e);
        e.iter().map(|e| e.to_string()).collect()
    }

    fn spec(props: Value) -> Value {
        json!({"type":"object","properties":{"spec":{"type":"object","properties":props}}})
    }

    #[test]
    fn keyword_table() {
        let cases: Vec<(Value, Value, Vec<&str>)> = vec![
            (json!({"replicas":{"type":"integer"}}), json!({"replicas":"string"}),
             vec![r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#]),
            (json!({"replicas":{"type":"integer"}}), json!({"replicas":1.5}),
             vec![r#"spec.replicas: Invalid value: "number": spec.replicas in body must be of type integer: "number""#]),
            (json!({"replicas":{"type":"integer"}}), json!({"replicas":2.0}), vec![]),
            (json!({"r":{"type":"number"}}), json!({"r":2}), vec![]),
            (json!({"b":{"type":"boolean"}}), json!({"b":"true"}),
             vec![r#"spec.b: Invalid value: "string": spec.b in body must be of type boolean: "string""#]),
            (json!({"o":{"type":"object"}}), json!({"o":[]}),
             vec![r#"spec.o: Invalid value: "array": spec.o in body must be of type object: "array""#]),
            (json!({"a":{"type":"array"}}), json!({"a":{}}),
             vec![r#"spec.a: Invalid value: "object": spec.a in body must be of type array: "object""#]),
            (json!({"s":{"type":"string"}}), json!({"s":null}),
             vec![r#"spec.s: Invalid value: "null": spec.s in body must be of type string: "null""#]),
            (json!({"s":{"type":"string","nullable":true}}), json!({"s":null}), vec![]),
            (json!({"replicas":{"type":"integer","minimum":0}}), json!({"replicas":-1}),
             vec!["spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"]),
            (json!({"r":{"type":"integer","minimum":0,"exclusiveMinimum":true}}), json!({"r":0}),
             vec!["spec.r: Invalid value: 0: spec.r in body should be greater than 0"]),
            (json!({"r":{"type":"integer","maximum":10}}), json!({"r":11}),
             vec!["spec.r: Invalid value: 11: spec.r in body should be less than or equal to 10"]),
            (json!({"r":{"type":"integer","maximum":10,"exclusiveMaximum":true}}), json!({"r":10}),
             vec!["spec.r: Invalid value: 10: spec.r in body should be less than 10"]),
            (json!({"r":{"type":"number","maximum":1.5}}), json!({"r":2.5}),
             vec!["spec.r: Invalid value: 2.5: spec.r in body should be less than or equal to 1.5"]),
            (json!({"r":{"type":"integer","multipleOf":2}}), json!({"r":3}),
             vec!["spec.r: Invalid value: 3: spec.r in body should be a multiple of 2"]),
            (json!({"r":{"type":"number","multipleOf":0.5}}), json!({"r":0.7}),
             vec!["spec.r: Invalid value: 0.7: spec.r in body should be a multiple of 0.5"]),
            (json!({"r":{"type":"number","multipleOf":0.1}}), json!({"r":0.3}), vec![]),
            (json!({"s":{"type":"string","maxLength":5}}), json!({"s":"toolong"}),
             vec!["spec.s: Too long: may not be more than 5 bytes"]),
            (json!({"s":{"type":"string","maxLength":1}}), json!({"s":"ab"}),
             vec!["spec.s: Too long: may not be more than 1 byte"]),
            (json!({"s":{"type":"string","maxLength":2}}), json!({"s":"éé"}), vec![]),
            (json!({"s":{"type":"string","minLength":1}}), json!({"s":""}),
             vec![r#"spec.s: Invalid value: "": spec.s in body should be at least 1 chars long"#]),
            (json!({"s":{"type":"string","pattern":"^a+$"}}), json!({"s":"b"}),
             vec![r#"spec.s: Invalid value: "b": spec.s in body should match '^a+$'"#]),
            (json!({"s":{"type":"string","format":"uuid"}}), json!({"s":"x"}),
             vec![r#"spec.s: Invalid value: "x": spec.s in body must be of type uuid: "x""#]),
            (json!({"s":{"type":"string","format":"date-time"}}), json!({"s":"x"}),
             vec![r#"spec.s: Invalid value: "x": spec.s in body must be of type date-time: "x""#]),
            (json!({"s":{"type":"string","format":"int32"}}), json!({"s":"x"}), vec![]),
            (json!({"s":{"type":"string","enum":["a","b"]}}), json!({"s":"x"}),
             vec![r#"spec.s: Unsupported value: "x": supported values: "a", "b""#]),
            (json!({"s":{"type":"integer","enum":[1,2]}}), json!({"s":3}),
             vec![r#"spec.s: Unsupported value: 3: supported values: "1", "2""#]),
            (json!({"a":{"type":"array","minItems":1}}), json!({"a":[]}),
             vec!["spec.a: Invalid value: 0: spec.a in body should have at least 1 items"]),
            (json!({"a":{"type":"array","maxItems":3}}), json!({"a":[1,2,3,4]}),
             vec!["spec.a: Too many: 4: must have at most 3 items"]),
            (json!({"a":{"type":"array","uniqueItems":true}}), json!({"a":[1,1]}),
             vec![r#"spec.a: Invalid value: "": spec.a in body shouldn't contain duplicates"#]),
            (json!({"o":{"type":"object","minProperties":1}}), json!({"o":{}}),
             vec!["spec.o: Invalid value: 0: spec.o in body should have at least 1 properties"]),
            (json!({"o":{"type":"object","maxProperties":1}}), json!({"o":{"a":1,"b":2}}),
             vec!["spec.o: Too many: 2: must have at most 1 item"]),
            (json!({"o":{"type":"object","required":["x"]}}), json!({"o":{}}),
             vec!["spec.o.x: Required value"]),
            (json!({"o":{"type":"object","additionalProperties":{"type":"integer"}}}), json!({"o":{"k":"v"}}),
             vec![r#"spec.o.k: Invalid value: "string": spec.o.k in body must be of type integer: "string""#]),
            (json!({"i":{"x-kubernetes-int-or-string":true}}), json!({"i":true}),
             vec![r#"spec.i: Invalid value: "boolean": spec.i in body must be of type integer,string: "boolean""#]),
            (json!({"i":{"x-kubernetes-int-or-string":true,"pattern":"^\\d+%$"}}), json!({"i":"5%"}), vec![]),
            (json!({"i":{"x-kubernetes-int-or-string":true}}), json!({"i":5}), vec![]),
            (json!({"items":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}}}),
             json!({"items":[{"name":"a"},{"name":1}]}),
             vec![r#"spec.items[1].name: Invalid value: "integer": spec.items[1].name in body must be of type string: "integer""#]),
            (json!({"p":{"type":"integer","oneOf":[{"minimum":5},{"maximum":1}]}}), json!({"p":3}),
             vec![r#"<nil>: Invalid value: "": "spec.p" must validate one and only one schema (oneOf). Found none valid"#,
                  "spec.p: Invalid value: 3: spec.p in body should be greater than or equal to 5"]),
            (json!({"p":{"type":"integer","anyOf":[{"minimum":5},{"maximum":1}]}}), json!({"p":0}), vec![]),
            (json!({"p":{"type":"integer","not":{"minimum":5}}}), json!({"p":6}),
             vec![r#"<nil>: Invalid value: "": "spec.p" must not validate the schema (not)"#]),
            (json!({"p":{"type":"integer","allOf":[{"minimum":5}]}}), json!({"p":1}),
             vec!["spec.p: Invalid value: 1: spec.p in body should be greater than or equal to 5",
                  r#"<nil>: Invalid value: "": "spec.p" must validate all the schemas (allOf). None validated"#]),
        ];
        for (props, s, want) in cases {
            let got = check(spec(props.clone()), json!({ "spec": s }));
            assert_eq!(got, want, "schema {props} value {s}");
        }
    }

    #[test]
    fn root_required_has_no_leading_dot() {
        let got = check(json!({"type":"object","required":["spec"]}), json!({}));
        assert_eq!(got, vec!["spec: Required value"]);
    }
}
