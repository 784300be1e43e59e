//! kube's CEL cost limits for `x-kubernetes-validations`: the static checks when a CRD is
//! loaded (apiextensions' `validation.go`) and the runtime budget of one object
//! (`schema/cel/validation.go`), with kube's limits and messages.
//!
//! kube meters the interpreter: cel-go counts the cost of each step and cancels a call
//! past `PerCallLimit`. The `cel` crate's interpreter has no meter, so before a rule runs
//! its cost is *bounded*: the static estimator ([`super::cel_cost`]) is fed the sizes of
//! the actual values (list lengths, string bytes, map sizes) instead of schema maxima.
//! The estimate assumes every iteration runs and every branch is the dearer one, so it is
//! at least what cel-go would count; a rule whose bound is over the per-call limit, or over
//! what is left of the object's budget, is not run at all and answers kube's error. So no
//! object, however large, makes a rule run longer than about `PerCallLimit` cost units.
//! The price: a rule that would stop early (an `exists` whose first item matches) is
//! charged, and may be refused, as if it ran to the end.

use kube_cel::cel::common::ast::IdedExpr;
use serde_json::Value;
use std::cell::OnceCell;

use super::cel_cost::{estimate, Range, SchemaSizes, Sizes, Ty, Var};
use super::cel_decl::{unescape, Decl, MAX_REQUEST_SIZE_BYTES};

/// apiserver's `PerCallLimit`: the most one evaluation of one expression may cost.
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// apiserver's `RuntimeCELCostBudget`: the most all rules of one object may cost.
pub const RUNTIME_BUDGET: i64 = 10_000_000;
/// apiextensions' `StaticEstimatedCostLimit`: one rule's estimate times its cardinality.
pub const STATIC_RULE_LIMIT: u64 = 10_000_000;
/// apiextensions' `StaticEstimatedCRDCostLimit`: the sum over one schema.
pub const STATIC_CRD_LIMIT: u64 = 100_000_000;

pub const OUT_OF_BUDGET: &str =
    "validation failed due to running out of cost budget, no further validation rules will be run";
pub const MESSAGE_OUT_OF_BUDGET: &str =
    "messageExpression evaluation failed due to running out of cost budget, no further validation rules will be run";

/// kube's error when one call passes the per-call limit (cel-go's cancellation text
/// quoted first, then the rule's message or text).
pub fn call_limit_message(rule: &str) -> String {
    format!("'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {rule}")
}

pub fn message_call_limit_message(expr: &str) -> String {
    format!("no further validation rules will be run due to call cost exceeds limit for messageExpression: {expr:?}")
}

/// kube's `getCostErrorMessage`.
pub fn cost_error_message(what: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        // Go's %f: six decimals, so 1.0x never reads as "1.0".
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!("{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)")
}

/// The variables of a CRD rule: `self` and `oldSelf`, both of the node's type.
fn vars(decl: &Decl) -> [Var<'_>; 2] {
    [
        Var {
            name: "self",
            ty: Ty::of(decl),
        },
        Var {
            name: "oldSelf",
            ty: Ty::of(decl),
        },
    ]
}

/// The static estimate of one expression on a node of type `decl` (kube's `MaxCost`).
pub fn static_cost(ast: &IdedExpr, decl: &Decl) -> u64 {
    estimate(ast, &vars(decl), &SchemaSizes { root: decl }).max
}

/// How many times a rule on a node may run per object when no enclosing list or map
/// bounds it (kube's `maxCardinality`: one element per comma of a 3 MiB request).
pub fn unbounded_cardinality(decl: &Decl) -> u64 {
    MAX_REQUEST_SIZE_BYTES / (decl.min_size + 1)
}

/// kube's `multiplyWithOverflowGuard`.
pub fn times_cardinality(cost: u64, cardinality: u64) -> u64 {
    cost.saturating_mul(cardinality)
}

/// The rules' estimated total over one schema, with its most expensive contributors.
#[derive(Debug, Default)]
pub struct TotalCost {
    pub total: u64,
    /// Up to four (field path, cost), dearest first; only rules of 1 % of the limit or more.
    pub most_expensive: Vec<(String, u64)>,
}

impl TotalCost {
    pub fn observe(&mut self, path: String, cost: u64) {
        self.total = self.total.saturating_add(cost);
        if cost < STATIC_CRD_LIMIT / 100 {
            return;
        }
        self.most_expensive.push((path, cost));
        self.most_expensive.sort_by_key(|e| std::cmp::Reverse(e.1));
        self.most_expensive.truncate(4);
    }
}

/// The most work the `cel` crate may do for one call, in cost units: beyond what cel-go
/// counts, it copies `map`/`filter` results at every step. 50 calls' worth keeps one
/// evaluation well under a second.
pub const WORK_LIMIT: u64 = 50 * PER_CALL_LIMIT;

/// Upper bounds of running `ast` on `new` (and `old`): what cel-go would count (what
/// kube's limits and budget see), and the `cel` crate's own work (see [`WORK_LIMIT`]).
pub fn runtime_bounds(ast: &IdedExpr, decl: &Decl, new: &Value, old: Option<&Value>) -> (u64, u64) {
    let mut roots = vec![("self", new)];
    if let Some(old) = old {
        roots.push(("oldSelf", old));
    }
    bounds(ast, &vars(decl), &roots)
}

/// [`runtime_bounds`] for an expression over untyped JSON variables (admission
/// policies and match conditions: `object`, `oldObject`, `request`, `params`, …).
/// Variables not among `roots` (computed ones) are bounded by all the inputs.
pub fn runtime_bounds_of(ast: &IdedExpr, roots: &[(&str, &Value)], others: &[&str]) -> (u64, u64) {
    let vars: Vec<Var<'_>> = roots
        .iter()
        .map(|(name, _)| *name)
        .chain(others.iter().copied())
        .map(|name| Var { name, ty: Ty::Dyn })
        .collect();
    bounds(ast, &vars, roots)
}

fn bounds(ast: &IdedExpr, vars: &[Var<'_>], roots: &[(&str, &Value)]) -> (u64, u64) {
    let mut sizes = ActualSizes {
        roots,
        total: OnceCell::new(),
        work: false,
    };
    let cost = estimate(ast, vars, &sizes).max;
    sizes.work = true;
    let work = estimate(ast, vars, &sizes).max;
    (cost, work)
}

/// Sizes of the values an expression is about to see.
struct ActualSizes<'r, 'v> {
    roots: &'r [(&'r str, &'v Value)],
    total: OnceCell<u64>,
    work: bool,
}

impl Sizes for ActualSizes<'_, '_> {
    fn size(&self, path: &[String]) -> Option<Range> {
        let name = path.first()?;
        let root = self.roots.iter().find(|(n, _)| n == name)?.1;
        let mut max = 0;
        walk(root, &path[1..], &mut max);
        Some(Range { min: 0, max })
    }

    /// A value the estimator cannot trace to an input (a computed string or list) is
    /// bounded by the whole input: the functions that grow strings have result sizes of
    /// their own, so this only stands in for values taken from the input.
    fn fallback(&self) -> Option<Range> {
        let total = *self
            .total
            .get_or_init(|| self.roots.iter().map(|(_, v)| json_size(v)).sum());
        Some(Range { min: 0, max: total })
    }

    fn actual(&self) -> bool {
        true
    }

    fn work(&self) -> bool {
        self.work
    }
}

/// The largest size among the values at `path` under `v`.
fn walk(v: &Value, path: &[String], max: &mut u64) {
    let Some((seg, rest)) = path.split_first() else {
        *max = (*max).max(value_size(v));
        return;
    };
    match (seg.as_str(), v) {
        ("@items", Value::Array(a)) => a.iter().for_each(|x| walk(x, rest, max)),
        ("@values", Value::Object(m)) => m.values().for_each(|x| walk(x, rest, max)),
        ("@keys", Value::Object(m)) if rest.is_empty() => {
            *max = (*max).max(m.keys().map(|k| k.len() as u64).max().unwrap_or(0));
        }
        ("@indices", Value::Array(_)) if rest.is_empty() => *max = (*max).max(1),
        (name, Value::Object(m)) => {
            let x = m.get(name).or_else(|| m.get(&unescape(name)));
            if let Some(x) = x {
                walk(x, rest, max);
            }
        }
        _ => {}
    }
}

/// `size()` of a value as cel-go counts it, in bytes for strings (at least the code
/// points CEL counts); scalars count 1 as cel-go's runtime does.
fn value_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64,
        Value::Array(a) => a.len() as u64,
        Value::Object(m) => m.len() as u64,
        Value::Null => 0,
        _ => 1,
    }
}

/// The bytes of `v` as JSON, about (without escapes).
fn json_size(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.len() as u64 + 2,
        Value::Array(a) => 2 + a.iter().map(|x| json_size(x) + 1).sum::<u64>(),
        Value::Object(m) => {
            2 + m
                .iter()
                .map(|(k, x)| k.len() as u64 + 4 + json_size(x))
                .sum::<u64>()
        }
        Value::Number(n) => n.to_string().len() as u64,
        Value::Bool(_) | Value::Null => 5,
    }
}

/// What is left of one object's runtime budget while its rules run.
#[derive(Debug)]
pub struct Budget {
    pub remaining: i64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            remaining: RUNTIME_BUDGET,
        }
    }
}

impl Budget {
    pub fn exhausted(&self) -> bool {
        self.remaining < 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_are_formatted_as_go_does() {
        assert!(
            cost_error_message("estimated rule cost", 11_000_000, 10_000_000)
                .starts_with("estimated rule cost exceeds budget by factor of 1.100000x (try")
        );
        assert!(
            cost_error_message("estimated rule cost", 25_000_000, 10_000_000)
                .contains("factor of 2.5x")
        );
        assert!(
            cost_error_message("estimated rule cost", u64::MAX, 10_000_000)
                .contains("factor of more than 100x")
        );
    }

    #[test]
    fn most_expensive_keeps_four() {
        let mut t = TotalCost::default();
        for (i, c) in [
            5_000_000u64,
            500,
            9_000_000,
            2_000_000,
            3_000_000,
            1_000_000,
        ]
        .into_iter()
        .enumerate()
        {
            t.observe(format!("r{i}"), c);
        }
        let names: Vec<_> = t.most_expensive.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["r2", "r0", "r4", "r3"]);
        assert_eq!(t.total, 20_000_500);
    }
}
