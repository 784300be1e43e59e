//! Logs as kube-apiserver writes them: text by default, or with
//! `--logging-format=json` one JSON object per line with kube's keys
//! (k8s.io/component-base's JSON format, zap's encoder behind zapr), in its
//! order: `ts` (milliseconds since the epoch, a float: component-base's
//! `epochMillisTimeEncoder`), `logger` (the event's target, where zap puts a
//! named logger's name), `caller` (zap's short caller: `dir/file:line`),
//! `msg`, `v` (the verbosity: 0 for info and warnings, absent on errors, as
//! zapr omits it), the event's own fields by name, and on an error its
//! `error` field as `err`, last (zapr's `ErrorKey`). A field named `error`
//! on another level is `err` in its place, as kube's `"err", err` pairs are.

use std::fmt::Write as _;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--logging-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the process's log subscriber (stderr; `RUST_LOG` filters,
/// `info` by default).
pub fn init(format: LogFormat) {
    init_with(format, "info");
}

/// [`init`] with another level when `RUST_LOG` is unset (`warn` for the
/// commands whose output is their own lines, not a log).
pub fn init_with(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.event_format(KubeJson).init(),
    }
}

/// kube's JSON line for one event.
pub struct KubeJson;

/// The fields of an event as JSON values, in the order they were recorded;
/// `message` becomes `msg` and `error` becomes `err` (kube's keys).
#[derive(Default)]
struct Fields(Vec<(&'static str, Value)>);

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        let key = match field.name() {
            "message" => "msg",
            "error" => "err",
            other => other,
        };
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = v,
            None => self.0.push((key, v)),
        }
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        let i = self.0.iter().position(|(k, _)| *k == key)?;
        Some(self.0.remove(i).1)
    }
}

/// One log line: its keys in kube's order (a JSON map's order is not kept
/// by `serde_json::Map`).
pub struct JsonLine(Vec<(std::borrow::Cow<'static, str>, Value)>);

impl JsonLine {
    fn push(&mut self, key: impl Into<std::borrow::Cow<'static, str>>, value: Value) {
        self.0.push((key.into(), value));
    }
}

impl Serialize for JsonLine {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k.as_ref(), v)?;
        }
        map.end()
    }
}

impl std::fmt::Display for JsonLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&text)
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.put(field, Value::String(s));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
}

/// klog's verbosity for a tracing level: info and warnings are 0, debug 4
/// and trace 5 (kube's "debug" and "trace" conventions); errors have none.
fn verbosity(level: &Level) -> Option<u8> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(5),
    }
}

/// One event as kube's JSON object (without the newline).
pub fn json_line(event: &Event<'_>, now: std::time::SystemTime) -> JsonLine {
    let meta = event.metadata();
    let mut fields = Fields::default();
    event.record(&mut fields);
    let mut line = JsonLine(Vec::with_capacity(6 + fields.0.len()));
    let ts = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as f64 / 1e6)
        .unwrap_or_default();
    line.push("ts", Value::from(ts));
    line.push("logger", Value::String(meta.target().to_string()));
    if let (Some(file), Some(l)) = (meta.file(), meta.line()) {
        line.push(
            "caller",
            Value::String(format!("{}:{l}", short_caller(file))),
        );
    }
    let msg = fields.take("msg").unwrap_or(Value::String(String::new()));
    line.push("msg", msg);
    let err = match verbosity(meta.level()) {
        Some(v) => {
            line.push("v", Value::from(v));
            None
        }
        None => fields.take("err"),
    };
    line.0
        .extend(fields.0.into_iter().map(|(k, v)| (k.into(), v)));
    if let Some(err) = err {
        line.push("err", err);
    }
    line
}

/// zap's `ShortCallerEncoder`: the file's directory and name, no more
/// (`server/mod.rs`, `src/lib.rs` of a dependency).
fn short_caller(file: &str) -> &str {
    match file.rmatch_indices(['/', '\\']).nth(1) {
        Some((i, _)) => &file[i + 1..],
        None => file,
    }
}

impl<S, N> FormatEvent<S, N> for KubeJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        writeln!(writer, "{}", json_line(event, std::time::SystemTime::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn errors_carry_err_and_no_verbosity_and_fields_follow() {
        let buf = Buffer::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_max_level(tracing::Level::TRACE)
            .event_format(KubeJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(error = "disk full", kind = "wal", "writing the log");
            tracing::debug!(n = 3, "details");
        });
        let text = String::from_utf8(buf.0.lock().expect("buf").clone()).expect("utf8");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["msg"], "writing the log");
        assert_eq!(lines[0]["err"], "disk full");
        assert_eq!(lines[0]["kind"], "wal");
        assert!(lines[0].get("v").is_none(), "{}", lines[0]);
        // kube's order: zapr writes the error after the key/value pairs.
        let first = text.lines().next().expect("a line");
        let at: Vec<usize> = ["ts", "logger", "caller", "msg", "kind", "err"]
            .iter()
            .map(|k| first.find(&format!("\"{k}\":")).expect("key"))
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{first}");
        assert_eq!(lines[0]["logger"], module_path!());
        assert!(
            lines[0]["caller"]
                .as_str()
                .is_some_and(|c| c.starts_with("src/logging.rs:")),
            "{}",
            lines[0]
        );
        assert_eq!(
            (&lines[1]["v"], &lines[1]["n"]),
            (&Value::from(4), &Value::from(3))
        );
    }

    #[test]
    fn ts_is_milliseconds_since_the_epoch_as_kube_writes_it() {
        // component-base's own test: 123 ns after the epoch is "ts":0.000123.
        let buf = Buffer::default();
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .event_format(Fixed)
            .finish();
        tracing::subscriber::with_default(subscriber, || tracing::info!("at the epoch"));
        let text = String::from_utf8(buf.0.lock().expect("buf").clone()).expect("utf8");
        let line: Value = serde_json::from_str(text.trim()).expect("json");
        assert_eq!(line["ts"], Value::from(0.000123));
        assert_eq!(line["v"], Value::from(0));
    }

    /// The JSON line at a fixed time.
    struct Fixed;

    impl<S, N> FormatEvent<S, N> for Fixed
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            _ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(123);
            writeln!(writer, "{}", json_line(event, at))
        }
    }

    #[test]
    fn callers_are_zaps_short_form() {
        assert_eq!(short_caller("src/server/mod.rs"), "server/mod.rs");
        assert_eq!(short_caller("src/lib.rs"), "src/lib.rs");
        assert_eq!(
            short_caller("/root/.cargo/registry/src/x/h2-0.4.20/src/proto/mod.rs"),
            "proto/mod.rs"
        );
        assert_eq!(short_caller("main.rs"), "main.rs");
    }
}
