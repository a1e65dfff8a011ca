//! runc (being written).
