//! The CRI log: container output split into lines and written as records
//! `<RFC3339Nano> <stream> <P|F> <content>\n`.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use petrel_shim::MAX_LOG_LINE;

use crate::time::{self, TIMESTAMP_LEN};

/// Which of the container's output streams a record comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output (and everything from a pseudo-terminal).
    Stdout,
    /// Standard error.
    Stderr,
}

impl Stream {
    fn name(self) -> &'static [u8] {
        match self {
            Self::Stdout => b"stdout",
            Self::Stderr => b"stderr",
        }
    }
}

/// Whether a record ends its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// Part of a longer line, or the unterminated end of the output.
    Partial,
    /// The last (or only) record of a line.
    Full,
}

impl Tag {
    fn letter(self) -> u8 {
        match self {
            Self::Partial => b'P',
            Self::Full => b'F',
        }
    }
}

/// Receives log records.
pub trait RecordSink {
    /// Takes one record; `content` holds no newline.
    fn record(&mut self, stream: Stream, tag: Tag, content: &[u8]);
}

/// Cuts one output stream into records: a line is held until its newline
/// arrives, a line longer than [`MAX_LOG_LINE`] becomes partial records
/// followed by a full one, and a `\r` before the newline is dropped (terminal
/// output ends lines with `\r\n`).
#[derive(Debug)]
pub struct LineSplitter {
    stream: Stream,
    /// The unterminated start of the current line; at most
    /// `MAX_LOG_LINE + 1` bytes between calls.
    pending: Vec<u8>,
}

impl LineSplitter {
    /// A splitter for `stream`.
    pub fn new(stream: Stream) -> Self {
        Self {
            stream,
            pending: Vec::new(),
        }
    }

    /// The stream this splitter cuts.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Takes the next chunk of output.
    pub fn feed(&mut self, mut data: &[u8], sink: &mut impl RecordSink) {
        while let Some(newline) = data.iter().position(|&b| b == b'\n') {
            if self.pending.is_empty() {
                self.emit_line(&data[..newline], sink);
            } else {
                let mut line = std::mem::take(&mut self.pending);
                line.extend_from_slice(&data[..newline]);
                self.emit_line(&line, sink);
                line.clear();
                // Keep the allocation for the next line.
                self.pending = line;
            }
            data = &data[newline + 1..];
        }
        if data.is_empty() {
            return;
        }
        self.pending.extend_from_slice(data);
        // Write out whole chunks of an overlong line now, but keep a chunk
        // followed only by `\r`: the line may end right there.
        let mut start = 0;
        loop {
            let left = self.pending.len() - start;
            let only_cr_after = left == MAX_LOG_LINE + 1 && self.pending.last() == Some(&b'\r');
            if left <= MAX_LOG_LINE || only_cr_after {
                break;
            }
            sink.record(
                self.stream,
                Tag::Partial,
                &self.pending[start..start + MAX_LOG_LINE],
            );
            start += MAX_LOG_LINE;
        }
        self.pending.drain(..start);
    }

    /// Writes out what is left of an unterminated line, as partial records
    /// (at the end of the output).
    pub fn finish(&mut self, sink: &mut impl RecordSink) {
        for chunk in self.pending.chunks(MAX_LOG_LINE) {
            sink.record(self.stream, Tag::Partial, chunk);
        }
        self.pending = Vec::new();
    }

    fn emit_line(&self, line: &[u8], sink: &mut impl RecordSink) {
        let mut line = line.strip_suffix(b"\r").unwrap_or(line);
        while line.len() > MAX_LOG_LINE {
            let (chunk, rest) = line.split_at(MAX_LOG_LINE);
            sink.record(self.stream, Tag::Partial, chunk);
            line = rest;
        }
        sink.record(self.stream, Tag::Full, line);
    }
}

/// Longest record header: timestamp, stream, tag and three spaces.
const HEADER_MAX: usize = TIMESTAMP_LEN + 1 + 6 + 1 + 1 + 1;
/// Records are gathered up to this size and written with one system call.
const OUT_BUF: usize = 8 * 1024;

/// Writes the record header for `stream` and `tag` with timestamp `ts` into
/// `out`; returns its length.
pub fn format_header(
    ts: &[u8; TIMESTAMP_LEN],
    stream: Stream,
    tag: Tag,
    out: &mut [u8; HEADER_MAX],
) -> usize {
    let name = stream.name();
    let mut n = 0;
    for part in [&ts[..], b" ", name, b" ", &[tag.letter()], b" "] {
        out[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    n
}

/// The CRI log file: records are gathered in a small buffer and appended to
/// the file at each [`LogFile::flush`].
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    /// The timestamp of records taken since the last [`LogFile::stamp`].
    ts: [u8; TIMESTAMP_LEN],
    /// Set after a failed write, so that a full disk is reported once.
    failing: bool,
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

impl LogFile {
    /// Opens (creating if needed) the log file for appending.
    pub fn open(path: PathBuf) -> io::Result<Self> {
        let file = open_log(&path)?;
        let mut log = Self {
            path,
            file,
            buf: Vec::new(),
            ts: [0; TIMESTAMP_LEN],
            failing: false,
        };
        log.stamp();
        Ok(log)
    }

    /// The log file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the log path anew (after the kubelet rotated the file). On
    /// failure the old file stays in use, so that no output is lost.
    pub fn reopen(&mut self) -> io::Result<()> {
        self.flush();
        self.file = open_log(&self.path)?;
        self.failing = false;
        Ok(())
    }

    /// Takes the current time for the records that follow: all the records
    /// cut from one read of output share a timestamp.
    pub fn stamp(&mut self) {
        time::format_rfc3339_nano(time::realtime_ns(), &mut self.ts);
    }

    /// Writes the gathered records to the file.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let result = self.file.write_all(&self.buf);
        self.buf.clear();
        self.note(result);
    }

    fn note(&mut self, result: io::Result<()>) {
        match result {
            Ok(()) => self.failing = false,
            Err(e) => {
                if !self.failing {
                    diag!("write log {}: {e}", self.path.display());
                }
                self.failing = true;
            }
        }
    }
}

/// Writes all of `parts` as one vectored write where the kernel allows.
fn write_all_vectored(file: &mut File, parts: &mut [&[u8]]) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let slices: [IoSlice<'_>; 3] = std::array::from_fn(|i| {
            IoSlice::new(parts.get(first + i).copied().unwrap_or_default())
        });
        let mut written = match file.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < parts.len() && written >= parts[first].len() {
            written -= parts[first].len();
            first += 1;
        }
        if first < parts.len() {
            parts[first] = &parts[first][written..];
        }
    }
    Ok(())
}

impl RecordSink for LogFile {
    fn record(&mut self, stream: Stream, tag: Tag, content: &[u8]) {
        let mut header = [0u8; HEADER_MAX];
        let header_len = format_header(&self.ts, stream, tag, &mut header);
        let header = &header[..header_len];
        let len = header.len() + content.len() + 1;
        if self.buf.len() + len > OUT_BUF {
            self.flush();
        }
        if len <= OUT_BUF {
            if self.buf.capacity() == 0 {
                self.buf.reserve_exact(OUT_BUF);
            }
            self.buf.extend_from_slice(header);
            self.buf.extend_from_slice(content);
            self.buf.push(b'\n');
        } else {
            // A long record goes out directly, without a copy.
            let result = write_all_vectored(&mut self.file, &mut [header, content, b"\n"]);
            self.note(result);
        }
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<(Stream, Tag, Vec<u8>)>);

    impl RecordSink for Collect {
        fn record(&mut self, stream: Stream, tag: Tag, content: &[u8]) {
            self.0.push((stream, tag, content.to_vec()));
        }
    }

    fn split(chunks: &[&[u8]]) -> Vec<(Tag, Vec<u8>)> {
        let mut sink = Collect::default();
        let mut splitter = LineSplitter::new(Stream::Stderr);
        for chunk in chunks {
            splitter.feed(chunk, &mut sink);
        }
        splitter.finish(&mut sink);
        sink.0
            .into_iter()
            .map(|(stream, tag, content)| {
                assert_eq!(stream, Stream::Stderr);
                (tag, content)
            })
            .collect()
    }

    fn full(s: &[u8]) -> (Tag, Vec<u8>) {
        (Tag::Full, s.to_vec())
    }

    fn partial(s: &[u8]) -> (Tag, Vec<u8>) {
        (Tag::Partial, s.to_vec())
    }

    #[test]
    fn splitter_should_write_full_lines() {
        assert_eq!(
            split(&[b"one\ntwo\n\nthree\n"]),
            vec![full(b"one"), full(b"two"), full(b""), full(b"three")]
        );
    }

    #[test]
    fn splitter_should_join_lines_across_chunks() {
        assert_eq!(
            split(&[b"he", b"llo\nwor", b"", b"ld", b"\n"]),
            vec![full(b"hello"), full(b"world")]
        );
    }

    #[test]
    fn splitter_should_end_with_a_partial_record() {
        assert_eq!(
            split(&[b"done\nno newline"]),
            vec![full(b"done"), partial(b"no newline")]
        );
        assert_eq!(split(&[]), vec![]);
    }

    #[test]
    fn splitter_should_drop_carriage_return_before_newline() {
        assert_eq!(
            split(&[b"tty line\r\n", b"a\rb\r", b"\n"]),
            vec![full(b"tty line"), full(b"a\rb")]
        );
    }

    #[test]
    fn splitter_should_split_long_lines_the_same_way_whatever_the_chunks() {
        let line: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut input = line.clone();
        input.push(b'\n');
        let expected = vec![
            partial(&line[..MAX_LOG_LINE]),
            partial(&line[MAX_LOG_LINE..2 * MAX_LOG_LINE]),
            full(&line[2 * MAX_LOG_LINE..]),
        ];
        assert_eq!(split(&[&input]), expected);
        for size in [1000, 4096, MAX_LOG_LINE, MAX_LOG_LINE + 1, 30_000] {
            let chunks: Vec<&[u8]> = input.chunks(size).collect();
            assert_eq!(split(&chunks), expected, "chunks of {size}");
        }
    }

    #[test]
    fn splitter_should_keep_a_line_of_exactly_the_limit_whole() {
        let line = vec![b'x'; MAX_LOG_LINE];
        let mut input = line.clone();
        input.extend_from_slice(b"\r\n");
        for size in [100, MAX_LOG_LINE, MAX_LOG_LINE + 1, MAX_LOG_LINE + 2] {
            let chunks: Vec<&[u8]> = input.chunks(size).collect();
            assert_eq!(split(&chunks), vec![full(&line)], "chunks of {size}");
        }
    }

    #[test]
    fn splitter_should_split_an_unterminated_long_tail() {
        let tail = vec![b'y'; MAX_LOG_LINE + 10];
        assert_eq!(
            split(&[&tail]),
            vec![
                partial(&tail[..MAX_LOG_LINE]),
                partial(&tail[MAX_LOG_LINE..])
            ]
        );
    }

    #[test]
    fn header_should_follow_the_cri_format() {
        let ts = *b"2026-11-22T01:02:03.123456789Z";
        let mut out = [0u8; HEADER_MAX];
        let n = format_header(&ts, Stream::Stdout, Tag::Full, &mut out);
        assert_eq!(&out[..n], b"2026-11-22T01:02:03.123456789Z stdout F ");
        let n = format_header(&ts, Stream::Stderr, Tag::Partial, &mut out);
        assert_eq!(&out[..n], b"2026-11-22T01:02:03.123456789Z stderr P ");
    }

    #[test]
    fn log_file_should_append_records_and_reopen() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("0.log");
        std::fs::write(&path, "old\n")?;
        let mut log = LogFile::open(path.clone())?;
        log.record(Stream::Stdout, Tag::Full, b"hello");
        let big = vec![b'z'; OUT_BUF * 2];
        log.record(Stream::Stderr, Tag::Partial, &big);
        log.flush();
        std::fs::rename(&path, dir.path().join("0.log.1"))?;
        log.record(Stream::Stdout, Tag::Full, b"rotated");
        log.reopen()?;
        log.record(Stream::Stdout, Tag::Full, b"new");
        drop(log);

        let old = std::fs::read_to_string(dir.path().join("0.log.1"))?;
        let lines: Vec<&str> = old.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "old");
        assert!(lines[1].ends_with(" stdout F hello"), "{}", lines[1]);
        assert_eq!(lines[1].len(), TIMESTAMP_LEN + " stdout F hello".len());
        assert!(lines[2].ends_with(&format!(" stderr P {}", "z".repeat(OUT_BUF * 2))));
        assert!(lines[3].ends_with(" stdout F rotated"), "{}", lines[3]);
        let new = std::fs::read_to_string(&path)?;
        assert_eq!(new.lines().count(), 1);
        assert!(new.ends_with(" stdout F new\n"), "{new}");
        Ok(())
    }

    #[test]
    fn log_file_should_be_created_with_mode_0640() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.log");
        let _log = LogFile::open(path.clone())?;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        // The umask may only take bits away.
        assert_eq!(mode & !0o640, 0, "mode {mode:o}");
        assert!(LogFile::open(dir.path().join("missing/c.log")).is_err());
        Ok(())
    }
}
