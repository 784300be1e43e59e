//! `x-kubernetes-validations` rules, compiled and evaluated with the `kube-cel` crate.
//!
//! kube-cel compiles and runs the rules of one schema node (it also handles `message`,
//! `messageExpression`, `optionalOldSelf` and the Kubernetes CEL libraries). We keep the
//! tree walk ourselves because kube's differs from kube-cel's in what matters for errors:
//! `oldSelf` of a list item is the old item with the same keys (list-type map) rather
//! than the same index, additionalProperties children are named `path[key]`, and the
//! field error's value and type follow apiextensions' `cel/validation.go`.

use super::render::field_value;
use super::structural::Node;
use crate::status::{quote, FieldError, FieldErrorKind};
use kube_cel::{CompiledSchema, ErrorKind};
use serde_json::Value;
use std::collections::HashMap;

/// The rules of one schema subtree, mirroring the schema only where rules exist.
pub struct Rules {
    here: Option<CompiledSchema>,
    type_name: String,
    properties: HashMap<String, Rules>,
    additional: Option<Box<Rules>>,
    items: Option<Box<Rules>>,
    list_type: Option<String>,
    list_map_keys: Vec<String>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("here", &self.here.is_some())
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Rules {
    /// Compiles every rule under `n`; `None` when the schema has no rules at all.
    /// A rule that does not compile fails the whole schema, as kube rejects such a CRD.
    pub fn compile(n: &Node, path: &str) -> Result<Option<Rules>, String> {
        if !n.has_rules_below() {
            return Ok(None);
        }
        let here = match &n.rules {
            Some(own) => {
                let c = kube_cel::compile_schema(own);
                if let Some(e) = c.compilation_errors().first() {
                    let at = if path.is_empty() { "<root>" } else { path };
                    return Err(format!("{at}: x-kubernetes-validations: {e}"));
                }
                Some(c)
            }
            None => None,
        };
        let mut properties = HashMap::new();
        for (k, p) in &n.properties {
            if let Some(r) = Rules::compile(p, &super::validate::child(path, k))? {
                properties.insert(k.clone(), r);
            }
        }
        let additional = match n.additional_schema() {
            Some(a) => Rules::compile(a, &format!("{path}[*]"))?.map(Box::new),
            None => None,
        };
        let items = match &n.items {
            Some(i) => Rules::compile(i, &format!("{path}[*]"))?.map(Box::new),
            None => None,
        };
        Ok(Some(Rules {
            here,
            type_name: n.type_name().to_string(),
            properties,
            additional,
            items,
            list_type: n.list_type.clone(),
            list_map_keys: n.list_map_keys.clone(),
        }))
    }

    /// Evaluates the rules against `v` (and `old` for transition rules).
    pub fn validate(&self, v: &Value, old: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
        if let Some(c) = &self.here {
            self.evaluate(c, v, old, path, errs);
        }
        match v {
            Value::Object(m) => {
                let old_map = old.and_then(Value::as_object);
                for (k, x) in m {
                    let old_x = old_map.and_then(|o| o.get(k));
                    if let Some(r) = self.properties.get(k) {
                        r.validate(x, old_x, &super::validate::child(path, k), errs);
                    } else if let Some(r) = &self.additional {
                        r.validate(x, old_x, &format!("{path}[{k}]"), errs);
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    let old_list = old.and_then(Value::as_array);
                    for (i, x) in a.iter().enumerate() {
                        let old_x = old_list.and_then(|o| self.correlate(o, x));
                        items.validate(x, old_x, &format!("{path}[{i}]"), errs);
                    }
                }
            }
            _ => {}
        }
    }

    /// kube correlates old and new list items only by identity: the list-map keys, or
    /// the value itself in a set. Atomic lists have no `oldSelf` for their items.
    fn correlate<'a>(&self, old: &'a [Value], x: &Value) -> Option<&'a Value> {
        match self.list_type.as_deref() {
            Some("map") => old
                .iter()
                .find(|o| self.list_map_keys.iter().all(|k| o.get(k) == x.get(k))),
            Some("set") => old.iter().find(|o| *o == x),
            _ => None,
        }
    }

    fn evaluate(
        &self,
        c: &CompiledSchema,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        errs: &mut Vec<FieldError>,
    ) {
        let Err(failures) = kube_cel::validate_compiled(c, v, old) else {
            return;
        };
        // kube omits the value of objects and lists from CEL errors.
        let shown = match v {
            Value::Object(_) | Value::Array(_) => None,
            other => Some(field_value(other)),
        };
        for f in failures.iter() {
            let field = match f.field_path.trim_start_matches('.') {
                "" => field_or_nil(path),
                rel => super::validate::child(path, rel),
            };
            match f.kind {
                ErrorKind::ValidationFailure => {
                    let detail = f.message.trim().to_string();
                    let e = match f.reason.as_deref() {
                        Some("FieldValueForbidden") => FieldError::forbidden(field, detail),
                        Some("FieldValueRequired") => FieldError::required(field, detail),
                        Some("FieldValueDuplicate") => {
                            FieldError::new(FieldErrorKind::Duplicate, field, shown.clone(), "")
                        }
                        _ => FieldError::new(FieldErrorKind::Invalid, field, shown.clone(), detail),
                    };
                    errs.push(e);
                }
                _ => {
                    // Runtime failures: kube prints the schema type as the value.
                    let why = f
                        .message
                        .strip_prefix("rule evaluation error: ")
                        .unwrap_or(&f.message);
                    errs.push(FieldError::new(
                        FieldErrorKind::Invalid,
                        field,
                        Some(quote(&self.type_name)),
                        format!("{why} evaluating rule: {}", f.rule.trim()),
                    ));
                }
            }
        }
    }
}

fn field_or_nil(path: &str) -> String {
    if path.is_empty() {
        "<nil>".to_string()
    } else {
        path.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(schema: Value) -> Rules {
        let n = Node::parse(&schema, "").unwrap();
        Rules::compile(&n, "").unwrap().unwrap()
    }

    fn run(r: &Rules, v: Value, old: Option<Value>) -> Vec<String> {
        let mut e = Vec::new();
        r.validate(&v, old.as_ref(), "", &mut e);
        e.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn messages_reasons_and_paths() {
        let r = rules(
            json!({"type":"object","properties":{"spec":{"type":"object",
            "x-kubernetes-validations":[
                {"rule":"self.replicas <= 5","message":"too many replicas"},
                {"rule":"self.replicas != 3"},
                {"rule":"self.replicas != 4","messageExpression":"'got ' + string(self.replicas)","fieldPath":".replicas"},
                {"rule":"self.replicas != 2","message":"no two","reason":"FieldValueForbidden"}],
            "properties":{"replicas":{"type":"integer",
                "x-kubernetes-validations":[{"rule":"self >= 0","message":"must be non-negative"}]}}}}}),
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":1}}), None),
            Vec::<String>::new()
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":7}}), None),
            vec!["spec: Invalid value: too many replicas"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":3}}), None),
            vec!["spec: Invalid value: failed rule: self.replicas != 3"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":4}}), None),
            vec!["spec.replicas: Invalid value: got 4"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":2}}), None),
            vec!["spec: Forbidden: no two"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":-1}}), None),
            vec!["spec.replicas: Invalid value: -1: must be non-negative"]
        );
    }

    #[test]
    fn transition_rules_use_correlated_old_values() {
        let r = rules(
            json!({"type":"object","properties":{"spec":{"type":"object","properties":{
            "name":{"type":"string","x-kubernetes-validations":[{"rule":"self == oldSelf","message":"name is immutable"}]},
            "ports":{"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["name"],
                "items":{"type":"object","properties":{"name":{"type":"string"},"port":{"type":"integer"}},
                "x-kubernetes-validations":[{"rule":"self.port >= oldSelf.port","message":"port may not decrease"}]}}}}}}),
        );
        // Create: transition rules are skipped.
        assert!(run(
            &r,
            json!({"spec":{"name":"a","ports":[{"name":"x","port":1}]}}),
            None
        )
        .is_empty());
        let old =
            json!({"spec":{"name":"a","ports":[{"name":"x","port":5},{"name":"y","port":5}]}});
        assert_eq!(
            run(
                &r,
                json!({"spec":{"name":"b","ports":[{"name":"y","port":6},{"name":"x","port":4}]}}),
                Some(old)
            ),
            vec![
                r#"spec.name: Invalid value: "b": name is immutable"#,
                "spec.ports[1]: Invalid value: port may not decrease",
            ]
        );
    }

    #[test]
    fn bad_rule_fails_compile() {
        let n = Node::parse(
            &json!({"type":"object","x-kubernetes-validations":[{"rule":"self.("}]}),
            "",
        )
        .unwrap();
        assert!(Rules::compile(&n, "").is_err());
    }

    #[test]
    fn rules_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Rules>();
    }
}
