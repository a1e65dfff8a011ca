use std::collections::HashSet;

use super::*;

#[derive(Default)]
struct FakeApi {
    calls: Mutex<Vec<String>>,
    patches: Mutex<Vec<Value>>,
    fail: Mutex<Option<fn() -> ApiFailure>>,
}

#[async_trait]
impl PodStatusApi for FakeApi {
    async fn patch_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<String>, ApiFailure> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("patch {namespace}/{name}"));
        if let Some(f) = *self.fail.lock().unwrap() {
            return Err(f());
        }
        self.patches.lock().unwrap().push(patch.clone());
        Ok(Some("2".into()))
    }
    async fn delete_now(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiFailure> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("delete {namespace}/{name} uid={uid}"));
        Ok(())
    }
}

#[derive(Default)]
struct Pods(Mutex<HashMap<String, Arc<Pod>>>);

impl ApiPods for Pods {
    fn by_uid(&self, uid: &str) -> Option<Arc<Pod>> {
        self.0.lock().unwrap().get(uid).cloned()
    }
}

#[derive(Default)]
struct Known(Mutex<HashSet<String>>);

impl PodsOnNode for Known {
    fn is_known(&self, uid: &str) -> bool {
        self.0.lock().unwrap().contains(uid)
    }
}

struct Fixture {
    api: Arc<FakeApi>,
    pods: Arc<Pods>,
    known: Arc<Known>,
    published: Arc<StatusStore>,
    sync: PodStatusSync,
}

fn fixture() -> Fixture {
    let api = Arc::new(FakeApi::default());
    let pods = Arc::new(Pods::default());
    let known = Arc::new(Known::default());
    let published = Arc::new(StatusStore::new());
    let sync = PodStatusSync::new(api.clone(), pods.clone(), published.clone(), known.clone());
    Fixture {
        api,
        pods,
        known,
        published,
        sync,
    }
}

fn pod(yaml: &str) -> Pod {
    serde_yaml::from_str(yaml).unwrap()
}

const API_POD: &str = "metadata: {name: web, namespace: ns, uid: u1, resourceVersion: '1', generation: 3}\nspec: {nodeName: n, containers: [{name: c, image: i}]}\nstatus:\n  phase: Pending\n  qosClass: BestEffort\n  conditions:\n  - {type: PodScheduled, status: 'True'}\n";
const OURS: &str = "metadata: {name: web, namespace: ns, uid: u1, generation: 3}\nspec: {nodeName: n, containers: [{name: c, image: i}]}\nstatus:\n  phase: Running\n  qosClass: BestEffort\n  podIP: 10.0.0.5\n  conditions:\n  - {type: Ready, status: 'True'}\n";

impl Fixture {
    fn api_pod(&self, yaml: &str) {
        let p = pod(yaml);
        let uid = p.metadata.uid.clone().unwrap();
        self.pods.0.lock().unwrap().insert(uid, Arc::new(p));
    }
    fn calls(&self) -> Vec<String> {
        self.api.calls.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_changed_status_should_be_patched_once_with_the_others_conditions_kept() {
    let f = fixture();
    f.api_pod(API_POD);
    f.known.0.lock().unwrap().insert("u1".into());
    f.published.upsert(pod(OURS));
    f.sync.reconcile("u1").await.unwrap();
    assert_eq!(f.calls(), ["patch ns/web"]);
    let patch = f.api.patches.lock().unwrap()[0].clone();
    assert_eq!(patch["metadata"]["uid"], "u1");
    let s = &patch["status"];
    assert_eq!(s["phase"], "Running");
    assert_eq!(s["podIP"], "10.0.0.5");
    assert_eq!(s["observedGeneration"], 3);
    // Cleared fields are sent as null, so the merge patch clears them.
    assert!(s["message"].is_null() && s.get("message").is_some());
    let types: Vec<&str> = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["PodScheduled", "Ready"]);
    // The informer has not caught up: not sent again.
    f.sync.reconcile("u1").await.unwrap();
    assert_eq!(f.calls().len(), 1);
}

#[tokio::test]
async fn a_status_the_api_has_already_should_not_be_sent() {
    let f = fixture();
    let mut ours = pod(OURS);
    ours.status.as_mut().unwrap().conditions = Some(vec![]);
    let mut api = ours.clone();
    api.metadata.resource_version = Some("5".into());
    let mut st = api.status.clone().unwrap();
    st.observed_generation = Some(3);
    st.conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "True".into(),
        ..Default::default()
    }]);
    api.status = Some(st);
    f.pods.0.lock().unwrap().insert("u1".into(), Arc::new(api));
    f.known.0.lock().unwrap().insert("u1".into());
    f.published.upsert(ours);
    f.sync.reconcile("u1").await.unwrap();
    assert!(f.calls().is_empty(), "{:?}", f.calls());
}

#[tokio::test]
async fn a_pod_being_deleted_should_be_deleted_only_once_the_workers_let_it_go() {
    let f = fixture();
    f.api_pod(&API_POD.replace(
        "generation: 3}",
        "generation: 3, deletionTimestamp: '2026-01-01T00:00:00Z', deletionGracePeriodSeconds: 30}",
    ));
    f.known.0.lock().unwrap().insert("u1".into());
    f.sync.reconcile("u1").await.unwrap();
    assert!(
        f.calls().iter().all(|c| !c.starts_with("delete")),
        "deleted while its containers may run: {:?}",
        f.calls()
    );
    f.known.0.lock().unwrap().clear();
    f.sync.reconcile("u1").await.unwrap();
    assert_eq!(f.calls().last().unwrap(), "delete ns/web uid=u1");
}

#[tokio::test]
async fn a_pod_the_api_no_longer_has_should_cost_no_call() {
    let f = fixture();
    f.published.upsert(pod(OURS));
    f.sync.reconcile("u1").await.unwrap();
    assert!(f.calls().is_empty());
}

#[tokio::test]
async fn a_refused_patch_should_be_retried_and_a_vanished_pod_accepted() {
    let f = fixture();
    f.api_pod(API_POD);
    f.published.upsert(pod(OURS));
    *f.api.fail.lock().unwrap() = Some(|| ApiFailure::Other("403 forbidden".into()));
    assert!(f.sync.reconcile("u1").await.is_err());
    *f.api.fail.lock().unwrap() = Some(|| ApiFailure::NotFound);
    assert!(matches!(f.sync.reconcile("u1").await, Ok(Action::Done)));
    *f.api.fail.lock().unwrap() = None;
    f.sync.reconcile("u1").await.unwrap();
    assert_eq!(f.api.patches.lock().unwrap().len(), 1);
}

#[test]
fn conditions_of_others_should_keep_their_place_and_ours_replace_the_apis() {
    let c = |t: &str, s: &str| PodCondition {
        type_: t.into(),
        status: s.into(),
        ..Default::default()
    };
    let api = [
        c("PodScheduled", "True"),
        c("Ready", "False"),
        c("example.com/gate", "True"),
    ];
    let ours = [
        c("Initialized", "True"),
        c("Ready", "True"),
        c("PodScheduled", "False"),
    ];
    let got: Vec<(String, String)> = merged_conditions(&ours, &api)
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    let want: Vec<(String, String)> = [
        ("PodScheduled", "True"),
        ("example.com/gate", "True"),
        ("Initialized", "True"),
        ("Ready", "True"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn the_nodes_disruption_condition_should_win_and_the_apis_be_kept_otherwise() {
    let c = |t: &str, r: &str| PodCondition {
        type_: t.into(),
        status: "True".into(),
        reason: Some(r.into()),
        ..Default::default()
    };
    let api = [c("DisruptionTarget", "EvictionByEvictionAPI")];
    let kept = merged_conditions(&[c("Ready", "x")], &api);
    assert_eq!(kept[0].reason.as_deref(), Some("EvictionByEvictionAPI"));
    let ours = [c("DisruptionTarget", "TerminationByKubelet")];
    let got = merged_conditions(&ours, &api);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].reason.as_deref(), Some("TerminationByKubelet"));
}
