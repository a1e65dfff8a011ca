//! What a pod sandbox is made of: pinned namespaces, shared files, the pid
//! namespace holder.
pub(crate) mod cgroup_owner;
pub mod files;
pub mod namespaces;
pub mod network;
pub mod pid_holder;
