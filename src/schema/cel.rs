//! `x-kubernetes-validations` rules, compiled and evaluated with the `kube-cel` crate.
//!
//! kube-cel compiles and runs the rules of one schema node (it also handles `message`,
//! `messageExpression`, `optionalOldSelf` and the Kubernetes CEL libraries). We keep the
//! tree walk ourselves because kube's differs from kube-cel's in what matters for errors:
//! `oldSelf` of a list item is the old item with the same keys (list-type map) rather
//! than the same index, additionalProperties children are named `path[key]`, and the
//! field error's value and type follow apiextensions' `cel/validation.go`.

use super::cel_budget::{self, Budget, TotalCost};
use super::cel_decl::{child_multiplicity, Decl};
use super::render::field_value;
use super::structural::Node;
use crate::status::{quote, FieldError, FieldErrorKind};
use kube_cel::cel::common::ast::IdedExpr;
use kube_cel::{CompiledSchema, ErrorKind};
use serde_json::Value;
use std::collections::HashMap;

/// Why a schema's rules cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// A rule does not compile.
    #[error("{0}")]
    Compile(String),
    /// kube's static cost checks refused rules; field paths start at `openAPIV3Schema`.
    #[error("{}", crate::status::aggregate(.0))]
    Cost(Vec<FieldError>),
}

/// One rule of a node, compiled alone so that rules run one at a time under the budget.
struct Rule {
    compiled: CompiledSchema,
    /// The same rule without its `messageExpression`, run when the message could not be
    /// afforded (kube then reports the message's budget error instead).
    bare: Option<CompiledSchema>,
    ast: IdedExpr,
    message: Option<(String, IdedExpr)>,
    /// kube's `ruleErrorString`: the message if any, else the rule.
    label: String,
    transition: bool,
    optional_old_self: bool,
}

/// The rules of one schema subtree, mirroring the schema only where rules exist.
pub struct Rules {
    here: Vec<Rule>,
    /// The node's CEL type and size bounds (kube's DeclType), for runtime cost bounds.
    decl: Option<Decl>,
    type_name: String,
    properties: HashMap<String, Rules>,
    additional: Option<Box<Rules>>,
    items: Option<Box<Rules>>,
    list_type: Option<String>,
    list_map_keys: Vec<String>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("here", &self.here.len())
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The static cost checks' state over one schema.
#[derive(Default)]
struct StaticCheck {
    errors: Vec<FieldError>,
    total: TotalCost,
}

impl Rules {
    /// Compiles every rule of the schema rooted at `n`; `None` when it has no rules.
    /// A rule that does not compile fails the whole schema, as kube rejects such a CRD;
    /// so do rules over kube's estimated cost limits when `cost_checks` is set.
    pub fn compile(n: &Node, cost_checks: bool) -> Result<Option<Rules>, RulesError> {
        let mut check = StaticCheck::default();
        let rules = Rules::build(n, "", "openAPIV3Schema", Some(1), true, &mut check)
            .map_err(RulesError::Compile)?;
        if check.total.total > cel_budget::STATIC_CRD_LIMIT {
            for (path, _) in &check.total.most_expensive {
                check.errors.push(FieldError::forbidden(
                    path.clone(),
                    "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
                ));
            }
            check.errors.push(FieldError::forbidden(
                "openAPIV3Schema",
                cel_budget::cost_error_message(
                    "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                    check.total.total,
                    cel_budget::STATIC_CRD_LIMIT,
                ),
            ));
        }
        if cost_checks && !check.errors.is_empty() {
            return Err(RulesError::Cost(check.errors));
        }
        Ok(rules)
    }

    /// `path` is the data path (`spec.items[*]`), `at` kube's schema field path
    /// (`openAPIV3Schema.properties[spec]`), `cardinality` how many times this node can
    /// occur in one object (`None`: unbounded), as apiextensions' `CELSchemaContext`.
    fn build(
        n: &Node,
        path: &str,
        at: &str,
        cardinality: Option<u64>,
        resource_root: bool,
        check: &mut StaticCheck,
    ) -> Result<Option<Rules>, String> {
        if !n.has_rules_below() {
            return Ok(None);
        }
        let child_cardinality = match (cardinality, child_multiplicity(n)) {
            (Some(c), Some(m)) => Some(cel_budget::times_cardinality(c, m)),
            _ => None,
        };
        // Children first: kube validates a node's subschemas before its own rules.
        let additional = match n.additional_schema() {
            Some(a) => Rules::build(
                a,
                &format!("{path}[*]"),
                &format!("{at}.additionalProperties"),
                child_cardinality,
                a.embedded,
                check,
            )?
            .map(Box::new),
            None => None,
        };
        let mut properties = HashMap::new();
        for (k, p) in &n.properties {
            if let Some(r) = Rules::build(
                p,
                &super::validate::child(path, k),
                &format!("{at}.properties[{k}]"),
                child_cardinality,
                p.embedded,
                check,
            )? {
                properties.insert(k.clone(), r);
            }
        }
        let items = match &n.items {
            Some(i) => Rules::build(
                i,
                &format!("{path}[*]"),
                &format!("{at}.items"),
                child_cardinality,
                i.embedded,
                check,
            )?
            .map(Box::new),
            None => None,
        };
        let decl = Decl::from_node(n, resource_root);
        let here = match &n.rules {
            Some(own) => compile_own(own, path, at, cardinality, decl.as_ref(), check)?,
            None => Vec::new(),
        };
        Ok(Some(Rules {
            here,
            decl,
            type_name: n.type_name().to_string(),
            properties,
            additional,
            items,
            list_type: n.list_type.clone(),
            list_map_keys: n.list_map_keys.clone(),
        }))
    }

    /// Evaluates the rules against `v` (and `old` for transition rules) within `budget`;
    /// once the budget is spent, no further rule runs.
    pub fn validate(
        &self,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        errs: &mut Vec<FieldError>,
        budget: &mut Budget,
    ) {
        if budget.exhausted() {
            return;
        }
        if !self.here.is_empty() {
            self.evaluate(v, old, path, errs, budget);
            if budget.exhausted() {
                return;
            }
        }
        match v {
            Value::Object(m) => {
                let old_map = old.and_then(Value::as_object);
                for (k, x) in m {
                    let old_x = old_map.and_then(|o| o.get(k));
                    if let Some(r) = self.properties.get(k) {
                        r.validate(x, old_x, &super::validate::child(path, k), errs, budget);
                    } else if let Some(r) = &self.additional {
                        r.validate(x, old_x, &format!("{path}[{k}]"), errs, budget);
                    }
                    if budget.exhausted() {
                        return;
                    }
                }
            }
            Value::Array(a) => {
                if let Some(items) = &self.items {
                    let old_list = old.and_then(Value::as_array);
                    for (i, x) in a.iter().enumerate() {
                        let old_x = old_list.and_then(|o| self.correlate(o, x));
                        items.validate(x, old_x, &format!("{path}[{i}]"), errs, budget);
                        if budget.exhausted() {
                            return;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// kube correlates old and new list items only by identity: the list-map keys, or
    /// the value itself in a set. Atomic lists have no `oldSelf` for their items.
    fn correlate<'a>(&self, old: &'a [Value], x: &Value) -> Option<&'a Value> {
        match self.list_type.as_deref() {
            Some("map") => old
                .iter()
                .find(|o| self.list_map_keys.iter().all(|k| o.get(k) == x.get(k))),
            Some("set") => old.iter().find(|o| *o == x),
            _ => None,
        }
    }

    /// A budget error on this node; nothing runs after it.
    fn out_of_budget(
        &self,
        field: String,
        detail: String,
        errs: &mut Vec<FieldError>,
        budget: &mut Budget,
    ) {
        errs.push(FieldError::new(
            FieldErrorKind::Invalid,
            field,
            Some(quote(&self.type_name)),
            detail,
        ));
        budget.remaining = -1;
    }

    /// Runs this node's rules in order, each only after its cost bound on these values
    /// fits the per-call limit and what is left of the budget (kube's order of checks).
    fn evaluate(
        &self,
        v: &Value,
        old: Option<&Value>,
        path: &str,
        errs: &mut Vec<FieldError>,
        budget: &mut Budget,
    ) {
        let here = field_or_nil(path);
        if budget.remaining <= 0 {
            self.out_of_budget(here, cel_budget::OUT_OF_BUDGET.into(), errs, budget);
            return;
        }
        let Some(decl) = &self.decl else {
            return;
        };
        for rule in &self.here {
            if rule.transition && old.is_none() && !rule.optional_old_self {
                continue; // kube-cel skips it too: nothing runs, nothing is charged
            }
            let (cost, work) = cel_budget::runtime_bounds(&rule.ast, decl, v, old);
            if cost > cel_budget::PER_CALL_LIMIT || work > cel_budget::WORK_LIMIT {
                // cel-go stops just past the limit, and then checks the budget first.
                let detail = if cel_budget::PER_CALL_LIMIT as i64 >= budget.remaining {
                    cel_budget::OUT_OF_BUDGET.to_string()
                } else {
                    cel_budget::call_limit_message(&rule.label)
                };
                self.out_of_budget(here, detail, errs, budget);
                return;
            }
            let cost = cost as i64;
            if cost > budget.remaining {
                self.out_of_budget(here, cel_budget::OUT_OF_BUDGET.into(), errs, budget);
                return;
            }
            budget.remaining -= cost;
            // The message runs only when the rule fails; run the rule without it when the
            // message could not be afforded, and answer the message's budget error then.
            let message = rule.message.as_ref().map(|(src, ast)| {
                let (cost, work) = cel_budget::runtime_bounds(ast, decl, v, old);
                (src, cost, work)
            });
            let unaffordable = message.as_ref().and_then(|(src, m, work)| {
                if *m > cel_budget::PER_CALL_LIMIT || *work > cel_budget::WORK_LIMIT {
                    Some(if cel_budget::PER_CALL_LIMIT as i64 >= budget.remaining {
                        cel_budget::MESSAGE_OUT_OF_BUDGET.to_string()
                    } else {
                        cel_budget::message_call_limit_message(src)
                    })
                } else if *m as i64 > budget.remaining {
                    Some(cel_budget::MESSAGE_OUT_OF_BUDGET.to_string())
                } else {
                    None
                }
            });
            match (&unaffordable, &rule.bare) {
                (Some(detail), Some(bare)) => {
                    let Err(failures) = kube_cel::validate_compiled(bare, v, old) else {
                        continue;
                    };
                    if let Some(f) = failures
                        .iter()
                        .find(|f| matches!(f.kind, ErrorKind::ValidationFailure))
                    {
                        let field = failure_field(path, &f.field_path);
                        self.out_of_budget(field, detail.clone(), errs, budget);
                        return;
                    }
                    self.report(failures.iter(), v, path, errs);
                }
                _ => {
                    let Err(failures) = kube_cel::validate_compiled(&rule.compiled, v, old) else {
                        continue;
                    };
                    if let Some((_, m, _)) = message {
                        if failures
                            .iter()
                            .any(|f| matches!(f.kind, ErrorKind::ValidationFailure))
                        {
                            budget.remaining -= m as i64;
                        }
                    }
                    self.report(failures.iter(), v, path, errs);
                }
            }
        }
    }

    fn report<'e>(
        &self,
        failures: impl Iterator<Item = &'e kube_cel::ValidationError>,
        v: &Value,
        path: &str,
        errs: &mut Vec<FieldError>,
    ) {
        // kube omits the value of objects and lists from CEL errors.
        let shown = match v {
            Value::Object(_) | Value::Array(_) => None,
            other => Some(field_value(other)),
        };
        for f in failures {
            let field = failure_field(path, &f.field_path);
            match f.kind {
                ErrorKind::ValidationFailure => {
                    let detail = f.message.trim().to_string();
                    let e = match f.reason.as_deref() {
                        Some("FieldValueForbidden") => FieldError::forbidden(field, detail),
                        Some("FieldValueRequired") => FieldError::required(field, detail),
                        Some("FieldValueDuplicate") => {
                            FieldError::new(FieldErrorKind::Duplicate, field, shown.clone(), "")
                        }
                        _ => FieldError::new(FieldErrorKind::Invalid, field, shown.clone(), detail),
                    };
                    errs.push(e);
                }
                _ => {
                    // Runtime failures: kube prints the schema type as the value.
                    let why = f
                        .message
                        .strip_prefix("rule evaluation error: ")
                        .unwrap_or(&f.message);
                    errs.push(FieldError::new(
                        FieldErrorKind::Invalid,
                        field,
                        Some(quote(&self.type_name)),
                        format!("{why} evaluating rule: {}", f.rule.trim()),
                    ));
                }
            }
        }
    }
}

/// The field of a failure: the node, or the rule's `fieldPath` below it.
fn failure_field(path: &str, field_path: &str) -> String {
    match field_path.trim_start_matches('.') {
        "" => field_or_nil(path),
        rel => super::validate::child(path, rel),
    }
}

/// Compiles a node's rules one by one and runs kube's static cost checks on them.
fn compile_own(
    own: &Value,
    path: &str,
    at: &str,
    cardinality: Option<u64>,
    decl: Option<&Decl>,
    check: &mut StaticCheck,
) -> Result<Vec<Rule>, String> {
    let place = if path.is_empty() { "<root>" } else { path };
    let list = own
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut rules = Vec::with_capacity(list.len());
    for (i, spec) in list.iter().enumerate() {
        let alone = |spec: Value| {
            let mut s = own.clone();
            s["x-kubernetes-validations"] = Value::Array(vec![spec]);
            kube_cel::compile_schema(&s)
        };
        let compiled = alone(spec.clone());
        if let Some(e) = compiled.compilation_errors().first() {
            return Err(format!("{place}: x-kubernetes-validations: {e}"));
        }
        let Some(Ok(result)) = compiled.validations.first() else {
            continue; // an empty rule: kube compiles nothing and runs nothing
        };
        let ast = result.program.expression().clone();
        let transition = result.is_transition_rule;
        let message = result.message_program.as_ref().map(|p| {
            let src = spec
                .get("messageExpression")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            (src, p.expression().clone())
        });
        let text = |k: &str| {
            spec.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .trim()
                .to_string()
        };
        let label = match text("message") {
            m if !m.is_empty() => m,
            _ => text("rule"),
        };
        let optional_old_self = spec
            .get("optionalOldSelf")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let Some(d) = decl {
            let rule_at = format!("{at}.x-kubernetes-validations[{i}]");
            let cost = cel_budget::times_cardinality(
                cel_budget::static_cost(&ast, d),
                cardinality.unwrap_or_else(|| cel_budget::unbounded_cardinality(d)),
            );
            if cost > cel_budget::STATIC_RULE_LIMIT {
                check.errors.push(FieldError::forbidden(
                    format!("{rule_at}.rule"),
                    cel_budget::cost_error_message(
                        "estimated rule cost",
                        cost,
                        cel_budget::STATIC_RULE_LIMIT,
                    ),
                ));
            }
            check.total.observe(format!("{rule_at}.rule"), cost);
            if let Some((_, m)) = &message {
                let cost = cel_budget::static_cost(m, d);
                if cost > cel_budget::STATIC_RULE_LIMIT {
                    check.errors.push(FieldError::forbidden(
                        format!("{rule_at}.messageExpression"),
                        cel_budget::cost_error_message(
                            "estimated messageExpression cost",
                            cost,
                            cel_budget::STATIC_RULE_LIMIT,
                        ),
                    ));
                }
                check
                    .total
                    .observe(format!("{rule_at}.messageExpression"), cost);
            }
        }
        let bare = match &message {
            Some(_) => {
                let mut s = spec.clone();
                if let Some(m) = s.as_object_mut() {
                    m.remove("messageExpression");
                }
                Some(alone(s))
            }
            None => None,
        };
        rules.push(Rule {
            compiled,
            bare,
            ast,
            message,
            label,
            transition,
            optional_old_self,
        });
    }
    Ok(rules)
}

fn field_or_nil(path: &str) -> String {
    if path.is_empty() {
        "<nil>".to_string()
    } else {
        path.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(schema: Value) -> Rules {
        let n = Node::parse(&schema, "").unwrap();
        Rules::compile(&n, true).unwrap().unwrap()
    }

    fn run(r: &Rules, v: Value, old: Option<Value>) -> Vec<String> {
        let mut e = Vec::new();
        r.validate(&v, old.as_ref(), "", &mut e, &mut Budget::default());
        e.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn messages_reasons_and_paths() {
        let r = rules(
            json!({"type":"object","properties":{"spec":{"type":"object",
            "x-kubernetes-validations":[
                {"rule":"self.replicas <= 5","message":"too many replicas"},
                {"rule":"self.replicas != 3"},
                {"rule":"self.replicas != 4","messageExpression":"self.replicas == 4 ? 'got 4' : 'other'","fieldPath":".replicas"},
                {"rule":"self.replicas != 2","message":"no two","reason":"FieldValueForbidden"}],
            "properties":{"replicas":{"type":"integer",
                "x-kubernetes-validations":[{"rule":"self >= 0","message":"must be non-negative"}]}}}}}),
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":1}}), None),
            Vec::<String>::new()
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":7}}), None),
            vec!["spec: Invalid value: too many replicas"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":3}}), None),
            vec!["spec: Invalid value: failed rule: self.replicas != 3"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":4}}), None),
            vec!["spec.replicas: Invalid value: got 4"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":2}}), None),
            vec!["spec: Forbidden: no two"]
        );
        assert_eq!(
            run(&r, json!({"spec":{"replicas":-1}}), None),
            vec!["spec.replicas: Invalid value: -1: must be non-negative"]
        );
    }

    #[test]
    fn transition_rules_use_correlated_old_values() {
        let r = rules(
            json!({"type":"object","properties":{"spec":{"type":"object","properties":{
            "name":{"type":"string","x-kubernetes-validations":[{"rule":"self == oldSelf","message":"name is immutable"}]},
            "ports":{"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["name"],
                "items":{"type":"object","properties":{"name":{"type":"string"},"port":{"type":"integer"}},
                "x-kubernetes-validations":[{"rule":"self.port >= oldSelf.port","message":"port may not decrease"}]}}}}}}),
        );
        // Create: transition rules are skipped.
        assert!(run(
            &r,
            json!({"spec":{"name":"a","ports":[{"name":"x","port":1}]}}),
            None
        )
        .is_empty());
        let old =
            json!({"spec":{"name":"a","ports":[{"name":"x","port":5},{"name":"y","port":5}]}});
        assert_eq!(
            run(
                &r,
                json!({"spec":{"name":"b","ports":[{"name":"y","port":6},{"name":"x","port":4}]}}),
                Some(old)
            ),
            vec![
                r#"spec.name: Invalid value: "b": name is immutable"#,
                "spec.ports[1]: Invalid value: port may not decrease",
            ]
        );
    }

    #[test]
    fn bad_rule_fails_compile() {
        let n = Node::parse(
            &json!({"type":"object","x-kubernetes-validations":[{"rule":"self.("}]}),
            "",
        )
        .unwrap();
        assert!(Rules::compile(&n, true).is_err());
    }

    fn refused(schema: Value) -> Vec<String> {
        let n = Node::parse(&schema, "").unwrap();
        match Rules::compile(&n, true) {
            Err(RulesError::Cost(errs)) => errs.iter().map(|e| e.to_string()).collect(),
            other => panic!("expected cost errors, got {other:?}"),
        }
    }

    const HINT: &str = "(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)";

    #[test]
    fn static_limits_refuse_with_kube_errors() {
        // A quadratic rule over an unbounded list (kube's own test case).
        let list = json!({"type":"object","properties":{"f":{"type":"array",
            "items":{"type":"string"},
            "x-kubernetes-validations":[{"rule":"self.all(x, self.exists_one(y, x.lowerAscii() == y.lowerAscii()))"}]}}});
        assert_eq!(
            refused(list),
            vec![
                format!("openAPIV3Schema.properties[f].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x {HINT}"),
                "openAPIV3Schema.properties[f].x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema".to_string(),
                format!("openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x {HINT}"),
            ]
        );
        // With maxItems and maxLength it loads.
        let bounded = json!({"type":"object","properties":{"f":{"type":"array","maxItems":10,
            "items":{"type":"string","maxLength":10},
            "x-kubernetes-validations":[{"rule":"self.all(x, self.exists_one(y, x.lowerAscii() == y.lowerAscii()))"}]}}});
        assert!(Rules::compile(&Node::parse(&bounded, "").unwrap(), true).is_ok());
        // A string() result has no size bound in cel-go, so concatenating it is unbounded.
        let msg = json!({"type":"object","properties":{"f":{"type":"array","items":{"type":"string"},
            "x-kubernetes-validations":[{"rule":"true","messageExpression":"string(self[0]) + string(self[1]) + string(self[2])"}]}}});
        let errs = refused(msg);
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("openAPIV3Schema.properties[f].x-kubernetes-validations[0].messageExpression: Forbidden: estimated messageExpression cost exceeds budget by factor of more than 100x"));
    }

    #[test]
    fn cardinality_multiplies_cost() {
        // 1000 objects each holding a string of 1 MiB bytes: the rule itself costs
        // ceil((4 * 262144 + 1) * 0.1) * ceil(3 * 0.25) + 1 = 104859, times maxItems 1000.
        let s = json!({"type":"object","properties":{"l":{"type":"array","maxItems":1000,
            "items":{"type":"object","properties":{"s":{"type":"string","maxLength":262144,
            "x-kubernetes-validations":[{"rule":"self.matches('a+b')"}]}}}}}});
        let errs = refused(s);
        assert_eq!(errs[0], format!("openAPIV3Schema.properties[l].items.properties[s].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of 10.5x {HINT}"));
        // Under an unbounded list, kube takes 3 MiB / (min size + 1) occurrences: a string
        // rule's node is at least 2 bytes ("").
        let s = json!({"type":"object","properties":{"l":{"type":"array",
            "items":{"type":"string","maxLength":64,
            "x-kubernetes-validations":[{"rule":"self.matches('^[a-z]+$')"}]}}}});
        // 53 * (3145728 / 3) = 55574528.
        let errs = refused(s);
        assert!(errs[0].contains("factor of 5.6x"), "{errs:?}");
    }

    #[test]
    fn runtime_budget_stops_rules() {
        // Statically 900 * (2 + 1 + 900 * 10 + 2) + 2 = 8104502: under kube's 10M, over
        // the 1M per call, so only the actual sizes decide.
        let r = rules(
            json!({"type":"object","properties":{"l":{"type":"array","maxItems":900,
            "items":{"type":"string","maxLength":10},
            "x-kubernetes-validations":[{"rule":"self.all(x, self.exists(y, x == y))","message":"dup"}]}}}),
        );
        let small: Vec<Value> = (0..10).map(|i| json!(format!("s{i}"))).collect();
        assert!(run(&r, json!({"l": small}), None).is_empty());
        let big: Vec<Value> = (0..900).map(|i| json!(format!("s{i}"))).collect();
        let t = std::time::Instant::now();
        assert_eq!(
            run(&r, json!({"l": big}), None),
            vec!["l: Invalid value: \"array\": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: dup".to_string()]
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn runtime_budget_is_per_object() {
        // Five rules on each of 20 strings (a 30-character regex: factor ceil(7.5) = 8):
        // statically 20 * (ceil(524289 * 0.1) * 8 + 1) = 8388660 each, 42M in all, under
        // kube's limits. On strings of 130000 bytes each call costs 13001 * 8 + 1 = 104009,
        // so the 10M budget lasts 96 calls: the 97th, on item 19, is refused.
        let rule = json!({"rule":"self.matches('^(a|b|c|d|e|f|g|h|i|j|k|l|m)+$')"});
        let r = rules(
            json!({"type":"object","properties":{"l":{"type":"array","maxItems":20,
            "items":{"type":"string","maxLength":131072,
            "x-kubernetes-validations":[rule, rule, rule, rule, rule]}}}}),
        );
        let item = "a".repeat(130_000);
        let items: Vec<Value> = (0..20).map(|_| json!(item)).collect();
        assert_eq!(
            run(&r, json!({"l": items}), None),
            vec!["l[19]: Invalid value: \"string\": validation failed due to running out of cost budget, no further validation rules will be run".to_string()]
        );
    }

    #[test]
    fn rules_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Rules>();
    }
}
#[cfg(test)]
mod interpreter_work {
    use super::*;
    use serde_json::json;

    /// The `cel` crate copies a `map`/`filter` result at every step: over 20000 items
    /// that is 2 * 10^8 copies (25 s in a debug build). cel-go would count only about
    /// 20000 * 14 for it, under kube's per-call limit; kshard refuses it at once.
    #[test]
    fn quadratic_map_is_refused_promptly() {
        let n = Node::parse(
            &json!({"type":"object","properties":{"l":{"type":"array","maxItems":100000,
            "items":{"type":"integer"},
            "x-kubernetes-validations":[{"rule":"self.map(x, x + 1).size() >= 0"}]}}}),
            "",
        )
        .unwrap();
        let r = Rules::compile(&n, true).unwrap().unwrap();
        let small: Vec<Value> = (0..1000).map(|i| json!(i)).collect();
        let mut e = Vec::new();
        r.validate(
            &json!({"l": small}),
            None,
            "",
            &mut e,
            &mut Budget::default(),
        );
        assert!(e.is_empty(), "{e:?}");
        let items: Vec<Value> = (0..20_000).map(|i| json!(i)).collect();
        let t = std::time::Instant::now();
        let mut e = Vec::new();
        r.validate(
            &json!({"l": items}),
            None,
            "",
            &mut e,
            &mut Budget::default(),
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(e.len(), 1);
        assert!(e[0]
            .detail
            .contains("call cost exceeds limit for rule: self.map(x, x + 1).size() >= 0"));
    }
}
