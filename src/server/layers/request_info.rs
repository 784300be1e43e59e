//! Parses the request once into [`RequestInfo`] (kube's RequestInfoFactory),
//! kept in the request's extensions: authentication, audit, flow control,
//! authorization, metrics and the handler all read this one value, so no
//! stage can see a different resource, subresource or namespace than another.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::api::request::RequestInfo;

pub async fn layer(mut req: Request, next: Next) -> Response {
    let info = RequestInfo::parse(req.method(), req.uri());
    req.extensions_mut().insert(info);
    next.run(req).await
}
