//! FlowSchema and PriorityLevelConfiguration, mirroring
//! `flowcontrol.apiserver.k8s.io/v1` field for field (served by kshard as
//! `flowcontrol.kshard.dev/v1`), with kube's defaulting and validation.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Name of the mandatory exempt priority level and flow schema.
pub const EXEMPT: &str = "exempt";
/// Name of the mandatory catch-all priority level and flow schema.
pub const CATCH_ALL: &str = "catch-all";
/// Wildcard accepted in verbs, apiGroups, resources, namespaces, URLs and subject names.
pub const WILDCARD: &str = "*";
/// Annotation telling the bootstrap maintenance whether it owns the spec.
pub const AUTO_UPDATE_ANNOTATION: &str = "apf.kubernetes.io/autoupdate-spec";

pub const DEFAULT_MATCHING_PRECEDENCE: i32 = 1000;
pub const MAX_MATCHING_PRECEDENCE: i32 = 10000;
pub const DEFAULT_NOMINAL_CONCURRENCY_SHARES: i32 = 30;
pub const DEFAULT_QUEUES: i32 = 64;
pub const DEFAULT_HAND_SIZE: i32 = 8;
pub const DEFAULT_QUEUE_LENGTH_LIMIT: i32 = 50;
pub const MAX_QUEUES: i32 = 10_000_000;
/// Upper bound on the entropy a hand may consume from the 64-bit flow hash.
pub const MAX_HASH_BITS: f64 = 60.0;

/// Verbs a resource rule may name (kube's `supportedVerbs`).
pub const SUPPORTED_VERBS: [&str; 9] = [
    "get",
    "list",
    "create",
    "update",
    "delete",
    "deletecollection",
    "patch",
    "watch",
    "proxy",
];

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub generation: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// Shared shape of FlowSchema and PriorityLevelConfiguration conditions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The generation of the spec the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

// ---------------------------------------------------------------- FlowSchema

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlowSchema {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: FlowSchemaSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<FlowSchemaStatus>,
}

/// FlowSchemaSpec describes how the FlowSchema's specification looks like.
// `kube::CustomResource` also generates `FlowSchemaResource`, the
// `flowcontrol.kshard.dev/v1` object operators write (see `crds/flowcontrol/`).
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "flowcontrol.kshard.dev",
    version = "v1",
    kind = "FlowSchema",
    root = "FlowSchemaResource",
    status = "FlowSchemaStatus",
    shortname = "fs",
    category = "kshard",
    printcolumn = r#"{"name":"PriorityLevel","type":"string","jsonPath":".spec.priorityLevelConfiguration.name"}"#,
    printcolumn = r#"{"name":"MatchingPrecedence","type":"integer","jsonPath":".spec.matchingPrecedence"}"#,
    printcolumn = r#"{"name":"DistinguisherMethod","type":"string","jsonPath":".spec.distinguisherMethod.type"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"MissingPL","type":"string","jsonPath":".status.conditions[?(@.type=='Dangling')].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FlowSchemaSpec {
    pub priority_level_configuration: PriorityLevelConfigurationReference,
    /// 0 means "unset" and defaults to 1000, like kube's int32 field.
    #[serde(default)]
    pub matching_precedence: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distinguisher_method: Option<FlowDistinguisherMethod>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<PolicyRulesWithSubjects>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PriorityLevelConfigurationReference {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlowDistinguisherMethod {
    #[serde(rename = "type")]
    pub type_: String,
}

pub const BY_USER: &str = "ByUser";
pub const BY_NAMESPACE: &str = "ByNamespace";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRulesWithSubjects {
    #[serde(default)]
    pub subjects: Vec<Subject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_rules: Vec<ResourcePolicyRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_resource_rules: Vec<NonResourcePolicyRule>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// "User", "Group" or "ServiceAccount"; a string so that invalid
    /// input survives decoding and is reported by validation.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserSubject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupSubject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountSubject>,
}

pub const SUBJECT_USER: &str = "User";
pub const SUBJECT_GROUP: &str = "Group";
pub const SUBJECT_SERVICE_ACCOUNT: &str = "ServiceAccount";

impl Subject {
    pub fn user(name: &str) -> Self {
        Subject {
            kind: SUBJECT_USER.into(),
            user: Some(UserSubject { name: name.into() }),
            ..Default::default()
        }
    }
    pub fn group(name: &str) -> Self {
        Subject {
            kind: SUBJECT_GROUP.into(),
            group: Some(GroupSubject { name: name.into() }),
            ..Default::default()
        }
    }
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Subject {
            kind: SUBJECT_SERVICE_ACCOUNT.into(),
            service_account: Some(ServiceAccountSubject {
                namespace: namespace.into(),
                name: name.into(),
            }),
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UserSubject {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GroupSubject {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServiceAccountSubject {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePolicyRule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster_scope: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NonResourcePolicyRule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(rename = "nonResourceURLs", default)]
    pub non_resource_urls: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlowSchemaStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition type set on FlowSchemas whose priority level does not exist.
pub const CONDITION_DANGLING: &str = "Dangling";

// ------------------------------------------------ PriorityLevelConfiguration

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityLevelConfiguration {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PriorityLevelConfigurationSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PriorityLevelConfigurationStatus>,
}

pub const TYPE_EXEMPT: &str = "Exempt";
pub const TYPE_LIMITED: &str = "Limited";
pub const LIMIT_RESPONSE_QUEUE: &str = "Queue";
pub const LIMIT_RESPONSE_REJECT: &str = "Reject";

/// PriorityLevelConfigurationSpec specifies the configuration of a priority level.
// `kube::CustomResource` also generates `PriorityLevelConfigurationResource`
// (`flowcontrol.kshard.dev/v1`).
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "flowcontrol.kshard.dev",
    version = "v1",
    kind = "PriorityLevelConfiguration",
    root = "PriorityLevelConfigurationResource",
    status = "PriorityLevelConfigurationStatus",
    shortname = "plc",
    category = "kshard",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"NominalConcurrencyShares","type":"integer","jsonPath":".spec.limited.nominalConcurrencyShares"}"#,
    printcolumn = r#"{"name":"Queues","type":"integer","jsonPath":".spec.limited.limitResponse.queuing.queues"}"#,
    printcolumn = r#"{"name":"HandSize","type":"integer","jsonPath":".spec.limited.limitResponse.queuing.handSize"}"#,
    printcolumn = r#"{"name":"QueueLengthLimit","type":"integer","jsonPath":".spec.limited.limitResponse.queuing.queueLengthLimit"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PriorityLevelConfigurationSpec {
    /// "Exempt" or "Limited".
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited: Option<LimitedPriorityLevelConfiguration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exempt: Option<ExemptPriorityLevelConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitedPriorityLevelConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal_concurrency_shares: Option<i32>,
    #[serde(default)]
    pub limit_response: LimitResponse,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lendable_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit_percent: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExemptPriorityLevelConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominal_concurrency_shares: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lendable_percent: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitResponse {
    /// "Queue" or "Reject".
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queuing: Option<QueuingConfiguration>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuingConfiguration {
    #[serde(default)]
    pub queues: i32,
    #[serde(default)]
    pub hand_size: i32,
    #[serde(default)]
    pub queue_length_limit: i32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PriorityLevelConfigurationStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

// ---------------------------------------------------------------- defaulting

impl FlowSchema {
    /// kube's `SetDefaults_FlowSchemaSpec`.
    pub fn apply_defaults(&mut self) {
        if self.spec.matching_precedence == 0 {
            self.spec.matching_precedence = DEFAULT_MATCHING_PRECEDENCE;
        }
    }

    /// The condition `Dangling`, if the status carries one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}

impl PriorityLevelConfiguration {
    /// kube's v1 defaulting: Limited shares 30, Exempt shares 0, lendable 0,
    /// queuing 64/8/50 for zero-valued fields.
    pub fn apply_defaults(&mut self) {
        let spec = &mut self.spec;
        if spec.type_ == TYPE_EXEMPT && spec.exempt.is_none() {
            spec.exempt = Some(ExemptPriorityLevelConfiguration::default());
        }
        if let Some(exempt) = spec.exempt.as_mut() {
            exempt.nominal_concurrency_shares.get_or_insert(0);
            exempt.lendable_percent.get_or_insert(0);
        }
        if let Some(limited) = spec.limited.as_mut() {
            limited
                .nominal_concurrency_shares
                .get_or_insert(DEFAULT_NOMINAL_CONCURRENCY_SHARES);
            limited.lendable_percent.get_or_insert(0);
            if let Some(q) = limited.limit_response.queuing.as_mut() {
                if q.queues == 0 {
                    q.queues = DEFAULT_QUEUES;
                }
                if q.hand_size == 0 {
                    q.hand_size = DEFAULT_HAND_SIZE;
                }
                if q.queue_length_limit == 0 {
                    q.queue_length_limit = DEFAULT_QUEUE_LENGTH_LIMIT;
                }
            }
        }
    }

    pub fn is_exempt(&self) -> bool {
        self.spec.type_ == TYPE_EXEMPT
    }

    /// Shares after defaulting (0 for exempt without shares).
    pub fn nominal_concurrency_shares(&self) -> i32 {
        match (&self.spec.limited, &self.spec.exempt) {
            (Some(l), _) => l
                .nominal_concurrency_shares
                .unwrap_or(DEFAULT_NOMINAL_CONCURRENCY_SHARES),
            (None, Some(e)) => e.nominal_concurrency_shares.unwrap_or(0),
            (None, None) => 0,
        }
    }

    pub fn lendable_percent(&self) -> i32 {
        match (&self.spec.limited, &self.spec.exempt) {
            (Some(l), _) => l.lendable_percent.unwrap_or(0),
            (None, Some(e)) => e.lendable_percent.unwrap_or(0),
            (None, None) => 0,
        }
    }

    pub fn borrowing_limit_percent(&self) -> Option<i32> {
        self.spec
            .limited
            .as_ref()
            .and_then(|l| l.borrowing_limit_percent)
    }

    /// Queuing parameters, `None` for Reject and Exempt levels.
    pub fn queuing(&self) -> Option<&QueuingConfiguration> {
        self.spec.limited.as_ref().and_then(|l| {
            if l.limit_response.type_ == LIMIT_RESPONSE_QUEUE {
                l.limit_response.queuing.as_ref()
            } else {
                None
            }
        })
    }
}

// ---------------------------------------------------------------- validation

/// One validation failure, like kube's `field.Error` (path + detail).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

fn err(errs: &mut Vec<FieldError>, path: impl Into<String>, message: impl Into<String>) {
    errs.push(FieldError {
        path: path.into(),
        message: message.into(),
    });
}

/// kube's `ValidatePathSegmentName` plus non-empty.
fn validate_name(errs: &mut Vec<FieldError>, name: &str) {
    if name.is_empty() {
        err(errs, "metadata.name", "Required value: name is required");
        return;
    }
    if name == "." || name == ".." {
        err(
            errs,
            "metadata.name",
            format!("Invalid value: {name:?}: may not be '{name}'"),
        );
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            err(
                errs,
                "metadata.name",
                format!("Invalid value: {name:?}: may not contain '{bad}'"),
            );
        }
    }
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `*` must stand alone when present; empty lists are required errors.
fn validate_wildcard_list(errs: &mut Vec<FieldError>, path: &str, items: &[String], what: &str) {
    if items.is_empty() {
        err(
            errs,
            path,
            format!("Required value: {what} must contain at least one value"),
        );
    } else if items.len() > 1 && items.iter().any(|v| v == WILDCARD) {
        err(
            errs,
            path,
            format!("Invalid value: if '*' is present, must not specify other {what}"),
        );
    }
}

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

/// Bits of the flow hash one hand consumes: ceil(log2(queues)·handSize).
pub fn required_entropy_bits(queues: i32, hand_size: i32) -> u32 {
    let bits = (f64::from(queues.max(1))).log2() * f64::from(hand_size.max(0));
    bits.ceil() as u32
}

/// Validates a (defaulted) PriorityLevelConfiguration.
pub fn validate_priority_level(pl: &PriorityLevelConfiguration) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_name(&mut errs, &pl.metadata.name);
    let spec = &pl.spec;
    let is_exempt_name = pl.metadata.name == EXEMPT;
    match spec.type_.as_str() {
        TYPE_EXEMPT | TYPE_LIMITED => {
            if (spec.type_ == TYPE_EXEMPT) != is_exempt_name {
                err(
                    &mut errs,
                    "spec.type",
                    format!("Invalid value: {:?}: type must be 'Exempt' if and only if name is 'exempt'", spec.type_),
                );
            }
        }
        "" => err(
            &mut errs,
            "spec.type",
            "Required value: must specify a type",
        ),
        other => err(
            &mut errs,
            "spec.type",
            format!("Unsupported value: {other:?}: supported values: \"Exempt\", \"Limited\""),
        ),
    }
    if let Some(e) = &spec.exempt {
        if spec.type_ != TYPE_EXEMPT {
            err(
                &mut errs,
                "spec.exempt",
                "Forbidden: must be nil if the type is not Exempt",
            );
        }
        check_shares(&mut errs, "spec.exempt", e.nominal_concurrency_shares);
        check_percent(&mut errs, "spec.exempt.lendablePercent", e.lendable_percent);
    }
    match &spec.limited {
        None if spec.type_ == TYPE_LIMITED => err(
            &mut errs,
            "spec.limited",
            "Required value: must not be empty when type is Limited",
        ),
        None => {}
        Some(l) => {
            if spec.type_ != TYPE_LIMITED {
                err(
                    &mut errs,
                    "spec.limited",
                    "Forbidden: must be nil if the type is not Limited",
                );
            }
            check_shares(&mut errs, "spec.limited", l.nominal_concurrency_shares);
            check_percent(
                &mut errs,
                "spec.limited.lendablePercent",
                l.lendable_percent,
            );
            if let Some(b) = l.borrowing_limit_percent {
                if b < 0 {
                    err(
                        &mut errs,
                        "spec.limited.borrowingLimitPercent",
                        format!("Invalid value: {b}: if specified, must be a non-negative integer"),
                    );
                }
            }
            validate_limit_response(&mut errs, &l.limit_response);
        }
    }
    errs
}

fn check_shares(errs: &mut Vec<FieldError>, path: &str, shares: Option<i32>) {
    if let Some(s) = shares {
        if s < 0 {
            err(
                errs,
                format!("{path}.nominalConcurrencyShares"),
                format!("Invalid value: {s}: must be a non-negative integer"),
            );
        }
    }
}

fn check_percent(errs: &mut Vec<FieldError>, path: &str, pct: Option<i32>) {
    if let Some(v) = pct {
        if !(0..=100).contains(&v) {
            err(
                errs,
                path,
                format!("Invalid value: {v}: must be between 0 and 100, inclusive"),
            );
        }
    }
}

fn validate_limit_response(errs: &mut Vec<FieldError>, lr: &LimitResponse) {
    let path = "spec.limited.limitResponse";
    match lr.type_.as_str() {
        LIMIT_RESPONSE_REJECT => {
            if lr.queuing.is_some() {
                err(
                    errs,
                    format!("{path}.queuing"),
                    "Forbidden: must be nil if limited.limitResponse.type is not Queue",
                );
            }
        }
        LIMIT_RESPONSE_QUEUE => match &lr.queuing {
            None => err(
                errs,
                format!("{path}.queuing"),
                "Required value: must not be empty if limited.limitResponse.type is Queue",
            ),
            Some(q) => validate_queuing(errs, &format!("{path}.queuing"), q),
        },
        "" => err(
            errs,
            format!("{path}.type"),
            "Required value: must specify a type",
        ),
        other => err(
            errs,
            format!("{path}.type"),
            format!("Unsupported value: {other:?}: supported values: \"Queue\", \"Reject\""),
        ),
    }
}

fn validate_queuing(errs: &mut Vec<FieldError>, path: &str, q: &QueuingConfiguration) {
    if q.queue_length_limit <= 0 {
        err(
            errs,
            format!("{path}.queueLengthLimit"),
            format!("Invalid value: {}: must be positive", q.queue_length_limit),
        );
    }
    if q.queues <= 0 {
        err(
            errs,
            format!("{path}.queues"),
            format!("Invalid value: {}: must be positive", q.queues),
        );
    } else if q.queues > MAX_QUEUES {
        err(
            errs,
            format!("{path}.queues"),
            format!(
                "Invalid value: {}: must not be greater than {MAX_QUEUES}",
                q.queues
            ),
        );
    }
    if q.hand_size <= 0 {
        err(
            errs,
            format!("{path}.handSize"),
            format!("Invalid value: {}: must be positive", q.hand_size),
        );
    } else if q.queues > 0 && q.hand_size > q.queues {
        err(
            errs,
            format!("{path}.handSize"),
            format!(
                "Invalid value: {}: should not be greater than queues ({})",
                q.hand_size, q.queues
            ),
        );
    } else if q.queues > 0
        && f64::from(required_entropy_bits(q.queues, q.hand_size)) > MAX_HASH_BITS
    {
        err(
            errs,
            format!("{path}.handSize"),
            format!(
                "Invalid value: {}: required entropy bits of deckSize {} and handSize {} should not be greater than {}",
                q.hand_size, q.queues, q.hand_size, MAX_HASH_BITS
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(
        shares: Option<i32>,
        queuing: Option<QueuingConfiguration>,
    ) -> PriorityLevelConfiguration {
        PriorityLevelConfiguration {
            metadata: ObjectMeta {
                name: "pl".into(),
                ..Default::default()
            },
            spec: PriorityLevelConfigurationSpec {
                type_: TYPE_LIMITED.into(),
                limited: Some(LimitedPriorityLevelConfiguration {
                    nominal_concurrency_shares: shares,
                    limit_response: LimitResponse {
                        type_: if queuing.is_some() {
                            LIMIT_RESPONSE_QUEUE
                        } else {
                            LIMIT_RESPONSE_REJECT
                        }
                        .into(),
                        queuing,
                    },
                    ..Default::default()
                }),
                exempt: None,
            },
            status: None,
        }
    }

    fn queuing(queues: i32, hand_size: i32, limit: i32) -> QueuingConfiguration {
        QueuingConfiguration {
            queues,
            hand_size,
            queue_length_limit: limit,
        }
    }

    fn paths(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn defaults_limited_and_queuing() {
        let mut pl = limited(None, Some(queuing(0, 0, 0)));
        pl.apply_defaults();
        let l = pl.spec.limited.as_ref().unwrap();
        assert_eq!(l.nominal_concurrency_shares, Some(30));
        assert_eq!(l.lendable_percent, Some(0));
        assert_eq!(l.borrowing_limit_percent, None);
        assert_eq!(l.limit_response.queuing, Some(queuing(64, 8, 50)));
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn zero_shares_are_kept_and_valid() {
        let mut pl = limited(Some(0), None);
        pl.apply_defaults();
        assert_eq!(pl.nominal_concurrency_shares(), 0);
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn defaults_exempt() {
        let mut pl = PriorityLevelConfiguration {
            metadata: ObjectMeta {
                name: EXEMPT.into(),
                ..Default::default()
            },
            spec: PriorityLevelConfigurationSpec {
                type_: TYPE_EXEMPT.into(),
                ..Default::default()
            },
            status: None,
        };
        pl.apply_defaults();
        let e = pl.spec.exempt.as_ref().unwrap();
        assert_eq!(e.nominal_concurrency_shares, Some(0));
        assert_eq!(e.lendable_percent, Some(0));
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn defaults_flow_schema_precedence() {
        let mut fs = FlowSchema::default();
        fs.apply_defaults();
        assert_eq!(fs.spec.matching_precedence, 1000);
        fs.spec.matching_precedence = 7;
        fs.apply_defaults();
        assert_eq!(fs.spec.matching_precedence, 7);
    }

    #[test]
    fn queuing_limits() {
        let cases = [
            (queuing(64, 8, 50), None),
            (queuing(10_000_000, 1, 1), None),
            (queuing(10_000_001, 1, 1), Some("queues")),
            (queuing(4, 5, 1), Some("handSize")),
            (queuing(64, 8, 0), Some("queueLengthLimit")),
            (queuing(0, 1, 1), Some("queues")),
            // ceil(log2(128)·8) = 56 is fine, ceil(log2(128)·9) = 63 is not.
            (queuing(128, 8, 1), None),
            (queuing(128, 9, 1), Some("handSize")),
            // 2^20 queues, hand 3: exactly 60 bits.
            (queuing(1 << 20, 3, 1), None),
            (queuing(1 << 20, 4, 1), Some("handSize")),
        ];
        for (q, want) in cases {
            let errs = validate_priority_level(&limited(Some(1), Some(q.clone())));
            match want {
                None => assert!(errs.is_empty(), "{q:?}: {errs:?}"),
                Some(field) => {
                    assert_eq!(errs.len(), 1, "{q:?}: {errs:?}");
                    assert_eq!(
                        errs[0].path,
                        format!("spec.limited.limitResponse.queuing.{field}")
                    );
                }
            }
        }
    }

    #[test]
    fn shares_and_percent_limits() {
        let mut pl = limited(Some(-1), None);
        let l = pl.spec.limited.as_mut().unwrap();
        l.lendable_percent = Some(101);
        l.borrowing_limit_percent = Some(-1);
        let errs = validate_priority_level(&pl);
        assert_eq!(
            paths(&errs),
            vec![
                "spec.limited.nominalConcurrencyShares",
                "spec.limited.lendablePercent",
                "spec.limited.borrowingLimitPercent"
            ]
        );
        let mut ok = limited(Some(0), None);
        let l = ok.spec.limited.as_mut().unwrap();
        l.lendable_percent = Some(100);
        l.borrowing_limit_percent = Some(0);
        assert!(validate_priority_level(&ok).is_empty());
    }

    #[test]
    fn exempt_type_iff_exempt_name() {
        let mut pl = limited(Some(1), None);
        pl.metadata.name = EXEMPT.into();
        assert_eq!(paths(&validate_priority_level(&pl)), vec!["spec.type"]);
        let mut pl = PriorityLevelConfiguration::default();
        pl.metadata.name = "other".into();
        pl.spec.type_ = TYPE_EXEMPT.into();
        pl.apply_defaults();
        assert_eq!(paths(&validate_priority_level(&pl)), vec!["spec.type"]);
    }

    #[test]
    fn reject_with_queuing_and_queue_without() {
        let mut pl = limited(Some(1), Some(queuing(1, 1, 1)));
        pl.spec.limited.as_mut().unwrap().limit_response.type_ = LIMIT_RESPONSE_REJECT.into();
        assert_eq!(
            paths(&validate_priority_level(&pl)),
            vec!["spec.limited.limitResponse.queuing"]
        );
        let mut pl = limited(Some(1), None);
        pl.spec.limited.as_mut().unwrap().limit_response.type_ = LIMIT_RESPONSE_QUEUE.into();
        assert_eq!(
            paths(&validate_priority_level(&pl)),
            vec!["spec.limited.limitResponse.queuing"]
        );
    }

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

    #[test]
    fn serde_field_names_mirror_kube() {
        let json = r#"{"metadata":{"name":"x"},"spec":{"type":"Limited","limited":{
            "nominalConcurrencyShares":5,"lendablePercent":10,"borrowingLimitPercent":20,
            "limitResponse":{"type":"Queue","queuing":{"queues":4,"handSize":2,"queueLengthLimit":9}}}}}"#;
        let pl: PriorityLevelConfiguration = serde_json::from_str(json).unwrap();
        assert_eq!(pl.nominal_concurrency_shares(), 5);
        assert_eq!(pl.queuing(), Some(&queuing(4, 2, 9)));
        let fs_json = r#"{"metadata":{"name":"f"},"spec":{"priorityLevelConfiguration":{"name":"x"},
            "distinguisherMethod":{"type":"ByUser"},"rules":[{"subjects":[{"kind":"ServiceAccount",
            "serviceAccount":{"namespace":"ns","name":"*"}}],"nonResourceRules":[{"verbs":["get"],
            "nonResourceURLs":["/healthz"]}]}]},"status":{"conditions":[{"type":"Dangling","status":"False","reason":"Found"}]}}"#;
        let fs: FlowSchema = serde_json::from_str(fs_json).unwrap();
        assert_eq!(
            fs.spec.rules[0].non_resource_rules[0].non_resource_urls,
            vec!["/healthz"]
        );
        assert_eq!(
            fs.condition(CONDITION_DANGLING).unwrap().status,
            ConditionStatus::False
        );
        let back = serde_json::to_value(&fs).unwrap();
        assert!(back["spec"]["rules"][0]["nonResourceRules"][0]["nonResourceURLs"].is_array());
    }
}
