//! Who is asking, as k8s.io/apiserver's delegating authenticator decides it,
//! in its order: a front proxy whose client certificate chains to the
//! requestheader CA (and whose CN is allowed) names the user in `X-Remote-*`
//! headers; else a client certificate from the client CA (CN user, O groups;
//! an empty CN names nobody); else a bearer token the host confirms with a
//! TokenReview; else anonymous (`system:anonymous`), or 401 with
//! `--anonymous-auth=false`. Credentials presented but not accepted are 401.
//! Standalone, the client CA is kshard's generated one. The CAs and header
//! names come from flags or from the host's
//! `extension-apiserver-authentication` ConfigMap (`configmap`), swapped in
//! place when it changes. Authorization and impersonation are in `crate::authz`.

pub mod configmap;
pub mod token;
pub mod x509;

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use rustls::pki_types::CertificateDer;

pub use x509::{CaBundle, CaError};

pub const GROUP_MASTERS: &str = "system:masters";
/// How long a TokenReview or SubjectAccessReview sent to the host may take:
/// k8s.io/apiserver's delegating options' `TokenRequestTimeout` and
/// authorization `ClientTimeout` (10 s each). Without it a hung host holds
/// the request, and its flow-control seat, until the request's deadline.
pub const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: String,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    pub fn dev_admin() -> Self {
        Self {
            user: "system:admin".into(),
            groups: vec![GROUP_MASTERS.into(), GROUP_AUTHENTICATED.into()],
            uid: String::new(),
            extra: BTreeMap::new(),
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == GROUP_MASTERS)
    }
}

/// How a request's user was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A front proxy (the host's aggregator) named the user in `X-Remote-*` headers.
    FrontProxy,
    ClientCertificate,
    Token,
    Anonymous,
    /// The dev authenticator (no delegation configured).
    Dev,
}

/// The dev authenticator: the admin identity, or whom the admin impersonates.
pub fn authenticate_dev(headers: &HeaderMap) -> Identity {
    let admin = Identity::dev_admin();
    let Some(user) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    else {
        return admin;
    };
    let mut groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    // kube adds system:authenticated to impersonated users (not to system:anonymous).
    if user != "system:anonymous" && !groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
        groups.push(GROUP_AUTHENTICATED.into());
    }
    Identity {
        user: user.to_string(),
        groups,
        uid: headers
            .get("impersonate-uid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        extra: BTreeMap::new(),
    }
}

/// The client certificate chain of a TLS connection (leaf first), with the
/// verdicts of the CA bundles that checked it: every request on the
/// connection presents the same chain, so it is checked once per bundle
/// (a digest of the chain and a shared cache's lock per request before).
#[derive(Clone, Debug, Default)]
pub struct PeerCertificates(Arc<PeerChain>);

#[derive(Default)]
struct PeerChain {
    chain: Vec<CertificateDer<'static>>,
    /// By bundle id; two at most (the client CA and the front proxy's).
    verdicts: std::sync::Mutex<Vec<(u64, x509::Verdict)>>,
}

impl std::fmt::Debug for PeerChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PeerChain({} certificates)", self.chain.len())
    }
}

/// Verdicts a connection keeps at most (bundles are replaced on reload).
const PEER_VERDICTS_MAX: usize = 4;

impl PeerCertificates {
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        Self(Arc::new(PeerChain {
            chain,
            verdicts: Default::default(),
        }))
    }

    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.0.chain
    }

    /// `ca.verify(chain)`, remembered for this connection until the verdict
    /// expires (as the bundle's own cache does).
    pub fn verified_by(&self, ca: &CaBundle) -> Option<Arc<x509::Subject>> {
        let now = std::time::SystemTime::now();
        {
            let verdicts = self.0.verdicts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, v)) = verdicts
                .iter()
                .find(|(id, v)| *id == ca.id() && now < v.until)
            {
                return v.subject.clone();
            }
        }
        let verdict = ca.verdict(&self.0.chain);
        let subject = verdict.subject.clone();
        let mut verdicts = self.0.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        verdicts.retain(|(id, v)| *id != ca.id() && now < v.until);
        if verdicts.len() >= PEER_VERDICTS_MAX {
            verdicts.remove(0);
        }
        verdicts.push((ca.id(), verdict));
        subject
    }
}

/// Front-proxy (requestheader) settings, with k8s.io/apiserver's flag defaults.
#[derive(Clone, Debug)]
pub struct RequestHeader {
    pub ca: CaBundle,
    /// Allowed proxy certificate CNs; empty allows any certificate from `ca`.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_headers_prefix: Vec<String>,
}

impl RequestHeader {
    pub fn new(ca: CaBundle) -> Self {
        Self {
            ca,
            allowed_names: Vec::new(),
            username_headers: vec!["X-Remote-User".into()],
            uid_headers: vec!["X-Remote-Uid".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_headers_prefix: vec!["X-Remote-Extra-".into()],
        }
    }
}

/// The CAs and front-proxy settings in force; replaced whole when they change.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    pub client_ca: Option<CaBundle>,
    pub request_header: Option<RequestHeader>,
}

/// The current [`AuthConfig`], readable from every request and swapped by the
/// ConfigMap watch; `loaded` turns true once the first configuration is in.
#[derive(Debug)]
pub struct DynamicConfig {
    current: std::sync::RwLock<Arc<AuthConfig>>,
    loaded: std::sync::atomic::AtomicBool,
}

impl DynamicConfig {
    pub fn new(initial: AuthConfig, loaded: bool) -> Self {
        Self {
            current: std::sync::RwLock::new(Arc::new(initial)),
            loaded: loaded.into(),
        }
    }

    pub fn get(&self) -> Arc<AuthConfig> {
        self.current
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    pub fn set(&self, config: AuthConfig) {
        let mut cur = self.current.write().unwrap_or_else(|e| e.into_inner());
        *cur = Arc::new(config);
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[derive(Clone, Debug, Default)]
pub enum Authenticator {
    /// Every request is the admin (in-process tests and tools only; `serve`
    /// authenticates certificates even standalone).
    #[default]
    Dev,
    Delegating {
        config: Arc<DynamicConfig>,
        tokens: Option<Arc<token::TokenReviewer>>,
        anonymous: Anonymous,
    },
}

/// What a request without credentials is (kube's `--anonymous-auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anonymous {
    /// 401, whatever the path.
    Refused,
    /// `system:anonymous` in `system:unauthenticated`: the authorizer decides.
    Allowed,
}

fn anonymous_identity() -> Identity {
    Identity {
        user: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
        uid: String::new(),
        extra: BTreeMap::new(),
    }
}

/// kube's 401 answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Unauthorized")]
pub struct Unauthorized;

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect()
}

/// Whether `name` (a header name, lowercase as `http` keeps them) starts
/// with `prefix`, compared without case and without allocating: this runs
/// for every header of every request.
fn has_prefix_ignore_case(name: &str, prefix: &str) -> bool {
    let (name, prefix) = (name.as_bytes(), prefix.as_bytes());
    // The first byte rejects most headers (`accept`, `user-agent`) cheaply.
    match (name.first(), prefix.first()) {
        (_, None) => true,
        (Some(n), Some(p)) if n.eq_ignore_ascii_case(p) => {
            name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
        }
        _ => false,
    }
}

/// Removes the request headers a front proxy may set, whoever sent them.
/// The named headers are removed by name (a lookup each); only a request
/// that carries a header with an extra prefix pays for collecting names.
/// `has_extra_header` is whether the request carries an extra header, when a scan
/// of the headers already found out.
fn strip_request_headers(
    headers: &mut HeaderMap,
    rh: &RequestHeader,
    has_extra_header: Option<bool>,
) {
    for name in rh
        .username_headers
        .iter()
        .chain(&rh.uid_headers)
        .chain(&rh.group_headers)
    {
        headers.remove(name.as_str());
    }
    let has_extra = |k: &HeaderName| {
        rh.extra_headers_prefix
            .iter()
            .any(|p| has_prefix_ignore_case(k.as_str(), p))
    };
    if has_extra_header.unwrap_or_else(|| headers.keys().any(has_extra)) {
        let names: Vec<HeaderName> = headers.keys().filter(|k| has_extra(k)).cloned().collect();
        for n in names {
            headers.remove(n);
        }
    }
}

fn unescape_path(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

impl Authenticator {
    pub fn is_dev(&self) -> bool {
        matches!(self, Authenticator::Dev)
    }

    /// Whether the authentication configuration is in (always, in dev mode).
    pub fn is_loaded(&self) -> bool {
        match self {
            Authenticator::Dev => true,
            Authenticator::Delegating { config, .. } => config.is_loaded(),
        }
    }

    /// Authenticates a request (removing any front-proxy headers from it, and
    /// the bearer token once it has been accepted).
    pub async fn authenticate(
        &self,
        headers: &mut HeaderMap,
        peer: Option<&PeerCertificates>,
    ) -> Result<(Identity, Via), Unauthorized> {
        let Authenticator::Delegating {
            config,
            tokens,
            anonymous,
        } = self
        else {
            return Ok((authenticate_dev(headers), Via::Dev));
        };
        // Credentials presented but not accepted are 401, never anonymous
        // (kube's union of authenticators fails on their error).
        let mut rejected = false;
        let config = config.get();
        let mut identity = None;
        let mut via = Via::Anonymous;
        if let Some(rh) = &config.request_header {
            // Whether the request carries extra headers, when a scan of its
            // headers already told (one scan a request, not two).
            let mut has_extra = None;
            if is_trusted_proxy(rh, peer) {
                (identity, has_extra) = from_request_headers(rh, headers);
                if identity.is_some() {
                    via = Via::FrontProxy;
                }
            }
            // The headers are only ever trusted above; never pass them on.
            strip_request_headers(headers, rh, has_extra);
        }
        if identity.is_none() {
            if let (Some(ca), Some(peer)) =
                (&config.client_ca, peer.filter(|p| !p.chain().is_empty()))
            {
                // A certificate that does not chain to the client CA (a front
                // proxy's that named no user included) is an error, as kube's
                // x509 authenticator makes it.
                match peer.verified_by(ca) {
                    None => rejected = true,
                    // kube: a certificate without a common name names no user.
                    Some(s) if !s.common_name.is_empty() => {
                        via = Via::ClientCertificate;
                        identity = Some(Identity {
                            user: s.common_name.clone(),
                            groups: s.organizations.clone(),
                            uid: String::new(),
                            extra: BTreeMap::new(),
                        });
                    }
                    Some(_) => {}
                }
            }
        }
        if identity.is_none() {
            if let (Some(reviewer), Some(token)) = (tokens, bearer_token(headers)) {
                match reviewer.review(&token).await {
                    Ok(Some(id)) => {
                        headers.remove(http::header::AUTHORIZATION);
                        via = Via::Token;
                        identity = Some(id);
                    }
                    Ok(None) => rejected = true,
                    Err(e) => {
                        rejected = true;
                        tracing::warn!(error = %e, "TokenReview failed");
                    }
                }
            }
        }
        match identity {
            Some(mut id) => {
                if !id.groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
                    id.groups.push(GROUP_AUTHENTICATED.into());
                }
                Ok((id, via))
            }
            None if rejected => Err(Unauthorized),
            None => match anonymous {
                Anonymous::Allowed => Ok((anonymous_identity(), Via::Anonymous)),
                // As kube with --anonymous-auth=false: probes too.
                Anonymous::Refused => Err(Unauthorized),
            },
        }
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// A front proxy: a certificate chaining to the requestheader CA with an allowed CN.
fn is_trusted_proxy(rh: &RequestHeader, peer: Option<&PeerCertificates>) -> bool {
    peer.and_then(|p| p.verified_by(&rh.ca))
        .is_some_and(|s| rh.allowed_names.is_empty() || rh.allowed_names.contains(&s.common_name))
}

/// The identity the front proxy's headers name, and whether the request
/// carries any extra header when the headers were scanned for them (so that
/// stripping them needs no second scan).
fn from_request_headers(
    rh: &RequestHeader,
    headers: &HeaderMap,
) -> (Option<Identity>, Option<bool>) {
    let Some(user) = rh
        .username_headers
        .iter()
        .find_map(|h| header_values(headers, h).into_iter().next())
    else {
        return (None, None);
    };
    let groups = rh
        .group_headers
        .iter()
        .flat_map(|h| header_values(headers, h))
        .collect();
    let uid = rh
        .uid_headers
        .iter()
        .find_map(|h| header_values(headers, h).into_iter().next())
        .unwrap_or_default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut has_extra = false;
    for (k, v) in headers.iter() {
        let k = k.as_str();
        for p in &rh.extra_headers_prefix {
            if has_prefix_ignore_case(k, p) {
                has_extra = true;
                let key = &k[p.len()..];
                if let Ok(v) = v.to_str() {
                    extra
                        .entry(unescape_path(key).to_lowercase())
                        .or_default()
                        .push(v.to_string());
                }
            }
        }
    }
    let id = Identity {
        user,
        groups,
        uid,
        extra,
    };
    (Some(id), Some(has_extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impersonation_in_dev_mode() {
        let mut h = HeaderMap::new();
        assert!(authenticate_dev(&h).is_master());
        h.insert("impersonate-user", "alice".parse().expect("hv"));
        h.append("impersonate-group", "tenants".parse().expect("hv"));
        let id = authenticate_dev(&h);
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, ["tenants", GROUP_AUTHENTICATED]);
        assert!(!id.is_master());
    }

    /// The front proxy's headers are read whatever their case and whatever
    /// the configured prefix's case, and every one of them is removed.
    #[test]
    fn front_proxy_headers_are_read_and_stripped() {
        let dir = tempfile::tempdir().expect("dir");
        let pki = crate::server::pki::ensure(dir.path(), &[]).expect("pki");
        let mut rh = RequestHeader::new(CaBundle::load(&pki.ca_cert()).expect("ca"));
        rh.extra_headers_prefix = vec!["x-remote-extra-".into(), "X-Other-".into()];
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("X-Remote-User", "alice"),
            ("x-remote-group", "tenants"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Extra-Scopes", "a"),
            ("x-remote-extra-scopes", "b"),
            ("X-Remote-Extra-Acme.com%2Fproject", "p1"),
            ("x-other-k", "v"),
            ("x-remote", "not a front-proxy header"),
            ("accept", "application/json"),
        ] {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        let (id, has_extra) = from_request_headers(&rh, &h);
        let id = id.expect("identity");
        assert_eq!(has_extra, Some(true));
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, ["tenants", "system:authenticated"]);
        assert_eq!(id.extra["scopes"], ["a", "b"]);
        assert_eq!(id.extra["acme.com/project"], ["p1"]);
        assert_eq!(id.extra["k"], ["v"]);
        // Stripped whether the identity scan found the extras or not.
        for known in [Some(true), None] {
            let mut h = h.clone();
            strip_request_headers(&mut h, &rh, known);
            let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
            left.sort_unstable();
            assert_eq!(left, ["accept", "x-remote"]);
        }
        // A request without extras says so, and without a user is not scanned.
        strip_request_headers(&mut h, &rh, None);
        h.insert("x-remote-user", "alice".parse().expect("value"));
        let (id, has_extra) = from_request_headers(&rh, &h);
        assert_eq!((id.is_some(), has_extra), (true, Some(false)));
        h.remove("x-remote-user");
        let (id, has_extra) = from_request_headers(&rh, &h);
        assert_eq!((id.is_some(), has_extra), (false, None));
    }
}
