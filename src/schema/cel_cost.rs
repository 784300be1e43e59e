//! The worst-case cost of a CEL expression, in cel-go's cost units, computed over the
//! parsed AST the way cel-go's `checker.Cost` does with kube's `library.CostEstimator`
//! (so the figures are kube's: 1 per identifier, select and O(1) call, 0.1 per string
//! byte traversed, comprehensions multiply their body by the range's size, …).
//!
//! cel-go estimates over a type-checked AST; the `cel` crate has no checker, so this
//! module infers the few types the model needs (which overload, whether a select is on a
//! map or object, whether a value is scalar) from the schema and the expression itself,
//! and where a type stays unknown (`dyn`) takes the most expensive candidate overload.
//!
//! Sizes come from a [`Sizes`] source: schema bounds when a CRD is loaded (the static
//! estimate kube checks), or the sizes of the actual values when a rule is about to run
//! (an upper bound of what running it costs, see `cel_budget`).
//!
//! One file (about 1,200 lines before its tests): it mirrors cel-go's `checker/cost.go`,
//! one match arm per function overload, and splitting that table would scatter one lookup.

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use std::collections::HashMap;

use super::cel_decl::{Decl, DeclKind};

/// A `[min, max]` range of sizes or costs; arithmetic saturates as cel-go's does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
}

impl Range {
    pub const UNKNOWN: Range = Range {
        min: 0,
        max: u64::MAX,
    };
    pub const ZERO: Range = Range { min: 0, max: 0 };

    pub fn fixed(n: u64) -> Range {
        Range { min: n, max: n }
    }
    pub fn plus(self, o: Range) -> Range {
        Range {
            min: self.min.saturating_add(o.min),
            max: self.max.saturating_add(o.max),
        }
    }
    pub fn times(self, o: Range) -> Range {
        Range {
            min: self.min.saturating_mul(o.min),
            max: self.max.saturating_mul(o.max),
        }
    }
    pub fn union(self, o: Range) -> Range {
        Range {
            min: self.min.min(o.min),
            max: self.max.max(o.max),
        }
    }
    /// cel-go's `MultiplyByCostFactor`: each bound times `f`, rounded up.
    pub fn factor(self, f: f64) -> Range {
        Range {
            min: mul_factor(self.min, f),
            max: mul_factor(self.max, f),
        }
    }
}

fn mul_factor(x: u64, f: f64) -> u64 {
    let xf = x as f64;
    if xf > 0.0 && f > 0.0 && xf > u64::MAX as f64 / f {
        return u64::MAX;
    }
    let c = (xf * f).ceil();
    if c >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        c as u64
    }
}

/// cel-go's cost constants (`common/cost.go`).
const STRING_TRAVERSAL: f64 = 0.1;
const REGEX_LENGTH: f64 = 0.25;
const LIST_CREATE: u64 = 10;
const MAP_CREATE: u64 = 30;
const STRUCT_CREATE: u64 = 40;
/// kube's `MaxNameFormatRegexSize`, for `format.<name>().validate()`.
const MAX_NAME_FORMAT_REGEX: f64 = 128.0;

/// The types the cost model distinguishes.
#[derive(Debug, Clone, PartialEq)]
pub enum Ty<'a> {
    Dyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    Type,
    List(Box<Ty<'a>>),
    Map(Box<Ty<'a>>, Box<Ty<'a>>),
    /// A schema object (a CEL struct).
    Object(&'a Decl),
    /// Kubernetes library types (`Quantity`, `URL`, `IP`, `CIDR`, `Semver`, `Format`, …).
    Opaque(&'static str),
    Optional(Box<Ty<'a>>),
}

impl<'a> Ty<'a> {
    pub fn of(d: &'a Decl) -> Ty<'a> {
        match &d.kind {
            DeclKind::Object(_) => Ty::Object(d),
            DeclKind::List(e) => Ty::List(Box::new(Ty::of(e))),
            DeclKind::Map(e) => Ty::Map(Box::new(Ty::String), Box::new(Ty::of(e))),
            DeclKind::String => Ty::String,
            DeclKind::Bytes => Ty::Bytes,
            DeclKind::Int => Ty::Int,
            DeclKind::Double => Ty::Double,
            DeclKind::Bool => Ty::Bool,
            DeclKind::Duration => Ty::Duration,
            DeclKind::Timestamp => Ty::Timestamp,
            DeclKind::IntOrString => Ty::Dyn,
        }
    }

    /// cel-go's `isScalar`: a size known without looking at the value.
    fn is_scalar(&self) -> bool {
        match self {
            Ty::Bool | Ty::Double | Ty::Duration | Ty::Int | Ty::Timestamp | Ty::Uint => true,
            Ty::Optional(t) => t.is_scalar(),
            _ => false,
        }
    }

    fn is_stringish(&self) -> bool {
        matches!(self, Ty::String | Ty::Bytes)
    }

    /// The first type parameter (list element, map key), as cel-go's `Parameters()[0]`.
    fn first_param(&self) -> Option<Ty<'a>> {
        match self {
            Ty::List(e) => Some((**e).clone()),
            Ty::Map(k, _) => Some((**k).clone()),
            _ => None,
        }
    }

    fn elem(&self) -> Ty<'a> {
        match self {
            Ty::List(e) => (**e).clone(),
            Ty::Map(_, v) => (**v).clone(),
            _ => Ty::Dyn,
        }
    }
}

/// Where sizes of values reached from variables come from. A path is a variable name
/// followed by field names (CEL-escaped), `@items`, `@values`, `@keys` or `@indices`.
pub trait Sizes {
    /// The size range of the values at `path`, or `None` when this source cannot tell.
    fn size(&self, path: &[String]) -> Option<Range>;
    /// The size assumed where nothing else is known; `None` = unbounded (cel-go's
    /// unknown estimate).
    fn fallback(&self) -> Option<Range> {
        None
    }
    /// Whether sizes are actual values rather than schema bounds: then some results cel-go
    /// leaves unknown are bounded by their input (a `split` item is no longer than the
    /// string split), so a bound of a real evaluation stays finite.
    fn actual(&self) -> bool {
        false
    }
    /// Whether to bound the `cel` crate's own work rather than cel-go's cost: it builds a
    /// `map`/`filter` result by copying the list so far at every step (quadratic), where
    /// cel-go appends in place.
    fn work(&self) -> bool {
        false
    }
}

/// Schema bounds, as kube's `sizeEstimator` reads them: the first path element (whatever
/// variable) stands for the rule's node, the rest walks the declaration.
pub struct SchemaSizes<'a> {
    pub root: &'a Decl,
}

impl Sizes for SchemaSizes<'_> {
    fn size(&self, path: &[String]) -> Option<Range> {
        let mut cur = self.root;
        for seg in path.iter().skip(1) {
            cur = match seg.as_str() {
                "@items" | "@values" => cur.elem()?,
                // Map keys are plain strings without a bound (`MaxElements` 0).
                "@keys" => return matches!(cur.kind, DeclKind::Map(_)).then_some(Range::ZERO),
                name => cur.field(name)?,
            };
        }
        Some(Range {
            min: 0,
            max: cur.max_elements,
        })
    }
}

/// One variable visible to an expression.
pub struct Var<'a> {
    pub name: &'a str,
    pub ty: Ty<'a>,
}

#[derive(Debug, Clone)]
struct EntrySize {
    list: bool,
    key: Range,
    val: Range,
}

impl EntrySize {
    fn union(a: Option<EntrySize>, b: Option<EntrySize>) -> Option<EntrySize> {
        let (a, b) = (a?, b?);
        Some(EntrySize {
            list: a.list,
            key: a.key.union(b.key),
            val: a.val.union(b.val),
        })
    }
}

#[derive(Debug, Clone)]
struct Local<'a> {
    path: Vec<String>,
    size: Option<Range>,
    entry: Option<EntrySize>,
    ty: Ty<'a>,
}

/// What the estimator knows about an evaluated operand (cel-go's `AstNode`).
struct Operand<'a> {
    path: Vec<String>,
    ty: Ty<'a>,
    size: Option<Range>,
}

/// Estimates `expr`'s cost range with the variables `vars` and sizes from `sizes`.
pub fn estimate(expr: &IdedExpr, vars: &[Var<'_>], sizes: &dyn Sizes) -> Range {
    let mut c = Coster {
        vars,
        sizes,
        paths: HashMap::new(),
        types: HashMap::new(),
        computed: HashMap::new(),
        entries: HashMap::new(),
        locals: HashMap::new(),
    };
    c.cost(expr)
}

struct Coster<'v, 'a> {
    vars: &'v [Var<'a>],
    sizes: &'v dyn Sizes,
    paths: HashMap<u64, Vec<String>>,
    types: HashMap<u64, Ty<'a>>,
    computed: HashMap<u64, Range>,
    entries: HashMap<u64, EntrySize>,
    locals: HashMap<String, Vec<Local<'a>>>,
}

fn is_accumulator(name: &str) -> bool {
    name == "@result" || name == "__result__" || name == "@__result__"
}

impl<'v, 'a> Coster<'v, 'a> {
    fn ty(&self, e: &IdedExpr) -> Ty<'a> {
        self.types.get(&e.id).cloned().unwrap_or(Ty::Dyn)
    }

    fn path(&self, e: &IdedExpr) -> Vec<String> {
        if let Expr::Ident(name) = &e.expr {
            if let Some(l) = self.local(name) {
                return l.path.clone();
            }
        }
        self.paths.get(&e.id).cloned().unwrap_or_default()
    }

    fn local(&self, name: &str) -> Option<&Local<'a>> {
        self.locals.get(name).and_then(|s| s.last())
    }

    fn push_local(&mut self, name: &str, l: Local<'a>) {
        self.locals.entry(name.to_string()).or_default().push(l);
    }

    fn pop_local(&mut self, name: &str) {
        if let Some(s) = self.locals.get_mut(name) {
            s.pop();
        }
    }

    /// cel-go's `computeSize`: recorded sizes, literal sizes, the size source by path,
    /// scalar types, then a local variable's size.
    fn size(&mut self, e: &IdedExpr) -> Option<Range> {
        if let Some(s) = self.computed.get(&e.id) {
            return Some(*s);
        }
        if let Some(s) = literal_size(e) {
            return Some(s);
        }
        let path = self.path(e);
        if !path.is_empty() {
            if let Some(s) = self.sizes.size(&path) {
                self.computed.insert(e.id, s);
                return Some(s);
            }
        }
        if self.ty(e).is_scalar() {
            return Some(Range::fixed(1));
        }
        if let Expr::Ident(name) = &e.expr {
            if let Some(s) = self.local(name).and_then(|l| l.size) {
                return Some(s);
            }
        }
        None
    }

    fn size_or_unknown(&mut self, e: &IdedExpr) -> Range {
        match self.size(e) {
            Some(s) => s,
            None => self.sizes.fallback().unwrap_or(Range::UNKNOWN),
        }
    }

    fn entry(&self, e: &IdedExpr) -> Option<EntrySize> {
        if let Some(s) = self.entries.get(&e.id) {
            return Some(s.clone());
        }
        if let Expr::Ident(name) = &e.expr {
            return self.local(name).and_then(|l| l.entry.clone());
        }
        None
    }

    fn operand(&mut self, e: &IdedExpr) -> Operand<'a> {
        let mut path = self.path(e);
        if path.first().is_some_and(|p| is_accumulator(p)) {
            path.clear();
        }
        Operand {
            path,
            ty: self.ty(e),
            size: self.size(e),
        }
    }

    /// kube's `sizeEstimate` of an operand: its computed size, else by its path.
    fn operand_size(&self, o: &Operand<'a>) -> Range {
        if let Some(s) = o.size {
            return s;
        }
        if !o.path.is_empty() {
            if let Some(s) = self.sizes.size(&o.path) {
                return s;
            }
        }
        self.sizes.fallback().unwrap_or(Range::UNKNOWN)
    }

    fn cost(&mut self, e: &IdedExpr) -> Range {
        match &e.expr {
            Expr::Literal(l) => {
                self.types.insert(e.id, literal_type(l));
                Range::ZERO
            }
            Expr::Ident(name) => {
                let (path, ty) = match self.local(name) {
                    Some(l) => (l.path.clone(), l.ty.clone()),
                    None => {
                        let ty = self
                            .vars
                            .iter()
                            .find(|v| v.name == name)
                            .map(|v| v.ty.clone())
                            .unwrap_or(Ty::Dyn);
                        (vec![name.clone()], ty)
                    }
                };
                self.paths.insert(e.id, path);
                self.types.insert(e.id, ty);
                Range::fixed(1)
            }
            Expr::Select(sel) => {
                if sel.test {
                    // has(): its operand only. cel-go charges the presence
                    // test one unit since v0.17.7, but kube's base
                    // environment turns that off (PresenceTestHasCost(false))
                    // for the estimator and the runtime alike; the real API
                    // server accepts rules that charging it would refuse.
                    let c = self.cost(&sel.operand);
                    self.types.insert(e.id, Ty::Bool);
                    return c;
                }
                let mut c = self.cost(&sel.operand);
                let operand = self.ty(&sel.operand);
                if matches!(operand, Ty::Map(..) | Ty::Object(_)) {
                    c = c.plus(Range::fixed(1));
                }
                let ty = match &operand {
                    Ty::Object(d) => d.field(&sel.field).map(Ty::of).unwrap_or(Ty::Dyn),
                    Ty::Map(_, v) => (**v).clone(),
                    _ => Ty::Dyn,
                };
                let mut path = self.path(&sel.operand);
                path.push(sel.field.clone());
                self.paths.insert(e.id, path);
                self.types.insert(e.id, ty);
                c
            }
            Expr::Call(_) => self.call(e),
            Expr::List(list) => {
                let mut sum = Range::ZERO;
                let mut item = Range {
                    min: if list.elements.is_empty() {
                        0
                    } else {
                        u64::MAX
                    },
                    max: 0,
                };
                let mut elem_ty: Option<Ty<'a>> = None;
                for x in &list.elements {
                    sum = sum.plus(self.cost(x));
                    item = item.union(self.size_or_unknown(x));
                    elem_ty = Some(join_types(elem_ty, self.ty(x)));
                }
                self.entries.insert(
                    e.id,
                    EntrySize {
                        list: true,
                        key: Range::fixed(1),
                        val: item,
                    },
                );
                self.types
                    .insert(e.id, Ty::List(Box::new(elem_ty.unwrap_or(Ty::Dyn))));
                sum.plus(Range::fixed(LIST_CREATE))
            }
            Expr::Map(map) => {
                let mut sum = Range::ZERO;
                let empty = map.entries.is_empty();
                let start = Range {
                    min: if empty { 0 } else { u64::MAX },
                    max: 0,
                };
                let (mut key, mut val) = (start, start);
                let (mut kt, mut vt): (Option<Ty<'a>>, Option<Ty<'a>>) = (None, None);
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        sum = sum.plus(self.cost(&m.key)).plus(self.cost(&m.value));
                        key = key.union(self.size_or_unknown(&m.key));
                        val = val.union(self.size_or_unknown(&m.value));
                        kt = Some(join_types(kt, self.ty(&m.key)));
                        vt = Some(join_types(vt, self.ty(&m.value)));
                    }
                }
                self.entries.insert(
                    e.id,
                    EntrySize {
                        list: false,
                        key,
                        val,
                    },
                );
                self.types.insert(
                    e.id,
                    Ty::Map(
                        Box::new(kt.unwrap_or(Ty::Dyn)),
                        Box::new(vt.unwrap_or(Ty::Dyn)),
                    ),
                );
                sum.plus(Range::fixed(MAP_CREATE))
            }
            Expr::Struct(s) => {
                let mut sum = Range::ZERO;
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        sum = sum.plus(self.cost(&f.value));
                    }
                }
                sum.plus(Range::fixed(STRUCT_CREATE))
            }
            Expr::Comprehension(_) => self.comprehension(e),
            Expr::Unspecified => Range::ZERO,
        }
    }

    fn comprehension(&mut self, e: &IdedExpr) -> Range {
        let Expr::Comprehension(comp) = &e.expr else {
            return Range::ZERO;
        };
        let bind = matches!(&comp.iter_range.expr, Expr::List(l) if l.elements.is_empty())
            && matches!(&comp.loop_cond.expr, Expr::Literal(LiteralValue::Boolean(b)) if !**b)
            && !is_accumulator(&comp.accu_var);
        let mut sum = self.cost(&comp.iter_range);
        sum = sum.plus(self.cost(&comp.accu_init));
        let accu = Local {
            path: self.path(&comp.accu_init),
            size: self.size(&comp.accu_init),
            entry: self.entry(&comp.accu_init),
            ty: self.ty(&comp.accu_init),
        };
        self.push_local(&comp.accu_var, accu);
        if bind {
            // cel.bind(): the result once, with the bound variable.
            sum = sum.plus(self.cost(&comp.result));
            self.pop_local(&comp.accu_var);
            if let Some(s) = self.size(&comp.result) {
                self.computed.insert(e.id, s);
            }
            if let Some(en) = self.entry(&comp.result) {
                self.entries.insert(e.id, en);
            }
            let t = self.ty(&comp.result);
            self.types.insert(e.id, t);
            return sum;
        }
        let range_entry = self.entry(&comp.iter_range);
        let range_ty = self.ty(&comp.iter_range);
        let is_list = match &range_entry {
            Some(en) => en.list,
            None => !matches!(range_ty, Ty::Map(..)),
        };
        let range_path = self.path(&comp.iter_range);
        let with = |seg: &str| {
            let mut p = range_path.clone();
            p.push(seg.to_string());
            p
        };
        let key_ty = match &range_ty {
            Ty::Map(k, _) => (**k).clone(),
            Ty::List(_) => Ty::Int,
            _ => Ty::Dyn,
        };
        let runtime_item = self.runtime_item_size(&comp.iter_range);
        match &comp.iter_var2 {
            Some(v2) => {
                let (key_seg, val_seg) = if is_list {
                    ("@indices", "@items")
                } else {
                    ("@keys", "@values")
                };
                let key = Local {
                    path: with(key_seg),
                    size: range_entry.as_ref().map(|en| en.key),
                    entry: None,
                    ty: key_ty,
                };
                let val = Local {
                    path: with(val_seg),
                    size: range_entry.as_ref().map(|en| en.val).or(runtime_item),
                    entry: None,
                    ty: range_ty.elem(),
                };
                self.push_local(&comp.iter_var, key);
                self.push_local(v2, val);
            }
            None => {
                let single = if is_list {
                    Local {
                        path: with("@items"),
                        size: range_entry.as_ref().map(|en| en.val).or(runtime_item),
                        entry: None,
                        ty: range_ty.elem(),
                    }
                } else {
                    Local {
                        path: with("@keys"),
                        size: range_entry.as_ref().map(|en| en.key),
                        entry: None,
                        ty: range_ty.first_param().unwrap_or(Ty::Dyn),
                    }
                };
                self.push_local(&comp.iter_var, single);
            }
        }
        let loop_cost = self.cost(&comp.loop_cond);
        let step_cost = self.cost(&comp.loop_step);
        // An accumulator that starts as an empty list takes the step's element type.
        let step_ty = self.ty(&comp.loop_step);
        if let Some(l) = self
            .locals
            .get_mut(&comp.accu_var)
            .and_then(|s| s.last_mut())
        {
            if matches!(l.ty, Ty::List(_) | Ty::Map(..) | Ty::Dyn) && step_ty != Ty::Dyn {
                l.ty = step_ty;
            }
        }
        self.pop_local(&comp.iter_var);
        if let Some(v2) = &comp.iter_var2 {
            self.pop_local(v2);
        }
        sum = sum.plus(self.cost(&comp.result));
        let result_ty = self.ty(&comp.result);
        self.pop_local(&comp.accu_var);
        self.types.insert(e.id, result_ty);
        let count = self.size_or_unknown(&comp.iter_range);
        sum = sum.plus(count.times(step_cost.plus(loop_cost)));
        if self.sizes.work() && matches!(comp.accu_init.expr, Expr::List(_) | Expr::Map(_)) {
            sum = sum.plus(count.times(count));
        }
        match &comp.accu_init.expr {
            Expr::Literal(_) => {
                if let Some(s) = self.size(&comp.accu_init) {
                    self.computed.insert(e.id, s);
                }
            }
            Expr::List(_) | Expr::Map(_) => {
                self.computed.insert(e.id, count);
                if let Some(en) = self.entry(&comp.loop_step) {
                    self.entries.insert(e.id, en);
                }
            }
            _ => {}
        }
        sum
    }

    /// With actual sizes, an item of a computed list (a `split` result, …) is no longer
    /// than the list's own recorded item bound; cel-go leaves it unknown.
    fn runtime_item_size(&self, range: &IdedExpr) -> Option<Range> {
        if !self.sizes.actual() {
            return None;
        }
        self.entries.get(&range.id).map(|en| en.val)
    }

    fn call(&mut self, e: &IdedExpr) -> Range {
        let Expr::Call(call) = &e.expr else {
            return Range::ZERO;
        };
        let name = call.func_name.as_str();
        if name == "dyn" && call.args.len() == 1 && call.target.is_none() {
            let c = self.cost(&call.args[0]);
            if let Some(s) = self.size(&call.args[0]) {
                self.computed.insert(e.id, s);
            }
            if let Some(en) = self.entry(&call.args[0]) {
                self.entries.insert(e.id, en);
            }
            self.types.insert(e.id, Ty::Dyn);
            return Range::fixed(1).plus(c);
        }
        let mut arg_costs = Vec::with_capacity(call.args.len());
        let mut args = Vec::with_capacity(call.args.len());
        for a in &call.args {
            arg_costs.push(self.cost(a));
            args.push(self.operand(a));
        }
        let mut sum = Range::ZERO;
        let target = match &call.target {
            Some(t) => {
                sum = sum.plus(self.cost(t));
                Some(self.operand(t))
            }
            None => None,
        };
        let ty = result_type(name, target.as_ref(), &args);
        self.types.insert(e.id, ty);
        let (fn_cost, mut result) =
            self.function_cost(e, name, target.as_ref(), &args, &arg_costs, &call.args);
        if name == "_[_]" || name == "_[?_]" {
            if let Some(container) = call.args.first() {
                let seg = match args[0].ty {
                    Ty::Map(..) => "@values",
                    _ => "@items",
                };
                result = self.entry(container).map(|en| en.val);
                let mut p = self.path(container);
                p.push(seg.to_string());
                self.paths.insert(e.id, p);
            }
        }
        if result.is_none() {
            result = self.size(e);
        }
        if let Some(r) = result {
            self.computed.insert(e.id, r);
        }
        sum.plus(fn_cost)
    }

    /// The cost of one call (with its arguments, not its target) and its result size:
    /// kube's `EstimateCallCost` first, then cel-go's built-in overloads, else 1.
    fn function_cost(
        &mut self,
        e: &IdedExpr,
        name: &str,
        target: Option<&Operand<'a>>,
        args: &[Operand<'a>],
        arg_costs: &[Range],
        arg_exprs: &[IdedExpr],
    ) -> (Range, Option<Range>) {
        let a = arg_costs.iter().fold(Range::ZERO, |s, c| s.plus(*c));
        let one = Range::fixed(1).plus(a);
        let sz = |s: &Self, o: &Operand<'a>| s.operand_size(o);
        let st = STRING_TRAVERSAL;
        match (name, target, args.len()) {
            // kube's library (`library/cost.go`).
            ("check", _, _) => return (Range::fixed(350_000).plus(a), None),
            (
                "serviceAccount" | "path" | "group" | "resource" | "subresource" | "namespace"
                | "name" | "allowed" | "reason" | "error" | "errored",
                _,
                _,
            ) => return (one, None),
            ("isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf", Some(t), _) => {
                let n = sz(self, t);
                return match t.ty.first_param() {
                    Some(el) => {
                        let mut el_cost = Range::fixed(1);
                        if el.is_stringish() {
                            let es = self.element_size(t);
                            el_cost = el_cost.plus(es.factor(st));
                        }
                        (n.times(el_cost).plus(a), None)
                    }
                    None => (n.factor(st).plus(a), None),
                };
            }
            ("url" | "jsonpatch.escapeKey", _, 1) => {
                let s = sz(self, &args[0]);
                return (s.factor(st).plus(a), Some(s));
            }
            ("lowerAscii" | "upperAscii" | "substring" | "trim", Some(t), _) => {
                let s = sz(self, t);
                return (s.factor(st).plus(a), Some(s));
            }
            ("replace", Some(t), n) if n >= 2 => {
                let s = sz(self, t);
                let from = sz(self, &args[0]);
                let with = sz(self, &args[1]);
                let size = replace_size(s, from, with);
                return (s.factor(2.0 * st).plus(a), Some(size));
            }
            ("split", Some(t), n) => {
                let s = sz(self, t);
                let mut max = s.max;
                if n > 1 {
                    if let Expr::Literal(LiteralValue::Int(i)) = &arg_exprs[1].expr {
                        max = (**i).max(0) as u64;
                    }
                }
                if self.sizes.actual() {
                    self.entries.insert(
                        e.id,
                        EntrySize {
                            list: true,
                            key: Range::fixed(1),
                            val: Range { min: 0, max: s.max },
                        },
                    );
                }
                return (s.factor(2.0 * st).plus(a), Some(Range { min: 0, max }));
            }
            ("join", Some(t), n) => {
                let list = sz(self, t);
                let mut size = Range::ZERO;
                if t.ty.first_param().is_some() {
                    size = list.times(self.element_size(t));
                }
                if n > 0 {
                    let sep = sz(self, &args[0]);
                    let seps = Range {
                        min: list.min.saturating_sub(1),
                        max: list.max.saturating_sub(1),
                    };
                    size = size.plus(sep.times(seps));
                }
                return (size.factor(st).plus(a), Some(size));
            }
            ("find" | "findAll", Some(t), n) if n >= 1 => {
                let s = sz(self, t);
                let str_cost = s.plus(Range::fixed(1)).factor(st);
                let re = sz(self, &args[0]).factor(REGEX_LENGTH);
                return (
                    str_cost.times(re).plus(a),
                    Some(Range { min: 0, max: s.max }),
                );
            }
            (
                "cidr" | "isIP" | "isCIDR" | "quantity" | "isQuantity" | "semver" | "isSemver",
                _,
                n,
            ) if n >= 1 => {
                return (sz(self, &args[0]).factor(st).plus(a), None);
            }
            ("ip", Some(_), 0) => return (one, None),
            ("ip", _, n) if n >= 1 => return (sz(self, &args[0]).factor(st).plus(a), None),
            ("ip.isCanonical", _, n) if n >= 1 => {
                return (sz(self, &args[0]).factor(2.0 * st).plus(a), None)
            }
            (
                "masked"
                | "prefixLength"
                | "family"
                | "isUnspecified"
                | "isLoopback"
                | "isLinkLocalMulticast"
                | "isLinkLocalUnicast"
                | "isGlobalUnicast"
                | "format.named"
                | "sign"
                | "asInteger"
                | "isInteger"
                | "asApproximateFloat"
                | "isGreaterThan"
                | "isLessThan"
                | "compareTo"
                | "add"
                | "sub"
                | "major"
                | "minor"
                | "patch"
                | "getScheme"
                | "getHostname"
                | "getHost"
                | "getPort"
                | "getEscapedPath"
                | "getQuery",
                _,
                _,
            ) => return (one, None),
            ("containsIP", _, n) if n >= 1 => {
                let ip = Range { min: 4, max: 16 };
                let mut c = ip.plus(ip).factor(st);
                if args[0].ty == Ty::String {
                    c = c.plus(sz(self, &args[0]).factor(st));
                }
                return (c.plus(a), None);
            }
            ("containsCIDR", _, n) if n >= 1 => {
                let ip = Range { min: 4, max: 16 };
                let mut c = ip
                    .plus(ip)
                    .factor(st)
                    .plus(ip.factor(st))
                    .plus(Range::fixed(1));
                if args[0].ty == Ty::String {
                    c = c.plus(sz(self, &args[0]).factor(st));
                }
                return (c.plus(a), None);
            }
            ("validate", _, n) if n >= 1 => {
                let c = sz(self, &args[0])
                    .factor(st)
                    .factor(MAX_NAME_FORMAT_REGEX * REGEX_LENGTH);
                return (c.plus(a), None);
            }
            ("_==_" | "_!=_", None, 2) => {
                if let (Ty::Opaque(l), Ty::Opaque(r)) = (&args[0].ty, &args[1].ty) {
                    if l == r {
                        return (one, None);
                    }
                }
            }
            _ => {}
        }
        // cel-go's built-in overloads (`checker/cost.go`).
        match (name, target, args.len()) {
            ("format", Some(t), _) => (sz(self, t).factor(st).plus(a), None),
            ("bytes", None, 1) if args[0].ty != Ty::Bytes => {
                let s = sz(self, &args[0]);
                let size = Range {
                    min: s.min,
                    max: s.max.saturating_mul(4),
                };
                (s.factor(st).plus(a), Some(size))
            }
            ("string", None, 1) if args[0].ty == Ty::Bytes => {
                let s = sz(self, &args[0]);
                (
                    s.factor(st).plus(a),
                    Some(Range {
                        min: s.min / 4,
                        max: s.max,
                    }),
                )
            }
            ("strings.quote", None, 1) => {
                let s = sz(self, &args[0]);
                let size = Range {
                    min: s.min.saturating_add(2),
                    max: s.max.saturating_mul(2).saturating_add(2),
                };
                (s.factor(st).plus(a), Some(size))
            }
            ("startsWith" | "endsWith", Some(_), 1) => {
                (sz(self, &args[0]).factor(st).plus(a), None)
            }
            ("@in", None, 2) => {
                let list = sz(self, &args[1]).factor(1.0).plus(a);
                match args[1].ty {
                    Ty::List(_) => (list, None),
                    Ty::Map(..) => (one, None),
                    _ => (list.union(one), None),
                }
            }
            ("matches", Some(t), 1) => {
                let str_cost = sz(self, t).plus(Range::fixed(1)).factor(st);
                let re = sz(self, &args[0]).factor(REGEX_LENGTH);
                (str_cost.times(re).plus(a), None)
            }
            ("contains", Some(t), 1) if matches!(t.ty, Ty::String | Ty::Dyn) => {
                let c = sz(self, t).factor(st).times(sz(self, &args[0]).factor(st));
                (c.plus(a), None)
            }
            ("_&&_" | "_||_", None, 2) => {
                let (l, r) = (arg_costs[0], arg_costs[1]);
                (
                    Range {
                        min: l.min,
                        max: l.plus(r).max,
                    },
                    None,
                )
            }
            ("_?_:_", None, 3) => {
                let size = self
                    .size_or_unknown(&arg_exprs[1])
                    .union(self.size_or_unknown(&arg_exprs[2]));
                if let Some(en) =
                    EntrySize::union(self.entry(&arg_exprs[1]), self.entry(&arg_exprs[2]))
                {
                    self.entries.insert(e.id, en);
                }
                (
                    arg_costs[0].plus(arg_costs[1].union(arg_costs[2])),
                    Some(size),
                )
            }
            ("_+_", None, 2) => {
                let (l, r) = (&args[0].ty, &args[1].ty);
                let stringy = l.is_stringish() || r.is_stringish();
                let listy = matches!(l, Ty::List(_)) || matches!(r, Ty::List(_));
                let dynamic = *l == Ty::Dyn && *r == Ty::Dyn;
                if !(stringy || listy || dynamic) {
                    return (one, None);
                }
                let size = sz(self, &args[0]).plus(sz(self, &args[1]));
                if let Some(en) =
                    EntrySize::union(self.entry(&arg_exprs[0]), self.entry(&arg_exprs[1]))
                {
                    self.entries.insert(e.id, en);
                }
                let string_cost = size.factor(st).plus(a);
                let c = if listy {
                    one
                } else if stringy {
                    string_cost
                } else {
                    one.union(string_cost)
                };
                (c, Some(size))
            }
            ("_<_" | "_>_" | "_<=_" | "_>=_" | "_==_" | "_!=_", None, 2) => {
                let (l, r) = (sz(self, &args[0]), sz(self, &args[1]));
                let smallest = l.max.min(r.max);
                let sized = Range {
                    min: u64::from(smallest > 0),
                    max: smallest,
                }
                .factor(st)
                .plus(a);
                if name == "_==_" || name == "_!=_" {
                    return (sized, None);
                }
                let (lt, rt) = (&args[0].ty, &args[1].ty);
                if lt.is_stringish() || rt.is_stringish() {
                    (sized, None)
                } else if *lt == Ty::Dyn && *rt == Ty::Dyn {
                    (sized.union(one), None)
                } else {
                    (one, None)
                }
            }
            _ => (one, None),
        }
    }

    /// The size of a list's elements, by the list's path (kube's `listElementNode`).
    fn element_size(&self, list: &Operand<'a>) -> Range {
        if !list.path.is_empty() {
            let mut p = list.path.clone();
            p.push("@items".to_string());
            if let Some(s) = self.sizes.size(&p) {
                return s;
            }
        }
        self.sizes.fallback().unwrap_or(Range::UNKNOWN)
    }
}

fn literal_size(e: &IdedExpr) -> Option<Range> {
    let n = match &e.expr {
        Expr::Literal(l) => match l {
            LiteralValue::String(s) => s.inner().chars().count() as u64,
            LiteralValue::Bytes(b) => b.inner().len() as u64,
            _ => 1,
        },
        Expr::List(l) => l.elements.len() as u64,
        Expr::Map(m) => m.entries.len() as u64,
        _ => return None,
    };
    Some(Range::fixed(n))
}

fn literal_type<'a>(l: &LiteralValue) -> Ty<'a> {
    match l {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::Null => Ty::Null,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) => Ty::Uint,
    }
}

/// The common type of two list or map members: the same type, else `dyn`.
fn join_types<'a>(acc: Option<Ty<'a>>, t: Ty<'a>) -> Ty<'a> {
    match acc {
        None => t,
        Some(a) if a == t => a,
        Some(Ty::Dyn) => t,
        Some(_) if t == Ty::Dyn => Ty::Dyn,
        Some(_) => Ty::Dyn,
    }
}

/// kube's size bound of `replace()`'s result.
fn replace_size(s: Range, from: Range, with: Range) -> Range {
    let mut count = Range::ZERO;
    let mut kept = Range::ZERO;
    if from.min == 0 {
        count.max = if s.max < u64::MAX { s.max + 1 } else { s.max };
        kept.max = s.max;
    } else if with.max <= from.min {
        kept.max = s.max;
    } else {
        count.max = (s.max as f64 / from.min as f64).ceil() as u64;
    }
    if from.max == 0 {
        count.min = if s.min < u64::MAX { s.min + 1 } else { s.min };
        kept.min = s.min;
    } else if from.max <= with.min {
        kept.min = s.min;
    } else {
        count.min = (s.min as f64 / from.max as f64).ceil() as u64;
    }
    count.times(with).plus(kept)
}

/// The result type of a call, as far as the cost model needs it.
fn result_type<'a>(name: &str, target: Option<&Operand<'a>>, args: &[Operand<'a>]) -> Ty<'a> {
    let first = || args.first().map(|a| a.ty.clone()).unwrap_or(Ty::Dyn);
    match name {
        "_==_"
        | "_!=_"
        | "_<_"
        | "_>_"
        | "_<=_"
        | "_>=_"
        | "_&&_"
        | "_||_"
        | "!_"
        | "@in"
        | "@not_strictly_false"
        | "matches"
        | "contains"
        | "startsWith"
        | "endsWith"
        | "exists"
        | "all"
        | "isSorted"
        | "isIP"
        | "isCIDR"
        | "isQuantity"
        | "isSemver"
        | "isURL"
        | "isInteger"
        | "isGreaterThan"
        | "isLessThan"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast"
        | "containsIP"
        | "containsCIDR"
        | "ip.isCanonical"
        | "allowed"
        | "errored"
        | "hasValue"
        | "sets.contains"
        | "sets.equivalent"
        | "sets.intersects"
        | "bool" => Ty::Bool,
        "size" | "indexOf" | "lastIndexOf" | "int" | "sign" | "asInteger" | "compareTo"
        | "prefixLength" | "family" | "major" | "minor" | "patch" | "getFullYear" | "getMonth"
        | "getDate" | "getDayOfMonth" | "getDayOfWeek" | "getDayOfYear" | "getHours"
        | "getMinutes" | "getSeconds" | "getMilliseconds" => Ty::Int,
        "uint" => Ty::Uint,
        "double" | "asApproximateFloat" => Ty::Double,
        "string"
        | "lowerAscii"
        | "upperAscii"
        | "trim"
        | "substring"
        | "replace"
        | "format"
        | "join"
        | "find"
        | "charAt"
        | "reverse"
        | "strings.quote"
        | "getScheme"
        | "getHostname"
        | "getHost"
        | "getPort"
        | "getEscapedPath"
        | "reason"
        | "base64.encode"
        | "jsonpatch.escapeKey" => Ty::String,
        "bytes" | "base64.decode" => Ty::Bytes,
        "duration" => Ty::Duration,
        "timestamp" => Ty::Timestamp,
        "type" => Ty::Type,
        "split" | "findAll" => Ty::List(Box::new(Ty::String)),
        "getQuery" => Ty::Map(
            Box::new(Ty::String),
            Box::new(Ty::List(Box::new(Ty::String))),
        ),
        "quantity" | "add" | "sub" => Ty::Opaque("Quantity"),
        "url" => Ty::Opaque("URL"),
        "ip" => Ty::Opaque("IP"),
        "cidr" | "masked" => Ty::Opaque("CIDR"),
        "semver" => Ty::Opaque("Semver"),
        "_[_]" => first().elem(),
        "_?_:_" => {
            let (t, f) = (
                args.get(1).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn),
                args.get(2).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn),
            );
            join_types(Some(t), f)
        }
        "_+_" | "_-_" | "_*_" | "_/_" | "_%_" => {
            let (l, r) = (
                first(),
                args.get(1).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn),
            );
            match (&l, &r) {
                (Ty::List(le), Ty::List(re)) => {
                    Ty::List(Box::new(join_types(Some((**le).clone()), (**re).clone())))
                }
                (Ty::Timestamp, Ty::Timestamp) if name == "_-_" => Ty::Duration,
                (Ty::Dyn, other) | (other, Ty::Dyn) => other.clone(),
                _ => l,
            }
        }
        "-_" => first(),
        "sum" | "max" | "min" => target.map(|t| t.ty.elem()).unwrap_or_else(first),
        "dyn" => Ty::Dyn,
        "optional.of" | "optional.ofNonZeroValue" => Ty::Optional(Box::new(first())),
        "value" | "orValue" => match target.map(|t| &t.ty) {
            Some(Ty::Optional(t)) => (**t).clone(),
            _ => Ty::Dyn,
        },
        _ => Ty::Dyn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::structural::Node;
    use kube_cel::cel::parser::Parser;
    use serde_json::{json, Value};

    /// The static estimate of `rule` on a node with `schema` (kube's `cr.MaxCost`).
    pub(crate) fn cost(schema: Value, rule: &str) -> u64 {
        let n = Node::parse(&schema, "").unwrap();
        let d = Decl::from_node(&n, false).unwrap();
        let ast = Parser::new().parse(rule).unwrap();
        let vars = [
            Var {
                name: "self",
                ty: Ty::of(&d),
            },
            Var {
                name: "oldSelf",
                ty: Ty::of(&d),
            },
        ];
        estimate(&ast, &vars, &SchemaSizes { root: &d }).max
    }

    fn strings(max_items: Option<u64>, max_length: Option<u64>) -> Value {
        let mut items = json!({"type":"string"});
        if let Some(l) = max_length {
            items["maxLength"] = json!(l);
        }
        let mut s = json!({"type":"array","items":items});
        if let Some(m) = max_items {
            s["maxItems"] = json!(m);
        }
        s
    }

    // Figures derived by hand from cel-go's checker/cost.go and kube's library/cost.go
    // with kube's DeclType sizes (see each comment).
    #[test]
    fn scalar_rules() {
        let obj = json!({"type":"object","properties":{
            "replicas":{"type":"integer"},"name":{"type":"string","maxLength":10}}});
        // self (1) + select (1) + literal (0) + `>` on ints (1).
        assert_eq!(cost(obj.clone(), "self.replicas > 0"), 3);
        // String equality: min(40, 3) * 0.1 rounded up = 1, + 2 for self.name.
        assert_eq!(cost(obj.clone(), "self.name == 'abc'"), 3);
        // has(): self (1); the presence test itself is free in kube.
        assert_eq!(cost(obj.clone(), "has(self.name)"), 1);
        // size(): 1 + self.name (2).
        assert_eq!(cost(obj, "self.name.size() < 5"), 4);
    }

    #[test]
    fn comprehensions() {
        // all over 10 strings of maxLength 5 (20 bytes): range 1 + init 0 + result 1 +
        // 10 * (cond 2 + step (1 + startsWith: ceil(0.1) + x 1 = 2) ) = 2 + 10*5 = 52.
        assert_eq!(
            cost(strings(Some(10), Some(5)), "self.all(x, x.startsWith('a'))"),
            52
        );
        // exists adds the `!` in its condition: 2 + 10 * 6 = 62.
        assert_eq!(
            cost(
                strings(Some(10), Some(5)),
                "self.exists(x, x.startsWith('a'))"
            ),
            62
        );
        // Quadratic over an unbounded list is far beyond any limit.
        let c = cost(strings(None, None), "self.all(x, self.exists(y, x == y))");
        assert!(c > 1_000_000_000, "{c}");
        // Bounded: inner exists = 1 + 1 + 10 * (3 + 1 + (ceil(20*0.1)=2 + 2)) = 82;
        // all = 1 + 1 + 10 * (2 + 1 + 82) = 852.
        assert_eq!(
            cost(
                strings(Some(10), Some(5)),
                "self.all(x, self.exists(y, x == y))"
            ),
            852
        );
    }

    #[test]
    fn unbounded_list_size() {
        // size() does not depend on the size: 1 + self.
        assert_eq!(cost(strings(None, None), "self.size() < 10"), 3);
        // all over an unbounded list of strings: 1048575 items * (cond 2 + step 1 + `!=` 1) + 2.
        assert_eq!(
            cost(strings(None, None), "self.all(x, x != '')"),
            1_048_575 * 4 + 2
        );
    }

    #[test]
    fn regex_and_strings() {
        let s = json!({"type":"string","maxLength":64});
        // matches: ceil((256 + 1) * 0.1) = 26 times ceil(len('^[a-z]+$')=8 * 0.25) = 2 → 52 + self 1.
        assert_eq!(cost(s.clone(), "self.matches('^[a-z]+$')"), 53);
        // Unbounded string: ceil(3145727 * 0.1) = 314573 * 2 + 1.
        assert_eq!(
            cost(json!({"type":"string"}), "self.matches('^[a-z]+$')"),
            629_147
        );
        // lowerAscii: ceil(256 * 0.1) = 26, then == on the result (256 vs 1): 1, + self 1.
        assert_eq!(cost(s.clone(), "self.lowerAscii() == 'a'"), 28);
        // contains: ceil(25.6) * ceil(0.3) = 26 + self.
        assert_eq!(cost(s, "self.contains('abc')"), 27);
    }

    #[test]
    fn map_and_filter() {
        // map: range 1 + init 10 + result 1 + 10 * (step: 1 + accu 1 + list 10 + x 1) = 142.
        assert_eq!(
            cost(strings(Some(10), Some(5)), "self.map(x, x).size() > 0"),
            142 + 2
        );
        // filter: range 1 + init 10 + result 1 + 10 * (pred + 13) with pred `x == 'a'` = 1 + 1.
        assert_eq!(
            cost(
                strings(Some(10), Some(5)),
                "self.filter(x, x == 'a').size() > 0"
            ),
            162 + 2
        );
    }
}
