//! `kshard serve`'s configuration. clap parses the command line straight into
//! [`ServeConfig`] (the binary adds nothing), and [`ServeConfig::default`] is
//! the same parse of an empty command line, so every default is written once,
//! on its flag.

use crate::units::{parse_bytes, parse_duration};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, FromArgMatches};

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Log format: `text`, or `json` (one object per line with kube's keys:
    /// ts, logger, caller, msg, v, err), as kube-apiserver's flag.
    #[arg(long, value_enum, default_value = "text")]
    pub logging_format: crate::logging::LogFormat,
    /// kube-apiserver's tracing configuration file (a `TracingConfiguration`
    /// of apiserver.config.k8s.io: OTLP gRPC `endpoint`, default
    /// localhost:4317, and `samplingRatePerMillion`, default 0). Without it
    /// nothing is traced.
    #[arg(long)]
    pub tracing_config_file: Option<PathBuf>,
    /// Where the embedded store, certificates and kubeconfig live.
    #[arg(long, default_value = "./kshard-data")]
    pub data_dir: PathBuf,
    /// Storage engine: `embedded` (under --data-dir, the default) or
    /// `tikv://pd1:2379[,pd2:2379]?prefix=<shard>` (needs the `tikv` build feature).
    #[arg(long)]
    pub store: Option<String>,
    /// Page cache of the embedded store (bytes, or with a Ki/Mi/Gi suffix).
    /// Small: the watch cache serves most reads, and the kernel's page cache
    /// holds the file anyway; 64Mi cost about twice its size in resident
    /// memory (the benchmark's memory figure rose from 1.9× to 4× the data).
    #[arg(long, default_value = "4Mi", value_parser = parse_bytes)]
    pub storage_cache_bytes: u64,
    /// HTTPS listen address.
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Directory (or file) of CustomResourceDefinition manifests to serve; repeatable.
    #[arg(long = "crds", default_value = "crds/examples")]
    pub crds: Vec<PathBuf>,
    /// Plain-HTTP listen address for local debugging (no TLS, no authentication).
    #[arg(long)]
    pub insecure_listen: Option<SocketAddr>,
    /// How often history is compacted (to the revision current one interval earlier).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub compaction_interval: Duration,
    /// How often watchers that allow bookmarks get one.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub bookmark_interval: Duration,
    /// Events the watch cache keeps per resource at most (kube's upper bound).
    #[arg(skip = crate::watch::DEFAULT_HISTORY_EVENTS)]
    pub watch_history: usize,
    /// How long the watch cache keeps events (kube-apiserver keeps 75 s);
    /// watchers resuming from an older revision get 410 Gone and re-list.
    #[arg(long, default_value = "75s", value_parser = parse_duration)]
    pub watch_cache_history: Duration,
    /// Memory (estimated: objects and the frames encoded for them) the watch
    /// cache's event history of one resource may hold; beyond it the oldest
    /// events are dropped whatever their age. Bytes, or with a Ki/Mi/Gi suffix.
    #[arg(long, default_value = "64Mi", value_parser = parse_bytes)]
    pub watch_cache_history_bytes: u64,
    /// Memory (estimated: objects and their frames) one watcher may hold
    /// queued. A watcher that reads slower than events come falls behind
    /// there: what it misses waits in the event history, and it is caught up
    /// once it reads. Bytes, or with a Ki/Mi/Gi suffix.
    #[arg(long, default_value = "32Mi", value_parser = parse_bytes)]
    pub watch_buffer_bytes: u64,
    /// How long a watcher may stay behind before its watch is ended (its
    /// queue freed; the client re-watches, and re-lists on 410).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub watch_buffer_grace: Duration,
    /// Non-mutating share of the server concurrency limit (API Priority and
    /// Fairness divides the sum of the two among priority levels).
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: u32,
    /// Mutating share of the server concurrency limit.
    #[arg(long, default_value_t = 200)]
    pub max_mutating_requests_inflight: u32,
    /// Cluster whose FlowSchema/PriorityLevelConfiguration objects configure flow
    /// control (default: kshard itself, which then serves those CRDs).
    #[arg(long)]
    pub flowcontrol_kubeconfig: Option<PathBuf>,
    /// Run the flow-control controller (off: the built-in configuration stays).
    #[arg(skip = true)]
    pub flowcontrol_controller: bool,
    /// Client certificates signed by this CA authenticate (CN user, O groups).
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// CA of the front proxy (the host's aggregator) allowed to set X-Remote-* headers.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Front-proxy certificate CNs allowed (comma-separated; empty: any).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// Request headers carrying the user name from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Request headers carrying the groups from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Request header prefixes carrying extra user information from the front proxy.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// The host cluster kshard is aggregated into (namespaces; default for the two below).
    /// In a pod, the in-cluster configuration is used without it.
    #[arg(long = "kubeconfig")]
    pub host_kubeconfig: Option<PathBuf>,
    /// Cluster that reviews bearer tokens and publishes extension-apiserver-authentication.
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// Cluster that answers SubjectAccessReviews.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// Requests without credentials are `system:anonymous` (in
    /// `system:unauthenticated`) and get what the authorizer allows; with
    /// `false`, they are refused with 401 (kube-apiserver's flag).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub anonymous_auth: bool,
    /// Standalone on a non-loopback address: anonymous requests may read and
    /// write everything (as they may on loopback). Anyone who can reach the
    /// port then can, so kshard says so loudly at start.
    #[arg(long)]
    pub anonymous_admin: bool,
    /// Do not read kube-system/extension-apiserver-authentication from the host.
    #[arg(long)]
    pub authentication_skip_lookup: bool,
    /// Non-resource paths allowed without authorization (a trailing * matches a prefix).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,
    /// Serving certificate (PEM); reloaded when it changes. Default: the generated dev PKI.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// How long TokenReview answers are reused.
    #[arg(long = "authentication-token-webhook-cache-ttl", default_value = "10s", value_parser = parse_duration)]
    pub token_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview answers are reused.
    #[arg(long = "authorization-webhook-cache-authorized-ttl", default_value = "10s", value_parser = parse_duration)]
    pub authorization_allow_ttl: Duration,
    /// How long denied SubjectAccessReview answers are reused.
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl", default_value = "10s", value_parser = parse_duration)]
    pub authorization_deny_ttl: Duration,
    /// Running in a pod: the host is reached with the in-cluster configuration
    /// and authentication is delegated even without flags. Not a flag: the
    /// binary sets it from the environment.
    #[arg(skip)]
    pub in_cluster: bool,
    /// This replica's name among the replicas of a shard on a shared store
    /// (unique; default: host name and process id).
    #[arg(long)]
    pub replica_id: Option<String>,
    /// `host:port` where the other replicas reach this one's internal
    /// endpoint (default: --internal-listen, or the host name and its port).
    #[arg(long)]
    pub advertise_address: Option<String>,
    /// Internal endpoint for the other replicas (plain HTTP/2 with a shared
    /// secret; keep it on a private network). Used only with a shared store.
    #[arg(long, default_value = "0.0.0.0:6444")]
    pub internal_listen: SocketAddr,
    /// How long the leader lease lasts unless renewed. The leader renews
    /// every fifth of it; followers take over a lease unchanged this long on
    /// their own clock, so a `kill -9`ed leader is replaced after about one
    /// lease (ARCHITECTURE.md, "Failover timing").
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// Where an admission webhook's `host:port` is reached instead of
    /// resolving it (`hooks.ns.svc:443=10.0.0.5:8443`), as curl's
    /// `--resolve`: for kshard outside the cluster whose Services its
    /// webhooks name. The certificate must still carry the name. Repeatable.
    #[arg(long = "admission-webhook-resolve", value_parser = parse_resolve)]
    pub admission_webhook_resolve: Vec<(String, SocketAddr)>,
    /// Behind a host: keep the host's APIService objects for the served
    /// group-versions in step (create, update, and remove those kshard
    /// registered); needs RBAC for `apiregistration.k8s.io` apiservices.
    #[arg(long)]
    pub manage_apiservices: bool,
    /// Namespace of the Service the managed APIServices point at.
    #[arg(long, default_value = "kshard-system")]
    pub apiservice_service_namespace: String,
    /// Name of that Service.
    #[arg(long, default_value = "kshard")]
    pub apiservice_service_name: String,
    /// Port of that Service.
    #[arg(long, default_value_t = 443)]
    pub apiservice_service_port: i32,
    /// CA (PEM) written as the managed APIServices' `caBundle`. Default: the
    /// `ca.crt` beside --tls-cert-file (cert-manager's and kubernetes.io/tls
    /// Secrets carry one), else the certificate itself (self-signed), else the
    /// generated dev CA.
    #[arg(long)]
    pub apiservice_ca_file: Option<PathBuf>,
    /// Behind a host: follow only the ShardResourceDefinitions with these
    /// labels (a label selector), for several shards behind one host.
    #[arg(long)]
    pub host_definitions_selector: Option<String>,
    #[command(flatten)]
    pub connections: super::conn::ConnectionLimits,
    #[command(flatten)]
    pub audit: crate::audit::AuditOptions,
}

impl ServeConfig {
    /// Whether authentication and authorization are delegated (any of their
    /// flags set, or running in a cluster); otherwise standalone dev mode.
    pub fn delegated(&self) -> bool {
        self.client_ca_file.is_some()
            || self.requestheader_client_ca_file.is_some()
            || self.host_kubeconfig.is_some()
            || self.authentication_kubeconfig.is_some()
            || self.authorization_kubeconfig.is_some()
            || self.in_cluster
    }

    /// The kubeconfig for one purpose: its own flag, else `--kubeconfig`; `Some(None)`
    /// means in-cluster; `None` means no host at all.
    pub(super) fn host_for(&self, specific: &Option<PathBuf>) -> Option<Option<PathBuf>> {
        match (specific, &self.host_kubeconfig) {
            (Some(p), _) | (None, Some(p)) => Some(Some(p.clone())),
            (None, None) if self.in_cluster => Some(None),
            _ => None,
        }
    }
}

impl Default for ServeConfig {
    /// The configuration of `kshard serve` with no flags.
    fn default() -> Self {
        let cmd = Self::augment_args(clap::Command::new("kshard"));
        // Parsing no arguments can only fail if a default above does not parse,
        // which the unit test below rules out.
        cmd.try_get_matches_from(["kshard"])
            .and_then(|m| Self::from_arg_matches(&m))
            .expect("the flag defaults parse")
    }
}

/// `host:port=address:port` for `--admission-webhook-resolve`.
pub fn parse_resolve(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected host:port=address:port"))?;
    let (host, port) = name
        .rsplit_once(':')
        .ok_or_else(|| format!("{name:?}: expected host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{name:?}: invalid port"))?;
    let addr: SocketAddr = addr
        .parse()
        .map_err(|_| format!("{addr:?}: expected address:port"))?;
    Ok((format!("{host}:{port}"), addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_flag_defaults() {
        let c = ServeConfig::default();
        assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 6443)));
        assert_eq!(c.compaction_interval, Duration::from_secs(300));
        assert_eq!(c.requestheader_username_headers, ["X-Remote-User"]);
        assert_eq!(
            c.authorization_always_allow_paths,
            crate::authz::DEFAULT_ALWAYS_ALLOW_PATHS
        );
        assert_eq!(c.token_cache_ttl, crate::auth::token::DEFAULT_CACHE_TTL);
        assert_eq!(c.authorization_allow_ttl, crate::authz::DEFAULT_ALLOW_TTL);
        assert_eq!(c.authorization_deny_ttl, crate::authz::DEFAULT_DENY_TTL);
        assert!(c.flowcontrol_controller && !c.in_cluster);
        assert_eq!(c.watch_history, crate::watch::DEFAULT_HISTORY_EVENTS);
        assert_eq!(c.watch_cache_history, crate::watch::DEFAULT_HISTORY_WINDOW);
        assert_eq!(c.watch_buffer_bytes, crate::watch::DEFAULT_WATCHER_BYTES);
        assert_eq!(c.watch_buffer_grace, crate::watch::DEFAULT_WATCHER_GRACE);
    }

    #[test]
    fn webhook_resolve_entries() {
        assert_eq!(
            parse_resolve("hooks.test.svc:443=127.0.0.1:9443"),
            Ok((
                "hooks.test.svc:443".to_string(),
                SocketAddr::from(([127, 0, 0, 1], 9443))
            ))
        );
        assert!(parse_resolve("hooks.test.svc=127.0.0.1:1").is_err());
        assert!(parse_resolve("h:443=nowhere").is_err());
    }
}
