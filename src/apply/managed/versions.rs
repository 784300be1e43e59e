//! kube's version conversion for the field manager: ownership is settled
//! at the version each manager wrote at, so objects are converted there
//! (through the definition's webhook, or an apiVersion rewrite), each object
//! at most once per version and request; managers at versions the resource
//! no longer has are dropped.

use std::collections::BTreeMap;

use serde_json::Value;

use super::entries::VersionedSet;
use super::Failure;
use crate::apply::fieldpath::values_equal;
use crate::apply::merge::{compare, Comparison};
use crate::apply::{ConvertError, FieldManager, MergeSchema, Versions};

/// The other versions of the resource and the conversions made for this
/// request.
pub(in crate::apply) struct VersionConverter<'a> {
    /// Other versions; `None`: rewrite only, one schema for all.
    versions: Option<Box<dyn Versions + 'a>>,
    /// Conversions made for this request (target version, source, result),
    /// so one object is sent to a webhook at most once per version.
    converted: std::sync::Mutex<Vec<(String, Value, Value)>>,
}

impl<'a> VersionConverter<'a> {
    /// Every version a rewrite of the request's, with its schema.
    pub(in crate::apply) fn rewrite_only() -> Self {
        Self {
            versions: None,
            converted: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub(in crate::apply) fn new(versions: Box<dyn Versions + 'a>) -> Self {
        Self {
            versions: Some(versions),
            converted: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Converting only rewrites apiVersion.
    fn rewrites(&self) -> bool {
        self.versions.as_deref().is_none_or(|v| v.rewrites_only())
    }

    /// Converts `objs` to `api_version` (kube's versionConverter: for a
    /// custom resource, straight from the request's version). Objects
    /// already there are kept; a rewrite-only resource keeps them all; the
    /// rest go to the webhook in one review, each object once per request.
    /// `Ok(None)`: the resource has no such version.
    pub(super) fn convert(
        &self,
        objs: Vec<Value>,
        api_version: &str,
    ) -> Result<Option<Vec<Value>>, Failure> {
        let versions = match self.versions.as_deref() {
            Some(v) if !v.rewrites_only() => v,
            _ => return Ok(Some(objs)),
        };
        let mut out: Vec<Option<Value>> = Vec::with_capacity(objs.len());
        {
            let done = self.converted.lock().unwrap_or_else(|p| p.into_inner());
            for o in &objs {
                if api_version_of(o) == api_version {
                    out.push(Some(o.clone()));
                    continue;
                }
                let hit = done
                    .iter()
                    .find(|(v, src, _)| v == api_version && values_equal(src, o));
                out.push(hit.map(|(_, _, r)| r.clone()));
            }
        }
        // Each distinct object still to convert, once (old and new are often equal).
        let mut todo: Vec<&Value> = Vec::new();
        for (o, got) in objs.iter().zip(&out) {
            if got.is_none() && !todo.iter().any(|t| values_equal(t, o)) {
                todo.push(o);
            }
        }
        if !todo.is_empty() {
            let results = match versions.convert(&todo, api_version) {
                Ok(r) => r,
                Err(ConvertError::MissingVersion(_)) => return Ok(None),
                Err(ConvertError::Failed(m)) => return Err(Failure::Convert(m)),
            };
            if results.len() != todo.len() {
                return Err(Failure::Convert(format!(
                    "converting {} objects to {api_version} returned {}",
                    todo.len(),
                    results.len()
                )));
            }
            let mut done = self.converted.lock().unwrap_or_else(|p| p.into_inner());
            for (src, res) in todo.iter().zip(results) {
                for (o, got) in objs.iter().zip(out.iter_mut()) {
                    if got.is_none() && values_equal(src, o) {
                        *got = Some(res.clone());
                    }
                }
                done.push((api_version.to_string(), (*src).clone(), res));
            }
        }
        Ok(Some(out.into_iter().flatten().collect()))
    }
}

impl FieldManager<'_> {
    /// Conversion only rewrites apiVersion: objects are compared as they
    /// are (apiVersion is equal on both sides, and field sets ignore values).
    pub(super) fn rewrites(&self) -> bool {
        self.converter.rewrites()
    }

    /// The merge schema of a manager's version; `None` when the resource has
    /// no such version.
    pub(super) fn schema_at(&self, api_version: &str) -> Option<&MergeSchema> {
        if api_version == self.api_version {
            return Some(self.schema);
        }
        match &self.converter.versions {
            Some(v) => v.schema(api_version),
            None => Some(self.schema),
        }
    }

    /// Drops managers recorded at versions the resource no longer has, as
    /// `Updater.reconcileManagedFieldsWithSchemaChanges` skips them on a
    /// missing-version error before every Update and Apply.
    pub(super) fn drop_missing_versions(&self, fields: &mut BTreeMap<String, VersionedSet>) {
        if self.converter.versions.is_some() {
            fields.retain(|_, vs| self.schema_at(&vs.api_version).is_some());
        }
    }

    /// The comparison of `old` and `new` at another manager's version, with
    /// that version's schema (`Updater.update`); `None` for a missing version.
    pub(super) fn compare_at(
        &self,
        old: &Value,
        new: &Value,
        api_version: &str,
        here: &Comparison,
    ) -> Result<Option<Comparison>, Failure> {
        let Some(schema) = self.schema_at(api_version) else {
            return Ok(None);
        };
        if self.rewrites() {
            if std::ptr::eq(schema, self.schema) {
                return Ok(Some(here.clone()));
            }
            return Ok(Some(compare(&schema.root, old, new).filter(&self.reset)));
        }
        let Some(objs) = self
            .converter
            .convert(vec![old.clone(), new.clone()], api_version)?
        else {
            return Ok(None);
        };
        let [old_v, new_v] = objs.as_slice() else {
            return Err(Failure::Convert(format!(
                "converting to {api_version} lost objects"
            )));
        };
        // kube keys reset fields by the request's version only; here they are
        // filtered at every version (the same top-level spec/status), so a
        // status write through one version cannot take spec from another's managers.
        Ok(Some(
            compare(&schema.root, old_v, new_v).filter(&self.reset),
        ))
    }
}

/// `obj` with its apiVersion set to `api_version` (the whole of a strategy
/// None conversion).
pub(super) fn at_version(obj: &Value, api_version: &str) -> Value {
    let mut out = obj.clone();
    if let Some(m) = out.as_object_mut() {
        if m.get("apiVersion").and_then(Value::as_str) != Some(api_version) {
            m.insert("apiVersion".into(), Value::String(api_version.into()));
        }
    }
    out
}

fn api_version_of(obj: &Value) -> &str {
    obj.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}
