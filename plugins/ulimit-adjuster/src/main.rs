//! Sample NRI plugin: sets a container's rlimits from its pod's annotations.
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     # every container of the pod
//!     ulimits.noderesource.dev/pod: |
//!       - {type: RLIMIT_NOFILE, soft: 1024, hard: 4096}
//!     # one container, by name (wins over the pod-wide entry of the same type)
//!     ulimits.noderesource.dev/container.web: |
//!       - {type: nofile, soft: 2048, hard: 4096}
//! ```
//!
//! Types are named as in the OCI spec (`RLIMIT_NOFILE`) or without the prefix in any
//! case (`nofile`). An annotation that does not parse, an unknown type or a soft limit
//! above the hard one fails the container's creation with a message naming it.
//!
//! Launched by the runtime as `NN-ulimit-adjuster` from its plugin directory, or run by
//! hand: `petrel-nri-ulimit-adjuster [SOCKET]`.

use std::collections::BTreeMap;
use std::sync::Arc;

use petrel_nri::api;
use petrel_nri::stub::{PluginError, Stub};
use serde::Deserialize;

/// Pod-wide annotation.
const POD_KEY: &str = "ulimits.noderesource.dev/pod";
/// Per-container annotation prefix (the container's name follows).
const CONTAINER_PREFIX: &str = "ulimits.noderesource.dev/container.";

/// The rlimit types the kernel has.
const TYPES: &[&str] = &[
    "RLIMIT_AS",
    "RLIMIT_CORE",
    "RLIMIT_CPU",
    "RLIMIT_DATA",
    "RLIMIT_FSIZE",
    "RLIMIT_LOCKS",
    "RLIMIT_MEMLOCK",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_NOFILE",
    "RLIMIT_NPROC",
    "RLIMIT_RSS",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
    "RLIMIT_SIGPENDING",
    "RLIMIT_STACK",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    #[serde(rename = "type")]
    typ: String,
    soft: u64,
    hard: u64,
}

/// `RLIMIT_NOFILE` for `nofile`, `NOFILE`, `rlimit_nofile`, ...
fn canonical_type(name: &str) -> Option<&'static str> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("RLIMIT_") {
        upper
    } else {
        format!("RLIMIT_{upper}")
    };
    TYPES.iter().copied().find(|t| *t == full)
}

/// Parses one annotation's value into limits by type.
fn parse(key: &str, text: &str) -> Result<BTreeMap<&'static str, (u64, u64)>, PluginError> {
    let list: Vec<Limit> = serde_yaml::from_str(text)
        .map_err(|e| PluginError::new(format!("annotation {key}: {e}")))?;
    let mut out = BTreeMap::new();
    for l in list {
        let typ = canonical_type(&l.typ).ok_or_else(|| {
            PluginError::new(format!("annotation {key}: unknown rlimit type {:?}", l.typ))
        })?;
        if l.soft > l.hard {
            return Err(PluginError::new(format!(
                "annotation {key}: {typ} soft limit {} is above the hard limit {}",
                l.soft, l.hard
            )));
        }
        out.insert(typ, (l.soft, l.hard));
    }
    Ok(out)
}

/// The rlimits for container `name` given its pod's annotations.
fn limits_for(
    annotations: &std::collections::HashMap<String, String>,
    name: &str,
) -> Result<Vec<api::PosixRlimit>, PluginError> {
    let mut all = BTreeMap::new();
    if let Some(text) = annotations.get(POD_KEY) {
        all.extend(parse(POD_KEY, text)?);
    }
    let key = format!("{CONTAINER_PREFIX}{name}");
    if let Some(text) = annotations.get(&key) {
        all.extend(parse(&key, text)?);
    }
    Ok(all
        .into_iter()
        .map(|(typ, (soft, hard))| api::PosixRlimit {
            r#type: typ.to_string(),
            hard,
            soft,
        })
        .collect())
}

struct Adjuster;

impl Adjuster {
    async fn create_container(
        self: Arc<Self>,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        let annotations = req.pod.map(|p| p.annotations).unwrap_or_default();
        let name = req.container.map(|c| c.name).unwrap_or_default();
        let rlimits = limits_for(&annotations, &name)?;
        if rlimits.is_empty() {
            return Ok(api::CreateContainerResponse::default());
        }
        tracing::info!(container = %name, ?rlimits, "adjusting rlimits");
        Ok(api::CreateContainerResponse {
            adjust: Some(api::ContainerAdjustment {
                rlimits,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let mut builder = Stub::builder(Adjuster).on_create_container(Adjuster::create_container);
    if std::env::var_os(api::PLUGIN_NAME_ENV).is_none() {
        builder = builder.name("ulimit-adjuster").index("20");
    }
    if let Some(socket) = std::env::args().nth(1) {
        builder = builder.socket_path(socket);
    }
    builder.build()?.run().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn limits_should_merge_pod_and_container_annotations() {
        let a = HashMap::from([
            (
                POD_KEY.to_string(),
                "- {type: RLIMIT_NOFILE, soft: 1024, hard: 4096}\n- {type: nproc, soft: 10, hard: 20}\n"
                    .to_string(),
            ),
            (
                format!("{CONTAINER_PREFIX}web"),
                "- {type: nofile, soft: 2048, hard: 4096}\n".to_string(),
            ),
        ]);
        let web = limits_for(&a, "web").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(web.len(), 2);
        assert_eq!(web[0].r#type, "RLIMIT_NOFILE");
        assert_eq!((web[0].soft, web[0].hard), (2048, 4096));
        assert_eq!(web[1].r#type, "RLIMIT_NPROC");
        let other = limits_for(&a, "db").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((other[0].soft, other[0].hard), (1024, 4096));
        assert!(limits_for(&HashMap::new(), "x")
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty());
    }

    #[test]
    fn bad_annotations_should_be_refused_with_their_key() {
        for (text, what) in [
            ("- {type: bogus, soft: 1, hard: 1}", "unknown rlimit type"),
            (
                "- {type: nofile, soft: 10, hard: 1}",
                "above the hard limit",
            ),
            ("not: [a list", "ulimits.noderesource.dev/pod"),
        ] {
            let a = HashMap::from([(POD_KEY.to_string(), text.to_string())]);
            let err = limits_for(&a, "x").err().map(|e| e.message().to_string());
            let err = err.unwrap_or_default();
            assert!(err.contains(what), "{text}: {err}");
        }
    }
}
