//! What start-up recovery does with one container, from what it finds: a
//! pure decision table, so that every case is tested without a host.

use crate::parts::{InitSeen, ShimSeen};
use crate::records::ContainerState;

/// What recovery found of one container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Its record's state; `None` when no record names it (found by its id
    /// alone: a bundle, a writable layer, a runc container, a shim).
    pub record: Option<ContainerState>,
    /// Whether its pod sandbox is known.
    pub pod_known: bool,
    /// Its shim.
    pub shim: ShimSeen,
    /// Its init.
    pub init: InitSeen,
    /// Whether runc's exec FIFO is still there.
    pub fifo: bool,
}

/// What recovery does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// A shim is still inside its create: wait for it (bounded) to finish
    /// or to undo it, before anything of the container is touched.
    WaitForShim,
    /// A create no client was ever answered for (no record, or a record in
    /// `Creating`), or a container whose pod is gone: remove everything
    /// (runc container, shim, cgroup, rootfs mount, bundle, writable
    /// layer, record). A CRI client that did not get its answer creates
    /// again with the same name, which is then free.
    Remove,
    /// Nothing to do (exited).
    Keep,
    /// Watch the shim again (a created container waiting for its start, a
    /// running one, or one whose init died and whose shim is recording it).
    Watch,
    /// A StartContainer interrupted after the init took the start: record
    /// it `Running`, with the FIFO removed first when `remove_fifo` (runc
    /// calls a container with a FIFO `created`, and a later start would
    /// wait on it for nothing), then watch the shim.
    MarkRunning {
        /// The exec FIFO is still there.
        remove_fifo: bool,
    },
    /// The shim exited while the runtime was down: read the exit it
    /// recorded (or record an unknown one).
    RecordExit,
}

/// The decision table.
pub(crate) fn decide(seen: &Seen) -> Action {
    let acknowledged = matches!(
        seen.record,
        Some(ContainerState::Created | ContainerState::Running | ContainerState::Exited)
    );
    if !acknowledged || !seen.pod_known {
        return if seen.shim == ShimSeen::InCreate {
            Action::WaitForShim
        } else {
            Action::Remove
        };
    }
    match (seen.record, seen.shim, seen.init) {
        (Some(ContainerState::Exited), ..) => Action::Keep,
        (_, ShimSeen::Gone, _) => Action::RecordExit,
        (Some(ContainerState::Created), _, InitSeen::Started) => Action::MarkRunning {
            remove_fifo: seen.fifo,
        },
        // Running with its FIFO still there: only runc's view is wrong.
        (Some(ContainerState::Running), _, InitSeen::Started) if seen.fifo => {
            Action::MarkRunning { remove_fifo: true }
        }
        _ => Action::Watch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ContainerState::*;

    fn seen(record: Option<ContainerState>, shim: ShimSeen, init: InitSeen, fifo: bool) -> Seen {
        Seen {
            record,
            pod_known: true,
            shim,
            init,
            fifo,
        }
    }

    #[test]
    fn decide_should_remove_every_unacknowledged_create_once_its_shim_is_out_of_it() {
        for record in [None, Some(Creating)] {
            for init in [InitSeen::Gone, InitSeen::AwaitingStart, InitSeen::Started] {
                for fifo in [false, true] {
                    let s = |shim| seen(record, shim, init, fifo);
                    assert_eq!(decide(&s(ShimSeen::InCreate)), Action::WaitForShim);
                    assert_eq!(decide(&s(ShimSeen::Serving)), Action::Remove);
                    assert_eq!(decide(&s(ShimSeen::Gone)), Action::Remove);
                }
            }
        }
    }

    #[test]
    fn decide_should_remove_a_container_whose_pod_is_gone() {
        let mut s = seen(Some(Running), ShimSeen::Serving, InitSeen::Started, false);
        s.pod_known = false;
        assert_eq!(decide(&s), Action::Remove);
        s.shim = ShimSeen::InCreate;
        assert_eq!(decide(&s), Action::WaitForShim);
    }

    #[test]
    fn decide_should_reconcile_created_records_with_the_init_and_the_fifo() {
        let table = [
            // (shim, init, fifo) -> action
            (
                ShimSeen::Serving,
                InitSeen::AwaitingStart,
                true,
                Action::Watch,
            ),
            (
                ShimSeen::Serving,
                InitSeen::Started,
                true,
                Action::MarkRunning { remove_fifo: true },
            ),
            (
                ShimSeen::Serving,
                InitSeen::Started,
                false,
                Action::MarkRunning { remove_fifo: false },
            ),
            (ShimSeen::Serving, InitSeen::Gone, true, Action::Watch),
            (ShimSeen::Serving, InitSeen::Gone, false, Action::Watch),
            (ShimSeen::Gone, InitSeen::Started, false, Action::RecordExit),
            (
                ShimSeen::Gone,
                InitSeen::AwaitingStart,
                true,
                Action::RecordExit,
            ),
            (ShimSeen::Gone, InitSeen::Gone, true, Action::RecordExit),
        ];
        for (shim, init, fifo, want) in table {
            assert_eq!(
                decide(&seen(Some(Created), shim, init, fifo)),
                want,
                "{shim:?} {init:?} fifo={fifo}"
            );
        }
    }

    #[test]
    fn decide_should_watch_running_and_keep_exited_containers() {
        assert_eq!(
            decide(&seen(
                Some(Running),
                ShimSeen::Serving,
                InitSeen::Started,
                false
            )),
            Action::Watch
        );
        assert_eq!(
            decide(&seen(
                Some(Running),
                ShimSeen::Serving,
                InitSeen::Started,
                true
            )),
            Action::MarkRunning { remove_fifo: true }
        );
        assert_eq!(
            decide(&seen(Some(Running), ShimSeen::Gone, InitSeen::Gone, false)),
            Action::RecordExit
        );
        for shim in [ShimSeen::Gone, ShimSeen::Serving] {
            assert_eq!(
                decide(&seen(Some(Exited), shim, InitSeen::Gone, false)),
                Action::Keep
            );
        }
    }
}
