//! CRD structural schemas: pruning, defaulting and validation of custom resources the
//! way apiextensions-apiserver does it, compiled once per CRD version.
//!
//! ```text
//! Schema::compile(&openAPIV3Schema)?            // once per CRD version
//! schema.prune(&mut obj) -> Vec<String>         // write path: unknown fields (sorted)
//! schema.apply_defaults(&mut obj)               // after pruning on write, and on read
//! schema.defaults_needed(&obj) -> bool           // on read: would defaulting change it?
//! schema.validate(&obj, old) -> Vec<FieldError> // old = Some(..) on update
//! ```
//!
//! One concept per file: [`structural`] parses the schema, [`prune`] drops unknown
//! fields, [`defaults`] applies `default`s, [`validate`] runs the OpenAPI value checks,
//! [`listtype`] the set/map uniqueness, [`embedded`] the embedded-resource checks,
//! [`cel`] the `x-kubernetes-validations` rules; [`render`] prints values as Go does and
//! [`formats`] knows the string formats.

pub mod cel;
pub mod cel_budget;
pub mod cel_cost;
pub mod cel_decl;
pub mod defaults;
pub mod embedded;
pub mod formats;
pub mod listtype;
pub mod prune;
pub mod render;
pub mod structural;
pub mod validate;

use crate::status::{FieldError, FieldErrorKind};
use serde_json::Value;
use structural::Node;

pub use structural::SchemaError;

/// Why a schema cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// A reason in words (kube reports it as one error on the schema).
    #[error("{0}")]
    Invalid(String),
    /// kube's field errors, with paths from `openAPIV3Schema` down.
    #[error("{}", crate::status::aggregate(.0))]
    Fields(Vec<FieldError>),
}

/// One CRD version's `openAPIV3Schema`, ready to prune, default and validate objects.
#[derive(Debug)]
pub struct Schema {
    root: Node,
    rules: Option<cel::Rules>,
    /// Whether any node has a `default` (reads skip defaulting when none does).
    has_defaults: bool,
    /// Whether any node is an embedded resource or a set or map list: most
    /// schemas have neither, and their writes skip those two walks.
    has_embedded: bool,
    has_list_types: bool,
}

impl Schema {
    /// Parses the schema and compiles its regexes and CEL rules; rules over kube's
    /// estimated cost limits refuse the schema with kube's field errors.
    pub fn compile(open_api_v3_schema: &Value) -> Result<Schema, CompileError> {
        Schema::compile_with(open_api_v3_schema, true)
    }

    /// [`Schema::compile`] without the static cost checks: kshard's own definitions, and
    /// stored ones (checked when written).
    pub fn compile_builtin(open_api_v3_schema: &Value) -> Result<Schema, CompileError> {
        Schema::compile_with(open_api_v3_schema, false)
    }

    fn compile_with(open_api_v3_schema: &Value, cost_checks: bool) -> Result<Schema, CompileError> {
        let root = Node::parse(open_api_v3_schema, "openAPIV3Schema")
            .map_err(|e| CompileError::Invalid(e.to_string()))?;
        let rules = cel::Rules::compile(&root, cost_checks).map_err(|e| match e {
            cel::RulesError::Compile(m) => CompileError::Invalid(m),
            cel::RulesError::Cost(errs) => CompileError::Fields(errs),
        })?;
        let has_defaults = defaults::any(&root);
        let has_embedded = root.any_in_tree(&|n| n.embedded);
        let has_list_types =
            root.any_in_tree(&|n| matches!(n.list_type.as_deref(), Some("set") | Some("map")));
        Ok(Schema {
            root,
            rules,
            has_defaults,
            has_embedded,
            has_list_types,
        })
    }

    /// Removes fields the schema does not declare; returns their paths, sorted
    /// (`spec.foo`, `spec.items[0].bar`) for `fieldValidation` warnings or errors.
    pub fn prune(&self, obj: &mut Value) -> Vec<String> {
        prune::prune_root(&self.root, obj)
    }

    /// Applies `default`s and drops nulls that are neither nullable nor defaulted.
    pub fn apply_defaults(&self, obj: &mut Value) {
        defaults::apply(&self.root, obj);
    }

    /// Whether the schema declares any `default`.
    pub fn has_defaults(&self) -> bool {
        self.has_defaults
    }

    /// Whether [`Schema::apply_defaults`] would change `obj`; reads nothing
    /// but `obj`, so a read path can skip copying objects that already carry
    /// every default (the usual case: they were defaulted when written).
    pub fn defaults_needed(&self, obj: &Value) -> bool {
        defaults::needed(&self.root, obj)
    }

    /// Validates `obj` (already pruned and defaulted); `old` is the stored object on
    /// updates. Order and gating follow the CR strategy: OpenAPI checks, embedded
    /// resources, list-type uniqueness, then CEL unless an earlier error blocks it.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut errs = self.validate_openapi(obj);
        self.validate_structure(obj, old, &mut errs);
        errs
    }

    /// The OpenAPI value checks alone (kube's `ValidateCustomResource`).
    pub fn validate_openapi(&self, obj: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate::value(&self.root, obj, "", &mut errs);
        errs
    }

    /// What the CR strategy checks after the validator: embedded resources,
    /// list-type uniqueness, then CEL unless an error so far (`errs` holds
    /// every earlier one, metadata and scale included) blocks it.
    pub fn validate_structure(&self, obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
        if self.has_embedded {
            embedded::validate(&self.root, obj, "", errs);
        }
        // On update kube skips list-type checks when the old object already broke them.
        let old_lists_ok = self.has_list_types
            && old.is_none_or(|o| {
                let mut e = Vec::new();
                listtype::validate(&self.root, o, "", &mut e);
                e.is_empty()
            });
        if old_lists_ok {
            listtype::validate(&self.root, obj, "", errs);
        }
        if let Some(rules) = &self.rules {
            if errs.iter().any(|e| is_blocking(e.kind)) {
                errs.push(FieldError::new(
                    FieldErrorKind::Invalid,
                    "<nil>",
                    Some("null".into()),
                    "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
                ));
            } else {
                rules.validate(obj, old, "", errs, &mut cel_budget::Budget::default());
            }
        }
    }
}

/// Errors after which kube does not run CEL rules (they may assume a well-typed object).
fn is_blocking(kind: FieldErrorKind) -> bool {
    matches!(
        kind,
        FieldErrorKind::NotSupported
            | FieldErrorKind::Required
            | FieldErrorKind::TooLong
            | FieldErrorKind::TooMany
            | FieldErrorKind::TypeInvalid
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget() -> Schema {
        Schema::compile(&json!({"type":"object","properties":{
            "spec":{"type":"object","required":["size"],"properties":{
                "size":{"type":"string","enum":["S","M","L"]},
                "replicas":{"type":"integer","minimum":0,"default":1},
                "tags":{"type":"array","x-kubernetes-list-type":"set","items":{"type":"string"}}},
                "x-kubernetes-validations":[{"rule":"self.replicas < 10","message":"at most 9 replicas"}]},
            "status":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}))
        .unwrap()
    }

    fn strings(e: &[FieldError]) -> Vec<String> {
        e.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn write_pipeline() {
        let s = widget();
        let mut obj = json!({"apiVersion":"demo/v1","kind":"Widget","metadata":{"name":"w"},
            "spec":{"size":"M","extra":true,"tags":["a","b"]},"status":{"free":{"form":1}}});
        assert_eq!(s.prune(&mut obj), vec!["spec.extra"]);
        s.apply_defaults(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert_eq!(obj["status"]["free"]["form"], 1);
        assert!(s.validate(&obj, None).is_empty());
    }

    #[test]
    fn cel_runs_only_without_blocking_errors() {
        let s = widget();
        let e = s.validate(
            &json!({"spec":{"size":"M","replicas":12,"tags":["a","a"]}}),
            None,
        );
        assert_eq!(
            strings(&e),
            vec![
                r#"spec.tags[1]: Duplicate value: "a""#,
                "spec: Invalid value: at most 9 replicas"
            ]
        );
        let e = s.validate(&json!({"spec":{"size":"XL","replicas":12}}), None);
        assert_eq!(
            strings(&e),
            vec![
                r#"spec.size: Unsupported value: "XL": supported values: "S", "M", "L""#,
                "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ]
        );
        let e = s.validate(&json!({"spec":{}}), None);
        assert_eq!(strings(&e)[0], "spec.size: Required value");
    }

    #[test]
    fn invalid_schema_is_rejected() {
        assert!(Schema::compile(&json!({"type":"string","pattern":"("})).is_err());
        assert!(Schema::compile(
            &json!({"type":"object","x-kubernetes-validations":[{"rule":")"}]})
        )
        .is_err());
    }

    #[test]
    fn set_lists_and_embedded_resources_are_found_however_deep() {
        // A set under a map's values' items, an embedded resource in a list.
        let deep = Schema::compile(&json!({"type":"object","properties":{"spec":{
            "type":"object",
            "additionalProperties":{"type":"array","items":{"type":"array",
                "x-kubernetes-list-type":"set","items":{"type":"string"}}},
            "properties":{"templates":{"type":"array","items":{"type":"object",
                "x-kubernetes-embedded-resource":true,
                "x-kubernetes-preserve-unknown-fields":true}}}}}}))
        .expect("schema");
        let obj = json!({"spec":{"a":[["x","x"]],"templates":[{"kind":"Pod"}]}});
        let mut errs = Vec::new();
        deep.validate_structure(&obj, None, &mut errs);
        assert_eq!(
            strings(&errs),
            [
                "spec[a][0][1]: Duplicate value: \"x\"",
                "spec.templates[0].apiVersion: Required value"
            ]
            .map(String::from)
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
        );
        // Without either, the same object has nothing to answer for.
        let plain = Schema::compile(&json!({"type":"object","properties":{"spec":{
            "type":"object","x-kubernetes-preserve-unknown-fields":true}}}))
        .expect("schema");
        assert!(!plain.has_list_types && !plain.has_embedded);
        let mut errs = Vec::new();
        plain.validate_structure(&obj, None, &mut errs);
        assert!(errs.is_empty());
    }

    /// `../shared/realworld-crds` beside the repository: public projects'
    /// CRDs. Missing data fails the tests rather than testing less.
    fn realworld_dir() -> std::path::PathBuf {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/realworld-crds");
        assert!(
            dir.is_dir(),
            "the real-world CRDs are missing at {}",
            dir.display()
        );
        dir
    }

    /// Every version of every CRD in the real-world set compiles.
    fn realworld() -> Vec<(String, Schema)> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(realworld_dir()).expect("read the real-world CRDs");
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let crd: Value = serde_saphyr::from_str(&text).unwrap();
            for v in crd["spec"]["versions"].as_array().unwrap() {
                let name = format!(
                    "{}/{}",
                    crd["metadata"]["name"].as_str().unwrap(),
                    v["name"].as_str().unwrap()
                );
                let schema = Schema::compile(&v["schema"]["openAPIV3Schema"])
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                out.push((name, schema));
            }
        }
        out
    }

    #[test]
    fn realworld_crds_compile() {
        let all = realworld();
        assert!(
            all.len() >= 8,
            "{:?}",
            all.iter().map(|x| &x.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn realworld_servicemonitor() {
        let Some((_, s)) = realworld()
            .into_iter()
            .find(|(n, _)| n == "servicemonitors.monitoring.coreos.com/v1")
        else {
            return;
        };
        let mut good = json!({"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor",
            "metadata":{"name":"web","namespace":"default"},
            "spec":{"selector":{"matchLabels":{"app":"web"}},
                "endpoints":[{"port":"http","interval":"30s","path":"/metrics","unknownKnob":1}]}});
        let pruned = s.prune(&mut good);
        assert_eq!(pruned, vec!["spec.endpoints[0].unknownKnob"]);
        s.apply_defaults(&mut good);
        assert_eq!(strings(&s.validate(&good, None)), Vec::<String>::new());
        let mut bad = json!({"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor",
            "metadata":{"name":"web"},
            "spec":{"selector":{},"endpoints":[{"port":"http","interval":"thirty","scheme":"gopher"}]}});
        s.prune(&mut bad);
        s.apply_defaults(&mut bad);
        let errs = strings(&s.validate(&bad, None));
        assert!(
            errs.iter().any(|e| e.starts_with(r#"spec.endpoints[0].interval: Invalid value: "thirty": spec.endpoints[0].interval in body should match"#)),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with(r#"spec.endpoints[0].scheme: Unsupported value: "gopher""#)),
            "{errs:?}"
        );
    }

    #[test]
    fn realworld_policyreport() {
        let Some((_, s)) = realworld()
            .into_iter()
            .find(|(n, _)| n.starts_with("policyreports.") && n.ends_with("v1beta2"))
        else {
            return;
        };
        let mut obj = json!({"apiVersion":"wgpolicyk8s.io/v1beta2","kind":"PolicyReport",
            "metadata":{"name":"r","namespace":"default"},
            "summary":{"pass":1,"fail":0},
            "results":[{"policy":"require-labels","result":"pass","source":"kyverno",
                "timestamp":{"seconds":1700000000,"nanos":0}}]});
        s.prune(&mut obj);
        s.apply_defaults(&mut obj);
        assert_eq!(strings(&s.validate(&obj, None)), Vec::<String>::new());
        obj["results"][0]["result"] = json!("maybe");
        let errs = strings(&s.validate(&obj, None));
        assert!(
            errs.iter()
                .any(|e| e.starts_with(r#"results[0].result: Unsupported value: "maybe""#)),
            "{errs:?}"
        );
    }
}
