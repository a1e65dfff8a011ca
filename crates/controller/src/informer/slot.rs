//! The form a cached object is kept in: shared decoded, or encoded.
//!
//! k8s-openapi's types keep every optional field inline, so a decoded
//! object is an order of magnitude larger than its JSON: a PodSet whose
//! template has one container is about 5 KB decoded and under 0.5 KB
//! encoded (Go's structs hold absent fields as nil pointers). A cache of
//! many objects that are read far less often than they are held can keep
//! them encoded and decode on each read.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

/// How a [`Store`](super::Store) keeps its objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CacheForm {
    /// Decoded, behind the `Arc`s readers and handlers share: a read
    /// copies a pointer. The default.
    #[default]
    Shared,
    /// Encoded as JSON and decoded on each read (microseconds per object
    /// read; about a tenth of the memory for k8s-openapi types). Events
    /// still carry the decoded objects the watch delivered. An object that
    /// does not come back equal from its encoding (a type whose serde
    /// impls do not round-trip) is kept decoded, with one warning.
    Encoded,
}

/// One cached object.
pub(crate) enum Slot<K> {
    Shared(Arc<K>),
    Encoded(Arc<[u8]>),
}

impl<K> Slot<K> {
    /// The object (decoded with `codec` if encoded); `None` only if an
    /// encoded slot no longer decodes, which one made by [`Codec::slot`]
    /// cannot do.
    pub(crate) fn object(&self, codec: Option<&Codec<K>>) -> Option<Arc<K>> {
        match (self, codec) {
            (Self::Shared(o), _) => Some(o.clone()),
            (Self::Encoded(b), Some(c)) => match (c.decode)(b) {
                Ok(o) => Some(Arc::new(o)),
                Err(e) => {
                    tracing::error!(error = %e, "a cached object no longer decodes");
                    None
                }
            },
            (Self::Encoded(_), None) => None,
        }
    }
}

impl<K> Clone for Slot<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Shared(o) => Self::Shared(o.clone()),
            Self::Encoded(b) => Self::Encoded(b.clone()),
        }
    }
}

/// The cache's objects as they were at one moment, in the form they are
/// kept, for a handler added late: decoded one at a time as it takes
/// them, so an encoded cache is never all decoded at once.
pub(crate) struct Snapshot<K> {
    pub(crate) items: Vec<(String, Slot<K>)>,
    pub(crate) codec: Option<Codec<K>>,
}

/// A [`Snapshot`] being delivered: in order, except that a key can be
/// taken ahead (its handler got an event for it: the key's add must come
/// first).
pub(crate) struct Delivery<K> {
    items: Vec<Option<(String, Slot<K>)>>,
    /// key → index in `items`, for the keys not delivered yet.
    ahead: std::collections::HashMap<String, usize>,
    next: usize,
    codec: Option<Codec<K>>,
}

impl<K> From<Snapshot<K>> for Delivery<K> {
    fn from(s: Snapshot<K>) -> Self {
        let ahead = s
            .items
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Self {
            items: s.items.into_iter().map(Some).collect(),
            ahead,
            next: 0,
            codec: s.codec,
        }
    }
}

impl<K> Delivery<K> {
    /// The next object not delivered yet, decoded (one that no longer
    /// decodes is skipped, as a read would); `None` when all were.
    pub(crate) fn next(&mut self) -> Option<(String, Arc<K>)> {
        while self.next < self.items.len() {
            let i = self.next;
            self.next += 1;
            if let Some(found) = self.deliver(i) {
                return Some(found);
            }
        }
        None
    }

    /// The object of `key` if it is still to be delivered.
    pub(crate) fn take(&mut self, key: &str) -> Option<(String, Arc<K>)> {
        let i = *self.ahead.get(key)?;
        self.deliver(i)
    }

    fn deliver(&mut self, i: usize) -> Option<(String, Arc<K>)> {
        let (key, slot) = self.items.get_mut(i)?.take()?;
        self.ahead.remove(&key);
        let obj = slot.object(self.codec.as_ref())?;
        Some((key, obj))
    }

    /// Whether every object was delivered.
    pub(crate) fn is_done(&self) -> bool {
        self.next >= self.items.len()
    }
}

/// Encodes and decodes `K` (plain function pointers, so a store needs no
/// serde bounds of its own).
pub(crate) struct Codec<K> {
    encode: fn(&K) -> Option<Vec<u8>>,
    decode: fn(&[u8]) -> Result<K, serde_json::Error>,
    same: fn(&K, &K) -> bool,
}

impl<K> Clone for Codec<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Codec<K> {}

impl<K: Serialize + DeserializeOwned + PartialEq> Codec<K> {
    /// JSON, as the API server speaks it.
    pub(crate) fn json() -> Self {
        Self {
            encode: |o| serde_json::to_vec(o).ok(),
            decode: |b| serde_json::from_slice(b),
            same: |a, b| a == b,
        }
    }
}

impl<K> Codec<K> {
    /// The slot for `obj`: encoded if its encoding decodes back equal.
    pub(crate) fn slot(&self, obj: &Arc<K>) -> Result<Slot<K>, Slot<K>> {
        match (self.encode)(obj) {
            Some(bytes) if (self.decode)(&bytes).is_ok_and(|back| (self.same)(&back, obj)) => {
                Ok(Slot::Encoded(bytes.into()))
            }
            _ => Err(Slot::Shared(obj.clone())),
        }
    }
}
