//! The flow-control controller: watches FlowSchema and PriorityLevelConfiguration
//! custom resources (`flowcontrol.kshard.dev/v1`) with kube-runtime
//! reflectors, turns them into the running `flowcontrol` configuration,
//! maintains the mandatory and suggested objects, and reports status with
//! server-side apply.
//!
//! Standalone, it talks to kshard itself (which serves these CRDs); in a
//! cluster, to the host. Replicas share the configuration; status writes are
//! server-side applies under one field manager, so replicas agree instead of
//! fighting, and they write only when status changes.
//!
//! Modules: `crd` (the CRDs), `object` (what both kinds share), `reconcile`
//! (objects → APF configuration, last valid spec), `status` (conditions and
//! their writes), `maintain` (bootstrap objects), `retry` (backoff).
//! Watches back off with kube-runtime's default backoff; a failed
//! maintenance pass or reconcile is retried with the same backoff.

pub mod crd;
mod maintain;
mod object;
mod reconcile;
mod retry;
mod status;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::{reflector, watcher, WatchStreamExt};

use crate::flowcontrol::types::{FlowSchemaResource, PriorityLevelConfigurationResource};
use crate::flowcontrol::Apf;
use object::FlowObject;
use reconcile::Reconciler;
use retry::{until, Retry};

/// Field manager of the status this controller writes.
pub const FIELD_MANAGER: &str = "kshard-flowcontrol";
/// Condition saying whether an object's spec is the one in force.
pub const CONDITION_IN_FORCE: &str = "InForce";
const MAINTENANCE_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("{failed} status write(s) failed, the first: {first}")]
    Status { failed: usize, first: kube::Error },
}

pub fn spawn(client: kube::Client, apf: Arc<Apf>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { run(client, apf).await })
}

enum Change {
    Schema(watcher::Event<FlowSchemaResource>),
    Level(watcher::Event<PriorityLevelConfigurationResource>),
}

/// What the watch events tell the loop beyond the caches' contents.
#[derive(Default)]
struct Watched {
    schemas_listed: bool,
    levels_listed: bool,
}

impl Watched {
    /// Notes one event; returns true when a bootstrap object was deleted.
    fn record(&mut self, change: &Change) -> bool {
        match change {
            Change::Schema(ev) => note(ev, &mut self.schemas_listed),
            Change::Level(ev) => note(ev, &mut self.levels_listed),
        }
    }

    /// Both caches hold a complete list (until then, reconciling would put
    /// a partial configuration in force).
    fn ready(&self) -> bool {
        self.schemas_listed && self.levels_listed
    }
}

fn note<K: FlowObject>(ev: &watcher::Event<K>, listed: &mut bool) -> bool {
    match ev {
        watcher::Event::InitDone => {
            *listed = true;
            false
        }
        watcher::Event::Delete(o) => o.meta().name.as_deref().is_some_and(K::is_bootstrap),
        _ => false,
    }
}

async fn run(client: kube::Client, apf: Arc<Apf>) {
    let schemas_api: Api<FlowSchemaResource> = Api::all(client.clone());
    let levels_api: Api<PriorityLevelConfigurationResource> = Api::all(client);

    // The watches start after the first maintenance pass, so their first
    // lists already hold the bootstrap objects and the configuration put in
    // force never lacks them.
    let mut maintenance = Retry::default();
    while let Err(e) = maintain::maintain(&schemas_api, &levels_api).await {
        let wait = maintenance.failed();
        tracing::warn!(error = %e, retry_in = ?wait, "flow-control maintenance failed; retrying");
        tokio::time::sleep(wait).await;
    }
    maintenance.succeeded();

    let (schemas, schemas_writer) = reflector::store();
    let (levels, levels_writer) = reflector::store();
    let changes = futures::stream::select(
        reflector(
            schemas_writer,
            watcher(schemas_api.clone(), watcher::Config::default()).default_backoff(),
        )
        .map(|e| e.map(Change::Schema)),
        reflector(
            levels_writer,
            watcher(levels_api.clone(), watcher::Config::default()).default_backoff(),
        )
        .map(|e| e.map(Change::Level)),
    );
    let mut changes = std::pin::pin!(changes);
    let mut reconciler = Reconciler {
        apf,
        schemas_api: schemas_api.clone(),
        levels_api: levels_api.clone(),
        schemas,
        levels,
        good_schemas: Default::default(),
        good_levels: Default::default(),
    };
    let mut watched = Watched::default();
    let mut reconcile = Retry::default();
    let mut tick = tokio::time::interval(MAINTENANCE_EVERY);
    tick.tick().await;
    loop {
        // Biased: due work runs before more events are taken, maintenance
        // first so a deleted bootstrap object is back before reconciling.
        tokio::select! {
            biased;
            () = until(maintenance.due()) => {
                match maintain::maintain(&schemas_api, &levels_api).await {
                    Ok(()) => maintenance.succeeded(),
                    Err(e) => {
                        let wait = maintenance.failed();
                        tracing::warn!(error = %e, retry_in = ?wait, "flow-control maintenance failed");
                    }
                }
            }
            () = until(reconcile.due()), if watched.ready() => {
                match reconciler.reconcile().await {
                    Ok(()) => reconcile.succeeded(),
                    Err(e) => {
                        let wait = reconcile.failed();
                        tracing::warn!(error = %e, retry_in = ?wait, "flow-control reconcile failed");
                    }
                }
            }
            next = changes.next() => {
                let Some(first) = next else { return };
                let mut batch = vec![first];
                // Take whatever else is ready so a burst reconciles once.
                while let Some(Some(more)) = changes.next().now_or_never() {
                    batch.push(more);
                }
                for change in batch {
                    match change {
                        Ok(c) => {
                            if watched.record(&c) {
                                maintenance.now();
                            }
                        }
                        // The watcher backs off before it retries.
                        Err(e) => tracing::debug!(error = %e, "flow-control watch error"),
                    }
                }
                reconcile.now();
            }
            _ = tick.tick() => maintenance.now(),
        }
    }
}
