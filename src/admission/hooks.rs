//! Where the webhook configuration comes from, and its compiled form.
//!
//! Standalone, kshard serves `admissionregistration.k8s.io/v1`
//! MutatingWebhookConfiguration and ValidatingWebhookConfiguration itself
//! (built-in CRDs, `crd.rs`), and [`Source::local`] follows the stored
//! objects through the watch cache. Behind a host, [`Source::host`] follows
//! the host's objects with kube-rs reflectors. Either way each change is
//! compiled into a new [`Hooks`] snapshot at once (no polling); requests read
//! the latest snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::Value;
use tokio::sync::watch;

use super::matching::{Conditions, Criteria, NamedRule, Rule, Selector};
use crate::backoff::Backoff;
use crate::registry::{Registry, WatchStart};
use crate::status::ApiError;
use crate::storage::EventType;

pub const GROUP: &str = "admissionregistration.k8s.io";
pub const MUTATING: &str = "mutatingwebhookconfigurations";
pub const VALIDATING: &str = "validatingwebhookconfigurations";
pub const POLICIES: &str = "validatingadmissionpolicies";
pub const BINDINGS: &str = "validatingadmissionpolicybindings";
/// kube's default and largest `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_TIMEOUT_SECONDS: i32 = 30;

/// Where a webhook is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Url(String),
    Service {
        namespace: String,
        name: String,
        path: String,
        port: u16,
    },
    /// Neither or both (kube's validation refuses it; a host may still hold one).
    Invalid,
}

impl Endpoint {
    fn from_api(c: &WebhookClientConfig) -> Self {
        match (&c.url, &c.service) {
            (Some(u), None) => Endpoint::Url(u.clone()),
            (None, Some(s)) => Endpoint::Service {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                path: s.path.clone().unwrap_or_default(),
                port: s.port.and_then(|p| u16::try_from(p).ok()).unwrap_or(443),
            },
            _ => Endpoint::Invalid,
        }
    }
}

/// One webhook, compiled.
#[derive(Debug)]
pub struct Hook {
    /// kube's accessor UID: `<configuration>/<webhook>/<index>`.
    pub uid: String,
    pub configuration: String,
    pub name: String,
    /// Its rules, match policy and selectors.
    pub criteria: Criteria,
    /// `failurePolicy: Ignore` (default Fail).
    pub ignore_failures: bool,
    /// `None`, `NoneOnDryRun`, `Some`, `Unknown`, or empty when unset.
    pub side_effects: String,
    pub timeout: Duration,
    pub review_versions: Vec<String>,
    /// `reinvocationPolicy: IfNeeded` (mutating webhooks).
    pub reinvoke_if_needed: bool,
    pub endpoint: Endpoint,
    /// `caBundle` (PEM); empty: the system's roots.
    pub ca_bundle: Vec<u8>,
    pub conditions: Conditions,
}

/// The fields both webhook kinds share.
struct Common<'a> {
    name: &'a str,
    client: &'a WebhookClientConfig,
    rules: Option<&'a Vec<k8s_openapi::api::admissionregistration::v1::RuleWithOperations>>,
    failure_policy: Option<&'a str>,
    match_policy: Option<&'a str>,
    namespace_selector: Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    object_selector: Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    side_effects: &'a str,
    timeout_seconds: Option<i32>,
    review_versions: &'a [String],
    conditions: Option<&'a Vec<k8s_openapi::api::admissionregistration::v1::MatchCondition>>,
}

impl Hook {
    fn compile(configuration: &str, index: usize, c: Common<'_>, reinvoke: bool) -> Self {
        Hook {
            uid: format!("{configuration}/{}/{index}", c.name),
            configuration: configuration.to_string(),
            name: c.name.to_string(),
            criteria: Criteria {
                namespace_selector: Selector::parse(c.namespace_selector),
                object_selector: Selector::parse(c.object_selector),
                rules: c
                    .rules
                    .into_iter()
                    .flatten()
                    .map(|r| NamedRule::any_name(Rule::from_api(r)))
                    .collect(),
                exclude: Vec::new(),
                equivalent: c.match_policy != Some("Exact"),
                all_without_rules: false,
            },
            ignore_failures: c.failure_policy == Some("Ignore"),
            side_effects: c.side_effects.to_string(),
            timeout: match c.timeout_seconds {
                Some(s) if s > 0 => Duration::from_secs(s.min(MAX_TIMEOUT_SECONDS) as u64),
                _ => DEFAULT_TIMEOUT,
            },
            review_versions: c.review_versions.to_vec(),
            reinvoke_if_needed: reinvoke,
            endpoint: Endpoint::from_api(c.client),
            ca_bundle: c
                .client
                .ca_bundle
                .as_ref()
                .map(|b| b.0.clone())
                .unwrap_or_default(),
            conditions: Conditions::compile(c.conditions),
        }
    }

    pub fn mutating(configuration: &str, index: usize, w: &MutatingWebhook) -> Self {
        let reinvoke = w.reinvocation_policy.as_deref() == Some("IfNeeded");
        Self::compile(
            configuration,
            index,
            Common {
                name: &w.name,
                client: &w.client_config,
                rules: w.rules.as_ref(),
                failure_policy: w.failure_policy.as_deref(),
                match_policy: w.match_policy.as_deref(),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds,
                review_versions: &w.admission_review_versions,
                conditions: w.match_conditions.as_ref(),
            },
            reinvoke,
        )
    }

    pub fn validating(configuration: &str, index: usize, w: &ValidatingWebhook) -> Self {
        Self::compile(
            configuration,
            index,
            Common {
                name: &w.name,
                client: &w.client_config,
                rules: w.rules.as_ref(),
                failure_policy: w.failure_policy.as_deref(),
                match_policy: w.match_policy.as_deref(),
                namespace_selector: w.namespace_selector.as_ref(),
                object_selector: w.object_selector.as_ref(),
                side_effects: &w.side_effects,
                timeout_seconds: w.timeout_seconds,
                review_versions: &w.admission_review_versions,
                conditions: w.match_conditions.as_ref(),
            },
            false,
        )
    }
}

/// Every webhook in force, in kube's order: configurations sorted by name,
/// webhooks in their configuration's order.
/// Validating admission policies with their bindings, by name.
#[derive(Debug, Default)]
pub struct Hooks {
    pub mutating: Vec<Arc<Hook>>,
    pub validating: Vec<Arc<Hook>>,
    pub policies: Vec<super::policy::PolicyHook>,
}

impl Hooks {
    pub fn compile(
        mutating: &BTreeMap<String, MutatingWebhookConfiguration>,
        validating: &BTreeMap<String, ValidatingWebhookConfiguration>,
    ) -> Self {
        Self::compile_all(mutating, validating, &BTreeMap::new(), &BTreeMap::new())
    }

    pub fn compile_all(
        mutating: &BTreeMap<String, MutatingWebhookConfiguration>,
        validating: &BTreeMap<String, ValidatingWebhookConfiguration>,
        policies: &BTreeMap<String, ValidatingAdmissionPolicy>,
        bindings: &BTreeMap<String, ValidatingAdmissionPolicyBinding>,
    ) -> Self {
        let mut hooks = Hooks {
            policies: super::policy::compile(policies, bindings),
            ..Default::default()
        };
        for (name, c) in mutating {
            for (i, w) in c.webhooks.iter().flatten().enumerate() {
                hooks.mutating.push(Arc::new(Hook::mutating(name, i, w)));
            }
        }
        for (name, c) in validating {
            for (i, w) in c.webhooks.iter().flatten().enumerate() {
                hooks
                    .validating
                    .push(Arc::new(Hook::validating(name, i, w)));
            }
        }
        hooks
    }
}

/// The configuration in force, and whether it has been read whole yet.
#[derive(Clone)]
pub struct Source {
    hooks: watch::Receiver<Arc<Hooks>>,
    synced: watch::Receiver<bool>,
    /// Kinds the host does not let kshard follow (not served, or not
    /// permitted), with what would fix it; served as if empty meanwhile.
    missing: watch::Receiver<Missing>,
}

/// Kind (plural) → why it is not followed and what would fix it.
pub type Missing = BTreeMap<&'static str, String>;

/// Every kind's objects by name (a BTreeMap: kube's name order).
#[derive(Default)]
struct Objects {
    mutating: BTreeMap<String, MutatingWebhookConfiguration>,
    validating: BTreeMap<String, ValidatingWebhookConfiguration>,
    policies: BTreeMap<String, ValidatingAdmissionPolicy>,
    bindings: BTreeMap<String, ValidatingAdmissionPolicyBinding>,
}

impl Objects {
    fn compile(&self) -> Arc<Hooks> {
        Arc::new(Hooks::compile_all(
            &self.mutating,
            &self.validating,
            &self.policies,
            &self.bindings,
        ))
    }

    fn apply(&mut self, plural: &str, kind: EventType, obj: &Value) {
        match plural {
            MUTATING => apply_local(&mut self.mutating, kind, obj),
            VALIDATING => apply_local(&mut self.validating, kind, obj),
            POLICIES => apply_local(&mut self.policies, kind, obj),
            _ => apply_local(&mut self.bindings, kind, obj),
        }
    }
}

impl Source {
    /// A fixed configuration (tests).
    pub fn fixed(hooks: Hooks) -> Self {
        let (_, h) = watch::channel(Arc::new(hooks));
        let (_, s) = watch::channel(true);
        let (_, missing) = watch::channel(Missing::new());
        Self {
            hooks: h,
            synced: s,
            missing,
        }
    }

    /// What is not followed and why (for `/readyz?verbose`).
    pub fn missing(&self) -> Missing {
        self.missing.borrow().clone()
    }

    pub fn current(&self) -> Arc<Hooks> {
        self.hooks.borrow().clone()
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits up to `limit` for the first complete read (kube's admission
    /// plugins wait up to 10 s for their informers).
    pub async fn wait_synced(&self, limit: Duration) -> bool {
        let mut synced = self.synced.clone();
        tokio::time::timeout(limit, synced.wait_for(|s| *s))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Follows the configuration objects kshard stores itself.
    pub fn local(registry: Arc<Registry>) -> (Self, tokio::task::JoinHandle<()>) {
        let (hooks_tx, hooks) = watch::channel(Arc::new(Hooks::default()));
        let (synced_tx, synced) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
            loop {
                // A watch that ended (its watcher fell behind) starts over
                // after a moment from a fresh list; a failure to start backs off.
                let wait = match follow_local(&registry, &hooks_tx, &synced_tx).await {
                    Ok(()) => {
                        backoff.reset();
                        Duration::from_millis(100)
                    }
                    Err(e) => {
                        let wait = backoff.next_delay();
                        tracing::warn!(error = %e, retry_in = ?wait, "following webhook configurations");
                        wait
                    }
                };
                tokio::time::sleep(wait).await;
            }
        });
        let (_, missing) = watch::channel(Missing::new());
        (
            Self {
                hooks,
                synced,
                missing,
            },
            task,
        )
    }

    /// Follows the host's configuration objects.
    pub fn host(client: kube::Client) -> (Self, tokio::task::JoinHandle<()>) {
        let (hooks_tx, hooks) = watch::channel(Arc::new(Hooks::default()));
        let (synced_tx, synced) = watch::channel(false);
        let (missing_tx, missing) = watch::channel(Missing::new());
        let task = tokio::spawn(follow_host(client, hooks_tx, synced_tx, missing_tx));
        (
            Self {
                hooks,
                synced,
                missing,
            },
            task,
        )
    }
}

/// One pass of following the stored objects: both kinds' current state,
/// then their changes, until a watch ends (a watcher that fell behind is
/// closed by the cache; the next pass starts over from a fresh list).
async fn follow_local(
    registry: &Registry,
    hooks: &watch::Sender<Arc<Hooks>>,
    synced: &watch::Sender<bool>,
) -> Result<(), ApiError> {
    let subscribe = |plural: &'static str| async move {
        let id = format!("{GROUP}/{plural}");
        match registry
            .watch(
                &id,
                crate::watch::Filter::everything(),
                WatchStart::InitialConsistent,
            )
            .await?
        {
            crate::registry::Watch::Started(sub) => Ok(sub),
            crate::registry::Watch::Expired(e) => Err(e),
        }
    };
    let mut subs = Vec::new();
    for plural in [MUTATING, VALIDATING, POLICIES, BINDINGS] {
        subs.push((plural, subscribe(plural).await?));
    }
    let mut objects = Objects::default();
    for (plural, sub) in &mut subs {
        for ev in sub.initial.drain(..) {
            objects.apply(plural, ev.kind, &ev.object.value());
        }
    }
    hooks.send_replace(objects.compile());
    synced.send_replace(true);
    // One stream of every kind's events; the end of any watch (`None`)
    // ends the pass.
    let mut events = futures::stream::select_all(subs.into_iter().map(|(plural, sub)| {
        sub.rx
            .into_events()
            .map(move |ev| (plural, Some(ev)))
            .chain(futures::stream::once(async move { (plural, None) }))
            .boxed()
    }));
    while let Some((plural, ev)) = events.next().await {
        let Some(ev) = ev else {
            return Ok(());
        };
        objects.apply(plural, ev.kind, &ev.object.value());
        hooks.send_replace(objects.compile());
    }
    Ok(())
}

fn apply_local<K: serde::de::DeserializeOwned>(
    into: &mut BTreeMap<String, K>,
    kind: EventType,
    obj: &Value,
) {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if kind == EventType::Deleted {
        into.remove(&name);
        return;
    }
    match serde_json::from_value::<K>(obj.clone()) {
        Ok(k) => {
            into.insert(name, k);
        }
        // The CRD's schema admits only what decodes; a stored object that
        // does not is left out (and said so) rather than stopping the rest.
        Err(e) => {
            tracing::error!(%name, error = %e, "webhook configuration does not decode; ignored")
        }
    }
}

fn by_name<K: kube::Resource + Clone>(objs: Vec<Arc<K>>) -> BTreeMap<String, K> {
    objs.into_iter()
        .map(|o| (kube::ResourceExt::name_any(&*o), (*o).clone()))
        .collect()
}

/// A reflector's events as one kind of change.
fn reflect<K>(
    api: kube::Api<K>,
    writer: reflector::store::Writer<K>,
    kind: &'static str,
) -> futures::stream::BoxStream<'static, (&'static str, Result<bool, watcher::Error>)>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    )
    .map(move |e| (kind, e.map(|ev| matches!(ev, watcher::Event::InitDone))))
    .boxed()
}

/// Why the host refuses kshard a kind for good (until someone changes the
/// host): not served (a host before 1.30 has no v1 admission policies) or
/// not permitted by kshard's RBAC. Other errors are passing and retried.
fn lasting_refusal(kind: &str, e: &watcher::Error) -> Option<String> {
    let (watcher::Error::InitialListFailed(kube::Error::Api(s))
    | watcher::Error::WatchStartFailed(kube::Error::Api(s))
    | watcher::Error::WatchFailed(kube::Error::Api(s))) = e
    else {
        return None;
    };
    match s.code {
        403 => Some(format!(
            "forbidden: kshard's ServiceAccount needs get, list and watch on admissionregistration.k8s.io {kind} (manifests/base/rbac.yaml, ClusterRole kshard)"
        )),
        404 => Some(format!(
            "not served by the host: admissionregistration.k8s.io/v1 {kind} needs Kubernetes 1.30 or later"
        )),
        _ => None,
    }
}

async fn follow_host(
    client: kube::Client,
    hooks: watch::Sender<Arc<Hooks>>,
    synced: watch::Sender<bool>,
    missing: watch::Sender<Missing>,
) {
    let (mutating, mutating_writer) = reflector::store::<MutatingWebhookConfiguration>();
    let (validating, validating_writer) = reflector::store::<ValidatingWebhookConfiguration>();
    let (policies, policies_writer) = reflector::store::<ValidatingAdmissionPolicy>();
    let (bindings, bindings_writer) = reflector::store::<ValidatingAdmissionPolicyBinding>();
    let mut changes = futures::stream::select_all([
        reflect(kube::Api::all(client.clone()), mutating_writer, MUTATING),
        reflect(
            kube::Api::all(client.clone()),
            validating_writer,
            VALIDATING,
        ),
        reflect(kube::Api::all(client.clone()), policies_writer, POLICIES),
        reflect(kube::Api::all(client), bindings_writer, BINDINGS),
    ]);
    // Nothing is in force until every kind has been listed once.
    let mut listed = std::collections::HashSet::new();
    while let Some((kind, change)) = changes.next().await {
        match change {
            Ok(true) => {
                listed.insert(kind);
                if missing.send_if_modified(|m| m.remove(kind).is_some()) {
                    tracing::info!(kind, "now following the host's admission configuration");
                }
            }
            Ok(false) => {}
            Err(e) => match lasting_refusal(kind, &e) {
                // Serve with what the host gives: enforce the kinds that
                // can be read, say once what is missing, and keep retrying
                // (the reflector backs off) so a later fix is picked up.
                Some(reason) if !listed.contains(kind) || missing.borrow().contains_key(kind) => {
                    if !missing.borrow().contains_key(kind) {
                        tracing::warn!(kind, %reason, "not enforcing the host's admission objects of this kind");
                        missing.send_modify(|m| {
                            m.insert(kind, reason);
                        });
                    }
                    listed.insert(kind);
                }
                _ => {
                    tracing::warn!(error = %e, kind, "watching the host's admission configuration");
                    continue;
                }
            },
        }
        if listed.len() < 4 {
            continue;
        }
        let objects = Objects {
            mutating: by_name(mutating.state()),
            validating: by_name(validating.state()),
            policies: by_name(policies.state()),
            bindings: by_name(bindings.state()),
        };
        hooks.send_replace(objects.compile());
        synced.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hooks_are_in_kube_order_with_kube_defaults() {
        let config = |name: &str, hooks: &[&str]| -> MutatingWebhookConfiguration {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "webhooks": hooks.iter().map(|h| json!({
                    "name": h, "sideEffects": "None", "admissionReviewVersions": ["v1"],
                    "clientConfig": {"service": {"namespace": "ns", "name": "svc"}},
                })).collect::<Vec<_>>(),
            }))
            .expect("config")
        };
        let mut m = BTreeMap::new();
        m.insert("b".to_string(), config("b", &["b1.x.io", "b2.x.io"]));
        m.insert("a".to_string(), config("a", &["a1.x.io"]));
        let hooks = Hooks::compile(&m, &BTreeMap::new());
        let uids: Vec<&str> = hooks.mutating.iter().map(|h| h.uid.as_str()).collect();
        assert_eq!(uids, ["a/a1.x.io/0", "b/b1.x.io/0", "b/b2.x.io/1"]);
        let h = &hooks.mutating[0];
        assert!(!h.ignore_failures && h.criteria.equivalent && !h.reinvoke_if_needed);
        assert_eq!(h.timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            h.endpoint,
            Endpoint::Service {
                namespace: "ns".into(),
                name: "svc".into(),
                path: String::new(),
                port: 443
            }
        );
    }
}
