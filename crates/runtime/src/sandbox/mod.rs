//! What a pod sandbox is made of (pinned namespaces, shared files, the pid
//! namespace holder, its network and cgroup), and its lifecycle: created
//! all or nothing (`create`), stopped and removed (`lifecycle`), undone
//! (`teardown`).
pub(crate) mod cgroup_owner;
pub(crate) mod create;
pub mod files;
pub(crate) mod lifecycle;
pub mod namespaces;
pub mod network;
pub mod pid_holder;
pub(crate) mod teardown;
pub(crate) mod userns;

use petrel_cri::api;

/// The pod-level namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ns {
    /// The network namespace.
    Network,
    /// The PID namespace.
    Pid,
    /// The IPC namespace.
    Ipc,
}

/// The namespace mode a pod asks for (POD when unset).
pub fn namespace_mode(config: &api::PodSandboxConfig, ns: Ns) -> api::NamespaceMode {
    let opts = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let raw = opts.map_or(0, |o| match ns {
        Ns::Network => o.network,
        Ns::Pid => o.pid,
        Ns::Ipc => o.ipc,
    });
    api::NamespaceMode::try_from(raw).unwrap_or(api::NamespaceMode::Pod)
}

/// The pod's own user namespace as its containers join it, if it has one.
/// A pod whose config asks for one that is not pinned (a stopped pod) gets
/// no container: never one in the host's user namespace instead.
pub(crate) fn user_namespace(
    rec: &crate::records::SandboxRecord,
) -> crate::error::Result<Option<petrel_oci::spec::PodUserNamespace>> {
    let Some(mappings) = crate::validate::userns::requested(&rec.config)? else {
        return Ok(None);
    };
    let Some(path) = rec.userns.clone() else {
        return Err(crate::error::RuntimeError::FailedPrecondition(format!(
            "pod sandbox {} has no user namespace pinned (is it stopped?)",
            rec.id
        )));
    };
    Ok(Some(petrel_oci::spec::PodUserNamespace { path, mappings }))
}
