//! Live definitions: the catalog the server answers from, replaced whole
//! when the definitions change, and the watcher of the definition files.
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
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use super::catalog::{Catalog, CatalogError};

/// The served types; readers take the current catalog, a change replaces it.
pub struct LiveCatalog {
    current: RwLock<Arc<Catalog>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl LiveCatalog {
    pub fn new(catalog: Catalog) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(catalog)),
            changed: tokio::sync::watch::Sender::new(0),
        })
    }

    pub fn get(&self) -> Arc<Catalog> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, catalog: Catalog) {
        let catalog = Arc::new(catalog);
        match self.current.write() {
            Ok(mut c) => *c = catalog,
            Err(poisoned) => *poisoned.into_inner() = catalog,
        }
        self.changed.send_modify(|g| *g += 1);
    }

    /// Wakes on every replacement (watches of a resource that went away end).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Where the catalog comes from: definition files, built-in manifests and,
/// when kshard serves the CustomResourceDefinition API, stored definitions.
#[derive(Clone)]
pub struct Sources {
    pub paths: Vec<PathBuf>,
    pub builtin: Vec<(PathBuf, String)>,
    pub serve_definitions: bool,
}

impl Sources {
    pub fn load(&self) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::load(&self.paths)?;
        for (name, text) in &self.builtin {
            catalog.add_builtin_manifests(name, text)?;
        }
        Ok(catalog)
    }

    /// [`Sources::load`] plus stored definitions; those the catalog cannot
    /// take are returned by name with the reason.
    pub fn load_with(
        &self,
        stored: &[serde_json::Value],
    ) -> Result<(Catalog, HashMap<String, String>), CatalogError> {
        let mut catalog = self.load()?;
        let rejected = super::crds::add_stored(&mut catalog, stored);
        Ok((catalog, rejected))
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
    } else if top || super::catalog::is_manifest(&real) {
        out.push((real, meta.len(), meta.modified().ok()));
    }
}

/// Follows the definition files (polled) and the stored definitions (read
/// from the watch cache), replaces the catalog when either changes, and keeps
/// the stored definitions' status and cleanup.
pub fn spawn_watcher(
    sources: Sources,
    registry: Arc<super::Registry>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let paths = sources.paths.clone();
        let mut seen_files = tokio::task::spawn_blocking(move || fingerprint(&paths))
            .await
            .unwrap_or_default();
        let mut seen_stored: Option<Vec<(String, String)>> = None;
        let mut rejected = HashMap::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let paths = sources.paths.clone();
            let Ok(files) = tokio::task::spawn_blocking(move || fingerprint(&paths)).await else {
                continue;
            };
            let stored = if sources.serve_definitions {
                super::crds::stored(&registry).await
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
            if files != seen_files || seen_stored.as_ref() != Some(&stored_now) {
                let s = sources.clone();
                match tokio::task::spawn_blocking(move || s.load_with(&stored)).await {
                    Ok(Ok((catalog, refused))) => {
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
                        rejected = refused;
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
            }
            if sources.serve_definitions {
                let catalog = registry.catalog();
                super::crds::reconcile(&registry, &catalog, &rejected).await;
            }
        }
    })
}
