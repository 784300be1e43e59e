//! The in-cluster manifests: the kustomize tree under `manifests/` (rendered by
//! the real `kubectl kustomize`) and `kshard manifests`, which must describe
//! the same objects.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use base64::Engine as _;
use kshard::apiextensions::catalog::Catalog;
use serde_json::Value;

const NS: &str = "kshard-system";

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn parse(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// `kubectl kustomize DIR`, parsed.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl (is it on PATH?)");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse(&String::from_utf8(out.stdout).expect("utf-8"))
}

/// `kshard manifests ARGS`, read back through kustomize so the output is
/// checked by the same YAML parser kubectl uses.
fn generate(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .arg("manifests")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kshard");
    assert!(
        out.status.success(),
        "kshard manifests {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("all.yaml"), &out.stdout).expect("write");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources:\n- all.yaml\n",
    )
    .expect("write");
    kustomize(dir.path())
}

fn base() -> Vec<Value> {
    kustomize(&repo("manifests/base"))
}

fn single() -> Vec<Value> {
    kustomize(&repo("manifests/overlays/single"))
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn kind_names(docs: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = docs
        .iter()
        .map(|d| format!("{}/{}", s(d, "/kind"), strip_hash(s(d, "/metadata/name"))))
        .collect();
    v.sort();
    v
}

/// kustomize's generated ConfigMaps carry a content hash suffix.
fn strip_hash(name: &str) -> String {
    let re = regex::Regex::new(r"^(kshard-(crds|store))-[a-z0-9]{10}$").expect("regex");
    re.replace(name, "$1").into_owned()
}

fn all<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| s(d, "/kind") == kind).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| s(d, "/kind") == kind && strip_hash(s(d, "/metadata/name")) == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", kind_names(docs)))
}

fn container(docs: &[Value]) -> &Value {
    find(docs, "Deployment", "kshard")
        .pointer("/spec/template/spec/containers/0")
        .expect("container")
}

fn args(docs: &[Value]) -> Vec<String> {
    container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

const COMMON: &[&str] = &[
    "ClusterRole/kshard",
    "ClusterRoleBinding/kshard",
    "ClusterRoleBinding/kshard:auth-delegator",
    "ConfigMap/kshard-crds",
    "CustomResourceDefinition/flowschemas.flowcontrol.kshard.dev",
    "CustomResourceDefinition/prioritylevelconfigurations.flowcontrol.kshard.dev",
    "CustomResourceDefinition/shardresourcedefinitions.apiextensions.kshard.dev",
    "Deployment/kshard",
    "Namespace/kshard-system",
    "RoleBinding/kshard:extension-apiserver-authentication-reader",
    "Service/kshard",
    "ServiceAccount/kshard",
    "APIService/v1.demo.kshard.dev",
];

const CERT_MANAGER: &[&str] = &[
    "Certificate/kshard-ca",
    "Certificate/kshard-serving",
    "Issuer/kshard-ca",
    "Issuer/kshard-selfsigned",
];

fn expected(extra: &[&[&str]]) -> Vec<String> {
    let mut v: Vec<String> = COMMON
        .iter()
        .chain(extra.iter().flat_map(|e| e.iter()))
        .map(|s| s.to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn kustomize_base_renders_exactly_the_expected_objects() {
    assert_eq!(
        kind_names(&base()),
        expected(&[
            CERT_MANAGER,
            &["ConfigMap/kshard-store", "PodDisruptionBudget/kshard"]
        ])
    );
}

#[test]
fn kustomize_single_overlay_renders_exactly_the_expected_objects() {
    assert_eq!(
        kind_names(&single()),
        expected(&[CERT_MANAGER, &["PersistentVolumeClaim/kshard-data"]])
    );
}

#[test]
fn generated_manifests_render_exactly_the_expected_objects() {
    assert_eq!(
        kind_names(&generate(&["--self-signed"])),
        expected(&[
            &["Secret/kshard-serving-cert"],
            &["ConfigMap/kshard-store", "PodDisruptionBudget/kshard"]
        ])
    );
    assert_eq!(
        kind_names(&generate(&["--self-signed", "--single"])),
        expected(&[
            &["Secret/kshard-serving-cert"],
            &["PersistentVolumeClaim/kshard-data"]
        ])
    );
}

/// Objects sorted by kind/name with kustomize's hash suffixes removed, so the
/// generator's output can be compared with kustomize's as a whole.
fn normalized(docs: &[Value]) -> Vec<(String, String)> {
    let re = regex::Regex::new(r"(kshard-(crds|store))-[a-z0-9]{10}\b").expect("regex");
    let mut v: Vec<(String, String)> = docs
        .iter()
        .map(|d| {
            let text = serde_json::to_string(d).expect("json");
            let text = re.replace_all(&text, "$1").into_owned();
            let value: Value = serde_json::from_str(&text).expect("json");
            (
                format!("{}/{}", s(d, "/kind"), strip_hash(s(d, "/metadata/name"))),
                serde_json::to_string_pretty(&sorted(value)).expect("json"),
            )
        })
        .collect();
    v.sort();
    v
}

/// Keys in a fixed order, so equal objects print equally.
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[test]
fn generator_and_kustomize_describe_the_same_objects() {
    for (generated, kustomized, what) in [
        (generate(&[]), base(), "base"),
        (generate(&["--single"]), single(), "overlays/single"),
    ] {
        let (g, k) = (normalized(&generated), normalized(&kustomized));
        assert_eq!(
            g.iter().map(|x| &x.0).collect::<Vec<_>>(),
            k.iter().map(|x| &x.0).collect::<Vec<_>>(),
            "{what}: objects"
        );
        for ((name, g), (_, k)) in g.iter().zip(&k) {
            assert!(
                g == k,
                "{what}: {name} differs\n--- kshard manifests\n{g}\n--- kubectl kustomize\n{k}"
            );
        }
    }
}

/// The group/versions the CRDs in `dir` serve, as APIService names.
fn served(dir: &str) -> BTreeSet<String> {
    let catalog = Catalog::load(&[repo(dir)]).expect("catalog");
    catalog
        .groups()
        .into_iter()
        .flat_map(|g| {
            g.versions
                .into_iter()
                .map(move |v| format!("{v}.{}", g.name))
        })
        .collect()
}

fn check_apiservice_common(a: &Value, ns: &str) {
    let name = s(a, "/metadata/name");
    assert_eq!(
        a["spec"]["service"],
        serde_json::json!({"namespace": ns, "name": "kshard", "port": 443}),
        "{name}: service reference"
    );
    assert!(
        a["spec"].get("insecureSkipTLSVerify").is_none(),
        "{name}: insecureSkipTLSVerify must never be set"
    );
    assert_eq!(
        format!("{}.{}", s(a, "/spec/version"), s(a, "/spec/group")),
        name
    );
    assert!(a["spec"]["groupPriorityMinimum"].as_u64().unwrap_or(0) > 0);
    assert!(a["spec"]["versionPriority"].as_u64().unwrap_or(0) > 0);
}

#[test]
fn base_apiservices_get_their_ca_from_the_serving_certificate() {
    for docs in [base(), single(), generate(&[])] {
        let apiservices = all(&docs, "APIService");
        let names: BTreeSet<String> = apiservices
            .iter()
            .map(|a| s(a, "/metadata/name").to_string())
            .collect();
        assert_eq!(names, served("manifests/base/served-crds"));
        for a in apiservices {
            check_apiservice_common(a, NS);
            assert!(
                a["spec"].get("caBundle").is_none(),
                "cainjector fills it in"
            );
            let inject = s(a, "/metadata/annotations/cert-manager.io~1inject-ca-from");
            let (ns, cert_name) = inject.split_once('/').expect("ns/name annotation");
            assert_eq!(ns, NS);
            // The annotated Certificate is the one the Deployment serves with,
            // for the Service's DNS names, issued by a CA chained to a root.
            let cert = find(&docs, "Certificate", cert_name);
            let dns: Vec<&str> = cert["spec"]["dnsNames"]
                .as_array()
                .expect("dnsNames")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(dns.contains(&"kshard.kshard-system.svc"), "{dns:?}");
            assert!(
                dns.contains(&"kshard.kshard-system.svc.cluster.local"),
                "{dns:?}"
            );
            assert_eq!(
                s(cert, "/spec/secretName"),
                s(
                    find(&docs, "Deployment", "kshard"),
                    "/spec/template/spec/volumes/2/secret/secretName"
                )
            );
            let ca_issuer = find(&docs, "Issuer", s(cert, "/spec/issuerRef/name"));
            let ca_cert = all(&docs, "Certificate")
                .into_iter()
                .find(|c| s(c, "/spec/secretName") == s(ca_issuer, "/spec/ca/secretName"))
                .expect("the CA issuer's secret comes from a Certificate");
            assert_eq!(ca_cert["spec"]["isCA"], Value::Bool(true));
            let root = find(&docs, "Issuer", s(ca_cert, "/spec/issuerRef/name"));
            assert!(root["spec"].get("selfSigned").is_some());
        }
    }
}

fn pem_certs(pem: &[u8]) -> Vec<rustls_pki_types::CertificateDer<'static>> {
    use rustls_pki_types::pem::PemObject as _;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .expect("PEM certificates")
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64 string"))
        .expect("base64")
}

/// Verifies `leaf` for `name` against `ca` as a TLS client would.
fn verify(ca: &rustls_pki_types::CertificateDer<'static>, leaf: &[u8], name: &str) -> bool {
    use rustls::client::danger::ServerCertVerifier as _;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).expect("CA certificate");
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .expect("verifier");
    let leaf = pem_certs(leaf).remove(0);
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &rustls_pki_types::ServerName::try_from(name.to_string()).expect("name"),
            &[],
            rustls_pki_types::UnixTime::now(),
        )
        .is_ok()
}

fn check_self_signed(docs: &[Value], ns: &str) {
    let secret = find(docs, "Secret", "kshard-serving-cert");
    assert_eq!(s(secret, "/type"), "kubernetes.io/tls");
    assert_eq!(s(secret, "/metadata/namespace"), ns);
    let tls_crt = b64(&secret["data"]["tls.crt"]);
    let tls_key = b64(&secret["data"]["tls.key"]);
    assert_eq!(
        s(
            find(docs, "Deployment", "kshard"),
            "/spec/template/spec/volumes/2/secret/secretName"
        ),
        "kshard-serving-cert"
    );

    let apiservices = all(docs, "APIService");
    assert_eq!(
        apiservices
            .iter()
            .map(|a| s(a, "/metadata/name").to_string())
            .collect::<BTreeSet<_>>(),
        served("crds/examples")
    );
    for a in apiservices {
        check_apiservice_common(a, ns);
        assert!(
            a["metadata"]
                .pointer("/annotations/cert-manager.io~1inject-ca-from")
                .is_none(),
            "no cert-manager without it"
        );
        let bundle = pem_certs(&b64(&a["spec"]["caBundle"]));
        assert_eq!(bundle.len(), 1, "caBundle holds the CA");
        let (_, ca) = x509_parser::parse_x509_certificate(&bundle[0]).expect("CA parses");
        assert!(
            ca.basic_constraints()
                .ok()
                .flatten()
                .is_some_and(|bc| bc.value.ca),
            "caBundle is a CA certificate"
        );
        for name in [
            format!("kshard.{ns}.svc"),
            format!("kshard.{ns}.svc.cluster.local"),
        ] {
            assert!(
                verify(&bundle[0], &tls_crt, &name),
                "the serving certificate verifies for {name}"
            );
        }
        assert!(
            !verify(&bundle[0], &tls_crt, "kshard.elsewhere.svc"),
            "and only for the Service's names"
        );
    }
    // The key in the Secret belongs to the certificate.
    let key = rcgen::KeyPair::from_pem(std::str::from_utf8(&tls_key).expect("utf-8"))
        .expect("tls.key parses");
    let leaf = pem_certs(&tls_crt).remove(0);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf).expect("tls.crt parses");
    assert_eq!(
        key.public_key_raw(),
        leaf.public_key().subject_public_key.data.as_ref()
    );
}

#[test]
fn self_signed_ca_bundle_verifies_the_serving_certificate() {
    check_self_signed(&generate(&["--self-signed"]), NS);
}

#[test]
fn self_signed_in_another_namespace_moves_everything_but_kube_system() {
    let docs = generate(&["--self-signed", "--namespace", "tenant-a"]);
    check_self_signed(&docs, "tenant-a");
    let text = serde_json::to_string(&docs).expect("json");
    assert!(!text.contains("kshard-system"), "{text}");
    let rb = find(
        &docs,
        "RoleBinding",
        "kshard:extension-apiserver-authentication-reader",
    );
    assert_eq!(s(rb, "/metadata/namespace"), "kube-system");
    assert_eq!(s(rb, "/subjects/0/namespace"), "tenant-a");
}

#[test]
fn bad_options_are_refused() {
    for (args, message) in [
        (&["--namespace", "Not_A_Label"][..], "not a DNS-1123 label"),
        (&["--crds", "no/such/dir"][..], "no/such/dir"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
            .arg("manifests")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run kshard");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// Whether `rules` allow `verb` on `group`/`resource`.
fn allows(rules: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |r: &Value, field: &str, want: &str| {
        r[field]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == want || x == "*"))
    };
    rules.as_array().is_some_and(|rules| {
        rules.iter().any(|r| {
            has(r, "apiGroups", group) && has(r, "resources", resource) && has(r, "verbs", verb)
        })
    })
}

fn binds_kshard_sa(binding: &Value, ns: &str) -> bool {
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|x| {
            s(x, "/kind") == "ServiceAccount"
                && s(x, "/name") == "kshard"
                && s(x, "/namespace") == ns
        })
    })
}

#[test]
fn rbac_grants_what_kshard_needs_from_the_host() {
    for docs in [base(), single(), generate(&["--self-signed"])] {
        let sa = find(&docs, "ServiceAccount", "kshard");
        assert_eq!(s(sa, "/metadata/namespace"), NS);
        assert_eq!(
            s(
                find(&docs, "Deployment", "kshard"),
                "/spec/template/spec/serviceAccountName"
            ),
            "kshard"
        );

        let delegator = all(&docs, "ClusterRoleBinding")
            .into_iter()
            .find(|b| s(b, "/roleRef/name") == "system:auth-delegator")
            .expect("ClusterRoleBinding to system:auth-delegator");
        assert_eq!(s(delegator, "/roleRef/kind"), "ClusterRole");
        assert!(binds_kshard_sa(delegator, NS));

        let reader = all(&docs, "RoleBinding")
            .into_iter()
            .find(|b| s(b, "/roleRef/name") == "extension-apiserver-authentication-reader")
            .expect("RoleBinding to extension-apiserver-authentication-reader");
        assert_eq!(s(reader, "/metadata/namespace"), "kube-system");
        assert_eq!(s(reader, "/roleRef/kind"), "Role");
        assert!(binds_kshard_sa(reader, NS));

        // Every ClusterRole bound to kshard's ServiceAccount, merged.
        let rules: Vec<Value> = all(&docs, "ClusterRoleBinding")
            .into_iter()
            .filter(|b| binds_kshard_sa(b, NS))
            .filter_map(|b| {
                docs.iter().find(|d| {
                    s(d, "/kind") == "ClusterRole"
                        && s(d, "/metadata/name") == s(b, "/roleRef/name")
                })
            })
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let rules = Value::Array(rules);
        for verb in ["get", "list", "watch"] {
            assert!(allows(&rules, "", "namespaces", verb), "namespaces {verb}");
            for r in ["flowschemas", "prioritylevelconfigurations"] {
                assert!(
                    allows(&rules, "flowcontrol.kshard.dev", r, verb),
                    "{r} {verb}"
                );
            }
        }
        for verb in ["patch", "update"] {
            for r in ["flowschemas/status", "prioritylevelconfigurations/status"] {
                assert!(
                    allows(&rules, "flowcontrol.kshard.dev", r, verb),
                    "{r} {verb}"
                );
            }
        }
        // Definitions managed through the host (ShardResourceDefinitions):
        // followed, finalized, their status written.
        for verb in ["get", "list", "watch", "update"] {
            assert!(
                allows(
                    &rules,
                    "apiextensions.kshard.dev",
                    "shardresourcedefinitions",
                    verb
                ),
                "shardresourcedefinitions {verb}"
            );
        }
        assert!(allows(
            &rules,
            "apiextensions.kshard.dev",
            "shardresourcedefinitions/status",
            "update"
        ));
        assert!(allows(
            &rules,
            "apiextensions.kshard.dev",
            "shardresourcedefinitions/finalizers",
            "update"
        ));
        // --manage-apiservices keeps the APIServices of its group-versions.
        for verb in ["get", "list", "create", "update", "delete"] {
            assert!(
                allows(&rules, "apiregistration.k8s.io", "apiservices", verb),
                "apiservices {verb}"
            );
        }
        let a = args(&docs);
        assert!(a.iter().any(|x| x == "--manage-apiservices"), "{a:?}");
        assert!(
            a.iter()
                .any(|x| x == "--apiservice-service-namespace=$(POD_NAMESPACE)"),
            "{a:?}"
        );
    }
}

#[test]
fn copied_crds_match_their_sources() {
    // kustomize reads nothing outside its root, so the base holds copies.
    // base/crds holds kshard's own kinds installed in the host: flow control
    // and the ShardResourceDefinition.
    let pairs: [(&str, &[&str]); 2] = [
        (
            "manifests/base/crds",
            &["crds/flowcontrol", "crds/apiextensions"],
        ),
        ("manifests/base/served-crds", &["crds/examples"]),
    ];
    let names = |dir: &str| -> BTreeSet<String> {
        std::fs::read_dir(repo(dir))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    for (copies, dirs) in pairs {
        let mut sources = BTreeMap::new();
        for dir in dirs {
            for name in names(dir) {
                sources.insert(name, dir.to_string());
            }
        }
        assert_eq!(
            names(copies),
            sources.keys().cloned().collect::<BTreeSet<_>>(),
            "{copies} must hold exactly the files of {dirs:?}"
        );
        for (name, sources) in &sources {
            let copy = std::fs::read(repo(&format!("{copies}/{name}"))).expect("copy");
            let source = std::fs::read(repo(&format!("{sources}/{name}"))).expect("source");
            assert!(
                copy == source,
                "{copies}/{name} differs from {sources}/{name}: cp {sources}/{name} {copies}/{name}"
            );
        }
    }
}

#[test]
fn every_served_crd_file_is_in_the_configmap_and_passed_with_crds() {
    for docs in [base(), single()] {
        let cm = find(&docs, "ConfigMap", "kshard-crds");
        let keys: BTreeSet<String> = cm["data"]
            .as_object()
            .expect("data")
            .keys()
            .cloned()
            .collect();
        let files: BTreeSet<String> = std::fs::read_dir(repo("manifests/base/served-crds"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(keys, files);
        let passed: BTreeSet<String> = args(&docs)
            .iter()
            .filter_map(|a| a.strip_prefix("--crds=/etc/kshard/crds/"))
            .map(str::to_string)
            .collect();
        assert_eq!(passed, keys, "one --crds per file of the mounted ConfigMap");
        let mounts = container(&docs)["volumeMounts"].as_array().expect("mounts");
        let crds_mount = mounts
            .iter()
            .find(|m| s(m, "/mountPath") == "/etc/kshard/crds")
            .expect("crds mount");
        let volume = find(&docs, "Deployment", "kshard")["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == crds_mount["name"])
            .expect("crds volume");
        assert_eq!(
            s(volume, "/configMap/name"),
            s(cm, "/metadata/name"),
            "mounts the generated ConfigMap"
        );
    }
}

/// kubelet's layout of a ConfigMap volume: the files live in a timestamped
/// directory, `..data` points at it, and each key is a symlink through `..data`.
#[cfg(unix)]
#[test]
fn crds_args_load_from_a_kubelet_style_configmap_volume() {
    let docs = base();
    let dir = tempfile::tempdir().expect("tmp");
    let stamped = dir.path().join("..2025_01_01_00_00_00.000000001");
    std::fs::create_dir(&stamped).expect("mkdir");
    for (key, text) in find(&docs, "ConfigMap", "kshard-crds")["data"]
        .as_object()
        .expect("data")
    {
        std::fs::write(stamped.join(key), text.as_str().expect("text")).expect("write");
        std::os::unix::fs::symlink(format!("..data/{key}"), dir.path().join(key)).expect("symlink");
    }
    std::os::unix::fs::symlink(
        stamped.file_name().expect("name"),
        dir.path().join("..data"),
    )
    .expect("symlink");
    let paths: Vec<PathBuf> = args(&docs)
        .iter()
        .filter_map(|a| a.strip_prefix("--crds=/etc/kshard/crds/"))
        .map(|key| dir.path().join(key))
        .collect();
    let catalog = Catalog::load(&paths).expect("the Deployment's --crds load");
    assert!(catalog.find("demo.kshard.dev", "v1", "widgets").is_some());
}

fn probe_path(c: &Value, probe: &str) -> String {
    assert_eq!(
        s(c, &format!("/{probe}/httpGet/scheme")),
        "HTTPS",
        "{probe}"
    );
    let port = &c[probe]["httpGet"]["port"];
    let container_port = c["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| &p["name"] == port || &p["containerPort"] == port)
        .expect("probe port is a container port");
    assert_eq!(container_port["containerPort"], 6443);
    s(c, &format!("/{probe}/httpGet/path")).to_string()
}

#[test]
fn base_deployment_is_two_spread_replicas_with_probes_and_a_budget() {
    let docs = base();
    let d = find(&docs, "Deployment", "kshard");
    assert_eq!(d["spec"]["replicas"], 2);
    let pod_labels = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    let selects_pods = |selector: &Value| {
        selector["matchLabels"]
            .as_object()
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| pod_labels.get(k) == Some(v)))
    };
    assert!(selects_pods(&d["spec"]["selector"]));

    let anti = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    let terms: Vec<&Value> = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| &t["podAffinityTerm"])
        .chain(
            anti["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .collect();
    assert!(
        terms
            .iter()
            .any(|t| s(t, "/topologyKey") == "kubernetes.io/hostname"
                && selects_pods(&t["labelSelector"])),
        "replicas spread over nodes: {anti}"
    );

    let pdb = find(&docs, "PodDisruptionBudget", "kshard");
    assert_eq!(s(pdb, "/metadata/namespace"), NS);
    assert!(
        selects_pods(&pdb["spec"]["selector"]),
        "PDB selects the pods"
    );
    assert!(
        pdb["spec"]["maxUnavailable"] == 1 || pdb["spec"]["minAvailable"] == 1,
        "one of two may go: {pdb}"
    );

    let c = container(&docs);
    assert_eq!(probe_path(c, "livenessProbe"), "/livez");
    assert_eq!(probe_path(c, "readinessProbe"), "/readyz");
    for r in ["cpu", "memory"] {
        assert!(c["resources"]["requests"].get(r).is_some(), "requests {r}");
    }
    assert!(
        c.get("lifecycle").is_none(),
        "no hooks: shutdown never touches the APIService"
    );

    let a = args(&docs);
    assert_eq!(a[0], "serve");
    for want in [
        "--listen=0.0.0.0:6443",
        "--tls-cert-file=/etc/kshard/tls/tls.crt",
        "--tls-private-key-file=/etc/kshard/tls/tls.key",
        "--store=$(KSHARD_STORE)",
    ] {
        assert!(a.iter().any(|x| x == want), "{want} in {a:?}");
    }
    assert!(
        !a.iter().any(|x| x.starts_with("--kubeconfig")),
        "in-cluster config"
    );
    let store = find(&docs, "ConfigMap", "kshard-store");
    assert!(s(store, "/data/KSHARD_STORE").starts_with("tikv://"));
    assert_eq!(
        strip_hash(s(c, "/env/0/valueFrom/configMapKeyRef/name")),
        "kshard-store"
    );
    let svc = find(&docs, "Service", "kshard");
    assert!(selects_pods(
        &serde_json::json!({"matchLabels": svc["spec"]["selector"]})
    ));
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(s(svc, "/spec/ports/0/targetPort"), "https");
}

#[test]
fn single_overlay_is_one_replica_on_the_embedded_store() {
    let (b, o) = (base(), single());
    let d = find(&o, "Deployment", "kshard");
    assert_eq!(d["spec"]["replicas"], 1);
    assert_eq!(s(d, "/spec/strategy/type"), "Recreate");
    let base_args: Vec<String> = args(&b)
        .into_iter()
        .filter(|a| !a.starts_with("--store="))
        .collect();
    assert_eq!(args(&o), base_args, "the base's arguments without --store");
    assert!(container(&o)["env"]
        .as_array()
        .is_none_or(|e| e.iter().all(|v| v["name"] != "KSHARD_STORE")));
    let data = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "data")
        .expect("data volume");
    let claim = s(data, "/persistentVolumeClaim/claimName");
    assert!(data.get("emptyDir").is_none());
    assert_eq!(
        s(
            find(&o, "PersistentVolumeClaim", claim),
            "/metadata/namespace"
        ),
        NS
    );
    assert_eq!(probe_path(container(&o), "livenessProbe"), "/livez");
    assert_eq!(probe_path(container(&o), "readinessProbe"), "/readyz");
}

#[test]
fn one_apiservice_per_served_version_preferred_version_first() {
    let dir = tempfile::tempdir().expect("tmp");
    let crd = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.tools.example.dev}
spec:
  group: tools.example.dev
  scope: Namespaced
  names: {plural: gadgets, kind: Gadget}
  versions:
  - {name: v1beta1, served: true, storage: false, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
  - {name: v1alpha1, served: false, storage: false, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
"#;
    std::fs::write(dir.path().join("gadgets.yaml"), crd).expect("write");
    let crds = dir.path().to_str().expect("utf-8 path");
    let docs = generate(&["--self-signed", "--crds", crds, "--crds", "crds/examples"]);
    let priority = |name: &str| {
        find(&docs, "APIService", name)["spec"]["versionPriority"]
            .as_u64()
            .expect("versionPriority")
    };
    assert!(priority("v1.tools.example.dev") > priority("v1beta1.tools.example.dev"));
    assert!(docs
        .iter()
        .all(|d| s(d, "/metadata/name") != "v1alpha1.tools.example.dev"));
    let mut names: Vec<&str> = all(&docs, "APIService")
        .into_iter()
        .map(|a| s(a, "/metadata/name"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "v1.demo.kshard.dev",
            "v1.tools.example.dev",
            "v1beta1.tools.example.dev"
        ]
    );
    let passed: BTreeSet<String> = args(&docs)
        .into_iter()
        .filter(|a| a.starts_with("--crds="))
        .collect();
    assert_eq!(
        passed,
        BTreeSet::from([
            "--crds=/etc/kshard/crds/gadgets.yaml".to_string(),
            "--crds=/etc/kshard/crds/widgets.yaml".to_string()
        ])
    );
}
