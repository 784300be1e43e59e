//! Label and field selectors: kube's grammar, its error messages, and matching.

use crate::object::MetaField;
use serde_json::Value;

use crate::object::meta::{validate_label_key, validate_label_value};

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Exists,
    DoesNotExist,
    Equals,
    NotEquals,
    In,
    NotIn,
    Gt,
    Lt,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    Gt,
    Lt,
    End,
}

impl Token {
    fn literal(&self) -> String {
        match self {
            Token::Ident(s) => s.clone(),
            Token::Bang => "!".into(),
            Token::Eq => "=".into(),
            Token::DoubleEq => "==".into(),
            Token::NotEq => "!=".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Comma => ",".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::End => String::new(),
        }
    }
}

fn tokenize(s: &str) -> Vec<Token> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let special =
        |c: char| matches!(c, '!' | '=' | '(' | ')' | ',' | '>' | '<') || c.is_whitespace();
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        let tok = match (two.as_str(), c) {
            ("==", _) => {
                i += 2;
                Token::DoubleEq
            }
            ("!=", _) => {
                i += 2;
                Token::NotEq
            }
            (_, '!') => {
                i += 1;
                Token::Bang
            }
            (_, '=') => {
                i += 1;
                Token::Eq
            }
            (_, '(') => {
                i += 1;
                Token::Open
            }
            (_, ')') => {
                i += 1;
                Token::Close
            }
            (_, ',') => {
                i += 1;
                Token::Comma
            }
            (_, '>') => {
                i += 1;
                Token::Gt
            }
            (_, '<') => {
                i += 1;
                Token::Lt
            }
            _ => {
                let start = i;
                while i < chars.len() && !special(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(word),
                }
            }
        };
        out.push(tok);
    }
    out.push(Token::End);
    out
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }
    /// In a value position, `in`/`notin` are plain words.
    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t != Token::End {
            self.pos += 1;
        }
        t
    }
    fn next_value(&mut self) -> Token {
        match self.next() {
            Token::In => Token::Ident("in".into()),
            Token::NotIn => Token::Ident("notin".into()),
            t => t,
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = match self.next() {
            Token::Bang => match self.next_value() {
                Token::Ident(k) => (k, Some(Op::DoesNotExist)),
                t => return Err(format!("found '{}', expected: identifier", t.literal())),
            },
            Token::Ident(k) => (k, None),
            t @ (Token::In | Token::NotIn) => (t.literal(), None),
            t => {
                return Err(format!(
                    "found '{}', expected: !, identifier, or 'end of string'",
                    t.literal()
                ))
            }
        };
        validate_label_key(&key).map_err(|msg| {
            format!(
                "unable to parse requirement: <nil>: Invalid value: {}: {msg}",
                crate::status::quote(&key)
            )
        })?;
        if let Some(op) = op {
            return Ok(Requirement {
                key,
                op,
                values: vec![],
            });
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(Requirement {
                key,
                op: Op::Exists,
                values: vec![],
            });
        }
        let op = match self.next() {
            Token::Eq | Token::DoubleEq => Op::Equals,
            Token::NotEq => Op::NotEquals,
            Token::In => Op::In,
            Token::NotIn => Op::NotIn,
            Token::Gt => Op::Gt,
            Token::Lt => Op::Lt,
            t => {
                return Err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                ))
            }
        };
        let values = match op {
            Op::In | Op::NotIn => self.set_values()?,
            _ => match self.peek().clone() {
                Token::End | Token::Comma => vec![String::new()],
                _ => match self.next_value() {
                    Token::Ident(v) => vec![v],
                    t => return Err(format!("found '{}', expected: identifier", t.literal())),
                },
            },
        };
        for v in &values {
            if matches!(op, Op::Gt | Op::Lt) {
                if v.parse::<i64>().is_err() {
                    return Err(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer"
                            .to_string(),
                    );
                }
            } else {
                validate_label_value(v).map_err(|msg| {
                    format!(
                        "unable to parse requirement: values[0][{key}]: Invalid value: {}: {msg}",
                        crate::status::quote(v)
                    )
                })?;
            }
        }
        Ok(Requirement { key, op, values })
    }

    fn set_values(&mut self) -> Result<Vec<String>, String> {
        match self.next() {
            Token::Open => {}
            t => return Err(format!("found '{}' expected: '('", t.literal())),
        }
        let mut values = Vec::new();
        if self.peek() == &Token::Close {
            self.next();
            return Ok(vec![String::new()]);
        }
        loop {
            match self.next_value() {
                Token::Ident(v) => values.push(v),
                Token::Comma => {
                    values.push(String::new());
                    continue;
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        t.literal()
                    ))
                }
            }
            match self.next() {
                Token::Comma => continue,
                Token::Close => return Ok(values),
                t => return Err(format!("found '{}', expected: ',' or ')'", t.literal())),
            }
        }
    }
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut p = Parser {
            tokens: tokenize(s),
            pos: 0,
        };
        let mut requirements = Vec::new();
        if p.peek() == &Token::End {
            return Ok(Self::default());
        }
        loop {
            // kube wraps every error of one started requirement (syntax or
            // validation) in this prefix, once.
            const PREFIX: &str = "unable to parse requirement: ";
            requirements.push(p.requirement().map_err(|e| {
                // A requirement that does not even start is kube's outer
                // loop's error, unwrapped.
                if e.starts_with(PREFIX)
                    || e.ends_with("expected: !, identifier, or 'end of string'")
                {
                    e
                } else {
                    format!("{PREFIX}{e}")
                }
            })?);
            match p.next() {
                Token::End => break,
                Token::Comma => {
                    if matches!(p.peek(), Token::End | Token::Comma) {
                        return Err(format!(
                            "found '{}', expected: identifier after ','",
                            p.peek().literal()
                        ));
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        t.literal()
                    ))
                }
            }
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Matches the `metadata.labels` of an object.
    pub fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// Matches labels looked up by `label` (the watch cache keeps them apart).
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| {
            let v = label(&r.key);
            match r.op {
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Equals | Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::NotEquals | Op::NotIn => v.is_none_or(|v| r.values.iter().all(|x| x != v)),
                Op::Gt | Op::Lt => {
                    let (Some(v), Some(bound)) = (
                        v.and_then(|v| v.parse::<i64>().ok()),
                        r.values.first().and_then(|b| b.parse::<i64>().ok()),
                    ) else {
                        return false;
                    };
                    if r.op == Op::Gt {
                        v > bound
                    } else {
                        v < bound
                    }
                }
            }
        })
    }

    pub fn matches_object(&self, obj: &Value) -> bool {
        self.is_empty() || self.matches(obj.meta_field("labels").and_then(Value::as_object))
    }
}

/// A parsed field selector: `field=value`, `field==value`, `field!=value` terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        for term in split_unescaped(s, ',') {
            let (field, eq, value) = if let Some(i) = find_unescaped(&term, "!=") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "==") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "=") {
                (&term[..i], true, &term[i + 1..])
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                ));
            };
            terms.push((field.to_string(), eq, unescape(value)?));
        }
        Ok(Self { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().map(|(f, _, _)| f.as_str())
    }

    /// The value an equality term requires for `field`, if any.
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|(f, eq, _)| f == field && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, get: impl Fn(&str) -> String) -> bool {
        self.terms.iter().all(|(f, eq, v)| (get(f) == *v) == *eq)
    }
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

fn find_unescaped(s: &str, pat: &str) -> Option<usize> {
    // By characters, not bytes: slicing at a byte inside a multi-byte
    // character panics, and a backslash escapes the whole next character.
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if s[i..].starts_with(pat) {
            return Some(i);
        }
    }
    None
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    ))
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            }
        } else if c == ',' || c == '=' {
            return Err(format!(
                "invalid field selector: unescaped character in value: {}",
                c as u32
            ));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Renders a JSON value as a field-selector value (strings bare, numbers and bools as text).
pub fn field_value(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn labels(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn label_selector_operators() {
        let l = labels(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app notin (web)", false),
            ("tier in (back)", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("n>3", true),
            ("n<3", false),
        ];
        for (sel, want) in cases {
            let s = LabelSelector::parse(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(s.matches(Some(&l)), want, "{sel}");
        }
    }

    #[test]
    fn label_selector_errors_match_kube() {
        let e = LabelSelector::parse("app=web,").expect_err("trailing comma");
        assert_eq!(e, "found '', expected: identifier after ','");
        let e = LabelSelector::parse("app in web").expect_err("no paren");
        assert_eq!(e, "unable to parse requirement: found 'web' expected: '('");
        let e = LabelSelector::parse("a/b/c=x").expect_err("bad key");
        assert!(
            e.starts_with("unable to parse requirement: <nil>: Invalid value: \"a/b/c\""),
            "{e}"
        );
        let e = LabelSelector::parse("app=-x").expect_err("bad value");
        assert!(e.contains("a valid label must be an empty string"), "{e}");
    }

    #[test]
    fn field_selector_parses_and_matches() {
        let f = FieldSelector::parse("metadata.name=a,spec.color!=red").expect("parse");
        assert!(f.matches(|k| if k == "metadata.name" {
            "a".into()
        } else {
            "blue".into()
        }));
        assert!(!f.matches(|k| if k == "metadata.name" {
            "a".into()
        } else {
            "red".into()
        }));
        assert_eq!(f.required_value("metadata.name"), Some("a"));
        let e = FieldSelector::parse("metadata.name").expect_err("no op");
        assert_eq!(
            e,
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        let f = FieldSelector::parse(r"metadata.name=a\,b").expect("escaped comma");
        assert_eq!(f.required_value("metadata.name"), Some("a,b"));
    }

    /// Regression (found by `prop_field_selector_never_panics`): the scan for
    /// operators sliced the term at every byte, so any multi-byte character
    /// (`ₐ`, or `é` after a backslash) panicked.
    #[test]
    fn field_selector_multibyte_characters() {
        assert!(FieldSelector::parse("ₐ").is_err());
        let f = FieldSelector::parse("metadata.name=é").expect("parse");
        assert_eq!(f.required_value("metadata.name"), Some("é"));
        let f = FieldSelector::parse("a\\é=x").expect("parse");
        assert_eq!(f.required_value("a\\é"), Some("x"));
        assert!(FieldSelector::parse("\\é").is_err());
        assert!(FieldSelector::parse("a=\\é").is_err());
    }

    const LABEL_TOKENS: &[&str] = &[
        "a",
        "b",
        "app",
        "x/y",
        "example.com/k",
        "-a",
        "a-",
        "1",
        "-1",
        "99999999999999999999",
        "=",
        "==",
        "!=",
        "!",
        "in",
        "notin",
        "(",
        ")",
        ",",
        ">",
        "<",
        " ",
        "\t",
        "é",
        "\\",
        "/",
        ".",
        "_",
        "\u{0}",
    ];

    fn label_map() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(
            prop::sample::select(LABEL_TOKENS),
            prop_oneof![
                prop::sample::select(LABEL_TOKENS).prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                Just(Value::Null),
            ],
            0..6,
        )
        .prop_map(|m| json!({"metadata": {"labels": m}}))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any text parses to a selector or an error; a parsed selector
        /// matches any object without panicking.
        #[test]
        fn prop_label_selector_never_panics(
            s in crate::fuzz::text(LABEL_TOKENS, 24),
            obj in prop_oneof![label_map(), crate::fuzz::json_value()],
        ) {
            if let Ok(sel) = LabelSelector::parse(&s) {
                let _ = sel.matches_object(&obj);
                let _ = sel.matches(obj.meta_field("labels").and_then(Value::as_object));
            }
        }

        #[test]
        fn prop_field_selector_never_panics(
            s in crate::fuzz::text(FIELD_TOKENS, 24),
            obj in crate::fuzz::json_value(),
        ) {
            if let Ok(sel) = FieldSelector::parse(&s) {
                let fields: Vec<&str> = sel.fields().collect();
                for f in fields {
                    let _ = sel.required_value(f);
                }
                let _ = sel.matches(|f| {
                    field_value(obj.pointer(&format!("/{}", f.replace('.', "/"))))
                });
            }
        }
    }

    const FIELD_TOKENS: &[&str] = &[
        "metadata.name",
        "metadata.namespace",
        "spec.x",
        "a",
        "=",
        "==",
        "!=",
        "!",
        ",",
        "\\",
        "\\,",
        "\\=",
        "\\\\",
        "\\n",
        " ",
        "é",
        "日本",
        "\u{0}",
    ];
}
