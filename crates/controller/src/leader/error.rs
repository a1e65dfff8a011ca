//! Errors of the lock APIs and the electors' configuration.

/// A lock API call's failure, classified as the electors need it.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The object changed since it was read (HTTP 409 on update): someone
    /// else wrote it first.
    #[error("lock {lock}: conflict: the object changed since it was read")]
    Conflict {
        /// The lock (`namespace/name`).
        lock: String,
    },
    /// A create found the object there (someone else created it first).
    #[error("lock {lock}: already exists")]
    AlreadyExists {
        /// The lock (`namespace/name`).
        lock: String,
    },
    /// Any other API failure (network, 5xx, forbidden...).
    #[error("lock {lock}: {source}")]
    Api {
        /// The lock (`namespace/name`).
        lock: String,
        /// What the client said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl LockError {
    /// Sorts a kube error for lock `lock`.
    pub(crate) fn from_kube(lock: &str, e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(s) if s.is_conflict() => Self::Conflict {
                lock: lock.to_owned(),
            },
            kube::Error::Api(s) if s.is_already_exists() => Self::AlreadyExists {
                lock: lock.to_owned(),
            },
            _ => Self::Api {
                lock: lock.to_owned(),
                source: Box::new(e),
            },
        }
    }
}

/// An elector's configuration is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A field is out of range; the message names it and the rule.
    #[error("leader election config: {field}: {rule}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What it must satisfy.
        rule: &'static str,
    },
    /// A required environment variable is unset or empty.
    #[error("leader election: environment variable {0} is not set")]
    MissingEnv(&'static str),
}
