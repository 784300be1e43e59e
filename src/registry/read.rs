//! get and list: from the watch cache or from the store's history, as
//! `resource_version` decides for the requested `ReadAt`.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

use super::resource_version::{continue_error, list_error, ReadAt};
use super::{storage_error, ContinueToken, Registry, Selectors, Target};
use crate::status::ApiError;
use crate::storage::Revision;
use crate::watch::CachedObject;

/// An object read or written: its JSON, and its parsed value on demand. An
/// item from the watch cache is parsed only when something needs more than
/// its bytes (a JSON answer in its own version needs none).
#[derive(Clone)]
pub struct Item {
    source: Source,
    /// Set when built from a value, or on first use for a cached item. Held
    /// inline (no allocation): a list makes one `Item` per cached object.
    value: OnceLock<Arc<Value>>,
}

/// Where an item's bytes live. A cached item keeps the cache's object: its
/// bytes, apiVersion and reference count sit together, so a list touches
/// one allocation per object besides the bytes it sends.
#[derive(Clone)]
enum Source {
    Json(Bytes),
    Cached(Arc<CachedObject>),
}

impl Item {
    pub fn new(value: impl Into<Arc<Value>>, json: Bytes) -> Self {
        Self {
            source: Source::Json(json),
            value: OnceLock::from(value.into()),
        }
    }

    pub fn cached(o: Arc<CachedObject>) -> Self {
        Self {
            source: Source::Cached(o),
            value: OnceLock::new(),
        }
    }

    /// The object's JSON encoding.
    pub fn json(&self) -> &Bytes {
        match &self.source {
            Source::Json(b) => b,
            Source::Cached(o) => &o.json,
        }
    }

    /// The parsed object. Cached bytes were parsed on their way into the
    /// cache, so parsing them again does not fail; `Null` if it ever did.
    pub fn value(&self) -> &Value {
        self.value
            .get_or_init(|| Arc::new(serde_json::from_slice(self.json()).unwrap_or(Value::Null)))
    }

    pub fn api_version(&self) -> &str {
        match &self.source {
            Source::Cached(o) => o.api_version(),
            Source::Json(_) => self
                .value()
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or(""),
        }
    }
}

pub struct ListResult {
    pub revision: Revision,
    pub items: Vec<Item>,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

impl Registry {
    pub async fn get(&self, t: &Target, name: &str, at: &ReadAt) -> Result<Item, ApiError> {
        let not_found = || ApiError::not_found(&t.rt.group, &t.rt.plural, name);
        match at {
            // A consistent read once the cache has every revision committed
            // when the request came: kube's consistent reads from the watch
            // cache (KEP-2340), here for gets as for lists. No store read,
            // no parse: the cached bytes are the answer.
            ReadAt::Consistent if matches!(self.consistent_cache().await?, Ok(())) => {
                let (_, obj) = self.cache.get(&t.rt.id(), &t.cache_key(name));
                Ok(Item::cached(obj.ok_or_else(not_found)?))
            }
            ReadAt::Consistent | ReadAt::Exact(_) | ReadAt::Continue(_) => {
                let (_, json) = self
                    .store
                    .get(&t.key(name))
                    .await
                    .map_err(storage_error)?
                    .ok_or_else(not_found)?;
                stored_item(t, json)
            }
            ReadAt::Any | ReadAt::NotOlderThan(_) => {
                if let ReadAt::NotOlderThan(rev) = at {
                    self.catch_up(*rev).await?;
                }
                let (_, obj) = self.cache.get(&t.rt.id(), &t.cache_key(name));
                let obj = obj.ok_or_else(not_found)?;
                Ok(Item::cached(obj))
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
            ReadAt::Consistent => match self.consistent_cache().await? {
                Ok(()) => Ok(self.list_cached(t, sel, limit)),
                Err(rev) => self.list_store(t, sel, rev, None, limit).await,
            },
            ReadAt::Any => Ok(self.list_cached(t, sel, limit)),
            ReadAt::NotOlderThan(rev) => {
                self.catch_up(*rev).await?;
                Ok(self.list_cached(t, sel, limit))
            }
            ReadAt::Exact(rev) => {
                let rev = self.exact_revision(*rev).await?;
                self.list_store(t, sel, rev, None, limit).await
            }
            ReadAt::Continue(token) => {
                let rev = self.continue_revision(token).await?;
                if let Some(page) = self.list_cached_at(t, sel, limit, token.after(), rev) {
                    return Ok(page);
                }
                let after = Some(format!("{}/{}", t.rt.id(), token.after()));
                self.list_store(t, sel, rev, after, limit)
                    .await
                    .map_err(|e| continue_error(e, token))
            }
        }
    }

    fn list_cached(&self, t: &Target, sel: &Selectors, limit: Option<usize>) -> ListResult {
        let filter = self.filter(t, None, sel);
        let page = self
            .cache
            .list_page(&t.rt.id(), &filter, limit.unwrap_or(usize::MAX));
        list_result(page, sel)
    }

    /// A continue page at its token's revision from the cache, when the
    /// resource has not changed since (see `Cache::list_page_at`).
    fn list_cached_at(
        &self,
        t: &Target,
        sel: &Selectors,
        limit: Option<usize>,
        after: &str,
        at: Revision,
    ) -> Option<ListResult> {
        let filter = self.filter(t, None, sel);
        let page =
            self.cache
                .list_page_at(&t.rt.id(), &filter, limit.unwrap_or(usize::MAX), after, at)?;
        Some(list_result(page, sel))
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
            .list_counting(
                &t.collection_prefix(),
                rev,
                after,
                limit,
                filter,
                sel.is_empty(),
            )
            .await
            .map_err(list_error)?;
        let resource_prefix = format!("{}/", t.rt.id());
        let mut items = Vec::with_capacity(page.items.len());
        for (_, json) in page.items {
            items.push(stored_item(t, json)?);
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

/// An object read from the store, with the defaults kube adds on read.
fn stored_item(t: &Target, json: Bytes) -> Result<Item, ApiError> {
    let value: Value = serde_json::from_slice(&json).map_err(ApiError::internal)?;
    Ok(match super::read_defaults(&t.rt, &value) {
        Some(v) => {
            let json = Bytes::from(serde_json::to_vec(&v).map_err(ApiError::internal)?);
            Item::new(v, json)
        }
        None => Item::new(value, json),
    })
}

/// A page from the cache as a list answer: a continue token after its last
/// object when more follow, and their count when no selector filtered them.
fn list_result(page: crate::watch::Page, sel: &Selectors) -> ListResult {
    let more = page.more > 0;
    ListResult {
        revision: page.revision,
        continue_token: more
            .then(|| page.items.last())
            .flatten()
            .map(|last| ContinueToken::new(page.revision, &last.key).encode()),
        remaining: (more && sel.is_empty()).then_some(page.more as u64),
        items: page.items.into_iter().map(Item::cached).collect(),
    }
}
