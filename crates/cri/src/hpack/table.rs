//! HPACK's static table (RFC 7541, Appendix A) and a decoder's dynamic table.

use std::collections::VecDeque;

use bytes::Bytes;

/// The static table; index 1 is the first entry.
pub(super) const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// What an entry costs in the table besides its name and value (RFC 7541 4.1).
pub(super) const ENTRY_OVERHEAD: usize = 32;

/// The dynamic table of one decoder: newest entry first.
#[derive(Debug)]
pub(super) struct Dynamic {
    entries: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max: usize,
}

impl Dynamic {
    pub(super) fn new(max: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max,
        }
    }

    /// The entry at `index` of the combined index space (static first).
    pub(super) fn get(&self, index: usize) -> Option<(Bytes, Bytes)> {
        match index {
            0 => None,
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Some((
                    Bytes::from_static(n.as_bytes()),
                    Bytes::from_static(v.as_bytes()),
                ))
            }
            _ => self.entries.get(index - 62).cloned(),
        }
    }

    /// Adds an entry, evicting the oldest ones to make room; an entry larger
    /// than the whole table empties it and is not added (RFC 7541 4.4).
    pub(super) fn insert(&mut self, name: Bytes, value: Bytes) {
        let cost = name.len() + value.len() + ENTRY_OVERHEAD;
        if cost > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.shrink_to(self.max - cost);
        self.size += cost;
        self.entries.push_front((name, value));
    }

    /// A dynamic table size update.
    pub(super) fn set_max(&mut self, max: usize) {
        self.max = max;
        self.shrink_to(max);
    }

    fn shrink_to(&mut self, room: usize) {
        while self.size > room {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + ENTRY_OVERHEAD,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
