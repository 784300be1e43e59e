//! Differential tests: the same requests to the reference kube-apiserver
//! (`common::real_host`, v1.36.2 with etcd) and to kshard, answers compared.
//!
//! The scenarios are data: every `tests/differential/*.yaml` file holds a list
//! of them (the file's header says how to write one). Both servers serve the
//! same CRDs (`crds/examples`, `tests/fixtures/crds`): kube-apiserver gets them
//! applied, kshard reads the files. Each scenario runs in a namespace of its
//! own (`${ns}`), its steps in order, first against kube-apiserver and then
//! against kshard, step by step, so both see the same sequence.
//!
//! What is compared per request: the status code, `Content-Type`, the
//! `Warning` headers and the body, normalised (see [`Norm`]). Watches opened
//! by a step are read by a later step; their events are compared the same way.
//! A scenario marked `known_difference` is a difference kshard keeps on
//! purpose: it is reported, not failed, must still differ (a mark that no
//! longer matches anything fails, so stale marks are removed), and its name
//! must be listed in the README's differences section.
//!
//! One kube-apiserver for the whole run: a single test runs every scenario and
//! reports every mismatch at the end. `KSHARD_DIFF_ONLY=text` runs only the
//! scenarios whose name contains `text`; `KSHARD_DIFF_SHOW=1` prints both
//! answers of every step.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use common::real_host::RealHost;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};

/// One scenario of a `tests/differential/*.yaml` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    /// Why kshard answers differently on purpose; the scenario must differ.
    #[serde(default)]
    known_difference: Option<String>,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Step {
    /// HTTP method; `GET` when absent.
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// A body given as YAML, sent as JSON.
    #[serde(default)]
    body: Option<Value>,
    /// A body sent exactly as written.
    #[serde(default)]
    raw: Option<String>,
    /// `Content-Type` of the body; `application/json` when absent.
    #[serde(default)]
    content_type: Option<String>,
    /// Values kept from this answer for later steps, by JSON pointer:
    /// `${name}` in later paths and bodies.
    #[serde(default)]
    capture: BTreeMap<String, String>,
    /// Compare the body as text (indentation matters), normalised by pattern.
    #[serde(default)]
    text: bool,
    /// Run on both servers but do not compare (setup the scenario relies on).
    #[serde(default)]
    setup: bool,
    /// Open a watch at `path` under this name (the answer's headers are compared).
    #[serde(default)]
    watch: Option<String>,
    /// Read events of an open watch.
    #[serde(default)]
    events: Option<Events>,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Events {
    watch: String,
    /// Events expected; one more arriving within a short grace is reported too.
    count: usize,
    /// Compare each event's line as text (keys in order), normalised by pattern.
    #[serde(default)]
    text: bool,
}

fn load_scenarios() -> Vec<(String, Scenario)> {
    let dir = common::repo_path("tests/differential");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/differential")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("scenario file");
        let list: Vec<Scenario> =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let file = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.extend(list.into_iter().map(|s| (file.clone(), s)));
    }
    out
}

/// A server under test: a client and what a scenario kept from its answers.
struct Side {
    name: &'static str,
    client: kube::Client,
    vars: HashMap<String, String>,
    norm: Norm,
    watches: HashMap<String, WatchStream>,
}

struct WatchStream {
    body: kube::client::Body,
    buf: Vec<u8>,
}

impl WatchStream {
    /// The next event's line as sent (without its newline), or None when
    /// none comes within `wait`.
    async fn next_line(&mut self, wait: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                line.pop();
                return Some(line);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await;
            match frame {
                Ok(Some(Ok(f))) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// Makes two answers comparable: server-chosen values become stable tokens.
/// resourceVersions and uids are numbered in order of first appearance within
/// the scenario (so "the same resourceVersion as before" stays visible: a
/// no-op write shows the token of the previous answer); a list's own
/// resourceVersion, continue tokens, timestamps and generated name suffixes
/// become placeholders.
#[derive(Default)]
struct Norm {
    rvs: HashMap<String, usize>,
    uids: HashMap<String, usize>,
}

fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && s.ends_with('Z')
        && b[..4].iter().all(u8::is_ascii_digit)
}

impl Norm {
    fn rv(&mut self, v: &str) -> String {
        let n = self.rvs.len() + 1;
        format!("RV#{}", self.rvs.entry(v.to_string()).or_insert(n))
    }
    fn uid(&mut self, v: &str) -> String {
        let n = self.uids.len() + 1;
        format!("UID#{}", self.uids.entry(v.to_string()).or_insert(n))
    }

    fn value(&mut self, v: &mut Value) {
        // A list's own resourceVersion is the store's current revision, which
        // on kube-apiserver moves with writes outside the scenario (leases).
        if let Some(o) = v.as_object_mut() {
            if o.contains_key("items") {
                if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                    if m.get("resourceVersion").is_some_and(Value::is_string) {
                        m.insert("resourceVersion".into(), json!("<list-rv>"));
                    }
                    if m.get("continue")
                        .and_then(Value::as_str)
                        .is_some_and(|c| !c.is_empty())
                    {
                        m.insert("continue".into(), json!("<continue>"));
                    }
                }
            }
            // managedFields are ordered by their times (then manager), and
            // the two servers run a scenario in different seconds: compare
            // the entries in one order.
            if let Some(Value::Array(entries)) = o.get_mut("managedFields") {
                let key = |e: &Value| {
                    ["operation", "manager", "subresource", "apiVersion"]
                        .map(|k| e[k].as_str().unwrap_or_default().to_string())
                };
                entries.sort_by_key(key);
            }
            // A table's ages ("0s", "1s") depend on when each server was asked.
            if let (Some(Value::Array(cols)), Some(Value::Array(_))) =
                (o.get("columnDefinitions").cloned(), o.get("rows"))
            {
                let dates: Vec<usize> = cols
                    .iter()
                    .enumerate()
                    // Built-in printers give an age column the type `date`
                    // (the webhook configurations' printer a `string` named Age).
                    .filter(|(_, c)| {
                        c["format"] == "date" || c["type"] == "date" || c["name"] == "Age"
                    })
                    .map(|(i, _)| i)
                    .collect();
                if let Some(Value::Array(rows)) = o.get_mut("rows") {
                    for row in rows {
                        if let Some(Value::Array(cells)) = row.get_mut("cells") {
                            for &i in &dates {
                                if let Some(c) = cells.get_mut(i) {
                                    *c = json!("<age>");
                                }
                            }
                        }
                    }
                }
            }
            if let (Some(Value::String(gen)), Some(Value::String(name))) =
                (o.get("generateName").cloned(), o.get("name").cloned())
            {
                if name.starts_with(&gen) && name.len() > gen.len() {
                    o.insert("name".into(), json!(format!("{gen}<generated>")));
                }
            }
        }
        match v {
            Value::Object(o) => {
                for (k, child) in o.iter_mut() {
                    match (k.as_str(), &*child) {
                        ("resourceVersion", Value::String(s)) if !s.starts_with('<') => {
                            *child = json!(self.rv(s));
                        }
                        ("uid", Value::String(s)) => *child = json!(self.uid(s)),
                        _ => self.value(child),
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|c| self.value(c)),
            Value::String(s) if is_timestamp(s) => *v = json!("<time>"),
            _ => {}
        }
    }

    /// Server-chosen values inside messages: known uids ("UID in object
    /// meta: …"), a delete precondition's resourceVersions, and the
    /// resourceVersions and times of an object a message quotes as JSON.
    fn strings(&mut self, v: &mut Value) {
        match v {
            Value::Object(o) => o.values_mut().for_each(|c| self.strings(c)),
            Value::Array(a) => a.iter_mut().for_each(|c| self.strings(c)),
            Value::String(s) if s.contains(' ') => {
                for (uid, n) in &self.uids {
                    if s.contains(uid.as_str()) {
                        *s = s.replace(uid.as_str(), &format!("UID#{n}"));
                    }
                }
                // The resourceVersions of an object a message quotes as
                // JSON, and a delete precondition's "ResourceVersion in the
                // precondition (…) does not match … in record (…)".
                for pattern in [
                    r#"resourceVersion\\":\\"(\d+)\\""#,
                    r"(?:in the precondition|in record) \((\d+)\)",
                ] {
                    let found: Vec<(String, String)> = regex::Regex::new(pattern)
                        .expect("regex")
                        .captures_iter(s)
                        .map(|c| (c[0].to_string(), c[1].to_string()))
                        .collect();
                    for (whole, rv) in found {
                        let tok = self.rv(&rv);
                        *s = s.replace(&whole, &whole.replace(&rv, &tok));
                    }
                }
                let ts =
                    regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").expect("regex");
                *s = ts.replace_all(s, "<time>").into_owned();
            }
            _ => {}
        }
    }

    fn json(&mut self, mut v: Value) -> Value {
        self.value(&mut v);
        self.strings(&mut v);
        v
    }

    /// A body compared as text: the same placeholders by pattern, and as
    /// [`Norm::value`] gives them, a list's (or table's) own resourceVersion
    /// and a table's ages.
    fn text(&mut self, s: &str) -> String {
        let rv = regex::Regex::new(r#""resourceVersion": ?"(\d+)""#).expect("regex");
        let uid = regex::Regex::new(r#""uid": ?"([0-9a-f-]{36})""#).expect("regex");
        let ts = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").expect("regex");
        let age = regex::Regex::new(r#""\d+(s|m|h|d|y)(\d+(s|m|h))?""#).expect("regex");
        let mut s = s.to_string();
        let is_list = ["items", "rows"]
            .iter()
            .any(|k| top_level_span(&s, k).is_some());
        if is_list {
            if let Some(span) = top_level_span(&s, "metadata") {
                let meta = rv
                    .replace_all(&s[span.clone()], r#""resourceVersion":"<list-rv>""#)
                    .into_owned();
                s.replace_range(span, &meta);
            }
        }
        if let Some(span) = top_level_span(&s, "rows") {
            let cells = regex::Regex::new(r#""cells": ?\[[^\]]*\]"#).expect("regex");
            let rows = cells
                .replace_all(&s[span.clone()], |c: &regex::Captures| {
                    age.replace_all(&c[0], r#""<age>""#).into_owned()
                })
                .into_owned();
            s.replace_range(span, &rows);
        }
        let mut out = s.clone();
        for c in rv.captures_iter(&s) {
            let tok = self.rv(&c[1]);
            out = out.replace(&c[0], &c[0].replace(&c[1], &tok));
        }
        for c in uid.captures_iter(&s) {
            let tok = self.uid(&c[1]);
            out = out.replace(&c[0], &c[0].replace(&c[1], &tok));
        }
        ts.replace_all(&out, "<time>").into_owned()
    }
}

/// Where the value of `key` in a JSON document's top-level object is, in
/// its text (compact or indented): a scan that follows strings and nesting.
fn top_level_span(text: &str, key: &str) -> Option<std::ops::Range<usize>> {
    let b = text.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    let string_end = |mut j: usize| -> usize {
        // `j` is just past an opening quote; returns just past the closing one.
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => return j + 1,
                _ => j += 1,
            }
        }
        b.len()
    };
    while i < b.len() {
        match b[i] {
            b'"' => {
                let end = string_end(i + 1);
                let rest = text[end..].trim_start();
                if depth == 1 && rest.starts_with(':') && &text[i + 1..end - 1] == key {
                    let start = text.len() - rest[1..].trim_start().len();
                    // The value's end: back to this depth, or a comma at it.
                    let (mut d, mut j) = (0usize, start);
                    while j < b.len() {
                        match b[j] {
                            b'"' => {
                                j = string_end(j + 1);
                                continue;
                            }
                            b'{' | b'[' => d += 1,
                            b'}' | b']' if d == 0 => return Some(start..j),
                            b'}' | b']' => {
                                d -= 1;
                                if d == 0 {
                                    return Some(start..j + 1);
                                }
                            }
                            b',' if d == 0 => return Some(start..j),
                            _ => {}
                        }
                        j += 1;
                    }
                    return None;
                }
                i = end;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

fn substitute(s: &str, vars: &HashMap<String, String>) -> String {
    let mut out = s.to_string();
    for (k, v) in vars {
        out = out.replace(&format!("${{{k}}}"), v);
    }
    out
}

/// The request a step sends, with this side's variables filled in.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn request_of(step: &Step, vars: &HashMap<String, String>) -> Request {
    let path = substitute(step.path.as_deref().unwrap_or("/"), vars);
    let body = match (&step.raw, &step.body) {
        (Some(raw), _) => substitute(raw, vars).into_bytes(),
        (None, Some(b)) => substitute(&b.to_string(), vars).into_bytes(),
        (None, None) => Vec::new(),
    };
    let mut headers: Vec<(String, String)> = step
        .headers
        .iter()
        .map(|(k, v)| (k.to_lowercase(), substitute(v, vars)))
        .collect();
    if step.raw.is_some() || step.body.is_some() {
        headers.push((
            "content-type".into(),
            step.content_type
                .clone()
                .unwrap_or_else(|| "application/json".into()),
        ));
    }
    Request {
        method: step.method.clone().unwrap_or_else(|| "GET".into()),
        path,
        headers,
        body,
    }
}

async fn send(client: &kube::Client, r: &Request) -> http::Response<kube::client::Body> {
    let mut b = http::Request::builder()
        .method(r.method.as_str())
        .uri(r.path.as_str());
    // The field manager kube derives from the user agent is part of the answer.
    if !r.headers.iter().any(|(k, _)| k == "user-agent") {
        b = b.header("user-agent", "differential/1.0");
    }
    for (k, v) in &r.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    let req = b
        .body(kube::client::Body::from(r.body.clone()))
        .expect("request");
    client.send(req).await.expect("send")
}

/// An answer in the form compared: code, headers that matter, body.
fn answer_of(parts: &http::response::Parts, body: &[u8], text: bool, norm: &mut Norm) -> Value {
    let header = |name: &str| -> Vec<String> {
        parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    };
    let protobuf = header("content-type")
        .first()
        .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
    // Go's JSON encoder ends a document with a newline: whether a body
    // does is compared for every answer, whatever else is.
    let final_newline = body.last() == Some(&b'\n');
    let body = if text {
        json!(norm.text(&String::from_utf8_lossy(body)))
    } else if protobuf && body.starts_with(b"k8s\0") {
        protobuf_tree(&body[4..])
    } else if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => norm.json(v),
            Err(_) => json!(String::from_utf8_lossy(body)),
        }
    };
    json!({
        "code": parts.status.as_u16(),
        "contentType": header("content-type"),
        "warning": header("warning"),
        "finalNewline": final_newline,
        "cacheControl": header("cache-control"),
        "hasAuditId": !header("audit-id").is_empty(),
        "hasPfFlowSchemaUid": !header("x-kubernetes-pf-flowschema-uid").is_empty(),
        "hasPfPriorityLevelUid": !header("x-kubernetes-pf-prioritylevel-uid").is_empty(),
        "contentEncoding": header("content-encoding"),
        "vary": header("vary"),
        "body": body,
    })
}

/// A protobuf body as a comparable tree, read by its wire format alone (no
/// schema): each field as `"<number>"` with its values in order; a length-
/// delimited field that reads as a message is a subtree, otherwise text.
/// A varint in the range of Unix seconds of this era is a time (the seconds
/// of a `metav1.Time`), which differs between the servers' answers.
fn protobuf_tree(b: &[u8]) -> Value {
    fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let c = *b.get(*i)?;
            *i += 1;
            v |= u64::from(c & 0x7f) << shift;
            if c < 0x80 {
                return Some(v);
            }
        }
        None
    }
    fn message(b: &[u8]) -> Option<Vec<(u64, Value)>> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let key = varint(b, &mut i)?;
            let (field, wire) = (key >> 3, key & 7);
            if field == 0 {
                return None;
            }
            let v = match wire {
                0 => {
                    let n = varint(b, &mut i)?;
                    if (1_500_000_000..4_000_000_000).contains(&n) {
                        json!("<time>")
                    } else {
                        json!(n)
                    }
                }
                2 => {
                    let len = usize::try_from(varint(b, &mut i)?).ok()?;
                    let bytes = b.get(i..i.checked_add(len)?)?;
                    i += len;
                    match message(bytes).filter(|m| !m.is_empty()) {
                        Some(m) => tree(m),
                        None => json!(String::from_utf8_lossy(bytes)),
                    }
                }
                _ => return None,
            };
            out.push((field, v));
        }
        Some(out)
    }
    fn tree(fields: Vec<(u64, Value)>) -> Value {
        let mut o = serde_json::Map::new();
        for (f, v) in fields {
            let entry = o.entry(f.to_string()).or_insert_with(|| json!([]));
            if let Some(a) = entry.as_array_mut() {
                a.push(v);
            }
        }
        Value::Object(o)
    }
    match message(b) {
        Some(m) => tree(m),
        None => json!(String::from_utf8_lossy(b)),
    }
}

/// What differs between two values, one line per path.
fn diff(path: &str, kube: &Value, ours: &Value, out: &mut Vec<String>) {
    match (kube, ours) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                let p = format!("{path}/{k}");
                match b.get(k) {
                    Some(vb) => diff(&p, va, vb, out),
                    None => out.push(format!("{p}: kube {va}, kshard has none")),
                }
            }
            for (k, vb) in b {
                if !a.contains_key(k) {
                    out.push(format!("{path}/{k}: kube has none, kshard {vb}"));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}/{i}"), va, vb, out);
            }
        }
        // Multi-line text (indented bodies) is shown whole, one side per block.
        (Value::String(a), Value::String(b))
            if a != b && (a.contains('\n') || b.contains('\n')) =>
        {
            out.push(format!(
                "{path}: text differs\n  kube:\n{a}\n  kshard:\n{b}"
            ));
        }
        _ if kube != ours => out.push(format!("{path}: kube {kube}, kshard {ours}")),
        _ => {}
    }
}

fn describe(r: &Request) -> String {
    let mut s = format!("{} {}", r.method, r.path);
    for (k, v) in &r.headers {
        let _ = write!(s, "\n    {k}: {v}");
    }
    if !r.body.is_empty() {
        let body = String::from_utf8_lossy(&r.body);
        let shown: String = body.chars().take(400).collect();
        let _ = write!(s, "\n    body: {shown}");
    }
    s
}

/// Runs one step on one side; returns the normalised answer (None for a
/// setup step).
async fn run_step(side: &mut Side, step: &Step) -> (Request, Value) {
    let req = request_of(step, &side.vars);
    if let Some(ev) = &step.events {
        let Some(w) = side.watches.get_mut(&ev.watch) else {
            panic!("{}: no watch named {}", side.name, ev.watch)
        };
        let mut got = Vec::new();
        for _ in 0..ev.count {
            match w.next_line(Duration::from_secs(5)).await {
                Some(e) => got.push(e),
                None => break,
            }
        }
        // An extra event (the kind of difference this catches) shows up
        // within a short while after the expected ones.
        if got.len() == ev.count {
            if let Some(e) = w.next_line(Duration::from_millis(500)).await {
                got.push(e);
            }
        }
        let events = if ev.text {
            let lines = got
                .iter()
                .map(|l| Value::String(side.norm.text(&String::from_utf8_lossy(l))))
                .collect();
            Value::Array(lines)
        } else {
            let parsed = got
                .iter()
                .map(|l| {
                    serde_json::from_slice(l)
                        .unwrap_or_else(|_| json!({"unparsed": String::from_utf8_lossy(l)}))
                })
                .collect();
            side.norm.json(Value::Array(parsed))
        };
        let req = Request {
            method: "WATCH".into(),
            path: format!("events of {}", ev.watch),
            headers: vec![],
            body: vec![],
        };
        return (req, events);
    }
    let resp = send(&side.client, &req).await;
    let (parts, body) = resp.into_parts();
    if let Some(name) = &step.watch {
        let answer = answer_of(&parts, &[], false, &mut side.norm);
        side.watches.insert(
            name.clone(),
            WatchStream {
                body,
                buf: Vec::new(),
            },
        );
        return (req, answer);
    }
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if !step.capture.is_empty() {
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        for (name, pointer) in &step.capture {
            let got = match v.pointer(pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            side.vars.insert(name.clone(), got);
        }
    }
    let answer = answer_of(&parts, &bytes, step.text, &mut side.norm);
    (req, answer)
}

/// Runs a scenario on both servers; the lines describing every difference.
async fn run_scenario(kube: &mut Side, ours: &mut Side, s: &Scenario) -> Vec<String> {
    let mut report = Vec::new();
    for (i, step) in s.steps.iter().enumerate() {
        let (kube_req, kube_answer) = run_step(kube, step).await;
        let (_, our_answer) = run_step(ours, step).await;
        if step.setup {
            continue;
        }
        if std::env::var_os("KSHARD_DIFF_SHOW").is_some() {
            eprintln!(
                "--- {} step {}: {}\n  kube:   {kube_answer}\n  kshard: {our_answer}",
                s.name,
                i + 1,
                describe(&kube_req)
            );
        }
        let mut lines = Vec::new();
        diff("", &kube_answer, &our_answer, &mut lines);
        if !lines.is_empty() {
            report.push(format!(
                "  step {}: {}\n{}",
                i + 1,
                describe(&kube_req),
                lines
                    .iter()
                    .take(40)
                    .map(|l| format!("    {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
    }
    report
}

/// The CRDs kshard serves, installed into kube-apiserver and served.
fn install_crds(host: &RealHost) {
    for f in ["crds/examples", "tests/fixtures/crds"] {
        let path = common::repo_path(f);
        host.kubectl_ok(&["apply", "-f", &path.to_string_lossy()]);
    }
    host.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ]);
    // Established comes a moment before the handlers serve the resources.
    host.wait_until("the CRDs served", Duration::from_secs(30), || {
        [
            "widgets.demo.kshard.dev",
            "gadgets.test.kshard.dev",
            "things.test.kshard.dev",
        ]
        .iter()
        .all(|r| host.kubectl(&["get", r]).status.success())
    });
}

/// kubectl's identity commands, run against both servers: exit code,
/// output and warnings must be the same. The reference's client is in
/// system:masters, so RBAC allows it what kshard standalone allows everyone.
fn kubectl_identity_commands(host: &RealHost, server: &common::TestServer) -> Vec<String> {
    let commands: [&[&str]; 5] = [
        &["auth", "whoami", "--as=alice", "--as-group=devs"],
        &[
            "auth",
            "can-i",
            "create",
            "widgets.demo.kshard.dev",
            "-n",
            "default",
        ],
        &["auth", "can-i", "list", "gadgets", "--all-namespaces"],
        &["auth", "can-i", "get", "/healthz"],
        &["auth", "can-i", "get", "nosuchthings"],
    ];
    let mut failures = Vec::new();
    for args in commands {
        let shown = |o: &std::process::Output| {
            format!(
                "exit {:?}\nstdout: {}\nstderr: {}",
                o.status.code(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        let kube = shown(&host.kubectl(args));
        let ours = shown(&server.kubectl(args));
        if kube != ours {
            failures.push(format!(
                "kubectl {}:\n  kube:\n{kube}\n  kshard:\n{ours}",
                args.join(" ")
            ));
        }
    }
    failures
}

/// `/openapi/v2` for the CRD groups: their paths (every operation, its
/// parameters, responses and extensions), the shared parameters those
/// paths refer to, and every definition they and the CRDs' kinds refer to,
/// transitively. kube's v2 document is the whole cluster's, so what belongs
/// to the other groups it serves is left out; the v3 documents are compared
/// whole by the scenarios of `60_openapi.yaml`.
fn openapi_parts(host: &RealHost, server: &common::TestServer) -> Vec<String> {
    let get = |raw: String| serde_json::from_str::<Value>(&raw).unwrap_or(Value::Null);
    let (kube2, ours2) = (
        get(host.kubectl_ok(&["get", "--raw", "/openapi/v2"])),
        get(server.kubectl_ok(&["get", "--raw", "/openapi/v2"])),
    );
    let mut failures = Vec::new();
    for (group, defs_prefix) in [
        ("demo.kshard.dev", "dev.kshard.demo."),
        ("test.kshard.dev", "dev.kshard.test."),
    ] {
        let part = |doc: &Value| -> Value { openapi_v2_part(doc, group, defs_prefix) };
        let (k, o) = (part(&kube2), part(&ours2));
        assert!(
            k["paths"].as_object().is_some_and(|m| !m.is_empty())
                && k["definitions"].as_object().is_some_and(|m| !m.is_empty()),
            "kube's /openapi/v2 has no {group} paths or definitions"
        );
        let mut lines = Vec::new();
        diff("", &k, &o, &mut lines);
        failures.extend(
            lines
                .into_iter()
                .take(40)
                .map(|l| format!("OpenAPI v2 of {group}: {l}")),
        );
    }
    failures
}

/// The part of a `/openapi/v2` document that serves `group`: its paths,
/// the `#/parameters/` they name and the `#/definitions/` they, and the
/// group's own definitions, name in turn.
fn openapi_v2_part(doc: &Value, group: &str, defs_prefix: &str) -> Value {
    fn refs(v: &Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    if let Some(name) = r.strip_prefix(prefix) {
                        out.push(name.to_string());
                    }
                }
                o.values().for_each(|c| refs(c, prefix, out));
            }
            Value::Array(a) => a.iter().for_each(|c| refs(c, prefix, out)),
            _ => {}
        }
    }
    let prefix = format!("/apis/{group}/");
    let paths: serde_json::Map<String, Value> = doc["paths"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(p, _)| p.starts_with(&prefix))
                .map(|(p, v)| (p.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let paths = Value::Object(paths);
    let mut names = Vec::new();
    refs(&paths, "#/parameters/", &mut names);
    let parameters: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| (n.clone(), doc["parameters"][n].clone()))
        .collect();
    let mut wanted = Vec::new();
    refs(&paths, "#/definitions/", &mut wanted);
    if let Some(d) = doc["definitions"].as_object() {
        wanted.extend(d.keys().filter(|n| n.starts_with(defs_prefix)).cloned());
    }
    let mut definitions = serde_json::Map::new();
    while let Some(name) = wanted.pop() {
        if definitions.contains_key(&name) {
            continue;
        }
        let d = doc["definitions"][&name].clone();
        refs(&d, "#/definitions/", &mut wanted);
        definitions.insert(name, d);
    }
    json!({"paths": paths, "parameters": parameters, "definitions": definitions})
}

/// kubectl's client-side apply of a changed configuration (a strategic
/// merge patch for kube's built-in kinds, computed from the server's
/// OpenAPI): applied twice, once as created and once changed (an item
/// changed, one removed, one added, the order changed, labels changed),
/// against both servers; kubectl's output and the objects must agree.
fn kubectl_client_side_apply(
    host: &RealHost,
    server: &common::TestServer,
    dir: &std::path::Path,
) -> Vec<String> {
    let hook = |name: &str, timeout: u32, extra: &str| {
        format!(
            "- name: {name}\n  clientConfig: {{url: \"https://127.0.0.1:1/{name}\"}}\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  timeoutSeconds: {timeout}\n  namespaceSelector: {{matchLabels: {{never: match}}}}\n{extra}"
        )
    };
    let conditions = |names: &[&str]| {
        let items: Vec<String> = names
            .iter()
            .map(|n| format!("  - {{name: {n}, expression: \"true\"}}\n"))
            .collect();
        format!("  matchConditions:\n{}", items.concat())
    };
    let vwc = |labels: &str, hooks: &[String]| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata:\n  name: csa-vwc\n  labels: {labels}\nwebhooks:\n{}",
            hooks.concat()
        )
    };
    let policy = |variables: &[&str], expression: &str| {
        let vars: Vec<String> = variables
            .iter()
            .map(|v| format!("    - {{name: {v}, expression: \"1\"}}\n"))
            .collect();
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata:\n  name: csa-vap\nspec:\n  matchConstraints:\n    resourceRules: [{{apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}}]\n  variables:\n{}  validations: [{{expression: \"{expression}\"}}]\n",
            vars.concat()
        )
    };
    let first = format!(
        "{}---\n{}",
        vwc(
            "{a: b, c: d}",
            &[
                hook("a.example.com", 10, &conditions(&["m1", "m2"])),
                hook("b.example.com", 10, ""),
                hook("x.example.com", 10, ""),
            ]
        ),
        policy(&["v1", "v2"], "true")
    );
    let second = format!(
        "{}---\n{}",
        vwc(
            "{a: z}",
            &[
                hook("x.example.com", 10, ""),
                hook("c.example.com", 7, ""),
                hook("a.example.com", 5, &conditions(&["m3", "m1"])),
            ]
        ),
        policy(&["v3", "v1"], "false")
    );
    let mut failures = Vec::new();
    let shown = |o: &std::process::Output| {
        format!(
            "exit {:?}\nstdout: {}\nstderr: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    for (i, text) in [&first, &first, &second].into_iter().enumerate() {
        let file = dir.join(format!("client-side-apply-{i}.yaml"));
        std::fs::write(&file, text).expect("manifest");
        let args = ["apply", "-f", &file.to_string_lossy()];
        let (kube, ours) = (shown(&host.kubectl(&args)), shown(&server.kubectl(&args)));
        if kube != ours {
            failures.push(format!(
                "kubectl apply (client-side) #{}:\n  kube:\n{kube}\n  kshard:\n{ours}",
                i + 1
            ));
        }
    }
    for what in [
        "validatingwebhookconfiguration/csa-vwc",
        "validatingadmissionpolicy/csa-vap",
    ] {
        let get = |raw: String| {
            Norm::default().json(serde_json::from_str::<Value>(&raw).unwrap_or(Value::Null))
        };
        let kube = get(host.kubectl_ok(&["get", what, "-o", "json"]));
        let ours = get(server.kubectl_ok(&["get", what, "-o", "json"]));
        let mut lines = Vec::new();
        diff("", &kube, &ours, &mut lines);
        failures.extend(
            lines
                .into_iter()
                .take(40)
                .map(|l| format!("{what} after client-side applies: {l}")),
        );
        host.kubectl_ok(&["delete", what]);
        server.kubectl_ok(&["delete", what]);
    }
    failures
}

/// kubectl against one of the two servers.
type Kubectl<'a> = dyn Fn(&[&str]) -> std::process::Output + 'a;

/// The real-world CRDs of `../shared/realworld-crds` (kyverno,
/// external-secrets, prometheus-operator, policy reports) with objects of
/// each (`tests/fixtures/realworld-examples`, carrying `creationTimestamp:
/// null`): applied once, then re-applied twice a second later, server-side
/// and with kubectl's client-side apply, against kube-apiserver and a
/// kshard serving the same CRDs. A re-apply must write nothing (the
/// objects keep their resourceVersion) on either server, kubectl must
/// say the same of each apply, and the objects must end alike.
async fn reapplying_real_world_examples(host: &RealHost, dir: &std::path::Path) -> Vec<String> {
    let crds = common::repo_path("../shared/realworld-crds");
    let mut failures = Vec::new();
    let server = common::start_with(|c| c.crds.push(crds.clone())).await;
    // Too large for client-side apply's annotation: created.
    host.kubectl_ok(&["create", "-f", &crds.to_string_lossy()]);
    host.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ]);
    let kinds = [
        "prometheusrules.monitoring.coreos.com",
        "servicemonitors.monitoring.coreos.com",
        "generatingpolicies.policies.kyverno.io",
        "namespacedgeneratingpolicies.policies.kyverno.io",
        "pushsecrets.external-secrets.io",
        "clusterpushsecrets.external-secrets.io",
        "policyreports.reports.x-k8s.io",
        "clusterpolicyreports.reports.x-k8s.io",
    ];
    host.wait_until(
        "the real-world CRDs served",
        Duration::from_secs(30),
        || {
            kinds
                .iter()
                .all(|r| host.kubectl(&["get", r, "-A"]).status.success())
        },
    );
    let examples = std::fs::read_to_string(common::repo_path(
        "tests/fixtures/realworld-examples/examples.yaml",
    ))
    .expect("examples");
    let shown = |o: &std::process::Output| {
        format!(
            "exit {:?}\nstdout: {}\nstderr: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    // name -> resourceVersion of every example, as one server has them.
    let versions = |out: String| -> BTreeMap<String, String> {
        let list: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|o| {
                        (
                            format!(
                                "{}/{}",
                                o["kind"].as_str().unwrap_or(""),
                                o["metadata"]["name"].as_str().unwrap_or("")
                            ),
                            o["metadata"]["resourceVersion"]
                                .as_str()
                                .unwrap_or("")
                                .to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    for (mode, flags) in [("ssa", &["--server-side"][..]), ("csa", &[][..])] {
        let ns = format!("realworld-{mode}");
        host.kubectl_ok(&["create", "namespace", &ns]);
        let file = dir.join(format!("realworld-{mode}.yaml"));
        std::fs::write(&file, examples.replace("${mode}", mode)).expect("examples file");
        let path = file.to_string_lossy().into_owned();
        let mut apply: Vec<&str> = vec!["apply", "-n", &ns, "-f", &path];
        apply.extend_from_slice(flags);
        let get = ["get", "-n", &ns, "-f", &path, "-o", "json"];
        let sides: [(&str, &Kubectl); 2] = [
            ("kube-apiserver", &|a: &[&str]| host.kubectl(a)),
            ("kshard", &|a: &[&str]| server.kubectl(a)),
        ];
        let mut first = Vec::new();
        for (name, run) in &sides {
            let out = run(&apply);
            if !out.status.success() {
                failures.push(format!(
                    "{name}: kubectl {} refused the examples:\n{}",
                    apply.join(" "),
                    shown(&out)
                ));
            }
            first.push(versions(
                String::from_utf8_lossy(&run(&get).stdout).into_owned(),
            ));
        }
        if failures.iter().any(|f| f.contains("refused the examples")) {
            continue;
        }
        let expected = examples.matches("\nkind: ").count();
        for ((name, _), got) in sides.iter().zip(&first) {
            if got.len() != expected {
                failures.push(format!(
                    "{name}: {} of the {expected} real-world examples read back ({mode})",
                    got.len()
                ));
            }
        }
        eprintln!(
            "real-world examples ({mode}): {expected} objects applied, re-applied twice on both servers"
        );
        // A second later, so a rewritten managedFields time would show.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for round in 2..=3 {
            let mut said = Vec::new();
            for (i, (name, run)) in sides.iter().enumerate() {
                let out = run(&apply);
                said.push(shown(&out));
                let now = versions(String::from_utf8_lossy(&run(&get).stdout).into_owned());
                for (obj, rv) in &first[i] {
                    if now.get(obj) != Some(rv) {
                        failures.push(format!(
                            "{name}: re-apply #{round} ({mode}) of {obj} wrote a new revision ({rv} -> {:?})",
                            now.get(obj)
                        ));
                    }
                }
            }
            if said[0] != said[1] {
                failures.push(format!(
                    "kubectl {} (re-apply #{round}):\n  kube:\n{}\n  kshard:\n{}",
                    apply.join(" "),
                    said[0],
                    said[1]
                ));
            }
        }
        let objects = |out: &std::process::Output| {
            Norm::default()
                .json(serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null))
        };
        let (k, o) = (objects(&host.kubectl(&get)), objects(&server.kubectl(&get)));
        let mut lines = Vec::new();
        diff("", &k, &o, &mut lines);
        failures.extend(
            lines
                .into_iter()
                .take(40)
                .map(|l| format!("real-world examples after {mode} applies: {l}")),
        );
    }
    failures
}

/// A metric family's `# HELP` and `# TYPE` texts, when present.
type Family = (Option<String>, Option<String>);

/// A `/metrics` text's families by name, and the names of samples that
/// belong to no declared family.
fn families(text: &str) -> (BTreeMap<String, Family>, Vec<String>) {
    let mut fams: BTreeMap<String, Family> = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            fams.entry(name.into()).or_default().0 = Some(help.into());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            fams.entry(name.into()).or_default().1 = Some(ty.into());
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or("").to_string();
            samples.push(name);
        }
    }
    let orphans = samples
        .into_iter()
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !fams.contains_key(n) && !fams.contains_key(base)
        })
        .collect();
    (fams, orphans)
}

/// Every family kshard's `/metrics` shows has `# HELP` and `# TYPE` lines,
/// and a family kube-apiserver has too has kube's help text and type.
fn metric_families(host: &RealHost, server: &common::TestServer) -> Vec<String> {
    let kube_text = host.kubectl_ok(&["get", "--raw", "/metrics"]);
    let ours_text = server.kubectl_ok(&["get", "--raw", "/metrics"]);
    let (kube, _) = families(&kube_text);
    let (ours, orphans) = families(&ours_text);
    let mut failures: Vec<String> = orphans
        .iter()
        .map(|n| format!("/metrics: sample {n} has no # HELP / # TYPE"))
        .collect();
    assert!(!ours.is_empty(), "kshard's /metrics shows no family");
    for (name, (help, ty)) in &ours {
        if help.as_deref().unwrap_or("").is_empty() || ty.is_none() {
            failures.push(format!("/metrics: {name} lacks # HELP or # TYPE"));
        }
        if let Some(k) = kube.get(name) {
            if k != &(help.clone(), ty.clone()) {
                failures.push(format!(
                    "/metrics: {name}: kube {k:?}, kshard {:?}",
                    (help, ty)
                ));
            }
        }
    }
    failures
}

/// The README's list of deliberate differences.
fn readme_differences() -> String {
    let readme = std::fs::read_to_string(common::repo_path("README.md")).expect("README");
    let start = readme
        .find("## Where kshard answers differently from kube-apiserver")
        .expect("README differences section");
    let rest = &readme[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kshard_answers_as_kube_apiserver_does() {
    let scenarios = load_scenarios();
    assert!(!scenarios.is_empty(), "no scenarios in tests/differential");
    let only = std::env::var("KSHARD_DIFF_ONLY").ok();
    let readme = readme_differences();

    let dir = tempfile::tempdir().expect("tmp");
    let host = RealHost::start(dir.path());
    install_crds(&host);
    let server = common::start().await;
    let kube_client = host.client().await;

    let mut failures = Vec::new();
    let mut known = Vec::new();
    let mut matched = 0;
    for (n, (file, s)) in scenarios.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !s.name.contains(o.as_str())) {
            continue;
        }
        let ns = format!("diff-{n}");
        host.kubectl_ok(&["create", "namespace", &ns]);
        let vars: HashMap<String, String> = [("ns".to_string(), ns.clone())].into();
        let mut kube = Side {
            name: "kube-apiserver",
            client: kube_client.clone(),
            vars: vars.clone(),
            norm: Norm::default(),
            watches: HashMap::new(),
        };
        let mut ours = Side {
            name: "kshard",
            client: server.client.clone(),
            vars,
            norm: Norm::default(),
            watches: HashMap::new(),
        };
        let report = run_scenario(&mut kube, &mut ours, s).await;
        let title = format!("scenario \"{}\" ({file})", s.name);
        match (&s.known_difference, report.is_empty()) {
            (None, true) => matched += 1,
            (None, false) => failures.push(format!("{title}:\n{}", report.join("\n"))),
            (Some(why), false) => {
                if !readme.contains(&s.name) {
                    failures.push(format!(
                        "{title} is a known difference not listed in the README's \
                         differences section"
                    ));
                }
                known.push(format!(
                    "{title}: known difference ({why}):\n{}",
                    report.join("\n")
                ));
            }
            (Some(_), true) => failures.push(format!(
                "{title} is marked as a known difference but now matches: remove the mark \
                 (and its README entry)"
            )),
        }
    }
    if only.is_none() {
        failures.extend(kubectl_identity_commands(&host, &server));
        failures.extend(metric_families(&host, &server));
        failures.extend(openapi_parts(&host, &server));
        failures.extend(kubectl_client_side_apply(&host, &server, dir.path()));
        // Last: it adds CRDs to kube-apiserver the scenarios' discovery
        // answers do not list.
        failures.extend(reapplying_real_world_examples(&host, dir.path()).await);
    }
    eprintln!(
        "differential: {matched} scenarios match, {} known differences, {} mismatches",
        known.len(),
        failures.len()
    );
    for k in &known {
        eprintln!("{k}\n");
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn top_level_span_finds_a_key_of_the_outer_object_only() {
    let compact = r#"{"items":[{"metadata":{"resourceVersion":"5"}}],"kind":"L","metadata":{"resourceVersion":"7"}}"#;
    let span = top_level_span(compact, "metadata").expect("metadata");
    assert_eq!(&compact[span], r#"{"resourceVersion":"7"}"#);
    let pretty = "{\n  \"kind\": \"Table\",\n  \"metadata\": {\n    \"resourceVersion\": \"7\"\n  },\n  \"rows\": []\n}";
    let span = top_level_span(pretty, "metadata").expect("metadata");
    assert_eq!(&pretty[span], "{\n    \"resourceVersion\": \"7\"\n  }");
    assert_eq!(
        top_level_span(pretty, "kind").map(|r| &pretty[r]),
        Some("\"Table\"")
    );
    assert!(top_level_span(r#"{"a":{"items":[]}}"#, "items").is_none());
}
