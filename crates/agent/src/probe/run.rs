//! Running one probe once: exec through the runtime, HTTP GET, TCP connect.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cri::RuntimeActuator;

/// The outcome of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed.
    Success,
    /// Failed, with why.
    Failure(String),
}

/// Why an exec probe failed: its exit code and, like kubelet, its output
/// (stderr when stdout is empty: a runc failure's message is only there).
fn exec_failure(out: &crate::cri::ExecOutput) -> String {
    let text = if out.stdout.iter().all(u8::is_ascii_whitespace) {
        &out.stderr
    } else {
        &out.stdout
    };
    format!(
        "command exited with {}: {}",
        out.exit_code,
        String::from_utf8_lossy(text).trim()
    )
}

/// Runs `probe` once against the container `container_id` (exec) or the
/// address `host` (HTTP, TCP).
pub async fn probe_once(
    runtime: &dyn RuntimeActuator,
    probe: &Probe,
    container: &Container,
    container_id: &str,
    host: Option<&str>,
) -> Outcome {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match runtime
            .exec_sync(container_id, cmd, timeout.as_secs() as i64)
            .await
        {
            Ok(out) if out.exit_code == 0 => Outcome::Success,
            Ok(out) => Outcome::Failure(exec_failure(&out)),
            Err(e) => Outcome::Failure(format!("exec failed: {e}")),
        };
    }
    if let Some(http) = &probe.http_get {
        let Some(host) = http.host.as_deref().or(host) else {
            return Outcome::Failure("the pod has no IP to probe".to_string());
        };
        let port = match resolve_port(&http.port, container) {
            Ok(p) => p,
            Err(e) => return Outcome::Failure(e),
        };
        let path = http.path.clone().unwrap_or_else(|| "/".to_string());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return match tokio::time::timeout(timeout, http_get(host, port, &path, &headers)).await {
            Ok(Ok(code)) if (200..400).contains(&code) => Outcome::Success,
            Ok(Ok(code)) => Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
            Ok(Err(e)) => Outcome::Failure(format!("Get \"http://{host}:{port}{path}\": {e}")),
            Err(_) => Outcome::Failure(format!(
                "Get \"http://{host}:{port}{path}\": timeout after {timeout:?}"
            )),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let Some(host) = tcp.host.as_deref().or(host) else {
            return Outcome::Failure("the pod has no IP to probe".to_string());
        };
        let port = match resolve_port(&tcp.port, container) {
            Ok(p) => p,
            Err(e) => return Outcome::Failure(e),
        };
        return match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
            Ok(Ok(_)) => Outcome::Success,
            Ok(Err(e)) => Outcome::Failure(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Outcome::Failure(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    Outcome::Failure("probe has no supported handler (exec, httpGet, tcpSocket)".to_string())
}

/// A port number, or a named port of the container.
fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("port {name:?} not found in the container's ports"))
        }
    }
}

/// A minimal HTTP/1.1 GET: returns the status code.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> std::io::Result<u16> {
    let mut s = TcpStream::connect((host, port)).await?;
    let host_header = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host_header}\r\n");
    let mut has_ua = false;
    let mut has_accept = false;
    for (k, v) in headers {
        has_ua |= k.eq_ignore_ascii_case("user-agent");
        has_accept |= k.eq_ignore_ascii_case("accept");
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_ua {
        req.push_str("User-Agent: kube-probe/1.34\r\n");
    }
    if !has_accept {
        req.push_str("Accept: */*\r\n");
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    // The status line is all we need.
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    while !buf.contains(&b'\n') && buf.len() < 4096 {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let line = line.lines().next().unwrap_or_default();
    let mut parts = line.split_whitespace();
    match (
        parts.next(),
        parts.next().and_then(|c| c.parse::<u16>().ok()),
    ) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => Ok(code),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("malformed HTTP response {line:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn http_get_should_read_the_status_code() -> std::io::Result<()> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        let server = tokio::spawn(async move {
            for code in [200u16, 503] {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                let mut b = [0u8; 1024];
                let _ = s.read(&mut b).await;
                let _ = s
                    .write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        assert_eq!(http_get("127.0.0.1", port, "/healthz", &[]).await?, 200);
        assert_eq!(http_get("127.0.0.1", port, "/", &[]).await?, 503);
        server.abort();
        Ok(())
    }

    #[test]
    fn exec_failures_should_say_the_exit_code_and_the_output() {
        let out = |stdout: &str, stderr: &str| crate::cri::ExecOutput {
            exit_code: 1,
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
        };
        assert_eq!(
            exec_failure(&out("not yet\n", "")),
            "command exited with 1: not yet"
        );
        assert_eq!(
            exec_failure(&out("\n", "exec failed: no such file\n")),
            "command exited with 1: exec failed: no such file"
        );
        assert_eq!(
            exec_failure(&out("out", "err")),
            "command exited with 1: out"
        );
    }

    #[test]
    fn named_ports_should_resolve_from_the_container() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap_or_default();
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
    }
}
