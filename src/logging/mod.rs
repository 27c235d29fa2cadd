//! The process's log: text for a person, or one JSON object a line for a collector
//! (`--log-format json`, `RAILGRID_LOG_FORMAT=json`), on stderr and, for the agent, in its
//! rolling file. `RAILGRID_LOG` takes a filter such as `debug`, `railgrid=trace` (every
//! crate of railgrid: targets are the crates' module paths, and match by prefix) or
//! `info,railgrid_agent::hub=debug` (one room of one crate).
//!
//! Much of what is logged comes from clients and jobs (a host's name, an error an agent
//! reports, a job's argv). One line is one event whatever they hold: in text, every field
//! and the message are written through [`escape`], so that no control character, escape
//! sequence or bidirectional override reaches a terminal or forges a line; JSON escapes
//! the controls itself, and the rest on the way out (docs/security.md, "Logs say what
//! happened, and only that").

mod escape;

use std::io::IsTerminal;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `fields.message` and the
    /// event's other fields, and the spans it is in.
    Json,
}

/// Logs to stderr (unless `stderr` is false) and, when given, to a second writer (the
/// agent's rolling file), as `format` says.
pub(crate) fn init(
    format: LogFormat,
    file: Option<tracing_appender::non_blocking::NonBlocking>,
    stderr: bool,
) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = std::env::var(crate::env_vars::LOG)
        .ok()
        .and_then(|s| s.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    let json = format == LogFormat::Json;
    crate::util::log_format::set_json(json);
    // NO_COLOR (no-color.org): no escape codes, even on a terminal.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let layer = |writer: tracing_subscriber::fmt::writer::BoxMakeWriter, ansi: bool| {
        if json {
            tracing_subscriber::fmt::layer()
                .with_writer(escape::JsonSafe(writer))
                .json()
                .with_current_span(false)
                .boxed()
        } else {
            let base = tracing_subscriber::fmt::layer().with_writer(writer);
            base.with_ansi(ansi)
                .with_target(false)
                .fmt_fields(escape::EscapedFields)
                .boxed()
        }
    };
    let mut layers = Vec::new();
    if stderr {
        layers.push(layer(
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
            colour,
        ));
    }
    if let Some(w) = file {
        layers.push(layer(
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(w),
            false,
        ));
    }
    let _ = tracing_subscriber::registry()
        .with(layers)
        .with(filter)
        .try_init();
}
