//! The node's credentials, as kubelet gets and keeps them:
//!
//! - `--kubeconfig` with a client certificate that is still valid: used.
//! - Otherwise, with `--bootstrap-kubeconfig` (TLS bootstrap): a new key
//!   pair, a CertificateSigningRequest for `system:node:<node>` in
//!   `system:nodes` (signer `kubernetes.io/kube-apiserver-client-kubelet`),
//!   made with the bootstrap credentials; once approved and signed, the
//!   certificate and key go to `<cert-dir>/kubelet-client-<time>.pem`
//!   (0600), `kubelet-client-current.pem` is pointed at it, and a
//!   kubeconfig naming that file is written to `--kubeconfig`.
//! - Rotation: at a random point between 70 % and 90 % of the certificate's
//!   life (kubelet's jitter), the same request is made with the node's own
//!   credentials; the new certificate replaces the old in place: the
//!   client's TLS configuration asks [`CurrentCert`] at each handshake, so
//!   every later connection presents it, with no client rebuilt.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::ClusterError;

/// The signer of kubelets' client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The name of the current certificate's link in the certificate directory.
pub const CURRENT: &str = "kubelet-client-current.pem";

/// A client certificate and its key (PEM), with its validity.
#[derive(Clone)]
pub struct ClientCert {
    /// Certificate chain then private key, PEM.
    pub pem: Vec<u8>,
    /// notBefore.
    pub not_before: Timestamp,
    /// notAfter.
    pub not_after: Timestamp,
    key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl ClientCert {
    /// Reads certificate and key from `pem`.
    pub fn parse(pem: &[u8]) -> Result<ClientCert, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("certificate: {e}"))?;
        let leaf = chain.first().ok_or("no certificate")?;
        let (not_before, not_after) =
            crate::der::validity(leaf.as_ref()).ok_or("certificate validity unreadable")?;
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("private key: {e}"))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("private key: {e}"))?;
        Ok(ClientCert {
            pem: pem.to_vec(),
            not_before,
            not_after,
            key: Arc::new(CertifiedKey::new(chain, signer)),
        })
    }

    /// When to renew it: `fraction` (0.7-0.9) of the way through its life.
    pub fn renew_at(&self, fraction: f64) -> Timestamp {
        let life = self.not_after.as_second() - self.not_before.as_second();
        let at = self.not_before.as_second() + (life as f64 * fraction) as i64;
        Timestamp::from_second(at).unwrap_or(self.not_after)
    }
}

/// The certificate the client presents, swapped in place on rotation.
#[derive(Debug)]
pub struct CurrentCert {
    cert: RwLock<ClientCert>,
    generation: super::fresh_conns::Generation,
}

impl CurrentCert {
    /// Holding `cert`.
    pub fn new(cert: ClientCert) -> Self {
        Self {
            cert: RwLock::new(cert),
            generation: super::fresh_conns::Generation::default(),
        }
    }

    /// The certificate now.
    pub fn get(&self) -> ClientCert {
        self.cert.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces it: the next TLS handshake presents `cert`, and the
    /// connections made with the old one end.
    pub fn set(&self, cert: ClientCert) {
        *self.cert.write().unwrap_or_else(|p| p.into_inner()) = cert;
        self.generation.bump();
    }
}

impl ResolvesClientCert for CurrentCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.get().key))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The CSR calls (a trait, so the flow is unit-tested without a cluster).
#[async_trait]
pub trait CsrApi: Send + Sync {
    /// Creates `csr`; returns its name.
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String>;
    /// Reads CSR `name`.
    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String>;
}

/// The CSR calls over a client.
pub struct KubeCsrApi(pub kube::Client);

#[async_trait]
impl CsrApi for KubeCsrApi {
    async fn create(&self, csr: &CertificateSigningRequest) -> Result<String, String> {
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.0.clone());
        let made = api
            .create(&PostParams::default(), csr)
            .await
            .map_err(|e| format!("create CertificateSigningRequest: {e}"))?;
        made.metadata
            .name
            .ok_or_else(|| "created CSR has no name".to_string())
    }

    async fn get(&self, name: &str) -> Result<CertificateSigningRequest, String> {
        let api: kube::Api<CertificateSigningRequest> = kube::Api::all(self.0.clone());
        api.get(name)
            .await
            .map_err(|e| format!("read CertificateSigningRequest {name}: {e}"))
    }
}

/// Asks for a client certificate for `node` and waits until it is issued;
/// returns certificate and key as one PEM. A denied or failed request is an
/// error naming why.
pub async fn request_certificate(api: &dyn CsrApi, node: &str) -> Result<Vec<u8>, String> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("key pair: {e}"))?;
    let mut params =
        rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| format!("CSR: {e}"))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| format!("CSR: {e}"))?;
    let csr = CertificateSigningRequest {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some("node-csr-".to_string()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: SIGNER.to_string(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    let name = api.create(&csr).await?;
    tracing::info!(csr = %name, node, "client certificate requested; waiting for approval");
    let mut delay = Duration::from_millis(200);
    loop {
        let got = api.get(&name).await?;
        if let Some(status) = &got.status {
            for c in status.conditions.iter().flatten() {
                if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
                    return Err(format!(
                        "CertificateSigningRequest {name} {}: {} {}",
                        c.type_.to_lowercase(),
                        c.reason.clone().unwrap_or_default(),
                        c.message.clone().unwrap_or_default()
                    ));
                }
            }
            if let Some(cert) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
                let mut pem = cert.0.clone();
                if !pem.ends_with(b"\n") {
                    pem.push(b'\n');
                }
                pem.extend_from_slice(key.serialize_pem().as_bytes());
                tracing::info!(csr = %name, node, "client certificate issued");
                return Ok(pem);
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Writes `pem` as the current client certificate in `dir`: a new file
/// (0600, in a private directory), then `kubelet-client-current.pem`
/// pointed at it in one rename. Returns the link's path.
pub fn store(dir: &Path, pem: &[u8]) -> Result<PathBuf, String> {
    petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE).map_err(|e| e.to_string())?;
    let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
    // Two certificates within one second keep both files.
    let file = (0..)
        .map(|n| match n {
            0 => dir.join(format!("kubelet-client-{stamp}.pem")),
            n => dir.join(format!("kubelet-client-{stamp}-{n}.pem")),
        })
        .find(|f| !f.exists())
        .unwrap_or_else(|| dir.join(format!("kubelet-client-{stamp}.pem")));
    write_private(&file, pem)?;
    let link = dir.join(CURRENT);
    let tmp = dir.join(format!(".{CURRENT}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&file, &tmp)
        .and_then(|()| std::fs::rename(&tmp, &link))
        .map_err(|e| format!("point {} at {}: {e}", link.display(), file.display()))?;
    Ok(link)
}

/// Writes a kubeconfig at `path` for the cluster of `bootstrap` with the
/// client certificate and key in `cert` (0600, written whole).
pub fn write_kubeconfig(path: &Path, bootstrap: &Kubeconfig, cert: &Path) -> Result<(), String> {
    let current = bootstrap
        .current_context
        .as_deref()
        .and_then(|c| bootstrap.contexts.iter().find(|x| x.name == c))
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone());
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| Some(&c.name) == current.as_ref())
        .or_else(|| bootstrap.clusters.first())
        .ok_or("the bootstrap kubeconfig names no cluster")?;
    let cert = cert.display().to_string();
    let yaml = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster.cluster}],
        "users": [{"name": "default-auth", "user": {"client-certificate": cert, "client-key": cert}}],
        "contexts": [{"name": "default-context", "context": {"cluster": "default-cluster", "user": "default-auth"}}],
        "current-context": "default-context",
    });
    let text = serde_yaml::to_string(&yaml).map_err(|e| e.to_string())?;
    write_private(path, text.as_bytes())
}

/// Writes `bytes` to `path` whole (a 0600 temporary file, synced, renamed
/// over it): a reader sees the old content or the new, never a part.
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("write {}: {e}", path.display()))
}

/// Where the node's credentials come from.
#[derive(Debug, Clone)]
pub struct CredentialFiles {
    /// `--kubeconfig`.
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`.
    pub bootstrap: Option<PathBuf>,
    /// `--cert-dir`.
    pub cert_dir: PathBuf,
    /// `--rotate-certificates`.
    pub rotate: bool,
}

/// The node's client, and the certificate to rotate (if it rotates).
pub struct Credentials {
    /// The client.
    pub client: kube::Client,
    /// The certificate it presents, when it is one the agent renews.
    pub rotating: Option<Arc<CurrentCert>>,
}

fn bad(path: &Path, reason: impl std::fmt::Display) -> ClusterError {
    ClusterError::Kubeconfig {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The PEM of the client certificate and key a kubeconfig names, if it
/// names them as files (the case the agent can renew).
fn cert_files(kc: &Kubeconfig) -> Option<(PathBuf, PathBuf)> {
    let ctx = kc
        .current_context
        .as_deref()
        .and_then(|c| kc.contexts.iter().find(|x| x.name == c))
        .and_then(|c| c.context.as_ref())?;
    let user = ctx.user.as_deref()?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    Some((
        PathBuf::from(auth.client_certificate.clone()?),
        PathBuf::from(auth.client_key.clone()?),
    ))
}

/// The valid client certificate of the kubeconfig at `path` and its file,
/// if it names one in files that reads and has not expired.
fn valid_cert(path: &Path) -> Option<(ClientCert, PathBuf)> {
    let kc = Kubeconfig::read_from(path).ok()?;
    let (cert, key) = cert_files(&kc)?;
    let mut pem = std::fs::read(&cert).ok()?;
    if key != cert {
        pem.extend(std::fs::read(&key).ok()?);
    }
    let c = ClientCert::parse(&pem).ok()?;
    (c.not_after > Timestamp::now()).then_some((c, cert))
}

/// The node's credentials: the kubeconfig's, else by TLS bootstrap.
pub async fn load(files: &CredentialFiles, node: &str) -> Result<Credentials, ClusterError> {
    let kubeconfig = &files.kubeconfig;
    let mut cert = valid_cert(kubeconfig);
    if cert.is_none() {
        if let Some(boot) = &files.bootstrap {
            let bkc = Kubeconfig::read_from(boot).map_err(|e| bad(boot, e))?;
            let bclient = client_from(bkc.clone(), None)
                .await
                .map_err(|e| bad(boot, e))?;
            tracing::info!(node, bootstrap = %boot.display(), "no valid client certificate: TLS bootstrap");
            let pem = request_certificate(&KubeCsrApi(bclient), node)
                .await
                .map_err(|e| bad(boot, e))?;
            let link = store(&files.cert_dir, &pem).map_err(|e| bad(boot, e))?;
            write_kubeconfig(kubeconfig, &bkc, &link).map_err(|e| bad(kubeconfig, e))?;
            cert = valid_cert(kubeconfig);
        }
    }
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| bad(kubeconfig, e))?;
    // Only a certificate the agent keeps (its cert-dir's current link,
    // which the kubeconfig names) is renewed: another kubeconfig would
    // still name the old one after a restart.
    let rotating = match cert {
        Some((c, file)) if files.rotate && file == files.cert_dir.join(CURRENT) => {
            Some(Arc::new(CurrentCert::new(c)))
        }
        Some((_, file)) if files.rotate => {
            tracing::info!(cert = %file.display(), "client certificate not in --cert-dir: not rotated");
            None
        }
        _ => None,
    };
    let client = client_from(kc, rotating.clone())
        .await
        .map_err(|e| bad(kubeconfig, e))?;
    Ok(Credentials { client, rotating })
}

/// A client for `kc`; with `current`, one whose TLS handshakes present the
/// certificate `current` holds at that moment.
async fn client_from(
    kc: Kubeconfig,
    current: Option<Arc<CurrentCert>>,
) -> Result<kube::Client, String> {
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let Some(current) = current else {
        return kube::Client::try_from(config).map_err(|e| e.to_string());
    };
    use kube::client::ConfigExt;
    let mut tls = config.rustls_client_config().map_err(|e| e.to_string())?;
    let generation = current.generation.clone();
    tls.client_auth_cert_resolver = current;
    // A resumed TLS session keeps the identity of the handshake it resumes:
    // after a rotation the API server would still see the old (soon
    // expired) certificate. Connections are pooled, so full handshakes are
    // rare.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(super::fresh_conns::FreshConnector::new(
        https, generation,
    ));
    let service = tower::Layer::layer(&config.base_uri_layer(), hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// Renews the certificate `current` before it expires, with the node's own
/// client, forever (until its task is aborted); failures are retried with
/// backoff and logged once per cause.
pub async fn rotate(
    api: Arc<dyn CsrApi>,
    current: Arc<CurrentCert>,
    node: String,
    cert_dir: PathBuf,
) {
    let mut failing: Option<String> = None;
    let mut retry = Duration::from_secs(1);
    let mut just_renewed = false;
    loop {
        let fraction = 0.7 + rand::random::<f64>() * 0.2;
        let cert = current.get();
        let now = Timestamp::now().as_second();
        let mut wait = cert.renew_at(fraction).as_second() - now;
        if just_renewed && wait <= 0 {
            // A signer that backdates notBefore a lot can hand out a
            // certificate already past its renewal point: use half of what
            // is left of it rather than asking again at once.
            wait = ((cert.not_after.as_second() - now) / 2).max(1);
        }
        let at = Timestamp::from_second(now + wait.max(0)).unwrap_or(cert.not_after);
        if wait > 0 {
            tracing::info!(node, renew_at = %at, "client certificate rotation scheduled");
            tokio::time::sleep(Duration::from_secs(wait.unsigned_abs())).await;
        }
        let renewed = async {
            let pem = request_certificate(api.as_ref(), &node).await?;
            let cert = ClientCert::parse(&pem)?;
            store(&cert_dir, &pem)?;
            Ok::<_, String>(cert)
        }
        .await;
        match renewed {
            Ok(cert) => {
                tracing::info!(node, not_after = %cert.not_after, "client certificate rotated");
                current.set(cert);
                just_renewed = true;
                failing = None;
                retry = Duration::from_secs(1);
            }
            Err(e) => {
                just_renewed = false;
                if failing.as_deref() != Some(e.as_str()) {
                    tracing::warn!(node, error = %e, "client certificate rotation failed; retrying");
                    failing = Some(e);
                }
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(300));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
