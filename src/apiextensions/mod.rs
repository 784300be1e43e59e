//! apiextensions: what the served resources are, below the generic
//! registry, as k8s.io/apiextensions-apiserver defines them: the catalog
//! of resource types built from CustomResourceDefinitions and its live
//! replacement, the validation of a definition, conversion between versions
//! (webhooks included), and the CustomResourceDefinition resource itself
//! (its built-in definition and strategy). Where definitions come from is
//! `crate::definitions`, above the registry.

pub mod catalog;
pub mod conversion;
pub mod crd_resource;
pub mod live;
pub mod strategy;
pub mod validation;

pub use catalog::{Catalog, ResourceType};
