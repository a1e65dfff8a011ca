//! The Lease a leader-with-lease election writes: its record (client-go's
//! `LeaderElectionRecord`) and the narrow API the elector needs, so the
//! election logic is tested against a fake.

use std::future::Future;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use super::error::LockError;

/// The election record in a Lease's spec, field for field as client-go
/// writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `holderIdentity`; empty when nobody holds it (released).
    pub holder: String,
    /// `leaseDurationSeconds`: how long others wait, from when they saw
    /// this record, before taking the lock.
    pub lease_duration_seconds: i32,
    /// `acquireTime`: when the holder took it (the holder's clock).
    pub acquire_time: Option<Timestamp>,
    /// `renewTime`: the holder's last renewal (its clock; only used to see
    /// that the record changed, never compared with our clock).
    pub renew_time: Option<Timestamp>,
    /// `leaseTransitions`: how many times the holder changed.
    pub transitions: i32,
}

impl LeaseRecord {
    /// The record in a Lease spec (absent fields read as client-go reads
    /// them: empty, zero).
    pub fn from_spec(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    /// Writes the record into `spec`, leaving the fields it does not own
    /// (`strategy`, `preferredHolder`) alone.
    pub fn write_spec(&self, spec: &mut LeaseSpec) {
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(self.lease_duration_seconds);
        spec.acquire_time = self.acquire_time.map(MicroTime);
        spec.renew_time = self.renew_time.map(MicroTime);
        spec.lease_transitions = Some(self.transitions);
    }
}

/// A record as read, with the resourceVersion an update must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The record.
    pub record: LeaseRecord,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// What the lease elector needs from the API server. Implemented for the
/// real API by [`KubeLease`](super::KubeLease), and by fakes in tests.
pub trait LeaseApi: Send + Sync + 'static {
    /// Reads the Lease; `None` if it does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<Versioned>, LockError>> + Send;
    /// Creates the Lease with `record` (`AlreadyExists` if someone did).
    fn create(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<Versioned, LockError>> + Send;
    /// Replaces the record if the Lease is still at `resource_version`
    /// (`Conflict` otherwise).
    fn update(
        &self,
        record: &LeaseRecord,
        resource_version: &str,
    ) -> impl Future<Output = Result<Versioned, LockError>> + Send;
    /// A counter that moves whenever the Lease may have changed (a watch),
    /// so a standby wakes at once when the lock is released.
    fn changes(&self) -> watch::Receiver<u64>;
    /// `namespace/name`, for logs and errors.
    fn describe(&self) -> String;
}
