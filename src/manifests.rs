//! `kshard manifests`: everything that runs kshard as an aggregated APIService
//! in a host cluster, as one multi-document YAML stream.
//!
//! The objects are rendered from the kustomize base in `manifests/base/`
//! (compiled in), so the generator and `kubectl apply -k` cannot disagree about
//! the Deployment, RBAC or certificates. What the base cannot know is computed
//! here: one APIService per served group/version of the given CRDs, the
//! ConfigMap carrying those CRDs, the namespace, and (with `--self-signed`) a
//! CA and serving certificate for clusters without cert-manager.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{json, Map, Value};

use crate::apiextensions::catalog::{Catalog, CatalogError};

/// The image the manifests run unless `--image` says otherwise.
pub const DEFAULT_IMAGE: &str = "ghcr.io/kshard/kshard:dev";
/// The namespace the base is written for; replaced by `--namespace`.
const BASE_NAMESPACE: &str = "kshard-system";
/// Where the Deployment mounts the served-CRDs ConfigMap.
const CRDS_MOUNT: &str = "/etc/kshard/crds";
/// ConfigMaps are stored in etcd, whose object limit is about 1.5 MiB; kube
/// caps a ConfigMap's data at 1 MiB.
const CONFIGMAP_LIMIT: usize = 1024 * 1024;

/// The base's files, in the order the objects are applied.
const NAMESPACE: &str = include_str!("../manifests/base/namespace.yaml");
const SERVICE_ACCOUNT: &str = include_str!("../manifests/base/serviceaccount.yaml");
const RBAC: &str = include_str!("../manifests/base/rbac.yaml");
const CERTIFICATES: &str = include_str!("../manifests/base/certificates.yaml");
const SERVICE: &str = include_str!("../manifests/base/service.yaml");
const DEPLOYMENT: &str = include_str!("../manifests/base/deployment.yaml");
const PDB: &str = include_str!("../manifests/base/pdb.yaml");
const STORE_ENV: &str = include_str!("../manifests/base/store.env");
const APISERVICE: &str = include_str!("../manifests/base/apiservice.yaml");
const SINGLE_PVC: &str = include_str!("../manifests/overlays/single/pvc.yaml");

#[derive(Debug, thiserror::Error)]
pub enum ManifestsError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--namespace {0:?} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)")]
    Namespace(String),
    #[error("--crds serves no group/version: give at least one CustomResourceDefinition with a served version")]
    NothingServed,
    #[error(
        "{first} and {second} have the same file name; ConfigMap keys must be unique, rename one"
    )]
    DuplicateFileName { first: PathBuf, second: PathBuf },
    #[error("{0}: file name is not a valid ConfigMap key (letters, digits, '-', '_', '.')")]
    BadFileName(PathBuf),
    #[error("the served CRDs total {0} bytes; a ConfigMap holds at most 1 MiB")]
    TooLarge(usize),
    #[error("manifests/base/{file}: {reason}")]
    Template { file: &'static str, reason: String },
    #[error("YAML output: {0}")]
    Yaml(String),
    #[error("certificate generation: {0}")]
    Certificate(#[from] rcgen::Error),
}

/// Options of `kshard manifests`.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// Directory (or file) of CustomResourceDefinition manifests to serve; repeatable.
    #[arg(long = "crds", default_value = "crds/examples")]
    pub crds: Vec<PathBuf>,
    /// Namespace of kshard's Deployment, Service and certificates.
    #[arg(long, default_value = BASE_NAMESPACE)]
    pub namespace: String,
    /// Container image.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Generate a CA and serving certificate (a kubernetes.io/tls Secret and the
    /// APIServices' caBundle) instead of relying on cert-manager.
    #[arg(long)]
    pub self_signed: bool,
    /// One replica on the embedded store (like manifests/overlays/single)
    /// instead of two replicas on TiKV.
    #[arg(long)]
    pub single: bool,
}

impl Default for ManifestsArgs {
    fn default() -> Self {
        ManifestsArgs {
            crds: vec![PathBuf::from("crds/examples")],
            namespace: BASE_NAMESPACE.into(),
            image: DEFAULT_IMAGE.into(),
            self_signed: false,
            single: false,
        }
    }
}

/// Renders the manifests as one multi-document YAML string.
pub fn render(args: &ManifestsArgs) -> Result<String, ManifestsError> {
    if !is_dns_label(&args.namespace) {
        return Err(ManifestsError::Namespace(args.namespace.clone()));
    }
    let ns = args.namespace.as_str();
    let catalog = Catalog::load(&args.crds)?;
    let groups = catalog.groups();
    if groups.iter().all(|g| g.versions.is_empty()) {
        return Err(ManifestsError::NothingServed);
    }
    let crd_files = crd_files(&catalog)?;

    let mut docs: Vec<Value> = Vec::new();
    docs.extend(template("namespace.yaml", NAMESPACE, ns)?);
    docs.extend(flowcontrol_crds()?);
    docs.extend(host_definition_crd()?);
    docs.extend(template("serviceaccount.yaml", SERVICE_ACCOUNT, ns)?);
    docs.extend(template("rbac.yaml", RBAC, ns)?);

    let ca_bundle = if args.self_signed {
        let (secret, ca_pem) = self_signed_secret(ns)?;
        docs.push(secret);
        Some(ca_pem)
    } else {
        docs.extend(template("certificates.yaml", CERTIFICATES, ns)?);
        None
    };

    docs.push(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kshard-crds", "namespace": ns, "labels": labels()},
        "data": crd_files.iter().map(|(k, (_, text))| (k.clone(), Value::String(text.clone()))).collect::<Map<_, _>>(),
    }));
    if !args.single {
        docs.push(store_configmap(ns)?);
    }
    docs.extend(template("service.yaml", SERVICE, ns)?);
    if args.single {
        docs.extend(template("pvc.yaml", SINGLE_PVC, ns)?);
    }
    let mut deployment = one(
        template("deployment.yaml", DEPLOYMENT, ns)?,
        "deployment.yaml",
    )?;
    shape_deployment(&mut deployment, args, crd_files.keys())?;
    docs.push(deployment);
    if !args.single {
        docs.extend(template("pdb.yaml", PDB, ns)?);
    }
    let apiservice = one(
        template("apiservice.yaml", APISERVICE, ns)?,
        "apiservice.yaml",
    )?;
    for group in &groups {
        for (i, version) in group.versions.iter().enumerate() {
            docs.push(apiservice_for(
                &apiservice,
                &group.name,
                version,
                i,
                ca_bundle.as_deref(),
            ));
        }
    }

    let mut out = format!(
        "# Generated by `kshard manifests`{}{} from manifests/base.\n",
        if args.self_signed {
            " --self-signed"
        } else {
            ""
        },
        if args.single { " --single" } else { "" },
    );
    for doc in &docs {
        out.push_str("---\n");
        out.push_str(
            &serde_saphyr::to_string(doc).map_err(|e| ManifestsError::Yaml(e.to_string()))?,
        );
    }
    Ok(out)
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn labels() -> Value {
    json!({"app.kubernetes.io/name": "kshard"})
}

/// Parses one of the base's files for namespace `ns`. The base names its
/// namespace only as `kshard-system` (in namespaces, subjects, DNS names and
/// the inject-ca-from annotation), and `ns` is a DNS label, so a textual
/// replacement is exact and cannot change the YAML's structure.
fn template(file: &'static str, text: &str, ns: &str) -> Result<Vec<Value>, ManifestsError> {
    let text = text.replace(BASE_NAMESPACE, ns);
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| ManifestsError::Template {
            file,
            reason: e.to_string(),
        })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn one(mut docs: Vec<Value>, file: &'static str) -> Result<Value, ManifestsError> {
    match (docs.pop(), docs.is_empty()) {
        (Some(doc), true) => Ok(doc),
        _ => Err(ManifestsError::Template {
            file,
            reason: "expected exactly one object".into(),
        }),
    }
}

/// The flow-control CRDs, straight from the types (the same text as
/// `crds/flowcontrol/`, which a test keeps in step).
fn flowcontrol_crds() -> Result<Vec<Value>, ManifestsError> {
    let text = crate::controller::crd::manifests_yaml();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| ManifestsError::Yaml(format!("flow-control CRDs: {e}")))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The ShardResourceDefinition CRD (`crds/apiextensions/`): definitions
/// managed through the host.
fn host_definition_crd() -> Result<Vec<Value>, ManifestsError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(crate::definitions::host::MANIFEST)
        .map_err(|e| ManifestsError::Yaml(format!("ShardResourceDefinition CRD: {e}")))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The served CRD files by ConfigMap key (their file name), with their text.
fn crd_files(catalog: &Catalog) -> Result<BTreeMap<String, (PathBuf, String)>, ManifestsError> {
    let mut files: BTreeMap<String, (PathBuf, String)> = BTreeMap::new();
    let mut total = 0;
    for source in catalog.resources.iter().map(|r| PathBuf::from(&r.source)) {
        let key = source
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| {
                n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            })
            .ok_or_else(|| ManifestsError::BadFileName(source.clone()))?
            .to_string();
        if let Some((first, _)) = files.get(&key) {
            if first == &source {
                continue; // several CRDs in one file
            }
            return Err(ManifestsError::DuplicateFileName {
                first: first.clone(),
                second: source,
            });
        }
        let text = read(&source)?;
        total += key.len() + text.len();
        files.insert(key, (source, text));
    }
    if total > CONFIGMAP_LIMIT {
        return Err(ManifestsError::TooLarge(total));
    }
    Ok(files)
}

fn read(path: &Path) -> Result<String, ManifestsError> {
    std::fs::read_to_string(path).map_err(|source| ManifestsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The `kshard-store` ConfigMap from the base's `store.env`.
fn store_configmap(ns: &str) -> Result<Value, ManifestsError> {
    let mut data = Map::new();
    for line in STORE_ENV.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or(ManifestsError::Template {
            file: "store.env",
            reason: format!("{line:?} is not KEY=VALUE"),
        })?;
        data.insert(k.to_string(), Value::String(v.to_string()));
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kshard-store", "namespace": ns, "labels": labels()},
        "data": data,
    }))
}

/// Image, one `--crds` per served file and, for `--single`, what
/// `manifests/overlays/single` changes.
fn shape_deployment<'a>(
    deployment: &mut Value,
    args: &ManifestsArgs,
    crd_keys: impl Iterator<Item = &'a String>,
) -> Result<(), ManifestsError> {
    let bad = |reason: &str| ManifestsError::Template {
        file: "deployment.yaml",
        reason: reason.into(),
    };
    let container = deployment
        .pointer_mut("/spec/template/spec/containers/0")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| bad("no container"))?;
    container.insert("image".into(), Value::String(args.image.clone()));
    let old_args = container
        .get("args")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("container has no args"))?
        .clone();
    // The served files replace the base's --crds where it stood.
    let mut crds: Vec<Value> = crd_keys
        .map(|key| Value::String(format!("--crds={CRDS_MOUNT}/{key}")))
        .collect();
    let mut new_args: Vec<Value> = Vec::new();
    let mut placed = false;
    for arg in old_args {
        let text = arg.as_str().unwrap_or_default();
        if text.starts_with("--crds=") {
            if !placed {
                new_args.append(&mut crds);
                placed = true;
            }
        } else if !(args.single && text.starts_with("--store=")) {
            new_args.push(arg);
        }
    }
    if !placed {
        return Err(bad("no --crds= argument"));
    }
    container.insert("args".into(), Value::Array(new_args));
    if !args.single {
        return Ok(());
    }
    // As the overlay does: drop only the store's variable.
    if let Some(env) = container.get_mut("env").and_then(Value::as_array_mut) {
        env.retain(|e| e.get("name").and_then(Value::as_str) != Some("KSHARD_STORE"));
    }
    let spec = deployment
        .pointer_mut("/spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| bad("no spec"))?;
    spec.insert("replicas".into(), json!(1));
    spec.insert("strategy".into(), json!({"type": "Recreate"}));
    let volumes = deployment
        .pointer_mut("/spec/template/spec/volumes")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("no volumes"))?;
    let data = volumes
        .iter_mut()
        .find(|v| v.get("name").and_then(Value::as_str) == Some("data"))
        .ok_or_else(|| bad("no data volume"))?;
    *data = json!({"name": "data", "persistentVolumeClaim": {"claimName": "kshard-data"}});
    Ok(())
}

/// The base's APIService for one group/version, `index` in the group's
/// priority order. With a CA bundle, it replaces cert-manager's injection.
fn apiservice_for(
    base: &Value,
    group: &str,
    version: &str,
    index: usize,
    ca_bundle: Option<&str>,
) -> Value {
    let mut obj = base.clone();
    obj["metadata"]["name"] = Value::String(format!("{version}.{group}"));
    obj["spec"]["group"] = Value::String(group.into());
    obj["spec"]["version"] = Value::String(version.into());
    // Kube prefers the highest versionPriority; it must stay positive.
    let priority = 100u32
        .saturating_sub(u32::try_from(index).unwrap_or(u32::MAX).saturating_mul(10))
        .max(1);
    obj["spec"]["versionPriority"] = json!(priority);
    if let Some(ca) = ca_bundle {
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.remove("annotations");
        }
        obj["spec"]["caBundle"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    obj
}

/// A CA and a serving certificate for the Service's DNS names, as the
/// `kubernetes.io/tls` Secret the Deployment mounts. The CA key is not kept:
/// nothing else can be signed with it. Returns the Secret and the CA PEM.
fn self_signed_secret(ns: &str) -> Result<(Value, String), ManifestsError> {
    // A day of slack for clocks behind ours.
    let from = chrono::Utc::now() - chrono::Duration::days(1);
    let (y, m, d) = {
        use chrono::Datelike as _;
        (from.year(), from.month() as u8, from.day().min(28) as u8)
    };
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("kshard-ca.{ns}"));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = rcgen::date_time_ymd(y, m, d);
    ca_params.not_after = rcgen::date_time_ymd(y + 10, m, d);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, &ca_key);

    let service = format!("kshard.{ns}.svc");
    let server_key = KeyPair::generate()?;
    let mut params =
        CertificateParams::new(vec![service.clone(), format!("{service}.cluster.local")])?;
    params
        .distinguished_name
        .push(DnType::CommonName, service.clone());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(y, m, d);
    // No automatic renewal without cert-manager: long enough not to surprise,
    // and the expiry is written on the Secret.
    let expires = (y + 2, m, d);
    params.not_after = rcgen::date_time_ymd(expires.0, expires.1, expires.2);
    let server_cert = params.signed_by(&server_key, &issuer)?;

    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca_pem = ca_cert.pem();
    let secret = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": "kshard-serving-cert",
            "namespace": ns,
            "labels": labels(),
            "annotations": {
                "kshard.dev/not-after": format!("{:04}-{:02}-{:02}", expires.0, expires.1, expires.2),
            },
        },
        "data": {
            "tls.crt": b64(&server_cert.pem()),
            "tls.key": b64(&server_key.serialize_pem()),
            "ca.crt": b64(&ca_pem),
        },
    });
    Ok((secret, ca_pem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("kshard-system"));
        assert!(!is_dns_label("Kshard"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a\nb: c"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }

    #[test]
    fn version_priorities_stay_positive() {
        let base = json!({"metadata": {}, "spec": {}});
        for i in [0, 1, 9, 10, 50] {
            let p = apiservice_for(&base, "g.dev", "v1", i, None)["spec"]["versionPriority"]
                .as_u64()
                .unwrap_or(0);
            assert!(p >= 1, "index {i}: {p}");
        }
    }
}
