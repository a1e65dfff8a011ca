//! HPACK's Huffman code (RFC 7541, Appendix B).
//!
//! The code is canonical: codes of one length are consecutive and follow
//! the order of their symbols, and each length starts where the previous
//! one ended, shifted left. So the table is fully given by the length of
//! each symbol's code, written below as groups; the codes themselves are
//! computed at compile time. (The groups give a complete code: the Kraft
//! sum is exactly 1 and EOS, the last symbol, is thirty 1 bits; tests check
//! both and the RFC's own examples.)

use super::HpackError;

/// The symbols (bytes, and 256 = EOS) whose code has each length.
const GROUPS: &[(u8, &[u16])] = &[
    (5, &bytes(*b"012aceiost")),
    (6, &bytes(*b" %-./3456789=A_bdfghlmnpru")),
    (7, &bytes(*b":BCDEFGHIJKLMNOPQRSTUVWYjkqvwxyz")),
    (8, &bytes(*b"&*,;XZ")),
    (10, &bytes(*b"!\"()?")),
    (11, &bytes(*b"'+|")),
    (12, &bytes(*b"#>")),
    (13, &bytes(*b"\0$@[]~")),
    (14, &bytes(*b"^}")),
    (15, &bytes(*b"<`{")),
    (19, &[92, 195, 208]),
    (20, &[128, 130, 131, 162, 184, 194, 224, 226]),
    (
        21,
        &[
            153, 161, 167, 172, 176, 177, 179, 209, 216, 217, 227, 229, 230,
        ],
    ),
    (
        22,
        &[
            129, 132, 133, 134, 136, 146, 154, 156, 160, 163, 164, 169, 170, 173, 178, 181, 185,
            186, 187, 189, 190, 196, 198, 228, 232, 233,
        ],
    ),
    (
        23,
        &[
            1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157, 158, 165, 166,
            168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239,
        ],
    ),
    (
        24,
        &[9, 142, 144, 145, 148, 159, 171, 206, 215, 225, 236, 237],
    ),
    (25, &[199, 207, 234, 235]),
    (
        26,
        &[
            192, 193, 200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255,
        ],
    ),
    (
        27,
        &[
            203, 204, 211, 212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252,
            253, 254,
        ],
    ),
    (
        28,
        &[
            2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 127, 220, 249,
        ],
    ),
    (30, &[10, 13, 22, 256]),
];

/// The end-of-string symbol: never part of a string, its prefix pads one.
const EOS: u16 = 256;
/// The longest code.
const MAX_LEN: usize = 30;

const fn bytes<const N: usize>(b: [u8; N]) -> [u16; N] {
    let mut out = [0u16; N];
    let mut i = 0;
    while i < N {
        out[i] = b[i] as u16;
        i += 1;
    }
    out
}

/// The canonical code in the two shapes its users need.
struct Code {
    /// Code length of each symbol.
    len: [u8; 257],
    /// The code of each symbol, right-aligned.
    code: [u32; 257],
    /// The first code of each length.
    first: [u32; MAX_LEN + 1],
    /// How many codes each length has.
    count: [u32; MAX_LEN + 1],
    /// Where each length's symbols start in `symbols`.
    offset: [u32; MAX_LEN + 1],
    /// The symbols ordered by (code length, symbol).
    symbols: [u16; 257],
}

const CODE: Code = build();

const fn build() -> Code {
    let mut len = [0u8; 257];
    let mut g = 0;
    while g < GROUPS.len() {
        let (l, syms) = GROUPS[g];
        let mut i = 0;
        while i < syms.len() {
            len[syms[i] as usize] = l;
            i += 1;
        }
        g += 1;
    }
    let mut c = Code {
        len,
        code: [0; 257],
        first: [0; MAX_LEN + 1],
        count: [0; MAX_LEN + 1],
        offset: [0; MAX_LEN + 1],
        symbols: [0; 257],
    };
    let mut next = 0u32;
    let mut placed = 0u32;
    let mut l = 1;
    while l <= MAX_LEN {
        next <<= 1;
        c.first[l] = next;
        c.offset[l] = placed;
        let mut s = 0;
        while s < 257 {
            if c.len[s] as usize == l {
                c.code[s] = next;
                c.symbols[placed as usize] = s as u16;
                next += 1;
                placed += 1;
                c.count[l] += 1;
            }
            s += 1;
        }
        l += 1;
    }
    c
}

/// Decodes a Huffman-coded string, appending to `out`.
///
/// Errors on EOS inside the string, on padding longer than 7 bits and on
/// padding that is not the start of EOS (all ones), as RFC 7541 5.2 asks.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            let index = code.wrapping_sub(CODE.first[len]);
            if index < CODE.count[len] {
                let sym = CODE.symbols[(CODE.offset[len] + index) as usize];
                if sym == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(sym as u8);
                code = 0;
                len = 0;
            } else if len == MAX_LEN {
                // Unreachable with a complete code; kept so that a bad table
                // cannot index past the arrays.
                return Err(HpackError::Huffman);
            }
        }
    }
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(())
}

/// The length of `input` Huffman-coded, in bytes.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input.iter().map(|&b| CODE.len[b as usize] as usize).sum();
    bits.div_ceil(8)
}

/// Huffman-codes `input`, appending to `out` (padded with EOS's first bits).
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc = 0u64;
    let mut bits = 0u32;
    for &b in input {
        let l = u32::from(CODE.len[b as usize]);
        acc = (acc << l) | u64::from(CODE.code[b as usize]);
        bits += l;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
        acc &= (1u64 << bits) - 1;
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1u64 << pad) - 1)) as u8);
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn code_should_be_complete_with_eos_all_ones() {
        // Kraft: the sum of 2^-len over all symbols is exactly 1.
        let sum: u64 = CODE
            .len
            .iter()
            .map(|&l| 1u64 << (MAX_LEN - l as usize))
            .sum();
        assert_eq!(sum, 1u64 << MAX_LEN);
        assert!(CODE.len.iter().all(|&l| l >= 5));
        assert_eq!(CODE.len[EOS as usize], 30);
        assert_eq!(CODE.code[EOS as usize], (1 << 30) - 1);
    }

    #[test]
    fn huffman_should_decode_the_rfc_examples() {
        // RFC 7541 C.4.1-C.4.3 and C.6.1.
        let cases: &[(&str, &str)] = &[
            ("f1e3c2e5f23a6ba0ab90f4ff", "www.example.com"),
            ("a8eb10649cbf", "no-cache"),
            ("25a849e95ba97d7f", "custom-key"),
            ("25a849e95bb8e8b4bf", "custom-value"),
            ("6402", "302"),
            ("aec3771a4b", "private"),
            (
                "d07abe941054d444a8200595040b8166e082a62d1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29ad171863c78f0b97c8e9ae82ae43d3",
                "https://www.example.com",
            ),
        ];
        for (hex, text) in cases {
            let raw: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            let mut out = Vec::new();
            decode(&raw, &mut out).expect(text);
            assert_eq!(out, text.as_bytes());
            let mut enc = Vec::new();
            encode(text.as_bytes(), &mut enc);
            assert_eq!(enc, raw, "{text}");
            assert_eq!(encoded_len(text.as_bytes()), raw.len());
        }
    }

    #[test]
    fn huffman_should_round_trip_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        let mut out = Vec::new();
        decode(&enc, &mut out).expect("decode");
        assert_eq!(out, all);
    }

    #[test]
    fn huffman_should_refuse_bad_padding_and_eos() {
        let mut out = Vec::new();
        // 'a' (00011) padded with zeros instead of ones.
        assert_eq!(decode(&[0b0001_1000], &mut out), Err(HpackError::Huffman));
        // A whole byte of padding after a byte of codes ('&' is 8 bits).
        let mut amp = Vec::new();
        encode(b"&", &mut amp);
        assert_eq!(amp.len(), 1);
        amp.push(0xff);
        assert_eq!(decode(&amp, &mut out), Err(HpackError::Huffman));
        // EOS itself (30 ones) inside the string.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(HpackError::Huffman)
        );
        // Eight bits of padding.
        assert_eq!(decode(&[0xff], &mut out), Err(HpackError::Huffman));
        out.clear();
        decode(&[], &mut out).expect("empty");
        assert!(out.is_empty());
    }
}
