//! In-memory lock APIs for the electors' unit tests: one store shared by
//! several candidates' handles, with failure and clock-skew knobs per
//! handle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

use super::error::LockError;
use super::for_life::{ConfigMapLock, LockObject, PodRef};
use super::lease_api::{LeaseApi, LeaseRecord, Versioned};

#[derive(Debug, Default)]
struct Lease {
    record: Option<(LeaseRecord, u64)>,
    history: Vec<LeaseRecord>,
    next_rv: u64,
}

/// One Lease shared by handles.
#[derive(Debug, Clone)]
pub(crate) struct LeaseStore {
    lease: Arc<Mutex<Lease>>,
    changes: Arc<watch::Sender<u64>>,
    notify: Arc<AtomicBool>,
}

impl LeaseStore {
    pub(crate) fn new() -> Self {
        Self {
            lease: Arc::default(),
            changes: Arc::new(watch::channel(0).0),
            notify: Arc::new(AtomicBool::new(true)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        if self.notify.load(Ordering::Acquire) {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Turns change notifications (the watch) off or on.
    pub(crate) fn set_notify(&self, on: bool) {
        self.notify.store(on, Ordering::Release);
    }

    /// The record now.
    pub(crate) fn record(&self) -> Option<LeaseRecord> {
        self.lock().record.as_ref().map(|(r, _)| r.clone())
    }

    /// Every record written, in order.
    pub(crate) fn history(&self) -> Vec<LeaseRecord> {
        self.lock().history.clone()
    }

    /// Someone else edits the Lease.
    pub(crate) fn edit(&self, f: impl FnOnce(&mut LeaseRecord)) {
        {
            let mut l = self.lock();
            l.next_rv += 1;
            let rv = l.next_rv;
            if let Some((r, v)) = l.record.as_mut() {
                f(r);
                *v = rv;
            }
        }
        self.bump();
    }

    /// A candidate's handle.
    pub(crate) fn handle(&self, name: &str) -> FakeLease {
        FakeLease {
            store: self.clone(),
            name: name.to_owned(),
            down: Arc::new(AtomicBool::new(false)),
            failing: Arc::new(AtomicBool::new(false)),
            skew_secs: 0,
            calls: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// One candidate's view of a [`LeaseStore`].
#[derive(Debug, Clone)]
pub(crate) struct FakeLease {
    store: LeaseStore,
    name: String,
    /// While set, calls never return (a partition: the caller's timeout
    /// ends them).
    pub(crate) down: Arc<AtomicBool>,
    /// While set, calls fail at once (an API error).
    pub(crate) failing: Arc<AtomicBool>,
    /// Added to the times this candidate writes (its wall clock is off).
    pub(crate) skew_secs: i64,
    /// Calls made.
    pub(crate) calls: Arc<AtomicU64>,
}

impl FakeLease {
    async fn enter(&self) -> Result<(), LockError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
        if self.failing.load(Ordering::Acquire) {
            return Err(LockError::Api {
                lock: self.describe(),
                source: "injected failure".into(),
            });
        }
        Ok(())
    }

    fn skewed(&self, r: &LeaseRecord) -> LeaseRecord {
        let d = SignedDuration::from_secs(self.skew_secs);
        let shift = |t: Option<Timestamp>| t.and_then(|t| t.checked_add(d).ok());
        LeaseRecord {
            acquire_time: shift(r.acquire_time),
            renew_time: shift(r.renew_time),
            ..r.clone()
        }
    }
}

impl LeaseApi for FakeLease {
    async fn get(&self) -> Result<Option<Versioned>, LockError> {
        self.enter().await?;
        Ok(self.store.lock().record.as_ref().map(|(r, v)| Versioned {
            record: r.clone(),
            resource_version: v.to_string(),
        }))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<Versioned, LockError> {
        self.enter().await?;
        let record = self.skewed(record);
        let v = {
            let mut l = self.store.lock();
            if l.record.is_some() {
                return Err(LockError::AlreadyExists {
                    lock: self.describe(),
                });
            }
            l.next_rv += 1;
            let rv = l.next_rv;
            l.record = Some((record.clone(), rv));
            l.history.push(record.clone());
            Versioned {
                record,
                resource_version: rv.to_string(),
            }
        };
        self.store.bump();
        Ok(v)
    }

    async fn update(&self, record: &LeaseRecord, rv: &str) -> Result<Versioned, LockError> {
        self.enter().await?;
        let record = self.skewed(record);
        let v = {
            let mut l = self.store.lock();
            l.next_rv += 1;
            let new_rv = l.next_rv;
            match l.record.as_mut() {
                Some((r, v)) if v.to_string() == rv => {
                    *r = record.clone();
                    *v = new_rv;
                    l.history.push(record.clone());
                }
                _ => {
                    return Err(LockError::Conflict {
                        lock: self.describe(),
                    })
                }
            }
            Versioned {
                record,
                resource_version: new_rv.to_string(),
            }
        };
        self.store.bump();
        Ok(v)
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.store.changes.subscribe()
    }

    fn describe(&self) -> String {
        format!("fake/{}", self.name)
    }
}

/// One lock ConfigMap shared by handles.
#[derive(Debug, Clone)]
pub(crate) struct ConfigMapStore {
    obj: Arc<Mutex<(Option<LockObject>, u64)>>,
    changes: Arc<watch::Sender<u64>>,
}

impl ConfigMapStore {
    pub(crate) fn new() -> Self {
        Self {
            obj: Arc::default(),
            changes: Arc::new(watch::channel(0).0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (Option<LockObject>, u64)> {
        self.obj.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock now.
    pub(crate) fn object(&self) -> Option<LockObject> {
        self.lock().0.clone()
    }

    /// Someone (the garbage collector, a user) deletes the lock.
    pub(crate) fn remove(&self) {
        self.lock().0 = None;
        self.changes.send_modify(|n| *n += 1);
    }
}

/// A candidate's view of a [`ConfigMapStore`].
#[derive(Debug, Clone)]
pub(crate) struct FakeConfigMap {
    pub(crate) store: ConfigMapStore,
}

impl ConfigMapLock for FakeConfigMap {
    async fn get(&self) -> Result<Option<LockObject>, LockError> {
        Ok(self.store.object())
    }

    async fn create(&self, owner: &PodRef) -> Result<LockObject, LockError> {
        let obj = {
            let mut l = self.store.lock();
            if l.0.is_some() {
                return Err(LockError::AlreadyExists {
                    lock: self.describe(),
                });
            }
            l.1 += 1;
            let obj = LockObject {
                uid: format!("cm-{}", l.1),
                owner_uid: Some(owner.uid.clone()),
            };
            l.0 = Some(obj.clone());
            obj
        };
        self.store.changes.send_modify(|n| *n += 1);
        Ok(obj)
    }

    async fn delete(&self, uid: &str) -> Result<(), LockError> {
        {
            let mut l = self.store.lock();
            if l.0.as_ref().map(|o| o.uid.as_str()) != Some(uid) {
                return Ok(());
            }
            l.0 = None;
        }
        self.store.changes.send_modify(|n| *n += 1);
        Ok(())
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.store.changes.subscribe()
    }

    fn describe(&self) -> String {
        "fake/lock".into()
    }
}
