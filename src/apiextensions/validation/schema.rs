//! The OpenAPI schema rules for a definition's `openAPIV3Schema`
//! (apiextensions' `validateCustomResourceDefinitionValidation` and
//! `ValidateCustomResourceDefinitionOpenAPISchema`): supported keywords,
//! where defaults may appear, the `x-kubernetes-*` list and map extensions,
//! and the static checks of `x-kubernetes-validations` rules (the catalog
//! compiles the rules themselves). Properties are walked in sorted order
//! (kube walks a Go map: any order is one of its orders).

use serde_json::{Map, Value};

use super::{invalid_raw, present, render, str_at, structural, Options};
use crate::status::{FieldError, FieldErrorKind};

const TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

/// The internal schema's fields in Go struct order, by their v1 keys (the
/// status-subresource root check walks them in this order).
const FIELD_ORDER: [(&str, &str); 44] = [
    ("id", "ID"),
    ("$schema", "Schema"),
    ("$ref", "Ref"),
    ("description", "Description"),
    ("type", "Type"),
    ("nullable", "Nullable"),
    ("format", "Format"),
    ("title", "Title"),
    ("default", "Default"),
    ("maximum", "Maximum"),
    ("exclusiveMaximum", "ExclusiveMaximum"),
    ("minimum", "Minimum"),
    ("exclusiveMinimum", "ExclusiveMinimum"),
    ("maxLength", "MaxLength"),
    ("minLength", "MinLength"),
    ("pattern", "Pattern"),
    ("maxItems", "MaxItems"),
    ("minItems", "MinItems"),
    ("uniqueItems", "UniqueItems"),
    ("multipleOf", "MultipleOf"),
    ("enum", "Enum"),
    ("maxProperties", "MaxProperties"),
    ("minProperties", "MinProperties"),
    ("required", "Required"),
    ("items", "Items"),
    ("allOf", "AllOf"),
    ("oneOf", "OneOf"),
    ("anyOf", "AnyOf"),
    ("not", "Not"),
    ("properties", "Properties"),
    ("additionalProperties", "AdditionalProperties"),
    ("patternProperties", "PatternProperties"),
    ("dependencies", "Dependencies"),
    ("additionalItems", "AdditionalItems"),
    ("definitions", "Definitions"),
    ("externalDocs", "ExternalDocs"),
    ("example", "Example"),
    (
        "x-kubernetes-preserve-unknown-fields",
        "XPreserveUnknownFields",
    ),
    ("x-kubernetes-embedded-resource", "XEmbeddedResource"),
    ("x-kubernetes-int-or-string", "XIntOrString"),
    ("x-kubernetes-list-map-keys", "XListMapKeys"),
    ("x-kubernetes-list-type", "XListType"),
    ("x-kubernetes-map-type", "XMapType"),
    ("x-kubernetes-validations", "XValidations"),
];

const ROOT_WITH_STATUS: [&str; 22] = [
    "Description",
    "Type",
    "Format",
    "Title",
    "Maximum",
    "ExclusiveMaximum",
    "Minimum",
    "ExclusiveMinimum",
    "MaxLength",
    "MinLength",
    "Pattern",
    "MaxItems",
    "MinItems",
    "UniqueItems",
    "MultipleOf",
    "Required",
    "Items",
    "Properties",
    "ExternalDocs",
    "Example",
    "XPreserveUnknownFields",
    "XValidations",
];

/// Whether a keyword holds a non-zero value in kube's internal schema
/// (false, "" and null are its zero values; a list or map, even empty, is not).
pub(super) fn is_set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn flag(s: &Value, k: &str) -> bool {
    s.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn opt_str<'a>(s: &'a Value, k: &str) -> Option<&'a str> {
    present(s.get(k)).and_then(Value::as_str)
}

fn obj<'a>(s: &'a Value, k: &str) -> Option<&'a Map<String, Value>> {
    s.get(k).and_then(Value::as_object)
}

fn sorted(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut v: Vec<(&String, &Value)> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// The schemas directly below `s`, for walking every node.
fn children(s: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    match s.get("items") {
        Some(i @ Value::Object(_)) => out.push(i),
        Some(Value::Array(a)) => out.extend(a.iter()),
        _ => {}
    }
    for k in ["allOf", "anyOf", "oneOf"] {
        if let Some(a) = s.get(k).and_then(Value::as_array) {
            out.extend(a.iter());
        }
    }
    if let Some(n @ Value::Object(_)) = s.get("not") {
        out.push(n);
    }
    for k in [
        "properties",
        "patternProperties",
        "definitions",
        "dependencies",
    ] {
        if let Some(m) = obj(s, k) {
            out.extend(m.values().filter(|v| v.is_object()));
        }
    }
    for k in ["additionalProperties", "additionalItems"] {
        if let Some(a @ Value::Object(_)) = s.get(k) {
            out.push(a);
        }
    }
    out
}

/// kube's `SchemaHas`: whether any node of the schema matches.
pub(super) fn any_node(s: &Value, pred: &dyn Fn(&Value) -> bool) -> bool {
    pred(s) || children(s).into_iter().any(|c| any_node(c, pred))
}

pub(super) fn has_invalid_type(s: &Value) -> bool {
    opt_str(s, "type").is_some_and(|t| !t.is_empty() && !TYPES.contains(&t))
}

pub(super) fn has_kubernetes_extensions(s: &Value) -> bool {
    flag(s, "x-kubernetes-embedded-resource")
        || present(s.get("x-kubernetes-preserve-unknown-fields")).is_some()
        || flag(s, "x-kubernetes-int-or-string")
        || s.get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        || present(s.get("x-kubernetes-list-type")).is_some()
        || s.get("x-kubernetes-validations")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

/// A `set` list whose items are not atomic (kube's `hasNonAtomicSetType`).
pub(super) fn has_non_atomic_set_type(s: &Value) -> bool {
    if opt_str(s, "x-kubernetes-list-type") != Some("set") {
        return false;
    }
    let Some(items) = s.get("items").filter(|i| i.is_object()) else {
        return false;
    };
    match str_at(items, "type") {
        "array" => opt_str(items, "x-kubernetes-list-type").is_some_and(|t| t != "atomic"),
        "object" => opt_str(items, "x-kubernetes-map-type") != Some("atomic"),
        _ => false,
    }
}

/// How defaults and embedded resources are judged below a node (kube's
/// `specStandardValidatorV3`).
#[derive(Clone)]
struct Scope {
    allow_defaults: bool,
    disallow_reason: String,
    inside_meta: bool,
    require_valid_type: bool,
}

impl Scope {
    fn forbid_defaults(&self, reason: String) -> Scope {
        Scope {
            allow_defaults: false,
            disallow_reason: reason,
            ..self.clone()
        }
    }
}

/// Validates one `schema` (a v1 `CustomResourceValidation`) found at `at`
/// (`spec.validation` or `spec.versions[i].schema`).
pub(super) fn validate(
    v: &Value,
    at: &str,
    status_enabled: bool,
    opts: &Options,
    errs: &mut Vec<FieldError>,
) {
    let Some(s) = present(v.get("openAPIV3Schema")) else {
        return;
    };
    let sp = format!("{at}.openAPIV3Schema");
    let mut local = Vec::new();
    if status_enabled {
        // The status schema is cut out of properties[status]: what else
        // sits at the root would be lost for it.
        for (key, go) in FIELD_ORDER {
            if !is_set(s.get(key)) {
                continue;
            }
            if go == "Type" {
                let t = str_at(s, "type");
                if t != "object" {
                    local.push(FieldError::invalid(
                        format!("{sp}.type"),
                        t,
                        r#"only "object" is allowed as the type at the root of the schema if the status subresource is enabled"#,
                    ));
                    break;
                }
                continue;
            }
            if !ROOT_WITH_STATUS.contains(&go) {
                local.push(invalid_raw(
                    &sp,
                    render::schema(s),
                    format!(
                        "only [{}] fields are allowed at the root of the schema if the status subresource is enabled",
                        ROOT_WITH_STATUS.join(" ")
                    ),
                ));
                break;
            }
        }
    }
    if flag(s, "nullable") {
        local.push(FieldError::forbidden(
            format!("{sp}.nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let mut init_errs = Vec::new();
    if opts.require_structural {
        match structural::unsupported(s) {
            Some(reason) => init_errs.push(FieldError::invalid(&sp, "", reason)),
            None => local.extend(structural::validate(s, &sp)),
        }
    }
    let scope = Scope {
        allow_defaults: true,
        disallow_reason: String::new(),
        inside_meta: false,
        require_valid_type: opts.require_valid_property_type,
    };
    node(s, &sp, &scope, true, opts, &mut local);
    // kube shows why the schema is not structural only when nothing else
    // (which usually says the same) was found.
    if local.is_empty() {
        local.extend(init_errs);
    }
    errs.extend(local);
}

/// A default must be a value its own schema accepts (kube validates each
/// default against the schema it sits in: an `enum` without `""` refuses a
/// `default: ""`, at `<node>.default<path inside the default>`). A node
/// that does not parse is left to the structural checks, which say why.
fn default_fits(s: &Value, d: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let Ok(node) = crate::schema::structural::Node::parse(s, at) else {
        return;
    };
    crate::schema::validate::value(&node, d, &format!("{at}.default"), errs);
}

/// The keywords kube does not support (`specStandardValidatorV3.validate`).
fn keywords(s: &Value, at: &str, scope: &Scope, errs: &mut Vec<FieldError>) {
    let t = str_at(s, "type");
    if scope.require_valid_type && !t.is_empty() && !TYPES.contains(&t) {
        errs.push(FieldError::not_supported(format!("{at}.type"), t, &TYPES));
    }
    if present(s.get("default")).is_some() && !scope.allow_defaults {
        let mut detail = "must not be set".to_string();
        if !scope.disallow_reason.is_empty() {
            detail.push(' ');
            detail.push_str(&scope.disallow_reason);
        }
        errs.push(FieldError::forbidden(format!("{at}.default"), detail));
    }
    if let Some(d) = present(s.get("default")).filter(|_| scope.allow_defaults) {
        default_fits(s, d, at, errs);
    }
    if !str_at(s, "id").is_empty() {
        errs.push(FieldError::forbidden(
            format!("{at}.id"),
            "id is not supported",
        ));
    }
    if present(s.get("additionalItems")).is_some() {
        errs.push(FieldError::forbidden(
            format!("{at}.additionalItems"),
            "additionalItems is not supported",
        ));
    }
    if obj(s, "patternProperties").is_some_and(|m| !m.is_empty()) {
        errs.push(FieldError::forbidden(
            format!("{at}.patternProperties"),
            "patternProperties is not supported",
        ));
    }
    if obj(s, "definitions").is_some_and(|m| !m.is_empty()) {
        errs.push(FieldError::forbidden(
            format!("{at}.definitions"),
            "definitions is not supported",
        ));
    }
    if present(s.get("dependencies")).is_some() {
        errs.push(FieldError::forbidden(
            format!("{at}.dependencies"),
            "dependencies is not supported",
        ));
    }
    if present(s.get("$ref")).is_some() {
        errs.push(FieldError::forbidden(
            format!("{at}.$ref"),
            "$ref is not supported",
        ));
    }
    if t == "null" {
        errs.push(FieldError::forbidden(
            format!("{at}.type"),
            "type cannot be set to null, use nullable as an alternative",
        ));
    }
    if s.get("items")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        errs.push(FieldError::forbidden(
            format!("{at}.items"),
            "items must be a schema object and not an array",
        ));
    }
    if scope.inside_meta && flag(s, "x-kubernetes-embedded-resource") {
        errs.push(FieldError::forbidden(
            format!("{at}.x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }
}

/// `ValidateCustomResourceDefinitionOpenAPISchema` for one node and below.
fn node(
    s: &Value,
    at: &str,
    scope: &Scope,
    is_root: bool,
    opts: &Options,
    errs: &mut Vec<FieldError>,
) {
    if !s.is_object() {
        return;
    }
    keywords(s, at, scope, errs);
    if flag(s, "uniqueItems") {
        errs.push(FieldError::forbidden(
            format!("{at}.uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    let props = obj(s, "properties").filter(|m| !m.is_empty());
    if let Some(ap) = present(s.get("additionalProperties")) {
        // Properties are for structs, additionalProperties for maps.
        if props.is_some() && (ap == &Value::Bool(false) || ap.is_object()) {
            errs.push(FieldError::forbidden(
                format!("{at}.additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        let sub = if scope.inside_meta {
            // Pruning without a value is ambiguous for metadata maps.
            scope.forbid_defaults("inside additionalProperties applying to object metadata".into())
        } else {
            scope.clone()
        };
        if ap.is_object() {
            node(
                ap,
                &format!("{at}.additionalProperties"),
                &sub,
                false,
                opts,
                errs,
            );
        }
    }
    let embedded = flag(s, "x-kubernetes-embedded-resource");
    for (k, p) in props.map(sorted).unwrap_or_default() {
        let mut sub = scope.clone();
        if (is_root || embedded) && matches!(k.as_str(), "metadata" | "kind" | "apiVersion") {
            sub.inside_meta = true;
            if is_root {
                sub = sub.forbid_defaults(format!("in top-level {k}"));
            }
        }
        node(p, &format!("{at}.properties[{k}]"), &sub, false, opts, errs);
    }
    if let Some(n) = present(s.get("not")) {
        node(n, &format!("{at}.not"), scope, false, opts, errs);
    }
    for k in ["allOf", "oneOf", "anyOf"] {
        for (i, c) in s
            .get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            node(c, &format!("{at}.{k}[{i}]"), scope, false, opts, errs);
        }
    }
    for (k, d) in obj(s, "definitions").map(sorted).unwrap_or_default() {
        node(
            d,
            &format!("{at}.definitions[{k}]"),
            scope,
            false,
            opts,
            errs,
        );
    }
    match s.get("items") {
        Some(i @ Value::Object(_)) => node(i, &format!("{at}.items"), scope, false, opts, errs),
        Some(Value::Array(a)) => {
            for (i, c) in a.iter().enumerate() {
                node(c, &format!("{at}.items[{i}]"), scope, false, opts, errs);
            }
        }
        _ => {}
    }
    for (k, d) in obj(s, "dependencies").map(sorted).unwrap_or_default() {
        if d.is_object() {
            node(
                d,
                &format!("{at}.dependencies[{k}]"),
                scope,
                false,
                opts,
                errs,
            );
        }
    }
    extensions(s, at, opts, errs);
    rules(s, at, errs);
}

/// The `x-kubernetes-*` extension rules of one node.
fn extensions(s: &Value, at: &str, opts: &Options, errs: &mut Vec<FieldError>) {
    let t = str_at(s, "type");
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        errs.push(invalid_raw(
            format!("{at}.x-kubernetes-preserve-unknown-fields"),
            "false".into(),
            "must be true or undefined",
        ));
    }
    let map_type = opt_str(s, "x-kubernetes-map-type");
    if map_type.is_some() && t != "object" {
        let msg = "must be object if x-kubernetes-map-type is specified";
        errs.push(type_error(at, t, msg));
    }
    if let Some(m) = map_type.filter(|m| *m != "atomic" && *m != "granular") {
        errs.push(FieldError::not_supported(
            format!("{at}.x-kubernetes-map-type"),
            m,
            &["atomic", "granular"],
        ));
    }
    let list_type = opt_str(s, "x-kubernetes-list-type");
    let items = s.get("items").filter(|i| i.is_object());
    if list_type.is_some() && t != "array" {
        errs.push(type_error(
            at,
            t,
            "must be array if x-kubernetes-list-type is specified",
        ));
    } else if opts.require_atomic_set_type && list_type == Some("set") {
        if let Some(is) = items {
            let msg = "must be atomic as item of a list with x-kubernetes-list-type=set";
            // kube prints the item's list type for either problem.
            let shown = match opt_str(is, "x-kubernetes-list-type") {
                Some(l) => render::go_string(l),
                None => "null".into(),
            };
            match str_at(is, "type") {
                "array" if opt_str(is, "x-kubernetes-list-type").is_some_and(|l| l != "atomic") => {
                    errs.push(invalid_raw(
                        format!("{at}.items.x-kubernetes-list-type"),
                        shown,
                        msg,
                    ));
                }
                "object" if opt_str(is, "x-kubernetes-map-type") != Some("atomic") => {
                    errs.push(invalid_raw(
                        format!("{at}.items.x-kubernetes-map-type"),
                        shown,
                        msg,
                    ));
                }
                _ => {}
            }
        }
    }
    if let Some(l) = list_type.filter(|l| !matches!(*l, "atomic" | "set" | "map")) {
        errs.push(FieldError::not_supported(
            format!("{at}.x-kubernetes-list-type"),
            l,
            &["atomic", "set", "map"],
        ));
    }
    let keys: Vec<&str> = s
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|k| k.as_str().unwrap_or_default()).collect())
        .unwrap_or_default();
    let keys_shown = || render::string_list(s.get("x-kubernetes-list-map-keys"));
    if !keys.is_empty() {
        match list_type {
            None => errs.push(FieldError::required(
                format!("{at}.x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some("map") => {}
            Some(l) => errs.push(FieldError::invalid(
                format!("{at}.x-kubernetes-list-type"),
                l,
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
        }
    }
    if list_type == Some("map") {
        if keys.is_empty() {
            errs.push(FieldError::required(
                format!("{at}.x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match present(s.get("items")) {
            None => errs.push(FieldError::required(
                format!("{at}.items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(Value::Object(_)) => {}
            Some(other) => errs.push(invalid_raw(
                format!("{at}.items"),
                render::props_or_array(Some(other)),
                "must only have a single schema if x-kubernetes-list-type is map",
            )),
        }
        if let Some(is) = items {
            let it = str_at(is, "type");
            if it != "object" {
                errs.push(FieldError::invalid(
                    format!("{at}.items.type"),
                    it,
                    "must be object if parent array's x-kubernetes-list-type is map",
                ));
            } else {
                let mut seen = Vec::new();
                for k in &keys {
                    match is.get("properties").and_then(|p| p.get(*k)) {
                        Some(p) => {
                            if matches!(str_at(p, "type"), "array" | "object") {
                                // kube prints the item's type here.
                                errs.push(FieldError::invalid(
                                    format!("{at}.items.properties[{k}].type"),
                                    it,
                                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                                ));
                            }
                        }
                        None => errs.push(invalid_raw(
                            format!("{at}.x-kubernetes-list-map-keys"),
                            keys_shown(),
                            "entries must all be names of item properties",
                        )),
                    }
                    if seen.contains(k) {
                        errs.push(invalid_raw(
                            format!("{at}.x-kubernetes-list-map-keys"),
                            keys_shown(),
                            "must not contain duplicate entries",
                        ));
                    }
                    seen.push(*k);
                }
            }
        }
    }
    if opts.require_map_list_keys_map_set {
        map_list_keys_map_set(s, at, errs);
    }
}

fn type_error(at: &str, t: &str, msg: &str) -> FieldError {
    if t.is_empty() {
        FieldError::required(format!("{at}.type"), msg)
    } else {
        FieldError::invalid(format!("{at}.type"), t, msg)
    }
}

/// `validateMapListKeysMapSet`: set and map items, and map keys, must be
/// present to be compared.
pub(super) fn map_list_keys_map_set(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let Some(is) = s.get("items").filter(|i| i.is_object()) else {
        return;
    };
    let Some(lt) = opt_str(s, "x-kubernetes-list-type").filter(|l| matches!(*l, "set" | "map"))
    else {
        return;
    };
    if flag(is, "nullable") {
        errs.push(FieldError::forbidden(
            format!("{at}.items.nullable"),
            format!("cannot be nullable when x-kubernetes-list-type is {lt}"),
        ));
    }
    if lt != "map" {
        return;
    }
    let required: Vec<&str> = is
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for k in s
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let Some(p) = is.get("properties").and_then(|p| p.get(k)) else {
            continue;
        };
        if !required.contains(&k) && present(p.get("default")).is_none() {
            errs.push(FieldError::required(
                format!("{at}.items.properties[{k}].default"),
                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ));
        }
        if flag(p, "nullable") {
            errs.push(FieldError::forbidden(
                format!("{at}.items.properties[{k}].nullable"),
                "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
            ));
        }
    }
}

fn has_newlines(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

const RULE_REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// The static checks of `x-kubernetes-validations` entries.
fn rules(s: &Value, at: &str, errs: &mut Vec<FieldError>) {
    let Some(list) = s.get("x-kubernetes-validations").and_then(Value::as_array) else {
        return;
    };
    for (i, r) in list.iter().enumerate() {
        let p = format!("{at}.x-kubernetes-validations[{i}]");
        let rule = str_at(r, "rule");
        let message = str_at(r, "message");
        let (rule_t, msg_t) = (rule.trim(), message.trim());
        if rule_t.is_empty() {
            errs.push(FieldError::required(
                format!("{p}.rule"),
                "rule is not specified",
            ));
        } else if !message.is_empty() && msg_t.is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.message"),
                message,
                "must be non-empty if specified",
            ));
        } else if has_newlines(msg_t) {
            errs.push(FieldError::invalid(
                format!("{p}.message"),
                message,
                "must not contain line breaks",
            ));
        } else if has_newlines(rule_t) && msg_t.is_empty() {
            errs.push(FieldError::required(
                format!("{p}.message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        let expr = str_at(r, "messageExpression");
        if !expr.is_empty() && expr.trim().is_empty() {
            errs.push(FieldError::required(
                format!("{p}.messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        if let Some(reason) = opt_str(r, "reason").filter(|x| !RULE_REASONS.contains(x)) {
            errs.push(FieldError::not_supported(
                format!("{p}.reason"),
                reason,
                &RULE_REASONS,
            ));
        }
        let fp = str_at(r, "fieldPath");
        if !fp.is_empty() && fp.trim().is_empty() {
            errs.push(FieldError::invalid(
                format!("{p}.fieldPath"),
                fp,
                "must be non-empty if specified",
            ));
        }
        if has_newlines(fp) {
            errs.push(FieldError::invalid(
                format!("{p}.fieldPath"),
                fp,
                "must not contain line breaks",
            ));
        }
        if !fp.is_empty() && structural::unsupported(s).is_none() {
            let valid = structural::field_path_with_arrays(fp, Some(s)).is_ok();
            if !valid {
                errs.push(FieldError::new(
                    FieldErrorKind::Invalid,
                    format!("{p}.fieldPath"),
                    Some(crate::status::quote(fp)),
                    "must be a valid path",
                ));
            }
        }
    }
}
