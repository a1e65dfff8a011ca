//! Informers: a local, indexed cache of one resource type kept equal to
//! the API server's by list + watch, whose events are classified where they
//! arise and handed to any number of handlers.
//!
//! * [`lister_watcher`]: the door to the API server, a trait ([`ListerWatcher`])
//!   with the real [`ApiLister`] over a `kube::Api` (typed or dynamic).
//! * the reflector: list (paginated), then watch from the list's
//!   resourceVersion with bookmarks; re-list on 410 Gone / `Expired`,
//!   compared with the cache; errors retried with backoff, logged once per
//!   episode.
//! * [`Store`] with [`Indexers`]: get by key, list, by namespace, label,
//!   field or any index function; objects are `Arc`s, reads copy pointers,
//!   or kept encoded ([`CacheForm::Encoded`]), reads decode.
//! * [`SharedInformer`] and [`InformerFactory`]: one list/watch per
//!   (type, namespace, selectors); handlers ([`EventHandler`],
//!   [`QueueHandler`]) each on their own task, a panic isolated.
//!
//! Every [`Event`] carries its [`EventClass`]:
//! an initial-list add (the first list, a re-list, or the snapshot a late
//! handler gets), a no-op resync, or a user change. A [`ClassPolicy`] maps
//! classes to queue tiers and delays.
//!
//! A controller with leader election: make the informers from a factory,
//! start them at once (a standby keeps a warm cache), report ready when
//! [`InformerFactory::has_synced`], and add its handlers only when it
//! leads (they get the cache as initial-list adds, at background priority).

mod handler;
mod index;
pub mod lister_watcher;
mod reflector;
mod shared;
mod slot;
mod store;

pub use crate::classify::{ClassPolicy, Delay, EventClass};
pub use handler::{Event, EventHandler, EventKind, QueueHandler, Registration};
pub use index::{IndexFn, Indexers, LABEL, NAMESPACE};
pub use lister_watcher::{ApiLister, ListerWatcher, Page, Selectors, WatchError};
pub use shared::{InformerConfig, InformerFactory, SharedInformer};
pub use slot::CacheForm;
pub use store::{object_key, Store};

/// Errors of the informer's reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InformerError {
    /// The store has no index of this name.
    #[error("no index named {0:?}")]
    NoSuchIndex(String),
}

#[cfg(test)]
mod tests;
