//! ContainerStatus and ListContainers.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use petrel_cri::api;

use crate::error::Result;
use crate::records::ContainerState;
use crate::server::sandbox_list::{encoded_list, labels_match};
use crate::service::Runtime;
use crate::state::{Container, State};

impl Runtime {
    /// ContainerStatus.
    pub(crate) async fn container_status_rpc(
        self: &Arc<Self>,
        req: api::ContainerStatusRequest,
    ) -> Result<api::ContainerStatusResponse> {
        let c = self.container(&req.container_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            let v = c.with(|r| {
                serde_json::json!({
                    "id": r.id,
                    "sandboxId": r.sandbox_id,
                    "name": r.name,
                    "pid": r.pid,
                    "shimPid": r.shim.map(|s| s.pid),
                    "bundle": r.bundle,
                    "cgroupPath": r.cgroup_path,
                    "runtime": self.oci.binary(),
                    "runtimeRoot": self.oci.root(),
                    "config": r.config,
                })
            });
            let spec: Option<serde_json::Value> =
                std::fs::read(c.with(|r| r.bundle.join("config.json")))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
            let mut v = v;
            if let (Some(obj), Some(spec)) = (v.as_object_mut(), spec) {
                obj.insert("runtimeSpec".into(), spec);
            }
            info.insert("info".to_string(), v.to_string());
        }
        Ok(api::ContainerStatusResponse {
            status: Some(self.container_status(&c)),
            info,
        })
    }

    /// ListContainers.
    pub(crate) async fn list_containers(
        self: &Arc<Self>,
        req: api::ListContainersRequest,
    ) -> Result<api::ListContainersResponse> {
        let filter = req.filter.unwrap_or_default();
        let containers = select_containers(&self.state, &filter)
            .iter()
            .map(|c| c.with(cri_container))
            .collect();
        Ok(api::ListContainersResponse { containers })
    }
}

/// The containers a ListContainers filter selects, oldest first.
pub(crate) fn select_containers(
    state: &State,
    filter: &api::ContainerFilter,
) -> Vec<Arc<Container>> {
    let by_id = if filter.id.is_empty() {
        None
    } else {
        match state.container(&filter.id) {
            Some(c) => Some(c.id.clone()),
            None => return Vec::new(),
        }
    };
    let by_pod = if filter.pod_sandbox_id.is_empty() {
        None
    } else {
        match state.sandbox(&filter.pod_sandbox_id) {
            Some(sb) => Some(sb.id.clone()),
            None => return Vec::new(),
        }
    };
    let want_state = filter.state.as_ref().map(|s| s.state);
    let mut selected: Vec<(i64, Arc<Container>)> = state
        .containers()
        .into_iter()
        .filter_map(|c| {
            let created_at = c.with(|r| {
                let keep = r.state != ContainerState::Creating
                    && by_id.as_ref().is_none_or(|id| *id == r.id)
                    && by_pod.as_ref().is_none_or(|p| *p == r.sandbox_id)
                    && want_state.is_none_or(|s| s == r.state.to_cri() as i32)
                    && labels_match(&r.config.labels, &filter.label_selector);
                keep.then_some(r.created_at)
            })?;
            Some((created_at, c))
        })
        .collect();
    selected.sort_by_key(|(t, _)| *t);
    selected.into_iter().map(|(_, c)| c).collect()
}

/// ListContainers, answered as the encoded response: each container's
/// encoding is cached until its record changes, so a relist of a thousand
/// containers copies bytes instead of building and encoding a thousand
/// messages.
pub(crate) fn list_containers_encoded(state: &State, req: &api::ListContainersRequest) -> Bytes {
    let filter = req.filter.clone().unwrap_or_default();
    let build = || {
        let parts: Vec<Bytes> = select_containers(state, &filter)
            .iter()
            .map(|c| c.listing(encode_container))
            .collect();
        encoded_list(&parts)
    };
    if filter == api::ContainerFilter::default() {
        state.all_containers_listing(build)
    } else {
        build()
    }
}

/// The encoding of a container's listing entry.
pub(crate) fn encode_container(r: &crate::records::ContainerRecord) -> Bytes {
    Bytes::from(prost::Message::encode_to_vec(&cri_container(r)))
}

/// The CRI listing entry of a container.
pub(crate) fn cri_container(r: &crate::records::ContainerRecord) -> api::Container {
    api::Container {
        id: r.id.clone(),
        pod_sandbox_id: r.sandbox_id.clone(),
        metadata: r.config.metadata.clone(),
        image: r.config.image.clone(),
        image_ref: r.image_id.clone(),
        state: r.state.to_cri() as i32,
        created_at: r.created_at,
        labels: r.config.labels.clone(),
        annotations: r.config.annotations.clone(),
        image_id: r.image_id.clone(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::records::ContainerRecord;
    use std::collections::HashMap;

    pub(crate) fn record(id: &str, created_at: i64) -> ContainerRecord {
        ContainerRecord {
            id: id.to_string(),
            sandbox_id: "pod".into(),
            name: format!("{id}_pod"),
            config: api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: id.into(),
                    attempt: 1,
                }),
                image: Some(api::ImageSpec {
                    image: "docker.io/petrel/busybox:latest".into(),
                    ..Default::default()
                }),
                labels: HashMap::from([("a".into(), "b".into())]),
                annotations: HashMap::from([("c".into(), "d".into())]),
                ..Default::default()
            },
            image_id: "sha256:00".into(),
            state: ContainerState::Running,
            created_at,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: 0,
            init_start_time: 0,
            own_pid_ns: true,
            shim: None,
            bundle: "/b".into(),
            layer_dir: "/l".into(),
            log_path: None,
            cgroup_path: "/c".into(),
            resources: None,
            user: None,
            restored_from: None,
            image_volumes: Vec::new(),
        }
    }

    #[test]
    fn cached_listing_should_encode_exactly_like_the_typed_response() {
        let recs = [record("x", 1), record("y", 2)];
        let typed = api::ListContainersResponse {
            containers: recs.iter().map(cri_container).collect(),
        };
        let mut concatenated = bytes::BytesMut::new();
        for r in &recs {
            let c = Container::new(r.clone());
            let b =
                c.listing(|r| bytes::Bytes::from(prost::Message::encode_to_vec(&cri_container(r))));
            prost::encoding::encode_key(
                1,
                prost::encoding::WireType::LengthDelimited,
                &mut concatenated,
            );
            prost::encoding::encode_varint(b.len() as u64, &mut concatenated);
            concatenated.extend_from_slice(&b);
        }
        assert_eq!(prost::Message::encode_to_vec(&typed), concatenated.to_vec());
    }

    #[test]
    fn listing_cache_should_follow_record_changes() {
        let c = Container::new(record("x", 1));
        let build = |r: &ContainerRecord| {
            bytes::Bytes::from(prost::Message::encode_to_vec(&cri_container(r)))
        };
        let before = c.listing(build);
        let mut r = c.record();
        r.state = ContainerState::Exited;
        c.set(r);
        let after = c.listing(build);
        assert_ne!(before, after);
        let decoded: api::Container = prost::Message::decode(after).unwrap_or_default();
        assert_eq!(decoded.state, api::ContainerState::ContainerExited as i32);
    }

    /// Containers of two pods, inserted newest first, one being created.
    fn state() -> State {
        let s = State::default();
        for (pod, created_at) in [("pod1", 1), ("pod2", 2)] {
            let mut sb = crate::server::sandbox_list::tests::record(
                pod,
                crate::records::SandboxState::Ready,
                created_at,
                "web",
            );
            sb.id = format!("{pod}-sandbox");
            s.insert_sandbox(Arc::new(crate::state::Sandbox::new(sb)));
        }
        for (id, pod, state, created_at, app) in [
            ("c4", "pod2", ContainerState::Creating, 40, "web"),
            ("c3", "pod2", ContainerState::Running, 30, "db"),
            ("c2", "pod1", ContainerState::Exited, 20, "web"),
            ("c1", "pod1", ContainerState::Running, 10, "web"),
        ] {
            let mut r = record(id, created_at);
            r.sandbox_id = format!("{pod}-sandbox");
            r.state = state;
            r.config.labels = HashMap::from([("app".into(), app.into())]);
            s.insert_container(Arc::new(Container::new(r)));
        }
        s
    }

    /// The ids the encoded response lists, after checking that it is the
    /// typed response's encoding.
    fn listed(s: &State, filter: api::ContainerFilter) -> Vec<String> {
        let typed = api::ListContainersResponse {
            containers: select_containers(s, &filter)
                .iter()
                .map(|c| c.with(cri_container))
                .collect(),
        };
        let req = api::ListContainersRequest {
            filter: Some(filter),
        };
        let encoded = list_containers_encoded(s, &req);
        assert_eq!(encoded.to_vec(), prost::Message::encode_to_vec(&typed));
        typed.containers.into_iter().map(|c| c.id).collect()
    }

    fn in_state(st: api::ContainerState) -> api::ContainerFilter {
        api::ContainerFilter {
            state: Some(api::ContainerStateValue { state: st as i32 }),
            ..Default::default()
        }
    }

    #[test]
    fn encoded_listing_should_equal_the_typed_response_for_every_filter() {
        let s = state();
        assert_eq!(listed(&s, Default::default()), ["c1", "c2", "c3"]);
        assert_eq!(listed(&s, Default::default()), ["c1", "c2", "c3"]);
        let by_id = |id: &str| api::ContainerFilter {
            id: id.into(),
            ..Default::default()
        };
        assert_eq!(listed(&s, by_id("c2")), ["c2"]);
        assert!(listed(&s, by_id("c4")).is_empty(), "being created");
        assert!(listed(&s, by_id("zz")).is_empty());
        let by_pod = |p: &str| api::ContainerFilter {
            pod_sandbox_id: p.into(),
            ..Default::default()
        };
        assert_eq!(listed(&s, by_pod("pod1-sandbox")), ["c1", "c2"]);
        assert_eq!(listed(&s, by_pod("pod2")), ["c3"], "unique prefix");
        assert!(listed(&s, by_pod("pod")).is_empty(), "ambiguous prefix");
        assert!(listed(&s, by_pod("nope")).is_empty());
        assert_eq!(
            listed(&s, in_state(api::ContainerState::ContainerRunning)),
            ["c1", "c3"]
        );
        assert_eq!(
            listed(&s, in_state(api::ContainerState::ContainerExited)),
            ["c2"]
        );
        let by_app = |app: &str| api::ContainerFilter {
            label_selector: HashMap::from([("app".into(), app.into())]),
            ..Default::default()
        };
        assert_eq!(listed(&s, by_app("web")), ["c1", "c2"]);
        assert_eq!(listed(&s, by_app("db")), ["c3"]);
        let all = api::ContainerFilter {
            pod_sandbox_id: "pod1-sandbox".into(),
            ..by_app("web")
        };
        assert_eq!(listed(&s, all), ["c1", "c2"]);
    }

    #[test]
    fn encoded_listing_should_follow_state_changes_and_removal() {
        let s = state();
        let running = in_state(api::ContainerState::ContainerRunning);
        assert_eq!(listed(&s, running.clone()), ["c1", "c3"]);
        let c = s.container("c1").expect("inserted");
        let mut r = c.record();
        r.state = ContainerState::Exited;
        c.set(r);
        assert_eq!(listed(&s, running.clone()), ["c3"]);
        let c = s.container("c4").expect("inserted");
        let mut r = c.record();
        r.state = ContainerState::Running;
        c.set(r);
        assert_eq!(listed(&s, running.clone()), ["c3", "c4"]);
        s.remove_container("c3");
        assert_eq!(listed(&s, running), ["c4"]);
        assert_eq!(listed(&s, Default::default()), ["c1", "c2", "c4"]);
    }

    #[test]
    fn unfiltered_listing_should_be_cached_until_a_container_changes() {
        let s = state();
        let all = || list_containers_encoded(&s, &api::ListContainersRequest { filter: None });
        let first = all();
        // The same bytes, not a rebuilt copy: the whole answer was cached.
        assert_eq!(all().as_ptr(), first.as_ptr());
        assert_eq!(listed(&s, Default::default()), ["c1", "c2", "c3"]);

        // A record change, an insertion and a removal each rebuild it.
        let c = s.container("c1").expect("inserted");
        let mut r = c.record();
        r.state = ContainerState::Exited;
        c.set(r);
        let changed = all();
        assert_ne!(changed.as_ptr(), first.as_ptr());
        let decoded: api::ListContainersResponse =
            prost::Message::decode(changed.clone()).unwrap_or_default();
        assert_eq!(
            decoded.containers[0].state,
            api::ContainerState::ContainerExited as i32
        );
        let mut r = record("c5", 50);
        r.sandbox_id = "pod1-sandbox".into();
        s.insert_container(Arc::new(Container::new(r)));
        assert_eq!(listed(&s, Default::default()), ["c1", "c2", "c3", "c5"]);
        s.remove_container("c2");
        assert_eq!(listed(&s, Default::default()), ["c1", "c3", "c5"]);
        let settled = all();
        assert_eq!(all().as_ptr(), settled.as_ptr());
    }
}
