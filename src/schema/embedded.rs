//! Checks for `x-kubernetes-embedded-resource` objects (apiextensions `objectmeta`
//! validation): apiVersion and kind are required and well-formed, metadata is an object
//! with a valid name. The resource root is checked elsewhere, so it is skipped here.

use super::formats::{is_dns1123_subdomain, matches_dns1035};
use super::render::field_value;
use super::structural::Node;
use crate::status::{quote, FieldError, FieldErrorKind};
use serde_json::Value;

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

pub fn validate(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    match v {
        Value::Object(m) => {
            if n.embedded {
                resource(m, path, errs);
            }
            for (k, x) in m {
                if let Some(p) = n.property(k) {
                    validate(p, x, &super::validate::child(path, k), errs);
                } else if let Some(a) = n.additional_schema() {
                    validate(a, x, &format!("{path}[{k}]"), errs);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = &n.items {
                for (i, x) in a.iter().enumerate() {
                    validate(items, x, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

fn invalid(field: String, v: &Value, detail: impl Into<String>) -> FieldError {
    FieldError::new(FieldErrorKind::Invalid, field, Some(field_value(v)), detail)
}

fn resource(m: &serde_json::Map<String, Value>, path: &str, errs: &mut Vec<FieldError>) {
    let at = |k: &str| super::validate::child(path, k);
    if !m.contains_key("apiVersion") {
        errs.push(FieldError::required(at("apiVersion"), ""));
    }
    if !m.contains_key("kind") {
        errs.push(FieldError::required(at("kind"), ""));
    }
    for (k, v) in m {
        match k.as_str() {
            "apiVersion" => match v.as_str() {
                None => errs.push(invalid(at(k), v, "must be a string")),
                Some("") => errs.push(invalid(at(k), v, "must not be empty")),
                Some(s) if s.matches('/').count() > 1 => errs.push(invalid(
                    at(k),
                    v,
                    format!("unexpected GroupVersion string: {s}"),
                )),
                Some(_) => {}
            },
            "kind" => match v.as_str() {
                None => errs.push(invalid(at(k), v, "must be a string")),
                Some("") => errs.push(invalid(at(k), v, "must not be empty")),
                Some(s) => {
                    let lower = s.to_lowercase();
                    let mut why = Vec::new();
                    if lower.len() > 63 {
                        why.push("must be no more than 63 characters".to_string());
                    }
                    if !matches_dns1035(&lower) {
                        why.push(DNS1035_MSG.to_string());
                    }
                    if !why.is_empty() {
                        errs.push(invalid(
                            at(k),
                            v,
                            format!(
                                "may have mixed case, but should otherwise match: {}",
                                why.join(",")
                            ),
                        ));
                    }
                }
            },
            "metadata" => match v {
                Value::Object(meta) => {
                    if let Some(Value::String(name)) = meta.get("name") {
                        if !name.is_empty() && !is_dns1123_subdomain(name) {
                            errs.push(FieldError::new(
                                FieldErrorKind::Invalid,
                                format!("{}.name", at(k)),
                                Some(quote(name)),
                                DNS1123_SUBDOMAIN_MSG,
                            ));
                        }
                    }
                }
                // Unverified wording: kube reports GetObjectMeta's decode error here.
                other => errs.push(invalid(at(k), other, "must be an object")),
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn embedded_requires_type_meta() {
        let n = Node::parse(
            &json!({"type":"object","properties":{"tpl":{"type":"object","x-kubernetes-embedded-resource":true,
                "x-kubernetes-preserve-unknown-fields":true}}}),
            "",
        )
        .unwrap();
        let mut e = Vec::new();
        validate(
            &n,
            &json!({"tpl":{"metadata":{"name":"Bad_Name"}}}),
            "",
            &mut e,
        );
        let got: Vec<String> = e.iter().map(|e| e.to_string()).collect();
        assert_eq!(got[0], "tpl.apiVersion: Required value");
        assert_eq!(got[1], "tpl.kind: Required value");
        assert!(got[2].starts_with(
            r#"tpl.metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain"#
        ));
        let mut e = Vec::new();
        validate(
            &n,
            &json!({"tpl":{"apiVersion":"v1","kind":"Pod_x"}}),
            "",
            &mut e,
        );
        assert_eq!(e.len(), 1);
        assert!(e[0].to_string().starts_with(
            r#"tpl.kind: Invalid value: "Pod_x": may have mixed case, but should otherwise match: a DNS-1035 label"#
        ));
    }
}
