//! Schema defaulting (apiextensions `structuraldefaulting`): a property that is missing,
//! or null where the schema is not nullable, takes a deep copy of its `default`; then
//! nulls that are neither nullable nor defaulted are dropped, as kube does before
//! validation (so `spec.x: null` on a non-nullable field is simply removed).

use super::structural::Node;
use serde_json::Value;

pub fn apply(n: &Node, v: &mut Value) {
    default(n, v);
    drop_nulls(n, v);
}

/// Whether any node of the schema has a `default`, where [`apply`] looks.
pub fn any(n: &Node) -> bool {
    n.default.is_some()
        || n.properties.iter().any(|(_, p)| any(p))
        || n.additional_schema().is_some_and(any)
        || n.items.as_deref().is_some_and(any)
}

/// Whether [`apply`] would change `v`: a defaulted property missing (or a
/// non-nullable null), or a non-nullable null it would replace or drop.
pub fn needed(n: &Node, v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            let missing = n.properties.iter().any(|(k, p)| {
                p.default.is_some() && m.get(k).is_none_or(|x| non_nullable_null(x, p))
            });
            missing
                || m.iter().any(|(k, x)| {
                    n.property(k)
                        .or_else(|| n.additional_schema())
                        .is_some_and(|s| non_nullable_null(x, s) || needed(s, x))
                })
        }
        Value::Array(a) => n.items.as_deref().is_some_and(|items| {
            a.iter().any(|x| {
                (non_nullable_null(x, items) && items.default.is_some()) || needed(items, x)
            })
        }),
        _ => false,
    }
}

fn non_nullable_null(v: &Value, n: &Node) -> bool {
    v.is_null() && !n.nullable
}

fn default(n: &Node, v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, p) in &n.properties {
                let Some(d) = &p.default else { continue };
                let needs = match m.get(k) {
                    None => true,
                    Some(x) => non_nullable_null(x, p),
                };
                if needs {
                    m.insert(k.clone(), d.clone());
                }
            }
            for (k, x) in m.iter_mut() {
                if let Some(p) = n.property(k) {
                    default(p, x);
                } else if let Some(a) = n.additional_schema() {
                    if non_nullable_null(x, a) {
                        if let Some(d) = &a.default {
                            *x = d.clone();
                        }
                    }
                    default(a, x);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = &n.items {
                for x in a.iter_mut() {
                    if non_nullable_null(x, items) {
                        if let Some(d) = &items.default {
                            *x = d.clone();
                        }
                    }
                    default(items, x);
                }
            }
        }
        _ => {}
    }
}

/// kube's `PruneNonNullableNullsWithoutDefaults`: object fields only; list items stay.
fn drop_nulls(n: &Node, v: &mut Value) {
    match v {
        Value::Object(m) => {
            let mut drop = Vec::new();
            for (k, x) in m.iter_mut() {
                let s = n.property(k).or_else(|| n.additional_schema());
                let Some(s) = s else { continue };
                if x.is_null() && !s.nullable && s.default.is_none() {
                    drop.push(k.clone());
                } else {
                    drop_nulls(s, x);
                }
            }
            for k in drop {
                m.remove(&k);
            }
        }
        Value::Array(a) => {
            if let Some(items) = &n.items {
                for x in a.iter_mut() {
                    drop_nulls(items, x);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(schema: Value, mut v: Value) -> Value {
        let n = Node::parse(&schema, "").unwrap();
        apply(&n, &mut v);
        v
    }

    #[test]
    fn nested_defaults_and_arrays() {
        let schema = json!({"type":"object","properties":{"spec":{"type":"object","default":{},
            "properties":{
                "replicas":{"type":"integer","default":1},
                "strategy":{"type":"object","default":{"type":"Rolling"},"properties":{
                    "type":{"type":"string"},"max":{"type":"integer","default":25}}},
                "ports":{"type":"array","items":{"type":"object","properties":{
                    "protocol":{"type":"string","default":"TCP"},"port":{"type":"integer"}}}}}}}});
        assert_eq!(
            run(schema.clone(), json!({})),
            json!({"spec":{"replicas":1,"strategy":{"type":"Rolling","max":25}}})
        );
        assert_eq!(
            run(
                schema,
                json!({"spec":{"replicas":3,"ports":[{"port":80},{"port":53,"protocol":"UDP"}]}})
            ),
            json!({"spec":{"replicas":3,"ports":[{"port":80,"protocol":"TCP"},{"port":53,"protocol":"UDP"}],
                "strategy":{"type":"Rolling","max":25}}})
        );
    }

    #[test]
    fn nulls() {
        let schema = json!({"type":"object","properties":{
            "a":{"type":"string","default":"d"},
            "b":{"type":"string"},
            "c":{"type":"string","nullable":true},
            "d":{"type":"string","nullable":true,"default":"x"},
            "m":{"type":"object","additionalProperties":{"type":"string","default":"z"}},
            "l":{"type":"array","items":{"type":"string"}}}});
        assert_eq!(
            run(
                schema,
                json!({"a":null,"b":null,"c":null,"d":null,"m":{"k":null},"l":[null]})
            ),
            json!({"a":"d","c":null,"d":null,"m":{"k":"z"},"l":[null]})
        );
    }

    #[test]
    fn needed_is_exactly_whether_apply_changes_anything() {
        let schema = json!({"type":"object","properties":{
            "a":{"type":"string","default":"d"},
            "b":{"type":"string"},
            "c":{"type":"string","nullable":true},
            "m":{"type":"object","additionalProperties":{"type":"string","default":"z"}},
            "l":{"type":"array","items":{"type":"object","properties":{
                "p":{"type":"integer","default":1},"q":{"type":"string"}}}},
            "s":{"type":"array","items":{"type":"string","default":"i"}}}});
        let n = Node::parse(&schema, "").unwrap();
        assert!(any(&n));
        for v in [
            json!({}),
            json!({"a":"x"}),
            json!({"a":null}),
            json!({"a":"x","b":null}),
            json!({"a":"x","c":null}),
            json!({"a":"x","m":{"k":"v"}}),
            json!({"a":"x","m":{"k":null}}),
            json!({"a":"x","l":[{"p":2}]}),
            json!({"a":"x","l":[{"q":"y"}]}),
            json!({"a":"x","l":[{"p":2,"q":null}]}),
            json!({"a":"x","l":[null]}),
            json!({"a":"x","s":["v"]}),
            json!({"a":"x","s":[null]}),
            json!({"a":"x","unknown":null}),
        ] {
            let mut applied = v.clone();
            apply(&n, &mut applied);
            assert_eq!(needed(&n, &v), applied != v, "{v} -> {applied}");
        }
        let plain = Node::parse(
            &json!({"type":"object","properties":{"b":{"type":"string"}}}),
            "",
        )
        .unwrap();
        assert!(!any(&plain));
    }
}
