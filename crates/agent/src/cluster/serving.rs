//! The kubelet API's serving certificate when none is given (kubelet's
//! behaviour without `--tls-cert-file`): a self-signed one for the node's
//! name, host name and IP, made once and kept in the certificate directory
//! (`kubelet.crt`, `kubelet.key`, 0600), made again when it has expired or
//! no longer names the node's IP. An API server that checks kubelets
//! against a CA (`--kubelet-certificate-authority`) will not trust it;
//! give the node a certificate of that CA then.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;

use super::credentials::write_private;

/// The files of the self-signed serving certificate.
pub fn paths(cert_dir: &Path) -> (PathBuf, PathBuf) {
    (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"))
}

/// The self-signed serving certificate in `cert_dir`, made if missing,
/// expired, or not naming `ip`; returns (certificate, key) paths.
pub fn ensure_self_signed(
    cert_dir: &Path,
    node: &str,
    host: &str,
    ip: IpAddr,
) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = paths(cert_dir);
    if usable(&cert, &key, ip) {
        return Ok((cert, key));
    }
    petrel_fs::create_private_dir_all(cert_dir, petrel_fs::PRIVATE).map_err(|e| e.to_string())?;
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("key pair: {e}"))?;
    let mut names = vec![node.to_string()];
    if host != node && !host.is_empty() {
        names.push(host.to_string());
    }
    let mut params =
        rcgen::CertificateParams::new(names).map_err(|e| format!("serving certificate: {e}"))?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{node}@{}", Timestamp::now().as_second()),
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    // A year, as kubelet's own.
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since_epoch(Timestamp::now());
    params.not_after = params.not_before + std::time::Duration::from_secs(365 * 24 * 3600);
    let made = params
        .self_signed(&pair)
        .map_err(|e| format!("serving certificate: {e}"))?;
    write_private(&key, pair.serialize_pem().as_bytes())?;
    write_private(&cert, made.pem().as_bytes())?;
    tracing::info!(cert = %cert.display(), "no serving certificate given: made a self-signed one");
    Ok((cert, key))
}

fn since_epoch(t: Timestamp) -> std::time::Duration {
    std::time::Duration::from_secs(t.as_second().max(0).unsigned_abs())
}

/// Whether the pair at `cert`/`key` reads, is valid now and names `ip`.
fn usable(cert: &Path, key: &Path, ip: IpAddr) -> bool {
    let (Ok(c), Ok(_)) = (std::fs::read(cert), std::fs::read(key)) else {
        return false;
    };
    use rustls_pki_types::pem::PemObject;
    let Ok(der) = rustls_pki_types::CertificateDer::from_pem_slice(&c) else {
        return false;
    };
    let valid = crate::der::validity(der.as_ref())
        .is_some_and(|(from, to)| from <= Timestamp::now() && Timestamp::now() < to);
    let names_ip = webpki::EndEntityCert::try_from(&der).is_ok_and(|e| {
        e.verify_is_valid_for_subject_name(&rustls_pki_types::ServerName::IpAddress(ip.into()))
            .is_ok()
    });
    valid && names_ip
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_should_be_made_once_and_name_the_node() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let (cert, key) = ensure_self_signed(&pki, "n1", "host-1", ip).unwrap();
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(usable(&cert, &key, ip));
        let first = std::fs::read(&cert).unwrap();
        ensure_self_signed(&pki, "n1", "host-1", ip).unwrap();
        assert_eq!(
            std::fs::read(&cert).unwrap(),
            first,
            "made again though usable"
        );
        // Another IP: made again, for it.
        let other: IpAddr = "10.1.2.4".parse().unwrap();
        ensure_self_signed(&pki, "n1", "host-1", other).unwrap();
        assert_ne!(std::fs::read(&cert).unwrap(), first);
        assert!(usable(&cert, &key, other));
    }
}
