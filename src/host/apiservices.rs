//! The host's `apiregistration.k8s.io/v1` APIServices for the group-versions
//! kshard serves, kept in step with the live catalog (`--manage-apiservices`):
//! one `<version>.<group>` per served group-version, pointing at kshard's
//! Service with the serving CA as `caBundle`, and the ones of group-versions
//! no longer served removed. Priorities are those kube-apiserver gives a
//! CRD's group-versions (its crdregistration controller): group 1000, version
//! 100, so the aggregator orders versions by kube's version order, as CRD
//! discovery does.
//!
//! kshard touches only APIServices it labelled and that point at its
//! Service: one written by hand or by a GitOps tool (unlabelled) is left
//! alone, so the two never fight over it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference,
};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::apiextensions::catalog::Catalog;
use crate::backoff::Backoff;
use crate::registry::Registry;

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "kshard";
/// kube-apiserver's priorities for CRD group-versions.
pub const GROUP_PRIORITY_MINIMUM: i32 = 1000;
pub const VERSION_PRIORITY: i32 = 100;
const MANAGER: &str = "kshard-apiservice-controller";
/// A changed CA (a renewed certificate) or an APIService removed by hand is
/// put right within this long.
const RESYNC: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ApiServiceError {
    #[error("reading the CA bundle {path}: {source}")]
    Ca {
        path: String,
        source: std::io::Error,
    },
    #[error("the host: {0}")]
    Host(#[from] kube::Error),
}

/// Where kshard is reached: its Service, and the CA that verifies it.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub port: i32,
    /// PEM; read on every pass, so a rotated CA is followed.
    pub ca_file: PathBuf,
}

impl Target {
    fn points_here(&self, a: &APIService) -> bool {
        let service = a.spec.as_ref().and_then(|s| s.service.as_ref());
        service.is_some_and(|s| {
            s.namespace.as_deref() == Some(self.namespace.as_str())
                && s.name.as_deref() == Some(self.name.as_str())
        })
    }
}

/// Keeps the APIServices in step until aborted: after every catalog change,
/// and every [`RESYNC`]. Only the leader writes; `ready` holds the first
/// pass back until every definition source is loaded (else a group about
/// to be served would be unregistered for a moment).
pub fn spawn(
    client: kube::Client,
    registry: Arc<Registry>,
    target: Target,
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: kube::Api<APIService> = kube::Api::all(client);
        let mut changes = registry.live_catalog().subscribe();
        let mut backoff = Backoff::new(Duration::from_secs(1), RESYNC);
        loop {
            let wait = if !ready() || registry.is_follower() {
                Duration::from_millis(100)
            } else {
                match sync(&api, &registry.catalog(), &target).await {
                    Ok(()) => {
                        backoff.reset();
                        RESYNC
                    }
                    Err(e) => {
                        let w = backoff.next_delay();
                        tracing::warn!(error = %e, retry_in = ?w, "keeping the host's APIServices");
                        w
                    }
                }
            };
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}

/// The APIServices the catalog calls for, by name.
pub fn desired(catalog: &Catalog, target: &Target, ca: &[u8]) -> BTreeMap<String, APIService> {
    let mut out = BTreeMap::new();
    for g in catalog.groups() {
        for v in &g.versions {
            let name = format!("{v}.{}", g.name);
            let a = APIService {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into()),
                    ..Default::default()
                },
                spec: Some(APIServiceSpec {
                    group: Some(g.name.clone()),
                    version: Some(v.clone()),
                    group_priority_minimum: GROUP_PRIORITY_MINIMUM,
                    version_priority: VERSION_PRIORITY,
                    service: Some(ServiceReference {
                        namespace: Some(target.namespace.clone()),
                        name: Some(target.name.clone()),
                        port: Some(target.port),
                    }),
                    ca_bundle: Some(k8s_openapi::ByteString(ca.to_vec())),
                    insecure_skip_tls_verify: None,
                }),
                status: None,
            };
            out.insert(name, a);
        }
    }
    out
}

/// One pass: create what is missing, update what differs, delete what kshard
/// registered and no longer serves.
pub async fn sync(
    api: &kube::Api<APIService>,
    catalog: &Catalog,
    target: &Target,
) -> Result<(), ApiServiceError> {
    let ca = tokio::fs::read(&target.ca_file)
        .await
        .map_err(|source| ApiServiceError::Ca {
            path: target.ca_file.display().to_string(),
            source,
        })?;
    let want = desired(catalog, target, &ca);
    let labelled = api
        .list(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")))
        .await?;
    let ours: BTreeMap<String, APIService> = labelled
        .items
        .into_iter()
        .filter(|a| target.points_here(a))
        .filter_map(|a| a.metadata.name.clone().map(|n| (n, a)))
        .collect();
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    for (name, a) in &want {
        match ours.get(name) {
            Some(cur) if cur.spec == a.spec => {}
            Some(cur) => {
                let mut updated = cur.clone();
                updated.spec = a.spec.clone();
                api.replace(name, &pp, &updated).await?;
                tracing::info!(apiservice = %name, "APIService updated");
            }
            None => match api.create(&pp, a).await {
                Ok(_) => tracing::info!(apiservice = %name, "APIService registered"),
                // Someone else's (unlabelled, or another server's): theirs.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tracing::debug!(apiservice = %name, "an APIService not kshard's exists; left alone")
                }
                Err(e) => return Err(e.into()),
            },
        }
    }
    for name in ours.keys().filter(|n| !want.contains_key(*n)) {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(apiservice = %name, "group-version no longer served; APIService removed")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_apiservice_per_served_group_version_with_kube_crd_priorities() {
        let mut catalog = Catalog::default();
        let crd = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.things.dev}
spec:
  group: things.dev
  scope: Namespaced
  names: {plural: gadgets, kind: Gadget}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}
  - {name: v2beta1, served: true, storage: false, schema: {openAPIV3Schema: {type: object}}}
  - {name: v0, served: false, storage: false, schema: {openAPIV3Schema: {type: object}}}
"#;
        catalog
            .add_manifests(std::path::Path::new("gadgets.yaml"), crd)
            .expect("crd");
        let target = Target {
            namespace: "shard-a".into(),
            name: "kshard".into(),
            port: 8443,
            ca_file: PathBuf::new(),
        };
        let want = desired(&catalog, &target, b"PEM");
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            ["v1.things.dev", "v2beta1.things.dev"]
        );
        let a = &want["v1.things.dev"];
        assert!(target.points_here(a));
        let spec = a.spec.as_ref().expect("spec");
        assert_eq!(
            (spec.group_priority_minimum, spec.version_priority),
            (1000, 100)
        );
        assert_eq!(
            spec.ca_bundle.as_ref().map(|b| b.0.as_slice()),
            Some(&b"PEM"[..])
        );
        assert_eq!(
            a.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY_LABEL)),
            Some(&MANAGED_BY.to_string())
        );
    }
}
