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
    // Go's ParseUint takes no sign, and says which of syntax or range failed.
    let parsed = if rv.starts_with('+') {
        Err("invalid syntax")
    } else {
        rv.parse::<Revision>()
            .map_err(|e| crate::status::go_parse_failure(&e))
    };
    parsed.map_err(|why| {
        ApiError::bad_request(format!(
            "invalid resource version: resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: {why}",
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

    /// A query string's resourceVersion options, read as `ListOptions` reads them.
    struct Opts(std::collections::HashMap<String, String>);

    impl Opts {
        fn requested(&self) -> Requested<'_> {
            let get = |k: &str| self.0.get(k).map_or("", String::as_str);
            Requested {
                resource_version: get("resourceVersion"),
                resource_version_match: get("resourceVersionMatch"),
                continue_: get("continue"),
                limit: self.0.get("limit").and_then(|l| l.parse().ok()),
                send_initial_events: self.0.get("sendInitialEvents").map(|v| v == "true"),
                allow_watch_bookmarks: get("allowWatchBookmarks") == "true",
            }
        }
        fn read_at(&self) -> Result<ReadAt, ApiError> {
            list_read_at(&self.requested())
        }
        fn watch_start(&self) -> Result<(WatchStart, bool), ApiError> {
            watch_start(&self.requested())
        }
    }

    fn opts(q: &str) -> Opts {
        Opts(
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The list table of the API concepts page, row by row.
    #[test]
    fn list_resource_version_table() {
        let rows: &[(&str, ReadAt)] = &[
            ("", ReadAt::Consistent),
            ("resourceVersion=0", ReadAt::Any),
            ("resourceVersion=5", ReadAt::NotOlderThan(5)),
            ("limit=2", ReadAt::Consistent),
            ("limit=2&resourceVersion=0", ReadAt::Any),
            ("limit=2&resourceVersion=5", ReadAt::Exact(5)),
            (
                "resourceVersion=5&resourceVersionMatch=Exact",
                ReadAt::Exact(5),
            ),
            (
                "limit=2&resourceVersion=5&resourceVersionMatch=Exact",
                ReadAt::Exact(5),
            ),
            (
                "resourceVersion=0&resourceVersionMatch=NotOlderThan",
                ReadAt::Any,
            ),
            (
                "resourceVersion=5&resourceVersionMatch=NotOlderThan",
                ReadAt::NotOlderThan(5),
            ),
            (
                "limit=2&resourceVersion=5&resourceVersionMatch=NotOlderThan",
                ReadAt::NotOlderThan(5),
            ),
        ];
        for (q, want) in rows {
            assert_eq!(&opts(q).read_at().expect(q), want, "{q}");
        }
        let token = ContinueToken::new(7, "ns/a").encode();
        assert!(matches!(
            opts(&format!("limit=2&continue={token}")).read_at(),
            Ok(ReadAt::Continue(_))
        ));
        // rv=0 with continue: treated as the continue token.
        assert!(matches!(
            opts(&format!("limit=2&continue={token}&resourceVersion=0")).read_at(),
            Ok(ReadAt::Continue(_))
        ));
        let e = opts(&format!("limit=2&continue={token}&resourceVersion=5"))
            .read_at()
            .expect_err("400");
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "specifying resource version is not allowed when using continue"
            )
        );
    }

    #[test]
    fn invalid_list_combinations() {
        let e = opts("resourceVersionMatch=Exact")
            .read_at()
            .expect_err("invalid");
        assert_eq!(e.code, 422);
        assert_eq!(e.message, "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided");
        let e = opts("resourceVersion=0&resourceVersionMatch=Exact")
            .read_at()
            .expect_err("invalid");
        assert!(
            e.message
                .contains("resourceVersionMatch \\\"exact\\\" is forbidden")
                || e.message
                    .contains("resourceVersionMatch \"exact\" is forbidden"),
            "{}",
            e.message
        );
        let e = opts("resourceVersion=1&resourceVersionMatch=Bogus")
            .read_at()
            .expect_err("invalid");
        assert!(e.message.contains("Unsupported value: \"Bogus\""));
        let e = opts("sendInitialEvents=true")
            .read_at()
            .expect_err("invalid");
        assert!(e
            .message
            .contains("sendInitialEvents is forbidden for list"));
        assert_eq!(
            opts("resourceVersion=abc")
                .read_at()
                .expect_err("bad rv")
                .code,
            400
        );
    }

    /// The watch table, plus streaming lists.
    #[test]
    fn watch_resource_version_table() {
        let w = |q: &str| opts(&format!("watch=1&{q}")).watch_start();
        assert_eq!(w("").expect("unset").0, WatchStart::InitialConsistent);
        assert_eq!(
            w("resourceVersion=0").expect("0").0,
            WatchStart::InitialNotOlderThan(0)
        );
        assert_eq!(w("resourceVersion=9").expect("9").0, WatchStart::After(9));
        let (s, end) =
            w("sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
                .expect("watchlist");
        assert_eq!((s, end), (WatchStart::InitialConsistent, true));
        let (s, _) =
            w("sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=4")
                .expect("watchlist");
        assert_eq!(s, WatchStart::InitialNotOlderThan(4));
        let e = w("sendInitialEvents=true").expect_err("needs match");
        assert!(e
            .message
            .contains("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"));
        let e = w("resourceVersionMatch=NotOlderThan&resourceVersion=1")
            .expect_err("needs sendInitialEvents");
        assert_eq!(e.code, 422);
    }

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
