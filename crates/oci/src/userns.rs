//! A pod's user namespace as the CRI asks for it
//! (`LinuxSandboxSecurityContext.namespace_options.userns_options`), checked.
//!
//! `NODE` (or nothing) is the host's user namespace. `POD` gives the pod a
//! user namespace of its own with the uid and gid mappings given, which
//! every container of the pod joins. `CONTAINER` and `TARGET` are refused,
//! as kubelet never sends them. A `POD` mapping must be one range each for
//! uids and gids (what kubelet sends, and what critest holds runtimes to)
//! that maps the container's root: files of the image owned by root are
//! shown through idmapped mounts as owned by the host id of container root.

use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder};
use petrel_cri::api;
use serde::{Deserialize, Serialize};

use crate::spec::{invalid, SpecError};

/// One range of ids: `size` ids from `container_id` inside are `host_id`
/// and on outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    /// The first id inside the namespace.
    pub container_id: u32,
    /// The id it is on the host.
    pub host_id: u32,
    /// How many ids.
    pub size: u32,
}

impl IdRange {
    /// The line of `/proc/<pid>/uid_map` (and `gid_map`) it is.
    pub fn map_line(&self) -> String {
        format!("{} {} {}\n", self.container_id, self.host_id, self.size)
    }

    /// The OCI form.
    pub fn oci(&self) -> LinuxIdMapping {
        // The builder cannot fail: every field has a value.
        LinuxIdMappingBuilder::default()
            .container_id(self.container_id)
            .host_id(self.host_id)
            .size(self.size)
            .build()
            .unwrap_or_default()
    }
}

/// The mappings of a pod's own user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMappings {
    /// The uid range.
    pub uids: IdRange,
    /// The gid range.
    pub gids: IdRange,
}

impl UserMappings {
    /// The host uid and gid of the container's root.
    pub fn host_root(&self) -> (u32, u32) {
        (self.uids.host_id, self.gids.host_id)
    }
}

/// The user namespace `opts` asks for: `None` for the host's (`NODE` or no
/// options), the mappings for `POD`; refused, naming the field under
/// `field` (e.g. `linux.security_context.namespace_options.userns_options`),
/// for any other mode or mappings other than one range each that maps
/// container id 0.
pub fn requested(
    opts: Option<&api::UserNamespace>,
    field: &str,
) -> Result<Option<UserMappings>, SpecError> {
    let Some(o) = opts else { return Ok(None) };
    let mode = api::NamespaceMode::try_from(o.mode)
        .map_err(|_| invalid(format!("{field}.mode"), format!("unknown mode {}", o.mode)))?;
    match mode {
        api::NamespaceMode::Node => {
            if !o.uids.is_empty() || !o.gids.is_empty() {
                return Err(invalid(
                    format!("{field}.uids"),
                    "mappings are only for mode POD (NODE is the host's user namespace)",
                ));
            }
            Ok(None)
        }
        api::NamespaceMode::Pod => Ok(Some(UserMappings {
            uids: one_range(&o.uids, &format!("{field}.uids"))?,
            gids: one_range(&o.gids, &format!("{field}.gids"))?,
        })),
        api::NamespaceMode::Container | api::NamespaceMode::Target => Err(invalid(
            format!("{field}.mode"),
            format!(
                "{} is not supported for user namespaces (POD or NODE)",
                mode.as_str_name()
            ),
        )),
    }
}

fn one_range(maps: &[api::IdMapping], field: &str) -> Result<IdRange, SpecError> {
    let [m] = maps else {
        return Err(invalid(
            field,
            format!("exactly one mapping is supported, got {}", maps.len()),
        ));
    };
    if m.length == 0 {
        return Err(invalid(format!("{field}[0].length"), "must not be 0"));
    }
    if m.container_id != 0 {
        return Err(invalid(
            format!("{field}[0].container_id"),
            format!(
                "the mapping must start at container id 0 (the container's root), not {}",
                m.container_id
            ),
        ));
    }
    let end_overflows = |start: u32| start.checked_add(m.length - 1).is_none();
    if end_overflows(m.host_id) || end_overflows(m.container_id) {
        return Err(invalid(
            format!("{field}[0].length"),
            format!("{} ids from {} go past 2^32", m.length, m.host_id),
        ));
    }
    if m.host_id == 0 {
        return Err(invalid(
            format!("{field}[0].host_id"),
            "must not map the host's root (0)",
        ));
    }
    Ok(IdRange {
        container_id: m.container_id,
        host_id: m.host_id,
        size: m.length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELD: &str = "linux.security_context.namespace_options.userns_options";

    fn map(container_id: u32, host_id: u32, length: u32) -> api::IdMapping {
        api::IdMapping {
            container_id,
            host_id,
            length,
        }
    }

    fn pod(uids: Vec<api::IdMapping>, gids: Vec<api::IdMapping>) -> api::UserNamespace {
        api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids,
            gids,
        }
    }

    fn refused(o: &api::UserNamespace) -> (String, String) {
        match requested(Some(o), FIELD) {
            Err(SpecError::Invalid { field, reason }) => (field, reason),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn requested_should_read_one_pod_range_each_for_uids_and_gids() {
        let o = pod(vec![map(0, 1000, 100_000)], vec![map(0, 2000, 65536)]);
        let m = requested(Some(&o), FIELD)
            .expect("valid")
            .expect("a userns");
        assert_eq!(
            m.uids,
            IdRange {
                container_id: 0,
                host_id: 1000,
                size: 100_000
            }
        );
        assert_eq!(m.host_root(), (1000, 2000));
        assert_eq!(m.uids.map_line(), "0 1000 100000\n");
    }

    #[test]
    fn requested_should_be_the_host_namespace_for_node_mode_or_no_options() {
        assert_eq!(requested(None, FIELD).expect("valid"), None);
        let node = api::UserNamespace {
            mode: api::NamespaceMode::Node as i32,
            ..Default::default()
        };
        assert_eq!(requested(Some(&node), FIELD).expect("valid"), None);
        let node_with_maps = api::UserNamespace {
            mode: api::NamespaceMode::Node as i32,
            uids: vec![map(0, 1000, 10)],
            ..Default::default()
        };
        assert_eq!(refused(&node_with_maps).0, format!("{FIELD}.uids"));
    }

    #[test]
    fn requested_should_refuse_container_and_target_modes_naming_the_mode() {
        for mode in [api::NamespaceMode::Container, api::NamespaceMode::Target] {
            let o = api::UserNamespace {
                mode: mode as i32,
                ..Default::default()
            };
            let (field, reason) = refused(&o);
            assert_eq!(field, format!("{FIELD}.mode"));
            assert!(reason.contains(mode.as_str_name()), "{reason}");
        }
        let unknown = api::UserNamespace {
            mode: 42,
            ..Default::default()
        };
        assert!(refused(&unknown).1.contains("42"));
    }

    #[test]
    fn requested_should_refuse_other_than_exactly_one_mapping() {
        let two = vec![map(0, 1000, 100_000), map(0, 2000, 100_000)];
        let (field, reason) = refused(&pod(two, vec![map(0, 1000, 100_000)]));
        assert_eq!(field, format!("{FIELD}.uids"));
        assert!(reason.contains("exactly one"), "{reason}");
        let (field, _) = refused(&pod(vec![map(0, 1000, 100_000)], Vec::new()));
        assert_eq!(field, format!("{FIELD}.gids"));
    }

    #[test]
    fn requested_should_refuse_a_mapping_without_container_root() {
        let o = pod(vec![map(1, 1000, 100_000)], vec![map(1, 1000, 100_000)]);
        let (field, reason) = refused(&o);
        assert_eq!(field, format!("{FIELD}.uids[0].container_id"));
        assert!(reason.contains("container id 0"), "{reason}");
    }

    #[test]
    fn requested_should_refuse_empty_overflowing_or_host_root_ranges() {
        let ok = vec![map(0, 1000, 10)];
        let (field, _) = refused(&pod(vec![map(0, 1000, 0)], ok.clone()));
        assert_eq!(field, format!("{FIELD}.uids[0].length"));
        let (field, _) = refused(&pod(ok.clone(), vec![map(0, u32::MAX, 2)]));
        assert_eq!(field, format!("{FIELD}.gids[0].length"));
        let (field, _) = refused(&pod(vec![map(0, 0, 65536)], ok));
        assert_eq!(field, format!("{FIELD}.uids[0].host_id"));
    }
}
