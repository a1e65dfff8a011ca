//! What a container is made of on the host: its rootfs and its shim, and
//! the recording of its exit.
pub(crate) mod exit;
pub mod found_shims;
pub mod image_users;
pub mod migration_warmup;
pub mod mount_ns;
pub mod rootfs;
pub mod shim;
