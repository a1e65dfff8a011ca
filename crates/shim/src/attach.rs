//! The attach protocol on [`ATTACH_SOCKET`](crate::ATTACH_SOCKET).
//!
//! A client connects to the shim's socket and from then on both sides send
//! frames: a one-byte kind, a big-endian `u16` payload length, the payload.
//!
//! Shim to client: [`STDOUT`] and [`STDERR`] frames carrying the container's
//! output as it is read (a terminal's output is all [`STDOUT`]). Output from
//! before the connection is not replayed (it is in the CRI log). A client
//! that does not read fast enough misses frames: the shim never waits for a
//! client, so neither the container nor the log is ever slowed by one. The
//! shim closes the connection when it exits (the container has exited and
//! its output is drained).
//!
//! Client to shim:
//! - [`STDIN_OPEN`] (empty): this client carries the container's input. When
//!   the shim was started with `--stdin-once`, the container's stdin is
//!   closed once such a client sends [`STDIN_CLOSE`] or disconnects (CRI
//!   `stdin_once`). Without `--stdin-once` another attach may follow.
//! - [`STDIN`]: input for the container's stdin (a pipe) or terminal.
//!   Input is never dropped: while the container does not read, the shim
//!   stops reading from its clients.
//! - [`STDIN_CLOSE`] (empty): this client's input has ended.
//! - [`RESIZE`] (4 bytes: width, height, big-endian `u16` each): sets the
//!   terminal's size (ignored without a terminal).
//!
//! A client sending anything else is disconnected.

/// Bytes before each frame's payload: kind, then the length.
pub const HEADER_LEN: usize = 3;
/// Largest payload of one frame.
pub const MAX_PAYLOAD: usize = u16::MAX as usize;

/// Shim to client: the container's standard output (or terminal output).
pub const STDOUT: u8 = 1;
/// Shim to client: the container's standard error.
pub const STDERR: u8 = 2;
/// Client to shim: input for the container.
pub const STDIN: u8 = 3;
/// Client to shim: this client's input has ended (no payload).
pub const STDIN_CLOSE: u8 = 4;
/// Client to shim: this client carries the container's input (no payload).
pub const STDIN_OPEN: u8 = 5;
/// Client to shim: terminal size, width then height (4-byte payload).
pub const RESIZE: u8 = 6;

/// The header of a frame of `kind` with `len` payload bytes; `len` must not
/// exceed [`MAX_PAYLOAD`] (longer data is sent as several frames).
pub fn header(kind: u8, len: usize) -> [u8; HEADER_LEN] {
    let len = u16::try_from(len).unwrap_or(u16::MAX).to_be_bytes();
    [kind, len[0], len[1]]
}

/// A complete [`RESIZE`] frame.
pub fn resize_frame(width: u16, height: u16) -> [u8; HEADER_LEN + 4] {
    let [k, l0, l1] = header(RESIZE, 4);
    let [w0, w1] = width.to_be_bytes();
    let [h0, h1] = height.to_be_bytes();
    [k, l0, l1, w0, w1, h0, h1]
}

/// Parses a header: the kind and the payload length.
pub fn parse_header(h: [u8; HEADER_LEN]) -> (u8, usize) {
    (h[0], usize::from(u16::from_be_bytes([h[1], h[2]])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_should_round_trip() {
        assert_eq!(parse_header(header(STDERR, 300)), (STDERR, 300));
        assert_eq!(
            parse_header(header(STDOUT, MAX_PAYLOAD)),
            (STDOUT, MAX_PAYLOAD)
        );
        assert_eq!(resize_frame(80, 24), [RESIZE, 0, 4, 0, 80, 0, 24]);
    }
}
