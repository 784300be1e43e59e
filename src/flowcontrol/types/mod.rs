//! FlowSchema and PriorityLevelConfiguration, mirroring
//! `flowcontrol.apiserver.k8s.io/v1` field for field (served by kshard as
//! `flowcontrol.kshard.dev/v1`), with kube's defaulting and validation.
//!
//! `types` (the objects and their CRDs), `defaults` (defaulting and the
//! accessors that read defaulted values), `validation` (shared checks and
//! `FieldError`), `validate_flow_schema`, `validate_priority_level`.

mod defaults;
#[cfg(test)]
pub(crate) mod fixtures;
mod objects;
mod validate_flow_schema;
mod validate_priority_level;
mod validation;

pub use objects::*;
pub use validate_flow_schema::validate_flow_schema;
pub use validate_priority_level::{required_entropy_bits, validate_priority_level};
pub use validation::FieldError;

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
