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
/// kept: a handler added late gets them decoded one at a time as it takes
/// them, so an encoded cache is never all decoded at once.
pub(crate) struct Snapshot<K> {
    pub(crate) items: Vec<(String, Slot<K>)>,
    pub(crate) codec: Option<Codec<K>>,
}

impl<K> Snapshot<K> {
    /// The objects with their keys, each decoded as it is taken (one that
    /// no longer decodes is left out, as a read would).
    pub(crate) fn into_objects(self) -> impl Iterator<Item = (String, Arc<K>)> {
        let codec = self.codec;
        self.items
            .into_iter()
            .filter_map(move |(key, slot)| slot.object(codec.as_ref()).map(|o| (key, o)))
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
