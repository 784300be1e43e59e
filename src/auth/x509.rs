//! Client certificates: verification against a CA bundle, and the identity
//! kube reads from them (CN = user, O = groups).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

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
    /// Chains verified lately: every request on a connection presents the
    /// same chain, and a signature check per request (tens of microseconds
    /// of P-256 arithmetic) was a fifth of a create's CPU. A reloaded bundle
    /// is a new `CaBundle` with an empty cache.
    verified: Arc<Mutex<HashMap<[u8; 32], Verdict>>>,
    /// Unique per loaded bundle, so that a connection's remembered verdict
    /// (`PeerCertificates::verified_by`) is never taken for another bundle's.
    id: u64,
}

/// The next bundle's `id`.
static NEXT_BUNDLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[derive(Clone)]
pub(crate) struct Verdict {
    /// The leaf's subject when the chain verified; `None` when it did not.
    pub(crate) subject: Option<Arc<Subject>>,
    pub(crate) until: SystemTime,
}

/// Who a verified leaf certificate names: kube reads CN as the user and O
/// as the groups. Parsed once per chain verdict, not per request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
}

/// How long a verdict is reused (never past the leaf's expiry).
const VERDICT_TTL: Duration = Duration::from_secs(60);
/// Chains remembered at most; the cache is emptied when full.
const VERDICTS_MAX: usize = 4096;

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
        Ok(Self {
            roots,
            verifier,
            verified: Arc::default(),
            id: NEXT_BUNDLE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Whether `chain` (leaf first) chains to this bundle and is valid now.
    pub fn verifies(&self, chain: &[CertificateDer<'static>]) -> bool {
        self.verify(chain).is_some()
    }

    /// The leaf's subject when `chain` (leaf first) chains to this bundle
    /// and is valid now; `None` otherwise.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> Option<Arc<Subject>> {
        self.verdict(chain).subject
    }

    /// This bundle's identity, for verdicts remembered elsewhere.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The verdict on `chain` and until when it holds.
    pub(crate) fn verdict(&self, chain: &[CertificateDer<'static>]) -> Verdict {
        let now = SystemTime::now();
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Verdict {
                subject: None,
                until: now + VERDICT_TTL,
            };
        };
        let key = chain_digest(chain);
        {
            let cache = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = cache.get(&key).filter(|v| now < v.until) {
                return v.clone();
            }
        }
        let ok = self
            .verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok();
        let mut until = now + VERDICT_TTL;
        let subject = if ok {
            if let Some(expiry) = not_after(leaf) {
                until = until.min(expiry);
            }
            Some(Arc::new(subject(leaf).unwrap_or_default()))
        } else {
            None
        };
        let mut cache = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= VERDICTS_MAX {
            cache.clear();
        }
        let verdict = Verdict { subject, until };
        cache.insert(key, verdict.clone());
        verdict
    }
}

fn chain_digest(chain: &[CertificateDer<'_>]) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for c in chain {
        h.update((c.len() as u64).to_be_bytes());
        h.update(c.as_ref());
    }
    h.finalize().into()
}

fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let secs = u64::try_from(parsed.validity().not_after.timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// The subject's common name and organizations of a certificate.
pub fn subject(cert: &CertificateDer<'_>) -> Option<Subject> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("")
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_string)
        .collect();
    Some(Subject {
        common_name,
        organizations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem_chain(path: &Path) -> Vec<CertificateDer<'static>> {
        let pem = std::fs::read(path).expect("read");
        CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .expect("pem")
    }

    /// Two PKIs (CA and certificates) in temporary directories (kept
    /// while the returned guard lives).
    fn two_pkis() -> (
        [tempfile::TempDir; 2],
        crate::server::pki::Pki,
        crate::server::pki::Pki,
    ) {
        let dirs = [
            tempfile::tempdir().expect("a"),
            tempfile::tempdir().expect("b"),
        ];
        let pa = crate::server::pki::ensure(dirs[0].path(), &[]).expect("pki a");
        let pb = crate::server::pki::ensure(dirs[1].path(), &[]).expect("pki b");
        (dirs, pa, pb)
    }

    #[test]
    fn a_verdict_is_reused_for_the_same_chain_and_only_by_its_own_bundle() {
        let (_dirs, pa, pb) = two_pkis();
        let ca_a = CaBundle::load(&pa.ca_cert()).expect("ca a");
        let ca_b = CaBundle::load(&pb.ca_cert()).expect("ca b");
        let admin_a = pem_chain(&pa.admin_cert());
        for _ in 0..3 {
            assert!(ca_a.verifies(&admin_a));
            assert!(!ca_b.verifies(&admin_a), "another CA's verdict is its own");
        }
        assert_eq!(ca_a.verified.lock().map(|c| c.len()).unwrap_or(0), 1);
        // The remembered verdict lasts no longer than the certificate.
        let until = ca_a
            .verified
            .lock()
            .expect("lock")
            .values()
            .next()
            .expect("one")
            .until;
        let expiry = not_after(&admin_a[0]).expect("not after");
        assert!(until <= expiry && until <= SystemTime::now() + VERDICT_TTL);
        assert!(!ca_a.verifies(&[]), "no chain, no user");
    }

    #[test]
    fn a_connection_remembers_each_bundles_verdict_and_not_a_reloaded_ones() {
        let (_dirs, pa, pb) = two_pkis();
        let ca_a = CaBundle::load(&pa.ca_cert()).expect("ca a");
        let ca_b = CaBundle::load(&pb.ca_cert()).expect("ca b");
        let conn = crate::auth::PeerCertificates::new(pem_chain(&pa.admin_cert()));
        for _ in 0..3 {
            let s = conn.verified_by(&ca_a).expect("verified by its CA");
            assert!(!s.common_name.is_empty());
            assert!(conn.verified_by(&ca_b).is_none(), "another CA's verdict");
        }
        // Only the connection's memo answered the repeats: the bundle's
        // shared cache was asked once.
        assert_eq!(ca_a.verified.lock().map(|c| c.len()).unwrap_or(0), 1);
        ca_a.verified.lock().expect("lock").clear();
        assert!(conn.verified_by(&ca_a).is_some());
        assert_eq!(ca_a.verified.lock().map(|c| c.len()).unwrap_or(0), 0);
        // A bundle loaded again from other CAs (a rotated ConfigMap) is a
        // bundle of its own: the connection's verdict for the old one is
        // not taken for it.
        let rotated = CaBundle::load(&pb.ca_cert()).expect("rotated");
        assert!(conn.verified_by(&rotated).is_none());
    }
}
