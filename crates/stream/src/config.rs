//! The streaming server's settings.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// How the streaming server listens and how long it waits.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Where to listen. The default, 127.0.0.1:0, is loopback on a free
    /// port: reachable by crictl and a kubelet on this machine only.
    pub address: SocketAddr,
    /// The scheme, authority and optional path prefix URLs start with
    /// (e.g. `http://10.0.0.5:10010` or `http://node/cri`), for a server
    /// reached through another address than it listens on. Default:
    /// `http://` and the bound address.
    pub base_url: Option<String>,
    /// How long a URL stays valid before its client connects (kubelet: 1 min).
    pub token_ttl: Duration,
    /// URLs handed out but not yet used, at most (kubelet: 1000).
    pub max_in_flight: usize,
    /// How long a SPDY client may take to open its streams (kubelet: 30 s).
    pub stream_creation_timeout: Duration,
    /// How long to wait for a client's goodbye after the server's, before
    /// dropping the connection.
    pub linger: Duration,
    /// A connection on which nothing was read or written for this long is
    /// closed (kubelet: 4 h). `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            address: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            base_url: None,
            token_ttl: Duration::from_secs(60),
            max_in_flight: 1000,
            stream_creation_timeout: Duration::from_secs(30),
            linger: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(4 * 3600)),
        }
    }
}
