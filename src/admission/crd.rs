//! The CRDs that let a standalone kshard serve
//! `admissionregistration.k8s.io/v1` MutatingWebhookConfiguration,
//! ValidatingWebhookConfiguration, ValidatingAdmissionPolicy and
//! ValidatingAdmissionPolicyBinding, so `kubectl apply -f webhook.yaml`
//! configures it. The schema carries kube's defaults (failurePolicy Fail,
//! matchPolicy Equivalent, empty selectors, timeoutSeconds 10,
//! reinvocationPolicy Never, rule scope `*`, service port 443) and the
//! checks of kube's validation a schema can say (required fields, enums,
//! the timeout's range, v1's side effects, unique webhook and condition
//! names, url or service). They are served only by kshard: behind a host,
//! the host's own objects configure it.

use serde_json::{json, Value};

use super::config::GROUP;

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
                "items": {"type": "string", "enum": ["*", "CREATE", "UPDATE", "DELETE", "CONNECT"]},
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
            "matchPolicy": {"type": "string", "enum": ["Exact", "Equivalent"], "default": "Equivalent"},
        },
    })
}

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
                                "reason": {"type": "string", "enum": ["Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"]},
                            },
                        },
                    },
                    "failurePolicy": {"type": "string", "enum": ["Ignore", "Fail"], "default": "Fail"},
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
                        "properties": {
                            "name": {"type": "string"},
                            "namespace": {"type": "string"},
                            "selector": selector(),
                            "parameterNotFoundAction": {"type": "string", "enum": ["Allow", "Deny"]},
                        },
                    },
                    "matchResources": match_resources(),
                    "validationActions": {
                        "type": "array",
                        "minItems": 1,
                        "x-kubernetes-list-type": "set",
                        "items": {"type": "string", "enum": ["Deny", "Warn", "Audit"]},
                    },
                },
            },
        },
    })
}

fn webhook(mutating: bool) -> Value {
    let mut properties = json!({
        "name": {
            "type": "string",
            "x-kubernetes-validations": [{
                "rule": "self.split('.').size() >= 3",
                "message": "should be a domain with at least three segments separated by dots",
            }],
        },
        "admissionReviewVersions": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string"},
            "x-kubernetes-list-type": "set",
            "x-kubernetes-validations": [{
                "rule": "self.exists(v, v == 'v1' || v == 'v1beta1')",
                "message": "must include at least one of v1, v1beta1",
            }],
        },
        "clientConfig": {
            "type": "object",
            "x-kubernetes-validations": [{
                "rule": "has(self.url) != has(self.service)",
                "message": "exactly one of url or service is required",
            }],
            "properties": {
                "url": {
                    "type": "string",
                    "x-kubernetes-validations": [{
                        "rule": "self.startsWith('https://')",
                        "message": "'https' is the only allowed URL scheme",
                    }],
                },
                "caBundle": {"type": "string", "format": "byte"},
                "service": {
                    "type": "object",
                    "required": ["namespace", "name"],
                    "properties": {
                        "namespace": {"type": "string"},
                        "name": {"type": "string"},
                        "path": {"type": "string"},
                        "port": {"type": "integer", "format": "int32", "default": 443, "minimum": 1, "maximum": 65535},
                    },
                },
            },
        },
        "rules": {"type": "array", "x-kubernetes-list-type": "atomic", "items": rule(false)},
        "failurePolicy": {"type": "string", "enum": ["Ignore", "Fail"], "default": "Fail"},
        "matchPolicy": {"type": "string", "enum": ["Exact", "Equivalent"], "default": "Equivalent"},
        "namespaceSelector": label_selector(),
        "objectSelector": label_selector(),
        // admissionregistration/v1 accepts only these two on create; an
        // older value already stored stays (kshard ratchets unchanged values).
        "sideEffects": {"type": "string", "enum": ["None", "NoneOnDryRun"]},
        "timeoutSeconds": {"type": "integer", "format": "int32", "default": 10, "minimum": 1, "maximum": 30},
        "matchConditions": match_conditions(),
    });
    if mutating {
        properties["reinvocationPolicy"] =
            json!({"type": "string", "enum": ["Never", "IfNeeded"], "default": "Never"});
    }
    json!({
        "type": "object",
        "required": ["name", "clientConfig", "sideEffects", "admissionReviewVersions"],
        "properties": properties,
    })
}

fn webhooks_schema(mutating: bool) -> Value {
    json!({
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "webhooks": {
                "type": "array",
                "items": webhook(mutating),
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
    use super::config::{BINDINGS, POLICIES};
    match (group, plural) {
        (GROUP, POLICIES) => &["spec", "status"],
        (GROUP, BINDINGS) => &["spec"],
        _ => &[],
    }
}

/// The CRDs as one multi-document YAML text (what the catalog loads).
pub fn manifests_yaml() -> String {
    use super::config::{BINDINGS, MUTATING, POLICIES, VALIDATING};
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
        crd("ValidatingAdmissionPolicy", POLICIES, policy_schema(), true),
        crd(
            "ValidatingAdmissionPolicyBinding",
            BINDINGS,
            binding_schema(),
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
    fn the_crds_load_into_a_catalog() {
        let mut c = crate::registry::Catalog::default();
        c.add_builtin_manifests(std::path::Path::new("<admission>"), &manifests_yaml())
            .expect("built-in admission CRDs load");
        assert!(c
            .find(GROUP, "v1", super::super::config::MUTATING)
            .is_some());
        assert!(c
            .find(GROUP, "v1", super::super::config::VALIDATING)
            .is_some());
    }
}
