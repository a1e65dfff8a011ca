//! Container environment: values, fieldRefs, resourceFieldRefs and
//! `$(VAR)` expansion.
