//! kubeconfig files: one cluster, one user authenticated by a client
//! certificate, one context, all by file path.

use std::path::{Path, PathBuf};

use crate::KitError;

/// What a kubeconfig says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubeconfig {
    /// The API server, `https://127.0.0.1:<port>`.
    pub server: String,
    /// The CA that signed the API server's certificate.
    pub ca: PathBuf,
    /// The user's client certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The user's name in the file (only a label: the certificate's CN is
    /// who the API server sees).
    pub user: String,
}

impl Kubeconfig {
    /// The file's text (YAML; strings quoted as JSON, which YAML reads).
    pub fn render(&self) -> String {
        let q = |s: &str| serde_json::Value::from(s).to_string();
        let p = |p: &Path| q(&p.display().to_string());
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: petrel\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n\
             - name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n\
             contexts:\n\
             - name: petrel\n  context:\n    cluster: petrel\n    user: {user}\n    namespace: default\n\
             current-context: petrel\n",
            server = q(&self.server),
            ca = p(&self.ca),
            user = q(&self.user),
            cert = p(&self.cert),
            key = p(&self.key),
        )
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: &Path) -> Result<(), KitError> {
        std::fs::write(path, self.render()).map_err(|e| KitError::io("write", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_should_name_server_ca_and_client_credentials() {
        let k = Kubeconfig {
            server: "https://127.0.0.1:6443".into(),
            ca: "/tmp/x/ca.crt".into(),
            cert: "/tmp/x/admin.crt".into(),
            key: "/tmp/x/admin.key".into(),
            user: "admin".into(),
        };
        let text = k.render();
        for want in [
            "server: \"https://127.0.0.1:6443\"",
            "certificate-authority: \"/tmp/x/ca.crt\"",
            "client-certificate: \"/tmp/x/admin.crt\"",
            "client-key: \"/tmp/x/admin.key\"",
            "- name: \"admin\"",
            "current-context: petrel",
        ] {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
    }
}
