//! The flow-control controller: watches FlowSchema and PriorityLevelConfiguration
//! custom resources (`flowcontrol.kshard.dev/v1`) with kube-rs, turns them into
//! the running `flowcontrol` configuration, maintains the mandatory and
//! suggested objects, and reports status with server-side apply.
//!
//! Standalone, it talks to kshard itself (which serves these CRDs); in a
//! cluster, to the host. Replicas share the configuration; status writes are
//! server-side applies under one field manager, so replicas agree instead of
//! fighting, and they write only when status changes.

pub mod crd;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{json, Value};

use crate::flowcontrol::bootstrap::{self, Action};
use crate::flowcontrol::config::{
    self, ConditionStatus, FlowSchemaResource, PriorityLevelConfigurationResource,
    CONDITION_DANGLING,
};
use crate::flowcontrol::Apf;

/// Field manager of the status this controller writes.
pub const FIELD_MANAGER: &str = "kshard-flowcontrol";
/// Condition saying whether an object's spec is the one in force.
pub const CONDITION_IN_FORCE: &str = "InForce";
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Convert(String),
}

pub fn spawn(client: kube::Client, apf: Arc<Apf>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { run(client, apf).await })
}

enum Change {
    Schema(watcher::Event<FlowSchemaResource>),
    Level(watcher::Event<PriorityLevelConfigurationResource>),
}

#[derive(Default)]
struct State {
    schemas: BTreeMap<String, FlowSchemaResource>,
    levels: BTreeMap<String, PriorityLevelConfigurationResource>,
    schemas_ready: bool,
    levels_ready: bool,
    /// The last valid spec of each object, kept in force while it is invalid.
    good_schemas: HashMap<String, config::FlowSchema>,
    good_levels: HashMap<String, config::PriorityLevelConfiguration>,
}

async fn run(client: kube::Client, apf: Arc<Apf>) {
    let schemas: Api<FlowSchemaResource> = Api::all(client.clone());
    let levels: Api<PriorityLevelConfigurationResource> = Api::all(client);
    // The first maintenance pass retries each second until it gets through.
    while let Err(e) = maintain(&schemas, &levels).await {
        tracing::warn!(error = %e, "flow-control maintenance failed; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let changes = futures::stream::select(
        watcher(schemas.clone(), watcher::Config::default()).map(|e| e.map(Change::Schema)),
        watcher(levels.clone(), watcher::Config::default()).map(|e| e.map(Change::Level)),
    );
    let mut changes = std::pin::pin!(changes);
    let mut state = State::default();
    let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            next = changes.next() => {
                let Some(first) = next else { return };
                let mut removed_bootstrap = false;
                let mut batch = vec![first];
                // Take whatever else is ready so a burst reconciles once.
                while let Some(Some(more)) = changes.next().now_or_never() {
                    batch.push(more);
                }
                for change in batch {
                    match change {
                        Ok(c) => removed_bootstrap |= state.record(c),
                        Err(e) => tracing::debug!(error = %e, "flow-control watch error"),
                    }
                }
                if removed_bootstrap {
                    if let Err(e) = maintain(&schemas, &levels).await {
                        tracing::warn!(error = %e, "flow-control maintenance failed");
                    }
                }
                if state.schemas_ready && state.levels_ready {
                    reconcile(&mut state, &apf, &schemas, &levels).await;
                }
            }
            _ = tick.tick() => {
                if let Err(e) = maintain(&schemas, &levels).await {
                    tracing::warn!(error = %e, "flow-control maintenance failed");
                }
            }
        }
    }
}

fn is_bootstrap(name: &str, schemas: bool) -> bool {
    if schemas {
        bootstrap::all_flow_schemas()
            .iter()
            .any(|o| o.metadata.name == name)
    } else {
        bootstrap::all_priority_levels()
            .iter()
            .any(|o| o.metadata.name == name)
    }
}

impl State {
    /// Applies one watch event; returns true when a bootstrap object was deleted.
    fn record(&mut self, change: Change) -> bool {
        match change {
            Change::Schema(ev) => match ev {
                watcher::Event::Init => {
                    self.schemas.clear();
                    self.schemas_ready = false;
                }
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                    self.schemas
                        .insert(o.metadata.name.clone().unwrap_or_default(), o);
                }
                watcher::Event::InitDone => self.schemas_ready = true,
                watcher::Event::Delete(o) => {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    self.schemas.remove(&name);
                    self.good_schemas.remove(&name);
                    return is_bootstrap(&name, true);
                }
            },
            Change::Level(ev) => match ev {
                watcher::Event::Init => {
                    self.levels.clear();
                    self.levels_ready = false;
                }
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                    self.levels
                        .insert(o.metadata.name.clone().unwrap_or_default(), o);
                }
                watcher::Event::InitDone => self.levels_ready = true,
                watcher::Event::Delete(o) => {
                    let name = o.metadata.name.clone().unwrap_or_default();
                    self.levels.remove(&name);
                    self.good_levels.remove(&name);
                    return is_bootstrap(&name, false);
                }
            },
        }
        false
    }
}

fn meta_of(m: &kube::api::ObjectMeta) -> config::ObjectMeta {
    config::ObjectMeta {
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        resource_version: m.resource_version.clone().unwrap_or_default(),
        generation: m.generation.unwrap_or(0),
        annotations: m.annotations.clone().unwrap_or_default(),
    }
}

fn schema_of(o: &FlowSchemaResource) -> config::FlowSchema {
    config::FlowSchema {
        metadata: meta_of(&o.metadata),
        spec: o.spec.clone(),
        status: None,
    }
}

fn level_of(o: &PriorityLevelConfigurationResource) -> config::PriorityLevelConfiguration {
    config::PriorityLevelConfiguration {
        metadata: meta_of(&o.metadata),
        spec: o.spec.clone(),
        status: None,
    }
}

fn problems(errors: &[config::FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn in_force(ok: bool, reason: &str, message: String, generation: i64) -> Value {
    json!({
        "type": CONDITION_IN_FORCE,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    })
}

/// Turns the objects into the running configuration and reports status.
async fn reconcile(
    state: &mut State,
    apf: &Apf,
    schemas_api: &Api<FlowSchemaResource>,
    levels_api: &Api<PriorityLevelConfigurationResource>,
) {
    let mut level_status: HashMap<String, Value> = HashMap::new();
    let mut levels = Vec::new();
    for (name, o) in &state.levels {
        let mut pl = level_of(o);
        pl.apply_defaults();
        let errs = config::validate_priority_level(&pl);
        let generation = o.metadata.generation.unwrap_or(0);
        if errs.is_empty() {
            state.good_levels.insert(name.clone(), pl.clone());
            levels.push(pl);
            level_status.insert(name.clone(), json!({"conditions": [
                in_force(true, "Valid", format!("generation {generation} is in force"), generation),
            ]}));
        } else {
            let kept = state.good_levels.get(name).cloned();
            let message = format!(
                "{}; {}",
                problems(&errs),
                if kept.is_some() {
                    "the last valid spec stays in force"
                } else {
                    "not in force"
                }
            );
            levels.extend(kept);
            level_status.insert(
                name.clone(),
                json!({"conditions": [
                    in_force(false, "Invalid", message, generation),
                ]}),
            );
        }
    }
    let mut schema_errors: HashMap<String, String> = HashMap::new();
    let mut schemas = Vec::new();
    for (name, o) in &state.schemas {
        let mut fs = schema_of(o);
        fs.apply_defaults();
        let errs = config::validate_flow_schema(&fs);
        if errs.is_empty() {
            state.good_schemas.insert(name.clone(), fs.clone());
            schemas.push(fs);
        } else {
            let kept = state.good_schemas.get(name).cloned();
            schema_errors.insert(
                name.clone(),
                format!(
                    "{}; {}",
                    problems(&errs),
                    if kept.is_some() {
                        "the last valid spec stays in force"
                    } else {
                        "not in force"
                    }
                ),
            );
            schemas.extend(kept);
        }
    }
    let report = apf.replace_config(schemas, levels);

    for (name, o) in &state.schemas {
        let dangling = report.dangling.contains(name);
        let generation = o.metadata.generation.unwrap_or(0);
        let in_force_cond = match schema_errors.get(name) {
            Some(m) => in_force(false, "Invalid", m.clone(), generation),
            None => in_force(
                true,
                "Valid",
                format!("generation {generation} is in force"),
                generation,
            ),
        };
        let level = &o.spec.priority_level_configuration.name;
        let dangling_cond = if dangling {
            json!({"type": CONDITION_DANGLING, "status": "True", "reason": "NotFound",
                "message": format!("This FlowSchema references the PriorityLevelConfiguration object named {level:?} but there is no such object")})
        } else {
            json!({"type": CONDITION_DANGLING, "status": "False", "reason": "Found",
                "message": format!("This FlowSchema references the PriorityLevelConfiguration object named {level:?} and it exists")})
        };
        let status = json!({"conditions": [dangling_cond, in_force_cond]});
        let current = o
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        write_status(schemas_api, "FlowSchema", name, current, status).await;
    }
    for (name, o) in &state.levels {
        let Some(status) = level_status.remove(name) else {
            continue;
        };
        let current = o
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        write_status(
            levels_api,
            "PriorityLevelConfiguration",
            name,
            current,
            status,
        )
        .await;
    }
}

/// Server-side applies `status` to one object when it differs from `current`.
async fn write_status<K>(
    api: &Api<K>,
    kind: &str,
    name: &str,
    current: &[config::Condition],
    status: Value,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(status) = changed_status(current, status) else {
        return;
    };
    let body = json!({"apiVersion": "flowcontrol.kshard.dev/v1", "kind": kind, "status": status});
    let params = PatchParams::apply(FIELD_MANAGER).force();
    if let Err(e) = api.patch_status(name, &params, &Patch::Apply(&body)).await {
        tracing::debug!(error = %e, kind, name, "status write failed");
    }
}

/// The status to write, with `lastTransitionTime` kept for conditions whose
/// status did not change; `None` when nothing would change.
fn changed_status(current: &[config::Condition], mut wanted: Value) -> Option<Value> {
    let now = crate::registry::now_rfc3339();
    let mut same = true;
    let conditions = wanted.get_mut("conditions")?.as_array_mut()?;
    if conditions.len() != current.len() {
        same = false;
    }
    for c in conditions.iter_mut() {
        let type_ = c["type"].as_str().unwrap_or("").to_string();
        let status = c["status"].as_str().unwrap_or("").to_string();
        let old = current.iter().find(|o| o.type_ == type_);
        let old_status = old.map(|o| match o.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        });
        let transition = match (old, old_status) {
            (Some(o), Some(s)) if s == status => o
                .last_transition_time
                .clone()
                .unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        if old.is_none_or(|o| {
            old_status != Some(status.as_str())
                || o.reason != c["reason"].as_str().unwrap_or("")
                || o.message != c["message"].as_str().unwrap_or("")
                || o.observed_generation != c["observedGeneration"].as_i64()
        }) {
            same = false;
        }
        c["lastTransitionTime"] = json!(transition);
    }
    (!same).then_some(wanted)
}

/// One maintenance pass over the mandatory and suggested objects.
async fn maintain(
    schemas: &Api<FlowSchemaResource>,
    levels: &Api<PriorityLevelConfigurationResource>,
) -> Result<(), ControllerError> {
    let existing: Vec<config::PriorityLevelConfiguration> = levels
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(level_of)
        .collect();
    carry_out(levels, bootstrap::plan_priority_levels(&existing), |o| {
        let obj = PriorityLevelConfigurationResource {
            metadata: kube_meta(&o.metadata),
            spec: o.spec,
            status: None,
        };
        (o.metadata, obj)
    })
    .await?;
    let existing: Vec<config::FlowSchema> = schemas
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(schema_of)
        .collect();
    carry_out(schemas, bootstrap::plan_flow_schemas(&existing), |o| {
        let obj = FlowSchemaResource {
            metadata: kube_meta(&o.metadata),
            spec: o.spec,
            status: None,
        };
        (o.metadata, obj)
    })
    .await
}

/// Performs a maintenance plan against one kind.
async fn carry_out<K, T>(
    api: &Api<K>,
    actions: Vec<Action<T>>,
    to_resource: impl Fn(T) -> (config::ObjectMeta, K),
) -> Result<(), ControllerError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for action in actions {
        match action {
            Action::Create(o) | Action::Update(o) => {
                let (meta, obj) = to_resource(o);
                write(api, &meta, obj).await?;
            }
            Action::Delete { name } => api
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ())
                .or_else(ignore_missing)?,
        }
    }
    Ok(())
}

fn ignore_missing(e: kube::Error) -> Result<(), ControllerError> {
    match e {
        kube::Error::Api(s) if s.code == 404 || s.code == 409 => Ok(()),
        other => Err(other.into()),
    }
}

fn kube_meta(m: &config::ObjectMeta) -> kube::api::ObjectMeta {
    kube::api::ObjectMeta {
        name: Some(m.name.clone()),
        annotations: (!m.annotations.is_empty()).then(|| m.annotations.clone()),
        resource_version: (!m.resource_version.is_empty()).then(|| m.resource_version.clone()),
        ..Default::default()
    }
}

/// Creates or replaces one bootstrap object (a lost race is left to the next pass).
async fn write<K>(api: &Api<K>, meta: &config::ObjectMeta, obj: K) -> Result<(), ControllerError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let pp = PostParams {
        field_manager: Some("kshard-flowcontrol-bootstrap".into()),
        ..Default::default()
    };
    let result = if meta.resource_version.is_empty() {
        api.create(&pp, &obj).await.map(|_| ())
    } else {
        api.replace(&meta.name, &pp, &obj).await.map(|_| ())
    };
    result.or_else(ignore_missing)
}
