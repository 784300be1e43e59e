//! The maintenance pass: the mandatory and suggested objects are created,
//! updated or deleted as `flowcontrol::bootstrap` plans it.

use kube::api::{Api, DeleteParams, PostParams};

use super::object::FlowObject;
use super::ControllerError;
use crate::flowcontrol::bootstrap::{self, Action};
use crate::flowcontrol::types::{FlowSchemaResource, PriorityLevelConfigurationResource};

/// Field manager of the bootstrap objects' specs.
const BOOTSTRAP_FIELD_MANAGER: &str = "kshard-flowcontrol-bootstrap";

/// One maintenance pass over the mandatory and suggested objects; levels
/// first, so the schemas written next find theirs.
pub(super) async fn maintain(
    schemas: &Api<FlowSchemaResource>,
    levels: &Api<PriorityLevelConfigurationResource>,
) -> Result<(), ControllerError> {
    maintain_kind(levels, bootstrap::plan_priority_levels).await?;
    maintain_kind(schemas, bootstrap::plan_flow_schemas).await
}

/// `bootstrap`'s plan for one kind, given what the store holds.
type Plan<T> = fn(&[T]) -> Vec<Action<T>>;

/// Lists one kind and carries out the plan for it.
async fn maintain_kind<K: FlowObject>(
    api: &Api<K>,
    plan: Plan<K::Config>,
) -> Result<(), ControllerError> {
    // A fresh list rather than the watch cache: the first pass runs before
    // the watches start.
    let existing: Vec<K::Config> = api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(K::to_config)
        .collect();
    for action in plan(&existing) {
        match action {
            Action::Create(o) | Action::Update(o) => write(api, K::from_config(o)).await?,
            Action::Delete { name } => api
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
                .or_else(ignore_missing)?,
        }
    }
    Ok(())
}

/// Creates or replaces one bootstrap object (a lost race is left to the next pass).
async fn write<K: FlowObject>(api: &Api<K>, obj: K) -> Result<(), ControllerError> {
    let pp = PostParams {
        field_manager: Some(BOOTSTRAP_FIELD_MANAGER.into()),
        ..Default::default()
    };
    let result = match (&obj.meta().resource_version, &obj.meta().name) {
        (Some(_), Some(name)) => api.replace(name, &pp, &obj).await.map(|_| ()),
        _ => api.create(&pp, &obj).await.map(|_| ()),
    };
    result.or_else(ignore_missing)
}

/// 404 and 409 mean someone else got there first; the next pass sees the result.
fn ignore_missing(e: kube::Error) -> Result<(), ControllerError> {
    match e {
        kube::Error::Api(s) if s.code == 404 || s.code == 409 => Ok(()),
        other => Err(other.into()),
    }
}
