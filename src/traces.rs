//! Traces as kube-apiserver exports them, with `--tracing-config-file`:
//! the file is kube's `TracingConfiguration` (`apiserver.config.k8s.io`
//! v1, v1beta1 or v1alpha1), read and validated as kube does (strict
//! fields, its messages); spans go over OTLP gRPC (plaintext, as kube's
//! `otlptracegrpc.WithInsecure`) to `endpoint` (default `localhost:4317`)
//! through the SDK's batch processor; the sampler is kube's
//! `ParentBased(TraceIDRatioBased(samplingRatePerMillion / 10⁶))`, with
//! `NeverSample` for a rate of 0 (the default): only requests whose caller
//! sampled them are exported then.
//!
//! Without the flag nothing is installed: every instrumentation point starts
//! with [`enabled`] (one atomic load) and allocates nothing, so a server
//! without tracing pays for none of it.
//!
//! Spans follow the request: `server::layers::trace` starts the server span
//! and runs the rest of the chain with its [`Context`] current (attached on
//! every poll of the request's future); deeper code starts children of the
//! current span with [`Span::child`] and runs their work inside them with
//! [`in_span`]. Outgoing calls (webhooks) carry the current span in a W3C
//! `traceparent` header ([`inject`]).

use std::future::Future;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

/// The collector kube dials when the file names none.
pub const DEFAULT_ENDPOINT: &str = "localhost:4317";
const GROUP: &str = "apiserver.config.k8s.io";
const KIND: &str = "TracingConfiguration";
/// The versions of the configuration kube-apiserver reads.
const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];
const MAX_SAMPLING_RATE_PER_MILLION: i32 = 1_000_000;

/// kube's `TracingConfiguration` as its file says it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TracingConfiguration {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    /// The collector's gRPC target: `host:port`, `dns://[authority]/host:port`
    /// or `unix:///path`.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Root requests sampled per million; 0 (the default) samples only
    /// what the caller sampled.
    #[serde(default)]
    pub sampling_rate_per_million: Option<i32>,
}

/// A configuration file kube-apiserver would refuse, in its words.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "failed to read tracing config: unable to read tracing configuration from {path:?}: {source}"
    )]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("failed to read tracing config: unable to decode tracing configuration data: {0}")]
    Decode(String),
    #[error("failed to validate tracing configuration: {0}")]
    Invalid(String),
    #[error("starting the trace exporter: {0}")]
    Exporter(String),
}

/// Where the collector is, as the gRPC target names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `host:port` (a `dns` target; its DNS server authority, if any, is not used).
    Tcp { host: String, port: u16 },
    /// `unix:///absolute/path`.
    Unix(std::path::PathBuf),
    /// `unix-abstract://name` (Linux's abstract socket namespace).
    UnixAbstract(String),
}

impl TracingConfiguration {
    /// Reads and validates `path` as kube-apiserver's `--tracing-config-file`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let cfg = Self::parse(&text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Decodes YAML or JSON. As kube's decoder: an empty file is all
    /// defaults, missing `apiVersion` and `kind` are this type's, unknown
    /// and repeated fields are errors.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        // One line, as kube's: the source snippet would repeat the file.
        let cfg: Option<Self> = serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::Decode(e.without_snippet().to_string()))?;
        let cfg = cfg.unwrap_or_default();
        let kind = cfg.kind.as_deref().unwrap_or(KIND);
        let version_known = match cfg.api_version.as_deref() {
            None => true,
            Some(v) => v
                .split_once('/')
                .is_some_and(|(g, v)| g == GROUP && VERSIONS.contains(&v)),
        };
        if kind != KIND || !version_known {
            let version = cfg
                .api_version
                .clone()
                .unwrap_or_else(|| format!("{GROUP}/{}", VERSIONS[0]));
            return Err(ConfigError::Decode(format!(
                "no kind {kind:?} is registered for version {version:?}"
            )));
        }
        Ok(cfg)
    }

    /// kube's `ValidateTracingConfiguration`: its field errors, several
    /// joined as Go's aggregate error joins them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        if let Some(rate) = self.sampling_rate_per_million {
            if rate < 0 {
                errs.push(format!(
                    "samplingRatePerMillion: Invalid value: {rate}: sampling rate must be positive"
                ));
            }
            if rate > MAX_SAMPLING_RATE_PER_MILLION {
                errs.push(format!(
                    "samplingRatePerMillion: Invalid value: {rate}: sampling rate per million must be less than or equal to one million"
                ));
            }
        }
        if let Some(endpoint) = &self.endpoint {
            if let Err(e) = target(endpoint) {
                errs.push(e);
            }
        }
        match errs.len() {
            0 => Ok(()),
            1 => Err(ConfigError::Invalid(errs.remove(0))),
            _ => Err(ConfigError::Invalid(format!("[{}]", errs.join(", ")))),
        }
    }

    /// The collector to dial.
    pub fn target(&self) -> Result<Target, ConfigError> {
        match self.endpoint.as_deref().filter(|e| !e.is_empty()) {
            Some(e) => target(e).map_err(ConfigError::Invalid),
            None => target(DEFAULT_ENDPOINT).map_err(ConfigError::Invalid),
        }
    }

    /// kube's sampler: the caller's decision when there is one, else this
    /// share of trace ids (none at 0).
    fn sampler(&self) -> Sampler {
        let rate = self.sampling_rate_per_million.unwrap_or(0);
        let root = if rate > 0 {
            Sampler::TraceIdRatioBased(f64::from(rate) / f64::from(MAX_SAMPLING_RATE_PER_MILLION))
        } else {
            Sampler::AlwaysOff
        };
        Sampler::ParentBased(Box::new(root))
    }
}

/// The gRPC target of `endpoint`, checked as kube's `validateEndpoint`
/// does (no `//`: a `dns` target; the schemes gRPC names), or kube's field
/// error. Beyond kube's check, a target the exporter could never dial (a
/// relative unix path, a port that is not a number) is refused here rather
/// than failing every export later.
fn target(endpoint: &str) -> Result<Target, String> {
    let full = if endpoint.contains("//") {
        endpoint.to_string()
    } else {
        format!("dns://{endpoint}")
    };
    let invalid = |why: String| format!("endpoint: Invalid value: {full:?}: {why}");
    let url = url::Url::parse(&full).map_err(|e| invalid(format!("parse {full:?}: {e}")))?;
    match url.scheme() {
        "dns" => {
            // `dns:///host:port` and `dns://resolver/host:port` name the host
            // in the path; `dns://host:port` (a bare `host:port`) in the authority.
            let path = url.path().trim_start_matches('/');
            let (host, port) = if path.is_empty() {
                let host = url
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| invalid("no host".into()))?;
                (host.to_string(), url.port())
            } else {
                split_host_port(path).map_err(invalid)?
            };
            // gRPC's default port.
            Ok(Target::Tcp {
                host,
                port: port.unwrap_or(443),
            })
        }
        "unix" => {
            if url.host_str().is_some_and(|h| !h.is_empty()) || !url.path().starts_with('/') {
                return Err(invalid("a unix endpoint needs an absolute path (unix:///path)".into()));
            }
            Ok(Target::Unix(url.path().into()))
        }
        "unix-abstract" => {
            let name = format!("{}{}", url.host_str().unwrap_or_default(), url.path());
            Ok(Target::UnixAbstract(name.trim_start_matches('/').to_string()))
        }
        other => Err(invalid(format!(
            "unsupported scheme: {other}.  Options are none, dns, unix, or unix-abstract.  See https://github.com/grpc/grpc/blob/master/doc/naming.md"
        ))),
    }
}

fn split_host_port(s: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("missing ']' in {s:?}"))?;
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host in {s:?}"));
    }
    let port = port
        .map(|p| p.parse::<u16>().map_err(|_| format!("invalid port {p:?}")))
        .transpose()?;
    Ok((host, port))
}

struct Installed {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Whether traces are exported (a tracing configuration was installed).
#[inline]
pub fn enabled() -> bool {
    INSTALLED.get().is_some()
}

fn tracer() -> Option<&'static SdkTracer> {
    INSTALLED.get().map(|i| &i.tracer)
}

/// Starts exporting with `cfg`, naming this process `instance`; must run
/// inside the Tokio runtime (the gRPC channel's worker is spawned on it).
/// Once per process: a second call (several servers in one test process)
/// keeps the first configuration.
pub fn install(cfg: &TracingConfiguration, instance: &str) -> Result<(), ConfigError> {
    if enabled() {
        tracing::warn!("tracing is already configured in this process; keeping that configuration");
        return Ok(());
    }
    let channel = channel(&cfg.target()?)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_channel(channel)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| ConfigError::Exporter(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("kshard")
        .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(cfg.sampler())
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("kshard");
    if INSTALLED.set(Installed { tracer, provider }).is_err() {
        tracing::warn!("tracing is already configured in this process; keeping that configuration");
    }
    tracing::info!(
        endpoint = cfg.endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT),
        sampling_rate_per_million = cfg.sampling_rate_per_million.unwrap_or(0),
        "exporting traces"
    );
    Ok(())
}

/// How long one export may take (OpenTelemetry's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A plaintext gRPC channel to the collector, connected on first use (a
/// collector that is down costs the exports, not the start).
fn channel(target: &Target) -> Result<tonic::transport::Channel, ConfigError> {
    let bad = |e: tonic::transport::Error| ConfigError::Exporter(e.to_string());
    let channel = match target {
        Target::Tcp { host, port } => {
            tonic::transport::Endpoint::from_shared(format!("http://{host}:{port}"))
                .map_err(bad)?
                .connect_timeout(Duration::from_secs(5))
                .connect_lazy()
        }
        Target::Unix(path) => {
            let path = path.clone();
            unix_endpoint().connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(hyper_util::rt::TokioIo::new)
                }
            }))
        }
        Target::UnixAbstract(name) => {
            let name = name.clone();
            unix_endpoint().connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                let name = name.clone();
                async move {
                    use std::os::linux::net::SocketAddrExt as _;
                    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                    let std = std::os::unix::net::UnixStream::connect_addr(&addr)?;
                    std.set_nonblocking(true)?;
                    tokio::net::UnixStream::from_std(std).map(hyper_util::rt::TokioIo::new)
                }
            }))
        }
    };
    Ok(channel)
}

/// A unix socket's channel still needs an HTTP/2 authority.
fn unix_endpoint() -> tonic::transport::Endpoint {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
}

/// Sends the spans still queued (at shutdown). Blocks until the exporter
/// answers or gives up; call from a blocking thread.
pub fn flush() {
    if let Some(i) = INSTALLED.get() {
        if let Err(e) = i.provider.force_flush() {
            tracing::warn!(error = %e, "flushing traces");
        }
    }
}

fn propagator() -> &'static TraceContextPropagator {
    static P: OnceLock<TraceContextPropagator> = OnceLock::new();
    P.get_or_init(TraceContextPropagator::new)
}

/// The caller's span from a W3C `traceparent` (and `tracestate`) header.
pub fn extract(headers: &http::HeaderMap) -> Option<SpanContext> {
    if !headers.contains_key("traceparent") {
        return None;
    }
    let cx = propagator().extract(&opentelemetry_http::HeaderExtractor(headers));
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Writes the current span into `headers` as `traceparent`, as kube's
/// clients do for every outgoing request (sampled or not), when tracing is on.
pub fn inject(headers: &mut http::HeaderMap) {
    if !enabled() {
        return;
    }
    Context::map_current(|cx| {
        if cx.span().span_context().is_valid() {
            propagator().inject_context(cx, &mut opentelemetry_http::HeaderInjector(headers));
        }
    });
}

/// Starts a root span of this process: the server span of a request.
/// `parent` is the caller's context (or none), `links` the callers it does
/// not follow.
pub fn start_server_span(
    name: String,
    start: std::time::SystemTime,
    parent: &Context,
    links: Vec<opentelemetry::trace::Link>,
    attributes: Vec<KeyValue>,
) -> Option<Context> {
    let tracer = tracer()?;
    let span = tracer
        .span_builder(name)
        .with_kind(SpanKind::Server)
        .with_start_time(start)
        .with_links(links)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    Some(parent.with_span(span))
}

/// A span of work inside a sampled trace; it ends when dropped.
pub struct Span {
    cx: Context,
}

impl Span {
    /// A child of the current span (an internal step), when tracing is on
    /// and the current span is sampled; nothing is made otherwise.
    #[inline]
    pub fn child(name: &'static str) -> Option<Span> {
        Self::child_with(name, SpanKind::Internal, Vec::new)
    }

    /// [`Span::child`] of `kind` with attributes, made only when the span is.
    #[inline]
    pub fn child_with(
        name: &'static str,
        kind: SpanKind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Option<Span> {
        let tracer = tracer()?;
        let parent =
            Context::map_current(|cx| cx.span().span_context().is_sampled().then(|| cx.clone()))?;
        Some(Self::start(tracer, &parent, name, kind, None, attributes()))
    }

    /// A child of `parent` that began at `start` (a step measured before
    /// the trace existed: authentication).
    pub fn child_of(
        parent: &Context,
        name: &'static str,
        start: std::time::SystemTime,
    ) -> Option<Span> {
        let tracer = tracer()?;
        if !parent.span().span_context().is_sampled() {
            return None;
        }
        Some(Self::start(
            tracer,
            parent,
            name,
            SpanKind::Internal,
            Some(start),
            Vec::new(),
        ))
    }

    fn start(
        tracer: &SdkTracer,
        parent: &Context,
        name: &'static str,
        kind: SpanKind,
        start: Option<std::time::SystemTime>,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let mut builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        if let Some(t) = start {
            builder = builder.with_start_time(t);
        }
        Span {
            cx: parent.with_span(builder.start_with_context(tracer, parent)),
        }
    }

    /// A child of this span, started now.
    pub fn start_child(
        &self,
        name: &'static str,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        match tracer() {
            Some(tracer) => Self::start(tracer, &self.cx, name, kind, None, attributes),
            // A span exists only while tracing is installed, which is for good.
            None => Span { cx: Context::new() },
        }
    }

    pub fn context(&self) -> &Context {
        &self.cx
    }

    pub fn set_attribute(&self, kv: KeyValue) {
        self.cx.span().set_attribute(kv);
    }

    /// Writes this span into `headers` as `traceparent` (an outgoing call's).
    pub fn inject(&self, headers: &mut http::HeaderMap) {
        propagator().inject_context(&self.cx, &mut opentelemetry_http::HeaderInjector(headers));
    }

    /// Marks the span failed with `message`.
    pub fn fail(&self, message: impl Into<String>) {
        self.cx.span().set_status(Status::error(message.into()));
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// Runs `fut` with `span` current (when there is one), so the spans it
/// starts are that span's children.
pub fn in_span<F: Future>(
    span: &Option<Span>,
    fut: F,
) -> futures::future::Either<opentelemetry::context::WithContext<F>, F> {
    match span {
        Some(s) => futures::future::Either::Left(fut.with_context(s.cx.clone())),
        None => futures::future::Either::Right(fut),
    }
}

/// Runs `fut` with `cx` current.
pub fn in_context<F: Future>(cx: Context, fut: F) -> opentelemetry::context::WithContext<F> {
    fut.with_context(cx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TracingConfiguration, String> {
        TracingConfiguration::parse(text)
            .and_then(|c| c.validate().map(|()| c))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_version_kube_reads_is_read() {
        for v in VERSIONS {
            let c = parse(&format!(
                "apiVersion: {GROUP}/{v}\nkind: TracingConfiguration\nendpoint: collector:4317\nsamplingRatePerMillion: 100\n"
            ))
            .expect(v);
            assert_eq!(c.endpoint.as_deref(), Some("collector:4317"));
            assert_eq!(c.sampling_rate_per_million, Some(100));
        }
        // JSON, and kube's defaults for what is left out.
        let c =
            parse(r#"{"apiVersion":"apiserver.config.k8s.io/v1","kind":"TracingConfiguration"}"#)
                .expect("json");
        assert_eq!(
            c.target().expect("target"),
            Target::Tcp {
                host: "localhost".into(),
                port: 4317
            }
        );
        assert_eq!(parse("").expect("empty"), TracingConfiguration::default());
        assert!(parse("samplingRatePerMillion: 5\n").is_ok());
    }

    #[test]
    fn what_kube_refuses_is_refused_in_its_words() {
        let cases = [
            (
                "apiVersion: apiserver.config.k8s.io/v2\nkind: TracingConfiguration\n",
                r#"failed to read tracing config: unable to decode tracing configuration data: no kind "TracingConfiguration" is registered for version "apiserver.config.k8s.io/v2""#,
            ),
            (
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AuditConfiguration\n",
                r#"no kind "AuditConfiguration" is registered for version "apiserver.config.k8s.io/v1""#,
            ),
            (
                "apiVersion: foo.io/v1\nkind: TracingConfiguration\n",
                r#"is registered for version "foo.io/v1""#,
            ),
            ("samplingRatePerMillion: 1\nfoo: 1\n", "unknown field `foo`"),
            ("samplingRatePerMillion: 1\nsamplingRatePerMillion: 2\n", "duplicate"),
            (
                "samplingRatePerMillion: -1\n",
                "failed to validate tracing configuration: samplingRatePerMillion: Invalid value: -1: sampling rate must be positive",
            ),
            (
                "samplingRatePerMillion: 2000000\nendpoint: http://foo:4317\n",
                r#"failed to validate tracing configuration: [samplingRatePerMillion: Invalid value: 2000000: sampling rate per million must be less than or equal to one million, endpoint: Invalid value: "http://foo:4317": unsupported scheme: http.  Options are none, dns, unix, or unix-abstract.  See https://github.com/grpc/grpc/blob/master/doc/naming.md]"#,
            ),
            ("endpoint: foo bar:1\n", r#"endpoint: Invalid value: "dns://foo bar:1": parse "dns://foo bar:1": "#),
            ("samplingRatePerMillion: 99999999999\n", "unable to decode tracing configuration data"),
            ("samplingRatePerMillion: x\n", "unable to decode tracing configuration data"),
        ];
        for (text, want) in cases {
            let got = parse(text).expect_err(text);
            assert!(got.contains(want), "{text:?}:\n got {got}\nwant {want}");
        }
    }

    #[test]
    fn endpoints_name_grpc_targets() {
        let t = |e: &str| target(e);
        assert_eq!(
            t("collector:4317"),
            Ok(Target::Tcp {
                host: "collector".into(),
                port: 4317
            })
        );
        assert_eq!(
            t("collector"),
            Ok(Target::Tcp {
                host: "collector".into(),
                port: 443
            })
        );
        assert_eq!(
            t("dns:///collector:55680"),
            Ok(Target::Tcp {
                host: "collector".into(),
                port: 55680
            })
        );
        assert_eq!(
            t("dns://8.8.8.8/collector:1"),
            Ok(Target::Tcp {
                host: "collector".into(),
                port: 1
            })
        );
        assert_eq!(
            t("[::1]:4317"),
            Ok(Target::Tcp {
                host: "[::1]".into(),
                port: 4317
            })
        );
        assert_eq!(
            t("unix:///run/otel.sock"),
            Ok(Target::Unix("/run/otel.sock".into()))
        );
        assert_eq!(
            t("unix-abstract://otel"),
            Ok(Target::UnixAbstract("otel".into()))
        );
        assert!(t("collector:http").is_err());
        assert!(t("unix://relative/path").is_err());
        assert!(t("https://collector:4317").is_err());
    }

    #[test]
    fn a_rate_samples_that_share_of_roots_and_follows_parents() {
        let c = |r| TracingConfiguration {
            sampling_rate_per_million: r,
            ..Default::default()
        };
        assert!(matches!(c(None).sampler(), Sampler::ParentBased(_)));
        let dbg = |s: Sampler| format!("{s:?}");
        assert!(dbg(c(None).sampler()).contains("AlwaysOff"));
        assert!(dbg(c(Some(0)).sampler()).contains("AlwaysOff"));
        assert!(dbg(c(Some(250_000)).sampler()).contains("TraceIdRatioBased(0.25)"));
    }

    #[test]
    fn traceparent_is_read_and_malformed_ones_are_not() {
        let mut h = http::HeaderMap::new();
        assert!(extract(&h).is_none());
        h.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        let sc = extract(&h).expect("span context");
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(sc.span_id().to_string(), "b7ad6b7169203331");
        assert!(sc.is_sampled() && sc.is_remote());
        h.insert(
            "traceparent",
            http::HeaderValue::from_static("00-zz-b7ad6b7169203331-01"),
        );
        assert!(extract(&h).is_none());
    }
}
