//! The OpenAPI v2 document as the protobuf message kube-apiserver serves for
//! `Accept: application/com.github.proto-openapi.spec.v2.v1.0+protobuf`:
//! gnostic's `openapi.v2.Document` (package `openapi.v2`, proto3), which
//! kube-openapi fills from its own document (`ToProtoBinary`).
//!
//! The messages are generated from gnostic's `OpenAPIv2.proto` (vendored
//! under `proto/`) and checked in under `generated/` (see `build.rs`); [`from_json`] converts as gnostic's
//! parser does: every map becomes a list of named entries in document order,
//! `x-` keys become vendor extensions whose values (like `default`, `enum`
//! and `example`) are carried as YAML text, a parameter is a body or a
//! query/path/header/formData one by its `in`, a `$ref` parameter or
//! response is a JSON reference. Keys gnostic does not know are left out
//! (gnostic refuses such a document; kshard's has none), and so are OAuth2
//! security schemes (kshard never declares one).

use prost::Message;
use serde_json::{Map, Value};

/// gnostic's messages, generated from `proto/openapiv2/OpenAPIv2.proto` and
/// checked in (`generated/`; `build.rs` checks them against a fresh
/// generation), in their protobuf packages (`openapi.v2` refers to
/// `google.protobuf.Any`).
#[allow(clippy::all)]
mod generated {
    pub mod google {
        pub mod protobuf {
            include!("generated/google.protobuf.rs");
        }
    }
    pub mod openapi {
        pub mod v2 {
            include!("generated/openapi.v2.rs");
        }
    }
}

pub use generated::openapi::v2::*;

/// The primitive keywords every non-body parameter and `PrimitivesItems`
/// share; each message numbers them from its own first one.
#[derive(Default)]
struct Primitive {
    type_: String,
    format: String,
    items: Option<PrimitivesItems>,
    collection_format: String,
    default: Option<Any>,
    maximum: f64,
    exclusive_maximum: bool,
    minimum: f64,
    exclusive_minimum: bool,
    max_length: i64,
    min_length: i64,
    pattern: String,
    max_items: i64,
    min_items: i64,
    unique_items: bool,
    enum_: Vec<Any>,
    multiple_of: f64,
    vendor_extension: Vec<NamedAny>,
}

// ---- JSON to protobuf, as gnostic's `ParseDocument` reads a document ----

/// The OpenAPI v2 JSON document as gnostic's `openapi_v2.Document`, encoded.
pub fn encode(doc: &Value) -> Vec<u8> {
    from_json(doc).encode_to_vec()
}

fn s(o: &Map<String, Value>, k: &str) -> String {
    o.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

fn b(o: &Map<String, Value>, k: &str) -> bool {
    o.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn f(o: &Map<String, Value>, k: &str) -> f64 {
    o.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

fn i(o: &Map<String, Value>, k: &str) -> i64 {
    o.get(k)
        .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|x| x as i64)))
        .unwrap_or(0)
}

fn strings(o: &Map<String, Value>, k: &str) -> Vec<String> {
    match o.get(k) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Some(Value::String(one)) => vec![one.clone()],
        _ => Vec::new(),
    }
}

fn obj<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Map<String, Value>> {
    o.get(k).and_then(Value::as_object)
}

/// A free-form value: YAML text, as gnostic's `NewAny` marshals it.
fn any(v: &Value) -> Any {
    let yaml = serde_saphyr::to_string(v)
        .or_else(|_| serde_json::to_string(v).map(|j| format!("{j}\n")))
        .unwrap_or_default();
    Any { value: None, yaml }
}

fn any_opt(o: &Map<String, Value>, k: &str) -> Option<Any> {
    o.get(k).map(any)
}

fn anys(o: &Map<String, Value>, k: &str) -> Vec<Any> {
    o.get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().map(any).collect())
        .unwrap_or_default()
}

/// The `x-` keys of an object, in order.
fn extensions(o: &Map<String, Value>) -> Vec<NamedAny> {
    o.iter()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, v)| NamedAny {
            name: k.clone(),
            value: Some(any(v)),
        })
        .collect()
}

fn external_docs(o: &Map<String, Value>) -> Option<ExternalDocs> {
    obj(o, "externalDocs").map(|d| ExternalDocs {
        description: s(d, "description"),
        url: s(d, "url"),
        vendor_extension: extensions(d),
    })
}

pub fn from_json(doc: &Value) -> Document {
    let empty = Map::new();
    let o = doc.as_object().unwrap_or(&empty);
    Document {
        swagger: s(o, "swagger"),
        info: obj(o, "info").map(info),
        host: s(o, "host"),
        base_path: s(o, "basePath"),
        schemes: strings(o, "schemes"),
        consumes: strings(o, "consumes"),
        produces: strings(o, "produces"),
        paths: obj(o, "paths").map(paths),
        definitions: obj(o, "definitions").map(|d| Definitions {
            additional_properties: named_schemas(d),
        }),
        parameters: obj(o, "parameters").map(|d| ParameterDefinitions {
            additional_properties: d
                .iter()
                .filter_map(|(k, v)| {
                    v.as_object().map(|p| NamedParameter {
                        name: k.clone(),
                        value: Some(parameter(p)),
                    })
                })
                .collect(),
        }),
        responses: obj(o, "responses").map(|d| ResponseDefinitions {
            additional_properties: d
                .iter()
                .filter_map(|(k, v)| {
                    v.as_object().map(|r| NamedResponse {
                        name: k.clone(),
                        value: Some(response(r)),
                    })
                })
                .collect(),
        }),
        security: security(o),
        security_definitions: obj(o, "securityDefinitions").map(|d| SecurityDefinitions {
            additional_properties: d
                .iter()
                .filter_map(|(k, v)| {
                    let item = v.as_object()?;
                    let oneof = match item.get("type").and_then(Value::as_str) {
                        Some("basic") => {
                            security_definitions_item::Oneof::BasicAuthenticationSecurity(
                                BasicAuthenticationSecurity {
                                    r#type: s(item, "type"),
                                    description: s(item, "description"),
                                    vendor_extension: extensions(item),
                                },
                            )
                        }
                        Some("apiKey") => {
                            security_definitions_item::Oneof::ApiKeySecurity(ApiKeySecurity {
                                r#type: s(item, "type"),
                                name: s(item, "name"),
                                r#in: s(item, "in"),
                                description: s(item, "description"),
                                vendor_extension: extensions(item),
                            })
                        }
                        _ => return None,
                    };
                    Some(NamedSecurityDefinitionsItem {
                        name: k.clone(),
                        value: Some(SecurityDefinitionsItem { oneof: Some(oneof) }),
                    })
                })
                .collect(),
        }),
        tags: o
            .get("tags")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_object)
                    .map(|t| Tag {
                        name: s(t, "name"),
                        description: s(t, "description"),
                        external_docs: external_docs(t),
                        vendor_extension: extensions(t),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        external_docs: external_docs(o),
        vendor_extension: extensions(o),
    }
}

fn info(o: &Map<String, Value>) -> Info {
    Info {
        title: s(o, "title"),
        version: s(o, "version"),
        description: s(o, "description"),
        terms_of_service: s(o, "termsOfService"),
        contact: obj(o, "contact").map(|c| Contact {
            name: s(c, "name"),
            url: s(c, "url"),
            email: s(c, "email"),
            vendor_extension: extensions(c),
        }),
        license: obj(o, "license").map(|l| License {
            name: s(l, "name"),
            url: s(l, "url"),
            vendor_extension: extensions(l),
        }),
        vendor_extension: extensions(o),
    }
}

fn security(o: &Map<String, Value>) -> Vec<SecurityRequirement> {
    o.get("security")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_object)
                .map(|req| SecurityRequirement {
                    additional_properties: req
                        .iter()
                        .map(|(k, v)| NamedStringArray {
                            name: k.clone(),
                            value: Some(StringArray {
                                value: v
                                    .as_array()
                                    .map(|a| {
                                        a.iter()
                                            .filter_map(|x| x.as_str().map(str::to_string))
                                            .collect()
                                    })
                                    .unwrap_or_default(),
                            }),
                        })
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn paths(o: &Map<String, Value>) -> Paths {
    Paths {
        vendor_extension: extensions(o),
        path: o
            .iter()
            .filter(|(k, _)| k.starts_with('/'))
            .filter_map(|(k, v)| {
                v.as_object().map(|p| NamedPathItem {
                    name: k.clone(),
                    value: Some(path_item(p)),
                })
            })
            .collect(),
    }
}

fn path_item(o: &Map<String, Value>) -> PathItem {
    let op = |k: &str| obj(o, k).map(operation);
    PathItem {
        r#ref: s(o, "$ref"),
        get: op("get"),
        put: op("put"),
        post: op("post"),
        delete: op("delete"),
        options: op("options"),
        head: op("head"),
        patch: op("patch"),
        parameters: parameters(o),
        vendor_extension: extensions(o),
    }
}

fn operation(o: &Map<String, Value>) -> Operation {
    Operation {
        tags: strings(o, "tags"),
        summary: s(o, "summary"),
        description: s(o, "description"),
        external_docs: external_docs(o),
        operation_id: s(o, "operationId"),
        produces: strings(o, "produces"),
        consumes: strings(o, "consumes"),
        parameters: parameters(o),
        responses: obj(o, "responses").map(|r| Responses {
            response_code: r
                .iter()
                .filter(|(k, _)| {
                    k.as_str() == "default"
                        || (k.len() == 3 && k.bytes().all(|c| c.is_ascii_digit()))
                })
                .filter_map(|(k, v)| {
                    let v = v.as_object()?;
                    let oneof = if v.contains_key("$ref") {
                        response_value::Oneof::JsonReference(json_reference(v))
                    } else {
                        response_value::Oneof::Response(response(v))
                    };
                    Some(NamedResponseValue {
                        name: k.clone(),
                        value: Some(ResponseValue { oneof: Some(oneof) }),
                    })
                })
                .collect(),
            vendor_extension: extensions(r),
        }),
        schemes: strings(o, "schemes"),
        deprecated: b(o, "deprecated"),
        security: security(o),
        vendor_extension: extensions(o),
    }
}

fn json_reference(o: &Map<String, Value>) -> JsonReference {
    JsonReference {
        r#ref: s(o, "$ref"),
        description: s(o, "description"),
    }
}

fn parameters(o: &Map<String, Value>) -> Vec<ParametersItem> {
    o.get("parameters")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_object)
                .map(|p| ParametersItem {
                    oneof: Some(if p.contains_key("$ref") {
                        parameters_item::Oneof::JsonReference(json_reference(p))
                    } else {
                        parameters_item::Oneof::Parameter(parameter(p))
                    }),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn primitive(o: &Map<String, Value>) -> Primitive {
    Primitive {
        type_: s(o, "type"),
        format: s(o, "format"),
        items: obj(o, "items").map(primitives_items),
        collection_format: s(o, "collectionFormat"),
        default: any_opt(o, "default"),
        maximum: f(o, "maximum"),
        exclusive_maximum: b(o, "exclusiveMaximum"),
        minimum: f(o, "minimum"),
        exclusive_minimum: b(o, "exclusiveMinimum"),
        max_length: i(o, "maxLength"),
        min_length: i(o, "minLength"),
        pattern: s(o, "pattern"),
        max_items: i(o, "maxItems"),
        min_items: i(o, "minItems"),
        unique_items: b(o, "uniqueItems"),
        enum_: anys(o, "enum"),
        multiple_of: f(o, "multipleOf"),
        vendor_extension: extensions(o),
    }
}

fn primitives_items(o: &Map<String, Value>) -> PrimitivesItems {
    let p = primitive(o);
    PrimitivesItems {
        r#type: p.type_,
        format: p.format,
        items: p.items.map(Box::new),
        collection_format: p.collection_format,
        default: p.default,
        maximum: p.maximum,
        exclusive_maximum: p.exclusive_maximum,
        minimum: p.minimum,
        exclusive_minimum: p.exclusive_minimum,
        max_length: p.max_length,
        min_length: p.min_length,
        pattern: p.pattern,
        max_items: p.max_items,
        min_items: p.min_items,
        unique_items: p.unique_items,
        r#enum: p.enum_,
        multiple_of: p.multiple_of,
        vendor_extension: p.vendor_extension,
    }
}

/// A body parameter by `in: body`, otherwise the non-body kind its `in` names.
fn parameter(o: &Map<String, Value>) -> Parameter {
    let in_ = s(o, "in");
    if in_ == "body" {
        return Parameter {
            oneof: Some(parameter::Oneof::BodyParameter(BodyParameter {
                description: s(o, "description"),
                name: s(o, "name"),
                r#in: in_,
                required: b(o, "required"),
                schema: obj(o, "schema").map(schema),
                vendor_extension: extensions(o),
            })),
        };
    }
    let (required, description, name) = (b(o, "required"), s(o, "description"), s(o, "name"));
    let allow_empty_value = b(o, "allowEmptyValue");
    let p = primitive(o);
    use non_body_parameter::Oneof as N;
    macro_rules! sub {
        ($t:ident $(, $extra:ident)?) => {
            $t {
                required,
                r#in: in_.clone(),
                description,
                name,
                $($extra,)?
                r#type: p.type_,
                format: p.format,
                items: p.items,
                collection_format: p.collection_format,
                default: p.default,
                maximum: p.maximum,
                exclusive_maximum: p.exclusive_maximum,
                minimum: p.minimum,
                exclusive_minimum: p.exclusive_minimum,
                max_length: p.max_length,
                min_length: p.min_length,
                pattern: p.pattern,
                max_items: p.max_items,
                min_items: p.min_items,
                unique_items: p.unique_items,
                r#enum: p.enum_,
                multiple_of: p.multiple_of,
                vendor_extension: p.vendor_extension,
            }
        };
    }
    let non_body = match in_.as_str() {
        "header" => N::HeaderParameterSubSchema(sub!(HeaderParameterSubSchema)),
        "formData" => {
            N::FormDataParameterSubSchema(sub!(FormDataParameterSubSchema, allow_empty_value))
        }
        "path" => N::PathParameterSubSchema(sub!(PathParameterSubSchema)),
        _ => N::QueryParameterSubSchema(sub!(QueryParameterSubSchema, allow_empty_value)),
    };
    Parameter {
        oneof: Some(parameter::Oneof::NonBodyParameter(NonBodyParameter {
            oneof: Some(non_body),
        })),
    }
}

fn response(o: &Map<String, Value>) -> Response {
    Response {
        description: s(o, "description"),
        schema: obj(o, "schema").map(|sc| SchemaItem {
            oneof: Some(if sc.get("type").and_then(Value::as_str) == Some("file") {
                schema_item::Oneof::FileSchema(FileSchema {
                    format: s(sc, "format"),
                    title: s(sc, "title"),
                    description: s(sc, "description"),
                    default: any_opt(sc, "default"),
                    required: strings(sc, "required"),
                    r#type: s(sc, "type"),
                    read_only: b(sc, "readOnly"),
                    external_docs: external_docs(sc),
                    example: any_opt(sc, "example"),
                    vendor_extension: extensions(sc),
                })
            } else {
                schema_item::Oneof::Schema(schema(sc))
            }),
        }),
        headers: obj(o, "headers").map(|h| Headers {
            additional_properties: h
                .iter()
                .filter_map(|(k, v)| {
                    let v = v.as_object()?;
                    let p = primitive(v);
                    Some(NamedHeader {
                        name: k.clone(),
                        value: Some(Header {
                            r#type: p.type_,
                            format: p.format,
                            items: p.items,
                            collection_format: p.collection_format,
                            default: p.default,
                            maximum: p.maximum,
                            exclusive_maximum: p.exclusive_maximum,
                            minimum: p.minimum,
                            exclusive_minimum: p.exclusive_minimum,
                            max_length: p.max_length,
                            min_length: p.min_length,
                            pattern: p.pattern,
                            max_items: p.max_items,
                            min_items: p.min_items,
                            unique_items: p.unique_items,
                            r#enum: p.enum_,
                            multiple_of: p.multiple_of,
                            description: s(v, "description"),
                            vendor_extension: p.vendor_extension,
                        }),
                    })
                })
                .collect(),
        }),
        examples: obj(o, "examples").map(|e| Examples {
            additional_properties: e
                .iter()
                .map(|(k, v)| NamedAny {
                    name: k.clone(),
                    value: Some(any(v)),
                })
                .collect(),
        }),
        vendor_extension: extensions(o),
    }
}

fn named_schemas(o: &Map<String, Value>) -> Vec<NamedSchema> {
    o.iter()
        .filter_map(|(k, v)| {
            v.as_object().map(|sc| NamedSchema {
                name: k.clone(),
                value: Some(schema(sc)),
            })
        })
        .collect()
}

pub fn schema(o: &Map<String, Value>) -> Schema {
    Schema {
        r#ref: s(o, "$ref"),
        format: s(o, "format"),
        title: s(o, "title"),
        description: s(o, "description"),
        default: any_opt(o, "default"),
        multiple_of: f(o, "multipleOf"),
        maximum: f(o, "maximum"),
        exclusive_maximum: b(o, "exclusiveMaximum"),
        minimum: f(o, "minimum"),
        exclusive_minimum: b(o, "exclusiveMinimum"),
        max_length: i(o, "maxLength"),
        min_length: i(o, "minLength"),
        pattern: s(o, "pattern"),
        max_items: i(o, "maxItems"),
        min_items: i(o, "minItems"),
        unique_items: b(o, "uniqueItems"),
        max_properties: i(o, "maxProperties"),
        min_properties: i(o, "minProperties"),
        required: strings(o, "required"),
        r#enum: anys(o, "enum"),
        additional_properties: o.get("additionalProperties").and_then(|v| {
            let oneof = match v {
                Value::Bool(x) => additional_properties_item::Oneof::Boolean(*x),
                Value::Object(sc) => {
                    additional_properties_item::Oneof::Schema(Box::new(schema(sc)))
                }
                _ => return None,
            };
            Some(Box::new(AdditionalPropertiesItem { oneof: Some(oneof) }))
        }),
        r#type: o.get("type").map(|_| TypeItem {
            value: strings(o, "type"),
        }),
        items: o.get("items").map(|v| ItemsItem {
            schema: match v {
                Value::Object(sc) => vec![schema(sc)],
                Value::Array(a) => a.iter().filter_map(Value::as_object).map(schema).collect(),
                _ => Vec::new(),
            },
        }),
        all_of: o
            .get("allOf")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_object).map(schema).collect())
            .unwrap_or_default(),
        properties: obj(o, "properties").map(|p| Properties {
            additional_properties: named_schemas(p),
        }),
        discriminator: s(o, "discriminator"),
        read_only: b(o, "readOnly"),
        xml: obj(o, "xml").map(|x| Xml {
            name: s(x, "name"),
            namespace: s(x, "namespace"),
            prefix: s(x, "prefix"),
            attribute: b(x, "attribute"),
            wrapped: b(x, "wrapped"),
            vendor_extension: extensions(x),
        }),
        external_docs: external_docs(o),
        example: any_opt(o, "example"),
        vendor_extension: extensions(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_the_parts_kubectl_reads() {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.35.0"},
            "paths": {
                "/apis/g/v1/things/{name}": {
                    "get": {
                        "operationId": "readGV1Thing",
                        "tags": ["g_v1"],
                        "parameters": [
                            {"name": "pretty", "in": "query", "type": "string", "uniqueItems": true},
                            {"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/x"}},
                        ],
                        "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/x"}}},
                        "x-kubernetes-action": "get",
                    },
                    "parameters": [{"name": "name", "in": "path", "required": true, "type": "string"}],
                },
            },
            "definitions": {
                "x": {
                    "type": "object",
                    "required": ["a"],
                    "properties": {
                        "a": {"type": "integer", "format": "int32", "minimum": 0},
                        "m": {"type": "object", "additionalProperties": {"type": "string"}},
                        "l": {"type": "array", "items": {"type": "string"}},
                    },
                    "x-kubernetes-group-version-kind": [{"group": "g", "kind": "Thing", "version": "v1"}],
                },
            },
        });
        let bytes = encode(&doc);
        let back = Document::decode(bytes.as_slice()).expect("decodes");
        assert_eq!(back.swagger, "2.0");
        let path = &back.paths.as_ref().expect("paths").path[0];
        assert_eq!(path.name, "/apis/g/v1/things/{name}");
        let item = path.value.as_ref().expect("item");
        let get = item.get.as_ref().expect("get");
        assert_eq!(get.operation_id, "readGV1Thing");
        assert_eq!(get.vendor_extension[0].name, "x-kubernetes-action");
        assert_eq!(
            get.vendor_extension[0]
                .value
                .as_ref()
                .map(|a| a.yaml.as_str()),
            Some("get\n")
        );
        assert!(matches!(
            get.parameters[1].oneof,
            Some(parameters_item::Oneof::Parameter(Parameter {
                oneof: Some(parameter::Oneof::BodyParameter(_))
            }))
        ));
        assert!(matches!(
            item.parameters[0].oneof,
            Some(parameters_item::Oneof::Parameter(Parameter {
                oneof: Some(parameter::Oneof::NonBodyParameter(NonBodyParameter {
                    oneof: Some(non_body_parameter::Oneof::PathParameterSubSchema(_))
                }))
            }))
        ));
        let def = &back
            .definitions
            .as_ref()
            .expect("defs")
            .additional_properties[0];
        let x = def.value.as_ref().expect("schema");
        assert_eq!(
            x.r#type.as_ref().map(|t| t.value.clone()),
            Some(vec!["object".to_string()])
        );
        assert_eq!(x.required, vec!["a"]);
        let props = &x.properties.as_ref().expect("props").additional_properties;
        assert_eq!(
            props[0].value.as_ref().map(|p| p.format.as_str()),
            Some("int32")
        );
        // Properties come in kube's (sorted) order: a, l, m.
        assert_eq!(props[2].name, "m");
        assert!(matches!(
            props[2]
                .value
                .as_ref()
                .and_then(|p| p.additional_properties.as_ref())
                .and_then(|a| a.oneof.as_ref()),
            Some(additional_properties_item::Oneof::Schema(_))
        ));
        assert_eq!(
            props[1]
                .value
                .as_ref()
                .and_then(|p| p.items.as_ref())
                .map(|i| i.schema.len()),
            Some(1)
        );
        let gvk: Value =
            serde_saphyr::from_str(&x.vendor_extension[0].value.as_ref().expect("gvk").yaml)
                .expect("yaml");
        assert_eq!(
            gvk,
            json!([{"group": "g", "kind": "Thing", "version": "v1"}])
        );
    }
}
