//! Logs as kube-apiserver writes them: text by default, or with
//! `--logging-format=json` one JSON object per line with kube's keys
//! (k8s.io/component-base's JSON format): `ts` (seconds since the epoch, a
//! float), `caller` (`file:line`), `msg`, `v` (the verbosity: 0 for info and
//! warnings, absent on errors, as zapr omits it), `err` for the error of an
//! error, then the event's own fields by name.

use std::fmt::Write as _;

use serde_json::{Map, Value};
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

/// The fields of an event as JSON values; `message` becomes `msg` and
/// `error` becomes `err` (kube's keys).
#[derive(Default)]
struct Fields(Map<String, Value>);

impl Fields {
    fn put(&mut self, field: &Field, v: Value) {
        let key = match field.name() {
            "message" => "msg",
            "error" => "err",
            other => other,
        };
        self.0.insert(key.to_string(), v);
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
pub fn json_line(event: &Event<'_>, now: std::time::SystemTime) -> Value {
    let meta = event.metadata();
    let mut fields = Fields::default();
    event.record(&mut fields);
    let mut line = Map::new();
    let ts = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    line.insert("ts".into(), Value::from(ts));
    if let (Some(file), Some(l)) = (meta.file(), meta.line()) {
        line.insert("caller".into(), Value::String(format!("{file}:{l}")));
    }
    let msg = fields
        .0
        .remove("msg")
        .unwrap_or(Value::String(String::new()));
    line.insert("msg".into(), msg);
    if let Some(v) = verbosity(meta.level()) {
        line.insert("v".into(), Value::from(v));
    }
    if let Some(err) = fields.0.remove("err") {
        line.insert("err".into(), err);
    }
    line.extend(fields.0);
    Value::Object(line)
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
        assert_eq!(
            (&lines[1]["v"], &lines[1]["n"]),
            (&Value::from(4), &Value::from(3))
        );
    }
}
