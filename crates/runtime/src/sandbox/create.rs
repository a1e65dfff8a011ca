//! A pod sandbox's creation: namespaces pinned without a pause process,
//! shared files, the shm tmpfs, the pod cgroup, the CNI network, the
//! PID-namespace holder; then NRI's RunPodSandbox, and `Ready` committed
//! once every plugin accepted the pod. All or nothing: a failure
//! (a refusing NRI plugin among them) undoes every step
//! (`sandbox::teardown`), deletes the record and frees the name.

use std::sync::Arc;

use petrel_cni::NetworkList;
use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
use crate::records::{NetworkRecord, SandboxRecord, SandboxState};
use crate::sandbox::files::{self, SandboxFiles};
use crate::sandbox::namespaces::NamespaceRequest;
use crate::sandbox::{namespace_mode, network, Ns};
use crate::service::Runtime;
use crate::state::Sandbox;

impl Runtime {
    /// Makes the sandbox `rec` describes (in state `Creating`, its name not
    /// yet reserved): on the host's network when `host_network`, else on
    /// `network` (none: loopback only). Returns once it is `Ready`, or
    /// undone.
    pub(crate) async fn sandbox_create(
        self: &Arc<Self>,
        mut rec: SandboxRecord,
        hostname: &str,
        host_network: bool,
        network: Option<NetworkList>,
    ) -> Result<Arc<Sandbox>> {
        let (id, name) = (rec.id.clone(), rec.name.clone());
        self.state.reserve_name(&name, &id)?;
        // Recorded before anything is made, so that a crash midway is undone
        // at the next start. Without an fsync: if the crash also loses this
        // intent, recovery's sweep of unnamed sandbox directories undoes the
        // namespaces and mounts; the holder process (the one thing the layout
        // cannot find) is committed durably as soon as it exists.
        if let Err(e) = self.store.put_unsynced(Table::Sandboxes, &id, &rec) {
            self.state.release_name(&name, &id);
            return Err(e.into());
        }
        let sb = Arc::new(Sandbox::new(rec.clone()));
        self.state.insert_sandbox(sb.clone());

        let made = match self
            .make_sandbox(&mut rec, hostname, host_network, network)
            .await
        {
            // A plugin may still refuse the pod: it is undone like a
            // failure. Until its hook returns the pod stays `Creating`,
            // unseen by clients (not listed, no status, no containers).
            Ok(()) => match self.nri_run_pod(&rec).await {
                Ok(()) => {
                    let ready = self.sandbox_ready(&sb, &mut rec);
                    if ready.is_err() {
                        // The plugins accepted a pod that is now undone.
                        self.nri_run_pod_undone(&rec).await;
                    }
                    ready
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match made {
            Ok(()) => {}
            Err(e) => {
                let mut cleanup = Vec::new();
                if let Err(undo) = self.sandbox_teardown(&rec).await {
                    cleanup.extend(undo.into_list());
                }
                if let Err(undo) = self.store.delete(Table::Sandboxes, &id) {
                    cleanup.push(undo.into());
                }
                if !cleanup.is_empty() {
                    tracing::error!(sandbox.id = %id, errors = cleanup.len(), "rollback of a failed RunPodSandbox incomplete");
                }
                self.state.remove_sandbox(&id);
                self.state.release_name(&name, &id);
                return Err(e.with_cleanup(cleanup));
            }
        }
        self.publish(&id, api::ContainerEventType::ContainerCreatedEvent, &sb);
        self.publish(&id, api::ContainerEventType::ContainerStartedEvent, &sb);
        Ok(sb)
    }

    async fn make_sandbox(
        self: &Arc<Self>,
        rec: &mut SandboxRecord,
        hostname: &str,
        host_network: bool,
        network: Option<NetworkList>,
    ) -> Result<()> {
        let dir = rec.dir.clone();
        petrel_fs::create_private_dir_all(&dir, petrel_fs::PRIVATE)
            .map_err(|e| RuntimeError::dir("create pod directory", e))?;
        let f = SandboxFiles::new(&dir);
        files::write_etc_files(&f, hostname, &rec.config, host_network)?;

        let host_ipc = namespace_mode(&rec.config, Ns::Ipc) == api::NamespaceMode::Node;
        let req = NamespaceRequest {
            net: !host_network,
            ipc: !host_ipc,
            uts: (!host_network).then(|| hostname.to_string()),
            // Checked by RunPodSandbox (`validate::userns::pod`).
            user: crate::validate::userns::requested(&rec.config)?,
        };
        // Creating a network namespace is the slowest step; it runs on its
        // own thread while the shm mount and the pod cgroup are made.
        let pin_dir = dir.clone();
        let pods = self.pods.clone();
        let pinning = tokio::task::spawn_blocking(move || pods.pin_namespaces(&pin_dir, &req));
        let rest = self.make_sandbox_shm_and_cgroup(rec, &f, host_ipc);
        let pinned = pinning
            .await
            .map_err(|e| RuntimeError::task("pin pod namespaces", e))?
            .map_err(|source| RuntimeError::Namespace {
                op: "pin pod namespaces",
                source,
            });
        // Record whatever was made before reporting any failure, so that the
        // rollback undoes all of it.
        if let Ok(p) = &pinned {
            rec.netns = p.net.clone();
            rec.ipcns = p.ipc.clone();
            rec.utsns = p.uts.clone();
            rec.userns = p.user.clone();
        }
        rest?;
        pinned?;
        if let Some(list) = network {
            self.attach_network(rec, &list, &f, hostname).await?;
        }

        if namespace_mode(&rec.config, Ns::Pid) == api::NamespaceMode::Pod {
            let holder = self.shims.spawn_pid_holder(rec.userns.as_deref()).await?;
            rec.pid_holder = Some(holder);
            // Recorded at once: the holder is the one resource that the
            // layout alone cannot find again after a crash.
            self.store.put(Table::Sandboxes, &rec.id, &*rec)?;
        }
        Ok(())
    }

    /// Commits a made pod as `Ready`: from here on clients see it.
    fn sandbox_ready(&self, sb: &Arc<Sandbox>, rec: &mut SandboxRecord) -> Result<()> {
        rec.state = SandboxState::Ready;
        self.save_sandbox(sb, rec.clone())
    }

    /// CNI ADD. The intent (which network) is committed first, so that a
    /// crash during ADD is undone by a DEL at the next start.
    async fn attach_network(
        &self,
        rec: &mut SandboxRecord,
        list: &NetworkList,
        f: &SandboxFiles,
        hostname: &str,
    ) -> Result<()> {
        rec.network = Some(NetworkRecord {
            conflist: list.to_json(),
            ifname: network::POD_IFNAME.to_string(),
            result: None,
            ips: Vec::new(),
        });
        self.store.put(Table::Sandboxes, &rec.id, &*rec)?;
        let attached = self.networks.add(list, rec).await?;
        let pod_ip = attached.ips.first().and_then(|ip| ip.parse().ok());
        rec.network = Some(attached);
        files::write_hosts(&f.hosts, hostname, pod_ip)
    }

    fn make_sandbox_shm_and_cgroup(
        &self,
        rec: &mut SandboxRecord,
        f: &SandboxFiles,
        host_ipc: bool,
    ) -> Result<()> {
        if !host_ipc {
            self.pods.mount_shm(&f.shm, self.config.shm_size)?;
            rec.shm_mounted = true;
        }
        rec.created_cgroup_dirs = self.make_pod_cgroup(&rec.cgroup_parent)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;
    use petrel_store::Table;

    use crate::config::PodNetworkMode;
    use crate::error::RuntimeError;
    use crate::parts::fake::{Call, Fault, TestRuntime};
    use crate::records::SandboxRecord;

    /// A runtime whose pods get a network namespace with loopback only.
    fn runtime() -> TestRuntime {
        TestRuntime::with_config(|c| c.pod_network = PodNetworkMode::Loopback)
    }

    /// A runtime whose pods join a (fake) CNI network.
    fn networked() -> TestRuntime {
        let t = TestRuntime::new();
        t.host.use_network();
        t
    }

    /// Where in `calls` the first call `is` is.
    fn position(calls: &[Call], is: impl Fn(&Call) -> bool) -> Option<usize> {
        calls.iter().position(is)
    }

    async fn run(t: &TestRuntime, name: &str) -> Result<String, RuntimeError> {
        t.isolated_pod(name).await
    }

    /// Nothing of a failed RunPodSandbox is left: no record, nothing in
    /// memory, no pinned namespace, shm mount, PID-namespace holder, pod
    /// cgroup or pod directory; and its name is free again.
    async fn assert_nothing_left(t: &TestRuntime) {
        assert!(t.rt.state.sandboxes().is_empty());
        let stored =
            t.rt.store
                .list::<SandboxRecord>(Table::Sandboxes)
                .expect("list");
        assert!(stored.is_empty(), "records left: {}", stored.len());
        assert!(t.host.namespaces().is_empty(), "{:?}", t.host.namespaces());
        assert!(t.host.shm_mounts().is_empty(), "{:?}", t.host.shm_mounts());
        assert!(
            t.host.pid_holders().is_empty(),
            "{:?}",
            t.host.pid_holders()
        );
        assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
        assert!(t.host.attached().is_empty(), "{:?}", t.host.attached());
        let dir = t.rt.layout.state.join("sandboxes");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("read dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
        let again = run(t, "p").await;
        assert!(again.is_ok(), "the name is still taken: {again:?}");
    }

    #[tokio::test]
    async fn run_pod_should_make_every_kernel_part_and_teardown_should_undo_them() {
        let t = runtime();
        let id = run(&t, "p").await.expect("run pod");
        assert_eq!(t.host.namespaces().len(), 3, "net, ipc, uts");
        assert_eq!(t.host.shm_mounts().len(), 1);
        assert_eq!(t.host.pid_holders().len(), 1);
        assert_eq!(t.host.cgroups().len(), 1);
        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .expect("remove pod");
        assert!(t.host.namespaces().is_empty());
        assert!(t.host.shm_mounts().is_empty());
        assert!(t.host.pid_holders().is_empty());
        assert!(t.host.cgroups().is_empty());
    }

    #[tokio::test]
    async fn run_pod_should_pin_a_user_namespace_that_holder_and_containers_join() {
        let t = runtime();
        let id =
            t.rt.run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(crate::parts::fake::userns_pod_config("u")),
                runtime_handler: String::new(),
            })
            .await
            .expect("run pod")
            .pod_sandbox_id;
        let stored: SandboxRecord =
            t.rt.store
                .get(Table::Sandboxes, &id)
                .expect("get")
                .expect("stored");
        let user = stored
            .userns
            .clone()
            .expect("user namespace pinned and recorded");
        assert!(t.host.namespaces().contains(&user));
        assert_eq!(t.host.namespaces().len(), 4, "user, net, ipc, uts");
        let calls = t.host.calls();
        assert!(
            calls
                .iter()
                .any(|c| *c == Call::PidHolderUserns(user.clone())),
            "the PID namespace must belong to the pod's user namespace: {calls:?}"
        );
        let cid = t.create(&id, "c").await.expect("create");
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| *c == Call::IdmappedMount(user.clone())));
        let bundle = t.stored(&cid).expect("container").bundle;
        let spec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(bundle.join("config.json")).expect("config.json"),
        )
        .expect("json");
        let joined = spec["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .any(|n| n["type"] == "user" && n["path"] == user.display().to_string());
        assert!(joined, "{}", spec["linux"]["namespaces"]);
        assert_eq!(spec["linux"]["uidMappings"][0]["hostID"], 100_000);
        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .expect("remove pod");
        assert!(t.host.namespaces().is_empty(), "{:?}", t.host.namespaces());
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_the_intent_cannot_be_recorded() {
        let t = runtime();
        t.rt.store.fail_writes(0, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::PinNamespaces(_))));
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_namespaces_cannot_be_pinned() {
        let t = runtime();
        t.host.fail(Fault::PinNamespaces, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("pin pod namespaces"), "{err}");
        // The shm mount and the cgroup made beside it were undone.
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::UnmountShm(_))));
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_shm_cannot_be_mounted() {
        let t = runtime();
        t.host.fail(Fault::MountShm, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("mount shm"), "{err}");
        // The namespaces pinned meanwhile were released.
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::UnpinNamespace(_))));
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_the_pod_cgroup_cannot_be_made() {
        let t = runtime();
        t.host.fail(Fault::CgroupEnsure, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("create pod cgroup"), "{err}");
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_the_pid_holder_cannot_start() {
        let t = runtime();
        t.host.fail(Fault::SpawnPidHolder, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("spawn pid holder"), "{err}");
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_the_pid_holder_cannot_be_recorded() {
        let t = runtime();
        // The intent passes; the holder's record fails.
        t.rt.store.fail_writes(1, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::KillPidHolder(_))));
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_ready_cannot_be_committed() {
        let t = runtime();
        t.rt.store.fail_writes(2, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("injected"), "{err}");
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_return_its_error_with_those_of_a_failed_rollback() {
        let t = runtime();
        t.host.fail(Fault::SpawnPidHolder, 1);
        t.host.fail(Fault::UnmountShm, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        let RuntimeError::Undone { error, cleanup } = &err else {
            panic!("not an undone error: {err}");
        };
        assert!(error.to_string().contains("spawn pid holder"), "{error}");
        assert_eq!(cleanup.len(), 1, "{cleanup:?}");
        assert!(cleanup[0].to_string().contains("unmount"), "{}", cleanup[0]);
        // Every other step was undone all the same.
        assert!(t.host.namespaces().is_empty(), "{:?}", t.host.namespaces());
        assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
        assert!(t.rt.state.sandboxes().is_empty());
    }

    #[tokio::test]
    async fn run_pod_should_join_the_network_and_remove_should_release_it() {
        let t = networked();
        let id = run(&t, "p").await.expect("run pod");
        let attached = t.host.attached();
        assert_eq!(attached.keys().collect::<Vec<_>>(), [&id]);
        let stored: Option<SandboxRecord> = t.rt.store.get(Table::Sandboxes, &id).expect("get");
        let net = stored.and_then(|r| r.network).expect("network recorded");
        assert_eq!(net.ips, attached[&id].ips);
        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: id })
            .await
            .expect("remove pod");
        assert!(t.host.attached().is_empty());
        assert!(t.host.namespaces().is_empty());
    }

    #[tokio::test]
    async fn run_pod_should_leave_nothing_when_cni_add_fails() {
        let t = networked();
        t.host.fail(Fault::NetworkAdd, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        let RuntimeError::Cni(cni) = &err else {
            panic!("not the ADD's error: {err}");
        };
        assert!(cni.to_string().contains("(ADD): injected"), "{cni}");
        // The intent was recorded before ADD, so DEL runs (CNI: a DEL after
        // a failed ADD releases whatever it made), while the netns exists.
        let calls = t.host.calls();
        let add = position(&calls, |c| matches!(c, Call::NetworkAdd(_)));
        let del = position(&calls, |c| matches!(c, Call::NetworkDel(_)));
        let unpin = position(&calls, |c| matches!(c, Call::UnpinNamespace(_)));
        assert!(add.is_some() && add < del && del < unpin, "{calls:?}");
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_delete_the_network_when_a_step_after_add_fails() {
        let t = networked();
        t.host.fail(Fault::SpawnPidHolder, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(err.to_string().contains("spawn pid holder"), "{err}");
        let calls = t.host.calls();
        let add = position(&calls, |c| matches!(c, Call::NetworkAdd(_)));
        let del = position(&calls, |c| matches!(c, Call::NetworkDel(_)));
        assert!(add.is_some() && add < del, "{calls:?}");
        assert_nothing_left(&t).await;
    }

    #[tokio::test]
    async fn run_pod_should_return_its_error_with_a_failed_network_release() {
        let t = networked();
        t.host.fail(Fault::SpawnPidHolder, 1);
        t.host.fail(Fault::NetworkDel, 1);
        let err = run(&t, "p").await.expect_err("run must fail");
        let RuntimeError::Undone { error, cleanup } = &err else {
            panic!("not an undone error: {err}");
        };
        assert!(error.to_string().contains("spawn pid holder"), "{error}");
        assert_eq!(cleanup.len(), 1, "{cleanup:?}");
        assert!(
            cleanup[0].to_string().contains("(DEL): injected"),
            "{}",
            cleanup[0]
        );
        // Everything else was undone all the same, the record deleted.
        assert!(t.host.namespaces().is_empty(), "{:?}", t.host.namespaces());
        assert!(t.host.shm_mounts().is_empty());
        assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
        assert!(t.rt.state.sandboxes().is_empty());
        let stored = t.rt.store.list::<SandboxRecord>(Table::Sandboxes);
        assert!(stored.is_ok_and(|s| s.is_empty()));
    }

    /// An NRI plugin, in this process, that refuses the first pod it is
    /// shown.
    async fn refusing_plugin(t: &TestRuntime) -> petrel_nri::stub::StubHandle {
        use std::sync::atomic::{AtomicBool, Ordering};
        t.rt.nri.launch().expect("launch nri");
        let socket = t.rt.nri.socket().expect("nri socket").to_path_buf();
        let refused = std::sync::Arc::new(AtomicBool::new(false));
        let stub = petrel_nri::stub::Stub::builder(())
            .name("refuser")
            .index("10")
            .socket_path(&socket)
            .on_run_pod_sandbox(move |_s, _req: petrel_nri::api::RunPodSandboxRequest| {
                let first = !refused.swap(true, Ordering::SeqCst);
                async move {
                    if first {
                        return Err(petrel_nri::stub::PluginError::new("no pods today"));
                    }
                    Ok(())
                }
            })
            .build()
            .expect("build plugin");
        let handle = stub.handle();
        tokio::spawn(async move {
            if let Err(e) = stub.run().await {
                tracing::debug!(error = %e, "test plugin ended");
            }
        });
        for _ in 0..500 {
            if !t.rt.nri.registry().all().is_empty() {
                return handle;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the test plugin did not register");
    }

    #[tokio::test]
    async fn run_pod_should_undo_everything_when_an_nri_plugin_refuses_it() {
        let t = TestRuntime::with_config(|c| {
            c.nri.socket_path = c.root.join("nri").join("nri.sock");
            c.nri.plugin_path = c.root.join("nri-plugins");
            c.nri.plugin_config_path = c.root.join("nri-conf.d");
        });
        t.host.use_network();
        let plugin = refusing_plugin(&t).await;
        let err = run(&t, "p").await.expect_err("run must fail");
        assert!(
            err.to_string().contains("10-refuser") && err.to_string().contains("no pods today"),
            "{err}"
        );
        // Refused after every step was made: each was undone.
        let calls = t.host.calls();
        let steps: [fn(&Call) -> bool; 6] = [
            |c: &Call| matches!(c, Call::PinNamespaces(_)),
            |c: &Call| matches!(c, Call::MountShm(_)),
            |c: &Call| matches!(c, Call::NetworkAdd(_)),
            |c: &Call| matches!(c, Call::SpawnPidHolder),
            |c: &Call| matches!(c, Call::NetworkDel(_)),
            |c: &Call| matches!(c, Call::KillPidHolder(_)),
        ];
        for made in steps {
            assert!(position(&calls, made).is_some(), "{calls:?}");
        }
        assert_nothing_left(&t).await;
        plugin.stop();
        t.rt.nri.shutdown().await;
    }
}
