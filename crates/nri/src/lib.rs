//! placeholder
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}
