//! Several replicas of one shard: a write reaching a follower goes to the
//! leader (after authentication and impersonation, before flow control, so
//! the leader's seats pay for it) and the client gets the leader's answer.
//! A write forwarded to a replica that no longer leads is refused with
//! "not the leader", so the follower looks again; it is never forwarded twice.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::Forwarded;
use crate::api::request::Route;
use crate::replica::{Replica, Routed};

pub async fn layer(
    State(replica): State<Option<Arc<Replica>>>,
    req: Request,
    next: Next,
) -> Response {
    let verb = match &super::info(&req).route {
        Route::Resource(r) => r.verb,
        _ => None,
    };
    let Some(replica) = replica.filter(|_| crate::replica::is_write(verb)) else {
        return next.run(req).await;
    };
    if req.extensions().get::<Forwarded>().is_some() {
        if !replica.is_leader() {
            return crate::replica::internal::not_leader();
        }
        return next.run(req).await;
    }
    let acting = super::acting_user(&req);
    match replica.route(req, &acting).await {
        Routed::Remote(resp) => resp,
        Routed::Local(req) => next.run(req).await,
    }
}
