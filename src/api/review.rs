//! The two identity reviews kubectl's `auth can-i` and `auth whoami` send:
//! `authorization.k8s.io/v1` SelfSubjectAccessReview and
//! `authentication.k8s.io/v1` SelfSubjectReview, answered as kube-apiserver
//! answers them (create only; nothing is stored). Only these two of kube's
//! review resources are served: the others (SubjectAccessReview,
//! TokenReview, ...) concern other users, which a shard does not manage.

use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Map, Value};

use super::negotiate::{negotiate_builtin, BuiltinOutput};
use super::request::ResourceRequest;
use super::response::{cbor_response, error_for, error_response, json_response, yaml_response};
use crate::apply::{FieldManager, MergeSchema};
use crate::auth::Identity;
use crate::authz::{Attributes, Authorizer, Decision};
use crate::status::{ApiError, FieldError, FieldErrorKind};

pub const AUTHENTICATION: &str = "authentication.k8s.io";
pub const AUTHORIZATION: &str = "authorization.k8s.io";
pub const SELF_SUBJECT_REVIEWS: &str = "selfsubjectreviews";
pub const SELF_SUBJECT_ACCESS_REVIEWS: &str = "selfsubjectaccessreviews";

/// A served review resource: group, resource, singular, kind.
pub struct Review {
    pub group: &'static str,
    pub resource: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
}

/// kube's discovery order: authentication before authorization.
pub const REVIEWS: [Review; 2] = [
    Review {
        group: AUTHENTICATION,
        resource: SELF_SUBJECT_REVIEWS,
        singular: "selfsubjectreview",
        kind: "SelfSubjectReview",
    },
    Review {
        group: AUTHORIZATION,
        resource: SELF_SUBJECT_ACCESS_REVIEWS,
        singular: "selfsubjectaccessreview",
        kind: "SelfSubjectAccessReview",
    },
];

/// The served review a request addresses (its collection path only).
pub fn addressed(r: &ResourceRequest) -> Option<&'static Review> {
    if r.version != "v1" || r.namespace.is_some() || r.name.is_some() || r.subresource.is_some() {
        return None;
    }
    REVIEWS
        .iter()
        .find(|v| v.group == r.group && v.resource == r.resource)
}

/// What a review request needs besides its body.
pub struct Call<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    pub query: &'a str,
    pub body: &'a [u8],
    pub user: Identity,
    pub authorizer: Option<Authorizer>,
}

pub async fn handle(review: &Review, call: Call<'_>) -> axum::response::Response {
    if call.method != Method::POST {
        return error_response(&ApiError::method_not_allowed());
    }
    let accept = call
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    // kube's create handler picks the answer's form before reading the body.
    let form = match negotiate_builtin(accept) {
        Ok(f) => f,
        Err(e) => return error_response(&e),
    };
    let result = match review.resource {
        SELF_SUBJECT_REVIEWS => Ok((self_subject_review(&call.user), Vec::new())),
        _ => self_subject_access_review(&call).await,
    };
    match result {
        Ok((v, warnings)) => {
            let mut resp = answer(form, review, &v);
            for w in &warnings {
                super::response::warn(&mut resp, w);
            }
            resp
        }
        Err(e) => error_for(accept, &e),
    }
}

/// A review's answer (201) in the negotiated form.
fn answer(form: BuiltinOutput, review: &Review, v: &Value) -> axum::response::Response {
    let code = StatusCode::CREATED;
    match form {
        BuiltinOutput::Json => json_response(code, v),
        BuiltinOutput::Yaml => yaml_response(code, v),
        BuiltinOutput::Cbor => cbor_response(code, v),
        BuiltinOutput::Protobuf => {
            let encoded = match review.resource {
                SELF_SUBJECT_REVIEWS => proto::encode_self_subject_review(v),
                _ => proto::encode_self_subject_access_review(v),
            };
            match encoded {
                Ok(bytes) => super::response::bytes_response(
                    code,
                    super::encoding::protobuf::MEDIA_TYPE,
                    bytes,
                ),
                Err(e) => error_response(&ApiError::internal(e)),
            }
        }
    }
}

/// The caller as authentication saw it (after impersonation); the request
/// body is not read, as kube ignores it.
fn self_subject_review(user: &Identity) -> Value {
    let mut info = Map::new();
    if !user.user.is_empty() {
        info.insert("username".into(), json!(user.user));
    }
    if !user.uid.is_empty() {
        info.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        info.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        info.insert("extra".into(), json!(user.extra));
    }
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": crate::object::now_rfc3339()},
        "status": {"userInfo": info},
    })
}

/// kube's field order of ResourceAttributes and NonResourceAttributes;
/// fields kube's types do not have are dropped, as its decoder drops them.
const RESOURCE_FIELDS: [&str; 9] = [
    "namespace",
    "verb",
    "group",
    "version",
    "resource",
    "subresource",
    "name",
    "fieldSelector",
    "labelSelector",
];
const NON_RESOURCE_FIELDS: [&str; 2] = ["path", "verb"];

fn pick(v: Option<&Value>, fields: &[&str]) -> Option<Map<String, Value>> {
    let o = v?.as_object()?;
    Some(
        fields
            .iter()
            .filter_map(|f| {
                o.get(*f)
                    .filter(|x| !x.is_null() && *x != "")
                    .map(|x| (f.to_string(), x.clone()))
            })
            .collect(),
    )
}

fn text(m: &Map<String, Value>, k: &str) -> String {
    m.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// Go's `%v` of a NonResourceAttributes value in a field error.
fn go_struct(m: &Map<String, Value>) -> String {
    let q = |k: &str| crate::status::quote(&text(m, k));
    format!("{{\"Path\":{},\"Verb\":{}}}", q("path"), q("verb"))
}

/// Fields of the body kube's typed decoder does not know (metadata aside),
/// in kube's path notation, for fieldValidation's warnings or refusal.
fn unknown_fields(body: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |v: Option<&Value>, prefix: &str, known: &[&str]| {
        if let Some(o) = v.and_then(Value::as_object) {
            out.extend(
                o.keys()
                    .filter(|k| !known.contains(&k.as_str()))
                    .map(|k| format!("{prefix}{k}")),
            );
        }
    };
    check(
        Some(body),
        "",
        &["kind", "apiVersion", "metadata", "spec", "status"],
    );
    let spec = body.get("spec");
    check(
        spec,
        "spec.",
        &["resourceAttributes", "nonResourceAttributes"],
    );
    let attrs = spec.and_then(|s| s.get("resourceAttributes"));
    check(attrs, "spec.resourceAttributes.", &RESOURCE_FIELDS);
    let attrs = spec.and_then(|s| s.get("nonResourceAttributes"));
    check(attrs, "spec.nonResourceAttributes.", &NON_RESOURCE_FIELDS);
    check(
        body.get("status"),
        "status.",
        &["allowed", "denied", "reason", "evaluationError"],
    );
    out
}

async fn self_subject_access_review(call: &Call<'_>) -> Result<(Value, Vec<String>), ApiError> {
    let q = super::options::Query::parse(call.query);
    let opts = super::options::write_options(&q, call.headers, false, "CreateOptions")?;
    let body = if media(call.headers) == super::encoding::protobuf::MEDIA_TYPE {
        proto::decode(call.body)?
    } else {
        super::resource::decode_body(call.headers, call.body, "SelfSubjectAccessReview")?
    };
    let unknown: Vec<String> = unknown_fields(&body)
        .iter()
        .map(|f| format!("unknown field {}", crate::status::quote(f)))
        .collect();
    let warnings = match opts.field_validation {
        crate::registry::FieldValidation::Ignore => Vec::new(),
        crate::registry::FieldValidation::Warn => unknown,
        crate::registry::FieldValidation::Strict if unknown.is_empty() => Vec::new(),
        crate::registry::FieldValidation::Strict => {
            return Err(ApiError::bad_request(format!(
                "SelfSubjectAccessReview in version \"v1\" cannot be handled as a \
                 SelfSubjectAccessReview: strict decoding error: {}",
                unknown.join(", ")
            )))
        }
    };
    let spec = body.get("spec");
    let resource = pick(
        spec.and_then(|s| s.get("resourceAttributes")),
        &RESOURCE_FIELDS,
    );
    let non_resource = pick(
        spec.and_then(|s| s.get("nonResourceAttributes")),
        &NON_RESOURCE_FIELDS,
    );
    let invalid = |e: FieldError| ApiError::invalid(AUTHORIZATION, "", "", &[e]);
    let mut attrs = Attributes {
        user: call.user.clone(),
        ..Default::default()
    };
    let spec_out = match (&resource, &non_resource) {
        (Some(r), None) => {
            attrs.resource_request = true;
            attrs.namespace = text(r, "namespace");
            attrs.verb = text(r, "verb");
            attrs.group = text(r, "group");
            attrs.version = text(r, "version");
            attrs.resource = text(r, "resource");
            attrs.subresource = text(r, "subresource");
            attrs.name = text(r, "name");
            json!({"resourceAttributes": r})
        }
        (None, Some(n)) => {
            attrs.path = text(n, "path");
            attrs.verb = text(n, "verb");
            json!({"nonResourceAttributes": n})
        }
        (None, None) => {
            return Err(invalid(FieldError::new(
                FieldErrorKind::Invalid,
                "spec.resourceAttributes",
                Some("null".into()),
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )))
        }
        (Some(_), Some(n)) => {
            return Err(invalid(FieldError::new(
                FieldErrorKind::Invalid,
                "spec.nonResourceAttributes",
                Some(go_struct(n)),
                "cannot be specified in combination with resourceAttributes",
            )))
        }
    };
    let decision = match &call.authorizer {
        Some(a) => a.authorize(&attrs).await.map_err(ApiError::internal)?,
        None => Decision::Deny(String::new()),
    };
    let status = match decision {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::Deny(reason) => json!({"allowed": false, "reason": reason}),
    };
    let api_version = "authorization.k8s.io/v1";
    let mut out = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": api_version,
        "metadata": {},
        "spec": spec_out,
        "status": status,
    });
    // kube's create handler records the writer's fields, as for any create:
    // the spec's attributes (status and metadata are kube's empty defaults).
    let empty = json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": api_version,
        "metadata": {},
        "spec": {},
        "status": out["status"].clone(),
    });
    let schema = MergeSchema::deduced();
    let fm = FieldManager::new(&schema, api_version, None, false);
    fm.update(
        Some(&empty),
        &mut out,
        &opts.manager,
        &crate::object::now_rfc3339(),
    )
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((out, warnings))
}

fn media(headers: &HeaderMap) -> &str {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim()
}

/// kubectl sends built-in kinds in protobuf: the SelfSubjectAccessReview
/// messages of `authorization.k8s.io/v1` (kube's field numbers), read into
/// the JSON form the rest of this module works on.
mod proto {
    use prost::Message;
    use serde_json::{json, Map, Value};

    use crate::api::encoding::protobuf::{
        decode_envelope, encode_object, object_meta_from_json, ObjectMeta,
    };
    use crate::status::ApiError;

    #[derive(Clone, PartialEq, Message)]
    pub struct SelfSubjectAccessReview {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Spec {
        #[prost(message, optional, tag = "1")]
        pub resource_attributes: Option<ResourceAttributes>,
        #[prost(message, optional, tag = "2")]
        pub non_resource_attributes: Option<NonResourceAttributes>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub group: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub version: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub resource: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub subresource: Option<String>,
        #[prost(string, optional, tag = "7")]
        pub name: Option<String>,
        #[prost(message, optional, tag = "8")]
        pub field_selector: Option<SelectorAttributes>,
        #[prost(message, optional, tag = "9")]
        pub label_selector: Option<SelectorAttributes>,
    }

    /// Field and label selector attributes share one shape.
    #[derive(Clone, PartialEq, Message)]
    pub struct SelectorAttributes {
        #[prost(string, optional, tag = "1")]
        pub raw_selector: Option<String>,
        #[prost(message, repeated, tag = "2")]
        pub requirements: Vec<Requirement>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Requirement {
        #[prost(string, optional, tag = "1")]
        pub key: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub operator: Option<String>,
        #[prost(string, repeated, tag = "3")]
        pub values: Vec<String>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct NonResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub path: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
    }

    // The answers, as kube writes them: Go's plain (non-pointer) strings
    // and bools always, pointers when set.

    #[derive(Clone, PartialEq, Message)]
    pub struct AccessReviewOut {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
        #[prost(message, optional, tag = "3")]
        pub status: Option<AccessReviewStatus>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct AccessReviewStatus {
        #[prost(bool, optional, tag = "1")]
        pub allowed: Option<bool>,
        #[prost(string, optional, tag = "2")]
        pub reason: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub evaluation_error: Option<String>,
        #[prost(bool, optional, tag = "4")]
        pub denied: Option<bool>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct SelfSubjectReviewOut {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub status: Option<SelfSubjectReviewStatus>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct SelfSubjectReviewStatus {
        #[prost(message, optional, tag = "1")]
        pub user_info: Option<UserInfo>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct UserInfo {
        #[prost(string, optional, tag = "1")]
        pub username: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub uid: Option<String>,
        #[prost(string, repeated, tag = "3")]
        pub groups: Vec<String>,
        /// `map<string, ExtraValue> extra = 4`, sorted by key as Go writes it.
        #[prost(message, repeated, tag = "4")]
        pub extra: Vec<ExtraEntry>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ExtraEntry {
        #[prost(string, optional, tag = "1")]
        pub key: Option<String>,
        #[prost(message, optional, tag = "2")]
        pub value: Option<ExtraValue>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct ExtraValue {
        #[prost(string, repeated, tag = "1")]
        pub items: Vec<String>,
    }

    fn text(v: &Value, k: &str) -> Option<String> {
        Some(
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        )
    }

    fn texts(v: Option<&Value>) -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn selector_out(v: &Value) -> SelectorAttributes {
        SelectorAttributes {
            raw_selector: text(v, "rawSelector"),
            requirements: v
                .get("requirements")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|r| Requirement {
                            key: text(r, "key"),
                            operator: text(r, "operator"),
                            values: texts(r.get("values")),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    fn metadata(v: &Value) -> Result<Option<ObjectMeta>, String> {
        object_meta_from_json(v.get("metadata").unwrap_or(&Value::Null))
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// A SelfSubjectAccessReview answer (its JSON form) in protobuf.
    pub fn encode_self_subject_access_review(v: &Value) -> Result<Vec<u8>, String> {
        let spec = &v["spec"];
        let resource_attributes = spec.get("resourceAttributes").map(|r| ResourceAttributes {
            namespace: text(r, "namespace"),
            verb: text(r, "verb"),
            group: text(r, "group"),
            version: text(r, "version"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            name: text(r, "name"),
            field_selector: r.get("fieldSelector").map(selector_out),
            label_selector: r.get("labelSelector").map(selector_out),
        });
        let non_resource_attributes =
            spec.get("nonResourceAttributes")
                .map(|n| NonResourceAttributes {
                    path: text(n, "path"),
                    verb: text(n, "verb"),
                });
        let status = &v["status"];
        let msg = AccessReviewOut {
            metadata: metadata(v)?,
            spec: Some(Spec {
                resource_attributes,
                non_resource_attributes,
            }),
            status: Some(AccessReviewStatus {
                allowed: Some(status["allowed"].as_bool().unwrap_or(false)),
                reason: text(status, "reason"),
                evaluation_error: text(status, "evaluationError"),
                denied: Some(status["denied"].as_bool().unwrap_or(false)),
            }),
        };
        Ok(encode_object(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            &msg,
        ))
    }

    /// A SelfSubjectReview answer (its JSON form) in protobuf.
    pub fn encode_self_subject_review(v: &Value) -> Result<Vec<u8>, String> {
        let info = &v["status"]["userInfo"];
        let extra = info
            .get("extra")
            .and_then(Value::as_object)
            .map(|m| {
                // serde_json's map is ordered by key, as Go writes map entries.
                m.iter()
                    .map(|(k, items)| ExtraEntry {
                        key: Some(k.clone()),
                        value: Some(ExtraValue {
                            items: texts(Some(items)),
                        }),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let msg = SelfSubjectReviewOut {
            metadata: metadata(v)?,
            status: Some(SelfSubjectReviewStatus {
                user_info: Some(UserInfo {
                    username: text(info, "username"),
                    uid: text(info, "uid"),
                    groups: texts(info.get("groups")),
                    extra,
                }),
            }),
        };
        Ok(encode_object(
            "authentication.k8s.io/v1",
            "SelfSubjectReview",
            &msg,
        ))
    }

    fn strings(out: &mut Map<String, Value>, fields: &[(&str, &Option<String>)]) {
        for (k, v) in fields {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                out.insert((*k).into(), json!(v));
            }
        }
    }

    fn selector(s: &SelectorAttributes) -> Value {
        let mut out = Map::new();
        strings(&mut out, &[("rawSelector", &s.raw_selector)]);
        if !s.requirements.is_empty() {
            let reqs: Vec<Value> = s
                .requirements
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    strings(&mut o, &[("key", &r.key), ("operator", &r.operator)]);
                    if !r.values.is_empty() {
                        o.insert("values".into(), json!(r.values));
                    }
                    Value::Object(o)
                })
                .collect();
            out.insert("requirements".into(), Value::Array(reqs));
        }
        Value::Object(out)
    }

    pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
        let bad = |e: String| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type SelfSubjectAccessReview): {e}"
            ))
        };
        let (_, raw) = decode_envelope(body).map_err(|e| bad(e.to_string()))?;
        let review =
            SelfSubjectAccessReview::decode(raw.as_slice()).map_err(|e| bad(e.to_string()))?;
        let mut spec = Map::new();
        let s = review.spec.unwrap_or_default();
        if let Some(r) = &s.resource_attributes {
            let mut o = Map::new();
            strings(
                &mut o,
                &[
                    ("namespace", &r.namespace),
                    ("verb", &r.verb),
                    ("group", &r.group),
                    ("version", &r.version),
                    ("resource", &r.resource),
                    ("subresource", &r.subresource),
                    ("name", &r.name),
                ],
            );
            if let Some(f) = &r.field_selector {
                o.insert("fieldSelector".into(), selector(f));
            }
            if let Some(l) = &r.label_selector {
                o.insert("labelSelector".into(), selector(l));
            }
            spec.insert("resourceAttributes".into(), Value::Object(o));
        }
        if let Some(n) = &s.non_resource_attributes {
            let mut o = Map::new();
            strings(&mut o, &[("path", &n.path), ("verb", &n.verb)]);
            spec.insert("nonResourceAttributes".into(), Value::Object(o));
        }
        Ok(json!({
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "spec": spec,
        }))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn reads_a_resource_review() {
            let msg = SelfSubjectAccessReview {
                spec: Some(Spec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some("ns".into()),
                        verb: Some("get".into()),
                        resource: Some("pods".into()),
                        ..Default::default()
                    }),
                    non_resource_attributes: None,
                }),
            };
            let body = crate::api::encoding::protobuf::encode_object(
                "authorization.k8s.io/v1",
                "SelfSubjectAccessReview",
                &msg,
            );
            let v = decode(&body).expect("decodes");
            assert_eq!(
                v["spec"],
                json!({"resourceAttributes": {"namespace": "ns", "verb": "get", "resource": "pods"}})
            );
        }
    }
}
