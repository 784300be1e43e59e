//! Namespace lifecycle, as kube's NamespaceLifecycle admission plugin: a
//! create in a namespace the host does not have is 404, in one the host is
//! terminating is 403. Namespaces are followed with a reflector; a miss is
//! checked once more against the host itself before refusing, because the
//! namespace may have been created a moment ago.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};

use crate::registry::write_admission::CreateAdmission;
use crate::registry::Target;
use crate::status::ApiError;

/// kube's wait for the cache to see a just-created namespace.
const MISSING_NAMESPACE_WAIT: Duration = Duration::from_millis(50);
/// How long a create waits for the first namespace list before refusing.
const SYNC_WAIT: Duration = Duration::from_secs(5);

pub struct NamespaceLifecycle {
    api: kube::Api<Namespace>,
    cache: reflector::Store<Namespace>,
    synced: Arc<AtomicBool>,
}

impl NamespaceLifecycle {
    /// Starts following the host's namespaces.
    pub fn spawn(client: kube::Client) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let api: kube::Api<Namespace> = kube::Api::all(client);
        let (cache, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = reflector::reflector(
            writer,
            watcher::watcher(api.clone(), watcher::Config::default()),
        )
        .default_backoff();
        let flag = synced.clone();
        let ready = cache.clone();
        let task = tokio::spawn(async move {
            let waiter = tokio::spawn(async move {
                if ready.wait_until_ready().await.is_ok() {
                    flag.store(true, Ordering::Release);
                }
            });
            let mut stream = stream.boxed();
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "watching host namespaces");
                }
            }
            waiter.abort();
        });
        (Arc::new(Self { api, cache, synced }), task)
    }

    /// Whether the first list of the host's namespaces is in.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn cached(&self, name: &str) -> Option<Arc<Namespace>> {
        self.cache.get(&ObjectRef::new(name))
    }

    async fn check(&self, t: &Target, name: &str) -> Result<(), ApiError> {
        let ns = t.namespace.as_str();
        if ns.is_empty() {
            return Ok(());
        }
        let forbidden =
            |msg: String| ApiError::forbidden_resource(&t.rt.group, &t.rt.plural, name, &msg);
        if !self.is_synced()
            && tokio::time::timeout(SYNC_WAIT, self.cache.wait_until_ready())
                .await
                .is_err()
        {
            return Err(forbidden("not yet ready to handle request".into()));
        }
        let mut found = self.cached(ns).map(|n| (*n).clone());
        if found.is_none() {
            tokio::time::sleep(MISSING_NAMESPACE_WAIT).await;
            found = self.cached(ns).map(|n| (*n).clone());
        }
        let namespace = match found {
            Some(n) => n,
            None => match self.api.get_opt(ns).await {
                Ok(Some(n)) => n,
                Ok(None) => return Err(ApiError::not_found("", "namespaces", ns)),
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "looking up namespace {ns} in the host: {e}"
                    )))
                }
            },
        };
        let terminating = namespace.metadata.deletion_timestamp.is_some()
            || namespace.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
        if terminating {
            return Err(forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))
            .with_cause(
                "NamespaceTerminating",
                &format!("namespace {ns} is being terminated"),
                "metadata.namespace",
            ));
        }
        Ok(())
    }
}

impl NamespaceLifecycle {
    /// A namespace as admission sees it, from the cache or (just created)
    /// the host; kube's 404 when it has no such namespace.
    async fn admission_view(&self, ns: &str) -> Result<serde_json::Value, ApiError> {
        let found = match self.cached(ns) {
            Some(n) => Some((*n).clone()),
            None => self.api.get_opt(ns).await.map_err(|e| {
                ApiError::internal(format!("looking up namespace {ns} in the host: {e}"))
            })?,
        };
        match found {
            Some(n) => Ok(crate::admission::namespace_view(
                &serde_json::to_value(&n).map_err(ApiError::internal)?,
            )),
            None => Err(ApiError::not_found("", "namespaces", ns)),
        }
    }
}

impl crate::admission::Namespaces for NamespaceLifecycle {
    fn get<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<serde_json::Value, ApiError>> {
        Box::pin(self.admission_view(namespace))
    }
}

impl CreateAdmission for NamespaceLifecycle {
    fn admit_create<'a>(
        &'a self,
        t: &'a Target,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(self.check(t, name))
    }
}
