//! QoS and pod cgroups, as kubelet's container manager keeps them with
//! the cgroupfs or the systemd driver, on cgroup v1 and v2, whichever
//! runtime runs the pods: `naming` says where each cgroup is (directory
//! or slice), `config` computes the values (no I/O), `host` writes them
//! through [`petrel_oci::cgroups::Cgroups`] behind a trait, `systemd`
//! (over `dbus`) makes them slice units instead, and `manager` decides
//! when (start, before a pod's sandbox, after it is gone).
//!
//! Left out, as kubelet has them off by default or as the agent has no
//! such setting: memory QoS (`memory.min`/`memory.high`, the alpha
//! MemoryQoS gate), `--qos-reserved`, huge page limits, a CFS period
//! other than 100 ms and `--cpu-cfs-quota=false`.

mod config;
mod dbus;
mod host;
mod manager;
mod naming;
mod systemd;

pub use config::{
    best_effort_config, burstable_config, milli_cpu_to_quota, milli_cpu_to_shares, pod_config,
    pod_cpu_request, top_level_config, ResourceConfig, MAX_SHARES, MIN_SHARES, QUOTA_PERIOD_US,
};
pub use dbus::ZbusSystemd;
pub use host::{files, shares_to_weight, CgroupHost, FileWrite, HostCgroups, HostError};
pub use manager::QosCgroups;
pub use naming::{expand_slice, slice_unit, CgroupDriver, CgroupLayout, LayoutError};
pub use systemd::{
    properties, quota_per_sec, slice_props, Prop, PropValue, SystemdBus, SystemdCgroups,
    SystemdError,
};
