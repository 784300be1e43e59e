//! `Impersonate-User`, `-Group`, `-Uid` and `-Extra-*`, as kube's
//! impersonation filter: every part asked for is authorized with the
//! `impersonate` verb for the requesting user, and only then does the request
//! continue as the impersonated user. Nothing is trusted on sight.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName};

use super::{forbidden, Attributes, Authorizer, Decision};
use crate::auth::{Identity, GROUP_AUTHENTICATED};
use crate::status::ApiError;

const USER: &str = "impersonate-user";
const UID: &str = "impersonate-uid";
const GROUP: &str = "impersonate-group";
const EXTRA_PREFIX: &str = "impersonate-extra-";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
const ANONYMOUS: &str = "system:anonymous";

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect()
}

fn extras(headers: &HeaderMap) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        if let Some(key) = k.as_str().strip_prefix(EXTRA_PREFIX) {
            let key = percent_encoding::percent_decode_str(key)
                .decode_utf8_lossy()
                .to_lowercase();
            if let Ok(v) = v.to_str() {
                out.entry(key).or_default().push(v.to_string());
            }
        }
    }
    out
}

/// The identity a request acts as: `requester` itself when it impersonates no
/// one, else the impersonated user once every part is allowed. The
/// `Impersonate-*` headers are removed either way.
pub async fn impersonate(
    authz: &Authorizer,
    requester: Identity,
    headers: &mut HeaderMap,
) -> Result<Identity, ApiError> {
    let user = values(headers, USER).into_iter().next().unwrap_or_default();
    let groups = values(headers, GROUP);
    let uid = values(headers, UID).into_iter().next().unwrap_or_default();
    let extra = extras(headers);
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for n in names {
        headers.remove(n);
    }
    if user.is_empty() {
        if groups.is_empty() && uid.is_empty() && extra.is_empty() {
            return Ok(requester);
        }
        return Err(ApiError::bad_request(
            "impersonating groups, a uid or extra fields requires impersonating a user",
        ));
    }
    let check =
        |group: &str, resource: &str, subresource: &str, namespace: &str, name: &str| Attributes {
            user: requester.clone(),
            verb: "impersonate".into(),
            resource_request: true,
            group: group.into(),
            version: String::new(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            path: String::new(),
        };
    let mut asks = Vec::new();
    let service_account = user
        .strip_prefix(SERVICE_ACCOUNT_PREFIX)
        .and_then(|rest| rest.split_once(':'));
    match service_account {
        Some((ns, name)) => asks.push(check("", "serviceaccounts", "", ns, name)),
        None => asks.push(check("", "users", "", "", &user)),
    }
    for g in &groups {
        asks.push(check("", "groups", "", "", g));
    }
    if !uid.is_empty() {
        asks.push(check("authentication.k8s.io", "uids", "", "", &uid));
    }
    for (key, vals) in &extra {
        for v in vals {
            asks.push(check("authentication.k8s.io", "userextras", key, "", v));
        }
    }
    for a in &asks {
        match authz.authorize(a).await {
            Ok(Decision::Allow) => {}
            Ok(Decision::Deny(reason)) => return Err(forbidden(a, &reason)),
            Err(e) => return Err(ApiError::internal(e.to_string())),
        }
    }
    let mut out_groups = groups;
    if let (Some((ns, _)), true) = (service_account, out_groups.is_empty()) {
        out_groups.push("system:serviceaccounts".into());
        out_groups.push(format!("system:serviceaccounts:{ns}"));
    }
    let implied = if user == ANONYMOUS {
        "system:unauthenticated"
    } else {
        GROUP_AUTHENTICATED
    };
    if !out_groups.iter().any(|g| g == implied) {
        out_groups.push(implied.into());
    }
    Ok(Identity {
        user,
        groups: out_groups,
        uid,
        extra,
    })
}
