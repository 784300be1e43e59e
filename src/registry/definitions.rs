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

/// Where the catalog comes from: definition files, plus built-in manifests.
#[derive(Clone)]
pub struct Sources {
    pub paths: Vec<PathBuf>,
    pub builtin: Vec<(PathBuf, String)>,
}

impl Sources {
    pub fn load(&self) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::load(&self.paths)?;
        for (name, text) in &self.builtin {
            catalog.add_manifests(name, text)?;
        }
        Ok(catalog)
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

/// Polls the definition files and replaces the catalog when they change.
pub fn spawn_watcher(
    sources: Sources,
    live: Arc<LiveCatalog>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let paths = sources.paths.clone();
        let mut seen = tokio::task::spawn_blocking(move || fingerprint(&paths))
            .await
            .unwrap_or_default();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let paths = sources.paths.clone();
            let Ok(now) = tokio::task::spawn_blocking(move || fingerprint(&paths)).await else {
                continue;
            };
            if now == seen {
                continue;
            }
            let s = sources.clone();
            match tokio::task::spawn_blocking(move || s.load()).await {
                Ok(Ok(catalog)) => {
                    tracing::info!(
                        resources = catalog.resources.len(),
                        "definitions changed; now serving the new catalog"
                    );
                    live.replace(catalog);
                    metrics::counter!("kshard_definitions_reloads_total", "result" => "ok")
                        .increment(1);
                    seen = now;
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "definitions changed but do not load; still serving the previous ones");
                    metrics::counter!("kshard_definitions_reloads_total", "result" => "error")
                        .increment(1);
                    seen = now;
                }
                Err(e) => tracing::warn!(error = %e, "loading definitions failed"),
            }
        }
    })
}
