//! Names and numbers shared by both transports: subprotocol names, stream
//! types, channel numbers, and the payloads carried on the error and resize
//! streams.

pub(crate) mod resize;
pub(crate) mod status;

/// Remote command protocol v5 (WebSocket only difference: the close signal).
pub const V5: &str = "v5.channel.k8s.io";
/// Remote command protocol v4: the error stream carries a JSON `Status`
/// with the exit code.
pub const V4: &str = "v4.channel.k8s.io";
/// Remote command protocol v3: adds the resize stream.
pub const V3: &str = "v3.channel.k8s.io";
/// Remote command protocol v2.
pub const V2: &str = "v2.channel.k8s.io";
/// Remote command protocol v1 (also the WebSocket "channel" protocol).
pub const V1: &str = "channel.k8s.io";
/// WebSocket base64 variant of v1.
pub const V1_BASE64: &str = "base64.channel.k8s.io";
/// WebSocket base64 variant of v4.
pub const V4_BASE64: &str = "v4.base64.channel.k8s.io";
/// The SPDY port-forward protocol.
pub const PORT_FORWARD: &str = "portforward.k8s.io";

/// SPDY remote command protocols, most preferred first.
pub(crate) const SPDY_REMOTE_COMMAND: &[&str] = &[V5, V4, V3, V2, V1];
/// SPDY port-forward protocols.
pub(crate) const SPDY_PORT_FORWARD: &[&str] = &[PORT_FORWARD];

/// The HTTP header naming SPDY stream protocol versions.
pub(crate) const HEADER_PROTOCOL_VERSION: &str = "x-stream-protocol-version";
/// The HTTP header listing the versions a server accepts, on a failed
/// negotiation.
pub(crate) const HEADER_ACCEPTED_VERSIONS: &str = "x-accepted-stream-protocol-versions";

/// SPDY stream header: which stream this is.
pub(crate) const STREAM_TYPE: &str = "streamtype";
/// SPDY port-forward stream header: the port in the pod.
pub(crate) const PORT: &str = "port";
/// SPDY port-forward stream header: pairs a data stream with its error stream.
pub(crate) const REQUEST_ID: &str = "requestid";

/// Stream types (SPDY `streamType` header values).
pub(crate) mod stream_type {
    pub(crate) const STDIN: &str = "stdin";
    pub(crate) const STDOUT: &str = "stdout";
    pub(crate) const STDERR: &str = "stderr";
    pub(crate) const ERROR: &str = "error";
    pub(crate) const RESIZE: &str = "resize";
    pub(crate) const DATA: &str = "data";
}

/// WebSocket channel numbers of the remote command protocols.
pub(crate) mod channel {
    pub(crate) const STDIN: u8 = 0;
    pub(crate) const STDOUT: u8 = 1;
    pub(crate) const STDERR: u8 = 2;
    pub(crate) const ERROR: u8 = 3;
    pub(crate) const RESIZE: u8 = 4;
    /// v5: `[CLOSE, n]` says the sender will write no more on channel n.
    pub(crate) const CLOSE: u8 = 255;
}

/// What a negotiated remote command protocol version can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Version {
    /// 1 to 5.
    pub(crate) number: u8,
    /// WebSocket messages are text, base64 encoded after the channel digit.
    pub(crate) base64: bool,
}

impl Version {
    /// The version of a remote command subprotocol name; `""` (no
    /// subprotocol asked for) is v1, as kubelet treats it.
    pub(crate) fn of(name: &str) -> Option<Version> {
        let (number, base64) = match name {
            V5 => (5, false),
            V4 => (4, false),
            V4_BASE64 => (4, true),
            V3 => (3, false),
            V2 => (2, false),
            V1 | "" => (1, false),
            V1_BASE64 => (1, true),
            _ => return None,
        };
        Some(Version { number, base64 })
    }

    /// v4 and later report the exit status as JSON.
    pub(crate) fn json_status(self) -> bool {
        self.number >= 4
    }

    /// v3 and later carry terminal resizes.
    pub(crate) fn resize(self) -> bool {
        self.number >= 3
    }
}

/// Picks the first of the client's protocols (in its order of preference)
/// that the server supports.
pub(crate) fn negotiate<'a>(client: &[&'a str], server: &[&str]) -> Option<&'a str> {
    client.iter().copied().find(|c| server.contains(c))
}

/// Splits comma-separated header values, trimming blanks.
pub(crate) fn split_list<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_client_preference() {
        assert_eq!(negotiate(&[V4, V5], SPDY_REMOTE_COMMAND), Some(V4));
        assert_eq!(negotiate(&["v9.channel.k8s.io"], SPDY_REMOTE_COMMAND), None);
        assert_eq!(split_list(["a, b", "", " c"]), vec!["a", "b", "c"]);
    }

    #[test]
    fn versions() {
        assert!(Version::of(V5).is_some_and(|v| v.json_status() && v.resize()));
        assert!(Version::of(V2).is_some_and(|v| !v.resize()));
        assert!(Version::of(V4_BASE64).is_some_and(|v| v.base64));
        assert!(Version::of("bogus").is_none());
    }
}
