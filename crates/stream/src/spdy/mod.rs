//! The SPDY/3.1 transport (what `kubectl` through the API server, `crictl`
//! and client-go's SPDY executor speak): framing, header compression, the
//! connection, and the server side of exec, attach and port-forward.

pub(crate) mod frame;
pub(crate) mod server;
pub(crate) mod session;
pub(crate) mod zlib;
