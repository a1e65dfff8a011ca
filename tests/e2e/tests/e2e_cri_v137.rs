//! The calls CRI v1 gained up to cri-api v0.37, against a real runtime: the
//! streamed List calls (KEP-5825) answer what the List calls do, with the
//! same filters, each item once, in non-empty batches; a listing larger than
//! a batch is cut; UpdatePodSandboxResources; CheckpointPod and RestorePod
//! refused naming themselves.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::prelude::*;
use tonic::Streaming;

/// Every batch of a stream, after checking it ended cleanly.
async fn drain<T>(mut s: Streaming<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(m) = s.message().await.expect("stream ends without error") {
        out.push(m);
    }
    out
}

/// The ids of every batch, checking that no batch is empty and that no id
/// comes twice; sorted.
fn ids_once(batches: Vec<Vec<String>>) -> Vec<String> {
    let mut seen = HashSet::new();
    for b in &batches {
        assert!(
            !b.is_empty(),
            "a streamed response carries at least one item"
        );
        for id in b {
            assert!(seen.insert(id.clone()), "{id} streamed twice");
        }
    }
    let mut ids: Vec<String> = seen.into_iter().collect();
    ids.sort();
    ids
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn label(k: &str, v: &str) -> HashMap<String, String> {
    HashMap::from([(k.to_string(), v.to_string())])
}

#[tokio::test]
async fn stream_rpcs_should_answer_what_the_list_rpcs_do_with_the_same_filters() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pa = node.pod_config("alpha");
    let pb = node.pod_config("beta");
    let a = c.run_pod(pa.clone()).await;
    let b = c.run_pod(pb.clone()).await;
    let a1 = c.run(&a, &pa, sh_container("a1", "sleep 1000")).await;
    let a2 = c.create(&a, &pa, sh_container("a2", "true")).await.unwrap();
    let b1 = c.run(&b, &pb, sh_container("b1", "sleep 1000")).await;

    // Pods: all, then by label.
    for filter in [
        None,
        Some(api::PodSandboxFilter {
            label_selector: label("test", "beta"),
            ..Default::default()
        }),
    ] {
        let list =
            c.rt.list_pod_sandbox(api::ListPodSandboxRequest {
                filter: filter.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .items;
        let streamed = drain(
            c.rt.stream_pod_sandboxes(api::StreamPodSandboxesRequest { filter })
                .await
                .unwrap()
                .into_inner(),
        )
        .await;
        let streamed = ids_once(
            streamed
                .into_iter()
                .map(|r| r.pod_sandboxes.into_iter().map(|p| p.id).collect())
                .collect(),
        );
        assert_eq!(streamed, sorted(list.into_iter().map(|p| p.id).collect()));
    }
    let only_b = drain(
        c.rt.stream_pod_sandboxes(api::StreamPodSandboxesRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: label("test", "beta"),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    assert_eq!(
        ids_once(
            only_b
                .into_iter()
                .map(|r| r.pod_sandboxes.into_iter().map(|p| p.id).collect())
                .collect()
        ),
        vec![b.clone()]
    );

    // Containers: all, then of pod a, then running ones of pod a.
    let running = Some(api::ContainerStateValue {
        state: api::ContainerState::ContainerRunning as i32,
    });
    let filters = [
        (None, sorted(vec![a1.clone(), a2.clone(), b1.clone()])),
        (
            Some(api::ContainerFilter {
                pod_sandbox_id: a.clone(),
                ..Default::default()
            }),
            sorted(vec![a1.clone(), a2.clone()]),
        ),
        (
            Some(api::ContainerFilter {
                pod_sandbox_id: a.clone(),
                state: running,
                ..Default::default()
            }),
            vec![a1.clone()],
        ),
    ];
    for (filter, want) in filters {
        let list =
            c.rt.list_containers(api::ListContainersRequest {
                filter: filter.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert_eq!(sorted(list.into_iter().map(|c| c.id).collect()), want);
        let streamed = drain(
            c.rt.stream_containers(api::StreamContainersRequest { filter })
                .await
                .unwrap()
                .into_inner(),
        )
        .await;
        let streamed = ids_once(
            streamed
                .into_iter()
                .map(|r| r.containers.into_iter().map(|c| c.id).collect())
                .collect(),
        );
        assert_eq!(streamed, want);
    }

    // Container stats of pod a; pod stats of pod b.
    let stats_filter = Some(api::ContainerStatsFilter {
        pod_sandbox_id: a.clone(),
        ..Default::default()
    });
    let list =
        c.rt.list_container_stats(api::ListContainerStatsRequest {
            filter: stats_filter.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats;
    let stat_id = |s: &api::ContainerStats| s.attributes.as_ref().unwrap().id.clone();
    let streamed = drain(
        c.rt.stream_container_stats(api::StreamContainerStatsRequest {
            filter: stats_filter,
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    let streamed_ids = ids_once(
        streamed
            .iter()
            .map(|r| r.container_stats.iter().map(stat_id).collect())
            .collect(),
    );
    assert_eq!(streamed_ids, sorted(list.iter().map(stat_id).collect()));
    assert_eq!(streamed_ids, sorted(vec![a1.clone(), a2.clone()]));
    assert!(
        streamed
            .iter()
            .flat_map(|r| &r.container_stats)
            .any(|s| stat_id(s) == a1 && s.memory.is_some()),
        "the running container's stats carry its memory"
    );

    let pod_filter = Some(api::PodSandboxStatsFilter {
        id: b.clone(),
        ..Default::default()
    });
    let pod_id = |s: &api::PodSandboxStats| s.attributes.as_ref().unwrap().id.clone();
    let streamed = drain(
        c.rt.stream_pod_sandbox_stats(api::StreamPodSandboxStatsRequest {
            filter: pod_filter.clone(),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    let streamed_pods: Vec<&api::PodSandboxStats> =
        streamed.iter().flat_map(|r| &r.pod_sandbox_stats).collect();
    assert_eq!(
        streamed_pods.iter().map(|s| pod_id(s)).collect::<Vec<_>>(),
        vec![b.clone()]
    );
    let containers_of_b: Vec<String> = streamed_pods[0]
        .linux
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(stat_id)
        .collect();
    assert_eq!(containers_of_b, vec![b1.clone()]);
    let listed =
        c.rt.list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter: pod_filter })
            .await
            .unwrap()
            .into_inner()
            .stats;
    assert_eq!(
        listed.iter().map(pod_id).collect::<Vec<_>>(),
        vec![b.clone()]
    );

    // Pod metrics: every ready pod, once.
    let listed =
        c.rt.list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner()
            .pod_metrics;
    let streamed = drain(
        c.rt.stream_pod_sandbox_metrics(api::StreamPodSandboxMetricsRequest {})
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    let streamed_metrics: Vec<&api::PodSandboxMetrics> = streamed
        .iter()
        .flat_map(|r| &r.pod_sandbox_metrics)
        .collect();
    let streamed_ids = ids_once(
        streamed
            .iter()
            .map(|r| {
                r.pod_sandbox_metrics
                    .iter()
                    .map(|m| m.pod_sandbox_id.clone())
                    .collect()
            })
            .collect(),
    );
    assert_eq!(
        streamed_ids,
        sorted(listed.iter().map(|m| m.pod_sandbox_id.clone()).collect())
    );
    assert_eq!(streamed_ids, sorted(vec![a.clone(), b.clone()]));
    assert!(
        streamed_metrics
            .iter()
            .all(|m| !m.metrics.is_empty() || !m.container_metrics.is_empty()),
        "each pod's metrics are filled in"
    );

    // Images: all, then by reference.
    let all = c
        .img
        .list_images(api::ListImagesRequest { filter: None })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(!all.is_empty());
    let streamed = drain(
        c.img
            .stream_images(api::StreamImagesRequest { filter: None })
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(
        ids_once(
            streamed
                .into_iter()
                .map(|r| r.images.into_iter().map(|i| i.id).collect())
                .collect()
        ),
        sorted(all.iter().map(|i| i.id.clone()).collect())
    );
    let one = drain(
        c.img
            .stream_images(api::StreamImagesRequest {
                filter: Some(api::ImageFilter {
                    image: Some(api::ImageSpec {
                        image: BUSYBOX.to_string(),
                        ..Default::default()
                    }),
                }),
            })
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    let one: Vec<&api::Image> = one.iter().flat_map(|r| &r.images).collect();
    assert_eq!(one.len(), 1);
    assert!(
        one[0].repo_tags.iter().any(|t| t == BUSYBOX),
        "{:?}",
        one[0]
    );

    // Nothing matches: the stream ends without a response.
    let none = drain(
        c.rt.stream_containers(api::StreamContainersRequest {
            filter: Some(api::ContainerFilter {
                id: "ffffffffffff".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    assert!(none.is_empty(), "{none:?}");

    for pod in [&a, &b] {
        c.remove_pod(pod).await.unwrap();
    }
}

#[tokio::test]
async fn stream_containers_should_cut_a_listing_larger_than_a_batch() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("big");
    let pod = c.run_pod(pc.clone()).await;
    // 12 containers of ~100 KiB each: more than the 1 MiB a batch holds.
    let mut want = Vec::new();
    for i in 0..12 {
        let mut cfg = sh_container(&format!("c{i}"), "true");
        cfg.annotations
            .insert("filler".into(), "x".repeat(100 * 1024));
        want.push(c.create(&pod, &pc, cfg).await.unwrap());
    }
    let streamed = drain(
        c.rt.stream_containers(api::StreamContainersRequest {
            filter: Some(api::ContainerFilter {
                pod_sandbox_id: pod.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    assert!(
        streamed.len() >= 2,
        "{} responses for a listing over 1 MiB",
        streamed.len()
    );
    for r in &streamed {
        assert!(prost::Message::encoded_len(r) <= (1 << 20) + 64);
    }
    let got = ids_once(
        streamed
            .into_iter()
            .map(|r| r.containers.into_iter().map(|c| c.id).collect())
            .collect(),
    );
    assert_eq!(got, sorted(want));
    c.remove_pod(&pod).await.unwrap();
}

#[tokio::test]
async fn update_pod_sandbox_resources_should_record_a_pods_resources_and_refuse_unknown_pods() {
    let node = Node::start();
    let mut c = node.clients().await;
    let pc = node.pod_config("resize");
    let pod = c.run_pod(pc).await;
    let resources = api::LinuxContainerResources {
        cpu_shares: 512,
        memory_limit_in_bytes: 256 << 20,
        ..Default::default()
    };
    c.rt.update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest {
        pod_sandbox_id: pod.clone(),
        overhead: None,
        resources: Some(resources.clone()),
    })
    .await
    .unwrap();
    // The verbose status shows the pod's config as recorded.
    let info =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info;
    let text = info.values().cloned().collect::<Vec<_>>().join("\n");
    assert!(
        text.contains(&(256u64 << 20).to_string()),
        "the new memory limit is in the pod's recorded config: {text}"
    );

    let err =
        c.rt.update_pod_sandbox_resources(api::UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "ffffffffffff".into(),
            overhead: None,
            resources: Some(resources),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    c.remove_pod(&pod).await.unwrap();
}

#[tokio::test]
async fn pod_checkpoint_rpcs_should_answer_unimplemented_naming_the_rpc() {
    let node = Node::start();
    let mut c = node.clients().await;
    let err =
        c.rt.checkpoint_pod(api::CheckpointPodRequest {
            pod_sandbox_id: "ffffffffffff".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    assert!(err.message().contains("CheckpointPod"), "{err:?}");
    let err =
        c.rt.restore_pod(api::RestorePodRequest::default())
            .await
            .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    assert!(err.message().contains("RestorePod"), "{err:?}");
    // The runtime still answers.
    tokio::time::timeout(
        Duration::from_secs(5),
        c.rt.version(api::VersionRequest::default()),
    )
    .await
    .unwrap()
    .unwrap();
}
