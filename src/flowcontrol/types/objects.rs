//! The FlowSchema and PriorityLevelConfiguration types; `kube::CustomResource`
//! derives the `flowcontrol.kshard.dev/v1` resources from the specs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::super::fixtures::queuing;
    use super::*;

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
