//! The process's logger: where lines go (stderr, as every Kubernetes component), in which
//! format, how much, and whether in colour.
//!
//! JSON lines are written by [`JsonLines`] rather than tracing-subscriber's JSON format:
//! that one writes each field under its own name, so an event with a field called
//! `message` (`warn!(message = %m, "binding failed")`) came out with two `"message"` keys
//! in one object, which a JSON parser resolves by silently dropping one. Here every key is
//! written once: the event's text is `message`, its fields are keys of their own beside it
//! (`pod`, `node`, `claim`, as kube components log them), and a field whose name is taken
//! is written as `fields.<name>`.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fmt;
use std::io::IsTerminal;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// `2026-01-01T00:00:00.000000Z  INFO target: message pod=ns/name node=n1`.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `message`, the fields, `target`.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            _ => Err(format!("log format {s:?}: must be text or json")),
        }
    }
}

/// This workspace's crates: what `--v=4` turns debug messages on for.
const OWN_CRATES: &[&str] = &[
    "dra_scheduler",
    "dra_engine",
    "dra_allocator",
    "dra_cel",
    "dra_quantity",
    "dra_node_agent",
    "dra_telemetry",
];

/// The filter for a kube-style verbosity (`--v`), unless `RUST_LOG` is set (not empty):
/// then `RUST_LOG` is taken as it is, since it says per module what it wants.
///
/// | `--v` | shows |
/// |---|---|
/// | none, 0–3 | info and above: what an operator reads (each scheduling decision, leadership, watch and write failures) |
/// | 4 | also this project's debug messages (retries, writes that failed harmlessly) |
/// | 5 | also the libraries' debug messages (kube client, HTTP) and this project's trace |
/// | 6 and more | everything |
///
/// kube components run at `--v=2` in most clusters and reach for 4 to debug; 0–3 are one
/// level here because tracing has no levels between info and debug.
pub fn directives(verbosity: Option<u8>, rust_log: Option<&str>) -> String {
    if let Some(rust_log) = rust_log.filter(|r| !r.trim().is_empty()) {
        return rust_log.to_string();
    }
    let own = |level: &str| {
        OWN_CRATES
            .iter()
            .map(|c| format!("{c}={level}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    match verbosity.unwrap_or(0) {
        0..=3 => "info".into(),
        4 => format!("info,{}", own("debug")),
        5 => format!("debug,{}", own("trace")),
        _ => "trace".into(),
    }
}

/// Colour codes only for a person at a terminal: stderr is one, and `NO_COLOR` is unset or
/// empty (<https://no-color.org>). Piped to a file, `kubectl logs` or a log shipper, lines
/// are plain text.
pub fn colour(stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Install the process's logger, writing to stderr. `RUST_LOG` (when set) wins over
/// `verbosity`; a `RUST_LOG` that is not a valid filter is reported and info is used.
pub fn init(format: Format, verbosity: Option<u8>) {
    let wanted = directives(verbosity, std::env::var("RUST_LOG").ok().as_deref());
    let (filter, invalid) = match tracing_subscriber::EnvFilter::try_new(&wanted) {
        Ok(filter) => (filter, None),
        Err(e) => (tracing_subscriber::EnvFilter::new("info"), Some(e)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        Format::Text => builder
            .with_ansi(colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ))
            .init(),
        Format::Json => builder.with_ansi(false).event_format(JsonLines).init(),
    }
    if let Some(e) = invalid {
        tracing::warn!(rust_log = %wanted, error = %e, "RUST_LOG is not a valid filter; logging at info");
    }
}

/// Report the error that ends the process, once [`init`] has run: `error: ...` on stderr in
/// text, as before logging started; in JSON one more line, level `ERROR` with the error in
/// `error`, so that every line a log shipper reads is JSON.
pub fn fatal(format: Format, error: &str) {
    match format {
        Format::Text => eprintln!("error: {error}"),
        Format::Json => tracing::error!(error = %error, "exiting on an error"),
    }
}

/// The JSON event format: one object a line, each key once (see the module's overview).
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        writeln!(
            writer,
            "{}",
            json_line(&timestamp, meta.level(), meta.target(), fields.0)
        )
    }
}

/// An event's fields in the order they were recorded.
#[derive(Default)]
struct Fields(Vec<(&'static str, Value)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .push((field.name(), Value::String(format!("{value:?}"))));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name(), Value::String(value.into())));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.push((field.name(), value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name(), value.into()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.push((field.name(), value.into()));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.push((field.name(), value.into()));
    }
}

/// One log line. The event's text is the first field named `message` (tracing's macros
/// record the format string first); records bridged from the `log` crate name their
/// target in `log.target`, and their other `log.*` fields (file, line) are dropped.
fn json_line(
    timestamp: &str,
    level: &Level,
    target: &str,
    fields: Vec<(&'static str, Value)>,
) -> String {
    let mut message = None;
    let mut target = Value::String(target.into());
    let mut rest = Vec::new();
    for (name, value) in fields {
        let name = name.strip_prefix("r#").unwrap_or(name);
        match name {
            "log.target" => target = value,
            _ if name.starts_with("log.") => {}
            "message" if message.is_none() => message = Some(value),
            _ => rest.push((name, value)),
        }
    }
    let mut taken: HashSet<String> = ["timestamp", "level", "message", "target"]
        .map(String::from)
        .into();
    let mut entries: Vec<(String, Value)> = vec![
        ("timestamp".into(), Value::String(timestamp.into())),
        ("level".into(), Value::String(level.as_str().into())),
        (
            "message".into(),
            message.unwrap_or_else(|| Value::String(String::new())),
        ),
    ];
    for (name, value) in rest {
        let mut key = name.to_string();
        let mut n = 1;
        while taken.contains(&key) {
            key = if n == 1 {
                format!("fields.{name}")
            } else {
                format!("fields.{name}.{n}")
            };
            n += 1;
        }
        taken.insert(key.clone());
        entries.push((key, value));
    }
    entries.push(("target".into(), target));
    let mut line = String::from("{");
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        line.push_str(&Value::String(key.clone()).to_string());
        line.push(':');
        line.push_str(&value.to_string());
    }
    line.push('}');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Everything the formatter wrote, through the real subscriber and tracing's macros.
    fn logged(format: Format, emit: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false);
        match format {
            Format::Text => tracing::subscriber::with_default(builder.finish(), emit),
            Format::Json => {
                tracing::subscriber::with_default(builder.event_format(JsonLines).finish(), emit)
            }
        }
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    fn occurrences(line: &str, key: &str) -> usize {
        line.matches(&format!("\"{key}\":")).count()
    }

    #[test]
    fn a_field_called_message_does_not_make_a_second_message_key() {
        let out = logged(Format::Json, || {
            let failure = "conflict on claim default/c";
            tracing::warn!(pod = "default/p", message = %failure, "binding failed; undone");
        });
        let line = out.lines().next().unwrap();
        assert_eq!(occurrences(line, "message"), 1, "{line}");
        let object: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        assert_eq!(object["message"], "binding failed; undone");
        assert_eq!(object["fields.message"], "conflict on claim default/c");
        assert_eq!(object["pod"], "default/p");
        assert_eq!(object["level"], "WARN");
    }

    #[test]
    fn fields_are_keys_of_their_own_with_their_json_types() {
        let out = logged(Format::Json, || {
            tracing::info!(
                pod = %"default/p",
                node = "gpu-node-1",
                claim = ?"default/c",
                devices = 2u64,
                seconds = 0.25,
                preempted = false,
                offset = -1i64,
                "scheduled"
            );
        });
        let object: serde_json::Map<String, Value> = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(object["pod"], "default/p");
        assert_eq!(object["node"], "gpu-node-1");
        // `?` is Debug: the quotes are part of the value, as in text logs.
        assert_eq!(object["claim"], "\"default/c\"");
        assert_eq!(object["devices"], 2);
        assert_eq!(object["seconds"], 0.25);
        assert_eq!(object["preempted"], false);
        assert_eq!(object["offset"], -1);
        assert!(
            object["target"]
                .as_str()
                .unwrap()
                .starts_with("dra_telemetry")
        );
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 11, "{keys:?}");
    }

    #[test]
    fn fields_named_like_the_envelope_keep_their_values_under_other_keys() {
        let line = json_line(
            "t",
            &Level::INFO,
            "x",
            vec![
                ("message", "text".into()),
                ("level", "high".into()),
                ("message", "a".into()),
                ("fields.message", "b".into()),
                ("message", "c".into()),
                ("r#type", "raw".into()),
            ],
        );
        for key in ["message", "level", "fields.message", "timestamp", "target"] {
            assert_eq!(occurrences(&line, key), 1, "{key} in {line}");
        }
        let object: serde_json::Map<String, Value> = serde_json::from_str(&line).unwrap();
        assert_eq!(object["message"], "text");
        assert_eq!(object["level"], "INFO");
        assert_eq!(object["fields.level"], "high");
        assert_eq!(object["fields.message"], "a");
        assert_eq!(object["fields.fields.message"], "b");
        assert_eq!(object["fields.message.2"], "c");
        assert_eq!(object["type"], "raw");
        assert_eq!(object.len(), 9);
    }

    #[test]
    fn records_from_the_log_crate_keep_their_target() {
        let line = json_line(
            "t",
            &Level::DEBUG,
            "log",
            vec![
                ("message", "handshake".into()),
                ("log.target", "rustls::client".into()),
                ("log.module_path", "rustls::client".into()),
                ("log.line", 7u64.into()),
            ],
        );
        assert_eq!(
            line,
            r#"{"timestamp":"t","level":"DEBUG","message":"handshake","target":"rustls::client"}"#
        );
    }

    #[test]
    fn text_lines_without_a_terminal_have_no_colour_codes() {
        assert!(!colour(false, None));
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        let out = logged(Format::Text, || {
            tracing::info!(pod = "default/p", "scheduled")
        });
        assert!(
            out.contains("INFO") && out.contains("scheduled pod=\"default/p\""),
            "{out}"
        );
        assert!(!out.contains('\x1b'), "{out:?}");
    }

    #[test]
    fn verbosity_follows_kube_and_rust_log_wins() {
        assert_eq!(directives(None, None), "info");
        assert_eq!(directives(Some(2), None), "info");
        assert_eq!(directives(Some(2), Some("  ")), "info");
        let v4 = directives(Some(4), None);
        assert!(v4.starts_with("info,dra_scheduler=debug,"), "{v4}");
        assert!(v4.contains("dra_node_agent=debug"), "{v4}");
        assert!(directives(Some(5), None).starts_with("debug,dra_scheduler=trace"));
        assert_eq!(directives(Some(9), None), "trace");
        assert_eq!(directives(Some(9), Some("warn")), "warn");
        for v in 0..=9 {
            let d = directives(Some(v), None);
            assert!(tracing_subscriber::EnvFilter::try_new(&d).is_ok(), "{d}");
        }
    }

    #[test]
    fn formats_parse_by_their_config_names() {
        assert_eq!("text".parse::<Format>(), Ok(Format::Text));
        assert_eq!("json".parse::<Format>(), Ok(Format::Json));
        assert!(
            "xml"
                .parse::<Format>()
                .unwrap_err()
                .contains("text or json")
        );
    }
}
