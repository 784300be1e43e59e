//! Calling one webhook: a client for its endpoint and CA bundle (built once,
//! then reused with its connections), the POST of the review under the
//! webhook's timeout, and what went wrong in kube's words.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use http_body_util::BodyExt;
use serde_json::Value;

use super::hooks::{Endpoint, Hook};
pub use crate::webhook_tls::MAX_ANSWER_BYTES as MAX_RESPONSE_BYTES;

/// A failure to get an answer from a webhook (kube's `ErrCallingWebhook`):
/// the webhook's failure policy decides whether the request fails.
#[derive(Debug, Clone, PartialEq)]
pub struct CallFailure {
    /// What follows `failed calling webhook "<name>": `.
    pub reason: String,
}

impl CallFailure {
    fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

/// Where one call goes.
struct Destination {
    /// The URL as kube names it in messages (before `?timeout=`).
    url: String,
    /// `host:port` to connect to (after `--admission-webhook-resolve`).
    dial: String,
    /// The name the serving certificate must carry, when not the dial host.
    server_name: Option<String>,
    path: String,
}

type HttpsClient = hyper_util::client::legacy::Client<
    crate::webhook_tls::Connector,
    http_body_util::Full<bytes::Bytes>,
>;

#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    dial: String,
    server_name: Option<String>,
    ca: Vec<u8>,
}

/// The clients of every webhook, by endpoint and CA bundle.
pub struct Clients {
    /// `host:port` → the address to connect to instead (the cluster's DNS
    /// resolves services in a pod; elsewhere this says where they are).
    resolve: HashMap<String, SocketAddr>,
    clients: Mutex<HashMap<ClientKey, HttpsClient>>,
}

impl Clients {
    pub fn new(resolve: &[(String, SocketAddr)]) -> Self {
        Self {
            resolve: resolve.iter().cloned().collect(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn destination(&self, endpoint: &Endpoint) -> Result<Destination, String> {
        let (url, host, port, path) = match endpoint {
            Endpoint::Url(u) => {
                let uri: http::Uri = u.parse().map_err(|e| format!("invalid URL {u:?}: {e}"))?;
                if uri.scheme_str() != Some("https") {
                    return Err(format!("{u:?}: 'https' is the only allowed URL scheme"));
                }
                let host = uri
                    .host()
                    .ok_or_else(|| format!("invalid URL {u:?}: no host"))?
                    .to_string();
                let port = uri.port_u16().unwrap_or(443);
                let authority = uri.authority().map(|a| a.as_str()).unwrap_or(&host);
                let path = uri.path().to_string();
                (format!("https://{authority}{path}"), host, port, path)
            }
            Endpoint::Service {
                namespace,
                name,
                path,
                port,
            } => {
                let host = format!("{name}.{namespace}.svc");
                (
                    format!("https://{host}:{port}{path}"),
                    host,
                    *port,
                    path.clone(),
                )
            }
            Endpoint::Invalid => {
                return Err("exactly one of url or service is required".into());
            }
        };
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let (dial, server_name) = match self.resolve.get(&format!("{bare}:{port}")) {
            Some(addr) => (addr.to_string(), Some(bare)),
            None => (format!("{host}:{port}"), None),
        };
        Ok(Destination {
            url,
            dial,
            server_name,
            path: if path.is_empty() { "/".into() } else { path },
        })
    }

    fn client(&self, d: &Destination, ca: &[u8]) -> Result<HttpsClient, String> {
        let key = ClientKey {
            dial: d.dial.clone(),
            server_name: d.server_name.clone(),
            ca: ca.to_vec(),
        };
        if let Some(c) = self.clients.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        // The webhook's own timeout bounds each call; this bounds a dial
        // that would otherwise wait for the kernel.
        let connector = crate::webhook_tls::connector(
            ca,
            d.server_name.as_deref(),
            std::time::Duration::from_secs(30),
        )
        .map_err(|e| e.to_string())?;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        if let Ok(mut m) = self.clients.lock() {
            m.insert(key, client.clone());
        }
        Ok(client)
    }

    /// POSTs `review` to the webhook and returns the review it answers.
    pub async fn call(&self, hook: &Hook, review: &Value) -> Result<Value, CallFailure> {
        let d = self
            .destination(&hook.endpoint)
            .map_err(|e| CallFailure::new(format!("could not get REST client: {e}")))?;
        let client = self
            .client(&d, &hook.ca_bundle)
            .map_err(|e| CallFailure::new(format!("could not get REST client: {e}")))?;
        // In AdmissionReview's field order, as kube sends it.
        let body = crate::api::encoding::typed_order::to_vec(review);
        // kube tells the webhook its deadline in whole seconds.
        let timeout = format!("{}s", hook.timeout.as_secs().max(1));
        let url = format!("{}?timeout={timeout}", d.url);
        let failed = |why: String| CallFailure::new(format!("failed to call webhook: {why}"));
        let mut req =
            http::Request::post(format!("https://{}{}?timeout={timeout}", d.dial, d.path))
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json, */*")
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .map_err(|e| failed(e.to_string()))?;
        // kube's webhook client (otelhttp's transport): a client span, whose
        // context the webhook receives as `traceparent`.
        let span = crate::traces::Span::child_with(
            "HTTP POST",
            opentelemetry::trace::SpanKind::Client,
            || {
                vec![
                    opentelemetry::KeyValue::new("http.request.method", "POST"),
                    opentelemetry::KeyValue::new("url.full", url.clone()),
                ]
            },
        );
        match &span {
            Some(s) => s.inject(req.headers_mut()),
            None => crate::traces::inject(req.headers_mut()),
        }
        let exchange = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| crate::webhook_tls::describe(&e, &d.dial))?;
            let status = resp.status();
            let text = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("text/plain"));
            let bytes = http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, text, bytes))
        };
        let (status, text, bytes) = match tokio::time::timeout(hook.timeout, exchange).await {
            Err(_) => {
                let why = format!("Post {url:?}: context deadline exceeded");
                if let Some(s) = &span {
                    s.fail(why.clone());
                }
                return Err(failed(why));
            }
            Ok(Err(why)) => {
                let why = format!("Post {url:?}: {why}");
                if let Some(s) = &span {
                    s.fail(why.clone());
                }
                return Err(failed(why));
            }
            Ok(Ok(r)) => r,
        };
        if let Some(s) = &span {
            s.set_attribute(opentelemetry::KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
        }
        drop(span);
        if !status.is_success() {
            return Err(failed(unexpected_status(status.as_u16(), text, &bytes)));
        }
        super::review::decode(&bytes).map_err(failed)
    }
}

/// client-go's error for a non-2xx answer: the Status the server sent, or
/// apimachinery's generic words for the code.
fn unexpected_status(code: u16, text: bool, body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if v.get("kind").and_then(Value::as_str) == Some("Status") {
            if let Some(m) = v.get("message").and_then(Value::as_str) {
                return m.to_string();
            }
        }
    }
    let server = if text {
        String::from_utf8_lossy(body).trim().to_string()
    } else {
        "unknown".to_string()
    };
    match code {
        409 => "the server reported a conflict".into(),
        404 => "the server could not find the requested resource".into(),
        400 => "the server rejected our request for an unknown reason".into(),
        401 => "the server has asked for the client to provide credentials".into(),
        403 | 415 => server,
        406 if server.is_empty() || server == "unknown" => {
            "the server was unable to respond with a content type that the client supports".into()
        }
        406 => server,
        405 => "the server does not allow this method on the requested resource".into(),
        422 => "the server rejected our request due to an error in our request".into(),
        503 => "the server is currently unable to handle the request".into(),
        504 => "the server was unable to return a response in the time allotted, but may still be processing the request".into(),
        429 => "the server has received too many requests and has asked us to try again later".into(),
        c if c >= 500 => format!(
            "an error on the server ({}) has prevented the request from succeeding",
            crate::status::quote(&server)
        ),
        c => format!("the server responded with the status code {c} but did not return more information"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_name_the_url_kube_names() {
        let clients = Clients::new(&[(
            "hooks.test.svc:8443".into(),
            "127.0.0.1:9999".parse().expect("addr"),
        )]);
        let svc = |port| Endpoint::Service {
            namespace: "test".into(),
            name: "hooks".into(),
            path: "/mutate".into(),
            port,
        };
        let d = clients.destination(&svc(8443)).expect("service");
        assert_eq!(d.url, "https://hooks.test.svc:8443/mutate");
        assert_eq!(
            (d.dial.as_str(), d.server_name.as_deref()),
            ("127.0.0.1:9999", Some("hooks.test.svc"))
        );
        let d = clients.destination(&svc(443)).expect("service");
        assert_eq!(
            (d.dial.as_str(), d.server_name),
            ("hooks.test.svc:443", None)
        );
        let d = clients
            .destination(&Endpoint::Url("https://example.com/v".into()))
            .expect("url");
        assert_eq!(
            (d.url.as_str(), d.dial.as_str()),
            ("https://example.com/v", "example.com:443")
        );
        assert!(clients
            .destination(&Endpoint::Url("http://example.com/v".into()))
            .is_err());
    }

    #[test]
    fn unexpected_answers_read_as_client_go_reads_them() {
        assert_eq!(
            unexpected_status(500, true, b"boom\n"),
            "an error on the server (\"boom\") has prevented the request from succeeding"
        );
        assert_eq!(
            unexpected_status(404, false, b"{}"),
            "the server could not find the requested resource"
        );
        assert_eq!(
            unexpected_status(
                400,
                false,
                br#"{"kind":"Status","apiVersion":"v1","message":"bad review"}"#
            ),
            "bad review"
        );
    }
}
