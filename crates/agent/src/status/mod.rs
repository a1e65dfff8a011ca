//! Pod status: computing the Kubernetes status of a pod, and publishing it.

pub mod compute;
pub mod store;

pub use compute::{
    carry_transition_times, compute_pod_status, published_pod, StatusContext,
    REASON_INVALID_MANIFEST,
};
pub use store::{StatusStore, WatchEvent, WatchEventType};
