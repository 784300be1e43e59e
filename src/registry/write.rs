//! The write pipeline shared by every resource: decode checks, metadata rules,
//! the strategy derived from the CRD (status/scale subresources, generation),
//! finalizers, then one conditional write per change (through
//! `guaranteed::Attempts`), with admission where kube has it. Deletion is in
//! `delete.rs`.
//!
//! One file (about 1,200 lines): create, update, patch and apply run the same steps in one
//! order, each a named function here; the read-modify-write loop (`guaranteed.rs`),
//! preconditions, strategies, patches and admission are their own modules.

use crate::object::MetaField;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::guaranteed::{too_deep, too_large, Attempts, Current, Plan};
use super::preconditions::{check_resource_version, Preconditions};
use super::read::Item;
use super::resource_version::parse_object_revision;
use super::write_admission::{Caller, Operation, Step};
use super::{convert_value, storage_error, Registry, Target};
use crate::apply::{ApplyError, ConvertError, FieldManager, MergeSchema, Versions};
use crate::object::meta::{go_string_slice, path_segment_errors, validate_object_meta};
use crate::object::now_rfc3339;
use crate::object::{
    copy_field, finalizers, generation, is_deleting, meta_mut, meta_str, spec_part,
};
use crate::status::{quote, ApiError, FieldError};
use crate::storage::{StorageError, Write};

const GENERATE_NAME_ATTEMPTS: usize = 8;
const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// How unknown fields in a request body are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// 400 listing every unknown field.
    Strict,
    /// Dropped, with one `Warning` header each.
    #[default]
    Warn,
    /// Dropped silently.
    Ignore,
}

/// Options every create/update/patch carries.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// The field manager recorded in managedFields (empty: not tracked).
    pub manager: String,
    /// Who asks, for admission (`None`: kshard's own writes, no webhooks).
    pub caller: Option<Arc<Caller>>,
    /// Repeated keys the body decoder found under Strict: kube reports them
    /// in one error with the unknown fields, so they wait for the schema.
    pub strict_duplicates: Vec<String>,
}

/// A successful write and the warnings to send with it.
pub struct Outcome {
    pub item: Item,
    pub warnings: Vec<String>,
    /// The write created the object (an apply may create or update: 201 or 200).
    pub created: bool,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
    /// Writes through `/scale`: they change the main resource (its replicas)
    /// and are recorded in managedFields with `subresource: scale`.
    Scale,
}

fn random_suffix() -> String {
    let bytes = uuid::Uuid::new_v4();
    bytes.as_bytes()[..5]
        .iter()
        .map(|b| GENERATE_NAME_ALPHABET[*b as usize % GENERATE_NAME_ALPHABET.len()] as char)
        .collect()
}

impl Registry {
    /// Checks apiVersion/kind/namespace of a request body and fills the namespace.
    fn check_body(&self, t: &Target, obj: &mut Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: expected an object",
                t.rt.kind
            )));
        }
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !t.is_api_version(api_version) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({})",
                t.api_version()
            )));
        }
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind.is_empty() {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing",
                t.rt.kind
            )));
        }
        if kind != t.rt.kind {
            let name = meta_str(obj, "name").to_string();
            return Err(ApiError::invalid(
                &t.rt.group,
                kind,
                &name,
                &[FieldError::invalid(
                    "kind",
                    kind,
                    format!("must be {}", t.rt.kind),
                )],
            ));
        }
        let rt_namespaced = t.rt.namespaced;
        let Some(meta) = meta_mut(obj) else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        if rt_namespaced {
            let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if ns.is_empty() {
                meta.insert("namespace".into(), Value::String(t.namespace.clone()));
            } else if ns != t.namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta.remove("namespace");
        }
        Ok(())
    }

    /// Decoding against the schema: unknown fields pruned (and reported as
    /// `fieldValidation` asks), defaults filled in.
    fn decode_schema(
        &self,
        t: &Target,
        obj: &mut Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        crate::object::meta::whole_numbers_as_integers(obj);
        // kube reports unknown metadata fields first, then the schema's.
        let mut unknown_paths = crate::object::meta::drop_unknown_metadata(obj);
        if let Some(schema) = t.version_info().and_then(|v| v.validation.clone()) {
            unknown_paths.extend(schema.prune(obj));
        }
        let unknown: Vec<String> = unknown_paths
            .iter()
            .map(|p| format!("unknown field {}", quote(p)))
            .collect();
        if opts.field_validation == FieldValidation::Strict && !opts.strict_duplicates.is_empty() {
            let mut all = opts.strict_duplicates.clone();
            all.extend(unknown);
            return Err(strict_decoding_error(t, &all));
        }
        if !unknown.is_empty() {
            match opts.field_validation {
                FieldValidation::Strict => return Err(strict_decoding_error(t, &unknown)),
                FieldValidation::Warn => warnings.extend(unknown),
                FieldValidation::Ignore => {}
            }
        }
        if let Some(schema) = t.version_info().and_then(|v| v.validation.clone()) {
            schema.apply_defaults(obj);
        }
        t.rt.strategy().prepare(obj);
        Ok(())
    }

    /// Every check of kube's CR strategy, in its order, answered as one 422:
    /// metadata (of `meta_view`: on create, the object before a name is
    /// generated), the OpenAPI schema, the scale paths (a `/status` write
    /// skips the spec's), embedded resources, list types, then CEL unless an
    /// earlier error blocks it. On update, schema errors on values the update
    /// did not change are not held against it (ratcheting, kube 1.30+), so
    /// objects stored under older rules stay updatable.
    fn validate(
        &self,
        t: &Target,
        obj: &Value,
        meta_view: &Value,
        old: Option<&Value>,
        sub: Subresource,
    ) -> Result<(), ApiError> {
        let no_meta = serde_json::Map::new();
        let meta = meta_view
            .get("metadata")
            .and_then(Value::as_object)
            .unwrap_or(&no_meta);
        let mut errs = validate_object_meta(meta, t.rt.namespaced);
        // The uid never changes. kube checks it twice, with the common
        // fields and again in the custom resource strategy, so its Status
        // names it twice among the causes (once in the message).
        if let Some(old) = old {
            let (new_uid, old_uid) = (meta_str(meta_view, "uid"), meta_str(old, "uid"));
            if new_uid != old_uid {
                let e = FieldError::invalid("metadata.uid", new_uid, "field is immutable");
                errs.extend([e.clone(), e]);
            }
        }
        let version = t.version_info();
        let schema = version.and_then(|v| v.validation.clone());
        let ratchet = |errs: &mut Vec<FieldError>, from: usize| {
            if let Some(old) = old {
                let added = errs.split_off(from);
                errs.extend(added.into_iter().filter(|e| {
                    // A spent CEL budget stopped the rules after it, changed
                    // values' included: never excused.
                    if e.detail.contains("no further validation rules will be run") {
                        return true;
                    }
                    let (new_v, old_v) = (value_at(obj, &e.field), value_at(old, &e.field));
                    new_v.is_none() || new_v != old_v
                }));
            }
        };
        if let Some(schema) = &schema {
            let from = errs.len();
            errs.extend(schema.validate_openapi(obj));
            ratchet(&mut errs, from);
        }
        if let Some(scale) = version.and_then(|v| v.scale.as_ref()) {
            errs.extend(super::scale::validate(
                scale,
                obj,
                sub != Subresource::Status,
            ));
        }
        errs.extend(
            t.rt.strategy()
                .validate(obj, old, sub == Subresource::Status),
        );
        // A stand-in for a kube built-in type: kube's own validation, in its
        // words and order, instead of list-type and CEL checks (its schema
        // has neither).
        if let Some(builtin) = t.rt.strategy().builtin_validation(obj) {
            let from = errs.len();
            errs.extend(builtin.errors);
            if builtin.ratcheted {
                ratchet(&mut errs, from);
            }
        } else if let Some(schema) = &schema {
            let from = errs.len();
            schema.validate_structure(obj, old, &mut errs);
            ratchet(&mut errs, from);
        }
        invalid_unless_empty(t, obj, &errs)
    }

    fn field_manager<'a>(&self, t: &'a Target, sub: Subresource) -> Option<FieldManager<'a>> {
        let v = t.version_info()?;
        let subresource = match sub {
            Subresource::Main => None,
            Subresource::Status => Some("status"),
            Subresource::Scale => Some("scale"),
        };
        Some(
            FieldManager::new(
                &v.merge,
                &t.api_version(),
                subresource,
                v.status_subresource,
            )
            .with_versions(Box::new(DefinitionVersions(&t.rt)))
            .with_present_fields(t.rt.strategy().always_present()),
        )
    }

    /// Records `manager`'s Update entry in the new object's managedFields
    /// (kube's `unknown` when the request named no manager and sent no
    /// User-Agent).
    fn track(
        &self,
        t: &Target,
        old: Option<&Value>,
        new: &mut Value,
        sub: Subresource,
        manager: &str,
    ) -> Result<(), ApiError> {
        let Some(fm) = self.field_manager(t, sub) else {
            return Ok(());
        };
        fm.update(old, new, manager, &now_rfc3339())
            .map_err(|e| apply_error(t, meta_str(new, "name"), e))
    }

    /// Server-side apply: merges `config` into the live object (creating it when
    /// absent) with field ownership and conflicts, then runs the usual pipeline.
    pub async fn apply(
        &self,
        t: &Target,
        name: &str,
        mut config: Value,
        force: bool,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        if sub != Subresource::Scale {
            // kube's apply handler refuses a configuration of another type
            // before anything else looks at it.
            let api_version = config.get("apiVersion").and_then(Value::as_str);
            let kind = config.get("kind").and_then(Value::as_str);
            if let (Some(v), Some(k)) = (api_version, kind) {
                if !v.is_empty() && !k.is_empty() && (v != t.api_version() || k != t.rt.kind) {
                    return Err(ApiError::bad_request(format!(
                        "invalid object type: {v}, Kind={k}"
                    )));
                }
            }
        }
        // kube's field manager names the configuration as sent (its
        // namespace and name may be missing); this one gets them filled in.
        let sent_as = format!(
            "({}/{}; ",
            meta_str(&config, "namespace"),
            meta_str(&config, "name")
        );
        self.check_body(t, &mut config)?;
        let config_name = meta_str(&config, "name");
        if !config_name.is_empty() && config_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({config_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(m) = meta_mut(&mut config) {
            m.insert("name".into(), Value::String(name.to_string()));
        }
        let fm = self
            .field_manager(t, sub)
            .ok_or_else(ApiError::not_found_path)?;
        let mut warnings = Vec::new();
        let mut created = false;
        let mut attempts = Attempts::new(self, t, name);
        let item = loop {
            let read = attempts.read().await?;
            let live = read.as_ref();
            let decided: Result<Plan, ApiError> = async {
                // The last attempt decides (a retry may find the object
                // created by another writer meanwhile).
                warnings.clear();
                let mut merged = fm
                    .apply(
                        live.map(|c| &c.value),
                        &config,
                        &opts.manager,
                        force,
                        &now_rfc3339(),
                    )
                    .map_err(|e| match e {
                        ApplyError::Internal(m) => ApplyError::Internal(m.replacen(
                            &format!("({}/{}; ", meta_str(&config, "namespace"), name),
                            &sent_as,
                            1,
                        )),
                        e => e,
                    })
                    .map_err(|e| apply_error(t, name, e))?;
                self.decode_schema(t, &mut merged, opts, &mut warnings)?;
                let Some(current) = live else {
                    if sub != Subresource::Main {
                        return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name));
                    }
                    // kube's patch handler admits an apply that creates as a CREATE.
                    let step = Step::new(Operation::Create, name, sub, None);
                    self.admit_mutating(t, &step, Some(&mut merged), opts, &mut warnings)
                        .await?;
                    warnings.extend(finalizer_warnings(&merged, None));
                    return match self.create_tracked(t, merged, opts, &mut warnings).await {
                        Ok(item) => {
                            created = true;
                            Ok(Plan::Done(item))
                        }
                        // Someone created it meanwhile: decide again from theirs.
                        Err(e) if e.reason == "AlreadyExists" => Ok(Plan::Again),
                        Err(e) => Err(e),
                    };
                };
                if let Some(m) = meta_mut(&mut merged) {
                    m.insert(
                        "resourceVersion".into(),
                        Value::String(current.rev.to_string()),
                    );
                }
                let step = Step::new(Operation::Update, name, sub, Some(&current.value));
                self.admit_mutating(t, &step, Some(&mut merged), opts, &mut warnings)
                    .await?;
                self.plan_update(t, name, current, merged, sub, opts, &mut warnings)
                    .await
            }
            .await;
            if let Some(item) = attempts.settle(live, decided).await? {
                break item;
            }
        };
        Ok(Outcome {
            item,
            warnings,
            created,
        })
    }

    pub(super) async fn to_storage(&self, t: &Target, obj: &Value) -> Result<Value, ApiError> {
        convert_value(
            &t.rt,
            obj,
            &format!("{}/{}", t.rt.group, t.rt.storage_version),
        )
        .await
    }

    /// [`Registry::to_storage`] of an object no longer needed as it was:
    /// already at the storage version it is passed on, not copied.
    pub(super) async fn storage_of_owned(&self, t: &Target, obj: Value) -> Result<Value, ApiError> {
        if obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| t.is_storage_version(v))
        {
            return Ok(obj);
        }
        let storage = format!("{}/{}", t.rt.group, t.rt.storage_version);
        convert_value(&t.rt, &obj, &storage).await
    }

    /// A written object as the answer shows it: decoded back from storage
    /// (with the defaults kube adds on read), in the request's version.
    pub(super) async fn item(
        &self,
        t: &Target,
        object: &Arc<Value>,
        json: &Bytes,
    ) -> Result<Item, ApiError> {
        let (object, json) = match super::read_defaults(&t.rt, object) {
            Some(v) => {
                let json = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
                (Arc::new(v), json)
            }
            None => (object.clone(), json.clone()),
        };
        if object
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|v| t.is_api_version(v))
        {
            Ok(Item::new(object, json))
        } else {
            // One conversion serves both forms.
            let value = convert_value(&t.rt, &object, &t.api_version()).await?;
            let json = Bytes::from(serde_json::to_vec(&value).map_err(ApiError::internal)?);
            Ok(Item::new(value, json))
        }
    }

    /// A dry run's answer, as if written: kube encodes it for storage and
    /// decodes it back, so the storage version's defaults show.
    pub(super) async fn dry_run_item(&self, t: &Target, obj: Value) -> Result<Item, ApiError> {
        let stored = self.to_storage(t, &obj).await?;
        let defaulted = super::read_defaults(&t.rt, &stored);
        let v = convert_value(
            &t.rt,
            defaulted.as_ref().unwrap_or(&stored),
            &t.api_version(),
        )
        .await?;
        let json = Bytes::from(serde_json::to_vec(&v).unwrap_or_default());
        Ok(Item::new(v, json))
    }

    pub async fn create(
        &self,
        t: &Target,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        self.check_body(t, &mut obj)?;
        let mut warnings = Vec::new();
        self.decode_schema(t, &mut obj, opts, &mut warnings)?;
        self.track(t, None, &mut obj, Subresource::Main, &opts.manager)?;
        // kube's create handler names the object for admission before a
        // generated name exists (empty then).
        let name = meta_str(&obj, "name").to_string();
        let step = Step::new(Operation::Create, &name, Subresource::Main, None);
        self.admit_mutating(t, &step, Some(&mut obj), opts, &mut warnings)
            .await?;
        warnings.extend(finalizer_warnings(&obj, None));
        let item = self.create_tracked(t, obj, opts, &mut warnings).await?;
        Ok(Outcome {
            item,
            warnings,
            created: true,
        })
    }

    /// Create of an object whose body checks, managedFields and mutating
    /// admission are done: system fields, name generation, validation,
    /// validating admission, the write.
    pub(super) async fn create_tracked(
        &self,
        t: &Target,
        mut obj: Value,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<Item, ApiError> {
        let dry_run = opts.dry_run;
        let has_status = t.has_status();
        if let Some(o) = obj.as_object_mut() {
            if has_status {
                o.remove("status");
            }
        }
        let Some(meta) = meta_mut(&mut obj) else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        // kube's storage refuses a create that names a version (one that
        // parses as a number other than 0; a dry run never reaches storage).
        // kube answers 500 for it; bad input here is never a 500, so 400
        // with kube's message.
        let named_version = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .and_then(|rv| rv.parse::<u64>().ok())
            .is_some_and(|rv| rv != 0);
        if named_version && !dry_run {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "resourceVersion",
        ] {
            meta.remove(field);
        }
        meta.insert("generation".into(), json!(1));
        let generate = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let explicit_name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        meta.insert(
            "uid".into(),
            Value::String(crate::object::meta::new_uid().to_string()),
        );
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));

        let generated = explicit_name.is_empty() && !generate.is_empty();
        let next_name = || {
            if generated {
                let prefix: String = generate.chars().take(58).collect();
                format!("{prefix}{}", random_suffix())
            } else {
                explicit_name.clone()
            }
        };
        // kube generates the name before validating, so a bad generateName
        // is reported on both fields and the 422 names the generated name.
        let mut name = next_name();
        if let Some(m) = meta_mut(&mut obj) {
            if name.is_empty() {
                m.remove("name");
            } else {
                m.insert("name".into(), Value::String(name.clone()));
            }
        }
        self.validate(t, &obj, &obj, None, Subresource::Main)?;
        // kube's validating admission sees the generated name.
        let step = Step::new(Operation::Create, &name, Subresource::Main, None);
        self.admit_validating(t, &step, Some(&obj), opts, warnings)
            .await?;
        let attempts = if generated { GENERATE_NAME_ATTEMPTS } else { 1 };
        let mut last_name = name.clone();
        for attempt in 0..attempts {
            if attempt > 0 {
                name = next_name();
            }
            last_name = name.clone();
            if let Some(m) = meta_mut(&mut obj) {
                m.insert("name".into(), Value::String(name.clone()));
            }
            if dry_run {
                if self
                    .store
                    .get(&t.key(&name))
                    .await
                    .map_err(storage_error)?
                    .is_some()
                {
                    if explicit_name.is_empty() {
                        continue;
                    }
                    return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
                }
                return self.dry_run_item(t, obj).await;
            }
            // The last attempt's object is not needed again: it is passed on.
            let object = if attempt + 1 < attempts {
                self.to_storage(t, &obj).await?
            } else {
                self.storage_of_owned(t, std::mem::take(&mut obj)).await?
            };
            let write = Write::Create {
                key: t.key(&name),
                object,
            };
            match self.store.write(write).await {
                Ok(w) => return self.item(t, &w.object, &w.json).await,
                Err(StorageError::AlreadyExists) => {
                    if explicit_name.is_empty() {
                        continue;
                    }
                    let mut e = ApiError::already_exists(&t.rt.group, &t.rt.plural, &name);
                    if let Ok(Some((_, json))) = self.store.get(&t.key(&name)).await {
                        if serde_json::from_slice::<Value>(&json).is_ok_and(|v| is_deleting(&v)) {
                            e.message = format!("object is being deleted: {}", e.message);
                        }
                    }
                    return Err(e);
                }
                Err(StorageError::TooLarge { size, limit }) => {
                    return Err(too_large(t, &name, size, limit))
                }
                Err(StorageError::TooDeep { limit }) => return Err(too_deep(t, &name, limit)),
                Err(e) => return Err(storage_error(e)),
            }
        }
        let mut e = ApiError::already_exists(&t.rt.group, &t.rt.plural, &last_name);
        e.message = format!(
            "{}, the server was not able to generate a unique name for the object",
            e.message
        );
        if let Some(d) = e.details.as_mut() {
            d.retry_after_seconds = 1;
        }
        Err(e)
    }

    /// PUT of the main resource or `/status`.
    pub async fn update(
        &self,
        t: &Target,
        name: &str,
        mut obj: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        self.check_body(t, &mut obj)?;
        let mut warnings = Vec::new();
        self.decode_schema(t, &mut obj, opts, &mut warnings)?;
        let body_name = meta_str(&obj, "name").to_string();
        if body_name.is_empty() {
            if let Some(m) = meta_mut(&mut obj) {
                m.insert("name".into(), Value::String(name.to_string()));
            }
        } else if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let rv = meta_str(&obj, "resourceVersion").to_string();
        let expected = if rv.is_empty() {
            None
        } else {
            Some(parse_object_revision("metadata.resourceVersion", &rv)?)
        };
        let preconditions = Preconditions::uid_of(&obj);
        let mut notes = Vec::new();
        let mut attempts = Attempts::new(self, t, name).named_at(expected);
        let item = loop {
            let read = attempts.read().await?;
            let current = read.as_ref();
            let decided: Result<Plan, ApiError> = async {
                // kube's order (as the reference server answers): existence
                // (custom resources are never created by PUT), the UID
                // precondition, then managedFields and mutating admission,
                // then the resourceVersion.
                let current = current.ok_or_else(|| not_found(t, name))?;
                preconditions.check(t, name, &current.value)?;
                let mut new = obj.clone();
                notes.clear();
                self.track(t, Some(&current.value), &mut new, sub, &opts.manager)?;
                let step = Step::new(Operation::Update, name, sub, Some(&current.value));
                self.admit_mutating(t, &step, Some(&mut new), opts, &mut notes)
                    .await?;
                let Some(expected) = expected else {
                    return Err(ApiError::invalid(
                        &t.rt.group,
                        &t.rt.plural,
                        name,
                        &[FieldError::new(
                            crate::status::FieldErrorKind::Invalid,
                            "metadata.resourceVersion",
                            Some("0".into()),
                            "must be specified for an update",
                        )],
                    ));
                };
                check_resource_version(t, name, expected, current)?;
                self.plan_update(t, name, current, new, sub, opts, &mut notes)
                    .await
            }
            .await;
            if let Some(item) = attempts.settle(current, decided).await? {
                break item;
            }
        };
        warnings.extend(notes);
        Ok(Outcome {
            item,
            warnings,
            created: false,
        })
    }

    /// Re-reads and applies `change` until it commits without a concurrent write in
    /// between (patches and internal updates). `change` may fail to abort.
    pub async fn update_with<F>(
        &self,
        t: &Target,
        name: &str,
        sub: Subresource,
        opts: &WriteOptions,
        mut change: F,
    ) -> Result<Outcome, ApiError>
    where
        F: FnMut(&Value) -> Result<Value, ApiError>,
    {
        let mut warnings = Vec::new();
        let mut attempts = Attempts::new(self, t, name);
        let item = loop {
            let read = attempts.read().await?;
            let current = read.as_ref();
            let decided: Result<Plan, ApiError> = async {
                let current = current.ok_or_else(|| not_found(t, name))?;
                let mut obj = change(&current.value)?;
                // kube's patch handler reports a strict decoding error as an
                // invalid `patch`, showing the patched object (keys sorted).
                let patched = (opts.field_validation == FieldValidation::Strict)
                    .then(|| serde_json::to_string(&sorted_keys(&obj)).unwrap_or_default());
                self.check_body(t, &mut obj)?;
                warnings.clear();
                self.decode_schema(t, &mut obj, opts, &mut warnings)
                    .map_err(|e| match (&patched, e.message.find(STRICT)) {
                        (Some(patched), Some(at)) if e.code == 400 => ApiError::invalid(
                            "",
                            "",
                            "",
                            &[FieldError::new(
                                crate::status::FieldErrorKind::Invalid,
                                "patch",
                                Some(quote(patched)),
                                &e.message[at..],
                            )],
                        ),
                        _ => e,
                    })?;
                let body_name = meta_str(&obj, "name");
                if body_name != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )));
                }
                let rv = meta_str(&obj, "resourceVersion").to_string();
                self.track(t, Some(&current.value), &mut obj, sub, &opts.manager)?;
                // kube's patch handler: the patch, managedFields, then mutating
                // admission, all before the store checks the resourceVersion.
                let step = Step::new(Operation::Update, name, sub, Some(&current.value));
                self.admit_mutating(t, &step, Some(&mut obj), opts, &mut warnings)
                    .await?;
                if !rv.is_empty() {
                    // A resourceVersion the client set in the patch.
                    let sent = parse_object_revision("metadata.resourceVersion", &rv)?;
                    check_resource_version(t, name, sent, current)?;
                }
                self.plan_update(t, name, current, obj, sub, opts, &mut warnings)
                    .await
            }
            .await;
            if let Some(item) = attempts.settle(current, decided).await? {
                break item;
            }
        };
        Ok(Outcome {
            item,
            warnings,
            created: false,
        })
    }

    /// The write an update of `current` to `obj` (managedFields recorded,
    /// mutating admission done) makes: system fields kept, status or main
    /// part only, finalizer and generation rules, validation, validating
    /// admission.
    #[allow(clippy::too_many_arguments)]
    async fn plan_update(
        &self,
        t: &Target,
        name: &str,
        stored: &Current,
        obj: Value,
        sub: Subresource,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<Plan, ApiError> {
        let (current_rev, current) = (stored.rev, &stored.value);
        let dry_run = opts.dry_run;
        let has_status = t.has_status();
        let mut new = match sub {
            Subresource::Main | Subresource::Scale => {
                let mut new = obj;
                if has_status {
                    // The main resource cannot change status when it has its own subresource.
                    if let Some(o) = new.as_object_mut() {
                        copy_field(o, current.as_object(), "status");
                    }
                }
                new
            }
            Subresource::Status => {
                // Only status (and managedFields) come from the request.
                let mut new = current.clone();
                if let Some(o) = new.as_object_mut() {
                    copy_field(o, obj.as_object(), "status");
                }
                if let (Some(mf), Some(m)) =
                    (obj.meta_field("managedFields").cloned(), meta_mut(&mut new))
                {
                    m.insert("managedFields".into(), mf);
                }
                new
            }
        };
        // System fields keep their stored values; the uid only when none is
        // given (kube's BeforeUpdate: another one is refused by validation).
        let old_meta = current.get("metadata").and_then(Value::as_object);
        if let Some(m) = meta_mut(&mut new) {
            if m.get("uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                copy_field(m, old_meta, "uid");
            }
            for field in [
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                copy_field(m, old_meta, field);
            }
            m.insert(
                "resourceVersion".into(),
                Value::String(current_rev.to_string()),
            );
            m.remove("selfLink");
        }
        if is_deleting(current) {
            let old = finalizers(current);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &t.rt.group,
                    &t.rt.kind,
                    name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {}",
                            go_string_slice(&added)
                        ),
                    )],
                ));
            }
        }
        if spec_part(&new, has_status) != spec_part(current, has_status) {
            let g = generation(current) + 1;
            if let Some(m) = meta_mut(&mut new) {
                m.insert("generation".into(), json!(g));
            }
        }
        self.validate(t, &new, &new, Some(current), sub)?;
        if sub != Subresource::Status {
            warnings.extend(finalizer_warnings(&new, Some(current)));
        }
        // kube calls validating admission on no-op updates too.
        let step = Step::new(Operation::Update, name, sub, Some(current));
        self.admit_validating(t, &step, Some(&new), opts, warnings)
            .await?;

        keep_managed_fields_times(&mut new, current);
        if stored.unchanged_by(&new) {
            // Nothing changed: no write, no new revision (as kube does).
            let json = Bytes::from(serde_json::to_vec(current).map_err(ApiError::internal)?);
            return Ok(Plan::Done(Item::new(current.clone(), json)));
        }
        if dry_run {
            return Ok(Plan::Done(self.dry_run_item(t, new).await?));
        }
        if is_deleting(&new) && finalizers(&new).is_empty() {
            // The last finalizer is gone: the object goes away.
            return Ok(Plan::Finalized(new));
        }
        Ok(Plan::Update(new))
    }

    /// Checks a URL name the way kube's key function does.
    pub fn check_url_name(&self, name: &str) -> Result<(), ApiError> {
        let errs = path_segment_errors(name);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::bad_request(format!(
                "Name parameter invalid: {}: {}",
                quote(name),
                errs.join(";")
            )))
        }
    }
}

/// The versions of a definition as the field manager sees them: every
/// version the definition lists (served or not, as kube's converter accepts
/// them), converted by its webhook or by an apiVersion rewrite.
struct DefinitionVersions<'a>(&'a crate::apiextensions::catalog::ResourceType);

impl Versions for DefinitionVersions<'_> {
    fn schema(&self, api_version: &str) -> Option<&MergeSchema> {
        let rt = self.0;
        let name = if rt.group.is_empty() {
            api_version
        } else {
            api_version
                .strip_prefix(rt.group.as_str())?
                .strip_prefix('/')?
        };
        rt.versions
            .iter()
            .find(|v| v.name == name)
            .map(|v| v.merge.as_ref())
    }

    fn rewrites_only(&self) -> bool {
        self.0.conversion.is_none()
    }

    fn convert(&self, objs: &[&Value], api_version: &str) -> Result<Vec<Value>, ConvertError> {
        if self.schema(api_version).is_none() {
            return Err(ConvertError::MissingVersion(api_version.to_string()));
        }
        let rt = self.0;
        let owned: Vec<Value> = objs.iter().map(|o| (*o).clone()).collect();
        let mut out = match &rt.conversion {
            Some(webhook) => webhook
                .convert_many_uncached_blocking(&owned, api_version)
                .map_err(ConvertError::Failed)?,
            None => owned
                .into_iter()
                .map(|mut o| {
                    if let Some(m) = o.as_object_mut() {
                        m.insert("apiVersion".into(), Value::String(api_version.into()));
                    }
                    o
                })
                .collect(),
        };
        // As on reads: a version with another schema prunes what it lacks.
        for (o, from) in out.iter_mut().zip(objs) {
            let from = from.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            if let Some(schema) = rt.pruning_between(from, api_version) {
                schema.prune(o);
            }
        }
        Ok(out)
    }
}

/// 422 listing `errs`, if there are any.
/// kube's warnings for finalizers a write adds (sorted, as its set lists
/// them): a finalizer without a domain-qualified path may collide with
/// other writers'.
fn finalizer_warnings(new: &Value, old: Option<&Value>) -> Vec<String> {
    let before = old.map(finalizers).unwrap_or_default();
    let mut added: Vec<String> = finalizers(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    added.sort();
    added.dedup();
    added
        .iter()
        .flat_map(|f| crate::object::meta::finalizer_name_warnings(f))
        .collect()
}

fn invalid_unless_empty(t: &Target, obj: &Value, errs: &[FieldError]) -> Result<(), ApiError> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &t.rt.group,
        &t.rt.kind,
        meta_str(obj, "name"),
        errs,
    ))
}

fn not_found(t: &Target, name: &str) -> ApiError {
    ApiError::not_found(&t.rt.group, &t.rt.plural, name)
}

/// The value at a kube field path (`spec.items[2].name`, `spec.map[key]`).
fn value_at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = root;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(inner) = rest.strip_prefix('[') {
            let end = inner.find(']')?;
            let key = &inner[..end];
            cur = match cur {
                Value::Array(a) => a.get(key.parse::<usize>().ok()?)?,
                Value::Object(o) => o.get(key)?,
                _ => return None,
            };
            rest = &inner[end + 1..];
        } else {
            let seg_end = rest.find(['.', '[']).unwrap_or(rest.len());
            cur = cur.get(&rest[..seg_end])?;
            rest = &rest[seg_end..];
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(cur)
}

/// Maps field-manager failures to kube's Status (conflicts carry one cause per field).
fn apply_error(t: &Target, name: &str, e: ApplyError) -> ApiError {
    match &e {
        ApplyError::Conflicts(conflicts) => {
            let mut err = ApiError::conflict(&t.rt.group, &t.rt.plural, name, "");
            err.message = e.to_string();
            if let Some(d) = err.details.as_mut() {
                // kube's conflict Status names no object, only the causes.
                d.name.clear();
                d.group.clear();
                d.kind.clear();
                d.causes = conflicts
                    .iter()
                    .map(|c| crate::status::Cause {
                        reason: "FieldManagerConflict".into(),
                        message: c.cause_message(),
                        field: c.field.clone(),
                    })
                    .collect();
            }
            err
        }
        ApplyError::BadRequest(m) => ApiError::bad_request(m.clone()),
        // A plain error in kube's handler: 500 without reason or details.
        ApplyError::Internal(m) => {
            let mut err = ApiError::internal(m);
            err.message = m.clone();
            err.reason = "".into();
            err.details = None;
            err
        }
    }
}

const STRICT: &str = "strict decoding error: ";

/// `v` with every object's keys in sorted order (how Go encodes a map).
fn sorted_keys(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_keys(&o[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// kube's strict decoder refusal, as the CR handler wraps it.
pub fn strict_decoding_error(t: &Target, errors: &[String]) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version {version} cannot be handled as a {kind}: {STRICT}{}",
        errors.join(", "),
        kind = t.rt.kind,
        version = quote(&t.version),
    ))
}

/// kube's `IgnoreManagedFieldsTimestampsTransformer`, run on every update:
/// when an update changes nothing but the times of managedFields entries
/// (an apply whose configuration restates a system field, such as
/// `creationTimestamp: null` from `kubectl create --dry-run -o yaml`, counts
/// as a change until the system fields are restored), the stored entries
/// are kept, so the update is a no-op and writes nothing. Compared in place:
/// this runs on every update.
fn keep_managed_fields_times(new: &mut Value, current: &Value) {
    let entries = |v: &Value| {
        v.pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .cloned()
    };
    let (Some(new_mf), Some(old_mf)) = (
        new.pointer("/metadata/managedFields")
            .and_then(Value::as_array),
        current
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array),
    ) else {
        return;
    };
    if new_mf == old_mf || new_mf.len() != old_mf.len() {
        return;
    }
    let same_but_time = |a: &Value, b: &Value| match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            a.iter().filter(|(k, _)| *k != "time").count()
                == b.iter().filter(|(k, _)| *k != "time").count()
                && a.iter()
                    .filter(|(k, _)| *k != "time")
                    .all(|(k, v)| b.get(k) == Some(v))
        }
        _ => a == b,
    };
    if !new_mf.iter().zip(old_mf).all(|(a, b)| same_but_time(a, b)) {
        return;
    }
    let (Some(n), Some(c)) = (new.as_object(), current.as_object()) else {
        return;
    };
    let same_outside_metadata = n.len() == c.len()
        && n.iter()
            .filter(|(k, _)| *k != "metadata")
            .all(|(k, v)| c.get(k) == Some(v));
    let (Some(nm), Some(cm)) = (
        n.get("metadata").and_then(Value::as_object),
        c.get("metadata").and_then(Value::as_object),
    ) else {
        return;
    };
    let same_metadata = nm.len() == cm.len()
        && nm
            .iter()
            .filter(|(k, _)| *k != "managedFields")
            .all(|(k, v)| cm.get(k) == Some(v));
    if !(same_outside_metadata && same_metadata) {
        return;
    }
    if let (Some(old), Some(m)) = (
        entries(current),
        new.get_mut("metadata").and_then(Value::as_object_mut),
    ) {
        m.insert("managedFields".into(), Value::Array(old));
    }
}

#[cfg(test)]
mod tests {
    use super::value_at;
    use serde_json::json;

    #[test]
    fn field_paths_resolve_like_kube_prints_them() {
        let v = json!({"spec": {"items": [{"name": "a"}, {"name": "b"}], "map": {"k.x": 1}}});
        assert_eq!(value_at(&v, "spec.items[1].name"), Some(&json!("b")));
        assert_eq!(value_at(&v, "spec.map[k.x]"), Some(&json!(1)));
        assert_eq!(value_at(&v, "spec.missing"), None);
        assert_eq!(value_at(&v, "spec.items[9]"), None);
    }
}
