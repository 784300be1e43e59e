//! The two webhook runs, as kube's dispatchers: mutating webhooks one after
//! another (each sees the previous one's patch; `reinvocationPolicy:
//! IfNeeded` webhooks run once more when a later one changed the object),
//! validating webhooks all at once. Failure policy, dry-run side effects,
//! denials, warnings and audit annotations follow kube.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::Value;

use super::hooks::Hook;
use super::matching::{self, Criteria, Verdict};
use super::review::{self, Invocation, ReviewVersion};
use super::webhook::CallFailure;
use super::Webhooks;
use crate::registry::patch::{self, PatchType};
use crate::registry::write_admission::{Attributes, Gvk};
use crate::registry::ResourceType;
use crate::status::{quote, ApiError, Details};

/// How long a request waits for the configuration to be read at start
/// (kube's admission plugins wait for their informers this long).
const READY_WAIT: Duration = Duration::from_secs(10);

/// What went wrong with one webhook.
enum HookError {
    /// The webhook could not be called or answered nonsense: the failure
    /// policy decides.
    Calling(CallFailure),
    /// The request's answer, whatever the policy (a denial, a dry run the
    /// webhook cannot take, a patch that does not apply).
    Final(ApiError),
}

fn calling(reason: impl Into<String>) -> HookError {
    HookError::Calling(CallFailure {
        reason: reason.into(),
    })
}

/// The kinds whose admission no webhook may take part in (kube's
/// `IsExemptAdmissionConfigurationResource`), so a broken webhook can
/// always be removed.
pub(super) fn exempt(kind: &Gvk) -> bool {
    kind.group == super::hooks::GROUP
        && matches!(
            kind.kind.as_str(),
            "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "MutatingAdmissionPolicy"
                | "MutatingAdmissionPolicyBinding"
        )
}

/// kube's `ToStatusErr`: a denial as the webhook worded it, prefixed with
/// who denied it; codes below 400 become 400.
fn denied(webhook: &str, status: Option<&Value>) -> ApiError {
    let field = |k: &str| {
        status
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let by = format!("admission webhook {} denied the request", quote(webhook));
    let (message, reason) = (field("message"), field("reason"));
    let message = if !message.is_empty() {
        format!("{by}: {message}")
    } else if !reason.is_empty() {
        format!("{by}: {reason}")
    } else {
        format!("{by} without explanation")
    };
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let code = match code {
        c if c < 400 => 400,
        // Not an HTTP status at all: an error of ours, not the client's.
        c if c > 599 => 500,
        c => c as u16,
    };
    let details = status
        .and_then(|s| s.get("details"))
        .and_then(|d| serde_json::from_value::<Details>(d.clone()).ok());
    ApiError::from_parts(code, reason, message, details)
}

/// The resource and kind a webhook or policy is invoked for, if its rules
/// match the request's resource, or (match policy Equivalent) another
/// served version of it: kube tries every rule against the request's
/// version first, then each rule against every other version.
pub(super) fn invocation(
    rules: &[matching::NamedRule],
    equivalent: bool,
    attrs: &Attributes<'_>,
) -> Option<Invocation> {
    let t = attrs.target;
    let matches = |rule: &matching::NamedRule, version: &str| {
        let r = matching::Request {
            operation: attrs.operation.as_str(),
            group: &t.rt.group,
            version,
            resource: &t.rt.plural,
            subresource: attrs.subresource,
            namespace: &t.namespace,
        };
        rule.matches(&r, attrs.name)
    };
    let invocation = |version: &str, kind: Gvk| Invocation {
        group: t.rt.group.clone(),
        version: version.to_string(),
        resource: t.rt.plural.clone(),
        subresource: attrs.subresource.to_string(),
        kind,
    };
    if rules.iter().any(|r| matches(r, &t.version)) {
        return Some(invocation(&t.version, attrs.kind.clone()));
    }
    if !equivalent {
        return None;
    }
    for rule in rules {
        for v in
            t.rt.versions
                .iter()
                .filter(|v| v.served && v.name != t.version)
        {
            if matches(rule, &v.name) {
                let kind = if attrs.subresource == "scale" {
                    attrs.kind.clone()
                } else {
                    Gvk {
                        group: t.rt.group.clone(),
                        version: v.name.clone(),
                        kind: t.rt.kind.clone(),
                    }
                };
                return Some(invocation(&v.name, kind));
            }
        }
    }
    None
}

/// The object as a webhook of version `inv` sees it.
pub(super) async fn versioned<'v>(
    t_rt: &ResourceType,
    request_version: &str,
    inv: &Invocation,
    obj: &'v Value,
) -> Result<Cow<'v, Value>, ApiError> {
    if inv.kind.kind != t_rt.kind || inv.version == request_version {
        return Ok(Cow::Borrowed(obj));
    }
    crate::registry::convert_value(t_rt, obj, &format!("{}/{}", inv.group, inv.version))
        .await
        .map(Cow::Owned)
}

/// [`versioned`] of an object that may be absent.
pub(super) async fn versioned_opt<'v>(
    t_rt: &ResourceType,
    request_version: &str,
    inv: &Invocation,
    obj: Option<&'v Value>,
) -> Result<Option<Cow<'v, Value>>, ApiError> {
    match obj {
        Some(o) => versioned(t_rt, request_version, inv, o).await.map(Some),
        None => Ok(None),
    }
}

/// A patched object as kube decodes it: numbers as integers where whole,
/// unknown fields pruned and defaults filled by `version`'s schema.
fn normalize(rt: &ResourceType, version: &str, obj: &mut Value) {
    crate::object::meta::whole_numbers_as_integers(obj);
    crate::object::meta::drop_unknown_metadata(obj);
    if let Some(schema) = rt.version(version).and_then(|v| v.validation.as_ref()) {
        schema.prune(obj);
        schema.apply_defaults(obj);
    }
}

/// Why it could not be told whether criteria take a request.
pub(super) enum Undecided {
    /// A selector that does not parse: kube's error for it.
    Selector(String),
    /// The request's namespace could not be read.
    Namespace(ApiError),
}

impl Undecided {
    /// As a policy's or binding's configuration error says it.
    pub(super) fn message(self) -> String {
        match self {
            Undecided::Selector(e) => e,
            Undecided::Namespace(e) => e.message,
        }
    }
}

/// The request's namespace, looked up at most once per run.
#[derive(Default)]
pub(super) struct NamespaceOnce(Option<Result<Value, ApiError>>);

impl NamespaceOnce {
    pub(super) async fn get(&mut self, w: &Webhooks, ns: &str) -> Result<&Value, ApiError> {
        if self.0.is_none() {
            self.0 = Some(w.namespaces.get(ns).await);
        }
        match self.0.as_ref() {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ApiError::internal("namespace lookup")),
        }
    }

    /// The namespace's labels.
    pub(super) async fn labels(
        &mut self,
        w: &Webhooks,
        ns: &str,
    ) -> Result<BTreeMap<String, String>, ApiError> {
        let v = self.get(w, ns).await?;
        Ok(matching::labels_of(Some(v)).unwrap_or_default())
    }
}

impl Webhooks {
    async fn ready(
        &self,
        attrs: &Attributes<'_>,
    ) -> Result<std::sync::Arc<super::hooks::Hooks>, ApiError> {
        if !self.source.is_synced() && !self.source.wait_synced(READY_WAIT).await {
            let t = attrs.target;
            return Err(ApiError::forbidden_resource(
                &t.rt.group,
                &t.rt.plural,
                attrs.name,
                "not yet ready to handle request",
            ));
        }
        Ok(self.source.current())
    }

    /// Whether `c` takes the request, and as which resource (kube's
    /// namespace and object matchers, then the rules): a selector that does
    /// not select decides first; a selector's error counts only when the
    /// rules take the request.
    pub(super) async fn select(
        &self,
        c: &Criteria,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        ns: &mut NamespaceOnce,
    ) -> Result<Option<Invocation>, Undecided> {
        let t = attrs.target;
        let ns_match = match &c.namespace_selector {
            _ if t.namespace.is_empty() => Ok(true),
            Ok(sel) if sel.is_empty() => Ok(true),
            Ok(sel) => ns
                .labels(self, &t.namespace)
                .await
                .map(|labels| sel.matches(&labels))
                .map_err(Undecided::Namespace),
            Err(e) => Err(Undecided::Selector(e.clone())),
        };
        if matches!(ns_match, Ok(false)) {
            return Ok(None);
        }
        let object_match = match &c.object_selector {
            Ok(sel) => Ok(matching::object_selected(sel, object, attrs.old_object)),
            Err(e) => Err(Undecided::Selector(e.clone())),
        };
        if matches!(object_match, Ok(false)) {
            return Ok(None);
        }
        if invocation(&c.exclude, c.equivalent, attrs).is_some() {
            return Ok(None);
        }
        let inv = if c.rules.is_empty() && c.all_without_rules {
            // Everything the selectors take, as the request's resource.
            Some(Invocation {
                group: t.rt.group.clone(),
                version: t.version.clone(),
                resource: t.rt.plural.clone(),
                subresource: attrs.subresource.to_string(),
                kind: attrs.kind.clone(),
            })
        } else {
            invocation(&c.rules, c.equivalent, attrs)
        };
        let Some(inv) = inv else {
            return Ok(None);
        };
        ns_match?;
        object_match?;
        Ok(Some(inv))
    }

    /// kube's `ShouldCallHook`: the webhook's criteria ([`Webhooks::select`]),
    /// then its match conditions.
    async fn should_call(
        &self,
        hook: &Hook,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        ns: &mut NamespaceOnce,
    ) -> Result<Option<Invocation>, ApiError> {
        let t = attrs.target;
        let inv = match self.select(&hook.criteria, attrs, object, ns).await {
            Ok(Some(inv)) => inv,
            Ok(None) => return Ok(None),
            Err(Undecided::Selector(e)) => return Err(ApiError::internal(e)),
            Err(Undecided::Namespace(e)) => return Err(e),
        };
        if hook.conditions.is_empty() {
            return Ok(Some(inv));
        }
        let request = Value::Object(review::request("", attrs, &inv));
        let obj = versioned_opt(&t.rt, &t.version, &inv, object).await?;
        let old = versioned_opt(&t.rt, &t.version, &inv, attrs.old_object).await?;
        let act = matching::Activation::new(&[
            ("object", obj.as_deref()),
            ("oldObject", old.as_deref()),
            ("request", Some(&request)),
        ]);
        match hook.conditions.evaluate(&act) {
            Verdict::Match => Ok(Some(inv)),
            Verdict::NoMatch => Ok(None),
            Verdict::Error(_) if hook.ignore_failures => Ok(None),
            Verdict::Error(e) => {
                tracing::warn!(webhook = %hook.name, error = %e, "failed evaluating match conditions, failing closed");
                Err(ApiError::forbidden_resource(
                    &t.rt.group,
                    &t.rt.plural,
                    attrs.name,
                    &e,
                ))
            }
        }
    }

    /// A webhook call, up to its checked answer: the dry-run rule, the
    /// review in the webhook's version, the POST, the answer's checks, its
    /// audit annotations and warnings. In a traced request it is kube's
    /// `Call mutating webhook` / `Call validating webhook` span, with the
    /// POST's span inside.
    async fn exchange(
        &self,
        hook: &Hook,
        inv: &Invocation,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        mutating: bool,
    ) -> Result<review::Answer, HookError> {
        let uid = uuid::Uuid::new_v4().to_string();
        let name = if mutating {
            "Call mutating webhook"
        } else {
            "Call validating webhook"
        };
        let span =
            crate::traces::Span::child_with(name, opentelemetry::trace::SpanKind::Internal, || {
                use opentelemetry::KeyValue;
                let t = attrs.target;
                vec![
                    KeyValue::new("configuration", hook.configuration.clone()),
                    KeyValue::new("webhook", hook.name.clone()),
                    // Go's GroupVersionResource.String().
                    KeyValue::new(
                        "resource",
                        format!("{}/{}, Resource={}", t.rt.group, t.version, t.rt.plural),
                    ),
                    KeyValue::new("subresource", attrs.subresource.to_string()),
                    KeyValue::new("operation", attrs.operation.as_str()),
                    KeyValue::new("UID", uid.clone()),
                ]
            });
        let outcome = crate::traces::in_span(
            &span,
            self.exchange_with(hook, inv, attrs, object, mutating, uid),
        )
        .await;
        if let (Some(span), Err(e)) = (&span, &outcome) {
            span.fail(match e {
                HookError::Calling(f) => f.reason.clone(),
                HookError::Final(e) => e.message.clone(),
            });
        }
        outcome
    }

    async fn exchange_with(
        &self,
        hook: &Hook,
        inv: &Invocation,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        mutating: bool,
        uid: String,
    ) -> Result<review::Answer, HookError> {
        if attrs.dry_run {
            match hook.side_effects.as_str() {
                "" => return Err(calling("Webhook SideEffects is nil")),
                "None" | "NoneOnDryRun" => {}
                _ => {
                    return Err(HookError::Final(ApiError::bad_request(format!(
                        "admission webhook {} does not support dry run",
                        quote(&hook.name)
                    ))))
                }
            }
        }
        let version = ReviewVersion::pick(&hook.review_versions).ok_or_else(|| {
            calling("could not create admission objects: webhook does not accept known AdmissionReview versions (v1, v1beta1)")
        })?;
        let t = attrs.target;
        let obj = versioned_opt(&t.rt, &t.version, inv, object)
            .await
            .map_err(HookError::Final)?;
        let old = versioned_opt(&t.rt, &t.version, inv, attrs.old_object)
            .await
            .map_err(HookError::Final)?;
        let body = review::review(version, &uid, attrs, inv, obj.as_deref(), old.as_deref());
        let answer = self
            .clients
            .call(hook, &body)
            .await
            .map_err(HookError::Calling)?;
        let answer = review::verify(version, &uid, mutating, &answer)
            .map_err(|e| calling(format!("received invalid webhook response: {e}")))?;
        if let Some(annotate) = &attrs.caller.annotate {
            for (k, v) in &answer.audit_annotations {
                annotate(&format!("{}/{k}", hook.name), v);
            }
        }
        for w in &answer.warnings {
            attrs.caller.warnings.add(w);
        }
        if !answer.allowed {
            return Err(HookError::Final(denied(&hook.name, answer.status.as_ref())));
        }
        Ok(answer)
    }

    /// One mutating webhook; `Ok(true)` when its patch changed the object.
    async fn call_mutating(
        &self,
        hook: &Hook,
        inv: &Invocation,
        attrs: &Attributes<'_>,
        object: Option<&mut Value>,
    ) -> Result<bool, HookError> {
        let answer = self
            .exchange(hook, inv, attrs, object.as_deref(), true)
            .await?;
        if answer.patch.is_empty() {
            return Ok(false);
        }
        let ops: Vec<serde_json::Map<String, Value>> = serde_json::from_slice(&answer.patch)
            .map_err(|e| {
                calling(format!(
                    "received undecodable patch in webhook response: {e}"
                ))
            })?;
        if ops.is_empty() {
            return Ok(false);
        }
        let Some(obj) = object else {
            return Err(HookError::Final(ApiError::internal(format!(
                "admission webhook {} attempted to modify the object, which is not supported for this operation",
                quote(&hook.name)
            ))));
        };
        if answer.patch_type != "JSONPatch" {
            return Err(calling(format!(
                "unsupported patch type {:?}",
                answer.patch_type
            )));
        }
        let t = attrs.target;
        let current = versioned(&t.rt, &t.version, inv, obj)
            .await
            .map_err(HookError::Final)?
            .into_owned();
        let mut patched = patch::apply(PatchType::Json, &current, &answer.patch)
            .map_err(|e| HookError::Final(ApiError::internal(e.message)))?;
        let changed = patched != current;
        if inv.kind.kind == t.rt.kind {
            normalize(&t.rt, &inv.version, &mut patched);
            if inv.version != t.version {
                patched = crate::registry::convert_value(&t.rt, &patched, &t.api_version())
                    .await
                    .map_err(HookError::Final)?;
                normalize(&t.rt, &t.version, &mut patched);
            }
        }
        *obj = patched;
        Ok(changed)
    }

    /// The mutating run: webhooks in order, then once more for those that
    /// asked (`IfNeeded`) when a later webhook changed the object.
    pub(super) async fn mutate_all(
        &self,
        attrs: &Attributes<'_>,
        mut object: Option<&mut Value>,
    ) -> Result<(), ApiError> {
        if exempt(&attrs.kind) {
            return Ok(());
        }
        let hooks = self.ready(attrs).await?;
        if hooks.mutating.is_empty() {
            return Ok(());
        }
        let mut ns = NamespaceOnce::default();
        let mut invoked_reinvocable = HashSet::new();
        let mut reinvoke = HashSet::new();
        let mut again = false;
        for round in 0..2 {
            if round == 1 && !again {
                break;
            }
            for (index, hook) in hooks.mutating.iter().enumerate() {
                let Some(inv) = self
                    .should_call(hook, attrs, object.as_deref(), &mut ns)
                    .await?
                else {
                    continue;
                };
                // A webhook is never called for the first time on reinvocation.
                if round == 1 && !reinvoke.contains(&hook.uid) {
                    continue;
                }
                let started = std::time::Instant::now();
                let outcome = self
                    .call_mutating(hook, &inv, attrs, object.as_deref_mut())
                    .await;
                observe(hook, "admit", attrs.operation.as_str(), started, &outcome);
                let changed = matches!(outcome, Ok(true));
                if let Some(annotate) = &attrs.caller.annotate {
                    // kube's `MutationAuditAnnotation`, fields in its order.
                    #[derive(serde::Serialize)]
                    struct Mutation<'a> {
                        configuration: &'a str,
                        webhook: &'a str,
                        mutated: bool,
                    }
                    let value = serde_json::to_string(&Mutation {
                        configuration: &hook.configuration,
                        webhook: &hook.name,
                        mutated: changed,
                    })
                    .unwrap_or_default();
                    annotate(
                        &format!("mutation.webhook.admission.k8s.io/round_{round}_index_{index}"),
                        &value,
                    );
                }
                if changed {
                    reinvoke.extend(invoked_reinvocable.drain());
                    again = true;
                }
                if hook.reinvoke_if_needed {
                    invoked_reinvocable.insert(hook.uid.clone());
                }
                match outcome {
                    Ok(_) => {}
                    Err(HookError::Calling(f)) if hook.ignore_failures => {
                        tracing::warn!(webhook = %hook.name, error = %f.reason, "failed calling webhook, failing open");
                        if let Some(annotate) = &attrs.caller.annotate {
                            annotate(
                                &format!("failed-open.mutation.webhook.admission.k8s.io/round_{round}_index_{index}"),
                                &hook.name,
                            );
                        }
                    }
                    Err(HookError::Calling(f)) => {
                        tracing::warn!(webhook = %hook.name, error = %f.reason, "failed calling webhook, failing closed");
                        return Err(call_error(hook, &f));
                    }
                    Err(HookError::Final(e)) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// The validating run: every matching webhook at once; the first error
    /// in webhook order is the answer.
    pub(super) async fn validate_all(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
    ) -> Result<(), ApiError> {
        if exempt(&attrs.kind) {
            return Ok(());
        }
        let hooks = self.ready(attrs).await?;
        let mut ns = NamespaceOnce::default();
        // kube's ValidatingAdmissionPolicy plugin runs before its webhook plugin.
        if !hooks.policies.is_empty() {
            self.validate_policies(attrs, object, &hooks.policies, &mut ns)
                .await?;
        }
        if hooks.validating.is_empty() {
            return Ok(());
        }
        let mut relevant = Vec::new();
        for (index, hook) in hooks.validating.iter().enumerate() {
            if let Some(inv) = self.should_call(hook, attrs, object, &mut ns).await? {
                relevant.push((index, hook, inv));
            }
        }
        let calls = relevant.iter().map(|(_, hook, inv)| async move {
            let started = std::time::Instant::now();
            let outcome = self.exchange(hook, inv, attrs, object, false).await;
            observe(
                hook,
                "validating",
                attrs.operation.as_str(),
                started,
                &outcome,
            );
            outcome
        });
        let outcomes = futures::future::join_all(calls).await;
        let mut first = None;
        for ((index, hook, _), outcome) in relevant.iter().zip(outcomes) {
            match outcome {
                Ok(_) => {}
                Err(HookError::Calling(f)) if hook.ignore_failures => {
                    tracing::warn!(webhook = %hook.name, error = %f.reason, "failed calling webhook, failing open");
                    if let Some(annotate) = &attrs.caller.annotate {
                        annotate(
                            &format!("failed-open.validating.webhook.admission.k8s.io/round_0_index_{index}"),
                            &hook.name,
                        );
                    }
                }
                Err(HookError::Calling(f)) => {
                    tracing::warn!(webhook = %hook.name, error = %f.reason, "failed calling webhook, failing closed");
                    first.get_or_insert_with(|| call_error(hook, &f));
                }
                Err(HookError::Final(e)) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// kube's `apiserver_admission_webhook_*` metrics for one call (`kind`:
/// `admit` or `validating`).
fn observe<T>(
    hook: &Hook,
    kind: &'static str,
    operation: &'static str,
    started: std::time::Instant,
    outcome: &Result<T, HookError>,
) {
    let (rejected, rejection) = match outcome {
        Ok(_) => (false, None),
        Err(HookError::Calling(_)) if hook.ignore_failures => {
            metrics::counter!("apiserver_admission_webhook_fail_open_count",
                "name" => hook.name.clone(), "type" => kind)
            .increment(1);
            (false, None)
        }
        Err(HookError::Calling(_)) => (true, Some(("calling_webhook_error", 500))),
        Err(HookError::Final(e)) => (true, Some(("no_error", e.code))),
    };
    metrics::histogram!("apiserver_admission_webhook_admission_duration_seconds",
        "name" => hook.name.clone(), "type" => kind, "operation" => operation,
        "rejected" => if rejected { "true" } else { "false" })
    .record(started.elapsed().as_secs_f64());
    if let Some((error_type, code)) = rejection {
        metrics::counter!("apiserver_admission_webhook_rejection_count",
            "name" => hook.name.clone(), "type" => kind, "operation" => operation,
            "error_type" => error_type, "rejection_code" => code.to_string())
        .increment(1);
    }
}

/// A webhook that could not be called, under failure policy Fail: kube's
/// `NewInternalError(ErrCallingWebhook)`.
fn call_error(hook: &Hook, f: &CallFailure) -> ApiError {
    ApiError::internal(format!(
        "failed calling webhook {}: {}",
        quote(&hook.name),
        f.reason
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn denials_read_as_kube_writes_them() {
        let e = denied(
            "deny.kshard.dev",
            Some(&json!({"code": 403, "reason": "Forbidden", "message": "no red widgets"})),
        );
        assert_eq!(e.code, 403);
        assert_eq!(e.reason, "Forbidden");
        assert_eq!(
            e.message,
            "admission webhook \"deny.kshard.dev\" denied the request: no red widgets"
        );
        let e = denied("d.x.io", None);
        assert_eq!((e.code, e.reason.as_ref()), (400, ""));
        assert_eq!(
            e.message,
            "admission webhook \"d.x.io\" denied the request without explanation"
        );
        assert!(e.to_json().get("reason").is_none());
        let e = denied(
            "d.x.io",
            Some(&json!({"code": 200, "reason": "NotAllowed"})),
        );
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"d.x.io\" denied the request: NotAllowed"
        );
    }

    fn rule(operations: &[&str], resources: &[&str]) -> matching::NamedRule {
        let strings = |v: &[&str]| Some(v.iter().map(|s| s.to_string()).collect());
        matching::NamedRule::any_name(matching::Rule::from_api(
            &k8s_openapi::api::admissionregistration::v1::RuleWithOperations {
                operations: strings(operations),
                api_groups: strings(&["demo.kshard.dev"]),
                api_versions: strings(&["*"]),
                resources: strings(resources),
                scope: None,
            },
        ))
    }

    fn selector(labels: &[(&str, &str)]) -> Result<matching::Selector, String> {
        matching::Selector::parse(Some(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                match_expressions: None,
            },
        ))
    }

    fn criteria(rules: Vec<matching::NamedRule>) -> Criteria {
        Criteria {
            namespace_selector: Ok(matching::Selector::default()),
            object_selector: Ok(matching::Selector::default()),
            rules,
            exclude: Vec::new(),
            equivalent: true,
            all_without_rules: false,
        }
    }

    /// The one check webhooks and policies share: selectors, rules,
    /// excluded rules, and selector errors that count only when the rules
    /// take the request.
    #[tokio::test]
    async fn criteria_select_by_selectors_and_rules() {
        let mut catalog = crate::registry::Catalog::default();
        catalog
            .add_manifests(
                std::path::Path::new("w.yaml"),
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
                 metadata: {name: widgets.demo.kshard.dev}\n\
                 spec: {group: demo.kshard.dev, scope: Namespaced, \
                 names: {plural: widgets, kind: Widget}, versions: [{name: v1, served: true, \
                 storage: true, schema: {openAPIV3Schema: {type: object}}}]}\n",
            )
            .expect("crd");
        let rt = catalog
            .find("demo.kshard.dev", "v1", "widgets")
            .cloned()
            .expect("widgets");
        let target = crate::registry::Target {
            rt,
            version: "v1".into(),
            namespace: "default".into(),
        };
        let caller = crate::registry::write_admission::Caller::default();
        let attrs = Attributes {
            target: &target,
            name: "w1",
            subresource: "",
            kind: Gvk {
                group: "demo.kshard.dev".into(),
                version: "v1".into(),
                kind: "Widget".into(),
            },
            operation: crate::registry::write_admission::Operation::Create,
            old_object: None,
            dry_run: false,
            caller: &caller,
        };
        let w = Webhooks::new(
            super::super::hooks::Source::fixed(Default::default()),
            super::super::webhook::Clients::new(&[]),
            std::sync::Arc::new(super::super::ImplicitNamespaces),
            None,
        );
        let object = json!({"metadata": {"name": "w1", "labels": {"color": "red"}}});
        let select = |c: Criteria| {
            let (w, attrs, object) = (&w, &attrs, &object);
            async move {
                w.select(&c, attrs, Some(object), &mut NamespaceOnce::default())
                    .await
                    .map(|inv| inv.map(|i| (i.resource, i.version)))
                    .map_err(Undecided::message)
            }
        };
        let taken = Ok(Some(("widgets".to_string(), "v1".to_string())));

        assert_eq!(
            select(criteria(vec![rule(&["CREATE"], &["widgets"])])).await,
            taken
        );
        assert_eq!(
            select(criteria(vec![rule(&["UPDATE"], &["widgets"])])).await,
            Ok(None)
        );
        assert_eq!(
            select(criteria(vec![rule(&["*"], &["gadgets"])])).await,
            Ok(None)
        );
        // No rules: nothing for a webhook, everything for a binding.
        assert_eq!(select(criteria(Vec::new())).await, Ok(None));
        let mut all = criteria(Vec::new());
        all.all_without_rules = true;
        assert_eq!(select(all).await, taken);
        // Excluded rules take the request back out.
        let mut excluded = criteria(vec![rule(&["*"], &["*"])]);
        excluded.exclude = vec![rule(&["CREATE"], &["widgets"])];
        assert_eq!(select(excluded).await, Ok(None));

        // Selectors: the namespace's implicit name label, the object's labels.
        let mut c = criteria(vec![rule(&["*"], &["widgets"])]);
        c.namespace_selector = selector(&[(crate::admission::NAMESPACE_NAME_LABEL, "default")]);
        c.object_selector = selector(&[("color", "red")]);
        assert_eq!(select(c).await, taken);
        let mut c = criteria(vec![rule(&["*"], &["widgets"])]);
        c.namespace_selector = selector(&[(crate::admission::NAMESPACE_NAME_LABEL, "other")]);
        assert_eq!(select(c).await, Ok(None));
        let mut c = criteria(vec![rule(&["*"], &["widgets"])]);
        c.object_selector = selector(&[("color", "blue")]);
        assert_eq!(select(c).await, Ok(None));

        // A selector's error counts only when the rules take the request,
        // and a selector that does not select decides first.
        let bad = || Err("bad selector".to_string());
        let mut c = criteria(vec![rule(&["*"], &["widgets"])]);
        c.object_selector = bad();
        assert_eq!(select(c).await, Err("bad selector".to_string()));
        let mut c = criteria(vec![rule(&["*"], &["gadgets"])]);
        c.object_selector = bad();
        assert_eq!(select(c).await, Ok(None));
        let mut c = criteria(vec![rule(&["*"], &["widgets"])]);
        c.namespace_selector = bad();
        c.object_selector = selector(&[("color", "blue")]);
        assert_eq!(select(c).await, Ok(None));
    }

    #[test]
    fn configuration_kinds_are_exempt() {
        let gvk = |g: &str, k: &str| Gvk {
            group: g.into(),
            version: "v1".into(),
            kind: k.into(),
        };
        assert!(exempt(&gvk(
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration"
        )));
        assert!(!exempt(&gvk(
            "demo.kshard.dev",
            "MutatingWebhookConfiguration"
        )));
    }
}
