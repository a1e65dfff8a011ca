//! JSON form of the CRI's `bytes` fields that once were strings.
//!
//! `KeyValue.value` (an environment variable's value) became `bytes` in
//! cri-api v0.37. Records written before hold it as a JSON string, and a
//! string reads best in `petrel ctl -o json` too: a value that is UTF-8 is
//! written as a string, any other as an array of bytes, and both read back.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Serializer;

/// Writes `v` as a string when it is UTF-8, else as an array of bytes.
pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(v) {
        Ok(text) => s.serialize_str(text),
        Err(_) => s.collect_seq(v),
    }
}

/// Reads a string or an array of bytes.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Bytes;
    impl<'de> Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or an array of bytes")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
            Ok(v.as_bytes().to_vec())
        }
        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Bytes)
}

#[cfg(test)]
mod tests {
    use crate::api::KeyValue;

    #[test]
    fn key_value_should_read_a_record_written_when_the_value_was_a_string(
    ) -> Result<(), serde_json::Error> {
        let kv: KeyValue = serde_json::from_str(r#"{"key":"A","value":"b c"}"#)?;
        assert_eq!(kv.value, b"b c");
        Ok(())
    }

    #[test]
    fn key_value_should_round_trip_utf8_as_a_string_and_other_bytes_as_an_array(
    ) -> Result<(), serde_json::Error> {
        let text = KeyValue {
            key: "A".into(),
            value: b"x".to_vec(),
        };
        assert_eq!(serde_json::to_string(&text)?, r#"{"key":"A","value":"x"}"#);
        let raw = KeyValue {
            key: "B".into(),
            value: vec![0xff, 0],
        };
        let json = serde_json::to_string(&raw)?;
        assert_eq!(json, r#"{"key":"B","value":[255,0]}"#);
        assert_eq!(serde_json::from_str::<KeyValue>(&json)?, raw);
        Ok(())
    }
}
