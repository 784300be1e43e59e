//! Authorization of the acting user with the request info's attributes
//! (`crate::authz`: a SubjectAccessReview to the host, cached; standalone
//! rules otherwise). It runs inside the flow-control seat, as in kube.

use axum::extract::Request;
use axum::response::Response;

use crate::api::request::RequestInfo;
use crate::auth::Identity;
use crate::authz::{Attributes, Authorizer, Decision};

/// The authorizer's view of a request.
pub fn attributes(info: &RequestInfo, method: &http::Method, user: &Identity) -> Attributes {
    let a = info.attributes(method);
    Attributes {
        user: user.clone(),
        verb: a.verb,
        resource_request: a.is_resource,
        group: a.group,
        version: a.version,
        resource: a.resource,
        subresource: a.subresource,
        namespace: a.namespace,
        name: a.name,
        path: a.path,
    }
}

pub async fn authorization_layer<F, Fut>(authz: &Authorizer, req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let info = super::info(&req);
    let attrs = attributes(&info, req.method(), &super::acting_user_ref(&req));
    let recording = req
        .extensions()
        .get::<std::sync::Arc<crate::audit::Recording>>()
        .cloned();
    let annotate = |k: &str, v: String| {
        if let Some(rec) = &recording {
            rec.annotate(k, v);
        }
    };
    let step = crate::traces::Span::child("authorization");
    let decision = authz.authorize(&attrs).await;
    if let Some(step) = &step {
        let verdict = match &decision {
            Ok(Decision::Allow) => "allow",
            Ok(Decision::Deny(_)) => "forbid",
            Err(_) => "error",
        };
        step.set_attribute(opentelemetry::KeyValue::new("decision", verdict));
    }
    drop(step);
    match decision {
        Ok(Decision::Allow) => {
            annotate("authorization.k8s.io/decision", "allow".into());
            // A SelfSubjectAccessReview asks this same authorizer.
            let mut req = req;
            req.extensions_mut().insert(authz.clone());
            next(req).await
        }
        Ok(Decision::Deny(reason)) => {
            annotate("authorization.k8s.io/decision", "forbid".into());
            annotate("authorization.k8s.io/reason", reason.clone());
            super::status_response(&crate::authz::forbidden(&attrs, &reason))
        }
        Err(e) => {
            tracing::warn!(error = %e, "authorization failed");
            super::status_response(&crate::status::ApiError::internal(e))
        }
    }
}
