//! Decoder and encoder tests: the RFC's examples, then random blocks made
//! by a test encoder that uses every representation.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use super::*;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn fields(pairs: &[(&str, &str)]) -> Vec<Field> {
    pairs
        .iter()
        .map(|(n, v)| Field {
            name: Bytes::copy_from_slice(n.as_bytes()),
            value: Bytes::copy_from_slice(v.as_bytes()),
            sensitive: false,
        })
        .collect()
}

fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<Field>, HpackError> {
    let mut out = Vec::new();
    d.decode(block, 1 << 20, &mut out)?;
    Ok(out)
}

#[test]
fn decoder_should_decode_the_rfc_request_examples() {
    // RFC 7541 C.3 (raw) and C.4 (Huffman): three requests on one connection.
    for blocks in [
        [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ],
        [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ],
    ] {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        let base = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(
            decode_all(&mut d, &hex(blocks[0])).expect("1"),
            fields(&base)
        );
        let mut second = base.to_vec();
        second.push(("cache-control", "no-cache"));
        assert_eq!(
            decode_all(&mut d, &hex(blocks[1])).expect("2"),
            fields(&second)
        );
        assert_eq!(
            decode_all(&mut d, &hex(blocks[2])).expect("3"),
            fields(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ])
        );
        assert_eq!(d.table.len(), 3);
    }
}

#[test]
fn decoder_should_evict_as_the_rfc_response_examples_do() {
    // RFC 7541 C.5.1-C.5.2: a 256-byte table; the second response evicts
    // the first entry (":status 302").
    let mut d = Decoder::new(256);
    let first = decode_all(
        &mut d,
        &hex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
              2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
              6c65 2e63 6f6d",
        ),
    )
    .expect("first");
    let date = ("date", "Mon, 21 Oct 2013 20:13:21 GMT");
    let location = ("location", "https://www.example.com");
    assert_eq!(
        first,
        fields(&[
            (":status", "302"),
            ("cache-control", "private"),
            date,
            location
        ])
    );
    assert_eq!(d.table.len(), 4);
    let second = decode_all(&mut d, &hex("4803 3330 37c1 c0bf")).expect("second");
    assert_eq!(
        second,
        fields(&[
            (":status", "307"),
            ("cache-control", "private"),
            date,
            location
        ])
    );
    assert_eq!(d.table.len(), 4, "one entry in, one out");
}

#[test]
fn decoder_should_refuse_malformed_blocks() {
    let cases: &[(&[u8], HpackError)] = &[
        (&[0x80], HpackError::BadIndex(0)),
        (&[0xbe], HpackError::BadIndex(62)),
        (&[0x41], HpackError::Truncated),
        (&[0x41, 0x05, b'a'], HpackError::Truncated),
        (
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
            HpackError::IntegerTooLarge,
        ),
        (&[0x3f, 0xe2, 0x1f], HpackError::TableSize(4097, 4096)),
        (&[0x82, 0x20], HpackError::LateSizeUpdate),
        (&[0x40, 0x81, 0x00, 0x00], HpackError::Huffman),
    ];
    for (block, want) in cases {
        let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
        assert_eq!(decode_all(&mut d, block), Err(*want), "{block:02x?}");
    }
    // An indexed reference to a 4 KB entry, repeated: bounded by max_list.
    let mut d = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut block = BytesMut::new();
    block.put_u8(0x40);
    encode_string(b"x", &mut block);
    encode_string(&[b'y'; 4000], &mut block);
    block.extend_from_slice(&[0xbe; 1000]);
    let mut out = Vec::new();
    assert_eq!(
        d.decode(&block, 64 << 10, &mut out),
        Err(HpackError::TooLarge(64 << 10))
    );
}

/// How the test encoder writes one field.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Repr {
    /// Indexed if the pair is in a table, else literal with indexing.
    Indexed,
    Incremental,
    Without,
    Never,
}

/// A test encoder that mirrors a decoder's table to use every representation.
pub(crate) struct TestEncoder {
    table: table::Dynamic,
    mirror: Vec<(Vec<u8>, Vec<u8>)>,
    max: usize,
}

impl TestEncoder {
    pub(crate) fn new() -> Self {
        Self {
            table: table::Dynamic::new(DEFAULT_TABLE_SIZE),
            mirror: Vec::new(),
            max: DEFAULT_TABLE_SIZE,
        }
    }

    fn find(&self, name: &[u8], value: Option<&[u8]>) -> Option<usize> {
        let static_hit = table::STATIC.iter().position(|(n, v)| {
            n.as_bytes() == name && value.is_none_or(|value| v.as_bytes() == value)
        });
        if let Some(i) = static_hit {
            return Some(i + 1);
        }
        self.mirror
            .iter()
            .position(|(n, v)| n == name && value.is_none_or(|value| v == value))
            .map(|i| i + 62)
    }

    fn string(s: &[u8], huffman: bool, out: &mut BytesMut) {
        if huffman {
            let mut h = Vec::new();
            huffman::encode(s, &mut h);
            encode_integer(h.len(), 7, 0x80, out);
            out.extend_from_slice(&h);
        } else {
            encode_string(s, out);
        }
    }

    fn insert(&mut self, n: &[u8], v: &[u8]) {
        self.table
            .insert(Bytes::copy_from_slice(n), Bytes::copy_from_slice(v));
        self.mirror.insert(0, (n.to_vec(), v.to_vec()));
        // Keep the mirror in step with the table's evictions.
        let mut size = 0;
        let max = self.max;
        self.mirror.retain(|(n, v)| {
            size += n.len() + v.len() + 32;
            size <= max
        });
    }

    pub(crate) fn encode(
        &mut self,
        fields: &[(Vec<u8>, Vec<u8>, Repr, bool)],
        resize: Option<usize>,
        out: &mut BytesMut,
    ) {
        if let Some(size) = resize {
            encode_integer(size, 5, 0x20, out);
            self.max = size;
            self.table.set_max(size);
            let mut total = 0;
            self.mirror.retain(|(n, v)| {
                total += n.len() + v.len() + 32;
                total <= size
            });
        }
        for (n, v, repr, huff) in fields {
            match repr {
                Repr::Indexed => {
                    if let Some(i) = self.find(n, Some(v)) {
                        encode_integer(i, 7, 0x80, out);
                        continue;
                    }
                    self.literal(n, v, 6, 0x40, *huff, out);
                    self.insert(n, v);
                }
                Repr::Incremental => {
                    self.literal(n, v, 6, 0x40, *huff, out);
                    self.insert(n, v);
                }
                Repr::Without => self.literal(n, v, 4, 0x00, *huff, out),
                Repr::Never => self.literal(n, v, 4, 0x10, *huff, out),
            }
        }
    }

    fn literal(&self, n: &[u8], v: &[u8], prefix: u8, flags: u8, huff: bool, out: &mut BytesMut) {
        match self.find(n, None) {
            Some(i) => encode_integer(i, prefix, flags, out),
            None => {
                encode_integer(0, prefix, flags, out);
                Self::string(n, huff, out);
            }
        }
        Self::string(v, huff, out);
    }
}

pub(crate) fn field_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, Repr, bool)> {
    let name = prop_oneof![
        Just(b":authority".to_vec()),
        Just(b":path".to_vec()),
        Just(b"content-type".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..12),
    ];
    let value = prop_oneof![
        Just(b"localhost".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..40),
        proptest::collection::vec(any::<u8>(), 0..600),
    ];
    let repr = prop_oneof![
        Just(Repr::Indexed),
        Just(Repr::Incremental),
        Just(Repr::Without),
        Just(Repr::Never)
    ];
    (name, value, repr, any::<bool>())
}

proptest! {
    #[test]
    fn decoder_should_follow_an_encoder_through_many_blocks(
        blocks in proptest::collection::vec(
            (proptest::collection::vec(field_strategy(), 0..8),
             proptest::option::weighted(0.1, 0usize..=4096)),
            1..12,
        )
    ) {
        let mut enc = TestEncoder::new();
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        for (fs, resize) in &blocks {
            let mut block = BytesMut::new();
            enc.encode(fs, *resize, &mut block);
            let got = decode_all(&mut dec, &block).expect("decode");
            prop_assert_eq!(got.len(), fs.len());
            for (g, (n, v, repr, _)) in got.iter().zip(fs) {
                prop_assert_eq!(&g.name[..], &n[..]);
                prop_assert_eq!(&g.value[..], &v[..]);
                prop_assert_eq!(g.sensitive, matches!(repr, Repr::Never));
            }
        }
    }

    #[test]
    fn decoder_should_never_panic_on_arbitrary_input(
        blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..6)
    ) {
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        for b in &blocks {
            let _ = decode_all(&mut dec, b);
        }
    }
}
