//! `metav1.Status` errors exactly as kube-apiserver writes them. Shared by the
//! registry (which decides what went wrong) and the HTTP layer (which writes it).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// One field-level problem (`field.Error` in apimachinery).
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    /// The bad value, already rendered the way kube prints it (`"x"`, `5`, `["a"]`).
    pub value: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Invalid,
    Required,
    Forbidden,
    NotSupported,
    Duplicate,
    TooLong,
    TooMany,
    NotFound,
    TypeInvalid,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            Self::Invalid => "FieldValueInvalid",
            Self::Required => "FieldValueRequired",
            Self::Forbidden => "FieldValueForbidden",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Duplicate => "FieldValueDuplicate",
            Self::TooLong => "FieldValueTooLong",
            Self::TooMany => "FieldValueTooMany",
            Self::NotFound => "FieldValueNotFound",
            Self::TypeInvalid => "FieldValueTypeInvalid",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Self::Invalid => "Invalid value",
            Self::Required => "Required value",
            Self::Forbidden => "Forbidden",
            Self::NotSupported => "Unsupported value",
            Self::Duplicate => "Duplicate value",
            Self::TooLong => "Too long",
            Self::TooMany => "Too many",
            Self::NotFound => "Not found",
            Self::TypeInvalid => "Invalid value",
        }
    }
    fn prints_value(self) -> bool {
        !matches!(self, Self::Required | Self::Forbidden | Self::TooLong)
    }
}

/// Go's strconv words for a number that does not parse: too many digits
/// is a range error, anything else a syntax error.
pub fn go_parse_failure(e: &std::num::ParseIntError) -> &'static str {
    match e.kind() {
        std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
            "value out of range"
        }
        _ => "invalid syntax",
    }
}

/// Renders a string value as Go's `%q` would (close enough for names and keys).
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

impl FieldError {
    pub fn new(
        kind: FieldErrorKind,
        field: impl Into<String>,
        value: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            field: field.into(),
            value,
            detail: detail.into(),
        }
    }
    pub fn invalid(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Invalid, field, Some(quote(value)), detail)
    }
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Required, field, None, detail)
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(FieldErrorKind::Forbidden, field, None, detail)
    }
    pub fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| quote(s)).collect();
        Self::new(
            FieldErrorKind::NotSupported,
            field,
            Some(quote(value)),
            format!("supported values: {}", list.join(", ")),
        )
    }

    /// `ErrorBody()`: the message without the field path.
    pub fn body(&self) -> String {
        let mut s = self.kind.label().to_string();
        if self.kind.prints_value() {
            if let Some(v) = &self.value {
                s.push_str(": ");
                s.push_str(v);
            }
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Joins field errors as apimachinery's aggregate does: one bare, several in brackets,
/// duplicates removed from the text.
pub fn aggregate(errors: &[FieldError]) -> String {
    let mut seen = Vec::<String>::new();
    for e in errors {
        let s = e.to_string();
        if !seen.contains(&s) {
            seen.push(s);
        }
    }
    if seen.len() == 1 {
        seen.remove(0)
    } else {
        format!("[{}]", seen.join(", "))
    }
}

/// A failure `Status` borrowed from an [`ApiError`], serialized in kube's order.
#[derive(Serialize)]
pub struct StatusBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: StatusMeta<'a>,
    status: &'static str,
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a Details>,
    code: u16,
}

#[derive(Serialize)]
struct StatusMeta<'a> {
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<&'a str>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Cause {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A failed request, rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    /// Empty for a webhook's Status that named none (kube omits the field).
    pub reason: std::borrow::Cow<'static, str>,
    pub message: String,
    pub details: Option<Box<Details>>,
    /// `metadata.continue` of the Status (expired continue tokens carry a fresh one).
    pub continue_token: Option<String>,
}

/// Group and resource (plural) or kind, for messages: `widgets.demo.kshard.dev`.
pub fn qualified(name: &str, group: &str) -> String {
    if group.is_empty() {
        name.to_string()
    } else {
        format!("{name}.{group}")
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }
    /// Adds a cause to the details (creating them if needed).
    pub fn with_cause(mut self, reason: &str, message: &str, field: &str) -> Self {
        self.details
            .get_or_insert_with(Default::default)
            .causes
            .push(Cause {
                reason: reason.into(),
                message: message.into(),
                field: field.into(),
            });
        self
    }
    fn with_details(mut self, d: Details) -> Self {
        self.details = Some(Box::new(d));
        self
    }
    fn named(group: &str, kind: &str, name: &str) -> Details {
        Details {
            name: name.into(),
            group: group.into(),
            kind: kind.into(),
            ..Default::default()
        }
    }

    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} {} not found", qualified(resource, group), quote(name)),
        )
        .with_details(Self::named(group, resource, name))
    }
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!(
                "{} {} already exists",
                qualified(resource, group),
                quote(name)
            ),
        )
        .with_details(Self::named(group, resource, name))
    }
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {}: {why}",
                qualified(resource, group),
                quote(name)
            ),
        )
        .with_details(Self::named(group, resource, name))
    }
    pub fn modified(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    /// 422 with one cause per field error; `kind` is a Kind or resource as kube uses it.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let message = if errors.is_empty() {
            format!("{} {} is invalid", qualified(kind, group), quote(name))
        } else {
            format!(
                "{} {} is invalid: {}",
                qualified(kind, group),
                quote(name),
                aggregate(errors)
            )
        };
        let mut d = Self::named(group, kind, name);
        d.causes = errors
            .iter()
            .map(|e| Cause {
                reason: e.kind.reason().into(),
                message: e.body(),
                field: e.field.clone(),
            })
            .collect();
        Self::new(422, "Invalid", message).with_details(d)
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    pub fn method_not_supported(group: &str, resource: &str, verb: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "{verb} is not supported on resources of kind {}",
                quote(&qualified(resource, group))
            ),
        )
        .with_details(Self::named(group, resource, ""))
    }
    /// A method the resource has no handler for (kube's
    /// `NewMethodNotSupported` on a route without it): empty details.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(Details::default())
    }
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: "ResourceVersionTooLarge".into(),
                message: "Too large resource version".into(),
                field: String::new(),
            }],
            retry_after_seconds: 1,
            ..Default::default()
        })
    }
    /// 504 `Timeout` (kube's NewTimeoutError, no retry hint).
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }
    /// 504 `Timeout` for a write whose outcome is unknown (sent to the
    /// leader replica, which did not answer): kube's NewTimeoutError code
    /// and reason ("the operation may still complete"), with NewServerTimeout's
    /// message and details (the verb as `name`, the resource as `kind`).
    pub fn write_outcome_unknown(verb: &str, group: &str, resource: &str) -> Self {
        Self::new(
            504,
            "Timeout",
            format!(
                "The {verb} operation against {} could not be completed at this time, please try again.",
                qualified(resource, group)
            ),
        )
        .with_details(Details {
            name: verb.to_string(),
            group: group.to_string(),
            kind: resource.to_string(),
            retry_after_seconds: 1,
            ..Default::default()
        })
    }
    /// 429 with `Retry-After: 1` (kube's NewTooManyRequests): try again later.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(429, "TooManyRequests", message).with_details(Details {
            retry_after_seconds: 1,
            ..Default::default()
        })
    }
    /// 503 with `Retry-After: 1`: the request was not carried out; try again.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message).with_details(Details {
            retry_after_seconds: 1,
            ..Default::default()
        })
    }
    /// A Status someone else decided (an admission webhook's), kept as sent.
    pub fn from_parts(
        code: u16,
        reason: String,
        message: String,
        details: Option<Details>,
    ) -> Self {
        Self {
            code,
            reason: reason.into(),
            message,
            details: details.map(Box::new),
            continue_token: None,
        }
    }
    pub fn internal(message: impl std::fmt::Display) -> Self {
        let message = message.to_string();
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                message,
                ..Default::default()
            }],
            ..Default::default()
        })
    }
    /// 406 with a message of its own (a metadata view of the wrong shape).
    pub fn not_acceptable_because(why: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", why)
    }
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
        )
    }
    /// The 406 of kube's handlers for its built-in kinds (`NewNotAcceptableError`
    /// of the serializer negotiation), which words it otherwise.
    pub fn not_acceptable_representations(available: &[&str]) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "406: Not Acceptable\n\nAvailable representations: {}",
                available.join(", ")
            ),
        )
        .with_details(Details::default())
    }
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// apierrors.NewForbidden: the message names the resource (and object) refused.
    pub fn forbidden_resource(group: &str, resource: &str, name: &str, err: &str) -> Self {
        let message = if group.is_empty() && resource.is_empty() {
            format!("forbidden: {err}")
        } else if name.is_empty() {
            format!("{} is forbidden: {err}", qualified(resource, group))
        } else {
            format!(
                "{} {} is forbidden: {err}",
                qualified(resource, group),
                quote(name)
            )
        };
        Self::new(403, "Forbidden", message).with_details(Self::named(group, resource, name))
    }
    /// kube's mux answers a path nothing serves with a plain-text `404 page
    /// not found`; this is the Status client-go makes of that answer, kept
    /// in this form until the response is written ([`Self::is_page_not_found`]).
    pub fn not_found_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: "UnexpectedServerResponse".into(),
                message: "404 page not found".into(),
                field: String::new(),
            }],
            ..Default::default()
        })
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.details
            .as_ref()
            .map(|d| d.retry_after_seconds)
            .filter(|n| *n > 0)
    }

    /// Whether this is [`Self::not_found_path`], answered as plain text.
    pub fn is_page_not_found(&self) -> bool {
        self.code == 404
            && self.details.as_ref().is_some_and(|d| {
                d.causes.len() == 1
                    && d.causes[0].reason == "UnexpectedServerResponse"
                    && d.causes[0].message == "404 page not found"
            })
    }

    /// kube's core API answer for a resource it does not have under
    /// `/api/v1` (a Status with empty details).
    pub fn not_found_legacy() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Details::default())
    }

    /// The Status as kube writes it: its fields in `metav1.Status`'s order,
    /// which a `Value` (whose keys sort) would not keep.
    pub fn status_body(&self) -> StatusBody<'_> {
        StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: StatusMeta {
                continue_token: self.continue_token.as_deref(),
            },
            status: "Failure",
            message: &self.message,
            reason: &self.reason,
            details: self.details.as_deref(),
            code: self.code,
        }
    }

    /// The Status body's JSON bytes (see [`ApiError::status_body`]).
    pub fn status_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.status_body()).unwrap_or_default()
    }

    pub fn to_json(&self) -> Value {
        let mut metadata = serde_json::Map::new();
        if let Some(c) = &self.continue_token {
            metadata.insert("continue".into(), Value::String(c.clone()));
        }
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
        });
        if let (false, Some(obj)) = (self.reason.is_empty(), v.as_object_mut()) {
            obj.insert("reason".into(), Value::String(self.reason.to_string()));
        }
        if let (Some(d), Some(obj)) = (&self.details, v.as_object_mut()) {
            obj.insert(
                "details".into(),
                serde_json::to_value(d).unwrap_or(Value::Null),
            );
        }
        if let Some(obj) = v.as_object_mut() {
            obj.insert("code".into(), json!(self.code));
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_body_keeps_kubes_field_order_and_says_what_to_json_says() {
        let mut e = ApiError::not_found("demo.kshard.dev", "widgets", "nope");
        e.continue_token = Some("t".into());
        let text = String::from_utf8(e.status_json()).expect("utf8");
        // metav1.Status's order, as kube-apiserver writes a 404.
        assert_eq!(
            text,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{"continue":"t"},"status":"Failure","message":"widgets.demo.kshard.dev \"nope\" not found","reason":"NotFound","details":{"name":"nope","group":"demo.kshard.dev","kind":"widgets"},"code":404}"#
        );
        let parsed: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(parsed, e.to_json());
    }

    #[test]
    fn invalid_message_has_kube_shape() {
        let e = ApiError::invalid(
            "demo.kshard.dev",
            "Widget",
            "Bad",
            &[FieldError::invalid(
                "metadata.name",
                "Bad",
                "must be lower case",
            )],
        );
        assert_eq!(
            e.message,
            "Widget.demo.kshard.dev \"Bad\" is invalid: metadata.name: Invalid value: \"Bad\": must be lower case"
        );
        let j = e.to_json();
        assert_eq!(j["details"]["causes"][0]["reason"], "FieldValueInvalid");
        assert_eq!(j["details"]["causes"][0]["field"], "metadata.name");
        assert_eq!(
            j["details"]["causes"][0]["message"],
            "Invalid value: \"Bad\": must be lower case"
        );
        assert_eq!(j["code"], 422);
    }

    #[test]
    fn several_errors_are_bracketed_and_deduplicated() {
        let a = FieldError::required("metadata.name", "name or generateName is required");
        let b = FieldError::forbidden("spec", "nope");
        assert_eq!(
            aggregate(&[a.clone(), b.clone(), a.clone()]),
            "[metadata.name: Required value: name or generateName is required, spec: Forbidden: nope]"
        );
        assert_eq!(
            aggregate(&[a.clone(), a]),
            "metadata.name: Required value: name or generateName is required"
        );
    }

    #[test]
    fn not_supported_lists_values() {
        let e = FieldError::not_supported(
            "resourceVersionMatch",
            "foo",
            &["Exact", "NotOlderThan", ""],
        );
        assert_eq!(
            e.body(),
            "Unsupported value: \"foo\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
    }
}
