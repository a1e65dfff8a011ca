//! Measures the NRI path in-process over a socketpair: an SDK plugin answering
//! CreateContainer with an adjustment, called through the runtime-side `PluginConn`
//! (round-trip latency percentiles), and a Synchronize of 1000 containers.
//!
//! `cargo run --release -p petrel-nri --example roundtrip`

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_nri::adaptation::{ConnOptions, PluginConn, Registration, RuntimeHandler};
use petrel_nri::api;
use petrel_nri::stub::Stub;
use petrel_nri::ttrpc::Status;
use tokio::net::UnixStream;

struct NoUpdates;

impl RuntimeHandler for NoUpdates {
    fn update_containers(
        &self,
        _plugin: &Registration,
        _req: api::UpdateContainersRequest,
    ) -> impl Future<Output = Result<api::UpdateContainersResponse, Status>> + Send {
        std::future::ready(Ok(api::UpdateContainersResponse::default()))
    }
}

/// A container as a runtime would describe it: a few labels, env, mounts, resources.
fn container(i: usize) -> api::Container {
    let mut c = api::Container {
        id: format!("{i:064x}"),
        pod_sandbox_id: format!("{:064x}", i / 2),
        name: format!("container-{i}"),
        state: api::ContainerState::ContainerRunning as i32,
        args: vec!["/bin/sh".into(), "-c".into(), "sleep 3600".into()],
        env: (0..10).map(|e| format!("VAR_{e}=value-{e}")).collect(),
        ..Default::default()
    };
    for l in [
        "app",
        "tier",
        "io.kubernetes.pod.name",
        "io.kubernetes.pod.namespace",
    ] {
        c.labels.insert(l.into(), format!("{l}-value"));
    }
    c.mounts = (0..4)
        .map(|m| api::Mount {
            destination: format!("/mnt/{m}"),
            r#type: "bind".into(),
            source: format!("/var/lib/petrel/volumes/{i}/{m}"),
            options: vec!["rbind".into(), "rw".into()],
        })
        .collect();
    c
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (a, b) = UnixStream::pair()?;
    let stub = Stub::builder(())
        .name("bench")
        .index("01")
        .connection(b)
        .on_create_container(|_s, _req: api::CreateContainerRequest| async {
            let mut adjust = api::ContainerAdjustment::default();
            adjust.annotations.insert("bench".into(), "1".into());
            Ok(api::CreateContainerResponse {
                adjust: Some(adjust),
                ..Default::default()
            })
        })
        .on_synchronize(|_s, _pods, ctrs| async move {
            assert_eq!(ctrs.len(), 1000);
            Ok(vec![])
        })
        .build()?;
    tokio::spawn(stub.run());
    let conn = PluginConn::accept(a, Arc::new(NoUpdates), ConnOptions::default()).await?;
    conn.configure("", "petrel", "bench").await?;

    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: "p".into(),
            name: "pod".into(),
            ..Default::default()
        }),
        container: Some(container(1)),
    };
    for _ in 0..200 {
        conn.create_container(&req).await?;
    }
    let mut samples: Vec<Duration> = Vec::with_capacity(5000);
    for _ in 0..5000 {
        let t = Instant::now();
        conn.create_container(&req).await?;
        samples.push(t.elapsed());
    }
    samples.sort();
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p) as usize];
    println!(
        "CreateContainer round trip (5000 calls): p50 {:?}  p90 {:?}  p99 {:?}",
        pct(0.5),
        pct(0.9),
        pct(0.99)
    );

    let pods: Vec<api::PodSandbox> = (0..500)
        .map(|i| api::PodSandbox {
            id: format!("{i:064x}"),
            name: format!("pod-{i}"),
            namespace: "default".into(),
            ..Default::default()
        })
        .collect();
    let ctrs: Vec<api::Container> = (0..1000).map(container).collect();
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        conn.synchronize(&pods, &ctrs).await?;
        times.push(t.elapsed());
    }
    times.sort();
    use prost::Message;
    let size = api::SynchronizeRequest {
        pods: pods.clone(),
        containers: ctrs.clone(),
        more: false,
    }
    .encoded_len();
    println!(
        "Synchronize of 500 pods + 1000 containers ({} KiB): median {:?} of 10",
        size / 1024,
        times[5]
    );
    conn.close().await;
    Ok(())
}
