//! The PodSet resource (`bench.petrel.dev/v1`, its CRD in
//! tools/peers/controller-runtime/crd.yaml): `spec{replicas, template}`,
//! `status{replicas, observedGeneration}`.
//!
//! `kube::Resource` is implemented by hand rather than with kube's
//! `CustomResource` derive: the derive needs kube's `derive` feature
//! (kube-derive and schemars, built for this one type) and would generate a
//! CRD schema we do not use — the CRD is the reference's, fixed in crd.yaml.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "bench.petrel.dev";
/// The API version.
pub const VERSION: &str = "v1";
/// The kind.
pub const KIND: &str = "PodSet";
/// The label that ties a Pod to its PodSet by name (ownership is by UID).
pub const POD_LABEL: &str = "bench.petrel.dev/podset";
/// The annotation a client stamps a user change with (Unix ns).
pub const CHANGED_AT: &str = "bench.petrel.dev/changed-at";

/// What the user asks for: that many Pods from the template.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodSetSpec {
    /// How many Pods.
    pub replicas: i32,
    /// What each Pod looks like.
    pub template: PodTemplateSpec,
}

/// What the controller observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetStatus {
    /// The replicas the controller last made the Pods match.
    #[serde(default)]
    pub replicas: i32,
    /// The generation it did that for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observed_generation: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A PodSet: keeps `spec.replicas` Pods from `spec.template`, owned by it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// `bench.petrel.dev/v1` (the API server sends it; we send it back).
    #[serde(default)]
    pub api_version: String,
    /// `PodSet`.
    #[serde(default)]
    pub kind: String,
    /// Name, namespace, UID, generation, annotations...
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: PodSetSpec,
    /// The observed state.
    #[serde(default)]
    pub status: PodSetStatus,
}

impl kube::Resource for PodSet {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "podsets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podset_should_read_the_api_servers_json_and_address_its_plural() {
        let json = serde_json::json!({
            "apiVersion": "bench.petrel.dev/v1", "kind": "PodSet",
            "metadata": {"name": "web", "namespace": "ns", "generation": 2},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"replicas": 1, "observedGeneration": 1}
        });
        let ps: PodSet = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(ps.spec.replicas, 3);
        assert_eq!(ps.status.observed_generation, 1);
        assert_eq!(
            <PodSet as kube::Resource>::url_path(&(), Some("ns")),
            "/apis/bench.petrel.dev/v1/namespaces/ns/podsets"
        );
    }
}
