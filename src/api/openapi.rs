//! OpenAPI v2 and v3 documents generated from the CRD schemas, named as
//! kube-apiserver names them (`dev.kshard.demo.v1.Widget`), with the meta
//! types they reference, so `kubectl explain` and kubectl's field-validation
//! probing work.

use serde_json::{json, Map, Value};

use crate::registry::{Catalog, ResourceType};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

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

fn wrap_ref(v3: bool, r: Value) -> Value {
    // v3 documents wrap refs that carry siblings in allOf, as kube does.
    if v3 {
        json!({"allOf": [r], "default": {}})
    } else {
        r
    }
}

/// The meta types a CR schema refers to (a trimmed but complete closure).
fn meta_definitions(v3: bool) -> Map<String, Value> {
    let r = |n: &str| meta_ref(v3, n);
    let str_map =
        json!({"type": "object", "additionalProperties": {"type": "string", "default": ""}});
    let mut m = Map::new();
    m.insert(format!("{META}.Time"), json!({"type": "string", "format": "date-time", "description": "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON."}));
    m.insert(format!("{META}.FieldsV1"), json!({"type": "object", "description": "FieldsV1 stores a set of fields in a data structure like a Trie, in JSON format."}));
    m.insert(format!("{META}.ManagedFieldsEntry"), json!({"type": "object", "description": "ManagedFieldsEntry is a workflow-id, a FieldSet and the group version of the resource that the fieldset applies to.", "properties": {
        "apiVersion": {"type": "string"}, "fieldsType": {"type": "string"}, "fieldsV1": r("FieldsV1"),
        "manager": {"type": "string"}, "operation": {"type": "string"}, "subresource": {"type": "string"}, "time": r("Time")}}));
    m.insert(format!("{META}.OwnerReference"), json!({"type": "object", "required": ["apiVersion", "kind", "name", "uid"], "description": "OwnerReference contains enough information to let you identify an owning object.", "properties": {
        "apiVersion": {"type": "string", "default": ""}, "blockOwnerDeletion": {"type": "boolean"}, "controller": {"type": "boolean"},
        "kind": {"type": "string", "default": ""}, "name": {"type": "string", "default": ""}, "uid": {"type": "string", "default": ""}},
        "x-kubernetes-map-type": "atomic"}));
    m.insert(format!("{META}.ObjectMeta"), json!({"type": "object", "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.", "properties": {
        "annotations": str_map.clone(), "creationTimestamp": r("Time"), "deletionGracePeriodSeconds": {"type": "integer", "format": "int64"},
        "deletionTimestamp": r("Time"), "finalizers": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
        "generateName": {"type": "string"}, "generation": {"type": "integer", "format": "int64"}, "labels": str_map,
        "managedFields": {"type": "array", "items": r("ManagedFieldsEntry"), "x-kubernetes-list-type": "atomic"},
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "ownerReferences": {"type": "array", "items": r("OwnerReference"), "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map", "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
        "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}, "uid": {"type": "string"}}}));
    m.insert(format!("{META}.ListMeta"), json!({"type": "object", "description": "ListMeta describes metadata that synthetic resources must have, including lists and various status objects.", "properties": {
        "continue": {"type": "string"}, "remainingItemCount": {"type": "integer", "format": "int64"}, "resourceVersion": {"type": "string"}, "selfLink": {"type": "string"}}}));
    m.insert(format!("{META}.StatusCause"), json!({"type": "object", "properties": {"field": {"type": "string"}, "message": {"type": "string"}, "reason": {"type": "string"}}}));
    m.insert(format!("{META}.StatusDetails"), json!({"type": "object", "properties": {
        "causes": {"type": "array", "items": r("StatusCause"), "x-kubernetes-list-type": "atomic"}, "group": {"type": "string"}, "kind": {"type": "string"},
        "name": {"type": "string"}, "retryAfterSeconds": {"type": "integer", "format": "int32"}, "uid": {"type": "string"}}}));
    m.insert(format!("{META}.Status"), json!({"type": "object", "description": "Status is a return value for calls that don't return other objects.", "properties": {
        "apiVersion": {"type": "string"}, "code": {"type": "integer", "format": "int32"}, "details": r("StatusDetails"), "kind": {"type": "string"},
        "message": {"type": "string"}, "metadata": wrap_ref(v3, r("ListMeta")), "reason": {"type": "string"}, "status": {"type": "string"}},
        "x-kubernetes-group-version-kind": [{"group": "", "kind": "Status", "version": "v1"}]}));
    m.insert(format!("{META}.Preconditions"), json!({"type": "object", "properties": {"resourceVersion": {"type": "string"}, "uid": {"type": "string"}}}));
    m.insert(format!("{META}.DeleteOptions"), json!({"type": "object", "description": "DeleteOptions may be provided when deleting an API object.", "properties": {
        "apiVersion": {"type": "string"}, "dryRun": {"type": "array", "items": {"type": "string", "default": ""}, "x-kubernetes-list-type": "atomic"},
        "gracePeriodSeconds": {"type": "integer", "format": "int64"}, "kind": {"type": "string"}, "orphanDependents": {"type": "boolean"},
        "preconditions": r("Preconditions"), "propagationPolicy": {"type": "string"}}}));
    m.insert(format!("{META}.Patch"), json!({"type": "object", "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body."}));
    m
}

/// The schema of a CR kind with metadata wired to ObjectMeta.
fn kind_schema(rt: &ResourceType, version: &str, v3: bool) -> Value {
    let v = rt.version(version);
    let mut schema = v
        .and_then(|v| v.schema.clone())
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    if let Some(o) = schema.as_object_mut() {
        let props = o
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|p| {
                p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
                p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
                p.insert("metadata".into(), wrap_ref(v3, meta_ref(v3, "ObjectMeta")));
            });
        let _ = props;
        o.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": rt.group, "version": version, "kind": rt.kind}]),
        );
    }
    schema
}

fn list_schema(rt: &ResourceType, version: &str, v3: bool) -> Value {
    let prefix = if v3 {
        "#/components/schemas/"
    } else {
        "#/definitions/"
    };
    json!({
        "type": "object",
        "required": ["items"],
        "description": format!("{} is a list of {}", rt.list_kind, rt.kind),
        "properties": {
            "apiVersion": {"type": "string"},
            "items": {"type": "array", "items": {"$ref": format!("{prefix}{}", definition_name(&rt.group, version, &rt.kind))}},
            "kind": {"type": "string"},
            "metadata": wrap_ref(v3, meta_ref(v3, "ListMeta")),
        },
        "x-kubernetes-group-version-kind": [{"group": rt.group, "version": version, "kind": rt.list_kind}],
    })
}

fn query_param(v3: bool, name: &str, description: &str, type_: &str) -> Value {
    if v3 {
        json!({"name": name, "in": "query", "description": description, "schema": {"type": type_, "uniqueItems": true}})
    } else {
        json!({"name": name, "in": "query", "description": description, "type": type_, "uniqueItems": true})
    }
}

fn operation(
    v3: bool,
    rt: &ResourceType,
    version: &str,
    action: &str,
    op_id: String,
    ref_: &str,
    write: bool,
) -> Value {
    let prefix = if v3 {
        "#/components/schemas/"
    } else {
        "#/definitions/"
    };
    let response = if v3 {
        json!({"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("{prefix}{ref_}")}}}}})
    } else {
        json!({"200": {"description": "OK", "schema": {"$ref": format!("{prefix}{ref_}")}}})
    };
    let mut params = Vec::new();
    if write {
        params.push(query_param(
            v3,
            "dryRun",
            "When present, indicates that modifications should not be persisted.",
            "string",
        ));
        params.push(query_param(v3, "fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes.", "string"));
        params.push(query_param(v3, "fieldValidation", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields.", "string"));
    }
    json!({
        "tags": [format!("{}_{}", rt.group.replace('.', "_"), version)],
        "operationId": op_id,
        "parameters": params,
        "responses": response,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": version, "kind": rt.kind},
    })
}

fn paths_for(rt: &ResourceType, version: &str, v3: bool) -> Map<String, Value> {
    let kind_def = definition_name(&rt.group, version, &rt.kind);
    let list_def = definition_name(&rt.group, version, &rt.list_kind);
    let base = format!("/apis/{}/{}", rt.group, version);
    let coll = if rt.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", rt.plural)
    } else {
        format!("{base}/{}", rt.plural)
    };
    let ident = format!("{}{}", rt.kind, version);
    let mut paths = Map::new();
    paths.insert(coll.clone(), json!({
        "get": operation(v3, rt, version, "list", format!("list{ident}"), &list_def, false),
        "post": operation(v3, rt, version, "post", format!("create{ident}"), &kind_def, true),
        "delete": operation(v3, rt, version, "deletecollection", format!("deletecollection{ident}"), &format!("{META}.Status"), false),
    }));
    let item = format!("{coll}/{{name}}");
    paths.insert(item.clone(), json!({
        "get": operation(v3, rt, version, "get", format!("read{ident}"), &kind_def, false),
        "put": operation(v3, rt, version, "put", format!("replace{ident}"), &kind_def, true),
        "patch": operation(v3, rt, version, "patch", format!("patch{ident}"), &kind_def, true),
        "delete": operation(v3, rt, version, "delete", format!("delete{ident}"), &format!("{META}.Status"), false),
    }));
    if let Some(v) = rt.version(version) {
        if v.status_subresource {
            paths.insert(format!("{item}/status"), json!({
                "get": operation(v3, rt, version, "get", format!("read{ident}Status"), &kind_def, false),
                "put": operation(v3, rt, version, "put", format!("replace{ident}Status"), &kind_def, true),
                "patch": operation(v3, rt, version, "patch", format!("patch{ident}Status"), &kind_def, true),
            }));
        }
    }
    if rt.namespaced {
        paths.insert(format!("{base}/{}", rt.plural), json!({
            "get": operation(v3, rt, version, "list", format!("list{ident}ForAllNamespaces"), &list_def, false),
        }));
    }
    paths
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
    let mut defs = meta_definitions(false);
    for rt in &catalog.resources {
        for v in rt.served_versions() {
            paths.extend(paths_for(rt, &v.name, false));
            definitions_for(rt, &v.name, false, &mut defs);
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": defs,
    })
}

pub fn v3_group_version(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    let resources = catalog.resources_in(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = meta_definitions(true);
    for rt in resources {
        paths.extend(paths_for(rt, version, true));
        definitions_for(rt, version, true, &mut schemas);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
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

#[cfg(test)]
mod tests {
    use super::*;

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
                    if let Some(Value::String(r)) = o.get("$ref") {
                        let name = r.strip_prefix(prefix).unwrap_or(r);
                        if !defs.contains_key(name) {
                            out.push(r.clone());
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
        assert!(dangling_refs(&v2doc, "#/definitions/", &defs).is_empty());
        let v3doc = v3_group_version(&c, "demo.kshard.dev", "v1").expect("gv");
        let schemas = v3doc["components"]["schemas"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(dangling_refs(&v3doc, "#/components/schemas/", &schemas).is_empty());
        assert!(schemas.contains_key("dev.kshard.demo.v1.Widget"));
    }
}
