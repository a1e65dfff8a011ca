//! The CRI container log format, as runtimes write it and kubelet reads it:
//! one record per line, `<RFC3339Nano> <stdout|stderr> <tags> <text>`,
//! where the first tag is `P` (a partial line: the text continues in the
//! next record of the same stream) or `F` (the line ends here).
//!
//! This module is pure logic: parsing records, joining partial lines,
//! timestamps, and the selection kubelet's `containerLogs` parameters make
//! (`sinceTime`/`sinceSeconds`, `tailLines`, `limitBytes`, `timestamps`).

use std::collections::VecDeque;

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogParseError {
    /// The record has fewer than four fields.
    #[error("log record has no {0} field")]
    Missing(&'static str),
    /// The timestamp is not RFC 3339.
    #[error("invalid timestamp {0:?}")]
    Timestamp(String),
    /// The stream is neither stdout nor stderr.
    #[error("invalid stream {0:?}")]
    Stream(String),
}

/// The stream a line was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One whole line of a container's output (partial records joined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the line (its first record) was written, ns since the epoch.
    pub time: i64,
    /// The stream.
    pub stream: LogStream,
    /// The text, without the newline.
    pub text: Vec<u8>,
}

impl LogLine {
    /// The line as `containerLogs` writes it: the text and a newline,
    /// prefixed with the RFC 3339 timestamp and a space when `timestamps`.
    pub fn render(&self, timestamps: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 32);
        if timestamps {
            out.extend_from_slice(format_rfc3339_nano(self.time).as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&self.text);
        out.push(b'\n');
        out
    }
}

/// Joins records into lines. Each stream has its own pending partial line,
/// since a runtime may interleave the two streams' records.
#[derive(Debug, Default)]
pub struct LineJoiner {
    stdout: Option<LogLine>,
    stderr: Option<LogLine>,
}

impl LineJoiner {
    /// A joiner with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one record (a file line without its `\n`); returns the line it
    /// completes, if any.
    pub fn push(&mut self, record: &[u8]) -> Result<Option<LogLine>, LogParseError> {
        let rec = parse_record(record)?;
        let slot = match rec.stream {
            LogStream::Stdout => &mut self.stdout,
            LogStream::Stderr => &mut self.stderr,
        };
        let mut line = match slot.take() {
            Some(mut pending) => {
                pending.text.extend_from_slice(rec.text);
                pending
            }
            None => LogLine {
                time: rec.time,
                stream: rec.stream,
                text: rec.text.to_vec(),
            },
        };
        if rec.partial {
            *slot = Some(line);
            return Ok(None);
        }
        line.text.shrink_to_fit();
        Ok(Some(line))
    }

    /// The partial lines still pending (a container that died mid-line),
    /// oldest first; the joiner is empty afterwards.
    pub fn flush(&mut self) -> Vec<LogLine> {
        let mut out: Vec<LogLine> = [self.stdout.take(), self.stderr.take()]
            .into_iter()
            .flatten()
            .collect();
        out.sort_by_key(|l| l.time);
        out
    }
}

struct Record<'a> {
    time: i64,
    stream: LogStream,
    partial: bool,
    text: &'a [u8],
}

fn parse_record(line: &[u8]) -> Result<Record<'_>, LogParseError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut parts = line.splitn(4, |b| *b == b' ');
    let ts = parts.next().ok_or(LogParseError::Missing("timestamp"))?;
    let stream = parts.next().ok_or(LogParseError::Missing("stream"))?;
    let tags = parts.next().ok_or(LogParseError::Missing("tag"))?;
    // An empty line is written as `<ts> <stream> F ` or without the space.
    let text = parts.next().unwrap_or(b"");
    let ts_text = String::from_utf8_lossy(ts);
    let time = parse_rfc3339(&ts_text).ok_or_else(|| LogParseError::Timestamp(ts_text.into()))?;
    let stream = match stream {
        b"stdout" => LogStream::Stdout,
        b"stderr" => LogStream::Stderr,
        other => {
            return Err(LogParseError::Stream(
                String::from_utf8_lossy(other).into_owned(),
            ))
        }
    };
    // Tags are `:`-separated; the first says partial or full.
    let partial = tags.split(|b| *b == b':').next() == Some(b"P");
    Ok(Record {
        time,
        stream,
        partial,
        text,
    })
}

/// Which lines `containerLogs` returns, and how.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSelection {
    /// Only lines written at or after this time (ns since the epoch).
    pub since: Option<i64>,
    /// Only the last this many lines of the file (then new ones, when
    /// following).
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes of output.
    pub limit_bytes: Option<u64>,
    /// Prefix each line with its timestamp.
    pub timestamps: bool,
}

impl LogSelection {
    /// Whether `line` is new enough.
    pub fn admits(&self, line: &LogLine) -> bool {
        self.since.is_none_or(|s| line.time >= s)
    }
}

/// The lines of a log's existing content that a selection keeps: the ones
/// new enough, of which the last `tail_lines`. Lines are fed in order;
/// at most `tail_lines` are held at once.
#[derive(Debug)]
pub struct TailBuffer {
    lines: VecDeque<LogLine>,
    keep: Option<usize>,
}

impl TailBuffer {
    /// A buffer for `sel`.
    pub fn new(sel: &LogSelection) -> Self {
        Self {
            lines: VecDeque::new(),
            keep: sel
                .tail_lines
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// Adds a line (already admitted by the selection).
    pub fn push(&mut self, line: LogLine) {
        if self.keep == Some(0) {
            return;
        }
        self.lines.push_back(line);
        if let Some(k) = self.keep {
            while self.lines.len() > k {
                self.lines.pop_front();
            }
        }
    }

    /// The lines kept, oldest first.
    pub fn into_lines(self) -> impl Iterator<Item = LogLine> {
        self.lines.into_iter()
    }
}

/// Counts output against `limitBytes`: the output is cut at the limit, as
/// kubelet's does, even in the middle of a line.
#[derive(Debug, Clone)]
pub struct ByteLimit {
    left: Option<u64>,
}

impl ByteLimit {
    /// A limit of `limit` bytes (None: unlimited).
    pub fn new(limit: Option<u64>) -> Self {
        Self { left: limit }
    }

    /// Cuts `chunk` to what may still be written and counts it.
    pub fn take(&mut self, mut chunk: Vec<u8>) -> Vec<u8> {
        if let Some(left) = self.left.as_mut() {
            let n = usize::try_from(*left)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            chunk.truncate(n);
            *left -= n as u64;
        }
        chunk
    }

    /// Nothing more may be written.
    pub fn exhausted(&self) -> bool {
        self.left == Some(0)
    }
}

/// Splits `buf` into complete file lines (without `\n`); the incomplete
/// rest stays in `buf`.
pub fn drain_records(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut start = 0;
    while let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
        out.push(buf[start..start + i].to_vec());
        start += i + 1;
    }
    buf.drain(..start);
    out
}

/// Parses an RFC 3339 time (`2024-05-01T10:00:00.123456789Z` or with a
/// `+hh:mm` offset) to ns since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 9 {
                nanos = nanos * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..9 {
            nanos *= 10;
        }
    }
    let offset_secs = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let h = num(i + 1..i + 3)?;
            let m = num(i + 4..i + 6)?;
            let o = h * 3600 + m * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_secs;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Formats ns since the epoch as Go's RFC3339Nano in UTC (what kubelet
/// prints): trailing zeros of the fraction are dropped, and the fraction
/// entirely when zero.
pub fn format_rfc3339_nano(t: i64) -> String {
    let secs = t.div_euclid(1_000_000_000);
    let nanos = t.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let mut out = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

// Howard Hinnant's days-from-civil algorithms, proleptic Gregorian.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn lines(input: &str) -> Vec<LogLine> {
        let mut j = LineJoiner::new();
        input
            .lines()
            .filter_map(|l| j.push(l.as_bytes()).unwrap())
            .collect()
    }

    #[test]
    fn timestamps_should_round_trip_like_go_rfc3339nano() {
        let t = parse_rfc3339("2016-10-06T00:17:09.669794202Z").unwrap();
        assert_eq!(t, 1_475_713_029_669_794_202);
        assert_eq!(format_rfc3339_nano(t), "2016-10-06T00:17:09.669794202Z");
        let t = parse_rfc3339("2024-02-29T23:59:59.5+01:00").unwrap();
        assert_eq!(format_rfc3339_nano(t), "2024-02-29T22:59:59.5Z");
        assert_eq!(
            format_rfc3339_nano(parse_rfc3339("1970-01-01T00:00:00Z").unwrap()),
            "1970-01-01T00:00:00Z"
        );
        for bad in [
            "2016-10-06 00:17:09Z",
            "2016-13-06T00:17:09Z",
            "2016-10-06T00:17:09",
            "2016-10-06T00:17:09.Z",
            "x016-10-06T00:17:09Z",
            "2016-10-06T00:17:09+0100",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn partial_records_should_be_joined_per_stream() {
        let got = lines(
            "2024-01-01T00:00:01Z stdout P hel\n\
             2024-01-01T00:00:02Z stderr F oops\n\
             2024-01-01T00:00:03Z stdout P lo \n\
             2024-01-01T00:00:04Z stdout F world\n\
             2024-01-01T00:00:05Z stdout F\n",
        );
        let texts: Vec<&[u8]> = got.iter().map(|l| l.text.as_slice()).collect();
        assert_eq!(texts, [&b"oops"[..], b"hello world", b""]);
        assert_eq!(got[1].stream, LogStream::Stdout);
        // The joined line carries its first record's time.
        assert_eq!(got[1].time, parse_rfc3339("2024-01-01T00:00:01Z").unwrap());
        assert_eq!(
            got[1].render(true),
            b"2024-01-01T00:00:01Z hello world\n".to_vec()
        );
        assert_eq!(got[1].render(false), b"hello world\n".to_vec());
    }

    #[test]
    fn text_should_keep_its_spaces_and_tags_may_have_more_fields() {
        let got = lines("2024-01-01T00:00:01.1Z stdout F:x  two  spaces ");
        assert_eq!(got[0].text, b" two  spaces ".to_vec());
    }

    #[test]
    fn bad_records_should_be_errors() {
        let mut j = LineJoiner::new();
        assert_eq!(
            j.push(b"2024-01-01T00:00:01Z"),
            Err(LogParseError::Missing("stream"))
        );
        assert!(matches!(
            j.push(b"yesterday stdout F x"),
            Err(LogParseError::Timestamp(_))
        ));
        assert!(matches!(
            j.push(b"2024-01-01T00:00:01Z stdin F x"),
            Err(LogParseError::Stream(_))
        ));
    }

    #[test]
    fn flush_should_return_pending_partial_lines() {
        let mut j = LineJoiner::new();
        assert_eq!(j.push(b"2024-01-01T00:00:02Z stderr P b").unwrap(), None);
        assert_eq!(j.push(b"2024-01-01T00:00:01Z stdout P a").unwrap(), None);
        let f = j.flush();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].text, b"a".to_vec());
        assert!(j.flush().is_empty());
    }

    #[test]
    fn tail_and_since_should_select_the_last_new_enough_lines() {
        let all = lines(
            "2024-01-01T00:00:01Z stdout F one\n\
             2024-01-01T00:00:02Z stdout F two\n\
             2024-01-01T00:00:03Z stdout F three\n\
             2024-01-01T00:00:04Z stdout F four\n",
        );
        let pick = |sel: LogSelection| -> Vec<String> {
            let mut t = TailBuffer::new(&sel);
            for l in all.iter().filter(|l| sel.admits(l)) {
                t.push(l.clone());
            }
            t.into_lines()
                .map(|l| String::from_utf8(l.text).unwrap())
                .collect()
        };
        assert_eq!(
            pick(LogSelection {
                tail_lines: Some(2),
                ..Default::default()
            }),
            ["three", "four"]
        );
        assert!(pick(LogSelection {
            tail_lines: Some(0),
            ..Default::default()
        })
        .is_empty());
        assert_eq!(
            pick(LogSelection {
                since: parse_rfc3339("2024-01-01T00:00:02Z"),
                tail_lines: Some(10),
                ..Default::default()
            }),
            ["two", "three", "four"]
        );
    }

    #[test]
    fn byte_limit_should_cut_mid_line_and_then_stop() {
        let mut l = ByteLimit::new(Some(5));
        assert_eq!(l.take(b"abc\n".to_vec()), b"abc\n".to_vec());
        assert!(!l.exhausted());
        assert_eq!(l.take(b"def\n".to_vec()), b"d".to_vec());
        assert!(l.exhausted());
        assert!(l.take(b"x".to_vec()).is_empty());
        let mut u = ByteLimit::new(None);
        assert_eq!(u.take(b"abc".to_vec()), b"abc".to_vec());
        assert!(!u.exhausted());
    }

    #[test]
    fn drain_records_should_keep_the_incomplete_rest() {
        let mut buf = b"a\nbc\nde".to_vec();
        assert_eq!(drain_records(&mut buf), vec![b"a".to_vec(), b"bc".to_vec()]);
        assert_eq!(buf, b"de".to_vec());
        buf.extend_from_slice(b"f\n");
        assert_eq!(drain_records(&mut buf), vec![b"def".to_vec()]);
        assert!(buf.is_empty());
    }
}
