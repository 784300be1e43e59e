//! `Apf`: the runtime object tying configuration, classifier, concurrency
//! split, queue sets, estimator and Retry-After together.
//!
//! All state lives behind one mutex; it is held only for bookkeeping (no
//! awaits), and waiting requests sleep on oneshot channels outside it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::bootstrap;
use super::classifier::{Classification, Classifier, RequestDigest};
use super::concurrency::{self, BorrowInput, LevelLimits, LevelShares, SeatDemandIntegrator};
use super::config::*;
use super::dump;
use super::estimator::{self, EstimateInputs, WorkEstimate};
use super::queueset::{Execution, QueueSet, RejectReason, WaitingRequest};
use super::retry_after::RetryAfter;

/// Queue wait limit for requests without a deadline.
pub const DEFAULT_WAIT_LIMIT: Duration = Duration::from_secs(15);
/// Upper bound of the queue wait limit.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(60);

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

/// A refused request: answer 429 with `Retry-After: retry_after_secs` and the
/// body "Too many requests, please try again later.".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request rejected by priority level {priority_level:?} ({reason:?}), retry after {retry_after_secs}s")]
pub struct Rejected {
    pub reason: RejectReason,
    pub retry_after_secs: u64,
    pub flow_schema: String,
    pub flow_schema_uid: String,
    pub priority_level: String,
    pub priority_level_uid: String,
}

pub const TOO_MANY_REQUESTS_BODY: &str = "Too many requests, please try again later.";

/// Hooks for the `apiserver_flowcontrol_*` histograms; counters and gauges
/// are read with [`Apf::snapshot`]. Called outside the APF lock.
pub trait ApfObserver: Send + Sync {
    /// `request_wait_duration_seconds{execute}`.
    fn wait_finished(
        &self,
        _priority_level: &str,
        _flow_schema: &str,
        _waited: Duration,
        _executed: bool,
    ) {
    }
    /// `request_execution_seconds{type}`; type is "regular" or "watch".
    fn execution_finished(
        &self,
        _priority_level: &str,
        _flow_schema: &str,
        _kind: &str,
        _took: Duration,
    ) {
    }
    /// `request_queue_length_after_enqueue`.
    fn enqueued(&self, _priority_level: &str, _flow_schema: &str, _queue_length: usize) {}
    /// `work_estimated_seats`.
    fn work_estimated(&self, _priority_level: &str, _flow_schema: &str, _seats: u32) {}
    /// `rejected_requests_total{reason}` as an event (also in snapshots).
    fn rejected(&self, _priority_level: &str, _flow_schema: &str, _reason: RejectReason) {}
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

/// Per-(level, schema) counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    pub priority_level: String,
    pub flow_schema: String,
    pub dispatched: u64,
    /// Indexed by `RejectReason::index()`.
    pub rejected: [u64; 4],
}

/// Gauges and counters of one level.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LevelSnapshot {
    pub name: String,
    pub uid: String,
    pub exempt: bool,
    pub quiescing: bool,
    pub nominal_limit_seats: u32,
    pub lendable_seats: u32,
    pub lower_limit_seats: u32,
    pub upper_limit_seats: u32,
    pub current_limit_seats: u32,
    pub max_seats_per_request: u32,
    pub waiting_requests: u32,
    pub executing_requests: u32,
    pub executing_seats: u32,
    pub demand_seats: u64,
    pub smoothed_demand_seats: f64,
    pub target_seats: f64,
    pub dispatched: u64,
    pub rejected: u64,
    pub timed_out: u64,
    pub cancelled: u64,
    pub retry_after_secs: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ApfSnapshot {
    pub server_concurrency_limit: u32,
    pub levels: Vec<LevelSnapshot>,
    pub flows: Vec<FlowCounters>,
}

struct Level {
    name: Arc<str>,
    uid: Arc<str>,
    config: PriorityLevelConfiguration,
    exempt: bool,
    limits: LevelLimits,
    max_seats: u32,
    qs: QueueSet,
    integrator: SeatDemandIntegrator,
    smoothed: f64,
    target: f64,
    quiescing: bool,
    retry: RetryAfter,
}

impl Level {
    fn new(pl: PriorityLevelConfiguration, now: Instant) -> Self {
        let name: Arc<str> = Arc::from(pl.metadata.name.as_str());
        let uid = uid_or_stable(&pl.metadata, "prioritylevelconfigurations");
        Level {
            name,
            uid,
            exempt: pl.is_exempt(),
            config: pl,
            limits: LevelLimits::default(),
            max_seats: 1,
            qs: QueueSet::new(now),
            integrator: SeatDemandIntegrator::new(now),
            smoothed: 0.0,
            target: 0.0,
            quiescing: false,
            retry: RetryAfter::default(),
        }
    }

    fn queue_count(&self) -> usize {
        if self.exempt {
            return 1;
        }
        self.config
            .queuing()
            .map_or(1, |q| q.queues.max(1) as usize)
    }

    fn note_demand(&mut self, now: Instant) {
        self.integrator.set(self.qs.seat_demand() as f64, now);
    }

    fn is_drained(&self) -> bool {
        self.qs.is_idle()
    }
}

fn uid_or_stable(meta: &ObjectMeta, kind: &str) -> Arc<str> {
    if meta.uid.is_empty() {
        Arc::from(bootstrap::stable_uid(kind, &meta.name))
    } else {
        Arc::from(meta.uid.as_str())
    }
}

struct State {
    server_cl: u32,
    levels: BTreeMap<Arc<str>, Level>,
    classifier: Classifier,
    schema_uids: HashMap<String, Arc<str>>,
    flows: HashMap<(Arc<str>, Arc<str>), FlowCounters>,
    next_id: u64,
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

struct Admitted {
    level: Arc<str>,
    level_uid: Arc<str>,
    schema: Arc<str>,
    schema_uid: Arc<str>,
}

enum Decision {
    /// `gated` is false for long-running requests that bypass APF.
    Run {
        exec: Execution,
        exempt: bool,
        gated: bool,
    },
    Wait {
        queue: usize,
        id: u64,
        rx: oneshot::Receiver<Instant>,
        arrive: Instant,
        queue_len: usize,
    },
    Reject(RejectReason, u64),
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

    fn observer(&self) -> Option<Arc<dyn ApfObserver>> {
        self.observer.read().ok().and_then(|o| o.clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent-enough counters;
        // refusing all traffic afterwards would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn seconds(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs()
    }

    fn wall(&self, t: Instant) -> SystemTime {
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

    /// Classifies, estimates, queues and waits for a seat.
    ///
    /// `deadline` is the request's deadline (the wait limit is a quarter of
    /// the time left, at most 60 s; 15 s without deadline); `cancel`
    /// completes when the client goes away. Dropping the returned future
    /// withdraws the request cleanly.
    pub async fn admit<C>(
        self: &Arc<Self>,
        digest: &RequestDigest,
        inputs: EstimateInputs,
        deadline: Option<Instant>,
        cancel: C,
    ) -> Result<SeatGuard, Rejected>
    where
        C: Future<Output = ()>,
    {
        let now = Instant::now();
        let (admitted, work, decision) = self.decide(digest, &inputs, now);
        let observer = self.observer();
        if let Some(o) = &observer {
            o.work_estimated(&admitted.level, &admitted.schema, work.max_seats());
        }
        match decision {
            Decision::Run {
                exec,
                exempt,
                gated,
            } => {
                if let (Some(o), true) = (&observer, gated) {
                    o.wait_finished(&admitted.level, &admitted.schema, Duration::ZERO, true);
                }
                Ok(SeatGuard::new(
                    self.clone(),
                    admitted,
                    exec,
                    exempt,
                    gated,
                    digest.verb == "watch",
                ))
            }
            Decision::Reject(reason, retry) => {
                if let Some(o) = &observer {
                    o.rejected(&admitted.level, &admitted.schema, reason);
                    o.wait_finished(&admitted.level, &admitted.schema, Duration::ZERO, false);
                }
                Err(self.rejected(&admitted, reason, retry))
            }
            Decision::Wait {
                queue,
                id,
                rx,
                arrive,
                queue_len,
            } => {
                if let Some(o) = &observer {
                    o.enqueued(&admitted.level, &admitted.schema, queue_len);
                }
                let limit = match deadline {
                    Some(d) => (d.saturating_duration_since(now) / 4).min(MAX_WAIT_LIMIT),
                    None => DEFAULT_WAIT_LIMIT,
                };
                let mut ticket = WaitTicket {
                    apf: self,
                    level: admitted.level.clone(),
                    schema: admitted.schema.clone(),
                    queue,
                    id,
                    work,
                    rx: Some(rx),
                    armed: true,
                };
                let outcome = ticket.wait(now + limit, cancel).await;
                let waited = Instant::now().saturating_duration_since(arrive);
                match outcome {
                    Ok(dispatched_at) => {
                        self.count_flow(&admitted.level, &admitted.schema, |c| c.dispatched += 1);
                        if let Some(o) = &observer {
                            o.wait_finished(&admitted.level, &admitted.schema, waited, true);
                        }
                        let exec = Execution {
                            queue: Some(queue),
                            work,
                            dispatched_at,
                        };
                        Ok(SeatGuard::new(
                            self.clone(),
                            admitted,
                            exec,
                            false,
                            true,
                            digest.verb == "watch",
                        ))
                    }
                    Err((reason, retry)) => {
                        self.count_flow(&admitted.level, &admitted.schema, |c| {
                            c.rejected[reason.index()] += 1
                        });
                        if let Some(o) = &observer {
                            o.rejected(&admitted.level, &admitted.schema, reason);
                            o.wait_finished(&admitted.level, &admitted.schema, waited, false);
                        }
                        Err(self.rejected(&admitted, reason, retry))
                    }
                }
            }
        }
    }

    fn rejected(&self, a: &Admitted, reason: RejectReason, retry_after_secs: u64) -> Rejected {
        Rejected {
            reason,
            retry_after_secs,
            flow_schema: a.schema.to_string(),
            flow_schema_uid: a.schema_uid.to_string(),
            priority_level: a.level.to_string(),
            priority_level_uid: a.level_uid.to_string(),
        }
    }

    fn decide(
        &self,
        digest: &RequestDigest,
        inputs: &EstimateInputs,
        now: Instant,
    ) -> (Admitted, WorkEstimate, Decision) {
        let secs = self.seconds(now);
        let mut guard = self.lock();
        let st = &mut *guard;
        let class = match st.classifier.classify(digest) {
            Some(c) => c,
            // Only a request without the usual authenticated/unauthenticated
            // group misses the mandatory catch-all; treat it as catch-all traffic.
            None => Classification {
                flow_schema: Arc::new(bootstrap::catch_all_flow_schema()),
                priority_level: Arc::from(CATCH_ALL),
                distinguisher: digest.user.clone(),
                flow_hash: 0,
            },
        };
        let schema: Arc<str> = Arc::from(class.flow_schema.metadata.name.as_str());
        let schema_uid = st
            .schema_uids
            .get(schema.as_ref())
            .cloned()
            .unwrap_or_else(|| uid_or_stable(&class.flow_schema.metadata, "flowschemas"));
        let level_name = if st.levels.contains_key(&class.priority_level) {
            class.priority_level.clone()
        } else {
            Arc::from(CATCH_ALL)
        };
        let next_id = st.next_id;
        st.next_id += 1;
        let Some(level) = st.levels.get_mut(&level_name) else {
            // No catch-all level either: cannot happen, mandatory levels are
            // always configured. Reject rather than panic.
            let admitted = Admitted {
                level: level_name.clone(),
                level_uid: Arc::from(""),
                schema,
                schema_uid,
            };
            return (
                admitted,
                WorkEstimate::default(),
                Decision::Reject(RejectReason::ConcurrencyLimit, 1),
            );
        };
        let admitted = Admitted {
            level: level.name.clone(),
            level_uid: level.uid.clone(),
            schema: schema.clone(),
            schema_uid,
        };
        let flow_key = (level.name.clone(), schema.clone());
        let work = if level.exempt {
            WorkEstimate::default()
        } else {
            estimator::estimate(inputs, level.max_seats)
        };
        level.qs.sync_time(now);

        let decision = if digest.is_long_running_non_watch {
            // Not gated, not counted: only classified for the headers.
            Decision::Run {
                exec: Execution {
                    queue: None,
                    work,
                    dispatched_at: now,
                },
                exempt: true,
                gated: false,
            }
        } else if level.exempt {
            level.qs.start_unbounded(&work);
            level.note_demand(now);
            Decision::Run {
                exec: Execution {
                    queue: None,
                    work,
                    dispatched_at: now,
                },
                exempt: true,
                gated: true,
            }
        } else if !level.qs.has_queues() {
            if level.qs.try_start_now(None, &work) {
                level.note_demand(now);
                Decision::Run {
                    exec: Execution {
                        queue: None,
                        work,
                        dispatched_at: now,
                    },
                    exempt: false,
                    gated: true,
                }
            } else {
                level.qs.record_rejection();
                Decision::Reject(
                    RejectReason::ConcurrencyLimit,
                    level.retry.record_drop(secs),
                )
            }
        } else {
            let q = level.qs.choose_queue(class.flow_hash).unwrap_or(0);
            if level.qs.try_start_now(Some(q), &work) {
                level.note_demand(now);
                Decision::Run {
                    exec: Execution {
                        queue: Some(q),
                        work,
                        dispatched_at: now,
                    },
                    exempt: false,
                    gated: true,
                }
            } else if level.qs.is_queue_full(q, work.max_seats()) {
                level.qs.record_rejection();
                Decision::Reject(RejectReason::QueueFull, level.retry.record_drop(secs))
            } else {
                let (tx, rx) = oneshot::channel();
                let req = WaitingRequest {
                    id: next_id,
                    work,
                    arrive: now,
                    arrive_wall: self.wall(now),
                    arrival_r: 0.0,
                    flow_schema: schema.clone(),
                    distinguisher: class.distinguisher.clone(),
                    digest: Arc::new(digest.clone()),
                    wake: tx,
                };
                let queue_len = level.qs.enqueue(q, req);
                level.qs.dispatch(now);
                level.note_demand(now);
                Decision::Wait {
                    queue: q,
                    id: next_id,
                    rx,
                    arrive: now,
                    queue_len,
                }
            }
        };
        let counters = st.flows.entry(flow_key).or_insert_with(|| FlowCounters {
            priority_level: admitted.level.to_string(),
            flow_schema: admitted.schema.to_string(),
            ..Default::default()
        });
        match &decision {
            Decision::Run { gated: true, .. } => counters.dispatched += 1,
            Decision::Run { .. } => {}
            Decision::Reject(r, _) => counters.rejected[r.index()] += 1,
            Decision::Wait { .. } => {}
        }
        (admitted, work, decision)
    }

    /// Runs `f` on a level and then dispatches what fits and drops the level
    /// if it is quiescing and drained.
    fn with_level(&self, name: &str, now: Instant, f: impl FnOnce(&mut Level)) {
        let mut st = self.lock();
        let Some(level) = st.levels.get_mut(name) else {
            return;
        };
        level.qs.sync_time(now);
        f(level);
        level.qs.dispatch(now);
        level.note_demand(now);
        if level.quiescing && level.is_drained() {
            st.levels.remove(name);
        }
    }

    fn count_flow(&self, level: &Arc<str>, schema: &Arc<str>, f: impl FnOnce(&mut FlowCounters)) {
        let mut st = self.lock();
        if let Some(c) = st.flows.get_mut(&(level.clone(), schema.clone())) {
            f(c);
        }
    }

    fn finish(self: &Arc<Self>, level: &Arc<str>, exec: &Execution, exempt: bool) {
        let now = Instant::now();
        let mut hold = None;
        self.with_level(level, now, |l| {
            if exempt {
                l.qs.finish_unbounded(&exec.work);
            } else {
                hold = l.qs.finish(now, exec);
            }
        });
        if let Some((seats, latency)) = hold {
            let queue = exec.queue;
            let weak: Weak<Apf> = Arc::downgrade(self);
            let level = level.clone();
            let release = move || {
                if let Some(apf) = weak.upgrade() {
                    apf.with_level(&level, Instant::now(), |l| l.qs.release_held(queue, seats));
                }
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(async move {
                        tokio::time::sleep(latency).await;
                        release();
                    });
                }
                Err(_) => release(),
            }
        }
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

    /// Counters and gauges for `apiserver_flowcontrol_*`.
    pub fn snapshot(&self) -> ApfSnapshot {
        let now = Instant::now();
        let secs = self.seconds(now);
        let mut st = self.lock();
        let server_cl = st.server_cl;
        let levels = st
            .levels
            .values_mut()
            .map(|l| LevelSnapshot {
                name: l.name.to_string(),
                uid: l.uid.to_string(),
                exempt: l.exempt,
                quiescing: l.quiescing,
                nominal_limit_seats: l.limits.nominal,
                lendable_seats: l.limits.lendable,
                lower_limit_seats: l.limits.min,
                upper_limit_seats: l.limits.max,
                current_limit_seats: l.qs.concurrency_limit(),
                max_seats_per_request: l.max_seats,
                waiting_requests: l.qs.waiting,
                executing_requests: l.qs.executing,
                executing_seats: l.qs.seats_in_use,
                demand_seats: l.qs.seat_demand(),
                smoothed_demand_seats: l.smoothed,
                target_seats: l.target,
                dispatched: l.qs.counters.dispatched,
                rejected: l.qs.counters.rejected,
                timed_out: l.qs.counters.timed_out,
                cancelled: l.qs.counters.cancelled,
                retry_after_secs: l.retry.get(secs),
            })
            .collect();
        let mut flows: Vec<FlowCounters> = st.flows.values().cloned().collect();
        flows.sort_by(|a, b| {
            (&a.priority_level, &a.flow_schema).cmp(&(&b.priority_level, &b.flow_schema))
        });
        ApfSnapshot {
            server_concurrency_limit: server_cl,
            levels,
            flows,
        }
    }

    /// `/debug/api_priority_and_fairness/dump_priority_levels`.
    pub fn dump_priority_levels(&self) -> String {
        let st = self.lock();
        let mut lines = vec![dump::row(&dump::PRIORITY_LEVEL_HEADERS)];
        for l in st.levels.values() {
            let active =
                l.qs.queues()
                    .iter()
                    .filter(|q| !q.waiting.is_empty())
                    .count();
            let c = l.qs.counters;
            lines.push(dump::row(&[
                l.name.to_string(),
                active.to_string(),
                l.qs.is_idle().to_string(),
                l.quiescing.to_string(),
                l.qs.waiting.to_string(),
                l.qs.executing.to_string(),
                c.dispatched.to_string(),
                c.rejected.to_string(),
                c.timed_out.to_string(),
                c.cancelled.to_string(),
            ]));
        }
        dump::tabwrite(&lines)
    }

    /// `/debug/api_priority_and_fairness/dump_queues`. Levels without queues
    /// (exempt, Reject) show one row of `<none>`.
    pub fn dump_queues(&self) -> String {
        let st = self.lock();
        let mut lines = vec![dump::row(&dump::QUEUE_HEADERS)];
        for l in st.levels.values() {
            if l.qs.queues().is_empty() {
                let mut cells = vec![l.name.to_string()];
                cells.extend(std::iter::repeat_n("<none>".to_string(), 8));
                lines.push(dump::row(&cells));
                continue;
            }
            for (i, q) in l.qs.queues().iter().enumerate() {
                lines.push(dump::row(&[
                    l.name.to_string(),
                    i.to_string(),
                    q.waiting.len().to_string(),
                    q.executing.to_string(),
                    q.seats_in_use.to_string(),
                    dump::seat_seconds(q.next_dispatch_r),
                    q.initial_seats_sum.to_string(),
                    q.max_seats_sum.to_string(),
                    dump::seat_seconds(q.total_work_sum),
                ]));
            }
        }
        dump::tabwrite(&lines)
    }

    /// `/debug/api_priority_and_fairness/dump_requests[?includeRequestDetails=1]`:
    /// one row per waiting request; StartTime is `<none>` because a waiting
    /// request has not started.
    pub fn dump_requests(&self, include_details: bool) -> String {
        let st = self.lock();
        let mut header: Vec<&str> = dump::REQUEST_HEADERS.to_vec();
        if include_details {
            header.extend(dump::REQUEST_DETAIL_HEADERS);
        }
        let mut lines = vec![dump::row(&header)];
        for l in st.levels.values() {
            for (qi, q) in l.qs.queues().iter().enumerate() {
                for (ri, r) in q.waiting.iter().enumerate() {
                    let mut cells = vec![
                        l.name.to_string(),
                        r.flow_schema.to_string(),
                        qi.to_string(),
                        ri.to_string(),
                        r.distinguisher.clone(),
                        dump::rfc3339_nano(r.arrive_wall),
                        r.work.initial_seats.to_string(),
                        r.work.final_seats.to_string(),
                        dump::go_duration(r.work.additional_latency),
                        "<none>".to_string(),
                    ];
                    if include_details {
                        let d = &r.digest;
                        let gv = if d.api_group.is_empty() {
                            d.api_version.clone()
                        } else {
                            format!("{}/{}", d.api_group, d.api_version)
                        };
                        cells.extend([
                            d.user.clone(),
                            d.verb.clone(),
                            d.path.clone(),
                            d.namespace.clone(),
                            d.name.clone(),
                            gv,
                            d.resource.clone(),
                            d.subresource.clone(),
                        ]);
                    }
                    lines.push(dump::row(&cells));
                }
            }
        }
        dump::tabwrite(&lines)
    }
}

/// A request in a queue; dropping it withdraws the request (or returns the
/// seats if it was dispatched in the meantime).
struct WaitTicket<'a> {
    apf: &'a Arc<Apf>,
    level: Arc<str>,
    schema: Arc<str>,
    queue: usize,
    id: u64,
    work: WorkEstimate,
    rx: Option<oneshot::Receiver<Instant>>,
    armed: bool,
}

impl WaitTicket<'_> {
    async fn wait<C: Future<Output = ()>>(
        &mut self,
        until: Instant,
        cancel: C,
    ) -> Result<Instant, (RejectReason, u64)> {
        let Some(mut rx) = self.rx.take() else {
            return Err((RejectReason::Cancelled, 1));
        };
        tokio::pin!(cancel);
        let reason = tokio::select! {
            biased;
            r = &mut rx => {
                self.armed = false;
                return r.map_err(|_| (RejectReason::Cancelled, 1));
            }
            _ = tokio::time::sleep_until(until) => RejectReason::TimeOut,
            _ = &mut cancel => RejectReason::Cancelled,
        };
        self.armed = false;
        let now = Instant::now();
        let secs = self.apf.seconds(now);
        let mut st = self.apf.lock();
        let removed = st.levels.get_mut(&self.level).map(|l| {
            l.qs.sync_time(now);
            let removed = l.qs.remove_waiting(self.queue, self.id, reason);
            let retry = if removed {
                l.retry.record_drop(secs)
            } else {
                0
            };
            l.note_demand(now);
            (removed, retry)
        });
        match removed {
            Some((true, retry)) => {
                drop(st);
                Err((reason, retry))
            }
            _ => {
                drop(st);
                // Dispatched while we were giving up: the seat is ours.
                rx.try_recv().map_err(|_| (reason, 1))
            }
        }
    }
}

impl Drop for WaitTicket<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let now = Instant::now();
        let mut dispatched = None;
        {
            let mut st = self.apf.lock();
            if let Some(l) = st.levels.get_mut(&self.level) {
                l.qs.sync_time(now);
                if !l
                    .qs
                    .remove_waiting(self.queue, self.id, RejectReason::Cancelled)
                {
                    dispatched = self.rx.as_mut().and_then(|rx| rx.try_recv().ok());
                }
                l.note_demand(now);
            }
        }
        if let Some(at) = dispatched {
            // Dispatched but nobody will run it: give the seats back.
            let exec = Execution {
                queue: Some(self.queue),
                work: self.work,
                dispatched_at: at,
            };
            self.apf.finish(&self.level, &exec, false);
        } else {
            self.apf.count_flow(&self.level, &self.schema, |c| {
                c.rejected[RejectReason::Cancelled.index()] += 1
            });
        }
    }
}

/// Holds a request's seats; release with [`SeatGuard::finish`] (dropping it
/// also releases).
pub struct SeatGuard {
    apf: Arc<Apf>,
    admitted: Admitted,
    exec: Execution,
    exempt: bool,
    /// False for long-running requests that bypass APF: nothing to release.
    gated: bool,
    watch: bool,
    finished: bool,
}

impl std::fmt::Debug for SeatGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeatGuard")
            .field("priority_level", &self.admitted.level)
            .field("flow_schema", &self.admitted.schema)
            .field("work", &self.exec.work)
            .finish()
    }
}

impl SeatGuard {
    fn new(
        apf: Arc<Apf>,
        admitted: Admitted,
        exec: Execution,
        exempt: bool,
        gated: bool,
        watch: bool,
    ) -> Self {
        SeatGuard {
            apf,
            admitted,
            exec,
            exempt,
            gated,
            watch,
            finished: false,
        }
    }

    /// Value of `X-Kubernetes-PF-FlowSchema-UID`.
    pub fn flow_schema_uid(&self) -> &str {
        &self.admitted.schema_uid
    }

    /// Value of `X-Kubernetes-PF-PriorityLevel-UID`.
    pub fn priority_level_uid(&self) -> &str {
        &self.admitted.level_uid
    }

    pub fn flow_schema_name(&self) -> &str {
        &self.admitted.schema
    }

    pub fn priority_level_name(&self) -> &str {
        &self.admitted.level
    }

    pub fn work_estimate(&self) -> WorkEstimate {
        self.exec.work
    }

    /// The request is done: release its seats (final seats after their latency).
    pub fn finish(mut self) {
        self.release();
    }

    /// For a watch: the initial events have been sent; it stops holding seats.
    pub fn release_initial_seats(mut self) {
        self.release();
    }

    fn release(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        if !self.gated {
            return;
        }
        let took = Instant::now().saturating_duration_since(self.exec.dispatched_at);
        self.apf
            .finish(&self.admitted.level, &self.exec, self.exempt);
        if let Some(o) = self.apf.observer() {
            o.execution_finished(
                &self.admitted.level,
                &self.admitted.schema,
                if self.watch { "watch" } else { "regular" },
                took,
            );
        }
    }
}

impl Drop for SeatGuard {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::super::bootstrap;
    use super::*;
    use std::future::pending;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn user(name: &str) -> RequestDigest {
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

    fn level(
        name: &str,
        shares: i32,
        queuing: Option<(i32, i32, i32)>,
    ) -> PriorityLevelConfiguration {
        PriorityLevelConfiguration {
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec: PriorityLevelConfigurationSpec {
                type_: TYPE_LIMITED.into(),
                limited: Some(LimitedPriorityLevelConfiguration {
                    nominal_concurrency_shares: Some(shares),
                    lendable_percent: Some(0),
                    borrowing_limit_percent: Some(0),
                    limit_response: LimitResponse {
                        type_: if queuing.is_some() {
                            LIMIT_RESPONSE_QUEUE
                        } else {
                            LIMIT_RESPONSE_REJECT
                        }
                        .into(),
                        queuing: queuing.map(|(queues, hand_size, queue_length_limit)| {
                            QueuingConfiguration {
                                queues,
                                hand_size,
                                queue_length_limit,
                            }
                        }),
                    },
                }),
                exempt: None,
            },
            status: None,
        }
    }

    /// ServerCL 4 split so that "test" gets exactly `seats` seats and
    /// everyone (system:authenticated) lands there.
    fn apf_with(level_cfg: PriorityLevelConfiguration) -> Arc<Apf> {
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
        let snap = apf.snapshot();
        let gd = snap
            .levels
            .iter()
            .find(|l| l.name == "global-default")
            .unwrap();
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
    async fn reject_level_with_zero_seats_rejects_even_when_idle() {
        let apf = Apf::new(ServerConfig::default());
        let mut zero = level("nothing", 0, None);
        zero.spec.limited.as_mut().unwrap().borrowing_limit_percent = Some(0);
        let fs = bootstrap::global_default_like("to-nothing", 50, "nothing");
        let mut levels = bootstrap::all_priority_levels();
        levels.push(zero);
        let mut schemas = bootstrap::all_flow_schemas();
        schemas.push(fs);
        apf.replace_config(schemas, levels);
        let err = apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::ConcurrencyLimit);
        assert_eq!(err.priority_level, "nothing");
        assert_eq!(err.retry_after_secs, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_limit_rejection_on_full_reject_level() {
        let apf = apf_with(level("test", 1, None));
        let mut guards = Vec::new();
        for _ in 0..4 {
            guards.push(
                apf.admit(&user("a"), EstimateInputs::Simple, None, pending())
                    .await
                    .unwrap(),
            );
        }
        let err = apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::ConcurrencyLimit);
        drop(guards.pop());
        assert!(apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .is_ok());
        let snap = apf.snapshot();
        let flow = snap.flows.iter().find(|f| f.flow_schema == "test").unwrap();
        assert_eq!(flow.dispatched, 5);
        assert_eq!(flow.rejected[RejectReason::ConcurrencyLimit.index()], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn queue_full_rejection() {
        // One queue of length 1, 4 seats.
        let apf = apf_with(level("test", 1, Some((1, 1, 1))));
        let mut guards = Vec::new();
        for _ in 0..4 {
            guards.push(
                apf.admit(&user("a"), EstimateInputs::Simple, None, pending())
                    .await
                    .unwrap(),
            );
        }
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("b"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        let err = apf
            .admit(&user("c"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::QueueFull);
        // Finishing one request dispatches the waiter.
        guards.pop().unwrap().finish();
        let g = waiter.await.unwrap().unwrap();
        assert_eq!(g.priority_level_name(), "test");
    }

    #[tokio::test(start_paused = true)]
    async fn time_out_at_wait_limit() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let _held: Vec<_> = futures_join(&apf, 4).await;
        let start = Instant::now();
        // Deadline 40 s away → wait limit 10 s.
        let err = apf
            .admit(
                &user("a"),
                EstimateInputs::Simple,
                Some(start + Duration::from_secs(40)),
                pending(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::TimeOut);
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
        // No deadline → 15 s.
        let start = Instant::now();
        let err = apf
            .admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::TimeOut);
        assert_eq!(Instant::now() - start, DEFAULT_WAIT_LIMIT);
        // Far deadline → capped at 60 s.
        let start = Instant::now();
        let err = apf
            .admit(
                &user("a"),
                EstimateInputs::Simple,
                Some(start + Duration::from_secs(3600)),
                pending(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.reason, RejectReason::TimeOut);
        assert_eq!(Instant::now() - start, MAX_WAIT_LIMIT);
        let snap = apf.snapshot();
        let l = snap.levels.iter().find(|l| l.name == "test").unwrap();
        assert_eq!((l.timed_out, l.waiting_requests), (3, 0));
    }

    async fn futures_join(apf: &Arc<Apf>, n: usize) -> Vec<SeatGuard> {
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

    #[tokio::test(start_paused = true)]
    async fn cancelled_by_client_and_by_dropping_the_future() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let held = futures_join(&apf, 4).await;
        let (tx, rx) = oneshot::channel::<()>();
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("a"), EstimateInputs::Simple, None, async {
                let _ = rx.await;
            })
            .await
        });
        tokio::task::yield_now().await;
        assert_eq!(
            apf.snapshot()
                .levels
                .iter()
                .find(|l| l.name == "test")
                .unwrap()
                .waiting_requests,
            1
        );
        tx.send(()).unwrap();
        assert_eq!(
            waiter.await.unwrap().unwrap_err().reason,
            RejectReason::Cancelled
        );
        // Dropping a waiting admit future withdraws the request.
        let apf3 = apf.clone();
        let aborted = tokio::spawn(async move {
            apf3.admit(&user("b"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        aborted.abort();
        let _ = aborted.await;
        let l = apf
            .snapshot()
            .levels
            .into_iter()
            .find(|l| l.name == "test")
            .unwrap();
        assert_eq!((l.waiting_requests, l.cancelled), (0, 2));
        drop(held);
        let l = apf
            .snapshot()
            .levels
            .into_iter()
            .find(|l| l.name == "test")
            .unwrap();
        assert_eq!((l.executing_requests, l.executing_seats), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_grows_under_rejections() {
        let apf = apf_with(level("test", 0, None));
        let mut last = 0;
        for _ in 0..3 {
            last = apf
                .admit(&user("a"), EstimateInputs::Simple, None, pending())
                .await
                .unwrap_err()
                .retry_after_secs;
        }
        assert_eq!(last, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn final_seats_held_after_finish() {
        let apf = apf_with(level("test", 1, Some((1, 1, 10))));
        let g = apf
            .admit(
                &user("a"),
                EstimateInputs::Mutating { watchers: 20 },
                None,
                pending(),
            )
            .await
            .unwrap();
        assert_eq!(
            g.work_estimate(),
            WorkEstimate {
                initial_seats: 1,
                final_seats: 1,
                additional_latency: Duration::from_millis(10)
            }
        );
        g.finish();
        let seats = |apf: &Apf| {
            apf.snapshot()
                .levels
                .into_iter()
                .find(|l| l.name == "test")
                .unwrap()
                .executing_seats
        };
        assert_eq!(seats(&apf), 1);
        tokio::time::sleep(Duration::from_millis(11)).await;
        assert_eq!(seats(&apf), 0);
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
        let snap = apf.snapshot();
        let gd = snap
            .levels
            .iter()
            .find(|l| l.name == "global-default")
            .unwrap();
        let wl = snap
            .levels
            .iter()
            .find(|l| l.name == "workload-low")
            .unwrap();
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

    #[tokio::test(start_paused = true)]
    async fn dumps_have_kube_columns() {
        let apf = apf_with(level("test", 1, Some((2, 1, 10))));
        let _held = futures_join(&apf, 4).await;
        let apf2 = apf.clone();
        let waiter = tokio::spawn(async move {
            apf2.admit(&user("w"), EstimateInputs::Simple, None, pending())
                .await
        });
        tokio::task::yield_now().await;
        let levels = apf.dump_priority_levels();
        let first = levels.lines().next().unwrap();
        assert!(
            first.starts_with(
                "PriorityLevelName, ActiveQueues, IsIdle, IsQuiescing, WaitingRequests,"
            ),
            "{first}"
        );
        assert!(
            levels
                .lines()
                .any(|l| l.starts_with("test,") && l.split(",").nth(4).unwrap().trim() == "1"),
            "{levels}"
        );
        let queues = apf.dump_queues();
        assert!(queues.starts_with("PriorityLevelName, Index,  PendingRequests, ExecutingRequests, SeatsInUse, NextDispatchR,"), "{queues}");
        assert!(queues
            .lines()
            .any(|l| l.starts_with("exempt,") && l.contains("<none>")));
        let reqs = apf.dump_requests(false);
        let lines: Vec<&str> = reqs.lines().collect();
        assert_eq!(lines.len(), 2, "{reqs}");
        assert!(lines[0].ends_with("AdditionalLatency, StartTime"), "{reqs}");
        let cells: Vec<&str> = lines[1].split(",\t").collect();
        let cells: Vec<&str> = if cells.len() > 1 {
            cells
        } else {
            lines[1].split(',').map(str::trim).collect()
        };
        assert_eq!(&cells[..5], &["test", "test", "0", "0", "w"], "{reqs}");
        assert_eq!(&cells[6..], &["1", "0", "0s", "<none>"], "{reqs}");
        let detailed = apf.dump_requests(true);
        assert!(
            detailed
                .lines()
                .next()
                .unwrap()
                .ends_with("APIVersion, Resource, SubResource"),
            "{detailed}"
        );
        assert!(detailed
            .lines()
            .nth(1)
            .unwrap()
            .contains("/api/v1/namespaces/default/pods/p"));
        waiter.abort();
    }

    struct CountingObserver(AtomicUsize, AtomicUsize);
    impl ApfObserver for CountingObserver {
        fn wait_finished(&self, _: &str, _: &str, _: Duration, executed: bool) {
            if executed {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        fn execution_finished(&self, _: &str, _: &str, _: &str, _: Duration) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn observer_hooks_and_long_running_bypass() {
        let apf = Apf::new(ServerConfig::default());
        let obs = Arc::new(CountingObserver(AtomicUsize::new(0), AtomicUsize::new(0)));
        apf.set_observer(obs.clone());
        apf.admit(&user("a"), EstimateInputs::Simple, None, pending())
            .await
            .unwrap()
            .finish();
        let exec = RequestDigest {
            is_long_running_non_watch: true,
            subresource: "exec".into(),
            ..user("a")
        };
        let g = apf
            .admit(&exec, EstimateInputs::Simple, None, pending())
            .await
            .unwrap();
        assert_eq!(g.priority_level_name(), "global-default");
        let gd = |apf: &Apf| {
            apf.snapshot()
                .levels
                .into_iter()
                .find(|l| l.name == "global-default")
                .unwrap()
        };
        assert_eq!(gd(&apf).executing_requests, 0);
        g.finish();
        assert_eq!(gd(&apf).dispatched, 1);
        assert_eq!(obs.0.load(Ordering::Relaxed), 1);
        assert_eq!(obs.1.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fast_path_is_cheap() {
        // Not a benchmark: guards against accidental O(queues) or allocation
        // blowups on the idle path by bounding the virtual-time-free cost
        // loosely (the paused clock does not move).
        let apf = Apf::new(ServerConfig::default());
        let d = user("alice");
        let started = std::time::Instant::now();
        for _ in 0..10_000 {
            apf.admit(&d, EstimateInputs::Simple, None, pending())
                .await
                .unwrap()
                .finish();
        }
        let per = started.elapsed() / 10_000;
        eprintln!("idle classify+admit+finish: {per:?} per request");
        assert!(per < Duration::from_millis(1), "{per:?} per request");
    }
}
