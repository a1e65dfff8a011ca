//! The connected plugins, in index order, and the union of what they
//! subscribed to (so an event nobody subscribed to costs one atomic load).

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use petrel_nri::adaptation::PluginConn;
use petrel_nri::api::{Event, EventMask};

/// Counters of one plugin, for metrics and `petrel ctl nri`.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Calls made.
    pub calls: AtomicU64,
    /// Calls that failed (timeouts included).
    pub errors: AtomicU64,
    /// Calls that ran into the request timeout.
    pub timeouts: AtomicU64,
    /// Total call time, in microseconds.
    pub busy_micros: AtomicU64,
}

impl PluginStats {
    /// Records one call.
    pub fn record(&self, took: Duration, error: bool, timeout: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.busy_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if error {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if timeout {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A registered, configured and synchronized plugin.
#[derive(Debug)]
pub struct Plugin {
    /// The connection.
    pub conn: PluginConn,
    /// True if the runtime launched it (from `plugin_path`).
    pub pre_registered: bool,
    /// Its process: the launched child, or the socket peer's (external).
    pub pid: Option<i32>,
    /// A timed-out call fails the CRI call instead of skipping the plugin.
    pub timeout_fatal: bool,
    /// Its call counters.
    pub stats: PluginStats,
}

impl Plugin {
    /// `NN-name`.
    pub fn qualified_name(&self) -> String {
        self.conn.registration().qualified_name()
    }

    fn order_key(&self) -> (String, String) {
        let r = self.conn.registration();
        (r.index.clone(), r.name.clone())
    }
}

/// Why a plugin was not added.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// Another connected plugin has the same index and name.
    #[error("a plugin named {0} is already connected")]
    Duplicate(String),
}

/// The plugins in index order.
#[derive(Debug, Default)]
pub struct Registry {
    plugins: RwLock<Vec<Arc<Plugin>>>,
    mask: AtomicI32,
}

impl Registry {
    /// Adds a plugin at its place in index order.
    pub fn insert(&self, plugin: Arc<Plugin>) -> Result<(), RegistryError> {
        let mut all = self.plugins.write().unwrap_or_else(|p| p.into_inner());
        let key = plugin.order_key();
        if all.iter().any(|p| p.order_key() == key) {
            return Err(RegistryError::Duplicate(plugin.qualified_name()));
        }
        let at = all.partition_point(|p| p.order_key() < key);
        all.insert(at, plugin);
        self.recompute(&all);
        Ok(())
    }

    /// Removes a plugin (by connection identity); true if it was there.
    pub fn remove(&self, plugin: &Arc<Plugin>) -> bool {
        let mut all = self.plugins.write().unwrap_or_else(|p| p.into_inner());
        let before = all.len();
        all.retain(|p| !Arc::ptr_eq(p, plugin));
        self.recompute(&all);
        all.len() != before
    }

    fn recompute(&self, all: &[Arc<Plugin>]) {
        let mask = all.iter().fold(0, |m, p| m | p.conn.events().0);
        self.mask.store(mask, Ordering::Release);
    }

    /// True if any plugin subscribed to `event`: the fast path of every hook.
    pub fn any(&self, event: Event) -> bool {
        EventMask(self.mask.load(Ordering::Acquire)).contains(event)
    }

    /// The plugins subscribed to `event`, in index order.
    pub fn subscribed(&self, event: Event) -> Vec<Arc<Plugin>> {
        if !self.any(event) {
            return Vec::new();
        }
        let all = self.plugins.read().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter(|p| p.conn.subscribed(event))
            .cloned()
            .collect()
    }

    /// Every plugin, in index order.
    pub fn all(&self) -> Vec<Arc<Plugin>> {
        self.plugins
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
