//! [`LeaseApi`] on a real API server: one `coordination.k8s.io/v1` Lease.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use tokio::sync::watch;

use super::error::LockError;
use super::lease_api::{LeaseApi, LeaseRecord, Versioned};
use super::watch_changes::ChangeWatch;

/// One Lease, read and written for an election.
#[derive(Debug)]
pub struct KubeLease {
    api: Api<Lease>,
    namespace: String,
    name: String,
    changes: ChangeWatch,
}

impl KubeLease {
    /// The Lease `namespace/name`; starts watching it (call inside a tokio
    /// runtime).
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let changes = ChangeWatch::start(api.clone(), name);
        Self {
            api,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            changes,
        }
    }

    fn versioned(&self, lease: &Lease) -> Versioned {
        Versioned {
            record: lease
                .spec
                .as_ref()
                .map(LeaseRecord::from_spec)
                .unwrap_or_default(),
            resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        }
    }
}

impl LeaseApi for KubeLease {
    async fn get(&self) -> Result<Option<Versioned>, LockError> {
        let got = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| LockError::from_kube(&self.describe(), e))?;
        Ok(got.as_ref().map(|l| self.versioned(l)))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Versioned, LockError> {
        let mut spec = LeaseSpec::default();
        record.write_spec(&mut spec);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        let made = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(|e| LockError::from_kube(&self.describe(), e))?;
        Ok(self.versioned(&made))
    }

    async fn update(
        &self,
        record: &LeaseRecord,
        resource_version: &str,
    ) -> Result<Versioned, LockError> {
        // A merge patch carrying the resourceVersion is refused with 409
        // if the Lease moved on: the same optimistic concurrency as
        // client-go's Update, without keeping the whole object around. Only
        // the record's fields are written (null clears a time).
        let patch = json!({
            "metadata": { "resourceVersion": resource_version },
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.lease_duration_seconds,
                "acquireTime": record.acquire_time.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime),
                "renewTime": record.renew_time.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime),
                "leaseTransitions": record.transitions,
            }
        });
        let got = self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| LockError::from_kube(&self.describe(), e))?;
        Ok(self.versioned(&got))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.receiver()
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
