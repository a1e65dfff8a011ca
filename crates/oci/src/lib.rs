//! OCI plumbing for Petrel.
pub mod cgroups;
pub mod dir_usage;
pub mod exec_fifo;
pub mod features;
pub mod proc_stat;
pub mod proc_usage;
pub mod runc;
pub mod spec;
pub mod stopped_delete;
pub mod user;
pub mod userns;
