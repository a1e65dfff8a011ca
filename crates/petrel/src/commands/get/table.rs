//! kubectl's pod table: the STATUS, READY, RESTARTS and AGE columns computed
//! the way kubectl computes them, so a user reads them the same way.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

/// Which columns to print.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Columns {
    /// NAMESPACE first (`-A`).
    pub namespace: bool,
    /// IP and NODE last (`-o wide`).
    pub wide: bool,
}

impl Columns {
    /// The header cells.
    pub fn header(&self) -> Vec<String> {
        let mut h = Vec::new();
        if self.namespace {
            h.push("NAMESPACE");
        }
        h.extend(["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
        if self.wide {
            h.extend(["IP", "NODE"]);
        }
        h.into_iter().map(str::to_string).collect()
    }

    /// The position of AGE among the cells.
    pub fn age_index(&self) -> Option<usize> {
        self.header().iter().position(|h| h == "AGE")
    }

    /// One pod's cells, as of `now`.
    pub fn row(&self, pod: &Pod, now: Timestamp) -> Vec<String> {
        let s = summarize(pod, now);
        let mut r = Vec::new();
        if self.namespace {
            r.push(pod.metadata.namespace.clone().unwrap_or_default());
        }
        r.push(pod.metadata.name.clone().unwrap_or_default());
        r.push(format!("{}/{}", s.ready, s.total));
        r.push(s.status);
        r.push(s.restarts);
        r.push(age(pod, now));
        if self.wide {
            let status = pod.status.as_ref();
            r.push(non_empty(status.and_then(|s| s.pod_ip.clone())));
            r.push(non_empty(
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ));
        }
        r
    }
}

fn non_empty(s: Option<String>) -> String {
    s.filter(|s| !s.is_empty())
        .unwrap_or_else(|| "<none>".into())
}

/// Left-aligned columns separated by three spaces, like kubectl's
/// tabwriter; `widths` grows to fit and is kept so watch lines line up.
pub fn render(rows: &[Vec<String>], widths: &mut Vec<usize>) -> String {
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// READY, STATUS and RESTARTS of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Ready containers.
    pub ready: usize,
    /// Containers (app containers and sidecars).
    pub total: usize,
    /// The STATUS column.
    pub status: String,
    /// The RESTARTS column: `3`, or `3 (20s ago)`.
    pub restarts: String,
}

/// kubectl's reading of a pod: the phase, overridden by the pod's reason,
/// then by the first init container not done, else by the app containers'
/// waiting or terminated reasons; Terminating when being deleted.
pub fn summarize(pod: &Pod, now: Timestamp) -> Summary {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let init_specs = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    // Init containers with restartPolicy Always are sidecars: they run
    // alongside the app and count in READY.
    let is_sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"))
    };
    let mut total = spec.map_or(0, |s| s.containers.len())
        + init_specs
            .iter()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .count();
    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart: Option<Timestamp> = None;
    let mut note_restart = |c: &ContainerStatus, restarts: &mut i64| {
        *restarts += i64::from(c.restart_count);
        let finished = c
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(|t| t.0);
        if let Some(f) = finished {
            last_restart = Some(last_restart.map_or(f, |l| l.max(f)));
        }
    };

    let mut reason = status
        .and_then(|s| s.phase.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "Pending".into());
    if let Some(r) = status
        .and_then(|s| s.reason.clone())
        .filter(|r| !r.is_empty())
    {
        reason = r;
    }

    let init_statuses = status
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    let mut initializing = false;
    for (i, c) in init_statuses.iter().enumerate() {
        note_restart(c, &mut restarts);
        let state = c.state.as_ref();
        let terminated = state.and_then(|s| s.terminated.as_ref());
        let waiting = state.and_then(|s| s.waiting.as_ref());
        if is_sidecar(&c.name) {
            sidecar_restarts += i64::from(c.restart_count);
            if c.ready {
                ready += 1;
            }
            if c.started == Some(true) {
                continue;
            }
        }
        if terminated.is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        initializing = true;
        reason = if let Some(t) = terminated {
            match t.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => match t.signal.filter(|s| *s != 0) {
                    Some(sig) => format!("Init:Signal:{sig}"),
                    None => format!("Init:ExitCode:{}", t.exit_code),
                },
            }
        } else if let Some(r) = waiting
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        break;
    }

    if !initializing {
        // Once initialized, only sidecars' restarts stay in the count.
        restarts = sidecar_restarts;
        let mut has_running = false;
        let statuses = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        // The first container's reason wins, as in kubectl.
        for c in statuses.iter().rev() {
            note_restart(c, &mut restarts);
            let state = c.state.as_ref();
            let waiting_reason = state
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty());
            let terminated = state.and_then(|s| s.terminated.as_ref());
            if let Some(r) = waiting_reason {
                reason = r;
            } else if let Some(t) = terminated {
                reason = match t.reason.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None => match t.signal.filter(|s| *s != 0) {
                        Some(sig) => format!("Signal:{sig}"),
                        None => format!("ExitCode:{}", t.exit_code),
                    },
                };
            } else if c.ready && state.is_some_and(|s| s.running.is_some()) {
                has_running = true;
                ready += 1;
            }
        }
        // A finished container beside running ones does not make the pod
        // look finished.
        if reason == "Completed" && has_running {
            reason = if has_condition(pod, "Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }

    if pod.metadata.deletion_timestamp.is_some() {
        reason = if status.and_then(|s| s.reason.as_deref()) == Some("NodeLost") {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    total = total.max(ready);
    let restarts = match last_restart {
        Some(t) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            human_duration(now.duration_since(t).as_secs())
        ),
        _ => restarts.to_string(),
    };
    Summary {
        ready,
        total,
        status: reason,
        restarts,
    }
}

fn has_condition(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// AGE: since metadata.creationTimestamp (else status.startTime).
pub fn age(pod: &Pod, now: Timestamp) -> String {
    let since = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .or(pod.status.as_ref().and_then(|s| s.start_time.as_ref()));
    match since {
        Some(t) => human_duration(now.duration_since(t.0).as_secs()),
        None => "<unknown>".into(),
    }
}

/// kubectl's short durations: two units while the larger is small
/// (`3m20s`, `5h10m`, `3d4h`), one unit after (`15m`, `20h`, `30d`).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        return two(m, "m", s % 60, "s");
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        return two(h, "h", m % 60, "m");
    }
    if h < 48 {
        return format!("{h}h");
    }
    let d = h / 24;
    if h < 24 * 8 {
        return two(d, "d", h % 24, "h");
    }
    if h < 24 * 365 * 2 {
        return format!("{d}d");
    }
    let y = d / 365;
    if h < 24 * 365 * 8 {
        return two(y, "y", d % 365, "d");
    }
    format!("{y}y")
}

fn two(a: i64, ua: &str, b: i64, ub: &str) -> String {
    if b == 0 {
        format!("{a}{ua}")
    } else {
        format!("{a}{ua}{b}{ub}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, PodCondition, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;

    const NOW: i64 = 1_700_000_000;

    fn ts(secs_ago: i64) -> Time {
        Time(Timestamp::new(NOW - secs_ago, 0).unwrap())
    }

    fn now() -> Timestamp {
        Timestamp::new(NOW, 0).unwrap()
    }

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            ..Default::default()
        }
    }

    fn pod(containers: &[&str], init: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                creation_timestamp: Some(ts(200)),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: containers.iter().map(|n| container(n)).collect(),
                init_containers: (!init.is_empty())
                    .then(|| init.iter().map(|n| container(n)).collect()),
                node_name: Some("node-a".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn running(name: &str, ready: bool, restarts: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            restart_count: restarts,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(ts(100)),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting(name: &str, reason: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn terminated(
        name: &str,
        code: i32,
        reason: Option<&str>,
        signal: Option<i32>,
    ) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    reason: reason.map(Into::into),
                    signal,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn status(p: &mut Pod) -> &mut PodStatus {
        p.status.as_mut().unwrap()
    }

    fn summary(p: &Pod) -> (usize, usize, String, String) {
        let s = summarize(p, now());
        (s.ready, s.total, s.status, s.restarts)
    }

    #[test]
    fn status_should_show_the_phase_when_nothing_overrides_it() {
        let mut p = pod(&["a", "b"], &[]);
        assert_eq!(summary(&p), (0, 2, "Pending".into(), "0".into()));
        status(&mut p).phase = Some("Running".into());
        status(&mut p).container_statuses =
            Some(vec![running("a", true, 0), running("b", false, 0)]);
        assert_eq!(summary(&p), (1, 2, "Running".into(), "0".into()));
        p.status = None;
        assert_eq!(summarize(&p, now()).status, "Pending");
    }

    #[test]
    fn status_should_show_init_progress_and_init_failures() {
        let mut p = pod(&["a"], &["i1", "i2"]);
        status(&mut p).init_container_statuses = Some(vec![
            waiting("i1", "PodInitializing"),
            waiting("i2", "PodInitializing"),
        ]);
        assert_eq!(summarize(&p, now()).status, "Init:0/2");
        status(&mut p).init_container_statuses = Some(vec![
            terminated("i1", 0, Some("Completed"), None),
            running("i2", false, 0),
        ]);
        assert_eq!(summarize(&p, now()).status, "Init:1/2");
        status(&mut p).init_container_statuses = Some(vec![
            terminated("i1", 0, Some("Completed"), None),
            waiting("i2", "CrashLoopBackOff"),
        ]);
        assert_eq!(summarize(&p, now()).status, "Init:CrashLoopBackOff");
        status(&mut p).init_container_statuses =
            Some(vec![terminated("i1", 3, Some("Error"), None)]);
        assert_eq!(summarize(&p, now()).status, "Init:Error");
        status(&mut p).init_container_statuses = Some(vec![terminated("i1", 137, None, Some(9))]);
        assert_eq!(summarize(&p, now()).status, "Init:Signal:9");
        status(&mut p).init_container_statuses = Some(vec![terminated("i1", 2, None, None)]);
        assert_eq!(summarize(&p, now()).status, "Init:ExitCode:2");
        // App containers do not speak while init runs.
        status(&mut p).container_statuses = Some(vec![waiting("a", "ErrImageNeverPull")]);
        assert_eq!(summarize(&p, now()).status, "Init:ExitCode:2");
    }

    #[test]
    fn status_should_prefer_container_reasons() {
        let mut p = pod(&["a", "b"], &[]);
        status(&mut p).phase = Some("Running".into());
        status(&mut p).container_statuses = Some(vec![
            running("a", true, 0),
            waiting("b", "CrashLoopBackOff"),
        ]);
        assert_eq!(summarize(&p, now()).status, "CrashLoopBackOff");
        status(&mut p).container_statuses = Some(vec![
            waiting("a", "ErrImageNeverPull"),
            waiting("b", "CrashLoopBackOff"),
        ]);
        assert_eq!(
            summarize(&p, now()).status,
            "ErrImageNeverPull",
            "the first container wins"
        );
        status(&mut p).container_statuses = Some(vec![
            terminated("a", 1, Some("Error"), None),
            running("b", true, 0),
        ]);
        assert_eq!(summarize(&p, now()).status, "Error");
        status(&mut p).container_statuses = Some(vec![
            terminated("a", 0, None, Some(15)),
            running("b", true, 0),
        ]);
        assert_eq!(summarize(&p, now()).status, "Signal:15");
        status(&mut p).container_statuses = Some(vec![
            terminated("a", 0, Some("Completed"), None),
            terminated("b", 0, Some("Completed"), None),
        ]);
        status(&mut p).phase = Some("Succeeded".into());
        assert_eq!(summarize(&p, now()).status, "Completed");
        // Completed beside a running container reads as Running/NotReady.
        status(&mut p).container_statuses = Some(vec![
            terminated("a", 0, Some("Completed"), None),
            running("b", true, 0),
        ]);
        assert_eq!(summarize(&p, now()).status, "NotReady");
        status(&mut p).conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
        assert_eq!(summarize(&p, now()).status, "Running");
    }

    #[test]
    fn status_should_show_pod_reason_and_terminating() {
        let mut p = pod(&["a"], &[]);
        status(&mut p).reason = Some("Invalid".into());
        assert_eq!(summarize(&p, now()).status, "Invalid");
        p.metadata.deletion_timestamp = Some(ts(1));
        status(&mut p).phase = Some("Running".into());
        status(&mut p).reason = None;
        status(&mut p).container_statuses = Some(vec![running("a", true, 0)]);
        assert_eq!(summary(&p), (1, 1, "Terminating".into(), "0".into()));
    }

    #[test]
    fn restarts_should_sum_and_say_when() {
        let mut p = pod(&["a", "b"], &[]);
        let mut a = running("a", true, 2);
        a.last_state = Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                finished_at: Some(ts(20)),
                ..Default::default()
            }),
            ..Default::default()
        });
        status(&mut p).container_statuses = Some(vec![a, running("b", true, 1)]);
        assert_eq!(summarize(&p, now()).restarts, "3 (20s ago)");
    }

    #[test]
    fn sidecars_should_count_in_ready() {
        let mut p = pod(&["a"], &["side"]);
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
            Some("Always".into());
        let mut side = running("side", true, 1);
        side.started = Some(true);
        status(&mut p).init_container_statuses = Some(vec![side]);
        status(&mut p).container_statuses = Some(vec![running("a", true, 0)]);
        status(&mut p).phase = Some("Running".into());
        assert_eq!(summary(&p), (2, 2, "Running".into(), "1".into()));
    }

    #[test]
    fn human_duration_should_match_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (599, "9m59s"),
            (600, "10m"),
            (179 * 60 + 59, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60 * 5, "3h5m"),
            (2 * 3600, "120m"),
            (8 * 3600 + 60, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (8 * 86400, "8d"),
            (730 * 86400, "2y"),
            (731 * 86400, "2y1d"),
            (8 * 365 * 86400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn age_should_use_creation_then_start_time() {
        let mut p = pod(&["a"], &[]);
        assert_eq!(age(&p, now()), "3m20s");
        p.metadata.creation_timestamp = None;
        assert_eq!(age(&p, now()), "<unknown>");
        status(&mut p).start_time = Some(ts(7200));
        assert_eq!(age(&p, now()), "120m");
    }

    #[test]
    fn render_should_align_columns_like_kubectl() {
        let mut p = pod(&["a"], &[]);
        status(&mut p).phase = Some("Running".into());
        status(&mut p).pod_ip = Some("10.88.0.5".into());
        status(&mut p).container_statuses = Some(vec![running("a", true, 0)]);
        let cols = Columns {
            namespace: true,
            wide: true,
        };
        let mut widths = Vec::new();
        let text = render(&[cols.header(), cols.row(&p, now())], &mut widths);
        assert_eq!(
            text,
            "NAMESPACE   NAME   READY   STATUS    RESTARTS   AGE     IP          NODE\n\
             default     web    1/1     Running   0          3m20s   10.88.0.5   node-a\n"
        );
        let plain = Columns::default();
        let mut widths = Vec::new();
        let text = render(
            &[plain.header(), plain.row(&pod(&["a"], &[]), now())],
            &mut widths,
        );
        assert_eq!(
            text,
            "NAME   READY   STATUS    RESTARTS   AGE\nweb    0/1     Pending   0          3m20s\n"
        );
        // Later rows keep the earlier widths.
        let again = render(&[plain.row(&pod(&["a"], &[]), now())], &mut widths);
        assert_eq!(again, "web    0/1     Pending   0          3m20s\n");
        let wide = Columns {
            namespace: false,
            wide: true,
        };
        let row = wide.row(&Pod::default(), now());
        assert_eq!(&row[5..], ["<none>", "<none>"]);
    }
}
