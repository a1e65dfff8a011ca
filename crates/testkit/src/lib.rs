//! Petrel's test kit, the one crate of test support: what the end-to-end
//! tests (`tests/e2e`), `make conformance` and `make bench` need beyond
//! Petrel itself. Every launcher gives its daemon a temporary root, socket,
//! ports, cgroup parent and names of its own and cleans up on drop, also
//! when a test fails.
//!
//! Petrel under test:
//!
//! - [`bins`]: the `petrel` and `petrel-shim` binaries, in the cargo target
//!   directory of the running executable.
//! - [`node`]: `petrel runtime` (or `petrel node`) as a process, for the
//!   end-to-end tests; `in_process` (feature `in-process`): the runtime
//!   library serving in the test's process.
//! - [`agent`]: `petrel agent` beside a runtime, and its pods' JSON.
//! - [`clients`]: CRI clients and the configs the tests build; [`ctl`]:
//!   `petrel ctl`; [`wait`]: polling; [`h2raw`]: hand-made HTTP/2.
//! - [`test_images`]: the busybox and pause test image archives;
//!   [`oci_layout`]: synthetic OCI layouts of a chosen size, and images
//!   with files of a test's own.
//! - [`local_containerd`]: the containerd 1.7/1.6 `make containerd`
//!   unpacks, as a CRI runtime the agent drives.
//! - [`prelude`]: what most end-to-end tests use.
//! - [`vm`]: a pure cgroup v2 guest under QEMU (kernel and initramfs of
//!   `make vm`), seeing the host's root read-only; commands run in it
//!   through its agent (`petrel-vm-agent`), for the tests of the cgroup v2
//!   code paths this v1 host cannot run.
//!
//! Real peers:
//!
//! - [`peers`]: where the real ecosystem's binaries are (critest, kubelet,
//!   kube-apiserver, etcd, kubectl, containerd 2.x, ...), built by `make peers`.
//! - [`images`]: the conformance kit's substitute images, built from Debian
//!   packages by `scripts/conformance-images.sh` and cached outside the clone.
//! - [`registry`]: a local registry serving them read-only, and the
//!   hosts.toml mirrors that send the upstream registries' names to it; or
//!   writable, with auth or TLS, for the pull tests.
//! - [`network`]: a private CNI bridge network with port mappings (for a
//!   runtime of the kit or one end-to-end test).
//! - [`petrel`] and [`containerd`]: a CRI runtime under test, with its own
//!   root, state, socket, cgroup parent and NRI socket, swept on drop.
//! - [`critest`]: one critest run (serialized host-wide) and its per-spec
//!   results; [`expected`]: the expected list they are held against;
//!   [`conformance`]: both together, and the side-by-side summary.
//! - [`certs`]: a throwaway certificate authority and the certificates a
//!   cluster needs, made with the `openssl` command.
//! - [`kubeconfig`]: kubeconfig files for those credentials.
//! - [`cluster`]: etcd and kube-apiserver on loopback, several side by side.
//! - [`kubectl`]: kubectl against such a cluster, with a deadline.
//! - [`kubelet`]: the real kubelet driving a CRI runtime under test,
//!   standalone (static pods) or joined to a [`cluster::Cluster`].
//! - [`process`], [`cri`], [`http`]: processes stopped by pid and swept
//!   places (the one sweep every launcher uses), the CRI calls the kit
//!   makes itself, plain HTTP GETs; [`stale`]: the owner file of each
//!   directory the kit makes, and the sweep of runs that died without
//!   cleaning up (once per process, by the first launcher).

pub mod agent;
pub mod bins;
pub mod certs;
pub mod clients;
pub mod cluster;
pub mod conformance;
pub mod containerd;
pub mod cri;
pub mod critest;
pub mod critest_bench;
pub mod criu;
pub mod ctl;
mod error;
pub mod expected;
pub mod h2raw;
pub mod http;
pub mod images;
#[cfg(feature = "in-process")]
pub mod in_process;
pub mod kubeconfig;
pub mod kubectl;
pub mod kubelet;
pub mod leader_elect;
pub mod local_containerd;
pub mod network;
pub mod node;
pub mod oci_layout;
pub mod peers;
pub mod petrel;
pub mod podset;
pub mod prelude;
pub mod process;
pub mod registry;
pub mod stale;
pub mod test_images;
pub mod vm;
pub mod wait;

pub use error::KitError;
