//! The kubelet API's webhook answers from the API server (kubelet's
//! `authentication.webhook` and `authorization.mode: Webhook`): a
//! TokenReview for a bearer token, a SubjectAccessReview for a request,
//! both made with the node's credentials.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;

use crate::server::webhook::{Attributes, Identity, Reviewer};

/// The reviews, asked with the node's client.
pub struct KubeReviewer {
    /// The node's client.
    pub client: kube::Client,
}

#[async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<Option<Identity>, String> {
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let done = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let Some(status) = done.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let Some(user) = status.user.filter(|u| u.username.is_some()) else {
            return Ok(None);
        };
        let mut extra: Vec<(String, Vec<String>)> =
            user.extra.unwrap_or_default().into_iter().collect();
        extra.sort();
        Ok(Some(Identity {
            user: user.username.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            extra,
        }))
    }

    async fn allowed(&self, who: &Identity, node: &str, what: Attributes) -> Result<bool, String> {
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.user.clone()),
                groups: Some(who.groups.clone()),
                uid: (!who.uid.is_empty()).then(|| who.uid.clone()),
                extra: (!who.extra.is_empty())
                    .then(|| who.extra.iter().cloned().collect::<BTreeMap<_, _>>()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(what.verb.to_string()),
                    version: Some("v1".to_string()),
                    resource: Some("nodes".to_string()),
                    subresource: Some(what.subresource.to_string()),
                    name: Some(node.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let done = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        Ok(done.status.is_some_and(|s| s.allowed))
    }
}
