//! HOST DOUBLE: a stand-in for the host cluster's kube-apiserver, kept only
//! for what the real one (`common::real_host`: etcd and kube-apiserver
//! v1.36.2) cannot do on demand — FAIL. A test makes it answer a path with an
//! error status (500, 503), hold the answer (a slow or hung host, a
//! TokenReview or SubjectAccessReview that never returns), or go down and
//! come back on the same address with every connection cut; a real host
//! cannot be made to do any of these for one kind of request while the rest
//! of it keeps working. Every test that needs only a working host uses the
//! real one (ARCHITECTURE.md, "Which tests use which host").
//!
//! It speaks the real wire protocol over HTTPS for what kshard needs behind
//! a host to become ready and to authenticate and authorize: TokenReview and
//! SubjectAccessReview (answered from a token table and a programmable
//! policy), `kube-system` ConfigMaps (the `extension-apiserver-authentication`
//! one, as kube-apiserver publishes it), Namespaces, and empty
//! `admissionregistration.k8s.io/v1` configurations and
//! `apiextensions.kshard.dev/v1` ShardResourceDefinitions, with list and
//! watch (resourceVersion, watch events, field selectors). It does not proxy:
//! tests speak to kshard straight, with a front-proxy certificate of
//! [`HostDouble::front_proxy_ca`], as kube-aggregator does.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::tls::{write_kubeconfig, Ca};

pub const KSHARD_TOKEN: &str = "kshard-service-account-token";

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

/// How the host fails the requests whose path starts with a prefix.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answers this status (a kube `Status` body) instead.
    Status(u16),
    /// Answers only after this long (a slow host; a long one is a hung host).
    Delay(Duration),
}

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

pub struct HostState {
    objects: Mutex<Objects>,
    events: broadcast::Sender<(u64, &'static str, Value)>,
    tokens: Mutex<HashMap<String, User>>,
    policy: Mutex<Policy>,
    faults: Mutex<Vec<(String, Fault)>>,
}

pub struct HostDouble {
    pub addr: SocketAddr,
    pub ca: Ca,
    /// The kubeconfig kshard uses to reach the host (its service-account token).
    pub kubeconfig: PathBuf,
    /// The CA the authentication ConfigMap names for front proxies (allowed
    /// name `front-proxy-client`).
    pub front_proxy_ca: Ca,
    pub client_ca: Ca,
    pub state: Arc<HostState>,
    pub dir: PathBuf,
    app: axum::Router,
    tls: tokio_rustls::TlsAcceptor,
    /// The accept loop; it owns every connection's task, so aborting it
    /// closes the listener and cuts every connection (the host is down).
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for HostDouble {
    fn drop(&mut self) {
        self.go_down();
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
    /// A working host with namespaces `default` and `kube-system`, the
    /// authentication ConfigMap (front-proxy CN `front-proxy-client`),
    /// kshard's own token, and a policy that denies everything.
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
            faults: Mutex::new(Vec::new()),
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
            state.put_namespace(ns);
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
        let tls = acceptor(&ca);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(accept_loop(listener, tls.clone(), app.clone()));
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
            app,
            tls,
            task: Mutex::new(Some(task)),
        }
    }

    /// The host goes down: its port is closed and every open connection
    /// (kshard's watches, its pooled review connection) is cut.
    pub fn go_down(&self) {
        if let Some(task) = self.task.lock().expect("task").take() {
            task.abort();
        }
    }

    /// The host comes back on the same address, with the same state.
    pub async fn come_back(&self) {
        // The aborted loop releases the port once its task is dropped.
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("rebinding {}: {e}", self.addr),
            }
        };
        let task = tokio::spawn(accept_loop(listener, self.tls.clone(), self.app.clone()));
        *self.task.lock().expect("task") = Some(task);
    }
}

fn acceptor(ca: &Ca) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    let (cert, key) = ca.server(&["localhost", "127.0.0.1"]);
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("tls");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(tls))
}

/// Serves connections until aborted; the connections are tasks of a
/// `JoinSet` this loop owns, so they end with it.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    app: axum::Router,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let tls = tls.clone();
        let app = app.clone();
        connections.spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
        });
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

    /// From now on, requests whose path starts with `prefix` get `fault`.
    pub fn fail(&self, prefix: &str, fault: Fault) {
        self.faults
            .lock()
            .expect("faults")
            .push((prefix.to_string(), fault));
    }

    /// Every fault cleared: the host works again.
    pub fn heal(&self) {
        self.faults.lock().expect("faults").clear();
    }

    fn fault_for(&self, path: &str) -> Option<Fault> {
        self.faults
            .lock()
            .expect("faults")
            .iter()
            .find(|(p, _)| path.starts_with(p.as_str()))
            .map(|(_, f)| *f)
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

    /// An active namespace, labelled as kube-apiserver labels every one.
    fn put_namespace(&self, name: &str) {
        let ns = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        self.put("namespaces", "", name, ns);
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

/// kube-apiserver's answer with this status code, as its own errors read.
fn failure(code: u16) -> Response {
    match code {
        500 => status(
            500,
            "InternalError",
            "Internal error occurred: the host double was told to fail",
        ),
        503 => status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        429 => status(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        ),
        _ => status(code, "Unknown", "the host double was told to fail"),
    }
}

fn query(req: &Request) -> HashMap<String, String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// The empty collections kshard follows on a host: the admission
/// configuration and the ShardResourceDefinitions, (list kind, apiVersion).
fn followed(group: &str, plural: &str) -> Option<(&'static str, &'static str, &'static str)> {
    const KINDS: [(&str, &str, &str, &str); 5] = [
        (
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfigurationList",
            "admissionregistration.k8s.io/v1",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfigurationList",
            "admissionregistration.k8s.io/v1",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicyList",
            "admissionregistration.k8s.io/v1",
        ),
        (
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBindingList",
            "admissionregistration.k8s.io/v1",
        ),
        (
            "apiextensions.kshard.dev",
            "shardresourcedefinitions",
            "ShardResourceDefinitionList",
            "apiextensions.kshard.dev/v1",
        ),
    ];
    KINDS
        .iter()
        .find(|(g, p, _, _)| *g == group && *p == plural)
        .map(|(_, p, l, v)| (*p, *l, *v))
}

/// The host's own API, as a kube-apiserver with only these resources.
async fn handle(State(st): State<Arc<HostState>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let Some(_caller) = st.authenticate(req.headers()) else {
        return status(401, "Unauthorized", "Unauthorized");
    };
    match st.fault_for(&path) {
        Some(Fault::Status(code)) => return failure(code),
        Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
        None => {}
    }
    let q = query(&req);
    match (req.method().as_str(), segs.as_slice()) {
        ("GET", ["api"]) => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        ),
        ("GET", ["api", "v1", "namespaces"]) => {
            collection(&st, "namespaces", "NamespaceList", "v1", "", &q).await
        }
        ("GET", ["api", "v1", "namespaces", name]) => match st.get("namespaces", "", name) {
            Some(o) => json_response(200, &o),
            None => status(404, "NotFound", &format!("namespaces \"{name}\" not found")),
        },
        ("GET", ["api", "v1", "namespaces", ns, "configmaps"]) => {
            collection(&st, "configmaps", "ConfigMapList", "v1", ns, &q).await
        }
        ("GET", ["api", "v1", "namespaces", ns, "configmaps", name]) => {
            match st.get("configmaps", ns, name) {
                Some(o) => json_response(200, &o),
                None => status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
            }
        }
        ("GET", ["apis", group, "v1", plural]) if followed(group, plural).is_some() => {
            let Some((kind, list_kind, api_version)) = followed(group, plural) else {
                return status(404, "NotFound", "not found");
            };
            collection(&st, kind, list_kind, api_version, "", &q).await
        }
        ("POST", ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
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
            let body = body_json(req).await;
            let policy = st.policy.lock().expect("policy").clone();
            let (allowed, reason) = policy(&body["spec"]);
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

async fn body_json(req: Request) -> Value {
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

/// `metadata.name` / `metadata.namespace` field selector terms.
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

/// List, or with `watch=true` a watch stream, of one kind in one namespace.
async fn collection(
    st: &Arc<HostState>,
    kind: &'static str,
    list_kind: &str,
    api_version: &str,
    namespace: &str,
    q: &HashMap<String, String>,
) -> Response {
    let fs = q.get("fieldSelector");
    let watching = q.get("watch").is_some_and(|v| v == "true" || v == "1");
    if !watching {
        let o = st.objects.lock().expect("objects");
        let items: Vec<Value> = o
            .items
            .iter()
            .filter(|s| s.kind == kind && (namespace.is_empty() || s.namespace == namespace))
            .map(|s| s.object.clone())
            .filter(|v| selected(v, fs))
            .collect();
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
