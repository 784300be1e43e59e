//! Helpers shared by the unit tests of the `Apf` modules.

use std::future::pending;
use std::sync::Arc;

use super::apf::{Apf, ServerConfig};
use super::bootstrap;
use super::classifier::RequestDigest;
use super::estimator::EstimateInputs;
use super::seats::SeatGuard;
use super::snapshot::LevelSnapshot;
use super::types::fixtures;
use super::types::*;

pub(super) fn user(name: &str) -> RequestDigest {
    RequestDigest {
        user: name.into(),
        groups: vec!["system:authenticated".into()],
        is_resource: true,
        verb: "get".into(),
        api_version: "v1".into(),
        resource: "pods".into(),
        namespace: "default".into(),
        name: "p".into(),
        path: "/api/v1/namespaces/default/pods/p".into(),
        ..Default::default()
    }
}

/// A Limited level that neither lends nor borrows; `queuing` is
/// (queues, handSize, queueLengthLimit), `None` for Reject.
pub(super) fn level(
    name: &str,
    shares: i32,
    queuing: Option<(i32, i32, i32)>,
) -> PriorityLevelConfiguration {
    let mut pl = fixtures::limited(
        Some(shares),
        queuing.map(|(queues, hand_size, limit)| fixtures::queuing(queues, hand_size, limit)),
    );
    pl.metadata.name = name.into();
    if let Some(l) = pl.spec.limited.as_mut() {
        l.lendable_percent = Some(0);
        l.borrowing_limit_percent = Some(0);
    }
    pl
}

/// ServerCL 4 split so that "test" gets exactly `seats` seats and
/// everyone (system:authenticated) lands there.
pub(super) fn apf_with(level_cfg: PriorityLevelConfiguration) -> Arc<Apf> {
    let apf = Apf::new(ServerConfig {
        max_requests_inflight: 3,
        max_mutating_requests_inflight: 1,
    });
    let fs = bootstrap::global_default_like("test", 100, &level_cfg.metadata.name);
    // catch-all gets 0 shares so "test" owns the whole ServerCL.
    let mut catch_all = bootstrap::catch_all_priority_level();
    catch_all
        .spec
        .limited
        .as_mut()
        .unwrap()
        .nominal_concurrency_shares = Some(0);
    let report = apf.replace_config(vec![fs], vec![level_cfg, catch_all]);
    assert!(report.invalid.is_empty(), "{report:?}");
    apf
}

pub(super) async fn futures_join(apf: &Arc<Apf>, n: usize) -> Vec<SeatGuard> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(
            apf.admit(&user("holder"), EstimateInputs::Simple, None, pending())
                .await
                .unwrap(),
        );
    }
    v
}

/// The snapshot of one level, which must exist.
pub(super) fn level_snapshot(apf: &Apf, name: &str) -> LevelSnapshot {
    apf.snapshot()
        .levels
        .into_iter()
        .find(|l| l.name == name)
        .unwrap()
}
