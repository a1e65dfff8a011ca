//! A launched plugin: socket and identity from the environment, as the runtime sets
//! them. A test binary of its own, because it sets process-wide environment variables
//! that would redirect other tests' plugins (under `cargo test` tests share a process).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use petrel_nri::adaptation::{
    plugin_socketpair, ConnOptions, PluginConn, Registration, RuntimeHandler,
};
use petrel_nri::api::{self, Event, EventMask};
use petrel_nri::stub::{Stub, StubError};
use petrel_nri::ttrpc::Status;

struct NoUpdates;

impl RuntimeHandler for NoUpdates {
    async fn update_containers(
        &self,
        _plugin: &Registration,
        _req: api::UpdateContainersRequest,
    ) -> Result<api::UpdateContainersResponse, Status> {
        Ok(api::UpdateContainersResponse::default())
    }
}

#[tokio::test]
async fn inherited_socket_and_identity_from_the_environment() {
    use std::os::fd::IntoRawFd;
    tokio::time::timeout(Duration::from_secs(15), async {
        let (runtime_end, plugin_fd) = plugin_socketpair().unwrap();
        let std_stream = std::os::unix::net::UnixStream::from(plugin_fd);
        let fd = std_stream.into_raw_fd();
        std::env::set_var(api::PLUGIN_SOCKET_ENV, fd.to_string());
        std::env::set_var(api::PLUGIN_NAME_ENV, "launched");
        std::env::set_var(api::PLUGIN_IDX_ENV, "07");

        let stub = Stub::builder(())
            .on_post_start_container(|_s, _req| async { Ok(()) })
            .build()
            .unwrap();
        assert_eq!((stub.name(), stub.index()), ("launched", "07"));
        let plugin = tokio::spawn(stub.run());

        let conn = PluginConn::accept(runtime_end, Arc::new(NoUpdates), ConnOptions::default())
            .await
            .unwrap();
        assert_eq!(conn.registration().qualified_name(), "07-launched");
        let mask = conn.configure("", "petrel", "0").await.unwrap();
        assert_eq!(mask, EventMask::of(Event::PostStartContainer));

        // The runtime goes away without Shutdown: the plugin ends with the cause.
        conn.close().await;
        let result = plugin.await.unwrap();
        assert!(
            matches!(result, Err(StubError::Disconnected(_))),
            "{result:?}"
        );

        // The fd can be taken only once per process.
        let again = Stub::builder(())
            .on_post_start_container(|_s, _req| async { Ok(()) })
            .build();
        assert!(matches!(again, Err(StubError::InheritedSocket(_))));
    })
    .await
    .expect("test took too long");
}
