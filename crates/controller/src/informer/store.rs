//! The informer's local cache: objects by key, and the indexes over them.
//!
//! Objects are kept as `Arc`s ([`CacheForm::Shared`]): a read clones
//! pointers, never objects, and the handlers get the same `Arc`s. Or
//! encoded ([`CacheForm::Encoded`]): a read decodes, outside the lock. One
//! `RwLock`; writers are the reflector only, readers are any number of
//! controllers.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::index::{IndexFn, Indexers};
use super::slot::{CacheForm, Codec, Slot, Snapshot};
use super::InformerError;

/// The key of an object: `namespace/name`, or `name` for cluster-scoped
/// objects (client-go's `MetaNamespaceKeyFunc`).
pub fn object_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

struct Inner<K> {
    items: HashMap<String, Slot<K>>,
    fns: HashMap<String, IndexFn<K>>,
    /// index name → value → keys.
    indices: HashMap<String, HashMap<String, HashSet<String>>>,
}

/// A thread-safe, indexed cache of objects (cloning shares it).
pub struct Store<K> {
    inner: Arc<RwLock<Inner<K>>>,
    /// Set for [`CacheForm::Encoded`].
    codec: Option<Codec<K>>,
    /// Whether an object that does not round-trip was reported.
    warned: Arc<AtomicBool>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            codec: self.codec,
            warned: self.warned.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Store<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("len", &self.len()).finish()
    }
}

impl<K: Serialize + DeserializeOwned + PartialEq> Store<K> {
    /// An empty store with these indexes, keeping objects in `form`.
    pub fn with_form(indexers: Indexers<K>, form: CacheForm) -> Self {
        let mut store = Self::new(indexers);
        if form == CacheForm::Encoded {
            store.codec = Some(Codec::json());
        }
        store
    }
}

impl<K> Store<K> {
    /// An empty store with these indexes, objects shared decoded.
    pub fn new(indexers: Indexers<K>) -> Self {
        Self {
            codec: None,
            warned: Arc::new(AtomicBool::new(false)),
            inner: Arc::new(RwLock::new(Inner {
                items: HashMap::new(),
                indices: indexers
                    .fns
                    .keys()
                    .map(|n| (n.clone(), HashMap::new()))
                    .collect(),
                fns: indexers.fns,
            })),
        }
    }

    /// Adds indexes (a shared informer's later users may need their own),
    /// computed at once over the cached objects; an index of the same name
    /// is replaced.
    pub fn add_indexers(&self, indexers: Indexers<K>) {
        let mut inner = self.write();
        for (name, f) in indexers.fns {
            let mut idx: HashMap<String, HashSet<String>> = HashMap::new();
            for (key, slot) in &inner.items {
                let Some(obj) = slot.object(self.codec.as_ref()) else {
                    continue;
                };
                for v in f(&obj) {
                    idx.entry(v).or_default().insert(key.clone());
                }
            }
            inner.indices.insert(name.clone(), idx);
            inner.fns.insert(name, f);
        }
    }

    // A writer that panicked mid-update cannot leave a half-made entry the
    // readers could trip on (every update is a few map operations), so a
    // poisoned lock is used as it is.
    fn read(&self) -> RwLockReadGuard<'_, Inner<K>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner<K>> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the store has an index named `name`.
    pub fn has_index(&self, name: &str) -> bool {
        self.read().fns.contains_key(name)
    }

    /// The object under `key` (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        let slot = self.read().items.get(key).cloned();
        slot.and_then(|s| s.object(self.codec.as_ref()))
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        let slots: Vec<Slot<K>> = self.read().items.values().cloned().collect();
        self.objects(&slots)
    }

    /// The objects in `slots`, decoded outside the lock.
    fn objects(&self, slots: &[Slot<K>]) -> Vec<Arc<K>> {
        slots
            .iter()
            .filter_map(|s| s.object(self.codec.as_ref()))
            .collect()
    }

    /// Every object with its key, as kept (decoded only as it is taken).
    pub(crate) fn snapshot(&self) -> Snapshot<K> {
        let items = self
            .read()
            .items
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        Snapshot {
            items,
            codec: self.codec,
        }
    }

    /// Whether objects are kept encoded ([`CacheForm::Encoded`]).
    pub(crate) fn is_encoded(&self) -> bool {
        self.codec.is_some()
    }

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.read().items.keys().cloned().collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.read().items.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects indexed under `value` in the index `index`.
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<K>>, InformerError> {
        let slots: Vec<Slot<K>> = {
            let inner = self.read();
            let idx = inner
                .indices
                .get(index)
                .ok_or_else(|| InformerError::NoSuchIndex(index.to_string()))?;
            idx.get(value)
                .into_iter()
                .flatten()
                .filter_map(|k| inner.items.get(k).cloned())
                .collect()
        };
        Ok(self.objects(&slots))
    }

    /// The keys indexed under `value` in the index `index`.
    pub fn index_keys(&self, index: &str, value: &str) -> Result<Vec<String>, InformerError> {
        let inner = self.read();
        let idx = inner
            .indices
            .get(index)
            .ok_or_else(|| InformerError::NoSuchIndex(index.to_string()))?;
        Ok(idx.get(value).into_iter().flatten().cloned().collect())
    }

    /// Puts `obj` under `key`; returns the object it replaced.
    pub(crate) fn put(&self, key: &str, obj: Arc<K>) -> Option<Arc<K>> {
        let slot = match &self.codec {
            None => Slot::Shared(obj.clone()),
            Some(codec) => codec.slot(&obj).unwrap_or_else(|kept| {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        key,
                        "an object does not come back equal from its JSON: such objects are cached decoded"
                    );
                }
                kept
            }),
        };
        let mut inner = self.write();
        let old = inner
            .items
            .insert(key.to_string(), slot)
            .and_then(|s| s.object(self.codec.as_ref()));
        reindex(&mut inner, key, old.as_deref(), Some(&obj));
        old
    }

    /// Removes `key`; returns the object it held.
    pub(crate) fn remove(&self, key: &str) -> Option<Arc<K>> {
        let mut inner = self.write();
        let old = inner
            .items
            .remove(key)
            .and_then(|s| s.object(self.codec.as_ref()));
        if let Some(o) = &old {
            reindex(&mut inner, key, Some(o), None);
        }
        old
    }
}

fn reindex<K>(inner: &mut Inner<K>, key: &str, old: Option<&K>, new: Option<&K>) {
    let Inner { fns, indices, .. } = inner;
    {
        for (name, f) in fns.iter() {
            let before: HashSet<String> = old.map(|o| f(o)).into_iter().flatten().collect();
            let after: HashSet<String> = new.map(|o| f(o)).into_iter().flatten().collect();
            if before == after {
                continue;
            }
            let idx = indices.entry(name.clone()).or_default();
            for v in before.difference(&after) {
                if let Some(keys) = idx.get_mut(v) {
                    keys.remove(key);
                    if keys.is_empty() {
                        idx.remove(v);
                    }
                }
            }
            for v in after.difference(&before) {
                idx.entry(v.clone()).or_default().insert(key.to_string());
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Pod, PodSpec};
    use kube::api::ObjectMeta;

    use super::*;
    use crate::informer::index::{LABEL, NAMESPACE};

    fn pod(ns: &str, name: &str, node: &str, labels: &[(&str, &str)]) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        })
    }

    fn store() -> Store<Pod> {
        store_in(CacheForm::Shared)
    }

    fn store_in(form: CacheForm) -> Store<Pod> {
        Store::with_form(
            Indexers::standard()
                .field("node", |p: &Pod| {
                    p.spec.as_ref().and_then(|s| s.node_name.clone())
                })
                .custom("name-len", |p: &Pod| {
                    vec![p.metadata.name.as_deref().unwrap_or("").len().to_string()]
                }),
            form,
        )
    }

    fn names(mut v: Vec<Arc<Pod>>) -> Vec<String> {
        let mut n: Vec<String> = v
            .drain(..)
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn store_should_answer_every_index_and_follow_updates_and_deletes() {
        for form in [CacheForm::Shared, CacheForm::Encoded] {
            every_index_should_follow_updates_and_deletes(store_in(form));
        }
    }

    fn every_index_should_follow_updates_and_deletes(s: Store<Pod>) {
        for p in [
            pod("a", "p1", "n1", &[("app", "web")]),
            pod("a", "p2", "n2", &[("app", "db")]),
            pod("b", "p3", "n1", &[("app", "web"), ("tier", "x")]),
        ] {
            s.put(&object_key(p.as_ref()), p);
        }
        assert_eq!(
            names(s.by_index(NAMESPACE, "a").expect("index")),
            ["p1", "p2"]
        );
        assert_eq!(
            names(s.by_index(LABEL, "app=web").expect("index")),
            ["p1", "p3"]
        );
        assert_eq!(
            names(s.by_index("node", "n1").expect("index")),
            ["p1", "p3"]
        );
        assert_eq!(names(s.by_index("name-len", "2").expect("index")).len(), 3);
        // p1 moves to n2 and loses its label; p3 goes.
        s.put("a/p1", pod("a", "p1", "n2", &[]));
        s.remove("b/p3");
        assert!(s.by_index("node", "n1").expect("index").is_empty());
        assert!(s.by_index(LABEL, "app=web").expect("index").is_empty());
        assert_eq!(
            names(s.by_index("node", "n2").expect("index")),
            ["p1", "p2"]
        );
        assert!(s.by_index(NAMESPACE, "b").expect("index").is_empty());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn store_should_refuse_an_unknown_index_by_name() {
        let err = store().by_index("nope", "x").expect_err("no such index");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn store_should_share_objects_not_copy_them() {
        let s = store();
        let p = pod("a", "p1", "n1", &[]);
        s.put("a/p1", p.clone());
        let got = s.get("a/p1").expect("cached");
        assert!(Arc::ptr_eq(&got, &p));
        assert_eq!(object_key(p.as_ref()), "a/p1");
    }

    #[test]
    fn an_encoded_store_should_keep_bytes_and_give_back_equal_objects() {
        let s = store_in(CacheForm::Encoded);
        let p = pod("a", "p1", "n1", &[("app", "web")]);
        assert!(s.put("a/p1", p.clone()).is_none());
        assert!(matches!(s.read().items.get("a/p1"), Some(Slot::Encoded(_))));
        let got = s.get("a/p1").expect("cached");
        assert_eq!(got, p);
        assert!(!Arc::ptr_eq(&got, &p), "decoded on read, not shared");
        // The replaced and the removed object come back decoded.
        let old = s.put("a/p1", pod("a", "p1", "n2", &[])).expect("replaced");
        assert_eq!(old, p);
        let gone = s.remove("a/p1").expect("removed");
        assert_eq!(
            gone.spec.as_ref().and_then(|x| x.node_name.as_deref()),
            Some("n2")
        );
        assert!(s.is_empty());
    }

    /// A type whose JSON drops a field: it cannot come back equal.
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Lossy {
        kept: String,
        #[serde(skip_serializing, default)]
        dropped: String,
    }

    #[test]
    fn an_encoded_store_should_keep_what_does_not_round_trip_decoded() {
        let s = Store::with_form(Indexers::default(), CacheForm::Encoded);
        let whole = Arc::new(Lossy {
            kept: "a".into(),
            dropped: "b".into(),
        });
        s.put("x", whole.clone());
        assert!(matches!(s.read().items.get("x"), Some(Slot::Shared(_))));
        assert!(Arc::ptr_eq(&s.get("x").expect("cached"), &whole));
        // One without the lossy field round-trips and is encoded.
        s.put(
            "y",
            Arc::new(Lossy {
                kept: "c".into(),
                dropped: String::new(),
            }),
        );
        assert!(matches!(s.read().items.get("y"), Some(Slot::Encoded(_))));
        assert_eq!(s.len(), 2);
    }
}
