//! kubectl (the peer built by `make peers`) against one kubeconfig, with a
//! deadline per call and its own HOME, so that its discovery cache never
//! lands in the user's `~/.kube`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::process::describe;
use crate::KitError;

/// How long one kubectl call may take before it is killed.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// kubectl bound to a kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: PathBuf,
    /// Named in errors: where to look when a call fails (the API server's log).
    log_hint: PathBuf,
}

impl Kubectl {
    /// kubectl from the peers, using `kubeconfig`, with `home` as its HOME
    /// (a directory of the caller's), errors pointing at `log_hint`.
    pub fn new(kubeconfig: &Path, home: &Path, log_hint: &Path) -> Result<Kubectl, KitError> {
        Ok(Kubectl {
            bin: crate::peers::peer_binary("kubectl")?,
            kubeconfig: kubeconfig.to_path_buf(),
            home: home.to_path_buf(),
            log_hint: log_hint.to_path_buf(),
        })
    }

    /// The kubeconfig in use.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A `kubectl --kubeconfig … ARGS` command, not started (for long-lived
    /// calls such as `port-forward`, which the caller stops by pid).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG");
        cmd
    }

    /// Runs kubectl with `args` (and `stdin`, if any) within `deadline`.
    pub fn run_with(
        &self,
        args: &[&str],
        stdin: Option<&[u8]>,
        deadline: Duration,
    ) -> Result<Output, KitError> {
        self.finish(self.command(args), stdin, deadline)
    }

    /// Runs kubectl with `args` on a pseudo-terminal of its own (through
    /// util-linux `script`), as a user at a terminal does: for `exec -it`,
    /// which refuses a TTY when its input is not a terminal. Returns what
    /// the terminal showed (a TTY turns each `\n` into `\r\n`).
    pub fn in_terminal(&self, args: &[&str], deadline: Duration) -> Result<String, KitError> {
        let kubectl = self.command(args);
        let quote =
            |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"));
        let line: Vec<String> = std::iter::once(quote(kubectl.get_program()))
            .chain(kubectl.get_args().map(quote))
            .collect();
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line.join(" "), "/dev/null"])
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG");
        let out = self.finish(cmd, None, deadline)?;
        if !out.status.success() {
            return Err(KitError::Run {
                component: "kubectl".into(),
                detail: format!(
                    "kubectl {} on a terminal exited with {}: {}",
                    args.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stdout).trim()
                ),
                log: self.log_hint.clone(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `cmd` (with `stdin` fed to it) and waits for it within
    /// `deadline`, killing it after.
    fn finish(
        &self,
        mut cmd: Command,
        stdin: Option<&[u8]>,
        deadline: Duration,
    ) -> Result<Output, KitError> {
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let command = describe(&cmd);
        let mut child = cmd.spawn().map_err(|e| KitError::Start {
            component: "kubectl".into(),
            command: command.clone(),
            log: self.log_hint.clone(),
            detail: e.to_string(),
        })?;
        if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
            // A kubectl that exits early closes the pipe: its status says why.
            let _ = w.write_all(data);
        }
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(deadline) {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(KitError::Run {
                component: "kubectl".into(),
                detail: format!("{command}: {e}"),
                log: self.log_hint.clone(),
            }),
            Err(_) => {
                // Not reaped yet (the waiting thread holds it): the pid is
                // still our child's.
                if let Some(p) = i32::try_from(pid)
                    .ok()
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
                Err(KitError::Run {
                    component: "kubectl".into(),
                    detail: format!("{command}: no answer within {deadline:?}"),
                    log: self.log_hint.clone(),
                })
            }
        }
    }

    /// Runs kubectl with `args`; fails unless it exits 0. Returns stdout.
    pub fn ok(&self, args: &[&str]) -> Result<String, KitError> {
        self.ok_with(args, None)
    }

    /// As [`Kubectl::ok`], with `stdin` fed to kubectl.
    pub fn ok_with(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<String, KitError> {
        let out = self.run_with(args, stdin, DEFAULT_DEADLINE)?;
        if !out.status.success() {
            return Err(KitError::Run {
                component: "kubectl".into(),
                detail: format!(
                    "kubectl {} exited with {}: {}",
                    args.join(" "),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                log: self.log_hint.clone(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON).
    pub fn apply(&self, manifest: &str) -> Result<String, KitError> {
        self.ok_with(&["apply", "-f", "-"], Some(manifest.as_bytes()))
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, KitError> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.ok(&all)?;
        serde_json::from_str(&text).map_err(|e| KitError::Run {
            component: "kubectl".into(),
            detail: format!("kubectl {}: output is not JSON: {e}", all.join(" ")),
            log: self.log_hint.clone(),
        })
    }
}

/// `kubectl port-forward`, stopped (by pid) when dropped.
pub struct PortForward(std::process::Child);

impl PortForward {
    /// Starts `kubectl port-forward pod/<pod> :<port>` and returns it with
    /// the local port kubectl chose (once it says so, within a minute).
    pub fn start(k: &Kubectl, pod: &str, port: u16) -> Result<(PortForward, u16), KitError> {
        use std::io::BufRead;
        let mut cmd = k.command(&["port-forward", &format!("pod/{pod}"), &format!(":{port}")]);
        let command = describe(&cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| KitError::io("run", Path::new("kubectl"), e))?;
        let out = child.stdout.take();
        let pf = PortForward(child);
        // "Forwarding from 127.0.0.1:41235 -> 8080"
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(out) = out {
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                        let local = rest.split(' ').next().and_then(|p| p.parse::<u16>().ok());
                        let _ = tx.send(local);
                    }
                }
            });
        }
        match rx.recv_timeout(Duration::from_secs(60)).ok().flatten() {
            Some(local) => Ok((pf, local)),
            None => Err(KitError::Run {
                component: "kubectl port-forward".into(),
                detail: format!("{command}: never said where it listens"),
                log: k.log_hint.clone(),
            }),
        }
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
