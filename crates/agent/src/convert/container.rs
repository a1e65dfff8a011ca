//! The container config: identity, image, command, environment, mounts,
//! logs, the annotations the agent reads back, resources and security.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, SecurityContext};
use petrel_cri::api;

use super::env::{container_field, environment, expand};
use super::hash::container_hash;
use super::hosts::hosts_mount;
use super::qos::qos_class;
use super::resources::{linux_resources, node_memory_bytes};
use super::sandbox::{pod_labels, spec_of};
use super::security::{namespace_options, profile, supplemental_groups};
use super::volumes::{container_mounts, SubPathMount};
use super::{ConvertContext, ConvertError};
use crate::types::{
    DesiredPod, ANNOTATION_CONTAINER_HASH, ANNOTATION_CONTAINER_KIND, ANNOTATION_PRE_STOP,
    ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_GRACE, KIND_APP, KIND_INIT, KIND_SIDECAR,
    LABEL_CONTAINER_NAME,
};

/// Container annotation: where the container writes its termination
/// message (informational; the file is not mounted yet).
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Kubernetes' default termination grace period, in seconds.
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 30;
/// Kubernetes' default termination message path.
const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// The CRI container config of one container of a pod, and the subPaths
/// to bind before it is created.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    /// The config; a subPath mount's `host_path` is its mount point.
    pub config: api::ContainerConfig,
    /// The subPaths, in the order of the container's volumeMounts.
    pub sub_paths: Vec<SubPathMount>,
}

/// The CRI container config of one container of a pod (see
/// [`container_plan`]).
pub fn container_config(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    restart_count: i32,
    ctx: &ConvertContext,
) -> Result<api::ContainerConfig, ConvertError> {
    container_plan(pod, container, init, restart_count, ctx).map(|p| p.config)
}

/// Is `c` a native sidecar: an init container with `restartPolicy:
/// Always` (Kubernetes 1.33 GA), started in order with the other init
/// containers but kept running beside the app containers?
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The CRI container config of one container of a pod and its subPaths.
/// `restart_count` is both the attempt and the log file's name.
pub fn container_plan(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    restart_count: i32,
    ctx: &ConvertContext,
) -> Result<ContainerPlan, ConvertError> {
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
    let (mut mounts, sub_paths) = container_mounts(pod, container, init, &env, ctx)?;
    mounts.extend(hosts_mount(container, ctx));

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
            match (init, is_sidecar(container)) {
                (true, true) => KIND_SIDECAR,
                (true, false) => KIND_INIT,
                (false, _) => KIND_APP,
            }
            .to_string(),
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
    let security = security_context(spec, container, &cfield, ctx)?;
    let config = api::ContainerConfig {
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
                value: value.clone().into_bytes(),
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
    };
    Ok(ContainerPlan { config, sub_paths })
}

/// The container's security settings: its own securityContext over the
/// pod's, limited to what CRI carries. Masked and read-only paths stay
/// empty so the runtime applies its defaults.
fn security_context(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    container: &Container,
    cfield: &str,
    ctx: &ConvertContext,
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
    let seccomp = Some(super::security::seccomp(
        spec,
        Some((container, cfield)),
        ctx,
    )?);
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
        namespace_options: Some(namespace_options(spec, ctx)?),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::{ctx, desired};
    use crate::types::{LABEL_MANAGED_BY, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};

    const POD: &str = r#"
metadata: {name: web, namespace: prod}
spec:
  terminationGracePeriodSeconds: 45
  securityContext: {runAsUser: 1000, supplementalGroups: [5], seccompProfile: {type: Unconfined}}
  volumes:
  - {name: data, emptyDir: {}}
  - {name: host, hostPath: {path: /var/log}}
  initContainers:
  - name: setup
    image: busybox
    command: [sh, -c, "echo $(GREETING) $$(GREETING)"]
  containers:
  - name: app
    image: nginx:1.25
    command: [/bin/app]
    args: ["--name=$(POD)", "--unknown=$(NOPE)"]
    workingDir: /srv
    stdin: true
    tty: true
    env:
    - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: DIR, value: logs}
    resources:
      requests: {cpu: 500m, memory: 256Mi}
      limits: {cpu: "1", memory: 512Mi}
    volumeMounts:
    - {name: data, mountPath: /data}
    - {name: data, mountPath: /cache, subPath: cache/app}
    - {name: host, mountPath: /host-logs, readOnly: true, mountPropagation: HostToContainer}
    - {name: data, mountPath: /per-pod, subPathExpr: "$(DIR)/$(POD)"}
    lifecycle:
      preStop: {exec: {command: [/bin/drain, --fast]}}
    securityContext:
      runAsUser: 2000
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {add: [NET_ADMIN], drop: [ALL]}
      appArmorProfile: {type: Localhost, localhostProfile: k8s-nginx}
"#;

    fn app(pod: &DesiredPod) -> Container {
        pod.pod.spec.as_ref().unwrap().containers[0].clone()
    }

    #[test]
    fn container_config_should_carry_identity_command_and_io() {
        let pod = desired(POD);
        let cfg = container_config(&pod, &app(&pod), false, 3, &ctx()).unwrap();
        let md = cfg.metadata.unwrap();
        assert_eq!((md.name.as_str(), md.attempt), ("app", 3));
        let image = cfg.image.unwrap();
        assert_eq!(image.image, "nginx:1.25");
        assert_eq!(image.user_specified_image, "nginx:1.25");
        assert_eq!(cfg.command, vec!["/bin/app"]);
        assert_eq!(cfg.args, vec!["--name=web", "--unknown=$(NOPE)"]);
        assert_eq!(cfg.working_dir, "/srv");
        assert_eq!(cfg.log_path, "app/3.log");
        assert!(cfg.stdin && cfg.tty && !cfg.stdin_once);
        assert_eq!(
            cfg.envs
                .iter()
                .map(|kv| (kv.key.as_str(), kv.value.as_slice()))
                .collect::<Vec<_>>(),
            vec![("POD", &b"web"[..]), ("DIR", &b"logs"[..])]
        );
    }

    #[test]
    fn container_config_should_label_and_annotate_for_the_agent() {
        let pod = desired(POD);
        let c = app(&pod);
        let cfg = container_config(&pod, &c, false, 3, &ctx()).unwrap();
        assert_eq!(cfg.labels[LABEL_POD_NAME], "web");
        assert_eq!(cfg.labels[LABEL_POD_NAMESPACE], "prod");
        assert_eq!(cfg.labels[LABEL_POD_UID], "uid-web");
        assert_eq!(cfg.labels[LABEL_CONTAINER_NAME], "app");
        assert_eq!(cfg.labels[LABEL_MANAGED_BY], "node-1");
        assert_eq!(
            cfg.annotations[ANNOTATION_CONTAINER_HASH],
            container_hash(&c)
        );
        assert_eq!(cfg.annotations[ANNOTATION_RESTART_COUNT], "3");
        assert_eq!(cfg.annotations[ANNOTATION_CONTAINER_KIND], "app");
        assert_eq!(cfg.annotations[ANNOTATION_TERMINATION_GRACE], "45");
        assert_eq!(
            cfg.annotations[ANNOTATION_PRE_STOP],
            r#"["/bin/drain","--fast"]"#
        );
        assert_eq!(
            cfg.annotations[ANNOTATION_TERMINATION_MESSAGE_PATH],
            "/dev/termination-log"
        );
    }

    #[test]
    fn container_config_should_mark_sidecars_by_their_kind() {
        let pod = desired(POD);
        let mut c = app(&pod);
        c.restart_policy = Some("Always".to_string());
        assert!(is_sidecar(&c));
        let cfg = container_config(&pod, &c, true, 0, &ctx()).unwrap();
        assert_eq!(cfg.annotations[ANNOTATION_CONTAINER_KIND], "sidecar");
        assert_eq!(
            cfg.annotations[ANNOTATION_PRE_STOP], r#"["/bin/drain","--fast"]"#,
            "a sidecar's preStop hook is kept"
        );
        c.restart_policy = None;
        assert!(!is_sidecar(&c));
    }

    #[test]
    fn container_config_should_describe_init_containers() {
        let pod = desired(POD);
        let init = pod
            .pod
            .spec
            .as_ref()
            .unwrap()
            .init_containers
            .as_ref()
            .unwrap()[0]
            .clone();
        let cfg = container_config(&pod, &init, true, 0, &ctx()).unwrap();
        assert_eq!(cfg.annotations[ANNOTATION_CONTAINER_KIND], "init");
        assert!(!cfg.annotations.contains_key(ANNOTATION_PRE_STOP));
        assert_eq!(
            cfg.command,
            vec!["sh", "-c", "echo $(GREETING) $(GREETING)"]
        );
        assert_eq!(cfg.log_path, "setup/0.log");
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(
            sc.run_as_user,
            Some(api::Int64Value { value: 1000 }),
            "the pod's"
        );
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            api::security_profile::ProfileType::Unconfined as i32
        );
        assert!(sc.capabilities.is_none() && !sc.readonly_rootfs && !sc.no_new_privs);
    }

    #[test]
    fn container_config_should_default_the_grace_period() {
        let pod = desired("metadata: {name: p}\nspec:\n  containers: [{name: a, image: x}]\n");
        let cfg = container_config(&pod, &app(&pod), false, 0, &ctx()).unwrap();
        assert_eq!(cfg.annotations[ANNOTATION_TERMINATION_GRACE], "30");
    }

    #[test]
    fn container_config_should_map_resources_and_security() {
        let pod = desired(POD);
        let cfg = container_config(&pod, &app(&pod), false, 0, &ctx()).unwrap();
        let linux = cfg.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!(
            (r.cpu_shares, r.cpu_period, r.cpu_quota),
            (512, 100_000, 100_000)
        );
        assert_eq!(r.memory_limit_in_bytes, 512 << 20);
        assert!(
            (3..=999).contains(&r.oom_score_adj),
            "burstable: {}",
            r.oom_score_adj
        );
        let sc = linux.security_context.unwrap();
        assert_eq!(
            sc.run_as_user,
            Some(api::Int64Value { value: 2000 }),
            "the container's wins"
        );
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
        );
        assert_eq!(sc.supplemental_groups, vec![5]);
        let aa = sc.apparmor.unwrap();
        assert_eq!(
            aa.profile_type,
            api::security_profile::ProfileType::Localhost as i32
        );
        assert_eq!(aa.localhost_ref, "k8s-nginx");
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
        assert_eq!(
            sc.namespace_options.unwrap().pid,
            api::NamespaceMode::Container as i32
        );
    }

    #[test]
    fn container_plan_should_mount_volumes_and_bind_sub_paths() {
        let pod = desired(POD);
        let plan = container_plan(&pod, &app(&pod), false, 0, &ctx()).unwrap();
        let m: Vec<_> = plan
            .config
            .mounts
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    m.host_path.as_str(),
                    m.readonly,
                    m.propagation,
                )
            })
            .collect();
        let dir = "/var/lib/petrel/pods/uid/volumes/kubernetes.io~empty-dir/data";
        // subPaths are bound on the agent's own mount points, named by
        // volume, container and the volumeMount's index.
        let points = "/var/lib/petrel/volume-subpaths/uid/data/app";
        let private = api::MountPropagation::PropagationPrivate as i32;
        assert_eq!(
            m,
            vec![
                ("/data", dir, false, private),
                ("/cache", &*format!("{points}/1"), false, private),
                (
                    "/host-logs",
                    "/var/log",
                    true,
                    api::MountPropagation::PropagationHostToContainer as i32
                ),
                ("/per-pod", &*format!("{points}/3"), false, private),
                // The pod's managed hosts file, last, as kubelet adds it.
                (
                    "/etc/hosts",
                    "/var/lib/petrel/pods/uid/etc-hosts",
                    false,
                    private
                ),
            ]
        );
        let subs: Vec<_> = plan
            .sub_paths
            .iter()
            .map(|s| {
                (
                    s.volume.as_str(),
                    s.container.as_str(),
                    s.sub_path.as_str(),
                    s.volume_dir.to_str().unwrap(),
                    s.relative.to_str().unwrap(),
                    s.mount_point.to_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            subs,
            vec![
                (
                    "data",
                    "app",
                    "cache/app",
                    dir,
                    "cache/app",
                    &*format!("{points}/1")
                ),
                (
                    "data",
                    "app",
                    "logs/web",
                    dir,
                    "logs/web",
                    &*format!("{points}/3")
                ),
            ]
        );
        assert_eq!(
            container_config(&pod, &app(&pod), false, 0, &ctx()).unwrap(),
            plan.config
        );
    }

    #[test]
    fn container_config_should_refuse_escaping_sub_paths() {
        for (key, sub) in [
            ("subPath", "../../etc"),
            ("subPath", "/etc"),
            ("subPath", "a/../../b"),
            ("subPathExpr", "$(X)"),
        ] {
            let yaml = format!(
                "metadata: {{name: p}}\nspec:\n  volumes: [{{name: d, emptyDir: {{}}}}]\n  containers:\n  - name: a\n    image: x\n    env: [{{name: X, value: '..'}}]\n    volumeMounts: [{{name: d, mountPath: /m, {key}: '{sub}'}}]\n"
            );
            let pod = desired(&yaml);
            let err = container_config(&pod, &app(&pod), false, 0, &ctx())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("spec.containers[a].volumeMounts[d].{key}")),
                "{err}"
            );
        }
    }

    #[test]
    fn container_config_should_refuse_what_it_cannot_run() {
        let cases = [
            ("containers: [{name: a}]", "spec.containers[a].image"),
            ("containers: [{name: a, image: x, volumeMounts: [{name: nope, mountPath: /m}]}]", "spec.containers[a].volumeMounts[nope]"),
            (
                "volumes: [{name: cm, configMap: {name: c}}]\n  containers: [{name: a, image: x, volumeMounts: [{name: cm, mountPath: /m}]}]",
                "configMap",
            ),
            (
                "volumes: [{name: d, emptyDir: {}}]\n  containers: [{name: a, image: x, volumeMounts: [{name: d, mountPath: /m, mountPropagation: Bidirectional}]}]",
                "mountPropagation",
            ),
            ("containers: [{name: a, image: x, securityContext: {seccompProfile: {type: Localhost}}}]", "seccompProfile.localhostProfile"),
        ];
        for (spec, needle) in cases {
            let pod = desired(&format!("metadata: {{name: p}}\nspec:\n  {spec}\n"));
            let err = container_config(&pod, &app(&pod), false, 0, &ctx())
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let pod = desired(
            "metadata: {name: p}\nspec:\n  volumes: [{name: d, emptyDir: {}}]\n  containers: [{name: a, image: x, securityContext: {privileged: true}, volumeMounts: [{name: d, mountPath: /m, mountPropagation: Bidirectional}]}]\n",
        );
        let cfg = container_config(&pod, &app(&pod), false, 0, &ctx()).unwrap();
        assert_eq!(
            cfg.mounts[0].propagation,
            api::MountPropagation::PropagationBidirectional as i32
        );
        assert!(cfg.linux.unwrap().security_context.unwrap().privileged);
    }
}
