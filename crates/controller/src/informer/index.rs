//! Index functions: each maps an object to the values it is found under.
//!
//! The store keeps, per index, value → keys; built-ins index by namespace,
//! by label (`key=value`, one entry per label) and by a field picked by an
//! extractor (e.g. `spec.nodeName`); any other function can be added.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use kube::Resource;

/// An index function: the values an object is indexed under.
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// The name of the built-in namespace index.
pub const NAMESPACE: &str = "namespace";
/// The name of the built-in label index (values `key=value`).
pub const LABEL: &str = "label";

/// The index functions of one store, by name.
pub struct Indexers<K> {
    pub(crate) fns: HashMap<String, IndexFn<K>>,
}

impl<K> Clone for Indexers<K> {
    fn clone(&self) -> Self {
        Self {
            fns: self.fns.clone(),
        }
    }
}

impl<K> fmt::Debug for Indexers<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.fns.keys().collect();
        names.sort();
        f.debug_struct("Indexers").field("names", &names).finish()
    }
}

impl<K> Default for Indexers<K> {
    fn default() -> Self {
        Self {
            fns: HashMap::new(),
        }
    }
}

impl<K: Resource + 'static> Indexers<K> {
    /// The namespace ([`NAMESPACE`]) and label ([`LABEL`]) indexes.
    #[must_use]
    pub fn standard() -> Self {
        Self::default().namespace().labels()
    }

    /// Indexes by namespace, under [`NAMESPACE`] (cluster-scoped objects
    /// under the empty string).
    #[must_use]
    pub fn namespace(self) -> Self {
        self.custom(NAMESPACE, |o: &K| {
            vec![o.meta().namespace.clone().unwrap_or_default()]
        })
    }

    /// Indexes by label, under [`LABEL`]: one value `key=value` per label.
    #[must_use]
    pub fn labels(self) -> Self {
        self.custom(LABEL, |o: &K| {
            o.meta()
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
    }

    /// Indexes under `name` by one field picked by `extract` (`None`: the
    /// object is not indexed), e.g. a pod's `spec.nodeName`.
    #[must_use]
    pub fn field<F>(self, name: &str, extract: F) -> Self
    where
        F: Fn(&K) -> Option<String> + Send + Sync + 'static,
    {
        self.custom(name, move |o: &K| extract(o).into_iter().collect())
    }
}

impl<K> Indexers<K> {
    /// Keeps only the indexes `keep` accepts by name.
    #[must_use]
    pub(crate) fn retain(mut self, keep: impl Fn(&str) -> bool) -> Self {
        self.fns.retain(|name, _| keep(name));
        self
    }

    /// Adds (or replaces) the index `name` computed by `f`.
    #[must_use]
    pub fn custom<F>(mut self, name: &str, f: F) -> Self
    where
        F: Fn(&K) -> Vec<String> + Send + Sync + 'static,
    {
        self.fns.insert(name.to_string(), Arc::new(f));
        self
    }
}
