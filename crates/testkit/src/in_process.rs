//! A Petrel runtime in the test's own process (so a test can call its
//! streaming backend directly), serving CRI on its own socket on tokio
//! threads of its own, in a temporary root with its own cgroup parent.
//! Dropping it removes every pod through CRI, stops the runtime, then
//! sweeps ([`crate::process`]) whatever its runc root, mounts and cgroups
//! still hold. Needs the `petrel-shim` binary ([`crate::bins`]), no older
//! than its sources, and runc. Behind the kit's `in-process` feature: it
//! links the runtime library.

#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use petrel_runtime::config::PodNetworkMode;
use petrel_runtime::{Runtime, RuntimeConfig, RuntimeStreams};

use crate::bins::shim_bin;
use crate::clients::Clients;
use crate::process::{random_suffix, remove_cgroup_tree, runc_sweep, unmount_under};
use crate::test_images::workspace_dir;

/// The shim binary the runtime will use, checked to be newer than the
/// shim's sources (a stale shim would lack what these tests exercise).
fn shim_binary() -> PathBuf {
    let shim = shim_bin();
    let built = std::fs::metadata(&shim)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", shim.display()));
    let src = workspace_dir().join("crates/shim/src");
    let newest: SystemTime = std::fs::read_dir(&src)
        .expect("shim sources")
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
        .expect("shim sources");
    assert!(
        built >= newest,
        "{} is older than its sources: run `cargo build -p petrel-shim` (make test does)",
        shim.display()
    );
    shim
}

/// A runtime under test.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub config: RuntimeConfig,
    pub cgroup_parent: String,
    served: Option<Served>,
}

/// A running instance: its tokio threads, the runtime, the way to stop it.
struct Served {
    threads: tokio::runtime::Runtime,
    rt: Arc<Runtime>,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Daemon {
    /// Starts a runtime in a fresh temporary root.
    pub fn start() -> Daemon {
        let dir = crate::process::kit_tempdir("petrel-st.").unwrap_or_else(|e| panic!("{e}"));
        let cgroup_parent = format!("/petrel-test-{}", random_suffix());
        crate::stale::record_cgroup(dir.path(), &cgroup_parent);
        crate::stale::record_runc_root(
            dir.path(),
            Path::new("runc"),
            &dir.path().join("state/runc"),
        );
        let config = RuntimeConfig {
            root: dir.path().join("root"),
            state: dir.path().join("state"),
            shim_binary: Some(shim_binary()),
            default_cgroup_parent: cgroup_parent.clone(),
            // Loopback only: the pod's own network namespace, no CNI.
            pod_network: PodNetworkMode::Loopback,
            // NRI with this test's own socket and (empty) plugin directories.
            nri: petrel_runtime::nri::NriConfig {
                socket_path: dir.path().join("nri.sock"),
                plugin_path: dir.path().join("nri-plugins"),
                plugin_config_path: dir.path().join("nri-conf"),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut d = Daemon {
            dir,
            config,
            cgroup_parent,
            served: None,
        };
        d.serve();
        d
    }

    fn serve(&mut self) {
        let threads = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("daemon")
            .enable_all()
            .build()
            .expect("daemon runtime");
        let rt = {
            let _g = threads.enter();
            Runtime::open(self.config.clone()).expect("open runtime")
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = threads.spawn({
            let rt = rt.clone();
            async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                if let Err(e) = petrel_runtime::serve_runtime(rt, shutdown).await {
                    eprintln!("runtime failed: {e}");
                }
            }
        });
        let socket = self.config.socket_path();
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "runtime did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.served = Some(Served {
            threads,
            rt,
            stop,
            done,
        });
    }

    /// The streaming backend of the running instance.
    pub fn streams(&self) -> RuntimeStreams {
        RuntimeStreams::new(&self.served.as_ref().expect("running").rt)
    }

    /// Stops the runtime (containers keep running under their shims) and
    /// drops everything it held, as a process exit would.
    pub fn stop(&mut self) {
        let Some(s) = self.served.take() else {
            return;
        };
        let _ = s.stop.send(());
        let _ = s
            .threads
            .block_on(async { tokio::time::timeout(Duration::from_secs(15), s.done).await });
        s.threads.shutdown_timeout(Duration::from_secs(5));
        assert_eq!(
            Arc::strong_count(&s.rt),
            1,
            "something still holds the stopped runtime"
        );
    }

    /// Stops the runtime and starts it again on the same root and state.
    pub fn restart(&mut self) {
        self.stop();
        self.serve();
    }

    /// CRI clients (call from a tokio runtime of the test's own).
    pub async fn clients(&self) -> Clients {
        let ch = petrel_cri::connect(&format!("unix://{}", self.config.socket_path().display()))
            .await
            .expect("connect to runtime");
        Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        }
    }

    /// A pod config unique to this test: own network namespace, own cgroup.
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        crate::clients::test_pod_config(
            "streaming",
            name,
            &self.dir.path().join("logs"),
            &self.cgroup_parent,
        )
    }

    fn cleanup(&mut self) {
        if self.served.is_none() && self.config.root.join("meta.redb").exists() {
            // A test that stopped the runtime: start it again to clean up.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        }
        if self.served.is_some() {
            let _ = crate::cri::remove_all_pods(&format!(
                "unix://{}",
                self.config.socket_path().display()
            ));
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.stop()));
        }
        // Sweep what is left in this test's own places.
        runc_sweep(Path::new("runc"), &self.config.state.join("runc"));
        unmount_under(self.dir.path());
        remove_cgroup_tree(&self.cgroup_parent);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A tokio runtime for the test's own side (clients, backend calls).
pub fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime")
}
