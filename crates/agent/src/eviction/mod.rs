//! Node-pressure eviction with kubelet's semantics and flags.
//!
//! - [`signals`]: the eviction signals and the conditions they drive;
//! - [`config`]: kubelet's threshold syntax, flags and defaults;
//! - [`thresholds`]: threshold evaluation with grace periods, the pressure
//!   transition period and minimum reclaim (pure);
//! - [`rank`]: the order in which pods are evicted (pure).

pub mod config;
pub mod rank;
pub mod signals;
pub mod thresholds;

pub use config::{EvictionConfigError, EvictionSettings, Threshold, ThresholdValue};
pub use signals::{NodeCondition, Resource, Signal, UnknownSignal};
