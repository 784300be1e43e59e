//! Bad values printed as kube prints them in CRD validation errors: a
//! `field.Error` JSON-encodes any value that is not a string, number or bool,
//! and the values kube passes are its *internal* apiextensions types, which
//! carry no JSON tags: Go field names, in struct order, zero values included.
//! The internal form is what `spec` becomes once converted from v1 (see
//! [`super::Spec`]).

use serde_json::{Map, Value};

use crate::schema::render::go_json;

/// encoding/json's string form: HTML-sensitive characters escaped too.
pub fn go_string(s: &str) -> String {
    let plain = serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""));
    plain
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn opt_str(v: Option<&Value>) -> String {
    match v.and_then(Value::as_str) {
        Some(s) => go_string(s),
        None => "null".into(),
    }
}

fn str_or_empty(v: Option<&Value>) -> String {
    go_string(v.and_then(Value::as_str).unwrap_or_default())
}

fn bool_of(v: Option<&Value>) -> String {
    v.and_then(Value::as_bool).unwrap_or(false).to_string()
}

fn raw_or_null(v: Option<&Value>) -> String {
    match v {
        Some(x) if !x.is_null() => go_json(x),
        _ => "null".into(),
    }
}

/// A `[]string` (nil when absent).
pub fn string_list(v: Option<&Value>) -> String {
    match v.and_then(Value::as_array) {
        Some(a) => {
            let parts: Vec<String> = a.iter().map(|s| str_or_empty(Some(s))).collect();
            format!("[{}]", parts.join(","))
        }
        None => "null".into(),
    }
}

fn list_of(v: Option<&Value>, each: fn(&Value) -> String) -> String {
    match v.and_then(Value::as_array) {
        Some(a) => {
            let parts: Vec<String> = a.iter().map(each).collect();
            format!("[{}]", parts.join(","))
        }
        None => "null".into(),
    }
}

fn map_of(v: Option<&Value>, each: fn(&Value) -> String) -> String {
    match v.and_then(Value::as_object) {
        Some(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", go_string(k), each(&m[k.as_str()])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        None => "null".into(),
    }
}

fn opt_schema(v: Option<&Value>) -> String {
    match v {
        Some(s) if s.is_object() => schema(s),
        _ => "null".into(),
    }
}

fn props_or_bool(v: Option<&Value>) -> String {
    match v {
        Some(Value::Bool(b)) => format!("{{\"Allows\":{b},\"Schema\":null}}"),
        Some(s @ Value::Object(_)) => format!("{{\"Allows\":true,\"Schema\":{}}}", schema(s)),
        _ => "null".into(),
    }
}

/// `*JSONSchemaPropsOrArray`.
pub fn props_or_array(v: Option<&Value>) -> String {
    match v {
        Some(s @ Value::Object(_)) => format!("{{\"Schema\":{},\"JSONSchemas\":null}}", schema(s)),
        Some(a @ Value::Array(_)) => {
            format!(
                "{{\"Schema\":null,\"JSONSchemas\":{}}}",
                list_of(Some(a), schema)
            )
        }
        _ => "null".into(),
    }
}

fn dependency(v: &Value) -> String {
    match v {
        Value::Array(_) => format!("{{\"Schema\":null,\"Property\":{}}}", string_list(Some(v))),
        s => format!("{{\"Schema\":{},\"Property\":null}}", opt_schema(Some(s))),
    }
}

fn rule(v: &Value) -> String {
    format!(
        "{{\"Rule\":{},\"Message\":{},\"MessageExpression\":{},\"Reason\":{},\"FieldPath\":{},\"OptionalOldSelf\":{}}}",
        str_or_empty(v.get("rule")),
        str_or_empty(v.get("message")),
        str_or_empty(v.get("messageExpression")),
        opt_str(v.get("reason")),
        str_or_empty(v.get("fieldPath")),
        match v.get("optionalOldSelf").and_then(Value::as_bool) {
            Some(b) => b.to_string(),
            None => "null".into(),
        }
    )
}

/// An internal `JSONSchemaProps`.
pub fn schema(s: &Value) -> String {
    let empty = Map::new();
    let m = s.as_object().unwrap_or(&empty);
    let g = |k: &str| m.get(k).filter(|v| !v.is_null());
    let docs = match g("externalDocs") {
        Some(d) => format!(
            "{{\"Description\":{},\"URL\":{}}}",
            str_or_empty(d.get("description")),
            str_or_empty(d.get("url"))
        ),
        None => "null".into(),
    };
    let fields: Vec<(&str, String)> = vec![
        ("ID", str_or_empty(g("id"))),
        ("Schema", str_or_empty(g("$schema"))),
        ("Ref", opt_str(g("$ref"))),
        ("Description", str_or_empty(g("description"))),
        ("Type", str_or_empty(g("type"))),
        ("Nullable", bool_of(g("nullable"))),
        ("Format", str_or_empty(g("format"))),
        ("Title", str_or_empty(g("title"))),
        ("Default", raw_or_null(g("default"))),
        ("Maximum", raw_or_null(g("maximum"))),
        ("ExclusiveMaximum", bool_of(g("exclusiveMaximum"))),
        ("Minimum", raw_or_null(g("minimum"))),
        ("ExclusiveMinimum", bool_of(g("exclusiveMinimum"))),
        ("MaxLength", raw_or_null(g("maxLength"))),
        ("MinLength", raw_or_null(g("minLength"))),
        ("Pattern", str_or_empty(g("pattern"))),
        ("MaxItems", raw_or_null(g("maxItems"))),
        ("MinItems", raw_or_null(g("minItems"))),
        ("UniqueItems", bool_of(g("uniqueItems"))),
        ("MultipleOf", raw_or_null(g("multipleOf"))),
        ("Enum", raw_or_null(g("enum"))),
        ("MaxProperties", raw_or_null(g("maxProperties"))),
        ("MinProperties", raw_or_null(g("minProperties"))),
        ("Required", string_list(g("required"))),
        ("Items", props_or_array(g("items"))),
        ("AllOf", list_of(g("allOf"), schema)),
        ("OneOf", list_of(g("oneOf"), schema)),
        ("AnyOf", list_of(g("anyOf"), schema)),
        ("Not", opt_schema(g("not"))),
        ("Properties", map_of(g("properties"), schema)),
        (
            "AdditionalProperties",
            props_or_bool(g("additionalProperties")),
        ),
        ("PatternProperties", map_of(g("patternProperties"), schema)),
        ("Dependencies", map_of(g("dependencies"), dependency)),
        ("AdditionalItems", props_or_bool(g("additionalItems"))),
        ("Definitions", map_of(g("definitions"), schema)),
        ("ExternalDocs", docs),
        ("Example", raw_or_null(g("example"))),
        (
            "XPreserveUnknownFields",
            match g("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) {
                Some(b) => b.to_string(),
                None => "null".into(),
            },
        ),
        (
            "XEmbeddedResource",
            bool_of(g("x-kubernetes-embedded-resource")),
        ),
        ("XIntOrString", bool_of(g("x-kubernetes-int-or-string"))),
        ("XListMapKeys", string_list(g("x-kubernetes-list-map-keys"))),
        ("XListType", opt_str(g("x-kubernetes-list-type"))),
        ("XMapType", opt_str(g("x-kubernetes-map-type"))),
        ("XValidations", list_of(g("x-kubernetes-validations"), rule)),
    ];
    struct_of(&fields)
}

fn struct_of(fields: &[(&str, String)]) -> String {
    let parts: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", parts.join(","))
}

/// An internal `*CustomResourceValidation` (a version's `schema`).
pub fn validation(v: Option<&Value>) -> String {
    match v {
        Some(v) => struct_of(&[(
            "OpenAPIV3Schema",
            opt_schema(v.get("openAPIV3Schema").filter(|s| !s.is_null())),
        )]),
        None => "null".into(),
    }
}

/// An internal `*CustomResourceSubresources`.
pub fn subresources(v: Option<&Value>) -> String {
    let Some(v) = v else {
        return "null".into();
    };
    let status = match v.get("status") {
        Some(s) if !s.is_null() => "{}".to_string(),
        _ => "null".into(),
    };
    let scale = match v.get("scale") {
        Some(s) if !s.is_null() => struct_of(&[
            ("SpecReplicasPath", str_or_empty(s.get("specReplicasPath"))),
            (
                "StatusReplicasPath",
                str_or_empty(s.get("statusReplicasPath")),
            ),
            ("LabelSelectorPath", opt_str(s.get("labelSelectorPath"))),
        ]),
        _ => "null".into(),
    };
    struct_of(&[("Status", status), ("Scale", scale)])
}

fn column(c: &Value) -> String {
    struct_of(&[
        ("Name", str_or_empty(c.get("name"))),
        ("Type", str_or_empty(c.get("type"))),
        ("Format", str_or_empty(c.get("format"))),
        ("Description", str_or_empty(c.get("description"))),
        (
            "Priority",
            c.get("priority")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                .to_string(),
        ),
        ("JSONPath", str_or_empty(c.get("jsonPath"))),
    ])
}

fn selectable(f: &Value) -> String {
    struct_of(&[("JSONPath", str_or_empty(f.get("jsonPath")))])
}

/// The internal `[]CustomResourceDefinitionVersion` of `spec`.
pub fn versions(spec: &super::Spec) -> String {
    let parts: Vec<String> = spec
        .versions
        .iter()
        .map(|v| {
            struct_of(&[
                ("Name", go_string(v.name)),
                ("Served", v.served.to_string()),
                ("Storage", v.storage.to_string()),
                ("Deprecated", v.deprecated.to_string()),
                ("DeprecationWarning", opt_str(v.deprecation_warning)),
                ("Schema", validation(v.schema)),
                ("Subresources", subresources(v.subresources)),
                ("AdditionalPrinterColumns", list_of(v.columns, column)),
                ("SelectableFields", list_of(v.selectable, selectable)),
            ])
        })
        .collect();
    if spec.versions.is_empty() {
        // A nil slice (kube's decoder leaves an absent or empty list nil).
        return "null".into();
    }
    format!("[{}]", parts.join(","))
}
