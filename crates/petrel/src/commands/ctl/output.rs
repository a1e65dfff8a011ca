//! Presentation: output formats, aligned tables, human sizes and times,
//! short ids, and the JSON touch-ups that make CRI messages readable.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;

use super::error::CtlError;

/// How a command prints what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable columns.
    Table,
    /// Pretty-printed JSON.
    Json,
    /// YAML.
    Yaml,
}

/// How many characters of an id the tables show, as crictl does.
pub const SHORT_ID_LEN: usize = 13;

/// Writes `text` to standard output.
pub fn emit(text: &str) -> Result<(), CtlError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| stdout_error(e, "stdout"))
}

/// Writes raw bytes to standard output or standard error.
pub fn emit_bytes(to_stderr: bool, bytes: &[u8]) -> Result<(), CtlError> {
    let result = if to_stderr {
        let mut err = io::stderr().lock();
        err.write_all(bytes).and_then(|()| err.flush())
    } else {
        let mut out = io::stdout().lock();
        out.write_all(bytes).and_then(|()| out.flush())
    };
    result.map_err(|e| stdout_error(e, if to_stderr { "stderr" } else { "stdout" }))
}

/// A closed pipe ends the command quietly; other write errors are reported.
pub fn stdout_error(e: io::Error, name: &'static str) -> CtlError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        CtlError::OutputClosed
    } else {
        CtlError::Io {
            what: "write",
            path: name.into(),
            source: e,
        }
    }
}

/// Renders `value` as pretty JSON or YAML (with a trailing newline).
pub fn render<T: Serialize>(format: Format, value: &T) -> Result<String, CtlError> {
    match format {
        Format::Yaml => serde_yaml::to_string(value)
            .map_err(|e| CtlError::Other(format!("cannot render yaml: {e}"))),
        Format::Json | Format::Table => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| CtlError::Other(format!("cannot render json: {e}"))),
    }
}

/// Prints `value` as JSON or YAML.
pub fn print_structured<T: Serialize>(format: Format, value: &T) -> Result<(), CtlError> {
    emit(&render(format, value)?)
}

/// What the inspect commands print: the status, then the verbose info.
#[derive(Debug, Serialize)]
pub struct StatusDoc {
    /// The status message, touched up for reading.
    pub status: Value,
    /// The verbose info map, values parsed as JSON where they are JSON.
    pub info: Value,
}

/// Prints several documents: YAML ones separated by `---`, JSON ones one
/// after the other (as crictl does for several ids).
pub fn print_documents<T: Serialize>(format: Format, docs: &[T]) -> Result<(), CtlError> {
    let mut text = String::new();
    for (i, doc) in docs.iter().enumerate() {
        if format == Format::Yaml && i > 0 {
            text.push_str("---\n");
        }
        text.push_str(&render(format, doc)?);
    }
    emit(&text)
}

/// Serializes a CRI message to a JSON value.
pub fn to_value<T: Serialize>(value: &T) -> Result<Value, CtlError> {
    serde_json::to_value(value).map_err(|e| CtlError::Other(format!("cannot render json: {e}")))
}

/// Columns aligned with two spaces between them; the last column is not padded.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a header row.
    pub fn new(header: &[&str]) -> Self {
        Self {
            rows: vec![header.iter().map(|h| (*h).to_string()).collect()],
        }
    }

    /// Appends a row.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// The table as text, one line per row.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count();
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad + 2));
                } else {
                    line.push_str(cell);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Prints the table.
    pub fn print(&self) -> Result<(), CtlError> {
        emit(&self.render())
    }
}

/// An id as tables show it: without `sha256:`, cut to 13 characters.
pub fn short_id(id: &str) -> &str {
    let id = id.strip_prefix("sha256:").unwrap_or(id);
    match id.char_indices().nth(SHORT_ID_LEN) {
        Some((cut, _)) => &id[..cut],
        None => id,
    }
}

/// A byte count in decimal units with four significant digits: `2.1MB`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{}{}", significant(value, 4), UNITS[unit])
}

/// `value` with `digits` significant digits, trailing zeros dropped.
fn significant(value: f64, digits: i32) -> String {
    if value == 0.0 {
        return "0".into();
    }
    let magnitude = value.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A duration in words, coarsely: "Less than a second", "3 minutes", "2 days".
pub fn human_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    let minutes = seconds / 60;
    // Hours are rounded, smaller units truncated.
    let hours = (d.as_secs_f64() / 3600.0 + 0.5) as u64;
    match () {
        _ if seconds < 1 => "Less than a second".into(),
        _ if seconds == 1 => "1 second".into(),
        _ if seconds < 60 => format!("{seconds} seconds"),
        _ if minutes == 1 => "About a minute".into(),
        _ if minutes < 60 => format!("{minutes} minutes"),
        _ if hours == 1 => "About an hour".into(),
        _ if hours < 48 => format!("{hours} hours"),
        _ if hours < 24 * 7 * 2 => format!("{} days", hours / 24),
        _ if hours < 24 * 30 * 2 => format!("{} weeks", hours / 24 / 7),
        _ if hours < 24 * 365 * 2 => format!("{} months", hours / 24 / 30),
        _ => format!("{} years", seconds / 3600 / 24 / 365),
    }
}

/// Now, in nanoseconds since the epoch (as CRI timestamps are).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A CRI timestamp relative to `now`: "3 minutes ago".
pub fn ago(ns: i64, now: i64) -> String {
    if ns <= 0 {
        return "unknown".into();
    }
    let elapsed = u64::try_from(now.saturating_sub(ns)).unwrap_or(0);
    format!("{} ago", human_duration(Duration::from_nanos(elapsed)))
}

/// A CRI timestamp (ns since the epoch) as RFC 3339 in UTC with
/// `frac_digits` (0–9) fractional digits: `2024-05-01T12:00:00.123Z`.
pub fn rfc3339(ns: i64, frac_digits: u32) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let tod = secs.rem_euclid(86_400);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        tod / 3600,
        tod / 60 % 60,
        tod % 60
    );
    let digits = frac_digits.min(9);
    if digits > 0 {
        let frac = nanos / 10_i64.pow(9 - digits);
        s.push_str(&format!(".{frac:0width$}", width = digits as usize));
    }
    s.push('Z');
    s
}

/// The proleptic Gregorian date of a day counted from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so leap days end each 400-year era.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Parses repeated `key=value` label flags.
pub fn parse_labels(raw: &[String]) -> Result<HashMap<String, String>, CtlError> {
    raw.iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CtlError::Usage(format!(
                "invalid label {l:?}: expected key=value"
            ))),
        })
        .collect()
}

/// Replaces the integer at `key` of a JSON object by its enum name.
pub fn name_enum(value: &mut Value, key: &str, name: Option<&str>) {
    if let (Some(obj), Some(name)) = (value.as_object_mut(), name) {
        if obj.contains_key(key) {
            obj.insert(key.to_string(), Value::String(name.to_string()));
        }
    }
}

/// Replaces the ns timestamp at `key` by RFC 3339 text (null when unset).
pub fn name_time(value: &mut Value, key: &str) {
    if let Some(obj) = value.as_object_mut() {
        if let Some(ns) = obj.get(key).and_then(Value::as_i64) {
            let text = if ns > 0 {
                Value::String(rfc3339(ns, 9))
            } else {
                Value::Null
            };
            obj.insert(key.to_string(), text);
        }
    }
}

/// The verbose `info` map of a status answer: each value parsed as JSON
/// when it is JSON, kept as a string otherwise.
pub fn info_value(info: &HashMap<String, String>) -> Value {
    let mut keys: Vec<&String> = info.keys().collect();
    keys.sort();
    let map = keys
        .into_iter()
        .map(|k| {
            let raw = &info[k];
            let v = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()));
            (k.clone(), v)
        })
        .collect();
    Value::Object(map)
}

/// Sorted `key -> value` lines for the table form of inspect commands.
pub fn map_lines(title: &str, map: &HashMap<String, String>) -> String {
    if map.is_empty() {
        return String::new();
    }
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    let mut out = format!("{title}:\n");
    for k in keys {
        out.push_str(&format!("\t{k} -> {}\n", map[k]));
    }
    out
}

/// The default when a value is empty: `<none>` in image tables, etc.
pub fn or_default(value: &str, default: &str) -> String {
    if value.is_empty() {
        default.to_string()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_should_align_columns_with_two_spaces() {
        let mut t = Table::new(&["A", "LONGER", "C"]);
        t.push(vec!["value".into(), "x".into(), "last".into()]);
        assert_eq!(t.render(), "A      LONGER  C\nvalue  x       last\n");
    }

    #[test]
    fn table_should_not_pad_the_last_column_or_leave_trailing_spaces() {
        let mut t = Table::new(&["ID", "NAME"]);
        t.push(vec!["1".into(), String::new()]);
        assert_eq!(t.render(), "ID  NAME\n1\n");
    }

    #[test]
    fn short_id_should_strip_digest_algorithm_and_cut_to_13() {
        assert_eq!(short_id("sha256:0123456789abcdef0123"), "0123456789abc");
        assert_eq!(short_id("0123456789abcdef"), "0123456789abc");
        assert_eq!(short_id("abc"), "abc");
    }

    #[test]
    fn human_size_should_use_decimal_units_and_four_digits() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(2_100_000), "2.1MB");
        assert_eq!(human_size(1_234_567), "1.235MB");
        assert_eq!(human_size(4096), "4.096kB");
        assert_eq!(human_size(12_000_000_000), "12GB");
    }

    #[test]
    fn human_duration_should_speak_like_crictl() {
        let s = Duration::from_secs;
        assert_eq!(
            human_duration(Duration::from_millis(300)),
            "Less than a second"
        );
        assert_eq!(human_duration(s(1)), "1 second");
        assert_eq!(human_duration(s(42)), "42 seconds");
        assert_eq!(human_duration(s(61)), "About a minute");
        assert_eq!(human_duration(s(180)), "3 minutes");
        assert_eq!(human_duration(s(3600)), "About an hour");
        assert_eq!(human_duration(s(5 * 3600)), "5 hours");
        assert_eq!(human_duration(s(3 * 86_400)), "3 days");
        assert_eq!(human_duration(s(21 * 86_400)), "3 weeks");
        assert_eq!(human_duration(s(90 * 86_400)), "3 months");
        assert_eq!(human_duration(s(3 * 365 * 86_400)), "3 years");
    }

    #[test]
    fn ago_should_describe_a_past_timestamp() {
        let now = 1_000_000_000_000;
        assert_eq!(ago(now - 180_000_000_000, now), "3 minutes ago");
        assert_eq!(ago(0, now), "unknown");
    }

    #[test]
    fn rfc3339_should_format_utc_with_chosen_precision() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00Z");
        // 2024-02-29T13:45:30.123456789Z, a leap day.
        let ns = 1_709_214_330_123_456_789;
        assert_eq!(rfc3339(ns, 3), "2024-02-29T13:45:30.123Z");
        assert_eq!(rfc3339(ns, 9), "2024-02-29T13:45:30.123456789Z");
        assert_eq!(rfc3339(951_782_400_000_000_000, 0), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn parse_labels_should_split_on_first_equals_and_reject_bare_keys() {
        let l = parse_labels(&["a=b".into(), "c=d=e".into()]).ok();
        assert_eq!(
            l.as_ref().and_then(|m| m.get("c")).map(String::as_str),
            Some("d=e")
        );
        assert!(parse_labels(&["novalue".into()]).is_err());
        assert!(parse_labels(&["=v".into()]).is_err());
    }

    #[test]
    fn info_value_should_parse_json_values_and_keep_plain_strings() {
        let info = HashMap::from([
            ("info".to_string(), r#"{"pid":42}"#.to_string()),
            ("note".to_string(), "plain text".to_string()),
        ]);
        let v = info_value(&info);
        assert_eq!(v["info"]["pid"], 42);
        assert_eq!(v["note"], "plain text");
    }

    #[test]
    fn name_time_should_render_set_times_and_null_unset_ones() {
        let mut v = serde_json::json!({"created_at": 1_000_000_000, "finished_at": 0});
        name_time(&mut v, "created_at");
        name_time(&mut v, "finished_at");
        assert_eq!(v["created_at"], "1970-01-01T00:00:01.000000000Z");
        assert!(v["finished_at"].is_null());
    }
}
