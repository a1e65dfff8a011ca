//! `pull`: pulls an image, showing each layer's progress, and prints the
//! image id.
//!
//! CRI PullImage is one unary call with no progress, so `pull` uses
//! Petrel's admin `PullImage`, the same pull streaming per-layer snapshots.
//! A runtime without it (containerd, CRI-O: UNIMPLEMENTED) gets CRI
//! PullImage and no progress. On a terminal each layer is an indicatif bar
//! (short digest, bytes of total, state); elsewhere (logs, pipes) a line
//! per layer and state change; `-q` prints the image id only.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use petrel_cri::admin::{
    AdminPullImageRequest, LayerProgress, LayerState, PullImageProgress, RegistryAuth,
};
use petrel_cri::api::{AuthConfig, ImageSpec, PullImageRequest};
use tokio_stream::StreamExt;

use super::error::CtlError;
use super::output::{emit, human_size};
use super::Ctl;

/// Pulls take minutes on slow links: without `--timeout` a pull may take
/// this long. A pull given `--timeout N` gives up after N seconds (0: no
/// limit), and the runtime stops its downloads when it does.
const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// Hex digits of a digest shown in progress lines and bars.
const SHORT_DIGEST_HEX: usize = 12;

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
    /// Print only the image id (no progress).
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

/// The admin API's form of CRI credentials.
fn registry_auth(a: AuthConfig) -> RegistryAuth {
    RegistryAuth {
        username: a.username,
        password: a.password,
        auth: a.auth,
        server_address: a.server_address,
        identity_token: a.identity_token,
        registry_token: a.registry_token,
    }
}

/// `pull REF`: pulls the image and prints its id.
pub async fn pull(ctl: &Ctl, args: PullArgs) -> Result<ExitCode, CtlError> {
    let auth = auth(&args)?;
    let what = format!("pull image {}", args.reference);
    let mut display = if args.quiet {
        Display::Quiet
    } else if std::io::stdout().is_terminal() {
        Display::Bars(Bars::new())
    } else {
        Display::Lines(Lines::default())
    };
    let limit = if ctl.timeout_given {
        ctl.timeout
    } else {
        Some(DEFAULT_PULL_TIMEOUT)
    };
    let work = pull_with_progress(ctl, &args.reference, auth, &what, &mut display);
    let result = match limit {
        Some(limit) => match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => Err(CtlError::rpc(
                what,
                tonic::Status::deadline_exceeded(format!(
                    "not pulled within {}s (see --timeout); the runtime stops the pull",
                    limit.as_secs()
                )),
            )),
        },
        None => work.await,
    };
    display.end(result.is_ok());
    let image_ref = result?;
    if args.quiet {
        emit(&format!("{image_ref}\n"))?;
    } else {
        emit(&format!("Image is up to date for {image_ref}\n"))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The admin API's streaming pull, shown on `display`; CRI PullImage when
/// the runtime has no such call. Returns the image id.
async fn pull_with_progress(
    ctl: &Ctl,
    reference: &str,
    auth: Option<AuthConfig>,
    what: &str,
    display: &mut Display,
) -> Result<String, CtlError> {
    let mut admin = ctl.admin().await?;
    let req = AdminPullImageRequest {
        image: reference.to_string(),
        auth: auth.clone().map(registry_auth),
    };
    let mut stream = match admin.pull_image(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            return cri_pull(ctl, reference, auth, what).await;
        }
        Err(s) => return Err(CtlError::rpc(what, s)),
    };
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|s| CtlError::rpc(what, s))?;
        display.show(&msg)?;
        if !msg.image_ref.is_empty() {
            return Ok(msg.image_ref);
        }
    }
    Err(CtlError::Other(format!(
        "{what}: the runtime ended the progress stream without a result"
    )))
}

/// CRI PullImage: no progress, only the result.
async fn cri_pull(
    ctl: &Ctl,
    reference: &str,
    auth: Option<AuthConfig>,
    what: &str,
) -> Result<String, CtlError> {
    let req = PullImageRequest {
        image: Some(ImageSpec {
            image: reference.to_string(),
            ..Default::default()
        }),
        auth,
        sandbox_config: None,
    };
    let mut svc = ctl.images().await?;
    // The whole pull is already under the caller's limit.
    let resp = ctl.call_within(None, what, svc.pull_image(req)).await?;
    Ok(resp.image_ref)
}

/// `sha256:` and the first hex digits of a digest.
fn short_digest(digest: &str) -> String {
    let (algo, hex) = digest.split_once(':').unwrap_or(("", digest));
    let hex: String = hex.chars().take(SHORT_DIGEST_HEX).collect();
    if algo.is_empty() {
        hex
    } else {
        format!("{algo}:{hex}")
    }
}

/// A state as people read it.
fn state_word(state: LayerState) -> &'static str {
    match state {
        LayerState::Waiting => "waiting",
        LayerState::Downloading => "downloading",
        LayerState::Exists => "already exists",
        LayerState::Downloaded => "downloaded",
        LayerState::Unpacking => "unpacking",
        LayerState::Done => "done",
    }
}

/// The line saying what a layer is doing now.
fn layer_line(l: &LayerProgress) -> String {
    let state = l.state();
    let short = short_digest(&l.digest);
    let word = state_word(state);
    match state {
        LayerState::Downloading => format!(
            "{short}  {word} {} / {}",
            human_size(l.done),
            human_size(l.size)
        ),
        LayerState::Downloaded | LayerState::Done => {
            format!("{short}  {word} {}", human_size(l.size))
        }
        _ => format!("{short}  {word}"),
    }
}

/// How progress is shown.
enum Display {
    /// Not at all (`-q`).
    Quiet,
    /// A line per layer state change (not a terminal).
    Lines(Lines),
    /// A bar per layer (a terminal).
    Bars(Bars),
}

impl Display {
    fn show(&mut self, msg: &PullImageProgress) -> Result<(), CtlError> {
        match self {
            Self::Quiet => Ok(()),
            Self::Lines(l) => {
                let text: String = l.changes(msg).into_iter().map(|s| s + "\n").collect();
                if text.is_empty() {
                    Ok(())
                } else {
                    emit(&text)
                }
            }
            Self::Bars(b) => {
                b.show(msg);
                Ok(())
            }
        }
    }

    /// The pull is over: bars are completed, or left where they stopped
    /// when it failed.
    fn end(&mut self, ok: bool) {
        if let Self::Bars(b) = self {
            b.end(ok);
        }
    }
}

/// Turns snapshots into lines: one for each layer whose state differs
/// from the last snapshot's.
#[derive(Debug, Default)]
struct Lines {
    last: Vec<Option<LayerState>>,
}

impl Lines {
    fn changes(&mut self, msg: &PullImageProgress) -> Vec<String> {
        self.last
            .resize(msg.layers.len().max(self.last.len()), None);
        let mut out = Vec::new();
        for (l, last) in msg.layers.iter().zip(self.last.iter_mut()) {
            let state = l.state();
            if *last != Some(state) {
                *last = Some(state);
                out.push(layer_line(l));
            }
        }
        out
    }
}

/// One indicatif bar per layer.
struct Bars {
    multi: MultiProgress,
    bars: Vec<ProgressBar>,
    style: ProgressStyle,
}

impl Bars {
    fn new() -> Self {
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {decimal_bytes:>9}/{decimal_total_bytes:<9} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        Self {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stdout()),
            bars: Vec::new(),
            style,
        }
    }

    fn show(&mut self, msg: &PullImageProgress) {
        for (i, l) in msg.layers.iter().enumerate() {
            if i == self.bars.len() {
                let bar = self.multi.add(ProgressBar::new(l.size));
                bar.set_style(self.style.clone());
                bar.set_prefix(short_digest(&l.digest));
                self.bars.push(bar);
            }
            let Some(bar) = self.bars.get(i) else {
                continue;
            };
            let state = l.state();
            bar.set_length(l.size);
            bar.set_position(match state {
                LayerState::Exists => l.size,
                _ => l.done.min(l.size),
            });
            bar.set_message(state_word(state));
            if matches!(state, LayerState::Exists | LayerState::Done) && !bar.is_finished() {
                bar.finish();
            }
        }
    }

    fn end(&mut self, ok: bool) {
        for bar in &self.bars {
            if !bar.is_finished() {
                if ok {
                    bar.finish();
                } else {
                    bar.abandon();
                }
            }
        }
        // indicatif leaves the cursor at the end of its last frame: what
        // follows starts on a line of its own.
        if !self.bars.is_empty() {
            let _ = emit("\n");
        }
    }
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

    fn layer(hex: char, size: u64, done: u64, state: LayerState) -> LayerProgress {
        LayerProgress {
            digest: format!("sha256:{}", hex.to_string().repeat(64)),
            size,
            done,
            state: state as i32,
        }
    }

    fn msg(layers: Vec<LayerProgress>) -> PullImageProgress {
        PullImageProgress {
            layers,
            image_ref: String::new(),
        }
    }

    #[test]
    fn short_digest_should_keep_the_algorithm_and_twelve_hex_digits() {
        assert_eq!(
            short_digest(&format!("sha256:{}", "ab".repeat(32))),
            "sha256:abababababab"
        );
        assert_eq!(short_digest("abc"), "abc");
    }

    #[test]
    fn lines_should_say_each_state_change_once() {
        let mut lines = Lines::default();
        let first = lines.changes(&msg(vec![
            layer('a', 2_000_000, 0, LayerState::Waiting),
            layer('b', 500, 0, LayerState::Exists),
        ]));
        assert_eq!(
            first,
            vec![
                "sha256:aaaaaaaaaaaa  waiting".to_string(),
                "sha256:bbbbbbbbbbbb  already exists".to_string(),
            ]
        );
        let downloading = lines.changes(&msg(vec![
            layer('a', 2_000_000, 1_000_000, LayerState::Downloading),
            layer('b', 500, 0, LayerState::Exists),
        ]));
        assert_eq!(
            downloading,
            vec!["sha256:aaaaaaaaaaaa  downloading 1MB / 2MB".to_string()]
        );
        // Only bytes moved: nothing to say.
        let more = lines.changes(&msg(vec![
            layer('a', 2_000_000, 1_500_000, LayerState::Downloading),
            layer('b', 500, 0, LayerState::Exists),
        ]));
        assert!(more.is_empty(), "{more:?}");
        let done = lines.changes(&msg(vec![
            layer('a', 2_000_000, 2_000_000, LayerState::Done),
            layer('b', 500, 0, LayerState::Exists),
        ]));
        assert_eq!(done, vec!["sha256:aaaaaaaaaaaa  done 2MB".to_string()]);
    }

    #[test]
    fn lines_should_follow_layers_that_appear_late() {
        let mut lines = Lines::default();
        assert!(lines.changes(&msg(vec![])).is_empty());
        let l = lines.changes(&msg(vec![layer('c', 10, 10, LayerState::Downloaded)]));
        assert_eq!(l, vec!["sha256:cccccccccccc  downloaded 10B".to_string()]);
    }

    #[test]
    fn state_words_should_differ() {
        let all = [
            LayerState::Waiting,
            LayerState::Downloading,
            LayerState::Exists,
            LayerState::Downloaded,
            LayerState::Unpacking,
            LayerState::Done,
        ];
        let words: std::collections::HashSet<_> = all.iter().map(|s| state_word(*s)).collect();
        assert_eq!(words.len(), all.len());
    }
}
