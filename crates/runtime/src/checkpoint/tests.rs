//! CheckpointContainer and restores on the fake host: the archive written,
//! read back into a new container, the calls' refusals and what they leave.

use std::path::{Path, PathBuf};

use petrel_cri::api;

use super::archive;
use crate::parts::fake::{container_config, Call, Fault, TestRuntime};
use crate::records::ContainerState;

/// A runtime whose CRIU is a file that exists (the fake never runs it).
fn runtime() -> TestRuntime {
    TestRuntime::with_config(|c| c.criu_binary = PathBuf::from("/bin/sh"))
}

async fn checkpoint(t: &TestRuntime, id: &str, location: &Path) -> crate::error::Result<()> {
    t.rt.checkpoint_container(api::CheckpointContainerRequest {
        container_id: id.to_string(),
        location: location.display().to_string(),
        timeout: 10,
    })
    .await
    .map(drop)
}

async fn create_from(t: &TestRuntime, pod: &str, image: &str) -> crate::error::Result<String> {
    let mut config = container_config("restored");
    config.image = Some(api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    });
    t.rt.create_container(api::CreateContainerRequest {
        pod_sandbox_id: pod.to_string(),
        config: Some(config),
        sandbox_config: None,
    })
    .await
    .map(|r| r.container_id)
}

fn entries(archive: &Path) -> Vec<String> {
    let mut tar = tar::Archive::new(std::fs::File::open(archive).expect("open"));
    tar.entries()
        .expect("entries")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .display()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn checkpoint_should_write_the_archive_and_leave_the_container_running() {
    let t = runtime();
    let pod = t.pod("p").await;
    let id = t.run(&pod, "c").await;
    let location = t.dir.path().join("cp.tar");
    checkpoint(&t, &id, &location).await.expect("checkpoint");
    let names = entries(&location);
    for want in [
        "checkpoint/inventory.img",
        "config.dump",
        "spec.dump",
        "status.dump",
        "rootfs-diff.tar",
        "dump.log",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    let meta = archive::read_metadata(&location).expect("metadata");
    assert_eq!(meta.config.id, id);
    assert_eq!(meta.config.name, "c");
    assert_eq!(
        meta.config.rootfs_image_ref,
        t.stored(&id).expect("rec").image_id
    );
    assert_eq!(meta.status.expect("status")["id"], id.as_str());
    // Forensic: the container goes on, and nothing is left behind.
    assert_eq!(t.state(&id), Some(ContainerState::Running));
    let work: Vec<_> = std::fs::read_dir(t.rt.layout.root.join("checkpoints"))
        .expect("read")
        .flatten()
        .collect();
    assert!(work.is_empty(), "{work:?}");
}

#[tokio::test]
async fn checkpoint_should_refuse_unknown_stopped_and_unwritable_cases_cleanly() {
    let t = runtime();
    let pod = t.pod("p").await;
    let location = t.dir.path().join("cp.tar");
    let err = checkpoint(&t, "nope", &location)
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");

    let created = t.create(&pod, "created").await.expect("create");
    let err = checkpoint(&t, &created, &location)
        .await
        .expect_err("not running");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string().contains("only a running container"),
        "{err}"
    );

    let id = t.run(&pod, "c").await;
    let err = checkpoint(&t, &id, Path::new("/nonexistent-petrel/cp.tar"))
        .await
        .expect_err("no such directory");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("location"), "{err}");

    t.host.fail(Fault::OciCheckpoint, 1);
    let err = checkpoint(&t, &id, &location)
        .await
        .expect_err("dump fails");
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(!location.exists());
    let left: Vec<_> = std::fs::read_dir(t.dir.path())
        .expect("read")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("petrel-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(t.state(&id), Some(ContainerState::Running));
}

#[tokio::test]
async fn checkpoint_should_need_criu() {
    let t = TestRuntime::with_config(|c| c.criu_binary = PathBuf::from("/nonexistent/criu"));
    let pod = t.pod("p").await;
    let id = t.run(&pod, "c").await;
    let err = checkpoint(&t, &id, &t.dir.path().join("cp.tar"))
        .await
        .expect_err("no criu");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("/nonexistent/criu"), "{err}");
    assert!(!t
        .host
        .calls()
        .iter()
        .any(|c| matches!(c, Call::OciCheckpoint(_))));
}

#[tokio::test]
async fn create_from_an_archive_should_restore_and_start_without_runc_start() {
    let t = runtime();
    let pod = t.pod("p").await;
    let id = t.run(&pod, "c").await;
    let location = t.dir.path().join("cp.tar");
    checkpoint(&t, &id, &location).await.expect("checkpoint");
    let other = t.pod("q").await;
    let restored = create_from(&t, &other, &location.display().to_string())
        .await
        .expect("restore");
    let rec = t.stored(&restored).expect("record");
    assert_eq!(rec.state, ContainerState::Created);
    let from = rec.restored_from.expect("restored_from");
    assert_eq!(from.archive, location);
    // The container shows its base image, the archive in annotations.
    assert_eq!(
        rec.config.image.as_ref().map(|i| i.image.as_str()),
        Some(crate::parts::fake::IMAGE)
    );
    assert_eq!(
        rec.config.annotations.get("restored").map(String::as_str),
        Some("true")
    );
    // CRIU's images were needed only by the restore.
    assert!(!rec.layer_dir.join(super::restore::IMAGES_DIR).exists());
    t.rt.start_container(api::StartContainerRequest {
        container_id: restored.clone(),
    })
    .await
    .expect("start");
    assert!(t.wait_state(&restored, ContainerState::Running).await);
    assert!(
        !t.host
            .calls()
            .iter()
            .any(|c| *c == Call::OciStart(restored.clone())),
        "a restored container is not started again"
    );
}

#[tokio::test]
async fn create_from_a_file_that_is_not_a_checkpoint_should_name_the_image_and_leave_nothing() {
    let t = runtime();
    let pod = t.pod("p").await;
    let garbage = t.dir.path().join("garbage.tar");
    std::fs::write(&garbage, b"not a tar at all").expect("write");
    let err = create_from(&t, &pod, &garbage.display().to_string())
        .await
        .expect_err("garbage");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("config.image.image"), "{err}");
    assert!(
        err.to_string().contains("not a checkpoint archive"),
        "{err}"
    );
    assert!(t.rt.state.containers().is_empty());
    assert!(!t
        .host
        .calls()
        .iter()
        .any(|c| matches!(c, Call::ShimStart(_))));
}

#[tokio::test]
async fn restore_should_leave_nothing_when_the_shim_fails() {
    let t = runtime();
    let pod = t.pod("p").await;
    let id = t.run(&pod, "c").await;
    let location = t.dir.path().join("cp.tar");
    checkpoint(&t, &id, &location).await.expect("checkpoint");
    t.host.fail(Fault::ShimStart, 1);
    let err = create_from(&t, &pod, &location.display().to_string())
        .await
        .expect_err("shim fails");
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(
        t.rt.state.containers().len(),
        1,
        "only the original is left"
    );
    let layers: Vec<_> = std::fs::read_dir(t.rt.layout.root.join("containers"))
        .expect("read")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(layers, [id], "a restore's layer and images are removed");
}

#[tokio::test]
async fn checkpoint_past_its_timeout_should_answer_in_time_and_leave_nothing() {
    let t = runtime();
    let pod = t.pod("p").await;
    let id = t.run(&pod, "c").await;
    t.host
        .checkpoint_takes(std::time::Duration::from_millis(1500));
    let location = t.dir.path().join("cp.tar");
    let began = std::time::Instant::now();
    let err =
        t.rt.checkpoint_container(api::CheckpointContainerRequest {
            container_id: id.clone(),
            location: location.display().to_string(),
            timeout: 1,
        })
        .await
        .expect_err("too slow");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err}");
    assert!(began.elapsed() < std::time::Duration::from_millis(1400));
    // The dump is let finish (never cut short), then everything of it goes.
    let checkpoints = t.rt.layout.root.join("checkpoints");
    let cleared = t
        .host
        .wait_for(std::time::Duration::from_secs(5), |_| {
            std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_none())
        })
        .await;
    assert!(cleared, "checkpoint work directory left");
    assert!(!location.exists());
    assert_eq!(t.state(&id), Some(ContainerState::Running));
}
