//! Just enough DER to read what the agent needs of an X.509 certificate:
//! its subject (who a client is) and its validity (when a client
//! certificate must be renewed). Anything unexpected reads as nothing.

use k8s_openapi::jiff::Timestamp;

/// One element: (tag, content, rest).
fn element(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&first, b) = b.split_first()?;
    let (len, b) = if first < 0x80 {
        (usize::from(first), b)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n]
            .iter()
            .fold(0usize, |a, &x| (a << 8) | usize::from(x));
        (len, &b[n..])
    };
    if b.len() < len {
        return None;
    }
    Some((tag, &b[..len], &b[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_O: &[u8] = &[0x55, 0x04, 0x0a];

/// The subject's CN and O values.
pub(crate) fn subject(cert: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    let mut rest = tbs_fields(cert)?;
    // serialNumber, signature, issuer, validity, then subject.
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    let (tag, mut name, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (mut cn, mut orgs) = (None, Vec::new());
    while !name.is_empty() {
        let (tag, mut rdn, next) = element(name)?;
        name = next;
        if tag != SET {
            return None;
        }
        while !rdn.is_empty() {
            let (tag, atv, next) = element(rdn)?;
            rdn = next;
            if tag != SEQUENCE {
                return None;
            }
            let (_, oid, v) = element(atv)?;
            let (_, value, _) = element(v)?;
            let value = String::from_utf8(value.to_vec()).ok()?;
            if oid == OID_CN {
                cn = Some(value);
            } else if oid == OID_O {
                orgs.push(value);
            }
        }
    }
    Some((cn, orgs))
}

const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The elements of a certificate's TBSCertificate after its version.
fn tbs_fields(cert: &[u8]) -> Option<&[u8]> {
    let (tag, cert, _) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = element(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    if tbs.first() == Some(&0xa0) {
        return Some(element(tbs)?.2);
    }
    Some(tbs)
}

/// A certificate's validity: (notBefore, notAfter).
pub(crate) fn validity(cert: &[u8]) -> Option<(Timestamp, Timestamp)> {
    let mut rest = tbs_fields(cert)?;
    // serialNumber, signature, issuer, then validity.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (tag, v, _) = element(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (t1, a, rest) = element(v)?;
    let (t2, b, _) = element(rest)?;
    Some((time(t1, a)?, time(t2, b)?))
}

/// An ASN.1 UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`).
fn time(tag: u8, v: &[u8]) -> Option<Timestamp> {
    let s = std::str::from_utf8(v).ok()?.strip_suffix('Z')?;
    let (year, rest) = match tag {
        UTC_TIME if s.len() == 12 => {
            let yy: i16 = s[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &s[2..])
        }
        GENERALIZED_TIME if s.len() == 14 => (s[..4].parse().ok()?, &s[4..]),
        _ => return None,
    };
    let n = |i: usize| rest.get(i..i + 2)?.parse::<i8>().ok();
    let dt =
        k8s_openapi::jiff::civil::DateTime::new(year, n(0)?, n(2)?, n(4)?, n(6)?, n(8)?, 0).ok()?;
    dt.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .ok()
        .map(|z| z.timestamp())
}

/// A certificate for tests: `openssl req -x509 -subj
/// "/O=system:nodes/O=extra group/CN=system:node:n1"`, valid from
/// 2026-11-28T18:41:08Z to 2026-11-29T18:41:08Z.
#[cfg(test)]
pub(crate) const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIB4TCCAYegAwIBAgIUO1GEbAPmKbp+JCL8y9GbKezyNaAwCgYIKoZIzj0EAwIw
RjEVMBMGA1UECgwMc3lzdGVtOm5vZGVzMRQwEgYDVQQKDAtleHRyYSBncm91cDEX
MBUGA1UEAwwOc3lzdGVtOm5vZGU6bjEwHhcNMjYxMTI4MTg0MTA4WhcNMjYxMTI5
MTg0MTA4WjBGMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMxFDASBgNVBAoMC2V4dHJh
IGdyb3VwMRcwFQYDVQQDDA5zeXN0ZW06bm9kZTpuMTBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABGlh4+VJwrECDGOKJCuzN9TkHsZ61fQ/f/QwzqtE8XXPHbMGkgsv
xVdozq6PUzsONKfTdWGZx022hl2mdpdKw8yjUzBRMB0GA1UdDgQWBBRcsmAOwjHi
MFjug6X0jQGr0TnxeDAfBgNVHSMEGDAWgBRcsmAOwjHiMFjug6X0jQGr0TnxeDAP
BgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQCQn1ncEMC1J0gBcutC
yai5Yn1m0T+pySyp3KwJ3xT7mgIgFu3ZHtDFPPgzaW9f2fWG4TBnimkI+/Db7jn2
W17Pvf8=
-----END CERTIFICATE-----
";

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    use super::*;

    fn der() -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(TEST_CERT.as_bytes()).unwrap()
    }

    #[test]
    fn validity_should_read_both_times() {
        let (from, to) = validity(der().as_ref()).unwrap();
        assert_eq!(from.to_string(), "2026-11-28T18:41:08Z");
        assert_eq!(to.to_string(), "2026-11-29T18:41:08Z");
    }

    #[test]
    fn times_should_read_both_asn1_forms() {
        assert_eq!(
            time(UTC_TIME, b"491231235959Z").unwrap().to_string(),
            "2049-12-31T23:59:59Z"
        );
        assert_eq!(
            time(UTC_TIME, b"500101000000Z").unwrap().to_string(),
            "1950-01-01T00:00:00Z"
        );
        assert_eq!(
            time(GENERALIZED_TIME, b"20500101000000Z")
                .unwrap()
                .to_string(),
            "2050-01-01T00:00:00Z"
        );
        assert!(time(UTC_TIME, b"991399000000Z").is_none());
        assert!(time(UTC_TIME, b"9912").is_none());
    }

    #[test]
    fn garbage_should_read_as_nothing() {
        assert!(validity(&[]).is_none());
        let d = der();
        assert!(validity(&d.as_ref()[..40]).is_none());
        assert!(subject(&d.as_ref()[..40]).is_none());
    }
}
