//! kube-apiserver's validation of `admissionregistration.k8s.io/v1`
//! MutatingWebhookConfiguration and ValidatingWebhookConfiguration, with its
//! field paths, messages and order, for the objects standalone kshard
//! stores as built-in custom resources (`crd.rs`). Their CRD schemas keep
//! only types and defaults; every value rule is here, because a schema says
//! them in other words (`should be greater than or equal to 1` where kube
//! says `the timeout value must be between 1 and 30 seconds`) and in other
//! orders. Checked against a running kube-apiserver 1.36 (differential
//! scenarios in `tests/differential/50_admission_objects.yaml`).
//!
//! A match condition that does not compile is refused as kube refuses it,
//! described by kshard's CEL parser (the `cel` crate), whose syntax errors
//! read as cel-go's (both come from CEL's ANTLR grammar); other compile
//! errors may be worded otherwise.

use serde_json::Value;

use crate::apiextensions::validation::{dns1035_errors, webhook_service, webhook_url};
use crate::object::meta::{dns_subdomain_errors, label_key_errors, label_value_errors};
use crate::status::{FieldError, FieldErrorKind};

const ACCEPTED_REVIEW_VERSIONS: [&str; 2] = ["v1", "v1beta1"];
const MAX_MATCH_CONDITIONS: usize = 64;

/// A field that is set: present and not null.
pub(super) fn present<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.get(k).filter(|v| !v.is_null())
}

pub(super) fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(super) fn invalid_raw(
    field: impl Into<String>,
    rendered: String,
    detail: impl Into<String>,
) -> FieldError {
    FieldError::new(FieldErrorKind::Invalid, field, Some(rendered), detail)
}

/// A string list as kube renders a bad one (`["*","CREATE"]`).
pub(super) fn rendered_list(items: &[&str]) -> String {
    serde_json::to_string(items).unwrap_or_default()
}

/// `ValidateMutatingWebhookConfiguration` / `ValidateValidatingWebhookConfiguration`
/// less the object metadata (checked with every kind's): each webhook's own
/// rules, then its admissionReviewVersions, then whether its name was taken.
pub fn webhook_configuration(obj: &Value, mutating: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(hooks) = obj.get("webhooks").and_then(Value::as_array) else {
        return errs;
    };
    let mut names: Vec<&str> = Vec::new();
    for (i, hook) in hooks.iter().enumerate() {
        let at = format!("webhooks[{i}]");
        webhook(hook, mutating, &at, &mut errs);
        review_versions(
            present(hook, "admissionReviewVersions"),
            &format!("{at}.admissionReviewVersions"),
            &mut errs,
        );
        let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
        if !name.is_empty() {
            if names.contains(&name) {
                errs.push(FieldError::new(
                    FieldErrorKind::Duplicate,
                    format!("{at}.name"),
                    Some(crate::status::quote(name)),
                    "",
                ));
            } else {
                names.push(name);
            }
        }
    }
    errs
}

fn webhook(hook: &Value, mutating: bool, at: &str, errs: &mut Vec<FieldError>) {
    fully_qualified_name(
        hook.get("name").and_then(Value::as_str).unwrap_or_default(),
        &format!("{at}.name"),
        errs,
    );
    if let Some(rules) = hook.get("rules").and_then(Value::as_array) {
        for (i, r) in rules.iter().enumerate() {
            rule_with_operations(r, &format!("{at}.rules[{i}]"), errs);
        }
    }
    one_of(hook, "failurePolicy", &["Fail", "Ignore"], at, errs);
    one_of(hook, "matchPolicy", &["Equivalent", "Exact"], at, errs);
    const SIDE_EFFECTS: [&str; 2] = ["None", "NoneOnDryRun"];
    if present(hook, "sideEffects").is_none() {
        errs.push(FieldError::required(
            format!("{at}.sideEffects"),
            format!("must specify one of {}", SIDE_EFFECTS.join(", ")),
        ));
    }
    one_of(hook, "sideEffects", &SIDE_EFFECTS, at, errs);
    if let Some(t) = present(hook, "timeoutSeconds").and_then(Value::as_i64) {
        if !(1..=30).contains(&t) {
            errs.push(invalid_raw(
                format!("{at}.timeoutSeconds"),
                t.to_string(),
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if let Some(s) = present(hook, sel) {
            label_selector(s, &format!("{at}.{sel}"), errs);
        }
    }
    if mutating {
        one_of(hook, "reinvocationPolicy", &["IfNeeded", "Never"], at, errs);
    }
    let cc_at = format!("{at}.clientConfig");
    let cc = hook.get("clientConfig").unwrap_or(&Value::Null);
    let url = present(cc, "url").and_then(Value::as_str);
    match (url, present(cc, "service")) {
        (Some(u), None) => webhook_url(u, &format!("{cc_at}.url"), errs),
        (None, Some(s)) => webhook_service(s, &format!("{cc_at}.service"), errs),
        _ => errs.push(FieldError::required(
            cc_at,
            "exactly one of url or service is required",
        )),
    }
    if let Some(conds) = present(hook, "matchConditions").and_then(Value::as_array) {
        match_conditions(conds, &format!("{at}.matchConditions"), errs);
    }
}

/// A set field must be one of `supported` (kube lists them sorted).
pub(super) fn one_of(
    hook: &Value,
    key: &str,
    supported: &[&str],
    at: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(v) = present(hook, key).and_then(Value::as_str) {
        if !supported.contains(&v) {
            errs.push(FieldError::not_supported(
                format!("{at}.{key}"),
                v,
                supported,
            ));
        }
    }
}

/// apimachinery's `IsFullyQualifiedName`: the first failure only.
fn fully_qualified_name(name: &str, at: &str, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(FieldError::required(at, ""));
        return;
    }
    let sub = dns_subdomain_errors(name);
    if !sub.is_empty() {
        errs.push(FieldError::invalid(at, name, sub.join(",")));
        return;
    }
    if name.split('.').count() < 3 {
        errs.push(FieldError::invalid(
            at,
            name,
            "should be a domain with at least three segments separated by dots",
        ));
    }
}

/// `validateAdmissionReviewVersions`, recognised versions required.
fn review_versions(v: Option<&Value>, at: &str, errs: &mut Vec<FieldError>) {
    let versions = strings(v);
    if versions.is_empty() {
        errs.push(FieldError::required(
            at,
            format!(
                "must specify one of {}",
                ACCEPTED_REVIEW_VERSIONS.join(", ")
            ),
        ));
        return;
    }
    let mut seen: Vec<&str> = Vec::new();
    let mut accepted = false;
    for (i, version) in versions.iter().enumerate() {
        if seen.contains(version) {
            errs.push(FieldError::invalid(
                format!("{at}[{i}]"),
                version,
                "duplicate version",
            ));
            continue;
        }
        seen.push(version);
        for m in dns1035_errors(version) {
            errs.push(FieldError::invalid(format!("{at}[{i}]"), version, m));
        }
        accepted |= ACCEPTED_REVIEW_VERSIONS.contains(version);
    }
    if !accepted {
        errs.push(invalid_raw(
            at,
            rendered_list(&versions),
            format!(
                "must include at least one of {}",
                ACCEPTED_REVIEW_VERSIONS.join(", ")
            ),
        ));
    }
}

/// `validateRuleWithOperations`: the operations, then the rule.
pub(super) fn rule_with_operations(r: &Value, at: &str, errs: &mut Vec<FieldError>) {
    const OPERATIONS: [&str; 5] = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    let ops = strings(present(r, "operations"));
    let ops_at = format!("{at}.operations");
    if ops.is_empty() {
        errs.push(FieldError::required(&ops_at, ""));
    }
    if ops.len() > 1 && ops.contains(&"*") {
        errs.push(invalid_raw(
            &ops_at,
            rendered_list(&ops),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (i, op) in ops.iter().enumerate() {
        if !OPERATIONS.contains(op) {
            errs.push(FieldError::not_supported(
                format!("{ops_at}[{i}]"),
                op,
                &OPERATIONS,
            ));
        }
    }
    rule(r, at, errs);
}

/// `validateRule`: groups, versions, resources and scope.
fn rule(r: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let groups = strings(present(r, "apiGroups"));
    if groups.is_empty() {
        errs.push(FieldError::required(format!("{at}.apiGroups"), ""));
    }
    if groups.len() > 1 && groups.contains(&"*") {
        errs.push(invalid_raw(
            format!("{at}.apiGroups"),
            rendered_list(&groups),
            "if '*' is present, must not specify other API groups",
        ));
    }
    let versions = strings(present(r, "apiVersions"));
    if versions.is_empty() {
        errs.push(FieldError::required(format!("{at}.apiVersions"), ""));
    }
    if versions.len() > 1 && versions.contains(&"*") {
        errs.push(invalid_raw(
            format!("{at}.apiVersions"),
            rendered_list(&versions),
            "if '*' is present, must not specify other API versions",
        ));
    }
    for (i, v) in versions.iter().enumerate() {
        if v.is_empty() {
            errs.push(FieldError::required(format!("{at}.apiVersions[{i}]"), ""));
        }
    }
    resources(
        &strings(present(r, "resources")),
        &format!("{at}.resources"),
        errs,
    );
    const SCOPES: [&str; 3] = ["*", "Cluster", "Namespaced"];
    one_of(r, "scope", &SCOPES, at, errs);
}

/// `validateResources`: `*` and `*/*` alone, and no subresource named
/// again under a `res/*` or `*/sub` that covers it.
fn resources(list: &[&str], at: &str, errs: &mut Vec<FieldError>) {
    if list.is_empty() {
        errs.push(FieldError::required(at, ""));
    }
    let mut any_subresource_of: Vec<&str> = Vec::new();
    let mut any_resource_with: Vec<&str> = Vec::new();
    let (mut double_wildcard, mut single_wildcard, mut plain) = (false, false, false);
    for (i, res_sub) in list.iter().enumerate() {
        if res_sub.is_empty() {
            errs.push(FieldError::required(format!("{at}[{i}]"), ""));
            continue;
        }
        double_wildcard |= *res_sub == "*/*";
        single_wildcard |= *res_sub == "*";
        let Some((res, sub)) = res_sub.split_once('/') else {
            plain |= *res_sub != "*";
            continue;
        };
        if any_subresource_of.contains(&res) {
            errs.push(FieldError::invalid(
                format!("{at}[{i}]"),
                res_sub,
                format!("if '{res}/*' is present, must not specify {res_sub}"),
            ));
        }
        if any_resource_with.contains(&sub) {
            errs.push(FieldError::invalid(
                format!("{at}[{i}]"),
                res_sub,
                format!("if '*/{sub}' is present, must not specify {res_sub}"),
            ));
        }
        if sub == "*" {
            any_subresource_of.push(res);
        }
        if res == "*" {
            any_resource_with.push(sub);
        }
    }
    if list.len() > 1 && double_wildcard {
        errs.push(invalid_raw(
            at,
            rendered_list(list),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if single_wildcard && plain {
        errs.push(invalid_raw(
            at,
            rendered_list(list),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
}

/// `ValidateLabelSelector`: the labels, then each expression.
pub(super) fn label_selector(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    if let Some(labels) = present(s, "matchLabels").and_then(Value::as_object) {
        let at = format!("{at}.matchLabels");
        for (k, v) in labels {
            for m in label_key_errors(k) {
                errs.push(FieldError::invalid(&at, k, m));
            }
            let v = v.as_str().unwrap_or_default();
            for m in label_value_errors(v) {
                errs.push(FieldError::invalid(&at, v, m));
            }
        }
    }
    if let Some(exprs) = present(s, "matchExpressions").and_then(Value::as_array) {
        for (i, e) in exprs.iter().enumerate() {
            let e_at = format!("{at}.matchExpressions[{i}]");
            let values = strings(present(e, "values"));
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match op {
                "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                    format!("{e_at}.values"),
                    "must be specified when `operator` is 'In' or 'NotIn'",
                )),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    errs.push(FieldError::forbidden(
                        format!("{e_at}.values"),
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    ))
                }
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                _ => errs.push(FieldError::invalid(
                    format!("{e_at}.operator"),
                    op,
                    "not a valid selector operator",
                )),
            }
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            for m in label_key_errors(key) {
                errs.push(FieldError::invalid(format!("{e_at}.key"), key, m));
            }
            for (j, v) in values.iter().enumerate() {
                for m in label_value_errors(v) {
                    errs.push(FieldError::invalid(format!("{e_at}.values[{j}]"), v, m));
                }
            }
        }
    }
}

/// Why a CEL expression does not compile, in kube's words
/// (`compilation failed: ERROR: <input>:1:3: Syntax error: ...`): kube
/// refuses what does not compile when it is stored. The detail is the cel
/// crate's parser's, whose syntax errors read as cel-go's; kshard does not
/// type-check, so an expression kube's checker refuses (an undeclared
/// name, a message expression that is not a string) passes here.
pub(super) fn compile_failure(expression: &str) -> Option<String> {
    let e = kube_cel::cel::Program::compile(expression).err()?;
    // cel-go indents the quoted source and caret lines by a space.
    let text = e.to_string().replace("\n| ", "\n | ");
    Some(format!("compilation failed: {text}"))
}

/// `validateMatchConditions`, CEL compiled as [`compile_failure`] does.
pub(super) fn match_conditions(conds: &[Value], at: &str, errs: &mut Vec<FieldError>) {
    if conds.len() > MAX_MATCH_CONDITIONS {
        errs.push(FieldError::new(
            FieldErrorKind::TooMany,
            at,
            Some(conds.len().to_string()),
            format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        ));
    }
    let mut names: Vec<&str> = Vec::new();
    for (i, c) in conds.iter().enumerate() {
        let c_at = format!("{at}[{i}]");
        let expression = c
            .get("expression")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if expression.trim().is_empty() {
            errs.push(FieldError::required(format!("{c_at}.expression"), ""));
        } else if let Some(failure) = compile_failure(expression.trim()) {
            // kube compiles, and quotes, the expression trimmed.
            errs.push(FieldError::invalid(
                format!("{c_at}.expression"),
                expression.trim(),
                failure,
            ));
        }
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError::required(format!("{c_at}.name"), ""));
        } else {
            for m in label_key_errors(name) {
                errs.push(FieldError::invalid(format!("{c_at}.name"), name, m));
            }
            if names.contains(&name) {
                errs.push(FieldError::new(
                    FieldErrorKind::Duplicate,
                    format!("{c_at}.name"),
                    Some(crate::status::quote(name)),
                    "",
                ));
            } else {
                names.push(name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(obj: &Value, mutating: bool) -> Vec<String> {
        webhook_configuration(obj, mutating)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn config(hook: Value) -> Value {
        let mut h = json!({"name": "a.example.com", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "clientConfig": {"url": "https://x.example.com/a"}});
        if let (Some(h), Some(more)) = (h.as_object_mut(), hook.as_object()) {
            for (k, v) in more {
                h.insert(k.clone(), v.clone());
            }
        }
        json!({"webhooks": [h]})
    }

    #[test]
    fn a_valid_configuration_passes() {
        assert!(messages(&config(json!({})), true).is_empty());
        let full = config(
            json!({"rules": [{"operations": ["CREATE"], "apiGroups": [""],
            "apiVersions": ["v1"], "resources": ["pods", "pods/status"], "scope": "*"}],
            "failurePolicy": "Ignore", "matchPolicy": "Exact", "timeoutSeconds": 30,
            "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            "matchConditions": [{"name": "c", "expression": "true"}]}),
        );
        assert!(messages(&full, false).is_empty());
    }

    #[test]
    fn timeouts_and_ports_out_of_range_in_kubes_words() {
        for t in [0, 31, -1] {
            assert_eq!(
                messages(&config(json!({"timeoutSeconds": t})), false),
                [format!("webhooks[0].timeoutSeconds: Invalid value: {t}: the timeout value must be between 1 and 30 seconds")]
            );
        }
        let svc = config(
            json!({"clientConfig": {"service": {"namespace": "n", "name": "s", "port": 0}}}),
        );
        assert_eq!(
            messages(&svc, false),
            ["webhooks[0].clientConfig.service.port: Invalid value: 0: port is not valid: must be between 1 and 65535, inclusive"]
        );
    }

    #[test]
    fn errors_come_in_kubes_order() {
        let bad = config(json!({"name": "ab", "admissionReviewVersions": ["v9"],
            "rules": [{"operations": ["BAD"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Bad"}],
            "failurePolicy": "Bad", "matchPolicy": "Bad", "sideEffects": "Some", "timeoutSeconds": 0,
            "clientConfig": {"service": {"namespace": "n", "name": "s", "port": 0}},
            "reinvocationPolicy": "Bad", "namespaceSelector": {"matchLabels": {"a b": "c"}}}));
        let fields: Vec<String> = webhook_configuration(&bad, true)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "webhooks[0].name",
                "webhooks[0].rules[0].operations[0]",
                "webhooks[0].rules[0].scope",
                "webhooks[0].failurePolicy",
                "webhooks[0].matchPolicy",
                "webhooks[0].sideEffects",
                "webhooks[0].timeoutSeconds",
                "webhooks[0].namespaceSelector.matchLabels",
                "webhooks[0].reinvocationPolicy",
                "webhooks[0].clientConfig.service.port",
                "webhooks[0].admissionReviewVersions",
            ]
        );
    }

    #[test]
    fn duplicates_and_required_fields() {
        let mut two = config(json!({}));
        let first = two["webhooks"][0].clone();
        if let Some(a) = two["webhooks"].as_array_mut() {
            a.push(first);
        }
        assert_eq!(
            messages(&two, false),
            [r#"webhooks[1].name: Duplicate value: "a.example.com""#]
        );
        let bare = json!({"webhooks": [{}]});
        assert_eq!(
            messages(&bare, false),
            [
                "webhooks[0].name: Required value",
                "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
                "webhooks[0].clientConfig: Required value: exactly one of url or service is required",
                "webhooks[0].admissionReviewVersions: Required value: must specify one of v1, v1beta1",
            ]
        );
    }

    #[test]
    fn resource_wildcards() {
        let m = |res: Value| {
            messages(
                &config(
                    json!({"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": res}]}),
                ),
                false,
            )
        };
        assert_eq!(
            m(json!(["pods/*", "pods/status", "*/status", "a/b/c"])),
            [
                r#"webhooks[0].rules[0].resources[1]: Invalid value: "pods/status": if 'pods/*' is present, must not specify pods/status"#
            ]
        );
        assert_eq!(
            m(json!(["*", "pods"])),
            [
                r#"webhooks[0].rules[0].resources: Invalid value: ["*","pods"]: if '*' is present, must not specify other resources without subresources"#
            ]
        );
        assert!(m(json!(["*", "*/status"])).is_empty());
    }

    #[test]
    fn match_conditions_that_do_not_compile_are_refused() {
        let bad = json!([{"name": "a", "expression": "!!"}, {"name": "b", "expression": "object != null"}]);
        let got = webhook_configuration(&config(json!({"matchConditions": bad})), false);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].field, "webhooks[0].matchConditions[0].expression");
        assert!(
            got[0].detail.starts_with("compilation failed: "),
            "{}",
            got[0].detail
        );
    }

    #[test]
    fn match_conditions_count_and_names() {
        let many: Vec<Value> = (0..65)
            .map(|i| json!({"name": format!("c{i}"), "expression": "true"}))
            .collect();
        assert_eq!(
            messages(&config(json!({"matchConditions": many})), false),
            ["webhooks[0].matchConditions: Too many: 65: must have at most 64 items"]
        );
        let dup = json!([{"name": "a", "expression": "true"}, {"name": "a", "expression": " "}]);
        assert_eq!(
            messages(&config(json!({"matchConditions": dup})), false),
            [
                "webhooks[0].matchConditions[1].expression: Required value",
                r#"webhooks[0].matchConditions[1].name: Duplicate value: "a""#
            ]
        );
    }
}
