//! A real HTTPS admission webhook server for tests: rustls with a serving
//! certificate from a test CA (whose PEM is the configurations'
//! `caBundle`), one programmable handler per path, and every review it
//! received, in order. The certificate names `hooks.test.svc` (the Service
//! the configurations name; kshard reaches it through
//! `--admission-webhook-resolve`), `localhost` and `127.0.0.1`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine as _;
use serde_json::{json, Value};

use super::tls::Ca;

/// The Service every test configuration names.
pub const SERVICE_HOST: &str = "hooks.test.svc";

/// What a handler answers.
#[derive(Clone)]
pub struct Reply {
    /// Waited before answering (a slow webhook).
    pub delay: Duration,
    pub status: u16,
    pub body: Value,
}

fn response_for(review: &Value, response: Value) -> Value {
    let mut r = response;
    r["uid"] = review["request"]["uid"].clone();
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": r})
}

impl Reply {
    pub fn allow(review: &Value) -> Self {
        Self::answer(review, json!({"allowed": true}))
    }

    /// Refuses with this `status` (code, reason, message as the webhook likes).
    pub fn deny(review: &Value, status: Value) -> Self {
        Self::answer(review, json!({"allowed": false, "status": status}))
    }

    /// Allows with a JSON patch of the object.
    pub fn patch(review: &Value, ops: Value) -> Self {
        let patch = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&ops).expect("json"));
        Self::answer(
            review,
            json!({"allowed": true, "patchType": "JSONPatch", "patch": patch}),
        )
    }

    /// Any `response` (its uid is filled in).
    pub fn answer(review: &Value, response: Value) -> Self {
        Self {
            delay: Duration::ZERO,
            status: 200,
            body: response_for(review, response),
        }
    }

    pub fn with_warnings(mut self, warnings: &[&str]) -> Self {
        self.body["response"]["warnings"] = json!(warnings);
        self
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

pub type Handler = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

/// One review received: the path and query it came to, and the review.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub query: String,
    pub review: Value,
    /// The W3C trace context the caller sent (a traced kshard's span).
    pub traceparent: Option<String>,
}

#[derive(Default)]
struct Hooks {
    handlers: Mutex<HashMap<String, Handler>>,
    received: Mutex<Vec<Received>>,
}

pub struct WebhookServer {
    pub addr: SocketAddr,
    pub ca: Ca,
    hooks: Arc<Hooks>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebhookServer {
    pub async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = Ca::new("webhook-ca");
        let hooks = Arc::new(Hooks::default());
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(hooks.clone());
        let (addr, task) =
            super::tls::serve_https(&ca, &[SERVICE_HOST, "localhost", "127.0.0.1"], app).await;
        WebhookServer {
            addr,
            ca,
            hooks,
            task,
        }
    }

    /// A server whose serving certificate is self-signed with `CA:TRUE`
    /// for `sans` (what `openssl req -x509` makes), given as its own
    /// `caBundle` (`ca_pem`): many webhook guides set webhooks up so.
    pub async fn start_self_signed(sans: &[&str]) -> (Self, String) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, sans[0]);
        let cert = params.self_signed(&key).expect("cert").pem();
        let hooks = Arc::new(Hooks::default());
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(hooks.clone());
        let (addr, task) = super::tls::serve_https_with(&cert, &key.serialize_pem(), app).await;
        let server = WebhookServer {
            addr,
            // Unused for this server: its bundle is its own certificate.
            ca: Ca::new("unused"),
            hooks,
            task,
        };
        (server, cert)
    }

    /// What kshard needs to reach `hooks.test.svc:443` here.
    pub fn resolve(&self) -> Vec<(String, SocketAddr)> {
        vec![(format!("{SERVICE_HOST}:443"), self.addr)]
    }

    /// The `caBundle` of configurations that call this server.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca.pem)
    }

    /// Sets (or replaces) what `path` answers.
    pub fn handle(&self, path: &str, h: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        self.hooks
            .handlers
            .lock()
            .expect("handlers")
            .insert(path.to_string(), Arc::new(h));
    }

    /// Every review `path` received so far.
    pub fn received(&self, path: &str) -> Vec<Received> {
        self.hooks
            .received
            .lock()
            .expect("received")
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// The reviews `path` received, forgetting them.
    pub fn take(&self, path: &str) -> Vec<Received> {
        let mut all = self.hooks.received.lock().expect("received");
        let (taken, kept): (Vec<_>, Vec<_>) = all.drain(..).partition(|r| r.path == path);
        *all = kept;
        taken
    }

    /// A webhook of a configuration, calling `path` here through the Service.
    pub fn webhook(&self, name: &str, path: &str) -> Value {
        json!({
            "name": name,
            "clientConfig": {
                "service": {"namespace": "test", "name": "hooks", "path": path},
                "caBundle": self.ca_bundle(),
            },
            "rules": [{
                "operations": ["*"],
                "apiGroups": ["demo.kshard.dev"],
                "apiVersions": ["*"],
                "resources": ["widgets", "widgets/status", "widgets/scale"],
            }],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        })
    }
}

async fn serve(State(hooks): State<Arc<Hooks>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let bytes = axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    let review: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    hooks.received.lock().expect("received").push(Received {
        path: path.clone(),
        query,
        review: review.clone(),
        traceparent,
    });
    let handler = hooks.handlers.lock().expect("handlers").get(&path).cloned();
    let reply = match handler {
        Some(h) => h(&review),
        None => Reply {
            delay: Duration::ZERO,
            status: 404,
            body: json!({}),
        },
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut r = Response::new(Body::from(serde_json::to_vec(&reply.body).expect("json")));
    *r.status_mut() = http::StatusCode::from_u16(reply.status).expect("status");
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}
