//! API Priority and Fairness (`crate::flowcontrol`): the request is
//! classified by FlowSchema, its width estimated from the watch cache's live
//! figures, and it waits for seats in its priority level (429 when
//! rejected). Seats are held until the response body has been sent (a
//! streamed LIST keeps working after its handler returns) and never past the
//! request deadline: a client still not reading its response then loses its
//! connection ([`crate::server::conn::ConnectionControl`]), whatever its TCP
//! or HTTP/2 window says. A watch gives its seats back once its initial
//! events are out.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;
use http::StatusCode;

use super::deadline::RequestDeadline;
use super::set_header;
use crate::api::request::{RequestInfo, Route, Verb};
use crate::api::watch::InitialEventsSent;
use crate::auth::Identity;
use crate::flowcontrol::{Apf, EstimateInputs, RequestDigest, SeatGuard, TOO_MANY_REQUESTS_BODY};
use crate::registry::Registry;
use crate::server::conn::ConnectionControl;

pub struct Priority {
    pub apf: Arc<Apf>,
    pub registry: Arc<Registry>,
    /// Deadlines of the responses still holding seats.
    pub watchdog: Watchdog,
}

/// The classifier's view of a request.
pub fn digest(info: &RequestInfo, method: &http::Method, user: &Identity) -> RequestDigest {
    let a = info.attributes(method);
    RequestDigest {
        user: user.user.clone(),
        groups: user.groups.clone(),
        is_resource: a.is_resource,
        verb: a.verb,
        api_group: a.group,
        api_version: a.version,
        resource: a.resource,
        subresource: a.subresource,
        namespace: a.namespace,
        name: a.name,
        path: a.path,
        is_long_running_non_watch: info.route.is_long_running_non_watch(),
    }
}

/// What a request will cost, from the watch cache's live figures.
fn estimate(registry: &Registry, info: &RequestInfo) -> EstimateInputs {
    let Route::Resource(r) = &info.route else {
        return EstimateInputs::Simple;
    };
    let resource = format!("{}/{}", r.group, r.resource);
    match r.verb {
        Some(Verb::List) | Some(Verb::Watch) if r.name.is_none() => {
            let (count, avg) = registry.list_cost(&resource);
            EstimateInputs::List {
                object_count: count as u64,
                avg_object_size: avg,
                from_watch_cache: true,
            }
        }
        Some(Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection) => {
            EstimateInputs::Mutating {
                watchers: registry.watchers_of(&resource) as u32,
            }
        }
        _ => EstimateInputs::Simple,
    }
}

/// kube's 429 from flow control, with its headers.
fn rejected(r: &crate::flowcontrol::Rejected) -> Response {
    let mut resp = Response::new(axum::body::Body::from(format!(
        "{TOO_MANY_REQUESTS_BODY}\n"
    )));
    *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    set_header(&mut resp, "content-type", "text/plain; charset=utf-8");
    set_header(&mut resp, "x-content-type-options", "nosniff");
    set_header(&mut resp, "retry-after", &r.retry_after_secs.to_string());
    set_header(
        &mut resp,
        "x-kubernetes-pf-flowschema-uid",
        &r.flow_schema_uid,
    );
    set_header(
        &mut resp,
        "x-kubernetes-pf-prioritylevel-uid",
        &r.priority_level_uid,
    );
    resp
}

pub async fn priority_layer<F, Fut>(p: &Priority, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let info = super::info(&req);
    let digest = digest(&info, req.method(), &super::acting_user_ref(&req));
    let deadline = req.extensions().get::<RequestDeadline>().map(|d| d.0);
    let recording = req
        .extensions()
        .get::<Arc<crate::audit::Recording>>()
        .cloned();
    let queued = Instant::now();
    // Classification and the wait for seats (kube's filter span name).
    let step = crate::traces::Span::child("priorityandfairness");
    // A client that goes away drops this future, which withdraws a queued request.
    let admitted = p
        .apf
        .admit(
            &digest,
            estimate(&p.registry, &info),
            deadline,
            std::future::pending::<()>(),
        )
        .await;
    if let Some(rec) = &recording {
        rec.annotate(
            "apiserver.latency.k8s.io/apf-queue-wait",
            format!("{:?}", queued.elapsed()),
        );
        if let Ok(seats) = &admitted {
            rec.annotate(
                "flowcontrol.kshard.dev/priority-level-uid",
                seats.priority_level_uid(),
            );
            rec.annotate(
                "flowcontrol.kshard.dev/flow-schema-uid",
                seats.flow_schema_uid(),
            );
        }
    }
    if let Some(step) = &step {
        use opentelemetry::KeyValue;
        step.set_attribute(KeyValue::new(
            "queue-wait",
            format!("{:?}", queued.elapsed()),
        ));
        match &admitted {
            Ok(seats) => {
                step.set_attribute(KeyValue::new(
                    "flow-schema-uid",
                    seats.flow_schema_uid().to_string(),
                ));
                step.set_attribute(KeyValue::new(
                    "priority-level-uid",
                    seats.priority_level_uid().to_string(),
                ));
            }
            Err(r) => step.fail(format!(
                "rejected by priority level {}",
                r.priority_level_uid
            )),
        }
    }
    drop(step);
    let seats = match admitted {
        Ok(s) => s,
        Err(r) => return rejected(&r),
    };
    let fs = seats.flow_schema_uid().to_string();
    let pl = seats.priority_level_uid().to_string();
    let mut resp = if info.route.is_watch() {
        // A watch holds its seats only until its initial events are out.
        req.extensions_mut().insert(InitialEventsSent::new(move || {
            seats.release_initial_seats()
        }));
        next(req).await
    } else {
        let connection = req.extensions().get::<ConnectionControl>().cloned();
        let held = Arc::new(Mutex::new(Some(seats)));
        let resp = next(req).await;
        let (parts, body) = resp.into_parts();
        Response::from_parts(
            parts,
            axum::body::Body::new(FinishOnEnd::new(
                body,
                held,
                deadline.map(|d| (&p.watchdog, d)),
                connection,
            )),
        )
    };
    set_header(&mut resp, "x-kubernetes-pf-flowschema-uid", &fs);
    set_header(&mut resp, "x-kubernetes-pf-prioritylevel-uid", &pl);
    resp
}

type Held = Arc<Mutex<Option<SeatGuard>>>;

fn take(seats: &Held) -> Option<SeatGuard> {
    seats.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// One task that enforces the deadline of every response still holding
/// seats. A task and timer per request cost 1–2 % of a create's CPU; here a
/// response registers in a map under one lock and leaves it when sent.
#[derive(Clone, Default)]
pub struct Watchdog(Arc<WatchdogShared>);

#[derive(Default)]
struct WatchdogShared {
    due: Mutex<Due>,
    wake: tokio::sync::Notify,
}

type DueKey = (tokio::time::Instant, u64);

#[derive(Default)]
struct Due {
    entries: std::collections::BTreeMap<DueKey, (Held, Option<ConnectionControl>)>,
    next_id: u64,
    running: bool,
    /// When the task looks next (`None`: only when notified). A deadline
    /// after it needs no wake: deadlines mostly only grow, and a wake per
    /// request was a task wake (often a thread's) on every lone create.
    looks_at: Option<tokio::time::Instant>,
    /// How many times the task has looked (what the tests count wakes by).
    rounds: u64,
}

impl Watchdog {
    fn due(&self) -> std::sync::MutexGuard<'_, Due> {
        self.0.due.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn watch(
        &self,
        deadline: tokio::time::Instant,
        seats: Held,
        connection: Option<ConnectionControl>,
    ) -> DueKey {
        let mut due = self.due();
        let key = (deadline, due.next_id);
        due.next_id += 1;
        let sooner = due.looks_at.is_none_or(|at| deadline < at);
        due.entries.insert(key, (seats, connection));
        if !due.running {
            due.running = true;
            tokio::spawn(watch_deadlines(self.0.clone()));
        } else if sooner {
            // Set here so that a burst wakes the task once.
            due.looks_at = Some(deadline);
            self.0.wake.notify_one();
        }
        key
    }

    fn unwatch(&self, key: &DueKey) {
        self.due().entries.remove(key);
    }
}

async fn watch_deadlines(shared: Arc<WatchdogShared>) {
    loop {
        let mut expired = Vec::new();
        let next = {
            let mut due = shared.due.lock().unwrap_or_else(|p| p.into_inner());
            due.rounds += 1;
            let now = tokio::time::Instant::now();
            while let Some(entry) = due.entries.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                expired.push(entry.remove());
            }
            due.looks_at = due.entries.keys().next().map(|k| k.0);
            due.looks_at
        };
        for (seats, connection) in expired {
            if let Some(s) = take(&seats) {
                tracing::debug!(
                    "response unsent at the request deadline: seats returned, connection closed"
                );
                s.finish();
                if let Some(c) = connection {
                    c.close();
                }
            }
        }
        // A notification sent meanwhile is kept by `Notify`, not lost.
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// A response body that returns its request's seats when it has been sent
/// (or dropped, when the client goes away), or at the request deadline,
/// whichever comes first. At the deadline an unsent body also closes its
/// connection: hyper may not poll a body whose client keeps its window
/// shut, so the [`Watchdog`] does it.
struct FinishOnEnd {
    inner: axum::body::Body,
    seats: Held,
    watched: Option<(Watchdog, DueKey)>,
}

impl FinishOnEnd {
    fn new(
        inner: axum::body::Body,
        seats: Held,
        deadline: Option<(&Watchdog, tokio::time::Instant)>,
        connection: Option<ConnectionControl>,
    ) -> Self {
        let watched = deadline.map(|(watchdog, at)| {
            let key = watchdog.watch(at, seats.clone(), connection);
            (watchdog.clone(), key)
        });
        Self {
            inner,
            seats,
            watched,
        }
    }

    fn finish(&mut self) {
        if let Some((watchdog, key)) = self.watched.take() {
            watchdog.unwatch(&key);
        }
        if let Some(s) = take(&self.seats) {
            s.finish();
        }
    }
}

impl Drop for FinishOnEnd {
    fn drop(&mut self) {
        self.finish();
    }
}

impl http_body::Body for FinishOnEnd {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::flowcontrol::ServerConfig;

    async fn seats(apf: &Arc<Apf>) -> Held {
        let info = RequestInfo::parse(
            &http::Method::GET,
            &"/apis/demo.kshard.dev/v1/widgets".parse().expect("uri"),
        );
        let user = Identity {
            user: "alice".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        };
        let d = digest(&info, &http::Method::GET, &user);
        let guard = apf
            .admit(
                &d,
                EstimateInputs::Simple,
                None,
                std::future::pending::<()>(),
            )
            .await
            .expect("admitted");
        Arc::new(Mutex::new(Some(guard)))
    }

    fn holds(seats: &Held) -> bool {
        seats.lock().expect("lock").is_some()
    }

    /// One task serves every deadline: one registered later but due sooner
    /// still fires on time, and a response sent before its deadline leaves.
    #[tokio::test(start_paused = true)]
    async fn the_watchdog_returns_seats_at_each_deadline() {
        let apf = Apf::new(ServerConfig::default());
        let dog = Watchdog::default();
        let start = tokio::time::Instant::now();
        let far = seats(&apf).await;
        dog.watch(start + Duration::from_secs(60), far.clone(), None);
        // The task now sleeps until the far deadline.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let near = seats(&apf).await;
        dog.watch(start + Duration::from_secs(1), near.clone(), None);
        let sent = seats(&apf).await;
        let key = dog.watch(start + Duration::from_secs(2), sent.clone(), None);
        dog.unwatch(&key);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(!holds(&near), "the sooner deadline fired");
        assert!(holds(&far), "the far one has not yet");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(holds(&sent), "an unwatched response keeps its seats");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!holds(&far), "the far deadline fired");
        assert!(dog.due().entries.is_empty());
    }

    /// Requests one after another register ever later deadlines: the task,
    /// asleep until an earlier one, is not woken for each.
    #[tokio::test(start_paused = true)]
    async fn later_deadlines_do_not_wake_the_watchdog() {
        let apf = Apf::new(ServerConfig::default());
        let dog = Watchdog::default();
        let start = tokio::time::Instant::now();
        let first = seats(&apf).await;
        let key = dog.watch(start + Duration::from_secs(60), first, None);
        tokio::time::sleep(Duration::from_millis(10)).await;
        dog.unwatch(&key);
        let rounds = dog.due().rounds;
        let mut held = Vec::new();
        for i in 1..=20u64 {
            let s = seats(&apf).await;
            let key = dog.watch(start + Duration::from_secs(60 + i), s.clone(), None);
            tokio::time::sleep(Duration::from_millis(1)).await;
            dog.unwatch(&key);
            held.push(s);
        }
        assert_eq!(dog.due().rounds, rounds, "no wake for a later deadline");
        // A sooner one still wakes it, and fires on time.
        let soon = seats(&apf).await;
        dog.watch(start + Duration::from_secs(1), soon.clone(), None);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert!(!holds(&soon), "the sooner deadline fired");
        assert!(held.iter().all(holds), "the sent ones kept their seats");
    }
}
