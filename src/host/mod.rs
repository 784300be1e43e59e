//! The host cluster kshard is aggregated into: clients for it (from a
//! kubeconfig, or the pod's in-cluster service account) and the namespace
//! lifecycle its namespaces impose on kshard's objects.

pub mod apiservices;
pub mod namespaces;

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("reading kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    #[error("building a client: {0}")]
    Client(String),
}

/// Whether this process runs in a pod with a service account (as
/// k8s.io/apiserver's in-cluster fallback checks).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && Path::new("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
}

/// A client for the host: `kubeconfig` if given, else the in-cluster config.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, HostError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |reason: String| HostError::Kubeconfig {
                path: path.display().to_string(),
                reason,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => kube::Config::incluster().map_err(|e| HostError::InCluster(e.to_string()))?,
    };
    kube::Client::try_from(config).map_err(|e| HostError::Client(e.to_string()))
}
