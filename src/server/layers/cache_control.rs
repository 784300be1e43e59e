//! API answers are not to be cached by intermediaries unless the handler
//! said otherwise (kube's `WithCacheControl`); a 304 carries no such header.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

pub async fn layer(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if resp.headers().get(http::header::CACHE_CONTROL).is_none()
        && resp.status() != http::StatusCode::NOT_MODIFIED
    {
        super::set_header(&mut resp, "cache-control", "no-cache, private");
    }
    resp
}
