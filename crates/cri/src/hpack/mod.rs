//! HPACK (RFC 7541): header block decoding, and encoding with literals only.
//!
//! Just what the `:authority` adapter ([`crate::authority`]) needs: a
//! decoder that follows the client's dynamic table, and an encoder that
//! never touches the server's (every field a literal "without indexing" or
//! "never indexed", names and values raw), so that re-encoded blocks leave
//! the server's table as it was. Huffman coding is in [`huffman`].

pub mod huffman;
mod table;

use bytes::{BufMut, Bytes, BytesMut};

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 7540 6.5.2): the table
/// size a client's encoder may use when the server never announces one.
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Errors while decoding a header block: each is a COMPRESSION_ERROR of the
/// connection in HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ends inside a field.
    #[error("hpack: header block truncated")]
    Truncated,
    /// An integer needs more than 28 bits.
    #[error("hpack: integer too large")]
    IntegerTooLarge,
    /// An index is 0 or past the end of the tables.
    #[error("hpack: index {0} out of range")]
    BadIndex(usize),
    /// A Huffman-coded string is invalid.
    #[error("hpack: invalid huffman code")]
    Huffman,
    /// A table size update above what the server allows.
    #[error("hpack: table size update to {0} above {1}")]
    TableSize(usize, usize),
    /// A table size update after the first field of a block.
    #[error("hpack: table size update after a header field")]
    LateSizeUpdate,
    /// The decoded header list is larger than the caller's bound.
    #[error("hpack: header list larger than {0} bytes")]
    TooLarge(usize),
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The name, as sent (HPACK does not check it).
    pub name: Bytes,
    /// The value.
    pub value: Bytes,
    /// Sent as "never indexed": intermediaries must keep it so.
    pub sensitive: bool,
}

/// The decoding side of one connection's HPACK context.
#[derive(Debug)]
pub struct Decoder {
    table: table::Dynamic,
    limit: usize,
}

impl Decoder {
    /// A decoder whose peer may use a table of up to `limit` bytes (the
    /// SETTINGS_HEADER_TABLE_SIZE its receiver announced).
    pub fn new(limit: usize) -> Self {
        Self {
            table: table::Dynamic::new(limit),
            limit,
        }
    }

    /// Decodes one complete header block (HEADERS and its CONTINUATIONs
    /// joined), appending its fields to `out`. `max_list` bounds the decoded
    /// list (name + value + 32 per field, RFC 7540's header list size), so a
    /// small block that refers to large table entries again and again cannot
    /// use unbounded memory. After an error the decoder's table is unusable,
    /// as the connection is.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list: usize,
        out: &mut Vec<Field>,
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut fields_seen = false;
        let mut list = 0usize;
        while let Some(&first) = block.get(pos) {
            let field = if first & 0x80 != 0 {
                let index = integer(block, &mut pos, 7)?;
                let (name, value) = self.table.get(index).ok_or(HpackError::BadIndex(index))?;
                Field {
                    name,
                    value,
                    sensitive: false,
                }
            } else if first & 0x40 != 0 {
                let (name, value) = self.literal(block, &mut pos, 6)?;
                self.table.insert(name.clone(), value.clone());
                Field {
                    name,
                    value,
                    sensitive: false,
                }
            } else if first & 0x20 != 0 {
                if fields_seen {
                    return Err(HpackError::LateSizeUpdate);
                }
                let size = integer(block, &mut pos, 5)?;
                if size > self.limit {
                    return Err(HpackError::TableSize(size, self.limit));
                }
                self.table.set_max(size);
                continue;
            } else {
                let (name, value) = self.literal(block, &mut pos, 4)?;
                Field {
                    name,
                    value,
                    sensitive: first & 0x10 != 0,
                }
            };
            fields_seen = true;
            list += field.name.len() + field.value.len() + table::ENTRY_OVERHEAD;
            if list > max_list {
                return Err(HpackError::TooLarge(max_list));
            }
            out.push(field);
        }
        Ok(())
    }

    /// A literal field whose name index has a `prefix`-bit prefix.
    fn literal(
        &self,
        block: &[u8],
        pos: &mut usize,
        prefix: u8,
    ) -> Result<(Bytes, Bytes), HpackError> {
        let index = integer(block, pos, prefix)?;
        let name = if index == 0 {
            string(block, pos)?
        } else {
            self.table.get(index).ok_or(HpackError::BadIndex(index))?.0
        };
        Ok((name, string(block, pos)?))
    }
}

/// An integer with an N-bit prefix (RFC 7541 5.1), at most 28 bits more.
fn integer(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let mask = (1usize << prefix) - 1;
    let first = usize::from(*block.get(*pos).ok_or(HpackError::Truncated)?) & mask;
    *pos += 1;
    if first < mask {
        return Ok(first);
    }
    let mut value = mask;
    let mut shift = 0;
    loop {
        let b = *block.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        if shift > 21 {
            return Err(HpackError::IntegerTooLarge);
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// A string literal (RFC 7541 5.2), raw or Huffman-coded.
fn string(block: &[u8], pos: &mut usize) -> Result<Bytes, HpackError> {
    let huffman = block.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(block, pos, 7)?;
    let end = pos.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = block.get(*pos..end).ok_or(HpackError::Truncated)?;
    *pos = end;
    if huffman {
        let mut out = Vec::with_capacity(len + len / 2);
        huffman::decode(raw, &mut out)?;
        Ok(Bytes::from(out))
    } else {
        Ok(Bytes::copy_from_slice(raw))
    }
}

/// Appends `field` as a literal with a literal name, "without indexing" or
/// (for a sensitive field) "never indexed": the receiver's table is left
/// alone either way.
pub fn encode_literal(name: &[u8], value: &[u8], sensitive: bool, out: &mut BytesMut) {
    out.put_u8(if sensitive { 0x10 } else { 0x00 });
    encode_string(name, out);
    encode_string(value, out);
}

fn encode_string(s: &[u8], out: &mut BytesMut) {
    encode_integer(s.len(), 7, 0x00, out);
    out.extend_from_slice(s);
}

/// Appends an integer with an N-bit prefix; `flags` are the bits above it.
pub fn encode_integer(mut value: usize, prefix: u8, flags: u8, out: &mut BytesMut) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.put_u8(flags | value as u8);
        return;
    }
    out.put_u8(flags | mask as u8);
    value -= mask;
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

#[cfg(test)]
pub(crate) mod tests;
