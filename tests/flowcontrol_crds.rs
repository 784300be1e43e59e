//! Flow control configured by FlowSchema / PriorityLevelConfiguration custom
//! resources, reconciled by the kube-rs controller against kshard itself.

mod common;

use std::time::{Duration, Instant};

use common::apf::has_condition;
use kshard::flowcontrol::types::{
    ConditionStatus, FlowSchemaResource, PriorityLevelConfigurationResource,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

#[test]
fn checked_in_crds_match_the_types() {
    let file = std::fs::read_to_string(common::repo_path(
        "crds/flowcontrol/flowcontrol.kshard.dev.yaml",
    ))
    .expect("crds file");
    assert!(
        file == kshard::controller::crd::manifests_yaml(),
        "crds/flowcontrol/flowcontrol.kshard.dev.yaml is stale: regenerate it with `cargo run -- crds > crds/flowcontrol/flowcontrol.kshard.dev.yaml`"
    );
}

/// The PL/FS uids a request from `group` is classified with.
async fn classified(s: &common::TestServer, group: &str) -> (String, String) {
    let r = s
        .raw(
            "GET",
            common::WIDGETS,
            &[("impersonate-user", "bob"), ("impersonate-group", group)],
            vec![],
        )
        .await;
    let h = |n: &str| {
        r.headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    (
        h("x-kubernetes-pf-flowschema-uid"),
        h("x-kubernetes-pf-prioritylevel-uid"),
    )
}

async fn within<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within {limit:?}: {what}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gitops_configuration_takes_effect_and_recovers() {
    let s = common::start_with_flowcontrol().await;
    let levels: Api<PriorityLevelConfigurationResource> = Api::all(s.client.clone());
    let schemas: Api<FlowSchemaResource> = Api::all(s.client.clone());
    // The mandatory and suggested objects appear on a fresh server.
    within(Duration::from_secs(5), "bootstrap objects", || async {
        s.kubectl(&["get", "flowschemas.flowcontrol.kshard.dev", "-o", "name"])
            .stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count()
            == 11
    })
    .await;
    let table = s.kubectl_ok(&["get", "prioritylevelconfigurations.flowcontrol.kshard.dev"]);
    assert!(
        table.starts_with("NAME") && table.contains("QUEUES") && table.contains("workload-low"),
        "{table}"
    );

    // GitOps: kubectl apply -k of the example puts tenant-a's traffic in its own level.
    let out = s.kubectl(&[
        "apply",
        "-k",
        common::repo_path("manifests/flowcontrol")
            .to_str()
            .unwrap_or(""),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied = Instant::now();
    let pl_uid = levels
        .get("tenant-a")
        .await
        .expect("level")
        .metadata
        .uid
        .expect("uid");
    let fs_uid = schemas
        .get("tenant-a-controller")
        .await
        .expect("schema")
        .metadata
        .uid
        .expect("uid");
    within(
        Duration::from_secs(2),
        "classified into tenant-a",
        || async { classified(&s, "tenant-a").await == (fs_uid.clone(), pl_uid.clone()) },
    )
    .await;
    eprintln!("new level in force after {:?}", applied.elapsed());
    within(Duration::from_secs(2), "status written", || async {
        let fs = schemas.get("tenant-a-controller").await.expect("schema");
        fs.status.is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Dangling" && c.reason == "Found")
        })
    })
    .await;

    // Validation the API enforces at apply time (CRD schema and CEL rules).
    let bad = "apiVersion: flowcontrol.kshard.dev/v1\nkind: PriorityLevelConfiguration\nmetadata: {name: bad}\nspec:\n  type: Limited\n  limited:\n    nominalConcurrencyShares: 1\n    limitResponse:\n      type: Queue\n      queuing: {queues: 4, handSize: 8, queueLengthLimit: 5}\n";
    let out = s.kubectl_stdin(&["apply", "-f", "-"], bad);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("handSize must not be greater than queues"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.kubectl_stdin(&["apply", "-f", "-"], "apiVersion: flowcontrol.kshard.dev/v1\nkind: PriorityLevelConfiguration\nmetadata: {name: sneaky}\nspec: {type: Exempt, exempt: {}}\n");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("type must be Exempt if and only if the name is exempt"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // An object kshard's own validation refuses: reported in status, old spec stays in force.
    let too_much_entropy = json!({"spec": {"limited": {"limitResponse": {"queuing": {"queues": 10_000_000, "handSize": 8}}}}});
    levels
        .patch(
            "tenant-a",
            &PatchParams::default(),
            &Patch::Merge(&too_much_entropy),
        )
        .await
        .expect("patch accepted by the API");
    within(Duration::from_secs(2), "invalid status", || async {
        let pl = levels.get("tenant-a").await.expect("level");
        pl.status.is_some_and(|st| {
            st.conditions.iter().any(|c| {
                c.type_ == "InForce"
                    && c.reason == "Invalid"
                    && c.observed_generation == pl.metadata.generation
                    && c.message.contains("the last valid spec stays in force")
            })
        })
    })
    .await;
    assert_eq!(
        classified(&s, "tenant-a").await.1,
        pl_uid,
        "the last good configuration stays"
    );
    let dump = s
        .get("/debug/api_priority_and_fairness/dump_queues")
        .await
        .text();
    assert_eq!(
        dump.lines().filter(|l| l.starts_with("tenant-a")).count(),
        32,
        "still 32 queues"
    );

    // Deleting the level: the schema dangles and traffic falls back to global-default.
    levels
        .delete("tenant-a", &DeleteParams::default())
        .await
        .expect("delete level");
    let global = levels
        .get("global-default")
        .await
        .expect("global-default")
        .metadata
        .uid
        .expect("uid");
    within(
        Duration::from_secs(2),
        "fallback to global-default",
        || async { classified(&s, "tenant-a").await.1 == global },
    )
    .await;
    within(Duration::from_secs(2), "dangling", || async {
        let fs = schemas.get("tenant-a-controller").await.expect("schema");
        fs.status.is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Dangling" && c.reason == "NotFound")
        })
    })
    .await;
    let table = s.kubectl_ok(&["get", "fs", "tenant-a-controller"]);
    assert!(
        table
            .lines()
            .nth(1)
            .unwrap_or("")
            .trim_end()
            .ends_with("True"),
        "MissingPL column: {table}"
    );

    // Deleting a suggested object brings it back.
    schemas
        .delete("service-accounts", &DeleteParams::default())
        .await
        .expect("delete suggested");
    within(
        Duration::from_secs(3),
        "suggested object recreated",
        || async {
            schemas
                .get_opt("service-accounts")
                .await
                .expect("get")
                .is_some()
        },
    )
    .await;
    // Deleting a mandatory object brings it back too.
    levels
        .delete("catch-all", &DeleteParams::default())
        .await
        .expect("delete mandatory");
    within(
        Duration::from_secs(3),
        "mandatory object recreated",
        || async { levels.get_opt("catch-all").await.expect("get").is_some() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_share_one_configuration_without_fighting_over_status() {
    let a = common::start_with_flowcontrol().await;
    // A second kshard whose controller follows the first one's objects.
    let kubeconfig = a.running.kubeconfig.clone();
    let b = common::start_with(|c| {
        c.flowcontrol_controller = true;
        c.flowcontrol_kubeconfig = Some(kubeconfig);
    })
    .await;
    let out = a.kubectl(&[
        "apply",
        "-k",
        common::repo_path("manifests/flowcontrol")
            .to_str()
            .unwrap_or(""),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let levels: Api<PriorityLevelConfigurationResource> = Api::all(a.client.clone());
    let pl_uid = levels
        .get("tenant-a")
        .await
        .expect("level")
        .metadata
        .uid
        .expect("uid");
    within(
        Duration::from_secs(3),
        "both replicas use the level",
        || async {
            classified(&a, "tenant-a").await.1 == pl_uid
                && classified(&b, "tenant-a").await.1 == pl_uid
        },
    )
    .await;
    // Both controllers write the same status under one field manager: it settles.
    let schemas: Api<FlowSchemaResource> = Api::all(a.client.clone());
    // Kustomize may create the schema before its level, so the first status
    // can say `Dangling=True`; wait for the settled one before observing.
    common::eventually(
        "the controllers wrote the schema's final status",
        || async {
            schemas.get("tenant-a-controller").await.is_ok_and(|fs| {
                has_condition(&fs, "Dangling", ConditionStatus::False)
                    && has_condition(&fs, "InForce", ConditionStatus::True)
            })
        },
    )
    .await;
    // The other replica may still have the same status in flight, stamped
    // with its own transition time: the first quiet moment ends that.
    let rv_now = || async {
        schemas
            .get("tenant-a-controller")
            .await
            .expect("fs")
            .metadata
            .resource_version
    };
    let rv1 = common::until("a quiet moment", Duration::from_secs(10), || async {
        let before = rv_now().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = rv_now().await;
        (before == after).then_some(after)
    })
    .await;
    // An observation window, not a wait: nothing may rewrite the status in it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fs = schemas.get("tenant-a-controller").await.expect("fs");
    assert_eq!(
        fs.metadata.resource_version, rv1,
        "status is not rewritten back and forth"
    );
    let managers: Vec<String> = fs
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        managers.contains(&"kshard-flowcontrol".to_string()),
        "{managers:?}"
    );
}
