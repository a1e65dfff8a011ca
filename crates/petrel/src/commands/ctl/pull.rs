//! `pull`: PullImage with optional credentials; prints the image id.
//!
//! Progress per layer needs a streaming call the CRI does not have; until
//! Petrel's admin API reports pull progress, `pull` prints the result only.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use petrel_cri::api::{AuthConfig, ImageSpec, PullImageRequest};

use super::error::CtlError;
use super::output::emit;
use super::Ctl;

/// Pulls take minutes on slow links; `--timeout` shorter than this is
/// raised to it (0 still means no limit).
const MIN_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// Flags of `pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// Image reference (`busybox`, `registry.k8s.io/pause:3.9`,
    /// `name@sha256:...`).
    reference: String,
    /// Registry credentials as `user:password`.
    #[arg(long, value_name = "USER:PASS")]
    creds: Option<String>,
    /// A registry bearer token (sent as is).
    #[arg(long, conflicts_with = "creds")]
    registry_token: Option<String>,
    /// Print only the image id.
    #[arg(short, long)]
    quiet: bool,
}

/// Splits `user:password` (the password may contain ':').
fn auth(args: &PullArgs) -> Result<Option<AuthConfig>, CtlError> {
    if let Some(t) = &args.registry_token {
        return Ok(Some(AuthConfig {
            registry_token: t.clone(),
            ..Default::default()
        }));
    }
    let Some(c) = &args.creds else {
        return Ok(None);
    };
    match c.split_once(':') {
        Some((u, p)) if !u.is_empty() => Ok(Some(AuthConfig {
            username: u.to_string(),
            password: p.to_string(),
            ..Default::default()
        })),
        _ => Err(CtlError::Usage("--creds must be USER:PASSWORD".to_string())),
    }
}

/// `pull REF`: pulls the image and prints its id.
pub async fn pull(ctl: &Ctl, args: PullArgs) -> Result<ExitCode, CtlError> {
    let req = PullImageRequest {
        image: Some(ImageSpec {
            image: args.reference.clone(),
            ..Default::default()
        }),
        auth: auth(&args)?,
        sandbox_config: None,
    };
    let mut svc = ctl.images().await?;
    let limit = ctl.timeout.map(|t| t.max(MIN_PULL_TIMEOUT));
    let resp = ctl
        .call_within(
            limit,
            format!("pull image {}", args.reference),
            svc.pull_image(req),
        )
        .await?;
    if args.quiet {
        emit(&format!("{}\n", resp.image_ref))?;
    } else {
        emit(&format!("Image is up to date for {}\n", resp.image_ref))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(creds: Option<&str>) -> PullArgs {
        PullArgs {
            reference: "busybox".into(),
            creds: creds.map(Into::into),
            registry_token: None,
            quiet: false,
        }
    }

    #[test]
    fn creds_should_split_at_the_first_colon() {
        let a = auth(&args(Some("u:p:w")));
        assert!(
            matches!(&a, Ok(Some(a)) if a.username == "u" && a.password == "p:w"),
            "{a:?}"
        );
        assert!(auth(&args(Some("nouser"))).is_err());
        assert!(auth(&args(Some(":p"))).is_err());
        assert!(matches!(auth(&args(None)), Ok(None)));
    }
}
