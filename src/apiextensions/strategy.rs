//! What a resource's own type adds to the generic write and delete
//! pipelines: kube's REST strategies (`PrepareForCreate`/`PrepareForUpdate`,
//! `Validate`, and for deletion the finalizer a type adds). Custom resources
//! add nothing beyond their schema; the CustomResourceDefinition resource
//! adds its defaults, its validation and its cleanup finalizer. The registry
//! asks the resource type for its strategy and never names a type itself.

use serde_json::Value;

use crate::status::FieldError;

pub trait Strategy: Sync {
    /// Defaults the type sets on an object being created or updated, after
    /// its schema's.
    fn prepare(&self, _obj: &mut Value) {}

    /// The type's own validation of an object being written (`old`: the
    /// stored one, on update), beyond its schema. `status_only`: a write
    /// through the status subresource.
    fn validate(&self, _obj: &Value, _old: Option<&Value>, _status_only: bool) -> Vec<FieldError> {
        Vec::new()
    }

    /// A finalizer the type adds when an object is first deleted (its
    /// dependents go before it does), and how the object then says so.
    fn deletion_finalizer(&self) -> Option<&'static str> {
        None
    }

    /// Marks an object whose deletion the type's finalizer holds up.
    fn mark_deleting(&self, _obj: &mut Value) {}
}

/// The strategy of custom resources: nothing beyond the schema.
pub struct Generic;

impl Strategy for Generic {}
