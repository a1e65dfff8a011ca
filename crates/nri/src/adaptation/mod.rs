//! The runtime's side of NRI plugin connections.
//!
//! [`PluginConn`] is one registered plugin: it runs the multiplexer on the plugin's
//! socket, serves the Runtime service (registration and plugin-initiated container
//! updates, the latter handed to the owner's [`RuntimeHandler`]) and offers typed calls
//! of the Plugin service with a per-call timeout, chunked synchronization and the
//! StateChange fallback for plugins built against older NRI. Deciding which plugins to
//! call, in which order, and merging or validating what they answer is the owner's job.

mod conn;

pub use conn::{
    plugin_socketpair, ConnError, ConnOptions, PluginConn, Registration, RuntimeHandler,
};
