//! kube's last-applied manager and updater: kubectl moving from client-side
//! to server-side apply keeps the fields its last-applied annotation still
//! describes, and the annotation follows each apply by kubectl.

use serde_json::Value;

use super::{metadata, Conflicts, Failure, Managed, Stamp};
use crate::apply::fieldpath::{go_json, Set};
use crate::apply::merge::{compare, field_set, validate};
use crate::apply::FieldManager;

/// kubectl's client-side apply annotation.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl FieldManager<'_> {
    /// kubectl's migration from client-side apply: when "kubectl" applies and
    /// conflicts only on fields whose live value still equals the
    /// last-applied annotation, the apply is forced.
    pub(super) fn apply_with_last_applied(
        &self,
        live: &Value,
        config: &Value,
        managed: Managed,
        manager: &str,
        force: bool,
        stamp: &Stamp,
    ) -> Result<(Value, Managed), Failure> {
        let conflicts =
            match self.layered_apply(live, config, managed.clone(), manager, force, stamp) {
                Err(Failure::Conflicts(c)) if manager == "kubectl" => c,
                other => return other,
            };
        let Some(allowed) = self.allowed_from_last_applied(live) else {
            return Err(Failure::Conflicts(conflicts));
        };
        let remaining: Conflicts = conflicts
            .iter()
            .filter(|(_, p)| !allowed.has(p))
            .cloned()
            .collect();
        if !remaining.is_empty() {
            return Err(Failure::Conflicts(remaining));
        }
        self.layered_apply(live, config, managed, manager, true, stamp)
    }

    /// Fields of the last-applied annotation whose live value is unchanged.
    fn allowed_from_last_applied(&self, live: &Value) -> Option<Set> {
        let text = metadata(live)?
            .get("annotations")?
            .get(LAST_APPLIED_ANNOTATION)?
            .as_str()?;
        if text.is_empty() {
            return None;
        }
        let last: Value = serde_json::from_str(text).ok()?;
        if last.get("apiVersion").and_then(Value::as_str) != Some(self.api_version.as_str()) {
            return None;
        }
        validate(self.root(), &last).ok()?;
        let cmp = compare(self.root(), &last, live);
        Some(
            field_set(self.root(), &last)
                .difference(&cmp.modified)
                .difference(&cmp.added)
                .difference(&cmp.removed),
        )
    }
}

/// After an apply by kubectl of an object that carries the annotation: the
/// annotation becomes the configuration just applied.
pub(super) fn update_annotation(obj: &mut Value, config: &Value, manager: &str) {
    if manager == "kubectl" && has_last_applied(obj) {
        set_last_applied(obj, build_last_applied(config));
    }
}

fn has_last_applied(obj: &Value) -> bool {
    metadata(obj)
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(LAST_APPLIED_ANNOTATION))
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
}

/// The applied configuration as kube stores it in the annotation: Go JSON
/// (sorted keys, HTML-escaped) plus newline, without the annotation itself.
fn build_last_applied(config: &Value) -> String {
    let mut c = config.clone();
    if let Some(a) = c
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
    let mut out = String::new();
    go_json(&c, &mut out);
    out.push('\n');
    out
}

fn set_last_applied(obj: &mut Value, text: String) {
    if let Some(a) = obj
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.insert(LAST_APPLIED_ANNOTATION.into(), Value::String(text));
    }
}
