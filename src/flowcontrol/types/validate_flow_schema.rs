//! kube's FlowSchema validation: precedence, rules, subjects, URLs.

use super::validation::{err, is_dns1123_label, validate_name, validate_wildcard_list, FieldError};
use super::*;

/// Validates a (defaulted) FlowSchema; an empty list means valid.
pub fn validate_flow_schema(fs: &FlowSchema) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_name(&mut errs, &fs.metadata.name);
    let spec = &fs.spec;
    let p = spec.matching_precedence;
    if p <= 0 {
        err(
            &mut errs,
            "spec.matchingPrecedence",
            format!("Invalid value: {p}: must be a positive value"),
        );
    } else if p > MAX_MATCHING_PRECEDENCE {
        err(
            &mut errs,
            "spec.matchingPrecedence",
            format!("Invalid value: {p}: must not be greater than {MAX_MATCHING_PRECEDENCE}"),
        );
    } else if p == 1 && fs.metadata.name != EXEMPT {
        err(
            &mut errs,
            "spec.matchingPrecedence",
            "Invalid value: 1: only the schema named 'exempt' may have matchingPrecedence 1",
        );
    }
    if let Some(dm) = &spec.distinguisher_method {
        if dm.type_ != BY_USER && dm.type_ != BY_NAMESPACE {
            err(
                &mut errs,
                "spec.distinguisherMethod.type",
                format!(
                    "Unsupported value: {:?}: supported values: \"ByNamespace\", \"ByUser\"",
                    dm.type_
                ),
            );
        }
    }
    if spec.priority_level_configuration.name.is_empty() {
        err(
            &mut errs,
            "spec.priorityLevelConfiguration.name",
            "Required value: must reference a priority level",
        );
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        let rp = format!("spec.rules[{i}]");
        if rule.subjects.is_empty() {
            err(
                &mut errs,
                format!("{rp}.subjects"),
                "Required value: subjects must contain at least one value",
            );
        }
        for (j, s) in rule.subjects.iter().enumerate() {
            validate_subject(&mut errs, &format!("{rp}.subjects[{j}]"), s);
        }
        if rule.resource_rules.is_empty() && rule.non_resource_rules.is_empty() {
            err(
                &mut errs,
                &rp,
                "Required value: at least one of resourceRules and nonResourceRules has to be non-empty",
            );
        }
        for (j, r) in rule.resource_rules.iter().enumerate() {
            validate_resource_rule(&mut errs, &format!("{rp}.resourceRules[{j}]"), r);
        }
        for (j, r) in rule.non_resource_rules.iter().enumerate() {
            validate_non_resource_rule(&mut errs, &format!("{rp}.nonResourceRules[{j}]"), r);
        }
    }
    errs
}

fn validate_subject(errs: &mut Vec<FieldError>, path: &str, s: &Subject) {
    let (user, group, sa) = (
        s.user.is_some(),
        s.group.is_some(),
        s.service_account.is_some(),
    );
    match s.kind.as_str() {
        SUBJECT_USER => match &s.user {
            None => err(
                errs,
                format!("{path}.user"),
                "Required value: user is required when subject kind is 'User'",
            ),
            Some(u) if u.name.is_empty() => err(
                errs,
                format!("{path}.user.name"),
                "Required value: username is required",
            ),
            Some(_) => {}
        },
        SUBJECT_GROUP => match &s.group {
            None => err(
                errs,
                format!("{path}.group"),
                "Required value: group is required when subject kind is 'Group'",
            ),
            Some(g) if g.name.is_empty() => err(
                errs,
                format!("{path}.group.name"),
                "Required value: group name is required",
            ),
            Some(_) => {}
        },
        SUBJECT_SERVICE_ACCOUNT => match &s.service_account {
            None => err(
                errs,
                format!("{path}.serviceAccount"),
                "Required value: serviceAccount is required when subject kind is 'ServiceAccount'",
            ),
            Some(sa) => {
                if sa.name.is_empty() {
                    err(
                        errs,
                        format!("{path}.serviceAccount.name"),
                        "Required value: serviceaccount name is required",
                    );
                }
                if sa.namespace.is_empty() {
                    err(
                        errs,
                        format!("{path}.serviceAccount.namespace"),
                        "Required value: serviceaccount namespace is required",
                    );
                }
            }
        },
        other => {
            err(
                errs,
                format!("{path}.kind"),
                format!("Unsupported value: {other:?}: supported values: \"Group\", \"ServiceAccount\", \"User\""),
            );
            return;
        }
    }
    // Exactly the member named by `kind` may be set.
    let extra = [
        (SUBJECT_USER, user, "user"),
        (SUBJECT_GROUP, group, "group"),
        (SUBJECT_SERVICE_ACCOUNT, sa, "serviceAccount"),
    ];
    for (kind, set, field) in extra {
        if set && kind != s.kind {
            err(
                errs,
                format!("{path}.{field}"),
                format!("Forbidden: {field} is forbidden when subject kind is not '{kind}'"),
            );
        }
    }
}

fn validate_resource_rule(errs: &mut Vec<FieldError>, path: &str, r: &ResourcePolicyRule) {
    validate_wildcard_list(errs, &format!("{path}.verbs"), &r.verbs, "verbs");
    for v in &r.verbs {
        if v != WILDCARD && !SUPPORTED_VERBS.contains(&v.as_str()) {
            err(
                errs,
                format!("{path}.verbs"),
                format!(
                    "Unsupported value: {v:?}: supported values: {}",
                    SUPPORTED_VERBS.join(", ")
                ),
            );
        }
    }
    validate_wildcard_list(
        errs,
        &format!("{path}.apiGroups"),
        &r.api_groups,
        "api groups",
    );
    validate_wildcard_list(
        errs,
        &format!("{path}.resources"),
        &r.resources,
        "resources",
    );
    if r.namespaces.is_empty() {
        if !r.cluster_scope {
            err(
                errs,
                format!("{path}.namespaces"),
                "Required value: resource rules that are not cluster scoped must supply at least one namespace",
            );
        }
    } else {
        validate_wildcard_list(
            errs,
            &format!("{path}.namespaces"),
            &r.namespaces,
            "namespaces",
        );
        for (i, ns) in r.namespaces.iter().enumerate() {
            if ns != WILDCARD && !is_dns1123_label(ns) {
                err(
                    errs,
                    format!("{path}.namespaces[{i}]"),
                    format!("Invalid value: {ns:?}: must be a DNS-1123 label or '*'"),
                );
            }
        }
    }
}

fn validate_non_resource_rule(errs: &mut Vec<FieldError>, path: &str, r: &NonResourcePolicyRule) {
    validate_wildcard_list(errs, &format!("{path}.verbs"), &r.verbs, "verbs");
    validate_wildcard_list(
        errs,
        &format!("{path}.nonResourceURLs"),
        &r.non_resource_urls,
        "non-resource urls",
    );
    for (i, url) in r.non_resource_urls.iter().enumerate() {
        let p = format!("{path}.nonResourceURLs[{i}]");
        if url.is_empty() {
            err(errs, p, "Invalid value: \"\": must not be empty");
        } else if url == WILDCARD || url == "/" {
        } else if !url.starts_with('/') {
            err(
                errs,
                p,
                format!("Invalid value: {url:?}: must start with slash"),
            );
        } else if url.contains("//") {
            err(
                errs,
                p,
                format!("Invalid value: {url:?}: must not contain double slash"),
            );
        } else if url.contains('*') && (!url.ends_with("/*") || url.matches('*').count() > 1) {
            err(
                errs,
                p,
                format!("Invalid value: {url:?}: wildcard can only do suffix glob"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::paths;
    use super::*;

    fn schema(name: &str, precedence: i32, rule: PolicyRulesWithSubjects) -> FlowSchema {
        FlowSchema {
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec: FlowSchemaSpec {
                priority_level_configuration: PriorityLevelConfigurationReference {
                    name: "pl".into(),
                },
                matching_precedence: precedence,
                distinguisher_method: None,
                rules: vec![rule],
            },
            status: None,
        }
    }

    fn all_rule() -> PolicyRulesWithSubjects {
        PolicyRulesWithSubjects {
            subjects: vec![Subject::group("g")],
            resource_rules: vec![ResourcePolicyRule {
                verbs: vec!["*".into()],
                api_groups: vec!["*".into()],
                resources: vec!["*".into()],
                cluster_scope: true,
                namespaces: vec!["*".into()],
            }],
            non_resource_rules: vec![NonResourcePolicyRule {
                verbs: vec!["*".into()],
                non_resource_urls: vec!["*".into()],
            }],
        }
    }

    #[test]
    fn precedence_limits() {
        assert!(validate_flow_schema(&schema("a", 10000, all_rule())).is_empty());
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 10001, all_rule()))),
            vec!["spec.matchingPrecedence"]
        );
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 1, all_rule()))),
            vec!["spec.matchingPrecedence"]
        );
        assert!(validate_flow_schema(&schema(EXEMPT, 1, all_rule())).is_empty());
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", -3, all_rule()))),
            vec!["spec.matchingPrecedence"]
        );
    }

    #[test]
    fn rule_shapes() {
        let mut r = all_rule();
        r.subjects.clear();
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 5, r))),
            vec!["spec.rules[0].subjects"]
        );
        let mut r = all_rule();
        r.resource_rules.clear();
        r.non_resource_rules.clear();
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 5, r))),
            vec!["spec.rules[0]"]
        );
        let mut r = all_rule();
        r.resource_rules[0].verbs = vec!["*".into(), "get".into()];
        r.resource_rules[0].namespaces.clear();
        r.resource_rules[0].cluster_scope = false;
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 5, r))),
            vec![
                "spec.rules[0].resourceRules[0].verbs",
                "spec.rules[0].resourceRules[0].namespaces"
            ]
        );
        let mut r = all_rule();
        r.resource_rules[0].verbs = vec!["frobnicate".into()];
        r.resource_rules[0].namespaces = vec!["Bad_NS".into()];
        assert_eq!(
            paths(&validate_flow_schema(&schema("a", 5, r))),
            vec![
                "spec.rules[0].resourceRules[0].verbs",
                "spec.rules[0].resourceRules[0].namespaces[0]"
            ]
        );
    }

    #[test]
    fn non_resource_urls() {
        for (url, ok) in [
            ("*", true),
            ("/", true),
            ("/healthz", true),
            ("/apis/*", true),
            ("healthz", false),
            ("", false),
            ("/a//b", false),
            ("/a*", false),
            ("/*/b/*", false),
        ] {
            let mut r = all_rule();
            r.non_resource_rules[0].non_resource_urls = vec![url.into()];
            assert_eq!(
                validate_flow_schema(&schema("a", 5, r)).is_empty(),
                ok,
                "{url}"
            );
        }
    }

    #[test]
    fn subjects() {
        let mut bad_kind = Subject::user("u");
        bad_kind.kind = "Robot".into();
        let mut two_members = Subject::user("u");
        two_members.group = Some(GroupSubject { name: "g".into() });
        for (s, want) in [
            (Subject::user("u"), vec![]),
            (
                Subject::user(""),
                vec!["spec.rules[0].subjects[0].user.name"],
            ),
            (
                Subject::service_account("", "*"),
                vec!["spec.rules[0].subjects[0].serviceAccount.namespace"],
            ),
            (bad_kind, vec!["spec.rules[0].subjects[0].kind"]),
            (two_members, vec!["spec.rules[0].subjects[0].group"]),
        ] {
            let mut r = all_rule();
            r.subjects = vec![s];
            assert_eq!(paths(&validate_flow_schema(&schema("a", 5, r))), want);
        }
    }
}
