//! What a container is made of on the host (its rootfs and its shim), and
//! its lifecycle: created all or nothing (`create`), started with its shim
//! (`start`), updated and removed (`lifecycle`), stopped (`stop`), its exit
//! recorded (`exit`), undone (`teardown`).
pub(crate) mod config_update;
pub(crate) mod create;
pub(crate) mod exec_process;
pub(crate) mod exit;
pub mod found_shims;
pub mod idmap;
pub mod image_users;
pub(crate) mod lifecycle;
pub mod migration_warmup;
pub mod mount_ns;
pub mod rootfs;
pub mod shim;
pub(crate) mod start;
pub(crate) mod stop;
pub(crate) mod teardown;
