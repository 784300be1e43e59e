//! Request metrics around everything below: every answer, including the
//! 401s, 403s, 429s and 504s of the layers, is counted and timed.

use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;

use crate::api::request::{RequestInfo, Route, Verb};
use crate::server::metrics::{record_request, RequestLabels};

/// The labels kube's `apiserver_request_total` carries for this request.
pub fn labels(method: &http::Method, info: &RequestInfo) -> RequestLabels {
    let Route::Resource(r) = &info.route else {
        return RequestLabels {
            verb: method.as_str().to_string(),
            group: String::new(),
            version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            scope: String::new(),
        };
    };
    RequestLabels {
        verb: match r.verb {
            Some(Verb::Create) => "POST".into(),
            Some(Verb::Update) => "PUT".into(),
            Some(v) => v.as_str().to_ascii_uppercase(),
            None => method.as_str().to_string(),
        },
        group: r.group.clone(),
        version: r.version.clone(),
        resource: r.resource.clone(),
        subresource: r.subresource.clone().unwrap_or_default(),
        scope: if r.name.is_some() {
            "resource".into()
        } else if r.namespace.is_some() {
            "namespace".into()
        } else {
            "cluster".into()
        },
    }
}

pub async fn metrics_layer<F, Fut>(req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let start = Instant::now();
    let labels = labels(req.method(), &super::info(&req));
    let resp = next(req).await;
    record_request(&labels, resp.status().as_u16(), start.elapsed());
    resp
}
