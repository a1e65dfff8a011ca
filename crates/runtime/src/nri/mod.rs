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
pub mod records;
pub mod registry;
pub mod spec;

pub use adjust::Updates;
pub use hooks::HookError;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_nri::adaptation::{
    ConnOptions, DefaultValidator, PluginConn, Registration, RuntimeHandler,
};
use petrel_nri::api;
use petrel_nri::ttrpc::Status;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

pub use config::NriConfig;
use discover::PluginFile;
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
    /// The socket this NRI bound (removed at shutdown).
    socket: Option<std::path::PathBuf>,
    /// The built-in validator, if `[nri.default_validator]` enables it.
    validator: Option<DefaultValidator>,
    /// Who set what in each container, from CreateContainer and accepted
    /// updates: later updates are checked against it. Replaced, never
    /// changed in place, while a merge holds a copy.
    owners: std::sync::Mutex<Arc<api::OwningPlugins>>,
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
    /// Starts NRI: launches the pre-registered plugins and, unless
    /// connections are disabled, listens for external ones. Disabled NRI
    /// starts nothing and every hook is a no-op.
    pub fn start(
        config: NriConfig,
        host: Arc<H>,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Result<Arc<Self>, NriError> {
        let listener = if config.disable || config.disable_connections {
            None
        } else {
            Some(bind(&config.socket_path)?)
        };
        let nri = Arc::new(Nri {
            socket: listener.as_ref().map(|_| config.socket_path.clone()),
            validator: DefaultValidator::from_config(config.default_validator.clone()),
            owners: std::sync::Mutex::default(),
            config,
            host,
            registry: Arc::default(),
            sync: tokio::sync::RwLock::new(()),
            runtime_name: runtime_name.to_string(),
            runtime_version: runtime_version.to_string(),
            stop: CancellationToken::new(),
        });
        if nri.config.disable {
            return Ok(nri);
        }
        let files = discover::discover(&nri.config.plugin_path, &nri.config.plugin_config_path)
            .map_err(|source| NriError::PluginDir {
                path: nri.config.plugin_path.clone(),
                source,
            })?;
        for file in files {
            if nri
                .config
                .plugin(&file.index, &file.name)
                .is_some_and(|o| o.disable)
            {
                tracing::info!(plugin = %file.qualified_name(), "nri: plugin disabled in the configuration");
                continue;
            }
            tokio::spawn(nri.clone().supervise(file));
        }
        if let Some(listener) = listener {
            tokio::spawn(nri.clone().accept_loop(listener));
        }
        Ok(nri)
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
        loop {
            let started = Instant::now();
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
                            self.admit(conn, file.config.as_deref().unwrap_or(""), true)
                                .await
                        }
                        Err(e) => {
                            tracing::warn!(plugin = %file.qualified_name(), error = %e, "nri: launched plugin did not register");
                            None
                        }
                    };
                    if let Some(plugin) = admitted {
                        tokio::select! {
                            cause = plugin.conn.closed() => {
                                tracing::warn!(plugin = %file.qualified_name(), cause = %cause, "nri: plugin connection lost");
                            }
                            _ = self.stop.cancelled() => {}
                        }
                        self.registry.remove(&plugin);
                    }
                    // A plugin whose connection is gone is done; make sure.
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
                Err(e) => {
                    tracing::warn!(plugin = %file.qualified_name(), path = %file.path.display(), error = %e, "nri: plugin could not be launched");
                }
            }
            if self.stop.is_cancelled() {
                return;
            }
            let d = launch::next_delay(delay, started.elapsed());
            delay = Some(d);
            tracing::info!(plugin = %file.qualified_name(), delay = ?d, "nri: relaunching plugin");
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
                let Some(plugin) = nri.admit(conn, "", false).await else {
                    return;
                };
                tokio::select! {
                    cause = plugin.conn.closed() => {
                        tracing::info!(plugin = %plugin.qualified_name(), cause = %cause, "nri: external plugin disconnected");
                    }
                    _ = nri.stop.cancelled() => {}
                }
                nri.registry.remove(&plugin);
            });
        }
    }

    /// Configures and synchronizes a registered plugin and adds it to the
    /// registry; `None` (connection closed) if any step fails.
    async fn admit(
        &self,
        conn: PluginConn,
        config: &str,
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
        tracing::info!(plugin = %name, pods = pods.len(), containers = containers.len(), "nri: plugin synchronized");
        Some(plugin)
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
        if let Some(path) = &self.socket {
            let _ = std::fs::remove_file(path);
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
        use std::os::unix::fs::DirBuilderExt;
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err(format!("create {}: {e}", dir.display())))?;
        }
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
