//! The `AdmissionReview` a webhook receives and the checks its answer must
//! pass (kube's `CreateV1AdmissionReview` and `VerifyAdmissionResponse`),
//! for `admission.k8s.io/v1` and the older `v1beta1`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::registry::write_admission::{Attributes, Gvk};

/// The resource and kind a webhook is called for: the request's, or an
/// equivalent version of it (match policy Equivalent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub kind: Gvk,
}

/// Which AdmissionReview version a webhook speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewVersion {
    V1,
    V1beta1,
}

impl ReviewVersion {
    /// The first version of the webhook's list that kube knows.
    pub fn pick(accepted: &[String]) -> Option<Self> {
        accepted.iter().find_map(|v| match v.as_str() {
            "v1" => Some(Self::V1),
            "v1beta1" => Some(Self::V1beta1),
            _ => None,
        })
    }

    fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "admission.k8s.io/v1",
            Self::V1beta1 => "admission.k8s.io/v1beta1",
        }
    }
}

fn gvk(k: &Gvk) -> Value {
    json!({"group": k.group, "version": k.version, "kind": k.kind})
}

/// The `request` of a review, in Go's field order (`object` and `oldObject`
/// left out: CEL's `request` variable has neither).
pub fn request(uid: &str, attrs: &Attributes<'_>, inv: &Invocation) -> Map<String, Value> {
    let t = attrs.target;
    let mut r = Map::new();
    if !uid.is_empty() {
        r.insert("uid".into(), json!(uid));
    }
    r.insert("kind".into(), gvk(&inv.kind));
    r.insert(
        "resource".into(),
        json!({"group": inv.group, "version": inv.version, "resource": inv.resource}),
    );
    if !inv.subresource.is_empty() {
        r.insert("subResource".into(), json!(inv.subresource));
    }
    r.insert("requestKind".into(), gvk(&attrs.kind));
    r.insert(
        "requestResource".into(),
        json!({"group": t.rt.group, "version": t.version, "resource": t.rt.plural}),
    );
    if !attrs.subresource.is_empty() {
        r.insert("requestSubResource".into(), json!(attrs.subresource));
    }
    if !attrs.name.is_empty() {
        r.insert("name".into(), json!(attrs.name));
    }
    if !t.namespace.is_empty() {
        r.insert("namespace".into(), json!(t.namespace));
    }
    r.insert("operation".into(), json!(attrs.operation.as_str()));
    let user = &attrs.caller.user;
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
    r.insert("userInfo".into(), Value::Object(info));
    r.insert("dryRun".into(), json!(attrs.dry_run));
    r.insert("options".into(), attrs.options());
    r
}

/// The whole review sent to a webhook. `object` is absent (null) for a
/// delete, `oldObject` for a create, as kube sends them.
pub fn review(
    version: ReviewVersion,
    uid: &str,
    attrs: &Attributes<'_>,
    inv: &Invocation,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Value {
    let mut r = request(uid, attrs, inv);
    // Go's field order: ... operation, userInfo, object, oldObject, dryRun, options.
    let dry_run = r.remove("dryRun").unwrap_or(Value::Null);
    let options = r.remove("options").unwrap_or(Value::Null);
    r.insert("object".into(), object.cloned().unwrap_or(Value::Null));
    r.insert("oldObject".into(), old.cloned().unwrap_or(Value::Null));
    r.insert("dryRun".into(), dry_run);
    r.insert("options".into(), options);
    json!({
        "kind": "AdmissionReview",
        "apiVersion": version.api_version(),
        "request": Value::Object(r),
    })
}

/// A webhook's answer, checked.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub allowed: bool,
    /// The decoded `patch` (mutating webhooks only).
    pub patch: Vec<u8>,
    pub patch_type: String,
    /// `response.status`, when the webhook sent one.
    pub status: Option<Value>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireReview {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<WireResponse>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    status: Option<Value>,
    patch: Option<String>,
    patch_type: Option<String>,
    #[serde(default)]
    audit_annotations: BTreeMap<String, String>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// Decodes the response body of a webhook call (kube's client decoding it
/// into an AdmissionReview).
pub fn decode(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("json parse error: {e}"))
}

/// kube's `VerifyAdmissionResponse`, with its messages.
pub fn verify(
    version: ReviewVersion,
    uid: &str,
    mutating: bool,
    body: &Value,
) -> Result<Answer, String> {
    let review: WireReview = serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
    let Some(r) = review.response else {
        return Err("webhook response was absent".into());
    };
    let patch = match &r.patch {
        Some(p) if !p.is_empty() => base64::engine::general_purpose::STANDARD
            .decode(p)
            .map_err(|e| format!("illegal base64 data in response.patch: {e}"))?,
        _ => Vec::new(),
    };
    let mut answer = Answer {
        allowed: r.allowed,
        patch: Vec::new(),
        patch_type: String::new(),
        status: r.status,
        warnings: r.warnings,
        audit_annotations: r.audit_annotations,
    };
    match version {
        ReviewVersion::V1 => {
            if r.uid != uid {
                return Err(format!("expected response.uid={uid:?}, got {:?}", r.uid));
            }
            let gvk = format!("{}, Kind={}", review.api_version, review.kind);
            if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
                return Err(format!(
                    "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {gvk}"
                ));
            }
            if mutating {
                if !patch.is_empty() && r.patch_type.is_none() {
                    return Err("webhook returned response.patch but not response.patchType".into());
                }
                if patch.is_empty() && r.patch_type.is_some() {
                    return Err("webhook returned response.patchType but not response.patch".into());
                }
                if let Some(pt) = r.patch_type {
                    if pt.is_empty() {
                        return Err(format!(
                            "webhook returned invalid response.patchType of {pt:?}"
                        ));
                    }
                    answer.patch_type = pt;
                }
                answer.patch = patch;
            } else {
                if !patch.is_empty() {
                    return Err("validating webhook may not return response.patch".into());
                }
                if r.patch_type.is_some() {
                    return Err("validating webhook may not return response.patchType".into());
                }
            }
        }
        // v1beta1 answers were never checked for uid or kind, and a patch is
        // always a JSON patch.
        ReviewVersion::V1beta1 => {
            if mutating && !patch.is_empty() {
                answer.patch = patch;
                answer.patch_type = "JSONPatch".into();
            }
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(resp: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp})
    }

    #[test]
    fn answers_are_checked_as_kube_checks_them() {
        let ok = verify(
            ReviewVersion::V1,
            "u1",
            false,
            &v1(json!({"uid": "u1", "allowed": true})),
        );
        assert_eq!(ok.map(|a| a.allowed), Ok(true));
        assert_eq!(
            verify(
                ReviewVersion::V1,
                "u1",
                false,
                &v1(json!({"uid": "u2", "allowed": true}))
            ),
            Err("expected response.uid=\"u1\", got \"u2\"".into())
        );
        assert_eq!(
            verify(
                ReviewVersion::V1,
                "u1",
                false,
                &json!({"kind": "AdmissionReview"})
            ),
            Err("webhook response was absent".into())
        );
        let patch = base64::engine::general_purpose::STANDARD.encode(b"[]");
        assert_eq!(
            verify(
                ReviewVersion::V1,
                "u",
                true,
                &v1(json!({"uid": "u", "allowed": true, "patch": patch}))
            ),
            Err("webhook returned response.patch but not response.patchType".into())
        );
        assert_eq!(
            verify(
                ReviewVersion::V1,
                "u",
                false,
                &v1(json!({"uid": "u", "allowed": true, "patch": patch}))
            ),
            Err("validating webhook may not return response.patch".into())
        );
        let beta = json!({"response": {"allowed": true, "patch": patch}});
        let a = verify(ReviewVersion::V1beta1, "ignored", true, &beta).expect("v1beta1");
        assert_eq!(
            (a.patch.as_slice(), a.patch_type.as_str()),
            (&b"[]"[..], "JSONPatch")
        );
        let wrong = json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                           "response": {"uid": "u", "allowed": true}});
        assert_eq!(
            verify(ReviewVersion::V1, "u", false, &wrong),
            Err("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got admission.k8s.io/v1beta1, Kind=AdmissionReview".into())
        );
    }

    #[test]
    fn the_first_known_review_version_is_used() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ReviewVersion::pick(&v(&["v2", "v1beta1", "v1"])),
            Some(ReviewVersion::V1beta1)
        );
        assert_eq!(ReviewVersion::pick(&v(&["v2"])), None);
    }
}
