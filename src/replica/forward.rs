//! Forwarding a write from a follower to the leader over the internal
//! endpoint, and trusting the identity it carries only with the shared secret.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body_util::Full;
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

use crate::auth::Identity;

pub const USER: &str = "x-kshard-forwarded-user";
pub const UID: &str = "x-kshard-forwarded-uid";
pub const GROUP: &str = "x-kshard-forwarded-group";
pub const EXTRA_PREFIX: &str = "x-kshard-forwarded-extra-";
/// Set by a replica that received a forwarded write without holding the lease.
pub const NOT_LEADER: &str = "x-kshard-not-leader";
/// Milliseconds the forwarding follower still waits for the answer: the
/// leader's request deadline (trusted only with the shared secret).
pub const TIMEOUT_MS: &str = "x-kshard-timeout-ms";

/// The identity a follower authenticated, trusted because the request came
/// with the replicas' shared secret on the internal endpoint.
#[derive(Clone, Debug)]
pub struct ForwardedIdentity(pub Identity);

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub fn client() -> Client {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(2)));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build(connector)
}

fn encode(v: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&utf8_percent_encode(v, NON_ALPHANUMERIC).to_string()).ok()
}

fn decode(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Headers that describe `identity` to the leader.
pub fn identity_headers(headers: &mut HeaderMap, identity: &Identity) {
    if let Some(v) = encode(&identity.user) {
        headers.insert(USER, v);
    }
    if let Some(v) = encode(&identity.uid) {
        headers.insert(UID, v);
    }
    for g in &identity.groups {
        if let Some(v) = encode(g) {
            headers.append(GROUP, v);
        }
    }
    for (k, values) in &identity.extra {
        let name = format!(
            "{EXTRA_PREFIX}{}",
            utf8_percent_encode(k, NON_ALPHANUMERIC)
                .to_string()
                .to_ascii_lowercase()
        );
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for value in values {
            if let Some(v) = encode(value) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Takes the forwarded identity out of `headers` (always removing the headers).
pub fn take_identity(headers: &mut HeaderMap) -> Option<Identity> {
    let user = headers.get(USER).and_then(decode);
    let uid = headers.get(UID).and_then(decode).unwrap_or_default();
    let groups: Vec<String> = headers.get_all(GROUP).iter().filter_map(decode).collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let extra_names: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with(EXTRA_PREFIX))
        .cloned()
        .collect();
    for name in &extra_names {
        let key = percent_decode_str(&name.as_str()[EXTRA_PREFIX.len()..])
            .decode_utf8_lossy()
            .into_owned();
        extra.insert(
            key,
            headers.get_all(name).iter().filter_map(decode).collect(),
        );
        headers.remove(name);
    }
    headers.remove(USER);
    headers.remove(UID);
    headers.remove(GROUP);
    Some(Identity {
        user: user?,
        groups,
        uid,
        extra,
    })
}

/// Hop-by-hop headers and the client's own credentials stay behind.
fn forwardable(name: &HeaderName) -> bool {
    let n = name.as_str();
    !matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "upgrade"
            | "te"
            | "host"
            | "authorization"
            | "content-length"
            // The follower's own span goes instead (`Replica::send`).
            | "traceparent"
            | "tracestate"
    ) && !n.starts_with("impersonate-")
        && !n.starts_with("x-kshard-")
}

/// A buffered request, so it can be sent again after a failed connection.
pub struct Buffered {
    pub method: http::Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Kept for handling here after all (routing data lives in them).
    extensions: http::Extensions,
}

pub async fn buffer(req: Request) -> Result<Buffered, Response> {
    let (parts, body) = req.into_parts();
    // The body layer's limit (`--max-request-body-bytes`), refused as it does.
    let body = crate::scope::read_within(body, &parts.extensions)
        .await
        .map_err(|e| crate::api::response::error_response(&e))?;
    Ok(Buffered {
        method: parts.method,
        path_and_query: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers: parts.headers,
        body,
        extensions: parts.extensions,
    })
}

impl Buffered {
    /// Rebuilds the request for handling here after all.
    pub fn into_request(self) -> Request {
        let mut req = Request::new(Body::from(self.body));
        *req.method_mut() = self.method;
        if let Ok(uri) = self.path_and_query.parse() {
            *req.uri_mut() = uri;
        }
        *req.headers_mut() = self.headers;
        *req.extensions_mut() = self.extensions;
        req
    }

    /// The request for the leader; `left` is how long this replica waits for
    /// the answer, which the leader takes as its deadline (a little shorter,
    /// so its own 504 arrives in time).
    pub fn to_leader(
        &self,
        address: &str,
        secret: &str,
        identity: &Identity,
        left: Option<std::time::Duration>,
    ) -> Result<http::Request<Full<Bytes>>, http::Error> {
        let mut builder = http::Request::builder()
            .method(self.method.clone())
            .uri(format!("http://{address}{}", self.path_and_query));
        if let Some(h) = builder.headers_mut() {
            for (name, value) in &self.headers {
                if forwardable(name) {
                    h.append(name.clone(), value.clone());
                }
            }
            identity_headers(h, identity);
            if let Some(left) = left {
                let ms = left.saturating_sub(left / 10).as_millis().max(1);
                if let Ok(v) = HeaderValue::from_str(&ms.to_string()) {
                    h.insert(TIMEOUT_MS, v);
                }
            }
            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {secret}")) {
                h.insert(http::header::AUTHORIZATION, v);
            }
        }
        builder.body(Full::new(self.body.clone()))
    }
}

/// The leader's answer as this replica's own.
pub fn relay(resp: http::Response<hyper::body::Incoming>) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(http::header::CONNECTION);
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    // The body is already encoded as the leader chose; do not compress it again.
    parts.extensions.insert(crate::api::response::NoCompression);
    Response::from_parts(parts, Body::new(body))
}

/// A write sent to the leader that did not answer (connection lost, or the
/// lease moved away from it): it may or may not have been carried out, so
/// the client must not take it as not done (kube's 504 `Timeout`).
pub fn outcome_unknown(write: &super::WriteInfo) -> Response {
    crate::api::response::error_response(&crate::status::ApiError::write_outcome_unknown(
        &write.verb,
        &write.group,
        &write.resource,
    ))
}

/// A write certainly not carried out (no leader, the leader unreachable or
/// no longer leading): 503 with `Retry-After`, safe to retry.
pub fn unavailable(message: &str) -> Response {
    let mut r =
        crate::api::response::error_response(&crate::status::ApiError::unavailable(message));
    if r.status() != StatusCode::SERVICE_UNAVAILABLE {
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_through_headers() {
        let id = Identity {
            user: "jane dö".into(),
            groups: vec!["system:authenticated".into(), "a,b".into()],
            uid: "42".into(),
            extra: BTreeMap::from([("scopes.example/X".into(), vec!["a".into(), "b c".into()])]),
        };
        let mut h = HeaderMap::new();
        identity_headers(&mut h, &id);
        let got = take_identity(&mut h).expect("identity");
        assert_eq!(got.user, id.user);
        assert_eq!(got.groups, id.groups);
        assert_eq!(got.uid, id.uid);
        // Header names are case-insensitive: extra keys come back lower-cased, as kube's do.
        assert_eq!(
            got.extra.get("scopes.example/x"),
            Some(&vec!["a".to_string(), "b c".to_string()])
        );
        assert!(h.is_empty());
    }
}
