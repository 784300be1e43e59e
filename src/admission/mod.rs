//! Admission webhooks, as kube-apiserver 1.35 runs them. Requests that
//! reach kshard through a host's aggregator skip the host's admission chain,
//! so kshard runs its own: MutatingAdmissionWebhook after the object is
//! decoded, defaulted and merged (before schema validation), and
//! ValidatingAdmissionWebhook after validation (before the write), for every
//! create, update, patch, apply and delete, subresources and dry runs too.
//! The registry calls them through `registry::admission::Admission`.
//!
//! - [`config`]: the webhook configurations (kshard's own objects
//!   standalone, the host's behind one), compiled into [`config::Hooks`];
//! - [`crd`]: the built-in CRDs that serve those kinds standalone;
//! - [`matching`]: rules, selectors, match policy, match conditions;
//! - [`review`]: the AdmissionReview sent and the answer's checks;
//! - [`webhook`]: the HTTPS call (clients, CA bundles, timeouts, errors);
//! - `dispatch`: the mutating (in order, with reinvocation) and validating
//!   (in parallel) runs, failure policy, patches, warnings, audit annotations.

pub mod config;
pub mod crd;
mod dispatch;
pub mod matching;
pub mod review;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::registry::admission::{Admission, Attributes};
use crate::status::ApiError;

/// The label kube puts on every namespace: its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The labels of a namespace, for webhooks' namespace selectors.
pub trait NamespaceLabels: Send + Sync {
    /// A namespace that does not exist is kube's 404 for it.
    fn labels<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, ApiError>>;
}

/// Standalone, namespaces are implicit: each has only the label kube gives
/// every namespace, its name.
pub struct ImplicitNamespaces;

impl NamespaceLabels for ImplicitNamespaces {
    fn labels<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, ApiError>> {
        let labels = [(NAMESPACE_NAME_LABEL.to_string(), namespace.to_string())].into();
        Box::pin(async move { Ok(labels) })
    }
}

/// The admission webhooks in force and what calling them needs.
pub struct Webhooks {
    source: config::Source,
    clients: webhook::Clients,
    namespaces: Arc<dyn NamespaceLabels>,
}

impl Webhooks {
    pub fn new(
        source: config::Source,
        clients: webhook::Clients,
        namespaces: Arc<dyn NamespaceLabels>,
    ) -> Self {
        Self {
            source,
            clients,
            namespaces,
        }
    }

    /// Whether the configuration has been read whole (readiness).
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
