//! Several replicas of one shard: a write reaching a follower goes to the
//! leader (after authentication and impersonation, before flow control, so
//! the leader's seats pay for it) and the client gets the leader's answer.
//! A write forwarded to a replica that no longer leads is refused with
//! "not the leader", so the follower looks again; it is never forwarded twice.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use super::Forwarded;
use crate::api::request::Route;
use crate::replica::{Replica, Routed, WriteInfo};

pub async fn forward_layer<F, Fut>(
    replica: Option<&Arc<Replica>>,
    req: Request,
    next: F,
) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let write = match &super::info(&req).route {
        Route::Resource(r) if crate::replica::is_write(r.verb) => WriteInfo {
            verb: r.verb.map(|v| v.as_str()).unwrap_or_default().to_string(),
            group: r.group.clone(),
            resource: r.resource.clone(),
        },
        _ => return next(req).await,
    };
    let Some(replica) = replica else {
        return next(req).await;
    };
    if req.extensions().get::<Forwarded>().is_some() {
        // Counted while it runs, so a leader handing over waits for it.
        let Some(local) = replica.begin_local_write() else {
            return crate::replica::internal::not_leader();
        };
        let resp = next(req).await;
        drop(local);
        return resp;
    }
    let acting = super::acting_user(&req);
    match replica.route(req, &acting, &write).await {
        Routed::Remote(resp) => resp,
        Routed::Local(req, local) => {
            let resp = next(req).await;
            drop(local);
            resp
        }
    }
}
