//! The informer against a real kube-apiserver (etcd + kube-apiserver from
//! build/peers/bin, `petrel_testkit::cluster`): initial list, user
//! changes, no-op resyncs, deletes, the indexes, a watch forced to expire
//! (re-list compared with the cache) and an API server restart.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use petrel_controller::informer::{
    lister_watcher::EventStream, ApiLister, Event, EventClass, EventKind, Indexers, InformerConfig,
    InformerFactory, ListerWatcher, Page, Selectors, SharedInformer, WatchError, LABEL, NAMESPACE,
};
use petrel_testkit::cluster::{self, Cluster};
use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;

/// How long one expected event may take (a loaded 2-core machine).
const WITHIN: Duration = Duration::from_secs(60);

/// A lister-watcher that can open a gap: phase 1 ends the current watch
/// and holds the next until phase 2, which then watches from
/// resourceVersion "1", compacted out of etcd by then, so the API server
/// answers 410 Gone and the informer must re-list.
struct GapLister {
    inner: ApiLister<ConfigMap>,
    /// 0: normal; 1: cut (watches end, the next waits); 2: resume with an
    /// expired version once; 3: normal again.
    phase: watch::Sender<u8>,
}

#[async_trait]
impl ListerWatcher<ConfigMap> for GapLister {
    async fn list(
        &self,
        limit: u32,
        continue_token: Option<String>,
    ) -> Result<Page<ConfigMap>, WatchError> {
        self.inner.list(limit, continue_token).await
    }

    async fn watch(
        &self,
        rv: &str,
        timeout_secs: u32,
    ) -> Result<EventStream<ConfigMap>, WatchError> {
        let mut rx = self.phase.subscribe();
        let mut rv = rv.to_string();
        if *rx.borrow() == 1 {
            let _ = rx.wait_for(|p| *p >= 2).await;
        }
        if *rx.borrow() == 2 {
            rv = "1".into();
            self.phase.send_replace(3);
        }
        let stream = self.inner.watch(&rv, timeout_secs).await?;
        let mut cut = self.phase.subscribe();
        let ended = async move {
            let _ = cut.wait_for(|p| *p == 1).await;
        };
        Ok(stream.take_until(Box::pin(ended)).boxed())
    }
}

/// What the test keeps of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kind: EventKind,
    key: String,
    class: EventClass,
    old: Option<String>,
    new: Option<String>,
    final_state_unknown: bool,
}

fn value(o: &Option<Arc<ConfigMap>>) -> Option<String> {
    o.as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get("v").cloned())
}

fn seen(
    kind: EventKind,
    key: &str,
    class: EventClass,
    old: Option<&str>,
    new: Option<&str>,
) -> Seen {
    Seen {
        kind,
        key: key.into(),
        class,
        old: old.map(String::from),
        new: new.map(String::from),
        final_state_unknown: false,
    }
}

/// Changes and resyncs, on two channels.
struct Recorder {
    changes: mpsc::UnboundedReceiver<Seen>,
    resyncs: mpsc::UnboundedReceiver<Seen>,
}

impl Recorder {
    fn attach(inf: &SharedInformer<ConfigMap>) -> Self {
        let (ctx, changes) = mpsc::unbounded_channel();
        let (rtx, resyncs) = mpsc::unbounded_channel();
        inf.add_handler(move |e: &Event<ConfigMap>| {
            let s = Seen {
                kind: e.kind,
                key: e.key.clone(),
                class: e.class,
                old: value(&e.old),
                new: value(&e.new),
                final_state_unknown: e.final_state_unknown,
            };
            let same = matches!((&e.old, &e.new), (Some(o), Some(n)) if Arc::ptr_eq(o, n));
            if e.class == EventClass::NoOpResync && same {
                let _ = rtx.send(s);
            } else {
                let _ = ctx.send(s);
            }
        });
        Self { changes, resyncs }
    }

    /// The next `n` changes, sorted by key.
    async fn changes(&mut self, n: usize) -> Vec<Seen> {
        let mut v = Vec::new();
        for i in 0..n {
            let e = timeout(WITHIN, self.changes.recv())
                .await
                .unwrap_or_else(|_| panic!("change {} of {n} within {WITHIN:?}; got {v:?}", i + 1))
                .expect("handler alive");
            v.push(e);
        }
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// No change came (after the given quiet time).
    async fn no_change(&mut self, quiet: Duration) {
        if let Ok(e) = timeout(quiet, self.changes.recv()).await {
            panic!("unexpected change {e:?}");
        }
    }
}

async fn client(cluster: &Cluster) -> Client {
    let kc = Kubeconfig::read_from(cluster.admin_kubeconfig()).expect("admin kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kube config");
    Client::try_from(config).expect("kube client")
}

fn cm(ns: &str, name: &str, v: &str, app: &str, node: &str, run: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                ("app".to_string(), app.to_string()),
                ("petrel-test".to_string(), run.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("v".to_string(), v.to_string()),
            ("node".to_string(), node.to_string()),
        ])),
        ..ConfigMap::default()
    }
}

async fn set_value(api: &Api<ConfigMap>, name: &str, v: &str) {
    let patch = serde_json::json!({ "data": { "v": v } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("patch configmap {name}: {e}"));
}

fn names(v: Vec<Arc<ConfigMap>>) -> Vec<String> {
    let mut n: Vec<String> = v
        .iter()
        .map(|c| c.metadata.name.clone().unwrap_or_default())
        .collect();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_should_follow_a_real_api_server_through_expiry_and_restart() {
    if let Some(why) = cluster::left_out() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .expect("start thread")
        .expect("cluster");
    let client = client(&cluster).await;
    let run = format!("{:08x}", rand::thread_rng().gen::<u32>());
    let (ns1, ns2) = (format!("inf-a-{run}"), format!("inf-b-{run}"));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&ns1, &ns2] {
        let n = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &n)
            .await
            .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
    }
    let api1: Api<ConfigMap> = Api::namespaced(client.clone(), &ns1);
    let api2: Api<ConfigMap> = Api::namespaced(client.clone(), &ns2);
    let pp = PostParams::default();
    for (api, c) in [
        (&api1, cm(&ns1, "a", "1", "web", "n1", &run)),
        (&api1, cm(&ns1, "b", "1", "db", "n2", &run)),
        (&api1, cm(&ns1, "e", "1", "db", "n2", &run)),
        (&api2, cm(&ns2, "c", "1", "web", "n1", &run)),
    ] {
        api.create(&pp, &c).await.expect("create configmap");
    }
    let key = |ns: &str, n: &str| format!("{ns}/{n}");

    // Informers from one factory: the typed one through the gap-making
    // lister, the dynamic one as it is, both across namespaces, selected
    // by this run's label.
    let selectors = Selectors::default().labels(format!("petrel-test={run}"));
    let period = Duration::from_secs(4);
    let factory = InformerFactory::new(InformerConfig::default().resync_period(Some(period)));
    let (phase, _) = watch::channel(0u8);
    let gap = Arc::new(GapLister {
        inner: ApiLister::new(Api::all(client.clone()), selectors.clone()),
        phase,
    });
    let node_index = Indexers::standard().field("node", |c: &ConfigMap| {
        c.data.as_ref().and_then(|d| d.get("node").cloned())
    });
    let inf = factory.informer_with("configmaps", node_index, {
        let gap = gap.clone();
        move || gap as Arc<dyn ListerWatcher<ConfigMap>>
    });
    let ar = ApiResource::erase::<ConfigMap>(&());
    let dynamic = factory.informer(
        Api::<DynamicObject>::all_with(client.clone(), &ar),
        selectors,
    );
    let mut rec = Recorder::attach(&inf);
    factory.start();
    timeout(Duration::from_secs(120), inf.wait_for_sync())
        .await
        .expect("synced");
    timeout(Duration::from_secs(120), dynamic.wait_for_sync())
        .await
        .expect("dynamic informer synced");
    assert!(factory.has_synced());

    // 1. What existed before start: initial-list adds.
    let il = EventClass::InitialList;
    assert_eq!(
        rec.changes(4).await,
        [
            seen(EventKind::Add, &key(&ns1, "a"), il, None, Some("1")),
            seen(EventKind::Add, &key(&ns1, "b"), il, None, Some("1")),
            seen(EventKind::Add, &key(&ns1, "e"), il, None, Some("1")),
            seen(EventKind::Add, &key(&ns2, "c"), il, None, Some("1")),
        ]
    );
    let dyn_keys = {
        let mut k = dynamic.store().keys();
        k.sort();
        k
    };
    assert_eq!(
        dyn_keys,
        [
            key(&ns1, "a"),
            key(&ns1, "b"),
            key(&ns1, "e"),
            key(&ns2, "c")
        ]
    );

    // 2. A user change.
    set_value(&api1, "a", "2").await;
    let uc = EventClass::UserChange;
    assert_eq!(
        rec.changes(1).await,
        [seen(
            EventKind::Update,
            &key(&ns1, "a"),
            uc,
            Some("1"),
            Some("2")
        )]
    );

    // 3. The resync: every object as a no-op update.
    let mut resynced = Vec::new();
    while resynced.len() < 4 {
        let s = timeout(WITHIN, rec.resyncs.recv())
            .await
            .expect("a resync within a minute")
            .expect("handler alive");
        assert_eq!((s.kind, s.old.clone()), (EventKind::Update, s.new.clone()));
        if !resynced.contains(&s.key) {
            resynced.push(s.key);
        }
    }

    // 4. The indexes.
    let store = inf.store();
    assert_eq!(
        names(store.by_index(NAMESPACE, &ns1).unwrap()),
        ["a", "b", "e"]
    );
    assert_eq!(names(store.by_index(LABEL, "app=web").unwrap()), ["a", "c"]);
    assert_eq!(names(store.by_index("node", "n2").unwrap()), ["b", "e"]);
    assert_eq!(
        store
            .get(&key(&ns2, "c"))
            .and_then(|c| c.metadata.name.clone()),
        Some("c".into())
    );

    // 5. A delete, with the final state.
    api1.delete("b", &DeleteParams::default())
        .await
        .expect("delete b");
    assert_eq!(
        rec.changes(1).await,
        [seen(
            EventKind::Delete,
            &key(&ns1, "b"),
            uc,
            Some("1"),
            None
        )]
    );

    // 6. A gap: the watch is cut; meanwhile a changes, e goes, f comes; the
    // next watch starts from an expired version, the API server says 410,
    // the informer re-lists and hands on only the difference.
    gap.phase.send_replace(1);
    set_value(&api1, "a", "3").await;
    api1.delete("e", &DeleteParams::default())
        .await
        .expect("delete e");
    api2.create(&pp, &cm(&ns2, "f", "1", "db", "n1", &run))
        .await
        .expect("create f");
    // Compacted history (as in any cluster older than a few minutes) and a
    // restarted API server, whose watch cache starts now: an old version
    // cannot be replayed, only answered 410.
    tokio::task::block_in_place(|| {
        cluster.compact_etcd().expect("compact etcd");
        cluster.restart_apiserver().expect("restart kube-apiserver");
    });
    gap.phase.send_replace(2);
    let mut e_gone = seen(EventKind::Delete, &key(&ns1, "e"), uc, Some("1"), None);
    e_gone.final_state_unknown = true;
    assert_eq!(
        rec.changes(3).await,
        [
            seen(EventKind::Update, &key(&ns1, "a"), uc, Some("2"), Some("3")),
            e_gone,
            seen(EventKind::Add, &key(&ns2, "f"), il, None, Some("1")),
        ]
    );
    assert_eq!(*gap.phase.borrow(), 3, "the expired watch was opened");
    // Nothing about c, nothing twice.
    rec.no_change(Duration::from_secs(3)).await;

    // 7. An API server restart: the watch breaks, the informer comes back
    // by itself and a change after it arrives once.
    tokio::task::block_in_place(|| cluster.restart_apiserver()).expect("restart kube-apiserver");
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        match timeout(Duration::from_secs(10), async {
            set_value(&api2, "c", "2").await;
        })
        .await
        {
            Ok(()) => break,
            Err(_) if tokio::time::Instant::now() < deadline => continue,
            Err(_) => panic!("the restarted API server took no patch"),
        }
    }
    assert_eq!(
        rec.changes(1).await,
        [seen(
            EventKind::Update,
            &key(&ns2, "c"),
            uc,
            Some("1"),
            Some("2")
        )]
    );
    rec.no_change(Duration::from_secs(3)).await;
    assert!(inf.has_synced());
    let mut keys = inf.store().keys();
    keys.sort();
    assert_eq!(keys, [key(&ns1, "a"), key(&ns2, "c"), key(&ns2, "f")]);
    factory.stop();
    drop(cluster);
}
