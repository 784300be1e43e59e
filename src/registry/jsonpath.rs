//! The subset of kubectl JSONPath that printer columns and selectable fields
//! use: `.a.b`, `['a']`, `[0]`, `[*]`, `[?(@.k=="v")]`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    Filter { path: Vec<String>, value: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

impl JsonPath {
    pub fn parse(path: &str) -> Result<Self, String> {
        let p = path.trim();
        let p = p
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .unwrap_or(p);
        let p = p.strip_prefix('$').unwrap_or(p);
        let chars: Vec<char> = p.chars().collect();
        let mut steps = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '.' => {
                    i += 1;
                    let start = i;
                    while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                        i += 1;
                    }
                    let name: String = chars[start..i].iter().collect();
                    if name.is_empty() {
                        if i >= chars.len() {
                            break;
                        }
                        return Err(format!("invalid JSONPath {path:?}: empty field"));
                    }
                    steps.push(Step::Field(name));
                }
                '[' => {
                    let end = chars[i..]
                        .iter()
                        .position(|c| *c == ']')
                        .map(|p| p + i)
                        .ok_or_else(|| format!("invalid JSONPath {path:?}: unclosed ["))?;
                    let inner: String = chars[i + 1..end].iter().collect();
                    steps.push(parse_bracket(inner.trim(), path)?);
                    i = end + 1;
                }
                _ => {
                    // A leading bare name (`spec.x`) is treated like `.spec.x`.
                    let start = i;
                    while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                        i += 1;
                    }
                    steps.push(Step::Field(chars[start..i].iter().collect()));
                }
            }
        }
        Ok(Self { steps })
    }

    /// All values the path selects.
    pub fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut cur = vec![root];
        for step in &self.steps {
            let mut next = Vec::new();
            for v in cur {
                match step {
                    Step::Field(f) => {
                        if let Some(x) = v.get(f) {
                            next.push(x);
                        }
                    }
                    Step::Index(n) => {
                        if let Some(arr) = v.as_array() {
                            let idx = if *n < 0 { arr.len() as i64 + n } else { *n };
                            if let Some(x) = usize::try_from(idx).ok().and_then(|i| arr.get(i)) {
                                next.push(x);
                            }
                        }
                    }
                    Step::All => match v {
                        Value::Array(a) => next.extend(a.iter()),
                        Value::Object(o) => next.extend(o.values()),
                        _ => {}
                    },
                    Step::Filter { path, value } => {
                        if let Some(arr) = v.as_array() {
                            next.extend(arr.iter().filter(|item| {
                                let mut x = Some(*item);
                                for p in path {
                                    x = x.and_then(|x| x.get(p));
                                }
                                x.is_some_and(|x| scalar_text(x) == *value)
                            }));
                        }
                    }
                }
            }
            cur = next;
        }
        cur
    }

    pub fn first<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        self.find(root).into_iter().next()
    }
}

fn parse_bracket(inner: &str, path: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::All);
    }
    if let Some(q) = inner
        .strip_prefix('\'')
        .and_then(|s| s.strip_suffix('\''))
        .or_else(|| inner.strip_prefix('"').and_then(|s| s.strip_suffix('"')))
    {
        return Ok(Step::Field(q.to_string()));
    }
    if let Ok(n) = inner.parse::<i64>() {
        return Ok(Step::Index(n));
    }
    if let Some(expr) = inner.strip_prefix("?(").and_then(|s| s.strip_suffix(')')) {
        let (lhs, rhs) = expr
            .split_once("==")
            .ok_or_else(|| format!("invalid JSONPath {path:?}: unsupported filter"))?;
        let lhs = lhs
            .trim()
            .strip_prefix("@.")
            .ok_or_else(|| format!("invalid JSONPath {path:?}: filter must start with @."))?;
        let rhs = rhs.trim().trim_matches(|c| c == '"' || c == '\'');
        return Ok(Step::Filter {
            path: lhs.split('.').map(str::to_string).collect(),
            value: rhs.to_string(),
        });
    }
    Err(format!("invalid JSONPath {path:?}: unsupported [{inner}]"))
}

/// Text of a scalar as kubectl prints it.
pub fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluates_common_printer_column_paths() {
        let v = json!({"spec": {"replicas": 3, "items": [{"n": "a"}, {"n": "b"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]},
            "metadata": {"labels": {"app.kubernetes.io/name": "w"}}});
        let get = |p: &str| JsonPath::parse(p).expect("parse").first(&v).cloned();
        assert_eq!(get(".spec.replicas"), Some(json!(3)));
        assert_eq!(get(".spec.items[1].n"), Some(json!("b")));
        assert_eq!(get(".spec.items[-1].n"), Some(json!("b")));
        assert_eq!(
            get(".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(
            get(".metadata.labels['app.kubernetes.io/name']"),
            Some(json!("w"))
        );
        assert_eq!(get(".spec.missing"), None);
        let all = JsonPath::parse(".spec.items[*].n").expect("parse");
        assert_eq!(all.find(&v).len(), 2);
    }
}
