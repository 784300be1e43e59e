//! `/livez`, `/readyz` and `/healthz` in kube's format (k8s.io/apiserver's
//! healthz): named checks, `ok` when all pass (the list with `?verbose`), on
//! failure the list with reasons withheld and HTTP 500; one check alone at
//! `/readyz/<name>`; `?exclude=<name>` skips a check. Checks that do I/O
//! (the store) run with a deadline, so a hung disk fails the check instead
//! of hanging the probe.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::response::Response;
use http::StatusCode;

use super::request::Health;
use super::response::bytes_response;
use crate::status::ApiError;

type CheckFuture = Pin<Box<dyn Future<Output = bool> + Send>>;
type Check = Arc<dyn Fn() -> CheckFuture + Send + Sync>;

/// How long one check may take before it counts as failed: kube's
/// `--etcd-readycheck-timeout` and `--etcd-healthcheck-timeout` (2 s), so
/// a hung store fails the probe well before the kubelet stops waiting for
/// an answer (the manifests' `timeoutSeconds`).
pub const CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// Which endpoints a check belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/readyz` only.
    Ready,
    /// `/livez`, `/healthz` and `/readyz` (a failed store means restart, too).
    Live,
}

/// The health checks; components add theirs as they start.
#[derive(Default)]
pub struct Readiness {
    checks: RwLock<Vec<(String, Probe, Check)>>,
    /// Informational lines for `/readyz?verbose` (not checks).
    info: RwLock<Vec<Info>>,
}

type Info = Arc<dyn Fn() -> String + Send + Sync>;

impl Readiness {
    /// A readiness check that answers at once from memory.
    pub fn add(&self, name: &str, check: impl Fn() -> bool + Send + Sync + 'static) {
        let check = Arc::new(check);
        self.add_async(name, Probe::Ready, move || {
            let ok = check();
            async move { ok }
        });
    }

    /// A check that does I/O; it fails if it takes longer than [`CHECK_DEADLINE`].
    pub fn add_async<F, Fut>(&self, name: &str, probe: Probe, check: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        let check: Check = Arc::new(move || Box::pin(check()));
        let mut checks = self.checks.write().unwrap_or_else(|e| e.into_inner());
        checks.push((name.to_string(), probe, check));
    }

    /// A line `/readyz?verbose` shows after the checks (e.g. the replica's role).
    pub fn add_info(&self, line: impl Fn() -> String + Send + Sync + 'static) {
        let mut info = self.info.write().unwrap_or_else(|e| e.into_inner());
        info.push(Arc::new(line));
    }

    fn info_lines(&self) -> String {
        let info = self.info.read().unwrap_or_else(|e| e.into_inner());
        // A source with nothing to say gives an empty line, which is left out.
        info.iter()
            .map(|f| f())
            .filter(|l| !l.is_empty())
            .map(|l| format!("info: {l}\n"))
            .collect()
    }

    /// The checks of one endpoint with their results, in the order they were added.
    pub async fn results(&self, which: Health) -> Vec<(String, bool)> {
        let checks: Vec<(String, Check)> = {
            let checks = self.checks.read().unwrap_or_else(|e| e.into_inner());
            checks
                .iter()
                .filter(|(_, p, _)| which == Health::Readyz || *p == Probe::Live)
                .map(|(n, _, c)| (n.clone(), c.clone()))
                .collect()
        };
        let runs = checks.into_iter().map(|(name, check)| async move {
            let ok = tokio::time::timeout(CHECK_DEADLINE, check())
                .await
                .unwrap_or(false);
            (name, ok)
        });
        futures::future::join_all(runs).await
    }

    pub async fn is_ready(&self) -> bool {
        self.results(Health::Readyz).await.iter().all(|(_, ok)| *ok)
    }
}

/// Answers `/<which>` or `/<which>/<check>`.
pub async fn respond(readiness: &Readiness, which: Health, path: &str, query: &str) -> Response {
    let name = match which {
        Health::Livez => "livez",
        Health::Healthz => "healthz",
        Health::Readyz => "readyz",
    };
    let mut results = vec![("ping".to_string(), true)];
    results.extend(readiness.results(which).await);
    let text = "text/plain; charset=utf-8";
    // `/readyz/<check>`: that check alone.
    let single = path
        .trim_matches('/')
        .strip_prefix(name)
        .map(|rest| rest.trim_start_matches('/'))
        .filter(|rest| !rest.is_empty());
    if let Some(check) = single {
        return match results.iter().find(|(n, _)| n == check) {
            Some((_, true)) => bytes_response(StatusCode::OK, text, "ok"),
            Some((_, false)) => bytes_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                text,
                "internal server error: reason withheld\n",
            ),
            None => super::response::error_response(&ApiError::not_found_path()),
        };
    }
    let excluded: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v.into_owned())
        .collect();
    let mut listing = String::new();
    let mut failed = false;
    for (check, ok) in &results {
        if excluded.iter().any(|e| e == check) {
            listing.push_str(&format!("[+]{check} excluded: ok\n"));
        } else if *ok {
            listing.push_str(&format!("[+]{check} ok\n"));
        } else {
            failed = true;
            listing.push_str(&format!("[-]{check} failed: reason withheld\n"));
        }
    }
    for e in excluded
        .iter()
        .filter(|e| !results.iter().any(|(n, _)| n == *e))
    {
        listing.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for \"{e}\"\n"
        ));
    }
    if which == Health::Readyz {
        listing.push_str(&readiness.info_lines());
    }
    if failed {
        return bytes_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            text,
            format!("{listing}{name} check failed\n"),
        );
    }
    let verbose = form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "verbose");
    if verbose {
        bytes_response(
            StatusCode::OK,
            text,
            format!("{listing}{name} check passed\n"),
        )
    } else {
        bytes_response(StatusCode::OK, text, "ok")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn text(r: Response) -> (u16, String) {
        let code = r.status().as_u16();
        let body = r.into_body().collect().await.expect("body").to_bytes();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn checks_endpoints_exclusion_and_deadlines() {
        let r = Readiness::default();
        r.add("informer-sync", || true);
        r.add_async("storage", Probe::Live, || async { false });
        r.add_async("slow", Probe::Ready, || async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            true
        });
        tokio::time::pause();
        let (code, body) = text(respond(&r, Health::Readyz, "/readyz", "verbose").await).await;
        assert_eq!(code, 500);
        assert_eq!(
            body,
            "[+]ping ok\n[+]informer-sync ok\n[-]storage failed: reason withheld\n[-]slow failed: reason withheld\nreadyz check failed\n"
        );
        // Liveness runs only the live checks.
        let (code, body) = text(respond(&r, Health::Livez, "/livez", "").await).await;
        assert_eq!(
            (code, body.as_str()),
            (
                500,
                "[+]ping ok\n[-]storage failed: reason withheld\nlivez check failed\n"
            )
        );
        let (code, body) = text(
            respond(
                &r,
                Health::Readyz,
                "/readyz",
                "exclude=storage&exclude=slow&exclude=nope",
            )
            .await,
        )
        .await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body, "ok");
        let (code, body) = text(
            respond(
                &r,
                Health::Readyz,
                "/readyz",
                "verbose&exclude=storage&exclude=slow",
            )
            .await,
        )
        .await;
        assert_eq!(code, 200);
        assert!(body.contains("[+]storage excluded: ok\n"), "{body}");
        assert_eq!(
            text(respond(&r, Health::Readyz, "/readyz/informer-sync", "").await).await,
            (200, "ok".into())
        );
        assert_eq!(
            text(respond(&r, Health::Readyz, "/readyz/storage", "").await)
                .await
                .0,
            500
        );
        assert_eq!(
            text(respond(&r, Health::Readyz, "/readyz/nope", "").await)
                .await
                .0,
            404
        );
    }

    #[tokio::test]
    async fn info_lines_follow_the_readyz_checks_only() {
        let r = Readiness::default();
        r.add("replica-caught-up", || true);
        r.add_info(|| "replica r1: follower; leader r0 (epoch 3)".to_string());
        let (code, body) = text(respond(&r, Health::Readyz, "/readyz", "verbose").await).await;
        assert_eq!(code, 200);
        assert_eq!(
            body,
            "[+]ping ok\n[+]replica-caught-up ok\ninfo: replica r1: follower; leader r0 (epoch 3)\nreadyz check passed\n"
        );
        assert_eq!(
            text(respond(&r, Health::Readyz, "/readyz", "").await).await,
            (200, "ok".into())
        );
        let (_, live) = text(respond(&r, Health::Livez, "/livez", "verbose").await).await;
        assert!(!live.contains("info:"), "{live}");
    }
}
