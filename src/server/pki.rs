//! The development PKI: a CA, a serving certificate and an admin client
//! certificate, generated once under `<data-dir>/pki` and reused afterwards,
//! plus the kubeconfig that points kubectl at this server.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
}

pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
    pub fn admin_cert(&self) -> PathBuf {
        self.dir.join("admin.crt")
    }
    pub fn admin_key(&self) -> PathBuf {
        self.dir.join("admin.key")
    }
}

/// Writes a file only its owner may read (0600): keys, and kubeconfigs that
/// carry a key. An existing file's mode is tightened too.
fn write(path: &Path, text: &str) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    let mut f = o.open(path).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io)?;
    }
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io)
}

/// Creates `dir` (and its parents) if needed and makes it the owner's alone
/// (0700): it holds private keys, the store and the admin kubeconfig.
pub fn private_dir(dir: &Path) -> Result<(), PkiError> {
    let io = |source| PkiError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

/// Loads the PKI under `dir`, generating whatever is missing.
pub fn ensure(dir: &Path, extra_sans: &[String]) -> Result<Pki, PkiError> {
    let pki = Pki {
        dir: dir.to_path_buf(),
    };
    private_dir(dir)?;
    let complete = [
        pki.ca_cert(),
        pki.server_cert(),
        pki.server_key(),
        pki.admin_cert(),
        pki.admin_key(),
    ]
    .iter()
    .all(|p| p.exists());
    if complete {
        return Ok(pki);
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kshard-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, &ca_key);

    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "kshard".to_string(),
    ];
    // The in-cluster Service names an aggregator dials (`<service>.<namespace>.svc`).
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "kshard-system".into());
    for svc in [
        format!("kshard.{namespace}.svc"),
        format!("kshard.{namespace}.svc.cluster.local"),
    ] {
        sans.push(svc);
    }
    sans.extend(extra_sans.iter().cloned());
    let server_key = KeyPair::generate()?;
    let mut server_params = CertificateParams::new(sans)?;
    server_params
        .distinguished_name
        .push(DnType::CommonName, "kshard");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server_params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let server_cert = server_params.signed_by(&server_key, &issuer)?;

    let admin_key = KeyPair::generate()?;
    let mut admin_params = CertificateParams::new(Vec::<String>::new())?;
    admin_params
        .distinguished_name
        .push(DnType::CommonName, "kshard-admin");
    admin_params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    admin_params.not_after = rcgen::date_time_ymd(2035, 1, 1);
    let admin_cert = admin_params.signed_by(&admin_key, &issuer)?;

    write(&pki.dir.join("ca.key"), &ca_key.serialize_pem())?;
    write(&pki.ca_cert(), &ca_cert.pem())?;
    write(&pki.server_key(), &server_key.serialize_pem())?;
    write(&pki.server_cert(), &server_cert.pem())?;
    write(&pki.admin_key(), &admin_key.serialize_pem())?;
    write(&pki.admin_cert(), &admin_cert.pem())?;
    Ok(pki)
}

/// Writes a kubeconfig for the admin identity pointing at `server` (an https URL).
pub fn write_kubeconfig(pki: &Pki, server: &str, path: &Path) -> Result<(), PkiError> {
    use base64::Engine as _;
    let read = |p: PathBuf| std::fs::read(&p).map_err(|source| PkiError::Io { path: p, source });
    let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kshard
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: kshard-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: kshard
  context:
    cluster: kshard
    user: kshard-admin
    namespace: default
current-context: kshard
",
        ca = b64(read(pki.ca_cert())?),
        cert = b64(read(pki.admin_cert())?),
        key = b64(read(pki.admin_key())?),
    );
    write(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn keys_and_kubeconfig_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let pki_dir = dir.path().join("pki");
        // A directory left open by an older version is closed again.
        std::fs::create_dir(&pki_dir).expect("dir");
        std::fs::set_permissions(&pki_dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let pki = ensure(&pki_dir, &[]).expect("pki");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, "old").expect("old kubeconfig");
        write_kubeconfig(&pki, "https://127.0.0.1:6443", &kubeconfig).expect("kubeconfig");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&pki_dir), 0o700);
        for f in [
            pki.server_key(),
            pki.admin_key(),
            pki_dir.join("ca.key"),
            kubeconfig,
        ] {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }

    #[test]
    fn serving_certificate_names_the_in_cluster_service() {
        let dir = tempfile::tempdir().expect("tmp");
        let pki = ensure(dir.path(), &["10.0.0.7".into()]).expect("pki");
        let pem = std::fs::read(pki.server_cert()).expect("cert");
        let (_, der) = x509_parser::pem::parse_x509_pem(&pem).expect("pem");
        let cert = der.parse_x509().expect("x509");
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .expect("ext")
            .expect("sans")
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        let ns = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "kshard-system".into());
        for want in [
            format!("DNSName({})", "localhost"),
            format!("DNSName(kshard.{ns}.svc)"),
        ] {
            assert!(sans.contains(&want), "{want} not in {sans:?}");
        }
        assert!(
            sans.iter().any(|s| s == "IPAddress(0a:00:00:07)"),
            "{sans:?}"
        );
    }
}
