//! `audit.k8s.io/v1` Event and EventList, field for field as kube-apiserver
//! writes them.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::policy::{Level, Stage};

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    pub username: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl From<&crate::auth::Identity> for UserInfo {
    fn from(id: &crate::auth::Identity) -> Self {
        UserInfo {
            username: id.user.clone(),
            uid: id.uid.clone(),
            groups: id.groups.clone(),
            extra: id.extra.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The part of a `metav1.Status` an event carries as `responseStatus`.
#[derive(Debug, Clone, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResponseStatus {
    pub metadata: serde_json::Map<String, Value>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    pub code: u16,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub level: &'static str,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: Stage,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub verb: String,
    pub user: UserInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<UserInfo>,
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    pub request_received_timestamp: String,
    pub stage_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Event {
    pub fn new(level: Level, audit_id: String) -> Self {
        let now = micro_time();
        Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: level.as_str(),
            audit_id,
            stage: Stage::RequestReceived,
            request_uri: String::new(),
            verb: String::new(),
            user: UserInfo::default(),
            impersonated_user: None,
            source_ips: Vec::new(),
            user_agent: String::new(),
            object_ref: None,
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: now.clone(),
            stage_timestamp: now,
            annotations: BTreeMap::new(),
        }
    }
}

/// The body a webhook backend posts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventList<'a> {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: serde_json::Map<String, Value>,
    pub items: &'a [Event],
}

impl<'a> EventList<'a> {
    pub fn new(items: &'a [Event]) -> Self {
        EventList {
            kind: "EventList",
            api_version: "audit.k8s.io/v1",
            metadata: serde_json::Map::new(),
            items,
        }
    }
}

/// metav1.MicroTime as kube writes it: RFC 3339 in UTC with microseconds.
pub fn micro_time() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}
