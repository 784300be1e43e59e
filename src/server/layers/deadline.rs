//! The request deadline (kube's WithRequestDeadline + timeout filter): a
//! request that is not long-running must be answered within
//! `--request-timeout`, or the client's shorter `?timeout=`; past it the
//! client gets kube's 504. Watches are long-running: they end at their own
//! `timeoutSeconds`. The deadline also bounds reading the request body
//! (inside this layer) and sending the response (the flow-control layer
//! closes a connection whose response is still unsent then).

use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use tokio::time::Instant;

use crate::api::request::Route;
use crate::status::ApiError;

pub use crate::scope::RequestDeadline;

/// kube's 504 for a request past its deadline.
pub fn exceeded() -> Response {
    super::status_response(&crate::scope::deadline_exceeded())
}

/// Long-running requests have no request deadline (kube's
/// LongRunningRequestCheck: watches, and the snapshot stream).
pub fn is_long_running(route: &Route) -> bool {
    route.is_watch() || route.is_long_running_non_watch()
}

/// The request's timeout: `max`, or the client's shorter `?timeout=` (Go
/// duration syntax). `Err` is kube's 400 for a bad value.
pub fn timeout_of(query: &str, max: Duration) -> Result<Duration, ApiError> {
    let asked = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "timeout")
        .map(|(_, v)| v.into_owned());
    match asked {
        None => Ok(max),
        Some(v) => match crate::units::parse_go_duration(&v) {
            Ok(d) if !d.is_zero() => Ok(d.min(max)),
            Ok(_) => Ok(max),
            Err(_) => Err(ApiError::bad_request(format!(
                "invalid timeout specified in the request URL: {v}"
            ))),
        },
    }
}

/// The forwarding follower's remaining wait, trusted only on a request that
/// came with the replicas' shared secret.
fn forwarded_timeout(req: &Request) -> Option<Duration> {
    req.extensions()
        .get::<crate::replica::forward::ForwardedIdentity>()?;
    let ms: u64 = req
        .headers()
        .get(crate::replica::forward::TIMEOUT_MS)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms.max(1)))
}

pub async fn deadline_layer<F, Fut>(max: Duration, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    if is_long_running(&super::info(&req).route) {
        return next(req).await;
    }
    let mut timeout = match timeout_of(req.uri().query().unwrap_or(""), max) {
        Ok(t) => t,
        Err(bad) => return super::status_response(&bad),
    };
    // A write a follower forwarded: it waits only so long for the answer.
    if let Some(left) = forwarded_timeout(&req) {
        timeout = timeout.min(left);
    }
    let now = Instant::now();
    let deadline = now.checked_add(timeout).unwrap_or(now);
    req.extensions_mut().insert(RequestDeadline(deadline));
    match tokio::time::timeout_at(deadline, next(req)).await {
        Ok(r) => r,
        Err(_) => exceeded(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_parameter_is_capped_by_the_server_and_validated() {
        let max = Duration::from_secs(60);
        assert_eq!(timeout_of("", max).ok(), Some(max));
        assert_eq!(
            timeout_of("timeout=5s", max).ok(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(timeout_of("timeout=2h", max).ok(), Some(max));
        assert_eq!(timeout_of("timeout=0s", max).ok(), Some(max));
        let bad = timeout_of("timeout=soon", max).err().map(|e| e.code);
        assert_eq!(bad, Some(400));
    }
}
