//! Generates the CRI v1 bindings from the vendored upstream `api.proto`
//! (third_party/cri-api, checked by `scripts/cri-proto.sh check`) and
//! Petrel's admin API from its own proto.

use std::path::PathBuf;

const CRI_PROTO: &str = "../../third_party/cri-api/v0.37.2/api.proto";

/// The field option upstream marks credentials with. Debian bookworm's
/// protoc (3.21) predates it (protobuf 22) and refuses the file, and prost
/// ignores it anyway: the option is dropped from a copy in OUT_DIR and its
/// meaning kept by hand (`AuthConfig`'s Debug, in lib.rs, redacts them).
const DEBUG_REDACT: &str = " [debug_redact = true]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={CRI_PROTO}");
    println!("cargo:rerun-if-changed=proto/admin.proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("cri-proto");
    std::fs::create_dir_all(&out)?;
    let text = std::fs::read_to_string(CRI_PROTO)?;
    let redacted = text.matches(DEBUG_REDACT).count();
    if redacted != 4 {
        return Err(format!(
            "{CRI_PROTO}: expected 4 fields with{DEBUG_REDACT}, found {redacted}: \
             check AuthConfig's Debug in crates/cri/src/lib.rs"
        )
        .into());
    }
    let copy = out.join("api.proto");
    std::fs::write(&copy, text.replace(DEBUG_REDACT, ""))?;
    // serde on every CRI type: the runtime keeps configs in its records as
    // JSON and `petrel ctl` prints messages as JSON. `default` on messages
    // so records written with an older CRI version (fewer fields) still read.
    tonic_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .message_attribute(".", "#[serde(default)]")
        .skip_debug(".runtime.v1.AuthConfig")
        .field_attribute(
            ".runtime.v1.KeyValue.value",
            "#[serde(with = \"crate::serde_bytes\")]",
        )
        .compile_protos(&[copy.as_path()], &[out.as_path()])?;
    tonic_build::configure()
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .compile_protos(&["proto/admin.proto"], &["proto"])?;
    Ok(())
}
