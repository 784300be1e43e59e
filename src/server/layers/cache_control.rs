//! API answers are not to be cached by intermediaries unless the handler
//! said otherwise (kube's `WithCacheControl`); a 304 carries no such header.

use axum::extract::Request;
use axum::response::Response;

pub async fn cache_control_layer<F, Fut>(req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let mut resp = next(req).await;
    if resp.headers().get(http::header::CACHE_CONTROL).is_none()
        && resp.status() != http::StatusCode::NOT_MODIFIED
    {
        super::set_header(&mut resp, "cache-control", "no-cache, private");
    }
    resp
}
