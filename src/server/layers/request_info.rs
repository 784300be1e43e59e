//! Parses the request once into [`RequestInfo`] (kube's RequestInfoFactory),
//! kept in the request's extensions: authentication, audit, flow control,
//! authorization, metrics and the handler all read this one value, so no
//! stage can see a different resource, subresource or namespace than another.

use axum::extract::Request;
use axum::response::Response;

use crate::api::request::RequestInfo;

pub async fn request_info_layer<F, Fut>(mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let info = RequestInfo::parse(req.method(), req.uri());
    req.extensions_mut().insert(std::sync::Arc::new(info));
    if crate::traces::enabled() {
        // The server span starts after authentication, dated from here.
        req.extensions_mut()
            .insert(super::trace::Received(std::time::SystemTime::now()));
    }
    next(req).await
}
