//! What a container is made of on the host: its rootfs and its shim.
pub mod image_users;
pub mod migration_warmup;
pub mod mount_ns;
pub mod rootfs;
pub mod shim;
