//! The informer against a fake lister-watcher, on paused tokio time.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{ObjectMeta, WatchEvent};
use kube::core::watch::{Bookmark, BookmarkMeta};
use kube::core::{Status, TypeMeta};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::*;
use crate::queue::{Priority, QueueConfig, WorkQueue};

type Ev = Result<WatchEvent<ConfigMap>, WatchError>;

/// A scripted watch: an error at once, or a stream the test feeds.
enum WatchScript {
    Fail(WatchError),
    Stream(mpsc::UnboundedReceiver<Ev>),
}

#[derive(Default)]
struct FakeState {
    /// The "server's" objects, in list order, and its resourceVersion.
    objects: BTreeMap<String, ConfigMap>,
    rv: u64,
    /// The outcome of the next list calls (`None`: answer normally).
    list_failures: VecDeque<Option<WatchError>>,
    watches: VecDeque<WatchScript>,
    list_calls: usize,
    /// The resourceVersion each watch was opened from.
    watch_rvs: Vec<String>,
}

#[derive(Clone)]
struct FakeLw {
    state: Arc<Mutex<FakeState>>,
    /// How many watches were opened, for tests to wait on.
    opened: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for FakeLw {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            opened: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl FakeLw {
    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().expect("fake state")
    }

    /// Sets an object on the "server" (a new resourceVersion); returns it.
    fn put(&self, name: &str, value: &str) -> ConfigMap {
        let mut s = self.lock();
        s.rv += 1;
        let cm = cm(name, value, s.rv);
        s.objects.insert(name.to_string(), cm.clone());
        cm
    }

    fn delete(&self, name: &str) -> Option<ConfigMap> {
        let mut s = self.lock();
        s.rv += 1;
        s.objects.remove(name)
    }

    /// Scripts the next watch as a stream; returns its feeder.
    fn next_watch(&self) -> mpsc::UnboundedSender<Ev> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().watches.push_back(WatchScript::Stream(rx));
        tx
    }

    fn watch_rvs(&self) -> Vec<String> {
        self.lock().watch_rvs.clone()
    }

    /// Waits (up to a minute of paused time) until `n` watches were opened.
    async fn watches_opened(&self, n: usize) {
        let mut rx = self.opened.subscribe();
        timeout(Duration::from_secs(60), rx.wait_for(|o| *o >= n))
            .await
            .expect("watches opened in time")
            .expect("sender alive");
    }
}

#[async_trait]
impl ListerWatcher<ConfigMap> for FakeLw {
    async fn list(
        &self,
        limit: u32,
        continue_token: Option<String>,
    ) -> Result<Page<ConfigMap>, WatchError> {
        let mut s = self.lock();
        s.list_calls += 1;
        if let Some(Some(e)) = s.list_failures.pop_front() {
            return Err(e);
        }
        let start: usize = continue_token
            .as_deref()
            .map(|t| t.parse().expect("our token"))
            .unwrap_or(0);
        let all: Vec<ConfigMap> = s.objects.values().cloned().collect();
        let end = (start + limit as usize).min(all.len());
        Ok(Page {
            items: all[start..end].to_vec(),
            resource_version: s.rv.to_string(),
            continue_token: (end < all.len()).then(|| end.to_string()),
        })
    }

    async fn watch(
        &self,
        resource_version: &str,
        _timeout_secs: u32,
    ) -> Result<lister_watcher::EventStream<ConfigMap>, WatchError> {
        let mut s = self.lock();
        s.watch_rvs.push(resource_version.to_string());
        self.opened.send_modify(|n| *n += 1);
        match s.watches.pop_front() {
            Some(WatchScript::Fail(e)) => Err(e),
            Some(WatchScript::Stream(rx)) => Ok(futures_util::stream::unfold(rx, |mut rx| async {
                rx.recv().await.map(|e| (e, rx))
            })
            .boxed()),
            // Unscripted: a watch that never says anything.
            None => Ok(futures_util::stream::pending().boxed()),
        }
    }
}

fn cm(name: &str, value: &str, rv: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            resource_version: Some(rv.to_string()),
            labels: Some([("app".to_string(), value.to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some([("v".to_string(), value.to_string())].into()),
        ..ConfigMap::default()
    }
}

fn value(o: &Option<Arc<ConfigMap>>) -> Option<String> {
    o.as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get("v").cloned())
}

/// What a recording handler saw of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    kind: EventKind,
    key: String,
    class: EventClass,
    old: Option<String>,
    new: Option<String>,
    final_state_unknown: bool,
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

fn recorder() -> (impl EventHandler<ConfigMap>, mpsc::UnboundedReceiver<Seen>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let h = move |e: &Event<ConfigMap>| {
        let _ = tx.send(Seen {
            kind: e.kind,
            key: e.key.clone(),
            class: e.class,
            old: value(&e.old),
            new: value(&e.new),
            final_state_unknown: e.final_state_unknown,
        });
    };
    (h, rx)
}

/// The next `n` events, in the order handled.
async fn take_in_order(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<Seen> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let e = timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("an event within 60 s")
            .expect("handler alive");
        v.push(e);
    }
    v
}

/// The next `n` events, sorted by key (a list's order is the map's).
async fn take(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<Seen> {
    let mut v = take_in_order(rx, n).await;
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

/// No further event: on paused time the timeout fires only once every
/// task is idle, so whatever was coming has come.
async fn nothing_more(rx: &mut mpsc::UnboundedReceiver<Seen>) {
    if let Ok(e) = timeout(Duration::from_millis(100), rx.recv()).await {
        panic!("unexpected event {e:?}");
    }
}

fn informer(lw: &FakeLw, config: InformerConfig) -> SharedInformer<ConfigMap> {
    SharedInformer::new(
        Arc::new(lw.clone()),
        Indexers::standard(),
        config.name("test"),
    )
}

fn gone() -> Ev {
    Ok(WatchEvent::Error(
        Status::failure("too old resource version", "Expired")
            .with_code(410)
            .boxed(),
    ))
}

use EventClass::{InitialList, NoOpResync, UserChange};
use EventKind::{Add, Delete, Update};

#[tokio::test(start_paused = true)]
async fn informer_should_classify_the_first_list_as_initial_and_watch_events_as_user_changes() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        informer_should_classify_the_first_list_as_initial_and_watch_events_as_user_changes_in(
            form,
        )
        .await;
    }
}

async fn informer_should_classify_the_first_list_as_initial_and_watch_events_as_user_changes_in(
    form: CacheForm,
) {
    let lw = FakeLw::default();
    lw.put("a", "1");
    lw.put("b", "1");
    let w = lw.next_watch();
    // A page size of 1: the list takes two pages and a continue token.
    let inf = informer(&lw, InformerConfig::default().cache_form(form).page_size(1));
    let (h, mut rx) = recorder();
    let reg = inf.add_handler(h);
    assert!(!inf.has_synced());
    inf.start();
    timeout(Duration::from_secs(60), inf.wait_for_sync())
        .await
        .expect("synced");
    assert_eq!(
        take(&mut rx, 2).await,
        [
            seen(Add, "ns/a", InitialList, None, Some("1")),
            seen(Add, "ns/b", InitialList, None, Some("1")),
        ]
    );
    assert_eq!(
        lw.watch_rvs(),
        ["2"],
        "the watch starts at the list's version"
    );
    assert_eq!(lw.lock().list_calls, 2);
    w.send(Ok(WatchEvent::Modified(lw.put("a", "2"))))
        .expect("feed");
    w.send(Ok(WatchEvent::Added(lw.put("c", "1"))))
        .expect("feed");
    let b = lw.delete("b").expect("b");
    w.send(Ok(WatchEvent::Deleted(b))).expect("feed");
    assert_eq!(
        take(&mut rx, 3).await,
        [
            seen(Update, "ns/a", UserChange, Some("1"), Some("2")),
            seen(Delete, "ns/b", UserChange, Some("1"), None),
            seen(Add, "ns/c", UserChange, None, Some("1")),
        ]
    );
    nothing_more(&mut rx).await;
    assert!(reg.has_synced());
    let store = inf.store();
    assert_eq!(store.len(), 2);
    assert_eq!(value(&store.get("ns/a")), Some("2".into()));
    assert!(store.get("ns/b").is_none());
    inf.stop();
}

/// `cm` as a server sends it: with a managed-fields entry.
fn managed(mut cm: ConfigMap) -> ConfigMap {
    cm.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("kubectl".into()),
        operation: Some("Update".into()),
        ..ManagedFieldsEntry::default()
    }]);
    cm
}

#[tokio::test(start_paused = true)]
async fn informer_should_strip_managed_fields_from_listed_and_watched_objects_when_asked() {
    for strip in [true, false] {
        let lw = FakeLw::default();
        let a = managed(lw.put("a", "1"));
        lw.lock().objects.insert("a".into(), a);
        let w = lw.next_watch();
        let inf = informer(&lw, InformerConfig::default().strip_managed_fields(strip));
        inf.start();
        timeout(Duration::from_secs(60), inf.wait_for_sync())
            .await
            .expect("synced");
        w.send(Ok(WatchEvent::Added(managed(lw.put("b", "1")))))
            .expect("feed");
        let store = inf.store();
        timeout(Duration::from_secs(60), async {
            while store.get("ns/b").is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("b cached");
        for key in ["ns/a", "ns/b"] {
            let kept = store
                .get(key)
                .is_some_and(|c| c.metadata.managed_fields.is_some());
            assert_eq!(kept, !strip, "{key}, strip {strip}");
        }
        inf.stop();
    }
}

#[tokio::test(start_paused = true)]
async fn informer_should_relist_on_410_and_deliver_only_the_difference() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        informer_should_relist_on_410_and_deliver_only_the_difference_in(form).await;
    }
}

async fn informer_should_relist_on_410_and_deliver_only_the_difference_in(form: CacheForm) {
    let lw = FakeLw::default();
    for n in ["a", "b", "c"] {
        lw.put(n, "1");
    }
    let w = lw.next_watch();
    let w2 = lw.next_watch();
    let inf = informer(&lw, InformerConfig::default().cache_form(form));
    let (h, mut rx) = recorder();
    inf.add_handler(h);
    inf.start();
    assert_eq!(take(&mut rx, 3).await.len(), 3);
    // While the watch is cut off: a changes, b goes, d comes, c stays.
    lw.put("a", "2");
    lw.delete("b");
    lw.put("d", "1");
    w.send(gone()).expect("feed");
    let mut b_gone = seen(Delete, "ns/b", UserChange, Some("1"), None);
    b_gone.final_state_unknown = true;
    assert_eq!(
        take(&mut rx, 3).await,
        [
            seen(Update, "ns/a", UserChange, Some("1"), Some("2")),
            b_gone,
            seen(Add, "ns/d", InitialList, None, Some("1")),
        ]
    );
    // Nothing about c, nothing twice.
    nothing_more(&mut rx).await;
    assert_eq!(lw.lock().list_calls, 2);
    assert_eq!(lw.watch_rvs(), ["3", "6"]);
    // The new watch goes on.
    w2.send(Ok(WatchEvent::Modified(lw.put("c", "2"))))
        .expect("feed");
    assert_eq!(
        take(&mut rx, 1).await,
        [seen(Update, "ns/c", UserChange, Some("1"), Some("2"))]
    );
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_relist_when_the_watch_request_itself_is_gone() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    lw.lock()
        .watches
        .push_back(WatchScript::Fail(WatchError::Expired("410".into())));
    let inf = informer(&lw, InformerConfig::default());
    let (h, mut rx) = recorder();
    inf.add_handler(h);
    inf.start();
    assert_eq!(take(&mut rx, 1).await.len(), 1);
    nothing_more(&mut rx).await;
    assert_eq!(lw.lock().list_calls, 2, "re-listed once");
    assert_eq!(lw.watch_rvs(), ["1", "1"]);
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_restart_a_list_whose_continue_token_expired() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        informer_should_restart_a_list_whose_continue_token_expired_in(form).await;
    }
}

/// A started informer kept in `form` on "a" and "b", listed one per page,
/// whose first list fails at page 2 with `err`; and its handler's events.
fn second_page_fails(
    form: CacheForm,
    err: WatchError,
) -> (
    FakeLw,
    SharedInformer<ConfigMap>,
    mpsc::UnboundedReceiver<Seen>,
) {
    let lw = FakeLw::default();
    lw.put("a", "1");
    lw.put("b", "1");
    lw.lock().list_failures = VecDeque::from([None, Some(err)]);
    let inf = informer(&lw, InformerConfig::default().cache_form(form).page_size(1));
    let (h, rx) = recorder();
    inf.add_handler(h);
    inf.start();
    (lw, inf, rx)
}

async fn informer_should_restart_a_list_whose_continue_token_expired_in(form: CacheForm) {
    // Page 1 answers, page 2 says its continue token expired.
    let (lw, inf, mut rx) = second_page_fails(form, WatchError::Expired("continue".into()));
    inf.wait_for_sync().await;
    // Each object once, whether the broken list's first page was applied
    // (encoded) or not (shared): the list again finds it unchanged.
    assert_eq!(
        take(&mut rx, 2).await,
        [
            seen(Add, "ns/a", InitialList, None, Some("1")),
            seen(Add, "ns/b", InitialList, None, Some("1")),
        ]
    );
    nothing_more(&mut rx).await;
    assert_eq!(
        lw.lock().list_calls,
        4,
        "the list started again from page 1"
    );
    inf.stop();
}

/// An encoded cache takes a list page by page (never a whole list decoded
/// at once); a shared one after the last page.
#[tokio::test(start_paused = true)]
async fn informer_should_apply_a_list_per_page_only_when_its_cache_is_encoded() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        // Page 2 fails once: the list is retried after a backoff.
        let (_lw, inf, mut rx) = second_page_fails(form, WatchError::Other("reset".into()));
        // Up to the backoff, in paused time.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!inf.has_synced());
        match form {
            CacheForm::Encoded => {
                assert_eq!(inf.store().len(), 1, "page 1 is in");
                assert_eq!(
                    take(&mut rx, 1).await,
                    [seen(Add, "ns/a", InitialList, None, Some("1"))]
                );
            }
            CacheForm::Shared => {
                assert_eq!(inf.store().len(), 0, "nothing before the last page");
                nothing_more(&mut rx).await;
            }
        }
        inf.wait_for_sync().await;
        let rest = match form {
            CacheForm::Encoded => take(&mut rx, 1).await,
            CacheForm::Shared => take(&mut rx, 2).await,
        };
        assert_eq!(
            rest.last(),
            Some(&seen(Add, "ns/b", InitialList, None, Some("1")))
        );
        nothing_more(&mut rx).await;
        assert_eq!(inf.store().len(), 2);
        inf.stop();
    }
}

#[tokio::test(start_paused = true)]
async fn informer_should_move_its_resource_version_on_with_bookmarks() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    let w = lw.next_watch();
    let inf = informer(&lw, InformerConfig::default());
    inf.start();
    inf.wait_for_sync().await;
    w.send(Ok(WatchEvent::Bookmark(Bookmark {
        types: TypeMeta::default(),
        metadata: BookmarkMeta {
            resource_version: "42".into(),
            annotations: BTreeMap::new(),
        },
    })))
    .expect("feed");
    // The watch times out (its stream ends): the next starts at 42.
    drop(w);
    lw.watches_opened(2).await;
    assert_eq!(lw.watch_rvs(), ["1", "42"]);
    assert_eq!(lw.lock().list_calls, 1, "a bookmark never re-lists");
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_resync_as_no_op_updates_every_period() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        informer_should_resync_as_no_op_updates_every_period_in(form).await;
    }
}

async fn informer_should_resync_as_no_op_updates_every_period_in(form: CacheForm) {
    let lw = FakeLw::default();
    lw.put("a", "1");
    lw.put("b", "1");
    let period = Duration::from_secs(30);
    let inf = informer(
        &lw,
        InformerConfig::default()
            .cache_form(form)
            .resync_period(Some(period)),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    inf.add_handler(move |e: &Event<ConfigMap>| {
        let same = matches!((&e.old, &e.new), (Some(o), Some(n)) if Arc::ptr_eq(o, n));
        let _ = tx.send((e.kind, e.class, same, tokio::time::Instant::now()));
    });
    let t0 = tokio::time::Instant::now();
    inf.start();
    for _ in 0..2 {
        let (kind, class, _, _) = rx.recv().await.expect("initial");
        assert_eq!((kind, class), (Add, InitialList));
    }
    for round in 1..=2u32 {
        for _ in 0..2 {
            let (kind, class, same, at) = rx.recv().await.expect("resync");
            assert_eq!((kind, class, same), (Update, NoOpResync, true));
            assert_eq!(at - t0, period * round, "round {round}");
        }
    }
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_hand_a_watch_event_over_before_the_rest_of_a_resync_round() {
    const N: usize = 200;
    let lw = FakeLw::default();
    for i in 0..N {
        lw.put(&format!("k{i:03}"), "1");
    }
    let w = lw.next_watch();
    let period = Duration::from_secs(30);
    let inf = informer(&lw, InformerConfig::default().resync_period(Some(period)));
    let (h, mut rx) = recorder();
    inf.add_handler(h);
    inf.start();
    assert_eq!(take(&mut rx, N).await.len(), N, "the initial list");
    lw.watches_opened(1).await;
    tokio::time::sleep(period).await;
    // The round has begun: a few replays are in.
    let first = take_in_order(&mut rx, 3).await;
    assert!(first.iter().all(|s| s.class == NoOpResync), "{first:?}");
    // The round replays the cache's keys in their order (unchanged since):
    // the last two are far from replayed yet. One changes, one goes.
    let order = inf.store().keys();
    let (changed, deleted) = (&order[N - 2], &order[N - 1]);
    let name = |key: &str| key.trim_start_matches("ns/").to_string();
    w.send(Ok(WatchEvent::Modified(lw.put(&name(changed), "2"))))
        .expect("feed");
    let gone = lw.delete(&name(deleted)).expect("deleted");
    w.send(Ok(WatchEvent::Deleted(gone))).expect("feed");
    // The rest: N - 3 replays but the deleted key's, the change, the delete.
    let rest = take_in_order(&mut rx, N - 2).await;
    let change = rest
        .iter()
        .position(|s| s.class == UserChange && &s.key == changed)
        .expect("the change");
    assert!(
        change < 10,
        "the change waited for {change} replays of the round"
    );
    assert_eq!(
        (rest[change + 1].kind, &rest[change + 1].key),
        (Delete, deleted),
        "then the delete"
    );
    // The changed key's replay shows its state after the change; the
    // deleted key is not replayed.
    let replay = rest
        .iter()
        .find(|s| s.class == NoOpResync && &s.key == changed)
        .expect("the changed key replayed");
    assert_eq!(replay.new.as_deref(), Some("2"));
    assert!(!rest
        .iter()
        .any(|s| s.class == NoOpResync && &s.key == deleted));
    nothing_more(&mut rx).await;
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_factory_should_share_one_watch_among_controllers() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    let factory = InformerFactory::new(InformerConfig::default());
    let first = factory.informer_with("cms", Indexers::default(), || {
        Arc::new(lw.clone()) as Arc<dyn ListerWatcher<ConfigMap>>
    });
    let second = factory.informer_with(
        "cms",
        Indexers::default().field("value", |c: &ConfigMap| {
            c.data.as_ref().and_then(|d| d.get("v").cloned())
        }),
        || -> Arc<dyn ListerWatcher<ConfigMap>> { panic!("made once") },
    );
    let (h1, mut rx1) = recorder();
    let (h2, mut rx2) = recorder();
    first.add_handler(h1);
    second.add_handler(h2);
    factory.start();
    factory.start();
    assert_eq!(take(&mut rx1, 1).await.len(), 1);
    assert_eq!(take(&mut rx2, 1).await.len(), 1);
    nothing_more(&mut rx1).await;
    assert!(factory.has_synced());
    assert_eq!(lw.lock().list_calls, 1);
    assert_eq!(lw.watch_rvs().len(), 1, "one watch");
    // The second controller's index is on the shared cache.
    assert_eq!(
        first.store().by_index("value", "1").expect("index").len(),
        1
    );
    factory.stop();
}

/// A late handler gets the cache one object at a time between events: a
/// watch event waits for one add, not for the whole cache, and comes after
/// its own key's add.
#[tokio::test(start_paused = true)]
async fn a_late_handler_should_hear_a_watch_event_before_the_rest_of_the_cache() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        let lw = FakeLw::default();
        for i in 0..200 {
            lw.put(&format!("o{i:03}"), "1");
        }
        let w = lw.next_watch();
        let inf = informer(&lw, InformerConfig::default().cache_form(form));
        inf.start();
        inf.wait_for_sync().await;
        let (h, mut rx) = recorder();
        let reg = inf.add_handler(h);
        w.send(Ok(WatchEvent::Modified(lw.put("o100", "2"))))
            .expect("feed");
        let all = take_in_order(&mut rx, 201).await;
        nothing_more(&mut rx).await;
        let update = all
            .iter()
            .position(|e| e.kind == Update)
            .expect("the update");
        assert_eq!(
            all[update],
            seen(Update, "ns/o100", UserChange, Some("1"), Some("2"))
        );
        assert!(
            update < 100,
            "{form:?}: the update came after {update} adds"
        );
        let add = all
            .iter()
            .position(|e| e.key == "ns/o100" && e.kind == Add)
            .expect("o100's add");
        assert!(add < update, "{form:?}: o100's add came after its update");
        assert_eq!(all[add], seen(Add, "ns/o100", InitialList, None, Some("1")));
        let keys: std::collections::HashSet<&str> = all
            .iter()
            .filter(|e| e.kind == Add)
            .map(|e| e.key.as_str())
            .collect();
        assert_eq!(keys.len(), 200, "{form:?}: every cached key once");
        assert!(reg.has_synced());
        inf.stop();
    }
}

#[tokio::test(start_paused = true)]
async fn informer_should_give_a_late_handler_the_cache_as_initial_list_adds() {
    for form in [CacheForm::Shared, CacheForm::Encoded] {
        informer_should_give_a_late_handler_the_cache_as_initial_list_adds_in(form).await;
    }
}

async fn informer_should_give_a_late_handler_the_cache_as_initial_list_adds_in(form: CacheForm) {
    let lw = FakeLw::default();
    lw.put("a", "1");
    lw.put("b", "1");
    let w = lw.next_watch();
    let inf = informer(&lw, InformerConfig::default().cache_form(form));
    inf.start();
    inf.wait_for_sync().await;
    let (h, mut rx) = recorder();
    let reg = inf.add_handler(h);
    assert_eq!(
        take(&mut rx, 2).await,
        [
            seen(Add, "ns/a", InitialList, None, Some("1")),
            seen(Add, "ns/b", InitialList, None, Some("1")),
        ]
    );
    w.send(Ok(WatchEvent::Modified(lw.put("b", "2"))))
        .expect("feed");
    assert_eq!(
        take(&mut rx, 1).await,
        [seen(Update, "ns/b", UserChange, Some("1"), Some("2"))]
    );
    assert!(reg.has_synced());
    // Removed, it hears nothing more.
    inf.remove_handler(&reg);
    w.send(Ok(WatchEvent::Modified(lw.put("b", "3"))))
        .expect("feed");
    assert!(timeout(Duration::from_millis(100), rx.recv())
        .await
        .is_ok_and(|e| e.is_none()));
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_survive_a_handler_that_panics() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    let w = lw.next_watch();
    let inf = informer(&lw, InformerConfig::default());
    let bad = inf.add_handler(|_: &Event<ConfigMap>| panic!("a handler bug"));
    let (h, mut rx) = recorder();
    inf.add_handler(h);
    inf.start();
    assert_eq!(take(&mut rx, 1).await.len(), 1);
    w.send(Ok(WatchEvent::Modified(lw.put("a", "2"))))
        .expect("feed");
    assert_eq!(
        take(&mut rx, 1).await,
        [seen(Update, "ns/a", UserChange, Some("1"), Some("2"))]
    );
    nothing_more(&mut rx).await;
    assert_eq!(bad.panics(), 2, "both events reached it, both panicked");
    assert!(bad.has_synced());
    assert_eq!(value(&inf.store().get("ns/a")), Some("2".into()));
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn informer_should_retry_failed_lists_and_watches_with_backoff() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    {
        let mut s = lw.lock();
        s.list_failures
            .push_back(Some(WatchError::Other("connection refused".into())));
        s.list_failures
            .push_back(Some(WatchError::Other("connection refused".into())));
        s.watches
            .push_back(WatchScript::Fail(WatchError::Other("503".into())));
    }
    let inf = informer(
        &lw,
        InformerConfig::default().backoff(Duration::from_secs(1), Duration::from_secs(10)),
    );
    let t0 = tokio::time::Instant::now();
    inf.start();
    inf.wait_for_sync().await;
    // Two failures: waits of ~1 s and ~2 s (+ up to 10 % jitter).
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_millis(3300),
        "{waited:?}"
    );
    assert_eq!(lw.lock().list_calls, 3);
    // The failed watch is retried from the same version after ~1 s (the
    // good list reset the backoff), without a re-list.
    lw.watches_opened(2).await;
    let retried = t0.elapsed() - waited;
    assert!(
        retried >= Duration::from_secs(1) && retried < Duration::from_millis(1100),
        "{retried:?}"
    );
    assert_eq!(lw.watch_rvs(), ["1", "1"]);
    assert_eq!(lw.lock().list_calls, 3);
    inf.stop();
}

#[tokio::test(start_paused = true)]
async fn queue_handler_should_map_each_class_to_its_tier_and_delay() {
    let lw = FakeLw::default();
    lw.put("a", "1");
    let w = lw.next_watch();
    let window = Duration::from_secs(10);
    let inf = informer(
        &lw,
        InformerConfig::default().resync_period(Some(Duration::from_secs(60))),
    );
    let queue: WorkQueue<String> = WorkQueue::new(QueueConfig::default().name("cms"));
    let reg = inf.add_handler(
        QueueHandler::new(queue.clone(), ClassPolicy::with_resync_window(window)).seed(1),
    );
    inf.start();
    inf.wait_for_sync().await;
    let item = timeout(Duration::from_secs(1), queue.get())
        .await
        .expect("in time")
        .expect("a");
    assert_eq!(
        (item.key.as_str(), item.priority),
        ("ns/a", Priority::Background),
        "an initial-list add"
    );
    assert!(reg.has_synced());
    queue.done(&item.key);
    w.send(Ok(WatchEvent::Added(lw.put("b", "1"))))
        .expect("feed");
    let item = timeout(Duration::from_secs(1), queue.get())
        .await
        .expect("in time")
        .expect("b");
    assert_eq!(
        (item.key.as_str(), item.priority),
        ("ns/b", Priority::Urgent)
    );
    queue.done(&item.key);
    // The resync at 60 s: both keys, background, each after a delay in
    // [0, 10 s).
    tokio::time::sleep(Duration::from_secs(60)).await;
    let t = tokio::time::Instant::now();
    let mut got = Vec::new();
    for _ in 0..2 {
        let item = timeout(window, queue.get())
            .await
            .expect("within the window")
            .expect("an item");
        assert_eq!(item.priority, Priority::Background);
        got.push(item.key.clone());
        queue.done(&item.key);
    }
    assert!(t.elapsed() < window);
    got.sort();
    assert_eq!(got, ["ns/a", "ns/b"]);
    inf.stop();
}
