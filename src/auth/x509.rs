//! Client certificates: verification against a CA bundle, and the identity
//! kube reads from them (CN = user, O = groups).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{path}: {reason}")]
    Load { path: String, reason: String },
}

/// A CA bundle that can verify client certificate chains.
#[derive(Clone)]
pub struct CaBundle {
    pub roots: Arc<RootCertStore>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CaBundle({} roots)", self.roots.len())
    }
}

impl CaBundle {
    pub fn load(path: &Path) -> Result<Self, CaError> {
        let pem = std::fs::read(path).map_err(|e| CaError::Load {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_pem(&pem, &path.display().to_string())
    }

    /// Parses a PEM bundle; `origin` names it in errors (a file or ConfigMap key).
    pub fn from_pem(pem: &[u8], origin: &str) -> Result<Self, CaError> {
        let err = |reason: String| CaError::Load {
            path: origin.to_string(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            roots
                .add(cert.map_err(|e| err(e.to_string()))?)
                .map_err(|e| err(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(err("no certificates".into()));
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder(roots.clone())
            .build()
            .map_err(|e| err(e.to_string()))?;
        Ok(Self { roots, verifier })
    }

    /// Whether `chain` (leaf first) chains to this bundle and is valid now.
    pub fn verifies(&self, chain: &[CertificateDer<'static>]) -> bool {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return false;
        };
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok()
    }
}

/// The subject's common name and organizations of a certificate.
pub fn subject(cert: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("")
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_string)
        .collect();
    Some((cn, orgs))
}
