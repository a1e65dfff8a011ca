//! OCI plumbing for Petrel.
pub mod cgroups;
pub mod runc;
pub mod spec;
pub mod user;
