//! Bearer tokens, confirmed by the host cluster with a TokenReview (as
//! k8s.io/apiserver's delegating token authenticator does). Answers, good and
//! bad, are cached for a short time so a busy client costs the host one review
//! per interval, not one per request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use sha2::{Digest, Sha256};

use super::Identity;

/// k8s.io/apiserver's default for delegated authentication.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(10);
/// Entries kept before expired ones are swept.
const CACHE_SWEEP_AT: usize = 4096;

#[derive(Debug, thiserror::Error)]
#[error("TokenReview: {0}")]
pub struct ReviewError(String);

/// When an answer was given, and who the token turned out to be (if anyone).
type Answer = (Instant, Option<Identity>);

pub struct TokenReviewer {
    client: kube::Client,
    ttl: Duration,
    /// Keyed by the token's SHA-256, never the token itself.
    cache: Mutex<HashMap<[u8; 32], Answer>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl TokenReviewer {
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The user behind `token`, or `None` when the host says it is not valid.
    pub async fn review(&self, token: &str) -> Result<Option<Identity>, ReviewError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((at, id)) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            if now.duration_since(*at) < self.ttl {
                return Ok(id.clone());
            }
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer = tokio::time::timeout(
            crate::auth::REVIEW_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| ReviewError("the host did not answer the review in time".into()))?
        .map_err(|e| ReviewError(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        let id = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(Identity {
                user: u.username.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                extra: u
                    .extra
                    .unwrap_or_default()
                    .into_iter()
                    .collect::<BTreeMap<_, _>>(),
            }),
            _ => None,
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_SWEEP_AT {
            let ttl = self.ttl;
            cache.retain(|_, (at, _)| now.duration_since(*at) < ttl);
        }
        cache.insert(key, (now, id.clone()));
        Ok(id)
    }
}
