//! May this user do this? Standalone, everyone may (the dev admin is the only
//! user), but only `system:masters` may take a snapshot. Delegated, as k8s.io/apiserver's delegating authorizer: the
//! always-allowed paths and `system:masters` pass, everything else is a
//! SubjectAccessReview to the host with the request's full attributes, its
//! allow and deny answers cached for a short time; with no host to ask, it is
//! denied. Denials are kube's 403.

pub mod impersonation;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use crate::auth::{Identity, GROUP_MASTERS};
use crate::status::{quote, ApiError};

/// k8s.io/apiserver's defaults for delegated authorization.
pub const DEFAULT_ALLOW_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_DENY_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_ALWAYS_ALLOW_PATHS: [&str; 3] = ["/healthz", "/readyz", "/livez"];
const CACHE_SWEEP_AT: usize = 8192;

/// What a request asks to do, as kube's authorizer.Attributes.
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub user: Identity,
    pub verb: String,
    pub resource_request: bool,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Denied (or no opinion); the reviewer's reason, possibly empty.
    Deny(String),
}

#[derive(Debug, thiserror::Error)]
#[error("SubjectAccessReview: {0}")]
pub struct AuthzError(String);

#[derive(Debug, Clone, Default)]
pub enum Authorizer {
    /// Every request (kube-apiserver's default `--authorization-mode`).
    #[default]
    AlwaysAllow,
    /// A standalone server: every authenticated user (kube's AlwaysAllow);
    /// `system:anonymous` too when `anonymous_full_access` (a loopback
    /// address, or `--anonymous-admin`), else only the probes and discovery,
    /// as RBAC's `system:public-info-viewer` and `system:discovery` allow.
    Standalone {
        anonymous_full_access: bool,
    },
    Delegating(std::sync::Arc<SubjectAccessReviewer>),
}

/// What an unauthenticated client may read from a standalone server on a
/// network address: health, version and discovery documents.
fn public_info(a: &Attributes) -> bool {
    let path = a.path.as_str();
    !a.resource_request
        && a.verb == "get"
        && ([
            "/healthz", "/livez", "/readyz", "/version", "/api", "/apis", "/openapi",
        ]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/"))))
}

impl Authorizer {
    pub async fn authorize(&self, a: &Attributes) -> Result<Decision, AuthzError> {
        match self {
            Authorizer::AlwaysAllow => Ok(Decision::Allow),
            // A snapshot is every object at once: standalone, only the
            // administrator's certificate (system:masters) may take one.
            Authorizer::Standalone { .. } if is_snapshot(a) => {
                Ok(if a.user.groups.iter().any(|g| g == GROUP_MASTERS) {
                    Decision::Allow
                } else {
                    Decision::Deny("only system:masters may take a snapshot".into())
                })
            }
            Authorizer::Standalone {
                anonymous_full_access,
            } => Ok(
                if a.user.user != ANONYMOUS_USER || *anonymous_full_access || public_info(a) {
                    Decision::Allow
                } else {
                    Decision::Deny(String::new())
                },
            ),
            Authorizer::Delegating(r) => r.authorize(a).await,
        }
    }
}

const ANONYMOUS_USER: &str = "system:anonymous";

/// `GET /kshard/snapshot` (`kshard snapshot save`).
fn is_snapshot(a: &Attributes) -> bool {
    !a.resource_request && a.path == crate::api::request::SNAPSHOT_PATH
}

type CacheEntry = (Instant, Decision);

pub struct SubjectAccessReviewer {
    /// `None`: no host to ask; what the allow-lists do not allow is denied.
    client: Option<kube::Client>,
    /// Non-resource paths anyone may reach; a trailing `*` matches a prefix.
    always_allow_paths: Vec<String>,
    always_allow_groups: Vec<String>,
    allow_ttl: Duration,
    deny_ttl: Duration,
    cache: Mutex<HashMap<String, CacheEntry>>,
}

impl std::fmt::Debug for SubjectAccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewer")
            .field("always_allow_paths", &self.always_allow_paths)
            .finish()
    }
}

impl SubjectAccessReviewer {
    pub fn new(client: Option<kube::Client>, always_allow_paths: Vec<String>) -> Self {
        Self {
            client,
            always_allow_paths,
            always_allow_groups: vec![GROUP_MASTERS.to_string()],
            allow_ttl: DEFAULT_ALLOW_TTL,
            deny_ttl: DEFAULT_DENY_TTL,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn with_ttls(mut self, allow: Duration, deny: Duration) -> Self {
        self.allow_ttl = allow;
        self.deny_ttl = deny;
        self
    }

    fn path_always_allowed(&self, path: &str) -> bool {
        self.always_allow_paths
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => path == p,
            })
    }

    async fn authorize(&self, a: &Attributes) -> Result<Decision, AuthzError> {
        if !a.resource_request && self.path_always_allowed(&a.path) {
            return Ok(Decision::Allow);
        }
        if a.user
            .groups
            .iter()
            .any(|g| self.always_allow_groups.contains(g))
        {
            return Ok(Decision::Allow);
        }
        let Some(client) = &self.client else {
            return Ok(Decision::Deny(String::new()));
        };
        let spec = review_spec(a);
        let key = serde_json::to_string(&spec).map_err(|e| AuthzError(e.to_string()))?;
        let now = Instant::now();
        if let Some((at, d)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            let ttl = match d {
                Decision::Allow => self.allow_ttl,
                Decision::Deny(_) => self.deny_ttl,
            };
            if now.duration_since(*at) < ttl {
                return Ok(d.clone());
            }
        }
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let answer = tokio::time::timeout(
            crate::auth::REVIEW_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| AuthzError("the host did not answer the review in time".into()))?
        .map_err(|e| AuthzError(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        let decision = if status.allowed && status.denied != Some(true) {
            Decision::Allow
        } else {
            let mut reason = status.reason.unwrap_or_default();
            if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty()) {
                if reason.is_empty() {
                    reason = e;
                }
            }
            Decision::Deny(reason)
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_SWEEP_AT {
            let longest = self.allow_ttl.max(self.deny_ttl);
            cache.retain(|_, (at, _)| now.duration_since(*at) < longest);
        }
        cache.insert(key, (now, decision.clone()));
        Ok(decision)
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The SubjectAccessReview kube's webhook authorizer sends for `a`.
pub fn review_spec(a: &Attributes) -> SubjectAccessReviewSpec {
    let mut spec = SubjectAccessReviewSpec {
        user: Some(a.user.user.clone()),
        groups: Some(a.user.groups.clone()),
        uid: non_empty(&a.user.uid),
        extra: (!a.user.extra.is_empty()).then(|| a.user.extra.clone().into_iter().collect()),
        ..Default::default()
    };
    if a.resource_request {
        spec.resource_attributes = Some(ResourceAttributes {
            namespace: non_empty(&a.namespace),
            verb: Some(a.verb.clone()),
            group: Some(a.group.clone()),
            version: Some(a.version.clone()),
            resource: Some(a.resource.clone()),
            subresource: non_empty(&a.subresource),
            name: non_empty(&a.name),
            ..Default::default()
        });
    } else {
        spec.non_resource_attributes = Some(NonResourceAttributes {
            path: Some(a.path.clone()),
            verb: Some(a.verb.clone()),
        });
    }
    spec
}

/// kube's Forbidden answer for a denied request (responsewriters.Forbidden).
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let user = quote(&a.user.user);
    let msg = if !a.resource_request {
        format!("User {user} cannot {} path {}", a.verb, quote(&a.path))
    } else {
        let mut resource = a.resource.clone();
        if !a.subresource.is_empty() {
            resource = format!("{resource}/{}", a.subresource);
        }
        if a.namespace.is_empty() {
            format!(
                "User {user} cannot {} resource {} in API group {} at the cluster scope",
                a.verb,
                quote(&resource),
                quote(&a.group)
            )
        } else {
            format!(
                "User {user} cannot {} resource {} in API group {} in the namespace {}",
                a.verb,
                quote(&resource),
                quote(&a.group),
                quote(&a.namespace)
            )
        }
    };
    // kube keeps error text from looking like HTML.
    let msg = msg
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let err = if reason.is_empty() {
        msg
    } else {
        format!("{msg}: {reason}")
    };
    let (group, resource) = if a.resource_request {
        (a.group.as_str(), a.resource.as_str())
    } else {
        ("", "")
    };
    ApiError::forbidden_resource(group, resource, &a.name, &err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(ns: &str, sub: &str) -> Attributes {
        Attributes {
            user: Identity {
                user: "alice".into(),
                ..Default::default()
            },
            verb: "list".into(),
            resource_request: true,
            group: "demo.kshard.dev".into(),
            version: "v1".into(),
            resource: "widgets".into(),
            subresource: sub.into(),
            namespace: ns.into(),
            ..Default::default()
        }
    }

    #[test]
    fn forbidden_messages_match_kube() {
        let e = forbidden(&attrs("default", ""), "");
        assert_eq!(
            e.message,
            "widgets.demo.kshard.dev is forbidden: User \"alice\" cannot list resource \"widgets\" in API group \"demo.kshard.dev\" in the namespace \"default\""
        );
        let mut a = attrs("", "status");
        a.verb = "get".into();
        a.name = "w1".into();
        let e = forbidden(&a, "no RBAC policy matched");
        assert_eq!(
            e.message,
            "widgets.demo.kshard.dev \"w1\" is forbidden: User \"alice\" cannot get resource \"widgets/status\" in API group \"demo.kshard.dev\" at the cluster scope: no RBAC policy matched"
        );
        let a = Attributes {
            user: a.user.clone(),
            verb: "get".into(),
            path: "/metrics".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden(&a, "").message,
            "forbidden: User \"alice\" cannot get path \"/metrics\""
        );
    }

    #[test]
    fn review_spec_carries_every_attribute() {
        let mut a = attrs("ns1", "scale");
        a.name = "w".into();
        let spec = serde_json::to_value(review_spec(&a)).expect("json");
        assert_eq!(
            spec["resourceAttributes"],
            serde_json::json!({"namespace": "ns1", "verb": "list", "group": "demo.kshard.dev",
                "version": "v1", "resource": "widgets", "subresource": "scale", "name": "w"})
        );
        assert_eq!(spec["user"], "alice");
    }
}
