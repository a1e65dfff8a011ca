//! Listing with filters, statuses, stats, runtime info and images, against
//! a real runtime.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::prelude::*;

fn label(k: &str, v: &str) -> HashMap<String, String> {
    HashMap::from([(k.to_string(), v.to_string())])
}

#[tokio::test]
async fn lists_should_filter_by_id_state_pod_and_labels() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pa = node.pod_config("alpha");
    let pb = node.pod_config("beta");
    let a = c.run_pod(pa.clone()).await;
    let b = c.run_pod(pb.clone()).await;
    let a1 = c.run(&a, &pa, sh_container("a1", "sleep 1000")).await;
    let a2 = c.create(&a, &pa, sh_container("a2", "true")).await.unwrap();
    let b1 = c.run(&b, &pb, sh_container("b1", "exit 0")).await;
    c.wait_state(
        &b1,
        api::ContainerState::ContainerExited,
        Duration::from_secs(5),
    )
    .await;
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: b.clone(),
    })
    .await
    .unwrap();

    let rt0 = c.rt.clone();
    let pods = |f: api::PodSandboxFilter| {
        let mut rt = rt0.clone();
        async move {
            let mut ids: Vec<String> = rt
                .list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(f) })
                .await
                .unwrap()
                .into_inner()
                .items
                .into_iter()
                .map(|p| p.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(pods(api::PodSandboxFilter::default()).await, both);
    assert_eq!(
        pods(api::PodSandboxFilter {
            id: a[..12].to_string(),
            ..Default::default()
        })
        .await,
        vec![a.clone()]
    );
    let ready = Some(api::PodSandboxStateValue {
        state: api::PodSandboxState::SandboxReady as i32,
    });
    assert_eq!(
        pods(api::PodSandboxFilter {
            state: ready,
            ..Default::default()
        })
        .await,
        vec![a.clone()]
    );
    assert_eq!(
        pods(api::PodSandboxFilter {
            label_selector: label("test", "beta"),
            ..Default::default()
        })
        .await,
        vec![b.clone()]
    );
    assert!(pods(api::PodSandboxFilter {
        label_selector: label("test", "gamma"),
        ..Default::default()
    })
    .await
    .is_empty());
    assert!(pods(api::PodSandboxFilter {
        id: "ffffffffffff".into(),
        ..Default::default()
    })
    .await
    .is_empty());

    let ctrs = |f: api::ContainerFilter| {
        let mut rt = rt0.clone();
        async move {
            let mut ids: Vec<String> = rt
                .list_containers(api::ListContainersRequest { filter: Some(f) })
                .await
                .unwrap()
                .into_inner()
                .containers
                .into_iter()
                .map(|c| c.id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(ctrs(api::ContainerFilter::default()).await.len(), 3);
    let mut in_a = vec![a1.clone(), a2.clone()];
    in_a.sort();
    assert_eq!(
        ctrs(api::ContainerFilter {
            pod_sandbox_id: a.clone(),
            ..Default::default()
        })
        .await,
        in_a
    );
    let running = Some(api::ContainerStateValue {
        state: api::ContainerState::ContainerRunning as i32,
    });
    assert_eq!(
        ctrs(api::ContainerFilter {
            state: running,
            ..Default::default()
        })
        .await,
        vec![a1.clone()]
    );
    let created = Some(api::ContainerStateValue {
        state: api::ContainerState::ContainerCreated as i32,
    });
    assert_eq!(
        ctrs(api::ContainerFilter {
            state: created,
            ..Default::default()
        })
        .await,
        vec![a2.clone()]
    );
    assert_eq!(
        ctrs(api::ContainerFilter {
            label_selector: label("container", "b1"),
            ..Default::default()
        })
        .await,
        vec![b1.clone()]
    );
    assert_eq!(
        ctrs(api::ContainerFilter {
            id: a1[..10].to_string(),
            ..Default::default()
        })
        .await,
        vec![a1.clone()]
    );

    // Stats follow the same filters; pod stats include their containers.
    let stats =
        c.rt.list_container_stats(api::ListContainerStatsRequest {
            filter: Some(api::ContainerStatsFilter {
                pod_sandbox_id: a.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(stats.len(), 2);
    let ps =
        c.rt.pod_sandbox_stats(api::PodSandboxStatsRequest {
            pod_sandbox_id: a.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    let linux = ps.linux.unwrap();
    assert_eq!(linux.containers.len(), 2);
    assert!(linux.memory.unwrap().working_set_bytes.is_some());
    assert!(linux.process.unwrap().process_count.unwrap().value >= 1);
    let all =
        c.rt.list_pod_sandbox_stats(api::ListPodSandboxStatsRequest {
            filter: Some(api::PodSandboxStatsFilter {
                label_selector: label("test", "alpha"),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    assert_eq!(all.len(), 1);

    // A created, never started container can be removed.
    c.remove(&a2).await.unwrap();
    assert_eq!(
        ctrs(api::ContainerFilter {
            pod_sandbox_id: a.clone(),
            ..Default::default()
        })
        .await,
        vec![a1]
    );
}

/// kubelet's EventedPLEG takes PodSandboxStatus's container statuses as the
/// pod's and picks the first of each name: attempts must come newest first.
#[tokio::test]
async fn pod_sandbox_status_should_list_containers_newest_first() {
    let node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    let pc = node.pod_config("attempts");
    let pod = c.run_pod(pc.clone()).await;
    let mut ids = Vec::new();
    // Five attempts of one container: ids are random, so id order matches
    // creation order by chance once in 120.
    for attempt in 0..5 {
        let mut cfg = sh_container("c", "exit 0");
        cfg.metadata.as_mut().unwrap().attempt = attempt;
        ids.push(c.create(&pod, &pc, cfg).await.unwrap());
    }
    let st =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(st.timestamp > 0);
    let attempts: Vec<u32> = st
        .containers_statuses
        .iter()
        .map(|s| s.metadata.as_ref().unwrap().attempt)
        .collect();
    assert_eq!(attempts, [4, 3, 2, 1, 0]);
    let newest: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    let listed: Vec<&str> = st
        .containers_statuses
        .iter()
        .map(|s| s.id.as_str())
        .collect();
    assert_eq!(listed, newest);
}

#[tokio::test]
async fn runtime_info_should_describe_petrel() {
    let node = Node::start();
    let mut c = node.clients().await;
    let v =
        c.rt.version(api::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("petrel", "v1")
    );
    let s =
        c.rt.status(api::StatusRequest { verbose: true })
            .await
            .unwrap()
            .into_inner();
    let conds = s.status.unwrap().conditions;
    assert!(conds.iter().any(|c| c.r#type == "RuntimeReady" && c.status));
    assert!(s.info.contains_key("cgroupVersion"));
    let rc =
        c.rt.runtime_config(api::RuntimeConfigRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(
        rc.linux.unwrap().cgroup_driver,
        api::CgroupDriver::Cgroupfs as i32
    );
}

#[tokio::test]
async fn images_should_import_list_and_refuse_removal_while_used() {
    let node = Node::start();
    let mut c = node.clients().await;
    let id = node.import_busybox(&mut c).await;
    // The docker archive of the same image adds a tag to the same id.
    let r = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: images_dir()
                .join("busybox-docker.tar")
                .display()
                .to_string(),
            tags: vec!["example.com/extra:1".into()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.images[0].id, id);
    let list = c
        .img
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(list.len(), 1);
    assert!(list[0].repo_tags.contains(&BUSYBOX.to_string()));
    assert!(list[0]
        .repo_tags
        .contains(&"example.com/extra:1".to_string()));
    let st = c
        .img
        .image_status(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(st.image.unwrap().id, id);
    assert!(st.info["info"].contains("busybox") || st.info["info"].contains("Cmd"));
    let none = c
        .img
        .image_status(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: "nope:1".into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.image.is_none());
    let fs = c
        .img
        .image_fs_info(api::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(fs.image_filesystems[0].used_bytes.as_ref().unwrap().value > 0);

    let pc = node.pod_config("img");
    let pod = c.run_pod(pc.clone()).await;
    let ctr = c.run(&pod, &pc, sh_container("user", "sleep 1000")).await;
    let e = c
        .img
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains(&ctr), "{}", e.message());
    c.remove_pod(&pod).await.unwrap();
    // One of two tags: only the tag goes (docker's untag semantics).
    c.img
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: "example.com/extra:1".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let left = c
        .img
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(left.len(), 1);
    assert!(!left[0]
        .repo_tags
        .contains(&"example.com/extra:1".to_string()));
    // The id removes the image with its remaining tags.
    c.img
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert!(c
        .img
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images
        .is_empty());
    let layers = std::fs::read_dir(node.root.join("images/layers"))
        .map(|it| it.count())
        .unwrap_or(0);
    assert_eq!(layers, 0, "unused layers are removed with the image");
    // A bad archive path names the field.
    let e = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: "/nonexistent.tar".into(),
            tags: vec![],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("path"), "{}", e.message());
}

#[tokio::test]
async fn recovery_should_remove_its_own_orphans_and_nothing_else() {
    let mut node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("keep");
    let pod = c.run_pod(pc.clone()).await;
    let keep = c.run(&pod, &pc, sh_container("keep", "sleep 1000")).await;
    node.terminate();
    // Debris no record names: an orphan bundle and writable layer with
    // container-id names, and a file that is not ours to judge.
    let orphan = "ab".repeat(32);
    std::fs::create_dir_all(node.state.join("containers").join(&orphan).join("rootfs")).unwrap();
    std::fs::create_dir_all(node.root.join("containers").join(&orphan).join("upper")).unwrap();
    let foreign = node.state.join("containers").join("not-an-id");
    std::fs::write(&foreign, "keep me").unwrap();
    node.restart();
    let mut c = node.clients().await;
    assert!(!node.state.join("containers").join(&orphan).exists());
    assert!(!node.root.join("containers").join(&orphan).exists());
    assert!(foreign.exists(), "a file that is not an id was touched");
    assert_eq!(
        c.status(&keep).await.state,
        api::ContainerState::ContainerRunning as i32
    );
    assert!(
        node.log().contains("interrupted create removed"),
        "{}",
        node.log()
    );
}
