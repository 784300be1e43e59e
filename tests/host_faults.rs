//! kshard behind a host that FAILS, played by the HOST DOUBLE
//! (`common::host_double`): a real kube-apiserver cannot be made to answer
//! 500 or 503 to one kind of request, hang a SubjectAccessReview, or drop
//! every connection and come back on the same address while a test runs.
//! Everything a working host shows is tested against the real one
//! (`tests/real_host.rs`, `tests/aggregation.rs`).
//!
//! kshard is reached straight, with a front-proxy certificate of the
//! double's CA (as kube-aggregator reaches it) or with a bearer token the
//! double reviews.

mod common;

use common::send;

use std::time::{Duration, Instant};

use common::host_double::{Fault, HostDouble, User};
use serde_json::Value;

const SAR: &str = "/apis/authorization.k8s.io/";
const TOKEN_REVIEW: &str = "/apis/authentication.k8s.io/";

struct Setup {
    host: HostDouble,
    _kshard: common::TestServer,
    /// As kube-aggregator: the front-proxy certificate (CN front-proxy-client).
    aggregator: kube::Client,
    /// Straight at kshard with alice's bearer token.
    alice_token: kube::Client,
    /// Straight at kshard, anonymous (for the probes).
    anonymous: kube::Client,
    _dir: tempfile::TempDir,
}

/// kshard behind the double, allowing alice widgets in `default`; reviews
/// cached for 1 s so a fault shows at once.
async fn setup(tune: impl FnOnce(&mut kshard::server::ServeConfig)) -> Setup {
    let dir = tempfile::tempdir().expect("tmp");
    let host = HostDouble::start(dir.path()).await;
    host.state.set_policy(alice_policy);
    host.state
        .add_token("alice-token", User::new("alice", &["devs"]));
    let hk = host.kubeconfig.clone();
    let kshard = common::start_with(move |c| {
        c.host_kubeconfig = Some(hk);
        c.authorization_allow_ttl = Duration::from_secs(1);
        c.authorization_deny_ttl = Duration::from_secs(1);
        c.token_cache_ttl = Duration::from_secs(1);
        tune(c);
    })
    .await;
    let ca = kshard_ca(&kshard);
    let server = format!("https://{}", kshard.running.addr);
    let kubeconfig = |name: &str, token: Option<&str>, cert: Option<&(String, String)>| {
        let path = dir.path().join(format!("{name}.kubeconfig"));
        common::tls::write_kubeconfig(&path, &server, &ca, token, cert);
        path
    };
    let proxy = host.front_proxy_ca.client("front-proxy-client", &[]);
    let aggregator = common::client_for(&kubeconfig("aggregator", None, Some(&proxy))).await;
    let alice_token = common::client_for(&kubeconfig("alice", Some("alice-token"), None)).await;
    let anonymous = common::client_for(&kubeconfig("anonymous", None, None)).await;
    let s = Setup {
        host,
        _kshard: kshard,
        aggregator,
        alice_token,
        anonymous,
        _dir: dir,
    };
    common::eventually("kshard ready behind the double", || async {
        send(&s.anonymous, "GET", "/readyz", &[], None).await.0 == 200
    })
    .await;
    s
}

fn kshard_ca(kshard: &common::TestServer) -> String {
    std::fs::read_to_string(
        kshard
            .running
            .kubeconfig
            .with_file_name("pki")
            .join("ca.crt"),
    )
    .expect("kshard ca")
}

fn alice_policy(spec: &Value) -> (bool, String) {
    let ra = &spec["resourceAttributes"];
    let ok = spec["user"] == "alice" && ra["resource"] == "widgets" && ra["namespace"] == "default";
    (ok, String::new())
}

const ALICE: [(&str, &str); 2] = [("x-remote-user", "alice"), ("x-remote-group", "devs")];
const MASTER: [(&str, &str); 2] = [
    ("x-remote-user", "carol"),
    ("x-remote-group", "system:masters"),
];

impl Setup {
    /// alice's list through the front proxy (a SubjectAccessReview) and
    /// with her token (a TokenReview, then one): the two codes.
    async fn alice(&self) -> (u16, u16) {
        let proxied = send(&self.aggregator, "GET", common::WIDGETS, &ALICE, None).await;
        let token = send(&self.alice_token, "GET", common::WIDGETS, &[], None).await;
        (proxied.0, token.0)
    }

    /// Waits until alice's two requests get these codes.
    async fn alice_gets(&self, want: (u16, u16), what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.alice().await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: alice got {got:?}, wanted {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A request that needs no review (system:masters) is served, and quickly.
    async fn masters_are_served(&self) {
        let start = Instant::now();
        let (code, _, body) = send(&self.aggregator, "GET", common::WIDGETS, &MASTER, None).await;
        assert_eq!(code, 200, "{body}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a request needing no review took {:?}",
            start.elapsed()
        );
    }
}

/// The host answering errors, then gone: kshard fails closed — a request
/// it cannot have reviewed is refused (500 for an authorization it could
/// not ask, as kube's delegating authorizer; 401 for a token it could not
/// check, as kube's token authenticator) at once, not after a wait;
/// requests that need no review go on; and it recovers by itself when the
/// host works again or comes back.
#[tokio::test(flavor = "multi_thread")]
async fn reviews_fail_closed_while_the_host_fails_or_is_down() {
    let s = setup(|_| {}).await;
    s.alice_gets((200, 200), "a working host").await;

    // 500 from the host's review APIs (an overloaded or broken API server).
    s.host.state.fail(SAR, Fault::Status(500));
    s.host.state.fail(TOKEN_REVIEW, Fault::Status(500));
    s.alice_gets((500, 401), "reviews answered 500").await;
    let (code, _, body) = send(&s.aggregator, "GET", common::WIDGETS, &ALICE, None).await;
    assert_eq!(code, 500, "{body}");
    let status: Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(status["reason"], "InternalError", "{body}");
    s.masters_are_served().await;
    let (code, _, body) = send(&s.anonymous, "GET", "/readyz", &[], None).await;
    assert_eq!(
        code, 200,
        "failing reviews do not make kshard unready: {body}"
    );
    s.host.state.heal();
    s.alice_gets((200, 200), "the host healed").await;

    // The host goes down: connection refused, every open connection cut.
    s.host.go_down();
    s.alice_gets((500, 401), "the host down").await;
    let start = Instant::now();
    let (code, _, _) = send(&s.aggregator, "GET", common::WIDGETS, &ALICE, None).await;
    assert_eq!(code, 500);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a refused connection took {:?} to fail",
        start.elapsed()
    );
    s.masters_are_served().await;
    let (code, _, _) = send(&s.anonymous, "GET", "/livez", &[], None).await;
    assert_eq!(code, 200);
    s.host.come_back().await;
    s.alice_gets((200, 200), "the host back").await;
}

/// A host that stops answering reviews (hung, not refusing): a request
/// waiting on its review ends at kshard's request deadline with kube's 504,
/// and meanwhile requests that need no review are served at once.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_review_ends_at_the_request_deadline_and_holds_up_no_one_else() {
    let deadline = Duration::from_secs(3);
    let s = setup(|c| c.connections.request_timeout = deadline).await;
    s.alice_gets((200, 200), "a working host").await;
    s.host
        .state
        .fail(SAR, Fault::Delay(Duration::from_secs(3600)));
    s.host
        .state
        .fail(TOKEN_REVIEW, Fault::Delay(Duration::from_secs(3600)));
    // Past the cached answers' 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let start = Instant::now();
    let hung = async {
        let (a, b) = s.alice().await;
        (a, b, start.elapsed())
    };
    let others = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.masters_are_served().await;
    };
    let ((proxied, token, took), ()) = tokio::join!(hung, others);
    assert_eq!((proxied, token), (504, 504));
    // The two ran one after the other, each to its deadline.
    assert!(
        took >= deadline * 2 && took < deadline * 2 + Duration::from_secs(6),
        "{took:?}"
    );
    let (code, _, body) = send(&s.aggregator, "GET", common::WIDGETS, &ALICE, None).await;
    assert_eq!(code, 504);
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("a Status")["reason"],
        "Timeout",
        "{body}"
    );
    s.host.state.heal();
    s.alice_gets((200, 200), "the host answering again").await;
}

/// While the host answers 503 for the authentication ConfigMap, kshard is
/// alive but not ready (it cannot know whom to trust as a front proxy), and
/// says which check fails without the reason; once the host answers, it
/// becomes ready without a restart. (The real host's version of this, the
/// ConfigMap not readable under RBAC, is in `tests/aggregation.rs`.)
#[tokio::test(flavor = "multi_thread")]
async fn readiness_waits_while_the_host_fails_the_authentication_configmap() {
    let dir = tempfile::tempdir().expect("tmp");
    let host = HostDouble::start(dir.path()).await;
    host.state.fail(
        "/api/v1/namespaces/kube-system/configmaps",
        Fault::Status(503),
    );
    let hk = host.kubeconfig.clone();
    let kshard = common::start_with(move |c| c.host_kubeconfig = Some(hk)).await;
    // /readyz is anonymous-accessible; the dev kubeconfig's certificate is not trusted here.
    let kc = dir.path().join("anon.kubeconfig");
    common::tls::write_kubeconfig(
        &kc,
        &format!("https://{}", kshard.running.addr),
        &kshard_ca(&kshard),
        None,
        None,
    );
    let anon = common::client_for(&kc).await;
    let (code, _, body) = send(&anon, "GET", "/readyz", &[], None).await;
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("[-]authentication-config failed: reason withheld"),
        "{body}"
    );
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    let (code, _, _) = send(&anon, "GET", "/livez", &[], None).await;
    assert_eq!(code, 200, "liveness is not readiness");

    host.state.heal();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _, body) = send(&anon, "GET", "/readyz?verbose", &[], None).await;
        if code == 200 {
            assert!(body.contains("[+]authentication-config ok"), "{body}");
            assert!(body.contains("[+]namespace-informer-sync ok"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A review the host never answers is given up after 10 s (kube's delegating
/// authenticator and authorizer client timeout), long before the request's
/// own deadline: the proxied request is a 500 (authorization failed), the
/// token request a 401, and both free their seats.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_review_is_given_up_after_ten_seconds() {
    let s = setup(|c| c.connections.request_timeout = Duration::from_secs(60)).await;
    s.alice_gets((200, 200), "a working host").await;
    s.host
        .state
        .fail(SAR, Fault::Delay(Duration::from_secs(3600)));
    s.host
        .state
        .fail(TOKEN_REVIEW, Fault::Delay(Duration::from_secs(3600)));
    // Past the cached answers' 1 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let start = Instant::now();
    let (proxied, token) = s.alice().await;
    let took = start.elapsed();
    assert_eq!((proxied, token), (500, 401));
    // The two ran one after the other, each to the review timeout.
    assert!(
        took >= Duration::from_secs(20) && took < Duration::from_secs(40),
        "{took:?}"
    );
    s.host.state.heal();
    s.alice_gets((200, 200), "the host answering again").await;
}
