//! Process wiring: open the store, start the watch cache, garbage collector
//! and compactor, then serve the API over TLS (HTTP/1.1 and h2) and, if asked,
//! plain HTTP for local debugging.

pub mod filters;
pub mod metrics;
pub mod pki;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::api::{self, ApiState};
use crate::flowcontrol::{self, Apf};
use crate::registry::{gc, Catalog, Registry};
use crate::storage::{StorageError, Store};
use crate::watch::{Cache, DEFAULT_RING_CAPACITY};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("loading CRDs: {0}")]
    Catalog(#[from] crate::registry::catalog::CatalogError),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("certificates: {0}")]
    Pki(#[from] pki::PkiError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("authentication: {0}")]
    Auth(#[from] crate::auth::CaError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    /// `--store`: `None` = the embedded engine under `data_dir`; or `tikv://...`.
    pub store: Option<String>,
    pub listen: SocketAddr,
    pub crds: Vec<PathBuf>,
    pub insecure_listen: Option<SocketAddr>,
    pub compaction_interval: Duration,
    pub bookmark_interval: Duration,
    /// Events kept per resource by the watch cache before old ones may be dropped.
    pub watch_history: usize,
    /// kube's --max-requests-inflight and --max-mutating-requests-inflight: their
    /// sum is the server concurrency limit API Priority and Fairness divides.
    pub max_requests_inflight: u32,
    pub max_mutating_requests_inflight: u32,
    /// Where the flow-control objects live; `None`: kshard itself serves them.
    pub flowcontrol_kubeconfig: Option<PathBuf>,
    /// Run the flow-control controller (off: the built-in configuration stays).
    pub flowcontrol_controller: bool,
    /// `--client-ca-file`: client certificates from this CA authenticate (CN user, O groups).
    pub client_ca_file: Option<PathBuf>,
    /// `--requestheader-client-ca-file`: front proxies presenting a certificate
    /// from this CA may name the user in `X-Remote-*` headers.
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// `--requestheader-allowed-names`: allowed front-proxy CNs (empty: any).
    pub requestheader_allowed_names: Vec<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("kshard-data"),
            store: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 6443)),
            crds: vec![PathBuf::from("crds/examples")],
            insecure_listen: None,
            compaction_interval: Duration::from_secs(300),
            bookmark_interval: Duration::from_secs(60),
            watch_history: DEFAULT_RING_CAPACITY,
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            flowcontrol_kubeconfig: None,
            flowcontrol_controller: true,
            client_ca_file: None,
            requestheader_client_ca_file: None,
            requestheader_allowed_names: Vec::new(),
        }
    }
}

/// A started server: where it listens, and its parts for in-process use.
pub struct Running {
    pub addr: SocketAddr,
    pub insecure_addr: Option<SocketAddr>,
    pub kubeconfig: PathBuf,
    pub registry: Arc<Registry>,
    pub apf: Arc<Apf>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops accepting connections and background work.
    pub fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

pub async fn start(cfg: ServeConfig) -> Result<Running, ServerError> {
    // Only the ring provider is compiled in; installing it again is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut catalog = Catalog::load(&cfg.crds)?;
    if cfg.flowcontrol_kubeconfig.is_none()
        && catalog
            .find("flowcontrol.kshard.dev", "v1", "flowschemas")
            .is_none()
    {
        // Standalone, flow control is configured through kshard's own API.
        catalog.add_manifests(
            std::path::Path::new("<built-in flowcontrol.kshard.dev CRDs>"),
            &crate::controller::crd::manifests_yaml(),
        )?;
    }
    let catalog = Arc::new(catalog);
    tracing::info!(resources = catalog.resources.len(), "catalog loaded");
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(io(format!("creating {}", cfg.data_dir.display())))?;

    let engine =
        crate::storage::open_engine(cfg.store.as_deref(), &cfg.data_dir.join("store.redb"))?;
    let store = Store::open(engine)?;
    let defaults_catalog = catalog.clone();
    let on_load: crate::watch::OnLoad =
        Arc::new(move |resource: &str, obj: &mut serde_json::Value| {
            crate::registry::default_on_read(&defaults_catalog, resource, obj)
        });
    let cache = Cache::start_with(store.clone(), cfg.watch_history, Some(on_load)).await?;
    let registry = Registry::new(catalog, store.clone(), cache);
    let mut tasks = vec![
        gc::spawn(registry.clone()),
        store.spawn_compactor(cfg.compaction_interval),
    ];
    let state = Arc::new(ApiState {
        registry: registry.clone(),
        ready: false.into(),
        bookmark_interval: cfg.bookmark_interval,
    });
    let apf = Apf::new(flowcontrol::ServerConfig {
        max_requests_inflight: cfg.max_requests_inflight,
        max_mutating_requests_inflight: cfg.max_mutating_requests_inflight,
    });
    metrics::handle();
    apf.set_observer(Arc::new(metrics::Observer));
    tasks.push(apf.spawn_borrowing_loop());
    let auth = authenticator(&cfg)?;
    let app = app(state.clone(), apf.clone(), registry.clone(), auth.clone());

    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(io(format!("listening on {}", cfg.listen)))?;
    let addr = listener.local_addr().map_err(io("local address"))?;
    let mut extra_sans = Vec::new();
    if !addr.ip().is_unspecified() {
        extra_sans.push(addr.ip().to_string());
    }
    let pki = pki::ensure(&cfg.data_dir.join("pki"), &extra_sans)?;
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    let kubeconfig = cfg.data_dir.join("kubeconfig");
    pki::write_kubeconfig(
        &pki,
        &format!("https://{host}:{}", addr.port()),
        &kubeconfig,
    )?;
    let tls = tls_config(&pki, &auth)?;
    tasks.push(tokio::spawn(serve_tls(listener, tls, app.clone())));

    let mut insecure_addr = None;
    if let Some(a) = cfg.insecure_listen {
        let l = TcpListener::bind(a)
            .await
            .map_err(io(format!("listening on {a}")))?;
        insecure_addr = Some(l.local_addr().map_err(io("local address"))?);
        tracing::warn!(addr = %a, "serving plain HTTP without authentication");
        tasks.push(tokio::spawn(serve_plain(l, app)));
    }
    let flowcontrol_kubeconfig = cfg
        .flowcontrol_kubeconfig
        .clone()
        .unwrap_or_else(|| kubeconfig.clone());
    if cfg.flowcontrol_controller {
        match controller_client(&flowcontrol_kubeconfig).await {
            Ok(client) => tasks.push(crate::controller::spawn(client, apf.clone())),
            Err(e) => tracing::error!(
                error = %e,
                "flow-control controller not started; built-in configuration stays in force"
            ),
        }
    }
    state.ready.store(true, Ordering::Release);
    tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "kshard is serving");
    Ok(Running {
        addr,
        insecure_addr,
        kubeconfig,
        registry,
        apf,
        tasks,
    })
}

/// The API plus the server's own endpoints, behind the request filters.
fn app(
    state: Arc<ApiState>,
    apf: Arc<Apf>,
    registry: Arc<Registry>,
    auth: crate::auth::Authenticator,
) -> Router {
    let own = Router::new()
        .route("/metrics", get(metrics_endpoint))
        .route(
            "/debug/api_priority_and_fairness/dump_priority_levels",
            get(dump_priority_levels),
        )
        .route(
            "/debug/api_priority_and_fairness/dump_queues",
            get(dump_queues),
        )
        .route(
            "/debug/api_priority_and_fairness/dump_requests",
            get(dump_requests),
        )
        .with_state(apf.clone());
    let filters = Arc::new(filters::Filters {
        apf,
        registry,
        auth,
    });
    own.merge(api::router(state))
        .layer(axum::middleware::from_fn_with_state(
            filters,
            filters::filter,
        ))
        .layer(
            tower_http::compression::CompressionLayer::new()
                .gzip(true)
                .compress_when(LargeBodies),
        )
}

/// kube compresses responses over 128 KiB when the client accepts gzip; watch
/// streams are left alone.
#[derive(Debug, Clone, Copy)]
struct LargeBodies;

const GZIP_THRESHOLD: u64 = 128 * 1024;

impl tower_http::compression::Predicate for LargeBodies {
    fn should_compress<B>(&self, response: &http::Response<B>) -> bool
    where
        B: http_body::Body,
    {
        if response
            .extensions()
            .get::<api::response::NoCompression>()
            .is_some()
        {
            return false;
        }
        let size = response
            .body()
            .size_hint()
            .exact()
            .or_else(|| {
                response
                    .headers()
                    .get(http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
            })
            .or_else(|| {
                response
                    .extensions()
                    .get::<api::response::SizeEstimate>()
                    .map(|s| s.0)
            });
        size.is_some_and(|n| n > GZIP_THRESHOLD)
    }
}

fn text(body: String) -> axum::response::Response {
    (
        [(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn metrics_endpoint(State(apf): State<Arc<Apf>>) -> axum::response::Response {
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&apf),
    )
        .into_response()
}

async fn dump_priority_levels(State(apf): State<Arc<Apf>>) -> axum::response::Response {
    text(apf.dump_priority_levels())
}

async fn dump_queues(State(apf): State<Arc<Apf>>) -> axum::response::Response {
    text(apf.dump_queues())
}

async fn dump_requests(
    State(apf): State<Arc<Apf>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    let details = q
        .get("includeRequestDetails")
        .is_some_and(|v| v == "1" || v == "true");
    text(apf.dump_requests(details))
}

async fn controller_client(kubeconfig: &std::path::Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

fn authenticator(cfg: &ServeConfig) -> Result<crate::auth::Authenticator, ServerError> {
    use crate::auth::{Authenticator, CaBundle, RequestHeader};
    if cfg.client_ca_file.is_none() && cfg.requestheader_client_ca_file.is_none() {
        return Ok(Authenticator::Dev);
    }
    let client_ca = cfg
        .client_ca_file
        .as_deref()
        .map(CaBundle::load)
        .transpose()?;
    let request_header = match cfg.requestheader_client_ca_file.as_deref() {
        Some(p) => {
            let mut rh = RequestHeader::new(CaBundle::load(p)?);
            rh.allowed_names = cfg.requestheader_allowed_names.clone();
            Some(rh)
        }
        None => None,
    };
    Ok(Authenticator::Delegating {
        client_ca,
        request_header,
    })
}

fn tls_config(
    pki: &pki::Pki,
    auth: &crate::auth::Authenticator,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.server_cert())
        .map_err(|e| ServerError::Tls(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_file(pki.server_key())
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let builder = rustls::ServerConfig::builder();
    let builder = match auth {
        crate::auth::Authenticator::Dev => builder.with_no_client_auth(),
        crate::auth::Authenticator::Delegating {
            client_ca,
            request_header,
        } => {
            // Ask for a certificate from any configured CA; which CA it chains to
            // decides, per request, what it may assert.
            let mut roots = rustls::RootCertStore::empty();
            for bundle in client_ca.iter().chain(request_header.iter().map(|r| &r.ca)) {
                roots.roots.extend(bundle.roots.roots.iter().cloned());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .allow_unauthenticated()
                .build()
                .map_err(|e| ServerError::Tls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let peer_certs = crate::auth::PeerCertificates(Arc::new(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            ));
            serve_connection(TokioIo::new(stream), app.layer(axum::Extension(peer_certs))).await;
        });
    }
}

async fn serve_plain(listener: TcpListener, app: Router) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        tokio::spawn(serve_connection(TokioIo::new(tcp), app));
    }
}

async fn serve_connection<I>(io: I, app: Router)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(app);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection_with_upgrades(io, service).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
