//! Measures one NRI call to a plugin in another process after the machine has
//! been idle for a while (how CreateContainer meets a plugin), next to a raw
//! round trip of a few bytes over a unix socket between the same two
//! processes: the floor any out-of-process plugin pays.
//!
//! `cargo run --release -p petrel-nri --example coldcall -- [gap-ms...]`

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_nri::adaptation::{ConnOptions, PluginConn, Registration, RuntimeHandler};
use petrel_nri::api;
use petrel_nri::stub::Stub;
use petrel_nri::ttrpc::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

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

type AnyError = Box<dyn std::error::Error>;

async fn child(kind: &str, path: &str) -> Result<(), AnyError> {
    match kind {
        "echo" => {
            let mut s = UnixStream::connect(path).await?;
            let mut buf = [0u8; 64];
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok(());
                }
                s.write_all(&buf[..n]).await?;
            }
        }
        _ => {
            let stub = Stub::builder(())
                .name("cold")
                .index("01")
                .socket_path(path)
                .no_reconnect()
                .on_create_container(|_s, _req: api::CreateContainerRequest| async {
                    let mut adjust = api::ContainerAdjustment::default();
                    adjust.env.push(api::KeyValue {
                        key: "COLD".into(),
                        value: "1".into(),
                    });
                    Ok(api::CreateContainerResponse {
                        adjust: Some(adjust),
                        ..Default::default()
                    })
                })
                .build()?;
            // The parent closing the connection ends the run: not an error here.
            let _ = stub.run().await;
            Ok(())
        }
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

async fn parent(gaps: Vec<u64>) -> Result<(), AnyError> {
    let dir = std::env::temp_dir().join(format!("coldcall-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = std::env::current_exe()?;
    let echo_path = dir.join("echo.sock");
    let nri_path = dir.join("nri.sock");
    let echo_l = UnixListener::bind(&echo_path)?;
    let nri_l = UnixListener::bind(&nri_path)?;
    let mut echo_child = std::process::Command::new(&exe)
        .args(["child", "echo", &echo_path.to_string_lossy()])
        .spawn()?;
    let mut nri_child = std::process::Command::new(&exe)
        .args(["child", "plugin", &nri_path.to_string_lossy()])
        .spawn()?;
    let (mut echo, _) = echo_l.accept().await?;
    let (nri, _) = nri_l.accept().await?;
    let conn = PluginConn::accept(nri, Arc::new(NoUpdates), ConnOptions::default()).await?;
    conn.configure("", "petrel", "cold").await?;
    let req = api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: "p".into(),
            name: "pod".into(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: "c".repeat(64),
            name: "ctr".into(),
            args: vec!["sleep".into(), "1000".into()],
            env: (0..5).map(|e| format!("VAR_{e}=value-{e}")).collect(),
            ..Default::default()
        }),
    };
    let mut buf = [0u8; 32];
    for gap in gaps {
        let (mut raw, mut call) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(gap)).await;
            let t = Instant::now();
            echo.write_all(&[7u8; 32]).await?;
            echo.read_exact(&mut buf).await?;
            raw.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(gap)).await;
            let t = Instant::now();
            conn.create_container(&req).await?;
            call.push(t.elapsed());
        }
        println!(
            "gap {gap:>3} ms: raw p50 {:>7.1?} p90 {:>7.1?} | nri call p50 {:>7.1?} p90 {:>7.1?}",
            pct(&mut raw, 0.5),
            pct(&mut raw, 0.9),
            pct(&mut call, 0.5),
            pct(&mut call, 0.9)
        );
    }
    drop(echo);
    conn.close().await;
    let _ = echo_child.wait();
    let _ = nri_child.kill();
    let _ = nri_child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() -> Result<(), AnyError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flavor = std::env::var("COLD_FLAVOR").unwrap_or_default();
    let rt = if flavor == "current" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    };
    if args.first().map(String::as_str) == Some("child") {
        return rt.block_on(child(&args[1], &args[2]));
    }
    let gaps = if args.is_empty() {
        vec![0, 1, 50]
    } else {
        args.iter().filter_map(|a| a.parse().ok()).collect()
    };
    rt.block_on(parent(gaps))
}
