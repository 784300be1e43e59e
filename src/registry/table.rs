//! Server-side printing: `meta.k8s.io/v1` Table for custom resources, with the
//! Name column, the CRD's additionalPrinterColumns (or Age), and row objects
//! as kube's `includeObject` asks.

use crate::object::MetaField;
use serde_json::{json, Map, Value};

use super::jsonpath::{scalar_text, JsonPath};
use super::Target;
use crate::apiextensions::catalog::PrinterColumn;

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "Metadata" => Ok(Self::Metadata),
            "Object" => Ok(Self::Object),
            "None" => Ok(Self::None),
            other => Err(format!(
                "Unable to convert to Table as requested: includeObject: Invalid value: {}: must be 'Metadata', 'Object', 'None', or empty",
                crate::status::quote(other)
            )),
        }
    }
}

/// Where a column's cell comes from: a printer column's JSONPath, or for
/// the built-in kinds standalone kshard serves as custom resources, kube's
/// printer for that kind.
enum Source {
    Path(Option<JsonPath>),
    Computed(fn(&Value) -> Value),
}

/// The columns of a type's table (with their parsed paths).
pub struct Columns {
    defs: Vec<PrinterColumn>,
    paths: Vec<Source>,
    /// kube's printer for a built-in kind: Age is a `string` column and a
    /// row without its object says `"object": null`.
    builtin: bool,
}

impl Columns {
    pub fn for_target(t: &Target) -> Self {
        if let Some(cols) = t.rt.strategy().table_columns() {
            let (mut defs, mut paths): (Vec<_>, Vec<_>) = cols
                .into_iter()
                .map(|(def, cell)| (def, Source::Computed(cell)))
                .unzip();
            defs.push(PrinterColumn {
                type_: "string".into(),
                ..age()
            });
            paths.push(Source::Computed(|o| {
                cell("date", o.pointer("/metadata/creationTimestamp"))
            }));
            return Self {
                defs,
                paths,
                builtin: true,
            };
        }
        let mut defs = t
            .version_info()
            .map(|v| v.printer_columns.clone())
            .unwrap_or_default();
        if defs.is_empty() {
            defs.push(age());
        }
        let paths = defs
            .iter()
            .map(|c| Source::Path(JsonPath::parse(&c.json_path).ok()))
            .collect();
        Self {
            defs,
            paths,
            builtin: false,
        }
    }

    pub fn definitions(&self) -> Value {
        let mut cols = vec![json!({
            "name": "Name", "type": "string", "format": "name",
            "description": NAME_DESCRIPTION, "priority": 0
        })];
        for c in &self.defs {
            cols.push(json!({
                "name": c.name, "type": c.type_, "format": c.format,
                "description": c.description, "priority": c.priority
            }));
        }
        Value::Array(cols)
    }

    pub fn row(&self, obj: &Value, include: IncludeObject) -> Value {
        let mut cells = vec![obj
            .meta_field("name")
            .cloned()
            .unwrap_or(Value::String(String::new()))];
        for (c, source) in self.defs.iter().zip(&self.paths) {
            match source {
                Source::Path(path) => {
                    let v = path.as_ref().and_then(|p| p.first(obj));
                    cells.push(cell(&c.type_, v));
                }
                Source::Computed(f) => cells.push(f(obj)),
            }
        }
        let mut row = Map::new();
        row.insert("cells".into(), Value::Array(cells));
        match include {
            IncludeObject::None if self.builtin => {
                row.insert("object".into(), Value::Null);
            }
            IncludeObject::None => {}
            IncludeObject::Metadata => {
                row.insert("object".into(), partial_metadata(obj));
            }
            IncludeObject::Object => {
                row.insert("object".into(), obj.clone());
            }
        }
        Value::Object(row)
    }
}

fn age() -> PrinterColumn {
    PrinterColumn {
        name: "Age".into(),
        type_: "date".into(),
        format: String::new(),
        description: AGE_DESCRIPTION.into(),
        priority: 0,
        json_path: ".metadata.creationTimestamp".into(),
    }
}

/// `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn cell(type_: &str, v: Option<&Value>) -> Value {
    let Some(v) = v else { return Value::Null };
    match type_ {
        "integer" => v.as_i64().map_or(Value::Null, |n| json!(n)),
        "number" => v.as_f64().map_or(Value::Null, |n| json!(n)),
        "boolean" => v.as_bool().map_or(Value::Null, |b| json!(b)),
        "date" => Value::String(match v.as_str() {
            Some(s) => match chrono::DateTime::parse_from_rfc3339(s) {
                Ok(t) => human_duration(chrono::Utc::now().signed_duration_since(t)),
                Err(_) => "<invalid>".into(),
            },
            None => "<unknown>".into(),
        }),
        _ => Value::String(scalar_text(v)),
    }
}

/// kube's `duration.HumanDuration`.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// A whole Table document.
pub fn table(columns: Option<&Columns>, rows: Vec<Value>, list_meta: Value) -> Value {
    let mut t = Map::new();
    t.insert("kind".into(), json!("Table"));
    t.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
    t.insert("metadata".into(), list_meta);
    if let Some(c) = columns {
        t.insert("columnDefinitions".into(), c.definitions());
    }
    t.insert("rows".into(), Value::Array(rows));
    Value::Object(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    #[test]
    fn human_durations_match_kube() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (9 * 3600, "9h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(TimeDelta::seconds(secs)), want, "{secs}");
        }
    }

    #[test]
    fn cells_follow_column_types() {
        assert_eq!(cell("integer", Some(&json!(3))), json!(3));
        assert_eq!(cell("string", Some(&json!(3))), json!("3"));
        assert_eq!(cell("integer", None), Value::Null);
        assert_eq!(cell("date", Some(&json!("garbage"))), json!("<invalid>"));
    }
}
