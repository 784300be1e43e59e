//! `x-kubernetes-list-type: set|map` uniqueness (apiextensions `listtype` validation):
//! a repeated element or map key is reported once, at its second occurrence.

use super::render::{field_value, go_json};
use super::structural::Node;
use crate::status::{FieldError, FieldErrorKind};
use serde_json::{Map, Value};

pub fn validate(n: &Node, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if let Some(p) = n.property(k) {
                    validate(p, x, &super::validate::child(path, k), errs);
                } else if let Some(a) = n.additional_schema() {
                    validate(a, x, &format!("{path}[{k}]"), errs);
                }
            }
        }
        Value::Array(a) => {
            match n.list_type.as_deref() {
                Some("set") => duplicates(a, path, |x| x.clone(), errs),
                Some("map") => list_map(n, a, path, errs),
                _ => {}
            }
            if let Some(items) = &n.items {
                for (i, x) in a.iter().enumerate() {
                    validate(items, x, &format!("{path}[{i}]"), errs);
                }
            }
        }
        _ => {}
    }
}

/// Reports the second occurrence of each repeated key (third and later are not reported).
fn duplicates(a: &[Value], path: &str, key: impl Fn(&Value) -> Value, errs: &mut Vec<FieldError>) {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (i, x) in a.iter().enumerate() {
        let k = key(x);
        let id = go_json(&k);
        match seen.iter_mut().find(|(s, _)| *s == id) {
            Some((_, times)) => {
                *times += 1;
                if *times == 2 {
                    errs.push(FieldError::new(
                        FieldErrorKind::Duplicate,
                        format!("{path}[{i}]"),
                        Some(field_value(&k)),
                        "",
                    ));
                }
            }
            None => seen.push((id, 1)),
        }
    }
}

fn list_map(n: &Node, a: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    for (i, x) in a.iter().enumerate() {
        if !x.is_object() && !x.is_null() {
            errs.push(FieldError::new(
                FieldErrorKind::Invalid,
                format!("{path}[{i}]"),
                Some(field_value(x)),
                "must be an object for an array of list-type map",
            ));
            return;
        }
    }
    // The duplicate's value is the map of its key fields (missing keys left out).
    let keys = &n.list_map_keys;
    duplicates(
        a,
        path,
        |x| {
            let mut k = Map::new();
            for f in keys {
                if let Some(v) = x.get(f) {
                    k.insert(f.clone(), v.clone());
                }
            }
            Value::Object(k)
        },
        errs,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(schema: Value, v: Value) -> Vec<String> {
        let n = Node::parse(&schema, "").unwrap();
        let mut e = Vec::new();
        validate(&n, &v, "spec.l", &mut e);
        e.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn sets_and_maps() {
        assert_eq!(
            run(
                json!({"type":"array","x-kubernetes-list-type":"set","items":{"type":"string"}}),
                json!(["a", "b", "a", "a"])
            ),
            vec![r#"spec.l[2]: Duplicate value: "a""#]
        );
        assert_eq!(
            run(
                json!({"type":"array","x-kubernetes-list-type":"set"}),
                json!([{"b":1,"a":2},{"a":2,"b":1}])
            ),
            vec![r#"spec.l[1]: Duplicate value: {"a":2,"b":1}"#]
        );
        let map = json!({"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["name","port"],
            "items":{"type":"object","properties":{"name":{"type":"string"},"port":{"type":"integer"}}}});
        assert_eq!(
            run(
                map.clone(),
                json!([{"name":"a","port":1},{"name":"a","port":2},{"port":1,"name":"a","x":1}])
            ),
            vec![r#"spec.l[2]: Duplicate value: {"name":"a","port":1}"#]
        );
        assert_eq!(
            run(map, json!([1])),
            vec!["spec.l[0]: Invalid value: 1: must be an object for an array of list-type map"]
        );
        assert!(run(
            json!({"type":"array","x-kubernetes-list-type":"atomic"}),
            json!([1, 1])
        )
        .is_empty());
    }
}
