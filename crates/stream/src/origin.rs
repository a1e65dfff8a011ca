//! Who may talk to a streaming endpoint from a browser: the checks against
//! DNS rebinding and cross-origin WebSockets, shared by the streaming
//! server and the agent's exec/attach/port-forward proxy.
//!
//! A web page can open a WebSocket to any address, loopback included, and
//! with DNS rebinding it can make its own name point at 127.0.0.1. Two
//! facts stop both:
//! - browsers always send `Origin` on a WebSocket handshake (RFC 6455),
//!   and a cross-origin page's `Origin` differs from the `Host` it
//!   connects to; kubectl (client-go's gorilla dialer and SPDY round
//!   tripper), crictl and kubelet's proxy send no `Origin` at all;
//! - a rebinding page can only send its own name as `Host`, never an IP
//!   literal or a name of this machine.
//!
//! So an upgrade that carries an `Origin` must come to a `Host` that is a
//! name of the server (an IP literal, `localhost`, or a configured name)
//! and the `Origin` must be that same host and port.

use http::{header, HeaderMap};

/// The names, besides IP literals and `localhost`, that a request's
/// `Host` may carry: the machine's host name, the host of the URLs handed
/// out, the names of a TLS certificate.
#[derive(Default)]
pub struct ServerNames {
    names: Vec<String>,
    matcher: Option<Matcher>,
}

/// A further test of names (a certificate's).
type Matcher = Box<dyn Fn(&str) -> bool + Send + Sync>;

impl std::fmt::Debug for ServerNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerNames")
            .field("names", &self.names)
            .field("matcher", &self.matcher.is_some())
            .finish()
    }
}

impl ServerNames {
    /// IP literals and `localhost`, plus `names` (case-insensitive; empty
    /// ones ignored).
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<String> = names
            .into_iter()
            .map(|n| normalize(n.as_ref()))
            .filter(|n| !n.is_empty())
            .collect();
        out.sort();
        out.dedup();
        Self {
            names: out,
            matcher: None,
        }
    }

    /// These names plus the machine's host name (`/proc/sys/kernel/hostname`).
    pub fn with_host_name(mut self) -> Self {
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let h = normalize(&h);
            if !h.is_empty() && !self.names.contains(&h) {
                self.names.push(h);
            }
        }
        self
    }

    /// Also accepts any name `f` accepts (e.g. a TLS certificate's).
    #[must_use]
    pub fn with_matcher(mut self, f: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.matcher = Some(Box::new(f));
        self
    }

    /// Whether `host` (a `Host` header value: `name`, `name:port`, an IP
    /// literal, `[v6]:port`) names this server.
    pub fn allows(&self, host: &str) -> bool {
        let Some((name, _)) = split_host_port(host) else {
            return false;
        };
        if name.parse::<std::net::IpAddr>().is_ok() {
            return true;
        }
        let name = normalize(name);
        name == "localhost"
            || name.ends_with(".localhost")
            || self.names.contains(&name)
            || self.matcher.as_ref().is_some_and(|m| m(&name))
    }
}

/// Lower case, without a trailing dot or surrounding whitespace.
fn normalize(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// `host[:port]` → (host without brackets, port); None if malformed.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        return Some((h, port));
    }
    match s.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 literal.
        Some((h, _)) if h.contains(':') => Some((s, None)),
        Some((h, p)) => Some((h, Some(p.parse().ok()?))),
        None => Some((s, None)),
    }
    .filter(|(h, _)| !h.is_empty())
}

/// Why a request was refused (answered 403 with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `Host` is not a name of this server (DNS rebinding).
    #[error("host {0:?} is not a name of this server (requests by another name are refused against DNS rebinding)")]
    ForeignHost(String),
    /// An upgrade whose `Origin` is not the host it was sent to.
    #[error("cross-origin upgrade refused: origin {origin:?} is not {host:?}")]
    CrossOrigin {
        /// The `Origin` header.
        origin: String,
        /// The `Host` header.
        host: String,
    },
}

fn one(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    // A header that is not text cannot match anything: "?" is refused.
    headers.get(name).map(|v| v.to_str().unwrap_or("?"))
}

/// Refuses a `Host` that is not one of `names` (IP literals and
/// `localhost` always are). A request without `Host` (HTTP/1.0) passes:
/// browsers always send one.
pub fn check_host(headers: &HeaderMap, names: &ServerNames) -> Result<(), Refusal> {
    match one(headers, header::HOST) {
        Some(h) if !names.allows(h) => Err(Refusal::ForeignHost(h.to_string())),
        _ => Ok(()),
    }
}

/// Refuses a request whose `Origin` is not its own `Host` (same scheme:
/// `https` when `tls`, else `http`; same host; same port, the scheme's
/// default if not given). A request without `Origin` passes: only
/// browsers send it.
pub fn check_origin(headers: &HeaderMap, tls: bool) -> Result<(), Refusal> {
    let Some(origin) = one(headers, header::ORIGIN) else {
        return Ok(());
    };
    let host = one(headers, header::HOST).unwrap_or("");
    if same_origin(origin, host, tls) {
        Ok(())
    } else {
        Err(Refusal::CrossOrigin {
            origin: origin.to_string(),
            host: host.to_string(),
        })
    }
}

/// The check of a streaming upgrade: a request with an `Origin` (a
/// browser's) must be sent to a name of this server, from that same
/// origin. Clients without `Origin` (kubectl, crictl, kubelet's proxy,
/// which keeps its own client's `Host`) pass whatever their `Host`.
pub fn check_browser(headers: &HeaderMap, names: &ServerNames, tls: bool) -> Result<(), Refusal> {
    if !headers.contains_key(header::ORIGIN) {
        return Ok(());
    }
    check_host(headers, names)?;
    check_origin(headers, tls)
}

fn same_origin(origin: &str, host: &str, tls: bool) -> bool {
    let origin = origin.trim();
    // The scheme is this connection's; "null", file://,
    // chrome-extension://... are never this server.
    let (scheme, default) = if tls {
        ("https://", 443)
    } else {
        ("http://", 80)
    };
    let Some(rest) = strip_scheme(origin, scheme) else {
        return false;
    };
    let (Some((oh, op)), Some((hh, hp))) = (split_host_port(rest), split_host_port(host)) else {
        return false;
    };
    oh.eq_ignore_ascii_case(hh)
        && op.unwrap_or(default) == hp.unwrap_or(default)
        // An origin is scheme://host[:port] and nothing more.
        && !rest.contains('/')
}

fn strip_scheme<'a>(s: &'a str, scheme: &str) -> Option<&'a str> {
    (s.len() >= scheme.len() && s[..scheme.len()].eq_ignore_ascii_case(scheme))
        .then(|| &s[scheme.len()..])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn host_should_be_an_ip_localhost_or_a_configured_name() {
        let n = ServerNames::new(["Node-1.example.", ""]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:10255",
            "10.0.0.5:10250",
            "[::1]:10255",
            "::1",
            "localhost",
            "LOCALHOST:80",
            "x.localhost:1",
            "node-1.example",
            "node-1.example.:10250",
        ] {
            assert!(n.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:10255",
            "node-1.example.evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "",
            ":80",
            "[::1",
            "host:port",
        ] {
            assert!(!n.allows(bad), "{bad}");
        }
        let m = ServerNames::new(Vec::<String>::new()).with_matcher(|h| h == "cert.example");
        assert!(m.allows("cert.example:443"));
        assert!(!m.allows("other.example"));
    }

    #[test]
    fn origin_should_match_host_and_port() {
        let ok = [
            ("http://127.0.0.1:10255", "127.0.0.1:10255", false),
            ("http://localhost", "localhost:80", false),
            ("HTTP://LocalHost:80", "localhost", false),
            ("https://node:443", "node", true),
            ("https://[::1]:8443", "[::1]:8443", true),
        ];
        for (o, h, tls) in ok {
            let hm = headers(&[("origin", o), ("host", h)]);
            assert_eq!(check_origin(&hm, tls), Ok(()), "{o} {h}");
        }
        let bad = [
            ("http://evil.example", "127.0.0.1:10255", false),
            ("http://127.0.0.1:8080", "127.0.0.1:10255", false),
            ("https://127.0.0.1:10255", "127.0.0.1:10255", false),
            ("null", "127.0.0.1:10255", false),
            ("file://", "localhost", false),
            ("http://localhost/path", "localhost", false),
            ("http://localhost", "", false),
        ];
        for (o, h, tls) in bad {
            let hm = headers(&[("origin", o), ("host", h)]);
            assert!(
                matches!(check_origin(&hm, tls), Err(Refusal::CrossOrigin { .. })),
                "{o} {h}"
            );
        }
        // No Origin: not a browser.
        assert_eq!(check_origin(&headers(&[("host", "x")]), false), Ok(()));
    }

    #[test]
    fn a_browser_should_be_refused_by_another_name_even_from_its_own_origin() {
        let n = ServerNames::new(["node-1"]);
        // DNS rebinding: the page's name points at us; Origin and Host
        // agree, but the name is not ours.
        let rebinding = headers(&[
            ("origin", "http://evil.example:10010"),
            ("host", "evil.example:10010"),
        ]);
        assert!(matches!(
            check_browser(&rebinding, &n, false),
            Err(Refusal::ForeignHost(_))
        ));
        // Cross-origin to our own address.
        let cross = headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:10010"),
        ]);
        assert!(matches!(
            check_browser(&cross, &n, false),
            Err(Refusal::CrossOrigin { .. })
        ));
        // kubelet's proxy keeps its client's Host and sends no Origin.
        let kubelet = headers(&[("host", "node-7.cluster.example:10250")]);
        assert_eq!(check_browser(&kubelet, &n, false), Ok(()));
        // A same-origin page of our own.
        let own = headers(&[("origin", "http://node-1:10010"), ("host", "node-1:10010")]);
        assert_eq!(check_browser(&own, &n, false), Ok(()));
        assert!(matches!(
            check_host(&kubelet, &n),
            Err(Refusal::ForeignHost(_))
        ));
    }
}
