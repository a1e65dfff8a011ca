//! Petrel image store (being written).
