//! What a container is made of on the host: its rootfs and its shim.
pub mod rootfs;
pub mod shim;
