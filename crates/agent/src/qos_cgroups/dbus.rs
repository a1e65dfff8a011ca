//! [`SystemdBus`] over the system bus with zbus: the Manager's methods
//! called on `org.freedesktop.systemd1`, each queued job awaited through
//! its `JobRemoved` signal (subscribed before the call, so none is
//! missed), as runc's systemd driver does.
//!
//! The QoS manager's calls are synchronous (short, under its lock), so
//! the connection lives on a thread of its own with its own small tokio
//! runtime: a call sends its request there and waits for the answer. The
//! thread ends when the [`ZbusSystemd`] is dropped.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use zbus::zvariant::{OwnedObjectPath, Value};

use super::systemd::{Prop, PropValue, SystemdBus, SystemdError};

/// The system bus when `DBUS_SYSTEM_BUS_ADDRESS` does not say otherwise.
pub const SYSTEM_BUS: &str = "unix:path=/run/dbus/system_bus_socket";
/// How long a unit's job may take (runc waits as long).
const JOB_TIMEOUT: Duration = Duration::from_secs(30);

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

enum Op {
    Start(String, Vec<Prop>),
    Set(String, Vec<Prop>),
    Stop(String),
}

struct Request {
    op: Op,
    reply: std_mpsc::Sender<Result<(), SystemdError>>,
}

/// systemd's Manager on the system bus.
pub struct ZbusSystemd {
    address: String,
    tx: mpsc::UnboundedSender<Request>,
}

impl ZbusSystemd {
    /// Connects to the bus at `address` (None: `DBUS_SYSTEM_BUS_ADDRESS`,
    /// else `/run/dbus/system_bus_socket`) and subscribes to systemd's signals. An error
    /// when the bus cannot be reached or systemd does not answer.
    pub fn connect(address: Option<&str>) -> Result<Self, SystemdError> {
        let address = address
            .map(str::to_string)
            .or_else(|| std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok())
            .unwrap_or_else(|| SYSTEM_BUS.to_string());
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let addr = address.clone();
        let spawned = std::thread::Builder::new()
            .name("systemd-dbus".into())
            .spawn(move || serve(addr, rx, ready_tx));
        let connect_err = |message: String| SystemdError::Connect {
            address: address.clone(),
            message,
        };
        spawned.map_err(|e| connect_err(e.to_string()))?;
        match ready_rx.recv_timeout(JOB_TIMEOUT) {
            Ok(Ok(())) => Ok(Self { address, tx }),
            Ok(Err(message)) => Err(connect_err(message)),
            Err(_) => Err(connect_err("no answer".to_string())),
        }
    }

    /// The bus address in use.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn ask(&self, method: &'static str, unit: &str, op: Op) -> Result<(), SystemdError> {
        let (reply, answer) = std_mpsc::channel();
        let gone = || SystemdError::Call {
            method,
            unit: unit.to_string(),
            message: "the D-Bus connection's thread has ended".to_string(),
        };
        self.tx.send(Request { op, reply }).map_err(|_| gone())?;
        // The thread answers every request within the job timeout.
        answer
            .recv_timeout(JOB_TIMEOUT + Duration::from_secs(5))
            .map_err(|_| gone())?
    }
}

impl SystemdBus for ZbusSystemd {
    fn start_unit(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError> {
        self.ask(
            "StartTransientUnit",
            unit,
            Op::Start(unit.to_string(), props),
        )
    }

    fn set_properties(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError> {
        self.ask("SetUnitProperties", unit, Op::Set(unit.to_string(), props))
    }

    fn stop_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.ask("StopUnit", unit, Op::Stop(unit.to_string()))
    }
}

/// The connection's thread: connects, says whether it could, then serves
/// requests one at a time until every sender is gone.
fn serve(
    address: String,
    mut rx: mpsc::UnboundedReceiver<Request>,
    ready: std_mpsc::Sender<Result<(), String>>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("runtime for the bus: {e}")));
            return;
        }
    };
    rt.block_on(async move {
        let proxy = match manager(&address).await {
            Ok(p) => p,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        while let Some(req) = rx.recv().await {
            let result = match req.op {
                Op::Start(unit, props) => {
                    let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
                    let args = (unit.as_str(), "replace", values(&props), aux);
                    job(&proxy, "StartTransientUnit", &unit, &args).await
                }
                Op::Set(unit, props) => proxy
                    .call_method("SetUnitProperties", &(unit.as_str(), true, values(&props)))
                    .await
                    .map(|_| ())
                    .map_err(|e| call_error("SetUnitProperties", &unit, &e)),
                Op::Stop(unit) => {
                    let r = job(&proxy, "StopUnit", &unit, &(unit.as_str(), "replace")).await;
                    // A failed unit stays loaded until reset; it would
                    // refuse the name the next time.
                    let _ = proxy
                        .call_method("ResetFailedUnit", &(unit.as_str(),))
                        .await;
                    r
                }
            };
            let _ = req.reply.send(result);
        }
    });
}

/// A proxy of systemd's Manager, subscribed to its signals.
async fn manager(address: &str) -> zbus::Result<zbus::Proxy<'static>> {
    let conn = zbus::connection::Builder::address(address)?
        .method_timeout(JOB_TIMEOUT)
        .build()
        .await?;
    let proxy = zbus::Proxy::new(&conn, DEST, PATH, MANAGER).await?;
    // systemd sends job signals only to subscribed clients.
    proxy.call_method("Subscribe", &()).await?;
    Ok(proxy)
}

fn values(props: &[Prop]) -> Vec<(&str, Value<'_>)> {
    props
        .iter()
        .map(|(name, v)| {
            let value = match v {
                PropValue::Bool(b) => Value::from(*b),
                PropValue::U64(n) => Value::from(*n),
                PropValue::Str(s) => Value::from(s.as_str()),
                PropValue::StrList(l) => {
                    Value::from(l.iter().map(String::as_str).collect::<Vec<&str>>())
                }
            };
            (*name, value)
        })
        .collect()
}

/// The D-Bus error names that mean there is nothing to do.
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        _ => None,
    }
}

fn call_error(method: &'static str, unit: &str, e: &zbus::Error) -> SystemdError {
    let message = match e {
        zbus::Error::MethodError(name, Some(text), _) => format!("{name}: {text}"),
        other => other.to_string(),
    };
    SystemdError::Call {
        method,
        unit: unit.to_string(),
        message,
    }
}

/// Calls `method`, which queues a job for `unit`, and waits for the job's
/// end: `done` is success. An existing unit (start) or an unknown one
/// (stop) is success with no job.
async fn job<B>(
    proxy: &zbus::Proxy<'static>,
    method: &'static str,
    unit: &str,
    args: &B,
) -> Result<(), SystemdError>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    let mut removed = proxy
        .receive_signal("JobRemoved")
        .await
        .map_err(|e| call_error(method, unit, &e))?;
    let reply = match proxy.call_method(method, args).await {
        Ok(m) => m,
        Err(e) => {
            let name = error_name(&e);
            let nothing_to_do = match method {
                "StartTransientUnit" => name.as_deref() == Some(UNIT_EXISTS),
                "StopUnit" => name.as_deref() == Some(NO_SUCH_UNIT),
                _ => false,
            };
            return if nothing_to_do {
                Ok(())
            } else {
                Err(call_error(method, unit, &e))
            };
        }
    };
    let path: OwnedObjectPath = reply
        .body()
        .deserialize()
        .map_err(|e| call_error(method, unit, &e))?;
    let wait = async {
        while let Some(signal) = removed.next().await {
            let body = signal.body();
            let Ok((_, job, _, result)) =
                body.deserialize::<(u32, OwnedObjectPath, String, String)>()
            else {
                continue;
            };
            if job == path {
                return Some(result);
            }
        }
        None
    };
    match tokio::time::timeout(JOB_TIMEOUT, wait).await {
        Ok(Some(result)) if result == "done" => Ok(()),
        Ok(Some(result)) => Err(SystemdError::Job {
            method,
            unit: unit.to_string(),
            result,
        }),
        Ok(None) => Err(SystemdError::Call {
            method,
            unit: unit.to_string(),
            message: "the bus closed before the job ended".to_string(),
        }),
        Err(_) => Err(SystemdError::Timeout {
            method,
            unit: unit.to_string(),
            secs: JOB_TIMEOUT.as_secs(),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_that_is_not_there_should_be_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let address = format!("unix:path={}/no-bus", dir.path().display());
        let err = ZbusSystemd::connect(Some(&address))
            .err()
            .expect("no bus there");
        let text = err.to_string();
        assert!(text.contains(&address), "{text}");
    }

    /// For real: systemd makes, sets and stops the QoS and pod slices the
    /// manager asks for, and the values land in the slices' files.
    #[test]
    #[ignore = "needs systemd as PID 1 on cgroup v2: runs in the systemd guest (e2e_cgroup_v2)"]
    fn slices_should_be_made_set_and_stopped_through_systemd() {
        use crate::qos_cgroups::{CgroupDriver, CgroupLayout, QosCgroups, SystemdCgroups};
        use petrel_oci::cgroups::{CgroupVersion, Cgroups};
        use std::sync::Arc;
        let init = std::fs::read_to_string("/proc/1/comm").unwrap();
        assert_eq!(init.trim(), "systemd", "needs systemd as PID 1");
        let cg = Cgroups::detect().unwrap();
        assert_eq!(cg.version(), CgroupVersion::V2, "needs cgroup v2");
        let bus = Arc::new(ZbusSystemd::connect(None).unwrap());

        // The test's own root slice, stopped (with all under it) at the end.
        let stem = format!("petrel_unit_{}", std::process::id());
        struct Stop(Arc<ZbusSystemd>, String);
        impl Drop for Stop {
            fn drop(&mut self) {
                let _ = self.0.stop_unit(&self.1);
            }
        }
        let _stop = Stop(bus.clone(), format!("{stem}.slice"));
        let layout = CgroupLayout::new(CgroupDriver::Systemd, &format!("/{stem}")).unwrap();
        let host = Arc::new(SystemdCgroups::new(bus.clone(), cg.clone()));
        let qos = QosCgroups::new(host, layout.clone(), 64, None);
        let read = |path: &str, file: &str| cg.read("cpu", path, file).unwrap().trim().to_string();

        qos.start(2000).unwrap();
        let kubepods = format!("/{stem}.slice/{stem}-kubepods.slice");
        assert_eq!(layout.pods_cgroup(), kubepods);
        assert_eq!(read(&kubepods, "cpu.weight"), "79");
        let besteffort = format!("{kubepods}/{stem}-kubepods-besteffort.slice");
        assert_eq!(read(&besteffort, "cpu.weight"), "1");

        let mut pod = crate::convert::test_support::desired(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: g, namespace: default}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n",
        );
        pod.uid = "a-b".into();
        qos.ensure_pod(&pod).unwrap();
        let slice = format!("{kubepods}/{stem}-kubepods-poda_b.slice");
        assert_eq!(read(&slice, "memory.max"), (64u64 << 20).to_string());
        assert_eq!(read(&slice, "cpu.max"), "50000 100000");
        assert_eq!(read(&slice, "pids.max"), "64");
        assert_eq!(read(&slice, "cpu.weight"), "20");

        // A child cgroup (as the runtime's scope): the slice is kept.
        let child = cg.dir("cpu", &slice).unwrap().join("busy");
        std::fs::create_dir(&child).unwrap();
        qos.forget_pod("a-b");
        assert!(
            cg.dir("cpu", &slice).unwrap().is_dir(),
            "a busy slice stays"
        );
        std::fs::remove_dir(&child).unwrap();
        qos.resync();
        assert!(
            !cg.dir("cpu", &slice).unwrap().exists(),
            "stopped when empty"
        );
        assert!(qos.owned().is_empty());

        // systemd's refusal names the unit and carries the D-Bus error.
        let err = bus
            .start_unit("petrel bad name.slice", Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("petrel bad name.slice"), "{err}");
        assert!(err.contains("org.freedesktop"), "{err}");
    }

    #[test]
    fn properties_should_become_dbus_values_of_systemds_types() {
        let props = vec![
            ("CPUWeight", PropValue::U64(39)),
            ("Delegate", PropValue::Bool(true)),
            ("Description", PropValue::Str("d".into())),
            ("Wants", PropValue::StrList(vec!["a.slice".into()])),
        ];
        let sigs: Vec<String> = values(&props)
            .iter()
            .map(|(_, v)| v.value_signature().to_string())
            .collect();
        assert_eq!(sigs, ["t", "b", "s", "as"]);
    }
}
