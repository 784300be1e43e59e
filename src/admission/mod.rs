//! Admission webhooks and ValidatingAdmissionPolicies, as kube-apiserver 1.35
//! runs them. Requests that reach kshard through a host's aggregator skip the
//! host's admission chain, so kshard runs its own: MutatingAdmissionWebhook
//! after the object is decoded, defaulted and merged (before schema
//! validation); ValidatingAdmissionPolicy, then ValidatingAdmissionWebhook
//! after validation (before the write), for every create, update, patch,
//! apply and delete, subresources and dry runs too. The registry calls them
//! through `registry::write_admission::Admission`.
//!
//! - [`config`]: the webhook configurations (kshard's own objects
//!   standalone, the host's behind one), compiled into [`hooks::Hooks`];
//! - [`crd`]: the built-in CRDs that serve those kinds standalone;
//! - [`matching`]: rules, selectors, match policy, match conditions;
//! - [`review`]: the AdmissionReview sent and the answer's checks;
//! - [`validation`]: kube's validation of the webhook configurations kshard stores;
//! - [`policy_validation`]: kube's validation of the policies and bindings it stores;
//! - [`strategy`]: those kinds' strategies, registered with the catalog;
//! - [`columns`]: kube's table columns for those kinds;
//! - [`webhook`]: the HTTPS call (clients, CA bundles, timeouts, errors);
//! - [`policy`]: ValidatingAdmissionPolicy and its bindings, in CEL;
//! - `dispatch`: the mutating (in order, with reinvocation) and validating
//!   (in parallel) runs, failure policy, patches, warnings, audit annotations.

pub mod builtin_crds;
pub mod columns;
mod dispatch;
pub mod hooks;
pub mod matching;
pub mod policy;
pub mod policy_validation;
pub mod review;
pub mod strategy;
pub mod validation;
pub mod webhook;

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::registry::write_admission::{Admission, Attributes};
use crate::status::ApiError;

/// The label kube puts on every namespace: its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The namespaces requests are in: their labels for namespace selectors, the
/// object for policies' `namespaceObject`.
pub trait Namespaces: Send + Sync {
    /// The Namespace as kube exposes it to admission (name, labels,
    /// annotations and the other metadata it keeps, spec, status); a
    /// namespace that does not exist is kube's 404 for it.
    fn get<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Value, ApiError>>;
}

/// Standalone, namespaces are implicit: each has only the label kube gives
/// every namespace, its name.
pub struct ImplicitNamespaces;

impl Namespaces for ImplicitNamespaces {
    fn get<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Value, ApiError>> {
        let ns = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {NAMESPACE_NAME_LABEL: namespace}},
            "spec": {}, "status": {"phase": "Active"},
        });
        Box::pin(async move { Ok(ns) })
    }
}

/// A Namespace as kube's `CreateNamespaceObject` exposes it.
pub fn namespace_view(ns: &Value) -> Value {
    let mut meta = serde_json::Map::new();
    for f in [
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "finalizers",
    ] {
        if let Some(v) = ns.pointer(&format!("/metadata/{f}")) {
            meta.insert(f.into(), v.clone());
        }
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": meta,
        "spec": ns.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
        "status": ns.get("status").cloned().unwrap_or_else(|| serde_json::json!({})),
    })
}

/// The admission webhooks and policies in force, and what running them needs.
pub struct Webhooks {
    source: hooks::Source,
    clients: webhook::Clients,
    namespaces: Arc<dyn Namespaces>,
    /// Where policies' params are read (`None`: bindings with params fail).
    params: Option<Arc<dyn policy::Params>>,
}

impl Webhooks {
    pub fn new(
        source: hooks::Source,
        clients: webhook::Clients,
        namespaces: Arc<dyn Namespaces>,
        params: Option<Arc<dyn policy::Params>>,
    ) -> Self {
        Self {
            source,
            clients,
            namespaces,
            params,
        }
    }

    /// Whether the configuration has been read whole (readiness).
    /// Host admission kinds not followed, with why (see [`hooks::Missing`]).
    pub fn missing(&self) -> hooks::Missing {
        self.source.missing()
    }

    pub fn is_synced(&self) -> bool {
        self.source.is_synced()
    }
}

impl Admission for Webhooks {
    fn mutate<'a>(
        &'a self,
        attrs: &'a Attributes<'a>,
        object: Option<&'a mut Value>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(self.mutate_all(attrs, object))
    }

    fn validate<'a>(
        &'a self,
        attrs: &'a Attributes<'a>,
        object: Option<&'a Value>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(self.validate_all(attrs, object))
    }
}
