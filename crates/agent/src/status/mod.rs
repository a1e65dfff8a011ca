//! Pod status: computing the Kubernetes status of a pod, and publishing it.

pub mod store;

pub use store::{StatusStore, WatchEvent, WatchEventType};
