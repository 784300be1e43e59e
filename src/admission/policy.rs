//! ValidatingAdmissionPolicy (`admissionregistration.k8s.io/v1`), as kube's
//! validating policy plugin runs it: a policy's match constraints, then each
//! of its bindings' match resources and params, then its match conditions,
//! variables, validations (message, messageExpression, reason) and audit
//! annotations in CEL; a failed validation is denied, warned or audited as
//! the binding's `validationActions` say. Policies run before validating
//! webhooks (kube's plugin order).
//!
//! CEL binds `object`, `oldObject`, `request`, `params`, `namespaceObject`
//! and `variables`; `authorizer` is not bound (an expression using it fails
//! to evaluate). Params are objects of a kind kshard serves.

use crate::object::MetaField;
use std::collections::BTreeMap;
use std::sync::Weak;

use futures::future::BoxFuture;
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ParamRef, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube_cel::cel;
use serde_json::Value;

use super::dispatch::{versioned_opt, NamespaceOnce, Undecided};
use super::matching::{self, Activation, Conditions, Criteria, Expr, NamedRule, Selector, Verdict};
use super::review::{self, Invocation};
use super::Webhooks;
use crate::registry::write_admission::Attributes;
use crate::registry::{convert_values, ReadAt, Registry, Selectors, Target};
use crate::status::ApiError;

/// kube's largest evaluated `messageExpression` and audit annotation value.
const MAX_MESSAGE_BYTES: usize = 5 * 1024;
const MAX_ANNOTATION_BYTES: usize = 10 * 1024;

/// A policy's `matchConstraints` or a binding's `matchResources`.
fn criteria(m: &MatchResources) -> Result<Criteria, String> {
    // The API defaults both selectors; kube refuses to guess without them.
    let selector = |s: Option<&_>, what: &str| match s {
        Some(s) => Ok(Selector::parse(Some(s))),
        None => Err(format!("a nil {what} selector is not supported")),
    };
    Ok(Criteria {
        namespace_selector: selector(m.namespace_selector.as_ref(), "namespace")?,
        object_selector: selector(m.object_selector.as_ref(), "object")?,
        rules: m
            .resource_rules
            .iter()
            .flatten()
            .map(NamedRule::from_api)
            .collect(),
        exclude: m
            .exclude_resource_rules
            .iter()
            .flatten()
            .map(NamedRule::from_api)
            .collect(),
        equivalent: m.match_policy.as_deref() != Some("Exact"),
        all_without_rules: true,
    })
}

/// One validation.
struct Check {
    expr: Expr,
    message: Option<String>,
    message_expr: Option<Expr>,
    reason: Option<String>,
}

/// A policy, compiled.
pub struct Policy {
    pub name: String,
    /// `apiVersion` and `kind` of the params.
    param_kind: Option<(String, String)>,
    /// `Err`: kube's configuration error for it.
    constraints: Result<Criteria, String>,
    ignore_failures: bool,
    conditions: Conditions,
    variables: Vec<(String, Expr)>,
    checks: Vec<Check>,
    audit_annotations: Vec<(String, Expr)>,
}

/// A binding, compiled.
pub struct Binding {
    pub name: String,
    param_ref: Option<ParamRef>,
    /// `None`: everything its policy matches.
    resources: Option<Result<Criteria, String>>,
    /// `Deny`, `Warn`, `Audit`.
    actions: Vec<String>,
}

/// A policy and its bindings, in name order.
pub struct PolicyHook {
    pub policy: Policy,
    pub bindings: Vec<Binding>,
}

impl std::fmt::Debug for PolicyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHook")
            .field("policy", &self.policy.name)
            .field(
                "bindings",
                &self.bindings.iter().map(|b| &b.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Policy {
    fn compile(name: &str, p: &ValidatingAdmissionPolicy) -> Self {
        let spec = p.spec.clone().unwrap_or_default();
        Policy {
            name: name.to_string(),
            param_kind: spec.param_kind.map(|k| {
                (
                    k.api_version.unwrap_or_default(),
                    k.kind.unwrap_or_default(),
                )
            }),
            constraints: match &spec.match_constraints {
                Some(m) => criteria(m),
                None => Err("policy contained no match constraints, a required field".into()),
            },
            ignore_failures: spec.failure_policy.as_deref() == Some("Ignore"),
            conditions: Conditions::compile(spec.match_conditions.as_ref()),
            variables: spec
                .variables
                .iter()
                .flatten()
                .map(|v| (v.name.clone(), Expr::compile(&v.expression)))
                .collect(),
            checks: spec
                .validations
                .iter()
                .flatten()
                .map(|v| Check {
                    expr: Expr::compile(&v.expression),
                    message: v.message.clone(),
                    message_expr: v.message_expression.as_deref().map(Expr::compile),
                    reason: v.reason.clone(),
                })
                .collect(),
            audit_annotations: spec
                .audit_annotations
                .iter()
                .flatten()
                .map(|a| (a.key.clone(), Expr::compile(&a.value_expression)))
                .collect(),
        }
    }
}

impl Binding {
    fn compile(name: &str, b: &ValidatingAdmissionPolicyBinding) -> Self {
        let spec = b.spec.clone();
        Binding {
            name: name.to_string(),
            param_ref: spec.param_ref,
            resources: spec.match_resources.as_ref().map(criteria),
            actions: spec.validation_actions,
        }
    }
}

/// Every policy with its bindings (policies by name, bindings by name;
/// bindings of absent policies are idle).
pub fn compile(
    policies: &BTreeMap<String, ValidatingAdmissionPolicy>,
    bindings: &BTreeMap<String, ValidatingAdmissionPolicyBinding>,
) -> Vec<PolicyHook> {
    policies
        .iter()
        .map(|(name, p)| PolicyHook {
            policy: Policy::compile(name, p),
            bindings: bindings
                .iter()
                .filter(|(_, b)| &b.spec.policy_name == name)
                .map(|(bname, b)| Binding::compile(bname, b))
                .collect(),
        })
        .collect()
}

/// Where params come from: objects of a kind kshard serves.
pub trait Params: Send + Sync {
    /// The params a binding's `paramRef` selects in `namespace` (the
    /// request's, unless the ref names one): kube's `CollectParams`.
    fn collect<'a>(
        &'a self,
        kind: &'a (String, String),
        param_ref: &'a ParamRef,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, String>>;
}

/// Params read from kshard's own watch cache.
pub struct RegistryParams(pub Weak<Registry>);

impl RegistryParams {
    async fn collect_from(
        &self,
        (api_version, kind): &(String, String),
        r: &ParamRef,
        namespace: &str,
    ) -> Result<Vec<Value>, String> {
        let unknown = || {
            format!(
                "paramKind kind `&ParamKind{{APIVersion:{api_version},Kind:{kind},}}` not known"
            )
        };
        let registry = self.0.upgrade().ok_or_else(unknown)?;
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let rt = registry
            .catalog()
            .find_by_kind(group, kind)
            .filter(|rt| rt.version(version).is_some())
            .cloned()
            .ok_or_else(unknown)?;
        let namespace = param_namespace(rt.namespaced, r, namespace)?;
        let t = Target {
            rt,
            version: version.to_string(),
            namespace,
        };
        let found: Vec<Value> = match (r.name.as_deref().filter(|n| !n.is_empty()), &r.selector) {
            (Some(_), Some(_)) => {
                return Err("paramRef.name and paramRef.selector are mutually exclusive".into())
            }
            (Some(name), None) => match registry.get(&t, name, &ReadAt::Any).await {
                Ok(item) => vec![item.value().clone()],
                Err(e) if e.code == 404 => Vec::new(),
                Err(e) => return Err(e.message),
            },
            (None, Some(sel)) => {
                let sel = Selector::parse(Some(sel))?;
                let listed = registry
                    .list(&t, &Selectors::default(), &ReadAt::Any, None)
                    .await
                    .map_err(|e| e.message)?;
                listed
                    .items
                    .iter()
                    .filter(|i| {
                        sel.matches(&matching::labels_of(Some(i.value())).unwrap_or_default())
                    })
                    .map(|i| i.value().clone())
                    .collect()
            }
            (None, None) => return Err("one of name or selector must be provided".into()),
        };
        // Params in the version the policy names, converted together.
        let refs: Vec<&Value> = found.iter().collect();
        let params = convert_values(&t.rt, &refs, api_version)
            .await
            .map_err(|e| e.message)?;
        found_or_denied(params, r)
    }
}

impl Params for RegistryParams {
    fn collect<'a>(
        &'a self,
        kind: &'a (String, String),
        param_ref: &'a ParamRef,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, String>> {
        Box::pin(self.collect_from(kind, param_ref, namespace))
    }
}

/// Behind a host: params of kinds kshard does not serve (a ConfigMap, most
/// often) are the host's objects, read when a request needs them.
pub struct HostParams {
    pub local: RegistryParams,
    pub client: kube::Client,
}

/// The namespace a `paramRef` reads from, as kube's `CollectParams` decides it.
fn param_namespace(namespaced: bool, r: &ParamRef, request_ns: &str) -> Result<String, String> {
    let ref_ns = r.namespace.clone().unwrap_or_default();
    if !namespaced {
        if !ref_ns.is_empty() {
            return Err(
                "paramRef.namespace must not be provided for a cluster-scoped `paramKind`".into(),
            );
        }
        Ok(String::new())
    } else if !ref_ns.is_empty() {
        Ok(ref_ns)
    } else if request_ns.is_empty() {
        Err("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".into())
    } else {
        Ok(request_ns.to_string())
    }
}

/// kube's `parameterNotFoundAction: Deny`: no params is an error.
fn found_or_denied(params: Vec<Value>, r: &ParamRef) -> Result<Vec<Value>, String> {
    if params.is_empty() && r.parameter_not_found_action.as_deref() == Some("Deny") {
        return Err(
            "no params found for policy binding with `Deny` parameterNotFoundAction".into(),
        );
    }
    Ok(params)
}

/// A `LabelSelector` in the label-selector query syntax.
fn selector_query(sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

impl HostParams {
    async fn collect_from_host(
        &self,
        (api_version, kind): &(String, String),
        r: &ParamRef,
        namespace: &str,
    ) -> Result<Vec<Value>, String> {
        use kube::api::{Api, DynamicObject, ListParams};
        let unknown = || {
            format!(
                "paramKind kind `&ParamKind{{APIVersion:{api_version},Kind:{kind},}}` not known"
            )
        };
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|_| unknown())?;
        let namespaced = caps.scope == kube::discovery::Scope::Namespaced;
        let ns = param_namespace(namespaced, r, namespace)?;
        let api: Api<DynamicObject> = if namespaced {
            Api::namespaced_with(self.client.clone(), &ns, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        };
        let to_value = |o: DynamicObject| serde_json::to_value(o).map_err(|e| e.to_string());
        let params = match (r.name.as_deref().filter(|n| !n.is_empty()), &r.selector) {
            (Some(_), Some(_)) => {
                return Err("paramRef.name and paramRef.selector are mutually exclusive".into())
            }
            (Some(name), None) => match api.get_opt(name).await.map_err(|e| e.to_string())? {
                Some(o) => vec![to_value(o)?],
                None => Vec::new(),
            },
            (None, Some(sel)) => api
                .list(&ListParams::default().labels(&selector_query(sel)))
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .map(to_value)
                .collect::<Result<Vec<_>, _>>()?,
            (None, None) => return Err("one of name or selector must be provided".into()),
        };
        found_or_denied(params, r)
    }
}

impl Params for HostParams {
    fn collect<'a>(
        &'a self,
        kind: &'a (String, String),
        param_ref: &'a ParamRef,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, String>> {
        Box::pin(async move {
            let (group, _) = kind.0.rsplit_once('/').unwrap_or(("", &kind.0));
            let served = self
                .local
                .0
                .upgrade()
                .is_some_and(|r| r.catalog().find_by_kind(group, &kind.1).is_some());
            if served {
                self.local.collect_from(kind, param_ref, namespace).await
            } else {
                self.collect_from_host(kind, param_ref, namespace).await
            }
        })
    }
}

/// What one evaluation of a policy decided.
enum Decision {
    Admit,
    Deny {
        message: String,
        /// Empty: kube's `Invalid`.
        reason: String,
    },
}

enum Annotation {
    Publish(String, String),
    Exclude,
    Error(String),
}

#[derive(Default)]
struct Evaluation {
    decisions: Vec<Decision>,
    annotations: Vec<Annotation>,
}

/// The CEL variables of one evaluation.
struct Inputs<'a> {
    object: Option<&'a Value>,
    old: Option<&'a Value>,
    request: &'a Value,
    params: Option<&'a Value>,
    namespace: Option<&'a Value>,
}

impl Policy {
    fn error_decision(&self, message: String) -> Decision {
        if self.ignore_failures {
            Decision::Admit
        } else {
            Decision::Deny {
                message,
                reason: String::new(),
            }
        }
    }

    /// kube's validator: match conditions, then validations, then audit
    /// annotations, each error under the failure policy.
    fn evaluate(&self, i: &Inputs<'_>) -> Evaluation {
        let inputs = [
            ("object", i.object),
            ("oldObject", i.old),
            ("request", Some(i.request)),
            ("params", i.params),
            ("namespaceObject", i.namespace),
        ];
        // One budget for everything this policy evaluates for the request.
        let budget = matching::budget();
        // Match conditions do not see the namespace object.
        match self
            .conditions
            .evaluate(&Activation::new(&inputs[..4]).sharing(&budget))
        {
            Verdict::Match => {}
            Verdict::NoMatch => return Evaluation::default(),
            Verdict::Error(e) => {
                return Evaluation {
                    decisions: vec![self.error_decision(e)],
                    annotations: Vec::new(),
                }
            }
        }
        // Variables in order, each seeing the earlier ones; one that fails
        // is left unbound, so only expressions that use it fail.
        let mut values: std::collections::HashMap<String, cel::Value> = Default::default();
        for (name, expr) in &self.variables {
            let act = Activation::new(&inputs)
                .sharing(&budget)
                .with("variables", cel::Value::from(values.clone()));
            if let Ok(v) = expr.eval(&act) {
                values.insert(name.clone(), v);
            }
        }
        let act = Activation::new(&inputs)
            .sharing(&budget)
            .with("variables", cel::Value::from(values));
        let decisions = self
            .checks
            .iter()
            .map(|c| match c.expr.eval(&act) {
                Ok(cel::Value::Bool(true)) => Decision::Admit,
                Ok(_) => Decision::Deny {
                    message: failure_message(c, &act),
                    reason: c.reason.clone().unwrap_or_default(),
                },
                Err(e) => self.error_decision(e),
            })
            .collect();
        let annotations = self
            .audit_annotations
            .iter()
            .map(|(key, expr)| match expr.eval(&act) {
                Ok(cel::Value::String(s)) => match s.trim() {
                    "" => Annotation::Exclude,
                    v => Annotation::Publish(key.clone(), truncate(v, MAX_ANNOTATION_BYTES)),
                },
                Ok(cel::Value::Null) => Annotation::Exclude,
                Ok(other) => Annotation::Error(format!(
                    "valueExpression '{}' resulted in unsupported return type: {}. Return type must be either string or null.",
                    expr.source,
                    other.type_of()
                )),
                Err(_) if self.ignore_failures => Annotation::Exclude,
                Err(e) => Annotation::Error(e),
            })
            .collect();
        Evaluation {
            decisions,
            annotations,
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A failed validation's message: its messageExpression (a one-line string
/// within kube's size), else its message, else the expression.
fn failure_message(c: &Check, act: &Activation<'_>) -> String {
    let evaluated = c
        .message_expr
        .as_ref()
        .and_then(|m| match m.eval(act) {
            Ok(cel::Value::String(s)) => Some(s.trim().to_string()),
            _ => None,
        })
        .filter(|m| !m.is_empty() && m.len() <= MAX_MESSAGE_BYTES && !m.contains('\n'));
    evaluated
        .or_else(|| {
            c.message
                .as_deref()
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("failed expression: {}", c.expr.source.trim()))
}

fn reason_code(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// A denial: which policy (and binding), why.
struct Denied {
    policy: String,
    binding: Option<String>,
    message: String,
    reason: String,
}

impl Webhooks {
    /// kube's validating policy dispatcher: every matching policy and
    /// binding, params, evaluation, and the binding's actions; the first
    /// denial is the answer.
    pub(super) async fn validate_policies(
        &self,
        attrs: &Attributes<'_>,
        object: Option<&Value>,
        hooks: &[PolicyHook],
        ns: &mut NamespaceOnce,
    ) -> Result<(), ApiError> {
        let mut run = PolicyRun {
            webhooks: self,
            attrs,
            object,
            ns,
            denied: Vec::new(),
        };
        for hook in hooks {
            let policy = &hook.policy;
            let Some(inv) = run.select(policy, None, &policy.constraints).await else {
                continue;
            };
            // Audit annotations by key, each value once, over all bindings.
            let mut published: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for binding in &hook.bindings {
                if let Some(resources) = &binding.resources {
                    if run.select(policy, Some(binding), resources).await.is_none() {
                        continue;
                    }
                }
                run.evaluate_binding(policy, binding, &inv, &mut published)
                    .await?;
            }
            if let Some(annotate) = &attrs.caller.annotate {
                for (k, vs) in &published {
                    annotate(&format!("{}/{k}", policy.name), &vs.join(", "));
                }
            }
        }
        run.answer()
    }
}

/// One request's run through the policies, and the denials found so far.
struct PolicyRun<'r, 'a> {
    webhooks: &'r Webhooks,
    attrs: &'r Attributes<'a>,
    object: Option<&'r Value>,
    ns: &'r mut NamespaceOnce,
    denied: Vec<Denied>,
}

impl PolicyRun<'_, '_> {
    /// A policy or binding that cannot be configured denies the request,
    /// unless the policy ignores failures.
    fn config_error(&mut self, p: &Policy, b: Option<&Binding>, e: String) {
        if p.ignore_failures {
            return;
        }
        let what = if b.is_some() { "binding" } else { "policy" };
        self.denied.push(Denied {
            policy: p.name.clone(),
            binding: b.map(|b| b.name.clone()),
            message: format!("failed to configure {what}: {e}"),
            reason: String::new(),
        });
    }

    /// The resource the policy's constraints (or the binding's resources)
    /// take the request as; `None` when they do not, or cannot be told.
    async fn select(
        &mut self,
        policy: &Policy,
        binding: Option<&Binding>,
        criteria: &Result<Criteria, String>,
    ) -> Option<Invocation> {
        let selected = match criteria {
            Err(e) => Err(e.clone()),
            Ok(c) => self
                .webhooks
                .select(c, self.attrs, self.object, self.ns)
                .await
                .map_err(Undecided::message),
        };
        selected.unwrap_or_else(|e| {
            self.config_error(policy, binding, e);
            None
        })
    }

    /// The params a binding evaluates its policy with: each object its
    /// `paramRef` names, or one evaluation without params.
    async fn params(&mut self, policy: &Policy, binding: &Binding) -> Option<Vec<Option<Value>>> {
        let (Some(kind), Some(r)) = (&policy.param_kind, &binding.param_ref) else {
            return Some(vec![None]);
        };
        let Some(source) = &self.webhooks.params else {
            self.config_error(policy, Some(binding), "params are not available".into());
            return None;
        };
        match source.collect(kind, r, &self.attrs.target.namespace).await {
            Ok(ps) => Some(ps.into_iter().map(Some).collect()),
            Err(e) => {
                self.config_error(policy, Some(binding), e);
                None
            }
        }
    }

    /// Evaluates the policy once per param for a binding that takes the
    /// request, and acts on what it decides.
    async fn evaluate_binding(
        &mut self,
        policy: &Policy,
        binding: &Binding,
        inv: &Invocation,
        published: &mut BTreeMap<String, Vec<String>>,
    ) -> Result<(), ApiError> {
        let Some(params) = self.params(policy, binding).await else {
            return Ok(());
        };
        let t = self.attrs.target;
        let namespace = if t.namespace.is_empty() {
            None
        } else {
            Some(self.ns.get(self.webhooks, &t.namespace).await?.clone())
        };
        let request = Value::Object(review::request("", self.attrs, inv));
        let obj = versioned_opt(&t.rt, &t.version, inv, self.object).await?;
        let old = versioned_opt(&t.rt, &t.version, inv, self.attrs.old_object).await?;
        for param in &params {
            let result = policy.evaluate(&Inputs {
                object: obj.as_deref(),
                old: old.as_deref(),
                request: &request,
                params: param.as_ref(),
                namespace: namespace.as_ref(),
            });
            for (index, decision) in result.decisions.iter().enumerate() {
                if let Decision::Deny { message, reason } = decision {
                    self.act(policy, binding, index, message, reason);
                }
            }
            for a in result.annotations {
                match a {
                    Annotation::Publish(k, v) => {
                        let values = published.entry(k).or_default();
                        if !values.contains(&v) {
                            values.push(v);
                        }
                    }
                    Annotation::Exclude => {}
                    Annotation::Error(message) => self.denied.push(Denied {
                        policy: policy.name.clone(),
                        binding: Some(binding.name.clone()),
                        message,
                        reason: String::new(),
                    }),
                }
            }
        }
        Ok(())
    }

    /// A failed validation, as the binding's `validationActions` say: deny,
    /// warn, or record an audit annotation.
    fn act(
        &mut self,
        policy: &Policy,
        binding: &Binding,
        index: usize,
        message: &str,
        reason: &str,
    ) {
        for action in &binding.actions {
            match action.as_str() {
                "Deny" => self.denied.push(Denied {
                    policy: policy.name.clone(),
                    binding: Some(binding.name.clone()),
                    message: message.to_string(),
                    reason: reason.to_string(),
                }),
                "Warn" => self.attrs.caller.warnings.add(&format!(
                    "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {message}",
                    policy.name, binding.name
                )),
                "Audit" => {
                    if let Some(annotate) = &self.attrs.caller.annotate {
                        // kube's `validationFailureValue`, fields in its order.
                        #[derive(serde::Serialize)]
                        #[serde(rename_all = "camelCase")]
                        struct Failure<'a> {
                            message: &'a str,
                            policy: &'a str,
                            binding: &'a str,
                            expression_index: usize,
                            validation_actions: &'a [String],
                        }
                        let value = serde_json::to_string(&[Failure {
                            message,
                            policy: &policy.name,
                            binding: &binding.name,
                            expression_index: index,
                            validation_actions: &binding.actions,
                        }])
                        .unwrap_or_default();
                        annotate("validation.policy.admission.k8s.io/validation_failure", &value);
                    }
                }
                _ => {}
            }
        }
    }

    /// The first denial as kube answers it, or admitted.
    fn answer(self) -> Result<(), ApiError> {
        let Some(d) = self.denied.into_iter().next() else {
            return Ok(());
        };
        let (attrs, t) = (self.attrs, self.attrs.target);
        let message = match &d.binding {
            Some(b) => format!(
                "ValidatingAdmissionPolicy '{}' with binding '{b}' denied request: {}",
                d.policy, d.message
            ),
            None => format!(
                "ValidatingAdmissionPolicy '{}' denied request: {}",
                d.policy, d.message
            ),
        };
        let name = match attrs.name {
            "" => self
                .object
                .and_then(|o| o.meta_field("name"))
                .and_then(Value::as_str)
                .unwrap_or(""),
            n => n,
        };
        let reason = if d.reason.is_empty() {
            "Invalid".to_string()
        } else {
            d.reason
        };
        let mut e = ApiError::forbidden_resource(&t.rt.group, &t.rt.plural, name, &message)
            .with_cause("", &message, "");
        e.code = reason_code(&reason);
        e.reason = reason.into();
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: Value) -> Policy {
        let p: ValidatingAdmissionPolicy =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec}))
                .expect("policy");
        Policy::compile("p", &p)
    }

    fn inputs<'a>(object: &'a Value, request: &'a Value, params: Option<&'a Value>) -> Inputs<'a> {
        Inputs {
            object: Some(object),
            old: None,
            request,
            params,
            namespace: None,
        }
    }

    fn denials(e: &Evaluation) -> Vec<(String, String)> {
        e.decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Deny { message, reason } => Some((message.clone(), reason.clone())),
                Decision::Admit => None,
            })
            .collect()
    }

    #[test]
    fn validations_are_worded_as_kube_words_them() {
        let p = policy(json!({
            "variables": [{"name": "replicas", "expression": "object.spec.replicas"}],
            "validations": [
                {"expression": "variables.replicas <= params.max", "messageExpression": "'at most ' + string(params.max) + ' replicas'", "reason": "Forbidden"},
                {"expression": "object.spec.color != 'red'", "message": "no red"},
                {"expression": "object.spec.size == 'L' "},
                {"expression": "object.spec.nope == 1"},
            ],
            "auditAnnotations": [
                {"key": "replicas", "valueExpression": "string(variables.replicas)"},
                {"key": "skipped", "valueExpression": "null"},
            ],
        }));
        let obj = json!({"spec": {"replicas": 5, "color": "red", "size": "S"}});
        let request = json!({"operation": "CREATE"});
        let params = json!({"max": 3});
        let e = p.evaluate(&inputs(&obj, &request, Some(&params)));
        let d = denials(&e);
        assert_eq!(
            d[0],
            ("at most 3 replicas".to_string(), "Forbidden".to_string())
        );
        assert_eq!(d[1], ("no red".to_string(), String::new()));
        assert_eq!(d[2].0, "failed expression: object.spec.size == 'L'");
        assert!(
            d[3].0
                .starts_with("expression 'object.spec.nope == 1' resulted in error: "),
            "{:?}",
            d[3]
        );
        assert!(
            matches!(&e.annotations[0], Annotation::Publish(k, v) if k == "replicas" && v == "5")
        );
        assert!(matches!(e.annotations[1], Annotation::Exclude));
    }

    #[test]
    fn failure_policy_ignore_admits_errors() {
        let p = policy(json!({
            "failurePolicy": "Ignore",
            "validations": [{"expression": "object.spec.nope == 1"}],
        }));
        let obj = json!({"spec": {}});
        let request = json!({});
        assert!(denials(&p.evaluate(&inputs(&obj, &request, None))).is_empty());
        let p = policy(json!({
            "matchConditions": [{"name": "only-red", "expression": "object.spec.color == 'red'"}],
            "validations": [{"expression": "false"}],
        }));
        let blue = json!({"spec": {"color": "blue"}});
        assert!(denials(&p.evaluate(&inputs(&blue, &request, None))).is_empty());
        // A condition that fails to evaluate denies under Fail.
        assert_eq!(denials(&p.evaluate(&inputs(&obj, &request, None))).len(), 1);
    }
}
