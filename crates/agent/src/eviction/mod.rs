//! Node-pressure eviction with kubelet's semantics and flags.
//!
//! - [`signals`]: the eviction signals and the conditions they drive;
//! - [`config`]: kubelet's threshold syntax, flags and defaults;
//! - [`thresholds`]: threshold evaluation with grace periods, the pressure
//!   transition period and minimum reclaim (pure);
//! - [`rank`]: the order in which pods are evicted (pure);
//! - [`observe`]: the node's statistics (cgroups, /proc, statvfs);
//! - [`local`]: pods' local storage and its limits;
//! - [`notify`]: memory cgroup threshold (v1) and PSI (v2) notifications;
//! - [`node`]: the node's published conditions;
//! - [`summary`]: `GET /stats/summary` in kubelet's shape, built each pass;
//! - [`manager`]: the loop that ties them together.

pub mod config;
pub mod local;
pub mod manager;
pub mod node;
pub mod notify;
pub mod observe;
pub mod rank;
pub mod signals;
pub mod summary;
pub mod thresholds;

pub use config::{EvictionConfigError, EvictionSettings, Threshold, ThresholdValue};
pub use manager::{EvictionManager, Evictor, ManagerParts};
pub use node::NodeState;
pub use signals::{NodeCondition, Resource, Signal, UnknownSignal};
