//! kube-apiserver's validation of CustomResourceDefinitions
//! (apiextensions-apiserver's `ValidateCustomResourceDefinition` and
//! `ValidateCustomResourceDefinitionUpdate`), with its field paths, error
//! kinds and messages, so a bad definition gets the same 422 as from kube.
//!
//! kube validates its *internal* form of the definition, converted from v1:
//! when every version carries the same schema (or subresources, printer
//! columns, selectable fields) it is moved to the spec's top level, so
//! errors in it are reported under `spec.validation`, `spec.subresources`,
//! `spec.additionalPrinterColumns` or `spec.selectableFields`; the webhook
//! conversion settings are read as `spec.conversion.webhookClientConfig` and
//! `spec.conversion.conversionReviewVersions`. [`Spec`] is that view.
//!
//! One concept per file: [`schema`] holds the OpenAPI schema rules
//! (`ValidateCustomResourceDefinitionOpenAPISchema`), [`structural`] the
//! structural-schema rules (`ValidateStructural`), [`render`] prints bad
//! values as kube does. The catalog still compiles the definition afterwards
//! (CEL rules and their cost), refusing what it cannot serve.
//!
//! One file (about 1,200 lines before its tests): it follows kube's `validation.go`
//! function by function and in its order, so the two can be read side by side; the schema
//! keyword rules, the structural checks and the rendering of values are their own files.

mod render;
mod schema;
mod structural;

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::object::meta::dns_subdomain_errors;
use crate::schema::formats::matches_dns1035;
use crate::schema::render::field_value;
use crate::status::{quote, FieldError, FieldErrorKind};

/// A CRD's spec as kube's internal type holds it (see the module comment).
pub struct Spec<'a> {
    pub group: &'a str,
    pub scope: &'a str,
    pub names: &'a Map<String, Value>,
    pub versions: Vec<Version<'a>>,
    /// The schema (`{openAPIV3Schema: ...}`) all versions share.
    pub validation: Option<&'a Value>,
    pub subresources: Option<&'a Value>,
    pub columns: Option<&'a Value>,
    pub selectable: Option<&'a Value>,
    pub preserve_unknown_fields: bool,
    pub conversion: Option<&'a Value>,
}

pub struct Version<'a> {
    pub name: &'a str,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub deprecation_warning: Option<&'a Value>,
    pub schema: Option<&'a Value>,
    pub subresources: Option<&'a Value>,
    pub columns: Option<&'a Value>,
    pub selectable: Option<&'a Value>,
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

/// A list field: kube's semantic equality takes empty and absent alike.
fn present_list(v: Option<&Value>) -> Option<&Value> {
    present(v).filter(|v| v.as_array().is_none_or(|a| !a.is_empty()))
}

fn str_at<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn bool_at(v: &Value, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}

static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();

fn empty_map() -> &'static Map<String, Value> {
    EMPTY.get_or_init(Map::new)
}

impl<'a> Spec<'a> {
    /// kube's v1 → internal conversion of `spec`.
    pub fn from_v1(obj: &'a Value) -> Spec<'a> {
        let null = &Value::Null;
        let spec = obj.get("spec").unwrap_or(null);
        let mut versions: Vec<Version<'a>> = spec
            .get("versions")
            .and_then(Value::as_array)
            .map(|vs| {
                vs.iter()
                    .map(|v| Version {
                        name: str_at(v, "name"),
                        served: bool_at(v, "served"),
                        storage: bool_at(v, "storage"),
                        deprecated: bool_at(v, "deprecated"),
                        deprecation_warning: present(v.get("deprecationWarning")),
                        schema: present(v.get("schema")),
                        subresources: present(v.get("subresources")),
                        columns: present_list(v.get("additionalPrinterColumns")),
                        selectable: present_list(v.get("selectableFields")),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Spec {
            group: str_at(spec, "group"),
            scope: str_at(spec, "scope"),
            names: spec
                .get("names")
                .and_then(Value::as_object)
                .unwrap_or_else(|| empty_map()),
            validation: None,
            subresources: None,
            columns: None,
            selectable: None,
            preserve_unknown_fields: bool_at(spec, "preserveUnknownFields"),
            conversion: present(spec.get("conversion")),
            versions: Vec::new(),
        };
        if let Some(first) = versions.first() {
            let (sch, sub, col, sel) = (
                first.schema,
                first.subresources,
                first.columns,
                first.selectable,
            );
            if versions.iter().all(|v| v.schema == sch) {
                out.validation = sch;
                versions.iter_mut().for_each(|v| v.schema = None);
            }
            if versions.iter().all(|v| v.subresources == sub) {
                out.subresources = sub;
                versions.iter_mut().for_each(|v| v.subresources = None);
            }
            if versions.iter().all(|v| v.columns == col) {
                out.columns = col;
                versions.iter_mut().for_each(|v| v.columns = None);
            }
            if versions.iter().all(|v| v.selectable == sel) {
                out.selectable = sel;
                versions.iter_mut().for_each(|v| v.selectable = None);
            }
        }
        out.versions = versions;
        out
    }

    fn names_str(&self, k: &str) -> &'a str {
        self.names
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Every `openAPIV3Schema` of the spec (top level and per version).
    fn schemas(&self) -> Vec<&'a Value> {
        let mut out: Vec<&Value> = Vec::new();
        for v in std::iter::once(self.validation).chain(self.versions.iter().map(|v| v.schema)) {
            if let Some(s) = v.and_then(|v| present(v.get("openAPIV3Schema"))) {
                out.push(s);
            }
        }
        out
    }

    fn has_schema_with(&self, pred: &dyn Fn(&Value) -> bool) -> bool {
        self.schemas()
            .into_iter()
            .any(|s| schema::any_node(s, pred))
    }

    /// `allVersionsSpecifyOpenAPISchema`.
    fn all_versions_have_schema(&self) -> bool {
        if self
            .validation
            .and_then(|v| present(v.get("openAPIV3Schema")))
            .is_some()
        {
            return true;
        }
        self.versions.iter().all(|v| {
            v.schema
                .and_then(|s| present(s.get("openAPIV3Schema")))
                .is_some()
        })
    }
}

/// Checks whose strictness depends on the stored definition on update (kube
/// lets a definition keep what older releases accepted).
#[derive(Clone)]
pub(crate) struct Options {
    pub require_recognized_review_version: bool,
    pub require_immutable_names: bool,
    pub require_openapi_schema: bool,
    pub require_valid_property_type: bool,
    pub require_structural: bool,
    pub require_atomic_set_type: bool,
    pub require_map_list_keys_map_set: bool,
    /// Versions (`""`: the top level) whose selectable fields may stay over
    /// the limit: unchanged from a stored definition already over it.
    pub allow_too_many_selectable: HashSet<String>,
}

impl Options {
    fn create() -> Self {
        Options {
            require_recognized_review_version: true,
            require_immutable_names: false,
            require_openapi_schema: true,
            require_valid_property_type: true,
            require_structural: true,
            require_atomic_set_type: true,
            require_map_list_keys_map_set: true,
            allow_too_many_selectable: HashSet::new(),
        }
    }

    fn update(new: &Spec, old: &Spec, old_obj: &Value) -> Self {
        let review_ok = old.conversion.is_none_or(|c| {
            let vs = review_versions(c);
            vs.is_empty() || vs.iter().any(|v| is_accepted_review_version(v))
        });
        let mut allow = HashSet::new();
        let over = |v: Option<&Value>| {
            v.and_then(Value::as_array)
                .is_some_and(|a| a.len() > MAX_SELECTABLE_FIELDS)
        };
        if over(old.selectable) && new.selectable == old.selectable {
            allow.insert(String::new());
        }
        for v in &new.versions {
            if let Some(o) = old.versions.iter().find(|o| o.name == v.name) {
                if over(o.selectable) && v.selectable == o.selectable {
                    allow.insert(v.name.to_string());
                }
            }
        }
        Options {
            require_recognized_review_version: review_ok,
            require_immutable_names: established(old_obj),
            require_openapi_schema: old.all_versions_have_schema(),
            require_valid_property_type: !old.has_schema_with(&schema::has_invalid_type),
            require_structural: old.schemas().into_iter().all(structural::is_structural),
            require_atomic_set_type: !old.has_schema_with(&schema::has_non_atomic_set_type),
            require_map_list_keys_map_set: !old.has_schema_with(&|s| {
                let mut e = Vec::new();
                schema::map_list_keys_map_set(s, "", &mut e);
                !e.is_empty()
            }),
            allow_too_many_selectable: allow,
        }
    }
}

const MAX_SELECTABLE_FIELDS: usize = 8;

fn established(obj: &Value) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        })
}

/// kube's checks of a definition being created (`ValidateCustomResourceDefinition`),
/// `obj` already defaulted as kube's v1 defaulting does.
pub fn validate_create(obj: &Value) -> Vec<FieldError> {
    let spec = Spec::from_v1(obj);
    let mut errs = metadata_name(obj, &spec);
    errs.extend(validate_spec(&spec, &Options::create()));
    errs.extend(stored_versions(
        &effective_stored_versions(&spec, &[]),
        &spec,
    ));
    errs.extend(api_approval(obj, &spec, None));
    errs.extend(preserve_unknown_fields(&spec, None));
    errs
}

/// kube's checks of an update (`ValidateCustomResourceDefinitionUpdate`):
/// the create checks, some relaxed when `old` already broke them, and the
/// immutable fields.
pub fn validate_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let spec = Spec::from_v1(new);
    let old_spec = Spec::from_v1(old);
    let opts = Options::update(&spec, &old_spec, old);
    let mut errs = metadata_name(new, &spec);
    errs.extend(validate_spec(&spec, &opts));
    let immutable = |errs: &mut Vec<FieldError>, path: &str, new: &str, old: &str| {
        if new != old {
            errs.push(FieldError::invalid(path, new, "field is immutable"));
        }
    };
    if opts.require_immutable_names {
        immutable(&mut errs, "spec.scope", spec.scope, old_spec.scope);
        immutable(
            &mut errs,
            "spec.names.kind",
            spec.names_str("kind"),
            old_spec.names_str("kind"),
        );
    }
    immutable(&mut errs, "spec.group", spec.group, old_spec.group);
    immutable(
        &mut errs,
        "spec.names.plural",
        spec.names_str("plural"),
        old_spec.names_str("plural"),
    );
    // The status is the stored one (kube's PrepareForUpdate keeps it). Until
    // kshard's controller has written it, it is what kube's create would
    // have set: the stored definition's storage version.
    let mut old_stored: Vec<String> = old
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if old_stored.is_empty() {
        old_stored = effective_stored_versions(&old_spec, &[]);
    }
    errs.extend(stored_versions(
        &effective_stored_versions(&spec, &old_stored),
        &spec,
    ));
    errs.extend(api_approval(new, &spec, Some(old)));
    errs.extend(preserve_unknown_fields(&spec, Some(&old_spec)));
    errs
}

/// The name check kube adds to ObjectMeta's (the DNS subdomain rules are
/// the generic metadata validation's, run before this).
fn metadata_name(obj: &Value, spec: &Spec) -> Vec<FieldError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Vec::new();
    }
    let want = format!("{}.{}", spec.names_str("plural"), spec.group);
    if name == want {
        return Vec::new();
    }
    vec![FieldError::invalid(
        "metadata.name",
        name,
        r#"must be spec.names.plural+"."+spec.group"#,
    )]
}

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// apimachinery's `IsDNS1035Label`.
pub(crate) fn dns1035_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_string());
    }
    if !matches_dns1035(s) {
        out.push(DNS1035_MSG.to_string());
    }
    out
}

fn required(path: impl Into<String>, detail: &str) -> FieldError {
    FieldError::required(path, detail)
}

fn invalid_raw(path: impl Into<String>, rendered: String, detail: impl Into<String>) -> FieldError {
    FieldError::new(FieldErrorKind::Invalid, path, Some(rendered), detail)
}

fn enum_string(path: &str, value: &str, accepted: &[&str], errs: &mut Vec<FieldError>) {
    if value.is_empty() {
        errs.push(required(path, ""));
    } else if !accepted.contains(&value) {
        errs.push(FieldError::not_supported(path, value, accepted));
    }
}

/// `validateCustomResourceDefinitionSpec`, in kube's order.
fn validate_spec(spec: &Spec, opts: &Options) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = spec.group;
    if group.is_empty() {
        errs.push(required("spec.group", ""));
    } else {
        let bad = dns_subdomain_errors(group);
        if !bad.is_empty() {
            errs.push(FieldError::invalid("spec.group", group, bad.join(",")));
        } else if !group.contains('.') {
            errs.push(FieldError::invalid(
                "spec.group",
                group,
                "should be a domain with at least one dot",
            ));
        }
    }
    enum_string(
        "spec.scope",
        spec.scope,
        &["Cluster", "Namespaced"],
        &mut errs,
    );

    let mut opts = opts.clone();
    // Pruning (no spec.preserveUnknownFields) needs structural schemas.
    if !spec.preserve_unknown_fields {
        opts.require_structural = true;
    }
    let no_top_schema = spec
        .validation
        .and_then(|v| present(v.get("openAPIV3Schema")))
        .is_none();
    if opts.require_openapi_schema {
        if no_top_schema {
            for (i, v) in spec.versions.iter().enumerate() {
                if v.schema
                    .and_then(|s| present(s.get("openAPIV3Schema")))
                    .is_none()
                {
                    errs.push(required(
                        format!("spec.versions[{i}].schema.openAPIV3Schema"),
                        "",
                    ));
                }
            }
        }
    } else if !spec.preserve_unknown_fields && no_top_schema {
        for (i, v) in spec.versions.iter().enumerate() {
            if v.served
                && v.schema
                    .and_then(|s| present(s.get("openAPIV3Schema")))
                    .is_none()
            {
                errs.push(required(
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    "because otherwise all fields are pruned",
                ));
            }
        }
    }
    if spec.has_schema_with(&|s| present(s.get("default")).is_some()) {
        opts.require_structural = true;
        if spec.preserve_unknown_fields {
            errs.push(invalid_raw(
                "spec.preserveUnknownFields",
                "true".into(),
                "must be false in order to use defaults in the schema",
            ));
        }
    }
    if spec.has_schema_with(&schema::has_kubernetes_extensions) {
        opts.require_structural = true;
    }

    let mut storage = 0;
    let mut seen = HashSet::new();
    let mut unique = true;
    for (i, v) in spec.versions.iter().enumerate() {
        if v.storage {
            storage += 1;
        }
        if !seen.insert(v.name) {
            unique = false;
        }
        let bad = dns1035_errors(v.name);
        if !bad.is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.versions[{i}].name"),
                v.name,
                bad.join(","),
            ));
        }
        let at = format!("spec.versions[{i}]");
        let subresources = if spec.versions.iter().any(|v| v.subresources.is_some()) {
            v.subresources
        } else {
            spec.subresources
        };
        version(v, &at, has_status(subresources), &opts, &mut errs);
    }
    if !unique {
        errs.push(invalid_raw(
            "spec.versions",
            render::versions(spec),
            "must contain unique version names",
        ));
    }
    if storage != 1 {
        errs.push(invalid_raw(
            "spec.versions",
            render::versions(spec),
            "must have exactly one version marked as storage version",
        ));
    }
    // kube's internal `spec.version` is the first version's name.
    if let Some(first) = spec.versions.first() {
        let bad = dns1035_errors(first.name);
        if !bad.is_empty() {
            errs.push(FieldError::invalid(
                "spec.version",
                first.name,
                bad.join(","),
            ));
        }
    }

    for k in ["plural", "singular", "kind", "listKind"] {
        if spec.names_str(k).is_empty() {
            errs.push(required(format!("spec.names.{k}"), ""));
        }
    }
    names(spec.names, "spec.names", &mut errs);

    let any_status =
        has_status(spec.subresources) || spec.versions.iter().any(|v| has_status(v.subresources));
    if let Some(v) = spec.validation {
        schema::validate(v, "spec.validation", any_status, &opts, &mut errs);
    }
    if let Some(s) = spec.subresources {
        subresources(s, "spec.subresources", &mut errs);
    }
    if let Some(cols) = spec.columns.and_then(Value::as_array) {
        for (i, c) in cols.iter().enumerate() {
            column(c, &format!("spec.additionalPrinterColumns[{i}]"), &mut errs);
        }
    }
    if let Some(fields) = spec.selectable {
        match spec.validation {
            None => errs.push(FieldError::invalid(
                "spec.selectableFields",
                "",
                "may only be set when validations.schema is included",
            )),
            Some(v) => selectable_fields(
                fields,
                v.get("openAPIV3Schema"),
                "spec",
                "spec.selectableFields",
                opts.allow_too_many_selectable.contains(""),
                &mut errs,
            ),
        }
    }

    let strategy = spec
        .conversion
        .map(|c| str_at(c, "strategy"))
        .unwrap_or("None");
    if spec.conversion.is_some() && strategy != "None" && spec.preserve_unknown_fields {
        errs.push(FieldError::invalid(
            "spec.conversion.strategy",
            strategy,
            "must be None if spec.preserveUnknownFields is true",
        ));
    }
    if let Some(c) = spec.conversion {
        conversion(c, opts.require_recognized_review_version, &mut errs);
    }
    errs
}

fn has_status(sub: Option<&Value>) -> bool {
    sub.and_then(|s| present(s.get("status"))).is_some()
}

/// `validateCustomResourceDefinitionVersion`: the parts kube keeps per version.
fn version(v: &Version, at: &str, status: bool, opts: &Options, errs: &mut Vec<FieldError>) {
    for e in deprecation_warning(v.deprecated, v.deprecation_warning) {
        let shown = v
            .deprecation_warning
            .map(field_value)
            .unwrap_or_else(|| "null".into());
        errs.push(invalid_raw(format!("{at}.deprecationWarning"), shown, e));
    }
    if let Some(s) = v.schema {
        schema::validate(s, &format!("{at}.schema"), status, opts, errs);
    }
    if let Some(s) = v.subresources {
        subresources(s, &format!("{at}.subresources"), errs);
    }
    if let Some(cols) = v.columns.and_then(Value::as_array) {
        for (i, c) in cols.iter().enumerate() {
            column(c, &format!("{at}.additionalPrinterColumns[{i}]"), errs);
        }
    }
    if let Some(fields) = v.selectable {
        match v.schema.and_then(|s| present(s.get("openAPIV3Schema"))) {
            None => errs.push(FieldError::invalid(
                format!("{at}.selectableFields"),
                "",
                "may only be set when `version.schema.openAPIV3Schema` is not included",
            )),
            Some(s) => selectable_fields(
                fields,
                Some(s),
                at,
                &format!("{at}.selectableFields"),
                opts.allow_too_many_selectable.contains(v.name),
                errs,
            ),
        }
    }
}

/// `validateDeprecationWarning`.
fn deprecation_warning(deprecated: bool, warning: Option<&Value>) -> Vec<String> {
    if !deprecated && warning.is_some() {
        return vec!["can only be set for deprecated versions".into()];
    }
    let Some(w) = warning.and_then(Value::as_str) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if w.len() > 256 {
        out.push("must be <= 256 characters long".into());
    }
    if w.is_empty() {
        out.push("must not be an empty string".into());
    }
    for (i, c) in w.char_indices() {
        if c.is_control() {
            out.push(format!(
                "must only contain printable UTF-8 characters; non-printable character found at index {i}"
            ));
            break;
        }
    }
    out
}

/// `ValidateCustomResourceDefinitionNames`.
fn names(n: &Map<String, Value>, at: &str, errs: &mut Vec<FieldError>) {
    let s = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or_default();
    for k in ["plural", "singular"] {
        let v = s(k);
        let bad = dns1035_errors(v);
        if !v.is_empty() && !bad.is_empty() {
            errs.push(FieldError::invalid(format!("{at}.{k}"), v, bad.join(",")));
        }
    }
    for k in ["kind", "listKind"] {
        let v = s(k);
        let bad = dns1035_errors(&v.to_lowercase());
        if !v.is_empty() && !bad.is_empty() {
            errs.push(FieldError::invalid(
                format!("{at}.{k}"),
                v,
                format!(
                    "may have mixed case, but should otherwise match: {}",
                    bad.join(",")
                ),
            ));
        }
    }
    let list = |k: &str| -> Vec<&str> {
        n.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default()).collect())
            .unwrap_or_default()
    };
    for (i, short) in list("shortNames").into_iter().enumerate() {
        let bad = dns1035_errors(short);
        if !bad.is_empty() {
            errs.push(FieldError::invalid(
                format!("{at}.shortNames[{i}]"),
                short,
                bad.join(","),
            ));
        }
    }
    if !s("kind").is_empty() && s("kind") == s("listKind") {
        errs.push(FieldError::invalid(
            format!("{at}.listKind"),
            s("listKind"),
            "kind and listKind may not be the same",
        ));
    }
    for (i, c) in list("categories").into_iter().enumerate() {
        let bad = dns1035_errors(c);
        if !bad.is_empty() {
            errs.push(FieldError::invalid(
                format!("{at}.categories[{i}]"),
                c,
                bad.join(","),
            ));
        }
    }
}

/// `validateSimpleJSONPath`.
fn simple_json_path(s: &str, at: &str, errs: &mut Vec<FieldError>) -> bool {
    let before = errs.len();
    if s.is_empty() {
        errs.push(FieldError::invalid(at, s, "must not be empty"));
    } else if !s.starts_with('.') {
        errs.push(FieldError::invalid(
            at,
            s,
            "must be a simple json path starting with .",
        ));
    }
    errs.len() == before
}

/// `ValidateCustomResourceDefinitionSubresources`: the scale paths.
fn subresources(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let Some(scale) = present(s.get("scale")) else {
        return;
    };
    for (k, prefix, under) in [
        ("specReplicasPath", ".spec.", ".spec"),
        ("statusReplicasPath", ".status.", ".status"),
    ] {
        let path = format!("{at}.scale.{k}");
        let v = str_at(scale, k);
        if v.is_empty() {
            errs.push(required(path, ""));
        } else if simple_json_path(v, &path, errs) && !v.starts_with(prefix) {
            errs.push(FieldError::invalid(
                path,
                v,
                format!("should be a json path under {under}"),
            ));
        }
    }
    let selector = str_at(scale, "labelSelectorPath");
    let path = format!("{at}.scale.labelSelectorPath");
    if !selector.is_empty()
        && simple_json_path(selector, &path, errs)
        && !selector.starts_with(".spec.")
        && !selector.starts_with(".status.")
    {
        errs.push(FieldError::invalid(
            path,
            selector,
            "should be a json path under either .spec or .status",
        ));
    }
}

const COLUMN_TYPES: &str = "boolean,date,integer,number,string";
const COLUMN_FORMATS: &str = "byte,date,date-time,double,float,int32,int64,password";

/// `ValidateCustomResourceColumnDefinition` (kube names the path field
/// `JSONPath`, its internal Go name).
fn column(c: &Value, at: &str, errs: &mut Vec<FieldError>) {
    if str_at(c, "name").is_empty() {
        errs.push(required(format!("{at}.name"), ""));
    }
    let t = str_at(c, "type");
    let msg = format!("must be one of {COLUMN_TYPES}");
    if t.is_empty() {
        errs.push(required(format!("{at}.type"), &msg));
    } else if !COLUMN_TYPES.split(',').any(|x| x == t) {
        errs.push(FieldError::invalid(format!("{at}.type"), t, msg));
    }
    let f = str_at(c, "format");
    if !f.is_empty() && !COLUMN_FORMATS.split(',').any(|x| x == f) {
        errs.push(FieldError::invalid(
            format!("{at}.format"),
            f,
            format!("must be one of {COLUMN_FORMATS}"),
        ));
    }
    let p = str_at(c, "jsonPath");
    if p.is_empty() {
        errs.push(required(format!("{at}.JSONPath"), ""));
    } else {
        simple_json_path(p, &format!("{at}.JSONPath"), errs);
    }
}

/// `ValidateCustomResourceSelectableFields`: each path must name a string,
/// boolean or integer field of the schema outside metadata.
fn selectable_fields(
    fields: &Value,
    schema: Option<&Value>,
    _owner: &str,
    at: &str,
    allow_too_many: bool,
    errs: &mut Vec<FieldError>,
) {
    let mut unique: Vec<String> = Vec::new();
    for (i, f) in fields.as_array().into_iter().flatten().enumerate() {
        let path = format!("{at}[{i}].jsonPath");
        let jp = str_at(f, "jsonPath");
        if jp.is_empty() {
            errs.push(required(path, ""));
            continue;
        }
        let (segments, found) = match structural::field_path(jp, schema) {
            Ok(x) => x,
            Err(e) => {
                errs.push(FieldError::invalid(
                    path,
                    jp,
                    format!("is an invalid path: {e}"),
                ));
                continue;
            }
        };
        if segments.first().is_some_and(|s| s == "metadata") {
            errs.push(FieldError::invalid(
                &path,
                jp,
                "must not point to fields in metadata",
            ));
        }
        let ok =
            found.is_some_and(|s| matches!(str_at(s, "type"), "string" | "boolean" | "integer"));
        if !ok {
            errs.push(FieldError::invalid(
                &path,
                jp,
                "must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.",
            ));
        }
        let key = segments.join(".");
        if unique.contains(&key) {
            errs.push(FieldError::new(
                FieldErrorKind::Duplicate,
                path,
                Some(quote(jp)),
                "",
            ));
        } else {
            unique.push(key);
        }
    }
    if unique.len() > MAX_SELECTABLE_FIELDS && !allow_too_many {
        errs.push(FieldError::new(
            FieldErrorKind::TooMany,
            at,
            Some(unique.len().to_string()),
            format!("must have at most {MAX_SELECTABLE_FIELDS} items"),
        ));
    }
}

fn review_versions(c: &Value) -> Vec<&str> {
    c.pointer("/webhook/conversionReviewVersions")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default()).collect())
        .unwrap_or_default()
}

fn is_accepted_review_version(v: &str) -> bool {
    matches!(v, "v1" | "v1beta1")
}

/// `validateCustomResourceConversion`, on kube's internal field names.
fn conversion(c: &Value, require_recognized: bool, errs: &mut Vec<FieldError>) {
    let at = "spec.conversion";
    let strategy = str_at(c, "strategy");
    enum_string(
        &format!("{at}.strategy"),
        strategy,
        &["None", "Webhook"],
        errs,
    );
    let webhook = present(c.get("webhook"));
    let client = webhook.and_then(|w| present(w.get("clientConfig")));
    let reviews = webhook.and_then(|w| present(w.get("conversionReviewVersions")));
    let cc_at = format!("{at}.webhookClientConfig");
    if strategy == "Webhook" {
        match client {
            None => errs.push(required(&cc_at, "required when strategy is set to Webhook")),
            Some(cc) => {
                let url = present(cc.get("url")).and_then(Value::as_str);
                let service = present(cc.get("service"));
                match (url, service) {
                    (Some(_), Some(_)) | (None, None) => errs.push(required(
                        &cc_at,
                        "exactly one of url or service is required",
                    )),
                    (Some(u), None) => webhook_url(u, &format!("{cc_at}.url"), errs),
                    (None, Some(s)) => webhook_service(s, &format!("{cc_at}.service"), errs),
                }
            }
        }
        let at = format!("{at}.conversionReviewVersions");
        let list: Vec<&str> = reviews
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default()).collect())
            .unwrap_or_default();
        if list.is_empty() {
            errs.push(required(at, ""));
        } else {
            let mut seen = HashSet::new();
            let mut accepted = false;
            for (i, v) in list.iter().enumerate() {
                if !seen.insert(*v) {
                    errs.push(FieldError::invalid(
                        format!("{at}[{i}]"),
                        v,
                        "duplicate version",
                    ));
                    continue;
                }
                for e in dns1035_errors(v) {
                    errs.push(FieldError::invalid(format!("{at}[{i}]"), v, e));
                }
                accepted |= is_accepted_review_version(v);
            }
            if require_recognized && !accepted {
                errs.push(invalid_raw(
                    at,
                    render::string_list(reviews),
                    "must include at least one of v1, v1beta1",
                ));
            }
        }
    } else {
        if client.is_some() {
            errs.push(FieldError::forbidden(
                &cc_at,
                "should not be set when strategy is not set to Webhook",
            ));
        }
        if reviews
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            errs.push(FieldError::forbidden(
                format!("{at}.conversionReviewVersions"),
                "should not be set when strategy is not set to Webhook",
            ));
        }
    }
}

/// The parts of a URL kube's checks look at, split as Go's `url.Parse`
/// splits them (it accepts far more than browsers do).
struct GoUrl<'a> {
    scheme: String,
    user: Option<&'a str>,
    host: &'a str,
    query: &'a str,
    fragment: &'a str,
}

fn go_url(raw: &str) -> Result<GoUrl<'_>, String> {
    let (rest, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut scheme = String::new();
    let mut after = rest;
    for (i, c) in rest.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err(format!("parse {}: missing protocol scheme", quote(raw))),
            ':' => {
                scheme = rest[..i].to_lowercase();
                after = &rest[i + 1..];
                break;
            }
            _ => break,
        }
    }
    let (mut user, mut host) = (None, "");
    if let Some(auth) = after.strip_prefix("//") {
        let auth = auth.split('/').next().unwrap_or_default();
        match auth.rsplit_once('@') {
            Some((u, h)) => {
                user = Some(u);
                host = h;
            }
            None => host = auth,
        }
    }
    Ok(GoUrl {
        scheme,
        user,
        host,
        query,
        fragment,
    })
}

/// apiserver's `ValidateWebhookURL` (https only).
pub(crate) fn webhook_url(u: &str, at: &str, errs: &mut Vec<FieldError>) {
    const FORM: &str = "; desired format: https://host[/path]";
    let parsed = match go_url(u) {
        Ok(p) => p,
        Err(e) => {
            errs.push(required(at, &format!("url must be a valid URL: {e}{FORM}")));
            return;
        }
    };
    if parsed.scheme != "https" {
        errs.push(FieldError::invalid(
            at,
            &parsed.scheme,
            format!("'https' is the only allowed URL scheme{FORM}"),
        ));
    }
    if parsed.host.is_empty() {
        errs.push(FieldError::invalid(
            at,
            parsed.host,
            format!("host must be specified{FORM}"),
        ));
    }
    if let Some(user) = parsed.user {
        errs.push(FieldError::invalid(
            at,
            user,
            "user information is not permitted in the URL",
        ));
    }
    if !parsed.fragment.is_empty() {
        errs.push(FieldError::invalid(
            at,
            parsed.fragment,
            "fragments are not permitted in the URL",
        ));
    }
    if !parsed.query.is_empty() {
        errs.push(FieldError::invalid(
            at,
            parsed.query,
            "query parameters are not permitted in the URL",
        ));
    }
}

/// apiserver's `ValidateWebhookService`. kube-apiserver 1.36 names the
/// other field of the two when one is missing (a missing namespace is
/// `service.name: Required value`, and the reverse), for CRD conversion and
/// admission webhooks alike: the running server says so, so kshard does.
pub(crate) fn webhook_service(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    if str_at(s, "namespace").is_empty() {
        errs.push(required(format!("{at}.name"), ""));
    }
    if str_at(s, "name").is_empty() {
        errs.push(required(format!("{at}.namespace"), ""));
    }
    let port = s.get("port").and_then(Value::as_i64).unwrap_or(443);
    if !(1..=65535).contains(&port) {
        errs.push(invalid_raw(
            format!("{at}.port"),
            port.to_string(),
            "port is not valid: must be between 1 and 65535, inclusive",
        ));
    }
    let Some(path) = present(s.get("path")).and_then(Value::as_str) else {
        return;
    };
    let p_at = format!("{at}.path");
    if path == "/" || path.is_empty() {
        return;
    }
    if path == "//" {
        errs.push(FieldError::invalid(
            p_at,
            path,
            "segment[0] may not be empty",
        ));
        return;
    }
    if !path.starts_with('/') {
        errs.push(FieldError::invalid(&p_at, path, "must start with a '/'"));
    }
    let mut rest = path.get(1..).unwrap_or_default();
    rest = rest.strip_suffix('/').unwrap_or(rest);
    for (i, step) in rest.split('/').enumerate() {
        if step.is_empty() {
            errs.push(FieldError::invalid(
                &p_at,
                path,
                format!("segment[{i}] may not be empty"),
            ));
            continue;
        }
        for e in dns_subdomain_errors(step) {
            errs.push(FieldError::invalid(
                &p_at,
                path,
                format!("segment[{i}]: {e}"),
            ));
        }
    }
}

/// The stored versions after the write, as kube's strategy computes them:
/// the stored list (empty on create) plus the storage version.
fn effective_stored_versions(spec: &Spec, stored: &[String]) -> Vec<String> {
    let mut out = stored.to_vec();
    if let Some(v) = spec.versions.iter().find(|v| v.storage) {
        if !out.iter().any(|s| s == v.name) {
            out.push(v.name.to_string());
        }
    }
    out
}

/// `ValidateCustomResourceDefinitionStoredVersions`.
fn stored_versions(stored: &[String], spec: &Spec) -> Vec<FieldError> {
    let at = "status.storedVersions";
    if stored.is_empty() {
        return vec![invalid_raw(
            at,
            "null".into(),
            "must have at least one stored version",
        )];
    }
    let rendered = || {
        let parts: Vec<String> = stored.iter().map(|s| render::go_string(s)).collect();
        format!("[{}]", parts.join(","))
    };
    let mut errs = Vec::new();
    for v in &spec.versions {
        if v.storage && !stored.iter().any(|s| s == v.name) {
            errs.push(invalid_raw(
                at,
                rendered(),
                format!("must have the storage version {}", v.name),
            ));
        }
    }
    // kube walks a map here; the stored order is one of its orders.
    let mut missing: Vec<(usize, &String)> = Vec::new();
    for s in stored {
        if spec.versions.iter().any(|v| v.name == s) || missing.iter().any(|(_, m)| *m == s) {
            continue;
        }
        // A duplicate entry is reported at its last index (a map keyed by name).
        let last = stored.iter().rposition(|x| x == s).unwrap_or(0);
        missing.push((last, s));
    }
    for (i, s) in missing {
        errs.push(FieldError::invalid(
            format!("{at}[{i}]"),
            s,
            format!("missing from spec.versions; {s} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {s} and removes {s} from status.storedVersions"),
        ));
    }
    errs
}

const APPROVAL: &str = "api-approved.kubernetes.io";

/// 0 invalid, 1 approved, 2 bypassed, 3 missing (kube's `APIApprovalState`).
fn approval_state(obj: &Value) -> (u8, String) {
    let a = obj
        .pointer("/metadata/annotations")
        .and_then(|m| m.get(APPROVAL))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if a.is_empty() {
        return (3, format!("protected groups must have approval annotation {}, see https://github.com/kubernetes/enhancements/pull/1111", quote(APPROVAL)));
    }
    if a.starts_with("unapproved") {
        return (2, String::new());
    }
    // Go's url.ParseRequestURI: an absolute URL with a host.
    let approved = go_url(a).is_ok_and(|u| !u.scheme.is_empty() && !u.host.is_empty());
    if approved {
        return (1, String::new());
    }
    (0, format!("protected groups must have approval annotation {} with either a URL or a reason starting with \"unapproved\", see https://github.com/kubernetes/enhancements/pull/1111", quote(APPROVAL)))
}

/// `validateAPIApproval`: definitions in `*.k8s.io` and `*.kubernetes.io`
/// name the approved API review.
fn api_approval(obj: &Value, spec: &Spec, old: Option<&Value>) -> Vec<FieldError> {
    let g = spec.group;
    let protected = g == "k8s.io"
        || g.ends_with(".k8s.io")
        || g == "kubernetes.io"
        || g.ends_with(".kubernetes.io");
    if !protected {
        return Vec::new();
    }
    let (state, reason) = approval_state(obj);
    if old.is_some_and(|o| approval_state(o).0 == state) {
        return Vec::new();
    }
    let at = format!("metadata.annotations[{APPROVAL}]");
    let value = obj
        .pointer("/metadata/annotations")
        .and_then(|m| m.get(APPROVAL))
        .and_then(Value::as_str)
        .unwrap_or_default();
    match state {
        1 | 2 => Vec::new(),
        3 => vec![required(at, &reason)],
        _ => vec![FieldError::invalid(at, value, reason)],
    }
}

/// `validatePreserveUnknownFields`: v1 definitions prune; only one stored
/// with pruning off (from v1beta1) may keep it.
fn preserve_unknown_fields(spec: &Spec, old: Option<&Spec>) -> Vec<FieldError> {
    if old.is_some_and(|o| o.preserve_unknown_fields) || !spec.preserve_unknown_fields {
        return Vec::new();
    }
    vec![invalid_raw(
        "spec.preserveUnknownFields",
        "true".into(),
        "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DNS1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

    /// A valid definition, defaulted as kube's v1 defaulting leaves it.
    fn crd() -> Value {
        let mut v = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}
                }]
            }
        });
        crate::apiextensions::crd_resource::set_defaults(&mut v);
        v
    }

    fn create(v: &Value) -> Vec<String> {
        validate_create(v).iter().map(|e| e.to_string()).collect()
    }

    fn schema_of(v: &mut Value) -> &mut Value {
        &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    }

    #[test]
    fn a_valid_definition_passes() {
        assert_eq!(create(&crd()), Vec::<String>::new());
    }

    #[test]
    fn name_group_and_scope() {
        let mut v = crd();
        v["metadata"]["name"] = json!("gadgets.example.com");
        v["spec"]["scope"] = json!("Global");
        assert_eq!(
            create(&v),
            [
                r#"metadata.name: Invalid value: "gadgets.example.com": must be spec.names.plural+"."+spec.group"#,
                r#"spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced""#,
            ]
        );
        let mut v = crd();
        v["metadata"]["name"] = json!("widgets.example");
        v["spec"]["group"] = json!("example");
        assert_eq!(
            create(&v),
            [r#"spec.group: Invalid value: "example": should be a domain with at least one dot"#]
        );
    }

    #[test]
    fn names_follow_dns_1035() {
        let mut v = crd();
        v["spec"]["names"]["shortNames"] = json!(["wd", "W"]);
        v["spec"]["names"]["categories"] = json!(["all-things", "9lives"]);
        v["spec"]["names"]["listKind"] = json!("Widget");
        assert_eq!(
            create(&v),
            [
                format!(r#"spec.names.shortNames[1]: Invalid value: "W": {DNS1035}"#),
                r#"spec.names.listKind: Invalid value: "Widget": kind and listKind may not be the same"#.to_string(),
                format!(r#"spec.names.categories[1]: Invalid value: "9lives": {DNS1035}"#),
            ]
        );
        let mut v = crd();
        v["spec"]["names"]["kind"] = json!("My_Widget");
        v["spec"]["names"]["listKind"] = json!("My_WidgetList");
        assert_eq!(
            create(&v),
            [
                format!(
                    r#"spec.names.kind: Invalid value: "My_Widget": may have mixed case, but should otherwise match: {DNS1035}"#
                ),
                format!(
                    r#"spec.names.listKind: Invalid value: "My_WidgetList": may have mixed case, but should otherwise match: {DNS1035}"#
                ),
            ]
        );
    }

    #[test]
    fn versions_need_one_storage_version_and_unique_names() {
        let mut v = crd();
        v["spec"]["versions"][0]["storage"] = json!(false);
        assert_eq!(
            create(&v),
            [
                r#"spec.versions: Invalid value: [{"Name":"v1","Served":true,"Storage":false,"Deprecated":false,"DeprecationWarning":null,"Schema":null,"Subresources":null,"AdditionalPrinterColumns":null,"SelectableFields":null}]: must have exactly one version marked as storage version"#,
                "status.storedVersions: Invalid value: null: must have at least one stored version",
            ]
        );
        let mut v = crd();
        let first = v["spec"]["versions"][0].clone();
        v["spec"]["versions"] = json!([first.clone(), first]);
        let errs = create(&v);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].ends_with(": must contain unique version names"),
            "{errs:?}"
        );
        assert!(errs[1].ends_with(": must have exactly one version marked as storage version"));
    }

    #[test]
    fn a_bad_version_name_is_reported_twice_as_kube_does() {
        let mut v = crd();
        v["spec"]["versions"][0]["name"] = json!("V1");
        assert_eq!(
            create(&v),
            [
                format!(r#"spec.versions[0].name: Invalid value: "V1": {DNS1035}"#),
                format!(r#"spec.version: Invalid value: "V1": {DNS1035}"#),
            ]
        );
    }

    #[test]
    fn schemas_are_required_and_reported_where_kube_keeps_them() {
        let mut v = crd();
        v["spec"]["versions"][0]
            .as_object_mut()
            .expect("version")
            .remove("schema");
        assert_eq!(
            create(&v),
            ["spec.versions[0].schema.openAPIV3Schema: Required value"]
        );
        // Two versions with different schemas: per-version paths.
        let mut v = crd();
        let mut second = v["spec"]["versions"][0].clone();
        second["name"] = json!("v2");
        second["storage"] = json!(false);
        second["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"] = json!({});
        v["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .push(second);
        assert_eq!(
            create(&v),
            ["spec.versions[1].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value: must not be empty for specified object fields"]
        );
    }

    #[test]
    fn structural_schema_rules() {
        let mut v = crd();
        *schema_of(&mut v) = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "spec": {"properties": {"n": {"type": "integer"}}},
            "list": {"type": "array"},
            "status": {"type": "object", "anyOf": [{"type": "string"}, {"properties": {"x": {}}}]}
        }});
        assert_eq!(
            create(&v),
            [
                "spec.validation.openAPIV3Schema.properties[list].items: Required value: must be specified",
                "spec.validation.openAPIV3Schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
                "spec.validation.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
                "spec.validation.openAPIV3Schema.properties[status].anyOf[0].type: Forbidden: must be empty to be structural",
            ]
        );
        // int-or-string's anyOf may name types; the root may not be an array.
        let mut v = crd();
        *schema_of(&mut v) = json!({"type": "object", "properties": {"port": {
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}]}}});
        assert_eq!(create(&v), Vec::<String>::new());
        *schema_of(&mut v) = json!({"type": "array", "items": {"type": "string"}});
        assert_eq!(
            create(&v),
            [
                r#"spec.validation.openAPIV3Schema.type: Invalid value: "array": must be object at the root"#
            ]
        );
        // The root's junctors may only name fields the skeleton declares.
        *schema_of(&mut v) = json!({"type": "object", "anyOf": [{"properties": {"ghost": {}}}]});
        assert_eq!(
            create(&v),
            ["spec.validation.openAPIV3Schema.properties[ghost]: Required value: because it is defined in spec.validation.openAPIV3Schema.anyOf[0].properties[ghost]"]
        );
    }

    #[test]
    fn openapi_keyword_rules() {
        let mut v = crd();
        *schema_of(&mut v) = json!({"type": "object", "properties": {
            "a": {"type": "strin"},
            "b": {"type": "array", "uniqueItems": true, "items": {"type": "string"}},
            "c": {"type": "object", "$ref": "#/x"},
            "kind": {"type": "string", "default": "W"},
            "d": {"type": "object", "x-kubernetes-map-type": "sometimes"},
            "e": {"type": "string", "x-kubernetes-preserve-unknown-fields": false}
        }});
        assert_eq!(
            create(&v),
            [
                r#"spec.validation.openAPIV3Schema.properties[a].type: Unsupported value: "strin": supported values: "array", "boolean", "integer", "number", "object", "string""#,
                "spec.validation.openAPIV3Schema.properties[b].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
                "spec.validation.openAPIV3Schema.properties[c].$ref: Forbidden: $ref is not supported",
                r#"spec.validation.openAPIV3Schema.properties[d].x-kubernetes-map-type: Unsupported value: "sometimes": supported values: "atomic", "granular""#,
                "spec.validation.openAPIV3Schema.properties[e].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined",
                "spec.validation.openAPIV3Schema.properties[kind].default: Forbidden: must not be set in top-level kind",
            ]
        );
    }

    #[test]
    fn list_type_rules() {
        let mut v = crd();
        *schema_of(&mut v) = json!({"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name", "port"],
                      "items": {"type": "object", "required": ["port"], "properties": {
                          "name": {"type": "string"}, "port": {"type": "integer"}}}},
            "tags": {"type": "string", "x-kubernetes-list-type": "set"},
            "objs": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "object"}}
        }});
        assert_eq!(
            create(&v),
            [
                "spec.validation.openAPIV3Schema.properties[objs].items.x-kubernetes-map-type: Invalid value: null: must be atomic as item of a list with x-kubernetes-list-type=set",
                "spec.validation.openAPIV3Schema.properties[ports].items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                r#"spec.validation.openAPIV3Schema.properties[tags].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified"#,
            ]
        );
    }

    #[test]
    fn status_subresource_limits_the_root() {
        let mut v = crd();
        v["spec"]["versions"][0]["subresources"] = json!({"status": {}});
        schema_of(&mut v)["minProperties"] = json!(1);
        let errs = create(&v);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with(r#"spec.validation.openAPIV3Schema: Invalid value: {"ID":"","Schema":"","Ref":null,"Description":"","Type":"object""#), "{errs:?}");
        assert!(errs[0].ends_with(": only [Description Type Format Title Maximum ExclusiveMaximum Minimum ExclusiveMinimum MaxLength MinLength Pattern MaxItems MinItems UniqueItems MultipleOf Required Items Properties ExternalDocs Example XPreserveUnknownFields XValidations] fields are allowed at the root of the schema if the status subresource is enabled"), "{errs:?}");
    }

    #[test]
    fn columns_scale_and_selectable_fields() {
        let mut v = crd();
        v["spec"]["versions"][0]["additionalPrinterColumns"] = json!([{"name": "Size", "type": "int", "jsonPath": "spec.size"}, {"name": "", "type": "string", "jsonPath": ".spec.size", "format": "hex"}]);
        v["spec"]["versions"][0]["subresources"] =
            json!({"scale": {"specReplicasPath": ".status.size", "statusReplicasPath": ""}});
        v["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".spec.size"}, {"jsonPath": ".spec.size"}, {"jsonPath": ".spec.nope"}, {"jsonPath": ".spec"}]);
        assert_eq!(
            create(&v),
            [
                r#"spec.subresources.scale.specReplicasPath: Invalid value: ".status.size": should be a json path under .spec"#,
                "spec.subresources.scale.statusReplicasPath: Required value",
                r#"spec.additionalPrinterColumns[0].type: Invalid value: "int": must be one of boolean,date,integer,number,string"#,
                r#"spec.additionalPrinterColumns[0].JSONPath: Invalid value: "spec.size": must be a simple json path starting with ."#,
                "spec.additionalPrinterColumns[1].name: Required value",
                r#"spec.additionalPrinterColumns[1].format: Invalid value: "hex": must be one of byte,date,date-time,double,float,int32,int64,password"#,
                r#"spec.selectableFields[1].jsonPath: Duplicate value: ".spec.size""#,
                r#"spec.selectableFields[2].jsonPath: Invalid value: ".spec.nope": is an invalid path: does not refer to a valid field"#,
                r#"spec.selectableFields[3].jsonPath: Invalid value: ".spec": must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed."#,
            ]
        );
    }

    #[test]
    fn webhook_conversion_settings() {
        let mut v = crd();
        v["spec"]["conversion"] =
            json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v2"]}});
        assert_eq!(
            create(&v),
            [
                "spec.conversion.webhookClientConfig: Required value: required when strategy is set to Webhook",
                r#"spec.conversion.conversionReviewVersions: Invalid value: ["v2"]: must include at least one of v1, v1beta1"#,
            ]
        );
        v["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "http://user@hook.example.com/convert?x=1"}}});
        assert_eq!(
            create(&v),
            [
                r#"spec.conversion.webhookClientConfig.url: Invalid value: "http": 'https' is the only allowed URL scheme; desired format: https://host[/path]"#,
                r#"spec.conversion.webhookClientConfig.url: Invalid value: "user": user information is not permitted in the URL"#,
                r#"spec.conversion.webhookClientConfig.url: Invalid value: "x=1": query parameters are not permitted in the URL"#,
            ]
        );
        v["spec"]["conversion"] =
            json!({"strategy": "None", "webhook": {"conversionReviewVersions": ["v1"]}});
        assert_eq!(
            create(&v),
            ["spec.conversion.conversionReviewVersions: Forbidden: should not be set when strategy is not set to Webhook"]
        );
    }

    #[test]
    fn preserve_unknown_fields_and_api_approval() {
        let mut v = crd();
        v["spec"]["preserveUnknownFields"] = json!(true);
        assert_eq!(
            create(&v),
            ["spec.preserveUnknownFields: Invalid value: true: cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead"]
        );
        let mut v = crd();
        v["metadata"]["name"] = json!("widgets.x.k8s.io");
        v["spec"]["group"] = json!("x.k8s.io");
        assert_eq!(
            create(&v),
            [
                r#"metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111"#
            ]
        );
        v["metadata"]["annotations"] = json!({"api-approved.kubernetes.io": "unapproved, testing"});
        assert_eq!(create(&v), Vec::<String>::new());
    }

    #[test]
    fn updates_keep_names_and_stored_versions() {
        let mut old = crd();
        old["status"] = json!({"storedVersions": ["v1"],
            "conditions": [{"type": "Established", "status": "True"}]});
        let mut new = old.clone();
        new["spec"]["scope"] = json!("Cluster");
        new["spec"]["names"]["kind"] = json!("Gadget");
        new["spec"]["versions"][0]["name"] = json!("v2");
        let errs: Vec<String> = validate_update(&new, &old)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            errs,
            [
                r#"spec.scope: Invalid value: "Cluster": field is immutable"#,
                r#"spec.names.kind: Invalid value: "Gadget": field is immutable"#,
                r#"status.storedVersions[0]: Invalid value: "v1": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1 and removes v1 from status.storedVersions"#,
            ]
        );
        // Not established yet: scope and kind may still change.
        old["status"]["conditions"] = json!([]);
        new["spec"]["versions"][0]["name"] = json!("v1");
        assert!(validate_update(&new, &old).is_empty());
    }

    #[test]
    fn an_unwritten_status_counts_the_stored_storage_version() {
        // kube's create records the storage version at once; kshard's
        // controller writes the status a moment later.
        let old = crd();
        let mut new = old.clone();
        new["spec"]["versions"][0]["name"] = json!("v2");
        let errs: Vec<String> = validate_update(&new, &old)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                r#"status.storedVersions[0]: Invalid value: "v1": missing from spec.versions"#
            ),
            "{errs:?}"
        );
    }

    #[test]
    fn updates_excuse_what_the_stored_definition_already_broke() {
        let mut old = crd();
        schema_of(&mut old)["properties"]["spec"]["properties"]["size"] = json!({"type": "int"});
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"a": "b"});
        assert!(validate_update(&new, &old).is_empty());
        assert_eq!(validate_create(&new).len(), 1);
    }
}
