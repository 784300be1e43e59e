//! The CRDs that let a standalone kshard serve
//! `admissionregistration.k8s.io/v1` MutatingWebhookConfiguration,
//! ValidatingWebhookConfiguration, ValidatingAdmissionPolicy and
//! ValidatingAdmissionPolicyBinding, so `kubectl apply -f webhook.yaml`
//! configures it. The schema carries kube's defaults (failurePolicy Fail,
//! matchPolicy Equivalent, empty selectors, timeoutSeconds 10,
//! reinvocationPolicy Never, rule scope `*`, service port 443) and list
//! types, but no value rules: kube's own validation of these kinds is in
//! `validation.rs` and `policy_validation.rs`, in its words and order
//! ([`builtin_validation`]). They are served only by kshard: behind a host,
//! the host's own objects configure it.

use serde_json::{json, Value};

use super::hooks::GROUP;

fn strings() -> Value {
    json!({"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "atomic"})
}

fn label_selector() -> Value {
    let mut s = selector();
    s["default"] = json!({});
    s
}

fn selector() -> Value {
    json!({
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
            "matchExpressions": {
                "type": "array",
                "x-kubernetes-list-type": "atomic",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string"},
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": strings(),
                    },
                },
            },
        },
    })
}

fn match_conditions() -> Value {
    json!({
        "type": "array",
        "maxItems": 64,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object",
            "required": ["name", "expression"],
            "properties": {
                "name": {"type": "string"},
                "expression": {"type": "string"},
            },
        },
    })
}

fn rule(named: bool) -> Value {
    let mut r = json!({
        "type": "object",
        "properties": {
            "operations": {
                "type": "array",
                "x-kubernetes-list-type": "atomic",
                "items": {"type": "string", "enum": ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"]},
            },
            "apiGroups": strings(),
            "apiVersions": strings(),
            "resources": strings(),
            "scope": {"type": "string", "enum": ["*", "Cluster", "Namespaced"], "default": "*"},
        },
    });
    if named {
        r["properties"]["resourceNames"] = strings();
    }
    r
}

/// `MatchResources`: which requests a policy (or binding) takes.
fn match_resources() -> Value {
    let rules = json!({"type": "array", "x-kubernetes-list-type": "atomic", "items": rule(true)});
    json!({
        "type": "object",
        "x-kubernetes-map-type": "atomic",
        "properties": {
            "namespaceSelector": label_selector(),
            "objectSelector": label_selector(),
            "resourceRules": rules,
            "excludeResourceRules": rules,
            "matchPolicy": {"type": "string", "enum": ["Equivalent", "Exact"], "default": "Equivalent"},
        },
    })
}

// The enums list their values as kube's validation lists them in its
// messages ("supported values: ..."), mostly sorted.
fn policy_schema() -> Value {
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["matchConstraints"],
                "properties": {
                    "paramKind": {
                        "type": "object",
                        "x-kubernetes-map-type": "atomic",
                        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"}},
                    },
                    "matchConstraints": match_resources(),
                    "validations": {
                        "type": "array",
                        "x-kubernetes-list-type": "atomic",
                        "items": {
                            "type": "object",
                            "required": ["expression"],
                            "properties": {
                                "expression": {"type": "string"},
                                "message": {"type": "string"},
                                "messageExpression": {"type": "string"},
                                "reason": {"type": "string", "enum": ["Forbidden", "Invalid", "RequestEntityTooLarge"]},
                            },
                        },
                    },
                    "failurePolicy": {"type": "string", "enum": ["Fail", "Ignore"], "default": "Fail"},
                    "auditAnnotations": {
                        "type": "array",
                        "x-kubernetes-list-type": "atomic",
                        "items": {
                            "type": "object",
                            "required": ["key", "valueExpression"],
                            "properties": {"key": {"type": "string"}, "valueExpression": {"type": "string"}},
                        },
                    },
                    "matchConditions": match_conditions(),
                    "variables": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "x-kubernetes-map-type": "atomic",
                            "required": ["name", "expression"],
                            "properties": {"name": {"type": "string"}, "expression": {"type": "string"}},
                        },
                    },
                },
            },
            // kube's policy always carries a status (an empty one until a
            // controller type-checks it), as the default gives it here.
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "default": {}},
        },
    })
}

fn binding_schema() -> Value {
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "required": ["policyName", "validationActions"],
                "properties": {
                    "policyName": {"type": "string"},
                    "paramRef": {
                        "type": "object",
                        "x-kubernetes-map-type": "atomic",
                        "properties": {
                            "name": {"type": "string"},
                            "namespace": {"type": "string"},
                            "selector": selector(),
                            "parameterNotFoundAction": {"type": "string", "enum": ["Deny", "Allow"]},
                        },
                    },
                    "matchResources": match_resources(),
                    "validationActions": {
                        "type": "array",
                        "minItems": 1,
                        "x-kubernetes-list-type": "set",
                        "items": {"type": "string", "enum": ["Audit", "Deny", "Warn"]},
                    },
                },
            },
        },
    })
}

fn webhook(mutating: bool) -> Value {
    let mut properties = json!({
        "name": {"type": "string"},
        "admissionReviewVersions": strings(),
        "clientConfig": {
            "type": "object",
            "properties": {
                "url": {"type": "string"},
                "caBundle": {"type": "string", "format": "byte"},
                "service": {
                    "type": "object",
                    "properties": {
                        "namespace": {"type": "string"},
                        "name": {"type": "string"},
                        "path": {"type": "string"},
                        "port": {"type": "integer", "format": "int32", "default": 443},
                    },
                },
            },
        },
        "rules": {"type": "array", "x-kubernetes-list-type": "atomic", "items": rule(false)},
        "failurePolicy": {"type": "string", "default": "Fail"},
        "matchPolicy": {"type": "string", "default": "Equivalent"},
        "namespaceSelector": label_selector(),
        "objectSelector": label_selector(),
        "sideEffects": {"type": "string"},
        "timeoutSeconds": {"type": "integer", "format": "int32", "default": 10},
        "matchConditions": match_conditions(),
    });
    if mutating {
        properties["reinvocationPolicy"] = json!({"type": "string", "default": "Never"});
    }
    json!({"type": "object", "properties": properties})
}

/// The value rules of a schema dropped, types, defaults and list types
/// kept: kube checks webhook configurations in Go (`validation.rs` does as
/// it does), and a schema would report the same faults in other words.
fn types_only(mut s: Value) -> Value {
    strip_value_rules(&mut s);
    s
}

fn strip_value_rules(s: &mut Value) {
    if let Value::Object(o) = s {
        for k in [
            "required",
            "enum",
            "minimum",
            "maximum",
            "minItems",
            "maxItems",
            "x-kubernetes-validations",
        ] {
            o.remove(k);
        }
        o.values_mut().for_each(strip_value_rules);
    }
}

/// The patch metadata of kube's own types of these kinds (what their Go
/// struct tags and published OpenAPI say): lists merged by a key under
/// strategic merge patch. `None` for any other resource: a custom
/// resource takes no strategic merge patch.
pub fn strategic_merge_meta(group: &str, plural: &str) -> Option<Value> {
    use super::hooks::{BINDINGS, MUTATING, POLICIES, VALIDATING};
    let by_name = |items: Value| {
        json!({"type": "array", "x-kubernetes-patch-strategy": "merge",
               "x-kubernetes-patch-merge-key": "name", "items": items})
    };
    let conditions = by_name(json!({"type": "object"}));
    match (group, plural) {
        (GROUP, MUTATING | VALIDATING) => Some(json!({"type": "object", "properties": {
            "webhooks": by_name(json!({"type": "object", "properties": {"matchConditions": conditions}})),
        }})),
        (GROUP, POLICIES) => Some(json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "matchConditions": conditions,
                "variables": by_name(json!({"type": "object"})),
            }},
        }})),
        (GROUP, BINDINGS) => Some(json!({"type": "object"})),
        _ => None,
    }
}

/// kube's own validation of `obj` when `group`/`plural` is one of these
/// kinds (`validation.rs`, `policy_validation.rs`), in its words and
/// order; `None` for any other resource. With the errors, whether an
/// update is excused those on fields it left as they were (the webhook
/// configurations'); kube checks a policy or binding whole on every
/// update.
pub fn builtin_validation(
    group: &str,
    plural: &str,
    obj: &Value,
) -> Option<(Vec<crate::status::FieldError>, bool)> {
    use super::hooks::{BINDINGS, MUTATING, POLICIES, VALIDATING};
    match (group, plural) {
        (GROUP, MUTATING) => Some((super::validation::webhook_configuration(obj, true), true)),
        (GROUP, VALIDATING) => Some((super::validation::webhook_configuration(obj, false), true)),
        (GROUP, POLICIES) => Some((super::policy_validation::policy(obj), false)),
        (GROUP, BINDINGS) => Some((super::policy_validation::binding(obj), false)),
        _ => None,
    }
}

fn webhooks_schema(mutating: bool) -> Value {
    let webhook = types_only(webhook(mutating));
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "webhooks": {
                "type": "array",
                "items": webhook,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        },
    })
}

fn crd(kind: &str, plural: &str, schema: Value, status: bool) -> Value {
    let mut version = json!({
        "name": "v1",
        "served": true,
        "storage": true,
        "schema": {"openAPIV3Schema": schema},
    });
    if status {
        version["subresources"] = json!({"status": {}});
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "plural": plural,
                "singular": kind.to_lowercase(),
                "kind": kind,
                "listKind": format!("{kind}List"),
                "categories": ["api-extensions"],
            },
            "versions": [version],
        },
    })
}

/// The top-level fields kube's type of a kind always carries, even empty
/// (its non-pointer structs), which field ownership starts from on create.
pub fn always_present(group: &str, plural: &str) -> &'static [&'static str] {
    use super::hooks::{BINDINGS, POLICIES};
    match (group, plural) {
        (GROUP, POLICIES) => &["spec", "status"],
        (GROUP, BINDINGS) => &["spec"],
        _ => &[],
    }
}

/// What kube's Go types of these kinds do to an object written: a list
/// left empty is not stored (their slices are `omitempty`), so
/// `webhooks: []`, `rules: []` or `matchConditions: []` read back absent,
/// and no manager owns them. `admissionReviewVersions` is the one list
/// kube's types keep when empty (their validation refuses it anyway).
pub fn omit_empty_lists(obj: &mut Value) {
    fn walk(v: &mut Value, top: bool) {
        match v {
            Value::Object(o) => {
                // Object metadata is every kind's, handled as such.
                let own = |k: &str| !(top && k == "metadata");
                o.retain(|k, v| {
                    !own(k)
                        || k == "admissionReviewVersions"
                        || v.as_array().is_none_or(|a| !a.is_empty())
                });
                o.iter_mut()
                    .filter(|(k, _)| own(k))
                    .for_each(|(_, v)| walk(v, false));
            }
            Value::Array(a) => a.iter_mut().for_each(|v| walk(v, false)),
            _ => {}
        }
    }
    walk(obj, true);
}

/// The CRDs as one multi-document YAML text (what the catalog loads).
pub fn manifests_yaml() -> String {
    use super::hooks::{BINDINGS, MUTATING, POLICIES, VALIDATING};
    let mut out = String::new();
    for c in [
        crd(
            "MutatingWebhookConfiguration",
            MUTATING,
            webhooks_schema(true),
            false,
        ),
        crd(
            "ValidatingWebhookConfiguration",
            VALIDATING,
            webhooks_schema(false),
            false,
        ),
        crd(
            "ValidatingAdmissionPolicy",
            POLICIES,
            types_only(policy_schema()),
            true,
        ),
        crd(
            "ValidatingAdmissionPolicyBinding",
            BINDINGS,
            types_only(binding_schema()),
            false,
        ),
    ] {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&c).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_lists_are_not_stored_as_kubes_types_omit_them() {
        let mut o = json!({"metadata": {"finalizers": []}, "webhooks": [{"name": "a",
            "rules": [], "admissionReviewVersions": [], "namespaceSelector": {"matchExpressions": []}}]});
        omit_empty_lists(&mut o);
        assert_eq!(
            o,
            json!({"metadata": {"finalizers": []}, "webhooks": [{"name": "a",
                "admissionReviewVersions": [], "namespaceSelector": {}}]})
        );
        let mut empty = json!({"webhooks": []});
        omit_empty_lists(&mut empty);
        assert_eq!(empty, json!({}));
    }

    #[test]
    fn the_crds_load_into_a_catalog() {
        let mut c = crate::registry::Catalog::default();
        c.add_builtin_manifests(std::path::Path::new("<admission>"), &manifests_yaml())
            .expect("built-in admission CRDs load");
        assert!(c.find(GROUP, "v1", super::super::hooks::MUTATING).is_some());
        assert!(c
            .find(GROUP, "v1", super::super::hooks::VALIDATING)
            .is_some());
    }
}
