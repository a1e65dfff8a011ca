//! The runtime's side of NRI plugin connections.
//!
//! [`PluginConn`] is one registered plugin: it runs the multiplexer on the plugin's
//! socket, serves the Runtime service (registration and plugin-initiated container
//! updates, the latter handed to the owner's [`RuntimeHandler`]) and offers typed calls
//! of the Plugin service with a per-call timeout, chunked synchronization and the
//! StateChange fallback for plugins built against older NRI. Deciding which plugins to
//! call and in which order is the owner's job.
//!
//! What plugins answer is combined by pure functions over the protocol types:
//! [`CreateMerger`] and [`UpdateMerger`] merge answers with ownership tracking and
//! conflict detection ([`owners`] holds the ownership record and its errors),
//! [`check_plugin_updates`] applies the same rules to plugin-initiated updates against
//! the owners the runtime recorded, and [`validate`] builds validation requests and is
//! the built-in default validator with the required-plugins check.

mod conn;
pub mod merge;
pub mod owners;
pub mod validate;

pub use conn::{
    plugin_socketpair, ConnError, ConnOptions, PluginConn, Registration, RuntimeHandler,
};
pub use merge::{
    check_plugin_updates, CreateMerger, CreateResult, Eviction, RejectedUpdate, UpdateMerger,
    UpdateResult,
};
pub use owners::MergeError;
pub use validate::{DefaultValidator, DefaultValidatorConfig, ValidationError};
