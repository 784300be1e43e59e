//! The catalog the server answers from: replaced whole when the
//! definitions change (half a catalog is never served), with a signal for
//! those that follow the changes (watches of a resource that went away end).

use std::sync::{Arc, RwLock};

use super::catalog::Catalog;

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
