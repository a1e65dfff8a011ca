//! Petrel CRI runtime (being written).
