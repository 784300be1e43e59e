//! `Apf`, the runtime facade of flow control: it starts with the bootstrap
//! configuration, applies new configurations (`replace_config`), classifies,
//! and runs the borrowing rounds. Admission lives in `admission` and `wait`,
//! seat release in `seats`, counters in `snapshot`, debug text in `dump`.
//!
//! All state lives behind one mutex; it is held only for bookkeeping (no
//! awaits), and waiting requests sleep on oneshot channels outside it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::SystemTime;

use tokio::time::Instant;

use super::bootstrap;
use super::classifier::{Classification, Classifier, RequestDigest};
use super::concurrency::{self, BorrowInput, LevelShares};
use super::estimator;
use super::level::{uid_or_stable, Level};
use super::snapshot::{ApfObserver, FlowCounters};
use super::types::*;

/// Server-wide limits (kube's --max-requests-inflight and
/// --max-mutating-requests-inflight); ServerCL is their sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    pub max_requests_inflight: u32,
    pub max_mutating_requests_inflight: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
        }
    }
}

impl ServerConfig {
    pub fn server_concurrency_limit(&self) -> u32 {
        self.max_requests_inflight + self.max_mutating_requests_inflight
    }
}

/// What `replace_config` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigReport {
    /// FlowSchemas whose level is missing: status `Dangling=True`.
    pub dangling: Vec<String>,
    /// FlowSchemas whose level exists: status `Dangling=False`.
    pub found: Vec<String>,
    /// Objects ignored for failing validation: (kind/name, errors).
    pub invalid: Vec<(String, Vec<FieldError>)>,
    /// Levels kept only until their requests drain.
    pub quiescing: Vec<String>,
}

/// Everything behind the `Apf` lock.
pub(super) struct State {
    pub(super) server_cl: u32,
    pub(super) levels: BTreeMap<Arc<str>, Level>,
    pub(super) classifier: Classifier,
    pub(super) schema_uids: HashMap<String, Arc<str>>,
    pub(super) flows: HashMap<(Arc<str>, Arc<str>), FlowCounters>,
    pub(super) next_id: u64,
}

/// API Priority and Fairness for one server.
pub struct Apf {
    state: Mutex<State>,
    epoch: Instant,
    epoch_wall: SystemTime,
    observer: RwLock<Option<Arc<dyn ApfObserver>>>,
}

impl std::fmt::Debug for Apf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Apf").finish_non_exhaustive()
    }
}

impl Apf {
    /// Starts with the bootstrap configuration in force.
    pub fn new(config: ServerConfig) -> Arc<Apf> {
        let now = Instant::now();
        let apf = Apf {
            state: Mutex::new(State {
                server_cl: config.server_concurrency_limit(),
                levels: BTreeMap::new(),
                classifier: Classifier::new(&[], |_| None),
                schema_uids: HashMap::new(),
                flows: HashMap::new(),
                next_id: 0,
            }),
            epoch: now,
            epoch_wall: SystemTime::now(),
            observer: RwLock::new(None),
        };
        apf.replace_config(
            bootstrap::all_flow_schemas(),
            bootstrap::all_priority_levels(),
        );
        Arc::new(apf)
    }

    pub fn set_observer(&self, observer: Arc<dyn ApfObserver>) {
        if let Ok(mut o) = self.observer.write() {
            *o = Some(observer);
        }
    }

    pub(super) fn observer(&self) -> Option<Arc<dyn ApfObserver>> {
        self.observer.read().ok().and_then(|o| o.clone())
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough counters;
        // refusing all traffic afterwards would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whole seconds since this `Apf` started (the Retry-After clock).
    pub(super) fn seconds(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs()
    }

    /// The wall-clock time of `t` (for the request dump).
    pub(super) fn wall(&self, t: Instant) -> SystemTime {
        self.epoch_wall + t.saturating_duration_since(self.epoch)
    }

    /// Replaces the whole configuration. Queued and executing requests are
    /// kept: removed levels quiesce and disappear once drained. Missing
    /// mandatory objects (exempt, catch-all) are supplied.
    pub fn replace_config(
        &self,
        schemas: Vec<FlowSchema>,
        levels: Vec<PriorityLevelConfiguration>,
    ) -> ConfigReport {
        let now = Instant::now();
        let mut report = ConfigReport::default();
        let mut pls: Vec<PriorityLevelConfiguration> = Vec::new();
        for mut pl in levels {
            pl.apply_defaults();
            let errs = validate_priority_level(&pl);
            if errs.is_empty() {
                if !pls.iter().any(|p| p.metadata.name == pl.metadata.name) {
                    pls.push(pl);
                }
            } else {
                report.invalid.push((
                    format!("prioritylevelconfigurations/{}", pl.metadata.name),
                    errs,
                ));
            }
        }
        for m in bootstrap::mandatory_priority_levels() {
            if !pls.iter().any(|p| p.metadata.name == m.metadata.name) {
                pls.push(m);
            }
        }
        let mut fss: Vec<FlowSchema> = Vec::new();
        for mut fs in schemas {
            fs.apply_defaults();
            let errs = validate_flow_schema(&fs);
            if errs.is_empty() {
                fss.push(fs);
            } else {
                report
                    .invalid
                    .push((format!("flowschemas/{}", fs.metadata.name), errs));
            }
        }
        for m in bootstrap::mandatory_flow_schemas() {
            if !fss.iter().any(|f| f.metadata.name == m.metadata.name) {
                fss.push(m);
            }
        }

        let mut st = self.lock();
        let server_cl = st.server_cl;
        let shares: Vec<LevelShares> = pls
            .iter()
            .map(|p| LevelShares {
                shares: p.nominal_concurrency_shares().max(0) as u32,
                lendable_percent: p.lendable_percent().clamp(0, 100) as u32,
                borrowing_limit_percent: if p.is_exempt() {
                    // Exempt levels are not limited; the bound only matters
                    // for reporting.
                    None
                } else {
                    p.borrowing_limit_percent().map(|b| b.max(0) as u32)
                },
            })
            .collect();
        let limits = concurrency::split(server_cl, &shares);
        let keep: Vec<Arc<str>> = pls
            .iter()
            .map(|p| Arc::from(p.metadata.name.as_str()))
            .collect();
        for (pl, lim) in pls.into_iter().zip(limits) {
            let name: Arc<str> = Arc::from(pl.metadata.name.as_str());
            let level = st.levels.entry(name).or_insert_with(|| {
                let mut l = Level::new(pl.clone(), now);
                l.qs.set_concurrency_limit(lim.initial_current());
                l
            });
            level.qs.sync_time(now);
            level.uid = uid_or_stable(&pl.metadata, "prioritylevelconfigurations");
            level.exempt = pl.is_exempt();
            level.config = pl;
            level.quiescing = false;
            level.limits = lim;
            let hand = level
                .config
                .queuing()
                .map_or(1, |q| q.hand_size.max(1) as u32);
            level.max_seats = estimator::level_max_seats(lim.nominal, hand);
            let current = level
                .qs
                .concurrency_limit()
                .clamp(lim.min, lim.max.max(lim.min));
            let queuing = level.config.queuing().map(|q| {
                (
                    q.queues.max(1) as usize,
                    q.hand_size.max(1) as usize,
                    q.queue_length_limit.max(0) as usize,
                )
            });
            level.qs.configure(queuing, current);
            level.qs.set_alone_at_zero(lim.nominal > 0 && !level.exempt);
            level.qs.dispatch(now);
            level.note_demand(now);
        }
        for (name, level) in st.levels.iter_mut() {
            if !keep.contains(name) {
                level.quiescing = true;
            }
        }
        st.levels.retain(|_, l| !(l.quiescing && l.is_drained()));
        report.quiescing = st
            .levels
            .values()
            .filter(|l| l.quiescing)
            .map(|l| l.name.to_string())
            .collect();

        let classifier = {
            let levels = &st.levels;
            Classifier::new(&fss, |name| {
                levels
                    .get(name)
                    .filter(|l| !l.quiescing)
                    .map(|l| l.queue_count())
            })
        };
        report.dangling = classifier.dangling().to_vec();
        report.found = classifier
            .schemas()
            .map(|f| f.metadata.name.clone())
            .collect();
        st.schema_uids = fss
            .iter()
            .map(|f| {
                (
                    f.metadata.name.clone(),
                    uid_or_stable(&f.metadata, "flowschemas"),
                )
            })
            .collect();
        st.classifier = classifier;
        report
    }

    /// Classification only (for headers on requests APF does not gate).
    pub fn classify(&self, digest: &RequestDigest) -> Option<Classification> {
        self.lock().classifier.classify(digest)
    }

    /// One borrowing round (call every [`concurrency::BORROWING_PERIOD`]).
    pub fn update_borrowing(&self, now: Instant) {
        let mut st = self.lock();
        let nominal_sum: u32 = st
            .levels
            .values()
            .filter(|l| !l.quiescing)
            .map(|l| l.limits.nominal)
            .sum();
        let mut names = Vec::new();
        let mut inputs = Vec::new();
        for level in st.levels.values_mut().filter(|l| !l.quiescing) {
            level.qs.sync_time(now);
            level.note_demand(now);
            let period = level.integrator.reset(now);
            inputs.push(BorrowInput {
                exempt: level.exempt,
                limits: level.limits,
                period,
                smoothed: level.smoothed,
            });
            names.push(level.name.clone());
        }
        let outputs = concurrency::borrow(nominal_sum, &inputs);
        for (name, out) in names.iter().zip(outputs) {
            if let Some(level) = st.levels.get_mut(name) {
                level.smoothed = out.smoothed;
                level.target = out.target;
                level.qs.set_concurrency_limit(out.current);
                level.qs.dispatch(now);
                level.note_demand(now);
            }
        }
    }

    /// Spawns the 10-second borrowing loop; it ends when the `Apf` is dropped.
    pub fn spawn_borrowing_loop(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(concurrency::BORROWING_PERIOD);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(apf) = weak.upgrade() else { break };
                apf.update_borrowing(Instant::now());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::flowcontrol::estimator::EstimateInputs;
    use std::future::pending;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn bootstrap_config_is_in_force_from_the_start() {
        let apf = Apf::new(ServerConfig::default());
        let g = apf
            .admit(&user("alice"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap();
        assert_eq!(g.flow_schema_name(), "global-default");
        assert_eq!(g.priority_level_name(), "global-default");
        assert_eq!(
            g.flow_schema_uid(),
            bootstrap::stable_uid("flowschemas", "global-default")
        );
        assert_eq!(
            g.priority_level_uid(),
            bootstrap::stable_uid("prioritylevelconfigurations", "global-default")
        );
        g.finish();
        let gd = level_snapshot(&apf, "global-default");
        assert_eq!(
            (
                gd.nominal_limit_seats,
                gd.current_limit_seats,
                gd.max_seats_per_request
            ),
            (49, 49 - 12, 8)
        );
        assert_eq!(gd.dispatched, 1);
        assert_eq!(gd.executing_requests, 0);
        let admin = RequestDigest {
            groups: vec!["system:masters".into()],
            ..user("root")
        };
        let g = apf
            .admit(&admin, EstimateInputs::Simple, None, pending())
            .await
            .unwrap();
        assert_eq!(g.priority_level_name(), "exempt");
    }

    #[tokio::test(start_paused = true)]
    async fn reconfiguration_keeps_requests_and_quiesces_removed_levels() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let mut held = futures_join(&apf, 4).await;
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("w"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        // Replace everything: "test" disappears, traffic goes to "other".
        let fs = bootstrap::global_default_like("to-other", 100, "other");
        let report = apf.replace_config(vec![fs], vec![level("other", 1, None)]);
        assert_eq!(report.quiescing, vec!["test".to_string()]);
        let dump = apf.dump_priority_levels();
        assert!(
            dump.lines()
                .any(|l| l.starts_with("test,") && l.contains("true,")),
            "{dump}"
        );
        let g = apf
            .admit(&user("n"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap();
        assert_eq!(g.priority_level_name(), "other");
        // The queued request still runs on the quiescing level.
        held.pop().unwrap().finish();
        let w = waiter.await.unwrap().unwrap();
        assert_eq!(w.priority_level_name(), "test");
        drop(held);
        drop(w);
        let names: Vec<String> = apf.snapshot().levels.into_iter().map(|l| l.name).collect();
        assert!(!names.contains(&"test".to_string()), "{names:?}");
        // Mandatory objects were supplied.
        assert!(names.contains(&"exempt".to_string()) && names.contains(&"catch-all".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn dangling_schemas_reported() {
        let apf = Apf::new(ServerConfig::default());
        let mut schemas = bootstrap::all_flow_schemas();
        schemas.push(bootstrap::global_default_like(
            "lost",
            5000,
            "no-such-level",
        ));
        let report = apf.replace_config(schemas, bootstrap::all_priority_levels());
        assert_eq!(report.dangling, vec!["lost".to_string()]);
        assert!(report.found.contains(&"global-default".to_string()));
    }

    #[tokio::test(start_paused = true)]
    async fn borrowing_moves_seats_to_busy_level() {
        let apf = Apf::new(ServerConfig::default());
        let mut held = Vec::new();
        // Keep workload-low (nominal 245, min 24) idle and global-default busy.
        for i in 0..37 {
            held.push(
                apf.admit(
                    &user(&format!("u{i}")),
                    EstimateInputs::Simple,
                    None,
                    pending(),
                )
                .await
                .unwrap(),
            );
        }
        let mut waiting = Vec::new();
        for i in 0..60 {
            let apf2 = apf.clone();
            waiting.push(tokio::spawn(async move {
                apf2.admit(
                    &user(&format!("w{i}")),
                    EstimateInputs::Simple,
                    None,
                    pending(),
                )
                .await
            }));
        }
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(10)).await;
        apf.update_borrowing(Instant::now());
        let gd = level_snapshot(&apf, "global-default");
        let wl = level_snapshot(&apf, "workload-low");
        assert!(gd.current_limit_seats > gd.nominal_limit_seats, "{gd:?}");
        // The idle level lent most of what it may lend (spare seats are
        // spread in proportion to targets, so it keeps a bit above MinCL).
        assert!(
            wl.current_limit_seats < wl.nominal_limit_seats / 2,
            "{wl:?}"
        );
        // The extra seats dispatched queued requests.
        assert!(gd.executing_requests > 37, "{gd:?}");
        drop(held);
        for w in waiting {
            let _ = w.await;
        }
    }
}
