//! spec (being written).
