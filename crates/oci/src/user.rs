//! user (being written).
