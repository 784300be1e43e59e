//! `audit.k8s.io/v1` Policy: which requests are recorded, and how much of
//! them. Rules are tried in order and the first that matches decides the
//! level; a request no rule matches is not recorded (level `None`), as in
//! k8s.io/apiserver's policy checker.

use serde::Deserialize;

/// How much of a request is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Default)]
pub enum Level {
    #[default]
    None,
    /// Who, what, when: user, verb, resource, response code.
    Metadata,
    /// Metadata and the request body.
    Request,
    /// Metadata, the request body and the response body.
    RequestResponse,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

/// Points in a request's life at which an event is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum Stage {
    RequestReceived,
    /// Long-running requests only (watch): the headers are sent, the body streams.
    ResponseStarted,
    ResponseComplete,
    Panic,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    pub level: Level,
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub user_groups: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub resources: Vec<GroupResources>,
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    #[serde(default)]
    pub omit_stages: Vec<Stage>,
    #[serde(default)]
    pub omit_managed_fields: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("reading audit policy {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("audit policy {path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// The request as the policy sees it.
#[derive(Debug, Clone, Default)]
pub struct Attributes<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    pub resource_request: bool,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub path: &'a str,
}

/// What the policy decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub level: Level,
    pub omit_stages: Vec<Stage>,
    pub omit_managed_fields: bool,
}

impl Decision {
    pub fn records(&self, stage: Stage) -> bool {
        self.level > Level::None && !self.omit_stages.contains(&stage)
    }
}

impl Policy {
    /// Reads a policy file (YAML or JSON), as `--audit-policy-file`.
    pub fn load(path: &std::path::Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| PolicyError::Invalid {
            path: path.display().to_string(),
            reason,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let policy: Policy = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if policy.kind != "Policy" {
            return Err(format!("kind {:?} is not Policy", policy.kind));
        }
        if !matches!(
            policy.api_version.as_str(),
            "audit.k8s.io/v1" | "audit.k8s.io/v1beta1"
        ) {
            return Err(format!(
                "apiVersion {:?} is not audit.k8s.io/v1",
                policy.api_version
            ));
        }
        for (i, r) in policy.rules.iter().enumerate() {
            if !r.resources.is_empty() && !r.non_resource_urls.is_empty() {
                return Err(format!(
                    "rules[{i}]: rules cannot apply to both regular resources and non-resource URLs"
                ));
            }
            if r.non_resource_urls.iter().any(|u| {
                u.is_empty()
                    || (u.contains('*') && !(u.ends_with('*') && u.matches('*').count() == 1))
            }) {
                return Err(format!(
                    "rules[{i}].nonResourceURLs: only a trailing * is allowed"
                ));
            }
        }
        Ok(policy)
    }

    /// The first matching rule's level, the policy's and the rule's omitted
    /// stages together, and the rule's `omitManagedFields` over the policy's.
    pub fn evaluate(&self, a: &Attributes) -> Decision {
        for rule in &self.rules {
            if rule.matches(a) {
                let mut omit_stages = self.omit_stages.clone();
                for s in &rule.omit_stages {
                    if !omit_stages.contains(s) {
                        omit_stages.push(*s);
                    }
                }
                return Decision {
                    level: rule.level,
                    omit_stages,
                    omit_managed_fields: rule
                        .omit_managed_fields
                        .unwrap_or(self.omit_managed_fields),
                };
            }
        }
        Decision {
            level: Level::None,
            omit_stages: self.omit_stages.clone(),
            omit_managed_fields: self.omit_managed_fields,
        }
    }
}

impl PolicyRule {
    fn matches(&self, a: &Attributes) -> bool {
        if !self.users.is_empty() && !self.users.iter().any(|u| u == a.user) {
            return false;
        }
        if !self.user_groups.is_empty() && !self.user_groups.iter().any(|g| a.groups.contains(g)) {
            return false;
        }
        if !self.verbs.is_empty() && !self.verbs.iter().any(|v| v == a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return a.resource_request && self.matches_resource(a);
        }
        if !self.non_resource_urls.is_empty() {
            return !a.resource_request && self.matches_path(a.path);
        }
        true
    }

    fn matches_resource(&self, a: &Attributes) -> bool {
        // "" in namespaces stands for cluster-scoped requests.
        if !self.namespaces.is_empty() && !self.namespaces.iter().any(|n| n == a.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let full = if a.subresource.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.resources.iter().any(|gr| {
            if gr.group != "*" && gr.group != a.group {
                return false;
            }
            let names_ok = gr.resource_names.is_empty() || gr.resource_names.iter().any(|n| n == a.name);
            let resource_ok = gr.resources.is_empty()
                || gr.resources.iter().any(|r| {
                    r == "*"
                        || *r == full
                        // "pods/*": every subresource of pods (not pods itself)
                        || (r.strip_suffix("/*").is_some_and(|p| p == a.resource) && !a.subresource.is_empty())
                        // "*/status": the status subresource of every resource
                        || r.strip_prefix("*/").is_some_and(|s| s == a.subresource)
                });
            names_ok && resource_ok
        })
    }

    fn matches_path(&self, path: &str) -> bool {
        self.non_resource_urls
            .iter()
            .any(|u| match u.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => u == path,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    users: ["system:kube-proxy"]
  - level: None
    nonResourceURLs: ["/healthz*", "/version"]
  - level: RequestResponse
    resources:
      - group: demo.kshard.dev
        resources: ["widgets/status"]
  - level: Request
    verbs: ["create", "update", "patch"]
    resources:
      - group: demo.kshard.dev
        resources: ["widgets"]
        resourceNames: ["w1"]
  - level: Metadata
    userGroups: ["devs"]
    namespaces: ["team-a"]
    omitStages: ["ResponseStarted"]
    omitManagedFields: true
  - level: Metadata
    resources:
      - group: "*"
        resources: ["*/scale"]
  - level: Metadata
    nonResourceURLs: ["/metrics"]
"#;

    fn attrs<'a>(verb: &'a str, resource: &'a str, sub: &'a str, name: &'a str) -> Attributes<'a> {
        Attributes {
            user: "alice",
            groups: &[],
            verb,
            resource_request: true,
            group: "demo.kshard.dev",
            resource,
            subresource: sub,
            namespace: "default",
            name,
            path: "/apis/demo.kshard.dev/v1/namespaces/default/widgets",
        }
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = Policy::parse(POLICY).expect("policy");
        let d = p.evaluate(&attrs("update", "widgets", "status", "w9"));
        assert_eq!(d.level, Level::RequestResponse);
        assert_eq!(d.omit_stages, [Stage::RequestReceived]);
        assert!(!d.records(Stage::RequestReceived) && d.records(Stage::ResponseComplete));
        assert_eq!(
            p.evaluate(&attrs("create", "widgets", "", "w1")).level,
            Level::Request
        );
        // resourceNames and verbs both narrow the rule
        assert_eq!(
            p.evaluate(&attrs("create", "widgets", "", "w2")).level,
            Level::None
        );
        assert_eq!(
            p.evaluate(&attrs("get", "widgets", "", "w1")).level,
            Level::None
        );
        // "*/scale" over every group
        assert_eq!(
            p.evaluate(&attrs("get", "widgets", "scale", "w1")).level,
            Level::Metadata
        );
    }

    #[test]
    fn users_groups_namespaces_and_stage_union() {
        let p = Policy::parse(POLICY).expect("policy");
        let groups = vec!["devs".to_string()];
        let mut a = attrs("list", "widgets", "", "");
        a.groups = &groups;
        assert_eq!(
            p.evaluate(&a).level,
            Level::None,
            "namespace default is not team-a"
        );
        a.namespace = "team-a";
        let d = p.evaluate(&a);
        assert_eq!(d.level, Level::Metadata);
        assert_eq!(
            d.omit_stages,
            [Stage::RequestReceived, Stage::ResponseStarted]
        );
        assert!(d.omit_managed_fields);
        let mut proxy = attrs("create", "widgets", "status", "x");
        proxy.user = "system:kube-proxy";
        assert_eq!(p.evaluate(&proxy).level, Level::None);
    }

    #[test]
    fn non_resource_urls() {
        let p = Policy::parse(POLICY).expect("policy");
        let mut a = attrs("get", "", "", "");
        a.resource_request = false;
        for (path, level) in [
            ("/healthz", Level::None),
            ("/healthz/ping", Level::None),
            ("/version", Level::None),
            ("/metrics", Level::Metadata),
            ("/metricsx", Level::None),
        ] {
            a.path = path;
            assert_eq!(p.evaluate(&a).level, level, "{path}");
        }
    }

    #[test]
    fn invalid_policies_are_refused() {
        assert!(Policy::parse("kind: Policy\napiVersion: v1\n").is_err());
        assert!(Policy::parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Bogus\n"
        )
        .is_err());
        let both = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: [/x]\n  resources: [{group: ''}]\n";
        assert!(Policy::parse(both).is_err());
        let star = "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: ['/a*b']\n";
        assert!(Policy::parse(star).is_err());
    }
}
