//! Admission as the write pipeline sees it: namespace lifecycle on creates,
//! and the hooks that mutate (after the object is decoded, defaulted, merged
//! and its managedFields recorded; before validation) and validate (after
//! validation, before the write) every create, update, patch, apply and
//! delete, dry runs included. What runs behind [`Admission`] (webhooks) lives
//! in `crate::admission`; the registry only knows these attributes.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::scale::{apply_scale, to_scale};
use super::{Registry, Subresource, Target, WriteOptions};
use crate::auth::Identity;
use crate::object::meta_str;
use crate::status::ApiError;

pub trait CreateAdmission: Send + Sync {
    /// `name` is the object's name, or its generateName when it has none yet.
    fn admit_create<'a>(
        &'a self,
        t: &'a Target,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}

/// kube's admission operations (CONNECT has no resource writes here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
}

/// Warnings a request collects on its way (webhooks add theirs as they
/// answer), in order, each once. The response carries every one of them,
/// even when the request fails.
#[derive(Clone, Default, Debug)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    pub fn add(&self, w: &str) {
        if let Ok(mut v) = self.0.lock() {
            if !v.iter().any(|x| x == w) {
                v.push(w.to_string());
            }
        }
    }
    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |v| v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The warnings added after the first `from`.
    pub fn since(&self, from: usize) -> Vec<String> {
        self.0
            .lock()
            .map(|v| v.get(from..).map(<[String]>::to_vec).unwrap_or_default())
            .unwrap_or_default()
    }
    pub fn all(&self) -> Vec<String> {
        self.since(0)
    }
}

/// Records one audit annotation of the request (key, value).
pub type Annotate = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Who sent a write and the options they sent, as admission reports them.
/// The API layer sets it on every write; writes kshard makes itself (garbage
/// collection) carry none and skip webhooks.
#[derive(Clone, Default)]
pub struct Caller {
    pub user: Identity,
    /// `fieldManager` and `fieldValidation` as the client sent them (the
    /// options a webhook sees hold these, not the defaults derived from them).
    pub field_manager: String,
    pub field_validation: String,
    /// A delete's DeleteOptions, as kube decodes them.
    pub delete_options: Option<Value>,
    pub warnings: Warnings,
    pub annotate: Option<Annotate>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("user", &self.user.user)
            .field("field_manager", &self.field_manager)
            .finish_non_exhaustive()
    }
}

impl Caller {
    /// The operation's options object as kube hands it to admission: a
    /// patch's options are UpdateOptions (or CreateOptions when an apply
    /// creates), kube's `patchToUpdateOptions`.
    pub fn options(&self, op: Operation, dry_run: bool) -> Value {
        if op == Operation::Delete {
            let mut o = self.delete_options.clone().unwrap_or_else(|| json!({}));
            if let Some(m) = o.as_object_mut() {
                // kube sets the kind before admission whatever the body said.
                let mut typed = serde_json::Map::new();
                typed.insert("kind".into(), json!("DeleteOptions"));
                typed.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
                for (k, v) in std::mem::take(m) {
                    if k != "kind" && k != "apiVersion" {
                        typed.insert(k, v);
                    }
                }
                if dry_run && !typed.contains_key("dryRun") {
                    typed.insert("dryRun".into(), json!(["All"]));
                }
                *m = typed;
            }
            return o;
        }
        let kind = match op {
            Operation::Create => "CreateOptions",
            _ => "UpdateOptions",
        };
        let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
        if dry_run {
            o["dryRun"] = json!(["All"]);
        }
        if !self.field_manager.is_empty() {
            o["fieldManager"] = json!(self.field_manager);
        }
        if !self.field_validation.is_empty() {
            o["fieldValidation"] = json!(self.field_validation);
        }
        o
    }
}

/// A group, version and kind (the `kind` of an admission request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// kube's `admission.Attributes` for one write.
pub struct Attributes<'a> {
    /// The resource, the version of the request, the namespace.
    pub target: &'a Target,
    /// Empty for a create whose name is still to be generated (mutating
    /// admission), and for each object of a deletecollection.
    pub name: &'a str,
    /// `""`, `"status"` or `"scale"`.
    pub subresource: &'a str,
    /// The kind of the objects: the resource's, or `autoscaling/v1` Scale
    /// for the scale subresource.
    pub kind: Gvk,
    pub operation: Operation,
    /// The stored object an update or delete starts from (the Scale of it
    /// for the scale subresource).
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    pub caller: &'a Caller,
}

impl Attributes<'_> {
    pub fn options(&self) -> Value {
        self.caller.options(self.operation, self.dry_run)
    }
}

/// Admission control beyond namespace lifecycle: mutating, then (after the
/// object validated) validating checks. Errors are the request's answer.
pub trait Admission: Send + Sync {
    /// May change `object` (absent for a delete). Kube runs this after the
    /// object is decoded and merged, before its schema validation.
    fn mutate<'a>(
        &'a self,
        attrs: &'a Attributes<'a>,
        object: Option<&'a mut Value>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;

    /// Sees the object about to be written (absent for a delete).
    fn validate<'a>(
        &'a self,
        attrs: &'a Attributes<'a>,
        object: Option<&'a Value>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}

/// Which admission check of a write the pipeline is at.
pub(super) struct Step<'a> {
    op: Operation,
    name: &'a str,
    sub: Subresource,
    /// The stored object (updates and deletes).
    old: Option<&'a Value>,
}

impl<'a> Step<'a> {
    pub fn new(op: Operation, name: &'a str, sub: Subresource, old: Option<&'a Value>) -> Self {
        Self { op, name, sub, old }
    }

    fn attributes(
        &self,
        t: &'a Target,
        old: Option<&'a Value>,
        dry_run: bool,
        caller: &'a Caller,
    ) -> Attributes<'a> {
        let (subresource, kind) = match self.sub {
            Subresource::Main => ("", t.gvk()),
            Subresource::Status => ("status", t.gvk()),
            // kube admits scale writes as the Scale object they are.
            Subresource::Scale => (
                "scale",
                Gvk {
                    group: "autoscaling".into(),
                    version: "v1".into(),
                    kind: "Scale".into(),
                },
            ),
        };
        Attributes {
            target: t,
            name: self.name,
            subresource,
            kind,
            operation: self.op,
            old_object: old,
            dry_run,
            caller,
        }
    }
}

fn scale_spec(t: &Target) -> Result<&crate::apiextensions::catalog::ScaleSpec, ApiError> {
    t.version_info()
        .and_then(|v| v.scale.as_ref())
        .ok_or_else(ApiError::not_found_path)
}

impl Target {
    /// The resource's group, version (the request's) and kind.
    pub fn gvk(&self) -> Gvk {
        Gvk {
            group: self.rt.group.clone(),
            version: self.version.clone(),
            kind: self.rt.kind.clone(),
        }
    }
}

impl Registry {
    /// Installs the admission that runs webhooks (once, at start).
    pub fn set_admission(&self, admission: Arc<dyn Admission>) {
        if self.webhooks.set(admission).is_err() {
            tracing::warn!("admission was already installed; keeping the first");
        }
    }

    /// Mutating admission of a create or update: namespace lifecycle (creates
    /// only, kube's first plugin), then webhooks. Webhook warnings join
    /// `warnings` in the order kube records them.
    pub(super) async fn admit_mutating(
        &self,
        t: &Target,
        step: &Step<'_>,
        object: Option<&mut Value>,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let span = crate::traces::Span::child("mutating admission");
        let result = crate::traces::in_span(
            &span,
            self.admit_mutating_now(t, step, object, opts, warnings),
        )
        .await;
        failed(span, result)
    }

    async fn admit_mutating_now(
        &self,
        t: &Target,
        step: &Step<'_>,
        object: Option<&mut Value>,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if step.op == Operation::Create {
            if let (Some(check), Some(obj)) = (&self.admission, object.as_deref()) {
                let name = match meta_str(obj, "name") {
                    "" => meta_str(obj, "generateName"),
                    n => n,
                }
                .to_string();
                check.admit_create(t, &name).await?;
            }
        }
        let (Some(hooks), Some(caller)) = (self.webhooks.get(), opts.caller.as_deref()) else {
            return Ok(());
        };
        let before = caller.warnings.len();
        let result = mutate(hooks.as_ref(), t, step, object, opts.dry_run, caller).await;
        warnings.extend(caller.warnings.since(before));
        result
    }

    /// Validating admission of the object about to be written.
    pub(super) async fn admit_validating(
        &self,
        t: &Target,
        step: &Step<'_>,
        object: Option<&Value>,
        opts: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let (Some(hooks), Some(caller)) = (self.webhooks.get(), opts.caller.as_deref()) else {
            return Ok(());
        };
        let before = caller.warnings.len();
        let span = crate::traces::Span::child("validating admission");
        let result = crate::traces::in_span(
            &span,
            validate(hooks.as_ref(), t, step, object, opts.dry_run, caller),
        )
        .await;
        let result = failed(span, result);
        warnings.extend(caller.warnings.since(before));
        result
    }

    /// Admission of a delete: mutating then validating webhooks, with the
    /// stored object as `oldObject` and no object (kube's
    /// `AdmissionToValidateObjectDeleteFunc`). Warnings go with the answer.
    pub(super) async fn admit_delete(
        &self,
        t: &Target,
        step: &Step<'_>,
        dry_run: bool,
        caller: Option<&Caller>,
    ) -> Result<(), ApiError> {
        let (Some(hooks), Some(caller)) = (self.webhooks.get(), caller) else {
            return Ok(());
        };
        let span = crate::traces::Span::child("mutating admission");
        let result = crate::traces::in_span(
            &span,
            mutate(hooks.as_ref(), t, step, None, dry_run, caller),
        )
        .await;
        failed(span, result)?;
        let span = crate::traces::Span::child("validating admission");
        let result = crate::traces::in_span(
            &span,
            validate(hooks.as_ref(), t, step, None, dry_run, caller),
        )
        .await;
        failed(span, result)
    }
}

/// Ends an admission phase's span, marked failed with the refusal.
fn failed(span: Option<crate::traces::Span>, result: Result<(), ApiError>) -> Result<(), ApiError> {
    if let (Some(span), Err(e)) = (&span, &result) {
        span.fail(e.message.clone());
    }
    result
}

async fn mutate(
    hooks: &dyn Admission,
    t: &Target,
    step: &Step<'_>,
    object: Option<&mut Value>,
    dry_run: bool,
    caller: &Caller,
) -> Result<(), ApiError> {
    match (step.sub, object) {
        (Subresource::Scale, Some(obj)) => {
            // The webhooks see (and patch) the Scale; its replicas go back
            // into the object, as kube's scale subresource converts.
            let spec = scale_spec(t)?;
            let old = step.old.map(|o| to_scale(spec, o));
            let attrs = step.attributes(t, old.as_ref(), dry_run, caller);
            let mut scale = to_scale(spec, obj);
            let before = scale.clone();
            hooks.mutate(&attrs, Some(&mut scale)).await?;
            if scale != before {
                *obj = apply_scale(spec, obj, &scale, &t.rt.kind, &t.rt.group)?;
            }
            Ok(())
        }
        (_, object) => {
            let attrs = step.attributes(t, step.old, dry_run, caller);
            match object {
                Some(obj) => {
                    hooks.mutate(&attrs, Some(&mut *obj)).await?;
                    after_mutation(t, step, obj)
                }
                None => hooks.mutate(&attrs, None).await,
            }
        }
    }
}

async fn validate(
    hooks: &dyn Admission,
    t: &Target,
    step: &Step<'_>,
    object: Option<&Value>,
    dry_run: bool,
    caller: &Caller,
) -> Result<(), ApiError> {
    match (step.sub, object) {
        (Subresource::Scale, Some(obj)) => {
            let spec = scale_spec(t)?;
            let old = step.old.map(|o| to_scale(spec, o));
            let scale = to_scale(spec, obj);
            let attrs = step.attributes(t, old.as_ref(), dry_run, caller);
            hooks.validate(&attrs, Some(&scale)).await
        }
        (_, object) => {
            let attrs = step.attributes(t, step.old, dry_run, caller);
            hooks.validate(&attrs, object).await
        }
    }
}

/// What a webhook's patch may not change, checked as kube's strategy checks
/// it after admission: the type stays the request's (kube's converter sets
/// it back), the namespace the request's
/// (`EnsureObjectNamespaceMatchesRequestNamespace`), and an update's name
/// the stored one (`metadata.name` is immutable).
fn after_mutation(t: &Target, step: &Step<'_>, obj: &mut Value) -> Result<(), ApiError> {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), Value::String(t.api_version()));
        o.insert("kind".into(), Value::String(t.rt.kind.clone()));
    }
    let name = meta_str(obj, "name");
    if step.op == Operation::Update && name != step.name {
        return Err(ApiError::invalid(
            &t.rt.group,
            &t.rt.kind,
            name,
            &[crate::status::FieldError::invalid(
                "metadata.name",
                name,
                "field is immutable",
            )],
        ));
    }
    let ns = meta_str(obj, "namespace");
    if t.rt.namespaced && ns != t.namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if !t.rt.namespaced && !ns.is_empty() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_as_kube_hands_them_to_admission() {
        let c = Caller {
            field_manager: "kubectl".into(),
            ..Default::default()
        };
        assert_eq!(
            c.options(Operation::Update, true),
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1",
                   "dryRun": ["All"], "fieldManager": "kubectl"})
        );
        let d = Caller {
            delete_options: Some(json!({"propagationPolicy": "Background"})),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&d.options(Operation::Delete, false)).ok(),
            Some(
                r#"{"apiVersion":"meta.k8s.io/v1","kind":"DeleteOptions","propagationPolicy":"Background"}"#
                    .into()
            )
        );
    }

    #[test]
    fn warnings_are_kept_once_in_order() {
        let w = Warnings::default();
        w.add("a");
        w.add("b");
        w.add("a");
        assert_eq!(w.all(), ["a", "b"]);
        assert_eq!(w.since(1), ["b"]);
        assert!(w.since(5).is_empty());
    }
}
