//! Petrel's CNI client: it finds the pod network configuration the way
//! containerd does (the first `.conf`, `.conflist` or `.json` file of the
//! configuration directory, by name), runs the plugin chain for ADD, DEL
//! and CHECK as the CNI specification (1.0, and the 0.x versions before it)
//! describes, and reads the result.
//!
//! Nothing here knows about pods: the runtime passes an [`Attachment`]
//! (container id, network namespace, interface, arguments and the runtime
//! capabilities such as port mappings) and stores what [`NetworkList::add`]
//! returns, so that the same list and result tear the network down later,
//! also after a restart and a change of the configuration directory.

mod config;
mod error;
mod invoke;
mod result;

pub use config::{load_dir, NetworkList};
pub use error::CniError;
pub use invoke::{Attachment, DnsCapability, PluginRunner, PortMapping};
pub use result::{AddResult, IpConfig};
