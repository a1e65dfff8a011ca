use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::*;

use crate::der::TEST_CERT as CERT;

#[test]
fn a_certificates_subject_should_name_the_user_and_its_groups() {
    let der = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
    let who = identity_of_certificate(der.as_ref()).unwrap();
    assert_eq!(who.user, "system:node:n1");
    assert_eq!(who.groups, ["system:nodes", "extra group"]);
}

#[test]
fn garbage_should_name_no_one() {
    assert!(identity_of_certificate(&[]).is_none());
    assert!(identity_of_certificate(&[0x30, 0x82, 0xff, 0xff, 1, 2]).is_none());
    let der = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
    let cut = &der.as_ref()[..der.as_ref().len() / 2];
    assert!(identity_of_certificate(cut).is_none());
}

#[test]
fn paths_should_map_to_kubelets_subresources_and_verbs() {
    let a = |m: Method, p: &str| {
        let x = attributes(&m, p);
        (x.verb, x.subresource)
    };
    assert_eq!(a(Method::GET, "/stats/summary"), ("get", "stats"));
    assert_eq!(a(Method::GET, "/metrics/resource"), ("get", "metrics"));
    assert_eq!(a(Method::GET, "/metrics"), ("get", "metrics"));
    assert_eq!(a(Method::GET, "/logs/"), ("get", "log"));
    assert_eq!(a(Method::GET, "/containerLogs/ns/p/c"), ("get", "proxy"));
    assert_eq!(a(Method::GET, "/pods"), ("get", "proxy"));
    // A WebSocket exec is a GET, and still runs a command.
    assert_eq!(a(Method::GET, "/exec/ns/p/c"), ("create", "proxy"));
    assert_eq!(a(Method::POST, "/portForward/ns/p"), ("create", "proxy"));
    assert_eq!(a(Method::GET, "/statsx"), ("get", "proxy"));
}

#[derive(Default)]
struct Fake {
    tokens: HashMap<String, Identity>,
    allow: Vec<(String, &'static str, &'static str)>,
    calls: Mutex<Vec<String>>,
    down: bool,
}

#[async_trait]
impl Reviewer for Fake {
    async fn review_token(&self, token: &str) -> Result<Option<Identity>, String> {
        lock(&self.calls).push(format!("token {token}"));
        if self.down {
            return Err("connection refused".into());
        }
        Ok(self.tokens.get(token).cloned())
    }
    async fn allowed(&self, who: &Identity, node: &str, what: Attributes) -> Result<bool, String> {
        lock(&self.calls).push(format!(
            "sar {} {node} {} {}",
            who.user, what.verb, what.subresource
        ));
        if self.down {
            return Err("connection refused".into());
        }
        Ok(self
            .allow
            .iter()
            .any(|(u, v, s)| *u == who.user && *v == what.verb && *s == what.subresource))
    }
}

fn user(name: &str) -> Identity {
    Identity {
        user: name.into(),
        ..Identity::default()
    }
}

const EXEC: Attributes = Attributes {
    verb: "create",
    subresource: "proxy",
};

#[tokio::test]
async fn a_token_should_be_reviewed_and_its_user_authorized_once_per_ttl() {
    let fake = Arc::new(Fake {
        tokens: HashMap::from([("t1".to_string(), user("alice"))]),
        allow: vec![("alice".into(), "create", "proxy")],
        ..Fake::default()
    });
    let w = Webhook::new(fake.clone(), "n1");
    let who = w.check(Some("t1"), None, EXEC).await.unwrap();
    assert_eq!(who.user, "alice");
    w.check(Some("t1"), None, EXEC).await.unwrap();
    assert_eq!(
        *lock(&fake.calls),
        ["token t1", "sar alice n1 create proxy"]
    );
}

#[tokio::test]
async fn an_unknown_token_or_no_credentials_should_be_unauthenticated() {
    let w = Webhook::new(Arc::new(Fake::default()), "n1");
    assert_eq!(
        w.check(Some("nope"), None, EXEC).await,
        Err(Refusal::Unauthenticated)
    );
    assert_eq!(
        w.check(None, None, EXEC).await,
        Err(Refusal::Unauthenticated)
    );
}

#[tokio::test]
async fn another_nodes_certificate_should_be_forbidden_with_kubelets_message() {
    let w = Webhook::new(Arc::new(Fake::default()), "n1");
    let other = Identity {
        user: "system:node:n2".into(),
        groups: vec!["system:nodes".into()],
        ..Identity::default()
    };
    assert_eq!(
        w.check(None, Some(&other), EXEC).await,
        Err(Refusal::Forbidden(
            "Forbidden (user=system:node:n2, verb=create, resource=nodes, subresource=proxy)"
                .into()
        ))
    );
}

#[tokio::test]
async fn an_api_server_that_cannot_be_asked_should_refuse_for_now_and_cache_nothing() {
    let w = Webhook::new(
        Arc::new(Fake {
            down: true,
            ..Fake::default()
        }),
        "n1",
    );
    assert!(matches!(
        w.check(None, Some(&user("admin")), EXEC).await,
        Err(Refusal::Unavailable(_))
    ));
    assert!(lock(&w.decisions).is_empty());
}
