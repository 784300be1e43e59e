//! The status this controller reports: an `InForce` condition on both kinds
//! and `Dangling` on FlowSchemas, written by server-side apply under one
//! field manager and only when it changes (so replicas agree instead of
//! fighting).

use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

use super::object::FlowObject;
use super::{CONDITION_IN_FORCE, FIELD_MANAGER};
use crate::flowcontrol::types::{Condition, ConditionStatus, FieldError, CONDITION_DANGLING};

/// The `InForce` condition.
pub(super) fn in_force(ok: bool, reason: &str, message: String, generation: i64) -> Value {
    json!({
        "type": CONDITION_IN_FORCE,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    })
}

/// `InForce=True` for a valid spec.
pub(super) fn valid(generation: i64) -> Value {
    in_force(
        true,
        "Valid",
        format!("generation {generation} is in force"),
        generation,
    )
}

/// `InForce=False` for an invalid spec; `kept` says whether the last valid
/// spec stays in force.
pub(super) fn invalid(errors: &[FieldError], kept: bool, generation: i64) -> Value {
    let problems = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let outcome = if kept {
        "the last valid spec stays in force"
    } else {
        "not in force"
    };
    in_force(
        false,
        "Invalid",
        format!("{problems}; {outcome}"),
        generation,
    )
}

/// The `Dangling` condition of a FlowSchema referring to `level`.
pub(super) fn dangling(level: &str, dangling: bool) -> Value {
    if dangling {
        json!({"type": CONDITION_DANGLING, "status": "True", "reason": "NotFound",
            "message": format!("This FlowSchema references the PriorityLevelConfiguration object named {level:?} but there is no such object")})
    } else {
        json!({"type": CONDITION_DANGLING, "status": "False", "reason": "Found",
            "message": format!("This FlowSchema references the PriorityLevelConfiguration object named {level:?} and it exists")})
    }
}

/// Server-side applies `status` to `object` when it differs from what the
/// object carries.
pub(super) async fn write<K: FlowObject>(
    api: &Api<K>,
    object: &K,
    status: Value,
) -> Result<(), kube::Error> {
    let Some(status) = changed_status(object.conditions(), status) else {
        return Ok(());
    };
    let name = object.meta().name.clone().unwrap_or_default();
    let body = json!({"apiVersion": K::api_version(&()), "kind": K::KIND, "status": status});
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::debug!(error = %e, kind = K::KIND, name, "status write failed");
            Err(e)
        }
    }
}

/// The status to write, with `lastTransitionTime` kept for conditions whose
/// status did not change; `None` when nothing would change.
fn changed_status(current: &[Condition], mut wanted: Value) -> Option<Value> {
    let now = crate::object::now_rfc3339();
    let mut same = true;
    let conditions = wanted.get_mut("conditions")?.as_array_mut()?;
    if conditions.len() != current.len() {
        same = false;
    }
    for c in conditions.iter_mut() {
        let type_ = c["type"].as_str().unwrap_or("").to_string();
        let status = c["status"].as_str().unwrap_or("").to_string();
        let old = current.iter().find(|o| o.type_ == type_);
        let old_status = old.map(|o| match o.status {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        });
        let transition = match (old, old_status) {
            (Some(o), Some(s)) if s == status => o
                .last_transition_time
                .clone()
                .unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        if old.is_none_or(|o| {
            old_status != Some(status.as_str())
                || o.reason != c["reason"].as_str().unwrap_or("")
                || o.message != c["message"].as_str().unwrap_or("")
                || o.observed_generation != c["observedGeneration"].as_i64()
        }) {
            same = false;
        }
        c["lastTransitionTime"] = json!(transition);
    }
    (!same).then_some(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(v: &Value) -> Condition {
        serde_json::from_value(v.clone()).unwrap()
    }

    #[test]
    fn unchanged_status_is_not_written() {
        let mut written = condition(&valid(3));
        written.last_transition_time = Some("2026-01-01T00:00:00Z".into());
        assert_eq!(
            changed_status(&[written], json!({"conditions": [valid(3)]})),
            None
        );
    }

    #[test]
    fn transition_time_kept_while_status_stays() {
        let mut written = condition(&valid(3));
        written.last_transition_time = Some("2026-01-01T00:00:00Z".into());
        // A new generation: the message changes, the status does not.
        let out = changed_status(
            std::slice::from_ref(&written),
            json!({"conditions": [valid(4)]}),
        )
        .unwrap();
        assert_eq!(
            out["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        // Invalid now: the status flips and the time moves.
        let out =
            changed_status(&[written], json!({"conditions": [invalid(&[], true, 5)]})).unwrap();
        assert_ne!(
            out["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert!(out["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .ends_with("the last valid spec stays in force"));
    }

    #[test]
    fn a_new_condition_is_a_change() {
        let written = condition(&valid(1));
        assert!(changed_status(
            &[written],
            json!({"conditions": [dangling("x", false), valid(1)]})
        )
        .is_some());
    }
}
