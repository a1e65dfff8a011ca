//! The informer's only door to the API server: list a page, open a watch.
//!
//! A trait, so the reflector's logic is tested against a fake (as youki
//! passes its syscalls); [`ApiLister`] is the real one over a
//! [`kube::Api`], typed (any k8s-openapi type) or dynamic
//! ([`kube::api::DynamicObject`] with an [`kube::discovery::ApiResource`]).

use std::fmt::Debug;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// One page of a list.
#[derive(Debug, Clone)]
pub struct Page<K> {
    /// The objects of this page.
    pub items: Vec<K>,
    /// The list's resourceVersion (the watch starts from it).
    pub resource_version: String,
    /// The token of the next page, if any.
    pub continue_token: Option<String>,
}

/// Why a list or watch failed, as the reflector needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// 410 Gone / `Expired`: the resourceVersion or continue token is too
    /// old; only a fresh list helps.
    #[error("resource version expired: {0}")]
    Expired(String),
    /// Anything else (connection refused, 5xx, a broken stream): retried
    /// with backoff.
    #[error("{0}")]
    Other(String),
}

impl WatchError {
    /// Classifies an API status: 410, or the reasons `Expired`/`Gone`.
    #[must_use]
    pub fn from_status(code: u16, reason: &str, message: &str) -> Self {
        if code == 410 || reason == "Expired" || reason == "Gone" {
            Self::Expired(format!("{code} {reason}: {message}"))
        } else {
            Self::Other(format!("{code} {reason}: {message}"))
        }
    }
}

impl From<kube::Error> for WatchError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::from_status(s.code, &s.reason, &s.message),
            other => Self::Other(other.to_string()),
        }
    }
}

/// A stream of watch events.
pub type EventStream<K> = BoxStream<'static, Result<WatchEvent<K>, WatchError>>;

/// Lists and watches one resource type (with its namespace and selectors
/// fixed at construction).
#[async_trait]
pub trait ListerWatcher<K>: Send + Sync {
    /// Lists one page of at most `limit` objects, continuing from
    /// `continue_token` (`None`: the first page, the most recent state).
    async fn list(&self, limit: u32, continue_token: Option<String>)
        -> Result<Page<K>, WatchError>;

    /// Opens a watch from `resource_version`, with bookmarks, ending after
    /// about `timeout_secs`.
    async fn watch(
        &self,
        resource_version: &str,
        timeout_secs: u32,
    ) -> Result<EventStream<K>, WatchError>;
}

/// Label and field selectors of an informer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selectors {
    /// A label selector (`app=web,tier!=db`).
    pub labels: Option<String>,
    /// A field selector (`spec.nodeName=n1`).
    pub fields: Option<String>,
}

impl Selectors {
    /// Selects by labels.
    #[must_use]
    pub fn labels(mut self, selector: impl Into<String>) -> Self {
        self.labels = Some(selector.into());
        self
    }

    /// Selects by fields.
    #[must_use]
    pub fn fields(mut self, selector: impl Into<String>) -> Self {
        self.fields = Some(selector.into());
        self
    }
}

/// The real [`ListerWatcher`] over a [`kube::Api`].
#[derive(Debug, Clone)]
pub struct ApiLister<K> {
    api: Api<K>,
    selectors: Selectors,
}

impl<K> ApiLister<K> {
    /// Lists and watches what `api` addresses (all namespaces or one),
    /// restricted by `selectors`.
    pub fn new(api: Api<K>, selectors: Selectors) -> Self {
        Self { api, selectors }
    }
}

#[async_trait]
impl<K> ListerWatcher<K> for ApiLister<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    async fn list(
        &self,
        limit: u32,
        continue_token: Option<String>,
    ) -> Result<Page<K>, WatchError> {
        // No resourceVersion: a consistent, most recent list (served from
        // etcd or the watch cache's consistent read), paginated.
        let lp = ListParams {
            label_selector: self.selectors.labels.clone(),
            field_selector: self.selectors.fields.clone(),
            limit: Some(limit),
            continue_token,
            ..ListParams::default()
        };
        let list = self.api.list(&lp).await?;
        Ok(Page {
            items: list.items,
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
        })
    }

    async fn watch(
        &self,
        resource_version: &str,
        timeout_secs: u32,
    ) -> Result<EventStream<K>, WatchError> {
        let wp = WatchParams {
            label_selector: self.selectors.labels.clone(),
            field_selector: self.selectors.fields.clone(),
            timeout: Some(timeout_secs),
            bookmarks: true,
            ..WatchParams::default()
        };
        let stream = self.api.watch(&wp, resource_version).await?;
        Ok(stream.map(|r| r.map_err(WatchError::from)).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_error_should_treat_410_and_expired_as_expired() {
        for (code, reason) in [(410, ""), (500, "Expired"), (200, "Gone")] {
            assert!(matches!(
                WatchError::from_status(code, reason, "too old"),
                WatchError::Expired(_)
            ));
        }
        assert!(matches!(
            WatchError::from_status(500, "InternalError", "x"),
            WatchError::Other(_)
        ));
    }
}
