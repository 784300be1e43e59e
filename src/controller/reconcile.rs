//! Reconciling: every FlowSchema and PriorityLevelConfiguration in the
//! watch caches becomes the running APF configuration at once (APF replaces
//! its whole configuration), then each object's status is reported.

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::Store;
use serde_json::{json, Value};

use super::object::FlowObject;
use super::{status, ControllerError};
use crate::flowcontrol::types::{FlowSchemaResource, PriorityLevelConfigurationResource};
use crate::flowcontrol::Apf;

/// The last valid spec of each object, kept in force while its current spec
/// is invalid. Keyed by name and tied to the uid, so a deleted and
/// re-created object does not inherit its predecessor's spec.
pub(super) struct LastGood<T> {
    specs: HashMap<String, (String, T)>,
}

impl<T> Default for LastGood<T> {
    fn default() -> Self {
        LastGood {
            specs: HashMap::new(),
        }
    }
}

impl<T: Clone> LastGood<T> {
    /// Validates each object: returns the configuration to put in force and
    /// each object's `InForce` condition, in the order of `objects`.
    pub(super) fn check<K: FlowObject<Config = T>>(
        &mut self,
        objects: &[Arc<K>],
    ) -> (Vec<T>, Vec<Value>) {
        let mut in_force = Vec::with_capacity(objects.len());
        let mut conditions = Vec::with_capacity(objects.len());
        for o in objects {
            let meta = o.meta();
            let name = meta.name.clone().unwrap_or_default();
            let uid = meta.uid.clone().unwrap_or_default();
            let generation = meta.generation.unwrap_or(0);
            let mut config = o.to_config();
            let errors = K::default_and_validate(&mut config);
            if errors.is_empty() {
                self.specs.insert(name, (uid, config.clone()));
                in_force.push(config);
                conditions.push(status::valid(generation));
            } else {
                let kept = self
                    .specs
                    .get(&name)
                    .filter(|(kept_uid, _)| *kept_uid == uid)
                    .map(|(_, spec)| spec.clone());
                conditions.push(status::invalid(&errors, kept.is_some(), generation));
                in_force.extend(kept);
            }
        }
        // Deleted objects take their last valid spec with them.
        self.specs.retain(|name, _| {
            objects
                .iter()
                .any(|o| o.meta().name.as_deref() == Some(name.as_str()))
        });
        (in_force, conditions)
    }
}

/// Everything a reconcile reads and writes.
pub(super) struct Reconciler {
    pub(super) apf: Arc<Apf>,
    pub(super) schemas_api: Api<FlowSchemaResource>,
    pub(super) levels_api: Api<PriorityLevelConfigurationResource>,
    pub(super) schemas: Store<FlowSchemaResource>,
    pub(super) levels: Store<PriorityLevelConfigurationResource>,
    pub(super) good_schemas: LastGood<crate::flowcontrol::FlowSchema>,
    pub(super) good_levels: LastGood<crate::flowcontrol::PriorityLevelConfiguration>,
}

/// The store's objects sorted by name, so a reconcile does not depend on
/// the cache's hash order.
fn sorted<K: FlowObject>(store: &Store<K>) -> Vec<Arc<K>> {
    let mut objects = store.state();
    objects.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    objects
}

impl Reconciler {
    /// Puts the cached objects in force and writes the statuses that changed.
    /// Every status is attempted; the first failure is returned so the whole
    /// reconcile is retried with backoff.
    pub(super) async fn reconcile(&mut self) -> Result<(), ControllerError> {
        let levels = sorted(&self.levels);
        let schemas = sorted(&self.schemas);
        let (level_configs, level_in_force) = self.good_levels.check(&levels);
        let (schema_configs, schema_in_force) = self.good_schemas.check(&schemas);
        let report = self.apf.replace_config(schema_configs, level_configs);

        let mut failures = Failures::default();
        for (o, in_force) in schemas.iter().zip(schema_in_force) {
            let name = o.metadata.name.as_deref().unwrap_or_default();
            let dangling = report.dangling.iter().any(|d| d == name);
            let level = &o.spec.priority_level_configuration.name;
            let wanted = json!({"conditions": [status::dangling(level, dangling), in_force]});
            failures.note(status::write(&self.schemas_api, o.as_ref(), wanted).await);
        }
        for (o, in_force) in levels.iter().zip(level_in_force) {
            let wanted = json!({"conditions": [in_force]});
            failures.note(status::write(&self.levels_api, o.as_ref(), wanted).await);
        }
        failures.into_result()
    }
}

/// Status writes that failed in one reconcile.
#[derive(Default)]
struct Failures {
    count: usize,
    first: Option<kube::Error>,
}

impl Failures {
    fn note(&mut self, result: Result<(), kube::Error>) {
        if let Err(e) = result {
            self.count += 1;
            self.first.get_or_insert(e);
        }
    }

    fn into_result(self) -> Result<(), ControllerError> {
        match self.first {
            None => Ok(()),
            Some(first) => Err(ControllerError::Status {
                failed: self.count,
                first,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flowcontrol::bootstrap;

    fn level(name: &str, uid: &str, queues: i32) -> Arc<PriorityLevelConfigurationResource> {
        let mut spec = bootstrap::all_priority_levels()
            .into_iter()
            .find(|l| l.queuing().is_some())
            .map(|l| l.spec)
            .unwrap_or_default();
        if let Some(q) = spec
            .limited
            .as_mut()
            .and_then(|l| l.limit_response.queuing.as_mut())
        {
            q.queues = queues;
        }
        let mut o = PriorityLevelConfigurationResource::new(name, spec);
        o.metadata.uid = Some(uid.into());
        o.metadata.generation = Some(1);
        Arc::new(o)
    }

    #[test]
    fn last_valid_spec_stays_in_force_for_the_same_object_only() {
        let mut good = LastGood::default();
        let (configs, conds) = good.check(&[level("a", "u1", 32)]);
        assert_eq!(configs.len(), 1);
        assert_eq!(conds[0]["status"], "True");
        // Too much entropy for shuffle sharding: invalid, the old spec stays.
        let (configs, conds) = good.check(&[level("a", "u1", 10_000_000)]);
        assert_eq!(configs[0].queuing().map(|q| q.queues), Some(32));
        assert_eq!(conds[0]["status"], "False");
        assert!(conds[0]["message"]
            .as_str()
            .unwrap()
            .ends_with("the last valid spec stays in force"));
        // Re-created under the same name: the predecessor's spec is not kept.
        let (configs, conds) = good.check(&[level("a", "u2", 10_000_000)]);
        assert!(configs.is_empty());
        assert!(conds[0]["message"]
            .as_str()
            .unwrap()
            .ends_with("not in force"));
        // Deleted: forgotten.
        let _ = good.check::<PriorityLevelConfigurationResource>(&[]);
        assert!(good.specs.is_empty());
    }
}
