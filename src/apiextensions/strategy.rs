//! What a resource's own type adds to the generic write and delete
//! pipelines: kube's REST strategies (`PrepareForCreate`/`PrepareForUpdate`,
//! `Validate`, and for deletion the finalizer a type adds). Custom resources
//! add nothing beyond their schema; the CustomResourceDefinition resource
//! adds its defaults, its validation and its cleanup finalizer. The registry
//! asks the resource type for its strategy and never names a type itself.
//! Types defined by modules above this one (the admission kinds kshard
//! serves standalone) bring their strategies in a [`Strategies`] table,
//! registered with the catalog at server start.

use serde_json::Value;

use super::catalog::PrinterColumn;
use crate::status::FieldError;

/// A table cell computed from an object.
pub type ComputedCell = fn(&Value) -> Value;

pub trait Strategy: Sync + std::fmt::Debug {
    /// Defaults the type sets on an object being created or updated, after
    /// its schema's.
    fn prepare(&self, _obj: &mut Value) {}

    /// The type's own validation of an object being written (`old`: the
    /// stored one, on update), beyond its schema. `status_only`: a write
    /// through the status subresource.
    fn validate(&self, _obj: &Value, _old: Option<&Value>, _status_only: bool) -> Vec<FieldError> {
        Vec::new()
    }

    /// kube's own validation of a type it builds in (Go code, in its words
    /// and order), in place of the schema's structural checks (list types,
    /// CEL), which such a schema does not carry. `None`: the schema's.
    fn builtin_validation(&self, _obj: &Value) -> Option<BuiltinValidation> {
        None
    }

    /// Top-level fields the type's objects always carry, even empty (a
    /// kube type's non-pointer structs): field ownership starts from them
    /// on create.
    fn always_present(&self) -> &'static [&'static str] {
        &[]
    }

    /// The columns of a kube built-in type's table (kube's printer for it,
    /// between Name and Age), each computed from the object, in place of
    /// the definition's printer columns.
    fn table_columns(&self) -> Option<Vec<(PrinterColumn, ComputedCell)>> {
        None
    }

    /// A finalizer the type adds when an object is first deleted (its
    /// dependents go before it does), and how the object then says so.
    fn deletion_finalizer(&self) -> Option<&'static str> {
        None
    }

    /// Marks an object whose deletion the type's finalizer holds up.
    fn mark_deleting(&self, _obj: &mut Value) {}
}

/// What [`Strategy::builtin_validation`] found.
pub struct BuiltinValidation {
    pub errors: Vec<FieldError>,
    /// Whether an update is excused the errors on values it left as they
    /// were (ratcheting), as the schema's checks are.
    pub ratcheted: bool,
}

/// Strategies by group and resource, for types whose strategy lives in a
/// module above this one; the catalog gives each matching type its own.
#[derive(Clone, Default, Debug)]
pub struct Strategies(Vec<(&'static str, &'static str, &'static dyn Strategy)>);

impl Strategies {
    pub fn insert(&mut self, group: &'static str, plural: &'static str, s: &'static dyn Strategy) {
        self.0.retain(|(g, p, _)| (*g, *p) != (group, plural));
        self.0.push((group, plural, s));
    }

    pub fn get(&self, group: &str, plural: &str) -> Option<&'static dyn Strategy> {
        self.0
            .iter()
            .find(|(g, p, _)| *g == group && *p == plural)
            .map(|(_, _, s)| *s)
    }
}

/// The strategy of custom resources: nothing beyond the schema.
#[derive(Debug)]
pub struct Generic;

impl Strategy for Generic {}
