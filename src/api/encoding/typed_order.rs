//! JSON in the field order of kube's Go structs. kube encodes custom
//! resources from maps (keys sorted, as a `serde_json::Value` writes them)
//! but its own kinds (Status, Table, PartialObjectMetadata, Scale,
//! discovery, reviews) from structs, fields in declaration order.
//! [`Shape`] is such a struct's order, with the shape of each field's value;
//! [`to_vec`] writes a document in the order of its kind's shape.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

/// How kube orders the keys of a JSON value.
#[derive(Clone, Copy)]
pub enum Shape {
    /// A Go map, or a custom resource: keys sorted (a `Value`'s own order).
    Sorted,
    /// A Go struct: these fields in this order, each value of its shape (an
    /// array's elements each take it); keys the struct lacks follow, sorted.
    Struct(&'static [(&'static str, Shape)]),
    /// An embedded object (a `RawExtension`): its own kind decides.
    Embedded,
}

use Shape::{Embedded, Sorted as S, Struct};

const GVK: Shape = Struct(&[("group", S), ("version", S), ("kind", S)]);
const GVR: Shape = Struct(&[("group", S), ("version", S), ("resource", S)]);

const OWNER_REFERENCE: Shape = Struct(&[
    ("apiVersion", S),
    ("kind", S),
    ("name", S),
    ("uid", S),
    ("controller", S),
    ("blockOwnerDeletion", S),
]);

const MANAGED_FIELDS_ENTRY: Shape = Struct(&[
    ("manager", S),
    ("operation", S),
    ("apiVersion", S),
    ("time", S),
    ("fieldsType", S),
    ("fieldsV1", S),
    ("subresource", S),
]);

const OBJECT_META_SHAPE: &[(&str, Shape)] = &[
    ("name", S),
    ("generateName", S),
    ("namespace", S),
    ("selfLink", S),
    ("uid", S),
    ("resourceVersion", S),
    ("generation", S),
    ("creationTimestamp", S),
    ("deletionTimestamp", S),
    ("deletionGracePeriodSeconds", S),
    ("labels", S),
    ("annotations", S),
    ("ownerReferences", OWNER_REFERENCE),
    ("finalizers", S),
    ("managedFields", MANAGED_FIELDS_ENTRY),
];
const OBJECT_META: Shape = Struct(OBJECT_META_SHAPE);

const LIST_META: Shape = Struct(&[
    ("selfLink", S),
    ("resourceVersion", S),
    ("continue", S),
    ("remainingItemCount", S),
]);

const STATUS: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", LIST_META),
    ("status", S),
    ("message", S),
    ("reason", S),
    (
        "details",
        Struct(&[
            ("name", S),
            ("group", S),
            ("kind", S),
            ("uid", S),
            (
                "causes",
                Struct(&[("reason", S), ("message", S), ("field", S)]),
            ),
            ("retryAfterSeconds", S),
        ]),
    ),
    ("code", S),
]);

const PARTIAL_OBJECT_METADATA: Shape =
    Struct(&[("kind", S), ("apiVersion", S), ("metadata", OBJECT_META)]);

const PARTIAL_OBJECT_METADATA_LIST: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", LIST_META),
    ("items", PARTIAL_OBJECT_METADATA),
]);

const TABLE: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", LIST_META),
    (
        "columnDefinitions",
        Struct(&[
            ("name", S),
            ("type", S),
            ("format", S),
            ("description", S),
            ("priority", S),
        ]),
    ),
    (
        "rows",
        Struct(&[
            ("cells", S),
            (
                "conditions",
                Struct(&[("type", S), ("status", S), ("reason", S), ("message", S)]),
            ),
            ("object", Embedded),
        ]),
    ),
]);

const SCALE: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", OBJECT_META),
    ("spec", Struct(&[("replicas", S)])),
    ("status", Struct(&[("replicas", S), ("selector", S)])),
]);

const GROUP_VERSION_FOR_DISCOVERY: Shape = Struct(&[("groupVersion", S), ("version", S)]);

const SERVER_ADDRESS_BY_CLIENT_CIDR: Shape = Struct(&[("clientCIDR", S), ("serverAddress", S)]);

const API_GROUP: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("name", S),
    ("versions", GROUP_VERSION_FOR_DISCOVERY),
    ("preferredVersion", GROUP_VERSION_FOR_DISCOVERY),
    ("serverAddressByClientCIDRs", SERVER_ADDRESS_BY_CLIENT_CIDR),
]);

const API_GROUP_LIST: Shape = Struct(&[("kind", S), ("apiVersion", S), ("groups", API_GROUP)]);

const API_VERSIONS: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("versions", S),
    ("serverAddressByClientCIDRs", SERVER_ADDRESS_BY_CLIENT_CIDR),
]);

const API_RESOURCE_LIST: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("groupVersion", S),
    (
        "resources",
        Struct(&[
            ("name", S),
            ("singularName", S),
            ("namespaced", S),
            ("group", S),
            ("version", S),
            ("kind", S),
            ("verbs", S),
            ("shortNames", S),
            ("categories", S),
            ("storageVersionHash", S),
        ]),
    ),
]);

/// `apidiscovery.k8s.io` v2 (and v2beta1, the same fields).
const API_GROUP_DISCOVERY_LIST: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", LIST_META),
    (
        "items",
        Struct(&[
            ("kind", S),
            ("apiVersion", S),
            ("metadata", OBJECT_META),
            (
                "versions",
                Struct(&[
                    ("version", S),
                    (
                        "resources",
                        Struct(&[
                            ("resource", S),
                            ("responseKind", GVK),
                            ("scope", S),
                            ("singularResource", S),
                            ("verbs", S),
                            ("shortNames", S),
                            ("categories", S),
                            (
                                "subresources",
                                Struct(&[
                                    ("subresource", S),
                                    ("responseKind", GVK),
                                    ("acceptedTypes", GVK),
                                    ("verbs", S),
                                ]),
                            ),
                        ]),
                    ),
                    ("freshness", S),
                ]),
            ),
        ]),
    ),
]);

const LABEL_SELECTOR_ATTRIBUTES: Shape = Struct(&[
    ("rawSelector", S),
    (
        "requirements",
        Struct(&[("key", S), ("operator", S), ("values", S)]),
    ),
]);

const RESOURCE_ATTRIBUTES: Shape = Struct(&[
    ("namespace", S),
    ("verb", S),
    ("group", S),
    ("version", S),
    ("resource", S),
    ("subresource", S),
    ("name", S),
    ("fieldSelector", LABEL_SELECTOR_ATTRIBUTES),
    ("labelSelector", LABEL_SELECTOR_ATTRIBUTES),
]);

const USER_INFO: Shape = Struct(&[("username", S), ("uid", S), ("groups", S), ("extra", S)]);

/// `authorization.k8s.io` access reviews (self, local and plain).
const SUBJECT_ACCESS_REVIEW: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", OBJECT_META),
    (
        "spec",
        Struct(&[
            ("resourceAttributes", RESOURCE_ATTRIBUTES),
            ("nonResourceAttributes", Struct(&[("path", S), ("verb", S)])),
            ("user", S),
            ("groups", S),
            ("extra", S),
            ("uid", S),
        ]),
    ),
    (
        "status",
        Struct(&[
            ("allowed", S),
            ("denied", S),
            ("reason", S),
            ("evaluationError", S),
        ]),
    ),
]);

const SELF_SUBJECT_RULES_REVIEW: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", OBJECT_META),
    ("spec", Struct(&[("namespace", S)])),
    (
        "status",
        Struct(&[
            (
                "resourceRules",
                Struct(&[
                    ("verbs", S),
                    ("apiGroups", S),
                    ("resources", S),
                    ("resourceNames", S),
                ]),
            ),
            (
                "nonResourceRules",
                Struct(&[("verbs", S), ("nonResourceURLs", S)]),
            ),
            ("incomplete", S),
            ("evaluationError", S),
        ]),
    ),
]);

const SELF_SUBJECT_REVIEW: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("metadata", OBJECT_META),
    ("status", Struct(&[("userInfo", USER_INFO)])),
]);

/// `/version` (kube's `version.Info`; it has no kind).
pub const VERSION_INFO: Shape = Struct(&[
    ("major", S),
    ("minor", S),
    ("emulationMajor", S),
    ("emulationMinor", S),
    ("minCompatibilityMajor", S),
    ("minCompatibilityMinor", S),
    ("gitVersion", S),
    ("gitCommit", S),
    ("gitTreeState", S),
    ("buildDate", S),
    ("goVersion", S),
    ("compiler", S),
    ("platform", S),
]);

/// `admission.k8s.io/v1` AdmissionReview, as kube sends it to a webhook:
/// the objects in it are the custom resources' own (sorted), the options
/// kube's `CreateOptions`, `UpdateOptions` or `DeleteOptions`.
const ADMISSION_REVIEW: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    (
        "request",
        Struct(&[
            ("uid", S),
            ("kind", GVK),
            ("resource", GVR),
            ("subResource", S),
            ("requestKind", GVK),
            ("requestResource", GVR),
            ("requestSubResource", S),
            ("name", S),
            ("namespace", S),
            ("operation", S),
            ("userInfo", USER_INFO),
            ("object", Embedded),
            ("oldObject", Embedded),
            ("dryRun", S),
            ("options", Embedded),
        ]),
    ),
    ("response", S),
]);

/// kube's options kinds (`meta.k8s.io/v1`), as embedded in admission reviews.
const CREATE_OPTIONS: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("dryRun", S),
    ("fieldManager", S),
    ("fieldValidation", S),
]);
const UPDATE_OPTIONS: Shape = CREATE_OPTIONS;
const PATCH_OPTIONS: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("dryRun", S),
    ("force", S),
    ("fieldManager", S),
    ("fieldValidation", S),
]);
const DELETE_OPTIONS: Shape = Struct(&[
    ("kind", S),
    ("apiVersion", S),
    ("gracePeriodSeconds", S),
    (
        "preconditions",
        Struct(&[("uid", S), ("resourceVersion", S)]),
    ),
    ("orphanDependents", S),
    ("propagationPolicy", S),
    ("dryRun", S),
    ("ignoreStoreReadErrorWithClusterBreakingPotential", S),
]);

/// The shape of a document of kube's own kinds (`Sorted` for anything else:
/// a custom resource, or its list). The group is checked too, so that a
/// custom resource named like one of kube's kinds stays a map.
pub fn of_document(doc: &Value) -> Shape {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    match (group, kind) {
        ("", "Status") => STATUS,
        ("", "APIGroup") => API_GROUP,
        ("", "APIGroupList") => API_GROUP_LIST,
        ("", "APIVersions") => API_VERSIONS,
        ("", "APIResourceList") => API_RESOURCE_LIST,
        ("meta.k8s.io", "Table") => TABLE,
        ("meta.k8s.io", "PartialObjectMetadata") => PARTIAL_OBJECT_METADATA,
        ("meta.k8s.io", "PartialObjectMetadataList") => PARTIAL_OBJECT_METADATA_LIST,
        ("meta.k8s.io", "CreateOptions") => CREATE_OPTIONS,
        ("meta.k8s.io", "UpdateOptions") => UPDATE_OPTIONS,
        ("meta.k8s.io", "PatchOptions") => PATCH_OPTIONS,
        ("meta.k8s.io", "DeleteOptions") => DELETE_OPTIONS,
        ("autoscaling", "Scale") => SCALE,
        ("apidiscovery.k8s.io", "APIGroupDiscoveryList") => API_GROUP_DISCOVERY_LIST,
        (
            "authorization.k8s.io",
            "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview",
        ) => SUBJECT_ACCESS_REVIEW,
        ("authorization.k8s.io", "SelfSubjectRulesReview") => SELF_SUBJECT_RULES_REVIEW,
        ("authentication.k8s.io", "SelfSubjectReview") => SELF_SUBJECT_REVIEW,
        ("admission.k8s.io", "AdmissionReview") => ADMISSION_REVIEW,
        _ => S,
    }
}

/// A `Value` serialized with its keys in the order `Shape` gives.
struct Shaped<'a>(pub &'a Value, pub Shape);

impl Serialize for Shaped<'_> {
    fn serialize<Ser: Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
        let shape = match self.1 {
            Embedded => of_document(self.0),
            other => other,
        };
        match (self.0, shape) {
            (Value::Object(m), Struct(fields)) => {
                let mut map = serializer.serialize_map(Some(m.len()))?;
                for (name, field_shape) in fields {
                    if let Some(v) = m.get(*name) {
                        map.serialize_entry(name, &Shaped(v, *field_shape))?;
                    }
                }
                // Keys the struct does not have, sorted (the map's order).
                for (k, v) in m {
                    if !fields.iter().any(|(name, _)| name == k) {
                        map.serialize_entry(k, v)?;
                    }
                }
                map.end()
            }
            (Value::Array(a), Struct(_)) => {
                let mut seq = serializer.serialize_seq(Some(a.len()))?;
                for x in a {
                    seq.serialize_element(&Shaped(x, shape))?;
                }
                seq.end()
            }
            (other, _) => other.serialize(serializer),
        }
    }
}

/// A document's bytes, in the order kube writes its kind.
pub fn to_vec(doc: &Value) -> Vec<u8> {
    to_vec_as(doc, of_document(doc))
}

/// A value's bytes in the order of `shape`.
pub fn to_vec_as(v: &Value, shape: Shape) -> Vec<u8> {
    match shape {
        S => serde_json::to_vec(v),
        _ => serde_json::to_vec(&Shaped(v, shape)),
    }
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: &Value) -> String {
        String::from_utf8(to_vec(v)).expect("utf8")
    }

    #[test]
    fn a_scale_is_written_as_kube_writes_it() {
        let scale = json!({
            "status": {"selector": "app=a", "replicas": 2},
            "spec": {"replicas": 3},
            "metadata": {"uid": "u", "creationTimestamp": "t", "name": "a", "namespace": "n", "resourceVersion": "7"},
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
        });
        // kube-apiserver 1.36's answer for a CR's /scale, byte for byte.
        assert_eq!(
            text(&scale),
            r#"{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"7","creationTimestamp":"t"},"spec":{"replicas":3},"status":{"replicas":2,"selector":"app=a"}}"#
        );
    }

    #[test]
    fn custom_resources_stay_sorted_and_unknown_keys_follow_sorted() {
        // A custom resource, even one named like kube's kinds, is a map.
        let cr = json!({"kind": "Table", "apiVersion": "example.com/v1", "metadata": {"name": "t"}, "columnDefinitions": []});
        assert_eq!(
            text(&cr),
            r#"{"apiVersion":"example.com/v1","columnDefinitions":[],"kind":"Table","metadata":{"name":"t"}}"#
        );
        let status = json!({"zz": 1, "code": 404, "kind": "Status", "apiVersion": "v1", "aa": 2});
        assert_eq!(
            text(&status),
            r#"{"kind":"Status","apiVersion":"v1","code":404,"aa":2,"zz":1}"#
        );
    }

    #[test]
    fn a_table_row_embeds_its_object_by_the_objects_kind() {
        let table = json!({
            "rows": [
                {"object": {"metadata": {"uid": "u", "name": "a"}, "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata"}, "cells": ["a"]},
                {"object": {"spec": {"b": 1, "a": 2}, "kind": "Thing", "apiVersion": "example.com/v1"}, "cells": ["b"]},
            ],
            "metadata": {"resourceVersion": "3"},
            "columnDefinitions": [{"type": "string", "name": "Name", "priority": 0, "format": "name", "description": "d"}],
            "apiVersion": "meta.k8s.io/v1",
            "kind": "Table",
        });
        assert_eq!(
            text(&table),
            concat!(
                r#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"3"},"#,
                r#""columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"d","priority":0}],"#,
                r#""rows":[{"cells":["a"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","uid":"u"}}},"#,
                r#"{"cells":["b"],"object":{"apiVersion":"example.com/v1","kind":"Thing","spec":{"a":2,"b":1}}}]}"#
            )
        );
    }

    #[test]
    fn object_meta_shape_names_the_fields_of_object_meta() {
        let names: Vec<&str> = OBJECT_META_SHAPE.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, crate::object::meta::OBJECT_META_FIELDS);
    }
}
