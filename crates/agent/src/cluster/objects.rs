//! The API objects the node's pods read — ConfigMaps, Secrets and
//! service-account tokens — as kubelet's watch-based managers keep them:
//!
//! - one watch per object (`metadata.name=<name>` in its namespace: the
//!   Node authorizer lets a node read exactly the objects its pods
//!   reference), started when the first pod referencing it is prepared
//!   and ended when the last one is released, so a quiet node costs the
//!   API server a watch per object, not a poll per pod;
//! - tokens issued through TokenRequest, bound to the pod, renewed once
//!   80 % of their life or 24 h has passed;
//! - every change (an object's, a renewed token) told to `changed` with
//!   the UIDs of the pods concerned, whose volumes are then written again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenRequestStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, PostParams};
use petrel_controller::informer::{
    ApiLister, Event, Indexers, InformerConfig, Selectors, SharedInformer,
};
use serde::de::DeserializeOwned;

use crate::convert::{token_keys, Lookup, ObjectView, TokenKey};
use crate::types::DesiredPod;
use crate::worker::PodObjects;

/// How long a pod's preparation waits for its objects' watches to list
/// them before the pod is retried.
const SYNC_WAIT: Duration = Duration::from_secs(5);
/// How often issued tokens are looked at for renewal.
const TOKEN_CHECK: Duration = Duration::from_secs(30);
/// A token is renewed after this long whatever its lifetime (kubelet).
const TOKEN_MAX_AGE_SECONDS: i64 = 24 * 3600;

/// `(namespace, name)`.
type ObjKey = (String, String);
/// The informer name and `tell` kind of the ClusterTrustBundles' watch.
const TRUST_BUNDLES: &str = "clustertrustbundle";

/// What a pod references.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMaps (volumes, projections, env, envFrom).
    pub config_maps: BTreeSet<ObjKey>,
    /// Secrets (the same).
    pub secrets: BTreeSet<ObjKey>,
    /// Whether a projection reads ClusterTrustBundles.
    pub trust_bundles: bool,
}

/// The ConfigMaps and Secrets `pod` reads, in its namespace.
pub fn references(pod: &DesiredPod) -> References {
    let mut r = References::default();
    let Some(spec) = pod.pod.spec.as_ref() else {
        return r;
    };
    let key = |n: &str| (pod.namespace.clone(), n.to_string());
    for v in spec.volumes.iter().flatten() {
        if let Some(c) = &v.config_map {
            r.config_maps.insert(key(&c.name));
        }
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            r.secrets.insert(key(name));
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(c) = &s.config_map {
                r.config_maps.insert(key(&c.name));
            }
            if let Some(c) = &s.secret {
                r.secrets.insert(key(&c.name));
            }
            r.trust_bundles |= s.cluster_trust_bundle.is_some();
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(r2) = &e.config_map_key_ref {
                r.config_maps.insert(key(&r2.name));
            }
            if let Some(r2) = &e.secret_key_ref {
                r.secrets.insert(key(&r2.name));
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r2) = &e.config_map_ref {
                r.config_maps.insert(key(&r2.name));
            }
            if let Some(r2) = &e.secret_ref {
                r.secrets.insert(key(&r2.name));
            }
        }
    }
    r
}

/// Whether a token issued at `issued`, expiring at `expires`, is due for
/// renewal at `now`: 80 % of its life gone, or 24 h old (kubelet's rule).
pub fn needs_renewal(issued: Timestamp, expires: Timestamp, now: Timestamp) -> bool {
    let life = expires.as_second() - issued.as_second();
    let age = now.as_second() - issued.as_second();
    age * 5 >= life * 4 || age >= TOKEN_MAX_AGE_SECONDS
}

/// One watched object and the pods that reference it.
struct Watched<K> {
    informer: SharedInformer<K>,
    users: BTreeSet<String>,
}

/// A token issued for a pod.
#[derive(Clone)]
struct Issued {
    token: String,
    issued: Timestamp,
    expires: Timestamp,
    /// The pod it is bound to: namespace, name.
    pod: ObjKey,
}

#[derive(Default)]
struct State {
    config_maps: BTreeMap<ObjKey, Watched<ConfigMap>>,
    secrets: BTreeMap<ObjKey, Watched<Secret>>,
    pods: BTreeMap<String, References>,
    tokens: BTreeMap<(String, TokenKey), Issued>,
    /// The cluster's ClusterTrustBundles, watched while a pod reads them.
    trust_bundles: Option<Watched<DynamicObject>>,
}

/// Told the UIDs of pods whose objects or tokens changed.
pub type Changed = Arc<dyn Fn(&str) + Send + Sync>;

/// The node's view of its pods' API objects; see the module's doc.
pub struct ObjectManager {
    client: kube::Client,
    state: Mutex<State>,
    changed: Changed,
    me: Weak<ObjectManager>,
}

impl ObjectManager {
    /// A manager reading with `client`, telling `changed` of changes.
    pub fn new(client: kube::Client, changed: Changed) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            client,
            state: Mutex::new(State::default()),
            changed,
            me: me.clone(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The watch of one object, started.
    fn watch<K>(&self, kind: &'static str, key: &ObjKey) -> SharedInformer<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
            + Clone
            + serde::Serialize
            + DeserializeOwned
            + std::fmt::Debug
            + PartialEq
            + Send
            + Sync
            + 'static,
        K::DynamicType: Default,
    {
        let api: kube::Api<K> = kube::Api::namespaced(self.client.clone(), &key.0);
        let lw = ApiLister::new(
            api,
            Selectors::default().fields(format!("metadata.name={}", key.1)),
        );
        let informer = SharedInformer::new(
            Arc::new(lw),
            Indexers::standard(),
            InformerConfig::default()
                .name(kind)
                .strip_managed_fields(true)
                .backoff(Duration::from_millis(200), Duration::from_secs(7)),
        );
        let me = self.me.clone();
        let (kind_of, k) = (kind, key.clone());
        let _ = informer.add_handler(move |_: &Event<K>| {
            if let Some(me) = me.upgrade() {
                me.tell(kind_of, &k);
            }
        });
        informer.start();
        informer
    }

    /// Tells `changed` of every pod using object `key` of `kind`.
    fn tell(&self, kind: &str, key: &ObjKey) {
        let users: Vec<String> = {
            let s = self.state();
            let watched = match kind {
                "configmap" => s.config_maps.get(key).map(|w| &w.users),
                "secret" => s.secrets.get(key).map(|w| &w.users),
                _ => s.trust_bundles.as_ref().map(|w| &w.users),
            };
            watched
                .map(|u| u.iter().cloned().collect())
                .unwrap_or_default()
        };
        for uid in users {
            (self.changed)(&uid);
        }
    }

    /// Makes pod `uid`'s references `refs`: new watches started, those no
    /// pod needs any more stopped.
    fn register(&self, uid: &str, refs: References) {
        let mut s = self.state();
        if s.pods.get(uid) == Some(&refs) {
            return;
        }
        let old = s
            .pods
            .insert(uid.to_string(), refs.clone())
            .unwrap_or_default();
        for key in refs.config_maps.difference(&old.config_maps) {
            if !s.config_maps.contains_key(key) {
                let informer = self.watch::<ConfigMap>("configmap", key);
                s.config_maps.insert(
                    key.clone(),
                    Watched {
                        informer,
                        users: BTreeSet::new(),
                    },
                );
            }
            if let Some(w) = s.config_maps.get_mut(key) {
                w.users.insert(uid.to_string());
            }
        }
        for key in refs.secrets.difference(&old.secrets) {
            if !s.secrets.contains_key(key) {
                let informer = self.watch::<Secret>("secret", key);
                s.secrets.insert(
                    key.clone(),
                    Watched {
                        informer,
                        users: BTreeSet::new(),
                    },
                );
            }
            if let Some(w) = s.secrets.get_mut(key) {
                w.users.insert(uid.to_string());
            }
        }
        let gone = References {
            config_maps: old
                .config_maps
                .difference(&refs.config_maps)
                .cloned()
                .collect(),
            secrets: old.secrets.difference(&refs.secrets).cloned().collect(),
            trust_bundles: old.trust_bundles && !refs.trust_bundles,
        };
        if refs.trust_bundles {
            if s.trust_bundles.is_none() {
                s.trust_bundles = Some(Watched {
                    informer: self.watch_trust_bundles(),
                    users: BTreeSet::new(),
                });
            }
            if let Some(w) = s.trust_bundles.as_mut() {
                w.users.insert(uid.to_string());
            }
        }
        drop_users(&mut s, uid, &gone);
    }

    /// The watch of every ClusterTrustBundle (`certificates.k8s.io/v1`,
    /// cluster-scoped; the Node authorizer lets nodes read them), started.
    fn watch_trust_bundles(&self) -> SharedInformer<DynamicObject> {
        let resource = ApiResource {
            group: "certificates.k8s.io".into(),
            version: "v1".into(),
            api_version: "certificates.k8s.io/v1".into(),
            kind: "ClusterTrustBundle".into(),
            plural: "clustertrustbundles".into(),
        };
        let api: kube::Api<DynamicObject> = kube::Api::all_with(self.client.clone(), &resource);
        let informer = SharedInformer::new(
            Arc::new(ApiLister::new(api, Selectors::default())),
            Indexers::standard(),
            InformerConfig::default()
                .name(TRUST_BUNDLES)
                .strip_managed_fields(true)
                .backoff(Duration::from_millis(200), Duration::from_secs(7)),
        );
        let me = self.me.clone();
        let none = (String::new(), String::new());
        let _ = informer.add_handler(move |_: &Event<DynamicObject>| {
            if let Some(me) = me.upgrade() {
                me.tell(TRUST_BUNDLES, &none);
            }
        });
        informer.start();
        informer
    }

    /// What of `refs` is not listed yet.
    fn unsynced(&self, refs: &References) -> Option<String> {
        let s = self.state();
        for key in &refs.config_maps {
            if !s
                .config_maps
                .get(key)
                .is_some_and(|w| w.informer.has_synced())
            {
                return Some(format!("configmap {:?} not yet listed", key.1));
            }
        }
        for key in &refs.secrets {
            if !s.secrets.get(key).is_some_and(|w| w.informer.has_synced()) {
                return Some(format!("secret {:?} not yet listed", key.1));
            }
        }
        let bundles_listed = s
            .trust_bundles
            .as_ref()
            .is_some_and(|w| w.informer.has_synced());
        if refs.trust_bundles && !bundles_listed {
            return Some("ClusterTrustBundle informer has not yet synced".to_string());
        }
        None
    }

    /// How many ConfigMaps and Secrets are watched now.
    pub fn watched(&self) -> (usize, usize) {
        let s = self.state();
        (s.config_maps.len(), s.secrets.len())
    }

    /// Issues token `key` for `pod` through TokenRequest.
    async fn request_token(
        &self,
        pod: &ObjKey,
        uid: &str,
        key: &TokenKey,
    ) -> Result<Issued, String> {
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(self.client.clone(), &pod.0);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if key.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![key.audience.clone()]
                },
                expiration_seconds: Some(key.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.1.clone()),
                    uid: Some(uid.to_string()),
                }),
            },
            ..Default::default()
        };
        let got: TokenRequest = api
            .create_subresource(
                "token",
                &key.service_account,
                &PostParams::default(),
                &request,
            )
            .await
            .map_err(|e| {
                format!(
                    "failed to fetch token for service account {:?}: {e}",
                    key.service_account
                )
            })?;
        let TokenRequestStatus {
            token,
            expiration_timestamp,
        } = got.status.ok_or("TokenRequest answered without a status")?;
        Ok(Issued {
            token,
            issued: Timestamp::now(),
            expires: expiration_timestamp.0,
            pod: pod.clone(),
        })
    }

    /// Renews every token due, telling `changed` of each pod concerned;
    /// runs until its task is aborted.
    pub async fn renew_tokens(self: Arc<Self>) {
        let mut failing: Option<String> = None;
        loop {
            tokio::time::sleep(TOKEN_CHECK).await;
            let now = Timestamp::now();
            let due: Vec<((String, TokenKey), Issued)> = self
                .state()
                .tokens
                .iter()
                .filter(|(_, t)| needs_renewal(t.issued, t.expires, now))
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect();
            for ((uid, key), old) in due {
                match self.request_token(&old.pod, &uid, &key).await {
                    Ok(new) => {
                        let mut s = self.state();
                        // Released meanwhile: not brought back.
                        if let Some(t) = s.tokens.get_mut(&(uid.clone(), key.clone())) {
                            *t = new;
                            drop(s);
                            tracing::info!(uid, service_account = %key.service_account, "service-account token renewed");
                            (self.changed)(&uid);
                        }
                        failing = None;
                    }
                    Err(e) => {
                        if failing.as_deref() != Some(e.as_str()) {
                            tracing::warn!(uid, error = %e, "service-account token renewal failed; retrying");
                            failing = Some(e);
                        }
                    }
                }
            }
        }
    }
}

/// Takes `uid` off the users of `gone`'s objects, stopping the watches
/// nobody uses any more.
fn drop_users(s: &mut State, uid: &str, gone: &References) {
    drop_from(&mut s.config_maps, "configmap", uid, &gone.config_maps);
    drop_from(&mut s.secrets, "secret", uid, &gone.secrets);
    if gone.trust_bundles {
        if let Some(w) = s.trust_bundles.as_mut() {
            w.users.remove(uid);
            if w.users.is_empty() {
                w.informer.stop();
                s.trust_bundles = None;
                tracing::info!(
                    kind = TRUST_BUNDLES,
                    "watch ended: no pod of this node reads it any more"
                );
            }
        }
    }
}

/// A ClusterTrustBundle as projections read it (`spec.signerName`,
/// `spec.trustBundle`).
fn trust_bundle(o: &DynamicObject) -> crate::convert::TrustBundle {
    let spec = &o.data["spec"];
    let text = |k: &str| spec[k].as_str().unwrap_or_default().to_string();
    crate::convert::TrustBundle {
        name: o.metadata.name.clone().unwrap_or_default(),
        signer_name: text("signerName"),
        labels: o.metadata.labels.clone().unwrap_or_default(),
        pem: text("trustBundle"),
    }
}

fn drop_from<K>(
    watched: &mut BTreeMap<ObjKey, Watched<K>>,
    kind: &str,
    uid: &str,
    gone: &BTreeSet<ObjKey>,
) where
    K: kube::Resource + Clone + PartialEq + Send + Sync + 'static,
{
    for key in gone {
        if let Some(w) = watched.get_mut(key) {
            w.users.remove(uid);
            if w.users.is_empty() {
                w.informer.stop();
                watched.remove(key);
                tracing::info!(kind, namespace = %key.0, name = %key.1, "watch ended: no pod of this node reads it any more");
            }
        }
    }
}

fn lookup<K: kube::Resource + Clone + PartialEq + Send + Sync + 'static>(
    watched: Option<&Watched<K>>,
    kind: &str,
    key: &ObjKey,
) -> Lookup<K> {
    match watched {
        Some(w) if w.informer.has_synced() => {
            match w.informer.store().get(&format!("{}/{}", key.0, key.1)) {
                Some(o) => Lookup::Found(o),
                None => Lookup::NotFound,
            }
        }
        _ => Lookup::Unknown(format!("{kind} {:?} not yet listed", key.1)),
    }
}

impl ObjectView for ObjectManager {
    fn config_map(&self, namespace: &str, name: &str) -> Lookup<ConfigMap> {
        let key = (namespace.to_string(), name.to_string());
        lookup(self.state().config_maps.get(&key), "configmap", &key)
    }

    fn secret(&self, namespace: &str, name: &str) -> Lookup<Secret> {
        let key = (namespace.to_string(), name.to_string());
        lookup(self.state().secrets.get(&key), "secret", &key)
    }

    fn token(&self, uid: &str, key: &TokenKey) -> Option<String> {
        self.state()
            .tokens
            .get(&(uid.to_string(), key.clone()))
            .map(|t| t.token.clone())
    }

    fn trust_bundles(&self) -> Lookup<Vec<crate::convert::TrustBundle>> {
        match self.state().trust_bundles.as_ref() {
            Some(w) if w.informer.has_synced() => Lookup::Found(Arc::new(
                w.informer
                    .store()
                    .list()
                    .iter()
                    .map(|o| trust_bundle(o))
                    .collect(),
            )),
            _ => Lookup::Unknown("ClusterTrustBundle informer has not yet synced".to_string()),
        }
    }
}

#[async_trait::async_trait]
impl PodObjects for ObjectManager {
    async fn prepare(&self, pod: &DesiredPod) -> Result<(), String> {
        // Static pods read no API objects (their conversion says so).
        if pod.source != crate::types::PodOrigin::Api {
            return Ok(());
        }
        let refs = references(pod);
        self.register(&pod.uid, refs.clone());
        let pod_key = (pod.namespace.clone(), pod.name.clone());
        for key in token_keys(pod) {
            let have = self
                .state()
                .tokens
                .contains_key(&(pod.uid.clone(), key.clone()));
            if !have {
                let issued = self.request_token(&pod_key, &pod.uid, &key).await?;
                self.state().tokens.insert((pod.uid.clone(), key), issued);
            }
        }
        let start = tokio::time::Instant::now();
        loop {
            match self.unsynced(&refs) {
                None => return Ok(()),
                Some(what) if start.elapsed() >= SYNC_WAIT => return Err(what),
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn release(&self, uid: &str) {
        let mut s = self.state();
        if let Some(refs) = s.pods.remove(uid) {
            drop_users(&mut s, uid, &refs);
        }
        s.tokens.retain(|(u, _), _| u != uid);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::desired;

    #[test]
    fn references_should_find_every_config_map_and_secret_a_pod_reads() {
        let pod = desired(
            r#"
metadata: {name: p, namespace: ns}
spec:
  volumes:
  - {name: a, configMap: {name: cm-vol}}
  - {name: b, secret: {secretName: sec-vol}}
  - name: c
    projected:
      sources:
      - configMap: {name: cm-proj}
      - secret: {name: sec-proj}
      - serviceAccountToken: {path: token}
  initContainers:
  - name: i
    image: x
    envFrom: [{configMapRef: {name: cm-init}}]
  containers:
  - name: app
    image: x
    env:
    - {name: A, valueFrom: {configMapKeyRef: {name: cm-env, key: k}}}
    - {name: B, valueFrom: {secretKeyRef: {name: sec-env, key: k}}}
    envFrom: [{secretRef: {name: sec-from}}]
"#,
        );
        let r = references(&pod);
        let names = |s: &BTreeSet<ObjKey>| -> Vec<String> {
            s.iter()
                .inspect(|k| assert_eq!(k.0, "ns"))
                .map(|k| k.1.clone())
                .collect()
        };
        assert_eq!(
            names(&r.config_maps),
            ["cm-env", "cm-init", "cm-proj", "cm-vol"]
        );
        assert_eq!(
            names(&r.secrets),
            ["sec-env", "sec-from", "sec-proj", "sec-vol"]
        );
    }

    #[tokio::test]
    async fn watches_should_live_as_long_as_a_pod_reads_their_object() {
        // An API server nobody answers at: the watches only retry.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let told = Arc::new(Mutex::new(Vec::<String>::new()));
        let t = Arc::clone(&told);
        let m = ObjectManager::new(
            client,
            Arc::new(move |u: &str| t.lock().unwrap().push(u.into())),
        );
        let a = desired("metadata: {name: a, namespace: ns}\nspec:\n  volumes: [{name: v, configMap: {name: shared}}, {name: s, secret: {secretName: only-a}}]\n  containers: [{name: c, image: x}]\n");
        let mut b = desired("metadata: {name: b, namespace: ns}\nspec:\n  volumes: [{name: v, configMap: {name: shared}}]\n  containers: [{name: c, image: x}]\n");
        b.uid = "uid-b".into();
        m.register(&a.uid, references(&a));
        m.register(&b.uid, references(&b));
        assert_eq!(m.watched(), (1, 1));
        // Not listed yet: a lookup says so rather than "not found".
        assert!(matches!(m.config_map("ns", "shared"), Lookup::Unknown(_)));
        assert_eq!(
            m.unsynced(&references(&a)).as_deref(),
            Some("configmap \"shared\" not yet listed")
        );
        m.release(&a.uid);
        assert_eq!(
            m.watched(),
            (1, 0),
            "the secret only a read is no longer watched"
        );
        // b no longer reads the ConfigMap: its watch ends.
        let none = desired(
            "metadata: {name: b, namespace: ns}\nspec:\n  containers: [{name: c, image: x}]\n",
        );
        m.register(&b.uid, references(&none));
        assert_eq!(m.watched(), (0, 0));
        m.release(&b.uid);

        // ClusterTrustBundles: one watch of them all while a pod reads them.
        let c = desired("metadata: {name: c, namespace: ns}\nspec:\n  volumes: [{name: v, projected: {sources: [{clusterTrustBundle: {name: x, path: ca.pem}}]}}]\n  containers: [{name: c, image: x}]\n");
        let refs = references(&c);
        assert!(refs.trust_bundles);
        m.register(&c.uid, refs.clone());
        assert!(m.state().trust_bundles.is_some());
        assert!(matches!(m.trust_bundles(), Lookup::Unknown(_)));
        assert_eq!(
            m.unsynced(&refs).as_deref(),
            Some("ClusterTrustBundle informer has not yet synced")
        );
        m.release(&c.uid);
        assert!(m.state().trust_bundles.is_none());
    }

    #[test]
    fn needs_renewal_should_follow_kubelet_s_rule() {
        let at = |s: i64| Timestamp::from_second(1_000_000 + s).unwrap();
        // One hour: renewed from 48 min on.
        assert!(!needs_renewal(at(0), at(3600), at(2879)));
        assert!(needs_renewal(at(0), at(3600), at(2880)));
        // A year: renewed after a day.
        let year = 365 * 24 * 3600;
        assert!(!needs_renewal(at(0), at(year), at(24 * 3600 - 1)));
        assert!(needs_renewal(at(0), at(year), at(24 * 3600)));
    }
}
