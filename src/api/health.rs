//! `/livez`, `/readyz` and `/healthz` in kube's format: named checks, `ok`
//! when all pass (the list with `?verbose`), and on failure the list with
//! reasons withheld and HTTP 500, as k8s.io/apiserver's healthz does.

use std::sync::{Arc, RwLock};

use axum::response::Response;
use http::StatusCode;

use super::request::Health;
use super::response::bytes_response;

type Check = Arc<dyn Fn() -> bool + Send + Sync>;

/// The readiness checks; components add theirs as they start.
#[derive(Default)]
pub struct Readiness {
    checks: RwLock<Vec<(String, Check)>>,
}

impl Readiness {
    pub fn add(&self, name: &str, check: impl Fn() -> bool + Send + Sync + 'static) {
        let mut checks = self.checks.write().unwrap_or_else(|e| e.into_inner());
        checks.push((name.to_string(), Arc::new(check)));
    }

    /// Every check with its result, in the order they were added.
    pub fn results(&self) -> Vec<(String, bool)> {
        let checks = self.checks.read().unwrap_or_else(|e| e.into_inner());
        checks.iter().map(|(n, c)| (n.clone(), c())).collect()
    }

    pub fn is_ready(&self) -> bool {
        self.results().iter().all(|(_, ok)| *ok)
    }
}

pub fn respond(readiness: &Readiness, which: Health, query: &str) -> Response {
    let (name, results) = match which {
        // The process answering is what liveness asks about.
        Health::Livez => ("livez", vec![("ping".to_string(), true)]),
        Health::Healthz => ("healthz", vec![("ping".to_string(), true)]),
        Health::Readyz => {
            let mut r = vec![("ping".to_string(), true)];
            r.extend(readiness.results());
            ("readyz", r)
        }
    };
    let mut listing = String::new();
    for (check, ok) in &results {
        if *ok {
            listing.push_str(&format!("[+]{check} ok\n"));
        } else {
            listing.push_str(&format!("[-]{check} failed: reason withheld\n"));
        }
    }
    let text = "text/plain; charset=utf-8";
    if results.iter().any(|(_, ok)| !ok) {
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
