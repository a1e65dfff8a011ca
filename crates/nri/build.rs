//! Generates the NRI message types from `proto/nri.proto` with prost.
//! Only messages are generated: the two ttRPC services are dispatched by hand in
//! `src/api.rs` (method-name constants) so no RPC framework is needed at build time.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nri.proto");
    prost_build::Config::new().compile_protos(&["proto/nri.proto"], &["proto"])?;
    Ok(())
}
