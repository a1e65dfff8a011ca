//! Attach clients on [`ATTACH_SOCKET`] (protocol: `petrel_shim::attach`).
//!
//! Everything here is non-blocking and driven by the shim's one `poll(2)`
//! loop: output goes to a client as far as its socket buffer takes it at
//! once; what does not fit waits in a backlog of at most [`MAX_BACKLOG`]
//! bytes for `POLLOUT` (so a burst does not cost a client that keeps up any
//! output), and frames that would overflow the backlog are dropped for that
//! client. A slow or stuck client never delays the container, the log or
//! another client. Without clients the server is one listening socket; a
//! client that is not behind holds no buffer.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};

use petrel_shim::attach::{self, HEADER_LEN};
use petrel_shim::ATTACH_SOCKET;

use crate::time;

/// Most clients attached at once; more are turned away.
pub const MAX_CLIENTS: usize = 8;
/// Most output bytes waiting for one client that is behind.
pub const MAX_BACKLOG: usize = 256 * 1024;
/// Bytes read from a client at a time (also bounds the shim's input buffer).
const READ_CHUNK: usize = 4096;
/// How long unsent output may still be flushed to clients when the shim
/// exits.
const FINAL_FLUSH_MS: i64 = 200;

/// What a client asks of the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// Input for the container.
    Input(&'a [u8]),
    /// A client carrying the container's input ended it (or left).
    InputEnded,
    /// New terminal size: width, height.
    Resize(u16, u16),
}

/// The listening socket and the attached clients.
#[derive(Debug)]
pub struct AttachServer {
    listener: UnixListener,
    clients: [Option<Client>; MAX_CLIENTS],
    /// Output frames dropped because a client was behind; reported once per
    /// client when it leaves.
    dropped_frames: u64,
}

#[derive(Debug)]
struct Client {
    stream: UnixStream,
    /// Output the socket did not take yet, whole frames (or the end of one
    /// first); at most [`MAX_BACKLOG`] bytes.
    backlog: VecDeque<u8>,
    decoder: Decoder,
    /// Sent `STDIN_OPEN` and not yet `STDIN_CLOSE`.
    carries_input: bool,
    dropped_frames: u64,
}

impl AttachServer {
    /// Binds [`ATTACH_SOCKET`] in the working directory (the bundle),
    /// replacing a stale socket.
    pub fn bind() -> io::Result<Self> {
        match std::fs::remove_file(ATTACH_SOCKET) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(ATTACH_SOCKET)?;
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener,
            clients: Default::default(),
            dropped_frames: 0,
        })
    }

    /// The listening socket's descriptor, to poll for `POLLIN`.
    pub fn listener_fd(&self) -> i32 {
        self.listener.as_raw_fd()
    }

    /// Fills one pollfd per client slot (`fd -1` for an empty one): input is
    /// polled only while `want_input`, output while a backlog waits.
    pub fn fill_pollfds(&self, fds: &mut [libc::pollfd], want_input: bool) {
        for (slot, pfd) in self.clients.iter().zip(fds.iter_mut()) {
            *pfd = match slot {
                Some(c) => libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events: (if want_input { libc::POLLIN } else { 0 })
                        | (if c.backlog.is_empty() {
                            0
                        } else {
                            libc::POLLOUT
                        }),
                    revents: 0,
                },
                None => libc::pollfd {
                    fd: -1,
                    events: 0,
                    revents: 0,
                },
            };
        }
    }

    /// Accepts every waiting connection.
    pub fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    diag!("accept attach client: {e}");
                    return;
                }
            };
            if let Err(e) = stream.set_nonblocking(true) {
                diag!("attach client: {e}");
                continue;
            }
            match self.clients.iter_mut().find(|s| s.is_none()) {
                Some(slot) => {
                    *slot = Some(Client {
                        stream,
                        backlog: VecDeque::new(),
                        decoder: Decoder::default(),
                        carries_input: false,
                        dropped_frames: 0,
                    })
                }
                // Closing the connection tells the client.
                None => diag!("attach client refused: {MAX_CLIENTS} clients attached"),
            }
        }
    }

    /// Serves what `poll` reported for client slot `index`; `on` receives
    /// the client's requests. Input is read only when `want_input`.
    pub fn serve_client(
        &mut self,
        index: usize,
        revents: libc::c_short,
        want_input: bool,
        on: &mut impl FnMut(Request<'_>),
    ) {
        let Some(client) = self.clients.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        let mut keep = true;
        if revents & libc::POLLOUT != 0 {
            keep = client.flush();
        }
        if keep && want_input && revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            keep = client.read(on);
        } else if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // Gone while its input is not wanted: whatever it still sent is
            // lost with it, and polling it again would only spin.
            keep = false;
        }
        if !keep {
            self.remove(index, on);
        }
    }

    /// Sends one frame of output to every client that is not behind.
    pub fn broadcast(&mut self, kind: u8, data: &[u8], on: &mut impl FnMut(Request<'_>)) {
        for chunk in data.chunks(attach::MAX_PAYLOAD) {
            let header = attach::header(kind, chunk.len());
            for index in 0..MAX_CLIENTS {
                let Some(client) = self.clients[index].as_mut() else {
                    continue;
                };
                if !client.send(&header, chunk) {
                    self.remove(index, on);
                }
            }
        }
    }

    /// Flushes what clients still miss for a moment, then disconnects them
    /// all and removes the socket (the shim is exiting).
    pub fn finish(&mut self) {
        let deadline = time::monotonic_ns() + FINAL_FLUSH_MS * 1_000_000;
        loop {
            let mut fds = [libc::pollfd {
                fd: -1,
                events: 0,
                revents: 0,
            }; MAX_CLIENTS];
            let mut waiting = false;
            for (slot, pfd) in self.clients.iter().zip(fds.iter_mut()) {
                if let Some(c) = slot.as_ref().filter(|c| !c.backlog.is_empty()) {
                    *pfd = libc::pollfd {
                        fd: c.stream.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    waiting = true;
                }
            }
            let left = deadline - time::monotonic_ns();
            if !waiting || left <= 0 {
                break;
            }
            let ms = libc::c_int::try_from((left + 999_999) / 1_000_000).unwrap_or(1);
            if crate::sys::poll(&mut fds, ms).is_err() {
                break;
            }
            for (slot, pfd) in self.clients.iter_mut().zip(fds.iter()) {
                if pfd.revents != 0 {
                    if let Some(c) = slot.as_mut() {
                        if !c.flush() {
                            c.backlog.clear();
                        }
                    }
                }
            }
        }
        for index in 0..MAX_CLIENTS {
            self.remove(index, &mut |_: Request<'_>| {});
        }
        if self.dropped_frames > 0 {
            diag!(
                "{} output frames were not sent to slow attach clients",
                self.dropped_frames
            );
        }
        let _ = std::fs::remove_file(ATTACH_SOCKET);
    }

    /// Disconnects a client; a client that still carried input ends it.
    fn remove(&mut self, index: usize, on: &mut impl FnMut(Request<'_>)) {
        if let Some(client) = self.clients.get_mut(index).and_then(Option::take) {
            self.dropped_frames += client.dropped_frames;
            if client.carries_input {
                on(Request::InputEnded);
            }
        }
    }
}

impl Client {
    /// Sends a frame, or queues it behind what the client has not taken
    /// yet, or drops it when that would exceed [`MAX_BACKLOG`]; `false`
    /// when the client is gone.
    fn send(&mut self, header: &[u8; HEADER_LEN], payload: &[u8]) -> bool {
        let total = header.len() + payload.len();
        let written = if self.backlog.is_empty() {
            let bufs = [IoSlice::new(header), IoSlice::new(payload)];
            match (&self.stream).write_vectored(&bufs) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    0
                }
                Err(_) => return false,
            }
        } else {
            0
        };
        if written >= total {
            return true;
        }
        // The start of a partly written frame is on the wire: its end must
        // follow whatever the cost. A whole frame may be dropped instead.
        if written == 0 && self.backlog.len() + total > MAX_BACKLOG {
            self.dropped_frames += 1;
            return true;
        }
        if written < header.len() {
            self.backlog.extend(&header[written..]);
            self.backlog.extend(payload);
        } else {
            self.backlog.extend(&payload[written - header.len()..]);
        }
        true
    }

    /// Writes what the client has not taken yet; `false` when gone.
    fn flush(&mut self) -> bool {
        while !self.backlog.is_empty() {
            let (a, b) = self.backlog.as_slices();
            let bufs = [IoSlice::new(a), IoSlice::new(b)];
            match (&self.stream).write_vectored(&bufs) {
                Ok(0) => return false,
                Ok(n) => {
                    self.backlog.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
        // Release the buffer: a client that caught up costs no memory.
        self.backlog = VecDeque::new();
        true
    }

    /// Reads one chunk of requests; `false` when the client is gone or broke
    /// the protocol.
    fn read(&mut self, on: &mut impl FnMut(Request<'_>)) -> bool {
        let mut buf = [0u8; READ_CHUNK];
        let n = match (&self.stream).read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return true
            }
            Err(_) => return false,
        };
        let carries_input = &mut self.carries_input;
        let result = self.decoder.feed(&buf[..n], &mut |frame| match frame {
            Frame::Open => *carries_input = true,
            Frame::Close => {
                if std::mem::take(carries_input) {
                    on(Request::InputEnded);
                }
            }
            Frame::Input(data) => on(Request::Input(data)),
            Frame::Resize(w, h) => on(Request::Resize(w, h)),
        });
        match result {
            Ok(()) => true,
            Err(msg) => {
                diag!("attach client disconnected: {msg}");
                false
            }
        }
    }
}

/// One decoded client frame (or a piece of a long input frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame<'a> {
    Open,
    Close,
    Input(&'a [u8]),
    Resize(u16, u16),
}

/// Splits a client's byte stream into frames; input payloads are passed on
/// piece by piece as they arrive, so nothing but a header and a resize is
/// ever buffered.
#[derive(Debug, Default)]
struct Decoder {
    header: [u8; HEADER_LEN],
    header_len: usize,
    /// Inside a payload: its kind and the bytes still to come.
    payload: Option<(u8, usize)>,
    size: [u8; 4],
    size_len: usize,
}

impl Decoder {
    fn feed<'a>(
        &mut self,
        mut data: &'a [u8],
        on: &mut impl FnMut(Frame<'a>),
    ) -> Result<(), &'static str> {
        loop {
            match self.payload {
                None => {
                    let n = (HEADER_LEN - self.header_len).min(data.len());
                    self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                    self.header_len += n;
                    data = &data[n..];
                    if self.header_len < HEADER_LEN {
                        return Ok(());
                    }
                    self.header_len = 0;
                    match attach::parse_header(self.header) {
                        (attach::STDIN_OPEN, 0) => on(Frame::Open),
                        (attach::STDIN_CLOSE, 0) => on(Frame::Close),
                        (attach::STDIN, 0) => {}
                        (attach::STDIN, len) => self.payload = Some((attach::STDIN, len)),
                        (attach::RESIZE, 4) => {
                            self.size_len = 0;
                            self.payload = Some((attach::RESIZE, 4));
                        }
                        _ => return Err("unknown or malformed frame"),
                    }
                }
                Some((kind, left)) => {
                    if data.is_empty() {
                        return Ok(());
                    }
                    let n = left.min(data.len());
                    let (piece, rest) = data.split_at(n);
                    data = rest;
                    if kind == attach::STDIN {
                        on(Frame::Input(piece));
                    } else {
                        self.size[self.size_len..self.size_len + n].copy_from_slice(piece);
                        self.size_len += n;
                    }
                    self.payload = (left > n).then_some((kind, left - n));
                    if self.payload.is_none() && kind == attach::RESIZE {
                        let [w0, w1, h0, h1] = self.size;
                        on(Frame::Resize(
                            u16::from_be_bytes([w0, w1]),
                            u16::from_be_bytes([h0, h1]),
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], step: usize) -> Result<Vec<String>, &'static str> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for piece in bytes.chunks(step) {
            d.feed(piece, &mut |f| {
                out.push(match f {
                    Frame::Open => "open".to_string(),
                    Frame::Close => "close".to_string(),
                    Frame::Input(b) => format!("in:{}", String::from_utf8_lossy(b)),
                    Frame::Resize(w, h) => format!("size:{w}x{h}"),
                })
            })?;
        }
        Ok(out)
    }

    fn stream() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&attach::header(attach::STDIN_OPEN, 0));
        b.extend_from_slice(&attach::header(attach::STDIN, 5));
        b.extend_from_slice(b"hello");
        b.extend_from_slice(&attach::resize_frame(120, 40));
        b.extend_from_slice(&attach::header(attach::STDIN_CLOSE, 0));
        b
    }

    #[test]
    fn decoder_should_read_frames_whole() -> Result<(), &'static str> {
        let got = decode_all(&stream(), 1024)?;
        assert_eq!(got, ["open", "in:hello", "size:120x40", "close"]);
        Ok(())
    }

    #[test]
    fn decoder_should_read_frames_split_anywhere() -> Result<(), &'static str> {
        let got = decode_all(&stream(), 1)?;
        let input: String = got
            .iter()
            .filter_map(|s| s.strip_prefix("in:"))
            .collect::<Vec<_>>()
            .concat();
        assert_eq!(input, "hello");
        assert_eq!(got.first().map(String::as_str), Some("open"));
        assert!(got.contains(&"size:120x40".to_string()));
        assert_eq!(got.last().map(String::as_str), Some("close"));
        Ok(())
    }

    #[test]
    fn decoder_should_refuse_unknown_frames() {
        assert!(decode_all(&attach::header(attach::STDOUT, 1), 8).is_err());
        assert!(decode_all(&attach::header(attach::RESIZE, 3), 8).is_err());
        assert!(decode_all(&attach::header(attach::STDIN_CLOSE, 2), 8).is_err());
    }

    #[test]
    fn send_should_queue_then_drop_whole_frames_for_a_client_that_is_behind() -> io::Result<()> {
        let (a, b) = UnixStream::pair()?;
        a.set_nonblocking(true)?;
        let mut client = Client {
            stream: a,
            backlog: VecDeque::new(),
            decoder: Decoder::default(),
            carries_input: false,
            dropped_frames: 0,
        };
        // Fill the socket and the backlog until a frame is dropped.
        let payload = [b'x'; 16 * 1024];
        let header = attach::header(attach::STDOUT, payload.len());
        let mut sent = 0;
        while client.dropped_frames == 0 {
            assert!(client.send(&header, &payload));
            assert!(client.backlog.len() <= MAX_BACKLOG);
            sent += 1;
            assert!(sent < 10_000, "the socket never filled");
        }
        assert!(!client.backlog.is_empty());
        // Behind: further frames are dropped, the backlog does not grow.
        let before = client.backlog.len();
        assert!(client.send(&header, &payload));
        assert_eq!(client.backlog.len(), before);
        assert_eq!(client.dropped_frames, 2);
        // The reader catches up: the backlog goes out, whole frames only.
        let mut reader = b;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while !client.backlog.is_empty() {
            let n = reader.read(&mut buf)?;
            got.extend_from_slice(&buf[..n]);
            assert!(client.flush());
        }
        reader.set_nonblocking(true)?;
        loop {
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let frame_len = HEADER_LEN + payload.len();
        assert_eq!(got.len(), (sent - 1) * frame_len);
        for frame in got.chunks(frame_len) {
            assert_eq!(frame[..HEADER_LEN], header);
        }
        // A peer that closed is reported as gone.
        drop(reader);
        let gone = !client.send(&header, &payload) || !client.flush();
        assert!(gone);
        Ok(())
    }
}
