//! The WebSocket transport: kubelet's channel protocols (`channel.k8s.io`
//! and its v2 to v5 and base64 variants) for exec and attach, and the
//! channel-pair protocol for port-forward.

pub(crate) mod conn;
pub(crate) mod server;

use crate::protocol::{V1, V1_BASE64, V2, V3, V4, V4_BASE64, V5};

/// Subprotocols offered for exec and attach, most preferred first.
pub(crate) const REMOTE_COMMAND: &[&str] = &[V5, V4, V4_BASE64, V3, V2, V1, V1_BASE64];
/// Subprotocols offered for port-forward.
pub(crate) const PORT_FORWARD: &[&str] = &[V4, V4_BASE64];
