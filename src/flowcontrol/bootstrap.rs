//! The built-in configuration: mandatory objects (exempt, catch-all) and the
//! suggested ones, as in kube-apiserver's `apis/flowcontrol/bootstrap`, plus
//! the pure decision logic of the maintenance pass the controller runs.

use sha2::{Digest, Sha256};

use super::types::*;

/// Deterministic UID for a built-in object, so that every replica and every
/// restart reports the same `X-Kubernetes-PF-*-UID` before the objects exist
/// in storage.
pub fn stable_uid(kind: &str, name: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"kshard.flowcontrol/");
    h.update(kind.as_bytes());
    h.update([0]);
    h.update(name.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    // Shape it as an RFC 4122 version-5-style UUID (name based, SHA).
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn meta(kind: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: name.into(),
        uid: stable_uid(kind, name),
        generation: 1,
        annotations: [(AUTO_UPDATE_ANNOTATION.to_string(), "true".to_string())].into(),
        ..Default::default()
    }
}

fn queued_level(
    name: &str,
    shares: i32,
    lendable: i32,
    queues: i32,
    hand: i32,
    limit: i32,
) -> PriorityLevelConfiguration {
    PriorityLevelConfiguration {
        metadata: meta("prioritylevelconfigurations", name),
        spec: PriorityLevelConfigurationSpec {
            type_: TYPE_LIMITED.into(),
            limited: Some(LimitedPriorityLevelConfiguration {
                nominal_concurrency_shares: Some(shares),
                lendable_percent: Some(lendable),
                borrowing_limit_percent: None,
                limit_response: LimitResponse {
                    type_: LIMIT_RESPONSE_QUEUE.into(),
                    queuing: Some(QueuingConfiguration {
                        queues,
                        hand_size: hand,
                        queue_length_limit: limit,
                    }),
                },
            }),
            exempt: None,
        },
        status: None,
    }
}

pub fn exempt_priority_level() -> PriorityLevelConfiguration {
    PriorityLevelConfiguration {
        metadata: meta("prioritylevelconfigurations", EXEMPT),
        spec: PriorityLevelConfigurationSpec {
            type_: TYPE_EXEMPT.into(),
            limited: None,
            exempt: Some(ExemptPriorityLevelConfiguration {
                nominal_concurrency_shares: Some(0),
                lendable_percent: Some(0),
            }),
        },
        status: None,
    }
}

pub fn catch_all_priority_level() -> PriorityLevelConfiguration {
    PriorityLevelConfiguration {
        metadata: meta("prioritylevelconfigurations", CATCH_ALL),
        spec: PriorityLevelConfigurationSpec {
            type_: TYPE_LIMITED.into(),
            limited: Some(LimitedPriorityLevelConfiguration {
                nominal_concurrency_shares: Some(5),
                lendable_percent: Some(0),
                borrowing_limit_percent: None,
                limit_response: LimitResponse {
                    type_: LIMIT_RESPONSE_REJECT.into(),
                    queuing: None,
                },
            }),
            exempt: None,
        },
        status: None,
    }
}

pub fn mandatory_priority_levels() -> Vec<PriorityLevelConfiguration> {
    vec![exempt_priority_level(), catch_all_priority_level()]
}

pub fn suggested_priority_levels() -> Vec<PriorityLevelConfiguration> {
    vec![
        queued_level("system", 30, 33, 64, 6, 50),
        queued_level("node-high", 40, 25, 64, 6, 50),
        queued_level("leader-election", 10, 0, 16, 4, 50),
        queued_level("workload-high", 40, 50, 128, 6, 50),
        queued_level("workload-low", 100, 90, 128, 6, 50),
        queued_level("global-default", 20, 50, 128, 6, 50),
    ]
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn resource_rule(
    verbs: &[&str],
    groups: &[&str],
    resources: &[&str],
    namespaces: &[&str],
    cluster: bool,
) -> ResourcePolicyRule {
    ResourcePolicyRule {
        verbs: strings(verbs),
        api_groups: strings(groups),
        resources: strings(resources),
        cluster_scope: cluster,
        namespaces: strings(namespaces),
    }
}

fn everything(subjects: Vec<Subject>) -> PolicyRulesWithSubjects {
    PolicyRulesWithSubjects {
        subjects,
        resource_rules: vec![resource_rule(&["*"], &["*"], &["*"], &["*"], true)],
        non_resource_rules: vec![NonResourcePolicyRule {
            verbs: strings(&["*"]),
            non_resource_urls: strings(&["*"]),
        }],
    }
}

fn schema(
    name: &str,
    level: &str,
    precedence: i32,
    distinguisher: Option<&str>,
    rules: Vec<PolicyRulesWithSubjects>,
) -> FlowSchema {
    FlowSchema {
        metadata: meta("flowschemas", name),
        spec: FlowSchemaSpec {
            priority_level_configuration: PriorityLevelConfigurationReference {
                name: level.into(),
            },
            matching_precedence: precedence,
            distinguisher_method: distinguisher
                .map(|d| FlowDistinguisherMethod { type_: d.into() }),
            rules,
        },
        status: None,
    }
}

pub fn exempt_flow_schema() -> FlowSchema {
    schema(
        EXEMPT,
        EXEMPT,
        1,
        None,
        vec![everything(vec![Subject::group("system:masters")])],
    )
}

pub fn catch_all_flow_schema() -> FlowSchema {
    schema(
        CATCH_ALL,
        CATCH_ALL,
        10000,
        Some(BY_USER),
        vec![everything(vec![
            Subject::group("system:unauthenticated"),
            Subject::group("system:authenticated"),
        ])],
    )
}

pub fn mandatory_flow_schemas() -> Vec<FlowSchema> {
    vec![exempt_flow_schema(), catch_all_flow_schema()]
}

pub fn suggested_flow_schemas() -> Vec<FlowSchema> {
    let kube_system_sa = || Subject::service_account("kube-system", "*");
    vec![
        schema(
            "probes",
            EXEMPT,
            2,
            None,
            vec![PolicyRulesWithSubjects {
                subjects: vec![
                    Subject::group("system:unauthenticated"),
                    Subject::group("system:authenticated"),
                ],
                resource_rules: vec![],
                non_resource_rules: vec![NonResourcePolicyRule {
                    verbs: strings(&["get"]),
                    non_resource_urls: strings(&["/healthz", "/readyz", "/livez"]),
                }],
            }],
        ),
        schema(
            "system-leader-election",
            "leader-election",
            100,
            Some(BY_USER),
            vec![PolicyRulesWithSubjects {
                subjects: vec![
                    Subject::user("system:kube-controller-manager"),
                    Subject::user("system:kube-scheduler"),
                    kube_system_sa(),
                ],
                resource_rules: vec![
                    resource_rule(
                        &["get", "create", "update"],
                        &[""],
                        &["endpoints", "configmaps"],
                        &["kube-system"],
                        false,
                    ),
                    resource_rule(
                        &["get", "create", "update"],
                        &["coordination.k8s.io"],
                        &["leases"],
                        &["*"],
                        false,
                    ),
                ],
                non_resource_rules: vec![],
            }],
        ),
        schema(
            "system-node-high",
            "node-high",
            400,
            Some(BY_USER),
            vec![PolicyRulesWithSubjects {
                subjects: vec![Subject::group("system:nodes")],
                resource_rules: vec![
                    resource_rule(&["*"], &[""], &["nodes", "nodes/status"], &["*"], true),
                    resource_rule(&["*"], &["coordination.k8s.io"], &["leases"], &["*"], false),
                ],
                non_resource_rules: vec![],
            }],
        ),
        schema(
            "system-nodes",
            "system",
            500,
            Some(BY_USER),
            vec![everything(vec![Subject::group("system:nodes")])],
        ),
        schema(
            "kube-controller-manager",
            "workload-high",
            800,
            Some(BY_NAMESPACE),
            vec![everything(vec![Subject::user(
                "system:kube-controller-manager",
            )])],
        ),
        schema(
            "kube-scheduler",
            "workload-high",
            800,
            Some(BY_NAMESPACE),
            vec![everything(vec![Subject::user("system:kube-scheduler")])],
        ),
        schema(
            "kube-system-service-accounts",
            "workload-high",
            900,
            Some(BY_NAMESPACE),
            vec![everything(vec![kube_system_sa()])],
        ),
        schema(
            "service-accounts",
            "workload-low",
            9000,
            Some(BY_USER),
            vec![everything(vec![Subject::group("system:serviceaccounts")])],
        ),
        schema(
            "global-default",
            "global-default",
            9900,
            Some(BY_USER),
            vec![everything(vec![
                Subject::group("system:unauthenticated"),
                Subject::group("system:authenticated"),
            ])],
        ),
    ]
}

/// Every built-in object, mandatory first.
pub fn all_flow_schemas() -> Vec<FlowSchema> {
    let mut v = mandatory_flow_schemas();
    v.extend(suggested_flow_schemas());
    v
}

pub fn all_priority_levels() -> Vec<PriorityLevelConfiguration> {
    let mut v = mandatory_priority_levels();
    v.extend(suggested_priority_levels());
    v
}

/// A schema shaped like global-default (everyone, everything, ByUser), for tests.
#[cfg(test)]
pub(super) fn global_default_like(name: &str, precedence: i32, level: &str) -> FlowSchema {
    schema(
        name,
        level,
        precedence,
        Some(BY_USER),
        vec![everything(vec![
            Subject::group("system:unauthenticated"),
            Subject::group("system:authenticated"),
        ])],
    )
}

// ---------------------------------------------------------------- maintenance

/// What one maintenance pass wants done to one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<T> {
    Create(T),
    /// Write the given object (spec and/or the auto-update annotation changed).
    Update(T),
    Delete {
        name: String,
    },
}

/// Whether maintenance owns the object's spec: the annotation when it is a
/// bool, else "generation == 1" (never edited by a user).
pub fn auto_update(meta: &ObjectMeta) -> (bool, bool) {
    match meta
        .annotations
        .get(AUTO_UPDATE_ANNOTATION)
        .map(|s| s.parse::<bool>())
    {
        Some(Ok(v)) => (v, false),
        _ => (meta.generation == 1, true),
    }
}

fn set_annotation(meta: &mut ObjectMeta, value: bool) {
    meta.annotations
        .insert(AUTO_UPDATE_ANNOTATION.into(), value.to_string());
}

/// One maintenance pass over priority levels: `existing` is what the store holds.
pub fn plan_priority_levels(
    existing: &[PriorityLevelConfiguration],
) -> Vec<Action<PriorityLevelConfiguration>> {
    plan(
        existing,
        &mandatory_priority_levels(),
        &suggested_priority_levels(),
        |o| &o.metadata,
        |o| &mut o.metadata,
        |current, wanted, mandatory| {
            let mut want = wanted.spec.clone();
            // The exempt level is mandatory but the user may tune its shares
            // and lendable percent.
            if mandatory && current.metadata.name == EXEMPT {
                if let (Some(w), Some(c)) = (want.exempt.as_mut(), current.spec.exempt.as_ref()) {
                    w.nominal_concurrency_shares = c
                        .nominal_concurrency_shares
                        .or(w.nominal_concurrency_shares);
                    w.lendable_percent = c.lendable_percent.or(w.lendable_percent);
                }
            }
            let mut cur = current.clone();
            cur.apply_defaults();
            if cur.spec == want {
                None
            } else {
                let mut out = current.clone();
                out.spec = want;
                Some(out)
            }
        },
    )
}

/// One maintenance pass over flow schemas.
pub fn plan_flow_schemas(existing: &[FlowSchema]) -> Vec<Action<FlowSchema>> {
    plan(
        existing,
        &mandatory_flow_schemas(),
        &suggested_flow_schemas(),
        |o| &o.metadata,
        |o| &mut o.metadata,
        |current, wanted, _| {
            let mut cur = current.clone();
            cur.apply_defaults();
            if cur.spec == wanted.spec {
                None
            } else {
                let mut out = current.clone();
                out.spec = wanted.spec.clone();
                Some(out)
            }
        },
    )
}

fn plan<T: Clone>(
    existing: &[T],
    mandatory: &[T],
    suggested: &[T],
    meta: impl Fn(&T) -> &ObjectMeta,
    meta_mut: impl Fn(&mut T) -> &mut ObjectMeta,
    respec: impl Fn(&T, &T, bool) -> Option<T>,
) -> Vec<Action<T>> {
    let mut actions = Vec::new();
    let find = |name: &str| existing.iter().find(|o| meta(o).name == name);
    for (wanted, is_mandatory) in mandatory
        .iter()
        .map(|o| (o, true))
        .chain(suggested.iter().map(|o| (o, false)))
    {
        let name = &meta(wanted).name;
        let Some(current) = find(name) else {
            actions.push(Action::Create(wanted.clone()));
            continue;
        };
        let (auto, annotation_needs_write) = auto_update(meta(current));
        if is_mandatory || auto {
            if let Some(mut updated) = respec(current, wanted, is_mandatory) {
                set_annotation(meta_mut(&mut updated), true);
                actions.push(Action::Update(updated));
                continue;
            }
        }
        if annotation_needs_write {
            let mut updated = current.clone();
            set_annotation(meta_mut(&mut updated), auto || is_mandatory);
            actions.push(Action::Update(updated));
        }
    }
    for o in existing {
        let m = meta(o);
        let known = mandatory
            .iter()
            .chain(suggested)
            .any(|b| meta(b).name == m.name);
        if !known
            && m.annotations
                .get(AUTO_UPDATE_ANNOTATION)
                .map(String::as_str)
                == Some("true")
        {
            actions.push(Action::Delete {
                name: m.name.clone(),
            });
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_bootstrap_objects_are_valid_and_defaulted() {
        for mut pl in all_priority_levels() {
            let before = pl.clone();
            pl.apply_defaults();
            assert_eq!(pl, before, "{} changes under defaulting", pl.metadata.name);
            assert!(
                validate_priority_level(&pl).is_empty(),
                "{}",
                pl.metadata.name
            );
            assert_eq!(pl.metadata.annotations[AUTO_UPDATE_ANNOTATION], "true");
        }
        for mut fs in all_flow_schemas() {
            let before = fs.clone();
            fs.apply_defaults();
            assert_eq!(fs, before);
            assert!(
                validate_flow_schema(&fs).is_empty(),
                "{}: {:?}",
                fs.metadata.name,
                validate_flow_schema(&fs)
            );
            assert_eq!(fs.metadata.annotations[AUTO_UPDATE_ANNOTATION], "true");
        }
    }

    #[test]
    fn table_of_levels() {
        let got: Vec<_> = all_priority_levels()
            .iter()
            .map(|p| {
                let q = p
                    .queuing()
                    .map(|q| (q.queues, q.hand_size, q.queue_length_limit));
                (
                    p.metadata.name.clone(),
                    p.nominal_concurrency_shares(),
                    p.lendable_percent(),
                    q,
                )
            })
            .collect();
        let want = vec![
            ("exempt", 0, 0, None),
            ("catch-all", 5, 0, None),
            ("system", 30, 33, Some((64, 6, 50))),
            ("node-high", 40, 25, Some((64, 6, 50))),
            ("leader-election", 10, 0, Some((16, 4, 50))),
            ("workload-high", 40, 50, Some((128, 6, 50))),
            ("workload-low", 100, 90, Some((128, 6, 50))),
            ("global-default", 20, 50, Some((128, 6, 50))),
        ];
        let want: Vec<_> = want
            .into_iter()
            .map(|(n, s, l, q)| (n.to_string(), s, l, q))
            .collect();
        assert_eq!(got, want);
        assert!(
            all_priority_levels()[1]
                .spec
                .limited
                .as_ref()
                .unwrap()
                .limit_response
                .type_
                == LIMIT_RESPONSE_REJECT
        );
    }

    #[test]
    fn table_of_schemas() {
        let got: Vec<_> = all_flow_schemas()
            .iter()
            .map(|f| {
                (
                    f.metadata.name.clone(),
                    f.spec.matching_precedence,
                    f.spec.priority_level_configuration.name.clone(),
                    f.spec
                        .distinguisher_method
                        .as_ref()
                        .map(|d| d.type_.clone()),
                )
            })
            .collect();
        let s = |n: &str, p, l: &str, d: Option<&str>| {
            (n.to_string(), p, l.to_string(), d.map(String::from))
        };
        assert_eq!(
            got,
            vec![
                s("exempt", 1, "exempt", None),
                s("catch-all", 10000, "catch-all", Some("ByUser")),
                s("probes", 2, "exempt", None),
                s(
                    "system-leader-election",
                    100,
                    "leader-election",
                    Some("ByUser")
                ),
                s("system-node-high", 400, "node-high", Some("ByUser")),
                s("system-nodes", 500, "system", Some("ByUser")),
                s(
                    "kube-controller-manager",
                    800,
                    "workload-high",
                    Some("ByNamespace")
                ),
                s("kube-scheduler", 800, "workload-high", Some("ByNamespace")),
                s(
                    "kube-system-service-accounts",
                    900,
                    "workload-high",
                    Some("ByNamespace")
                ),
                s("service-accounts", 9000, "workload-low", Some("ByUser")),
                s("global-default", 9900, "global-default", Some("ByUser")),
            ]
        );
    }

    #[test]
    fn uids_are_stable_and_distinct() {
        assert_eq!(
            stable_uid("flowschemas", "exempt"),
            exempt_flow_schema().metadata.uid
        );
        assert_ne!(
            stable_uid("flowschemas", "exempt"),
            stable_uid("prioritylevelconfigurations", "exempt")
        );
        let uid = stable_uid("flowschemas", "x");
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "5");
    }

    #[test]
    fn maintenance_creates_missing_and_leaves_in_sync_alone() {
        let actions = plan_priority_levels(&[]);
        assert_eq!(actions.len(), 8);
        assert!(actions.iter().all(|a| matches!(a, Action::Create(_))));
        assert!(plan_priority_levels(&all_priority_levels()).is_empty());
        assert!(plan_flow_schemas(&all_flow_schemas()).is_empty());
    }

    #[test]
    fn maintenance_forces_mandatory_but_respects_user_owned_suggested() {
        let mut levels = all_priority_levels();
        // A user edits catch-all (mandatory) and system (opting out of updates).
        levels[1]
            .spec
            .limited
            .as_mut()
            .unwrap()
            .nominal_concurrency_shares = Some(50);
        levels[2]
            .spec
            .limited
            .as_mut()
            .unwrap()
            .nominal_concurrency_shares = Some(1);
        levels[2]
            .metadata
            .annotations
            .insert(AUTO_UPDATE_ANNOTATION.into(), "false".into());
        // Exempt's shares belong to the user.
        levels[0]
            .spec
            .exempt
            .as_mut()
            .unwrap()
            .nominal_concurrency_shares = Some(7);
        let actions = plan_priority_levels(&levels);
        assert_eq!(actions.len(), 1, "{actions:?}");
        match &actions[0] {
            Action::Update(pl) => {
                assert_eq!(pl.metadata.name, "catch-all");
                assert_eq!(pl.nominal_concurrency_shares(), 5);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn maintenance_annotation_rules() {
        let mut schemas = all_flow_schemas();
        // Missing annotation, generation 1: maintenance owns it and writes annotation.
        schemas[3].metadata.annotations.clear();
        // Garbage annotation, generation 2 (user edited): user owns it.
        schemas[4]
            .metadata
            .annotations
            .insert(AUTO_UPDATE_ANNOTATION.into(), "maybe".into());
        schemas[4].metadata.generation = 2;
        schemas[4].spec.matching_precedence = 123;
        // Unknown object with annotation true: delete.
        let mut stray = schemas[5].clone();
        stray.metadata.name = "old-suggested".into();
        schemas.push(stray);
        let actions = plan_flow_schemas(&schemas);
        assert_eq!(actions.len(), 3, "{actions:?}");
        match &actions[0] {
            Action::Update(fs) => {
                assert_eq!(fs.metadata.annotations[AUTO_UPDATE_ANNOTATION], "true")
            }
            other => panic!("{other:?}"),
        }
        match &actions[1] {
            Action::Update(fs) => {
                assert_eq!(fs.metadata.annotations[AUTO_UPDATE_ANNOTATION], "false");
                assert_eq!(fs.spec.matching_precedence, 123);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            actions[2],
            Action::Delete {
                name: "old-suggested".into()
            }
        );
    }
}
