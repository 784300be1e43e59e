//! `--tracing-config-file`: the real kshard binary exports its spans over
//! OTLP gRPC to a collector in the test (opentelemetry-proto's
//! `TraceService` on tonic, on loopback: the wire protocol a real collector
//! speaks), following the caller's W3C `traceparent` as kube-apiserver does;
//! behind the real kube-apiserver, its spans continue the aggregator's trace.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::real_host::{poll, RealHost, ADMIN_TOKEN, ALICE};
use common::until;
use common::webhook::{Reply, WebhookServer};
use common::WIDGETS;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{json, Value};

/// How long a test waits for spans on a loaded machine (the exporters send
/// every 100 ms here, kube-apiserver's every 5 s).
const PATIENCE: Duration = Duration::from_secs(60);

/// One span as received, with the `service.name` of its resource.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    fn id(&self) -> String {
        hex(&self.span.span_id)
    }
    fn parent(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    fn attr(&self, key: &str) -> Option<String> {
        let v = self.span.attributes.iter().find(|kv| kv.key == key)?;
        Some(match v.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => s.clone(),
            any_value::Value::IntValue(i) => i.to_string(),
            any_value::Value::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP trace collector: every span every exporter sent it.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("spans");
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    any_value::Value::StringValue(s) => s.clone(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Serves on a loopback port; returns the `host:port` an exporter dials.
    async fn start() -> (Self, String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await;
        });
        (collector, addr.to_string(), task)
    }

    fn spans(&self) -> Vec<Received> {
        self.0.lock().expect("spans").clone()
    }

    fn of_trace(&self, trace_id: &str) -> Vec<Received> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id() == trace_id)
            .collect()
    }

    /// Waits until `trace_id` has spans named `names` (each at least once).
    async fn wait_for(&self, trace_id: &str, names: &[&str]) -> Vec<Received> {
        let mut last = Vec::new();
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                last = self.of_trace(trace_id);
                if names.iter().all(|n| last.iter().any(|s| s.span.name == *n)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            found.is_ok(),
            "trace {trace_id} never had spans {names:?}; it has {:#?}",
            last.iter()
                .map(|s| (&s.service, &s.span.name))
                .collect::<Vec<_>>()
        );
        last
    }
}

/// A tracing configuration file in `dir`.
fn config(dir: &Path, text: &str) -> String {
    let path = dir.join("tracing.yaml");
    std::fs::write(&path, text).expect("write config");
    path.display().to_string()
}

fn by_name<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans
        .iter()
        .find(|s| s.span.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} among {spans:#?}"))
}

/// `traceparent` for a sampled caller span.
fn traceparent(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// An anonymous request straight at a spawned kshard (standalone on
/// loopback, anonymous may do anything, but is in no privileged group).
async fn anonymous(data: &Path, uri: &str, headers: &[(&str, &str)]) -> u16 {
    let tls = common::connect_to(data, &[b"http/1.1"]).await;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let mut b = http::Request::get(uri).header("host", "localhost");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = sender
        .send_request(
            b.body(http_body_util::Empty::<bytes::Bytes>::new())
                .expect("request"),
        )
        .await
        .expect("response");
    resp.status().as_u16()
}

/// A privileged caller's `traceparent` is followed (the server span is its
/// child, in its trace), and the request's layers, its handler, its storage
/// commit and its admission webhook call are spans of that trace; the
/// webhook receives the trace in its own `traceparent`. An anonymous
/// caller's context starts a new trace linked to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_traced_create_has_its_layers_admission_and_commit_in_the_callers_trace() {
    let (collector, endpoint, _task) = Collector::start().await;
    let hooks = WebhookServer::start().await;
    hooks.handle("/mutate", |r| {
        Reply::patch(
            r,
            json!([{"op": "add", "path": "/metadata/labels", "value": {"seen": "yes"}}]),
        )
    });
    let dir = tempfile::tempdir().expect("tmp");
    let file = config(
        dir.path(),
        &format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {endpoint}\nsamplingRatePerMillion: 1000000\n"
        ),
    );
    let data = dir.path().join("data");
    let resolve = format!("hooks.test.svc:443={}", hooks.addr);
    let _kshard = common::spawn_kshard_with(
        &data,
        &[
            "--tracing-config-file",
            &file,
            "--admission-webhook-resolve",
            &resolve,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let client = common::client_for(&data.join("kubeconfig")).await;
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "labels"},
        "webhooks": [hooks.webhook("labels.kshard.dev", "/mutate")],
    });
    let (code, _, body) = common::send(
        &client,
        "POST",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        &[],
        Some(&mutating),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    // The configuration is followed through a watch: wait until it is used.
    until("the webhook to be called", PATIENCE, || async {
        common::send(
            &client,
            "POST",
            &format!("{WIDGETS}?dryRun=All"),
            &[],
            Some(&common::widget("probe", 1)),
        )
        .await;
        (!hooks.received("/mutate").is_empty()).then_some(())
    })
    .await;
    hooks.take("/mutate");

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let (code, _, body) = common::send(
        &client,
        "POST",
        WIDGETS,
        &[("traceparent", &traceparent(trace_id, caller))],
        Some(&common::widget("w1", 1)),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let spans = collector
        .wait_for(
            trace_id,
            &[
                "POST /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets",
                "authentication",
                "read request body",
                "audit",
                "impersonation",
                "priorityandfairness",
                "authorization",
                "Create",
                "mutating admission",
                "Call mutating webhook",
                "HTTP POST",
                "validating admission",
                "storage commit",
            ],
        )
        .await;
    assert!(spans.iter().all(|s| s.service == "kshard"), "{spans:#?}");

    // The server span is the caller's span's child.
    let server = by_name(
        &spans,
        "POST /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets",
    );
    assert_eq!(server.parent(), caller);
    assert_eq!(server.span.kind, SpanKind::Server as i32);
    assert_eq!(
        server.attr("http.response.status_code").as_deref(),
        Some("201")
    );
    assert_eq!(
        server.attr("http.target").as_deref(),
        Some("/apis/demo.kshard.dev/v1/namespaces/default/widgets")
    );
    assert!(server.attr("audit-id").is_some_and(|a| !a.is_empty()));
    // The layers, in kube's order, each a child of the server span and
    // within it.
    let steps = [
        "authentication",
        "read request body",
        "audit",
        "impersonation",
        "priorityandfairness",
        "authorization",
        "Create",
    ];
    let mut previous_start = server.span.start_time_unix_nano;
    for step in steps {
        let s = by_name(&spans, step);
        assert_eq!(s.parent(), server.id(), "{step}");
        assert!(
            s.span.start_time_unix_nano >= previous_start,
            "{step} starts before the step ahead of it"
        );
        assert!(
            s.span.end_time_unix_nano <= server.span.end_time_unix_nano,
            "{step}"
        );
        previous_start = s.span.start_time_unix_nano;
    }
    assert_eq!(
        by_name(&spans, "authorization").attr("decision").as_deref(),
        Some("allow")
    );
    // The handler holds admission and the commit.
    let create = by_name(&spans, "Create");
    let mutating = by_name(&spans, "mutating admission");
    assert_eq!(mutating.parent(), create.id());
    assert_eq!(
        by_name(&spans, "validating admission").parent(),
        create.id()
    );
    let commit = by_name(&spans, "storage commit");
    assert_eq!(commit.parent(), create.id());
    assert_eq!(commit.attr("operation").as_deref(), Some("create"));
    assert!(commit
        .attr("key")
        .is_some_and(|k| k.contains("widgets") && k.contains("w1")));
    assert!(commit.attr("revision").is_some());
    // The webhook call: kube's span, the POST inside it, and the webhook
    // got the POST's span as its parent.
    let call = by_name(&spans, "Call mutating webhook");
    assert_eq!(call.parent(), mutating.id());
    assert_eq!(call.attr("webhook").as_deref(), Some("labels.kshard.dev"));
    assert_eq!(call.attr("configuration").as_deref(), Some("labels"));
    assert_eq!(call.attr("operation").as_deref(), Some("CREATE"));
    let post = by_name(&spans, "HTTP POST");
    assert_eq!(post.parent(), call.id());
    assert_eq!(post.span.kind, SpanKind::Client as i32);
    assert_eq!(
        post.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    let sent = hooks.take("/mutate");
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].traceparent.as_deref(),
        Some(traceparent(trace_id, &post.id()).as_str()),
        "the webhook's traceparent"
    );

    // An anonymous caller's context is not followed: a new trace, linked.
    let stranger_trace = "0af7651916cd43dd8448eb211c80319c";
    let stranger = "b7ad6b7169203331";
    let code = anonymous(
        &data,
        WIDGETS,
        &[("traceparent", &traceparent(stranger_trace, stranger))],
    )
    .await;
    assert_eq!(code, 200);
    let mut linked = None;
    let _ = tokio::time::timeout(PATIENCE, async {
        loop {
            linked = collector.spans().into_iter().find(|s| {
                s.span
                    .links
                    .iter()
                    .any(|l| hex(&l.trace_id) == stranger_trace && hex(&l.span_id) == stranger)
            });
            if linked.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let linked = linked.expect("a span linked to the anonymous caller's");
    assert_eq!(
        linked.span.name,
        "GET /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets"
    );
    assert_ne!(linked.trace_id(), stranger_trace);
    assert!(linked.parent().is_empty() || linked.parent() == "0000000000000000");
    assert!(collector.of_trace(stranger_trace).is_empty());
}

/// At `samplingRatePerMillion: 0` (kube's default) only what a trusted
/// caller sampled is exported: a request without a parent is not, nor one
/// whose sampled `traceparent` comes from an anonymous caller.
#[tokio::test(flavor = "multi_thread")]
async fn at_rate_zero_only_a_trusted_callers_sampled_requests_are_exported() {
    let (collector, endpoint, _task) = Collector::start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = config(
        dir.path(),
        &format!("apiVersion: apiserver.config.k8s.io/v1beta1\nkind: TracingConfiguration\nendpoint: dns:///{endpoint}\n"),
    );
    let data = dir.path().join("data");
    let _kshard = common::spawn_kshard_with(
        &data,
        &["--tracing-config-file", &file],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let client = common::client_for(&data.join("kubeconfig")).await;
    // No parent, and an anonymous caller's sampled context: not exported.
    let (code, _, body) = common::send(&client, "GET", WIDGETS, &[], None).await;
    assert_eq!(code, 200, "{body}");
    let stranger_trace = "0af7651916cd43dd8448eb211c80319c";
    let code = anonymous(
        &data,
        WIDGETS,
        &[(
            "traceparent",
            &traceparent(stranger_trace, "b7ad6b7169203331"),
        )],
    )
    .await;
    assert_eq!(code, 200);
    // The admin's sampled request is: once its spans are in, every span
    // exported before them has arrived too.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (code, _, body) = common::send(
        &client,
        "GET",
        WIDGETS,
        &[("traceparent", &traceparent(trace_id, "00f067aa0ba902b7"))],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let spans = collector
        .wait_for(
            trace_id,
            &[
                "GET /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets",
                "List",
            ],
        )
        .await;
    assert_eq!(
        by_name(
            &spans,
            "GET /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets"
        )
        .parent(),
        "00f067aa0ba902b7"
    );
    // A caller's unsampled context is followed too, and not exported.
    let unsampled = "11111111111111111111111111111111";
    let (code, _, _) = common::send(
        &client,
        "GET",
        WIDGETS,
        &[(
            "traceparent",
            &format!("00-{unsampled}-00f067aa0ba902b7-00"),
        )],
        None,
    )
    .await;
    assert_eq!(code, 200);
    let last = "22222222222222222222222222222222";
    common::send(
        &client,
        "GET",
        WIDGETS,
        &[("traceparent", &traceparent(last, "00f067aa0ba902b7"))],
        None,
    )
    .await;
    collector.wait_for(last, &["List"]).await;
    let others: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id() != trace_id && s.trace_id() != last)
        .map(|s| (s.trace_id(), s.span.name))
        .collect();
    assert!(
        others.is_empty(),
        "exported without a sampled parent: {others:?}"
    );
}

/// A file kube-apiserver refuses stops kshard at start with kube's words;
/// nothing is served.
#[test]
fn an_invalid_tracing_configuration_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let cases = [
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: 2000000\nendpoint: http://collector:4317\n",
            "failed to validate tracing configuration: [samplingRatePerMillion: Invalid value: 2000000: sampling rate per million must be less than or equal to one million, endpoint: Invalid value: \"http://collector:4317\": unsupported scheme: http.",
        ),
        (
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRate: 5\n",
            "failed to read tracing config: unable to decode tracing configuration data: unknown field `samplingRate`",
        ),
        (
            "apiVersion: apiserver.config.k8s.io/v2\nkind: TracingConfiguration\n",
            "no kind \"TracingConfiguration\" is registered for version \"apiserver.config.k8s.io/v2\"",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("tracing-{i}.yaml"));
        std::fs::write(&file, text).expect("write");
        let out = refused(dir.path(), &file.display().to_string());
        assert!(out.contains(want), "{text}\n--- stderr:\n{out}");
        assert!(out.contains("--tracing-config-file"), "{out}");
    }
    let missing = dir.path().join("nowhere.yaml").display().to_string();
    let out = refused(dir.path(), &missing);
    assert!(
        out.contains(&format!(
            "failed to read tracing config: unable to read tracing configuration from \"{missing}\""
        )),
        "{out}"
    );
}

/// Runs `kshard serve` with `file`; it must exit unsuccessfully, without
/// serving. Returns its stderr.
fn refused(dir: &Path, file: &str) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tracing-config-file",
            file,
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kshard");
    let exited = poll(Duration::from_secs(30), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    assert!(
        exited && !out.status.success(),
        "kshard did not refuse {file}"
    );
    assert!(
        out.stdout.is_empty(),
        "it served: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Behind the real kube-apiserver, tracing too: the aggregator's proxy
/// sends its span as `traceparent`, and kshard's spans continue that trace
/// (kshard follows the front proxy, which can name any user, so it is
/// trusted as kube trusts `system:masters`), even at rate 0 and for a user
/// whose own context neither server follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_the_host_kshards_spans_continue_the_aggregators_trace() {
    let (collector, endpoint, _task) = Collector::start().await;
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(dir.path().join("cfg")).expect("dir");
    let host_file = config(
        &dir.path().join("cfg"),
        &format!("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {endpoint}\nsamplingRatePerMillion: 1000000\n"),
    );
    let host = RealHost::start_with(dir.path(), &[format!("--tracing-config-file={host_file}")]);
    let kshard_file = dir.path().join("kshard-tracing.yaml");
    std::fs::write(
        &kshard_file,
        format!("apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: {endpoint}\nsamplingRatePerMillion: 0\n"),
    )
    .expect("write");
    let kshard =
        host.install_kshard(&[&format!("--tracing-config-file={}", kshard_file.display())]);
    host.kubectl_ok(&["create", "namespace", "team-a"]);
    host.kubectl_ok(&[
        "create",
        "role",
        "widget-reader",
        "-n",
        "team-a",
        "--verb=get,list,watch",
        "--resource=widgets.demo.kshard.dev",
    ]);
    host.kubectl_ok(&[
        "create",
        "rolebinding",
        "devs-read",
        "-n",
        "team-a",
        "--role=widget-reader",
        "--group=devs",
    ]);
    let list = "/apis/demo.kshard.dev/v1/namespaces/team-a/widgets";
    let kshard_server_span = "GET /apis/demo.kshard.dev/v1/namespaces/{:namespace}/widgets";

    // The admin (system:masters): the host follows its context, kshard the host's.
    let admin = common::client_for(&host.kubeconfig_for(ADMIN_TOKEN)).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller = "00f067aa0ba902b7";
    let (code, _, body) = common::send(
        &admin,
        "GET",
        list,
        &[("traceparent", &traceparent(trace_id, caller))],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}\n{}", kshard.log_tail());
    let mut spans = collector
        .wait_for(trace_id, &[kshard_server_span, "List"])
        .await;
    // The host exports its spans on a timer of its own: wait for the proxy's
    // span (the parent of kshard's) and the host's server span too.
    let complete = |spans: &[Received]| {
        let ours = spans
            .iter()
            .find(|s| s.service == "kshard" && s.span.name == kshard_server_span);
        let host =
            |f: &dyn Fn(&Received) -> bool| spans.iter().any(|s| s.service != "kshard" && f(s));
        ours.is_some_and(|o| host(&|h| h.id() == o.parent())) && host(&|h| h.parent() == caller)
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    while !complete(&spans) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        spans = collector.of_trace(trace_id);
    }
    let host_spans: HashMap<String, &Received> = spans
        .iter()
        .filter(|s| s.service != "kshard")
        .map(|s| (s.id(), s))
        .collect();
    let ours = spans
        .iter()
        .find(|s| s.service == "kshard" && s.span.name == kshard_server_span)
        .expect("kshard's server span");
    let proxy = host_spans.get(&ours.parent()).unwrap_or_else(|| {
        panic!(
            "kshard's server span's parent {} is none of the host's spans: {:#?}",
            ours.parent(),
            spans
                .iter()
                .map(|s| (&s.service, &s.span.name, s.id(), s.parent()))
                .collect::<Vec<_>>()
        )
    });
    assert_eq!(proxy.span.kind, SpanKind::Client as i32, "{proxy:#?}");
    // The host's own server span is the admin caller's child.
    assert!(
        spans
            .iter()
            .any(|s| s.service != "kshard" && s.parent() == caller),
        "no host span is the caller's child"
    );

    // Alice (group devs): neither server follows her context; the host
    // starts its own trace (at its rate) and kshard continues it.
    let alice = common::client_for(&host.kubeconfig_for(ALICE.0)).await;
    let hers = "0af7651916cd43dd8448eb211c80319c";
    let (code, _, body) = common::send(
        &alice,
        "GET",
        list,
        &[("traceparent", &traceparent(hers, "b7ad6b7169203331"))],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let mut found = None;
    assert!(
        poll(PATIENCE, || {
            let all = collector.spans();
            found = all
                .iter()
                .find(|s| {
                    s.service == "kshard"
                        && s.span.name == kshard_server_span
                        && s.trace_id() != trace_id
                })
                .cloned()
                .map(|ours| {
                    let parent = all
                        .iter()
                        .find(|h| h.service != "kshard" && h.id() == ours.parent())
                        .cloned();
                    (ours, parent)
                });
            matches!(&found, Some((_, Some(_))))
        }),
        "kshard's span of alice's request, with the host's parent: {found:#?}"
    );
    let (ours, parent) = found.expect("found");
    assert_ne!(ours.trace_id(), hers, "alice chose the trace");
    assert_eq!(parent.expect("parent").trace_id(), ours.trace_id());
    assert!(collector.of_trace(hers).is_empty());
}

/// A conversion webhook's call is a span of the reading request's trace
/// (kube's `Call conversion webhook`, with the POST inside), and the
/// webhook receives the POST's span as `traceparent`.
#[tokio::test(flavor = "multi_thread")]
async fn a_conversion_webhook_call_is_in_the_readers_trace() {
    use base64::Engine as _;
    let (collector, endpoint, _task) = Collector::start().await;
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let recorded = seen.clone();
    let app = axum::Router::new().route(
        "/convert",
        axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let recorded = recorded.clone();
            async move {
                recorded.lock().expect("seen").push(
                    headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .map(String::from),
                );
                let review: Value = serde_json::from_slice(&body).unwrap_or_default();
                let req = &review["request"];
                let desired = req["desiredAPIVersion"].clone();
                let objects: Vec<Value> = req["objects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|o| {
                        let mut o = o.clone();
                        o["apiVersion"] = desired.clone();
                        o
                    })
                    .collect();
                let answer = json!({
                    "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                    "response": {"uid": req["uid"], "convertedObjects": objects,
                                 "result": {"status": "Success"}},
                });
                (
                    [(http::header::CONTENT_TYPE, "application/json")],
                    answer.to_string(),
                )
            }
        }),
    );
    let ca = common::tls::Ca::new("webhook-ca");
    let (addr, _hook) = common::tls::serve_https(&ca, &["127.0.0.1"], app).await;
    let dir = tempfile::tempdir().expect("tmp");
    let version = |name: &str, storage: bool| {
        format!(
            "\n  - name: {name}\n    served: true\n    storage: {storage}\n    schema:\n      openAPIV3Schema:\n        type: object\n        properties:\n          spec: {{type: object, properties: {{colour: {{type: string}}}}}}"
        )
    };
    let crd = format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: gadgets.gadgets.kshard.dev}}\nspec:\n  group: gadgets.kshard.dev\n  scope: Namespaced\n  names: {{plural: gadgets, singular: gadget, kind: Gadget}}\n  conversion:\n    strategy: Webhook\n    webhook:\n      conversionReviewVersions: [v1]\n      clientConfig:\n        url: https://127.0.0.1:{}/convert\n        caBundle: {}\n  versions:{}{}\n",
        addr.port(),
        base64::engine::general_purpose::STANDARD.encode(&ca.pem),
        version("v1", true),
        version("v2", false),
    );
    let crd_file = dir.path().join("gadgets.yaml");
    std::fs::write(&crd_file, crd).expect("crd");
    let file = config(
        dir.path(),
        &format!("endpoint: {endpoint}\nsamplingRatePerMillion: 1000000\n"),
    );
    let data = dir.path().join("data");
    let crds = crd_file.display().to_string();
    let _kshard = common::spawn_kshard_with(
        &data,
        &["--crds", &crds, "--tracing-config-file", &file],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let client = common::client_for(&data.join("kubeconfig")).await;
    let v1 = "/apis/gadgets.kshard.dev/v1/namespaces/default/gadgets";
    let gadget = json!({"apiVersion": "gadgets.kshard.dev/v1", "kind": "Gadget",
                        "metadata": {"name": "g1"}, "spec": {"colour": "red"}});
    let (code, _, body) = common::send(&client, "POST", v1, &[], Some(&gadget)).await;
    assert_eq!(code, 201, "{body}");
    seen.lock().expect("seen").clear();

    let trace_id = "5bf92f3577b34da6a3ce929d0e0e4736";
    let (code, _, body) = common::send(
        &client,
        "GET",
        "/apis/gadgets.kshard.dev/v2/namespaces/default/gadgets/g1",
        &[("traceparent", &traceparent(trace_id, "00f067aa0ba902b7"))],
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("gadgets.kshard.dev/v2"), "{body}");
    let spans = collector
        .wait_for(trace_id, &["Get", "Call conversion webhook", "HTTP POST"])
        .await;
    let call = by_name(&spans, "Call conversion webhook");
    assert_eq!(
        call.attr("desired-api-version").as_deref(),
        Some("gadgets.kshard.dev/v2")
    );
    assert_eq!(call.attr("object-count").as_deref(), Some("1"));
    // Under the handler's span, directly or through the read's steps.
    let ids: HashMap<String, &Received> = spans.iter().map(|s| (s.id(), s)).collect();
    let mut up = call.parent();
    let mut chain = Vec::new();
    while let Some(s) = ids.get(&up) {
        chain.push(s.span.name.clone());
        up = s.parent();
    }
    assert!(chain.contains(&"Get".to_string()), "{chain:?}");
    let post = by_name(&spans, "HTTP POST");
    assert_eq!(post.parent(), call.id());
    let sent = seen.lock().expect("seen").clone();
    assert!(
        sent.contains(&Some(traceparent(trace_id, &post.id()))),
        "the webhook's traceparent: {sent:?}, the POST span {}",
        post.id()
    );
}

/// Several replicas: a write a follower forwards continues its trace on
/// the leader (the leader's server span is the child of the follower's
/// `forward to leader` span, and the commit is the leader's).
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread")]
async fn a_write_forwarded_to_the_leader_continues_the_followers_trace() {
    use common::replicas::{shared_store, spawn_replica_with, wait_ready};
    let (collector, endpoint, _task) = Collector::start().await;
    let dir = tempfile::tempdir().expect("tmp");
    let file = config(
        dir.path(),
        &format!("endpoint: {endpoint}\nsamplingRatePerMillion: 1000000\n"),
    );
    let (_double, pd, shard) = shared_store();
    let flags = ["--tracing-config-file", file.as_str()];
    let replicas = [
        spawn_replica_with(dir.path(), "r0", &pd, &shard, &flags),
        spawn_replica_with(dir.path(), "r1", &pd, &shard, &flags),
    ];
    let mut clients = Vec::new();
    for r in &replicas {
        let c = r.client().await;
        wait_ready(&c, PATIENCE).await;
        clients.push(c);
    }
    // One of the two follows: a write through each, in its own trace.
    let traces = [
        "6bf92f3577b34da6a3ce929d0e0e4701",
        "6bf92f3577b34da6a3ce929d0e0e4702",
    ];
    let caller = "00f067aa0ba902b7";
    for (i, c) in clients.iter().enumerate() {
        let (code, _, body) = common::send(
            c,
            "POST",
            WIDGETS,
            &[("traceparent", &traceparent(traces[i], caller))],
            Some(&common::widget(&format!("w{i}"), 1)),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let mut forwarded = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, async {
        loop {
            forwarded = traces
                .iter()
                .map(|t| collector.of_trace(t))
                .find(|spans| {
                    ["forward to leader", "storage commit"]
                        .iter()
                        .all(|n| spans.iter().any(|s| s.span.name == *n))
                        && spans.iter().filter(|s| s.span.name == "Create").count() == 1
                        && spans
                            .iter()
                            .filter(|s| s.span.kind == SpanKind::Server as i32)
                            .count()
                            == 2
                })
                .unwrap_or_default();
            if !forwarded.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        !forwarded.is_empty(),
        "no forwarded write's trace: {:#?}",
        collector
            .spans()
            .iter()
            .map(|s| (s.trace_id(), s.span.name.clone()))
            .collect::<Vec<_>>()
    );
    let servers: Vec<&Received> = forwarded
        .iter()
        .filter(|s| s.span.kind == SpanKind::Server as i32)
        .collect();
    let follower = servers
        .iter()
        .find(|s| s.parent() == caller)
        .expect("the follower's server span, the caller's child");
    let forward = by_name(&forwarded, "forward to leader");
    assert_eq!(forward.parent(), follower.id());
    assert_eq!(forward.span.kind, SpanKind::Client as i32);
    let leader = servers
        .iter()
        .find(|s| s.parent() == forward.id())
        .expect("the leader's server span, the forward's child");
    let create = by_name(&forwarded, "Create");
    assert_eq!(create.parent(), leader.id());
    assert_eq!(by_name(&forwarded, "storage commit").parent(), create.id());
}
