//! HTTPS to webhooks (admission and conversion) trusting a `caBundle` as
//! kube-apiserver does, which is Go's `crypto/x509`, and wording TLS
//! failures in Go's words.
//!
//! The one case where Go and webpki part: a serving certificate that is
//! itself in the bundle. `openssl req -x509` makes a self-signed
//! certificate with `CA:TRUE`, and many webhook guides give it as its own
//! `caBundle`. Go trusts a leaf found in the root pool (after checking its
//! names and validity); webpki refuses a CA certificate as an end entity.
//! So a leaf byte-identical to a bundle certificate is checked here for
//! names and validity, and its handshake signature as usual; everything
//! else goes through webpki's full chain verification.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Largest webhook answer read, admission or conversion (a review holds at
/// most its objects and a patch); kube's error beyond it.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("unable to load root certificates: {0}")]
    Roots(String),
    #[error("{0}")]
    Tls(String),
}

/// The certificates of a PEM bundle, in order.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::Roots(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsSetupError::Roots(
            "no certificates in caBundle".to_string(),
        ));
    }
    Ok(certs)
}

/// An HTTPS connector for one webhook: trusting `ca_bundle` (PEM; empty:
/// the system's roots are not used, as kube then uses the host's, which a
/// shard does not have: nothing is trusted), verifying the serving
/// certificate for `server_name` when given (a dialled address resolved
/// elsewhere), else for the host dialled.
pub fn connector(
    ca_bundle: &[u8],
    server_name: Option<&str>,
    connect_timeout: Duration,
) -> Result<Connector, TlsSetupError> {
    let roots = if ca_bundle.is_empty() {
        Vec::new()
    } else {
        pem_certificates(ca_bundle)?
    };
    let verifier = GoVerifier::new(roots, server_name)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}

#[derive(Debug)]
struct GoVerifier {
    roots: Vec<CertificateDer<'static>>,
    /// webpki over the same roots; None when the bundle holds nothing
    /// webpki can anchor on (every leaf then needs the identical-root path).
    webpki: Option<Arc<WebPkiServerVerifier>>,
    name_override: Option<ServerName<'static>>,
    schemes: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl GoVerifier {
    fn new(
        roots: Vec<CertificateDer<'static>>,
        server_name: Option<&str>,
    ) -> Result<Self, TlsSetupError> {
        let mut store = RootCertStore::empty();
        let (added, _) = store.add_parsable_certificates(roots.iter().cloned());
        if !roots.is_empty() && added == 0 {
            return Err(TlsSetupError::Roots(
                "no parsable certificates in caBundle".to_string(),
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let schemes = provider.signature_verification_algorithms;
        let webpki = if store.is_empty() {
            None
        } else {
            Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
                    .build()
                    .map_err(|e| TlsSetupError::Tls(e.to_string()))?,
            )
        };
        let name_override = server_name
            .map(|n| {
                ServerName::try_from(n.to_string())
                    .map_err(|e| TlsSetupError::Tls(format!("server name {n:?}: {e}")))
            })
            .transpose()?;
        Ok(Self {
            roots,
            webpki,
            name_override,
            schemes,
        })
    }
}

/// A certificate's DNS and IP subject alternative names, and whether it
/// has a subject common name (Go's words depend on all three).
fn names_of(der: &[u8]) -> (Vec<String>, Vec<String>, bool) {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return (Vec::new(), Vec::new(), false);
    };
    let has_cn = cert.subject().iter_common_name().next().is_some();
    let (mut dns, mut ips) = (Vec::new(), Vec::new());
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) => {
                    if let Ok(a) = <[u8; 4]>::try_from(*b) {
                        ips.push(std::net::Ipv4Addr::from(a).to_string());
                    } else if let Ok(a) = <[u8; 16]>::try_from(*b) {
                        ips.push(std::net::Ipv6Addr::from(a).to_string());
                    }
                }
                _ => {}
            }
        }
    }
    (dns, ips, has_cn)
}

/// Go's words (`x509.HostnameError`) for a name the certificate does not
/// carry: an IP is matched against the IP SANs only, a host name against
/// the DNS SANs only.
fn name_mismatch(der: &[u8], name: &ServerName<'_>) -> Error {
    let wanted = name.to_str().into_owned();
    let (dns, ips, has_cn) = names_of(der);
    let detail = if dns.is_empty() && ips.is_empty() && has_cn {
        "x509: certificate relies on legacy Common Name field, use SANs instead".to_string()
    } else if matches!(name, ServerName::IpAddress(_)) {
        if ips.is_empty() {
            format!("x509: cannot validate certificate for {wanted} because it doesn't contain any IP SANs")
        } else {
            format!(
                "x509: certificate is valid for {}, not {wanted}",
                ips.join(", ")
            )
        }
    } else if dns.is_empty() {
        format!("x509: certificate is not valid for any names, but wanted to match {wanted}")
    } else {
        format!(
            "x509: certificate is valid for {}, not {wanted}",
            dns.join(", ")
        )
    };
    Error::General(detail)
}

/// Whether a certificate names itself as its issuer.
fn self_issued(der: &[u8]) -> bool {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c.issuer() == c.subject())
        .unwrap_or(false)
}

/// Go's validity check of a certificate trusted as its own root.
fn check_validity(der: &[u8], now: UnixTime) -> Result<(), Error> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Err(Error::InvalidCertificate(CertificateError::BadEncoding));
    };
    let now_secs = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let v = cert.validity();
    let rfc3339 = |t: i64| crate::timestamps::rfc3339_secs(t).unwrap_or_default();
    if now_secs > v.not_after.timestamp() {
        return Err(Error::General(format!(
            "x509: certificate has expired or is not yet valid: current time {} is after {}",
            rfc3339(now_secs),
            rfc3339(v.not_after.timestamp())
        )));
    }
    if now_secs < v.not_before.timestamp() {
        return Err(Error::General(format!(
            "x509: certificate has expired or is not yet valid: current time {} is before {}",
            rfc3339(now_secs),
            rfc3339(v.not_before.timestamp())
        )));
    }
    Ok(())
}

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let name = self.name_override.as_ref().unwrap_or(server_name);
        let name_ok = || {
            webpki::EndEntityCert::try_from(end_entity)
                .map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?
                .verify_is_valid_for_subject_name(name)
                .map_err(|_| name_mismatch(end_entity.as_ref(), name))
        };
        // A leaf that is itself in the bundle is trusted as Go trusts it.
        if self.roots.iter().any(|r| r.as_ref() == end_entity.as_ref()) {
            check_validity(end_entity.as_ref(), now)?;
            name_ok()?;
            return Ok(ServerCertVerified::assertion());
        }
        let Some(webpki) = &self.webpki else {
            return Err(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        };
        match webpki.verify_server_cert(end_entity, intermediates, name, ocsp_response, now) {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Err(name_mismatch(end_entity.as_ref(), name)),
            // A self-signed CA certificate that is not in the bundle: Go
            // finds no chain to a root ("unknown authority"); webpki stops
            // earlier, at the CA flag.
            Err(Error::InvalidCertificate(CertificateError::Other(o)))
                if matches!(
                    o.0.downcast_ref::<webpki::Error>(),
                    Some(webpki::Error::CaUsedAsEndEntity)
                ) && self_issued(end_entity.as_ref()) =>
            {
                Err(Error::InvalidCertificate(CertificateError::UnknownIssuer))
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.schemes)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.schemes)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.supported_schemes()
    }
}

/// A failure to reach a webhook as Go's HTTP client words it after
/// `Post "<url>": ` (refused connections, certificate problems); others
/// as they come.
pub fn describe(err: &(dyn std::error::Error + 'static), dial: &str) -> String {
    // Every error in the chain, looking inside io::Errors too: their
    // source() skips the error they wrap.
    let mut chain: Vec<&(dyn std::error::Error + 'static)> = Vec::new();
    let mut todo: Vec<&(dyn std::error::Error + 'static)> = vec![err];
    while let Some(e) = todo.pop() {
        chain.push(e);
        if let Some(next) = e.source() {
            todo.push(next);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            todo.push(inner);
        }
    }
    for e in &chain {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return format!("dial tcp {dial}: connect: connection refused");
            }
        }
        if let Some(tls) = e.downcast_ref::<Error>() {
            return match tls {
                Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    "tls: failed to verify certificate: x509: certificate signed by unknown authority"
                        .into()
                }
                Error::General(go) if go.starts_with("x509: ") => {
                    format!("tls: failed to verify certificate: {go}")
                }
                other => format!("remote error: tls: {other}"),
            };
        }
    }
    chain
        .last()
        .map(|e| e.to_string())
        .unwrap_or_else(|| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed_ca(sans: &[&str]) -> (CertificateDer<'static>, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("cert");
        (cert.der().clone(), cert.pem())
    }

    #[test]
    fn a_self_signed_ca_leaf_in_its_own_bundle_is_trusted_for_its_names_only() {
        let (der, pem) = self_signed_ca(&["hooks.test.svc", "127.0.0.1"]);
        let v = GoVerifier::new(pem_certificates(pem.as_bytes()).expect("pem"), None)
            .expect("verifier");
        let now = UnixTime::now();
        let name = |n: &str| ServerName::try_from(n.to_string()).expect("name");
        assert!(v
            .verify_server_cert(&der, &[], &name("hooks.test.svc"), &[], now)
            .is_ok());
        assert!(v
            .verify_server_cert(&der, &[], &name("127.0.0.1"), &[], now)
            .is_ok());
        let err = v
            .verify_server_cert(&der, &[], &name("other.svc"), &[], now)
            .expect_err("wrong name");
        assert_eq!(
            err,
            Error::General("x509: certificate is valid for hooks.test.svc, not other.svc".into())
        );
        // Another self-signed certificate is not trusted by this bundle.
        let (stranger, _) = self_signed_ca(&["hooks.test.svc"]);
        assert!(v
            .verify_server_cert(&stranger, &[], &name("hooks.test.svc"), &[], now)
            .is_err());
    }
}
