//! Sample NRI plugin, the use case of NRI's design (seed 003): containers of
//! Guaranteed pods with an integer CPU limit equal to their request get CPUs of
//! their own (cpuset); every other container runs on the shared pool, the CPUs
//! nobody owns. When the pool changes (an exclusive container comes or goes),
//! the containers on it are updated.
//!
//! Configuration (the runtime's `NN-cpu-policy.conf` or `cpu-policy.conf`, YAML):
//!
//! ```yaml
//! cpus: "0-7"      # CPUs to manage (default: every online CPU)
//! reserved: "0"    # never given exclusively; stay in the shared pool
//! ```
//!
//! A container asking for more exclusive CPUs than can be given (the shared
//! pool always keeps one) fails to be created, with the reason.

mod cpuset;
mod policy;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use petrel_nri::api;
use petrel_nri::stub::{PluginError, Stub, StubHandle};
use serde::Deserialize;

use policy::Policy;

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    cpus: Option<String>,
    reserved: Option<String>,
}

struct State {
    policy: Mutex<Policy>,
    /// Set once the stub exists: for updates nobody asked for.
    handle: Arc<OnceLock<StubHandle>>,
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An update setting `id`'s CPUs.
fn cpus_update(id: &str, cpus: &BTreeSet<u32>) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.to_string(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: cpuset::format(cpus),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        // A container that went away meanwhile is no reason to fail.
        ignore_failure: true,
    }
}

/// Updates moving every shared container (but `except`) to the pool.
fn pool_updates(p: &Policy, except: &str) -> Vec<api::ContainerUpdate> {
    let pool = p.shared_pool();
    p.shared_containers()
        .filter(|id| id.as_str() != except)
        .map(|id| cpus_update(id, &pool))
        .collect()
}

fn online_cpus() -> Result<BTreeSet<u32>, PluginError> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map_err(|e| PluginError::new(format!("read the online CPUs: {e}")))?;
    cpuset::parse(&text).map_err(PluginError::new)
}

fn current_cpus(c: &api::Container) -> Option<BTreeSet<u32>> {
    let cpus = &c.linux.as_ref()?.resources.as_ref()?.cpu.as_ref()?.cpus;
    cpuset::parse(cpus).ok().filter(|s| !s.is_empty())
}

async fn configure(
    s: Arc<State>,
    req: api::ConfigureRequest,
) -> Result<Option<petrel_nri::api::EventMask>, PluginError> {
    let cfg: Config = if req.config.trim().is_empty() {
        Config::default()
    } else {
        serde_yaml::from_str(&req.config)
            .map_err(|e| PluginError::new(format!("configuration: {e}")))?
    };
    let mut allowed = match &cfg.cpus {
        Some(c) => cpuset::parse(c).map_err(PluginError::new)?,
        None => online_cpus()?,
    };
    let reserved = match &cfg.reserved {
        Some(r) => cpuset::parse(r).map_err(PluginError::new)?,
        None => BTreeSet::new(),
    };
    tracing::info!(cpus = %cpuset::format(&allowed), reserved = %cpuset::format(&reserved), "configured");
    allowed.extend(reserved.iter().copied());
    *s.lock() = Policy::new(allowed, reserved);
    Ok(None)
}

async fn synchronize(
    s: Arc<State>,
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
) -> Result<Vec<api::ContainerUpdate>, PluginError> {
    let pods: HashMap<&str, &api::PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut p = s.lock();
    for c in &containers {
        if c.state == api::ContainerState::ContainerStopped as i32 {
            continue;
        }
        let want = pods
            .get(c.pod_sandbox_id.as_str())
            .and_then(|pod| policy::exclusive_request(pod, c));
        if let Err(e) = p.admit(&c.id, want, current_cpus(c).as_ref()) {
            tracing::warn!(container = %c.id, error = %e, "left on the shared pool");
            let _ = p.admit(&c.id, None, None);
        }
    }
    Ok(containers
        .iter()
        .filter_map(|c| {
            let cpus = p.cpus_of(&c.id)?;
            (current_cpus(c).as_ref() != Some(&cpus)).then(|| cpus_update(&c.id, &cpus))
        })
        .collect())
}

async fn create_container(
    s: Arc<State>,
    req: api::CreateContainerRequest,
) -> Result<api::CreateContainerResponse, PluginError> {
    let (Some(pod), Some(ctr)) = (req.pod, req.container) else {
        return Ok(api::CreateContainerResponse::default());
    };
    let want = policy::exclusive_request(&pod, &ctr);
    let mut p = s.lock();
    let changed = p.admit(&ctr.id, want, None).map_err(|e| {
        PluginError::new(format!("container {} of pod {}: {e}", ctr.name, pod.name))
    })?;
    let cpus = p.cpus_of(&ctr.id).unwrap_or_default();
    tracing::info!(container = %ctr.name, exclusive = want.is_some(), cpus = %cpuset::format(&cpus), "placed");
    let update = if changed {
        pool_updates(&p, &ctr.id)
    } else {
        Vec::new()
    };
    let adjust = api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(api::LinuxResources {
                cpu: Some(api::LinuxCpu {
                    cpus: cpuset::format(&cpus),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(api::CreateContainerResponse {
        adjust: Some(adjust),
        update,
        ..Default::default()
    })
}

async fn stop_container(
    s: Arc<State>,
    req: api::StopContainerRequest,
) -> Result<api::StopContainerResponse, PluginError> {
    let id = req.container.map(|c| c.id).unwrap_or_default();
    let mut p = s.lock();
    let update = if p.release(&id) {
        pool_updates(&p, &id)
    } else {
        Vec::new()
    };
    Ok(api::StopContainerResponse { update })
}

async fn remove_container(
    s: Arc<State>,
    req: api::RemoveContainerRequest,
) -> Result<(), PluginError> {
    let id = req.container.map(|c| c.id).unwrap_or_default();
    let update = {
        let mut p = s.lock();
        if !p.release(&id) {
            return Ok(());
        }
        pool_updates(&p, &id)
    };
    // Not an answer to this event (RemoveContainer has none): an unsolicited update.
    if let Some(h) = s.handle.get().cloned() {
        tokio::spawn(async move {
            if let Err(e) = h.update_containers(update, Vec::new()).await {
                tracing::warn!(error = %e, "shared pool update failed");
            }
        });
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let slot = Arc::new(OnceLock::new());
    let state = State {
        policy: Mutex::new(Policy::new(BTreeSet::new(), BTreeSet::new())),
        handle: slot.clone(),
    };
    let mut builder = Stub::builder(state)
        .on_configure(configure)
        .on_synchronize(synchronize)
        .on_create_container(create_container)
        .on_stop_container(stop_container)
        .on_remove_container(remove_container);
    if std::env::var_os(api::PLUGIN_NAME_ENV).is_none() {
        builder = builder.name("cpu-policy").index("30");
    }
    if let Some(socket) = std::env::args().nth(1) {
        builder = builder.socket_path(socket);
    }
    let _ = slot.set(builder.handle());
    builder.build()?.run().await?;
    Ok(())
}
