//! kube-apiserver's validation of `admissionregistration.k8s.io/v1`
//! ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding, with its
//! field paths, messages and order, for the objects standalone kshard
//! stores as built-in custom resources (`crd.rs`). As for the webhook
//! configurations (`validation.rs`), their CRD schemas keep only types,
//! defaults and list types, and every value rule is here: a schema would
//! say them in other words and orders, and stop at the first of them.
//! Checked against a running kube-apiserver 1.36 (differential scenarios in
//! `tests/differential/55_admission_policy_validation.yaml`).
//!
//! The rules run on the object as defaulted (failurePolicy, matchPolicy,
//! selectors and rule scopes come from the schema's defaults, as kube's
//! defaulting gives them before its validation). CEL expressions are
//! parsed, not type-checked (see [`compile_failure`]).

use serde_json::{json, Value};

use super::validation::{
    compile_failure, invalid_raw, label_selector, match_conditions, one_of, present, rendered_list,
    rule_with_operations, strings,
};
use crate::apiextensions::validation::dns1035_errors;
use crate::object::meta::{dns_subdomain_errors, label_key_errors, path_segment_errors};
use crate::status::{FieldError, FieldErrorKind};

const MAX_AUDIT_ANNOTATIONS: usize = 20;
/// Bytes of an audit annotation's value expression, trimmed.
const MAX_AUDIT_VALUE_EXPRESSION: usize = 5 * 1024;

fn text<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn items<'a>(v: &'a Value, k: &str) -> &'a [Value] {
    present(v, k)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn duplicate(at: impl Into<String>, value: &str) -> FieldError {
    FieldError::new(
        FieldErrorKind::Duplicate,
        at,
        Some(crate::status::quote(value)),
        "",
    )
}

/// `ValidateValidatingAdmissionPolicy` less the object metadata (checked
/// with every kind's).
pub fn policy(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let null = Value::Null;
    let spec = present(obj, "spec").unwrap_or(&null);
    let at = "spec";
    match present(spec, "failurePolicy").and_then(Value::as_str) {
        None => errs.push(FieldError::required(format!("{at}.failurePolicy"), "")),
        Some(_) => one_of(spec, "failurePolicy", &["Fail", "Ignore"], at, &mut errs),
    }
    if let Some(kind) = present(spec, "paramKind") {
        param_kind(kind, &format!("{at}.paramKind"), &mut errs);
    }
    match present(spec, "matchConstraints") {
        None => errs.push(FieldError::required(format!("{at}.matchConstraints"), "")),
        Some(m) => {
            match_resources(m, &format!("{at}.matchConstraints"), &mut errs);
            // The rules give the policy's expressions their types.
            if items(m, "resourceRules").is_empty() {
                errs.push(FieldError::required(
                    format!("{at}.matchConstraints.resourceRules"),
                    "",
                ));
            }
        }
    }
    if let Some(conds) = present(spec, "matchConditions").and_then(Value::as_array) {
        match_conditions(conds, &format!("{at}.matchConditions"), &mut errs);
    }
    for (i, v) in items(spec, "variables").iter().enumerate() {
        variable(v, &format!("{at}.variables[{i}]"), &mut errs);
    }
    let (validations, audits) = (items(spec, "validations"), items(spec, "auditAnnotations"));
    if validations.is_empty() && audits.is_empty() {
        for k in ["validations", "auditAnnotations"] {
            errs.push(FieldError::required(
                format!("{at}.{k}"),
                "validations or auditAnnotations must contain at least one item",
            ));
        }
        return errs;
    }
    for (i, v) in validations.iter().enumerate() {
        validation(v, &format!("{at}.validations[{i}]"), &mut errs);
    }
    if audits.len() > MAX_AUDIT_ANNOTATIONS {
        // kube renders its internal type, whose fields carry no JSON names.
        let shown: Vec<Value> = audits
            .iter()
            .map(|a| json!({"Key": text(a, "key"), "ValueExpression": text(a, "valueExpression")}))
            .collect();
        errs.push(invalid_raw(
            format!("{at}.auditAnnotations"),
            Value::Array(shown).to_string(),
            format!("must not have more than {MAX_AUDIT_ANNOTATIONS} auditAnnotations"),
        ));
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut keys: Vec<&str> = Vec::new();
    for (i, a) in audits.iter().enumerate() {
        let a_at = format!("{at}.auditAnnotations[{i}]");
        audit_annotation(a, name, &a_at, &mut errs);
        let key = text(a, "key");
        if keys.contains(&key) {
            errs.push(duplicate(format!("{a_at}.key"), key));
        }
        keys.push(key);
    }
    errs
}

/// `validateParamKind`: apiVersion as `group/version`, kind as a DNS-1035
/// label in any case.
fn param_kind(kind: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let api_version = text(kind, "apiVersion");
    let v_at = format!("{at}.apiVersion");
    if api_version.is_empty() {
        errs.push(FieldError::required(&v_at, ""));
    } else {
        let parsed = match api_version.matches('/').count() {
            _ if api_version == "/" => Some(("", "")),
            0 => Some(("", api_version)),
            1 => api_version.split_once('/'),
            _ => None,
        };
        match parsed {
            None => errs.push(FieldError::invalid(
                &v_at,
                api_version,
                format!("unexpected GroupVersion string: {api_version}"),
            )),
            Some((group, version)) => {
                if !group.is_empty() {
                    let e = dns_subdomain_errors(group);
                    if !e.is_empty() {
                        errs.push(FieldError::invalid(&v_at, group, e.join(",")));
                    }
                }
                if version.is_empty() {
                    errs.push(FieldError::invalid(
                        &v_at,
                        api_version,
                        "version must be specified",
                    ));
                } else {
                    let e = dns1035_errors(version);
                    if !e.is_empty() {
                        errs.push(FieldError::invalid(&v_at, version, e.join(",")));
                    }
                }
            }
        }
    }
    let k = text(kind, "kind");
    if k.is_empty() {
        errs.push(FieldError::required(format!("{at}.kind"), ""));
    } else {
        let e = dns1035_errors(&k.to_lowercase());
        if !e.is_empty() {
            errs.push(FieldError::invalid(
                format!("{at}.kind"),
                k,
                format!(
                    "may have mixed case, but should otherwise match: {}",
                    e.join(",")
                ),
            ));
        }
    }
}

/// `validateMatchResources`: match policy, selectors (strictly), then the
/// rules and the excluded rules.
fn match_resources(m: &Value, at: &str, errs: &mut Vec<FieldError>) {
    match present(m, "matchPolicy") {
        None => errs.push(FieldError::required(format!("{at}.matchPolicy"), "")),
        Some(_) => one_of(m, "matchPolicy", &["Equivalent", "Exact"], at, errs),
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        match present(m, sel) {
            None => errs.push(FieldError::required(format!("{at}.{sel}"), "")),
            Some(s) => label_selector(s, &format!("{at}.{sel}"), errs),
        }
    }
    for list in ["resourceRules", "excludeResourceRules"] {
        for (i, r) in items(m, list).iter().enumerate() {
            let r_at = format!("{at}.{list}[{i}]");
            let mut seen: Vec<&str> = Vec::new();
            for (j, name) in strings(present(r, "resourceNames")).into_iter().enumerate() {
                let n_at = format!("{r_at}.resourceNames[{j}]");
                for msg in path_segment_errors(name) {
                    errs.push(FieldError::invalid(&n_at, name, msg));
                }
                if seen.contains(&name) {
                    errs.push(duplicate(&n_at, name));
                } else {
                    seen.push(name);
                }
            }
            rule_with_operations(r, &r_at, errs);
        }
    }
}

/// CEL's identifiers, less its reserved words.
fn is_cel_identifier(name: &str) -> bool {
    use crate::schema::cel_decl::RESERVED;
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !RESERVED.contains(&name)
}

/// `validateVariable`.
fn variable(v: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let name = text(v, "name");
    if name.trim().is_empty() {
        errs.push(FieldError::required(
            format!("{at}.name"),
            "name is not specified",
        ));
    } else if !is_cel_identifier(name) {
        errs.push(FieldError::invalid(
            format!("{at}.name"),
            name,
            "must be a valid CEL identifier",
        ));
    }
    let expression = text(v, "expression");
    if expression.trim().is_empty() {
        errs.push(FieldError::required(
            format!("{at}.expression"),
            "expression is not specified",
        ));
    } else if let Some(failure) = compile_failure(expression) {
        errs.push(FieldError::invalid(
            format!("{at}.expression"),
            expression,
            failure,
        ));
    }
}

/// `validateValidation`: the expression, the message expression, the
/// message, the reason. kube compiles the expressions as written (the
/// columns of its errors count the spaces around them).
fn validation(v: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let expression = text(v, "expression");
    if expression.trim().is_empty() {
        errs.push(FieldError::required(
            format!("{at}.expression"),
            "expression is not specified",
        ));
    } else if let Some(failure) = compile_failure(expression) {
        errs.push(FieldError::invalid(
            format!("{at}.expression"),
            expression,
            failure,
        ));
    }
    let message_expression = text(v, "messageExpression");
    if !message_expression.is_empty() && message_expression.trim().is_empty() {
        errs.push(FieldError::invalid(
            format!("{at}.messageExpression"),
            message_expression,
            "must be non-empty if specified",
        ));
    } else if !message_expression.is_empty() {
        if let Some(failure) = compile_failure(message_expression) {
            errs.push(FieldError::invalid(
                format!("{at}.messageExpression"),
                message_expression,
                failure,
            ));
        }
    }
    let message = text(v, "message");
    if !message.is_empty() && message.trim().is_empty() {
        errs.push(FieldError::invalid(
            format!("{at}.message"),
            message,
            "must be non-empty if specified",
        ));
    } else if message.trim().contains(['\n', '\r']) {
        errs.push(FieldError::invalid(
            format!("{at}.message"),
            message,
            "must not contain line breaks",
        ));
    }
    one_of(
        v,
        "reason",
        &["Forbidden", "Invalid", "RequestEntityTooLarge"],
        at,
        errs,
    );
}

/// `validateAuditAnnotation`: the key as the annotation it becomes
/// (`<policy name>/<key>`), then the value expression.
fn audit_annotation(a: &Value, policy_name: &str, at: &str, errs: &mut Vec<FieldError>) {
    let key = text(a, "key");
    let k_at = format!("{at}.key");
    if policy_name.is_empty() {
        errs.push(FieldError::invalid(
            &k_at,
            key,
            "requires metadata.name be non-empty",
        ));
    } else {
        let full = format!("{policy_name}/{key}");
        for msg in label_key_errors(&full) {
            errs.push(FieldError::invalid(&k_at, &full, msg));
        }
    }
    let expression = text(a, "valueExpression");
    let v_at = format!("{at}.valueExpression");
    let trimmed = expression.trim();
    if trimmed.is_empty() {
        errs.push(FieldError::required(
            v_at,
            "valueExpression is not specified",
        ));
    } else if trimmed.len() > MAX_AUDIT_VALUE_EXPRESSION {
        errs.push(FieldError::required(
            v_at,
            format!("must not exceed {MAX_AUDIT_VALUE_EXPRESSION} bytes in length"),
        ));
    } else if let Some(failure) = compile_failure(trimmed) {
        errs.push(FieldError::invalid(v_at, expression, failure));
    }
}

/// `ValidateValidatingAdmissionPolicyBinding` less the object metadata.
pub fn binding(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let null = Value::Null;
    let spec = present(obj, "spec").unwrap_or(&null);
    let policy_name = text(spec, "policyName");
    if policy_name.is_empty() {
        errs.push(FieldError::required("spec.policyName", ""));
    } else {
        for msg in dns_subdomain_errors(policy_name) {
            errs.push(FieldError::invalid("spec.policyName", policy_name, msg));
        }
    }
    if let Some(r) = present(spec, "paramRef") {
        param_ref(r, "spec.paramRef", &mut errs);
    }
    if let Some(m) = present(spec, "matchResources") {
        match_resources(m, "spec.matchResources", &mut errs);
    }
    validation_actions(
        &strings(present(spec, "validationActions")),
        "spec.validationActions",
        &mut errs,
    );
    errs
}

/// `validateParamRef`: a name or a selector, not both; what to do when no
/// parameter is found.
fn param_ref(r: &Value, at: &str, errs: &mut Vec<FieldError>) {
    const EXCLUSIVE: &str = "name and selector are mutually exclusive";
    let name = text(r, "name");
    let selector = present(r, "selector");
    if !name.is_empty() {
        for msg in path_segment_errors(name) {
            errs.push(FieldError::invalid(format!("{at}.name"), name, msg));
        }
        if selector.is_some() {
            errs.push(FieldError::forbidden(format!("{at}.name"), EXCLUSIVE));
        }
    }
    if let Some(s) = selector {
        label_selector(s, &format!("{at}.selector"), errs);
        if !name.is_empty() {
            errs.push(FieldError::forbidden(format!("{at}.selector"), EXCLUSIVE));
        }
    }
    if name.is_empty() && selector.is_none() {
        errs.push(FieldError::required(
            at,
            "one of name or selector must be specified",
        ));
    }
    let action = text(r, "parameterNotFoundAction");
    if action.is_empty() {
        errs.push(FieldError::required(
            format!("{at}.parameterNotFoundAction"),
            "",
        ));
    } else if action != "Deny" && action != "Allow" {
        // kube lists these two unsorted.
        errs.push(FieldError::not_supported(
            format!("{at}.parameterNotFoundAction"),
            action,
            &["Deny", "Allow"],
        ));
    }
}

/// `validateValidationActions`: known, unique, not both Deny and Warn, one
/// at least.
fn validation_actions(actions: &[&str], at: &str, errs: &mut Vec<FieldError>) {
    const SUPPORTED: [&str; 3] = ["Audit", "Deny", "Warn"];
    let mut seen: Vec<&str> = Vec::new();
    for (i, a) in actions.iter().enumerate() {
        if !SUPPORTED.contains(a) {
            errs.push(FieldError::not_supported(
                format!("{at}[{i}]"),
                a,
                &SUPPORTED,
            ));
        }
        if seen.contains(a) {
            errs.push(duplicate(format!("{at}[{i}]"), a));
        }
        seen.push(a);
    }
    if seen.contains(&"Deny") && seen.contains(&"Warn") {
        errs.push(invalid_raw(
            at,
            rendered_list(actions),
            "must not contain both Deny and Warn (repeating the same validation failure \
             information in the API response and headers serves no purpose)",
        ));
    }
    if seen.is_empty() {
        errs.push(FieldError::required(
            at,
            "at least one validation action is required",
        ));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(errs: Vec<FieldError>) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    fn valid_policy() -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"matchPolicy": "Equivalent", "namespaceSelector": {}, "objectSelector": {},
                "resourceRules": [{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"], "scope": "*"}]},
            "validations": [{"expression": "object.spec.replicas < 5", "message": "too many", "reason": "Invalid"}],
            "variables": [{"name": "_x1", "expression": "1"}],
            "auditAnnotations": [{"key": "k", "valueExpression": "'v'"}]}})
    }

    #[test]
    fn a_valid_policy_and_binding_pass() {
        assert_eq!(messages(policy(&valid_policy())), Vec::<String>::new());
        let b = json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Audit"],
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}}});
        assert_eq!(messages(binding(&b)), Vec::<String>::new());
    }

    #[test]
    fn an_empty_policy_lacks_constraints_and_validations() {
        let p = json!({"metadata": {"name": "p"}, "spec": {"failurePolicy": "Fail"}});
        assert_eq!(
            messages(policy(&p)),
            [
                "spec.matchConstraints: Required value",
                "spec.validations: Required value: validations or auditAnnotations must contain at least one item",
                "spec.auditAnnotations: Required value: validations or auditAnnotations must contain at least one item",
            ]
        );
    }

    #[test]
    fn param_kinds_in_kubes_words() {
        let with = |kind: Value| {
            let mut p = valid_policy();
            p["spec"]["paramKind"] = kind;
            messages(policy(&p))
        };
        assert_eq!(
            with(json!({"apiVersion": "a/b/c", "kind": "ConfigMap"})),
            [
                r#"spec.paramKind.apiVersion: Invalid value: "a/b/c": unexpected GroupVersion string: a/b/c"#
            ]
        );
        assert_eq!(
            with(json!({"apiVersion": "g.example/", "kind": "ConfigMap"})),
            [
                r#"spec.paramKind.apiVersion: Invalid value: "g.example/": version must be specified"#
            ]
        );
        assert_eq!(
            with(json!({})),
            [
                "spec.paramKind.apiVersion: Required value",
                "spec.paramKind.kind: Required value"
            ]
        );
        assert!(with(json!({"apiVersion": "v1", "kind": "ConfigMap"})).is_empty());
    }

    #[test]
    fn variables_audit_annotations_and_expressions() {
        let mut p = valid_policy();
        p["spec"]["variables"] =
            json!([{"name": "in", "expression": "1 +"}, {"name": " ", "expression": "1"}]);
        p["spec"]["auditAnnotations"] =
            json!([{"key": "a", "valueExpression": "'x'"}, {"key": "a", "valueExpression": " "}]);
        p["spec"]["validations"] = json!([{"expression": "true", "message": "a\nb"}]);
        let got = messages(policy(&p));
        assert_eq!(got.len(), 6, "{got:#?}");
        assert_eq!(
            got[0],
            r#"spec.variables[0].name: Invalid value: "in": must be a valid CEL identifier"#
        );
        assert!(got[1].starts_with(
            r#"spec.variables[0].expression: Invalid value: "1 +": compilation failed: ERROR: <input>:1:4: Syntax error"#
        ), "{}", got[1]);
        assert_eq!(
            got[2],
            "spec.variables[1].name: Required value: name is not specified"
        );
        assert_eq!(
            got[3],
            r#"spec.validations[0].message: Invalid value: "a\nb": must not contain line breaks"#
        );
        assert_eq!(
            got[4],
            "spec.auditAnnotations[1].valueExpression: Required value: valueExpression is not specified"
        );
        assert_eq!(
            got[5],
            r#"spec.auditAnnotations[1].key: Duplicate value: "a""#
        );
    }

    #[test]
    fn binding_actions_and_param_refs() {
        let b = json!({"spec": {"policyName": "p", "validationActions": ["Deny", "Warn", "Deny", "Bad"],
            "paramRef": {"name": "a", "selector": {}}}});
        assert_eq!(
            messages(binding(&b)),
            [
                "spec.paramRef.name: Forbidden: name and selector are mutually exclusive",
                "spec.paramRef.selector: Forbidden: name and selector are mutually exclusive",
                "spec.paramRef.parameterNotFoundAction: Required value",
                r#"spec.validationActions[2]: Duplicate value: "Deny""#,
                r#"spec.validationActions[3]: Unsupported value: "Bad": supported values: "Audit", "Deny", "Warn""#,
                r#"spec.validationActions: Invalid value: ["Deny","Warn","Deny","Bad"]: must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)"#,
            ]
        );
        assert_eq!(
            messages(binding(&json!({"spec": {}}))),
            [
                "spec.policyName: Required value",
                "spec.validationActions: Required value: at least one validation action is required"
            ]
        );
    }
}
