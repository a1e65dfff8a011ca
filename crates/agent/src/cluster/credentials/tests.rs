use std::sync::Mutex;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};

use super::*;

/// A self-signed certificate and key valid from `from` to `to`.
fn cert(cn: &str, from: &str, to: &str) -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let t = |s: &str| {
        let ts: Timestamp = s.parse().unwrap();
        rcgen::date_time_ymd(2000, 1, 1) + time_since_2000(ts)
    };
    p.not_before = t(from);
    p.not_after = t(to);
    let c = p.self_signed(&key).unwrap();
    let mut pem = c.pem().into_bytes();
    pem.extend(key.serialize_pem().into_bytes());
    pem
}

fn time_since_2000(ts: Timestamp) -> std::time::Duration {
    let base: Timestamp = "2000-01-01T00:00:00Z".parse().unwrap();
    std::time::Duration::from_secs((ts.as_second() - base.as_second()) as u64)
}

#[test]
fn a_certificate_should_be_renewed_between_70_and_90_percent_of_its_life() {
    let c = ClientCert::parse(&cert(
        "system:node:n1",
        "2026-01-01T00:00:00Z",
        "2026-01-11T00:00:00Z",
    ))
    .unwrap();
    assert_eq!(c.not_before.to_string(), "2026-01-01T00:00:00Z");
    assert_eq!(c.renew_at(0.7).to_string(), "2026-01-08T00:00:00Z");
    assert_eq!(c.renew_at(0.9).to_string(), "2026-01-10T00:00:00Z");
}

#[test]
fn a_pem_without_a_key_or_certificate_should_be_refused() {
    assert!(ClientCert::parse(b"").is_err());
    let only_cert: Vec<u8> =
        String::from_utf8(cert("x", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z"))
            .unwrap()
            .split("-----BEGIN PRIVATE KEY-----")
            .next()
            .unwrap()
            .as_bytes()
            .to_vec();
    assert!(ClientCert::parse(&only_cert)
        .unwrap_err()
        .contains("private key"));
}

/// Issues whatever is asked after `polls` reads, or denies it.
struct FakeSigner {
    created: Mutex<Vec<CertificateSigningRequest>>,
    polls: Mutex<u32>,
    deny: bool,
}

#[async_trait]
impl CsrApi for FakeSigner {
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String> {
        self.created.lock().unwrap().push(csr.clone());
        Ok("node-csr-1".into())
    }
    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String> {
        let mut csr = self.created.lock().unwrap()[0].clone();
        csr.metadata.name = Some(name.into());
        let mut n = self.polls.lock().unwrap();
        if *n > 0 {
            *n -= 1;
            return Ok(csr);
        }
        csr.status = Some(if self.deny {
            CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition {
                    type_: "Denied".into(),
                    status: "True".into(),
                    reason: Some("NotMine".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }
        } else {
            let signed = cert(
                "system:node:n1",
                "2026-01-01T00:00:00Z",
                "2027-01-01T00:00:00Z",
            );
            let cert_only = String::from_utf8(signed).unwrap();
            let cert_only = cert_only
                .split("-----BEGIN PRIVATE KEY-----")
                .next()
                .unwrap()
                .to_string();
            CertificateSigningRequestStatus {
                certificate: Some(ByteString(cert_only.into_bytes())),
                ..Default::default()
            }
        });
        Ok(csr)
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_should_name_the_node_and_wait_for_the_certificate() {
    let api = FakeSigner {
        created: Mutex::new(vec![]),
        polls: Mutex::new(3),
        deny: false,
    };
    let pem = request_certificate(&api, "n1").await.unwrap();
    let text = String::from_utf8(pem.clone()).unwrap();
    assert!(text.contains("BEGIN CERTIFICATE") && text.contains("BEGIN PRIVATE KEY"));
    let csr = &api.created.lock().unwrap()[0];
    assert_eq!(csr.spec.signer_name, SIGNER);
    assert_eq!(
        csr.spec.usages.as_deref().unwrap(),
        ["digital signature", "client auth"]
    );
    let req = String::from_utf8(csr.spec.request.0.clone()).unwrap();
    assert!(
        req.starts_with("-----BEGIN CERTIFICATE REQUEST-----"),
        "{req}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_request_should_say_so() {
    let api = FakeSigner {
        created: Mutex::new(vec![]),
        polls: Mutex::new(0),
        deny: true,
    };
    let e = request_certificate(&api, "n1").await.unwrap_err();
    assert!(e.contains("denied") && e.contains("NotMine"), "{e}");
}

#[test]
fn stored_certificates_should_be_private_and_the_link_should_move() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let a = cert("a", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z");
    let link = store(&pki, &a).unwrap();
    assert_eq!(std::fs::read(&link).unwrap(), a);
    let target = std::fs::read_link(&link).unwrap();
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(&pki).unwrap().permissions().mode() & 0o777,
        0o700
    );
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let b = cert("b", "2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z");
    store(&pki, &b).unwrap();
    assert_eq!(std::fs::read(&link).unwrap(), b);
}

#[test]
fn the_written_kubeconfig_should_name_the_bootstraps_cluster_and_the_current_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let boot: Kubeconfig = serde_yaml::from_str(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443', certificate-authority: /ca.crt}\nusers:\n- name: b\n  user: {token: abc.def}\ncontexts:\n- name: x\n  context: {cluster: c, user: b}\ncurrent-context: x\n",
    )
    .unwrap();
    let pki = dir.path().join("pki");
    let link = store(
        &pki,
        &cert(
            "system:node:n1",
            "2026-01-01T00:00:00Z",
            "2099-01-01T00:00:00Z",
        ),
    )
    .unwrap();
    let path = dir.path().join("kubeconfig");
    write_kubeconfig(&path, &boot, &link).unwrap();
    let kc = Kubeconfig::read_from(&path).unwrap();
    let cluster = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
    let (c, file) = valid_cert(&path).unwrap();
    assert_eq!(file, pki.join(CURRENT));
    assert_eq!(c.not_after.to_string(), "2099-01-01T00:00:00Z");
    assert!(!text_has_token(&path));
}

fn text_has_token(path: &Path) -> bool {
    std::fs::read_to_string(path).unwrap().contains("abc.def")
}
