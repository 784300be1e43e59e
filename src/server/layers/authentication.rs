//! Authentication, in k8s.io/apiserver's delegating order (front proxy,
//! client certificate, bearer token, anonymous; see `crate::auth`). The user
//! goes into the request's extensions as [`Authenticated`] and as the acting
//! [`Identity`] (which impersonation may replace). Credentials that are
//! presented and refused are 401, marked [`Unauthenticated`] for the audit
//! layer around this one to record.

use axum::extract::Request;
use axum::response::Response;

use super::{Authenticated, Forwarded, FrontProxied, InsecureListener, Unauthenticated};
use crate::auth::{Authenticator, Identity, PeerCertificates};
use crate::replica::forward::ForwardedIdentity;
use crate::status::ApiError;

pub struct Authentication {
    pub auth: Authenticator,
}

/// kube's 401.
pub fn unauthorized() -> Response {
    let mut e = ApiError::forbidden("Unauthorized");
    e.code = 401;
    e.reason = "Unauthorized".into();
    super::status_response(&e)
}

pub async fn authentication_layer<F, Fut>(a: &Authentication, mut req: Request, next: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    // Only the replicas' internal endpoint sets this, after checking their secret.
    let identity = if let Some(fwd) = req.extensions_mut().remove::<ForwardedIdentity>() {
        req.extensions_mut().insert(Forwarded);
        fwd.0
    } else if req.extensions().get::<InsecureListener>().is_some() {
        Identity::dev_admin()
    } else {
        let peer = req.extensions().get::<PeerCertificates>().cloned();
        match a.auth.authenticate(req.headers_mut(), peer.as_ref()).await {
            Ok((id, via)) => {
                if via == crate::auth::Via::FrontProxy {
                    req.extensions_mut().insert(FrontProxied);
                }
                id
            }
            Err(_) => {
                let mut resp = unauthorized();
                resp.extensions_mut().insert(Unauthenticated);
                return resp;
            }
        }
    };
    req.extensions_mut().insert(Authenticated(identity.clone()));
    req.extensions_mut().insert(identity);
    next(req).await
}
