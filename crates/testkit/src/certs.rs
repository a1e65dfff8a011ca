//! A throwaway certificate authority and the certificates a test cluster
//! needs, as PEM files, made with the `openssl` command (Debian's, installed
//! by `make deps`).
//!
//! Why the CLI and not a crate (`rcgen`): openssl is already a dependency of
//! `make deps`, the Kubernetes components read files anyway, and the kit
//! then adds no crypto code to the workspace's dependency tree (nor a second
//! TLS provider beside `ring`). Keys are EC P-256: generated in
//! milliseconds, accepted by etcd, kube-apiserver, kubelet and kubectl, and
//! for service-account tokens (ES256).
//!
//! Each certificate is issued by one `openssl req -x509 -CA` call
//! (OpenSSL ≥ 3.0) with a private minimal `openssl.cnf`, so no extension
//! comes from the machine's configuration: leaf certificates carry exactly
//! `basicConstraints CA:FALSE`, `keyUsage digitalSignature`, the extended
//! key usage asked for and the subject alternative names.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::KitError;

/// How long certificates are valid: long enough for a demo cluster left up
/// over a weekend, short enough that a leaked key is worthless soon.
const VALID_DAYS: u32 = 7;

/// A subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum San {
    /// `DNS:name`.
    Dns(String),
    /// `IP:address`.
    Ip(IpAddr),
}

/// What a certificate is for (its extended key usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A TLS server (`serverAuth`).
    Server,
    /// A TLS client (`clientAuth`).
    Client,
}

/// One certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRequest {
    /// File stem: `<name>.crt` and `<name>.key` in the PKI directory.
    pub name: String,
    /// Subject CN: Kubernetes reads it as the user name.
    pub common_name: String,
    /// Subject O entries: Kubernetes reads them as groups.
    pub organizations: Vec<String>,
    /// Server or client.
    pub usage: Usage,
    /// Subject alternative names (servers).
    pub sans: Vec<San>,
}

impl CertRequest {
    /// A client certificate for user `cn` in `groups`.
    pub fn client(name: &str, cn: &str, groups: &[&str]) -> CertRequest {
        CertRequest {
            name: name.to_string(),
            common_name: cn.to_string(),
            organizations: groups.iter().map(|g| g.to_string()).collect(),
            usage: Usage::Client,
            sans: Vec::new(),
        }
    }

    /// A server certificate for `cn` valid for `sans`.
    pub fn server(name: &str, cn: &str, sans: Vec<San>) -> CertRequest {
        CertRequest {
            name: name.to_string(),
            common_name: cn.to_string(),
            organizations: Vec::new(),
            usage: Usage::Server,
            sans,
        }
    }
}

/// A certificate and its key, as files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The PEM certificate.
    pub cert: PathBuf,
    /// The PEM private key (inside the kit's private 0700 directory).
    pub key: PathBuf,
}

/// A certificate authority in a directory of its own.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
    ca: Issued,
}

impl Pki {
    /// Creates a CA named `ca_name` in `dir` (created if missing).
    pub fn create(dir: &Path, ca_name: &str) -> Result<Pki, KitError> {
        std::fs::create_dir_all(dir).map_err(|e| KitError::io("create directory", dir, e))?;
        let cnf = dir.join("openssl.cnf");
        // `req` needs a distinguished_name section; -subj fills it.
        std::fs::write(&cnf, "[req]\ndistinguished_name = dn\n[dn]\n")
            .map_err(|e| KitError::io("write", &cnf, e))?;
        let ca = Issued {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        let mut args = req_args(&cnf, &ca, &subject(ca_name, &[]));
        args.extend(
            [
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]
            .map(String::from),
        );
        let pki = Pki {
            dir: dir.to_path_buf(),
            ca,
        };
        pki.openssl(&args)?;
        Ok(pki)
    }

    /// The CA's certificate and key (what a signer signs with).
    pub fn ca(&self) -> &Issued {
        &self.ca
    }

    /// The CA certificate (what clients and servers trust).
    pub fn ca_cert(&self) -> &Path {
        &self.ca.cert
    }

    /// The PKI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Issues the certificate `req` describes, signed by the CA.
    pub fn issue(&self, req: &CertRequest) -> Result<Issued, KitError> {
        let out = Issued {
            cert: self.dir.join(format!("{}.crt", req.name)),
            key: self.dir.join(format!("{}.key", req.name)),
        };
        let mut args = req_args(
            &self.dir.join("openssl.cnf"),
            &out,
            &subject(&req.common_name, &req.organizations),
        );
        args.push("-CA".into());
        args.push(self.ca.cert.display().to_string());
        args.push("-CAkey".into());
        args.push(self.ca.key.display().to_string());
        args.extend(leaf_extensions(req));
        self.openssl(&args)?;
        Ok(out)
    }

    /// A key pair for signing service-account tokens: (private, public).
    pub fn service_account_keys(&self) -> Result<(PathBuf, PathBuf), KitError> {
        let key = self.dir.join("sa.key");
        let public = self.dir.join("sa.pub");
        self.openssl(&[
            "genpkey".into(),
            "-algorithm".into(),
            "EC".into(),
            "-pkeyopt".into(),
            "ec_paramgen_curve:prime256v1".into(),
            "-out".into(),
            key.display().to_string(),
        ])?;
        self.openssl(&[
            "pkey".into(),
            "-in".into(),
            key.display().to_string(),
            "-pubout".into(),
            "-out".into(),
            public.display().to_string(),
        ])?;
        Ok((key, public))
    }

    /// Runs `openssl ARGS`, its output appended to `openssl.log` here.
    fn openssl(&self, args: &[String]) -> Result<(), KitError> {
        let log = self.dir.join("openssl.log");
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| KitError::io("open", &log, e))?;
        let err = out.try_clone().map_err(|e| KitError::io("open", &log, e))?;
        let mut cmd = Command::new("openssl");
        cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        let command = crate::process::describe(&cmd);
        let status = cmd.status().map_err(|e| KitError::Start {
            component: "openssl".into(),
            command: command.clone(),
            log: log.clone(),
            detail: format!("{e} (apt-get install openssl, or `make deps`)"),
        })?;
        if !status.success() {
            return Err(KitError::Run {
                component: "openssl".into(),
                detail: format!("{command} exited with {status}"),
                log,
            });
        }
        Ok(())
    }
}

/// The `openssl req` arguments making a new P-256 key and a certificate
/// with subject `subj` into `out`.
fn req_args(cnf: &Path, out: &Issued, subj: &str) -> Vec<String> {
    [
        "req",
        "-config",
        &cnf.display().to_string(),
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        &out.key.display().to_string(),
        "-out",
        &out.cert.display().to_string(),
        "-subj",
        subj,
        "-days",
        &VALID_DAYS.to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// An `openssl -subj` string: `/O=g1/O=g2/CN=cn`, with `/` and `\` in
/// values escaped.
pub fn subject(cn: &str, organizations: &[String]) -> String {
    let esc = |v: &str| v.replace('\\', "\\\\").replace('/', "\\/");
    let mut s = String::new();
    for o in organizations {
        s.push_str("/O=");
        s.push_str(&esc(o));
    }
    s.push_str("/CN=");
    s.push_str(&esc(cn));
    s
}

/// The `-addext` arguments of a leaf certificate.
pub fn leaf_extensions(req: &CertRequest) -> Vec<String> {
    let mut exts = vec![
        "basicConstraints=critical,CA:FALSE".to_string(),
        "keyUsage=critical,digitalSignature".to_string(),
        match req.usage {
            Usage::Server => "extendedKeyUsage=serverAuth".to_string(),
            Usage::Client => "extendedKeyUsage=clientAuth".to_string(),
        },
    ];
    if !req.sans.is_empty() {
        let names: Vec<String> = req
            .sans
            .iter()
            .map(|s| match s {
                San::Dns(d) => format!("DNS:{d}"),
                San::Ip(ip) => format!("IP:{ip}"),
            })
            .collect();
        exts.push(format!("subjectAltName={}", names.join(",")));
    }
    exts.into_iter()
        .flat_map(|e| ["-addext".to_string(), e])
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn subject_should_list_groups_before_the_common_name_and_escape_slashes() {
        assert_eq!(
            subject("system:node:n1", &["system:nodes".to_string()]),
            "/O=system:nodes/CN=system:node:n1"
        );
        assert_eq!(subject("a/b", &[]), "/CN=a\\/b");
    }

    #[test]
    fn leaf_extensions_should_name_usage_and_alternative_names() {
        let req = CertRequest::server(
            "apiserver",
            "kube-apiserver",
            vec![
                San::Dns("localhost".into()),
                San::Ip("127.0.0.1".parse().unwrap()),
            ],
        );
        let args = leaf_extensions(&req);
        assert!(args.contains(&"extendedKeyUsage=serverAuth".to_string()));
        assert!(args.contains(&"subjectAltName=DNS:localhost,IP:127.0.0.1".to_string()));
        assert!(args.contains(&"basicConstraints=critical,CA:FALSE".to_string()));
        assert_eq!(args.iter().filter(|a| *a == "-addext").count(), 4);
        let client = leaf_extensions(&CertRequest::client("a", "admin", &["system:masters"]));
        assert!(client.contains(&"extendedKeyUsage=clientAuth".to_string()));
        assert!(!client.iter().any(|a| a.starts_with("subjectAltName")));
    }

    #[test]
    fn pki_should_issue_certificates_the_ca_verifies() {
        let d = tempfile::tempdir().unwrap();
        let pki = Pki::create(&d.path().join("pki"), "test-ca").unwrap();
        let c = pki
            .issue(&CertRequest::client(
                "node",
                "system:node:n1",
                &["system:nodes"],
            ))
            .unwrap();
        let out = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(pki.ca_cert())
            .arg(&c.cert)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-in"])
            .arg(&c.cert)
            .output()
            .unwrap();
        let subject = String::from_utf8_lossy(&text.stdout);
        assert!(
            subject.contains("O = system:nodes, CN = system:node:n1"),
            "{subject}"
        );
        let (key, public) = pki.service_account_keys().unwrap();
        assert!(key.is_file() && public.is_file());
    }
}
