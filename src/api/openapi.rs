//! OpenAPI v2 and v3 documents generated from the CRD schemas, named as
//! kube-apiserver names them (`dev.kshard.demo.v1.Widget`), with the meta
//! types they reference, so `kubectl explain` and kubectl's field-validation
//! probing work.
//!
//! One file (about 1,300 lines before its tests): v2 is converted from the v3 paths, and
//! both draw on the same kube texts and the same schema walk; split by version, most of it
//! would be shared across the split.

use serde_json::{json, Map, Value};

use crate::registry::{Catalog, ResourceType};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const AUTOSCALING: &str = "io.k8s.api.autoscaling.v1";

/// Definition name of a kind: reversed group, version, kind.
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    format!("{}.{version}.{kind}", parts.join("."))
}

fn meta_ref(v3: bool, name: &str) -> Value {
    let prefix = if v3 {
        "#/components/schemas/"
    } else {
        "#/definitions/"
    };
    json!({"$ref": format!("{prefix}{META}.{name}")})
}

/// The schema of a CR kind with metadata wired to ObjectMeta, published as
/// apiextensions-apiserver's OpenAPI builder does: int-or-string unfolded to
/// its `anyOf` (v3), or converted to what OpenAPI v2 can say (v2; a
/// preserve-unknown-fields root is then a bare object).
fn kind_schema(rt: &ResourceType, version: &str, v3: bool) -> Value {
    let v = rt.version(version);
    let mut schema = v
        .and_then(|v| v.schema.clone())
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    unfold_int_or_string(&mut schema);
    go_numbers(&mut schema);
    // kube's built-in types kshard serves publish their patch metadata, which
    // kubectl's client-side apply computes its strategic merge patch from.
    if let Some(meta) = crate::admission::builtin_crds::strategic_merge_meta(&rt.group, &rt.plural)
    {
        overlay_patch_meta(&mut schema, &meta);
    }
    let root_preserves = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if !v3 && root_preserves {
        schema = json!({"type": "object"});
    } else if let Some(o) = schema.as_object_mut() {
        if !v3 {
            to_openapi_v2(o);
        }
        // After the v2 conversion: an embedded node it left without a type
        // (one that preserves unknown fields) gets nothing in v2.
        for_each_child(o, &mut |c| add_embedded_type_meta(v3, c));
        let props = o
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|p| {
                p.insert("apiVersion".into(), type_meta_property("apiVersion"));
                p.insert("kind".into(), type_meta_property("kind"));
                p.insert(
                    "metadata".into(),
                    described_ref(v3, meta_ref(v3, "ObjectMeta"), OBJECT_META_DESCRIPTION),
                );
            });
        let _ = props;
    }
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": rt.group, "version": version, "kind": rt.kind}]),
        );
        add_selectable_fields(rt, version, o);
    }
    schema
}

/// kube publishes the version's selectableFields (paths without the
/// leading dot) on the kind and its list, so clients know which field
/// selectors are served.
fn add_selectable_fields(rt: &ResourceType, version: &str, o: &mut Map<String, Value>) {
    let selectable: Vec<Value> = rt
        .version(version)
        .map(|v| v.selectable_fields.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|f| json!({"fieldPath": f.trim_start_matches('.')}))
        .collect();
    if !selectable.is_empty() {
        o.insert(
            "x-kubernetes-selectable-fields".into(),
            Value::Array(selectable),
        );
    }
}

const OBJECT_META_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_META_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// `apiVersion` and `kind` as kube's builder adds them to every CR kind and list.
fn type_meta_property(name: &str) -> Value {
    let description = if name == "apiVersion" {
        "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"
    } else {
        "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
    };
    json!({"type": "string", "description": description})
}

/// A reference with a description beside it: v3 wraps the reference in
/// `allOf` (a `$ref` takes no siblings there), v2 keeps it bare.
fn described_ref(v3: bool, r: Value, description: &str) -> Value {
    if v3 {
        json!({"allOf": [r], "description": description})
    } else {
        let mut r = r;
        r["description"] = json!(description);
        r
    }
}

/// Copies the `x-kubernetes-patch-*` keys of `meta` onto the same nodes of
/// `schema` (following properties and items).
fn overlay_patch_meta(schema: &mut Value, meta: &Value) {
    let (Some(s), Some(m)) = (schema.as_object_mut(), meta.as_object()) else {
        return;
    };
    for (k, v) in m {
        if k.starts_with("x-kubernetes-patch-") {
            s.insert(k.clone(), v.clone());
        }
    }
    if let (Some(Value::Object(sp)), Some(Value::Object(mp))) =
        (s.get_mut("properties"), m.get("properties"))
    {
        for (k, mv) in mp {
            if let Some(sv) = sp.get_mut(k) {
                overlay_patch_meta(sv, mv);
            }
        }
    }
    if let (Some(si), Some(mi)) = (s.get_mut("items"), m.get("items")) {
        overlay_patch_meta(si, mi);
    }
}

/// Numbers as Go's encoding/json writes the float64s of kube's schema
/// type (`minimum`, `maximum`, `multipleOf`): an integral value without a
/// fraction (`0`, not serde's `0.0`), below 1e21 where Go switches to
/// exponents.
fn go_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                if f.fract() == 0.0 && f.abs() < 1e21 {
                    // Integral and below 1e21: exact in an i128 range; i64
                    // covers all but the largest, which stay as they are.
                    #[allow(clippy::cast_possible_truncation)]
                    let i = f as i64;
                    if i as f64 == f {
                        *v = json!(i);
                    }
                }
            }
        }
        Value::Object(o) => o.values_mut().for_each(go_numbers),
        Value::Array(a) => a.iter_mut().for_each(go_numbers),
        _ => {}
    }
}

/// kube's builder gives every `x-kubernetes-embedded-resource` object node
/// below the root `apiVersion`, `kind` and `metadata` properties (its own
/// wording) and requires `kind` and `apiVersion`.
fn add_embedded_type_meta(v3: bool, o: &mut Map<String, Value>) {
    if o.get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        == Some(true)
        && o.get("type").and_then(Value::as_str) == Some("object")
    {
        if let Value::Object(props) = o.entry("properties").or_insert_with(|| json!({})) {
            props.insert("apiVersion".into(), json!({"type": "string", "description": "apiVersion defines the versioned schema of this representation of an object. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}));
            props.insert("kind".into(), json!({"type": "string", "description": "kind is a string value representing the type of this object. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}));
            props.insert(
                "metadata".into(),
                described_ref(v3, meta_ref(v3, "ObjectMeta"), OBJECT_META_DESCRIPTION),
            );
        }
        if let Value::Array(req) = o.entry("required").or_insert_with(|| json!([])) {
            for k in ["kind", "apiVersion"] {
                if !req.iter().any(|r| r == k) {
                    req.push(json!(k));
                }
            }
        }
    }
    for_each_child(o, &mut |c| add_embedded_type_meta(v3, c));
}

/// The structural children of a schema node: properties, items and
/// additionalProperties (not the value validations under the junctors).
fn for_each_child(o: &mut Map<String, Value>, f: &mut impl FnMut(&mut Map<String, Value>)) {
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        for p in props.values_mut() {
            if let Value::Object(p) = p {
                f(p);
            }
        }
    }
    if let Some(Value::Object(items)) = o.get_mut("items") {
        f(items);
    }
    if let Some(Value::Object(ap)) = o.get_mut("additionalProperties") {
        f(ap);
    }
}

/// The `anyOf` every int-or-string field is published with.
fn int_or_string_any_of() -> Value {
    json!([{"type": "integer"}, {"type": "string"}])
}

/// `Structural.Unfold`: an `x-kubernetes-int-or-string` node gains
/// `anyOf: [{type: integer}, {type: string}]`, or, where it has another
/// `anyOf` already, a first `allOf` entry of it; nodes that spell it out
/// already are left as they are.
fn unfold_int_or_string(schema: &mut Value) {
    fn visit(o: &mut Map<String, Value>) {
        if o.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
            let pattern = int_or_string_any_of();
            let spelled = o.get("anyOf") == Some(&pattern)
                || o.get("allOf")
                    .and_then(|a| a.get(0))
                    .and_then(|first| first.get("anyOf"))
                    == Some(&pattern);
            if !spelled {
                if o.contains_key("anyOf") {
                    let mut all_of = vec![json!({"anyOf": pattern})];
                    if let Some(Value::Array(rest)) = o.remove("allOf") {
                        all_of.extend(rest);
                    }
                    o.insert("allOf".into(), Value::Array(all_of));
                } else {
                    o.insert("anyOf".into(), pattern);
                }
            }
        }
        for_each_child(o, &mut visit);
    }
    if let Value::Object(o) = schema {
        visit(o);
    }
}

/// apiextensions-apiserver's `ToStructuralOpenAPIV2`, on every structural
/// node, parents before children: the junctors go (so int-or-string is the
/// extension alone); a nullable node loses its type, properties and items; a
/// preserve-unknown-fields node its properties and items, and its type when
/// object; an array without items its type; a nullable property is no longer
/// required (nor any, under nullable additionalProperties).
fn to_openapi_v2(o: &mut Map<String, Value>) {
    for k in ["allOf", "anyOf", "oneOf", "not"] {
        o.remove(k);
    }
    let flag = |o: &Map<String, Value>, k: &str| o.get(k).and_then(Value::as_bool) == Some(true);
    let nullable = flag(o, "nullable");
    o.remove("nullable");
    if nullable {
        o.remove("type");
        o.remove("items");
        o.remove("properties");
    }
    let preserve = flag(o, "x-kubernetes-preserve-unknown-fields");
    if preserve {
        o.remove("items");
        o.remove("properties");
    }
    let type_is =
        |o: &Map<String, Value>, t: &str| o.get("type").and_then(Value::as_str) == Some(t);
    if !o.contains_key("items") && type_is(o, "array") {
        o.remove("type");
    }
    if preserve && type_is(o, "object") {
        o.remove("type");
    }
    let nullable_props: Vec<String> = o
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .filter(|(_, v)| v.get("nullable").and_then(Value::as_bool) == Some(true))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(Value::Array(req)) = o.get_mut("required") {
        req.retain(|r| {
            r.as_str()
                .is_none_or(|r| !nullable_props.iter().any(|n| n == r))
        });
        if req.is_empty() {
            o.remove("required");
        }
    }
    if o.get("additionalProperties")
        .and_then(|a| a.get("nullable"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        o.remove("required");
    }
    for_each_child(o, &mut to_openapi_v2);
}

/// kube-openapi's `PruneDefaults`, which kube-apiserver applies to every
/// OpenAPI v2 definition: no schema in the document keeps a `default`.
fn prune_defaults(v: &mut Value) {
    fn visit(o: &mut Map<String, Value>) {
        o.remove("default");
        for k in ["properties", "definitions", "patternProperties"] {
            if let Some(Value::Object(m)) = o.get_mut(k) {
                m.values_mut().for_each(|s| {
                    if let Value::Object(s) = s {
                        visit(s);
                    }
                });
            }
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(a)) = o.get_mut(k) {
                a.iter_mut().for_each(|s| {
                    if let Value::Object(s) = s {
                        visit(s);
                    }
                });
            }
        }
        for k in ["items", "additionalProperties", "not", "additionalItems"] {
            match o.get_mut(k) {
                Some(Value::Object(s)) => visit(s),
                Some(Value::Array(a)) => a.iter_mut().for_each(|s| {
                    if let Value::Object(s) = s {
                        visit(s);
                    }
                }),
                _ => {}
            }
        }
    }
    if let Value::Object(o) = v {
        visit(o);
    }
}

fn list_schema(rt: &ResourceType, version: &str, v3: bool) -> Value {
    let prefix = if v3 {
        "#/components/schemas/"
    } else {
        "#/definitions/"
    };
    let mut list = json!({
        "type": "object",
        "required": ["items"],
        "description": format!("{} is a list of {}", rt.list_kind, rt.kind),
        "properties": {
            "apiVersion": type_meta_property("apiVersion"),
            "items": {
                "type": "array",
                "description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", rt.plural),
                "items": {"$ref": format!("{prefix}{}", definition_name(&rt.group, version, &rt.kind))},
            },
            "kind": type_meta_property("kind"),
            "metadata": described_ref(v3, meta_ref(v3, "ListMeta"), LIST_META_DESCRIPTION),
        },
        "x-kubernetes-group-version-kind": [{"group": rt.group, "version": version, "kind": rt.list_kind}],
    });
    if let Some(o) = list.as_object_mut() {
        add_selectable_fields(rt, version, o);
    }
    list
}

/// kube's `ToValidOperationID`: letters, `_` and (not first) digits kept,
/// anything else dropped and the next kept letter upper-cased.
fn valid_operation_id(s: &str, capitalize_first: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut capitalize = capitalize_first;
    for (i, c) in s.chars().enumerate() {
        if c.is_alphabetic() || c == '_' || (i != 0 && c.is_numeric()) {
            if capitalize {
                out.extend(c.to_uppercase());
                capitalize = false;
            } else {
                out.push(c);
            }
        } else {
            capitalize = true;
        }
    }
    out
}

/// The tag and operation ID kube-apiserver gives an operation on a CR path
/// (`GetOperationIDAndTags`): the verb, then group (less `.k8s.io`) and
/// version camel-cased, then the rest of the route's operation name.
fn operation_naming(rt: &ResourceType, version: &str, verb: &str, rest: &str) -> (String, String) {
    let group = rt.group.strip_suffix(".k8s.io").unwrap_or(&rt.group);
    let tag = format!(
        "{}_{}",
        valid_operation_id(group, false),
        valid_operation_id(version, false)
    );
    // The verb trie answers the shortest verb: `deletecollection` is
    // `delete` + `Collection...`.
    let (verb, rest) = match verb.strip_prefix("delete") {
        Some(more) if !more.is_empty() => ("delete", format!("{more}{rest}")),
        _ => (verb, rest.to_string()),
    };
    let mut rest_chars = rest.chars();
    let titled: String = match rest_chars.next() {
        Some(first) => first.to_uppercase().chain(rest_chars).collect(),
        None => String::new(),
    };
    let id = format!(
        "{verb}{}{}{titled}",
        valid_operation_id(group, true),
        valid_operation_id(version, true)
    );
    (tag, id)
}

fn definitions_for(rt: &ResourceType, version: &str, v3: bool, out: &mut Map<String, Value>) {
    out.insert(
        definition_name(&rt.group, version, &rt.kind),
        kind_schema(rt, version, v3),
    );
    out.insert(
        definition_name(&rt.group, version, &rt.list_kind),
        list_schema(rt, version, v3),
    );
}

pub fn v2(catalog: &Catalog) -> Value {
    let mut paths = Map::new();
    let mut defs = v3::shared_definitions_v2(META);
    let mut scale = false;
    for rt in &catalog.resources {
        for v in rt.served_versions() {
            paths.extend(v2_paths(v3::paths_for(rt, &v.name)));
            definitions_for(rt, &v.name, false, &mut defs);
            scale |= v.scale.is_some();
        }
    }
    let parameters = share_parameters(&mut paths);
    if scale {
        defs.extend(v3::shared_definitions_v2(AUTOSCALING));
    }
    // kube-apiserver prunes every default from its v2 definitions.
    for d in defs.values_mut() {
        prune_defaults(d);
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": defs,
        "parameters": parameters,
    })
}

/// kube's v2 form of a CR version's paths (apiextensions-apiserver builds
/// both from the same routes): each v3 operation with its request body as
/// a `body` parameter, its answers' schemas inline, v2's parameter form,
/// and the media types and scheme v2 lists per operation.
fn v2_paths(v3_paths: Map<String, Value>) -> Map<String, Value> {
    const OBJECT_TYPES: [&str; 2] = ["application/json", "application/yaml"];
    // kube lists them in this order in v2 (v3 sorts its media types).
    const PATCH_TYPES: [&str; 3] = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/apply-patch+yaml",
    ];
    let to_definitions = |r: &str| r.replace("#/components/schemas/", "#/definitions/");
    let schema_of = |content: &Value| -> Option<Value> {
        content
            .as_object()?
            .values()
            .next()
            .and_then(|m| m.get("schema"))
            .and_then(|s| s.get("$ref"))
            .and_then(Value::as_str)
            .map(|r| json!({"$ref": to_definitions(r)}))
    };
    let mut out = Map::new();
    for (path, item) in v3_paths {
        let Value::Object(item) = item else { continue };
        let mut v2 = Map::new();
        // kube-openapi's PathItem order.
        for method in ["get", "put", "post", "delete", "options", "head", "patch"] {
            let Some(op) = item.get(method) else { continue };
            let mut params: Vec<Value> = op["parameters"]
                .as_array()
                .map(|ps| ps.iter().map(v2_parameter).collect())
                .unwrap_or_default();
            if let Some(body) = op.get("requestBody") {
                let mut p = json!({"name": "body", "in": "body"});
                if body["required"] == json!(true) {
                    p["required"] = json!(true);
                }
                p["schema"] = schema_of(&body["content"]).unwrap_or(Value::Null);
                params.push(p);
                params.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            }
            let mut responses = Map::new();
            if let Some(rs) = op["responses"].as_object() {
                for (code, r) in rs {
                    let mut v2r = json!({"description": r["description"]});
                    if let Some(schema) = r.get("content").and_then(schema_of) {
                        v2r["schema"] = schema;
                    }
                    responses.insert(code.clone(), v2r);
                }
            }
            let consumes: &[&str] = if method == "patch" {
                &PATCH_TYPES
            } else {
                &OBJECT_TYPES
            };
            let mut o = Map::new();
            o.insert("description".into(), op["description"].clone());
            o.insert("consumes".into(), json!(consumes));
            o.insert("produces".into(), json!(OBJECT_TYPES));
            o.insert("schemes".into(), json!(["https"]));
            o.insert("tags".into(), op["tags"].clone());
            o.insert("operationId".into(), op["operationId"].clone());
            if !params.is_empty() {
                o.insert("parameters".into(), Value::Array(params));
            }
            o.insert("responses".into(), Value::Object(responses));
            for k in ["x-kubernetes-action", "x-kubernetes-group-version-kind"] {
                if let Some(v) = op.get(k) {
                    o.insert(k.into(), v.clone());
                }
            }
            v2.insert(method.into(), Value::Object(o));
        }
        if let Some(ps) = item.get("parameters").and_then(Value::as_array) {
            v2.insert(
                "parameters".into(),
                Value::Array(ps.iter().map(v2_parameter).collect()),
            );
        }
        out.insert(path, Value::Object(v2));
    }
    out
}

/// kube-openapi's `Parameter` fields, in the order it writes them:
/// validations, then the simple schema, then the parameter's own props
/// (a body parameter's `schema` among them). The shared parameters' names
/// hash that text.
const PARAMETER_KEYS: [&str; 25] = [
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "type",
    "nullable",
    "format",
    "items",
    "collectionFormat",
    "default",
    "example",
    "description",
    "name",
    "in",
    "required",
    "schema",
    "allowEmptyValue",
];

/// A v3 non-body parameter in v2's form (the schema's keys at the top).
fn v2_parameter(p: &Value) -> Value {
    let mut o = Map::new();
    let schema = &p["schema"];
    // A v2 non-body parameter has no `schema`: its schema's keys are its own.
    for (i, k) in PARAMETER_KEYS.iter().take(23).enumerate() {
        let from = if i < 19 { schema } else { p };
        if let Some(v) = from.get(*k) {
            o.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(o)
}

/// A v2 parameter's JSON as kube-openapi writes it (keys in
/// [`PARAMETER_KEYS`] order; a `Value`'s own keys sort).
fn kube_parameter_json(p: &Value) -> String {
    let mut out = String::from("{");
    for k in PARAMETER_KEYS {
        if let Some(v) = p.get(k) {
            if out.len() > 1 {
                out.push(',');
            }
            out.push_str(&Value::String(k.to_string()).to_string());
            out.push(':');
            out.push_str(&v.to_string());
        }
    }
    out.push('}');
    out
}

/// kube-openapi's v2 parameter deduplication: every parameter but the
/// kind-specific ones (`name`, a body of the kind's own schema) and the two
/// kubectl once probed for (`dryRun`, `fieldValidation`) moves to the
/// document's `parameters`, named `<name>-<hash of its JSON>`, and the
/// operations and paths refer to it there.
fn share_parameters(paths: &mut Map<String, Value>) -> Map<String, Value> {
    let kept = |p: &Value| {
        let (name, at) = (p["name"].as_str(), p["in"].as_str());
        (name == Some("name") && matches!(at, Some("query" | "path")))
            || (at == Some("query") && matches!(name, Some("dryRun" | "fieldValidation")))
            || (at == Some("body")
                && !p["schema"]["$ref"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("#/definitions/io.k8s.apimachinery")))
    };
    let mut shared = std::collections::BTreeMap::new();
    let mut share = |params: &mut Value| {
        let Some(list) = params.as_array_mut() else {
            return;
        };
        for p in list.iter_mut() {
            if p.get("$ref").is_some() || kept(p) {
                continue;
            }
            let text = kube_parameter_json(p);
            let name = format!(
                "{}-{}",
                p["name"].as_str().unwrap_or("param"),
                parameter_hash(&text)
            );
            shared.entry(name.clone()).or_insert_with(|| p.clone());
            *p = json!({"$ref": format!("#/parameters/{name}")});
        }
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (k, v) in item.iter_mut() {
            if k == "parameters" {
                share(v);
            } else if let Some(ps) = v.get_mut("parameters") {
                share(ps);
            }
        }
    }
    shared.into_iter().collect()
}

/// kube-openapi's name suffix for a shared parameter: the first six bytes
/// of the 64-bit FNV-1 hash of its JSON, URL-safe base64 (eight
/// characters). FNV-1 is a few lines, written here rather than pulled in.
fn parameter_hash(json: &str) -> String {
    use base64::Engine as _;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in json.bytes() {
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        h ^= u64::from(b);
    }
    base64::engine::general_purpose::URL_SAFE.encode(&h.to_be_bytes()[..6])
}

pub fn v3_group_version(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    let resources = catalog.resources_in(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for rt in &resources {
        paths.extend(v3::paths_for(rt, version));
        definitions_for(rt, version, true, &mut schemas);
    }
    v3::add_shared_schemas(&paths, &mut schemas);
    // kube's CRD documents carry the title and version of its CRD builder.
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The OpenAPI v3 document of a CR group-version as kube-apiserver 1.36
/// answers `/openapi/v3/apis/<group>/<version>` (apiextensions-apiserver's
/// builder, then kube-openapi's v3 conversion): each operation with its
/// description, parameters, request body and responses, the parameters all
/// operations of a path share moved to the path, and kube's own shared types.
mod v3 {
    use std::sync::LazyLock;

    use serde_json::{json, Map, Value};

    use super::{definition_name, operation_naming, AUTOSCALING, META};
    use crate::registry::ResourceType;

    /// kube-apiserver v1.36.2's texts: its query and path parameters by
    /// name (the patch form of `fieldManager` as `fieldManager/patch`) and
    /// the shared types a CR document refers to (`io.k8s.*` schemas), as its
    /// `/openapi/v3/apis/demo.kshard.dev/v1` answers them. The differential
    /// test compares whole documents against the running reference, so a
    /// drift shows there.
    static KUBE: LazyLock<Value> = LazyLock::new(|| {
        serde_json::from_str(include_str!("openapi_v3_kube.json")).unwrap_or_default()
    });

    fn param(name: &str) -> Value {
        KUBE["parameters"][name].clone()
    }

    /// Adds the shared schemas the paths and the CR schemas refer to,
    /// and those they refer to in turn.
    pub fn add_shared_schemas(paths: &Map<String, Value>, schemas: &mut Map<String, Value>) {
        let Some(shared) = KUBE["schemas"].as_object() else {
            return;
        };
        let mut wanted = Vec::new();
        paths.values().for_each(|p| collect_refs(p, &mut wanted));
        schemas.values().for_each(|s| collect_refs(s, &mut wanted));
        while let Some(name) = wanted.pop() {
            if schemas.contains_key(&name) {
                continue;
            }
            if let Some(s) = shared.get(&name) {
                collect_refs(s, &mut wanted);
                schemas.insert(name, s.clone());
            }
        }
    }

    /// kube's shared types whose names start with `prefix`, in v2's form
    /// (kube-apiserver serves the same texts in both documents): refs to
    /// `#/definitions/`, a ref with siblings bare rather than in `allOf`.
    pub fn shared_definitions_v2(prefix: &str) -> Map<String, Value> {
        fn to_v2(v: &mut Value) {
            match v {
                Value::Object(o) => {
                    let single_ref = o
                        .get("allOf")
                        .and_then(Value::as_array)
                        .filter(|a| a.len() == 1)
                        .and_then(|a| a[0].get("$ref").cloned());
                    if let Some(r) = single_ref {
                        o.remove("allOf");
                        o.insert("$ref".into(), r);
                    }
                    if let Some(Value::String(r)) = o.get_mut("$ref") {
                        *r = r.replace("#/components/schemas/", "#/definitions/");
                    }
                    o.values_mut().for_each(to_v2);
                }
                Value::Array(a) => a.iter_mut().for_each(to_v2),
                _ => {}
            }
        }
        KUBE["schemas"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(n, _)| n.starts_with(prefix))
                    .map(|(n, s)| {
                        let mut s = s.clone();
                        to_v2(&mut s);
                        (n.clone(), s)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What an operation answers and takes.
    struct Op<'a> {
        /// `x-kubernetes-action`.
        action: &'a str,
        /// The verb the operation ID starts with.
        verb: &'a str,
        /// After the verb in the operation ID (`NamespacedWidgetStatus`).
        rest: String,
        description: String,
        /// Query parameters of its own (path parameters and `pretty` are
        /// every operation's).
        params: &'a [&'a str],
        /// The request body's schema and media types, and whether required.
        body: Option<(String, &'a [&'a str], bool)>,
        /// Answer codes and the schema answered.
        responses: &'a [&'a str],
        answer: String,
    }

    const LIST_PARAMS: &[&str] = &[
        "allowWatchBookmarks",
        "continue",
        "fieldSelector",
        "labelSelector",
        "limit",
        "resourceVersion",
        "resourceVersionMatch",
        "sendInitialEvents",
        "shardSelector",
        "timeoutSeconds",
        "watch",
    ];
    const WRITE_PARAMS: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
    const PATCH_PARAMS: &[&str] = &["dryRun", "fieldManager/patch", "fieldValidation", "force"];
    const DELETE_PARAMS: &[&str] = &[
        "dryRun",
        "gracePeriodSeconds",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        "orphanDependents",
        "propagationPolicy",
    ];
    const OBJECT_TYPES: &[&str] = &["application/json", "application/yaml"];
    const PATCH_TYPES: &[&str] = &[
        "application/apply-patch+yaml",
        "application/json-patch+json",
        "application/merge-patch+json",
    ];

    fn content(types: &[&str], schema: &str) -> Value {
        let mut c = Map::new();
        for t in types {
            c.insert(
                (*t).to_string(),
                json!({"schema": {"$ref": format!("#/components/schemas/{schema}")}}),
            );
        }
        Value::Object(c)
    }

    fn operation(
        rt: &ResourceType,
        version: &str,
        shared: &[Value],
        op: Op,
    ) -> (Value, Vec<Value>) {
        let (tag, id) = operation_naming(rt, version, op.verb, &op.rest);
        let mut responses = Map::new();
        for code in op.responses {
            let description = match *code {
                "201" => "Created",
                "202" => "Accepted",
                _ => "OK",
            };
            responses.insert(
                (*code).to_string(),
                json!({"description": description, "content": content(OBJECT_TYPES, &op.answer)}),
            );
        }
        responses.insert("401".into(), json!({"description": "Unauthorized"}));
        let mut o = json!({
            "description": op.description,
            "operationId": id,
            "tags": [tag],
            "responses": responses,
            "x-kubernetes-action": op.action,
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": version, "kind": rt.kind},
        });
        if let Some((schema, types, required)) = op.body {
            o["requestBody"] = json!({"content": content(types, &schema)});
            if required {
                o["requestBody"]["required"] = json!(true);
            }
        }
        let mut params: Vec<Value> = shared.to_vec();
        params.extend(op.params.iter().map(|p| param(p)));
        (o, params)
    }

    /// The article kube's descriptions put before a kind (padded with
    /// spaces): none for a plural-looking one (`Settings`, not `Class`),
    /// `an` before a vowel.
    fn article(kind: &str) -> &'static str {
        if kind.ends_with('s') && !kind.ends_with("ss") {
            " "
        } else if kind
            .chars()
            .next()
            .is_some_and(|c| "aeiou".contains(c.to_ascii_lowercase()))
        {
            " an "
        } else {
            " a "
        }
    }

    /// kube-openapi's v3 paths: the parameters every operation of a path
    /// has move to the path, each list sorted by name (and location).
    fn path_item(ops: Vec<(&str, (Value, Vec<Value>))>) -> Value {
        let key = |p: &Value| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["in"].as_str().unwrap_or_default().to_string(),
            )
        };
        let common: Vec<Value> = ops
            .first()
            .map(|(_, (_, first))| {
                first
                    .iter()
                    .filter(|p| ops.iter().all(|(_, (_, ps))| ps.contains(p)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut item = Map::new();
        for (method, (mut o, params)) in ops {
            let mut own: Vec<Value> = params.into_iter().filter(|p| !common.contains(p)).collect();
            if !own.is_empty() {
                own.sort_by_key(key);
                o["parameters"] = Value::Array(own);
            }
            item.insert(method.to_string(), o);
        }
        if !common.is_empty() {
            let mut common = common;
            common.sort_by_key(key);
            item.insert("parameters".into(), Value::Array(common));
        }
        Value::Object(item)
    }

    /// The paths of one served version of a CRD: the collection (and,
    /// namespaced, the all-namespaces list), the item, and the `/status`
    /// and `/scale` subresources the version enables.
    pub fn paths_for(rt: &ResourceType, version: &str) -> Map<String, Value> {
        let kind_def = definition_name(&rt.group, version, &rt.kind);
        let list_def = definition_name(&rt.group, version, &rt.list_kind);
        let status_def = format!("{META}.Status");
        let scale_def = format!("{AUTOSCALING}.Scale");
        let delete_def = format!("{META}.DeleteOptions");
        let patch_def = format!("{META}.Patch");
        let kind = &rt.kind;
        let base = format!("/apis/{}/{}", rt.group, version);
        let ns = if rt.namespaced { "Namespaced" } else { "" };
        let coll = if rt.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", rt.plural)
        } else {
            format!("{base}/{}", rt.plural)
        };
        let name_param = {
            let mut p = param("namespace");
            p["name"] = json!("name");
            p["description"] = json!(format!("name of the {kind}"));
            p
        };
        let mut coll_shared = vec![param("pretty")];
        if rt.namespaced {
            coll_shared.push(param("namespace"));
        }
        let mut item_shared = coll_shared.clone();
        item_shared.push(name_param);
        let op = |shared: &[Value], o: Op| operation(rt, version, shared, o);

        let mut paths = Map::new();
        paths.insert(
            coll.clone(),
            path_item(vec![
                (
                    "get",
                    op(
                        &coll_shared,
                        Op {
                            action: "list",
                            verb: "list",
                            rest: format!("{ns}{kind}"),
                            description: format!("list objects of kind {kind}"),
                            params: LIST_PARAMS,
                            body: None,
                            responses: &["200"],
                            answer: list_def.clone(),
                        },
                    ),
                ),
                (
                    "post",
                    op(
                        &coll_shared,
                        Op {
                            action: "post",
                            verb: "create",
                            rest: format!("{ns}{kind}"),
                            description: format!("create{}{kind}", article(kind)),
                            params: WRITE_PARAMS,
                            body: Some((kind_def.clone(), OBJECT_TYPES, true)),
                            responses: &["200", "201", "202"],
                            answer: kind_def.clone(),
                        },
                    ),
                ),
                (
                    "delete",
                    op(
                        &coll_shared,
                        Op {
                            action: "deletecollection",
                            verb: "deletecollection",
                            rest: format!("{ns}{kind}"),
                            description: format!("delete collection of {kind}"),
                            // kube's CR handler publishes the list options
                            // here (and no DeleteOptions body).
                            params: LIST_PARAMS,
                            body: None,
                            responses: &["200"],
                            answer: status_def.clone(),
                        },
                    ),
                ),
            ]),
        );
        // The item and its subresources: get, put and patch (and delete
        // for the item itself).
        let mut item_paths = vec![("", "", kind_def.clone())];
        if let Some(v) = rt.version(version) {
            if v.status_subresource {
                item_paths.push(("/status", "status", kind_def.clone()));
            }
            if v.scale.is_some() {
                item_paths.push(("/scale", "scale", scale_def.clone()));
            }
        }
        for (suffix, sub, def) in item_paths {
            let of = if sub.is_empty() {
                String::new()
            } else {
                format!("{sub} of ")
            };
            let titled: String = sub
                .chars()
                .take(1)
                .flat_map(char::to_uppercase)
                .chain(sub.chars().skip(1))
                .collect();
            let rest = format!("{ns}{kind}{titled}");
            let mut ops = vec![
                (
                    "get",
                    op(
                        &item_shared,
                        Op {
                            action: "get",
                            verb: "read",
                            rest: rest.clone(),
                            description: format!("read {of}the specified {kind}"),
                            params: &["resourceVersion"],
                            body: None,
                            responses: &["200"],
                            answer: def.clone(),
                        },
                    ),
                ),
                (
                    "put",
                    op(
                        &item_shared,
                        Op {
                            action: "put",
                            verb: "replace",
                            rest: rest.clone(),
                            description: format!("replace {of}the specified {kind}"),
                            params: WRITE_PARAMS,
                            body: Some((def.clone(), OBJECT_TYPES, true)),
                            responses: &["200", "201"],
                            answer: def.clone(),
                        },
                    ),
                ),
                (
                    "patch",
                    op(
                        &item_shared,
                        Op {
                            action: "patch",
                            verb: "patch",
                            rest: rest.clone(),
                            description: format!("partially update {of}the specified {kind}"),
                            params: PATCH_PARAMS,
                            body: Some((patch_def.clone(), PATCH_TYPES, true)),
                            responses: &["200"],
                            answer: def.clone(),
                        },
                    ),
                ),
            ];
            if sub.is_empty() {
                ops.push((
                    "delete",
                    op(
                        &item_shared,
                        Op {
                            action: "delete",
                            verb: "delete",
                            rest: rest.clone(),
                            description: format!("delete{}{kind}", article(kind)),
                            params: DELETE_PARAMS,
                            body: Some((delete_def.clone(), OBJECT_TYPES, false)),
                            responses: &["200", "202"],
                            answer: status_def.clone(),
                        },
                    ),
                ));
            }
            paths.insert(format!("{coll}/{{name}}{suffix}"), path_item(ops));
        }
        if rt.namespaced {
            paths.insert(
                format!("{base}/{}", rt.plural),
                path_item(vec![(
                    "get",
                    op(
                        &[param("pretty")],
                        Op {
                            action: "list",
                            verb: "list",
                            rest: format!("{kind}ForAllNamespaces"),
                            description: format!("list objects of kind {kind}"),
                            params: LIST_PARAMS,
                            body: None,
                            responses: &["200"],
                            answer: list_def,
                        },
                    ),
                )]),
            );
        }
        paths
    }

    fn collect_refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    if let Some(name) = r.strip_prefix("#/components/schemas/") {
                        out.push(name.to_string());
                    }
                }
                o.values().for_each(|c| collect_refs(c, out));
            }
            Value::Array(a) => a.iter().for_each(|c| collect_refs(c, out)),
            _ => {}
        }
    }
}

/// `/openapi/v3`: one entry per group-version, with a hash query so clients can cache.
pub fn v3_root(catalog: &Catalog) -> Value {
    let mut paths = Map::new();
    for g in catalog.groups() {
        for v in &g.versions {
            if let Some(doc) = v3_group_version(catalog, &g.name, v) {
                let hash = super::discovery::etag(&serde_json::to_vec(&doc).unwrap_or_default());
                let hash = hash.trim_matches('"');
                paths.insert(
                    format!("apis/{}/{}", g.name, v),
                    json!({"serverRelativeURL": format!("/openapi/v3/apis/{}/{}?hash={hash}", g.name, v)}),
                );
            }
        }
    }
    json!({"paths": paths})
}

/// The protobuf form of `/openapi/v2`, as kube-openapi names it in its answer
/// (whichever of its two names the client asked for).
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V2Form {
    Json,
    Protobuf,
}

/// One media range of an Accept header, as goautoneg parses it.
struct Clause<'a> {
    type_: &'a str,
    subtype: &'a str,
    q: f64,
}

/// goautoneg's `ParseAccept`: ranges split at `,`, `;` and `/`, trimmed of
/// spaces only; a range without a subtype is kept only as `*`; a `q` that
/// does not parse is 0. Sorted by its (not strictly weak) order: higher q
/// first, else a concrete type or subtype before a wildcard, with Go's
/// insertion sort for short lists, as `sort.Sort` does below 13 elements.
fn parse_accept(header: &str) -> Vec<Clause<'_>> {
    let mut out = Vec::new();
    for part in header.split(',') {
        let part = part.trim_matches(' ');
        let (range, params) = part.split_once(';').unwrap_or((part, ""));
        let (type_, sub) = range.split_once('/').unwrap_or((range, ""));
        let type_ = type_.trim_matches(' ');
        let subtype = if sub.is_empty() {
            if type_ != "*" {
                continue;
            }
            "*"
        } else {
            if sub.contains('/') {
                continue;
            }
            sub.trim_matches(' ')
        };
        let mut q = 1.0;
        if !params.is_empty() {
            for p in params.split(';') {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                if v.contains('=') {
                    continue;
                }
                if k.trim_matches(' ') == "q" {
                    // strconv.ParseFloat(v, 32): no trimming, 0 on error.
                    q = v.parse::<f32>().map(f64::from).unwrap_or(0.0);
                }
            }
        }
        out.push(Clause { type_, subtype, q });
    }
    let less = |a: &Clause, b: &Clause| {
        a.q > b.q || (a.type_ != "*" && b.type_ == "*") || (a.subtype != "*" && b.subtype == "*")
    };
    if out.len() <= 12 {
        for i in 1..out.len() {
            let mut j = i;
            while j > 0 && less(&out[j], &out[j - 1]) {
                out.swap(j, j - 1);
                j -= 1;
            }
        }
    } else {
        // Longer lists: a stable sort on the same preferences.
        out.sort_by(|a, b| {
            b.q.total_cmp(&a.q)
                .then((a.type_ == "*").cmp(&(b.type_ == "*")))
                .then((a.subtype == "*").cmp(&(b.subtype == "*")))
        });
    }
    out
}

/// The form of `/openapi/v2` to answer with: the first sorted range that
/// matches JSON or either protobuf name (a missing Accept is `*/*`; a q of 0
/// still matches, as in kube-openapi). `None` is kube's 406.
pub fn negotiate_v2(accept: Option<&str>) -> Option<V2Form> {
    const OFFERED: [(&str, V2Form); 3] = [
        ("json", V2Form::Json),
        (
            "com.github.proto-openapi.spec.v2@v1.0+protobuf",
            V2Form::Protobuf,
        ),
        (
            "com.github.proto-openapi.spec.v2.v1.0+protobuf",
            V2Form::Protobuf,
        ),
    ];
    let header = match accept {
        None | Some("") => "*/*",
        Some(h) => h,
    };
    parse_accept(header).iter().find_map(|c| {
        if c.type_ != "application" && c.type_ != "*" {
            return None;
        }
        OFFERED
            .iter()
            .find(|(sub, _)| c.subtype == *sub || c.subtype == "*")
            .map(|(_, form)| *form)
    })
}

/// Whether `/openapi/v3/<group>/<version>` can answer in JSON: as for v2,
/// the first sorted range naming JSON or gnostic's v3 protobuf picks the
/// form. kshard writes no v3 protobuf, so a range for it is passed over
/// (a client that takes JSON next gets JSON; one that takes only protobuf
/// gets the 406 kube gives a range it cannot serve).
pub fn v3_accepts_json(accept: Option<&str>) -> bool {
    let header = match accept {
        None | Some("") => "*/*",
        Some(h) => h,
    };
    parse_accept(header).iter().any(|c| {
        (c.type_ == "application" || c.type_ == "*") && (c.subtype == "json" || c.subtype == "*")
    })
}

/// Go's `http.ServeContent` reading If-None-Match against `etag`: `*` or any
/// listed entity tag that matches weakly (`W/` ignored) means not modified.
pub fn if_none_match(headers: &http::HeaderMap, etag: &str) -> bool {
    let strip = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_string();
    let ours = strip(etag);
    for value in headers.get_all(http::header::IF_NONE_MATCH).iter().take(1) {
        let Ok(mut buf) = value.to_str() else {
            return false;
        };
        loop {
            buf = buf.trim_matches(|c| c == ' ' || c == '\t');
            if buf.is_empty() {
                break;
            }
            if let Some(rest) = buf.strip_prefix(',') {
                buf = rest;
                continue;
            }
            if buf.starts_with('*') {
                return true;
            }
            let Some((tag, rest)) = scan_etag(buf) else {
                break;
            };
            if strip(tag) == ours {
                return true;
            }
            buf = rest;
        }
    }
    false
}

/// Go's `scanETag`: an optional `W/`, then a quoted tag of visible characters.
fn scan_etag(s: &str) -> Option<(&str, &str)> {
    let start = if s.starts_with("W/") { 2 } else { 0 };
    let bytes = s.as_bytes();
    if bytes.len() - start < 2 || bytes[start] != b'"' {
        return None;
    }
    for (i, &c) in bytes.iter().enumerate().skip(start + 1) {
        match c {
            0x21 | 0x23..=0x7E | 0x80..=0xFF => {}
            b'"' => return Some((&s[..=i], &s[i + 1..])),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_accept_negotiation_follows_goautoneg() {
        use V2Form::*;
        let pb = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
        let pb_new = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
        for (accept, want) in [
            (None, Some(Json)),
            (Some(""), Some(Json)),
            (Some("*/*"), Some(Json)),
            (Some("application/*"), Some(Json)),
            (Some("application/json"), Some(Json)),
            (Some("application/json, */*"), Some(Json)),
            (Some(pb), Some(Protobuf)),
            (Some(pb_new), Some(Protobuf)),
            (Some(&format!("{pb}, application/json")), Some(Protobuf)),
            (Some(&format!("application/json, {pb}")), Some(Json)),
            (
                Some(&format!("application/json;q=0.5, {pb}")),
                Some(Protobuf),
            ),
            (Some("application/json;q=0.1, */*"), Some(Json)),
            // goautoneg's order: a concrete range moves ahead of a wildcard
            // before it whatever their q.
            (Some(&format!("*/*;q=0.9, {pb};q=0.1")), Some(Protobuf)),
            (Some(&format!("*/*, {pb}")), Some(Protobuf)),
            // Parameters do not matter, nor does a q of 0.
            (
                Some("application/json;g=apidiscovery.k8s.io;v=v2"),
                Some(Json),
            ),
            (Some("application/json;q=0"), Some(Json)),
            (Some("application/yaml"), None),
            (
                Some("text/plain, application/vnd.kubernetes.protobuf"),
                None,
            ),
            (Some("application"), None),
            (Some("Application/JSON"), None),
        ] {
            assert_eq!(negotiate_v2(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn if_none_match_reads_lists_weak_tags_and_star() {
        let etag = "\"ABC\"";
        let h = |v: &str| {
            let mut m = http::HeaderMap::new();
            m.insert(http::header::IF_NONE_MATCH, v.parse().expect("value"));
            m
        };
        assert!(if_none_match(&h("\"ABC\""), etag));
        assert!(if_none_match(&h("W/\"ABC\""), etag));
        assert!(if_none_match(&h("\"x\", \"ABC\""), etag));
        assert!(if_none_match(&h("*"), etag));
        assert!(!if_none_match(&h("\"ABD\""), etag));
        assert!(!if_none_match(&h("ABC"), etag));
        assert!(!if_none_match(&http::HeaderMap::new(), etag));
    }

    #[test]
    fn int_or_string_is_unfolded_for_v3_and_bare_for_v2() {
        let crd = json!({"type": "object", "properties": {
            "port": {"x-kubernetes-int-or-string": true, "description": "p"},
            "spelled": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
            "other": {"x-kubernetes-int-or-string": true, "anyOf": [{"pattern": "^a"}, {"pattern": "^b"}]},
            "list": {"type": "array", "items": {"x-kubernetes-int-or-string": true}},
        }});
        let mut v3 = crd.clone();
        unfold_int_or_string(&mut v3);
        let int_or_string = json!([{"type": "integer"}, {"type": "string"}]);
        assert_eq!(
            v3["properties"]["port"],
            json!({"x-kubernetes-int-or-string": true, "description": "p", "anyOf": int_or_string})
        );
        assert_eq!(v3["properties"]["spelled"], crd["properties"]["spelled"]);
        assert_eq!(
            v3["properties"]["other"]["allOf"],
            json!([{"anyOf": int_or_string}])
        );
        assert_eq!(
            v3["properties"]["other"]["anyOf"],
            crd["properties"]["other"]["anyOf"]
        );
        assert_eq!(v3["properties"]["list"]["items"]["anyOf"], int_or_string);
        let mut v2 = v3.clone();
        if let Some(o) = v2.as_object_mut() {
            to_openapi_v2(o);
        }
        assert_eq!(
            v2["properties"]["port"],
            json!({"x-kubernetes-int-or-string": true, "description": "p"})
        );
        assert_eq!(
            v2["properties"]["other"],
            json!({"x-kubernetes-int-or-string": true})
        );
    }

    #[test]
    fn v2_conversion_drops_what_v2_cannot_say() {
        let mut s = json!({"type": "object", "required": ["a", "n"], "properties": {
            "a": {"type": "string", "default": "x", "oneOf": [{"pattern": "a"}]},
            "n": {"type": "object", "nullable": true, "properties": {"z": {"type": "string"}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"q": {"type": "string"}}},
            "arr": {"type": "array", "x-kubernetes-preserve-unknown-fields": true, "items": {"type": "string"}},
        }});
        if let Some(o) = s.as_object_mut() {
            to_openapi_v2(o);
        }
        prune_defaults(&mut s);
        assert_eq!(s["required"], json!(["a"]));
        assert_eq!(s["properties"]["a"], json!({"type": "string"}));
        assert_eq!(s["properties"]["n"], json!({}));
        assert_eq!(
            s["properties"]["free"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(
            s["properties"]["arr"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
    }

    #[test]
    fn operation_ids_are_kubes() {
        let mut c = Catalog::default();
        c.add_manifests(
            std::path::Path::new("w.yaml"),
            include_str!("../../crds/examples/widgets.yaml"),
        )
        .expect("crd");
        let doc = v2(&c);
        let id = |path: &str, method: &str| doc["paths"][path][method]["operationId"].clone();
        let ns = "/apis/demo.kshard.dev/v1/namespaces/{namespace}/widgets";
        assert_eq!(id(ns, "get"), "listDemoKshardDevV1NamespacedWidget");
        assert_eq!(
            id(ns, "delete"),
            "deleteDemoKshardDevV1CollectionNamespacedWidget"
        );
        assert_eq!(
            id(&format!("{ns}/{{name}}/scale"), "patch"),
            "patchDemoKshardDevV1NamespacedWidgetScale"
        );
        assert_eq!(
            id(&format!("{ns}/{{name}}/status"), "get"),
            "readDemoKshardDevV1NamespacedWidgetStatus"
        );
        assert_eq!(
            id("/apis/demo.kshard.dev/v1/widgets", "get"),
            "listDemoKshardDevV1WidgetForAllNamespaces"
        );
        assert_eq!(
            doc["paths"][ns]["post"]["tags"],
            json!(["demoKshardDev_v1"])
        );
        assert_eq!(valid_operation_id("apps.k8s-io", true), "AppsK8sIo");
    }

    fn catalog_of(crd: &str) -> Catalog {
        let mut c = Catalog::default();
        c.add_manifests(std::path::Path::new("c.yaml"), crd)
            .expect("crd");
        c
    }

    #[test]
    fn v3_parameters_shared_by_every_operation_sit_on_the_path() {
        let c = catalog_of(include_str!("../../crds/examples/widgets.yaml"));
        let doc = v3_group_version(&c, "demo.kshard.dev", "v1").expect("gv");
        let names = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        let ns = "/apis/demo.kshard.dev/v1/namespaces/{namespace}/widgets";
        let item = format!("{ns}/{{name}}");
        assert_eq!(
            names(&doc["paths"][ns]["parameters"]),
            ["namespace", "pretty"]
        );
        assert_eq!(
            names(&doc["paths"][&item]["parameters"]),
            ["name", "namespace", "pretty"]
        );
        assert_eq!(
            names(&doc["paths"][&item]["get"]["parameters"]),
            ["resourceVersion"]
        );
        assert_eq!(
            names(&doc["paths"][&item]["patch"]["parameters"]),
            ["dryRun", "fieldManager", "fieldValidation", "force"]
        );
        assert_eq!(
            doc["paths"][&item]["parameters"][0]["description"],
            "name of the Widget"
        );
        assert_eq!(doc["paths"][&item]["parameters"][0]["in"], "path");
        // The all-namespaces list has one operation: everything is shared.
        let all = &doc["paths"]["/apis/demo.kshard.dev/v1/widgets"];
        assert!(all["get"].get("parameters").is_none());
        assert_eq!(names(&all["parameters"]).len(), 12);
        assert_eq!(all["get"]["description"], "list objects of kind Widget");
        let post = &doc["paths"][ns]["post"];
        assert_eq!(post["requestBody"]["required"], true);
        assert_eq!(
            post["responses"]["201"]["content"]["application/yaml"]["schema"]["$ref"],
            "#/components/schemas/dev.kshard.demo.v1.Widget"
        );
        assert_eq!(
            post["responses"]["401"],
            json!({"description": "Unauthorized"})
        );
        let delete = &doc["paths"][&item]["delete"];
        assert!(delete["requestBody"].get("required").is_none());
        assert_eq!(delete["description"], "delete a Widget");
        // Shared types: those referred to, and theirs in turn.
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for name in ["meta.v1.ShardInfo", "meta.v1.Patch", "meta.v1.StatusCause"] {
            assert!(
                schemas.contains_key(&format!("io.k8s.apimachinery.pkg.apis.{name}")),
                "{name}"
            );
        }
        assert!(schemas.contains_key("io.k8s.api.autoscaling.v1.ScaleSpec"));
        assert_eq!(doc["info"]["title"], "Kubernetes CRD Swagger");
    }

    #[test]
    fn kube_texts_parse() {
        let kube: Value = serde_json::from_str(include_str!("openapi_v3_kube.json")).expect("JSON");
        assert_eq!(kube["parameters"].as_object().map(Map::len), Some(22));
        assert!(kube["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"].is_object());
    }

    #[test]
    fn articles_and_embedded_resources_as_kube_writes_them() {
        let c = catalog_of(
            r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: settings.e.kshard.dev}
spec:
  group: e.kshard.dev
  scope: Cluster
  names: {plural: settings, singular: settings, kind: Settings}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          n: {type: integer, minimum: 0, maximum: 1.5}
          obj:
            type: object
            x-kubernetes-embedded-resource: true
            required: [data, kind]
            properties: {data: {type: string}}
          free:
            type: object
            x-kubernetes-embedded-resource: true
            x-kubernetes-preserve-unknown-fields: true
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: edges.e.kshard.dev}
spec:
  group: e.kshard.dev
  scope: Cluster
  names: {plural: edges, singular: edge, kind: Edge}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}
"#,
        );
        let doc = v3_group_version(&c, "e.kshard.dev", "v1").expect("gv");
        let p = &doc["paths"];
        assert_eq!(
            p["/apis/e.kshard.dev/v1/settings"]["post"]["description"],
            "create Settings"
        );
        assert_eq!(
            p["/apis/e.kshard.dev/v1/edges"]["post"]["description"],
            "create an Edge"
        );
        assert_eq!(
            p["/apis/e.kshard.dev/v1/edges/{name}"]["delete"]["description"],
            "delete an Edge"
        );
        let props = &doc["components"]["schemas"]["dev.kshard.e.v1.Settings"]["properties"];
        // Integral float64s without a fraction, as Go writes them.
        assert_eq!(
            serde_json::to_string(&props["n"]["minimum"]).expect("json"),
            "0"
        );
        assert_eq!(props["n"]["maximum"], json!(1.5));
        assert_eq!(
            props["obj"]["required"],
            json!(["data", "kind", "apiVersion"])
        );
        assert_eq!(
            props["obj"]["properties"]["metadata"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert_eq!(props["free"]["required"], json!(["kind", "apiVersion"]));
        // v2 first drops the type of a node that preserves unknown fields,
        // and such a node then gets nothing.
        let v2doc = v2(&c);
        let v2props = &v2doc["definitions"]["dev.kshard.e.v1.Settings"]["properties"];
        assert_eq!(
            v2props["obj"]["required"],
            json!(["data", "kind", "apiVersion"])
        );
        assert!(v2props["free"].get("required").is_none());
    }

    #[test]
    fn v3_is_served_as_json_when_the_client_takes_it() {
        assert!(v3_accepts_json(None));
        assert!(v3_accepts_json(Some("*/*")));
        assert!(v3_accepts_json(Some("application/json")));
        assert!(v3_accepts_json(Some(
            "application/com.github.proto-openapi.spec.v3@v1.0+protobuf, application/json"
        )));
        assert!(!v3_accepts_json(Some("application/yaml")));
        assert!(!v3_accepts_json(Some(
            "application/com.github.proto-openapi.spec.v3@v1.0+protobuf"
        )));
    }

    #[test]
    fn definition_names_reverse_the_group() {
        assert_eq!(
            definition_name("demo.kshard.dev", "v1", "Widget"),
            "dev.kshard.demo.v1.Widget"
        );
    }

    /// Every `$ref` in a document must resolve to a definition in it.
    pub fn dangling_refs(doc: &Value, prefix: &str, defs: &Map<String, Value>) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(v: &Value, prefix: &str, defs: &Map<String, Value>, out: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    // Other refs (v2's shared parameters) are checked apart.
                    if let Some(Value::String(r)) = o.get("$ref") {
                        if let Some(name) = r.strip_prefix(prefix) {
                            if !defs.contains_key(name) {
                                out.push(r.clone());
                            }
                        }
                    }
                    o.values().for_each(|x| walk(x, prefix, defs, out));
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, prefix, defs, out)),
                _ => {}
            }
        }
        walk(doc, prefix, defs, &mut out);
        out
    }

    /// Names kube-apiserver 1.36 gives these parameters in its `/openapi/v2`.
    #[test]
    fn shared_parameter_names_hash_as_kubes() {
        let pretty = r#"{"uniqueItems":true,"type":"string","description":"If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).","name":"pretty","in":"query"}"#;
        assert_eq!(parameter_hash(pretty), "tJGM1-ng");
        let namespace = r#"{"uniqueItems":true,"type":"string","description":"object name and auth scope, such as for teams and projects","name":"namespace","in":"path","required":true}"#;
        assert_eq!(parameter_hash(namespace), "vgWSWtn3");
        // The same text from the parameter as a `Value` (whose keys sort).
        let v: Value = serde_json::from_str(pretty).expect("json");
        assert_eq!(kube_parameter_json(&v), pretty);
        let v: Value = serde_json::from_str(namespace).expect("json");
        assert_eq!(kube_parameter_json(&v), namespace);
    }

    #[test]
    fn no_dangling_refs() {
        let mut c = Catalog::default();
        c.add_manifests(
            std::path::Path::new("w.yaml"),
            include_str!("../../crds/examples/widgets.yaml"),
        )
        .expect("crd");
        let v2doc = v2(&c);
        let defs = v2doc["definitions"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let d = dangling_refs(&v2doc, "#/definitions/", &defs);
        assert!(d.is_empty(), "{d:?}");
        let params = v2doc["parameters"].as_object().cloned().unwrap_or_default();
        let d = dangling_refs(&v2doc, "#/parameters/", &params);
        assert!(d.is_empty(), "{d:?}");
        assert!(
            params.contains_key("pretty-tJGM1-ng"),
            "{:?}",
            params.keys()
        );
        let v3doc = v3_group_version(&c, "demo.kshard.dev", "v1").expect("gv");
        let schemas = v3doc["components"]["schemas"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(dangling_refs(&v3doc, "#/components/schemas/", &schemas).is_empty());
        assert!(schemas.contains_key("dev.kshard.demo.v1.Widget"));
    }
}
