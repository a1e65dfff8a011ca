//! PodSandboxStatus and ListPodSandbox.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use petrel_cri::api;

use crate::error::Result;
use crate::records::{SandboxRecord, SandboxState};
use crate::service::Runtime;
use crate::state::{Sandbox, State};
use crate::util;

/// Whether every `selector` label is present with the same value.
pub(crate) fn labels_match(
    labels: &HashMap<String, String>,
    selector: &HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl Runtime {
    /// PodSandboxStatus.
    pub(crate) async fn pod_sandbox_status(
        self: &Arc<Self>,
        req: api::PodSandboxStatusRequest,
    ) -> Result<api::PodSandboxStatusResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            info.insert("info".to_string(), self.sandbox_info(&sb));
            // What the last CNI CHECK said (recovery runs one after a
            // restart). Status never runs one itself: a CHECK execs every
            // plugin of the chain, ten times the cost of the rest of the
            // answer, and containerd does not either.
            if let Some(check) = sb
                .network_check()
                .filter(|_| sb.with(|r| r.network.is_some()))
            {
                info.insert("networkCheck".to_string(), check);
            }
        }
        Ok(api::PodSandboxStatusResponse {
            status: Some(self.sandbox_status(&sb)),
            info,
            containers_statuses: self.pod_container_statuses(&sb),
            timestamp: util::now_ns(),
        })
    }

    fn sandbox_info(&self, sb: &Sandbox) -> String {
        sb.with(|r| {
            serde_json::json!({
                "id": r.id,
                "name": r.name,
                "state": r.state,
                "runtimeHandler": r.runtime_handler,
                "cgroupParent": r.cgroup_parent,
                "netns": r.netns,
                "ipcns": r.ipcns,
                "utsns": r.utsns,
                "userns": r.userns,
                "network": r.network.as_ref().map(|n| serde_json::json!({
                    "ifname": n.ifname,
                    "ips": n.ips,
                    "result": n.result,
                    "config": serde_json::from_str::<serde_json::Value>(&n.conflist).ok(),
                })),
                "pidHolder": r.pid_holder.map(|h| h.pid),
                "sandboxDir": r.dir,
                "config": r.config,
            })
            .to_string()
        })
    }

    /// ListPodSandbox.
    pub(crate) async fn list_pod_sandbox(
        self: &Arc<Self>,
        req: api::ListPodSandboxRequest,
    ) -> Result<api::ListPodSandboxResponse> {
        let filter = req.filter.unwrap_or_default();
        let items = select_sandboxes(&self.state, &filter)
            .iter()
            .map(|sb| sb.with(cri_sandbox))
            .collect();
        Ok(api::ListPodSandboxResponse { items })
    }
}

/// The sandboxes a ListPodSandbox filter selects, oldest first.
pub(crate) fn select_sandboxes(state: &State, filter: &api::PodSandboxFilter) -> Vec<Arc<Sandbox>> {
    let by_id = if filter.id.is_empty() {
        None
    } else {
        match state.sandbox(&filter.id) {
            Some(sb) => Some(sb.id.clone()),
            None => return Vec::new(),
        }
    };
    let want_state = filter.state.as_ref().map(|s| s.state);
    let mut selected: Vec<(i64, Arc<Sandbox>)> = state
        .sandboxes()
        .into_iter()
        .filter_map(|sb| {
            let created_at = sb.with(|r| {
                let keep = r.state != SandboxState::Creating
                    && by_id.as_ref().is_none_or(|id| *id == r.id)
                    && want_state.is_none_or(|s| s == cri_sandbox_state(r.state) as i32)
                    && labels_match(&r.config.labels, &filter.label_selector);
                keep.then_some(r.created_at)
            })?;
            Some((created_at, sb))
        })
        .collect();
    selected.sort_by_key(|(t, _)| *t);
    selected.into_iter().map(|(_, sb)| sb).collect()
}

/// ListPodSandbox, answered as the encoded response: each sandbox's
/// encoding is cached until its record changes (as for ListContainers).
pub(crate) fn list_pod_sandbox_encoded(state: &State, req: &api::ListPodSandboxRequest) -> Bytes {
    let filter = req.filter.clone().unwrap_or_default();
    let parts: Vec<Bytes> = select_sandboxes(state, &filter)
        .iter()
        .map(|sb| sb.listing(encode_sandbox))
        .collect();
    encoded_list(&parts)
}

/// The CRI state of a sandbox (one being created is never listed).
pub(crate) fn cri_sandbox_state(state: SandboxState) -> api::PodSandboxState {
    match state {
        SandboxState::Ready => api::PodSandboxState::SandboxReady,
        SandboxState::Creating | SandboxState::NotReady => api::PodSandboxState::SandboxNotready,
    }
}

/// The CRI listing entry of a sandbox.
pub(crate) fn cri_sandbox(r: &SandboxRecord) -> api::PodSandbox {
    api::PodSandbox {
        id: r.id.clone(),
        metadata: r.config.metadata.clone(),
        state: cri_sandbox_state(r.state) as i32,
        created_at: r.created_at,
        labels: r.config.labels.clone(),
        annotations: r.config.annotations.clone(),
        runtime_handler: r.runtime_handler.clone(),
    }
}

/// The encoding of a sandbox's listing entry.
pub(crate) fn encode_sandbox(r: &SandboxRecord) -> Bytes {
    Bytes::from(prost::Message::encode_to_vec(&cri_sandbox(r)))
}

/// A List response whose only field, the repeated field 1 (`items` of
/// ListPodSandboxResponse, `containers` of ListContainersResponse), holds
/// the given encoded messages: the same bytes prost makes of the typed
/// response.
pub(crate) fn encoded_list(parts: &[Bytes]) -> Bytes {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    let len = parts
        .iter()
        .map(|p| 1 + encoded_len_varint(p.len() as u64) + p.len())
        .sum();
    let mut out = BytesMut::with_capacity(len);
    for p in parts {
        encode_key(1, WireType::LengthDelimited, &mut out);
        encode_varint(p.len() as u64, &mut out);
        out.extend_from_slice(p);
    }
    out.freeze()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A sandbox record with labels `petrel.io/node=n1` and `app=<app>`.
    pub(crate) fn record(
        id: &str,
        state: SandboxState,
        created_at: i64,
        app: &str,
    ) -> SandboxRecord {
        SandboxRecord {
            id: id.to_string(),
            name: format!("{id}_ns_uid_0"),
            config: api::PodSandboxConfig {
                metadata: Some(api::PodSandboxMetadata {
                    name: id.into(),
                    uid: format!("uid-{id}"),
                    namespace: "ns".into(),
                    attempt: 0,
                }),
                labels: HashMap::from([
                    ("petrel.io/node".into(), "n1".into()),
                    ("app".into(), app.into()),
                ]),
                annotations: HashMap::from([("note".into(), id.into())]),
                ..Default::default()
            },
            runtime_handler: "runc".into(),
            state,
            created_at,
            dir: "/d".into(),
            netns: None,
            ipcns: None,
            utsns: None,
            userns: None,
            pid_holder: None,
            shm_mounted: false,
            cgroup_parent: "/p".into(),
            created_cgroups: Vec::new(),
            created_cgroup_dirs: Vec::new(),
            network: None,
            released_ips: Vec::new(),
        }
    }

    /// Sandboxes inserted newest first, one of them still being created.
    fn state() -> State {
        let s = State::default();
        for r in [
            record("cccc", SandboxState::Ready, 30, "web"),
            record("bbbb", SandboxState::NotReady, 20, "db"),
            record("aaaa", SandboxState::Ready, 10, "web"),
            record("dddd", SandboxState::Creating, 5, "web"),
        ] {
            s.insert_sandbox(Arc::new(Sandbox::new(r)));
        }
        s
    }

    fn request(filter: api::PodSandboxFilter) -> api::ListPodSandboxRequest {
        api::ListPodSandboxRequest {
            filter: Some(filter),
        }
    }

    fn state_filter(s: api::PodSandboxState) -> Option<api::PodSandboxStateValue> {
        Some(api::PodSandboxStateValue { state: s as i32 })
    }

    /// The ids the encoded response lists, after checking that it is the
    /// typed response's encoding.
    fn listed(s: &State, filter: api::PodSandboxFilter) -> Vec<String> {
        let typed = api::ListPodSandboxResponse {
            items: select_sandboxes(s, &filter)
                .iter()
                .map(|sb| sb.with(cri_sandbox))
                .collect(),
        };
        let encoded = list_pod_sandbox_encoded(s, &request(filter));
        assert_eq!(encoded.to_vec(), prost::Message::encode_to_vec(&typed));
        typed.items.into_iter().map(|p| p.id).collect()
    }

    #[test]
    fn encoded_listing_should_equal_the_typed_response_for_every_filter() {
        let s = state();
        let ids = |v: &[&str]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>();
        assert_eq!(
            listed(&s, Default::default()),
            ids(&["aaaa", "bbbb", "cccc"])
        );
        // Twice: the second answer comes from the cache.
        assert_eq!(
            listed(&s, Default::default()),
            ids(&["aaaa", "bbbb", "cccc"])
        );
        let by_id = |id: &str| api::PodSandboxFilter {
            id: id.into(),
            ..Default::default()
        };
        assert_eq!(listed(&s, by_id("bbbb")), ids(&["bbbb"]));
        assert_eq!(listed(&s, by_id("bb")), ids(&["bbbb"]), "unique prefix");
        assert!(listed(&s, by_id("zz")).is_empty());
        assert!(listed(&s, by_id("dddd")).is_empty(), "being created");
        let by_state = |st| api::PodSandboxFilter {
            state: state_filter(st),
            ..Default::default()
        };
        assert_eq!(
            listed(&s, by_state(api::PodSandboxState::SandboxReady)),
            ids(&["aaaa", "cccc"])
        );
        assert_eq!(
            listed(&s, by_state(api::PodSandboxState::SandboxNotready)),
            ids(&["bbbb"])
        );
        let by_labels = |l: &[(&str, &str)]| api::PodSandboxFilter {
            label_selector: l
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        assert_eq!(
            listed(&s, by_labels(&[("petrel.io/node", "n1"), ("app", "web")])),
            ids(&["aaaa", "cccc"])
        );
        assert!(listed(&s, by_labels(&[("petrel.io/node", "n2")])).is_empty());
        assert!(listed(&s, by_labels(&[("missing", "")])).is_empty());
        let all = api::PodSandboxFilter {
            id: "cccc".into(),
            state: state_filter(api::PodSandboxState::SandboxReady),
            label_selector: HashMap::from([("app".into(), "web".into())]),
        };
        assert_eq!(listed(&s, all), ids(&["cccc"]));
    }

    #[test]
    fn encoded_listing_should_follow_state_changes_and_removal() {
        let s = state();
        let ready = api::PodSandboxFilter {
            state: state_filter(api::PodSandboxState::SandboxReady),
            ..Default::default()
        };
        assert_eq!(listed(&s, ready.clone()), ["aaaa", "cccc"]);
        let sb = s.sandbox("aaaa").expect("inserted");
        let mut r = sb.record();
        r.state = SandboxState::NotReady;
        sb.set(r);
        assert_eq!(listed(&s, ready.clone()), ["cccc"]);
        let all = list_pod_sandbox_encoded(&s, &request(Default::default()));
        let decoded: api::ListPodSandboxResponse = prost::Message::decode(all).unwrap_or_default();
        assert_eq!(
            decoded.items[0].state,
            api::PodSandboxState::SandboxNotready as i32
        );
        // The one being created becomes visible once ready.
        let sb = s.sandbox("dddd").expect("inserted");
        let mut r = sb.record();
        r.state = SandboxState::Ready;
        sb.set(r);
        assert_eq!(listed(&s, ready.clone()), ["dddd", "cccc"]);
        s.remove_sandbox("cccc");
        assert_eq!(listed(&s, ready), ["dddd"]);
        assert_eq!(listed(&s, Default::default()), ["dddd", "aaaa", "bbbb"]);
    }

    #[test]
    fn encoded_list_should_encode_like_prost_with_long_entries() {
        // An entry over 127 bytes takes a two-byte length.
        let mut r = record("eeee", SandboxState::Ready, 1, &"x".repeat(300));
        r.config.annotations.clear();
        let typed = api::ListPodSandboxResponse {
            items: vec![
                cri_sandbox(&r),
                cri_sandbox(&record("ffff", SandboxState::Ready, 2, "y")),
            ],
        };
        let parts: Vec<Bytes> = typed
            .items
            .iter()
            .map(|p| Bytes::from(prost::Message::encode_to_vec(p)))
            .collect();
        assert_eq!(
            encoded_list(&parts).to_vec(),
            prost::Message::encode_to_vec(&typed)
        );
        assert!(encoded_list(&[]).is_empty());
    }

    #[tokio::test]
    async fn verbose_status_should_answer_from_cached_state_without_a_cni_check() {
        use crate::parts::fake::{Call, TestRuntime};
        let t = TestRuntime::new();
        t.host.use_network();
        let id = t.isolated_pod("p").await.expect("run pod");
        let status = |verbose| api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose,
        };
        for _ in 0..3 {
            let st = t.rt.pod_sandbox_status(status(true)).await.expect("status");
            let info: serde_json::Value =
                serde_json::from_str(&st.info["info"]).expect("info is JSON");
            assert_eq!(info["network"]["ips"][0], "10.88.0.2", "{info}");
            // No CHECK ran, so there is no verdict to show.
            assert!(!st.info.contains_key("networkCheck"), "{:?}", st.info);
        }
        let checks = |t: &TestRuntime| {
            t.host
                .calls()
                .iter()
                .filter(|c| matches!(c, Call::NetworkCheck(_)))
                .count()
        };
        assert_eq!(checks(&t), 0, "{:?}", t.host.calls());

        // The verdict of a CHECK (recovery's, after a restart) is shown as
        // it was, without another CHECK.
        t.rt.state
            .sandbox(&id)
            .expect("pod")
            .set_network_check("ok".into());
        let st = t.rt.pod_sandbox_status(status(true)).await.expect("status");
        assert_eq!(st.info.get("networkCheck").map(String::as_str), Some("ok"));
        assert_eq!(checks(&t), 0);
    }
}
