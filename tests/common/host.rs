//! HOST DOUBLE: a stand-in for the host cluster's kube-apiserver, because no
//! kube-apiserver can run on these machines. It speaks the real wire protocol
//! over HTTPS for the parts kshard uses — TokenReview, SubjectAccessReview,
//! `kube-system` ConfigMaps, Namespaces and `admissionregistration.k8s.io/v1`
//! Mutating/ValidatingWebhookConfigurations, ValidatingAdmissionPolicies and
//! their bindings with list/watch (resourceVersion,
//! watch events, field selectors), and with create/update/delete
//! kshard's `apiextensions.kshard.dev/v1` ShardResourceDefinitions (a custom
//! resource with the status subresource, finalizers and deletionTimestamp,
//! conflicts on a stale resourceVersion) and `apiregistration.k8s.io/v1`
//! APIServices (label selectors) — and acts as kube-aggregator in front of
//! kshard: callers authenticate with bearer tokens and their requests are
//! proxied to kshard with the front-proxy client certificate and
//! `X-Remote-*` headers, so kubectl pointed at it reaches kshard as it would
//! through a real cluster.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};
use tokio::sync::broadcast;

pub const KSHARD_TOKEN: &str = "kshard-service-account-token";

/// A certificate authority for tests.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("ca").pem();
        Ca { params, key, pem }
    }

    /// A client certificate (PEM cert, PEM key).
    pub fn client(&self, cn: &str, orgs: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let issuer = Issuer::from_params(&self.params, &self.key);
        (
            params.signed_by(&key, &issuer).expect("cert").pem(),
            key.serialize_pem(),
        )
    }

    /// A serving certificate for `sans` (PEM cert, PEM key).
    pub fn server(&self, sans: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, sans[0]);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let issuer = Issuer::from_params(&self.params, &self.key);
        (
            params.signed_by(&key, &issuer).expect("cert").pem(),
            key.serialize_pem(),
        )
    }
}

/// Serves `app` over HTTPS on a free loopback port with a certificate of
/// `ca` for `sans` (HTTP/2 and HTTP/1.1, upgrades allowed).
pub async fn serve_https(
    ca: &Ca,
    sans: &[&str],
    app: axum::Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let (cert, key) = ca.server(sans);
    serve_https_with(&cert, &key, app).await
}

/// Serves `app` over HTTPS with this certificate and key (PEM).
pub async fn serve_https_with(
    cert: &str,
    key: &str,
    app: axum::Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("tls");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    (addr, task)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `server` trusting `ca_pem`, with a token or a client certificate.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    token: Option<&str>,
    cert: Option<&(String, String)>,
) {
    let mut user = String::new();
    if let Some(t) = token {
        user.push_str(&format!("    token: {t}\n"));
    }
    if let Some((c, k)) = cert {
        user.push_str(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(c),
            b64(k)
        ));
    }
    if user.is_empty() {
        user.push_str("    username: nobody\n");
    }
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context: {{cluster: k, user: u, namespace: default}}\ncurrent-context: c\n",
        b64(ca_pem)
    );
    std::fs::write(path, kc).expect("kubeconfig");
}

/// Who a bearer token belongs to.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }
}

/// Decides a SubjectAccessReview spec: (allowed, reason).
pub type Policy = Arc<dyn Fn(&Value) -> (bool, String) + Send + Sync>;

struct Stored {
    kind: &'static str,
    namespace: String,
    name: String,
    object: Value,
}

struct Objects {
    rv: u64,
    items: Vec<Stored>,
    /// Every change as (rv, kind, event), for watches that start in the past.
    history: Vec<(u64, &'static str, Value)>,
}

/// Where the host forwards aggregated requests: kshard, and the front-proxy identity.
pub struct Upstream {
    pub addr: SocketAddr,
    pub client: kube::Client,
}

pub struct HostState {
    objects: Mutex<Objects>,
    events: broadcast::Sender<(u64, &'static str, Value)>,
    tokens: Mutex<HashMap<String, User>>,
    policy: Mutex<Policy>,
    pub token_reviews: AtomicUsize,
    pub access_reviews: AtomicUsize,
    /// Every SubjectAccessReview spec received, in order.
    pub reviewed: Mutex<Vec<Value>>,
    /// Namespaced list/watch paths the host answers 503 to (to hold kshard unready).
    pub unavailable: Mutex<Vec<String>>,
    upstream: tokio::sync::RwLock<Option<Upstream>>,
}

pub struct HostDouble {
    pub addr: SocketAddr,
    pub ca: Ca,
    /// The kubeconfig kshard uses to reach the host (its service-account token).
    pub kubeconfig: PathBuf,
    pub front_proxy_ca: Ca,
    pub client_ca: Ca,
    pub state: Arc<HostState>,
    pub dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `extension-apiserver-authentication` data kube-apiserver publishes.
pub fn authentication_configmap_data(
    client_ca: &str,
    front_proxy_ca: &str,
    allowed_names: &[&str],
) -> Value {
    json!({
        "client-ca-file": client_ca,
        "requestheader-client-ca-file": front_proxy_ca,
        "requestheader-allowed-names": serde_json::to_string(allowed_names).expect("json"),
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-uid-headers": "[\"X-Remote-Uid\"]",
    })
}

impl HostDouble {
    /// A host with namespaces `default` and `kube-system`, the authentication
    /// ConfigMap (front-proxy CN `front-proxy-client`), kshard's own token, and
    /// a policy that denies everything.
    pub async fn start(dir: &Path) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = Ca::new("host-ca");
        let front_proxy_ca = Ca::new("front-proxy-ca");
        let client_ca = Ca::new("kubernetes-client-ca");
        let (events, _) = broadcast::channel(1024);
        let state = Arc::new(HostState {
            objects: Mutex::new(Objects {
                rv: 100,
                items: Vec::new(),
                history: Vec::new(),
            }),
            events,
            tokens: Mutex::new(HashMap::new()),
            policy: Mutex::new(Arc::new(|_: &Value| (false, String::new()))),
            token_reviews: AtomicUsize::new(0),
            access_reviews: AtomicUsize::new(0),
            reviewed: Mutex::new(Vec::new()),
            unavailable: Mutex::new(Vec::new()),
            upstream: tokio::sync::RwLock::new(None),
        });
        state.add_token(
            KSHARD_TOKEN,
            User::new(
                "system:serviceaccount:kshard-system:kshard",
                &[
                    "system:serviceaccounts",
                    "system:serviceaccounts:kshard-system",
                ],
            ),
        );
        for ns in ["default", "kube-system"] {
            state.put_namespace(ns, false);
        }
        state.put_configmap(
            "kube-system",
            "extension-apiserver-authentication",
            authentication_configmap_data(
                &client_ca.pem,
                &front_proxy_ca.pem,
                &["front-proxy-client"],
            ),
        );

        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let (addr, task) = serve_https(&ca, &["localhost", "127.0.0.1"], app).await;
        let kubeconfig = dir.join("host.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &format!("https://{addr}"),
            &ca.pem,
            Some(KSHARD_TOKEN),
            None,
        );
        HostDouble {
            addr,
            ca,
            kubeconfig,
            front_proxy_ca,
            client_ca,
            state,
            dir: dir.to_path_buf(),
            task,
        }
    }

    /// Makes the host proxy aggregated requests to kshard at `addr`, presenting
    /// a front-proxy client certificate with CN `cn` (and trusting `kshard_ca`).
    pub async fn aggregate(&self, addr: SocketAddr, kshard_ca: &str, cn: &str) {
        let cert = self.front_proxy_ca.client(cn, &[]);
        let path = self.dir.join(format!("front-proxy-{cn}.kubeconfig"));
        write_kubeconfig(
            &path,
            &format!("https://{addr}"),
            kshard_ca,
            None,
            Some(&cert),
        );
        let client = super::client_for(&path).await;
        *self.state.upstream.write().await = Some(Upstream { addr, client });
    }

    /// A kubeconfig for talking to the host (and through it to kshard) as the token's user.
    pub fn user_kubeconfig(&self, token: &str) -> PathBuf {
        let path = self.dir.join(format!("user-{token}.kubeconfig"));
        write_kubeconfig(
            &path,
            &format!("https://{}", self.addr),
            &self.ca.pem,
            Some(token),
            None,
        );
        path
    }
}

impl HostState {
    pub fn add_token(&self, token: &str, user: User) {
        self.tokens
            .lock()
            .expect("tokens")
            .insert(token.to_string(), user);
    }

    pub fn set_policy(&self, p: impl Fn(&Value) -> (bool, String) + Send + Sync + 'static) {
        *self.policy.lock().expect("policy") = Arc::new(p);
    }

    fn put(&self, kind: &'static str, namespace: &str, name: &str, mut object: Value) {
        let mut o = self.objects.lock().expect("objects");
        o.rv += 1;
        let rv = o.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        object["metadata"]["name"] = json!(name);
        if !namespace.is_empty() {
            object["metadata"]["namespace"] = json!(namespace);
        }
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
            object["metadata"]["creationTimestamp"] = json!("2026-11-22T00:00:00Z");
        }
        let existing = o
            .items
            .iter()
            .position(|s| s.kind == kind && s.namespace == namespace && s.name == name);
        let ev_type = if existing.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        match existing {
            Some(i) => o.items[i].object = object.clone(),
            None => o.items.push(Stored {
                kind,
                namespace: namespace.into(),
                name: name.into(),
                object: object.clone(),
            }),
        }
        let ev = json!({"type": ev_type, "object": object});
        o.history.push((rv, kind, ev.clone()));
        let _ = self.events.send((rv, kind, ev));
    }

    fn remove(&self, kind: &'static str, namespace: &str, name: &str) {
        let mut o = self.objects.lock().expect("objects");
        let Some(i) = o
            .items
            .iter()
            .position(|s| s.kind == kind && s.namespace == namespace && s.name == name)
        else {
            return;
        };
        let mut gone = o.items.remove(i).object;
        o.rv += 1;
        let rv = o.rv;
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        let ev = json!({"type": "DELETED", "object": gone});
        o.history.push((rv, kind, ev.clone()));
        let _ = self.events.send((rv, kind, ev));
    }

    /// Creates or updates a namespace; `terminating` sets deletionTimestamp and phase.
    pub fn put_namespace(&self, name: &str, terminating: bool) {
        self.put_namespace_labeled(name, terminating, &[]);
    }

    /// A namespace with labels besides the `kubernetes.io/metadata.name`
    /// kube-apiserver gives every namespace.
    pub fn put_namespace_labeled(&self, name: &str, terminating: bool, labels: &[(&str, &str)]) {
        let mut all = serde_json::Map::new();
        all.insert("kubernetes.io/metadata.name".into(), json!(name));
        for (k, v) in labels {
            all.insert(k.to_string(), json!(v));
        }
        let mut ns = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": all},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": if terminating { "Terminating" } else { "Active" }},
        });
        let uid = self
            .get("namespaces", "", name)
            .map(|o| o["metadata"]["uid"].clone());
        if let Some(uid) = uid {
            ns["metadata"]["uid"] = uid;
        }
        if terminating {
            ns["metadata"]["deletionTimestamp"] = json!("2026-11-22T00:00:00Z");
        }
        self.put("namespaces", "", name, ns);
    }

    pub fn delete_namespace(&self, name: &str) {
        self.remove("namespaces", "", name);
    }

    /// Creates or updates a MutatingWebhookConfiguration (`mutating`) or a
    /// ValidatingWebhookConfiguration with these webhooks.
    pub fn put_webhook_configuration(&self, mutating: bool, name: &str, webhooks: Value) {
        let (plural, kind) = webhook_kind(mutating);
        let uid = self
            .get(plural, "", name)
            .map(|o| o["metadata"]["uid"].clone());
        let mut obj = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "webhooks": webhooks,
        });
        if let Some(uid) = uid {
            obj["metadata"]["uid"] = uid;
        }
        self.put(plural, "", name, obj);
    }

    pub fn delete_webhook_configuration(&self, mutating: bool, name: &str) {
        self.remove(webhook_kind(mutating).0, "", name);
    }

    /// Creates or updates a ValidatingAdmissionPolicy (`binding` false) or
    /// a ValidatingAdmissionPolicyBinding with this spec.
    pub fn put_admission_policy(&self, binding: bool, name: &str, spec: Value) {
        let (plural, kind) = if binding {
            (
                "validatingadmissionpolicybindings",
                "ValidatingAdmissionPolicyBinding",
            )
        } else {
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy")
        };
        let obj = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "spec": spec,
        });
        self.put(plural, "", name, obj);
    }

    pub fn put_configmap(&self, namespace: &str, name: &str, data: Value) {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}, "data": data});
        self.put("configmaps", namespace, name, cm);
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let o = self.objects.lock().expect("objects");
        o.items
            .iter()
            .find(|s| s.kind == kind && s.namespace == namespace && s.name == name)
            .map(|s| s.object.clone())
    }

    fn authenticate(&self, headers: &http::HeaderMap) -> Option<User> {
        let v = headers.get("authorization")?.to_str().ok()?;
        let token = v.strip_prefix("Bearer ")?;
        self.tokens.lock().expect("tokens").get(token).cloned()
    }
}

fn webhook_kind(mutating: bool) -> (&'static str, &'static str) {
    if mutating {
        (
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
        )
    } else {
        (
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
        )
    }
}

fn json_response(code: u16, v: &Value) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(v).expect("json")));
    *r.status_mut() = http::StatusCode::from_u16(code).expect("code");
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    json_response(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

fn query(req: &Request) -> HashMap<String, String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The host's own API (as a kube-apiserver with only these resources), then
/// everything else proxied to kshard as the aggregator would.
async fn handle(State(st): State<Arc<HostState>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let own = matches!(
        segs.as_slice(),
        ["api"] | ["api", "v1"] | ["api", "v1", "namespaces", ..]
    ) || path.starts_with("/apis/authentication.k8s.io/")
        || path.starts_with("/apis/authorization.k8s.io/")
        || path.starts_with("/apis/admissionregistration.k8s.io/")
        || path.starts_with("/apis/apiextensions.kshard.dev/")
        || path.starts_with("/apis/apiregistration.k8s.io/");
    if !own {
        return proxy(st, req).await;
    }
    let Some(_caller) = st.authenticate(req.headers()) else {
        return status(401, "Unauthorized", "Unauthorized");
    };
    if st.unavailable.lock().expect("unavailable").contains(&path) {
        return status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    let q = query(&req);
    match (req.method().as_str(), segs.as_slice()) {
        ("GET", ["api"]) => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        ("GET", ["api", "v1"]) => json_response(
            200,
            &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "namespaces", "singularName": "namespace", "namespaced": false, "kind": "Namespace",
                 "verbs": ["get", "list", "watch"], "shortNames": ["ns"]},
                {"name": "configmaps", "singularName": "configmap", "namespaced": true, "kind": "ConfigMap",
                 "verbs": ["get", "list", "watch"], "shortNames": ["cm"]},
            ]}),
        ),
        ("GET", ["api", "v1", "namespaces"]) => collection(&st, "namespaces", "", &q).await,
        ("GET", ["api", "v1", "namespaces", name]) => match st.get("namespaces", "", name) {
            Some(o) => json_response(200, &o),
            None => status(404, "NotFound", &format!("namespaces \"{name}\" not found")),
        },
        ("GET", ["api", "v1", "namespaces", ns, "configmaps"]) => {
            collection(&st, "configmaps", ns, &q).await
        }
        ("GET", ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            match st.get("configmaps", ns, name) {
                Some(o) => json_response(200, &o),
                None => status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
            }
        }
        (
            "GET",
            ["apis", "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"],
        ) => collection(&st, "mutatingwebhookconfigurations", "", &q).await,
        (
            "GET",
            ["apis", "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"],
        ) => collection(&st, "validatingwebhookconfigurations", "", &q).await,
        ("GET", ["apis", "admissionregistration.k8s.io", "v1", plural])
            if plural.starts_with("validatingadmissionpolic") =>
        {
            let kind = if plural.ends_with("bindings") {
                "validatingadmissionpolicybindings"
            } else {
                "validatingadmissionpolicies"
            };
            collection(&st, kind, "", &q).await
        }
        (_, ["apis", group, "v1", plural, rest @ ..])
            if CUSTOM
                .iter()
                .any(|k| k.group == *group && k.plural == *plural) =>
        {
            let Some(kind) = CUSTOM
                .iter()
                .find(|k| k.group == *group && k.plural == *plural)
            else {
                return status(404, "NotFound", "not found");
            };
            let method = req.method().as_str().to_string();
            let rest: Vec<String> = rest.iter().map(|r| r.to_string()).collect();
            custom(&st, kind, &method, &rest, &q, req).await
        }
        ("POST", ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
            st.token_reviews.fetch_add(1, Ordering::SeqCst);
            let body = body_json(req).await;
            let token = body["spec"]["token"].as_str().unwrap_or("");
            let user = st.tokens.lock().expect("tokens").get(token).cloned();
            let status = match user {
                Some(u) => json!({"authenticated": true, "user": {
                    "username": u.name, "groups": u.groups, "extra": u.extra}}),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            json_response(
                201,
                &json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                        "metadata": {"creationTimestamp": null}, "spec": body["spec"], "status": status}),
            )
        }
        ("POST", ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]) => {
            st.access_reviews.fetch_add(1, Ordering::SeqCst);
            let body = body_json(req).await;
            st.reviewed
                .lock()
                .expect("reviewed")
                .push(body["spec"].clone());
            let policy = st.policy.lock().expect("policy").clone();
            let (allowed, reason) = if discovery_rule(&body["spec"]) {
                (
                    true,
                    "RBAC: allowed by ClusterRoleBinding \"system:discovery\"".into(),
                )
            } else {
                policy(&body["spec"])
            };
            let mut status = json!({"allowed": allowed});
            if !reason.is_empty() {
                status["reason"] = json!(reason);
            }
            json_response(
                201,
                &json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                        "metadata": {"creationTimestamp": null}, "spec": body["spec"], "status": status}),
            )
        }
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

/// The bootstrap `system:discovery` and `system:public-info-viewer` roles:
/// every authenticated user may GET discovery, OpenAPI, version and health.
fn discovery_rule(spec: &Value) -> bool {
    let nr = &spec["nonResourceAttributes"];
    let path = nr["path"].as_str().unwrap_or("");
    let exact = [
        "/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz",
    ];
    let prefixes = ["/api/", "/apis/", "/openapi/", "/version/"];
    nr["verb"] == "get" && (exact.contains(&path) || prefixes.iter().any(|p| path.starts_with(p)))
}

async fn body_json(req: Request) -> Value {
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

fn selected(obj: &Value, field_selector: Option<&String>) -> bool {
    let Some(sel) = field_selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| match term.split_once('=') {
        Some(("metadata.name", v)) => obj["metadata"]["name"] == v.trim_start_matches('='),
        Some(("metadata.namespace", v)) => {
            obj["metadata"]["namespace"] == v.trim_start_matches('=')
        }
        _ => true,
    })
}

/// Equality-based label selector terms (`a=b,c==d,e!=f`, `g`, `!h`).
fn labelled(obj: &Value, label_selector: Option<&String>) -> bool {
    let Some(sel) = label_selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &obj["metadata"]["labels"];
    sel.split(',').all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k] != v
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k] == v.trim_start_matches('=')
        } else if let Some(k) = term.strip_prefix('!') {
            labels[k].is_null()
        } else {
            !labels[term].is_null()
        }
    })
}

/// A cluster-scoped kind the double stores with create/update/delete.
pub struct CustomKind {
    pub group: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// Has the status subresource (status ignored on main-resource writes).
    pub status: bool,
}

pub const SRD: CustomKind = CustomKind {
    group: "apiextensions.kshard.dev",
    plural: "shardresourcedefinitions",
    kind: "ShardResourceDefinition",
    status: true,
};
pub const APISERVICE: CustomKind = CustomKind {
    group: "apiregistration.k8s.io",
    plural: "apiservices",
    kind: "APIService",
    status: true,
};
const CUSTOM: [CustomKind; 2] = [SRD, APISERVICE];

/// The answer instead of a write (boxed: a Response is large).
type Refusal = Box<Response>;

/// What a write decided, under the store's lock.
enum Outcome {
    Put(Value),
    Remove(Value),
}

impl HostState {
    /// One object of a custom kind, as stored.
    pub fn object(&self, kind: &CustomKind, name: &str) -> Option<Value> {
        self.get(kind.plural, "", name)
    }

    /// Every object of a custom kind.
    pub fn objects(&self, kind: &CustomKind) -> Vec<Value> {
        let o = self.objects.lock().expect("objects");
        o.items
            .iter()
            .filter(|s| s.kind == kind.plural)
            .map(|s| s.object.clone())
            .collect()
    }

    /// Reads the current object and decides, atomically, as kube-apiserver's
    /// guaranteed update does; `Err` is the answer to send instead.
    fn write(
        &self,
        kind: &CustomKind,
        name: &str,
        decide: impl FnOnce(Option<&Value>) -> Result<Outcome, Refusal>,
    ) -> Result<Value, Refusal> {
        let mut o = self.objects.lock().expect("objects");
        let at = o
            .items
            .iter()
            .position(|s| s.kind == kind.plural && s.name == name);
        let outcome = decide(at.map(|i| &o.items[i].object))?;
        o.rv += 1;
        let rv = o.rv;
        let (ev_type, mut object) = match (outcome, at) {
            (Outcome::Remove(obj), Some(i)) => {
                o.items.remove(i);
                ("DELETED", obj)
            }
            (Outcome::Put(obj), Some(i)) => {
                o.items[i].object = obj.clone();
                ("MODIFIED", obj)
            }
            (Outcome::Put(obj), None) | (Outcome::Remove(obj), None) => {
                o.items.push(Stored {
                    kind: kind.plural,
                    namespace: String::new(),
                    name: name.into(),
                    object: obj.clone(),
                });
                ("ADDED", obj)
            }
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        if ev_type != "DELETED" {
            if let Some(i) = o
                .items
                .iter()
                .position(|s| s.kind == kind.plural && s.name == name)
            {
                o.items[i].object = object.clone();
            }
        }
        let ev = json!({"type": ev_type, "object": object});
        o.history.push((rv, kind.plural, ev.clone()));
        let _ = self.events.send((rv, kind.plural, ev));
        Ok(object)
    }
}

fn conflict(kind: &CustomKind, name: &str) -> Refusal {
    Box::new(status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            kind.plural, kind.group
        ),
    ))
}

fn not_found(kind: &CustomKind, name: &str) -> Refusal {
    Box::new(status(
        404,
        "NotFound",
        &format!("{}.{} \"{name}\" not found", kind.plural, kind.group),
    ))
}

/// A stale `resourceVersion` in an update is a conflict; none means "any".
fn stale(body: &Value, cur: &Value) -> bool {
    let sent = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
    !sent.is_empty() && sent != cur["metadata"]["resourceVersion"].as_str().unwrap_or("")
}

/// create, get, list/watch, update (main and status), delete of a custom
/// kind, with kube's finalizer and deletionTimestamp rules.
async fn custom(
    st: &Arc<HostState>,
    kind: &CustomKind,
    method: &str,
    rest: &[String],
    q: &HashMap<String, String>,
    req: Request,
) -> Response {
    let name = rest.first().map(String::as_str).unwrap_or("");
    let sub = rest.get(1).map(String::as_str);
    let api_version = format!("{}/v1", kind.group);
    let result = match (method, rest.len()) {
        ("GET", 0) => return collection(st, kind.plural, "", q).await,
        ("GET", 1 | 2) => {
            return match st.object(kind, name) {
                Some(o) => json_response(200, &o),
                None => *not_found(kind, name),
            }
        }
        ("POST", 0) => {
            let mut body = body_json(req).await;
            let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
            if name.is_empty() {
                return status(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name is required",
                );
            }
            body["apiVersion"] = json!(api_version);
            body["kind"] = json!(kind.kind);
            if kind.status {
                if let Some(m) = body.as_object_mut() {
                    m.remove("status");
                }
            }
            body["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
            body["metadata"]["creationTimestamp"] = json!("2026-11-22T00:00:00Z");
            body["metadata"]["generation"] = json!(1);
            st.write(kind, &name, |cur| match cur {
                Some(_) => Err(Box::new(status(
                    409,
                    "AlreadyExists",
                    &format!("{}.{} \"{name}\" already exists", kind.plural, kind.group),
                ))),
                None => Ok(Outcome::Put(body)),
            })
            .map(|o| (201, o))
        }
        ("PUT", 1) => {
            let mut body = body_json(req).await;
            st.write(kind, name, |cur| {
                let Some(cur) = cur else {
                    return Err(not_found(kind, name));
                };
                if stale(&body, cur) {
                    return Err(conflict(kind, name));
                }
                if kind.status {
                    body["status"] = cur["status"].clone();
                    if body["status"].is_null() {
                        if let Some(m) = body.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                ] {
                    body["metadata"][f] = cur["metadata"][f].clone();
                    if body["metadata"][f].is_null() {
                        if let Some(m) = body["metadata"].as_object_mut() {
                            m.remove(f);
                        }
                    }
                }
                let generation = cur["metadata"]["generation"].as_i64().unwrap_or(1);
                body["metadata"]["generation"] = json!(if body["spec"] != cur["spec"] {
                    generation + 1
                } else {
                    generation
                });
                body["apiVersion"] = json!(api_version);
                body["kind"] = json!(kind.kind);
                let finalizers_left = body["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if !cur["metadata"]["deletionTimestamp"].is_null() && !finalizers_left {
                    return Ok(Outcome::Remove(body));
                }
                Ok(Outcome::Put(body))
            })
            .map(|o| (200, o))
        }
        ("PUT", 2) if sub == Some("status") && kind.status => {
            let body = body_json(req).await;
            st.write(kind, name, |cur| {
                let Some(cur) = cur else {
                    return Err(not_found(kind, name));
                };
                if stale(&body, cur) {
                    return Err(conflict(kind, name));
                }
                let mut next = cur.clone();
                next["status"] = body["status"].clone();
                Ok(Outcome::Put(next))
            })
            .map(|o| (200, o))
        }
        ("DELETE", 1) => st
            .write(kind, name, |cur| {
                let Some(cur) = cur else {
                    return Err(not_found(kind, name));
                };
                let finalizers = cur["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty());
                if !finalizers {
                    return Ok(Outcome::Remove(cur.clone()));
                }
                let mut next = cur.clone();
                if next["metadata"]["deletionTimestamp"].is_null() {
                    next["metadata"]["deletionTimestamp"] = json!("2026-11-22T00:00:01Z");
                    next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                }
                Ok(Outcome::Put(next))
            })
            .map(|o| (200, o)),
        _ => Err(Box::new(status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ))),
    };
    match result {
        Ok((code, obj)) => json_response(code, &obj),
        Err(r) => *r,
    }
}

/// List, or with `watch=true` a watch stream, of one kind in one namespace.
async fn collection(
    st: &Arc<HostState>,
    kind: &'static str,
    namespace: &str,
    q: &HashMap<String, String>,
) -> Response {
    let fs = q.get("fieldSelector");
    let ls = q.get("labelSelector").cloned();
    let watching = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    if !watching {
        let o = st.objects.lock().expect("objects");
        let items: Vec<Value> = o
            .items
            .iter()
            .filter(|s| s.kind == kind && (namespace.is_empty() || s.namespace == namespace))
            .map(|s| s.object.clone())
            .filter(|v| selected(v, fs) && labelled(v, ls.as_ref()))
            .collect();
        let (list_kind, api_version) = match kind {
            "namespaces" => ("NamespaceList", "v1"),
            "mutatingwebhookconfigurations" => (
                "MutatingWebhookConfigurationList",
                "admissionregistration.k8s.io/v1",
            ),
            "validatingwebhookconfigurations" => (
                "ValidatingWebhookConfigurationList",
                "admissionregistration.k8s.io/v1",
            ),
            "validatingadmissionpolicies" => (
                "ValidatingAdmissionPolicyList",
                "admissionregistration.k8s.io/v1",
            ),
            "validatingadmissionpolicybindings" => (
                "ValidatingAdmissionPolicyBindingList",
                "admissionregistration.k8s.io/v1",
            ),
            "shardresourcedefinitions" => {
                ("ShardResourceDefinitionList", "apiextensions.kshard.dev/v1")
            }
            "apiservices" => ("APIServiceList", "apiregistration.k8s.io/v1"),
            _ => ("ConfigMapList", "v1"),
        };
        return json_response(
            200,
            &json!({"kind": list_kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": o.rv.to_string()}, "items": items}),
        );
    }
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(300u64);
    let (backlog, mut live) = {
        let o = st.objects.lock().expect("objects");
        let backlog: Vec<(u64, Value)> = o
            .history
            .iter()
            .filter(|(rv, k, _)| *rv > from && *k == kind)
            .map(|(rv, _, e)| (*rv, e.clone()))
            .collect();
        (backlog, st.events.subscribe())
    };
    let ns = namespace.to_string();
    let fs = fs.cloned();
    let wanted = move |ev: &Value| {
        (ns.is_empty() || ev["object"]["metadata"]["namespace"] == ns.as_str())
            && selected(&ev["object"], fs.as_ref())
            && labelled(&ev["object"], ls.as_ref())
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut last = from;
        let line = |ev: &Value| {
            let mut b = serde_json::to_vec(ev).expect("json");
            b.push(b'\n');
            Bytes::from(b)
        };
        for (rv, ev) in backlog {
            last = rv;
            if wanted(&ev) && tx.send(Ok(line(&ev))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                got = live.recv() => match got {
                    Ok((rv, k, ev)) if k == kind && rv > last => {
                        last = rv;
                        if wanted(&ev) && tx.send(Ok(line(&ev))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// kube-aggregator's proxy: the caller's identity travels in `X-Remote-*`
/// headers over a connection authenticated with the front-proxy certificate.
async fn proxy(st: Arc<HostState>, req: Request) -> Response {
    let Some(user) = st.authenticate(req.headers()) else {
        return status(401, "Unauthorized", "Unauthorized");
    };
    let upstream = st.upstream.read().await;
    let Some(up) = upstream.as_ref() else {
        return status(503, "ServiceUnavailable", "no aggregated server");
    };
    let (parts, body) = req.into_parts();
    let mut b = http::Request::builder().method(parts.method.clone()).uri(
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/"),
    );
    for (k, v) in &parts.headers {
        let name = k.as_str();
        if name == "authorization" || name == "host" || name.starts_with("x-remote-") {
            continue;
        }
        b = b.header(k, v);
    }
    b = b.header("X-Remote-User", &user.name);
    for g in &user.groups {
        b = b.header("X-Remote-Group", g);
    }
    if !user.groups.iter().any(|g| g == "system:authenticated") {
        b = b.header("X-Remote-Group", "system:authenticated");
    }
    for (k, vs) in &user.extra {
        for v in vs {
            b = b.header(format!("X-Remote-Extra-{k}"), v);
        }
    }
    let bytes = axum::body::to_bytes(body, 8 << 20)
        .await
        .unwrap_or_default();
    let req = b
        .body(kube::client::Body::from(bytes.to_vec()))
        .expect("proxied request");
    match up.client.send(req).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            let stream = body
                .into_data_stream()
                .map(|r| r.map_err(std::io::Error::other));
            Response::from_parts(parts, Body::from_stream(stream))
        }
        Err(e) => status(503, "ServiceUnavailable", &format!("proxying: {e}")),
    }
}
