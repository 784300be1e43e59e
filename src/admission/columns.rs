//! kube's table columns for the admissionregistration kinds (its printers
//! for those built-in types, between Name and Age), given to the registry's
//! table through the kinds' strategy.

use serde_json::{json, Value};

use super::hooks::{BINDINGS, MUTATING, POLICIES, VALIDATING};
use crate::apiextensions::catalog::PrinterColumn;
use crate::apiextensions::strategy::ComputedCell;

/// A closure without captures as the plain function a column computes with.
fn as_cell(f: ComputedCell) -> ComputedCell {
    f
}

fn column(name: &str, type_: &str, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        format: String::new(),
        description: description.into(),
        priority: 0,
        json_path: String::new(),
    }
}

fn count(v: Option<&Value>) -> Value {
    json!(v.and_then(Value::as_array).map_or(0, Vec::len))
}

/// kube's ParamKind cell: `apiVersion/kind`, or `<unset>`.
fn param_kind(obj: &Value) -> Value {
    match obj.pointer("/spec/paramKind") {
        Some(p) if p.is_object() => {
            let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
            json!(format!("{}/{}", s("apiVersion"), s("kind")))
        }
        _ => json!("<unset>"),
    }
}

/// kube's ParamRef cell: `namespace/name` (`*` for any namespace), else the
/// selector as Go prints a LabelSelector, or `<unset>`.
fn param_ref(obj: &Value) -> Value {
    let Some(p) = obj.pointer("/spec/paramRef").filter(|p| p.is_object()) else {
        return json!("<unset>");
    };
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
    if !s("name").is_empty() {
        let ns = if s("namespace").is_empty() {
            "*"
        } else {
            s("namespace")
        };
        return json!(format!("{ns}/{}", s("name")));
    }
    match p.get("selector").filter(|v| v.is_object()) {
        Some(sel) => json!(go_label_selector(sel)),
        None => json!("<unset>"),
    }
}

/// Go's generated `String()` of a `*metav1.LabelSelector`.
fn go_label_selector(sel: &Value) -> String {
    let labels: std::collections::BTreeMap<&str, &str> = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let labels: String = labels.iter().map(|(k, v)| format!("{k}: {v},")).collect();
    let exprs: String = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("");
                    let values: Vec<&str> = e
                        .get("values")
                        .and_then(Value::as_array)
                        .map(|v| v.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    format!(
                        "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{}],}},",
                        s("key"),
                        s("operator"),
                        values.join(" ")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{exprs}}},}}"
    )
}

/// kube's columns for one of the admissionregistration kinds (between Name
/// and Age); `None` for any other resource of the group.
pub fn table_columns(plural: &str) -> Option<Vec<(PrinterColumn, ComputedCell)>> {
    Some(match plural {
        MUTATING | VALIDATING => vec![(
            column(
                "Webhooks",
                "integer",
                "Webhooks indicates the number of webhooks registered in this configuration",
            ),
            as_cell(|o| count(o.get("webhooks"))),
        )],
        POLICIES => vec![
            (
                column(
                    "Validations",
                    "integer",
                    "Validations indicates the number of validation rules defined in this configuration",
                ),
                as_cell(|o| count(o.pointer("/spec/validations"))),
            ),
            (
                column(
                    "ParamKind",
                    "string",
                    "ParamKind specifies the kind of resources used to parameterize this policy",
                ),
                as_cell(param_kind),
            ),
        ],
        BINDINGS => vec![
            (
                column(
                    "PolicyName",
                    "string",
                    "PolicyName indicates the policy definition which the policy binding binded to",
                ),
                as_cell(|o| {
                    json!(o.pointer("/spec/policyName").and_then(Value::as_str).unwrap_or(""))
                }),
            ),
            (
                column(
                    "ParamRef",
                    "string",
                    "ParamRef indicates the param resource which sets the configuration param",
                ),
                as_cell(param_ref),
            ),
        ],
        _ => return None,
    })
}
