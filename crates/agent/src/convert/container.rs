//! The container config: identity, image, command, environment, mounts,
//! logs, the annotations the agent reads back, resources and security.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, SecurityContext};
use petrel_cri::api;

use super::env::{container_field, environment, expand};
use super::hash::container_hash;
use super::qos::qos_class;
use super::resources::{linux_resources, node_memory_bytes};
use super::sandbox::{pod_labels, spec_of};
use super::security::{namespace_options, profile, supplemental_groups};
use super::volumes::container_mounts;
use super::{ConvertContext, ConvertError};
use crate::types::{
    DesiredPod, ANNOTATION_CONTAINER_HASH, ANNOTATION_CONTAINER_KIND, ANNOTATION_PRE_STOP,
    ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_GRACE, LABEL_CONTAINER_NAME,
};

/// Container annotation: where the container writes its termination
/// message (informational; the file is not mounted yet).
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Kubernetes' default termination grace period, in seconds.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;
/// Kubernetes' default termination message path.
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// The CRI container config of one container of a pod. `restart_count` is
/// both the attempt and the log file's name.
pub fn container_config(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    restart_count: i32,
    ctx: &ConvertContext,
) -> Result<api::ContainerConfig, ConvertError> {
    let spec = spec_of(pod)?;
    let cfield = container_field(container, init);
    let image = container
        .image
        .as_deref()
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| ConvertError::invalid(format!("{cfield}.image"), "missing"))?;
    let env = environment(pod, container, init, ctx)?;
    let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter().flatten().map(|s| expand(s, &lookup)).collect()
    };
    let mounts = container_mounts(pod, container, init, &env, ctx)?;

    let mut labels = pod_labels(pod, ctx);
    labels.insert(LABEL_CONTAINER_NAME.to_string(), container.name.clone());

    let grace = spec
        .termination_grace_period_seconds
        .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS);
    let mut annotations = HashMap::from([
        (
            ANNOTATION_CONTAINER_HASH.to_string(),
            container_hash(container),
        ),
        (
            ANNOTATION_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            ANNOTATION_CONTAINER_KIND.to_string(),
            if init { "init" } else { "app" }.to_string(),
        ),
        (ANNOTATION_TERMINATION_GRACE.to_string(), grace.to_string()),
        (
            ANNOTATION_TERMINATION_MESSAGE_PATH.to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.to_string()),
        ),
    ]);
    if let Some(cmd) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.as_ref())
    {
        let json = serde_json::to_string(cmd).map_err(|e| {
            ConvertError::invalid(
                format!("{cfield}.lifecycle.preStop.exec.command"),
                e.to_string(),
            )
        })?;
        annotations.insert(ANNOTATION_PRE_STOP.to_string(), json);
    }

    let qos = qos_class(spec);
    let security = security_context(spec, container, &cfield)?;
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: container.name.clone(),
            attempt: u32::try_from(restart_count).unwrap_or(0),
        }),
        image: Some(api::ImageSpec {
            image: image.to_string(),
            user_specified_image: image.to_string(),
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(key, value)| api::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{}.log", container.name, restart_count),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(linux_resources(container, qos, node_memory_bytes())),
            security_context: Some(security),
        }),
        ..Default::default()
    })
}

/// The container's security settings: its own securityContext over the
/// pod's, limited to what CRI carries. Masked and read-only paths stay
/// empty so the runtime applies its defaults.
fn security_context(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    container: &Container,
    cfield: &str,
) -> Result<api::LinuxContainerSecurityContext, ConvertError> {
    let psc = spec.security_context.as_ref();
    let csc = container.security_context.as_ref();
    let pick =
        |c: fn(&SecurityContext) -> Option<i64>,
         p: fn(&k8s_openapi::api::core::v1::PodSecurityContext) -> Option<i64>| {
            csc.and_then(c)
                .or_else(|| psc.and_then(p))
                .map(|value| api::Int64Value { value })
        };
    let seccomp = match csc.and_then(|c| c.seccomp_profile.as_ref()) {
        Some(p) => Some(profile(
            &p.type_,
            p.localhost_profile.as_deref(),
            &format!("{cfield}.securityContext.seccompProfile"),
        )?),
        None => match psc.and_then(|p| p.seccomp_profile.as_ref()) {
            Some(p) => Some(profile(
                &p.type_,
                p.localhost_profile.as_deref(),
                "spec.securityContext.seccompProfile",
            )?),
            None => None,
        },
    };
    let apparmor = match csc.and_then(|c| c.app_armor_profile.as_ref()) {
        Some(p) => Some(profile(
            &p.type_,
            p.localhost_profile.as_deref(),
            &format!("{cfield}.securityContext.appArmorProfile"),
        )?),
        None => match psc.and_then(|p| p.app_armor_profile.as_ref()) {
            Some(p) => Some(profile(
                &p.type_,
                p.localhost_profile.as_deref(),
                "spec.securityContext.appArmorProfile",
            )?),
            None => None,
        },
    };
    let capabilities = csc
        .and_then(|c| c.capabilities.as_ref())
        .map(|caps| api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        });
    Ok(api::LinuxContainerSecurityContext {
        capabilities,
        privileged: csc.and_then(|c| c.privileged).unwrap_or(false),
        namespace_options: Some(namespace_options(spec)),
        run_as_user: pick(|c| c.run_as_user, |p| p.run_as_user),
        run_as_group: pick(|c| c.run_as_group, |p| p.run_as_group),
        readonly_rootfs: csc
            .and_then(|c| c.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: csc.and_then(|c| c.allow_privilege_escalation) == Some(false),
        seccomp,
        apparmor,
        ..Default::default()
    })
}
