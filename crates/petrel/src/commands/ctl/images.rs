//! Image commands: `images`, `inspecti`, `image import|export|prune|gc`,
//! `rmi` and `imagefsinfo`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use petrel_cri::admin::{
    GarbageCollectImagesRequest, GarbageCollectImagesResponse, ImportImageRequest,
    ImportImageResponse,
};
use petrel_cri::api::{
    FilesystemUsage, Image, ImageFilter, ImageFsInfoRequest, ImageFsInfoResponse, ImageSpec,
    ImageStatusRequest, ListImagesRequest, RemoveImageRequest,
};

mod export;

use super::error::CtlError;
use super::output::{self, emit, Format, StatusDoc, Table};
use super::{Ctl, Outcome};

/// The least time an import may take: unpacking a large archive is slow.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(600);

/// Flags of `images`.
#[derive(Debug, Args)]
pub struct ImagesArgs {
    /// Only images matching this reference.
    reference: Option<String>,
    /// Print only image ids.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Show full ids.
    #[arg(long)]
    no_trunc: bool,
}

/// `images`: lists images, sorted by repository and tag.
pub async fn list(ctl: &Ctl, args: ImagesArgs) -> Result<ExitCode, CtlError> {
    let mut svc = ctl.images().await?;
    let filter = args.reference.as_ref().map(|r| ImageFilter {
        image: Some(spec(r)),
    });
    let resp = ctl
        .call("list images", svc.list_images(ListImagesRequest { filter }))
        .await?;
    if args.quiet {
        emit(
            &resp
                .images
                .iter()
                .map(|i| format!("{}\n", i.id))
                .collect::<String>(),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    match ctl.format_or(Format::Table) {
        Format::Table => images_table(&resp.images, args.no_trunc).print()?,
        f => output::print_structured(f, &resp)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn spec(reference: &str) -> ImageSpec {
    ImageSpec {
        image: reference.to_string(),
        ..Default::default()
    }
}

fn images_table(images: &[Image], no_trunc: bool) -> Table {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for image in images {
        let id = if no_trunc {
            image.id.clone()
        } else {
            output::short_id(&image.id).to_string()
        };
        let size = output::human_size(image.size);
        for (repo, tag) in names(image) {
            rows.push(vec![repo, tag, id.clone(), size.clone()]);
        }
    }
    rows.sort();
    let mut t = Table::new(&["IMAGE", "TAG", "IMAGE ID", "SIZE"]);
    for row in rows {
        t.push(row);
    }
    t
}

/// The (repository, tag) pairs an image is listed under: one per tag, or
/// its digested repository with tag `<none>`, or `<none> <none>`.
fn names(image: &Image) -> Vec<(String, String)> {
    if !image.repo_tags.is_empty() {
        return image.repo_tags.iter().map(|t| split_tag(t)).collect();
    }
    if let Some(digested) = image.repo_digests.first() {
        let repo = digested
            .split_once('@')
            .map_or(digested.as_str(), |(r, _)| r);
        return vec![(repo.to_string(), "<none>".into())];
    }
    vec![("<none>".into(), "<none>".into())]
}

/// Splits `repo:tag`; a colon before the last `/` belongs to a registry port.
fn split_tag(reference: &str) -> (String, String) {
    let name_start = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[name_start..].rfind(':') {
        Some(i) => {
            let at = name_start + i;
            (reference[..at].to_string(), reference[at + 1..].to_string())
        }
        None => (reference.to_string(), "<none>".into()),
    }
}

/// Flags of `inspecti`.
#[derive(Debug, Args)]
pub struct InspectiArgs {
    /// Image reference or id.
    reference: String,
}

/// `inspecti`: the verbose ImageStatus of one image (JSON by default).
pub async fn inspect(ctl: &Ctl, args: InspectiArgs) -> Result<ExitCode, CtlError> {
    let mut svc = ctl.images().await?;
    let req = ImageStatusRequest {
        image: Some(spec(&args.reference)),
        verbose: true,
    };
    let what = format!("get status of image {}", args.reference);
    let resp = ctl.call(what, svc.image_status(req)).await?;
    let Some(image) = &resp.image else {
        return Err(CtlError::Other(format!(
            "image {} not found",
            args.reference
        )));
    };
    match ctl.format_or(Format::Json) {
        Format::Table => images_table(std::slice::from_ref(image), true).print()?,
        f => {
            let doc = StatusDoc {
                status: output::to_value(image)?,
                info: output::info_value(&resp.info),
            };
            output::print_structured(f, &doc)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `image` subcommands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Import an OCI image-layout or docker archive from a local file.
    Import(ImportArgs),
    /// Write an image as an OCI image-layout archive (on the runtime's
    /// host), readable by `image import` and `skopeo copy oci-archive:`.
    Export(export::ExportArgs),
    /// Remove every image no container uses.
    Prune,
    /// Kubelet's image GC: unused images, least recently used first, while
    /// the image filesystem is above --high percent, down to --low.
    Gc(GcArgs),
}

/// Flags of `image import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The archive (the runtime reads it: it must be on the runtime's host).
    file: PathBuf,
    /// Also tag the imported image with this reference (repeatable).
    #[arg(long = "tag")]
    tags: Vec<String>,
}

/// Dispatches `image` subcommands.
pub async fn image(ctl: &Ctl, command: ImageCommand) -> Result<ExitCode, CtlError> {
    match command {
        ImageCommand::Import(args) => import(ctl, args).await,
        ImageCommand::Export(args) => export::export(ctl, args).await,
        ImageCommand::Prune => prune(ctl).await,
        ImageCommand::Gc(args) => {
            let req = GarbageCollectImagesRequest {
                prune: false,
                high_threshold_percent: args.high,
                low_threshold_percent: args.low,
            };
            gc(ctl, req).await
        }
    }
}

async fn import(ctl: &Ctl, args: ImportArgs) -> Result<ExitCode, CtlError> {
    let path = absolute(&args.file)?;
    let mut admin = ctl.admin().await?;
    let req = ImportImageRequest {
        path: path.display().to_string(),
        tags: args.tags,
    };
    let limit = Some(
        ctl.timeout
            .map_or(IMPORT_TIMEOUT, |t| t.max(IMPORT_TIMEOUT)),
    );
    let what = format!("import image archive {}", path.display());
    let resp = ctl
        .call_within(limit, what, admin.import_image(req))
        .await?;
    match ctl.format_or(Format::Table) {
        Format::Table => emit(&imported_text(&resp))?,
        f => output::print_structured(f, &resp)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The archive path as the runtime must see it: absolute and existing.
fn absolute(file: &Path) -> Result<PathBuf, CtlError> {
    std::fs::canonicalize(file).map_err(|source| CtlError::Io {
        what: "find image archive",
        path: file.to_path_buf(),
        source,
    })
}

fn imported_text(resp: &ImportImageResponse) -> String {
    resp.images
        .iter()
        .map(|i| {
            let names = if i.repo_tags.is_empty() {
                "<none>".to_string()
            } else {
                i.repo_tags.join(", ")
            };
            format!(
                "Imported {} {} ({})\n",
                output::short_id(&i.id),
                names,
                output::human_size(i.size)
            )
        })
        .collect()
}

/// Flags of `rmi`.
#[derive(Debug, Args)]
pub struct RmiArgs {
    /// Image references or ids.
    #[arg(required_unless_present_any = ["all", "prune"])]
    references: Vec<String>,
    /// Remove every image (those in use by a container fail).
    #[arg(short = 'a', long, conflicts_with = "prune")]
    all: bool,
    /// Remove every image no container uses.
    #[arg(short = 'q', long)]
    prune: bool,
}

/// `rmi`: removes each reference with docker's untag semantics (one of
/// several tags removes that tag; an id, digest or last tag removes the
/// image) and names what went.
pub async fn remove(ctl: &Ctl, args: RmiArgs) -> Result<ExitCode, CtlError> {
    if args.prune {
        return prune(ctl).await;
    }
    let references = if args.all {
        let mut svc = ctl.images().await?;
        let resp = ctl
            .call(
                "list images",
                svc.list_images(ListImagesRequest { filter: None }),
            )
            .await?;
        resp.images.into_iter().map(|i| i.id).collect()
    } else {
        args.references
    };
    let mut outcome = Outcome::default();
    for reference in &references {
        if let Some(lines) = outcome.note(remove_one(ctl, reference).await) {
            emit(&lines)?;
        }
    }
    Ok(outcome.exit_code())
}

/// Removes what `reference` names; returns "Untagged: ..." or "Deleted:
/// ..." lines.
async fn remove_one(ctl: &Ctl, reference: &str) -> Result<String, CtlError> {
    let mut svc = ctl.images().await?;
    let what = format!("get status of image {reference}");
    // RemoveImage succeeds for unknown images; say so instead.
    let Some(before) = ctl
        .call(what, svc.image_status(status_req(reference)))
        .await?
        .image
    else {
        return Err(CtlError::Other(format!("no such image {reference}")));
    };
    let req = RemoveImageRequest {
        image: Some(spec(reference)),
    };
    ctl.call(format!("remove image {reference}"), svc.remove_image(req))
        .await?;
    let what = format!("get status of image {}", before.id);
    let after = ctl
        .call(what, svc.image_status(status_req(&before.id)))
        .await?
        .image;
    Ok(removal_text(&before, after.as_ref()))
}

fn status_req(reference: &str) -> ImageStatusRequest {
    ImageStatusRequest {
        image: Some(spec(reference)),
        verbose: false,
    }
}

/// What a removal did, from the image before and after it.
fn removal_text(before: &Image, after: Option<&Image>) -> String {
    match after {
        Some(after) => before
            .repo_tags
            .iter()
            .filter(|t| !after.repo_tags.contains(t))
            .map(|t| format!("Untagged: {t}\n"))
            .collect(),
        None => deleted_text(&before.id, &before.repo_tags),
    }
}

fn deleted_text(id: &str, tags: &[String]) -> String {
    if tags.is_empty() {
        format!("Deleted: {id}\n")
    } else {
        tags.iter().map(|t| format!("Deleted: {t}\n")).collect()
    }
}

/// `image prune` / `rmi --prune`: removes every image no container uses.
async fn prune(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    gc(
        ctl,
        GarbageCollectImagesRequest {
            prune: true,
            ..Default::default()
        },
    )
    .await
}

async fn gc(ctl: &Ctl, req: GarbageCollectImagesRequest) -> Result<ExitCode, CtlError> {
    let mut admin = ctl.admin().await?;
    let limit = Some(
        ctl.timeout
            .map_or(IMPORT_TIMEOUT, |t| t.max(IMPORT_TIMEOUT)),
    );
    let resp = ctl
        .call_within(
            limit,
            "garbage collect images",
            admin.garbage_collect_images(req),
        )
        .await?;
    match ctl.format_or(Format::Table) {
        Format::Table => emit(&gc_text(&resp))?,
        f => output::print_structured(f, &resp)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn gc_text(resp: &GarbageCollectImagesResponse) -> String {
    let mut out: String = resp
        .removed
        .iter()
        .map(|i| deleted_text(&i.id, &i.repo_tags))
        .collect();
    out.push_str(&format!(
        "Total reclaimed space: {}\n",
        output::human_size(resp.freed_bytes)
    ));
    out
}

/// Flags of `image gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Collect only when the image filesystem is more than this percent used.
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u32).range(0..=100))]
    high: u32,
    /// Collect until usage is below this percent.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(0..=100))]
    low: u32,
}

/// `imagefsinfo`: usage of the filesystems holding images and containers.
pub async fn fs_info(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut svc = ctl.images().await?;
    let resp = ctl
        .call(
            "get image filesystem info",
            svc.image_fs_info(ImageFsInfoRequest {}),
        )
        .await?;
    match ctl.format_or(Format::Table) {
        Format::Table => fs_table(&resp).print()?,
        f => output::print_structured(f, &resp)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn fs_table(resp: &ImageFsInfoResponse) -> Table {
    let mut t = Table::new(&["FILESYSTEM", "MOUNTPOINT", "USED", "INODES"]);
    let rows = resp
        .image_filesystems
        .iter()
        .map(|f| ("image", f))
        .chain(resp.container_filesystems.iter().map(|f| ("container", f)));
    for (kind, fs) in rows {
        t.push(fs_row(kind, fs));
    }
    t
}

fn fs_row(kind: &str, fs: &FilesystemUsage) -> Vec<String> {
    let mountpoint = fs.fs_id.as_ref().map_or("", |i| i.mountpoint.as_str());
    vec![
        kind.to_string(),
        mountpoint.to_string(),
        fs.used_bytes
            .as_ref()
            .map_or("-".into(), |b| output::human_size(b.value)),
        fs.inodes_used
            .as_ref()
            .map_or("-".into(), |i| i.value.to_string()),
    ]
}

#[cfg(test)]
// A failed expectation is a failed test.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use petrel_cri::api::{FilesystemIdentifier, UInt64Value};

    fn image(id: &str, tags: &[&str], digests: &[&str], size: u64) -> Image {
        Image {
            id: id.into(),
            repo_tags: tags.iter().map(|s| s.to_string()).collect(),
            repo_digests: digests.iter().map(|s| s.to_string()).collect(),
            size,
            ..Default::default()
        }
    }

    #[test]
    fn split_tag_should_ignore_registry_ports() {
        assert_eq!(
            split_tag("localhost:5000/busybox:1.36"),
            ("localhost:5000/busybox".into(), "1.36".into())
        );
        assert_eq!(
            split_tag("localhost:5000/busybox"),
            ("localhost:5000/busybox".into(), "<none>".into())
        );
    }

    #[test]
    fn images_table_should_list_each_tag_and_untagged_as_none() {
        let images = [
            image(
                "sha256:1111111111111111aaaa",
                &[
                    "docker.io/petrel/busybox:latest",
                    "docker.io/petrel/busybox:1",
                ],
                &[],
                2_100_000,
            ),
            image(
                "sha256:2222222222222222bbbb",
                &[],
                &["docker.io/library/alpine@sha256:ffff"],
                5_000,
            ),
            image("sha256:3333333333333333", &[], &[], 1),
        ];
        let text = images_table(&images, false).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "IMAGE                     TAG     IMAGE ID       SIZE"
        );
        assert_eq!(
            lines[1],
            "<none>                    <none>  3333333333333  1B"
        );
        assert_eq!(
            lines[2],
            "docker.io/library/alpine  <none>  2222222222222  5kB"
        );
        assert_eq!(
            lines[3],
            "docker.io/petrel/busybox  1       1111111111111  2.1MB"
        );
        assert_eq!(
            lines[4],
            "docker.io/petrel/busybox  latest  1111111111111  2.1MB"
        );
    }

    #[test]
    fn removal_text_should_name_untagged_tags_or_deleted_names() {
        let before = image("sha256:aa", &["d/a:1", "d/a:2"], &[], 1);
        let after = image("sha256:aa", &["d/a:1"], &[], 1);
        assert_eq!(removal_text(&before, Some(&after)), "Untagged: d/a:2\n");
        assert_eq!(
            removal_text(&before, None),
            "Deleted: d/a:1\nDeleted: d/a:2\n"
        );
        let untagged = image("sha256:bb", &[], &[], 1);
        assert_eq!(removal_text(&untagged, None), "Deleted: sha256:bb\n");
    }

    #[test]
    fn fs_table_should_show_both_filesystems() {
        let fs = FilesystemUsage {
            timestamp: 1,
            fs_id: Some(FilesystemIdentifier {
                mountpoint: "/var/lib/petrel".into(),
            }),
            used_bytes: Some(UInt64Value { value: 1_500_000 }),
            inodes_used: None,
        };
        let resp = ImageFsInfoResponse {
            image_filesystems: vec![fs.clone()],
            container_filesystems: vec![fs],
        };
        let text = fs_table(&resp).render();
        assert!(
            text.contains("\nimage       /var/lib/petrel  1.5MB  -\n"),
            "{text}"
        );
        assert!(
            text.contains("\ncontainer   /var/lib/petrel  1.5MB  -\n"),
            "{text}"
        );
    }

    #[test]
    fn absolute_should_resolve_relative_paths_and_name_missing_files() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("a.tar");
        std::fs::write(&file, b"x").expect("write archive");
        assert_eq!(absolute(&file).ok().map(|p| p.is_absolute()), Some(true));
        let missing = absolute(Path::new("no-such-archive.tar"));
        let text = missing.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("no-such-archive.tar"), "{text}");
    }
}
