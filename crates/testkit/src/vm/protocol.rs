//! What the host and the guest agent say over the virtio-serial port: one
//! JSON object per line (JSON escapes every newline inside a string, so a
//! line is exactly one message). The host sends a [`Request`], the agent
//! runs it and answers one [`Response`] with the same id; one command at a
//! time.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The longest line either side accepts: a command's output is capped well
/// below it ([`OUTPUT_CAP`]), so a longer line is garbage on the port.
pub const MAX_FRAME: usize = 64 << 20;

/// How much of each of a command's stdout and stderr the agent sends back;
/// the rest is cut, and the cut said at the end.
pub const OUTPUT_CAP: usize = 16 << 20;

/// A command for the guest to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Echoed in the response: an answer left from an abandoned command
    /// (the host gave up waiting) is told apart by it.
    pub id: u64,
    /// The program and its arguments; empty: a ping, answered at once
    /// without running anything (the host's sign that the guest is up).
    pub argv: Vec<String>,
    /// Variables set on top of the agent's own environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The working directory (the agent's, `/`, when absent).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Seconds after which the agent kills the command's process group.
    pub timeout_s: f64,
}

/// How a command ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's id (0 for a line that was no request).
    pub id: u64,
    /// The exit code, when it exited.
    pub status: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its stdout (lossy UTF-8, at most [`OUTPUT_CAP`] bytes).
    pub stdout: String,
    /// Its stderr (likewise).
    pub stderr: String,
    /// Whether the agent killed it at the request's timeout.
    pub timed_out: bool,
    /// Why it could not run (no such program, a bad request).
    pub error: Option<String>,
    /// Seconds from its start to its end, measured in the guest.
    pub elapsed_s: f64,
}

/// `msg` as one line: JSON and a newline.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(msg).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

/// Writes `msg` as one line and flushes it.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(msg)?)?;
    w.flush()
}

/// One line (without its newline) as a message.
pub fn decode<T: DeserializeOwned>(line: &[u8]) -> io::Result<T> {
    serde_json::from_slice(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Splits a byte stream into lines, keeping a partial line across reads
/// that fail with a timeout (`WouldBlock`/`TimedOut` on a socket with a
/// read timeout) so the caller can look at the clock and read on.
#[derive(Debug, Default)]
pub struct LineReader {
    partial: Vec<u8>,
}

/// What one [`LineReader::next_line`] got.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// A whole line, newline removed.
    Line(Vec<u8>),
    /// The read timed out; a partial line is kept for the next call.
    Timeout,
    /// End of stream; a partial line before it is dropped (half a message
    /// is no message).
    Eof,
}

impl LineReader {
    /// A reader with nothing pending.
    pub fn new() -> LineReader {
        LineReader::default()
    }

    /// Reads the next line from `r`. A line longer than [`MAX_FRAME`] is an
    /// `InvalidData` error (and dropped).
    pub fn next_line(&mut self, r: &mut impl BufRead) -> io::Result<Read> {
        loop {
            let (done, used) = match r.fill_buf() {
                Ok([]) => {
                    self.partial.clear();
                    return Ok(Read::Eof);
                }
                Ok(buf) => match buf.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        self.partial.extend_from_slice(&buf[..i]);
                        (true, i + 1)
                    }
                    None => {
                        self.partial.extend_from_slice(buf);
                        (false, buf.len())
                    }
                },
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(Read::Timeout)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            r.consume(used);
            if self.partial.len() > MAX_FRAME {
                self.partial.clear();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a line longer than {MAX_FRAME} bytes"),
                ));
            }
            if done {
                return Ok(Read::Line(std::mem::take(&mut self.partial)));
            }
        }
    }
}

/// `bytes` as text for a [`Response`], cut at [`OUTPUT_CAP`] with a note.
pub fn output_text(bytes: &[u8]) -> String {
    if bytes.len() <= OUTPUT_CAP {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut s = String::from_utf8_lossy(&bytes[..OUTPUT_CAP]).into_owned();
    s.push_str(&format!(
        "\n[petrel-vm-agent: {} more bytes cut]\n",
        bytes.len() - OUTPUT_CAP
    ));
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::io::BufReader;

    fn request() -> Request {
        Request {
            id: 7,
            argv: vec!["sh".into(), "-c".into(), "echo 'a\nb'".into()],
            env: BTreeMap::from([("PATH".into(), "/bin".into())]),
            cwd: Some("/tmp".into()),
            timeout_s: 2.5,
        }
    }

    #[test]
    fn encode_should_make_one_line_that_decodes_to_the_same_message() {
        let resp = Response {
            id: 7,
            status: Some(1),
            stdout: "line 1\nline 2\n\u{0}\"quoted\"".into(),
            stderr: "é\r\n".into(),
            ..Response::default()
        };
        let line = encode(&resp).unwrap();
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
        let back: Response = decode(&line[..line.len() - 1]).unwrap();
        assert_eq!(back, resp);

        let line = encode(&request()).unwrap();
        let back: Request = decode(&line[..line.len() - 1]).unwrap();
        assert_eq!(back, request());
    }

    #[test]
    fn decode_should_default_env_and_cwd_and_refuse_garbage() {
        let r: Request = decode(br#"{"id":1,"argv":[],"timeout_s":1}"#).unwrap();
        assert!(r.env.is_empty() && r.cwd.is_none() && r.argv.is_empty());
        let e = decode::<Request>(b"{\"id\":").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(
            decode::<Request>(br#"{"argv":["x"]}"#).is_err(),
            "id missing"
        );
    }

    /// A reader handing out prepared chunks, a timeout between some.
    struct Chunks(VecDeque<Option<Vec<u8>>>);

    impl io::Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.pop_front() {
                None => Ok(0),
                Some(None) => Err(io::ErrorKind::WouldBlock.into()),
                Some(Some(c)) => {
                    buf[..c.len()].copy_from_slice(&c);
                    Ok(c.len())
                }
            }
        }
    }

    fn chunks(parts: &[Option<&[u8]>]) -> BufReader<Chunks> {
        BufReader::new(Chunks(
            parts.iter().map(|p| p.map(|c| c.to_vec())).collect(),
        ))
    }

    #[test]
    fn line_reader_should_keep_a_partial_line_across_timeouts() {
        let mut r = chunks(&[
            Some(b"{\"a\":"),
            None,
            Some(b"1}\n{\"b\""),
            Some(b":2}\n"),
            None,
        ]);
        let mut lr = LineReader::new();
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Timeout);
        assert_eq!(
            lr.next_line(&mut r).unwrap(),
            Read::Line(b"{\"a\":1}".to_vec())
        );
        assert_eq!(
            lr.next_line(&mut r).unwrap(),
            Read::Line(b"{\"b\":2}".to_vec())
        );
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Timeout);
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Eof);
    }

    #[test]
    fn line_reader_should_drop_half_a_line_at_eof_and_go_on_after() {
        // The host hung up mid-message; the next connection starts clean.
        let mut r = chunks(&[Some(b"{\"half\""), None]);
        let mut lr = LineReader::new();
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Timeout);
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Eof);
        let mut r = chunks(&[Some(b"{}\n")]);
        assert_eq!(lr.next_line(&mut r).unwrap(), Read::Line(b"{}".to_vec()));
    }

    #[test]
    fn line_reader_should_refuse_a_line_longer_than_a_frame() {
        let big = vec![b'x'; MAX_FRAME + 1];
        let mut r = BufReader::new(&big[..]);
        let e = LineReader::new().next_line(&mut r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn output_text_should_cut_at_the_cap_and_say_so() {
        assert_eq!(output_text(b"ok\n"), "ok\n");
        let big = vec![b'y'; OUTPUT_CAP + 10];
        let s = output_text(&big);
        assert!(s.starts_with("yyy"));
        assert!(
            s.ends_with("[petrel-vm-agent: 10 more bytes cut]\n"),
            "{}",
            &s[s.len() - 50..]
        );
    }
}
