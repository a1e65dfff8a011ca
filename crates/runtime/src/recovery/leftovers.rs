//! Containers a crash left half-made, found from their ids alone, and
//! removed once no shim is inside their create any more.
//!
//! A CreateContainer killed midway can leave, named by the container's id
//! only: a writable layer (`<root>/containers/<id>`), a bundle with its
//! rootfs mount (`<state>/containers/<id>`), a shim (whose command line
//! names the bundle), a runc container and its cgroups (`<pod
//! cgroup>/<id>`, named in the bundle's `config.json` and runc's state).
//! Its intent record may be there or not (it is written without an fsync).
//! A shim still inside `runc create` finishes it (and, finding its runtime
//! gone when it answers, undoes it and exits): recovery waits for that,
//! bounded, before touching anything, or a runc container would appear
//! after the sweep, without a bundle.
//!
//! A StartContainer killed before it committed `Running` leaves, beside a
//! container recorded `Created` without a shim, its shim and runc
//! container: they are stopped alike (the files stay, the container stays
//! created, and the client's retry starts it).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use petrel_store::Table;

use crate::parts::{FoundShim, ShimSeen};
use crate::records::ContainerRecord;
use crate::service::Runtime;

/// How long recovery waits for shims still inside their create; past it
/// they (and what they started) are killed. runc create takes ~40 ms here,
/// seconds under heavy load.
const CREATE_WAIT: Duration = Duration::from_secs(10);
/// How long a shim may take to exit once its container is deleted (it
/// drains output for up to a second after the init's exit).
const EXIT_WAIT: Duration = Duration::from_secs(5);
/// How often shims inside their create are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(10);
/// How many leftovers are removed at once (each starts runc).
const REMOVALS_AT_ONCE: usize = 8;

/// A half-made container: its record, if one survived.
pub(crate) type Leftovers = HashMap<String, Option<ContainerRecord>>;

/// The container cgroup a bundle's `config.json` names, if it is the
/// container's own: a path whose last component is the id, or runc's
/// systemd form `<slice>:petrel:<id>` (its scope's path).
fn cgroup_from_config(bundle: &Path, id: &str) -> Option<String> {
    let text = std::fs::read(bundle.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    let path = v.get("linux")?.get("cgroupsPath")?.as_str()?;
    if path.starts_with('/') {
        return (path.rsplit('/').next() == Some(id)).then(|| path.to_string());
    }
    let own = path.rsplit(':').next() == Some(id)
        && path.split(':').nth(1) == Some(petrel_oci::cgroups::systemd::SCOPE_PREFIX);
    own.then(|| petrel_oci::cgroups::systemd::cgroup_of_spec_path(path))
        .flatten()
}

impl Runtime {
    /// Removes every half-made container, and undoes the interrupted
    /// starts of the `not_started` containers (created, recorded without a
    /// shim) that left a shim or a runc container (`in_runc`): waits
    /// (bounded) for shims still inside their create, then removes each
    /// leftover completely and stops each interrupted start's process.
    pub(crate) async fn remove_leftovers(
        self: &Arc<Self>,
        mut leftovers: Leftovers,
        not_started: Vec<String>,
        in_runc: &HashSet<String>,
    ) {
        let containers = self.layout.state.join("containers");
        let shims = self.shims.find(&containers);
        // A shim of a bundle no record names is a leftover too.
        for id in shims.keys() {
            if self.state.container(id).is_none() {
                leftovers.entry(id.clone()).or_insert(None);
            }
        }
        let starts: Vec<String> = not_started
            .into_iter()
            .filter(|id| shims.contains_key(id) || in_runc.contains(id))
            .collect();
        if leftovers.is_empty() && starts.is_empty() {
            return;
        }
        let mut pinned: HashMap<String, Box<dyn FoundShim>> = leftovers
            .keys()
            .chain(starts.iter())
            .filter_map(|id| {
                let pid = *shims.get(id)?;
                Some((id.clone(), self.shims.pin(id, pid, &containers)?))
            })
            .collect();
        self.wait_out_of_create(&pinned).await;
        for id in starts {
            tracing::warn!(container.id = %id, "undoing a StartContainer interrupted by a crash; the container stays created");
            let shim = pinned.remove(&id);
            self.stop_leftover_process(&id, shim).await;
            let exit = self.layout.bundle(&id).join(petrel_shim::EXIT_FILE);
            if let Err(e) = std::fs::remove_file(&exit) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(container.id = %id, error = %e, "exit record of an interrupted start not removed");
                }
            }
        }
        if leftovers.is_empty() {
            return;
        }
        tracing::warn!(
            count = leftovers.len(),
            shims = pinned.len(),
            "removing containers left half-made by a crash"
        );
        let removals = leftovers.into_iter().map(|(id, rec)| {
            let shim = pinned.remove(&id);
            let rt = self.clone();
            async move { rt.remove_leftover(&id, rec.as_ref(), shim).await }
        });
        futures_util::stream::iter(removals)
            .for_each_concurrent(REMOVALS_AT_ONCE, |f| f)
            .await;
    }

    /// Waits until no shim is inside its create, at most [`CREATE_WAIT`];
    /// past it, kills those that still are (with what they started).
    async fn wait_out_of_create(&self, shims: &HashMap<String, Box<dyn FoundShim>>) {
        let t0 = Instant::now();
        let mut first = None;
        loop {
            let in_create: Vec<(&String, &Box<dyn FoundShim>)> = shims
                .iter()
                .filter(|(_, s)| s.seen() == ShimSeen::InCreate)
                .collect();
            let first = *first.get_or_insert(in_create.len());
            if in_create.is_empty() {
                if first > 0 {
                    tracing::info!(
                        shims = first,
                        waited_ms = t0.elapsed().as_millis() as u64,
                        "waited for shims inside their create"
                    );
                }
                return;
            }
            if t0.elapsed() >= CREATE_WAIT {
                for (id, s) in in_create {
                    tracing::error!(container.id = %id, shim.pid = s.pid(), "shim still inside its create after {CREATE_WAIT:?}: killed");
                    s.kill_tree();
                }
                return;
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Stops what runc and a shim hold of a container a crash interrupted:
    /// runc's container deleted (which kills its init, so its shim exits),
    /// the shim waited for (bounded), then killed.
    async fn stop_leftover_process(&self, id: &str, shim: Option<Box<dyn FoundShim>>) {
        if let Err(e) = self.oci.delete(id, true).await {
            tracing::error!(container.id = %id, error = %e, "runc container of an interrupted create not removed");
        }
        if let Some(shim) = shim {
            if !shim.exited_within(EXIT_WAIT).await {
                tracing::warn!(container.id = %id, shim.pid = shim.pid(), "shim of an interrupted create did not exit: killed");
                shim.kill_tree();
                if !shim.exited_within(EXIT_WAIT).await {
                    tracing::error!(container.id = %id, shim.pid = shim.pid(), "killed shim of an interrupted create still there");
                }
                // What the kill may have cut short.
                if let Err(e) = self.oci.delete(id, true).await {
                    tracing::error!(container.id = %id, error = %e, "runc container of an interrupted create not removed");
                }
            }
        }
    }

    /// Removes one half-made container completely: its process
    /// ([`Runtime::stop_leftover_process`]), its cgroup, rootfs mount,
    /// bundle, writable layer and record.
    async fn remove_leftover(
        &self,
        id: &str,
        rec: Option<&ContainerRecord>,
        shim: Option<Box<dyn FoundShim>>,
    ) {
        self.stop_leftover_process(id, shim).await;
        let bundle = self.layout.bundle(id);
        let cgroup = rec
            .map(|r| r.cgroup_path.clone())
            .or_else(|| cgroup_from_config(&bundle, id));
        if let Some(cg) = cgroup {
            if let Err(e) = self.cgroups.remove(&cg) {
                tracing::warn!(container.id = %id, cgroup = %cg, error = %e, "cgroup of an interrupted create not removed");
            }
        }
        let layer = self.layout.container_layer(id);
        let mounter = self.rootfs.clone();
        let files = tokio::task::spawn_blocking(move || {
            crate::container::teardown::remove_container_files(mounter.as_ref(), &bundle, &layer)
        })
        .await;
        match files {
            Ok(errors) => {
                for e in errors {
                    tracing::error!(container.id = %id, error = %e, "files of an interrupted create not removed")
                }
            }
            Err(e) => {
                tracing::error!(container.id = %id, error = %e, "files of an interrupted create not removed")
            }
        }
        if rec.is_some() {
            if let Err(e) = self.store.delete(Table::Containers, id) {
                tracing::error!(container.id = %id, error = %e, "record of an interrupted create not deleted");
            }
        }
        tracing::info!(container.id = %id, "interrupted create removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn cgroup_from_config_should_take_only_the_containers_own_cgroup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |path: &str| {
            std::fs::write(
                dir.path().join("config.json"),
                format!(r#"{{"linux":{{"cgroupsPath":"{path}"}}}}"#),
            )
            .expect("write")
        };
        write(&format!("/pods/p1/{ID}"));
        assert_eq!(
            cgroup_from_config(dir.path(), ID),
            Some(format!("/pods/p1/{ID}"))
        );
        write("/pods/p1");
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
        // The systemd driver's form names the scope.
        write(&format!("kubepods-pod1.slice:petrel:{ID}"));
        assert_eq!(
            cgroup_from_config(dir.path(), ID),
            Some(format!(
                "/kubepods.slice/kubepods-pod1.slice/petrel-{ID}.scope"
            ))
        );
        write(&format!("kubepods-pod1.slice:other:{ID}"));
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
        write("kubepods-pod1.slice:petrel:other");
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
        std::fs::remove_file(dir.path().join("config.json")).expect("rm");
        assert_eq!(cgroup_from_config(dir.path(), ID), None);
    }
}
