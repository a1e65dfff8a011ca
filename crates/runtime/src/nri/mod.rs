//! NRI in the runtime: pre-registered plugins launched from `plugin_path`,
//! external ones accepted on `socket_path`, each configured, synchronized and
//! then called on the pod and container events it subscribed to.
//!
//! The runtime side is [`host`]: what NRI asks of the runtime (a snapshot for
//! Synchronize, plugin-initiated updates and evictions) and the calls the CRI
//! handlers make at each event.

mod adjust;
pub mod config;
pub mod discover;
mod hooks;
pub mod host;
mod launch;
pub mod metrics;
pub mod records;
pub mod registry;
pub mod spec;

pub use adjust::Updates;
pub use hooks::HookError;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_nri::adaptation::{
    ConnOptions, DefaultValidator, PluginConn, Registration, RuntimeHandler,
};
use petrel_nri::api::{self, Event};
use petrel_nri::ttrpc::Status;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

pub use config::NriConfig;
use discover::PluginFile;
pub use metrics::NriMetrics;
use registry::{Plugin, PluginStats, Registry};

/// What the runtime gives NRI.
pub trait NriHost: Send + Sync + 'static {
    /// Every pod and container, for a new plugin's Synchronize.
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>);

    /// Updates and evictions a plugin asks for, unsolicited or in its
    /// Synchronize answer; the answer lists those that failed.
    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl Future<Output = Result<api::UpdateContainersResponse, Status>> + Send;
}

/// Adapts an [`NriHost`] to the connection's handler.
struct HostHandler<H>(Arc<H>);

impl<H: NriHost> RuntimeHandler for HostHandler<H> {
    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl Future<Output = Result<api::UpdateContainersResponse, Status>> + Send {
        let host = self.0.clone();
        let plugin = plugin.clone();
        async move { host.update_containers(&plugin, req).await }
    }
}

/// Errors of NRI's start-up.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// The plugin directory could not be read.
    #[error("nri: read plugin directory {path}: {source}")]
    PluginDir {
        /// `plugin_path`.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The socket could not be set up.
    #[error("nri: socket {path}: {reason}")]
    Socket {
        /// `socket_path`.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
}

/// NRI for one runtime.
pub struct Nri<H: NriHost> {
    config: NriConfig,
    host: Arc<H>,
    registry: Arc<Registry>,
    /// Held for writing while a plugin is synchronized, for reading by the
    /// CRI calls that change pods and containers: a plugin sees every object
    /// either in its Synchronize or as an event afterwards, never neither.
    sync: tokio::sync::RwLock<()>,
    runtime_name: String,
    runtime_version: String,
    stop: CancellationToken,
    /// The socket this NRI bound, once [`Nri::launch`] bound it (removed
    /// at shutdown; never one it did not bind).
    socket: std::sync::OnceLock<std::path::PathBuf>,
    /// The built-in validator, if `[nri.default_validator]` enables it.
    validator: Option<DefaultValidator>,
    /// Who set what in each container, from CreateContainer and accepted
    /// updates: later updates are checked against it. Replaced, never
    /// changed in place, while a merge holds a copy.
    owners: std::sync::Mutex<Arc<api::OwningPlugins>>,
    metrics: NriMetrics,
    /// The pre-registered plugins by `NN-name`: how their supervision goes.
    launched: std::sync::Mutex<BTreeMap<String, Launched>>,
}

/// How a pre-registered plugin's supervision goes.
#[derive(Debug, Clone, Default)]
struct Launched {
    /// Launches after the first.
    relaunches: u32,
    /// Why it is not connected (empty while it is).
    problem: String,
}

/// One plugin as `petrel ctl nri` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// Its index (`NN`).
    pub index: String,
    /// Its name.
    pub name: String,
    /// The events it subscribed to (empty while not connected).
    pub events: Vec<String>,
    /// Launched by the runtime from `plugin_path`.
    pub pre_registered: bool,
    /// Its process (from the socket's peer credentials), 0 if unknown.
    pub pid: i32,
    /// "connected", or why not (a pre-registered plugin being relaunched).
    pub health: String,
    /// Relaunches so far (pre-registered plugins).
    pub relaunches: u32,
    /// Calls made, failed, timed out, and their total time in microseconds.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Total call time in microseconds.
    pub busy_micros: u64,
    /// Its request timeout.
    pub request_timeout: Duration,
    /// A timeout fails the CRI call (and disconnects it).
    pub timeout_fatal: bool,
}

impl<H: NriHost> std::fmt::Debug for Nri<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nri")
            .field("disabled", &self.config.disable)
            .field("socket", &self.socket)
            .field("plugins", &self.registry.all().len())
            .finish_non_exhaustive()
    }
}

impl<H: NriHost> Nri<H> {
    /// Starts NRI: [`Nri::new`], then [`Nri::launch`].
    pub fn start(
        config: NriConfig,
        host: Arc<H>,
        metrics: NriMetrics,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Result<Arc<Self>, NriError> {
        let nri = Self::new(config, host, metrics, runtime_name, runtime_version);
        nri.launch()?;
        Ok(nri)
    }

    /// NRI, idle: no plugin runs and every hook is a no-op until
    /// [`Nri::launch`].
    pub fn new(
        config: NriConfig,
        host: Arc<H>,
        metrics: NriMetrics,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Arc<Self> {
        Arc::new(Nri {
            socket: std::sync::OnceLock::new(),
            validator: DefaultValidator::from_config(config.default_validator.clone()),
            owners: std::sync::Mutex::default(),
            metrics,
            launched: std::sync::Mutex::default(),
            config,
            host,
            registry: Arc::default(),
            sync: tokio::sync::RwLock::new(()),
            runtime_name: runtime_name.to_string(),
            runtime_version: runtime_version.to_string(),
            stop: CancellationToken::new(),
        })
    }

    /// Launches the pre-registered plugins and, unless connections are
    /// disabled, listens for external ones (each plugin is synchronized
    /// with the host's pods and containers as it registers). Disabled NRI
    /// launches nothing. Call it once.
    pub fn launch(self: &Arc<Self>) -> Result<(), NriError> {
        if self.config.disable {
            return Ok(());
        }
        let listener = if self.config.disable_connections {
            None
        } else {
            let listener = bind(&self.config.socket_path)?;
            if self.socket.set(self.config.socket_path.clone()).is_err() {
                tracing::warn!("nri: launched twice");
            }
            Some(listener)
        };
        let files = discover::discover(&self.config.plugin_path, &self.config.plugin_config_path)
            .map_err(|source| NriError::PluginDir {
            path: self.config.plugin_path.clone(),
            source,
        })?;
        for file in files {
            if self
                .config
                .plugin(&file.index, &file.name)
                .is_some_and(|o| o.disable)
            {
                tracing::info!(plugin = %file.qualified_name(), "nri: plugin disabled in the configuration");
                continue;
            }
            tokio::spawn(self.clone().supervise(file));
        }
        if let Some(listener) = listener {
            tokio::spawn(self.clone().accept_loop(listener));
        }
        Ok(())
    }

    /// The connected plugins.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The configuration NRI runs with.
    pub fn config(&self) -> &NriConfig {
        &self.config
    }

    /// True if NRI is off (every hook a no-op).
    pub fn disabled(&self) -> bool {
        self.config.disable
    }

    /// NRI's metrics.
    pub fn metrics(&self) -> &NriMetrics {
        &self.metrics
    }

    /// The socket external plugins dial, if NRI listens.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.get().map(PathBuf::as_path)
    }

    /// Records one call to a plugin, in its counters and the metrics.
    pub(crate) fn observe(
        &self,
        p: &Plugin,
        event: Event,
        took: Duration,
        error: bool,
        timeout: bool,
    ) {
        p.stats.record(took, error, timeout);
        self.metrics.observe(
            &p.qualified_name(),
            event.as_str_name(),
            took,
            error,
            timeout,
        );
    }

    /// Every plugin, connected ones in index order, then pre-registered
    /// ones that are not connected.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        use std::sync::atomic::Ordering::Relaxed;
        let launched = self
            .launched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out: Vec<PluginInfo> = self
            .registry
            .all()
            .iter()
            .map(|p| {
                let r = p.conn.registration();
                let mask = p.conn.events();
                PluginInfo {
                    index: r.index.clone(),
                    name: r.name.clone(),
                    events: (1..Event::Last as i32)
                        .filter_map(|e| Event::try_from(e).ok())
                        .filter(|e| mask.contains(*e))
                        .map(|e| e.as_str_name().to_string())
                        .collect(),
                    pre_registered: p.pre_registered,
                    pid: p.pid.unwrap_or(0),
                    health: "connected".to_string(),
                    relaunches: launched
                        .get(&p.qualified_name())
                        .map_or(0, |l| l.relaunches),
                    calls: p.stats.calls.load(Relaxed),
                    errors: p.stats.errors.load(Relaxed),
                    timeouts: p.stats.timeouts.load(Relaxed),
                    busy_micros: p.stats.busy_micros.load(Relaxed),
                    request_timeout: p.conn.request_timeout(),
                    timeout_fatal: p.timeout_fatal,
                }
            })
            .collect();
        for (qualified, l) in launched {
            if out
                .iter()
                .any(|p| format!("{}-{}", p.index, p.name) == qualified)
            {
                continue;
            }
            let (index, name) = qualified.split_once('-').unwrap_or(("", &qualified));
            out.push(PluginInfo {
                index: index.to_string(),
                name: name.to_string(),
                events: Vec::new(),
                pre_registered: true,
                pid: 0,
                health: if l.problem.is_empty() {
                    "starting".to_string()
                } else {
                    l.problem.clone()
                },
                relaunches: l.relaunches,
                calls: 0,
                errors: 0,
                timeouts: 0,
                busy_micros: 0,
                request_timeout: self.config.request_timeout(index, name),
                timeout_fatal: self
                    .config
                    .plugin(index, name)
                    .is_some_and(|o| o.timeout_fatal),
            });
        }
        out
    }

    /// Notes how a pre-registered plugin's supervision goes.
    fn note_launch(&self, file: &PluginFile, relaunch: bool, problem: &str) {
        let mut all = self.launched.lock().unwrap_or_else(|p| p.into_inner());
        let l = all.entry(file.qualified_name()).or_default();
        if relaunch {
            l.relaunches += 1;
            self.metrics.relaunched(&file.qualified_name());
        }
        l.problem = problem.to_string();
    }

    /// Held by a CRI call while it changes pods or containers (see `sync`).
    pub async fn block_sync(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.sync.read().await
    }

    fn options(&self, index: &str, name: &str) -> ConnOptions {
        ConnOptions {
            registration_timeout: self.config.plugin_registration_timeout,
            request_timeout: self.config.request_timeout(index, name),
            ..Default::default()
        }
    }

    /// Keeps one pre-registered plugin running: launch, admit, wait for its
    /// end, relaunch after a growing delay.
    async fn supervise(self: Arc<Self>, file: PluginFile) {
        let mut delay = None;
        self.note_launch(&file, false, "");
        loop {
            let started = Instant::now();
            let problem;
            match launch::spawn(&file) {
                Ok((mut child, stream)) => {
                    let handler = Arc::new(HostHandler(self.host.clone()));
                    let opts = self.options(&file.index, &file.name);
                    let admitted = match PluginConn::accept(stream, handler, opts).await {
                        Ok(conn) => {
                            let r = conn.registration();
                            if r.index != file.index || r.name != file.name {
                                tracing::warn!(plugin = %file.qualified_name(), registered = %r.qualified_name(), "nri: launched plugin registered under another name");
                            }
                            let pid = child.id().and_then(|p| i32::try_from(p).ok());
                            self.admit(conn, file.config.as_deref().unwrap_or(""), pid, true)
                                .await
                        }
                        Err(e) => {
                            tracing::warn!(plugin = %file.qualified_name(), error = %e, "nri: launched plugin did not register");
                            None
                        }
                    };
                    // The process is waited for as soon as it exits, also
                    // while a child it left holds the connection open: a
                    // zombie left waiting would be reaped by the runtime's
                    // orphan reaper and its pid could be reused before the
                    // kill below.
                    let mut exited = false;
                    problem = if let Some(plugin) = admitted {
                        self.note_launch(&file, false, "");
                        let lost = loop {
                            tokio::select! {
                                cause = plugin.conn.closed() => {
                                    tracing::warn!(plugin = %file.qualified_name(), cause = %cause, "nri: plugin connection lost");
                                    break format!("connection lost: {cause}");
                                }
                                _ = self.stop.cancelled() => break String::new(),
                                status = child.wait(), if !exited => {
                                    exited = true;
                                    tracing::info!(plugin = %file.qualified_name(), status = ?status.ok(), "nri: plugin process exited");
                                }
                            }
                        };
                        self.remove_plugin(&plugin);
                        lost
                    } else {
                        "did not register, configure or synchronize".to_string()
                    };
                    // A plugin whose connection is gone is done; make sure.
                    if !exited {
                        if let Err(e) = child.start_kill() {
                            tracing::warn!(plugin = %file.qualified_name(), error = %e, "nri: plugin not killed");
                        }
                        if let Err(e) = child.wait().await {
                            tracing::warn!(plugin = %file.qualified_name(), error = %e, "nri: plugin not reaped");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(plugin = %file.qualified_name(), path = %file.path.display(), error = %e, "nri: plugin could not be launched");
                    problem = format!("launch failed: {e}");
                }
            }
            if self.stop.is_cancelled() {
                return;
            }
            let d = launch::next_delay(delay, started.elapsed());
            delay = Some(d);
            tracing::info!(plugin = %file.qualified_name(), delay = ?d, "nri: relaunching plugin");
            self.note_launch(&file, true, &format!("{problem}; relaunch in {d:?}"));
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = self.stop.cancelled() => return,
            }
        }
    }

    /// Accepts external plugins until NRI stops.
    async fn accept_loop(self: Arc<Self>, listener: UnixListener) {
        loop {
            let stream = tokio::select! {
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "nri: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = self.stop.cancelled() => return,
            };
            let nri = self.clone();
            tokio::spawn(async move {
                let handler = Arc::new(HostHandler(nri.host.clone()));
                let opts = ConnOptions {
                    registration_timeout: nri.config.plugin_registration_timeout,
                    request_timeout: nri.config.plugin_request_timeout,
                    ..Default::default()
                };
                let conn = match PluginConn::accept(stream, handler, opts).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "nri: external plugin refused");
                        return;
                    }
                };
                let r = conn.registration().clone();
                if nri
                    .config
                    .plugin(&r.index, &r.name)
                    .is_some_and(|o| o.disable)
                {
                    tracing::warn!(plugin = %r.qualified_name(), "nri: plugin disabled in the configuration; refused");
                    conn.close().await;
                    return;
                }
                let pid = conn.peer_pid();
                let Some(plugin) = nri.admit(conn, "", pid, false).await else {
                    return;
                };
                tokio::select! {
                    cause = plugin.conn.closed() => {
                        tracing::info!(plugin = %plugin.qualified_name(), cause = %cause, "nri: external plugin disconnected");
                    }
                    _ = nri.stop.cancelled() => {}
                }
                nri.remove_plugin(&plugin);
            });
        }
    }

    /// Configures and synchronizes a registered plugin and adds it to the
    /// registry; `None` (connection closed) if any step fails.
    async fn admit(
        &self,
        conn: PluginConn,
        config: &str,
        pid: Option<i32>,
        pre_registered: bool,
    ) -> Option<Arc<Plugin>> {
        let name = conn.registration().qualified_name();
        if let Err(e) = conn
            .configure(config, &self.runtime_name, &self.runtime_version)
            .await
        {
            tracing::warn!(plugin = %name, error = %e, "nri: Configure failed; plugin dropped");
            conn.close().await;
            return None;
        }
        let r = conn.registration().clone();
        let plugin = Arc::new(Plugin {
            timeout_fatal: self
                .config
                .plugin(&r.index, &r.name)
                .is_some_and(|o| o.timeout_fatal),
            conn,
            pre_registered,
            pid,
            stats: PluginStats::default(),
        });
        let _write = self.sync.write().await;
        let (pods, containers) = self.host.snapshot();
        let updates = match plugin.conn.synchronize(&pods, &containers).await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(plugin = %name, error = %e, "nri: Synchronize failed; plugin dropped");
                plugin.conn.close().await;
                return None;
            }
        };
        if !updates.is_empty() {
            let req = api::UpdateContainersRequest {
                update: updates,
                evict: Vec::new(),
            };
            if let Err(e) = self.host.update_containers(&r, req).await {
                tracing::warn!(plugin = %name, error = %e.message, "nri: updates from Synchronize refused");
            }
        }
        if let Err(e) = self.registry.insert(plugin.clone()) {
            tracing::warn!(plugin = %name, error = %e, "nri: plugin refused");
            plugin.conn.close().await;
            return None;
        }
        self.metrics.plugins.set(self.registry.all().len() as i64);
        tracing::info!(plugin = %name, pods = pods.len(), containers = containers.len(), "nri: plugin synchronized");
        Some(plugin)
    }

    fn remove_plugin(&self, plugin: &Arc<Plugin>) {
        self.registry.remove(plugin);
        self.metrics.plugins.set(self.registry.all().len() as i64);
    }

    /// Tells every plugin the runtime is going down, and stops NRI.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        for p in self.registry.all() {
            if let Err(e) = p.conn.shutdown().await {
                tracing::debug!(plugin = %p.qualified_name(), error = %e, "nri: Shutdown not delivered");
            }
            p.conn.close().await;
        }
        if let Some(path) = self.socket.get() {
            crate::util::remove_file_logged(path, "NRI socket");
        }
    }
}

/// Listens on `path`: its directory is made 0700; a stale socket file is
/// replaced, a live one (another runtime answering) is an error.
fn bind(path: &Path) -> Result<UnixListener, NriError> {
    let err = |reason: String| NriError::Socket {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(dir) = path.parent() {
        // What we create of the socket's path is private; an existing
        // directory (/var/run/nri of another runtime) is left as it is.
        petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
            .map_err(|e| err(e.to_string()))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err("another runtime is listening there".to_string()));
        }
        std::fs::remove_file(path).map_err(|e| err(format!("remove the stale socket: {e}")))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| err(format!("bind: {e}")))?;
    Ok(listener)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cri_tests;
