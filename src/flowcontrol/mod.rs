//! API Priority and Fairness (APF): kube-apiserver's flow control, as a
//! pure-logic module with no HTTP dependency.
//!
//! # How the HTTP layer uses it
//! ```ignore
//! let apf: Arc<Apf> = Apf::new(ServerConfig { max_requests_inflight: 400, max_mutating_requests_inflight: 200 });
//! apf.spawn_borrowing_loop();                       // 10 s lending/borrowing rounds
//! match apf.admit(&digest, EstimateInputs::Simple, deadline, client_gone).await {
//!     Ok(seats) => {
//!         // headers: X-Kubernetes-PF-FlowSchema-UID = seats.flow_schema_uid(),
//!         //          X-Kubernetes-PF-PriorityLevel-UID = seats.priority_level_uid()
//!         run_request().await;
//!         seats.finish();                            // watch: release_initial_seats() after initial events
//!     }
//!     Err(rejected) => { /* 429, Retry-After: rejected.retry_after_secs, body TOO_MANY_REQUESTS_BODY */ }
//! }
//! ```
//! The controller feeds configuration with [`Apf::replace_config`] (and uses
//! [`bootstrap::plan_flow_schemas`] / [`bootstrap::plan_priority_levels`] for
//! the maintenance pass); `/metrics` reads [`Apf::snapshot`] and may install
//! an [`ApfObserver`] for histograms; the debug endpoints return
//! [`Apf::dump_priority_levels`], [`Apf::dump_queues`], [`Apf::dump_requests`].
//!
//! Modules: `config` (types, defaults, validation), `bootstrap` (built-in
//! objects and maintenance), `classifier`, `concurrency` (ServerCL split and
//! borrowing), `shuffle` (dealer), `queueset` (fair queuing), `estimator`,
//! `retry_after`, `dump` (debug text). The `Apf` runtime: `apf` (the facade,
//! configuration, borrowing), `level` (one level's state), `admission`
//! (run, queue or reject), `wait` (a queued request), `seats` (`SeatGuard`
//! and release), `snapshot` (counters and observer hooks).

mod apf;
pub mod bootstrap;
pub mod classifier;
pub mod concurrency;
mod decide;
pub mod dump;
pub mod estimator;
mod level;
pub mod queueset;
pub mod retry_after;
mod seats;
pub mod shuffle;
mod snapshot;
#[cfg(test)]
mod test_support;
pub mod types;
mod wait;

pub use apf::{Apf, ConfigReport, ServerConfig};
pub use classifier::{Classification, RequestDigest};
pub use decide::{Rejected, DEFAULT_WAIT_LIMIT, MAX_WAIT_LIMIT, TOO_MANY_REQUESTS_BODY};
pub use estimator::{EstimateInputs, WorkEstimate};
pub use queueset::RejectReason;
pub use seats::SeatGuard;
pub use snapshot::{ApfObserver, ApfSnapshot, FlowCounters, LevelSnapshot};
pub use types::{FieldError, FlowSchema, PriorityLevelConfiguration};
