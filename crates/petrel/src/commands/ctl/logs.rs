//! `logs`: prints a container's CRI log file, optionally following it.
//!
//! A CRI log file holds one record per line:
//! `<RFC 3339 nano timestamp> <stdout|stderr> <tags> <content>`, where the
//! tags are `F` (the record ends a line) or `P` (a piece of a longer line;
//! the next record of that stream continues it). Records are printed to our
//! own stdout or stderr, pieces joined, so the reader sees the container's
//! output as it was written.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use petrel_cri::api::ContainerState;

use super::containers::container_status;
use super::error::CtlError;
use super::output::stdout_error;
use super::Ctl;

/// How often `-f` looks for new output.
const POLL: Duration = Duration::from_millis(100);
/// How often `-f` asks whether the container still runs.
const STATUS_EVERY: Duration = Duration::from_millis(500);
/// How much is read at a time.
const CHUNK: usize = 64 * 1024;

/// Flags of `logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Follow the log until the container stops.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Print only the last N lines.
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Prefix each line with its timestamp.
    #[arg(short = 't', long)]
    timestamps: bool,
    /// Container id or unique id prefix.
    id: String,
}

/// Which stream a record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The container's standard output.
    Stdout,
    /// The container's standard error.
    Stderr,
}

/// One parsed log record, borrowing from the line it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The timestamp as written (RFC 3339 with nanoseconds).
    pub timestamp: &'a [u8],
    /// The stream.
    pub stream: Stream,
    /// Whether the line continues in the stream's next record.
    pub partial: bool,
    /// The content, without the newline.
    pub content: &'a [u8],
}

/// Parses one line of a CRI log file (without its newline); None if it is
/// not a record.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let (timestamp, rest) = split_field(line)?;
    let (stream, rest) = split_field(rest)?;
    // The tags may be the last field when the content is empty.
    let (tags, content) = split_field(rest).unwrap_or((rest, &[]));
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    if timestamp.is_empty() || tags.is_empty() {
        return None;
    }
    // Tags are `:`-separated; only P (partial) and F (full) exist today.
    let partial = tags.split(|&b| b == b':').any(|t| t == b"P");
    Some(Record {
        timestamp,
        stream,
        partial,
        content,
    })
}

fn split_field(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let space = s.iter().position(|&b| b == b' ')?;
    Some((&s[..space], &s[space + 1..]))
}

/// The index of the first record to print so that `lines` complete lines
/// remain (an unfinished line at the end counts as one).
pub fn tail_start(records: &[Record<'_>], lines: usize) -> usize {
    let mut seen = 0;
    for i in (0..records.len()).rev() {
        let ends_line = !records[i].partial || i + 1 == records.len();
        if ends_line {
            if seen == lines {
                return i + 1;
            }
            seen += 1;
        }
    }
    0
}

/// Writes records to two outputs, joining partial records and adding
/// timestamps at the start of each line when asked.
pub struct Printer<O: Write, E: Write> {
    out: O,
    err: E,
    timestamps: bool,
    /// Per stream: whether the next record starts a new line.
    at_line_start: [bool; 2],
    /// Lines that were not records.
    malformed: usize,
}

impl<O: Write, E: Write> Printer<O, E> {
    /// A printer writing stdout records to `out` and stderr ones to `err`.
    pub fn new(out: O, err: E, timestamps: bool) -> Self {
        Self {
            out,
            err,
            timestamps,
            at_line_start: [true, true],
            malformed: 0,
        }
    }

    /// Parses and prints one line of the log file.
    pub fn line(&mut self, line: &[u8]) -> io::Result<()> {
        match parse_record(line) {
            Some(r) => self.record(&r),
            None => {
                self.malformed += 1;
                Ok(())
            }
        }
    }

    /// Prints one record.
    pub fn record(&mut self, r: &Record<'_>) -> io::Result<()> {
        let slot = match r.stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        };
        let starts_line = self.at_line_start[slot];
        let w: &mut dyn Write = match r.stream {
            Stream::Stdout => &mut self.out,
            Stream::Stderr => &mut self.err,
        };
        if self.timestamps && starts_line {
            w.write_all(r.timestamp)?;
            w.write_all(b" ")?;
        }
        w.write_all(r.content)?;
        if !r.partial {
            w.write_all(b"\n")?;
        }
        self.at_line_start[slot] = !r.partial;
        Ok(())
    }

    /// Flushes both outputs.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()?;
        self.err.flush()
    }

    /// How many lines were skipped because they were not records.
    pub fn malformed(&self) -> usize {
        self.malformed
    }

    #[cfg(test)]
    fn into_inner(self) -> (O, E) {
        (self.out, self.err)
    }
}

/// Splits `buf` into complete lines (without newlines) and the unfinished
/// rest.
fn complete_lines(buf: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let end = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let lines = buf[..end]
        .split(|&b| b == b'\n')
        .take(buf[..end].iter().filter(|&&b| b == b'\n').count())
        .collect();
    (lines, &buf[end..])
}

/// The identity of a file, to notice rotation.
fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// Reads a log file incrementally and follows it across rotations.
struct LogReader {
    path: PathBuf,
    file: Option<File>,
    id: (u64, u64),
    offset: u64,
    /// Bytes after the last newline read so far.
    pending: Vec<u8>,
}

impl LogReader {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            id: (0, 0),
            offset: 0,
            pending: Vec::new(),
        }
    }

    fn io_error(&self, what: &'static str, source: io::Error) -> CtlError {
        CtlError::Io {
            what,
            path: self.path.clone(),
            source,
        }
    }

    /// Opens the file at the path from its start; false if it does not exist.
    fn open(&mut self) -> Result<bool, CtlError> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.io_error("open log file", e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| self.io_error("stat log file", e))?;
        self.id = file_id(&meta);
        self.file = Some(file);
        self.offset = 0;
        self.pending.clear();
        Ok(true)
    }

    /// Reads one chunk into `pending`; returns how many bytes came.
    fn read_chunk(&mut self) -> Result<usize, CtlError> {
        let Some(file) = self.file.as_mut() else {
            return Ok(0);
        };
        let start = self.pending.len();
        self.pending.resize(start + CHUNK, 0);
        let n = loop {
            match file.read(&mut self.pending[start..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.pending.truncate(start);
                    return Err(self.io_error("read log file", e));
                }
            }
        };
        self.pending.truncate(start + n);
        self.offset += n as u64;
        Ok(n)
    }

    /// Reads to the end of the current file and returns the complete lines'
    /// bytes, keeping an unfinished line for later.
    fn read_to_end(&mut self) -> Result<Vec<u8>, CtlError> {
        while self.read_chunk()? > 0 {}
        let end = self
            .pending
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let rest = self.pending.split_off(end);
        Ok(std::mem::replace(&mut self.pending, rest))
    }

    /// Prints every complete line available now; returns the bytes read.
    fn pump<O: Write, E: Write>(&mut self, printer: &mut Printer<O, E>) -> Result<usize, CtlError> {
        let mut total = 0;
        loop {
            let n = self.read_chunk()?;
            total += n;
            let (lines, rest) = complete_lines(&self.pending);
            for line in lines {
                printer.line(line).map_err(|e| stdout_error(e, "stdout"))?;
            }
            self.pending = rest.to_vec();
            if n == 0 {
                break;
            }
        }
        printer.flush().map_err(|e| stdout_error(e, "stdout"))?;
        Ok(total)
    }

    /// After reaching the end: if the path now names another file (rotated),
    /// drain the old one and switch to the new one; if the file shrank
    /// (truncated in place), read it again from the start. True if switched.
    fn follow_rotation<O: Write, E: Write>(
        &mut self,
        printer: &mut Printer<O, E>,
    ) -> Result<bool, CtlError> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            // Between the rename and the new file's creation.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.io_error("stat log file", e)),
        };
        if self.file.is_none() || file_id(&meta) != self.id {
            // Whatever reached the old file since the last read.
            self.pump(printer)?;
            return self.open();
        }
        if meta.len() < self.offset {
            let rewound = match self.file.as_mut() {
                Some(file) => file.seek(SeekFrom::Start(0)).map(drop),
                None => Ok(()),
            };
            rewound.map_err(|e| self.io_error("rewind log file", e))?;
            self.offset = 0;
            self.pending.clear();
            return Ok(true);
        }
        Ok(false)
    }
}

/// `logs`: prints the container's log, then follows it with `-f`.
pub async fn logs(ctl: &Ctl, args: LogsArgs) -> Result<ExitCode, CtlError> {
    let status = container_status(ctl, &args.id, false)
        .await?
        .status
        .unwrap_or_default();
    if status.log_path.is_empty() {
        return Err(CtlError::Other(format!(
            "container {} has no log file",
            args.id
        )));
    }
    let mut reader = LogReader::new(PathBuf::from(&status.log_path));
    let mut printer = Printer::new(io::stdout(), io::stderr(), args.timestamps);
    let opened = reader.open()?;
    if !opened && !args.follow {
        return Err(CtlError::Io {
            what: "open log file",
            path: reader.path.clone(),
            source: io::ErrorKind::NotFound.into(),
        });
    }
    print_existing(&mut reader, &mut printer, args.tail)?;
    if args.follow {
        follow(ctl, &status.id, &mut reader, &mut printer).await?;
    }
    warn_malformed(&printer, &reader.path);
    Ok(ExitCode::SUCCESS)
}

/// Prints what the file holds now: everything, or the last `tail` lines.
fn print_existing<O: Write, E: Write>(
    reader: &mut LogReader,
    printer: &mut Printer<O, E>,
    tail: Option<usize>,
) -> Result<(), CtlError> {
    let Some(tail) = tail else {
        return reader.pump(printer).map(drop);
    };
    let bytes = reader.read_to_end()?;
    let (lines, _) = complete_lines(&bytes);
    let mut records = Vec::with_capacity(lines.len());
    for line in lines {
        match parse_record(line) {
            Some(r) => records.push(r),
            None => printer.malformed += 1,
        }
    }
    let write = |printer: &mut Printer<O, E>| -> io::Result<()> {
        for r in &records[tail_start(&records, tail)..] {
            printer.record(r)?;
        }
        printer.flush()
    };
    write(printer).map_err(|e| stdout_error(e, "stdout"))
}

/// Follows the file until the container stops running (or is removed)
/// and everything it wrote has been printed.
async fn follow<O: Write, E: Write>(
    ctl: &Ctl,
    id: &str,
    reader: &mut LogReader,
    printer: &mut Printer<O, E>,
) -> Result<(), CtlError> {
    let mut last_check = Instant::now();
    loop {
        if reader.pump(printer)? > 0 {
            continue;
        }
        if reader.follow_rotation(printer)? {
            continue;
        }
        if last_check.elapsed() >= STATUS_EVERY {
            last_check = Instant::now();
            if !still_running(ctl, id).await? {
                // The shim may still be writing the last output.
                tokio::time::sleep(POLL).await;
                reader.pump(printer)?;
                if reader.follow_rotation(printer)? {
                    reader.pump(printer)?;
                }
                return Ok(());
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Whether the container may still write output (created or running).
async fn still_running(ctl: &Ctl, id: &str) -> Result<bool, CtlError> {
    match container_status(ctl, id, false).await {
        Ok(resp) => {
            let state = resp
                .status
                .map_or(ContainerState::ContainerUnknown as i32, |s| s.state);
            Ok(state == ContainerState::ContainerRunning as i32
                || state == ContainerState::ContainerCreated as i32)
        }
        Err(e) if e.code() == Some(tonic::Code::NotFound) => Ok(false),
        Err(e) => Err(e),
    }
}

fn warn_malformed<O: Write, E: Write>(printer: &Printer<O, E>, path: &Path) {
    let n = printer.malformed();
    if n > 0 {
        eprintln!(
            "petrel ctl: skipped {n} line(s) of {} that were not CRI log records",
            path.display()
        );
    }
}

#[cfg(test)]
// A failed expectation is a failed test.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    const TS: &str = "2024-05-01T12:00:00.000000001Z";

    fn print(lines: &[&str], timestamps: bool) -> (String, String) {
        let mut p = Printer::new(Vec::new(), Vec::new(), timestamps);
        for l in lines {
            p.line(l.as_bytes()).expect("write to memory");
        }
        let (o, e) = p.into_inner();
        (
            String::from_utf8_lossy(&o).into_owned(),
            String::from_utf8_lossy(&e).into_owned(),
        )
    }

    #[test]
    fn parse_record_should_read_all_fields() {
        let r = parse_record(b"2024-05-01T12:00:00.1Z stderr F hello world").expect("record");
        assert_eq!(r.timestamp, b"2024-05-01T12:00:00.1Z");
        assert_eq!(r.stream, Stream::Stderr);
        assert!(!r.partial);
        assert_eq!(r.content, b"hello world");
    }

    #[test]
    fn parse_record_should_accept_empty_content_with_or_without_space() {
        for line in [&b"ts stdout F "[..], &b"ts stdout F"[..]] {
            let r = parse_record(line).expect("record");
            assert_eq!(r.content, b"", "{line:?}");
        }
    }

    #[test]
    fn parse_record_should_keep_spaces_inside_content() {
        let r = parse_record(b"ts stdout P  two  spaces ").expect("record");
        assert!(r.partial);
        assert_eq!(r.content, b" two  spaces ");
    }

    #[test]
    fn parse_record_should_reject_non_records() {
        assert_eq!(parse_record(b"plain text"), None);
        assert_eq!(parse_record(b"ts stdin F x"), None);
        assert_eq!(parse_record(b""), None);
    }

    #[test]
    fn printer_should_join_partial_records_with_the_next_ones() {
        let lines = [
            format!("{TS} stdout P hel"),
            format!("{TS} stdout P lo "),
            format!("{TS} stdout F world"),
            format!("{TS} stdout F next"),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(print(&lines, false).0, "hello world\nnext\n");
    }

    #[test]
    fn printer_should_route_streams_and_join_per_stream() {
        let lines = [
            format!("{TS} stdout P out-"),
            format!("{TS} stderr F err"),
            format!("{TS} stdout F line"),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert_eq!(print(&lines, false), ("out-line\n".into(), "err\n".into()));
    }

    #[test]
    fn printer_should_timestamp_only_line_starts() {
        let lines = ["t1 stdout P a", "t2 stdout F b", "t3 stdout F c"];
        assert_eq!(print(&lines, true).0, "t1 ab\nt3 c\n");
    }

    #[test]
    fn printer_should_leave_a_trailing_partial_unterminated() {
        assert_eq!(print(&["t stdout P prompt> "], false).0, "prompt> ");
    }

    #[test]
    fn printer_should_count_malformed_lines() {
        let mut p = Printer::new(Vec::new(), Vec::new(), false);
        p.line(b"garbage").expect("write to memory");
        p.line(b"t stdout F ok").expect("write to memory");
        assert_eq!(p.malformed(), 1);
    }

    fn records(spec: &[(bool, &'static str)]) -> Vec<Record<'static>> {
        spec.iter()
            .map(|&(partial, content)| Record {
                timestamp: b"t",
                stream: Stream::Stdout,
                partial,
                content: content.as_bytes(),
            })
            .collect()
    }

    #[test]
    fn tail_start_should_count_whole_lines() {
        let r = records(&[(false, "a"), (true, "b1"), (false, "b2"), (false, "c")]);
        assert_eq!(tail_start(&r, 1), 3);
        assert_eq!(tail_start(&r, 2), 1);
        assert_eq!(tail_start(&r, 3), 0);
        assert_eq!(tail_start(&r, 10), 0);
        assert_eq!(tail_start(&r, 0), 4);
    }

    #[test]
    fn tail_start_should_count_an_unfinished_last_line() {
        let r = records(&[(false, "a"), (true, "b1")]);
        assert_eq!(tail_start(&r, 1), 1);
    }

    #[test]
    fn complete_lines_should_hold_back_an_unfinished_line() {
        let (lines, rest) = complete_lines(b"a\nb\nc");
        assert_eq!(lines, [&b"a"[..], &b"b"[..]]);
        assert_eq!(rest, b"c");
        let (lines, rest) = complete_lines(b"\n");
        assert_eq!(lines, [&b""[..]]);
        assert_eq!(rest, b"");
    }

    #[test]
    fn log_reader_should_follow_rotation_and_truncation() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("0.log");
        std::fs::write(&path, "t stdout F one\nt stdout F tw").expect("write log");
        let mut reader = LogReader::new(path.clone());
        assert!(reader.open().expect("open"));
        let mut p = Printer::new(Vec::new(), Vec::new(), false);
        reader.pump(&mut p).expect("pump");

        // The rest of the record arrives, then the file is rotated.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(b"o\n").expect("append");
        std::fs::rename(&path, dir.path().join("0.log.1")).expect("rotate");
        std::fs::write(&path, "t stdout F three\n").expect("write new log");
        assert!(reader.follow_rotation(&mut p).expect("rotation"));
        reader.pump(&mut p).expect("pump");

        // Truncated in place (copytruncate).
        std::fs::write(&path, "t stdout F 4\n").expect("truncate");
        assert!(reader.follow_rotation(&mut p).expect("truncation"));
        reader.pump(&mut p).expect("pump");

        let (out, _) = p.into_inner();
        assert_eq!(String::from_utf8_lossy(&out), "one\ntwo\nthree\n4\n");
    }

    #[test]
    fn print_existing_should_print_the_last_lines_only() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("0.log");
        let log = "t stdout F a\nt stderr F b\nt stdout P c1\nt stdout F c2\nunfinished";
        std::fs::write(&path, log).expect("write log");
        let mut reader = LogReader::new(path);
        assert!(reader.open().expect("open"));
        let mut p = Printer::new(Vec::new(), Vec::new(), false);
        print_existing(&mut reader, &mut p, Some(2)).expect("print");
        let (out, err) = p.into_inner();
        assert_eq!(String::from_utf8_lossy(&out), "c1c2\n");
        assert_eq!(String::from_utf8_lossy(&err), "b\n");
        assert_eq!(reader.pending, b"unfinished");
    }
}
