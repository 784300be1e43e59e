//! kshard: a Kubernetes API server shard for CRD-defined resource groups.
//! A request flows `server` → `api` → `registry` → `storage`; `watch` follows
//! the store's change feed (see DESIGN.md).

pub mod admission;
pub mod api;
pub mod apiextensions;
pub mod apply;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod backoff;
pub mod controller;
pub mod definitions;
pub mod flowcontrol;
#[cfg(test)]
mod fuzz;
pub mod host;
pub mod logging;
pub mod manifests;
pub mod object;
pub mod registry;
pub mod replica;
pub mod schema;
pub mod scope;
pub mod server;
pub mod snapshot;
pub mod status;
pub mod storage;
pub mod timestamps;
pub mod traces;
pub mod units;
pub mod watch;
pub mod webhook_tls;
