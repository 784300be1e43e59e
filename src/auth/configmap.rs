//! The host's `kube-system/extension-apiserver-authentication` ConfigMap: the
//! client CA and front-proxy (requestheader) settings kube-apiserver publishes
//! for aggregated servers. Flags win over it, as in k8s.io/apiserver; what the
//! flags leave open follows the ConfigMap through a watch, so a CA rotation on
//! the host takes effect without a restart.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;

use super::{AuthConfig, CaBundle, DynamicConfig, RequestHeader};

pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "extension-apiserver-authentication";

/// The configuration `flags` (what the command line fixed) completed from the
/// ConfigMap's data. Unparseable entries are logged and left out.
pub fn merge(flags: &AuthConfig, data: Option<&BTreeMap<String, String>>) -> AuthConfig {
    let ca = |key: &str| -> Option<CaBundle> {
        let pem = data?.get(key)?;
        match CaBundle::from_pem(
            pem.as_bytes(),
            &format!("configmap {NAMESPACE}/{NAME} {key}"),
        ) {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring CA from the authentication ConfigMap");
                None
            }
        }
    };
    let list = |key: &str| -> Option<Vec<String>> {
        let raw = data?.get(key)?;
        match serde_json::from_str::<Vec<String>>(raw) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(key, error = %e, "ignoring malformed list in the authentication ConfigMap");
                None
            }
        }
    };
    let client_ca = flags.client_ca.clone().or_else(|| ca("client-ca-file"));
    let request_header = flags.request_header.clone().or_else(|| {
        let mut rh = RequestHeader::new(ca("requestheader-client-ca-file")?);
        rh.allowed_names = list("requestheader-allowed-names").unwrap_or_default();
        if let Some(v) = list("requestheader-username-headers") {
            rh.username_headers = v;
        }
        if let Some(v) = list("requestheader-uid-headers") {
            rh.uid_headers = v;
        }
        if let Some(v) = list("requestheader-group-headers") {
            rh.group_headers = v;
        }
        if let Some(v) = list("requestheader-extra-headers-prefix") {
            rh.extra_headers_prefix = v;
        }
        Some(rh)
    });
    AuthConfig {
        client_ca,
        request_header,
    }
}

/// Keeps `dynamic` equal to `flags` completed from the ConfigMap, for as long
/// as the task runs. The watcher retries with backoff while the host is away.
pub fn spawn_watch(
    client: kube::Client,
    flags: AuthConfig,
    dynamic: Arc<DynamicConfig>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, NAMESPACE);
        let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut seen_in_init = false;
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => seen_in_init = false,
                Ok(Event::InitApply(cm)) | Ok(Event::Apply(cm)) => {
                    seen_in_init = true;
                    tracing::info!("authentication configuration loaded from {NAMESPACE}/{NAME}");
                    dynamic.set(merge(&flags, cm.data.as_ref()));
                }
                Ok(Event::InitDone) => {
                    if !seen_in_init {
                        tracing::warn!("{NAMESPACE}/{NAME} not found; using the flags alone");
                        dynamic.set(merge(&flags, None));
                    }
                }
                Ok(Event::Delete(_)) => dynamic.set(merge(&flags, None)),
                Err(e) => tracing::warn!(error = %e, "watching {NAMESPACE}/{NAME}"),
            }
        }
    })
}
