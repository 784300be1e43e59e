//! The `kshard` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kshard",
    version,
    about = "A Kubernetes API server shard for CRD-defined resource groups"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API.
    Serve(Box<ServeArgs>),
    /// Print the flowcontrol.kshard.dev CustomResourceDefinitions (YAML).
    Crds,
    /// Print the manifests that run kshard as an aggregated APIService (YAML).
    Manifests(kshard::manifests::ManifestsArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Where the embedded store, certificates and kubeconfig live.
    #[arg(long, default_value = "./kshard-data")]
    data_dir: PathBuf,
    /// Storage engine: `embedded` (under --data-dir) or
    /// `tikv://pd1:2379[,pd2:2379]?prefix=<shard>` (needs the `tikv` build feature).
    #[arg(long)]
    store: Option<String>,
    /// HTTPS listen address.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Directory (or file) of CustomResourceDefinition manifests to serve; repeatable.
    #[arg(long = "crds", default_value = "crds/examples")]
    crds: Vec<PathBuf>,
    /// Plain-HTTP listen address for local debugging (no TLS, no authentication).
    #[arg(long)]
    insecure_listen: Option<SocketAddr>,
    /// How often history is compacted (to the revision current one interval earlier).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    compaction_interval: Duration,
    /// How often watchers that allow bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    bookmark_interval: Duration,
    /// Non-mutating share of the server concurrency limit (API Priority and Fairness).
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: u32,
    /// Mutating share of the server concurrency limit (API Priority and Fairness).
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: u32,
    /// Cluster whose FlowSchema/PriorityLevelConfiguration objects configure flow
    /// control (default: kshard itself, which then serves those CRDs).
    #[arg(long)]
    flowcontrol_kubeconfig: Option<PathBuf>,
    /// Client certificates signed by this CA authenticate (CN user, O groups).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// CA of the front proxy (the host's aggregator) allowed to set X-Remote-* headers.
    #[arg(long)]
    requestheader_client_ca_file: Option<PathBuf>,
    /// Front-proxy certificate CNs allowed (comma-separated; empty: any).
    #[arg(long, value_delimiter = ',')]
    requestheader_allowed_names: Vec<String>,
    /// Request headers carrying the user name from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    requestheader_username_headers: Vec<String>,
    /// Request headers carrying the groups from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    requestheader_group_headers: Vec<String>,
    /// Request header prefixes carrying extra user information from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    requestheader_extra_headers_prefix: Vec<String>,
    /// The host cluster kshard is aggregated into (namespaces; default for the two below).
    /// In a pod, the in-cluster configuration is used without it.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Cluster that reviews bearer tokens and publishes extension-apiserver-authentication.
    #[arg(long)]
    authentication_kubeconfig: Option<PathBuf>,
    /// Cluster that answers SubjectAccessReviews.
    #[arg(long)]
    authorization_kubeconfig: Option<PathBuf>,
    /// Do not read kube-system/extension-apiserver-authentication from the host.
    #[arg(long)]
    authentication_skip_lookup: bool,
    /// Non-resource paths allowed without authorization (a trailing * matches a prefix).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    authorization_always_allow_paths: Vec<String>,
    /// How long TokenReview answers are reused.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    authentication_token_webhook_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview answers are reused.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    authorization_webhook_cache_authorized_ttl: Duration,
    /// How long denied SubjectAccessReview answers are reused.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    authorization_webhook_cache_unauthorized_ttl: Duration,
    /// Serving certificate (PEM); reloaded when it changes. Default: the generated dev PKI.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// This replica's name among the replicas of a shard on a shared store
    /// (unique; default: host name and process id).
    #[arg(long)]
    replica_id: Option<String>,
    /// `host:port` where the other replicas reach this one's internal
    /// endpoint (default: --internal-listen, or the host name and its port).
    #[arg(long)]
    advertise_address: Option<String>,
    /// Internal endpoint for the other replicas (plain HTTP/2 with a shared
    /// secret; keep it on a private network). Used only with a shared store.
    #[arg(long, default_value = "0.0.0.0:6444")]
    internal_listen: SocketAddr,
    /// How long the leader lease lasts unless renewed (renewed every fifth).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_duration: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(a) => {
                let cfg = kshard::server::ServeConfig {
                    data_dir: a.data_dir,
                    store: a.store,
                    listen: a.listen,
                    crds: a.crds,
                    insecure_listen: a.insecure_listen,
                    compaction_interval: a.compaction_interval,
                    bookmark_interval: a.bookmark_interval,
                    max_requests_inflight: a.max_requests_inflight,
                    max_mutating_requests_inflight: a.max_mutating_requests_inflight,
                    flowcontrol_kubeconfig: a.flowcontrol_kubeconfig,
                    client_ca_file: a.client_ca_file,
                    requestheader_client_ca_file: a.requestheader_client_ca_file,
                    requestheader_allowed_names: a.requestheader_allowed_names,
                    requestheader_username_headers: a.requestheader_username_headers,
                    requestheader_group_headers: a.requestheader_group_headers,
                    requestheader_extra_headers_prefix: a.requestheader_extra_headers_prefix,
                    host_kubeconfig: a.kubeconfig,
                    authentication_kubeconfig: a.authentication_kubeconfig,
                    authorization_kubeconfig: a.authorization_kubeconfig,
                    authentication_skip_lookup: a.authentication_skip_lookup,
                    authorization_always_allow_paths: a.authorization_always_allow_paths,
                    tls_cert_file: a.tls_cert_file,
                    tls_private_key_file: a.tls_private_key_file,
                    token_cache_ttl: a.authentication_token_webhook_cache_ttl,
                    authorization_allow_ttl: a.authorization_webhook_cache_authorized_ttl,
                    authorization_deny_ttl: a.authorization_webhook_cache_unauthorized_ttl,
                    in_cluster: kshard::host::in_cluster(),
                    replica_id: a.replica_id,
                    advertise_address: a.advertise_address,
                    internal_listen: a.internal_listen,
                    lease_duration: a.lease_duration,
                    ..Default::default()
                };
                let running = kshard::server::start(cfg)
                    .await
                    .context("starting kshard")?;
                println!(
                    "kshard is serving on https://{}\n  kubectl --kubeconfig {} get widgets",
                    running.addr,
                    running.kubeconfig.display()
                );
                // Kubernetes stops pods with SIGTERM; a terminal with ctrl-c.
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .context("installing the SIGTERM handler")?;
                tokio::select! {
                    r = tokio::signal::ctrl_c() => r.context("waiting for ctrl-c")?,
                    _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                }
                running.shutdown();
                Ok(())
            }
            Command::Manifests(a) => {
                print!(
                    "{}",
                    kshard::manifests::render(&a).context("rendering the manifests")?
                );
                Ok(())
            }
            Command::Crds => {
                print!("{}", kshard::controller::crd::manifests_yaml());
                Ok(())
            }
        }
    })
}
