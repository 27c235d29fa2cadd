//! Escaping what clients and jobs put in log lines: the text format's fields
//! ([`EscapedFields`]) and, for JSON, the few characters serde_json leaves as they are
//! ([`JsonSafe`]).

use std::borrow::Cow;
use std::io::Write;

use tracing_subscriber::fmt::MakeWriter;

/// The text format's fields, each value escaped ([`escape`]): `message` first, then
/// `name=value`, as tracing-subscriber's own format lays them out.
pub(super) struct EscapedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut v = EscapingVisitor {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

struct EscapingVisitor<'w> {
    writer: tracing_subscriber::fmt::format::Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl tracing::field::Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.write(field, value);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

impl EscapingVisitor<'_> {
    fn write(&mut self, field: &tracing::field::Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let pad = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        let value = escape(value);
        self.result = match field.name() {
            "message" => write!(self.writer, "{pad}{value}"),
            name => write!(
                self.writer,
                "{pad}{}={value}",
                name.strip_prefix("r#").unwrap_or(name)
            ),
        };
    }
}

/// `text` with every control character (C0, DEL, C1) and every bidirectional override
/// written as an escape (`\n`, `\r`, `\t`, `\u{1b}`), so that it stays on one line and
/// moves no cursor. Everything else, other scripts included, is left as it is.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_bad) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_bad(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether `c` must never reach a log as it is: a control character (C0, DEL, C1) or a
/// bidirectional override.
fn is_bad(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A JSON log's writer: serde_json escapes C0 controls, quotes and backslashes, and
/// leaves DEL, C1 controls and bidirectional overrides as they are; these are written as
/// `\uXXXX` here. They can only be inside strings (the rest of a line is ASCII), where
/// that escape means the same character.
pub(super) struct JsonSafe<M>(pub(super) M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for JsonSafe<M> {
    type Writer = JsonSafeWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        JsonSafeWriter(self.0.make_writer())
    }
}

pub(super) struct JsonSafeWriter<W>(W);

impl<W: Write> Write for JsonSafeWriter<W> {
    /// One event's line a call, as the fmt layer writes it: all of it, escaped.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) if text.chars().any(|c| is_bad(c) && c >= '\u{7f}') => {
                let mut out = String::with_capacity(buf.len() + 16);
                for c in text.chars() {
                    if is_bad(c) && c >= '\u{7f}' {
                        out.push_str(&format!("\\u{:04x}", u32::from(c)));
                    } else {
                        out.push(c);
                    }
                }
                self.0.write_all(out.as_bytes())?;
            }
            _ => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_a_client_sends_breaks_a_line_or_moves_a_cursor() {
        assert_eq!(escape("web-1 ünïcode 東京"), "web-1 ünïcode 東京");
        assert_eq!(
            escape("\u{1b}]0;PWNED\u{7}\r\nfake line\0"),
            "\\u{1b}]0;PWNED\\u{7}\\r\\nfake line\\u{0}"
        );
        assert_eq!(
            escape("a\u{9b}b\u{202e}c\u{7f}"),
            "a\\u{9b}b\\u{202e}c\\u{7f}"
        );
    }

    #[test]
    fn a_json_line_keeps_no_c1_control_or_override_and_means_the_same() {
        let value = "x\u{9b}31m\u{202e}y\u{7f}";
        let line = serde_json::json!({ "host": value }).to_string();
        let mut out = JsonSafeWriter(Vec::new());
        out.write_all(line.as_bytes()).expect("write");
        let written = String::from_utf8(out.0).expect("utf-8");
        assert!(!written.chars().any(is_bad), "{written:?}");
        let back: serde_json::Value = serde_json::from_str(&written).expect("still JSON");
        assert_eq!(back["host"], value);
    }
}
