use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use k8s_openapi::ByteString;

use super::*;
use crate::convert::test_support::{ctx, desired};

/// Objects held in memory; `unknown` names are not listed yet.
#[derive(Default)]
pub(crate) struct FakeObjects {
    pub config_maps: BTreeMap<String, ConfigMap>,
    pub secrets: BTreeMap<String, Secret>,
    pub tokens: BTreeMap<TokenKey, String>,
    pub unknown: Vec<String>,
    pub bundles: Vec<crate::convert::TrustBundle>,
}

impl ObjectView for FakeObjects {
    fn config_map(&self, _ns: &str, name: &str) -> Lookup<ConfigMap> {
        if self.unknown.iter().any(|u| u == name) {
            return Lookup::Unknown(format!("configmap {name:?} not yet listed"));
        }
        match self.config_maps.get(name) {
            Some(c) => Lookup::Found(Arc::new(c.clone())),
            None => Lookup::NotFound,
        }
    }
    fn secret(&self, _ns: &str, name: &str) -> Lookup<Secret> {
        match self.secrets.get(name) {
            Some(c) => Lookup::Found(Arc::new(c.clone())),
            None => Lookup::NotFound,
        }
    }
    fn token(&self, _uid: &str, key: &TokenKey) -> Option<String> {
        self.tokens.get(key).cloned()
    }
    fn trust_bundles(&self) -> Lookup<Vec<crate::convert::TrustBundle>> {
        Lookup::Found(Arc::new(self.bundles.clone()))
    }
}

pub(crate) fn objects() -> FakeObjects {
    let mut f = FakeObjects::default();
    f.config_maps.insert(
        "cfg".into(),
        ConfigMap {
            data: Some(BTreeMap::from([
                ("app.conf".into(), "port=80\n".into()),
                ("mode".into(), "fast".into()),
            ])),
            binary_data: Some(BTreeMap::from([("blob".into(), ByteString(vec![0, 1, 2]))])),
            ..Default::default()
        },
    );
    f.secrets.insert(
        "creds".into(),
        Secret {
            data: Some(BTreeMap::from([
                ("user".into(), ByteString(b"admin".to_vec())),
                ("pass".into(), ByteString(b"s3cret".to_vec())),
            ])),
            ..Default::default()
        },
    );
    f.tokens.insert(
        TokenKey {
            service_account: "runner".into(),
            audience: String::new(),
            expiration_seconds: 3607,
        },
        "tok-1".into(),
    );
    f
}

fn volume(pod: &DesiredPod, name: &str) -> Volume {
    pod.pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap()
        .clone()
}

fn files(p: &Payload) -> Vec<(String, String, u32)> {
    p.iter()
        .map(|(k, v)| {
            (
                k.display().to_string(),
                String::from_utf8_lossy(&v.data).into_owned(),
                v.mode,
            )
        })
        .collect()
}

const POD: &str = r#"
metadata: {name: web, namespace: prod}
spec:
  serviceAccountName: runner
  containers: [{name: app, image: x}]
  volumes:
  - {name: all, configMap: {name: cfg}}
  - name: some
    configMap:
      name: cfg
      defaultMode: 0o600
      items: [{key: mode, path: conf/mode, mode: 0o444}]
  - {name: absent, configMap: {name: nowhere, optional: true}}
  - {name: required, configMap: {name: nowhere}}
  - {name: badkey, configMap: {name: cfg, items: [{key: nokey, path: x}]}}
  - {name: okkey, configMap: {name: cfg, optional: true, items: [{key: nokey, path: x}]}}
  - {name: sec, secret: {secretName: creds, items: [{key: pass, path: password}]}}
  - {name: later, configMap: {name: later}}
  - name: api
    projected:
      defaultMode: 0o640
      sources:
      - serviceAccountToken: {path: token, expirationSeconds: 3607}
      - configMap: {name: cfg, items: [{key: mode, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
      - secret: {name: creds, items: [{key: user, path: user}]}
  - name: notoken
    projected:
      sources:
      - serviceAccountToken: {path: token, audience: vault}
"#;

#[test]
fn a_config_map_volume_should_show_every_key_or_the_items() {
    let pod = desired(POD);
    let objs = objects();
    let all = api_volume_payload(&pod, &volume(&pod, "all"), &objs).unwrap();
    assert_eq!(
        files(&all),
        [
            ("app.conf".into(), "port=80\n".into(), 0o644),
            ("blob".into(), "\u{0}\u{1}\u{2}".into(), 0o644),
            ("mode".into(), "fast".into(), 0o644),
        ]
    );
    let some = api_volume_payload(&pod, &volume(&pod, "some"), &objs).unwrap();
    assert_eq!(files(&some), [("conf/mode".into(), "fast".into(), 0o444)]);
}

#[test]
fn missing_objects_and_keys_should_say_so_unless_optional() {
    let pod = desired(POD);
    let mut objs = objects();
    let absent = api_volume_payload(&pod, &volume(&pod, "absent"), &objs).unwrap();
    assert!(absent.is_empty());
    let err = api_volume_payload(&pod, &volume(&pod, "required"), &objs).unwrap_err();
    assert!(
        matches!(&err, ConvertError::Missing(m) if m == "configmap \"nowhere\" not found"),
        "{err}"
    );
    let err = api_volume_payload(&pod, &volume(&pod, "badkey"), &objs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "configmap references non-existent config key: nokey"
    );
    let ok = api_volume_payload(&pod, &volume(&pod, "okkey"), &objs).unwrap();
    assert!(ok.is_empty());
    objs.unknown.push("later".into());
    let err = api_volume_payload(&pod, &volume(&pod, "later"), &objs).unwrap_err();
    assert!(
        matches!(&err, ConvertError::Missing(m) if m.contains("not yet listed")),
        "{err}"
    );
}

#[test]
fn a_secret_volume_should_show_its_items() {
    let pod = desired(POD);
    let sec = api_volume_payload(&pod, &volume(&pod, "sec"), &objects()).unwrap();
    assert_eq!(files(&sec), [("password".into(), "s3cret".into(), 0o644)]);
}

#[test]
fn a_projected_volume_should_merge_token_config_map_downward_api_and_secret() {
    let pod = desired(POD);
    let objs = objects();
    let api = api_volume_payload(&pod, &volume(&pod, "api"), &objs).unwrap();
    assert_eq!(
        files(&api),
        [
            ("ca.crt".into(), "fast".into(), 0o640),
            ("namespace".into(), "prod".into(), 0o640),
            ("token".into(), "tok-1".into(), 0o640),
            ("user".into(), "admin".into(), 0o640),
        ]
    );
    let err = api_volume_payload(&pod, &volume(&pod, "notoken"), &objs).unwrap_err();
    assert!(
        matches!(&err, ConvertError::Missing(m) if m.contains("runner")),
        "{err}"
    );
    assert_eq!(
        token_keys(&pod),
        [
            TokenKey {
                service_account: "runner".into(),
                audience: String::new(),
                expiration_seconds: 3607
            },
            TokenKey {
                service_account: "runner".into(),
                audience: "vault".into(),
                expiration_seconds: DEFAULT_TOKEN_SECONDS
            },
        ]
    );
}

#[test]
fn write_api_volume_should_write_atomically_and_update_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let pod = desired(POD);
    let objs = Arc::new(objects());
    let c = ConvertContext {
        pod_dir: tmp.path().join("pods/uid"),
        objects: Some(Objects(objs.clone())),
        ..ctx()
    };
    let dir = write_api_volume(&pod, &volume(&pod, "some"), &c).unwrap();
    assert!(dir.ends_with("volumes/kubernetes.io~configmap/some"));
    let file = dir.join("conf/mode");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "fast");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert!(std::fs::symlink_metadata(dir.join("..data"))
        .unwrap()
        .file_type()
        .is_symlink());
    // The object changes: the same path shows the new value.
    let mut changed = objects();
    changed
        .config_maps
        .get_mut("cfg")
        .unwrap()
        .data
        .as_mut()
        .unwrap()
        .insert("mode".into(), "slow".into());
    let c2 = ConvertContext {
        objects: Some(Objects(Arc::new(changed))),
        ..c.clone()
    };
    crate::convert::refresh_volumes(&pod, &c2).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "slow");
    // A volume whose object is missing is not made at all.
    let err = write_api_volume(&pod, &volume(&pod, "required"), &c).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("MountVolume.SetUp failed for volume \"required\" : configmap"),
        "{err}"
    );
    assert!(!tmp
        .path()
        .join("pods/uid/volumes/kubernetes.io~configmap/required")
        .exists());
    // Without an API server (a static pod's context) they are refused.
    let none = ConvertContext { objects: None, ..c };
    let err = write_api_volume(&pod, &volume(&pod, "all"), &none).unwrap_err();
    assert!(err.to_string().contains("need an API server"), "{err}");
}

#[test]
fn a_pod_s_fs_group_should_own_its_files_readable_by_the_group() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let pod = desired(&POD.replace(
        "  serviceAccountName: runner\n",
        "  serviceAccountName: runner\n  securityContext: {fsGroup: 4321}\n",
    ));
    let c = ConvertContext {
        pod_dir: tmp.path().join("pods/uid"),
        objects: Some(Objects(Arc::new(objects()))),
        ..ctx()
    };
    let dir = write_api_volume(&pod, &volume(&pod, "sec"), &c).unwrap();
    let file = std::fs::metadata(dir.join("password")).unwrap();
    assert_eq!(file.gid(), 4321);
    assert_eq!(file.permissions().mode() & 0o7777, 0o644 | 0o440);
    let data = std::fs::metadata(dir.join("..data")).unwrap();
    assert_eq!(data.gid(), 4321);
    assert_eq!(data.permissions().mode() & 0o2000, 0o2000, "setgid");
    // Written again unchanged: nothing to do.
    let again = crate::convert::refresh_volumes(&pod, &c).unwrap();
    assert!(again > 0);
}
