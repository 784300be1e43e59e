//! Process wiring: open the store, start the watch cache, garbage collector
//! and compactor, then serve the API over TLS (HTTP/1.1 and h2) and, if asked,
//! plain HTTP for local debugging.
//!
//! Long (about 1,200 lines) because it wires every subsystem, one named phase each in
//! `start`; the request layers, connections, TLS, the dev PKI and the configuration are
//! their own files.

mod config;
pub mod conn;
mod gather;
pub mod layers;
pub mod metrics;
pub mod pki;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::api::{self, ApiState};
use crate::backoff::Backoff;
use crate::flowcontrol::{self, Apf};
use crate::registry::{gc, Catalog, Registry};
use crate::storage::{StorageError, Store};
use crate::watch::Cache;

pub use config::ServeConfig;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("loading CRDs: {0}")]
    Catalog(#[from] crate::apiextensions::catalog::CatalogError),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("certificates: {0}")]
    Pki(#[from] pki::PkiError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("authentication: {0}")]
    Auth(#[from] crate::auth::CaError),
    #[error("host cluster: {0}")]
    Host(#[from] crate::host::HostError),
    #[error("serving certificate: {0}")]
    TlsFiles(#[from] tls::TlsFileError),
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// A started server: where it listens, and its parts for in-process use.
pub struct Running {
    pub addr: SocketAddr,
    pub insecure_addr: Option<SocketAddr>,
    pub kubeconfig: PathBuf,
    pub registry: Arc<Registry>,
    /// The store under the registry (tests compact its history).
    pub store: Arc<Store>,
    pub apf: Arc<Apf>,
    pub readiness: Arc<crate::api::health::Readiness>,
    /// Request-body limits and the budget left (tests watch it).
    pub body_limits: Arc<layers::body::BodyLimits>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    connections: conn::Connections,
    shutting_down: Arc<std::sync::atomic::AtomicBool>,
    replica: Option<Arc<crate::replica::Replica>>,
    limits: Arc<conn::ConnectionLimits>,
}

impl Running {
    /// Stops at once: no more connections, background work aborted.
    pub fn shutdown(self) {
        self.connections.stop.cancel();
        for t in self.tasks {
            t.abort();
        }
    }

    /// Stops as kube-apiserver does on SIGTERM: `/readyz` fails first (for
    /// `--shutdown-delay-duration`), then no new connections are accepted,
    /// in-flight requests finish (HTTP/2 clients get GOAWAY), watch streams
    /// end cleanly so clients resume from their last resourceVersion, all
    /// within `--shutdown-grace-period`; then a leader gives up its lease
    /// and the store is closed. Every acknowledged write is durable already.
    pub async fn shutdown_gracefully(self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        tracing::info!(delay = ?self.limits.shutdown_delay_duration, "shutting down: /readyz fails");
        tokio::time::sleep(self.limits.shutdown_delay_duration).await;
        // Still serving: a leader's writes in flight finish, it gives the
        // lease up and a follower takes over at once; writes arriving here
        // meanwhile are forwarded to it.
        if let Some(r) = &self.replica {
            r.hand_over(self.limits.shutdown_grace_period).await;
        }
        self.connections.stop.cancel();
        self.connections.tasks.close();
        let open = self.connections.tasks.len();
        tracing::info!(connections = open, grace = ?self.limits.shutdown_grace_period, "no new connections; draining");
        if tokio::time::timeout(
            self.limits.shutdown_grace_period,
            self.connections.tasks.wait(),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                connections = self.connections.tasks.len(),
                "grace period over; closing the remaining connections"
            );
        }
        for t in self.tasks {
            t.abort();
        }
        if let Some(r) = &self.replica {
            r.resign().await;
        }
        self.store.close();
        // The last requests' spans, before the process exits.
        if crate::traces::enabled() {
            let _ = tokio::task::spawn_blocking(crate::traces::flush).await;
        }
        tracing::info!("stopped");
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// Starts the server in its phases: the catalog, the store, the registry
/// with its watch cache, admission, background upkeep, flow control, the
/// listeners with their certificates and delegation, then the controllers
/// that act on the host. Each phase adds its tasks and readiness checks.
pub async fn start(cfg: ServeConfig) -> Result<Running, ServerError> {
    install_process_globals(&cfg)?;
    let (mut catalog, mut sources) = load_catalog(&cfg)?;
    pki::private_dir(&cfg.data_dir)?;
    let (store, replica, internal_listener) = open_store(&cfg).await?;
    if sources.serve_definitions {
        // Before the watch cache loads the objects the stored definitions define.
        serve_stored_definitions(&mut catalog, &store).await;
    }
    tracing::info!(resources = catalog.resources.len(), "catalog loaded");
    let mut w = Wiring {
        cfg: &cfg,
        readiness: Arc::new(crate::api::health::Readiness::default()),
        tasks: Vec::new(),
    };
    // Standalone, admission webhooks are configured through kshard's own API;
    // behind a host, by the host's objects.
    let admission_host = cfg.host_for(&None);
    let (registry, host) = w
        .start_registry(catalog, &store, admission_host.as_ref())
        .await?;
    let host_client = host.as_ref().map(|(c, _)| c.clone());
    w.follow_host_definitions(host_client.as_ref(), &mut sources)?;
    w.start_admission(&registry, host, admission_host.is_none())
        .await;
    let shutting_down = w.start_upkeep(&registry, &store, replica.as_ref()).await;
    let connections = conn::Connections::default();
    let host_definitions = sources.host.clone();
    w.follow_definitions(sources, &registry, &connections);
    let apf = w.start_flow_control();
    let (listener, addr, pki, kubeconfig) = listen_with_certificates(&cfg).await?;
    let mut delegation = delegation(&cfg, &w.readiness, &pki, addr).await?;
    w.tasks.extend(std::mem::take(&mut delegation.tasks));
    let auth = delegation.auth.clone();
    let (app, body_limits) = w
        .request_stack(
            &registry,
            &store,
            &apf,
            replica.as_ref(),
            delegation,
            &connections,
        )
        .await?;
    let limits = Arc::new(cfg.connections.clone());
    let listeners = Listeners {
        public: listener,
        internal: internal_listener,
        limits: limits.clone(),
        connections: connections.clone(),
    };
    let insecure_addr = w
        .serve(listeners, app, replica.as_ref(), &pki, &auth)
        .await?;
    if let (true, Some(client)) = (cfg.manage_apiservices, &host_client) {
        let task = keep_apiservices(&cfg, client, &registry, &pki, host_definitions);
        w.tasks.push(task);
    }
    if cfg.flowcontrol_controller {
        w.tasks
            .extend(start_flowcontrol_controller(&cfg, &kubeconfig, &apf).await);
    }
    tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "kshard is serving");
    Ok(Running {
        addr,
        insecure_addr,
        kubeconfig,
        registry,
        store,
        apf,
        readiness: w.readiness,
        body_limits,
        tasks: w.tasks,
        connections,
        shutting_down,
        replica,
        limits,
    })
}

type Tasks = Vec<tokio::task::JoinHandle<()>>;

/// What the phases of [`start`] build up: the background tasks and the
/// readiness checks.
struct Wiring<'a> {
    cfg: &'a ServeConfig,
    readiness: Arc<crate::api::health::Readiness>,
    tasks: Tasks,
}

/// Process-wide state every later phase relies on.
fn install_process_globals(cfg: &ServeConfig) -> Result<(), ServerError> {
    // Only the ring provider is compiled in; installing it again is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // First, as kube-apiserver: a tracing file it would refuse stops the start.
    if let Some(path) = &cfg.tracing_config_file {
        let tracing = crate::traces::TracingConfiguration::load(path)
            .map_err(|e| ServerError::Config(format!("--tracing-config-file: {e}")))?;
        let instance = cfg
            .replica_id
            .clone()
            .unwrap_or_else(crate::replica::default_replica_id);
        crate::traces::install(&tracing, &instance)
            .map_err(|e| ServerError::Config(format!("--tracing-config-file: {e}")))?;
    }
    // The recorder first: metrics recorded before it is installed are lost
    // (a replica's first election round reports the leader before serving).
    let _ = metrics::handle();
    Ok(())
}

/// The catalog from the definition files, with the built-in definitions
/// kshard serves for itself when nothing else provides them; and the
/// sources the definitions watcher follows afterwards.
fn load_catalog(cfg: &ServeConfig) -> Result<(Catalog, crate::definitions::Sources), ServerError> {
    let mut sources = crate::definitions::Sources {
        paths: cfg.crds.clone(),
        builtin: Vec::new(),
        // The admission kinds' validation and field ownership, kube's
        // built-in types' (below the admission module, the registry cannot
        // name them).
        strategies: crate::admission::strategy::strategies(),
        serve_definitions: false,
        host: None,
    };
    let mut catalog = Catalog::load(&cfg.crds)?;
    catalog.register_strategies(sources.strategies.clone());
    let mut add_builtin = |catalog: &mut Catalog, name: &str, manifests: String| {
        let builtin = (PathBuf::from(name), manifests);
        catalog.add_builtin_manifests(&builtin.0, &builtin.1)?;
        sources.builtin.push(builtin);
        Ok::<_, ServerError>(())
    };
    // Standalone, definitions are API objects too (`kubectl apply -f
    // crd.yaml`); behind a host, the host serves apiextensions.k8s.io.
    let standalone = cfg.host_for(&None).is_none();
    let serve_definitions = standalone
        && catalog
            .find(
                crate::apiextensions::crd_resource::GROUP,
                "v1",
                crate::apiextensions::crd_resource::PLURAL,
            )
            .is_none();
    if serve_definitions {
        add_builtin(
            &mut catalog,
            "<built-in apiextensions.k8s.io CRD>",
            crate::apiextensions::crd_resource::api_manifest(),
        )?;
    }
    // Behind a host, flow-control objects live in the host like any other
    // configuration; standalone, kshard serves them itself.
    if cfg.host_for(&cfg.flowcontrol_kubeconfig.clone()).is_none()
        && catalog
            .find("flowcontrol.kshard.dev", "v1", "flowschemas")
            .is_none()
    {
        // Standalone, flow control is configured through kshard's own API.
        add_builtin(
            &mut catalog,
            "<built-in flowcontrol.kshard.dev CRDs>",
            crate::controller::crd::manifests_yaml(),
        )?;
    }
    // Standalone, admission webhooks are configured through kshard's own API.
    if standalone
        && catalog
            .find(
                crate::admission::hooks::GROUP,
                "v1",
                crate::admission::hooks::MUTATING,
            )
            .is_none()
    {
        add_builtin(
            &mut catalog,
            "<built-in admissionregistration.k8s.io CRDs>",
            crate::admission::builtin_crds::manifests_yaml(),
        )?;
    }
    sources.serve_definitions = serve_definitions;
    Ok((catalog, sources))
}

/// The store, and on a shared store this replica with its internal listener.
async fn open_store(
    cfg: &ServeConfig,
) -> Result<
    (
        Arc<Store>,
        Option<Arc<crate::replica::Replica>>,
        Option<TcpListener>,
    ),
    ServerError,
> {
    let engine = open_engine_retrying(cfg).await?;
    // The embedded store belongs to this process alone: no lease, no peers.
    let shared_store = cfg
        .store
        .as_deref()
        .is_some_and(|s| !matches!(s, "" | "embedded"));
    // Several replicas: the store checks this replica's lease fence in every
    // write transaction, and the replica is built whole around that store.
    if shared_store {
        let (rcfg, listener) = replica_config(cfg).await?;
        let fence = crate::replica::Replica::fence_for(&rcfg);
        let store = Store::open_fenced(engine.clone(), Some(fence.clone()))?;
        let replica = crate::replica::Replica::new(rcfg, engine, fence, store.clone())
            .await
            .map_err(|e| ServerError::Config(e.to_string()))?;
        Ok((store, Some(replica), Some(listener)))
    } else {
        Ok((Store::open(engine)?, None, None))
    }
}

/// Adds the definitions stored through kshard's own CRD API to the catalog.
async fn serve_stored_definitions(catalog: &mut Catalog, store: &Store) {
    let stored = crate::definitions::stored::stored_in(store).await;
    let refused = crate::definitions::stored::add_stored(catalog, &stored);
    for (name, reason) in refused {
        tracing::warn!(definition = %name, %reason, "a stored definition is not served");
    }
}

/// The host's client and its namespace lifecycle, behind a host.
type HostAdmission = (
    kube::Client,
    Arc<crate::host::namespaces::NamespaceLifecycle>,
);

impl Wiring<'_> {
    /// The watch cache over the store, and the registry over both; behind a
    /// host, creates pass its namespace lifecycle (kube's admission).
    async fn start_registry(
        &mut self,
        catalog: Catalog,
        store: &Arc<Store>,
        admission_host: Option<&Option<PathBuf>>,
    ) -> Result<(Arc<Registry>, Option<HostAdmission>), ServerError> {
        let live_catalog = crate::apiextensions::live::LiveCatalog::new(catalog);
        let on_load = crate::registry::read_defaulter(live_catalog.clone());
        let history = crate::watch::HistoryLimits {
            window: self.cfg.watch_cache_history,
            bytes: self.cfg.watch_cache_history_bytes,
            events: self.cfg.watch_history,
            watcher_bytes: self.cfg.watch_buffer_bytes,
            watcher_grace: self.cfg.watch_buffer_grace,
        };
        let cache = Cache::start_with(store.clone(), history, Some(on_load)).await?;
        // Behind a host: webhook configurations and namespace labels come from
        // the host too.
        let host = match admission_host {
            Some(h) => {
                let client = crate::host::client(h.as_deref()).await?;
                let (lifecycle, task) =
                    crate::host::namespaces::NamespaceLifecycle::spawn(client.clone());
                self.tasks.push(task);
                let synced = lifecycle.clone();
                self.readiness
                    .add("namespace-informer-sync", move || synced.is_synced());
                Some((client, lifecycle))
            }
            None => None,
        };
        let admission = host
            .as_ref()
            .map(|(_, l)| l.clone() as Arc<dyn crate::registry::write_admission::CreateAdmission>);
        let registry = Registry::new(live_catalog, store.clone(), cache, admission);
        Ok((registry, host))
    }

    /// Behind a host, definitions are managed through its API too
    /// (ShardResourceDefinitions), served once the first list is loaded.
    fn follow_host_definitions(
        &mut self,
        host_client: Option<&kube::Client>,
        sources: &mut crate::definitions::Sources,
    ) -> Result<(), ServerError> {
        if let Some(client) = host_client {
            let (defs, task) = crate::definitions::host::HostDefinitions::spawn(
                client.clone(),
                self.cfg.host_definitions_selector.as_deref(),
            );
            self.tasks.push(task);
            let loaded = defs.clone();
            self.readiness
                .add("host-definitions-sync", move || loaded.is_loaded());
            sources.host = Some(defs);
        } else if self.cfg.manage_apiservices {
            return Err(ServerError::Config(
                "--manage-apiservices needs a host cluster (--kubeconfig, or running in a pod)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Admission webhooks and policies: their configuration followed from
    /// kshard's own objects or the host's, their params and namespaces; the
    /// registry calls them from then on.
    async fn start_admission(
        &mut self,
        registry: &Arc<Registry>,
        host: Option<HostAdmission>,
        standalone: bool,
    ) {
        let host_client = host.as_ref().map(|(c, _)| c.clone());
        let (source, namespaces, task): (_, Arc<dyn crate::admission::Namespaces>, _) = match host {
            Some((client, lifecycle)) => {
                let (source, task) = crate::admission::hooks::Source::host(client);
                (source, lifecycle, task)
            }
            None => {
                let (source, task) = crate::admission::hooks::Source::local(registry.clone());
                (source, Arc::new(crate::admission::ImplicitNamespaces), task)
            }
        };
        self.tasks.push(task);
        // Params of admission policies are kshard's own objects (a weak
        // reference: the registry holds the admission); behind a host, objects
        // of kinds kshard does not serve are the host's.
        let local_params = crate::admission::policy::RegistryParams(Arc::downgrade(registry));
        let params: Arc<dyn crate::admission::policy::Params> = match host_client {
            Some(client) => Arc::new(crate::admission::policy::HostParams {
                local: local_params,
                client,
            }),
            None => Arc::new(local_params),
        };
        let webhooks = Arc::new(crate::admission::Webhooks::new(
            source,
            crate::admission::webhook::Clients::new(&self.cfg.admission_webhook_resolve),
            namespaces,
            Some(params),
        ));
        let synced = webhooks.clone();
        self.readiness
            .add("admission-webhook-configuration-sync", move || {
                synced.is_synced()
            });
        let described = webhooks.clone();
        self.readiness.add_info(move || {
            let missing = described.missing();
            if missing.is_empty() {
                return String::new();
            }
            missing
                .iter()
                .map(|(kind, why)| format!("admission: not following the host's {kind}: {why}"))
                .collect::<Vec<_>>()
                .join("\ninfo: ")
        });
        if standalone {
            // Standalone the configuration is kshard's own, already in the watch
            // cache: serve only once it is read, as listening waits for the caches.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !webhooks.is_synced() && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        registry.set_admission(webhooks);
    }

    /// The garbage collector, compaction, the storage probe, the replica's
    /// election and stream, and the readiness checks that go with them; returns
    /// the flag a graceful shutdown raises to fail `/readyz`.
    async fn start_upkeep(
        &mut self,
        registry: &Arc<Registry>,
        store: &Arc<Store>,
        replica: Option<&Arc<crate::replica::Replica>>,
    ) -> Arc<std::sync::atomic::AtomicBool> {
        self.tasks.push(gc::spawn(registry.clone()));
        self.tasks
            .push(store.spawn_compactor(self.cfg.compaction_interval));
        // A real read through the engine, for liveness and readiness alike (kube's
        // `etcd` check): a store that cannot answer within the deadline fails both.
        let probe = store.clone();
        self.readiness
            .add_async("storage", crate::api::health::Probe::Live, move || {
                let store = probe.clone();
                async move { store.probe().await.is_ok() }
            });
        // Listening starts after the watch caches are loaded.
        self.readiness.add("watch-cache-sync", || true);
        if let Some(r) = replica {
            self.tasks.extend(r.start().await);
            let r = r.clone();
            let described = r.clone();
            self.readiness
                .add("replica-caught-up", move || r.caught_up());
            self.readiness.add_info(move || described.describe());
        }
        let shutting_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = shutting_down.clone();
        self.readiness.add("shutdown", move || {
            !stopping.load(std::sync::atomic::Ordering::Acquire)
        });
        shutting_down
    }

    /// Definitions change without a restart: the files are followed, and
    /// discovery, OpenAPI and every request use the catalog of the moment.
    fn follow_definitions(
        &mut self,
        sources: crate::definitions::Sources,
        registry: &Arc<Registry>,
        connections: &conn::Connections,
    ) {
        if !self.cfg.crds.is_empty() || sources.serve_definitions || sources.host.is_some() {
            self.tasks.push(crate::definitions::spawn_watcher(
                sources,
                registry.clone(),
                std::time::Duration::from_millis(500),
                connections.stop.clone(),
            ));
        }
    }

    /// API Priority and Fairness with its metrics and borrowing rounds.
    fn start_flow_control(&mut self) -> Arc<Apf> {
        let apf = Apf::new(flowcontrol::ServerConfig {
            max_requests_inflight: self.cfg.max_requests_inflight,
            max_mutating_requests_inflight: self.cfg.max_mutating_requests_inflight,
        });
        self.tasks.extend(metrics::spawn_upkeep());
        apf.set_observer(Arc::new(metrics::Observer));
        self.tasks.push(apf.spawn_borrowing_loop());
        apf
    }

    /// The API and the server's own endpoints behind the request layers,
    /// and the body limits those layers share.
    async fn request_stack(
        &self,
        registry: &Arc<Registry>,
        store: &Arc<crate::storage::Store>,
        apf: &Arc<Apf>,
        replica: Option<&Arc<crate::replica::Replica>>,
        delegation: Delegation,
        connections: &conn::Connections,
    ) -> Result<(Router, Arc<layers::body::BodyLimits>), ServerError> {
        let cfg = self.cfg;
        let auditor = crate::audit::Auditor::from_options(&cfg.audit)
            .await
            .map_err(|e| ServerError::Config(e.to_string()))?;
        let body_limits = Arc::new(layers::body::BodyLimits::new(
            cfg.connections.max_request_body_bytes,
            cfg.connections.max_buffered_request_body_bytes,
        ));
        let state = Arc::new(ApiState {
            registry: registry.clone(),
            readiness: self.readiness.clone(),
            bookmark_interval: cfg.bookmark_interval,
            min_request_timeout: cfg.connections.min_request_timeout,
            request_timeout: cfg.connections.request_timeout,
            stop_watches: connections.stop.clone(),
            serve_reviews: !cfg.delegated(),
        });
        let snapshots =
            crate::snapshot::serve::Snapshots::new(store.clone(), connections.stop.clone());
        let app = app(
            state,
            snapshots,
            layers::Parts {
                apf: apf.clone(),
                registry: registry.clone(),
                auth: delegation.auth,
                authz: delegation.authz,
                replica: replica.cloned(),
                auditor,
                request_timeout: cfg.connections.request_timeout,
                body: body_limits.clone(),
            },
        );
        Ok((app, body_limits))
    }

    /// Serves the app: to other replicas on the internal listener, over TLS on
    /// the public one, and in plain HTTP when asked (whose address it returns).
    async fn serve(
        &mut self,
        listeners: Listeners,
        app: Router,
        replica: Option<&Arc<crate::replica::Replica>>,
        pki: &pki::Pki,
        auth: &crate::auth::Authenticator,
    ) -> Result<Option<SocketAddr>, ServerError> {
        let Listeners {
            public,
            internal,
            limits,
            connections,
        } = listeners;
        if let (Some(r), Some(l)) = (replica, internal) {
            let internal =
                crate::replica::internal::router(r.clone(), app.clone(), connections.stop.clone());
            self.tasks.push(tokio::spawn(serve_plain(
                l,
                internal,
                limits.clone(),
                connections.clone(),
            )));
        }

        let serving = match (&self.cfg.tls_cert_file, &self.cfg.tls_private_key_file) {
            (Some(c), Some(k)) => tls::ReloadingCert::new(c.clone(), k.clone())?,
            (None, None) => tls::ReloadingCert::new(pki.server_cert(), pki.server_key())?,
            _ => {
                return Err(ServerError::Config(
                    "--tls-cert-file and --tls-private-key-file go together".into(),
                ))
            }
        };
        let tls = tls::server_config(Arc::new(serving), !auth.is_dev())
            .map_err(|e| ServerError::Tls(e.to_string()))?;
        self.tasks.push(tokio::spawn(serve_tls(
            public,
            tls,
            app.clone(),
            limits.clone(),
            connections.clone(),
        )));

        let mut insecure_addr = None;
        if let Some(a) = self.cfg.insecure_listen {
            let l = TcpListener::bind(a)
                .await
                .map_err(io(format!("listening on {a}")))?;
            insecure_addr = Some(l.local_addr().map_err(io("local address"))?);
            tracing::warn!(addr = %a, "serving plain HTTP without authentication: every request is the admin");
            let app = app.layer(axum::Extension(layers::InsecureListener));
            self.tasks
                .push(tokio::spawn(serve_plain(l, app, limits, connections)));
        }
        Ok(insecure_addr)
    }
}

/// The public listener, the dev PKI with the address it got among the
/// certificate's names, and the admin kubeconfig pointing at it.
async fn listen_with_certificates(
    cfg: &ServeConfig,
) -> Result<(TcpListener, SocketAddr, pki::Pki, PathBuf), ServerError> {
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
    Ok((listener, addr, pki, kubeconfig))
}

/// The sockets the app is served on, and what every connection shares.
struct Listeners {
    public: TcpListener,
    /// The replicas' internal endpoint, on a shared store.
    internal: Option<TcpListener>,
    limits: Arc<conn::ConnectionLimits>,
    connections: conn::Connections,
}

/// Keeps the host's APIServices in step with the catalog, once the host's
/// definitions are loaded.
fn keep_apiservices(
    cfg: &ServeConfig,
    client: &kube::Client,
    registry: &Arc<Registry>,
    pki: &pki::Pki,
    host_definitions: Option<crate::definitions::host::HostDefinitions>,
) -> tokio::task::JoinHandle<()> {
    let target = crate::host::apiservices::Target {
        namespace: cfg.apiservice_service_namespace.clone(),
        name: cfg.apiservice_service_name.clone(),
        port: cfg.apiservice_service_port,
        ca_file: apiservice_ca_file(cfg, pki),
    };
    tracing::info!(ca = %target.ca_file.display(), service = %format!("{}/{}", target.namespace, target.name), "keeping the host's APIServices in step");
    let ready: Arc<dyn Fn() -> bool + Send + Sync> = match host_definitions {
        Some(h) => Arc::new(move || h.is_loaded()),
        None => Arc::new(|| true),
    };
    crate::host::apiservices::spawn(client.clone(), registry.clone(), target, ready)
}

/// The flow-control controller, against the host's objects or kshard's own
/// (through the admin kubeconfig); without a client the built-in
/// configuration stays in force.
async fn start_flowcontrol_controller(
    cfg: &ServeConfig,
    kubeconfig: &std::path::Path,
    apf: &Arc<Apf>,
) -> Option<tokio::task::JoinHandle<()>> {
    let client = match cfg.host_for(&cfg.flowcontrol_kubeconfig.clone()) {
        Some(host) => crate::host::client(host.as_deref())
            .await
            .map_err(|e| e.to_string()),
        None => controller_client(kubeconfig).await,
    };
    match client {
        Ok(client) => Some(crate::controller::spawn(client, apf.clone())),
        Err(e) => {
            tracing::error!(
                error = %e,
                "flow-control controller not started; built-in configuration stays in force"
            );
            None
        }
    }
}

/// The CA the host's aggregator verifies kshard with: the flag; else the
/// `ca.crt` a cert-manager or `kubernetes.io/tls` Secret mounts beside the
/// serving certificate; else that certificate itself (self-signed); else,
/// with the generated dev PKI, its CA.
fn apiservice_ca_file(cfg: &ServeConfig, pki: &pki::Pki) -> PathBuf {
    if let Some(f) = &cfg.apiservice_ca_file {
        return f.clone();
    }
    match &cfg.tls_cert_file {
        Some(cert) => {
            let beside = cert.with_file_name("ca.crt");
            if beside.exists() {
                beside
            } else {
                cert.clone()
            }
        }
        None => pki.ca_cert(),
    }
}

/// Opens the storage engine; a cluster that cannot be reached yet (TiKV still
/// starting) is retried with backoff (0.5 s doubling to 30 s), saying so each
/// time, instead of failing the start.
async fn open_engine_retrying(
    cfg: &ServeConfig,
) -> Result<Arc<dyn crate::storage::Engine>, ServerError> {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let store = cfg.store.clone();
        let path = cfg.data_dir.join(crate::storage::embedded::STORE_FILE);
        let cache = usize::try_from(cfg.storage_cache_bytes).unwrap_or(usize::MAX);
        let opened = tokio::task::spawn_blocking(move || {
            crate::storage::open_engine(store.as_deref(), &path, cache)
        })
        .await
        .map_err(|e| ServerError::Config(format!("opening the store: {e}")))?;
        match opened {
            Err(StorageError::Unavailable(why)) => {
                let wait = backoff.next_delay();
                tracing::error!(retry_in = ?wait, "{why}");
                tokio::time::sleep(wait).await;
            }
            other => return Ok(other?),
        }
    }
}

/// This replica's configuration (id, advertised address) on a shared store,
/// with its internal endpoint bound.
async fn replica_config(
    cfg: &ServeConfig,
) -> Result<(crate::replica::ReplicaConfig, TcpListener), ServerError> {
    let listener = TcpListener::bind(cfg.internal_listen)
        .await
        .map_err(io(format!("listening on {}", cfg.internal_listen)))?;
    let bound = listener.local_addr().map_err(io("local address"))?;
    let advertise_address = match &cfg.advertise_address {
        Some(a) => a.clone(),
        None if bound.ip().is_unspecified() => {
            let host = crate::replica::default_replica_id();
            let host = host.rsplit_once('-').map_or(host.as_str(), |(h, _)| h);
            format!("{host}:{}", bound.port())
        }
        None => bound.to_string(),
    };
    let rcfg = crate::replica::ReplicaConfig {
        replica_id: cfg
            .replica_id
            .clone()
            .unwrap_or_else(crate::replica::default_replica_id),
        advertise_address,
        lease_duration: cfg.lease_duration,
    };
    tracing::info!(
        replica = %rcfg.replica_id,
        advertise = %rcfg.advertise_address,
        internal = %bound,
        "replica of a shared store"
    );
    Ok((rcfg, listener))
}

/// What delegation to a host adds: the authenticator and authorizer, and the
/// background work that keeps them (and namespace lifecycle) current.
struct Delegation {
    auth: crate::auth::Authenticator,
    authz: crate::authz::Authorizer,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn delegation(
    cfg: &ServeConfig,
    readiness: &Arc<crate::api::health::Readiness>,
    pki: &pki::Pki,
    addr: SocketAddr,
) -> Result<Delegation, ServerError> {
    use crate::auth::{
        Anonymous, AuthConfig, Authenticator, CaBundle, DynamicConfig, RequestHeader,
    };
    let anonymous = if cfg.anonymous_auth {
        Anonymous::Allowed
    } else {
        Anonymous::Refused
    };
    if !cfg.delegated() {
        // Standalone: the generated CA's certificates authenticate (the admin
        // kubeconfig's is in system:masters); every authenticated user is
        // authorized, as kube-apiserver's default AlwaysAllow mode. Anonymous
        // requests get everything too on a loopback address (a laptop), and on
        // any other address only the probes and discovery unless
        // --anonymous-admin says otherwise.
        let anonymous_full_access =
            cfg.anonymous_auth && (addr.ip().is_loopback() || cfg.anonymous_admin);
        if cfg.anonymous_admin && !addr.ip().is_loopback() {
            tracing::warn!(
                %addr,
                "--anonymous-admin on an address other hosts can reach: anyone who can \
                 connect can read and write every object without credentials"
            );
        } else if cfg.anonymous_auth && !addr.ip().is_loopback() {
            tracing::info!(
                %addr,
                "anonymous requests may only read health and discovery on this address; \
                 use the admin kubeconfig, or --anonymous-admin to open everything"
            );
        }
        let config = AuthConfig {
            client_ca: Some(CaBundle::load(&pki.ca_cert())?),
            request_header: None,
        };
        return Ok(Delegation {
            auth: Authenticator::Delegating {
                config: Arc::new(DynamicConfig::new(config, true)),
                tokens: None,
                anonymous,
            },
            authz: crate::authz::Authorizer::Standalone {
                anonymous_full_access,
            },
            tasks: Vec::new(),
        });
    }
    if cfg.anonymous_admin {
        return Err(ServerError::Config(
            "--anonymous-admin is for a standalone server; behind a host, the host authorizes"
                .into(),
        ));
    }
    let mut out = Delegation {
        auth: Authenticator::Dev,
        authz: crate::authz::Authorizer::AlwaysAllow,
        tasks: Vec::new(),
    };
    let flags = AuthConfig {
        client_ca: cfg
            .client_ca_file
            .as_deref()
            .map(CaBundle::load)
            .transpose()?,
        request_header: match cfg.requestheader_client_ca_file.as_deref() {
            Some(p) => {
                let mut rh = RequestHeader::new(CaBundle::load(p)?);
                rh.allowed_names = cfg.requestheader_allowed_names.clone();
                rh.username_headers = cfg.requestheader_username_headers.clone();
                rh.group_headers = cfg.requestheader_group_headers.clone();
                rh.extra_headers_prefix = cfg.requestheader_extra_headers_prefix.clone();
                Some(rh)
            }
            None => None,
        },
    };
    let authn_host = match cfg.host_for(&cfg.authentication_kubeconfig) {
        Some(h) => Some(crate::host::client(h.as_deref()).await?),
        None => None,
    };
    // With nothing left for the ConfigMap to fill in, there is nothing to look up.
    let lookup = authn_host.is_some()
        && !cfg.authentication_skip_lookup
        && (flags.client_ca.is_none() || flags.request_header.is_none());
    let config = Arc::new(DynamicConfig::new(flags.clone(), !lookup));
    let tokens = authn_host.as_ref().map(|c| {
        Arc::new(crate::auth::token::TokenReviewer::new(
            c.clone(),
            cfg.token_cache_ttl,
        ))
    });
    if let (true, Some(client)) = (lookup, &authn_host) {
        out.tasks.push(crate::auth::configmap::spawn_watch(
            client.clone(),
            flags,
            config.clone(),
        ));
    }
    let loaded = config.clone();
    readiness.add("authentication-config", move || loaded.is_loaded());
    out.auth = Authenticator::Delegating {
        config,
        tokens,
        anonymous,
    };

    let authz_host = match cfg.host_for(&cfg.authorization_kubeconfig) {
        Some(h) => Some(crate::host::client(h.as_deref()).await?),
        None => {
            tracing::warn!(
                "no host to authorize against (--authorization-kubeconfig/--kubeconfig): \
                 only system:masters and the always-allowed paths are authorized"
            );
            None
        }
    };
    out.authz = crate::authz::Authorizer::Delegating(Arc::new(
        crate::authz::SubjectAccessReviewer::new(
            authz_host,
            cfg.authorization_always_allow_paths.clone(),
        )
        .with_ttls(cfg.authorization_allow_ttl, cfg.authorization_deny_ttl),
    ));
    Ok(out)
}

/// The API plus the server's own endpoints, behind the request layers.
fn app(
    state: Arc<ApiState>,
    snapshots: Arc<crate::snapshot::serve::Snapshots>,
    parts: layers::Parts,
) -> Router {
    let snapshot = Router::new()
        .route(
            crate::api::request::SNAPSHOT_PATH,
            axum::routing::any(crate::snapshot::serve::handle),
        )
        .with_state(snapshots);
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
        .with_state(parts.apf.clone());
    layers::stack(own.merge(snapshot).merge(api::router(state)), parts).layer(
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

async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Arc<conn::ConnectionLimits>,
    conns: conn::Connections,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let l = limits.clone();
    let stop = conns.stop.clone();
    conn::accept_loop(listener, &l, conns, move |tcp, peer, permit| {
        let acceptor = acceptor.clone();
        let app = app.clone();
        let limits = limits.clone();
        let stop = stop.clone();
        async move {
            // A client that never finishes the handshake gives its slot back.
            let stream = match tokio::time::timeout(
                limits.tls_handshake_timeout,
                acceptor.accept(tcp),
            )
            .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let peer_certs = crate::auth::PeerCertificates::new(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            );
            let certs = Some(peer_certs);
            if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                // Many streams' frames leave as few TLS records in one write.
                let stream = gather::Gathered::new(stream);
                conn::serve_connection(stream, app, peer, certs, &limits, &stop).await;
            } else {
                conn::serve_connection(stream, app, peer, certs, &limits, &stop).await;
            }
            drop(permit);
        }
    })
    .await;
}

async fn serve_plain(
    listener: TcpListener,
    app: Router,
    limits: Arc<conn::ConnectionLimits>,
    conns: conn::Connections,
) {
    let l = limits.clone();
    let stop = conns.stop.clone();
    conn::accept_loop(listener, &l, conns, move |tcp, peer, permit| {
        let app = app.clone();
        let limits = limits.clone();
        let stop = stop.clone();
        async move {
            conn::serve_connection(tcp, app, peer, None, &limits, &stop).await;
            drop(permit);
        }
    })
    .await;
}
