//! Test PKI and TLS plumbing shared by the harnesses: certificate
//! authorities that issue client and serving certificates (rcgen), an HTTPS
//! server for an axum app (webhook and conversion servers, the host double),
//! and kubeconfig files.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A certificate authority for tests.
pub struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pub pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("ca").pem();
        Ca { params, key, pem }
    }

    /// A client certificate (PEM cert, PEM key).
    pub fn client(&self, cn: &str, orgs: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let issuer = Issuer::from_params(&self.params, &self.key);
        (
            params.signed_by(&key, &issuer).expect("cert").pem(),
            key.serialize_pem(),
        )
    }

    /// A serving certificate for `sans` (PEM cert, PEM key).
    pub fn server(&self, sans: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, sans[0]);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let issuer = Issuer::from_params(&self.params, &self.key);
        (
            params.signed_by(&key, &issuer).expect("cert").pem(),
            key.serialize_pem(),
        )
    }
}

/// Serves `app` over HTTPS on a free loopback port with a certificate of
/// `ca` for `sans` (HTTP/2 and HTTP/1.1, upgrades allowed).
pub async fn serve_https(
    ca: &Ca,
    sans: &[&str],
    app: axum::Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let (cert, key) = ca.server(sans);
    serve_https_with(&cert, &key, app).await
}

/// Serves `app` over HTTPS with this certificate and key (PEM).
pub async fn serve_https_with(
    cert: &str,
    key: &str,
    app: axum::Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certs");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let mut tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("tls");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            });
        }
    });
    (addr, task)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `server` trusting `ca_pem`, with a token or a client certificate.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    token: Option<&str>,
    cert: Option<&(String, String)>,
) {
    let mut user = String::new();
    if let Some(t) = token {
        user.push_str(&format!("    token: {t}\n"));
    }
    if let Some((c, k)) = cert {
        user.push_str(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(c),
            b64(k)
        ));
    }
    if user.is_empty() {
        user.push_str("    username: nobody\n");
    }
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: c\n  context: {{cluster: k, user: u, namespace: default}}\ncurrent-context: c\n",
        b64(ca_pem)
    );
    std::fs::write(path, kc).expect("kubeconfig");
}
