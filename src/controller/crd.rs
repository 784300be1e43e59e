//! The `flowcontrol.kshard.dev/v1` CustomResourceDefinitions, generated from
//! the Rust types (kube's derive + schemars) plus the limits and cross-field
//! rules a host API server can enforce at apply time.

use kube::CustomResourceExt;
use serde_json::{json, Value};

use crate::flowcontrol::types::{FlowSchemaResource, PriorityLevelConfigurationResource};

fn schema_mut<'a>(
    crd: &'a mut Value,
    pointer: &str,
) -> Option<&'a mut serde_json::Map<String, Value>> {
    crd.pointer_mut(&format!("/spec/versions/0/schema/openAPIV3Schema{pointer}"))
        .and_then(Value::as_object_mut)
}

fn add_rule(crd: &mut Value, pointer: &str, rule: &str, message: &str) {
    if let Some(s) = schema_mut(crd, pointer) {
        let rules = s
            .entry("x-kubernetes-validations")
            .or_insert_with(|| json!([]));
        if let Some(list) = rules.as_array_mut() {
            list.push(json!({"rule": rule, "message": message}));
        }
    }
}

fn set(crd: &mut Value, pointer: &str, key: &str, value: Value) {
    if let Some(s) = schema_mut(crd, pointer) {
        s.insert(key.into(), value);
    }
}

/// Restricts a string field to `values`. The derive gives every
/// `#[serde(default)]` string field `default: ""`, which a real API server
/// refuses once the field has an enum (a default must validate against its
/// schema), so the default goes: an omitted value stays omitted.
fn one_of(crd: &mut Value, pointer: &str, values: &[&str]) {
    if let Some(s) = schema_mut(crd, pointer) {
        s.insert("enum".into(), json!(values));
        s.remove("default");
    }
}

pub fn flow_schema() -> Value {
    let mut crd = serde_json::to_value(FlowSchemaResource::crd()).unwrap_or(Value::Null);
    let spec = "/properties/spec/properties";
    set(
        &mut crd,
        &format!("{spec}/matchingPrecedence"),
        "minimum",
        json!(0),
    );
    set(
        &mut crd,
        &format!("{spec}/matchingPrecedence"),
        "maximum",
        json!(10000),
    );
    one_of(
        &mut crd,
        &format!("{spec}/distinguisherMethod/properties/type"),
        &["ByUser", "ByNamespace"],
    );
    add_rule(
        &mut crd,
        "",
        "self.metadata.name == 'exempt' || !has(self.spec.matchingPrecedence) || self.spec.matchingPrecedence != 1",
        "only the exempt FlowSchema may use matchingPrecedence 1",
    );
    crd
}

pub fn priority_level() -> Value {
    let mut crd =
        serde_json::to_value(PriorityLevelConfigurationResource::crd()).unwrap_or(Value::Null);
    let spec = "/properties/spec/properties";
    one_of(&mut crd, &format!("{spec}/type"), &["Exempt", "Limited"]);
    let limited = format!("{spec}/limited/properties");
    set(
        &mut crd,
        &format!("{limited}/nominalConcurrencyShares"),
        "minimum",
        json!(0),
    );
    set(
        &mut crd,
        &format!("{limited}/lendablePercent"),
        "minimum",
        json!(0),
    );
    set(
        &mut crd,
        &format!("{limited}/lendablePercent"),
        "maximum",
        json!(100),
    );
    set(
        &mut crd,
        &format!("{limited}/borrowingLimitPercent"),
        "minimum",
        json!(0),
    );
    let queuing = format!("{limited}/limitResponse/properties/queuing");
    set(
        &mut crd,
        &format!("{queuing}/properties/queues"),
        "minimum",
        json!(0),
    );
    set(
        &mut crd,
        &format!("{queuing}/properties/queues"),
        "maximum",
        json!(10_000_000),
    );
    set(
        &mut crd,
        &format!("{queuing}/properties/handSize"),
        "minimum",
        json!(0),
    );
    add_rule(
        &mut crd,
        &queuing,
        "!has(self.handSize) || !has(self.queues) || self.handSize <= self.queues",
        "handSize must not be greater than queues",
    );
    one_of(
        &mut crd,
        &format!("{limited}/limitResponse/properties/type"),
        &["Queue", "Reject"],
    );
    // The derive defaults the whole `limitResponse` to `{type: ""}`, outside
    // the enum above; kube's own type has no default there either.
    if let Some(s) = schema_mut(&mut crd, &format!("{limited}/limitResponse")) {
        s.remove("default");
    }
    // As kube's validation: a level says its type, a limited level how it
    // answers excess load.
    set(&mut crd, "/properties/spec", "required", json!(["type"]));
    set(
        &mut crd,
        &format!("{spec}/limited"),
        "required",
        json!(["limitResponse"]),
    );
    set(
        &mut crd,
        &format!("{limited}/limitResponse"),
        "required",
        json!(["type"]),
    );
    add_rule(
        &mut crd,
        "",
        "(self.metadata.name == 'exempt') == (self.spec.type == 'Exempt')",
        "type must be Exempt if and only if the name is exempt",
    );
    crd
}

/// Both CRDs as one multi-document YAML file (what `kshard crds` prints).
pub fn manifests_yaml() -> String {
    let mut out = String::from(
        "# Generated by `kshard crds` from src/flowcontrol/config.rs and src/controller/crd.rs.\n# Do not edit: a test fails when this file drifts from the types.\n",
    );
    for crd in [flow_schema(), priority_level()] {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    /// The flow-control CRDs are installed into host clusters, whose kube-apiserver
    /// checks their rules' estimated cost: they must pass as a user's definition.
    #[test]
    fn flowcontrol_crds_pass_kubes_cost_limits() {
        let mut c = crate::apiextensions::Catalog::default();
        c.add_manifests(
            std::path::Path::new("flowcontrol"),
            &super::manifests_yaml(),
        )
        .expect("within kube's limits");
    }
}
