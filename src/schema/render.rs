//! Values printed the way Go prints them in kube's messages: `%v` for numbers, `%q` for
//! strings, `json.Marshal` (sorted keys) for maps and slices.

use serde_json::Value;

/// Go's `%v` of a float64 (strconv `'g'` with shortest precision): shortest round-trip
/// digits, exponent form when the decimal exponent is < -4 or >= 6 (so 1e6 is `1e+06`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "1.2345e6".
    let e = format!("{f:e}");
    let (mantissa, exp) = match e.split_once('e') {
        Some((m, x)) => (m.to_string(), x.parse::<i32>().unwrap_or(0)),
        None => return e,
    };
    // strconv uses precision 6 for this decision when the precision is "shortest".
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    format!("{f}")
}

/// A JSON number as Go prints the decoded value: int64 as an integer, float64 with `%v`.
pub fn go_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else {
        go_float(n.as_f64().unwrap_or(0.0))
    }
}

/// `json.Marshal` of an unstructured value: map keys sorted, floats in Go's JSON form.
pub fn go_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", json_string(k), go_json(&m[k.as_str()])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(go_json).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => go_json_float(n.as_f64().unwrap_or(0.0)),
        },
        other => other.to_string(),
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// encoding/json's float form: plain decimal unless exponent < -6 or >= 21.
fn go_json_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let e = format!("{f:e}");
        if let Some((m, x)) = e.split_once('e') {
            let exp: i32 = x.parse().unwrap_or(0);
            let sign = if exp < 0 { '-' } else { '+' };
            return format!("{m}e{sign}{:02}", exp.abs());
        }
        return e;
    }
    format!("{f}")
}

/// A value as `field.Error.ErrorBody` prints it: `%v` for numbers and booleans, `%q` for
/// strings, JSON for everything else (null prints as `null`).
pub fn field_value(v: &Value) -> String {
    match v {
        Value::String(s) => crate::status::quote(s),
        Value::Number(n) => go_number(n),
        Value::Bool(b) => b.to_string(),
        other => go_json(other),
    }
}

/// kube-openapi's name for the JSON type of a decoded value.
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::String(_) => "string",
        Value::Number(n) if n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_go() {
        for (f, want) in [
            (0.0, "0"),
            (1.5, "1.5"),
            (10.0, "10"),
            (-2.25, "-2.25"),
            (1e21, "1e+21"),
            (123456789.0, "1.23456789e+08"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
        ] {
            assert_eq!(go_float(f), want, "{f}");
        }
    }

    #[test]
    fn json_sorts_keys() {
        assert_eq!(go_json(&json!({"b":1,"a":"x"})), r#"{"a":"x","b":1}"#);
        assert_eq!(field_value(&json!("x")), "\"x\"");
        assert_eq!(field_value(&json!(null)), "null");
        assert_eq!(field_value(&json!([1, 2])), "[1,2]");
    }
}
