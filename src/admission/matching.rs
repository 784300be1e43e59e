//! Which webhooks a request calls, as kube's `ShouldCallHook`: a webhook's
//! rules (operations, API groups and versions, resources with `*/status`
//! and `*`, scope), its match policy (an equivalent version of the resource),
//! its namespace and object selectors, then its CEL match conditions.

use crate::object::MetaField;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, NamedRuleWithOperations, RuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_cel::cel;
use serde_json::Value;

use crate::schema::cel_budget;

/// A rule's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    All,
    Cluster,
    Namespaced,
    /// A value kube does not know: matches nothing.
    Unknown,
}

/// One `RuleWithOperations`.
#[derive(Debug, Clone)]
pub struct Rule {
    operations: Vec<String>,
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    scope: Scope,
}

/// A rule limited to some object names (a policy's `resourceNames`; empty:
/// any name).
#[derive(Debug, Clone)]
pub struct NamedRule {
    pub rule: Rule,
    pub names: Vec<String>,
}

impl NamedRule {
    pub fn any_name(rule: Rule) -> Self {
        Self {
            rule,
            names: Vec::new(),
        }
    }

    pub fn from_api(r: &NamedRuleWithOperations) -> Self {
        Self {
            rule: Rule::from_api(&RuleWithOperations {
                operations: r.operations.clone(),
                api_groups: r.api_groups.clone(),
                api_versions: r.api_versions.clone(),
                resources: r.resources.clone(),
                scope: r.scope.clone(),
            }),
            names: r.resource_names.clone().unwrap_or_default(),
        }
    }

    /// kube compares an empty (still to be generated) name as it is.
    pub fn matches(&self, r: &Request<'_>, name: &str) -> bool {
        self.rule.matches(r) && (self.names.is_empty() || self.names.iter().any(|n| n == name))
    }
}

/// What a rule is matched against: the operation and the resource (possibly
/// an equivalent version of the request's).
pub struct Request<'a> {
    pub operation: &'a str,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
}

fn exact_or_wildcard(items: &[String], requested: &str) -> bool {
    items.iter().any(|i| i == "*" || i == requested)
}

impl Rule {
    pub fn from_api(r: &RuleWithOperations) -> Self {
        let list = |v: &Option<Vec<String>>| v.clone().unwrap_or_default();
        Rule {
            operations: list(&r.operations),
            groups: list(&r.api_groups),
            versions: list(&r.api_versions),
            resources: list(&r.resources),
            scope: match r.scope.as_deref() {
                None | Some("*") => Scope::All,
                Some("Cluster") => Scope::Cluster,
                Some("Namespaced") => Scope::Namespaced,
                Some(_) => Scope::Unknown,
            },
        }
    }

    pub fn matches(&self, r: &Request<'_>) -> bool {
        self.scope_matches(r)
            && self.operations.iter().any(|o| o == "*" || o == r.operation)
            && exact_or_wildcard(&self.groups, r.group)
            && exact_or_wildcard(&self.versions, r.version)
            && self.resources.iter().any(|res| {
                let (res, sub) = res.split_once('/').unwrap_or((res, ""));
                (res == "*" || res == r.resource) && (sub == "*" || sub == r.subresource)
            })
    }

    fn scope_matches(&self, r: &Request<'_>) -> bool {
        // A namespace object is cluster-scoped although its requests name a namespace.
        let namespace_object = r.group.is_empty() && r.resource == "namespaces";
        match self.scope {
            Scope::All => true,
            Scope::Namespaced => !namespace_object && !r.namespace.is_empty(),
            Scope::Cluster => namespace_object || r.namespace.is_empty(),
            Scope::Unknown => false,
        }
    }
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A `metav1.LabelSelector`; the empty selector selects everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// kube's `LabelSelectorAsSelector`, with its error texts.
    pub fn parse(s: Option<&LabelSelector>) -> Result<Self, String> {
        let Some(s) = s else {
            return Ok(Self::default());
        };
        let mut reqs = Vec::new();
        for (k, v) in s.match_labels.iter().flatten() {
            reqs.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for e in s.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let key = e.key.clone();
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(
                        "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"
                            .into(),
                    )
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "values: Invalid value: {}: values set must be empty for exists and does not exist",
                        crate::object::meta::go_string_slice(&values)
                    ))
                }
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// An object's labels (none when it has none, or is absent).
pub fn labels_of(obj: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let obj = obj.filter(|o| o.is_object())?;
    Some(
        obj.meta_field("labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// Which requests a webhook, a policy or a binding takes before its match
/// conditions: namespace and object selectors, resource rules under a match
/// policy, and rules that take requests back out. A selector that does not
/// parse is kept as kube's error, which counts only for requests the rules
/// take.
#[derive(Debug)]
pub struct Criteria {
    pub namespace_selector: Result<Selector, String>,
    pub object_selector: Result<Selector, String>,
    pub rules: Vec<NamedRule>,
    /// `excludeResourceRules` (policies; webhooks have none).
    pub exclude: Vec<NamedRule>,
    /// `matchPolicy: Equivalent` (the default).
    pub equivalent: bool,
    /// Without rules every resource is taken (a binding's `matchResources`),
    /// rather than none (a webhook's `rules`).
    pub all_without_rules: bool,
}

/// kube's object selector: the object's labels or the old object's match.
pub fn object_selected(sel: &Selector, object: Option<&Value>, old: Option<&Value>) -> bool {
    sel.is_empty()
        || [object, old]
            .into_iter()
            .any(|o| labels_of(o).is_some_and(|l| sel.matches(&l)))
}

/// A CEL expression, compiled once; a compilation error is kept and
/// reported whenever the expression would be evaluated.
pub struct Expr {
    pub source: String,
    program: Result<cel::Program, String>,
}

impl Expr {
    pub fn compile(source: &str) -> Self {
        Self {
            source: source.to_string(),
            program: cel::Program::compile(source).map_err(|e| format!("compilation error: {e}")),
        }
    }

    /// The value, or kube's message for a failed evaluation. Before it
    /// runs, the expression is charged an upper bound of its cost over the
    /// actual inputs; one over kube's per-call limit fails as cel-go's
    /// cancelled evaluation does, without running (a policy's author could
    /// otherwise let one large object burn a worker thread).
    pub fn eval(&self, a: &Activation<'_>) -> Result<cel::Value, String> {
        let p = self.program.as_ref().map_err(Clone::clone)?;
        let (cost, work) = cel_budget::runtime_bounds_of(p.expression(), &a.json, &a.computed);
        if cost > cel_budget::PER_CALL_LIMIT || work > cel_budget::WORK_LIMIT {
            return Err(format!(
                "expression '{}' resulted in error: operation cancelled: actual cost limit exceeded",
                self.source
            ));
        }
        // The evaluation's budget, shared by its expressions (kube's
        // RuntimeCELCostBudget): once spent, no further expression runs.
        let cost = i64::try_from(cost).unwrap_or(i64::MAX);
        let left = a.budget.fetch_sub(cost, Ordering::Relaxed) - cost;
        if left < 0 {
            return Err(cel_budget::OUT_OF_BUDGET.to_string());
        }
        p.execute(&a.ctx)
            .map_err(|e| format!("expression '{}' resulted in error: {e}", self.source))
    }
}

/// A JSON value as CEL sees it (absent: null).
pub fn to_cel(v: Option<&Value>) -> cel::Value {
    v.map_or(cel::Value::Null, |v| {
        cel::to_value(v).unwrap_or(cel::Value::Null)
    })
}

static NULL: Value = Value::Null;

/// The variables of one evaluation, as CEL values with kube's libraries,
/// and as the JSON they came from (whose sizes bound each expression's cost).
pub struct Activation<'a> {
    ctx: cel::Context<'static>,
    json: Vec<(&'static str, &'a Value)>,
    /// Variables computed by other expressions (a policy's `variables`).
    computed: Vec<&'static str>,
    /// What is left of the evaluation's cost budget.
    budget: Arc<AtomicI64>,
}

/// A fresh cost budget for one evaluation (a webhook's match conditions, or
/// everything one policy evaluates for one request).
pub fn budget() -> Arc<AtomicI64> {
    Arc::new(AtomicI64::new(cel_budget::RUNTIME_BUDGET))
}

impl<'a> Activation<'a> {
    /// Binds JSON variables; an absent one is null.
    pub fn new(vars: &[(&'static str, Option<&'a Value>)]) -> Self {
        use kube_cel::KubeCelExt;
        let mut ctx = cel::Context::default();
        ctx.register_all();
        for (name, v) in vars {
            ctx.add_variable_from_value(*name, to_cel(*v));
        }
        Self {
            ctx,
            json: vars.iter().map(|(n, v)| (*n, v.unwrap_or(&NULL))).collect(),
            computed: Vec::new(),
            budget: budget(),
        }
    }

    /// Draws on `budget` (shared with other activations of one evaluation).
    pub fn sharing(mut self, budget: &Arc<AtomicI64>) -> Self {
        self.budget = budget.clone();
        self
    }

    /// Binds a computed variable.
    pub fn with(mut self, name: &'static str, v: cel::Value) -> Self {
        self.ctx.add_variable_from_value(name, v);
        self.computed.push(name);
        self
    }
}

/// One compiled match condition.
struct Condition {
    name: String,
    expr: Expr,
}

/// A webhook's or policy's `matchConditions`, compiled once.
#[derive(Default)]
pub struct Conditions(Vec<Condition>);

impl std::fmt::Debug for Conditions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|c| &c.name))
            .finish()
    }
}

/// What the match conditions decided.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Match,
    /// A condition was false: the webhook is skipped.
    NoMatch,
    /// Conditions that failed to evaluate (and none was false): the failure
    /// policy decides.
    Error(String),
}

impl Conditions {
    pub fn compile(conditions: Option<&Vec<MatchCondition>>) -> Self {
        Self(
            conditions
                .into_iter()
                .flatten()
                .map(|c| Condition {
                    name: c.name.clone(),
                    expr: Expr::compile(&c.expression),
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// kube's matcher: any false condition skips the webhook; otherwise any
    /// error fails; otherwise it matches. The context binds `object`,
    /// `oldObject` and `request` (and a policy's `params`); `authorizer` is
    /// not bound (an expression using it fails).
    pub fn evaluate(&self, a: &Activation<'_>) -> Verdict {
        let mut errors = Vec::new();
        for c in &self.0 {
            match c.expr.eval(a) {
                Ok(cel::Value::Bool(false)) => return Verdict::NoMatch,
                Ok(cel::Value::Bool(true)) => {}
                Ok(other) => errors.push(format!(
                    "expression '{}' resulted in error: no such overload: returned {}, not a bool",
                    c.expr.source,
                    other.type_of()
                )),
                Err(e) => errors.push(e),
            }
        }
        match errors.len() {
            0 => Verdict::Match,
            1 => Verdict::Error(errors.remove(0)),
            _ => Verdict::Error(format!("[{}]", errors.join(", "))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    fn rule(ops: &[&str], resources: &[&str], scope: Option<&str>) -> Rule {
        let v = |xs: &[&str]| Some(xs.iter().map(|s| s.to_string()).collect());
        Rule::from_api(&RuleWithOperations {
            operations: v(ops),
            api_groups: v(&["demo.kshard.dev"]),
            api_versions: v(&["*"]),
            resources: v(resources),
            scope: scope.map(str::to_string),
        })
    }

    fn req<'a>(op: &'a str, sub: &'a str, ns: &'a str) -> Request<'a> {
        Request {
            operation: op,
            group: "demo.kshard.dev",
            version: "v1",
            resource: "widgets",
            subresource: sub,
            namespace: ns,
        }
    }

    #[test]
    fn rules_match_as_kube_matches_them() {
        let main = rule(&["CREATE"], &["widgets"], None);
        assert!(main.matches(&req("CREATE", "", "default")));
        assert!(!main.matches(&req("UPDATE", "", "default")));
        // `widgets` is the main resource only; `widgets/status` and `*/*` add subresources.
        assert!(!main.matches(&req("CREATE", "status", "default")));
        assert!(rule(&["*"], &["widgets/status"], None).matches(&req("UPDATE", "status", "d")));
        assert!(rule(&["*"], &["*/*"], None).matches(&req("UPDATE", "scale", "d")));
        assert!(rule(&["*"], &["*/scale"], None).matches(&req("UPDATE", "scale", "d")));
        assert!(!rule(&["*"], &["*"], None).matches(&req("UPDATE", "scale", "d")));
        assert!(!rule(&["*"], &["*"], Some("Cluster")).matches(&req("CREATE", "", "d")));
        assert!(rule(&["*"], &["*"], Some("Cluster")).matches(&req("CREATE", "", "")));
        assert!(rule(&["*"], &["*"], Some("Namespaced")).matches(&req("CREATE", "", "d")));
        assert!(!rule(&["*"], &["*"], Some("Bogus")).matches(&req("CREATE", "", "d")));
    }

    #[test]
    fn selectors_match_labels() {
        let sel = Selector::parse(Some(&LabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        }))
        .expect("valid");
        let labels = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(sel.matches(&labels(&[("team", "a")])));
        assert!(!sel.matches(&labels(&[("team", "a"), ("tier", "db")])));
        assert!(!sel.matches(&labels(&[])));
        assert!(Selector::parse(None).expect("empty").matches(&labels(&[])));
        let bad = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "In".into(),
                values: None,
            }]),
            ..Default::default()
        };
        assert!(Selector::parse(Some(&bad)).is_err());
        // Either the object or the old object may match.
        let sel = Selector::parse(Some(&LabelSelector {
            match_labels: Some([("a".to_string(), "1".to_string())].into()),
            ..Default::default()
        }))
        .expect("valid");
        let with = json!({"metadata": {"labels": {"a": "1"}}});
        let without = json!({"metadata": {}});
        assert!(object_selected(&sel, None, Some(&with)));
        assert!(!object_selected(&sel, Some(&without), None));
    }

    #[test]
    fn match_conditions_follow_kube_semantics() {
        let conds = |exprs: &[&str]| {
            Conditions::compile(Some(
                &exprs
                    .iter()
                    .enumerate()
                    .map(|(i, e)| MatchCondition {
                        name: format!("c{i}"),
                        expression: e.to_string(),
                    })
                    .collect(),
            ))
        };
        let obj = json!({"metadata": {"name": "w"}, "spec": {"color": "red"}});
        let request = json!({"operation": "CREATE", "userInfo": {"username": "alice"}});
        let act = Activation::new(&[
            ("object", Some(&obj)),
            ("oldObject", None),
            ("request", Some(&request)),
        ]);
        let eval = |c: &Conditions| c.evaluate(&act);
        assert_eq!(
            eval(&conds(&[
                "object.spec.color == 'red'",
                "request.userInfo.username == 'alice'"
            ])),
            Verdict::Match
        );
        assert_eq!(
            eval(&conds(&[
                "oldObject == null",
                "object.spec.color == 'blue'"
            ])),
            Verdict::NoMatch
        );
        // A false condition wins over an error; an error alone fails.
        assert_eq!(
            eval(&conds(&["object.nope.x == 1", "false"])),
            Verdict::NoMatch
        );
        assert!(matches!(
            eval(&conds(&["object.nope.x == 1"])),
            Verdict::Error(_)
        ));
        assert!(matches!(eval(&conds(&["((("])), Verdict::Error(_)));
    }
}
