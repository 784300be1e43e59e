//! TLS for the API port: a serving certificate reloaded when its files change
//! (cert-manager renews it in place), and, when authentication is delegated,
//! client certificates requested but judged per request, as kube-apiserver
//! does: the CAs that decide what a certificate may assert can change while
//! the server runs (ConfigMap rotation), so the handshake only checks that the
//! client holds the certificate's key.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// How often a handshake may look at the files' modification times.
const RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct TlsFileError {
    path: String,
    reason: String,
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsFileError> {
    let err = |p: &Path, reason: String| TlsFileError {
        path: p.display().to_string(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| err(cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(err(cert, "no certificates".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| err(key, e.to_string()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key_der)
        .map_err(|e| err(key, e.to_string()))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match().map_err(|e| err(key, e.to_string()))?;
    Ok(Arc::new(ck))
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

struct Loaded {
    checked: Instant,
    stamps: (Option<SystemTime>, Option<SystemTime>),
    key: Arc<CertifiedKey>,
}

/// The serving certificate from a cert/key file pair, reloaded after they
/// change; a half-written pair keeps the previous certificate in use.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .finish()
    }
}

impl ReloadingCert {
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Self, TlsFileError> {
        let ck = load(&cert, &key)?;
        let stamps = (modified(&cert), modified(&key));
        Ok(Self {
            loaded: Mutex::new(Loaded {
                checked: Instant::now(),
                stamps,
                key: ck,
            }),
            cert,
            key,
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        let mut l = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if l.checked.elapsed() >= RECHECK {
            l.checked = Instant::now();
            let stamps = (modified(&self.cert), modified(&self.key));
            if stamps != l.stamps {
                match load(&self.cert, &self.key) {
                    Ok(k) => {
                        tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                        l.key = k;
                        l.stamps = stamps;
                    }
                    Err(e) => tracing::warn!(error = %e, "serving certificate not reloaded"),
                }
            }
        }
        l.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Asks for a client certificate, accepts any, and checks only that the
/// client signed the handshake with its key; authentication decides later
/// which CA (if any) it chains to.
#[derive(Debug)]
pub struct RequestClientCert {
    provider: Arc<CryptoProvider>,
}

impl RequestClientCert {
    pub fn new() -> Self {
        Self {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        }
    }
}

impl Default for RequestClientCert {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The server's rustls configuration: h2 and HTTP/1.1, the reloading
/// certificate, and client certificates requested when `request_client_certs`.
pub fn server_config(
    cert: Arc<ReloadingCert>,
    request_client_certs: bool,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(go_ordered_provider()))
        .with_safe_default_protocol_versions()?;
    let builder = if request_client_certs {
        builder.with_client_cert_verifier(Arc::new(RequestClientCert::new()))
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    // The server's order decides, as Go's crypto/tls does for kube-apiserver.
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// ring's cipher suites in the order Go's crypto/tls prefers them on
/// hardware with AES instructions: AES-128-GCM, then ChaCha20-Poly1305 (TLS
/// 1.3) or AES-256-GCM (TLS 1.2), then the rest. kube-apiserver therefore
/// settles on AES-128-GCM with every client that offers it, whatever the
/// client's own order (rustls and OpenSSL clients list AES-256 first); it is
/// also the cheaper cipher for every byte a watch sends.
fn go_ordered_provider() -> CryptoProvider {
    use rustls::CipherSuite as S;
    let rank = |s: S| match s {
        S::TLS13_AES_128_GCM_SHA256 => 0,
        S::TLS13_CHACHA20_POLY1305_SHA256 => 1,
        S::TLS13_AES_256_GCM_SHA384 => 2,
        S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => 10,
        S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 11,
        S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => 12,
        S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 13,
        S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => 14,
        S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => 15,
        _ => 20,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    // Stable: suites of equal rank keep ring's order.
    provider.cipher_suites.sort_by_key(|c| rank(c.suite()));
    provider
}
