//! cgroups (being written).
