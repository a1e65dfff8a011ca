//! The reconcile against a fake cache and a fake API.

use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::report::tests::Buf;

#[derive(Default)]
struct FakeCache {
    podsets: Vec<PodSet>,
    pods: Vec<Pod>,
}

impl Cache for FakeCache {
    fn podset(&self, key: &str) -> Option<Arc<PodSet>> {
        self.podsets
            .iter()
            .find(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ) == key
            })
            .cloned()
            .map(Arc::new)
    }
    fn pods_labelled(&self, ns: &str, name: &str) -> Vec<Arc<Pod>> {
        self.pods
            .iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns)
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(POD_LABEL))
                        .map(String::as_str)
                        == Some(name)
            })
            .cloned()
            .map(Arc::new)
            .collect()
    }
}

/// Records every call; `conflict` makes status writes fail.
#[derive(Default)]
struct FakeApi {
    calls: Mutex<Vec<String>>,
    created: Mutex<Vec<Pod>>,
    statuses: Mutex<Vec<PodSetStatus>>,
    conflict: bool,
}

#[async_trait]
impl PodSetApi for FakeApi {
    async fn create_pod(&self, ns: &str, pod: &Pod) -> Result<(), ApiError> {
        let gen = pod.metadata.generate_name.clone().unwrap_or_default();
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("create {ns}/{gen}"));
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pod.clone());
        Ok(())
    }
    async fn delete_pod(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("delete {ns}/{name}"));
        Ok(())
    }
    async fn replace_status(&self, ps: &PodSet) -> Result<(), ApiError> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push("status".into());
        if self.conflict {
            return Err(ApiError::Conflict("ns/web".into()));
        }
        self.statuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ps.status.clone());
        Ok(())
    }
}

impl FakeApi {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn podset(replicas: i32, generation: i64, status: (i32, i64), stamp: &str) -> PodSet {
    let mut ps = PodSet::default();
    ps.metadata.name = Some("web".into());
    ps.metadata.namespace = Some("ns".into());
    ps.metadata.uid = Some("uid-1".into());
    ps.metadata.generation = Some(generation);
    ps.metadata.annotations = Some([(CHANGED_AT.to_string(), stamp.to_string())].into());
    ps.spec.replicas = replicas;
    ps.spec.template.metadata = Some(ObjectMeta {
        labels: Some([("app".to_string(), "web".to_string())].into()),
        ..ObjectMeta::default()
    });
    ps.status = PodSetStatus {
        replicas: status.0,
        observed_generation: status.1,
    };
    ps
}

fn pod(name: &str, owner_uid: &str, deleting: bool) -> Pod {
    let mut p = new_pod(&podset(1, 1, (0, 0), "1"));
    p.metadata.generate_name = None;
    p.metadata.name = Some(name.into());
    if let Some(r) = p
        .metadata
        .owner_references
        .as_mut()
        .and_then(|r| r.first_mut())
    {
        r.uid = owner_uid.into();
    }
    if deleting {
        p.metadata.deletion_timestamp = Some(Time(Default::default()));
    }
    p
}

fn reconciler(cache: FakeCache, api: Arc<FakeApi>) -> (Reconciler, Buf) {
    let buf = Buf::default();
    let r = Reconciler {
        cache: Arc::new(cache),
        api,
        report: Arc::new(Reporter::new(Box::new(buf.clone()), || 9)),
    };
    (r, buf)
}

#[tokio::test]
async fn reconcile_should_create_missing_pods_write_status_and_report_the_stamp() {
    let api = Arc::new(FakeApi::default());
    let cache = FakeCache {
        podsets: vec![podset(3, 2, (1, 1), "100")],
        // One owned, one owned but terminating, one of another owner.
        pods: vec![
            pod("a", "uid-1", false),
            pod("b", "uid-1", true),
            pod("c", "uid-2", false),
        ],
    };
    let (r, out) = reconciler(cache, api.clone());
    assert_eq!(r.reconcile("ns/web").await.ok(), Some(Action::Done));
    assert_eq!(api.calls(), ["create ns/web-", "create ns/web-", "status"]);
    let created = api
        .created
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let p = &created[0];
    assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
    let labels = p.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(POD_LABEL).map(String::as_str), Some("web"));
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("web"),
        "template labels kept"
    );
    let owner = p.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.len(), 1);
    assert_eq!(owner[0].uid, "uid-1");
    assert_eq!(owner[0].api_version, "bench.petrel.dev/v1");
    assert_eq!(
        (owner[0].controller, owner[0].block_owner_deletion),
        (Some(true), Some(true))
    );
    let statuses = api
        .statuses
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(
        statuses,
        [PodSetStatus {
            replicas: 3,
            observed_generation: 2
        }]
    );
    assert_eq!(out.text(), "reconciled ns/web 2 100 9\n");
}

#[tokio::test]
async fn reconcile_should_delete_extra_pods_and_leave_a_current_status_alone() {
    let api = Arc::new(FakeApi::default());
    let cache = FakeCache {
        podsets: vec![podset(1, 3, (1, 3), "200")],
        pods: vec![
            pod("a", "uid-1", false),
            pod("b", "uid-1", false),
            pod("c", "uid-1", false),
        ],
    };
    let (r, _) = reconciler(cache, api.clone());
    assert!(r.reconcile("ns/web").await.is_ok());
    assert_eq!(api.calls(), ["delete ns/b", "delete ns/c"]);
}

#[tokio::test]
async fn reconcile_should_retry_a_status_conflict_without_reporting() {
    let api = Arc::new(FakeApi {
        conflict: true,
        ..FakeApi::default()
    });
    let cache = FakeCache {
        podsets: vec![podset(0, 2, (1, 1), "300")],
        pods: vec![],
    };
    let (r, out) = reconciler(cache, api.clone());
    assert!(matches!(
        r.reconcile("ns/web").await,
        Err(ReconcileError::Api(ApiError::Conflict(_)))
    ));
    assert_eq!(
        out.text(),
        "",
        "a change is reported once its status is written"
    );
}

#[tokio::test]
async fn reconcile_should_do_nothing_for_a_deleted_podset() {
    let api = Arc::new(FakeApi::default());
    let (r, out) = reconciler(FakeCache::default(), api.clone());
    assert_eq!(r.reconcile("ns/gone").await.ok(), Some(Action::Done));
    assert!(api.calls().is_empty());
    assert_eq!(out.text(), "");
}

#[test]
fn owner_key_should_map_a_pod_to_its_controlling_podset_only() {
    assert_eq!(
        owner_key(&pod("a", "uid-1", false)).as_deref(),
        Some("ns/web")
    );
    let mut other = pod("a", "uid-1", false);
    if let Some(r) = other
        .metadata
        .owner_references
        .as_mut()
        .and_then(|r| r.first_mut())
    {
        r.kind = "ReplicaSet".into();
        r.api_version = "apps/v1".into();
    }
    assert_eq!(owner_key(&other), None);
    let mut not_controller = pod("a", "uid-1", false);
    if let Some(r) = not_controller
        .metadata
        .owner_references
        .as_mut()
        .and_then(|r| r.first_mut())
    {
        r.controller = None;
    }
    assert_eq!(owner_key(&not_controller), None);
}
