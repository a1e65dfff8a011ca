//! kubelet's `KubeletConfiguration` file for a kubelet under test on a
//! shared machine (cgroup v1 hybrid, no systemd, root without
//! CAP_SYS_RESOURCE, a disk about 90 % full, other tests beside it).
//!
//! Every setting that differs from kubelet's default, or that a default
//! would make wrong here, is set in [`KubeletConfig::render`] with the
//! reason beside it; docs/design/testing.md lists them too.
//! The file is JSON, which kubelet reads as it reads YAML.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

/// How kubelet authenticates and authorizes callers of its API (port
/// `port`: logs, exec, port-forward, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAuth {
    /// No API server to ask: anonymous callers, everything allowed. The
    /// server listens on 127.0.0.1 only and tests use the read-only port.
    Standalone,
    /// As in a real cluster: callers present a client certificate signed by
    /// `client_ca` (the API server's `--kubelet-client-certificate`), or a
    /// bearer token the API server vouches for (TokenReview); what they may
    /// do is asked of the API server (SubjectAccessReview). Anonymous
    /// callers are refused. kubelet serves `tls_cert`/`tls_key`, which the
    /// API server checks against the cluster CA.
    Cluster {
        /// The CA of client certificates.
        client_ca: PathBuf,
        /// kubelet's serving certificate.
        tls_cert: PathBuf,
        /// Its key.
        tls_key: PathBuf,
    },
}

/// Ports kubelet listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletPorts {
    /// The API (`port`, 10250 by default): what the API server calls, on
    /// [`KubeletConfig::address`].
    pub api: u16,
    /// The read-only port (`/pods`, `/metrics`, no authentication), on the
    /// same address; None: off.
    pub read_only: Option<u16>,
    /// `/healthz` (`healthzPort`), on 127.0.0.1.
    pub healthz: u16,
}

/// A kubelet's configuration, as the kit sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletConfig {
    /// The CRI endpoint (`unix:///…/petrel.sock`), runtime and images.
    pub runtime_endpoint: String,
    /// Static pod manifests (`staticPodPath`).
    pub static_pod_path: PathBuf,
    /// Where kubelet has the runtime write container logs (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// FlexVolume plugins (`volumePluginDir`): an empty directory.
    pub volume_plugin_dir: PathBuf,
    /// The cgroup kubelet puts `kubepods` in (`cgroupRoot`), cgroupfs form.
    pub cgroup_root: String,
    /// The address kubelet's API (and read-only port) listens on.
    pub address: IpAddr,
    /// Listening ports.
    pub ports: KubeletPorts,
    /// Authentication and authorization of kubelet's API.
    pub auth: ServerAuth,
    /// The `EventedPLEG` feature gate (kubelet subscribes to the runtime's
    /// GetContainerEvents).
    pub evented_pleg: bool,
    /// The open-file limit kubelet sets for itself (`maxOpenFiles`).
    pub max_open_files: u64,
    /// The longest wait before a crashed container is restarted
    /// (`crashLoopBackOff.maxContainerRestartPeriod`); None: kubelet's
    /// 5 minutes (10 s doubling).
    pub max_restart_period: Option<Duration>,
    /// The most pods kubelet admits (`maxPods`); None: kubelet's 110.
    pub max_pods: Option<u32>,
    /// Whether the host is cgroup v1 (this machine's hybrid layout):
    /// kubelet must then be told to run anyway. On a v2 host kubelet keeps
    /// its default, refusing v1 (`failCgroupV1: true`).
    pub cgroup_v1_host: bool,
    /// `cgroupDriver: systemd` (slices through systemd) instead of
    /// cgroupfs; the runtime must use the same driver.
    pub systemd_cgroups: bool,
}

/// Whether this host's `/sys/fs/cgroup` is a cgroup v1 (or hybrid) layout:
/// only a pure v2 mount has `cgroup.controllers` at its root.
pub fn host_is_cgroup_v1() -> bool {
    !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

impl KubeletConfig {
    /// The `KubeletConfiguration` document.
    pub fn render(&self) -> Value {
        let mut c = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",

            // --- this machine ---
            // PID 1 is not systemd: cgroups are made by path. Petrel's
            // RuntimeConfig answers cgroupfs too (kubelet asks the runtime).
            "cgroupDriver": if self.systemd_cgroups { "systemd" } else { "cgroupfs" },
            // kubepods/{burstable,besteffort}/pod<uid> go under a cgroup of
            // this kubelet only (never the host's shared /kubepods). kubelet
            // refuses a root that does not exist: the kit makes it first
            // and removes the whole tree at the end.
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": true,
            // kubelet would lower its own oom_score_adj to -999; root here
            // lacks CAP_SYS_RESOURCE, so that fails (only logged). 0 keeps
            // what the test process has.
            "oomScoreAdj": 0,
            // kubelet raises its RLIMIT_NOFILE to this (default 1000000);
            // above the hard limit that needs CAP_SYS_RESOURCE too: the kit
            // passes the hard limit it has.
            "maxOpenFiles": self.max_open_files,
            // Without this kubelet rewrites host-wide sysctls at start
            // (vm.overcommit_memory=1, kernel.panic=10,
            // kernel.panic_on_oops=1, kernel.keys.root_max*), for every
            // process of this shared machine. With it kubelet only checks
            // them and refuses to start if they differ: the kit shows it
            // the values it expects through bind mounts in kubelet's own
            // mount namespace (see `mountns`), and the host keeps its own.
            "protectKernelDefaults": true,
            // Otherwise kubelet creates KUBE-IPTABLES-HINT and
            // KUBE-FIREWALL chains and jumps from the host's INPUT/OUTPUT,
            // and re-checks them every minute: host-wide rules no test may
            // touch. Pods here have loopback only.
            "makeIPTablesUtilChains": false,
            // A machine with swap (a CI runner may have it) must not stop
            // kubelet; pods get no swap (memorySwap defaults to NoSwap).
            "failSwapOn": false,
            // The defaults (memory.available<100Mi, nodefs.available<10%,
            // imagefs.available<15%, ...) trip on this machine, whose disk
            // is ~90 % full, and shared with other tests: kubelet would
            // evict the test's pods and refuse new ones. Thresholds only a
            // machine in real trouble reaches; every signal is named, so no
            // default is merged in.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "100Mi",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "100Mi",
                "imagefs.inodesFree": "1%",
            },
            "mergeDefaultEvictionSettings": false,
            // Image GC off (100 % with no maximum age): over 85 % disk use
            // kubelet would remove the imported busybox image, which no
            // registry can give back here.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,

            // --- this test's own places and ports ---
            "containerRuntimeEndpoint": self.runtime_endpoint,
            "imageServiceEndpoint": self.runtime_endpoint,
            "staticPodPath": self.static_pod_path,
            // Default /var/log/pods is shared by every kubelet and
            // containerd on the machine.
            "podLogsDir": self.pod_logs_dir,
            // Default /usr/libexec/kubernetes/... is created by kubelet.
            "volumePluginDir": self.volume_plugin_dir,
            // Standalone: loopback. Joined: the node's IP, where the API
            // server dials it (kubelet refuses a loopback node IP).
            "address": self.address.to_string(),
            "port": self.ports.api,
            // Unauthenticated: on loopback only (standalone); 0 is off.
            "readOnlyPort": self.ports.read_only.unwrap_or(0),
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports.healthz,

            // --- what the tests need ---
            "featureGates": { "EventedPLEG": self.evented_pleg },
        });
        let auth = match &self.auth {
            ServerAuth::Standalone => json!({
                "authentication": {
                    "anonymous": { "enabled": true },
                    "webhook": { "enabled": false },
                },
                "authorization": { "mode": "AlwaysAllow" },
            }),
            ServerAuth::Cluster {
                client_ca,
                tls_cert,
                tls_key,
            } => json!({
                "authentication": {
                    "anonymous": { "enabled": false },
                    "webhook": { "enabled": true },
                    "x509": { "clientCAFile": client_ca },
                },
                "authorization": { "mode": "Webhook" },
                "tlsCertFile": tls_cert,
                "tlsPrivateKeyFile": tls_key,
            }),
        };
        merge(&mut c, auth);
        if self.cgroup_v1_host {
            // kubelet >= 1.35 refuses cgroup v1 unless told not to.
            merge(&mut c, json!({ "failCgroupV1": false }));
        }
        if let Some(n) = self.max_pods {
            // A bench runs more than kubelet's default 110 pods; beyond
            // it kubelet rejects new ones (UnexpectedAdmissionError).
            merge(&mut c, json!({ "maxPods": n }));
        }
        if let Some(max) = self.max_restart_period {
            // Restarts within seconds instead of 10 s, 20 s, 40 s...: a test
            // sees several (KubeletCrashLoopBackOffMax, beta and on since
            // 1.35; kubelet's minimum is 1 s).
            merge(
                &mut c,
                json!({ "crashLoopBackOff": {
                    "maxContainerRestartPeriod": format!("{}ms", max.as_millis())
                }}),
            );
        }
        c
    }
}

/// Adds `extra`'s keys to object `base`.
fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(auth: ServerAuth, evented: bool) -> KubeletConfig {
        KubeletConfig {
            runtime_endpoint: "unix:///t/petrel.sock".into(),
            static_pod_path: "/t/manifests".into(),
            pod_logs_dir: "/t/pod-logs".into(),
            volume_plugin_dir: "/t/volume-plugins".into(),
            cgroup_root: "/petrel-kubelet-abc".into(),
            address: std::net::Ipv4Addr::LOCALHOST.into(),
            ports: KubeletPorts {
                api: 1,
                read_only: Some(2),
                healthz: 3,
            },
            auth,
            evented_pleg: evented,
            max_open_files: 4096,
            max_restart_period: Some(Duration::from_secs(1)),
            max_pods: None,
            cgroup_v1_host: true,
            systemd_cgroups: false,
        }
    }

    #[test]
    fn render_should_set_what_this_machine_needs() {
        let c = config(ServerAuth::Standalone, false).render();
        assert_eq!(c["kind"], "KubeletConfiguration");
        assert_eq!(c["failCgroupV1"], false);
        assert_eq!(c["cgroupDriver"], "cgroupfs");
        assert_eq!(c["cgroupRoot"], "/petrel-kubelet-abc");
        assert_eq!(c["protectKernelDefaults"], true);
        assert_eq!(c["makeIPTablesUtilChains"], false);
        assert_eq!(c["oomScoreAdj"], 0);
        assert_eq!(c["imageGCHighThresholdPercent"], 100);
        assert_eq!(c["evictionHard"]["nodefs.available"], "100Mi");
        assert_eq!(c["containerRuntimeEndpoint"], "unix:///t/petrel.sock");
        assert_eq!(c["imageServiceEndpoint"], "unix:///t/petrel.sock");
        assert_eq!(c["podLogsDir"], "/t/pod-logs");
        assert_eq!(c["staticPodPath"], "/t/manifests");
        assert_eq!(c["port"], 1);
        assert_eq!(c["readOnlyPort"], 2);
        assert_eq!(c["healthzPort"], 3);
        assert_eq!(c["address"], "127.0.0.1");
        assert_eq!(c["featureGates"]["EventedPLEG"], false);
        assert_eq!(c["crashLoopBackOff"]["maxContainerRestartPeriod"], "1000ms");
        assert_eq!(c["authorization"]["mode"], "AlwaysAllow");
        assert!(c.get("maxPods").is_none(), "kubelet's default unless asked");
    }

    #[test]
    fn render_should_keep_kubelets_refusal_of_v1_on_a_v2_host() {
        let mut k = config(ServerAuth::Standalone, false);
        k.cgroup_v1_host = false;
        assert!(k.render().get("failCgroupV1").is_none(), "default: true");
    }

    #[test]
    fn render_should_raise_max_pods_when_asked() {
        let mut k = config(ServerAuth::Standalone, false);
        k.max_pods = Some(250);
        assert_eq!(k.render()["maxPods"], 250);
    }

    #[test]
    fn render_should_authenticate_the_api_server_by_certificate_when_joined() {
        let c = config(
            ServerAuth::Cluster {
                client_ca: "/p/ca.crt".into(),
                tls_cert: "/p/k.crt".into(),
                tls_key: "/p/k.key".into(),
            },
            true,
        )
        .render();
        assert_eq!(c["authentication"]["x509"]["clientCAFile"], "/p/ca.crt");
        assert_eq!(c["authentication"]["anonymous"]["enabled"], false);
        assert_eq!(c["authorization"]["mode"], "Webhook");
        assert_eq!(c["tlsCertFile"], "/p/k.crt");
        assert_eq!(c["featureGates"]["EventedPLEG"], true);
        // The common settings are still there.
        assert_eq!(c["failCgroupV1"], false);
    }
}
