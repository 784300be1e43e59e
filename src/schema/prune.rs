//! Dropping fields the schema does not declare (apiextensions `pruning`). The resource
//! root and every embedded resource keep `apiVersion`, `kind` and `metadata`; subtrees
//! under `x-kubernetes-preserve-unknown-fields` are kept except where a declared
//! property's own schema prunes. Returns the dropped paths, sorted, as kube reports
//! them for `fieldValidation` (`spec.foo`, `spec.items[0].bar`).

use super::structural::Node;
use serde_json::Value;

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Prunes `v` in place; `root` marks the resource root (treated as embedded).
pub fn prune_root(n: &Node, v: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    prune(Some(n), v, &mut String::new(), true, &mut out);
    out.sort();
    out
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// Runs `f` with `path` naming the child `k` (kube's `parent.key`, or `key`
/// at the root). One buffer serves the whole walk: a string per field
/// visited was a percent of a create, and only dropped fields need one.
fn at_key(path: &mut String, k: &str, f: impl FnOnce(&mut String)) {
    let len = path.len();
    if len > 0 {
        path.push('.');
    }
    path.push_str(k);
    f(path);
    path.truncate(len);
}

/// Runs `f` with `path` naming item `i` (`parent[i]`).
fn at_index(path: &mut String, i: usize, f: impl FnOnce(&mut String)) {
    use std::fmt::Write as _;
    let len = path.len();
    let _ = write!(path, "[{i}]");
    f(path);
    path.truncate(len);
}

fn prune(n: Option<&Node>, v: &mut Value, path: &mut String, root: bool, out: &mut Vec<String>) {
    if let Some(n) = n {
        if n.preserve_unknown {
            skip_prune(n, v, path, root, out);
            return;
        }
    }
    match v {
        Value::Object(m) => {
            let Some(n) = n else {
                // No schema at all: every key is unknown.
                out.extend(m.keys().map(|k| join(path, k)));
                m.clear();
                return;
            };
            let embedded = n.embedded || root;
            let mut drop = Vec::new();
            for (k, x) in m.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(p) = n.property(k) {
                    at_key(path, k, |path| prune(Some(p), x, path, false, out));
                } else if has_additional(n) {
                    // A bool `additionalProperties` keeps the key but, as in kube, gives no
                    // schema for its value, so objects under it are emptied.
                    at_key(path, k, |path| {
                        prune(n.additional_schema(), x, path, false, out)
                    });
                } else {
                    out.push(join(path, k));
                    drop.push(k.clone());
                }
            }
            for k in drop {
                m.remove(&k);
            }
        }
        Value::Array(a) => {
            let items = n.and_then(|n| n.items.as_deref());
            for (i, x) in a.iter_mut().enumerate() {
                at_index(path, i, |path| prune(items, x, path, false, out));
            }
        }
        _ => {}
    }
}

fn has_additional(n: &Node) -> bool {
    !matches!(n.additional, super::structural::Additional::Unset)
}

fn skip_prune(n: &Node, v: &mut Value, path: &mut String, root: bool, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let embedded = n.embedded || root;
            for (k, x) in m.iter_mut() {
                if embedded && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(p) = n.property(k) {
                    at_key(path, k, |path| prune(Some(p), x, path, false, out));
                } else if has_additional(n) {
                    at_key(path, k, |path| {
                        prune(n.additional_schema(), x, path, false, out)
                    });
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = n.items.as_deref() {
                for (i, x) in a.iter_mut().enumerate() {
                    at_index(path, i, |path| skip_prune(items, x, path, false, out));
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

    fn run(schema: Value, mut v: Value) -> (Value, Vec<String>) {
        let n = Node::parse(&schema, "").unwrap();
        let p = prune_root(&n, &mut v);
        (v, p)
    }

    #[test]
    fn prunes_nested_and_arrays_keeps_root_meta() {
        let schema = json!({"type":"object","properties":{"spec":{"type":"object","properties":{
            "a":{"type":"string"},
            "items":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"}}}},
            "labels":{"type":"object","additionalProperties":{"type":"string"}}}}}});
        let (v, p) = run(
            schema,
            json!({"apiVersion":"x/v1","kind":"K","metadata":{"name":"n","weird":1},
                "spec":{"a":"x","foo":1,"items":[{"name":"a","bar":2},{"name":"b"}],"labels":{"k":"v"}},
                "status":{"x":1}}),
        );
        assert_eq!(p, vec!["spec.foo", "spec.items[0].bar", "status"]);
        assert_eq!(
            v,
            json!({"apiVersion":"x/v1","kind":"K","metadata":{"name":"n","weird":1},
                "spec":{"a":"x","items":[{"name":"a"},{"name":"b"}],"labels":{"k":"v"}}})
        );
    }

    #[test]
    fn preserve_unknown_and_embedded() {
        let schema = json!({"type":"object","properties":{"spec":{"type":"object","properties":{
            "free":{"type":"object","x-kubernetes-preserve-unknown-fields":true,
                "properties":{"strict":{"type":"object","properties":{"ok":{"type":"integer"}}}}},
            "tpl":{"type":"object","x-kubernetes-embedded-resource":true,
                "properties":{"spec":{"type":"object","properties":{"x":{"type":"integer"}}}}},
            "nested":{"type":"object","properties":{"kind":{"type":"string"}}}}}}});
        let (v, p) = run(
            schema,
            json!({"spec":{
                "free":{"anything":{"deep":1},"strict":{"ok":1,"gone":2}},
                "tpl":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"x":1,"y":2},"extra":1},
                "nested":{"kind":"k","apiVersion":"dropped"}}}),
        );
        assert_eq!(
            p,
            vec![
                "spec.free.strict.gone",
                "spec.nested.apiVersion",
                "spec.tpl.extra",
                "spec.tpl.spec.y"
            ]
        );
        assert_eq!(v["spec"]["free"]["anything"], json!({"deep":1}));
        assert_eq!(v["spec"]["tpl"]["metadata"], json!({"name":"p"}));
        assert_eq!(v["spec"]["tpl"]["kind"], "Pod");
    }

    #[test]
    fn items_without_schema_drop_object_keys() {
        let (v, p) = run(
            json!({"type":"object","properties":{"l":{"type":"array"}}}),
            json!({"l":[{"a":1},2]}),
        );
        assert_eq!(p, vec!["l[0].a"]);
        assert_eq!(v, json!({"l":[{},2]}));
    }
}
