//! Terminal size messages: JSON objects `{"Width":W,"Height":H}` one after
//! another on the resize stream (Go's `TerminalSize` has no JSON tags, so
//! the field names are capitalised).

use serde::{Deserialize, Serialize};

use crate::TermSize;

#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    #[serde(rename = "Width")]
    width: u16,
    #[serde(rename = "Height")]
    height: u16,
}

/// Encodes one resize message (with the newline Go's encoder adds).
pub(crate) fn encode(size: TermSize) -> Vec<u8> {
    let mut v = serde_json::to_vec(&Wire {
        width: size.width,
        height: size.height,
    })
    .unwrap_or_default();
    v.push(b'\n');
    v
}

/// Splits a byte stream into resize messages; a message may arrive in
/// pieces, several may arrive in one piece.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    pending: Vec<u8>,
}

/// The resize stream held something that is not a resize message.
#[derive(Debug, thiserror::Error)]
#[error("invalid resize message: {0}")]
pub(crate) struct InvalidResize(String);

impl Decoder {
    /// Feeds bytes; returns the complete messages they finish.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Vec<TermSize>, InvalidResize> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut consumed = 0;
        {
            let mut iter = serde_json::Deserializer::from_slice(&self.pending).into_iter::<Wire>();
            loop {
                match iter.next() {
                    Some(Ok(w)) => {
                        consumed = iter.byte_offset();
                        out.push(TermSize {
                            width: w.width,
                            height: w.height,
                        });
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => return Err(InvalidResize(e.to_string())),
                    None => {
                        consumed = self.pending.len();
                        break;
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_joined_messages() {
        let mut d = Decoder::default();
        let sz = |width, height| TermSize { width, height };
        assert!(d.push(br#"{"Width":80,"#).is_ok_and(|v| v.is_empty()));
        assert_eq!(
            d.push(b"\"Height\":24}\n{\"Width\":100,\"Height\":40}\n{")
                .ok(),
            Some(vec![sz(80, 24), sz(100, 40)])
        );
        assert_eq!(
            d.push(b"\"Height\":1,\"Width\":2}").ok(),
            Some(vec![sz(2, 1)])
        );
        assert!(d.push(br#"{"Width":"wide","Height":1}"#).is_err());
        assert_eq!(encode(sz(3, 4)), b"{\"Width\":3,\"Height\":4}\n".to_vec());
    }
}
