//! The write pipeline shared by every resource: decode checks, metadata rules,
//! the strategy derived from the CRD (status/scale subresources, generation),
//! finalizers and deletion, then one storage write per change.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::meta::{go_string_slice, path_segment_errors, validate_object_meta};
use super::read::Item;
use super::{convert_json, convert_value, now_rfc3339, storage_error, Registry, Selectors, Target};
use crate::apply::{ApplyError, FieldManager};
use crate::status::{quote, ApiError, FieldError};
use crate::storage::{Revision, StorageError, Write};

/// Attempts for writes that re-read and retry on a concurrent change.
const MAX_RETRIES: usize = 16;
const GENERATE_NAME_ATTEMPTS: usize = 8;
const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

pub const FINALIZER_ORPHAN: &str = "orphan";
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
    pub propagation: Option<Propagation>,
    pub dry_run: bool,
}

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
}

/// A successful write and the warnings to send with it.
pub struct Outcome {
    pub item: Item,
    pub warnings: Vec<String>,
}

pub enum DeleteOutcome {
    /// Removed now; the last state (in the request's version).
    Deleted(Item),
    /// Marked for deletion; finalizers pending.
    Pending(Item),
}

/// A conditional write either commits or loses a race with another writer.
enum Commit {
    Done(Item),
    Raced,
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
}

fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let o = obj.as_object_mut()?;
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn set_finalizers(obj: &mut Value, list: &[String]) {
    if let Some(m) = meta_mut(obj) {
        if list.is_empty() {
            m.remove("finalizers");
        } else {
            m.insert("finalizers".into(), json!(list));
        }
    }
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Everything but metadata (and status, when it has its own subresource).
fn spec_part(obj: &Value, skip_status: bool) -> Map<String, Value> {
    obj.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    let system = matches!(k.as_str(), "metadata" | "apiVersion" | "kind");
                    !(system || (skip_status && k.as_str() == "status"))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn generation(obj: &Value) -> i64 {
    obj.pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

fn random_suffix() -> String {
    let bytes = uuid::Uuid::new_v4();
    bytes.as_bytes()[..5]
        .iter()
        .map(|b| GENERATE_NAME_ALPHABET[*b as usize % GENERATE_NAME_ALPHABET.len()] as char)
        .collect()
}

fn parse_rv(field: &str, rv: &str) -> Result<Revision, ApiError> {
    rv.parse::<Revision>().map_err(|e| {
        ApiError::bad_request(format!(
            "invalid resource version: {field}: Invalid value: {}: {e}",
            quote(rv)
        ))
    })
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
        if api_version != t.api_version() {
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
        super::meta::whole_numbers_as_integers(obj);
        let Some(schema) = t.version_info().and_then(|v| v.validation.clone()) else {
            return Ok(());
        };
        let unknown: Vec<String> = schema
            .prune(obj)
            .iter()
            .map(|p| format!("unknown field {}", quote(p)))
            .collect();
        if !unknown.is_empty() {
            match opts.field_validation {
                FieldValidation::Strict => {
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        unknown.join(", ")
                    )))
                }
                FieldValidation::Warn => warnings.extend(unknown),
                FieldValidation::Ignore => {}
            }
        }
        schema.apply_defaults(obj);
        Ok(())
    }

    /// The schema's value validations and CEL rules (`old` for transition rules).
    fn validate_schema(
        &self,
        t: &Target,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(schema) = t.version_info().and_then(|v| v.validation.clone()) else {
            return Ok(());
        };
        let mut errs = schema.validate(obj, old);
        if let Some(old) = old {
            // Ratcheting (kube 1.30+): a value the update did not change is not held
            // against it, so objects stored under older rules stay updatable.
            errs.retain(|e| {
                let (new_v, old_v) = (value_at(obj, &e.field), value_at(old, &e.field));
                new_v.is_none() || new_v != old_v
            });
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &t.rt.group,
                &t.rt.kind,
                meta_str(obj, "name"),
                &errs,
            ))
        }
    }

    fn field_manager<'a>(&self, t: &'a Target, sub: Subresource) -> Option<FieldManager<'a>> {
        let v = t.version_info()?;
        let subresource = (sub == Subresource::Status).then_some("status");
        Some(FieldManager::new(
            &v.merge,
            &t.api_version(),
            subresource,
            v.status_subresource,
        ))
    }

    /// Records `manager`'s Update entry in the new object's managedFields.
    fn track(
        &self,
        t: &Target,
        old: Option<&Value>,
        new: &mut Value,
        sub: Subresource,
        manager: &str,
    ) -> Result<(), ApiError> {
        if manager.is_empty() {
            return Ok(());
        }
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
        for _ in 0..MAX_RETRIES {
            let live = match self.read_current(t, name).await {
                Ok(found) => Some(found),
                Err(e) if e.code == 404 => None,
                Err(e) => return Err(e),
            };
            let mut merged = fm
                .apply(
                    live.as_ref().map(|(_, v)| v),
                    &config,
                    &opts.manager,
                    force,
                    &now_rfc3339(),
                )
                .map_err(|e| apply_error(t, name, e))?;
            let mut warnings = Vec::new();
            self.decode_schema(t, &mut merged, opts, &mut warnings)?;
            let Some((current_rev, current)) = live else {
                if sub == Subresource::Status {
                    return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name));
                }
                match self.create_tracked(t, merged, opts.dry_run).await {
                    Ok(item) => return Ok(Outcome { item, warnings }),
                    // Someone created it meanwhile: apply onto theirs.
                    Err(e) if e.reason == "AlreadyExists" => continue,
                    Err(e) => return Err(e),
                }
            };
            if let Some(m) = meta_mut(&mut merged) {
                m.insert(
                    "resourceVersion".into(),
                    Value::String(current_rev.to_string()),
                );
            }
            match self
                .commit_update(t, name, current_rev, &current, merged, sub, opts, false)
                .await?
            {
                Commit::Done(item) => return Ok(Outcome { item, warnings }),
                Commit::Raced => continue,
            }
        }
        Err(ApiError::modified(&t.rt.group, &t.rt.plural, name))
    }

    fn validate_meta(&self, t: &Target, obj: &Value) -> Result<(), ApiError> {
        let meta = obj
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let errs = validate_object_meta(&meta, t.rt.namespaced);
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &t.rt.group,
                &t.rt.kind,
                meta_str(obj, "name"),
                &errs,
            ))
        }
    }

    fn to_storage(&self, t: &Target, obj: &Value) -> Value {
        convert_value(obj, &format!("{}/{}", t.rt.group, t.rt.storage_version))
    }

    fn item(&self, t: &Target, object: &Arc<Value>, json: &Bytes) -> Item {
        let api_version = t.api_version();
        if object.get("apiVersion").and_then(Value::as_str) == Some(api_version.as_str()) {
            Item {
                json: json.clone(),
                value: object.clone(),
            }
        } else {
            let v = convert_value(object, &api_version);
            Item {
                json: convert_json(json, object, &api_version),
                value: Arc::new(v),
            }
        }
    }

    fn dry_run_item(&self, t: &Target, obj: Value) -> Item {
        let v = convert_value(&obj, &t.api_version());
        Item {
            json: Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
            value: Arc::new(v),
        }
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
        let item = self.create_tracked(t, obj, opts.dry_run).await?;
        Ok(Outcome { item, warnings })
    }

    /// Create of an object whose body checks and managedFields are done.
    async fn create_tracked(
        &self,
        t: &Target,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Item, ApiError> {
        if let Some(check) = self.admission.get() {
            let name = match meta_str(&obj, "name") {
                "" => meta_str(&obj, "generateName"),
                n => n,
            }
            .to_string();
            check.admit_create(t, &name).await?;
        }
        let has_status = t.has_status();
        if let Some(o) = obj.as_object_mut() {
            if has_status {
                o.remove("status");
            }
        }
        let Some(meta) = meta_mut(&mut obj) else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
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
        if explicit_name.is_empty() && !generate.is_empty() {
            meta.insert("name".into(), Value::String(String::new()));
        }
        meta.insert(
            "uid".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));

        // Validate with the name the client chose (an empty name with generateName passes).
        {
            let mut probe = obj.clone();
            if explicit_name.is_empty() {
                if let Some(m) = meta_mut(&mut probe) {
                    m.remove("name");
                }
            }
            self.validate_meta(t, &probe)?;
        }
        self.validate_schema(t, &obj, None)?;
        let attempts = if explicit_name.is_empty() {
            GENERATE_NAME_ATTEMPTS
        } else {
            1
        };
        let mut last_name = explicit_name.clone();
        for _ in 0..attempts {
            let name = if explicit_name.is_empty() {
                let prefix: String = generate.chars().take(58).collect();
                format!("{prefix}{}", random_suffix())
            } else {
                explicit_name.clone()
            };
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
                return Ok(self.dry_run_item(t, obj));
            }
            let write = Write::Create {
                key: t.key(&name),
                object: self.to_storage(t, &obj),
            };
            match self.store.write(write).await {
                Ok(w) => return Ok(self.item(t, &w.object, &w.json)),
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

    async fn read_current(&self, t: &Target, name: &str) -> Result<(Revision, Value), ApiError> {
        let (rev, json) = self
            .store
            .get(&t.key(name))
            .await
            .map_err(storage_error)?
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        let value: Value = serde_json::from_slice(&json).map_err(ApiError::internal)?;
        Ok((rev, convert_value(&value, &t.api_version())))
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
        if rv.is_empty() {
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
        }
        let expected = parse_rv("metadata.resourceVersion", &rv)?;
        let (current_rev, current) = self.read_current(t, name).await?;
        if expected != current_rev {
            return Err(ApiError::modified(&t.rt.group, &t.rt.plural, name));
        }
        match self
            .commit_update(t, name, current_rev, &current, obj, sub, opts, true)
            .await?
        {
            Commit::Done(item) => Ok(Outcome { item, warnings }),
            Commit::Raced => Err(ApiError::modified(&t.rt.group, &t.rt.plural, name)),
        }
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
        for _ in 0..MAX_RETRIES {
            let (current_rev, current) = self.read_current(t, name).await?;
            let mut obj = change(&current)?;
            self.check_body(t, &mut obj)?;
            let mut warnings = Vec::new();
            self.decode_schema(t, &mut obj, opts, &mut warnings)?;
            let body_name = meta_str(&obj, "name");
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            let rv = meta_str(&obj, "resourceVersion").to_string();
            if !rv.is_empty() && parse_rv("metadata.resourceVersion", &rv)? != current_rev {
                // A precondition the client set (or a stale read): only retry our own.
                if meta_str(&current, "resourceVersion") != rv {
                    return Err(ApiError::modified(&t.rt.group, &t.rt.plural, name));
                }
            }
            match self
                .commit_update(t, name, current_rev, &current, obj, sub, opts, true)
                .await?
            {
                Commit::Done(item) => return Ok(Outcome { item, warnings }),
                Commit::Raced => continue,
            }
        }
        Err(ApiError::modified(&t.rt.group, &t.rt.plural, name))
    }

    #[allow(clippy::too_many_arguments)]
    async fn commit_update(
        &self,
        t: &Target,
        name: &str,
        current_rev: Revision,
        current: &Value,
        mut obj: Value,
        sub: Subresource,
        opts: &WriteOptions,
        track: bool,
    ) -> Result<Commit, ApiError> {
        let dry_run = opts.dry_run;
        if track {
            self.track(t, Some(current), &mut obj, sub, &opts.manager)?;
        }
        let has_status = t.has_status();
        let mut new = match sub {
            Subresource::Main => {
                let mut new = obj;
                if has_status {
                    // The main resource cannot change status when it has its own subresource.
                    if let Some(o) = new.as_object_mut() {
                        match current.get("status") {
                            Some(s) => {
                                o.insert("status".into(), s.clone());
                            }
                            None => {
                                o.remove("status");
                            }
                        }
                    }
                }
                new
            }
            Subresource::Status => {
                // Only status (and managedFields) come from the request.
                let mut new = current.clone();
                if let Some(o) = new.as_object_mut() {
                    match obj.get("status") {
                        Some(s) => {
                            o.insert("status".into(), s.clone());
                        }
                        None => {
                            o.remove("status");
                        }
                    }
                }
                if let (Some(mf), Some(m)) = (
                    obj.pointer("/metadata/managedFields").cloned(),
                    meta_mut(&mut new),
                ) {
                    m.insert("managedFields".into(), mf);
                }
                new
            }
        };
        // System fields keep their stored values.
        let old_meta = current
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if let Some(m) = meta_mut(&mut new) {
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(field) {
                    Some(v) => {
                        m.insert(field.into(), v.clone());
                    }
                    None => {
                        m.remove(field);
                    }
                }
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
        self.validate_meta(t, &new)?;
        self.validate_schema(t, &new, Some(current))?;

        if new == *current {
            // Nothing changed: no write, no new revision (as kube does).
            let json = Bytes::from(serde_json::to_vec(current).map_err(ApiError::internal)?);
            return Ok(Commit::Done(Item {
                json,
                value: Arc::new(current.clone()),
            }));
        }
        if dry_run {
            return Ok(Commit::Done(self.dry_run_item(t, new)));
        }
        let key = t.key(name);
        let write = if is_deleting(&new) && finalizers(&new).is_empty() {
            // The last finalizer is gone: the object goes away.
            Write::Delete {
                key,
                expected: Some(current_rev),
            }
        } else {
            Write::Update {
                key,
                expected: current_rev,
                object: self.to_storage(t, &new),
            }
        };
        match self.store.write(write).await {
            Ok(w) => Ok(Commit::Done(self.item(t, &w.object, &w.json))),
            Err(StorageError::Conflict { .. }) => Ok(Commit::Raced),
            Err(e) => Err(self.write_error(t, name, e)),
        }
    }

    /// Storage outcomes of a write that are not a race to retry.
    fn write_error(&self, t: &Target, name: &str, e: StorageError) -> ApiError {
        match e {
            StorageError::NotFound => ApiError::not_found(&t.rt.group, &t.rt.plural, name),
            StorageError::Conflict { .. } => ApiError::modified(&t.rt.group, &t.rt.plural, name),
            StorageError::TooLarge { size, limit } => too_large(t, name, size, limit),
            other => storage_error(other),
        }
    }

    pub async fn delete(
        &self,
        t: &Target,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        for _ in 0..MAX_RETRIES {
            let (current_rev, current) = self.read_current(t, name).await?;
            let gk = format!("{}.{}", t.rt.kind, t.rt.group);
            if let Some(uid) = &opts.precondition_uid {
                let actual = meta_str(&current, "uid");
                if uid != actual {
                    return Err(precondition_failed(t, &gk, name, format!(
                        "the UID in the precondition ({uid}) does not match the UID in record ({actual}). The object might have been deleted and then recreated"
                    )));
                }
            }
            if let Some(rv) = &opts.precondition_resource_version {
                let actual = meta_str(&current, "resourceVersion");
                if rv != actual {
                    return Err(precondition_failed(t, &gk, name, format!(
                        "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({actual}). The object might have been modified"
                    )));
                }
            }
            let mut fins = finalizers(&current);
            match opts.propagation {
                Some(Propagation::Orphan) => {
                    fins.retain(|f| f != FINALIZER_FOREGROUND);
                    if !fins.iter().any(|f| f == FINALIZER_ORPHAN) {
                        fins.push(FINALIZER_ORPHAN.into());
                    }
                }
                Some(Propagation::Foreground) => {
                    fins.retain(|f| f != FINALIZER_ORPHAN);
                    if !fins.iter().any(|f| f == FINALIZER_FOREGROUND) {
                        fins.push(FINALIZER_FOREGROUND.into());
                    }
                }
                Some(Propagation::Background) => {
                    fins.retain(|f| f != FINALIZER_ORPHAN && f != FINALIZER_FOREGROUND);
                }
                None => {}
            }
            let key = t.key(name);
            if fins.is_empty() {
                if opts.dry_run {
                    return Ok(DeleteOutcome::Deleted(self.dry_run_item(t, current)));
                }
                match self
                    .store
                    .write(Write::Delete {
                        key,
                        expected: Some(current_rev),
                    })
                    .await
                {
                    Ok(w) => return Ok(DeleteOutcome::Deleted(self.item(t, &w.object, &w.json))),
                    Err(StorageError::Conflict { .. }) => continue,
                    Err(e) => return Err(self.write_error(t, name, e)),
                }
            }
            let mut new = current.clone();
            set_finalizers(&mut new, &fins);
            if !is_deleting(&current) {
                let g = generation(&current);
                if let Some(m) = meta_mut(&mut new) {
                    m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                    m.insert("deletionGracePeriodSeconds".into(), json!(0));
                    if g > 0 {
                        m.insert("generation".into(), json!(g + 1));
                    }
                }
            }
            if new == current {
                let json = Bytes::from(serde_json::to_vec(&current).map_err(ApiError::internal)?);
                return Ok(DeleteOutcome::Pending(Item {
                    json,
                    value: Arc::new(current),
                }));
            }
            if opts.dry_run {
                return Ok(DeleteOutcome::Pending(self.dry_run_item(t, new)));
            }
            match self
                .store
                .write(Write::Update {
                    key,
                    expected: current_rev,
                    object: self.to_storage(t, &new),
                })
                .await
            {
                Ok(w) => return Ok(DeleteOutcome::Pending(self.item(t, &w.object, &w.json))),
                Err(StorageError::Conflict { .. }) => continue,
                Err(e) => return Err(self.write_error(t, name, e)),
            }
        }
        Err(ApiError::modified(&t.rt.group, &t.rt.plural, name))
    }

    /// Deletes every object of the collection that matches; returns them as they were.
    pub async fn delete_collection(
        &self,
        t: &Target,
        sel: &Selectors,
        opts: &DeleteOptions,
    ) -> Result<Vec<Item>, ApiError> {
        let listed = self.list(t, sel, &super::ReadAt::Consistent, None).await?;
        let mut out = Vec::with_capacity(listed.items.len());
        for item in listed.items {
            let name = meta_str(&item.value, "name").to_string();
            let mut target = t.clone();
            if t.rt.namespaced {
                target.namespace = meta_str(&item.value, "namespace").to_string();
            }
            match self.delete(&target, &name, opts).await {
                Ok(_) => out.push(self.item(t, &item.value, &item.json)),
                // Already gone: someone else deleted it meanwhile.
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
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

/// An object too large to store: 422, as kube answers for oversized custom resources.
fn too_large(t: &Target, name: &str, size: usize, limit: usize) -> ApiError {
    ApiError::invalid(
        &t.rt.group,
        &t.rt.kind,
        name,
        &[FieldError::new(
            crate::status::FieldErrorKind::TooLong,
            "<root>",
            Some(size.to_string()),
            format!("may not be more than {limit} bytes"),
        )],
    )
}

/// Maps field-manager failures to kube's Status (conflicts carry one cause per field).
fn apply_error(t: &Target, name: &str, e: ApplyError) -> ApiError {
    match &e {
        ApplyError::Conflicts(conflicts) => {
            let mut err = ApiError::conflict(&t.rt.group, &t.rt.plural, name, "");
            err.message = e.to_string();
            if let Some(d) = err.details.as_mut() {
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
        ApplyError::Internal(m) => {
            let mut err = ApiError::internal(m);
            err.message = m.clone();
            err
        }
    }
}

fn precondition_failed(t: &Target, gk: &str, name: &str, why: String) -> ApiError {
    let mut e = ApiError::conflict("", gk, name, &why);
    if let Some(d) = e.details.as_mut() {
        d.group = t.rt.group.clone();
        d.kind = t.rt.kind.clone();
    }
    e
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
