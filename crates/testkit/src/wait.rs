//! Polling for a condition a test waits on.

use std::time::{Duration, Instant};

/// Waits up to `within` until `f` holds; returns whether it did.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}
