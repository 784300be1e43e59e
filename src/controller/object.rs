//! What the controller needs to know about its two kinds, so reconciling,
//! status and maintenance are written once for both.

use std::fmt::Debug;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::flowcontrol::bootstrap;
use crate::flowcontrol::types::{
    self, Condition, FieldError, FlowSchemaResource, PriorityLevelConfigurationResource,
};

/// A `flowcontrol.kshard.dev/v1` kind and the `flowcontrol` configuration
/// object it carries.
pub(super) trait FlowObject:
    kube::Resource<DynamicType = ()>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: &'static str;
    /// The configuration object (`types::FlowSchema` or
    /// `types::PriorityLevelConfiguration`).
    type Config: Clone;

    /// The object as configuration, as stored (not defaulted).
    fn to_config(&self) -> Self::Config;
    /// The object to write for a bootstrap object.
    fn from_config(config: Self::Config) -> Self;
    /// Whether `name` is one of the mandatory or suggested objects.
    fn is_bootstrap(name: &str) -> bool;
    /// Applies kube's defaults and validates; no errors means valid.
    fn default_and_validate(config: &mut Self::Config) -> Vec<FieldError>;
    /// The conditions the object's status carries now.
    fn conditions(&self) -> &[Condition];
}

fn meta_of(m: &kube::api::ObjectMeta) -> types::ObjectMeta {
    types::ObjectMeta {
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        resource_version: m.resource_version.clone().unwrap_or_default(),
        generation: m.generation.unwrap_or(0),
        annotations: m.annotations.clone().unwrap_or_default(),
    }
}

/// Only what a bootstrap write sets: the name, the auto-update annotation,
/// and the resourceVersion it replaces (empty for a create).
fn kube_meta(m: &types::ObjectMeta) -> kube::api::ObjectMeta {
    kube::api::ObjectMeta {
        name: Some(m.name.clone()),
        annotations: (!m.annotations.is_empty()).then(|| m.annotations.clone()),
        resource_version: (!m.resource_version.is_empty()).then(|| m.resource_version.clone()),
        ..Default::default()
    }
}

impl FlowObject for FlowSchemaResource {
    const KIND: &'static str = "FlowSchema";
    type Config = types::FlowSchema;

    fn to_config(&self) -> types::FlowSchema {
        types::FlowSchema {
            metadata: meta_of(&self.metadata),
            spec: self.spec.clone(),
            status: None,
        }
    }

    fn from_config(c: types::FlowSchema) -> Self {
        FlowSchemaResource {
            metadata: kube_meta(&c.metadata),
            spec: c.spec,
            status: None,
        }
    }

    fn is_bootstrap(name: &str) -> bool {
        bootstrap::all_flow_schemas()
            .iter()
            .any(|o| o.metadata.name == name)
    }

    fn default_and_validate(c: &mut types::FlowSchema) -> Vec<FieldError> {
        c.apply_defaults();
        types::validate_flow_schema(c)
    }

    fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}

impl FlowObject for PriorityLevelConfigurationResource {
    const KIND: &'static str = "PriorityLevelConfiguration";
    type Config = types::PriorityLevelConfiguration;

    fn to_config(&self) -> types::PriorityLevelConfiguration {
        types::PriorityLevelConfiguration {
            metadata: meta_of(&self.metadata),
            spec: self.spec.clone(),
            status: None,
        }
    }

    fn from_config(c: types::PriorityLevelConfiguration) -> Self {
        PriorityLevelConfigurationResource {
            metadata: kube_meta(&c.metadata),
            spec: c.spec,
            status: None,
        }
    }

    fn is_bootstrap(name: &str) -> bool {
        bootstrap::all_priority_levels()
            .iter()
            .any(|o| o.metadata.name == name)
    }

    fn default_and_validate(c: &mut types::PriorityLevelConfiguration) -> Vec<FieldError> {
        c.apply_defaults();
        types::validate_priority_level(c)
    }

    fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}
