//! Pod events into the PodSet queue, under their owner's key
//! (controller-runtime's `Owns`): the kit's [`QueueHandler`] queues an
//! event's own key, so Pods get this small handler with the same policy.
//!
//! [`QueueHandler`]: petrel_controller::informer::QueueHandler

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use petrel_controller::informer::{ClassPolicy, Event, EventHandler};
use petrel_controller::WorkQueue;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::reconcile::owner_key;

/// Queues the controlling PodSet of each Pod event (of the old and the new
/// Pod), at the tier and delay `policy` gives the event's class.
pub struct OwnerHandler {
    queue: WorkQueue<String>,
    policy: ClassPolicy,
    rng: Mutex<StdRng>,
}

impl OwnerHandler {
    /// A handler into `queue`.
    pub fn new(queue: WorkQueue<String>, policy: ClassPolicy) -> Self {
        Self {
            queue,
            policy,
            rng: Mutex::new(StdRng::from_entropy()),
        }
    }
}

impl EventHandler<Pod> for OwnerHandler {
    fn on_event(&self, event: &Event<Pod>) {
        let mut keys: Vec<String> = [event.old.as_deref(), event.new.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(owner_key)
            .collect();
        keys.dedup();
        for key in keys {
            let d = {
                let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
                self.policy.decide(event.class, &mut *rng)
            };
            match d.delay {
                Some(delay) if !delay.is_zero() => self.queue.add_after(key, d.priority, delay),
                _ => self.queue.add(key, d.priority),
            }
        }
    }
}
