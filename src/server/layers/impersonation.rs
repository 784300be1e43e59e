//! Impersonation: `Impersonate-User`, `-Group`, `-Uid` and `-Extra-*` are
//! authorized with the `impersonate` verb (`crate::authz::impersonation`) and
//! replace the acting [`Identity`]; the headers are removed either way. The
//! audit event names both users. With the in-process development
//! authenticator, on the insecure debugging port and for forwarded writes
//! (impersonated on the follower already) there is nothing to do.

use axum::extract::Request;
use axum::response::Response;

use super::{Authenticated, Forwarded, InsecureListener};
use crate::authz::Authorizer;

pub struct Impersonation {
    pub authz: Authorizer,
    /// The in-process development authenticator names the user itself.
    pub dev: bool,
}

pub async fn impersonation_layer<F, Fut>(im: &Impersonation, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let skip = im.dev
        || req.extensions().get::<Forwarded>().is_some()
        || req.extensions().get::<InsecureListener>().is_some();
    if skip {
        return next(req).await;
    }
    let Some(Authenticated(requester)) = req.extensions().get::<Authenticated>().cloned() else {
        return next(req).await;
    };
    match crate::authz::impersonation::impersonate(&im.authz, requester.clone(), req.headers_mut())
        .await
    {
        Ok(acting) => {
            if acting != requester {
                if let Some(rec) = req
                    .extensions()
                    .get::<std::sync::Arc<crate::audit::Recording>>()
                {
                    rec.set_impersonated_user(crate::audit::UserInfo::from(&acting));
                }
            }
            req.extensions_mut().insert(acting);
            next(req).await
        }
        Err(e) => super::status_response(&e),
    }
}
