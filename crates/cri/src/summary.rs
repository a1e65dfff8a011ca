//! A lean decoding of ListContainersResponse: each container's id, sandbox
//! id, state, creation time and a few chosen labels, nothing else.
//!
//! A relist of 1000 pods receives ~5000 containers (4 MB). Decoded in full,
//! every container costs some thirty heap allocations (its metadata, image
//! strings, and two hash maps of labels and annotations); that decode is
//! most of a relist's CPU. A relist needs only what tells it which pod a
//! container belongs to and whether its state changed, so this decoder
//! walks the protobuf wire format itself, skips every other field without
//! copying it, and keeps only the labels asked for.

/// What a relist needs of one listed container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSummary {
    /// The container's id.
    pub id: String,
    /// The id of its pod sandbox.
    pub pod_sandbox_id: String,
    /// `runtime.v1.ContainerState` as its number.
    pub state: i32,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// The labels whose keys were asked for (in wire order).
    pub labels: Vec<(String, String)>,
}

impl ContainerSummary {
    /// The value of label `key`, when it was kept.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The wire format was not a ListContainersResponse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed ListContainersResponse: {0}")]
pub struct DecodeError(&'static str);

// Field numbers of runtime.v1.Container (api.proto).
const RESPONSE_CONTAINERS: u32 = 1;
const CONTAINER_ID: u32 = 1;
const CONTAINER_POD_SANDBOX_ID: u32 = 2;
const CONTAINER_STATE: u32 = 6;
const CONTAINER_CREATED_AT: u32 = 7;
const CONTAINER_LABELS: u32 = 8;
// A map entry is a message of key = 1, value = 2.
const ENTRY_KEY: u32 = 1;
const ENTRY_VALUE: u32 = 2;

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// A cursor over protobuf bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or(DecodeError("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type; `None` at the end.
    fn key(&mut self) -> Result<Option<(u32, u8)>, DecodeError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let k = self.varint()?;
        let field = u32::try_from(k >> 3).map_err(|_| DecodeError("field number too large"))?;
        if field == 0 {
            return Err(DecodeError("field number 0"));
        }
        Ok(Some((field, (k & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError("length past the end"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(self.varint()?).map_err(|_| DecodeError("length too large"))?;
        self.take(n)
    }

    fn string(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| DecodeError("string is not UTF-8"))
    }

    fn skip(&mut self, wire: u8) -> Result<(), DecodeError> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.bytes().map(drop),
            FIXED32 => self.take(4).map(drop),
            _ => Err(DecodeError("unsupported wire type")),
        }
    }
}

/// Checks a field's wire type.
fn expect(wire: u8, want: u8) -> Result<(), DecodeError> {
    if wire == want {
        Ok(())
    } else {
        Err(DecodeError("field has the wrong wire type"))
    }
}

/// Decodes a ListContainersResponse, keeping of each container's labels
/// only those whose key is in `keep`.
pub fn decode_container_summaries(
    buf: &[u8],
    keep: &[&str],
) -> Result<Vec<ContainerSummary>, DecodeError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while let Some((field, wire)) = r.key()? {
        if field == RESPONSE_CONTAINERS {
            expect(wire, LEN)?;
            out.push(container(r.bytes()?, keep)?);
        } else {
            r.skip(wire)?;
        }
    }
    Ok(out)
}

fn container(buf: &[u8], keep: &[&str]) -> Result<ContainerSummary, DecodeError> {
    let mut r = Reader { buf };
    let mut c = ContainerSummary::default();
    while let Some((field, wire)) = r.key()? {
        match field {
            CONTAINER_ID => {
                expect(wire, LEN)?;
                c.id = r.string()?.to_string();
            }
            CONTAINER_POD_SANDBOX_ID => {
                expect(wire, LEN)?;
                c.pod_sandbox_id = r.string()?.to_string();
            }
            // proto3 enums and int64 are varints; negative values take ten
            // bytes and wrap back through the cast.
            CONTAINER_STATE => {
                expect(wire, VARINT)?;
                c.state = r.varint()? as i32;
            }
            CONTAINER_CREATED_AT => {
                expect(wire, VARINT)?;
                c.created_at = r.varint()? as i64;
            }
            CONTAINER_LABELS => {
                expect(wire, LEN)?;
                if let Some(kv) = label(r.bytes()?, keep)? {
                    // A repeated key replaces the earlier entry, as in a map.
                    c.labels.retain(|(k, _)| *k != kv.0);
                    c.labels.push(kv);
                }
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(c)
}

/// One map entry, when its key is kept (only then is anything copied).
fn label(buf: &[u8], keep: &[&str]) -> Result<Option<(String, String)>, DecodeError> {
    let mut r = Reader { buf };
    let (mut key, mut value) = ("", "");
    while let Some((field, wire)) = r.key()? {
        match field {
            ENTRY_KEY => {
                expect(wire, LEN)?;
                key = r.string()?;
            }
            ENTRY_VALUE => {
                expect(wire, LEN)?;
                value = r.string()?;
            }
            _ => r.skip(wire)?,
        }
    }
    Ok(keep
        .contains(&key)
        .then(|| (key.to_string(), value.to_string())))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use prost::Message;

    use super::*;
    use crate::api;

    fn container(i: usize, state: api::ContainerState) -> api::Container {
        api::Container {
            id: format!("c{i}"),
            pod_sandbox_id: format!("s{i}"),
            metadata: Some(api::ContainerMetadata {
                name: format!("n{i}"),
                attempt: 3,
            }),
            image: Some(api::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            image_ref: "sha256:x".into(),
            image_id: "sha256:y".into(),
            state: state as i32,
            created_at: 1_700_000_000_000_000_000 + i as i64,
            labels: HashMap::from([
                ("uid".to_string(), format!("u{i}")),
                ("other".to_string(), "x".to_string()),
                ("name".to_string(), format!("p{i}")),
            ]),
            annotations: HashMap::from([("uid".to_string(), "not a label".to_string())]),
        }
    }

    #[test]
    fn summaries_should_match_the_full_decode_and_keep_only_asked_labels() {
        let states = [
            api::ContainerState::ContainerCreated,
            api::ContainerState::ContainerRunning,
            api::ContainerState::ContainerExited,
            api::ContainerState::ContainerUnknown,
        ];
        let full = api::ListContainersResponse {
            containers: (0..8).map(|i| container(i, states[i % 4])).collect(),
        };
        let got =
            decode_container_summaries(&full.encode_to_vec(), &["uid", "name"]).expect("decode");
        assert_eq!(got.len(), 8);
        for (c, s) in full.containers.iter().zip(&got) {
            assert_eq!(s.id, c.id);
            assert_eq!(s.pod_sandbox_id, c.pod_sandbox_id);
            assert_eq!(s.state, c.state);
            assert_eq!(s.created_at, c.created_at);
            let mut labels = s.labels.clone();
            labels.sort();
            let mut want: Vec<(String, String)> = c
                .labels
                .iter()
                .filter(|(k, _)| *k == "uid" || *k == "name")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            want.sort();
            assert_eq!(labels, want);
            assert_eq!(s.label("uid"), c.labels.get("uid").map(String::as_str));
            assert_eq!(s.label("other"), None);
        }
    }

    #[test]
    fn empty_and_default_fields_should_decode_to_defaults() {
        let full = api::ListContainersResponse {
            containers: vec![api::Container::default()],
        };
        let got = decode_container_summaries(&full.encode_to_vec(), &["uid"]).expect("decode");
        assert_eq!(got, vec![ContainerSummary::default()]);
        assert_eq!(decode_container_summaries(&[], &[]), Ok(vec![]));
    }

    #[test]
    fn negative_numbers_should_round_trip() {
        let mut c = container(1, api::ContainerState::ContainerRunning);
        c.created_at = -5;
        c.state = -1;
        let full = api::ListContainersResponse {
            containers: vec![c],
        };
        let got = decode_container_summaries(&full.encode_to_vec(), &[]).expect("decode");
        assert_eq!((got[0].created_at, got[0].state), (-5, -1));
    }

    #[test]
    fn truncated_or_malformed_input_should_be_an_error_not_a_panic() {
        let full = api::ListContainersResponse {
            containers: (0..3)
                .map(|i| container(i, api::ContainerState::ContainerRunning))
                .collect(),
        }
        .encode_to_vec();
        for cut in 1..full.len() {
            let whole = api::ListContainersResponse::decode(&full[..cut]).is_ok();
            let lean = decode_container_summaries(&full[..cut], &["uid"]).is_ok();
            // The lean decoder never accepts what prost refuses (it may
            // refuse more: it checks the fields it reads only).
            assert!(whole || !lean, "cut at {cut}");
        }
        // Field 0, a bad wire type, an overlong varint.
        assert!(decode_container_summaries(&[0x02, 0x00], &[]).is_err());
        assert!(decode_container_summaries(&[0x0b], &[]).is_err());
        assert!(decode_container_summaries(
            &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            &[]
        )
        .is_err());
        // The id field as a varint.
        assert!(decode_container_summaries(&[0x0a, 0x02, 0x08, 0x01], &[]).is_err());
    }
}
