//! `image export REF FILE`: the runtime writes the image as an OCI
//! image-layout archive that `image import` and `skopeo copy oci-archive:`
//! read.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use petrel_cri::admin::{ExportImageRequest, ExportImageResponse};

use super::super::error::CtlError;
use super::super::output::{self, emit, Format};
use super::super::Ctl;
use super::IMPORT_TIMEOUT;

/// Flags of `image export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Image reference or id.
    reference: String,
    /// The archive to write (the runtime writes it: it lands on the
    /// runtime's host; an existing file is replaced).
    file: PathBuf,
}

/// `image export`.
pub async fn export(ctl: &Ctl, args: ExportArgs) -> Result<ExitCode, CtlError> {
    let path = absolute(&args.file)?;
    let mut admin = ctl.admin().await?;
    let req = ExportImageRequest {
        image: args.reference.clone(),
        path: path.display().to_string(),
    };
    let limit = Some(
        ctl.timeout
            .map_or(IMPORT_TIMEOUT, |t| t.max(IMPORT_TIMEOUT)),
    );
    let what = format!("export image {}", args.reference);
    let resp = ctl
        .call_within(limit, what, admin.export_image(req))
        .await?;
    match ctl.format_or(Format::Table) {
        Format::Table => emit(&exported_text(&args.reference, &path, &resp))?,
        f => output::print_structured(f, &resp)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `file` made absolute against the current directory (it need not exist
/// yet; its directory must).
fn absolute(file: &Path) -> Result<PathBuf, CtlError> {
    let name = file
        .file_name()
        .ok_or_else(|| CtlError::Other(format!("{} does not name a file", file.display())))?;
    let dir = match file.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from("."),
    };
    let dir = std::fs::canonicalize(&dir).map_err(|source| CtlError::Io {
        what: "find export directory",
        path: dir.clone(),
        source,
    })?;
    Ok(dir.join(name))
}

fn exported_text(reference: &str, path: &Path, resp: &ExportImageResponse) -> String {
    format!(
        "Exported {reference} as {} to {} ({})\n",
        output::short_id(&resp.id),
        path.display(),
        output::human_size(resp.size)
    )
}

#[cfg(test)]
// A failed expectation is a failed test.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn absolute_should_resolve_the_directory_and_keep_the_name() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let p = absolute(&dir.path().join("out.tar")).expect("absolute");
        assert!(p.is_absolute());
        assert!(p.ends_with("out.tar"));
        assert!(absolute(&dir.path().join("missing/out.tar")).is_err());
    }
}
