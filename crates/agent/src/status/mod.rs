//! Pod status: computing the Kubernetes status of a pod, and publishing it.

pub mod compute;
pub mod store;

pub use compute::{compute_pod_status, published_pod, StatusContext};
pub use store::{StatusStore, WatchEvent, WatchEventType};
