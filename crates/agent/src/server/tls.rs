//! Who may reach the TCP server. On loopback it may speak plain HTTP
//! without authentication, and then serves only `/healthz` and
//! `/metrics` (every local user, and every container on the host's
//! network, reaches it; the rest of the API is on the unix socket).
//! Anywhere else the logs, exec, attach and port-forward endpoints would
//! hand the node to anyone on the network, so a non-loopback address is
//! refused unless TLS with client certificates is configured (kubelet's
//! `--tls-cert-file`, `--tls-private-key-file`, `--client-ca-file`): then
//! every client must present a certificate signed by the client CA, and
//! the whole API is served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The TLS files of the server, as configured.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// The server certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// The CA that signs client certificates (PEM).
    pub client_ca: Option<PathBuf>,
}

/// Why the server may not, or cannot, serve as configured.
#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    /// A non-loopback address without client-certificate authentication.
    #[error(
        "refusing to serve on {0}: the agent's endpoints (logs, exec, attach, port-forward) \
         need client-certificate authentication on a non-loopback address; set \
         --tls-cert-file, --tls-private-key-file and --client-ca-file, or listen on 127.0.0.1"
    )]
    Unauthenticated(SocketAddr),
    /// One TLS flag without its partner.
    #[error("{given} is set but {missing} is not")]
    Incomplete {
        /// The flag given.
        given: &'static str,
        /// The flag missing.
        missing: &'static str,
    },
    /// A file could not be read or holds nothing usable.
    #[error("{flag} {}: {reason}", path.display())]
    File {
        /// The flag that names the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate and key do not make a TLS configuration.
    #[error("--tls-cert-file/--tls-private-key-file: {0}")]
    Config(String),
}

const CERT_FLAG: &str = "--tls-cert-file";
const KEY_FLAG: &str = "--tls-private-key-file";
const CA_FLAG: &str = "--client-ca-file";

/// Decides how to serve on `listen`: None for plain HTTP (loopback, no
/// TLS configured), or the TLS configuration that requires client
/// certificates.
pub fn server_tls(
    listen: SocketAddr,
    files: &TlsFiles,
) -> Result<Option<Arc<ServerConfig>>, ExposureError> {
    let loopback = listen.ip().is_loopback();
    let (cert, key, ca) = match (&files.cert, &files.key, &files.client_ca) {
        (Some(c), Some(k), Some(a)) => (c, k, a),
        (None, None, None) if loopback => return Ok(None),
        (None, None, _) | (_, _, None) if !loopback => {
            return Err(ExposureError::Unauthenticated(listen))
        }
        (Some(_), None, _) => return Err(incomplete(CERT_FLAG, KEY_FLAG)),
        (None, Some(_), _) => return Err(incomplete(KEY_FLAG, CERT_FLAG)),
        (None, None, _) => return Err(incomplete(CA_FLAG, CERT_FLAG)),
        (Some(_), Some(_), None) => return Err(incomplete(CERT_FLAG, CA_FLAG)),
    };
    build(cert, key, Some(ca), true).map(Some)
}

/// The kubelet API's TLS configuration in cluster mode: the serving
/// certificate and key (given, or self-signed), client certificates of
/// `client_ca` verified when presented but none required, since every
/// request is authenticated by the webhook (a certificate, or a bearer
/// token the API server reviews), as kubelet's server does.
pub fn cluster_server_tls(files: &TlsFiles) -> Result<Arc<ServerConfig>, ExposureError> {
    let (cert, key) = match (&files.cert, &files.key) {
        (Some(c), Some(k)) => (c, k),
        (Some(_), None) => return Err(incomplete(CERT_FLAG, KEY_FLAG)),
        (None, _) => return Err(incomplete(KEY_FLAG, CERT_FLAG)),
    };
    build(cert, key, files.client_ca.as_ref(), false)
}

/// A server configuration from the files; `require` makes a client
/// certificate of `ca` mandatory.
fn build(
    cert: &Path,
    key: &Path,
    ca: Option<&PathBuf>,
    require: bool,
) -> Result<Arc<ServerConfig>, ExposureError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs(CERT_FLAG, cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ExposureError::File {
        flag: KEY_FLAG,
        path: key.to_path_buf(),
        reason: format!("no usable private key: {e}"),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ExposureError::Config(e.to_string()))?;
    let builder = match ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certs(CA_FLAG, ca)? {
                roots.add(c).map_err(|e| ExposureError::File {
                    flag: CA_FLAG,
                    path: ca.clone(),
                    reason: format!("not a CA certificate: {e}"),
                })?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let verifier = if require {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|e| ExposureError::File {
                flag: CA_FLAG,
                path: ca.clone(),
                reason: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| ExposureError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A matcher of the DNS names the server certificate is valid for (its
/// subjectAltNames, wildcards included), for the `Host` check; None if the
/// certificate cannot be read (the server would not start then anyway).
pub fn certificate_names(
    files: &TlsFiles,
) -> Option<impl Fn(&str) -> bool + Send + Sync + 'static> {
    let pem = std::fs::read(files.cert.as_ref()?).ok()?;
    let leaf = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    webpki::EndEntityCert::try_from(&leaf).ok()?;
    Some(move |name: &str| {
        let Ok(dns) = rustls_pki_types::DnsName::try_from(name.to_string()) else {
            return false;
        };
        webpki::EndEntityCert::try_from(&leaf).is_ok_and(|cert| {
            cert.verify_is_valid_for_subject_name(&rustls_pki_types::ServerName::DnsName(dns))
                .is_ok()
        })
    })
}

fn incomplete(given: &'static str, missing: &'static str) -> ExposureError {
    ExposureError::Incomplete { given, missing }
}

fn certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ExposureError> {
    let file_err = |reason: String| ExposureError::File {
        flag,
        path: path.to_path_buf(),
        reason,
    };
    // Read first: a missing file is reported as such, not as "no
    // certificate".
    let pem = std::fs::read(path).map_err(|e| file_err(e.to_string()))?;
    let list = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(format!("invalid PEM: {e}")))?;
    if list.is_empty() {
        return Err(file_err("no certificate in the file".into()));
    }
    Ok(list)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_without_tls_should_be_plain_and_elsewhere_refused() {
        assert!(server_tls(addr("127.0.0.1:10255"), &TlsFiles::default())
            .unwrap()
            .is_none());
        assert!(server_tls(addr("[::1]:10255"), &TlsFiles::default())
            .unwrap()
            .is_none());
        let e = server_tls(addr("0.0.0.0:10255"), &TlsFiles::default()).unwrap_err();
        assert!(matches!(e, ExposureError::Unauthenticated(_)), "{e}");
        assert!(e.to_string().contains("--client-ca-file"), "{e}");
        // TLS without client CA is not authentication.
        let half = TlsFiles {
            cert: Some("/c".into()),
            key: Some("/k".into()),
            client_ca: None,
        };
        assert!(matches!(
            server_tls(addr("10.0.0.1:10250"), &half).unwrap_err(),
            ExposureError::Unauthenticated(_)
        ));
    }

    #[test]
    fn missing_partner_flags_and_files_should_be_named() {
        let only_cert = TlsFiles {
            cert: Some("/c".into()),
            ..Default::default()
        };
        let e = server_tls(addr("127.0.0.1:1"), &only_cert).unwrap_err();
        assert!(e.to_string().contains(KEY_FLAG), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let files = TlsFiles {
            cert: Some(dir.path().join("absent.pem")),
            key: Some(empty.clone()),
            client_ca: Some(empty.clone()),
        };
        let e = server_tls(addr("0.0.0.0:1"), &files)
            .unwrap_err()
            .to_string();
        assert!(e.contains(CERT_FLAG) && e.contains("absent.pem"), "{e}");
    }
}
