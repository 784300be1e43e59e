//! get and list with kube's resourceVersion semantics: consistent reads wait for
//! the watch cache to catch up; exact and continued lists read history from
//! the store.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::{storage_error, ContinueToken, Registry, Selectors, Target};
use crate::status::ApiError;
use crate::storage::{Revision, StorageError};
use crate::watch::WatchError;

/// How long a read waits for a revision the cache has not reached yet.
pub const WAIT_FOR_REVISION: Duration = Duration::from_secs(3);

const LIST_TOO_OLD: &str = "The resourceVersion for the provided list is too old.";
const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// Which state a read must reflect (the rows of the resourceVersion tables).
#[derive(Debug, Clone, PartialEq)]
pub enum ReadAt {
    /// Most recent: a consistent read.
    Consistent,
    /// Anything the cache has.
    Any,
    NotOlderThan(Revision),
    Exact(Revision),
    Continue(ContinueToken),
}

#[derive(Clone)]
pub struct Item {
    pub json: Bytes,
    pub value: Arc<Value>,
}

pub struct ListResult {
    pub revision: Revision,
    pub items: Vec<Item>,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

fn wait_error(e: WatchError) -> ApiError {
    match e {
        WatchError::TooLarge { requested, current } => {
            ApiError::too_large_resource_version(requested, current)
        }
        WatchError::TooOld { requested, oldest } => {
            ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
        }
        WatchError::Storage(e) => storage_error(e),
    }
}

impl Registry {
    async fn catch_up(&self, rev: Revision) -> Result<(), ApiError> {
        self.cache
            .wait_for(rev, WAIT_FOR_REVISION)
            .await
            .map_err(wait_error)
    }

    pub async fn get(&self, t: &Target, name: &str, at: &ReadAt) -> Result<Item, ApiError> {
        let not_found = || ApiError::not_found(&t.rt.group, &t.rt.plural, name);
        match at {
            ReadAt::Consistent | ReadAt::Exact(_) | ReadAt::Continue(_) => {
                let (_, json) = self
                    .store
                    .get(&t.key(name))
                    .await
                    .map_err(storage_error)?
                    .ok_or_else(not_found)?;
                let mut value: Value = serde_json::from_slice(&json).map_err(ApiError::internal)?;
                let json = if super::default_on_read(&self.catalog, &t.rt.id(), &mut value) {
                    Bytes::from(serde_json::to_vec(&value).map_err(ApiError::internal)?)
                } else {
                    json
                };
                Ok(Item {
                    json,
                    value: Arc::new(value),
                })
            }
            ReadAt::Any | ReadAt::NotOlderThan(_) => {
                if let ReadAt::NotOlderThan(rev) = at {
                    self.catch_up(*rev).await?;
                }
                let (_, obj) = self.cache.get(&t.rt.id(), &t.cache_key(name));
                let obj = obj.ok_or_else(not_found)?;
                Ok(Item {
                    json: obj.json.clone(),
                    value: obj.value.clone(),
                })
            }
        }
    }

    pub async fn list(
        &self,
        t: &Target,
        sel: &Selectors,
        at: &ReadAt,
        limit: Option<usize>,
    ) -> Result<ListResult, ApiError> {
        match at {
            ReadAt::Consistent => {
                let rev = self.store.read_revision().await.map_err(storage_error)?;
                match self.cache.wait_for(rev, WAIT_FOR_REVISION).await {
                    Ok(()) => Ok(self.list_cached(t, sel, limit)),
                    // A lagging cache must not make a consistent read fail: read the store.
                    Err(_) => self.list_store(t, sel, rev, None, limit).await,
                }
            }
            ReadAt::Any => Ok(self.list_cached(t, sel, limit)),
            ReadAt::NotOlderThan(rev) => {
                self.catch_up(*rev).await?;
                Ok(self.list_cached(t, sel, limit))
            }
            ReadAt::Exact(rev) => {
                if *rev > self.store.revision() {
                    self.catch_up(*rev).await?;
                }
                self.list_store(t, sel, *rev, None, limit)
                    .await
                    .map_err(|e| {
                        if e.code == 410 {
                            ApiError::expired(LIST_TOO_OLD)
                        } else {
                            e
                        }
                    })
            }
            ReadAt::Continue(token) => {
                let after = Some(format!("{}/{}", t.rt.id(), token.after()));
                let rev = if token.rv < 0 {
                    self.store.read_revision().await.map_err(storage_error)?
                } else {
                    token.rv as Revision
                };
                self.list_store(t, sel, rev, after, limit)
                    .await
                    .map_err(|e| {
                        if e.code == 410 {
                            let mut e = ApiError::expired(CONTINUE_TOO_OLD);
                            e.continue_token = Some(ContinueToken::latest(&token.start).encode());
                            e
                        } else {
                            e
                        }
                    })
            }
        }
    }

    fn list_cached(&self, t: &Target, sel: &Selectors, limit: Option<usize>) -> ListResult {
        let filter = self.filter(t, None, sel);
        let (revision, objects) = self.cache.list(&t.rt.id(), &filter);
        let total = objects.len();
        let take = limit.unwrap_or(total).min(total);
        let items: Vec<Item> = objects[..take]
            .iter()
            .map(|o| Item {
                json: o.json.clone(),
                value: o.value.clone(),
            })
            .collect();
        let more = take < total;
        ListResult {
            revision,
            continue_token: (more && take > 0)
                .then(|| ContinueToken::new(revision, &objects[take - 1].key).encode()),
            remaining: (more && sel.is_empty()).then_some((total - take) as u64),
            items,
        }
    }

    async fn list_store(
        &self,
        t: &Target,
        sel: &Selectors,
        rev: Revision,
        after: Option<String>,
        limit: Option<usize>,
    ) -> Result<ListResult, ApiError> {
        let sel2 = sel.clone();
        let filter: crate::storage::ValueFilter = if sel.is_empty() {
            Arc::new(|_| true)
        } else {
            Arc::new(move |json: &[u8]| {
                serde_json::from_slice::<Value>(json).is_ok_and(|v| sel2.matches(&v))
            })
        };
        let page = self
            .store
            .list(&t.collection_prefix(), rev, after, limit, filter)
            .await
            .map_err(|e| match e {
                StorageError::Compacted { .. } => ApiError::expired(LIST_TOO_OLD),
                other => storage_error(other),
            })?;
        let resource_prefix = format!("{}/", t.rt.id());
        let mut items = Vec::with_capacity(page.items.len());
        let resource = t.rt.id();
        for (_, json) in page.items {
            let mut value: Value = serde_json::from_slice(&json).map_err(ApiError::internal)?;
            let json = if super::default_on_read(&self.catalog, &resource, &mut value) {
                Bytes::from(serde_json::to_vec(&value).map_err(ApiError::internal)?)
            } else {
                json
            };
            items.push(Item {
                json,
                value: Arc::new(value),
            });
        }
        Ok(ListResult {
            revision: page.revision,
            continue_token: page.continue_after.map(|k| {
                ContinueToken::new(rev, k.strip_prefix(&resource_prefix).unwrap_or(&k)).encode()
            }),
            remaining: (page.remaining > 0 && sel.is_empty()).then_some(page.remaining),
            items,
        })
    }
}
