//! The resource catalog: what is served, loaded from ordinary
//! `apiextensions.k8s.io/v1` CustomResourceDefinition manifests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionSpec, CustomResourceDefinitionVersion,
};
use serde_json::Value;

use crate::schema::CompileError;
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{file}: {reason}")]
    File { file: PathBuf, reason: String },
    #[error("{file}: document {index}: {reason}")]
    Document {
        file: PathBuf,
        index: usize,
        reason: String,
    },
    #[error("{file}: document {index}: {name} is already defined in {other}")]
    Duplicate {
        file: PathBuf,
        index: usize,
        name: String,
        other: String,
    },
}

#[derive(Debug, Clone)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i32,
    pub json_path: String,
}

#[derive(Debug, Clone)]
pub struct ScaleSpec {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Version {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub status_subresource: bool,
    pub scale: Option<ScaleSpec>,
    pub printer_columns: Vec<PrinterColumn>,
    /// JSONPaths (`.spec.color`) usable in field selectors, besides name and namespace.
    pub selectable_fields: Vec<String>,
    pub schema: Option<Value>,
    /// The structural schema: pruning, defaulting, validation (CEL included).
    pub validation: Option<Arc<crate::schema::Schema>>,
    /// The merge view of the schema for server-side apply and managedFields.
    pub merge: Arc<crate::apply::MergeSchema>,
    /// For a deprecated version, the warning every request to it carries:
    /// the CRD's `deprecationWarning`, else kube's default text.
    pub deprecation_warning: Option<String>,
    /// Index of the first version with the same schema: converting between
    /// versions of one class needs no pruning.
    pub schema_class: usize,
}

/// One served resource type (one CRD).
#[derive(Debug, Clone)]
pub struct ResourceType {
    pub group: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub versions: Vec<Version>,
    pub storage_version: String,
    pub source: String,
    /// Whether any version's schema declares a default (reads default then).
    pub has_defaults: bool,
    /// Its definition is being deleted: no new objects (kube's 405).
    pub terminating: bool,
    /// The definition's spec, as read (to tell a changed definition apart).
    pub definition: Value,
    /// `spec.conversion.strategy: Webhook`: versions convert through it.
    pub conversion: Option<Arc<super::conversion::Webhook>>,
    /// A strategy registered for this group and resource (the catalog's
    /// [`Strategies`](super::strategy::Strategies)).
    pub registered_strategy: Option<&'static dyn super::strategy::Strategy>,
}

impl ResourceType {
    /// `group/plural`: the resource part of every storage key.
    /// What this type adds to the generic write and delete pipelines.
    pub fn strategy(&self) -> &'static dyn super::strategy::Strategy {
        if let Some(s) = self.registered_strategy {
            s
        } else if super::crd_resource::is_definition(self) {
            &super::crd_resource::DefinitionStrategy
        } else {
            &super::strategy::Generic
        }
    }

    pub fn id(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }
    /// `widgets.demo.kshard.dev`
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
    pub fn version(&self, name: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.name == name && v.served)
    }
    /// The schema that prunes an object converted from `from` to `to`
    /// (`group/version` strings), when the two versions' schemas differ.
    pub fn pruning_between(&self, from: &str, to: &str) -> Option<&Arc<crate::schema::Schema>> {
        let named = |av: &str| {
            let name = av.strip_prefix(self.group.as_str())?.strip_prefix('/')?;
            self.versions.iter().find(|v| v.name == name)
        };
        let target = named(to)?;
        let same = named(from).is_some_and(|f| f.schema_class == target.schema_class);
        if same {
            None
        } else {
            target.validation.as_ref()
        }
    }
    pub fn served_versions(&self) -> impl Iterator<Item = &Version> {
        self.versions.iter().filter(|v| v.served)
    }
    pub fn storage_key(&self, namespace: &str, name: &str) -> String {
        format!("{}/{}/{}/{}", self.group, self.plural, namespace, name)
    }
    /// Base64 of the first 8 bytes of sha256("group/storageVersion/Kind"), as kube computes it.
    pub fn storage_version_hash(&self) -> String {
        use base64::Engine as _;
        let digest = Sha256::digest(format!(
            "{}/{}/{}",
            self.group, self.storage_version, self.kind
        ));
        base64::engine::general_purpose::STANDARD.encode(&digest[..8])
    }
}

#[derive(Debug, Default)]
pub struct Catalog {
    pub resources: Vec<Arc<ResourceType>>,
    /// Documents of other kinds found beside the CRDs (`file document N
    /// (apiVersion kind)`), skipped.
    pub skipped: Vec<String>,
    /// Strategies given to the types of their group and resource.
    strategies: super::strategy::Strategies,
}

/// A served group with its versions, highest priority first.
pub struct Group {
    pub name: String,
    pub versions: Vec<String>,
}

impl Catalog {
    /// Loads every `*.yaml`/`*.yml`/`*.json` file under each directory (or file).
    /// Any problem fails the whole load: half a catalog is never served.
    pub fn load(paths: &[PathBuf]) -> Result<Self, CatalogError> {
        let mut files = Vec::new();
        for p in paths {
            collect_files(p, &mut files)?;
        }
        files.sort();
        let mut catalog = Catalog::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| CatalogError::File {
                file: file.clone(),
                reason: e.to_string(),
            })?;
            catalog.add_manifests(&file, &text)?;
        }
        if !catalog.skipped.is_empty() {
            tracing::warn!(
                skipped = %catalog.skipped.join(", "),
                "documents that are not CustomResourceDefinitions were skipped"
            );
        }
        Ok(catalog)
    }

    pub fn add_manifests(&mut self, file: &Path, text: &str) -> Result<(), CatalogError> {
        self.add_manifests_as(file, text, Origin::User)
    }

    /// kshard's own definitions (the CustomResourceDefinition, flow-control and admission
    /// APIs): they stand in for kube's built-in types, whose validation is Go code with no
    /// cost limits, so their rules skip the static cost checks (they still run under the
    /// runtime budget).
    pub fn add_builtin_manifests(&mut self, file: &Path, text: &str) -> Result<(), CatalogError> {
        self.add_manifests_as(file, text, Origin::Trusted)
    }

    fn add_manifests_as(
        &mut self,
        file: &Path,
        text: &str,
        origin: Origin,
    ) -> Result<(), CatalogError> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| CatalogError::File {
                file: file.to_path_buf(),
                reason: format!("invalid YAML: {e}"),
            })?;
        for (index, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            let doc_err = |reason: String| CatalogError::Document {
                file: file.to_path_buf(),
                index,
                reason,
            };
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
            let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            // Projects ship other objects beside their CRDs (admission
            // policies, RBAC): those are skipped, and named once at the end.
            if !kind.is_empty() && !api_version.is_empty() && kind != "CustomResourceDefinition" {
                self.skipped.push(format!(
                    "{} document {index} ({api_version} {kind})",
                    file.display()
                ));
                continue;
            }
            if kind != "CustomResourceDefinition" || api_version != "apiextensions.k8s.io/v1" {
                return Err(doc_err(format!(
                    "expected apiextensions.k8s.io/v1 CustomResourceDefinition, found {api_version:?} {kind:?}"
                )));
            }
            self.add_definition_as(&file.display().to_string(), doc, origin)
                .map_err(|e| match e {
                    e @ DefinitionError::Fields(_) => doc_err(e.to_string()),
                    DefinitionError::Invalid(reason) => doc_err(reason),
                    DefinitionError::Duplicate { name, other } => CatalogError::Duplicate {
                        file: file.to_path_buf(),
                        index,
                        name,
                        other,
                    },
                })?;
        }
        Ok(())
    }

    /// Whether two catalogs serve the same definitions (a status write to a
    /// stored definition changes its resourceVersion, not what is served).
    pub fn same_resources(&self, other: &Catalog) -> bool {
        self.resources.len() == other.resources.len()
            && self.resources.iter().zip(&other.resources).all(|(a, b)| {
                a.source == b.source
                    && a.terminating == b.terminating
                    && a.definition == b.definition
            })
    }

    /// Gives the types of each group and resource in `strategies` (those
    /// served now and those added later) that strategy.
    pub fn register_strategies(&mut self, strategies: super::strategy::Strategies) {
        for r in &mut self.resources {
            if let Some(s) = strategies.get(&r.group, &r.plural) {
                let mut rt = (**r).clone();
                rt.registered_strategy = Some(s);
                *r = Arc::new(rt);
            }
        }
        self.strategies = strategies;
    }

    /// Marks the resource defined by `source` as terminating.
    pub fn mark_terminating(&mut self, source: &str) {
        for r in &mut self.resources {
            if r.source == source {
                let mut rt = (**r).clone();
                rt.terminating = true;
                *r = Arc::new(rt);
            }
        }
    }

    /// Adds one CustomResourceDefinition document, from `source`.
    pub fn add_definition(&mut self, source: &str, doc: Value) -> Result<(), DefinitionError> {
        self.add_definition_as(source, doc, Origin::User)
    }

    /// A definition stored through the API: it passed every check when written, and kube
    /// never checks a stored definition again, so the static cost checks are not rerun
    /// (a definition stored before them keeps being served).
    pub fn add_stored_definition(
        &mut self,
        source: &str,
        doc: Value,
    ) -> Result<(), DefinitionError> {
        self.add_definition_as(source, doc, Origin::Trusted)
    }

    fn add_definition_as(
        &mut self,
        source: &str,
        doc: Value,
        origin: Origin,
    ) -> Result<(), DefinitionError> {
        let crd: CustomResourceDefinition =
            serde_json::from_value(doc).map_err(|e| DefinitionError::Invalid(e.to_string()))?;
        let mut rt = resource_from_crd(&crd, source, origin)?;
        rt.registered_strategy = self.strategies.get(&rt.group, &rt.plural);
        if let Some(other) = self
            .resources
            .iter()
            .find(|r| r.group == rt.group && r.plural == rt.plural)
        {
            return Err(DefinitionError::Duplicate {
                name: rt.qualified_name(),
                other: other.source.clone(),
            });
        }
        self.resources.push(Arc::new(rt));
        Ok(())
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<ResourceType>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.plural == plural && r.version(version).is_some())
    }

    pub fn find_by_kind(&self, group: &str, kind: &str) -> Option<&Arc<ResourceType>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.kind == kind)
    }

    /// Groups with their served versions in kube's priority order.
    pub fn groups(&self) -> Vec<Group> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in &self.resources {
            let versions = groups.entry(r.group.clone()).or_default();
            for v in r.served_versions() {
                if !versions.contains(&v.name) {
                    versions.push(v.name.clone());
                }
            }
        }
        groups
            .into_iter()
            .map(|(name, mut versions)| {
                versions.sort_by(|a, b| compare_versions(b, a).then_with(|| a.cmp(b)));
                Group { name, versions }
            })
            .collect()
    }

    pub fn resources_in(&self, group: &str, version: &str) -> Vec<&Arc<ResourceType>> {
        let mut v: Vec<_> = self
            .resources
            .iter()
            .filter(|r| r.group == group && r.version(version).is_some())
            .collect();
        v.sort_by(|a, b| a.plural.cmp(&b.plural));
        v
    }
}

/// Where a definition comes from: loaded now (checked as kube checks a new one), or
/// kshard's own or already stored (the static cost checks are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    User,
    Trusted,
}

/// Why one definition cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    #[error("{0}")]
    Invalid(String),
    /// kube's field errors (the CEL cost checks), paths from `spec`.
    #[error("{}", crate::status::aggregate(.0))]
    Fields(Vec<crate::status::FieldError>),
    #[error("{name} is already defined by {other}")]
    Duplicate { name: String, other: String },
}

/// Checks a CustomResourceDefinition object the way the catalog reads it.
pub fn check_definition(doc: &Value) -> Result<(), DefinitionError> {
    let crd: CustomResourceDefinition =
        serde_json::from_value(doc.clone()).map_err(|e| DefinitionError::Invalid(e.to_string()))?;
    resource_from_crd(&crd, "", Origin::User).map(|_| ())
}

/// Whether a file in a definitions directory is read (by its extension).
pub fn is_manifest(p: &Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), CatalogError> {
    let meta = std::fs::metadata(path).map_err(|e| CatalogError::File {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let entries = std::fs::read_dir(path).map_err(|e| CatalogError::File {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    for entry in entries.flatten() {
        let p = entry.path();
        // Hidden entries are skipped: a mounted ConfigMap keeps its files
        // twice more under `..data` and `..<timestamp>`.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            collect_files(&p, out)?;
        } else if is_manifest(&p) && !p.exists() {
            // A dangling link: a mounted ConfigMap briefly has them while a
            // key is removed (kubelet swaps `..data`, then drops the link).
            tracing::debug!(file = %p.display(), "skipping a dangling link");
        } else if is_manifest(&p) {
            out.push(p);
        }
    }
    Ok(())
}

fn resource_from_crd(
    crd: &CustomResourceDefinition,
    source: &str,
    origin: Origin,
) -> Result<ResourceType, DefinitionError> {
    let invalid = DefinitionError::Invalid;
    let spec = &crd.spec;
    let names = &spec.names;
    let name = crd.metadata.name.clone().unwrap_or_default();
    if spec.group.is_empty() || !spec.group.contains('.') {
        return Err(invalid(format!(
            "spec.group {:?} must be a DNS subdomain with at least one dot",
            spec.group
        )));
    }
    if names.plural.is_empty() || names.kind.is_empty() {
        return Err(invalid(
            "spec.names.plural and spec.names.kind are required".into(),
        ));
    }
    if name != format!("{}.{}", names.plural, spec.group) {
        return Err(invalid(format!(
            "metadata.name {name:?} must be spec.names.plural + \".\" + spec.group ({}.{})",
            names.plural, spec.group
        )));
    }
    let namespaced = match spec.scope.as_str() {
        "Namespaced" => true,
        "Cluster" => false,
        other => {
            return Err(invalid(format!(
                "spec.scope {other:?} must be Namespaced or Cluster"
            )))
        }
    };
    if spec.versions.is_empty() {
        return Err(invalid("spec.versions must not be empty".into()));
    }
    let storage: Vec<_> = spec.versions.iter().filter(|v| v.storage).collect();
    if storage.len() != 1 {
        return Err(invalid(format!(
            "exactly one version must be the storage version, found {}",
            storage.len()
        )));
    }
    let conversion = match &spec.conversion {
        Some(conv) if conv.strategy == "Webhook" => Some(Arc::new(
            super::conversion::Webhook::from_spec(conv).map_err(invalid)?,
        )),
        Some(conv) if conv.strategy != "None" => {
            return Err(invalid(format!(
                "spec.conversion.strategy: Unsupported value: {:?}: supported values: \"None\", \"Webhook\"",
                conv.strategy
            )));
        }
        _ => None,
    };
    let mut versions = spec
        .versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            // kube reports schema errors under `spec.validation` when every version has
            // the same schema (its internal form keeps one), else under each version.
            let at = if spec.versions.iter().all(|o| o.schema == v.schema) {
                "spec.validation".to_string()
            } else {
                format!("spec.versions[{i}].schema")
            };
            version_from_crd(v, &at, origin)
        })
        .collect::<Result<Vec<_>, DefinitionError>>()?;
    let schemas: Vec<Option<Value>> = versions.iter().map(|v| v.schema.clone()).collect();
    for (i, v) in versions.iter_mut().enumerate() {
        v.schema_class = schemas.iter().position(|s| *s == schemas[i]).unwrap_or(i);
    }
    // Versions of one schema share one merge schema: the field manager then
    // compares them once (strategy None).
    let merges: Vec<_> = versions.iter().map(|v| v.merge.clone()).collect();
    for v in versions.iter_mut() {
        if let Some(m) = merges.get(v.schema_class) {
            v.merge = m.clone();
        }
    }
    for (v, crd_v) in versions.iter_mut().zip(&spec.versions) {
        if crd_v.deprecated == Some(true) {
            v.deprecation_warning = Some(match &crd_v.deprecation_warning {
                Some(w) => w.clone(),
                None => default_deprecation_warning(&crd_v.name, spec),
            });
        }
    }
    Ok(ResourceType {
        group: spec.group.clone(),
        plural: names.plural.clone(),
        singular: names
            .singular
            .clone()
            .unwrap_or_else(|| names.kind.to_lowercase()),
        kind: names.kind.clone(),
        list_kind: names
            .list_kind
            .clone()
            .unwrap_or_else(|| format!("{}List", names.kind)),
        short_names: names.short_names.clone().unwrap_or_default(),
        categories: names.categories.clone().unwrap_or_default(),
        namespaced,
        storage_version: storage[0].name.clone(),
        has_defaults: versions
            .iter()
            .any(|v| v.validation.as_ref().is_some_and(|s| s.has_defaults())),
        versions,
        source: source.to_string(),
        terminating: false,
        definition: serde_json::to_value(&crd.spec).unwrap_or_default(),
        conversion,
        registered_strategy: None,
    })
}

/// kube's `defaultDeprecationWarning`: `<group>/<version> <Kind> is
/// deprecated`, naming the highest-priority served, non-deprecated version
/// that ranks above it, if there is one.
fn default_deprecation_warning(version: &str, spec: &CustomResourceDefinitionSpec) -> String {
    let (group, kind) = (&spec.group, &spec.names.kind);
    let mut msg = format!("{group}/{version} {kind} is deprecated");
    let newer = spec
        .versions
        .iter()
        .filter(|v| v.served && v.deprecated != Some(true))
        .map(|v| v.name.as_str())
        .filter(|v| compare_versions(version, v) == std::cmp::Ordering::Less)
        .max_by(|a, b| compare_versions(a, b));
    if let Some(v) = newer {
        msg.push_str(&format!("; use {group}/{v} {kind}"));
    }
    msg
}

/// kube's validation of `deprecationWarning`: only on deprecated versions,
/// 1 to 256 bytes, printable characters only (so it fits a header).
fn check_deprecation_warning(v: &CustomResourceDefinitionVersion) -> Result<(), String> {
    let Some(w) = &v.deprecation_warning else {
        return Ok(());
    };
    let field = format!("spec.versions[{}].deprecationWarning", v.name);
    if v.deprecated != Some(true) {
        return Err(format!("{field}: can only be set for deprecated versions"));
    }
    if w.is_empty() || w.len() > 256 {
        return Err(format!("{field}: must be 1 to 256 characters long"));
    }
    if let Some((i, _)) = w.char_indices().find(|&(_, c)| !is_printable(c)) {
        return Err(format!(
            "{field}: must only contain printable UTF-8 characters; non-printable character found at index {i}"
        ));
    }
    Ok(())
}

/// Go's `unicode.IsPrint`, closely enough: no control or format characters,
/// no space but the ASCII one.
fn is_printable(c: char) -> bool {
    c == ' '
        || !(c.is_control()
            || c.is_whitespace()
            || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{e000}'..='\u{f8ff}'))
}

fn version_from_crd(
    v: &CustomResourceDefinitionVersion,
    schema_at: &str,
    origin: Origin,
) -> Result<Version, DefinitionError> {
    check_deprecation_warning(v).map_err(DefinitionError::Invalid)?;
    let sub = v.subresources.as_ref();
    let scale = sub.and_then(|s| s.scale.as_ref()).map(|s| ScaleSpec {
        spec_replicas_path: s.spec_replicas_path.clone(),
        status_replicas_path: s.status_replicas_path.clone(),
        label_selector_path: s.label_selector_path.clone(),
    });
    let printer_columns = v
        .additional_printer_columns
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| PrinterColumn {
            name: c.name.clone(),
            type_: c.type_.clone(),
            format: c.format.clone().unwrap_or_default(),
            description: c.description.clone().unwrap_or_else(|| {
                format!(
                    "Custom resource definition column (in JSONPath format): {}",
                    c.json_path
                )
            }),
            priority: c.priority.unwrap_or(0),
            json_path: c.json_path.clone(),
        })
        .collect();
    let selectable_fields = v
        .selectable_fields
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|f| f.json_path.clone())
        .collect();
    let schema = v
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).map_err(|e| DefinitionError::Invalid(e.to_string())))
        .transpose()?;
    let validation = schema
        .as_ref()
        .map(|s| {
            let compiled = match origin {
                Origin::User => crate::schema::Schema::compile(s),
                Origin::Trusted => crate::schema::Schema::compile_builtin(s),
            };
            compiled.map(Arc::new).map_err(|e| match e {
                CompileError::Invalid(e) => DefinitionError::Invalid(format!(
                    "spec.versions[{}].schema.openAPIV3Schema: {e}",
                    v.name
                )),
                CompileError::Fields(errs) => DefinitionError::Fields(
                    errs.into_iter()
                        .map(|mut f| {
                            f.field = format!("{schema_at}.{}", f.field);
                            f
                        })
                        .collect(),
                ),
            })
        })
        .transpose()?;
    let merge = Arc::new(crate::apply::MergeSchema::from_openapi(schema.as_ref()));
    Ok(Version {
        name: v.name.clone(),
        served: v.served,
        storage: v.storage,
        status_subresource: sub.and_then(|s| s.status.as_ref()).is_some(),
        scale,
        printer_columns,
        selectable_fields,
        schema,
        validation,
        merge,
        deprecation_warning: None,
        schema_class: 0,
    })
}

/// Kube's version priority: GA > beta > alpha, higher numbers first; others last by name.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let major: u32 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((major, 2, 0));
        }
        let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        Some((major, level, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((ma, la, na)), Some((mb, lb, nb))) => la.cmp(&lb).then(ma.cmp(&mb)).then(na.cmp(&nb)),
        (Some(_), None) => std::cmp::Ordering::Greater,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (None, None) => b.cmp(a),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A two-version CRD with status and scale (other registry tests load it too).
    pub(crate) const WIDGET: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.demo.kshard.dev
spec:
  group: demo.kshard.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
  - name: v1beta1
    served: true
    storage: false
"#;

    #[test]
    fn loads_multi_version_crd() {
        let mut c = Catalog::default();
        c.add_manifests(Path::new("w.yaml"), WIDGET).expect("load");
        let rt = c
            .find("demo.kshard.dev", "v1beta1", "widgets")
            .expect("found");
        assert_eq!(rt.list_kind, "WidgetList");
        assert_eq!(rt.storage_version, "v1");
        assert!(rt.version("v1").expect("v1").status_subresource);
        assert_eq!(rt.storage_version_hash().len(), 12);
        let groups = c.groups();
        assert_eq!(groups[0].versions, ["v1", "v1beta1"]);
    }

    #[test]
    fn malformed_document_is_reported_with_index() {
        let text = format!("{WIDGET}\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: x}}\nspec: {{group: nodot, names: {{plural: x, kind: X}}, scope: Namespaced, versions: []}}\n");
        let err = Catalog::default()
            .add_manifests(Path::new("bad.yaml"), &text)
            .expect_err("must fail");
        let msg = err.to_string();
        assert!(msg.starts_with("bad.yaml: document 1:"), "{msg}");
        assert!(msg.contains("spec.group"), "{msg}");
    }

    #[test]
    fn configmap_volume_layout_loads_each_crd_once() {
        // kubelet mounts a ConfigMap as `..<ts>/f`, `..data -> ..<ts>`, `f -> ..data/f`.
        let dir = tempfile::tempdir().expect("tmp");
        let ts = dir.path().join("..2026_11_22_00_00_00.1");
        std::fs::create_dir(&ts).expect("dir");
        std::fs::write(ts.join("widgets.yaml"), WIDGET).expect("write");
        std::os::unix::fs::symlink(&ts, dir.path().join("..data")).expect("link");
        std::os::unix::fs::symlink(
            dir.path().join("..data/widgets.yaml"),
            dir.path().join("widgets.yaml"),
        )
        .expect("link");
        let c = Catalog::load(&[dir.path().to_path_buf()]).expect("loads once, no duplicate");
        assert!(c.find("demo.kshard.dev", "v1", "widgets").is_some());
    }

    #[test]
    fn version_priority_is_kube_order() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2", "v2", "foo"];
        v.sort_by(|a, b| compare_versions(b, a));
        assert_eq!(v, ["v2", "v1", "v2beta1", "v1beta2", "v1alpha1", "foo"]);
    }

    fn crd_with_versions(versions: &str) -> String {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: deps.tests.example.com}}\nspec:\n  group: tests.example.com\n  scope: Cluster\n  names: {{plural: deps, kind: Dep}}\n  versions:\n{versions}"
        )
    }

    #[test]
    fn deprecation_warnings_are_kubes() {
        // kube's test/integration/deprecation_test.go fixture.
        let text = crd_with_versions(
            "  - {name: v1alpha1, served: true, deprecated: true}\n  - {name: v1alpha2, served: true, deprecated: true, deprecationWarning: custom deprecation warning}\n  - {name: v1beta3, served: true}\n  - {name: v1beta2, served: true}\n  - {name: v1, served: false, storage: true}\n",
        );
        let mut c = Catalog::default();
        c.add_manifests(Path::new("d.yaml"), &text).expect("load");
        let rt = &c.resources[0];
        let warning = |v: &str| rt.version(v).and_then(|v| v.deprecation_warning.clone());
        assert_eq!(
            warning("v1alpha1").as_deref(),
            Some("tests.example.com/v1alpha1 Dep is deprecated; use tests.example.com/v1beta3 Dep")
        );
        assert_eq!(
            warning("v1alpha2").as_deref(),
            Some("custom deprecation warning")
        );
        assert_eq!(warning("v1beta2"), None);
        assert_eq!(warning("v1beta3"), None);
        // No served, non-deprecated version ranks above: no replacement named.
        let text = crd_with_versions(
            "  - {name: v2, served: true, storage: true, deprecated: true}\n  - {name: v1, served: true}\n",
        );
        let mut c = Catalog::default();
        c.add_manifests(Path::new("d.yaml"), &text).expect("load");
        assert_eq!(
            c.resources[0]
                .version("v2")
                .and_then(|v| v.deprecation_warning.clone())
                .as_deref(),
            Some("tests.example.com/v2 Dep is deprecated")
        );
    }

    #[test]
    fn invalid_deprecation_warnings_are_refused() {
        for (version, why) in [
            ("{name: v1, served: true, storage: true, deprecationWarning: x}", "can only be set for deprecated versions"),
            ("{name: v1, served: true, storage: true, deprecated: true, deprecationWarning: ''}", "1 to 256"),
            ("{name: v1, served: true, storage: true, deprecated: true, deprecationWarning: \"a\\tb\"}", "non-printable character found at index 1"),
        ] {
            let text = crd_with_versions(&format!("  - {version}\n"));
            let err = Catalog::default()
                .add_manifests(Path::new("d.yaml"), &text)
                .expect_err(version);
            assert!(err.to_string().contains(why), "{version}: {err}");
        }
        let long = "x".repeat(257);
        let text = crd_with_versions(&format!(
            "  - {{name: v1, served: true, storage: true, deprecated: true, deprecationWarning: {long}}}\n"
        ));
        assert!(Catalog::default()
            .add_manifests(Path::new("d.yaml"), &text)
            .is_err());
    }
}
