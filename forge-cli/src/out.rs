//! Output: aligned tables and key/value blocks for people, JSON for scripts.

use std::io::{ErrorKind, Write};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::fail;

/// Writes to standard output (what [`out!`] and [`outln!`] expand to). When the reader has
/// gone (a closed pipe: `forge events --follow | head`), the command ends at once with exit 0,
/// as Unix tools do; another write error ends it with a message and exit 1. Never a panic.
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| {
            if newline {
                stdout.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(err) if err.kind() == ErrorKind::BrokenPipe => std::process::exit(0),
        Err(err) => {
            eprintln!("forge: cannot write to standard output: {err}");
            std::process::exit(i32::from(fail::PROBLEM));
        }
    }
}

/// A table with a header row, printed with columns aligned by two spaces.
pub(crate) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, each line ending in a newline; the last column is not padded.
    pub(crate) fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let headers: Vec<String> = self.headers.iter().map(|h| (*h).to_owned()).collect();
        for row in std::iter::once(&headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(columns) {
                if i + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    let pad = widths[i] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub(crate) fn print(&self) {
        out!("{}", self.render());
    }
}

/// `key  value` lines with the keys aligned.
pub(crate) fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in fields {
        outln!("{key:width$}  {value}");
    }
}

/// Pretty JSON on stdout, its floats without binary noise ([`tidy`]).
pub(crate) fn print_json(value: &impl Serialize) {
    match json_text(value) {
        Ok(text) => outln!("{text}"),
        Err(err) => eprintln!("forge: cannot render JSON: {err}"),
    }
}

/// What [`print_json`] prints.
fn json_text(value: &impl Serialize) -> serde_json::Result<String> {
    serde_json::to_value(value).and_then(|v| serde_json::to_string_pretty(&tidy(v)))
}

/// One line of JSON on stdout (for `--follow`), flushed at once.
pub(crate) fn print_json_line(value: &impl Serialize) {
    use std::io::Write;
    if let Ok(text) = serde_json::to_value(value).and_then(|v| serde_json::to_string(&tidy(v))) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{text}");
        let _ = stdout.flush();
    }
}

/// A UTC instant to the second.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// An optional instant, `-` for none.
pub(crate) fn opt_time(at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "-".to_owned(), time)
}

/// A duration in seconds, short: `850ms`, `12.3s`, `4m10s`, `2h03m`, `3d04h`.
pub(crate) fn secs(s: f64) -> String {
    let sign = if s < 0.0 { "-" } else { "" };
    let s = s.abs();
    let text = if s < 1.0 {
        format!("{}ms", (s * 1000.0).round() as u64)
    } else if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        let s = s.round() as u64;
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400.0 {
        let m = (s / 60.0).round() as u64;
        format!("{}h{:02}m", m / 60, m % 60)
    } else {
        let h = (s / 3600.0).round() as u64;
        format!("{}d{:02}h", h / 24, h % 24)
    };
    format!("{sign}{text}")
}

/// A duration in milliseconds, short.
pub(crate) fn ms(ms: f64) -> String {
    secs(ms / 1000.0)
}

/// How long ago an instant was, from now.
pub(crate) fn ago(at: DateTime<Utc>) -> String {
    let s = (Utc::now() - at).num_milliseconds() as f64 / 1000.0;
    if s >= 0.0 {
        format!("{} ago", secs(s))
    } else {
        format!("in {}", secs(-s))
    }
}

/// An optional value, `-` for none.
pub(crate) fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// A list, comma-separated, `-` when empty.
pub(crate) fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(",")
    }
}

/// Text cut to `max` characters (with `…`), on one line.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let one_line = text.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut short: String = one_line.chars().take(max.saturating_sub(1)).collect();
        short.push('…');
        short
    }
}

/// `value` with each float rounded to 12 significant digits: figures computed in floating point
/// (`10422.669000000002` ms) print as the decimals they stand for (`10422.669`); no FORGE
/// figure has that many meaningful digits.
pub(crate) fn tidy(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or_default();
            let rounded = format!("{x:.11e}").parse::<f64>().unwrap_or(x);
            serde_json::Number::from_f64(rounded).map_or(Value::Number(n), Value::Number)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(tidy).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (key, tidy(value)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_do_not_pad_the_last() {
        let mut table = Table::new(&["ROLE", "NODE", "EPOCH"]);
        table.row(vec!["scheduler".into(), "a".into(), "7".into()]);
        table.row(vec!["log_compactor".into(), "node-b".into(), "12".into()]);
        assert_eq!(
            table.render(),
            "ROLE           NODE    EPOCH\n\
             scheduler      a       7\n\
             log_compactor  node-b  12\n"
        );
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(secs(0.85), "850ms");
        assert_eq!(secs(12.34), "12.3s");
        assert_eq!(secs(250.0), "4m10s");
        assert_eq!(secs(7380.0), "2h03m");
        assert_eq!(secs(-3.0), "-3.0s");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn json_floats_print_without_binary_noise() {
        let value = serde_json::json!({
            "lease_left_ms": 10422.669000000002,
            "sum": 0.1 + 0.2,
            "small": [1.0e-7 + 2.0e-7, 3.0],
            "exact": 12.5,
            "count": 7,
            "big": 123456789012.0,
        });
        let text = json_text(&value).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .map(|line| line.trim().trim_end_matches(','))
            .collect();
        for expected in [
            "\"lease_left_ms\": 10422.669",
            "\"sum\": 0.3",
            "3e-7",
            "\"exact\": 12.5",
            "\"count\": 7",
            "\"big\": 123456789012.0",
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in {text}");
        }
    }
}
