//! Query options of list/watch/get/delete/write requests: typed, validated with
//! kube's rules and messages; the resourceVersion tables are
//! `registry::resource_version`'s.

use std::collections::HashMap;

use crate::registry::resource_version::{self, Requested};
use crate::registry::{Preconditions, Propagation, ReadAt, WatchStart};
use crate::status::{quote, ApiError, FieldError};

/// A request's query parameters, every value of each kept in order.
pub struct Query(HashMap<String, Vec<String>>);

impl Query {
    pub fn parse(q: &str) -> Self {
        Self(
            form_urlencoded::parse(q.as_bytes()).fold(HashMap::new(), |mut m, (k, v)| {
                m.entry(k.into_owned())
                    .or_insert_with(Vec::new)
                    .push(v.into_owned());
                m
            }),
        )
    }
    /// The first value (kube reads the first of a repeated scalar parameter).
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).and_then(|v| v.first()).map(String::as_str)
    }
    /// Every value of a list parameter such as `dryRun`.
    pub fn values(&self, k: &str) -> &[String] {
        self.0.get(k).map_or(&[], Vec::as_slice)
    }
    fn str(&self, k: &str) -> String {
        self.get(k).unwrap_or("").to_string()
    }
    /// kube's query bool: absent is `None`; `0` and `false` (any case) are
    /// false; anything else, even an empty value, is true. Never an error.
    pub fn bool(&self, k: &str) -> Option<bool> {
        self.get(k).map(super::request::query_bool)
    }
    fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None | Some("") => Ok(None),
            Some(v) => v.parse::<i64>().map(Some).map_err(|e| {
                ApiError::bad_request(format!(
                    "strconv.ParseInt: parsing {}: {}",
                    quote(v),
                    crate::status::go_parse_failure(&e)
                ))
            }),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub label_selector: String,
    pub field_selector: String,
    pub watch: bool,
    pub allow_watch_bookmarks: bool,
    pub resource_version: String,
    pub resource_version_match: String,
    pub limit: Option<usize>,
    pub continue_: String,
    pub send_initial_events: Option<bool>,
    /// As sent: 0 is unset, a negative value a deadline already past.
    pub timeout_seconds: Option<i64>,
}

impl ListOptions {
    pub fn parse(q: &Query, watch_by_path: bool) -> Result<Self, ApiError> {
        let limit = q.int("limit")?.filter(|l| *l > 0).map(|l| l as usize);
        let timeout_seconds = q.int("timeoutSeconds")?;
        Ok(Self {
            label_selector: q.str("labelSelector"),
            field_selector: q.str("fieldSelector"),
            watch: watch_by_path || q.bool("watch").unwrap_or(false),
            allow_watch_bookmarks: q.bool("allowWatchBookmarks").unwrap_or(false),
            resource_version: q.str("resourceVersion"),
            resource_version_match: q.str("resourceVersionMatch"),
            limit,
            continue_: q.str("continue"),
            send_initial_events: q.bool("sendInitialEvents"),
            timeout_seconds,
        })
    }

    /// The options the resourceVersion rules look at.
    pub fn requested(&self) -> Requested<'_> {
        Requested {
            resource_version: &self.resource_version,
            resource_version_match: &self.resource_version_match,
            continue_: &self.continue_,
            limit: self.limit,
            send_initial_events: self.send_initial_events,
            allow_watch_bookmarks: self.allow_watch_bookmarks,
        }
    }

    /// The list table row these options select (after kube's validation).
    pub fn read_at(&self) -> Result<ReadAt, ApiError> {
        resource_version::list_read_at(&self.requested())
    }

    /// The get table row.
    pub fn get_read_at(&self) -> Result<ReadAt, ApiError> {
        resource_version::get_read_at(&self.resource_version)
    }

    /// Where a watch starts, and whether it ends its initial events with a bookmark.
    pub fn watch_start(&self) -> Result<(WatchStart, bool), ApiError> {
        resource_version::watch_start(&self.requested())
    }
}

/// `dryRun` (only `All`), validated as kube validates the request's options
/// (`options_kind`: CreateOptions, UpdateOptions, PatchOptions or
/// DeleteOptions): 422 naming the options and every value, as a JSON list.
pub fn dry_run(q: &Query, options_kind: &str) -> Result<bool, ApiError> {
    let values = q.values("dryRun");
    if values.iter().all(|v| v == "All") {
        return Ok(!values.is_empty());
    }
    let listed: Vec<String> = values.iter().map(|v| quote(v)).collect();
    Err(ApiError::invalid(
        "meta.k8s.io",
        options_kind,
        "",
        &[FieldError::new(
            crate::status::FieldErrorKind::NotSupported,
            "dryRun",
            Some(format!("[{}]", listed.join(","))),
            "supported values: \"All\"",
        )],
    ))
}

/// Create/update/patch options: dryRun, fieldValidation and the field manager
/// (from `fieldManager`, else derived from the User-Agent; required for apply).
pub fn write_options(
    q: &Query,
    headers: &http::HeaderMap,
    is_apply: bool,
    options_kind: &str,
) -> Result<crate::registry::WriteOptions, ApiError> {
    use crate::registry::FieldValidation;
    let field_validation = match q.get("fieldValidation").unwrap_or("") {
        "" | "Warn" => FieldValidation::Warn,
        "Strict" => FieldValidation::Strict,
        "Ignore" => FieldValidation::Ignore,
        other => {
            // kube validates the options object: 422 naming it.
            return Err(ApiError::invalid(
                "meta.k8s.io",
                options_kind,
                "",
                &[FieldError::new(
                    crate::status::FieldErrorKind::NotSupported,
                    "fieldValidation",
                    Some(quote(other)),
                    "supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
                )],
            ));
        }
    };
    let explicit = q.get("fieldManager").unwrap_or("");
    if explicit.chars().count() > 128 {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            if is_apply {
                "PatchOptions"
            } else {
                "CreateOptions"
            },
            "",
            &[FieldError::new(
                crate::status::FieldErrorKind::TooLong,
                "fieldManager",
                None,
                "may not be more than 128 bytes",
            )],
        ));
    }
    let manager = if !explicit.is_empty() {
        explicit.to_string()
    } else if is_apply {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            &[FieldError::required(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    } else {
        let ua = headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        crate::apply::default_manager(ua)
    };
    Ok(crate::registry::WriteOptions {
        dry_run: dry_run(q, options_kind)?,
        field_validation,
        manager,
        caller: None,
        strict_duplicates: Vec::new(),
    })
}

/// DeleteOptions from the query and an optional JSON body.
pub fn delete_options(q: &Query, body: &[u8]) -> Result<crate::registry::DeleteOptions, ApiError> {
    // kube decodes the query's parameters first: a grace period that is
    // not a number is a 400 whether or not the object exists.
    q.int("gracePeriodSeconds")?;
    let mut opts = crate::registry::DeleteOptions {
        dry_run: dry_run(q, "DeleteOptions")?,
        ..Default::default()
    };
    let mut propagation = q.get("propagationPolicy").map(str::to_string);
    let mut orphan = q.bool("orphanDependents");
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
        if let Some(p) = v.get("propagationPolicy").and_then(|p| p.as_str()) {
            propagation = Some(p.to_string());
        }
        if let Some(o) = v.get("orphanDependents").and_then(|p| p.as_bool()) {
            orphan = Some(o);
        }
        if let Some(pre) = v.get("preconditions") {
            let field = |f: &str| pre.get(f).and_then(|u| u.as_str()).map(str::to_string);
            opts.preconditions = Preconditions {
                uid: field("uid"),
                resource_version: field("resourceVersion"),
            };
        }
        if let Some(d) = v.get("dryRun").and_then(|d| d.as_array()) {
            for x in d {
                if x.as_str() != Some("All") {
                    return Err(ApiError::bad_request(format!(
                        "dryRun: Unsupported value: {x}: supported values: \"All\""
                    )));
                }
                opts.dry_run = true;
            }
        }
    }
    if propagation.is_some() && orphan.is_some() {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            &[FieldError::invalid(
                "propagationPolicy",
                propagation.as_deref().unwrap_or(""),
                "orphanDependents and deletionPropagation cannot be both set",
            )],
        ));
    }
    opts.propagation = match (propagation.as_deref(), orphan) {
        (Some("Foreground"), _) => Some(Propagation::Foreground),
        (Some("Background"), _) => Some(Propagation::Background),
        (Some("Orphan"), _) | (None, Some(true)) => Some(Propagation::Orphan),
        (None, _) => None,
        (Some(other), _) => {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "DeleteOptions",
                "",
                &[FieldError::not_supported(
                    "propagationPolicy",
                    other,
                    &["Foreground", "Background", "Orphan", "nil"],
                )],
            ))
        }
    };
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The tables themselves are tested in `registry::resource_version`; this
    /// checks the options reach them.
    #[test]
    fn options_reach_the_resource_version_tables() {
        let opts = |q: &str| ListOptions::parse(&Query::parse(q), false).expect("parse");
        let o = opts("limit=2&resourceVersion=5");
        assert_eq!(o.read_at().ok(), Some(ReadAt::Exact(5)));
        assert_eq!(o.get_read_at().ok(), Some(ReadAt::NotOlderThan(5)));
        let o = opts("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true");
        assert_eq!(
            o.watch_start().ok(),
            Some((WatchStart::InitialConsistent, true))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Any query string: options or a kube error, for every kind of request.
        #[test]
        fn prop_query_options_never_panic(
            q in crate::fuzz::query(),
            by_path in any::<bool>(),
            apply in any::<bool>(),
            body in crate::fuzz::body_bytes(),
            user_agent in crate::fuzz::text(&["kubectl", "/", "v1.30", " ", "(linux)", "\u{7f}", "é", "\t"], 12),
        ) {
            let q = Query::parse(&q);
            if let Ok(o) = ListOptions::parse(&q, by_path) {
                let _ = (o.read_at(), o.get_read_at(), o.watch_start());
                let _ = resource_version::parse_revision(&o.resource_version);
                let _ = resource_version::parse_object_revision("metadata.resourceVersion", &o.resource_version);
            }
            let _ = dry_run(&q, "CreateOptions");
            let mut headers = http::HeaderMap::new();
            if let Ok(ua) = http::HeaderValue::from_str(&user_agent) {
                headers.insert(http::header::USER_AGENT, ua);
            }
            let _ = write_options(&q, &headers, apply, "PatchOptions");
            let _ = delete_options(&q, &body);
        }
    }
}
