//! `clusterTrustBundle` projections: the trust anchors of one
//! ClusterTrustBundle by name, or of every bundle of a signer whose labels
//! match a selector, as kubelet projects them: each certificate once, as
//! PEM. (kubelet shuffles them once per start; here they are in the order
//! of their DER bytes, which is as stable and needs no state.)

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::api_volumes::Lookup;
use super::ConvertError;

/// One ClusterTrustBundle as the projection reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustBundle {
    /// Its name.
    pub name: String,
    /// `spec.signerName` ("" for none).
    pub signer_name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// `spec.trustBundle`: PEM certificates.
    pub pem: String,
}

/// Whether `labels` match `selector` (matchLabels and matchExpressions,
/// as the API defines them).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let plain = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    plain
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let have = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => have.is_some_and(|v| values.contains(v)),
                "NotIn" => have.is_none_or(|v| !values.contains(v)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                // An operator the API would refuse matches nothing.
                _ => false,
            }
        })
}

/// The file of projection `p`, from `bundles` (all of the cluster's).
pub fn projection_file(
    p: &ClusterTrustBundleProjection,
    bundles: Lookup<Vec<TrustBundle>>,
    field: &str,
) -> Result<Vec<u8>, ConvertError> {
    let optional = p.optional.unwrap_or(false);
    let all = match bundles {
        Lookup::Found(b) => b,
        Lookup::NotFound => std::sync::Arc::new(Vec::new()),
        Lookup::Unknown(why) => return Err(ConvertError::Missing(why)),
    };
    let chosen: Vec<&TrustBundle> = match (&p.name, &p.signer_name) {
        (Some(name), None) => {
            let found: Vec<&TrustBundle> = all.iter().filter(|b| &b.name == name).collect();
            if found.is_empty() {
                if optional {
                    return Ok(Vec::new());
                }
                return Err(ConvertError::Missing(format!(
                    "while getting ClusterTrustBundle: clustertrustbundles.certificates.k8s.io {name:?} not found"
                )));
            }
            found
        }
        (None, Some(signer)) => {
            // No selector matches nothing; an empty one everything
            // (kubelet's reading).
            let found: Vec<&TrustBundle> = match &p.label_selector {
                None => Vec::new(),
                Some(sel) => all
                    .iter()
                    .filter(|b| &b.signer_name == signer && selector_matches(sel, &b.labels))
                    .collect(),
            };
            if found.is_empty() {
                if optional {
                    return Ok(Vec::new());
                }
                return Err(ConvertError::Missing(
                    "combination of signerName and labelSelector matched zero ClusterTrustBundles"
                        .to_string(),
                ));
            }
            found
        }
        _ => {
            return Err(ConvertError::invalid(
                field,
                "exactly one of name and signerName must be set",
            ))
        }
    };
    let mut anchors: BTreeSet<Vec<u8>> = BTreeSet::new();
    for b in chosen {
        for der in CertificateDer::pem_slice_iter(b.pem.as_bytes()) {
            let der = der.map_err(|e| {
                ConvertError::invalid(
                    field,
                    format!("ClusterTrustBundle {:?}: unreadable PEM: {e}", b.name),
                )
            })?;
            anchors.insert(der.as_ref().to_vec());
        }
    }
    Ok(anchors
        .iter()
        .flat_map(|der| pem_certificate(der))
        .collect())
}

/// `der` as one PEM CERTIFICATE block (64 characters a line).
fn pem_certificate(der: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out.into_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn cert(cn: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.self_signed(&key).unwrap().pem()
    }

    fn bundle(name: &str, signer: &str, labels: &[(&str, &str)], pem: &str) -> TrustBundle {
        TrustBundle {
            name: name.into(),
            signer_name: signer.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pem: pem.into(),
        }
    }

    fn projection(yaml: &str) -> ClusterTrustBundleProjection {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn selectors_should_match_as_the_api_defines_them() {
        let labels: BTreeMap<String, String> = [("env".to_string(), "prod".to_string())].into();
        let sel = |y: &str| -> LabelSelector { serde_yaml::from_str(y).unwrap() };
        assert!(selector_matches(&sel("{}"), &labels));
        assert!(selector_matches(&sel("matchLabels: {env: prod}"), &labels));
        assert!(!selector_matches(&sel("matchLabels: {env: dev}"), &labels));
        assert!(selector_matches(
            &sel("matchExpressions: [{key: env, operator: In, values: [prod, dev]}]"),
            &labels
        ));
        assert!(!selector_matches(
            &sel("matchExpressions: [{key: env, operator: NotIn, values: [prod]}]"),
            &labels
        ));
        assert!(selector_matches(
            &sel("matchExpressions: [{key: team, operator: DoesNotExist}]"),
            &labels
        ));
        assert!(!selector_matches(
            &sel("matchExpressions: [{key: team, operator: Exists}]"),
            &labels
        ));
    }

    #[test]
    fn a_projection_should_give_each_anchor_once_as_pem() {
        let (a, b) = (cert("a"), cert("b"));
        let bundles = Lookup::Found(Arc::new(vec![
            bundle(
                "one",
                "example.com/s",
                &[("env", "prod")],
                &format!("{a}{b}"),
            ),
            bundle("two", "example.com/s", &[("env", "prod")], &a),
            bundle("three", "example.com/s", &[("env", "dev")], &cert("c")),
            bundle("four", "other.com/s", &[("env", "prod")], &cert("d")),
        ]));
        let by_name = projection_file(
            &projection("{name: two, path: ca.pem}"),
            bundles.clone(),
            "f",
        )
        .unwrap();
        assert_eq!(CertificateDer::pem_slice_iter(&by_name).count(), 1);
        let by_signer = projection_file(
            &projection("{signerName: example.com/s, labelSelector: {matchLabels: {env: prod}}, path: ca.pem}"),
            bundles.clone(),
            "f",
        )
        .unwrap();
        // a and b once each; c (other labels) and d (other signer) not.
        let ders: Vec<_> = CertificateDer::pem_slice_iter(&by_signer)
            .map(|d| d.unwrap())
            .collect();
        assert_eq!(ders.len(), 2);
        let text = String::from_utf8(by_signer).unwrap();
        assert!(text.lines().all(|l| l.len() <= 64), "{text}");
        // No selector matches nothing.
        let err = projection_file(
            &projection("{signerName: example.com/s, path: ca.pem}"),
            bundles.clone(),
            "f",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "combination of signerName and labelSelector matched zero ClusterTrustBundles"
        );
        // Missing: refused unless optional, then an empty file.
        let err = projection_file(
            &projection("{name: nope, path: ca.pem}"),
            bundles.clone(),
            "f",
        )
        .unwrap_err();
        assert!(matches!(err, ConvertError::Missing(_)), "{err}");
        let empty = projection_file(
            &projection("{name: nope, path: ca.pem, optional: true}"),
            bundles,
            "f",
        )
        .unwrap();
        assert!(empty.is_empty());
        // Not listed yet: said so.
        let err = projection_file(
            &projection("{name: one, path: ca.pem}"),
            Lookup::Unknown("not yet listed".into()),
            "f",
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "not yet listed");
    }
}
