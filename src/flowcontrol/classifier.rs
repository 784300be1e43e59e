//! Maps a request to (FlowSchema, priority level, flow): schemas in
//! (precedence, name) order, first match wins, dangling schemas skipped.

use std::collections::HashSet;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::types::*;

/// What APF needs to know about a request: the authenticated user and the
/// parsed request info. Built by the HTTP layer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestDigest {
    pub user: String,
    pub groups: Vec<String>,
    pub is_resource: bool,
    /// kube verb for resource requests (get, list, watch, create, ...), the
    /// lowercase HTTP method for non-resource requests.
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
    /// Long-running requests other than watch (exec, proxy, portforward...)
    /// bypass APF entirely.
    pub is_long_running_non_watch: bool,
}

/// The result of classification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classification {
    pub flow_schema: Arc<FlowSchema>,
    pub priority_level: Arc<str>,
    /// Empty unless the level has more than one queue.
    pub distinguisher: String,
    pub flow_hash: u64,
}

/// First 8 bytes, little endian, of sha256(schema ‖ 0x00 ‖ distinguisher).
pub fn flow_hash(schema: &str, distinguisher: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(schema.as_bytes());
    h.update([0u8]);
    h.update(distinguisher.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

const SA_PREFIX: &str = "system:serviceaccount:";

pub fn matches_subject(s: &Subject, digest: &RequestDigest) -> bool {
    match s.kind.as_str() {
        SUBJECT_USER => s
            .user
            .as_ref()
            .is_some_and(|u| u.name == WILDCARD || u.name == digest.user),
        SUBJECT_GROUP => s
            .group
            .as_ref()
            .is_some_and(|g| g.name == WILDCARD || digest.groups.contains(&g.name)),
        SUBJECT_SERVICE_ACCOUNT => s.service_account.as_ref().is_some_and(|sa| {
            let Some(rest) = digest.user.strip_prefix(SA_PREFIX) else {
                return false;
            };
            let Some((ns, name)) = rest.split_once(':') else {
                return false;
            };
            ns == sa.namespace && (sa.name == WILDCARD || name == sa.name)
        }),
        _ => false,
    }
}

fn contains_or_wildcard(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == WILDCARD || v == value)
}

pub fn matches_resource_rule(r: &ResourcePolicyRule, d: &RequestDigest) -> bool {
    if !contains_or_wildcard(&r.verbs, &d.verb)
        || !contains_or_wildcard(&r.api_groups, &d.api_group)
    {
        return false;
    }
    let resource_ok = if d.subresource.is_empty() {
        contains_or_wildcard(&r.resources, &d.resource)
    } else {
        r.resources.iter().any(|x| {
            x == WILDCARD
                || (x.len() == d.resource.len() + 1 + d.subresource.len()
                    && x.starts_with(d.resource.as_str())
                    && x.as_bytes()[d.resource.len()] == b'/'
                    && x.ends_with(d.subresource.as_str()))
        })
    };
    if !resource_ok {
        return false;
    }
    if d.namespace.is_empty() {
        r.cluster_scope
    } else {
        contains_or_wildcard(&r.namespaces, &d.namespace)
    }
}

/// `*` matches all; `/x` matches `/x` and `/x/...`; `/x/*` matches `/x/...`.
pub fn matches_non_resource_url(rule_url: &str, path: &str) -> bool {
    if rule_url == WILDCARD || rule_url == path {
        return true;
    }
    let prefix = rule_url.strip_suffix('*').unwrap_or(rule_url);
    if prefix.ends_with('/') {
        path.starts_with(prefix)
    } else {
        path.len() > prefix.len()
            && path.starts_with(prefix)
            && path.as_bytes()[prefix.len()] == b'/'
    }
}

pub fn matches_non_resource_rule(r: &NonResourcePolicyRule, d: &RequestDigest) -> bool {
    contains_or_wildcard(&r.verbs, &d.verb)
        && r.non_resource_urls
            .iter()
            .any(|u| matches_non_resource_url(u, &d.path))
}

pub fn matches_rules(rules: &PolicyRulesWithSubjects, d: &RequestDigest) -> bool {
    if !rules.subjects.iter().any(|s| matches_subject(s, d)) {
        return false;
    }
    if d.is_resource {
        rules
            .resource_rules
            .iter()
            .any(|r| matches_resource_rule(r, d))
    } else {
        rules
            .non_resource_rules
            .iter()
            .any(|r| matches_non_resource_rule(r, d))
    }
}

pub fn matches_flow_schema(fs: &FlowSchema, d: &RequestDigest) -> bool {
    fs.spec.rules.iter().any(|r| matches_rules(r, d))
}

/// An immutable classification table built from one configuration.
#[derive(Debug, Clone)]
pub struct Classifier {
    /// Non-dangling schemas in (precedence, name) order, each with its level.
    schemas: Vec<(Arc<FlowSchema>, Arc<str>, bool)>,
    dangling: Vec<String>,
}

impl Classifier {
    /// `queues_of(level)` gives the level's queue count (None if the level
    /// does not exist); it decides danglingness and whether the flow
    /// distinguisher is needed.
    pub fn new(schemas: &[FlowSchema], queues_of: impl Fn(&str) -> Option<usize>) -> Self {
        let mut sorted: Vec<&FlowSchema> = schemas.iter().collect();
        sorted.sort_by(|a, b| {
            (a.spec.matching_precedence, &a.metadata.name)
                .cmp(&(b.spec.matching_precedence, &b.metadata.name))
        });
        let mut out = Vec::with_capacity(sorted.len());
        let mut dangling = Vec::new();
        let mut seen = HashSet::new();
        for fs in sorted {
            if !seen.insert(fs.metadata.name.clone()) {
                continue;
            }
            let level = &fs.spec.priority_level_configuration.name;
            match queues_of(level) {
                Some(q) => out.push((Arc::new(fs.clone()), Arc::from(level.as_str()), q > 1)),
                None => dangling.push(fs.metadata.name.clone()),
            }
        }
        Classifier {
            schemas: out,
            dangling,
        }
    }

    /// Names of schemas whose priority level is missing (status Dangling=True).
    pub fn dangling(&self) -> &[String] {
        &self.dangling
    }

    pub fn schemas(&self) -> impl Iterator<Item = &FlowSchema> {
        self.schemas.iter().map(|(fs, _, _)| fs.as_ref())
    }

    pub fn classify(&self, d: &RequestDigest) -> Option<Classification> {
        let (fs, level, multi_queue) = self
            .schemas
            .iter()
            .find(|(fs, _, _)| matches_flow_schema(fs, d))?;
        let (distinguisher, flow_hash_value) = if *multi_queue {
            let dist = match fs
                .spec
                .distinguisher_method
                .as_ref()
                .map(|m| m.type_.as_str())
            {
                Some(BY_USER) => d.user.clone(),
                Some(BY_NAMESPACE) => d.namespace.clone(),
                _ => String::new(),
            };
            let h = flow_hash(&fs.metadata.name, &dist);
            (dist, h)
        } else {
            (String::new(), 0)
        };
        Some(Classification {
            flow_schema: fs.clone(),
            priority_level: level.clone(),
            distinguisher,
            flow_hash: flow_hash_value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::bootstrap;
    use super::*;

    fn digest(user: &str, groups: &[&str]) -> RequestDigest {
        RequestDigest {
            user: user.into(),
            groups: groups.iter().map(|s| s.to_string()).collect(),
            is_resource: true,
            verb: "get".into(),
            resource: "pods".into(),
            namespace: "default".into(),
            ..Default::default()
        }
    }

    fn bootstrap_classifier() -> Classifier {
        let levels = bootstrap::all_priority_levels();
        Classifier::new(&bootstrap::all_flow_schemas(), |name| {
            levels
                .iter()
                .find(|l| l.metadata.name == name)
                .map(|l| l.queuing().map_or(1, |q| q.queues as usize))
        })
    }

    #[test]
    fn bootstrap_classification() {
        let c = bootstrap_classifier();
        let cases: Vec<(RequestDigest, &str)> = vec![
            (
                digest("admin", &["system:masters", "system:authenticated"]),
                "exempt",
            ),
            (digest("alice", &["system:authenticated"]), "global-default"),
            (
                digest("anon", &["system:unauthenticated"]),
                "global-default",
            ),
            (digest("nobody", &[]), ""),
            (
                digest("system:node:n1", &["system:nodes", "system:authenticated"]),
                "system-nodes",
            ),
            (
                RequestDigest {
                    resource: "nodes".into(),
                    subresource: "status".into(),
                    namespace: "".into(),
                    ..digest("system:node:n1", &["system:nodes"])
                },
                "system-node-high",
            ),
            (
                digest("system:kube-scheduler", &["system:authenticated"]),
                "kube-scheduler",
            ),
            (
                RequestDigest {
                    api_group: "coordination.k8s.io".into(),
                    resource: "leases".into(),
                    namespace: "kube-system".into(),
                    ..digest("system:kube-scheduler", &["system:authenticated"])
                },
                "system-leader-election",
            ),
            (
                digest(
                    "system:serviceaccount:kube-system:foo",
                    &["system:serviceaccounts"],
                ),
                "kube-system-service-accounts",
            ),
            (
                digest(
                    "system:serviceaccount:apps:foo",
                    &["system:serviceaccounts"],
                ),
                "service-accounts",
            ),
            (
                RequestDigest {
                    is_resource: false,
                    path: "/healthz/etcd".into(),
                    ..digest("x", &["system:unauthenticated"])
                },
                "probes",
            ),
            (
                RequestDigest {
                    is_resource: false,
                    verb: "post".into(),
                    path: "/healthz".into(),
                    ..digest("x", &["system:unauthenticated"])
                },
                "global-default",
            ),
        ];
        for (d, want) in cases {
            let got = c
                .classify(&d)
                .map(|r| r.flow_schema.metadata.name.clone())
                .unwrap_or_default();
            assert_eq!(got, want, "{d:?}");
        }
    }

    #[test]
    fn order_is_precedence_then_name() {
        let mut a = bootstrap::global_default_like("b-schema", 50, "global-default");
        let mut b = bootstrap::global_default_like("a-schema", 50, "workload-low");
        a.apply_defaults();
        b.apply_defaults();
        let mut low = bootstrap::global_default_like("later", 60, "system");
        low.apply_defaults();
        let c = Classifier::new(&[low, a, b], |_| Some(64));
        let r = c.classify(&digest("u", &["system:authenticated"])).unwrap();
        assert_eq!(r.flow_schema.metadata.name, "a-schema");
        assert_eq!(&*r.priority_level, "workload-low");
    }

    #[test]
    fn dangling_schemas_are_skipped_and_reported() {
        let fs1 = bootstrap::global_default_like("first", 10, "missing-level");
        let fs2 = bootstrap::global_default_like("second", 20, "present");
        let c = Classifier::new(&[fs1, fs2], |n| (n == "present").then_some(1));
        assert_eq!(c.dangling(), &["first".to_string()]);
        let r = c.classify(&digest("u", &["system:authenticated"])).unwrap();
        assert_eq!(r.flow_schema.metadata.name, "second");
        // One queue: no distinguisher, no hash.
        assert_eq!(r.distinguisher, "");
        assert_eq!(r.flow_hash, 0);
    }

    #[test]
    fn distinguishers_and_hash() {
        let c = bootstrap_classifier();
        let r = c
            .classify(&digest("alice", &["system:authenticated"]))
            .unwrap();
        assert_eq!(r.distinguisher, "alice");
        assert_eq!(r.flow_hash, flow_hash("global-default", "alice"));
        let r = c.classify(&digest("system:kube-scheduler", &[])).unwrap();
        assert_eq!(r.distinguisher, "default");
        // Hash input is schema ‖ 0x00 ‖ distinguisher: verify against sha256 directly.
        let d = Sha256::digest(b"global-default\0alice");
        assert_eq!(
            flow_hash("global-default", "alice"),
            u64::from_le_bytes(d[..8].try_into().unwrap())
        );
        assert_ne!(flow_hash("ab", "c"), flow_hash("a", "bc"));
    }

    #[test]
    fn subject_matching() {
        let d = digest("system:serviceaccount:ns1:sa1", &["g1"]);
        assert!(matches_subject(&Subject::service_account("ns1", "sa1"), &d));
        assert!(matches_subject(&Subject::service_account("ns1", "*"), &d));
        assert!(!matches_subject(&Subject::service_account("ns2", "*"), &d));
        assert!(!matches_subject(
            &Subject::service_account("ns1", "sa2"),
            &d
        ));
        assert!(!matches_subject(
            &Subject::service_account("ns1", "*"),
            &digest("system:serviceaccount:ns10:sa1", &[])
        ));
        assert!(matches_subject(&Subject::user("*"), &d));
        assert!(matches_subject(&Subject::group("g1"), &d));
        assert!(matches_subject(&Subject::group("*"), &digest("x", &[])));
        assert!(!matches_subject(&Subject::group("g2"), &d));
        assert!(!matches_subject(
            &Subject::user("system:serviceaccount:ns1"),
            &d
        ));
    }

    #[test]
    fn resource_rule_matching() {
        let rule = ResourcePolicyRule {
            verbs: vec!["get".into(), "list".into()],
            api_groups: vec!["apps".into()],
            resources: vec!["deployments".into(), "deployments/scale".into()],
            cluster_scope: false,
            namespaces: vec!["prod".into()],
        };
        let base = RequestDigest {
            is_resource: true,
            verb: "get".into(),
            api_group: "apps".into(),
            resource: "deployments".into(),
            namespace: "prod".into(),
            ..Default::default()
        };
        assert!(matches_resource_rule(&rule, &base));
        assert!(matches_resource_rule(
            &rule,
            &RequestDigest {
                subresource: "scale".into(),
                ..base.clone()
            }
        ));
        assert!(!matches_resource_rule(
            &rule,
            &RequestDigest {
                subresource: "status".into(),
                ..base.clone()
            }
        ));
        assert!(!matches_resource_rule(
            &rule,
            &RequestDigest {
                verb: "watch".into(),
                ..base.clone()
            }
        ));
        assert!(!matches_resource_rule(
            &rule,
            &RequestDigest {
                api_group: "".into(),
                ..base.clone()
            }
        ));
        assert!(!matches_resource_rule(
            &rule,
            &RequestDigest {
                namespace: "dev".into(),
                ..base.clone()
            }
        ));
        // Cluster-scoped requests need clusterScope.
        assert!(!matches_resource_rule(
            &rule,
            &RequestDigest {
                namespace: "".into(),
                ..base.clone()
            }
        ));
        let cluster = ResourcePolicyRule {
            cluster_scope: true,
            namespaces: vec![],
            ..rule.clone()
        };
        assert!(matches_resource_rule(
            &cluster,
            &RequestDigest {
                namespace: "".into(),
                ..base.clone()
            }
        ));
        assert!(!matches_resource_rule(&cluster, &base));
        let wild = ResourcePolicyRule {
            namespaces: vec!["*".into()],
            resources: vec!["*".into()],
            ..rule
        };
        assert!(matches_resource_rule(
            &wild,
            &RequestDigest {
                namespace: "any".into(),
                subresource: "x".into(),
                ..base
            }
        ));
    }

    #[test]
    fn non_resource_url_matching() {
        for (rule, path, want) in [
            ("/healthz", "/healthz", true),
            ("/healthz", "/healthz/etcd", true),
            ("/healthz", "/healthzz", false),
            ("/apis/*", "/apis/apps", true),
            ("/apis/*", "/apis/", true),
            ("/apis/*", "/apis", false),
            ("*", "/anything", true),
            ("/", "/", true),
            ("/", "/x", true),
        ] {
            assert_eq!(matches_non_resource_url(rule, path), want, "{rule} {path}");
        }
    }
}
