//! The REAL HOST: Debian's etcd and the reference kube-apiserver v1.36.2
//! (`../shared/bin/kube-apiserver`, or `$KSHARD_KUBE_APISERVER`) on loopback,
//! with the PKI a cluster has: a client CA, a front-proxy CA and the
//! aggregator's proxy client certificate, service-account signing keys, RBAC,
//! and a token file with an administrator and two ordinary users.
//!
//! [`RealHost::install_kshard`] registers a kshard process the way the
//! shipped manifests do: the objects `kubectl kustomize manifests/base`
//! renders are applied to the host as they are, with only what an installer
//! fills in changed (the Service becomes an ExternalName for loopback, the
//! APIService gets the port and caBundle). kshard then talks to the host with
//! a token of its own ServiceAccount, so the shipped RBAC is what it has.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::tls::{write_kubeconfig, Ca};
use super::{kubectl_with, repo_path, run_blocking, KillOnDrop};

/// The namespace the shipped manifests install into.
pub const NAMESPACE: &str = "kshard-system";

/// Ordinary users of the host's token file: (token, name, groups).
pub const ALICE: (&str, &str, &str) = ("alice-token", "alice", "devs");
pub const BOB: (&str, &str, &str) = ("bob-token", "bob", "");
/// A user of the `tenant-a` group, which `manifests/flowcontrol` gives a
/// priority level of its own.
pub const CAROL: (&str, &str, &str) = ("carol-token", "carol", "tenant-a");
/// The host administrator's token (`admin`, in `system:masters`).
pub const ADMIN_TOKEN: &str = "admin-token";

/// The host's audit policy: TokenReviews and SubjectAccessReviews with
/// their request bodies, nothing else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create]
  resources:
  - group: authentication.k8s.io
    resources: [tokenreviews]
  - group: authorization.k8s.io
    resources: [subjectaccessreviews]
- level: None
";

/// A free loopback port (the listener is closed before it is used; a clash
/// with another process is possible but rare, and fails loudly).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn kube_apiserver_bin() -> PathBuf {
    let bin = std::env::var_os("KSHARD_KUBE_APISERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_path("../shared/bin/kube-apiserver"));
    assert!(
        bin.exists(),
        "the reference kube-apiserver is missing at {} (set KSHARD_KUBE_APISERVER)",
        bin.display()
    );
    bin
}

/// A child process whose output goes to a log file (read on failure).
fn spawn_logged(mut cmd: Command, log: &Path) -> KillOnDrop {
    let file = std::fs::File::create(log).expect("log file");
    let err = file.try_clone().expect("log file");
    cmd.stdout(Stdio::from(file)).stderr(Stdio::from(err));
    KillOnDrop(cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}")))
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub struct RealHost {
    pub dir: PathBuf,
    pub url: String,
    /// The CA that signed the host's serving certificate.
    pub ca: Ca,
    /// The front-proxy CA (`--requestheader-client-ca-file`).
    pub front_proxy_ca: Ca,
    /// A kubeconfig for the host's administrator (`admin`, `system:masters`).
    pub admin_kubeconfig: PathBuf,
    apiserver_log: PathBuf,
    audit_log: PathBuf,
    // Dropped in this order: the API server before its etcd.
    _apiserver: KillOnDrop,
    _etcd: KillOnDrop,
}

impl RealHost {
    /// Starts etcd and kube-apiserver in `dir` and waits until the host is ready.
    pub fn start(dir: &Path) -> RealHost {
        Self::start_with(dir, &[])
    }

    /// [`RealHost::start`] with more kube-apiserver flags.
    pub fn start_with(dir: &Path, extra: &[String]) -> RealHost {
        let dir = dir.join("host");
        std::fs::create_dir_all(dir.join("pki")).expect("host dir");
        let pki = dir.join("pki");
        let write = |name: &str, text: &str| {
            let p = pki.join(name);
            std::fs::write(&p, text).expect("pki file");
            p
        };

        let ca = Ca::new("host-ca");
        let front_proxy_ca = Ca::new("front-proxy-ca");
        let (serving_cert, serving_key) = ca.server(&["localhost", "127.0.0.1"]);
        let (proxy_cert, proxy_key) = front_proxy_ca.client("front-proxy-client", &[]);
        let sa_key = rcgen::KeyPair::generate().expect("service-account key");
        let ca_file = write("ca.crt", &ca.pem);
        let fp_ca_file = write("front-proxy-ca.crt", &front_proxy_ca.pem);
        let serving_cert = write("apiserver.crt", &serving_cert);
        let serving_key = write("apiserver.key", &serving_key);
        let proxy_cert = write("front-proxy-client.crt", &proxy_cert);
        let proxy_key = write("front-proxy-client.key", &proxy_key);
        let sa_pub = write("sa.pub", &sa_key.public_key_pem());
        let sa_priv = write("sa.key", &sa_key.serialize_pem());
        // The host audits the reviews it answers (only those), so a test can
        // count what kshard asks and for whom.
        let audit_policy = write("audit-policy.yaml", AUDIT_POLICY);
        let audit_log = dir.join("audit.log");
        let tokens = write(
            "tokens.csv",
            &[ALICE, BOB, CAROL].iter().fold(
                format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n"),
                |acc, (token, name, groups)| {
                    format!("{acc}{token},{name},{name}-uid,\"{groups}\"\n")
                },
            ),
        );

        for attempt in 0..3 {
            let etcd_port = free_port();
            let peer_port = free_port();
            let etcd_url = format!("http://127.0.0.1:{etcd_port}");
            let mut etcd = Command::new("etcd");
            etcd.arg("--data-dir")
                .arg(dir.join(format!("etcd-{attempt}")))
                .args(["--listen-client-urls", &etcd_url])
                .args(["--advertise-client-urls", &etcd_url])
                .args([
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                ])
                .args([
                    "--initial-cluster",
                    &format!("default=http://127.0.0.1:{peer_port}"),
                ])
                // The host's data is throwaway; fsync would only slow the tests.
                .arg("--unsafe-no-fsync");
            let etcd_log = dir.join("etcd.log");
            let mut etcd = spawn_logged(etcd, &etcd_log);

            let port = free_port();
            let mut kas = Command::new(kube_apiserver_bin());
            kas.args(["--etcd-servers", &etcd_url])
                .args(["--secure-port", &port.to_string()])
                .args(["--bind-address", "127.0.0.1"])
                .arg("--cert-dir")
                .arg(dir.join("certs"))
                .arg("--tls-cert-file")
                .arg(&serving_cert)
                .arg("--tls-private-key-file")
                .arg(&serving_key)
                .arg("--client-ca-file")
                .arg(&ca_file)
                .arg("--token-auth-file")
                .arg(&tokens)
                .args(["--authorization-mode", "RBAC"])
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .arg("--service-account-key-file")
                .arg(&sa_pub)
                .arg("--service-account-signing-key-file")
                .arg(&sa_priv)
                .args(["--service-cluster-ip-range", "10.96.0.0/16"])
                .arg("--requestheader-client-ca-file")
                .arg(&fp_ca_file)
                .args(["--requestheader-allowed-names", "front-proxy-client"])
                .args(["--requestheader-username-headers", "X-Remote-User"])
                .args(["--requestheader-group-headers", "X-Remote-Group"])
                .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
                .arg("--proxy-client-cert-file")
                .arg(&proxy_cert)
                .arg("--proxy-client-key-file")
                .arg(&proxy_key)
                .arg("--audit-policy-file")
                .arg(&audit_policy)
                .arg("--audit-log-path")
                .arg(&audit_log)
                .args(["--endpoint-reconciler-type", "none"])
                .arg("--enable-aggregator-routing=false")
                .args(extra);
            let apiserver_log = dir.join("kube-apiserver.log");
            let mut apiserver = spawn_logged(kas, &apiserver_log);

            let url = format!("https://127.0.0.1:{port}");
            let admin_kubeconfig = dir.join("admin.kubeconfig");
            write_kubeconfig(&admin_kubeconfig, &url, &ca.pem, Some(ADMIN_TOKEN), None);
            // A port picked free may be taken by another process before etcd or
            // kube-apiserver binds it: either then exits, and the host starts
            // again on other ports.
            let mut exited = false;
            let ready = poll(Duration::from_secs(90), || {
                exited = apiserver.0.try_wait().ok().flatten().is_some()
                    || etcd.0.try_wait().ok().flatten().is_some();
                exited
                    || kubectl_with(&admin_kubeconfig, &["get", "--raw", "/readyz"], None)
                        .status
                        .success()
            });
            if exited && attempt < 2 {
                eprintln!(
                    "the host exited at start (attempt {attempt}), starting again:\n{}\n{}",
                    tail(&apiserver_log),
                    tail(&etcd_log)
                );
                continue;
            }
            assert!(
                ready && !exited,
                "the host's /readyz never passed; kube-apiserver log:\n{}\netcd log:\n{}",
                tail(&apiserver_log),
                tail(&etcd_log)
            );
            return RealHost {
                dir,
                url,
                ca,
                front_proxy_ca,
                admin_kubeconfig,
                apiserver_log,
                audit_log: audit_log.clone(),
                _apiserver: apiserver,
                _etcd: etcd,
            };
        }
        unreachable!("the loop returns or panics on its last attempt")
    }

    /// Polls `ok` (a blocking check) until it holds; panics with the host's
    /// log tail after `limit`.
    pub fn wait_until(&self, what: &str, limit: Duration, ok: impl FnMut() -> bool) {
        if !poll(limit, ok) {
            panic!(
                "timed out after {limit:?} waiting for {what}; kube-apiserver log:\n{}",
                tail(&self.apiserver_log)
            );
        }
    }

    /// A file of the host's PKI (`front-proxy-ca.crt`,
    /// `front-proxy-client.crt`, ...); kube-apiserver reloads the CA and
    /// proxy client files when they change.
    pub fn pki(&self, name: &str) -> PathBuf {
        self.dir.join("pki").join(name)
    }

    /// The aggregator's client certificate and key (PEM; CN
    /// `front-proxy-client`), as kube-apiserver presents them to kshard now:
    /// to speak to kshard straight as the aggregator does.
    pub fn proxy_client_cert(&self) -> (String, String) {
        let read = |n: &str| std::fs::read_to_string(self.pki(n)).expect("proxy client file");
        (
            read("front-proxy-client.crt"),
            read("front-proxy-client.key"),
        )
    }

    /// The specs of the reviews (`tokenreviews` or `subjectaccessreviews`)
    /// the host has answered so far, from its audit log, in order.
    pub fn reviews(&self, resource: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["objectRef"]["resource"] == resource)
            .map(|e| e["requestObject"]["spec"].clone())
            .collect()
    }

    /// A kubeconfig for the host with a bearer token.
    pub fn kubeconfig_for(&self, token: &str) -> PathBuf {
        let path = self
            .dir
            .join(format!("{}.kubeconfig", token.replace(':', "_")));
        write_kubeconfig(&path, &self.url, &self.ca.pem, Some(token), None);
        path
    }

    /// kubectl against the host as its administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_with(&self.admin_kubeconfig, args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        kubectl_with(&self.admin_kubeconfig, args, Some(stdin))
    }

    /// `kubectl create -f -` of `manifest` through the host, retried for up
    /// to `limit` while the host is not yet serving it (its aggregator's
    /// discovery lags a backend's start) or an admission step still refuses
    /// it. An `AlreadyExists` counts as created: an earlier attempt's reply
    /// was lost. Returns the last attempt's stderr when it never succeeded.
    pub fn create_until_accepted(&self, manifest: &str, limit: Duration) -> Result<(), String> {
        let mut last = String::new();
        let created = poll(limit, || {
            let out = self.kubectl_stdin(&["create", "-f", "-"], manifest);
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            out.status.success() || last.contains("AlreadyExists")
        });
        if created {
            Ok(())
        } else {
            Err(last)
        }
    }

    /// kubectl as the administrator; panics with its stderr on failure.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        super::kubectl_ok_with(&self.admin_kubeconfig, args)
    }

    /// Applies JSON objects to the host (client-side apply, as an installer's
    /// `kubectl apply -f` does).
    pub fn apply(&self, objects: &[Value]) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let out = self.kubectl_stdin(&["apply", "-f", "-"], &list.to_string());
        assert!(
            out.status.success(),
            "kubectl apply to the host: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A token for a ServiceAccount, from the host's TokenRequest API.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.kubectl_ok(&["create", "token", name, "-n", namespace, "--duration=4h"])
            .trim()
            .to_string()
    }

    /// The kube-apiserver's and etcd's process ids (a benchmark reads their CPU).
    pub fn pids(&self) -> (u32, u32) {
        (self._apiserver.id(), self._etcd.id())
    }

    /// kube-rs client for the host as its administrator.
    pub async fn client(&self) -> kube::Client {
        super::client_for(&self.admin_kubeconfig).await
    }
}

/// `kubectl kustomize DIR`, parsed into objects.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("kustomize").arg(dir);
    let out = run_blocking(cmd, None);
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Polls `ok` every 250 ms until it holds (true) or `limit` passes (false).
pub fn poll(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    false
}

fn kind_of(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

/// A kshard process installed into a [`RealHost`] from the shipped manifests.
pub struct Installed {
    pub port: u16,
    pub data_dir: PathBuf,
    /// kshard's own CA (the APIService caBundle) and serving certificate files.
    pub ca: Ca,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// kshard's kubeconfig for the host: its ServiceAccount's token.
    pub host_kubeconfig: PathBuf,
    pub args: Vec<String>,
    pub log: PathBuf,
    pub process: Option<KillOnDrop>,
}

impl Installed {
    /// Restarts the kshard process with the same flags, data and port.
    pub fn restart(&mut self) {
        self.process = None;
        self.process = Some(spawn_kshard_logged(&self.args, &self.log));
    }

    /// A kubeconfig straight at kshard (not through the host): anonymous,
    /// or with a client certificate (PEM cert, key).
    pub fn direct_kubeconfig(&self, path: &Path, cert: Option<&(String, String)>) -> PathBuf {
        write_kubeconfig(
            path,
            &format!("https://127.0.0.1:{}", self.port),
            &self.ca.pem,
            None,
            cert,
        );
        path.to_path_buf()
    }

    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

fn spawn_kshard_logged(args: &[String], log: &Path) -> KillOnDrop {
    let bin = std::env::var("KSHARD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kshard").into());
    let mut cmd = Command::new(bin);
    cmd.args(args).env("RUST_LOG", "info");
    // Append, so a restart keeps the earlier run's log.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("kshard log");
    let err = file.try_clone().expect("log");
    cmd.stdout(Stdio::from(file)).stderr(Stdio::from(err));
    KillOnDrop(cmd.spawn().expect("spawn kshard"))
}

impl RealHost {
    /// The objects of `manifests/base` as an installer on this host applies
    /// them: cert-manager's objects left out (no cert-manager here: the
    /// installer brings the certificate itself), the Service an ExternalName
    /// for loopback, the APIService pointed at `port` with `ca_pem`.
    pub fn base_objects_for_loopback(port: u16, ca_pem: &str) -> Vec<Value> {
        use base64::Engine as _;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        kustomize(&repo_path("manifests/base"))
            .into_iter()
            .filter(|o| {
                o["apiVersion"]
                    .as_str()
                    .is_none_or(|v| !v.starts_with("cert-manager.io/"))
            })
            .map(|mut o| {
                match kind_of(&o) {
                    "Service" => {
                        o["spec"] = json!({
                            "type": "ExternalName",
                            "externalName": "localhost",
                            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                        });
                    }
                    "APIService" => {
                        if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                            a.remove("cert-manager.io/inject-ca-from");
                        }
                        o["spec"]["service"]["port"] = json!(port);
                        o["spec"]["caBundle"] = json!(ca_bundle);
                    }
                    _ => {}
                }
                o
            })
            .collect()
    }

    /// Installs kshard from `manifests/base` and starts it as the Deployment
    /// would (its flags, with paths of this machine), plus `extra` flags;
    /// waits until every APIService of the base is Available.
    pub fn install_kshard(&self, extra: &[&str]) -> Installed {
        let port = free_port();
        let dir = self.dir.join("kshard");
        std::fs::create_dir_all(&dir).expect("kshard dir");
        let ca = Ca::new("kshard-ca");
        let svc = format!("kshard.{NAMESPACE}.svc");
        let (cert, key) = ca.server(&[&svc, "localhost", "127.0.0.1"]);
        let cert_file = dir.join("tls.crt");
        let key_file = dir.join("tls.key");
        std::fs::write(&cert_file, cert).expect("cert");
        std::fs::write(&key_file, key).expect("key");
        std::fs::write(dir.join("ca.crt"), &ca.pem).expect("ca");

        let objects = Self::base_objects_for_loopback(port, &ca.pem);
        let apiservices: Vec<String> = objects
            .iter()
            .filter(|o| kind_of(o) == "APIService")
            .filter_map(|o| o["metadata"]["name"].as_str().map(String::from))
            .collect();
        // CRDs first, as `kubectl apply -k` would need them established
        // before objects of their kinds (the base has none, but order
        // matters to an installer).
        self.apply(&objects);

        let token = self.service_account_token(NAMESPACE, "kshard");
        let host_kubeconfig = dir.join("host.kubeconfig");
        write_kubeconfig(
            &host_kubeconfig,
            &self.url,
            &self.ca.pem,
            Some(&token),
            None,
        );

        let data_dir = dir.join("data");
        let mut args: Vec<String> = vec![
            "serve".into(),
            format!("--listen=127.0.0.1:{port}"),
            format!("--data-dir={}", data_dir.display()),
            format!(
                "--crds={}",
                repo_path("manifests/base/served-crds/widgets.yaml").display()
            ),
            format!("--tls-cert-file={}", cert_file.display()),
            format!("--tls-private-key-file={}", key_file.display()),
            format!("--kubeconfig={}", host_kubeconfig.display()),
            "--manage-apiservices".into(),
            format!("--apiservice-service-namespace={NAMESPACE}"),
            format!("--apiservice-service-port={port}"),
            format!("--apiservice-ca-file={}", dir.join("ca.crt").display()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = dir.join("kshard.log");
        let process = Some(spawn_kshard_logged(&args, &log));
        let installed = Installed {
            port,
            data_dir,
            ca,
            cert_file,
            key_file,
            host_kubeconfig,
            args,
            log,
            process,
        };
        let mut installed = installed;
        for name in &apiservices {
            let up = poll(Duration::from_secs(120), || {
                let exited = installed
                    .process
                    .as_mut()
                    .is_some_and(|p| p.0.try_wait().ok().flatten().is_some());
                assert!(!exited, "kshard exited:\n{}", installed.log_tail());
                self.apiservice_available(name)
            });
            if !up {
                panic!(
                    "APIService {name} not Available: {}\nkshard log:\n{}",
                    self.kubectl_ok(&["get", "apiservice", name, "-o", "json"]),
                    installed.log_tail()
                );
            }
        }
        installed
    }

    /// Waits until the host's authorizer, which reads RBAC from informers,
    /// answers `kubectl auth can-i <args>` with yes (a self review, which
    /// the tests' counts of `subjectaccessreviews` do not see).
    pub fn wait_can_i(&self, args: &[&str]) {
        let mut argv = vec!["auth", "can-i"];
        argv.extend_from_slice(args);
        self.wait_until(
            &format!("the host's RBAC to allow {args:?}"),
            Duration::from_secs(10),
            || self.kubectl(&argv).status.success(),
        );
    }

    /// Waits until every CustomResourceDefinition is Established and its
    /// resource is in discovery and lists: Established comes a moment before
    /// the host's discovery and handlers have the resource.
    pub fn wait_crds_served(&self) {
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ]);
        let out = self.kubectl(&["get", "crd", "-o", "jsonpath={.items[*].metadata.name}"]);
        let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect();
        self.wait_until("the CRDs served", Duration::from_secs(30), || {
            let out = self.kubectl(&["api-resources", "-o", "name"]);
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            names.iter().all(|n| listed.lines().any(|l| l == n))
                && names.iter().all(|n| {
                    self.kubectl(&["get", n, "-A", "-o", "name"])
                        .status
                        .success()
                })
        });
    }

    /// Whether an APIService has `Available=True`.
    pub fn apiservice_available(&self, name: &str) -> bool {
        let out = self.kubectl(&[
            "get",
            "apiservice",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim() == "True"
    }
}
