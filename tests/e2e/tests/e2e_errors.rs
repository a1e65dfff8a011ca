//! Bad input gets a clear error naming what is wrong, and leaves nothing
//! behind.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::prelude::*;

#[tokio::test]
async fn unknown_ids_should_be_not_found_and_bad_configs_invalid() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let nf = tonic::Code::NotFound;
    let e =
        c.rt.container_status(api::ContainerStatusRequest {
            container_id: "deadbeef".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), nf);
    let e =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: "deadbeef".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), nf);
    assert_eq!(c.start("deadbeef").await.unwrap_err().code(), nf);
    // Stop and remove are idempotent (CRI): an unknown id is nothing to do.
    c.stop("deadbeef", 0).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: "deadbeef".into(),
    })
    .await
    .unwrap();

    // Missing metadata.
    let mut pc = node.pod_config("bad");
    pc.metadata = None;
    let e =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(pc),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("config.metadata"), "{}", e.message());
    // An unknown runtime handler.
    let e =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(node.pod_config("bad")),
            runtime_handler: "kata".into(),
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("runtime_handler"), "{}", e.message());

    let pc = node.pod_config("good");
    let pod = c.run_pod(pc.clone()).await;
    let cases: Vec<(&str, api::ContainerConfig)> = vec![
        (
            "config.metadata",
            api::ContainerConfig {
                metadata: None,
                ..sh_container("x", "true")
            },
        ),
        (
            "config.image.image",
            api::ContainerConfig {
                image: None,
                ..sh_container("x", "true")
            },
        ),
        (
            "config.image.image",
            api::ContainerConfig {
                image: Some(api::ImageSpec {
                    image: "nosuch/image:1".into(),
                    ..Default::default()
                }),
                ..sh_container("x", "true")
            },
        ),
        (
            "mounts[0]",
            api::ContainerConfig {
                mounts: vec![api::Mount {
                    host_path: "/nonexistent/petrel".into(),
                    container_path: "/data".into(),
                    ..Default::default()
                }],
                ..sh_container("x", "true")
            },
        ),
        (
            "mounts[0]",
            api::ContainerConfig {
                mounts: vec![api::Mount {
                    host_path: "/tmp".into(),
                    container_path: "relative".into(),
                    ..Default::default()
                }],
                ..sh_container("x", "true")
            },
        ),
        (
            "memory_limit_in_bytes",
            api::ContainerConfig {
                linux: Some(api::LinuxContainerConfig {
                    resources: Some(api::LinuxContainerResources {
                        memory_limit_in_bytes: -1024,
                        ..Default::default()
                    }),
                    security_context: None,
                }),
                ..sh_container("x", "true")
            },
        ),
        (
            "config.log_path",
            api::ContainerConfig {
                log_path: "../../escape.log".into(),
                ..sh_container("x", "true")
            },
        ),
    ];
    for (field, cfg) in cases {
        let e = c.create(&pod, &pc, cfg).await.unwrap_err();
        assert_eq!(
            e.code(),
            tonic::Code::InvalidArgument,
            "{field}: {}",
            e.message()
        );
        assert!(
            e.message().contains(field),
            "expected {field} in {:?}",
            e.message()
        );
    }
    // The name is still free after all these failures.
    c.run(&pod, &pc, sh_container("x", "sleep 100")).await;
}

#[tokio::test]
async fn a_start_failing_in_runc_should_end_in_start_error_and_undo_what_it_made() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("rollback");
    let pod = c.run_pod(pc.clone()).await;
    // A file bound onto the image's /bin directory: nothing checks that up
    // front, and runc's mount fails in `runc create`, which StartContainer
    // runs (as containerd, CreateContainer only records the container).
    let file = node.dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let mut cfg = sh_container("doomed", "true");
    cfg.mounts = vec![api::Mount {
        host_path: file.display().to_string(),
        container_path: "/bin".into(),
        ..Default::default()
    }];
    let id = c.create(&pod, &pc, cfg).await.expect("create only records");
    let e = c.start(&id).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
    // containerd's answer: exited, StartError, 128, the error as message.
    let st = c.status(&id).await;
    assert_eq!(st.state, api::ContainerState::ContainerExited as i32);
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));
    assert!(!st.message.is_empty() && st.finished_at > 0, "{st:?}");
    let runc_list = || {
        let out = std::process::Command::new("runc")
            .arg("--root")
            .arg(node.state.join("runc"))
            .args(["list", "-q"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(runc_list().is_empty(), "runc container left");
    let pod_cg = Node::cgroup_dir("memory", &format!("{}/rollback", node.cgroup_parent));
    let children = || {
        std::fs::read_dir(&pod_cg)
            .map(|it| it.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0)
    };
    assert_eq!(children(), 0, "container cgroup left");
    // The failed shim was reaped by the start itself (sooner than the
    // orphan sweep's grace period).
    node.assert_no_zombie_children(Duration::from_secs(2));
    // The rootfs and bundle stay until the removal, which leaves nothing.
    c.remove(&id).await.expect("remove");
    for d in ["state/containers", "root/containers"] {
        let n = std::fs::read_dir(node.dir.path().join(d))
            .map(|it| it.count())
            .unwrap_or(0);
        assert_eq!(n, 0, "{d} not empty after the removal");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&format!("{}/state/containers", node.dir.path().display())),
        "rootfs mount left"
    );
    // The name was released.
    c.run(&pod, &pc, sh_container("doomed", "sleep 100")).await;
}

/// Asserts an INVALID_ARGUMENT naming `field`, with a message that stays
/// small whatever the value was.
fn assert_invalid(r: Result<impl std::fmt::Debug, tonic::Status>, field: &str, what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
    assert!(
        e.message().contains(field),
        "{what}: expected {field} in {:?}",
        e.message()
    );
    assert!(
        e.message().len() < 4096,
        "{what}: {} bytes",
        e.message().len()
    );
}

#[tokio::test]
async fn hostile_pod_values_should_be_invalid_argument_and_leave_nothing() {
    let node = Node::start();
    let mut c = node.clients().await;
    let big = "n".repeat(3 << 20);
    type Change = Box<dyn Fn(&mut api::PodSandboxConfig)>;
    let cases: Vec<(&str, &str, Change)> = vec![
        (
            "NUL in name",
            "config.metadata.name",
            Box::new(|pc| pc.metadata.as_mut().unwrap().name = "a\0b".into()),
        ),
        (
            "3 MB name",
            "config.metadata.name",
            Box::new(move |pc| pc.metadata.as_mut().unwrap().name = big.clone()),
        ),
        (
            "/ in namespace",
            "config.metadata.namespace",
            Box::new(|pc| pc.metadata.as_mut().unwrap().namespace = "kube/system".into()),
        ),
        (
            ".. in uid",
            "config.metadata.uid",
            Box::new(|pc| pc.metadata.as_mut().unwrap().uid = "..".into()),
        ),
        (
            ".. in log directory",
            "config.log_directory",
            Box::new(|pc| pc.log_directory = "/tmp/../etc".into()),
        ),
    ];
    for (what, field, change) in cases {
        let mut pc = node.pod_config("hostile");
        change(&mut pc);
        let r =
            c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(pc),
                runtime_handler: String::new(),
            })
            .await;
        assert_invalid(r, field, what);
        node.assert_no_debris("hostile");
    }
    let pods =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(pods.items.is_empty(), "no sandbox recorded");
    // critest's names pass.
    let mut pc = node.pod_config("hostile");
    pc.metadata.as_mut().unwrap().name =
        "PodSandbox-for-create-test-3f6c1d2e-9a4b-4c1d-8e2f-0a1b2c3d4e5f".into();
    c.run_pod(pc).await;
}

#[tokio::test]
async fn hostile_container_values_should_be_invalid_argument_and_leave_nothing() {
    let node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    let pc = node.pod_config("door");
    let pod = c.run_pod(pc.clone()).await;
    let resources = |f: fn(&mut api::LinuxContainerResources)| {
        let mut r = api::LinuxContainerResources::default();
        f(&mut r);
        Some(api::LinuxContainerConfig {
            resources: Some(r),
            security_context: None,
        })
    };
    let mount = |container_path: &str, propagation: api::MountPropagation| api::Mount {
        host_path: "/tmp".into(),
        container_path: container_path.into(),
        propagation: propagation as i32,
        ..Default::default()
    };
    let private = api::MountPropagation::PropagationPrivate;
    let big = "c".repeat(3 << 20);
    let cases: Vec<(&str, &str, api::ContainerConfig)> = vec![
        (
            "NUL in name",
            "config.metadata.name",
            sh_container("a\0b", "true"),
        ),
        (
            "3 MB name",
            "config.metadata.name",
            // Only the name is large: the request stays under gRPC's 4 MB.
            api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: big.clone(),
                    attempt: 0,
                }),
                ..sh_container("x", "true")
            },
        ),
        (
            "memory -1",
            "memory_limit_in_bytes",
            api::ContainerConfig {
                linux: resources(|r| r.memory_limit_in_bytes = -1),
                ..sh_container("x", "true")
            },
        ),
        (
            "memory i64::MAX",
            "memory_limit_in_bytes",
            api::ContainerConfig {
                linux: resources(|r| r.memory_limit_in_bytes = i64::MAX),
                ..sh_container("x", "true")
            },
        ),
        (
            "cpu_period 1",
            "cpu_period",
            api::ContainerConfig {
                linux: resources(|r| r.cpu_period = 1),
                ..sh_container("x", "true")
            },
        ),
        (
            "cpu_shares 2^62",
            "cpu_shares",
            api::ContainerConfig {
                linux: resources(|r| r.cpu_shares = 1 << 62),
                ..sh_container("x", "true")
            },
        ),
        (
            "cpuset 4095",
            "cpuset_cpus",
            api::ContainerConfig {
                linux: resources(|r| r.cpuset_cpus = "4095".into()),
                ..sh_container("x", "true")
            },
        ),
        (
            "container_path /proc",
            "mounts[0].container_path",
            api::ContainerConfig {
                mounts: vec![mount("/proc", private)],
                ..sh_container("x", "true")
            },
        ),
        (
            "relative container_path",
            "mounts[0].container_path",
            api::ContainerConfig {
                mounts: vec![mount("data", private)],
                ..sh_container("x", "true")
            },
        ),
        (
            "container_path with ..",
            "mounts[0].container_path",
            api::ContainerConfig {
                mounts: vec![mount("/data/../proc", private)],
                ..sh_container("x", "true")
            },
        ),
        (
            "bidirectional unprivileged",
            "mounts[0].propagation",
            api::ContainerConfig {
                mounts: vec![mount(
                    "/data",
                    api::MountPropagation::PropagationBidirectional,
                )],
                ..sh_container("x", "true")
            },
        ),
    ];
    for (what, field, cfg) in cases {
        assert_invalid(c.create(&pod, &pc, cfg).await, field, what);
    }
    let list =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(list.containers.is_empty(), "no container recorded");
    for d in ["state/containers", "root/containers"] {
        let n = std::fs::read_dir(node.dir.path().join(d))
            .map(|it| it.count())
            .unwrap_or(0);
        assert_eq!(n, 0, "{d} not empty after refused creates");
    }
    let pod_cg = Node::cgroup_dir("memory", &format!("{}/door", node.cgroup_parent));
    let children = std::fs::read_dir(&pod_cg)
        .map(|it| it.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    assert_eq!(children, 0, "container cgroup left");

    // UpdateContainerResources gets the same checks; the container runs on.
    let id = c.run(&pod, &pc, sh_container("x", "sleep 100")).await;
    for (what, field, linux) in [
        (
            "memory -1",
            "memory_limit_in_bytes",
            api::LinuxContainerResources {
                memory_limit_in_bytes: -1,
                ..Default::default()
            },
        ),
        (
            "cpu_period 1",
            "cpu_period",
            api::LinuxContainerResources {
                cpu_period: 1,
                ..Default::default()
            },
        ),
    ] {
        let r =
            c.rt.update_container_resources(api::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(linux),
                ..Default::default()
            })
            .await;
        assert_invalid(r, field, what);
    }
    let st =
        c.rt.container_status(api::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
}

#[tokio::test]
async fn names_should_be_reserved_once_under_concurrency() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("dup");
    let mut tasks = vec![];
    for _ in 0..8 {
        let mut cc = c.clone();
        let pc = pc.clone();
        tasks.push(tokio::spawn(async move {
            cc.rt
                .run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(pc),
                    runtime_handler: String::new(),
                })
                .await
        }));
    }
    let mut ok = vec![];
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => ok.push(r.into_inner().pod_sandbox_id),
            Err(e) => assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}"),
        }
    }
    assert_eq!(ok.len(), 1);
    let pod = ok.remove(0);
    let mut tasks = vec![];
    for _ in 0..8 {
        let mut cc = c.clone();
        let pc = pc.clone();
        let pod = pod.clone();
        tasks.push(tokio::spawn(async move {
            cc.create(&pod, &pc, sh_container("same", "true")).await
        }));
    }
    let mut created = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => created += 1,
            Err(e) => assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}"),
        }
    }
    assert_eq!(created, 1);
}

#[tokio::test]
async fn socket_and_state_should_not_be_readable_by_others() {
    let node = Node::start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&node.socket), 0o660);
    for d in [&node.root, &node.state] {
        assert_eq!(mode(d) & 0o007, 0, "{} is open to others", d.display());
    }
    let meta = node.root.join("meta.redb");
    assert_eq!(mode(&meta) & 0o007, 0, "metadata readable by others");
    let _ = HashMap::<String, String>::new();
}

#[test]
fn runtime_should_refuse_to_start_without_its_oci_runtime_or_with_a_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(petrel_bin())
            .arg("runtime")
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--state")
            .arg(dir.path().join("state"))
            .arg("--nri-socket")
            .arg(dir.path().join("nri.sock"))
            .arg("--nri-plugin-path")
            .arg(dir.path().join("nri-plugins"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--runtime-binary", "/nonexistent/runc"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("OCI runtime /nonexistent/runc not found")
    );
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[cri]\nno_such_key = 1\n").unwrap();
    let out = run(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no_such_key") && err.contains("bad.toml"),
        "{err}"
    );
}

#[tokio::test]
async fn importing_a_file_that_is_not_an_archive_should_never_echo_it() {
    let node = Node::start();
    let mut c = node.clients().await;
    // A file of the host that is no image: shaped like /etc/shadow.
    let secret = "root:$6$SECRETsalt$SECREThashSECREThashSECREThashSECREThash:19700:0:99999:7:::\n";
    let shadow = node.dir.path().join("shadow");
    std::fs::write(&shadow, secret.repeat(40)).unwrap();
    let quotes = |msg: &str| {
        ["SECRET", "$6$", "root:", "19700"]
            .iter()
            .any(|s| msg.contains(s))
    };

    let err = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: shadow.display().to_string(),
            tags: vec![],
        })
        .await
        .expect_err("a shadow file is no image");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains(&shadow.display().to_string()),
        "{err:?}"
    );
    assert!(err.message().contains("not a tar archive"), "{err:?}");
    assert!(!quotes(err.message()), "{err:?}");

    let o = ctl(&node, &["image", "import", shadow.to_str().unwrap()]);
    assert!(!o.status.success());
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("not a tar archive"), "{out}");
    assert!(!quotes(&out), "{out}");
    assert!(!quotes(&node.log()), "the runtime's log quotes the file");
    assert!(std::fs::read_dir(node.root.join("images/tmp"))
        .unwrap()
        .next()
        .is_none());
}

#[tokio::test]
async fn importing_an_archive_with_a_huge_tar_record_should_be_resource_exhausted() {
    let node = Node::start();
    let mut c = node.clients().await;
    // A GNU long name record claiming 512 MiB (only its header is there).
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_path("././@LongLink").unwrap();
    h.set_size(512 << 20);
    h.set_cksum();
    let archive = node.dir.path().join("huge.tar");
    std::fs::write(&archive, h.as_bytes()).unwrap();
    let started = std::time::Instant::now();
    let err = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: archive.display().to_string(),
            tags: vec![],
        })
        .await
        .expect_err("refused");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("long name record"), "{err:?}");
}

/// Peak resident set (VmHWM) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test]
async fn importing_an_archive_with_a_512_mb_manifest_should_fail_fast_and_small() {
    let node = Node::start();
    let mut c = node.clients().await;
    // A complete docker archive whose manifest.json is 512 MiB of holes
    // (no disk used): refused from its header, never copied or read.
    let mut h = tar::Header::new_gnu();
    h.set_path("manifest.json").unwrap();
    h.set_size(512 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    let archive = node.dir.path().join("big-manifest.tar");
    std::fs::write(&archive, h.as_bytes()).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .unwrap();
    f.set_len(512 + (512 << 20) + 1024).unwrap();
    let before = peak_rss(node.pid());
    let started = std::time::Instant::now();
    let err = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: archive.display().to_string(),
            tags: vec![],
        })
        .await
        .expect_err("refused");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("manifest.json is 536870912 bytes, larger than the 4194304 bytes allowed"),
        "{err:?}"
    );
    let after = peak_rss(node.pid());
    assert!(
        after < before + (32 << 20),
        "runtime peak RSS {before} -> {after}"
    );
    assert!(std::fs::read_dir(node.root.join("images/tmp"))
        .unwrap()
        .next()
        .is_none());
}

/// A docker archive of one image `x/sparse:1` whose one layer holds a GNU
/// sparse file `big` claiming `real` bytes with 4 KiB of data.
fn sparse_image_archive(path: &std::path::Path, real: u64) {
    use sha2::Digest;
    let sha = |b: &[u8]| format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)));
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNUSparse);
    h.set_path("big").unwrap();
    h.set_size(4096);
    h.set_mode(0o644);
    let g = h.as_gnu_mut().unwrap();
    g.sparse[0].set_offset(0);
    g.sparse[0].set_length(4096);
    g.sparse[1].set_offset(real);
    g.sparse[1].set_length(0);
    g.set_real_size(real);
    h.set_cksum();
    let mut layer = h.as_bytes().to_vec();
    layer.extend_from_slice(&[b'd'; 4096]);
    layer.extend_from_slice(&[0; 1024]);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/big"]}},"rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        sha(&layer)
    );
    let manifest = r#"[{"Config":"config.json","RepoTags":["x/sparse:1"],"Layers":["layer.tar"]}]"#;
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("manifest.json", manifest.as_bytes()),
        ("config.json", config.as_bytes()),
        ("layer.tar", &layer[..]),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    }
    std::fs::write(path, b.into_inner().unwrap()).unwrap();
}

fn import_req(path: &std::path::Path) -> petrel_cri::admin::ImportImageRequest {
    petrel_cri::admin::ImportImageRequest {
        path: path.display().to_string(),
        tags: vec![],
    }
}

#[tokio::test]
async fn a_layer_claiming_10_gib_of_sparse_file_should_be_stored_sparse_or_refused() {
    // Under a 1 GiB bound: refused before the file is made.
    let node = Node::start_with("max_layer_bytes = 1073741824");
    let mut c = node.clients().await;
    let archive = node.dir.path().join("sparse.tar");
    sparse_image_archive(&archive, 10 << 30);
    let err = c
        .admin
        .import_image(import_req(&archive))
        .await
        .expect_err("over the bound");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("\"big\""), "{err:?}");
    assert!(
        err.message().contains("over the limit of 1073741824 bytes"),
        "{err:?}"
    );
    let layers = node.root.join("images/layers");
    assert!(std::fs::read_dir(&layers).unwrap().next().is_none());
    assert!(std::fs::read_dir(node.root.join("images/tmp"))
        .unwrap()
        .next()
        .is_none());

    // Under the default bound: stored with holes, 10 GiB long, 4 KiB used.
    let node = Node::start();
    let mut c = node.clients().await;
    c.admin
        .import_image(import_req(&archive))
        .await
        .expect("sparse layer imported");
    let layer = std::fs::read_dir(node.root.join("images/layers"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let m = std::fs::metadata(layer.join("big")).unwrap();
    assert_eq!(m.len(), 10 << 30);
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&m) * 512 <= 64 << 10,
        "{} blocks",
        std::os::unix::fs::MetadataExt::blocks(&m)
    );
}
