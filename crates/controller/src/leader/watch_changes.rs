//! A background watch of one named object that bumps a counter on every
//! change, so a standby candidate wakes at once instead of at its next
//! retry.

use std::fmt::Debug;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Server-side watch timeout: below the API server's own cap, so watches
/// end cleanly and are renewed.
const WATCH_TIMEOUT_SECS: u32 = 290;
/// Pause after a failed watch before the next, so an API outage is not a
/// busy loop (the candidates still retry on their own timers).
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// The watch task; aborted when dropped.
#[derive(Debug)]
pub(crate) struct ChangeWatch {
    rx: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl ChangeWatch {
    /// Watches object `name` of `api`.
    pub(crate) fn start<K>(api: Api<K>, name: &str) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let (tx, rx) = watch::channel(0u64);
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(WATCH_TIMEOUT_SECS);
        let what = name.to_owned();
        let task = tokio::spawn(async move {
            let mut failing = false;
            loop {
                match api.watch(&wp, "0").await {
                    Ok(stream) => {
                        let mut stream = Box::pin(stream);
                        while let Some(ev) = stream.next().await {
                            match ev {
                                Ok(WatchEvent::Added(_))
                                | Ok(WatchEvent::Modified(_))
                                | Ok(WatchEvent::Deleted(_)) => {
                                    failing = false;
                                    tx.send_modify(|n| *n = n.wrapping_add(1));
                                }
                                Ok(_) => {}
                                Err(_) => break,
                            }
                        }
                    }
                    Err(e) => {
                        // Once per episode, not per retry.
                        if !failing {
                            tracing::warn!(lock = %what, error = %e, "lock watch failed; retrying");
                            failing = true;
                        }
                    }
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(RETRY_AFTER).await;
            }
        });
        Self { rx, task }
    }

    /// The change counter.
    pub(crate) fn receiver(&self) -> watch::Receiver<u64> {
        self.rx.clone()
    }
}

impl Drop for ChangeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
