//! What most end-to-end tests use: `use petrel_testkit::prelude::*;`.

pub use crate::bins::petrel_bin;
pub use crate::clients::{pod_namespaces, sh_container, with_namespaces, Clients};
pub use crate::ctl::{ctl, ok};
pub use crate::node::{read_log, Node};
pub use crate::process::{cgroup_leftovers, mounts_under, random_suffix, remove_cgroup_tree};
pub use crate::test_images::{images_dir, BUSYBOX};
pub use crate::wait::eventually;
