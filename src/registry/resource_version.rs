//! kube's resourceVersion rules, in one place: parsing `resourceVersion`,
//! `resourceVersionMatch`, `continue` and `sendInitialEvents` into the rows of
//! the get, list and watch tables; which revision a read waits for or reads
//! at; and when that revision is too old (410 Expired) or too large (504).
//! Everything else in the registry asks this module.

use std::time::Duration;

use super::{storage_error, ContinueToken, Registry};
use crate::status::{quote, ApiError, FieldError};
use crate::storage::{Revision, StorageError};
use crate::watch::{Filter, Start, Subscription, WatchError};

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

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchStart {
    /// Initial state (synthetic ADDED) at a consistent revision, then changes.
    InitialConsistent,
    /// Initial state at whatever the cache has (at least this revision), then changes.
    InitialNotOlderThan(Revision),
    /// Changes after a revision (no initial state).
    After(Revision),
    /// Changes from now on.
    Now,
}

/// The resourceVersion-related options of a get, list or watch, as sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requested<'a> {
    pub resource_version: &'a str,
    pub resource_version_match: &'a str,
    pub continue_: &'a str,
    pub limit: Option<usize>,
    pub send_initial_events: Option<bool>,
    pub allow_watch_bookmarks: bool,
}

/// A started watch, or one that starts below what the cache still holds.
pub enum Watch {
    Started(Subscription),
    /// kube answers such a watch with 200 and this as its one ERROR event (410).
    Expired(ApiError),
}

fn list_options_invalid(errs: &[FieldError]) -> ApiError {
    ApiError::invalid("meta.k8s.io", "ListOptions", "", errs)
}

/// A `resourceVersion` query parameter.
pub fn parse_revision(rv: &str) -> Result<Revision, ApiError> {
    rv.parse::<Revision>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version: resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: invalid syntax",
            quote(rv),
            quote(rv)
        ))
    })
}

/// A `resourceVersion` inside an object (`field` names where, for the message).
pub fn parse_object_revision(field: &str, rv: &str) -> Result<Revision, ApiError> {
    rv.parse::<Revision>().map_err(|e| {
        ApiError::bad_request(format!(
            "invalid resource version: {field}: Invalid value: {}: {e}",
            quote(rv)
        ))
    })
}

/// The get table: unset is consistent, "0" is anything cached, else not older than.
pub fn get_read_at(resource_version: &str) -> Result<ReadAt, ApiError> {
    Ok(match resource_version {
        "" => ReadAt::Consistent,
        "0" => ReadAt::Any,
        rv => ReadAt::NotOlderThan(parse_revision(rv)?),
    })
}

/// kube's ValidateListOptions for list requests, then the list table.
pub fn list_read_at(r: &Requested) -> Result<ReadAt, ApiError> {
    let mut errs = Vec::new();
    let m = r.resource_version_match;
    if !m.is_empty() {
        if r.resource_version.is_empty() {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !r.continue_.is_empty() {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if m != "Exact" && m != "NotOlderThan" {
            errs.push(FieldError::not_supported(
                "resourceVersionMatch",
                m,
                &["Exact", "NotOlderThan", ""],
            ));
        }
        if m == "Exact" && r.resource_version == "0" {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if r.send_initial_events.is_some() {
        errs.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if !errs.is_empty() {
        return Err(list_options_invalid(&errs));
    }
    let rv = r.resource_version;
    if !r.continue_.is_empty() {
        if !rv.is_empty() && rv != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        return Ok(ReadAt::Continue(ContinueToken::decode(r.continue_)?));
    }
    Ok(match (rv, m) {
        ("", _) => ReadAt::Consistent,
        ("0", _) => ReadAt::Any,
        (rv, "Exact") => ReadAt::Exact(parse_revision(rv)?),
        (rv, "NotOlderThan") => ReadAt::NotOlderThan(parse_revision(rv)?),
        // Legacy: a resourceVersion with a limit is an exact, paged list.
        (rv, _) if r.limit.is_some() => ReadAt::Exact(parse_revision(rv)?),
        (rv, _) => ReadAt::NotOlderThan(parse_revision(rv)?),
    })
}

/// kube's watch validation (with the WatchList defaults), then the watch table.
/// Returns the start and whether the initial-events-end bookmark is wanted.
pub fn watch_start(r: &Requested) -> Result<(WatchStart, bool), ApiError> {
    let mut errs = Vec::new();
    let m = r.resource_version_match;
    let rv = r.resource_version;
    if r.send_initial_events.is_some() && m != "NotOlderThan" {
        errs.push(FieldError::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if !m.is_empty() {
        if r.send_initial_events.is_none() {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if m != "NotOlderThan" {
            errs.push(FieldError::not_supported(
                "resourceVersionMatch",
                m,
                &["NotOlderThan"],
            ));
        }
        if !r.continue_.is_empty() {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
    }
    if !errs.is_empty() {
        return Err(list_options_invalid(&errs));
    }
    Ok(match r.send_initial_events {
        Some(true) => {
            let start = match rv {
                "" => WatchStart::InitialConsistent,
                "0" => WatchStart::InitialNotOlderThan(0),
                rv => WatchStart::InitialNotOlderThan(parse_revision(rv)?),
            };
            (start, r.allow_watch_bookmarks)
        }
        Some(false) => match rv {
            "" | "0" => (WatchStart::Now, false),
            rv => (WatchStart::After(parse_revision(rv)?), false),
        },
        None => match rv {
            // The WatchList defaults: initial events, with the end bookmark if bookmarks are on.
            "" => (WatchStart::InitialConsistent, r.allow_watch_bookmarks),
            "0" => (WatchStart::InitialNotOlderThan(0), r.allow_watch_bookmarks),
            rv => (WatchStart::After(parse_revision(rv)?), false),
        },
    })
}

/// A revision the cache did not reach in time is "too large" (504, retry);
/// one it no longer holds is "too old" (410).
fn cache_error(e: WatchError) -> ApiError {
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

/// A list from history below the compacted revision (410).
pub(super) fn list_error(e: StorageError) -> ApiError {
    match e {
        StorageError::Compacted { .. } => ApiError::expired(LIST_TOO_OLD),
        other => storage_error(other),
    }
}

/// A continued list whose revision is compacted: 410 with a token that
/// continues from the same key at the latest revision (kube's inconsistent
/// continuation), for clients that accept that.
pub(super) fn continue_error(e: ApiError, token: &ContinueToken) -> ApiError {
    if e.code != 410 {
        return e;
    }
    let mut e = ApiError::expired(CONTINUE_TOO_OLD);
    e.continue_token = Some(ContinueToken::latest(&token.start).encode());
    e
}

impl Registry {
    /// Waits until the cache has reached `rev` (504 when it does not in time).
    pub(super) async fn catch_up(&self, rev: Revision) -> Result<(), ApiError> {
        self.cache
            .wait_for(rev, WAIT_FOR_REVISION)
            .await
            .map_err(cache_error)
    }

    /// The revision a consistent read must reflect.
    pub(super) async fn consistent_revision(&self) -> Result<Revision, ApiError> {
        self.store.read_revision().await.map_err(storage_error)
    }

    /// Waits for the cache to reach the consistent revision; `Err(rev)` when it
    /// lags, so the read goes to the store at `rev` instead (a lagging cache
    /// must not make a consistent read fail).
    pub(super) async fn consistent_cache(&self) -> Result<Result<(), Revision>, ApiError> {
        let rev = self.consistent_revision().await?;
        Ok(self
            .cache
            .wait_for(rev, WAIT_FOR_REVISION)
            .await
            .map_err(|_| rev))
    }

    /// The revision an exact list reads at, once the store has it (a revision
    /// beyond the newest committed one waits like a NotOlderThan read).
    pub(super) async fn exact_revision(&self, rev: Revision) -> Result<Revision, ApiError> {
        if rev > self.store.revision() {
            self.catch_up(rev).await?;
        }
        Ok(rev)
    }

    /// The revision a continued list reads at: the token's, or the latest for
    /// an inconsistent continuation (rv -1).
    pub(super) async fn continue_revision(
        &self,
        token: &ContinueToken,
    ) -> Result<Revision, ApiError> {
        match Revision::try_from(token.rv) {
            Ok(rev) => Ok(rev),
            Err(_) => self.consistent_revision().await,
        }
    }

    /// Starts a watch of `resource` where the watch table says.
    pub async fn watch(
        &self,
        resource: &str,
        filter: Filter,
        start: WatchStart,
    ) -> Result<Watch, ApiError> {
        let from = match start {
            WatchStart::InitialConsistent => {
                let rev = self.consistent_revision().await?;
                self.catch_up(rev).await?;
                Start::InitialState
            }
            WatchStart::InitialNotOlderThan(rev) => {
                self.catch_up(rev).await?;
                Start::InitialState
            }
            WatchStart::After(rev) => Start::After(rev),
            WatchStart::Now => Start::After(self.cache.revision()),
        };
        match self.cache.watch(resource, from, filter) {
            Ok(sub) => Ok(Watch::Started(sub)),
            Err(e @ WatchError::TooOld { .. }) => Ok(Watch::Expired(cache_error(e))),
            Err(e) => Err(cache_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_table() {
        assert_eq!(get_read_at("").ok(), Some(ReadAt::Consistent));
        assert_eq!(get_read_at("0").ok(), Some(ReadAt::Any));
        assert_eq!(get_read_at("7").ok(), Some(ReadAt::NotOlderThan(7)));
        assert_eq!(get_read_at("x").map_err(|e| e.code), Err(400));
    }

    #[test]
    fn compacted_continue_offers_an_inconsistent_token() {
        let token = ContinueToken::new(5, "ns/a");
        let e = continue_error(
            list_error(StorageError::Compacted {
                requested: 5,
                compacted: 9,
            }),
            &token,
        );
        assert_eq!((e.code, e.message.as_str()), (410, CONTINUE_TOO_OLD));
        let next = e
            .continue_token
            .map(|t| ContinueToken::decode(&t).map(|t| t.rv));
        assert_eq!(next.and_then(Result::ok), Some(-1));
        // Other failures pass through unchanged.
        let e = continue_error(ApiError::bad_request("x"), &token);
        assert_eq!(e.code, 400);
    }
}
