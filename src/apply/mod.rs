//! Server-side apply and managedFields, as kube-apiserver does them for
//! custom resources (structured-merge-diff + apimachinery `managedfields`).
//!
//! Pure logic over `serde_json::Value` objects; the write pipeline calls it:
//!
//! - every non-apply write (create, update, JSON/merge patch, on the main
//!   resource or `/status`) calls [`FieldManager::update`] with the old and
//!   new object before storing, so the writer's Update entry is recorded;
//! - `application/apply-patch+yaml` calls [`FieldManager::apply`] with the
//!   live object (`None` to create) and the parsed configuration, then runs
//!   the usual strategy (defaults, status/spec reset, validation) on the result.
//!
//! ```ignore
//! let schema = MergeSchema::from_openapi(version.schema.as_ref());
//! let fm = FieldManager::new(&schema, "demo.kshard.dev/v1", None, status_enabled);
//! fm.update(Some(&old), &mut new, &default_manager(user_agent), &now)?;
//! let obj = fm.apply(Some(&live), &config, "kubectl", force, &now)?; // 409 on conflicts
//! ```
//!
//! Entries written at other versions are compared at their own version, as
//! structured-merge-diff's `Updater` does: the old and new objects are
//! converted through [`Versions`] (the definition's conversion webhook, or an
//! apiVersion rewrite under strategy None) and compared with that version's
//! schema, so conflicts and removals are in the owner's field names. Without
//! [`FieldManager::with_versions`] every version is a rewrite sharing one
//! schema. Modules: [`fieldpath`] (paths, sets, FieldsV1),
//! [`schema`] (the merge view of a CRD schema), `merge` (merge, compare,
//! field sets, removal), `managed` (managedFields: one module per concern
//! of kube's field manager layers), `time` (managedFields timestamps).

pub mod fieldpath;
mod managed;
mod merge;
pub mod schema;
mod time;

use serde_json::Value;

pub use fieldpath::{Path, PathElement, Set};
pub use managed::LAST_APPLIED_ANNOTATION;
pub use schema::MergeSchema;

/// Longest manager name kube derives from a User-Agent.
const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// One field another manager owns with a different value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager's name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// Empty for Apply entries (kube leaves it out of their identity).
    pub api_version: String,
    pub subresource: String,
    /// kube's path string, e.g. `.spec.replicas`.
    pub field: String,
    /// kube's rendering of the manager: `"m"`, `"m" using v1`, `"m" with subresource "status"`.
    pub description: String,
    /// The manager identifier kube sorts messages by.
    id: String,
}

impl Conflict {
    /// The `message` of the status cause (type `FieldManagerConflict`, field [`Conflict::field`]).
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.description)
    }
}

/// Why a write could not be tracked or applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// 409 Conflict, reason `Conflict`, one cause per conflict.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// 400 Bad Request.
    #[error("{0}")]
    BadRequest(String),
    /// 500 Internal Server Error (kube returns 500 for schema errors in an
    /// applied configuration: "failed to create typed patch object ...").
    #[error("{0}")]
    Internal(String),
}

impl ApplyError {
    /// The HTTP status kube answers with.
    pub fn status_code(&self) -> u16 {
        match self {
            ApplyError::Conflicts(_) => 409,
            ApplyError::BadRequest(_) => 400,
            ApplyError::Internal(_) => 500,
        }
    }
}

/// kube's conflict message: one conflict on one line, several grouped by
/// manager (sorted by manager identifier) with one path per line.
fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.description, c.field
        );
    }
    let mut ids: Vec<&str> = conflicts.iter().map(|c| c.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    let mut lines = Vec::new();
    for id in ids {
        let mine: Vec<&Conflict> = conflicts.iter().filter(|c| c.id == id).collect();
        if let Some(first) = mine.first() {
            lines.push(format!("conflicts with {}:", first.description));
        }
        lines.extend(mine.iter().map(|c| format!("- {}", c.field)));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Why an object could not be converted for the field manager.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// The resource has no such version: managers recorded at it are
    /// dropped (structured-merge-diff's `IsMissingVersionError`).
    #[error("no version {0} of the resource")]
    MissingVersion(String),
    /// Anything else (a failing webhook) fails an apply.
    #[error("{0}")]
    Failed(String),
}

/// The other versions of the resource a field manager works on.
pub trait Versions: Send + Sync {
    /// The merge schema of `api_version` (`group/version`); `None` when the
    /// resource has no such version.
    fn schema(&self, api_version: &str) -> Option<&MergeSchema>;
    /// Whether converting only rewrites `apiVersion` (strategy None): then
    /// objects are compared as they are, with the target version's schema.
    fn rewrites_only(&self) -> bool;
    /// Converts `objs` (of one version) to `api_version`, one result per
    /// object in order, in one call (one ConversionReview).
    fn convert(&self, objs: &[&Value], api_version: &str) -> Result<Vec<Value>, ConvertError>;
}

/// Tracks field ownership for one resource version and endpoint.
pub struct FieldManager<'a> {
    schema: &'a MergeSchema,
    api_version: String,
    subresource: Option<String>,
    /// Fields the strategy resets on this endpoint; nobody owns them here.
    reset: Set,
    /// Other versions, and the conversions made for this request.
    converter: managed::versions::VersionConverter<'a>,
    /// Top-level object fields the kind always has, even empty (kube's
    /// built-in types' non-pointer structs such as `spec`): a create does
    /// not own them as such, only what is set inside them.
    present: &'static [&'static str],
}

impl<'a> FieldManager<'a> {
    /// `api_version` is the request's group/version; `subresource` is
    /// `Some("status")` on `/status`. `status_subresource` says whether the
    /// CRD version enables the status subresource: then writes to the main
    /// resource do not own `status`, and writes to `/status` never own `spec`.
    pub fn new(
        schema: &'a MergeSchema,
        api_version: &str,
        subresource: Option<&str>,
        status_subresource: bool,
    ) -> FieldManager<'a> {
        let mut reset = Set::new();
        match subresource {
            Some("status") => reset.insert(&[PathElement::Field("spec".into())]),
            Some(_) => {}
            None if status_subresource => reset.insert(&[PathElement::Field("status".into())]),
            None => {}
        }
        FieldManager {
            schema,
            api_version: api_version.to_string(),
            subresource: subresource.map(String::from),
            reset,
            converter: managed::versions::VersionConverter::rewrite_only(),
            present: &[],
        }
    }

    /// Names the top-level fields the kind always carries (see `present`).
    pub fn with_present_fields(mut self, fields: &'static [&'static str]) -> FieldManager<'a> {
        self.present = fields;
        self
    }

    /// Compares at each manager's own version through `versions`.
    pub fn with_versions(mut self, versions: Box<dyn Versions + 'a>) -> FieldManager<'a> {
        self.converter = managed::versions::VersionConverter::new(versions);
        self
    }
}

/// The manager kube records for a write without `fieldManager`: the
/// User-Agent up to its first `/`, without unprintable characters, at most
/// 128 bytes (e.g. `kubectl/v1.30.0 (linux/amd64)` gives `kubectl`).
pub fn default_manager(user_agent: &str) -> String {
    let prefix = user_agent.split('/').next().unwrap_or("");
    let mut out = String::new();
    for c in prefix.chars() {
        if c.is_control() || (c.is_whitespace() && c != ' ') {
            continue;
        }
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod tests;
