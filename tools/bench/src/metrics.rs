//! The runtime's own view of its calls: the `operations_duration_seconds`
//! histogram of its metrics (Admin.Metrics), which times each handler
//! without the transport. Differences of two snapshots give the mean
//! handler time of the calls made in between.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::node::Clients;

const METRIC: &str = "petrel_runtime_operations_duration_seconds";

/// Sum of seconds and count per CRI operation.
#[derive(Debug, Clone, Default)]
pub struct OpTotals(HashMap<String, (f64, u64)>);

impl OpTotals {
    /// Reads the runtime's current totals.
    pub async fn read(c: &mut Clients) -> Result<OpTotals> {
        let text = c
            .admin
            .metrics(petrel_cri::admin::MetricsRequest {})
            .await
            .context("Admin.Metrics")?
            .into_inner()
            .text;
        Ok(parse(&text))
    }

    /// Mean handler time of `op` between `before` and `self`, if it ran.
    pub fn mean_since(&self, before: &OpTotals, op: &str) -> Option<Duration> {
        let (s1, n1) = self.0.get(op).copied()?;
        let (s0, n0) = before.0.get(op).copied().unwrap_or_default();
        let n = n1.checked_sub(n0).filter(|n| *n > 0)?;
        Duration::try_from_secs_f64((s1 - s0).max(0.0) / n as f64).ok()
    }
}

fn parse(text: &str) -> OpTotals {
    let mut totals: HashMap<String, (f64, u64)> = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(METRIC) else {
            continue;
        };
        let (is_sum, rest) = if let Some(r) = rest.strip_prefix("_sum") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix("_count") {
            (false, r)
        } else {
            continue;
        };
        let Some(op) = label(rest, "operation_type") else {
            continue;
        };
        let Some(value) = rest.rsplit(' ').next() else {
            continue;
        };
        let entry = totals.entry(op.to_string()).or_default();
        if is_sum {
            entry.0 = value.parse().unwrap_or(0.0);
        } else {
            entry.1 = value.parse::<f64>().map(|v| v as u64).unwrap_or(0);
        }
    }
    OpTotals(totals)
}

/// The value of label `name` in `{a="x",b="y"} ...`.
fn label<'a>(s: &'a str, name: &str) -> Option<&'a str> {
    let inner = s.strip_prefix('{')?.split('}').next()?;
    inner.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_should_give_the_mean_of_the_calls_in_between() {
        let before = parse(
            "# HELP x\n\
             petrel_runtime_operations_duration_seconds_sum{operation_type=\"ListContainers\"} 0.5\n\
             petrel_runtime_operations_duration_seconds_count{operation_type=\"ListContainers\"} 10\n\
             petrel_runtime_operations_duration_seconds_bucket{le=\"0.001\",operation_type=\"ListContainers\"} 3\n",
        );
        let after = parse(
            "petrel_runtime_operations_duration_seconds_sum{operation_type=\"ListContainers\"} 0.9\n\
             petrel_runtime_operations_duration_seconds_count{operation_type=\"ListContainers\"} 210\n\
             petrel_runtime_operations_duration_seconds_count{operation_type=\"Version\"} 4\n",
        );
        assert_eq!(
            after.mean_since(&before, "ListContainers"),
            Some(Duration::from_millis(2))
        );
        assert_eq!(after.mean_since(&before, "Version"), Some(Duration::ZERO));
        assert_eq!(after.mean_since(&before, "StartContainer"), None);
    }
}
