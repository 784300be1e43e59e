//! The sources of definitions, above the registry: definition files (and
//! their watcher), the built-in manifests, definitions stored as objects
//! (`stored`) and behind a host its ShardResourceDefinitions (`host`). Each
//! change is loaded into a new catalog that replaces the live one whole.
//!
//! The files are polled (a fingerprint of every file's resolved path, size
//! and modification time) rather than watched through inotify: a mounted
//! ConfigMap changes by swapping a `..data` symlink, which inotify on the
//! directory reports unreliably, and a poll of a few `stat`s every half
//! second costs nothing. A change that does not load (bad YAML, an invalid
//! definition) leaves the current catalog serving: half a catalog is never
//! served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub mod host;
pub mod stored;

use crate::apiextensions::catalog::{Catalog, CatalogError};
pub use crate::apiextensions::live::LiveCatalog;

/// Where the catalog comes from: definition files, built-in manifests,
/// when kshard serves the CustomResourceDefinition API, stored definitions,
/// and behind a host, the host's ShardResourceDefinitions.
#[derive(Clone)]
pub struct Sources {
    pub paths: Vec<PathBuf>,
    pub builtin: Vec<(PathBuf, String)>,
    /// Strategies of types whose strategy lives above the catalog.
    pub strategies: crate::apiextensions::strategy::Strategies,
    pub serve_definitions: bool,
    pub host: Option<host::HostDefinitions>,
}

/// A loaded catalog, and the definition objects it could not take, by name
/// with the reason (their status says it).
pub struct Loaded {
    pub catalog: Catalog,
    pub rejected_stored: HashMap<String, String>,
    pub rejected_host: HashMap<String, String>,
}

impl Sources {
    pub fn load(&self) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::load(&self.paths)?;
        catalog.register_strategies(self.strategies.clone());
        for (name, text) in &self.builtin {
            catalog.add_builtin_manifests(name, text)?;
        }
        Ok(catalog)
    }

    /// [`Sources::load`] plus definition objects: stored ones and the
    /// host's. Files come first, so a definition object that collides with
    /// a file is the one refused.
    pub fn load_with(
        &self,
        stored: &[serde_json::Value],
        host: &[serde_json::Value],
    ) -> Result<Loaded, CatalogError> {
        let mut catalog = self.load()?;
        let rejected_stored = stored::add_stored(&mut catalog, stored);
        let rejected_host = stored::add_definitions(&mut catalog, host, host::source_of, false);
        Ok(Loaded {
            catalog,
            rejected_stored,
            rejected_host,
        })
    }
}

/// What identifies the definition files' content without reading it.
pub fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, true, &mut files);
    }
    files.sort();
    files
}

fn collect(p: &Path, top: bool, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
    // Resolve symlinks, so a swapped `..data` link shows as new files.
    let Ok(real) = std::fs::canonicalize(p) else {
        return;
    };
    let Ok(meta) = std::fs::metadata(&real) else {
        return;
    };
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(&real) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            // ConfigMap mounts keep their data in hidden `..` entries, reached
            // through the visible symlinks.
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            collect(&p.join(name), false, out);
        }
    } else if top || crate::apiextensions::catalog::is_manifest(&real) {
        out.push((real, meta.len(), meta.modified().ok()));
    }
}

/// Follows the definition files (polled), the stored definitions (read
/// from the watch cache) and the host's definitions (pushed by their
/// reflector, so a change is served at once), replaces the catalog when any
/// of them changes, and keeps the definition objects' status and cleanup.
pub fn spawn_watcher(
    sources: Sources,
    registry: Arc<crate::registry::Registry>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let paths = sources.paths.clone();
        let mut seen_files = tokio::task::spawn_blocking(move || fingerprint(&paths))
            .await
            .unwrap_or_default();
        let mut seen_stored: Option<Vec<(String, String)>> = None;
        let mut seen_host: Option<Vec<serde_json::Value>> = None;
        let mut host_changes = sources.host.as_ref().map(|h| h.subscribe());
        let mut rejected = HashMap::new();
        let mut rejected_host = HashMap::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
                Ok(()) = async {
                    match host_changes.as_mut() {
                        Some(rx) => rx.changed().await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
            let paths = sources.paths.clone();
            let Ok(files) = tokio::task::spawn_blocking(move || fingerprint(&paths)).await else {
                continue;
            };
            let stored = if sources.serve_definitions {
                stored::stored(&registry).await
            } else {
                Vec::new()
            };
            let stored_now: Vec<(String, String)> = stored
                .iter()
                .map(|d| {
                    let at = |p: &str| d.pointer(p).and_then(|v| v.as_str()).unwrap_or_default();
                    (
                        at("/metadata/name").to_string(),
                        at("/metadata/resourceVersion").to_string(),
                    )
                })
                .collect();
            let host_defs = sources.host.as_ref().and_then(|h| h.current());
            // What is served from a host definition: its spec, and whether it
            // is being deleted (status and finalizer writes change nothing).
            let host_now = host_defs.as_ref().map(|defs| {
                defs.iter()
                    .map(|d| {
                        serde_json::json!([
                            d.pointer("/metadata/name"),
                            d.get("spec"),
                            crate::apiextensions::crd_resource::deleting(d)
                        ])
                    })
                    .collect::<Vec<_>>()
            });
            if files != seen_files
                || seen_stored.as_ref() != Some(&stored_now)
                || seen_host != host_now
            {
                let s = sources.clone();
                let host_list = host_defs.clone().unwrap_or_default();
                match tokio::task::spawn_blocking(move || s.load_with(&stored, &host_list)).await {
                    Ok(Ok(loaded)) => {
                        let catalog = loaded.catalog;
                        let same = registry.catalog().same_resources(&catalog);
                        if !same {
                            tracing::info!(
                                resources = catalog.resources.len(),
                                "definitions changed; now serving the new catalog"
                            );
                            registry.live_catalog().replace(catalog);
                            metrics::counter!("kshard_definitions_reloads_total", "result" => "ok")
                                .increment(1);
                        }
                        for (name, reason) in &loaded.rejected_host {
                            if rejected_host.get(name) != Some(reason) {
                                tracing::warn!(definition = %name, %reason, "a host definition is not served");
                            }
                        }
                        rejected = loaded.rejected_stored;
                        rejected_host = loaded.rejected_host;
                        if host_defs.is_some() {
                            if let Some(h) = &sources.host {
                                h.mark_loaded();
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::error!(error = %e, "definitions changed but do not load; still serving the previous ones");
                        metrics::counter!("kshard_definitions_reloads_total", "result" => "error")
                            .increment(1);
                    }
                    Err(e) => tracing::warn!(error = %e, "loading definitions failed"),
                }
                seen_files = files;
                seen_stored = Some(stored_now);
                seen_host = host_now;
            }
            if sources.serve_definitions {
                let catalog = registry.catalog();
                stored::reconcile(&registry, &catalog, &rejected).await;
            }
            if let Some(h) = &sources.host {
                let catalog = registry.catalog();
                h.reconcile(&registry, &catalog, &rejected_host).await;
            }
        }
    })
}
