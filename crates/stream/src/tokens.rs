//! Single-use, expiring tokens that stand for a request accepted over CRI
//! until its client connects to the streaming URL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;

/// Bytes of randomness per token (256 bits: not guessable).
const TOKEN_BYTES: usize = 32;
/// How long a spent token's fate is remembered, at least.
const MIN_GRACE: Duration = Duration::from_secs(300);

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Never issued, or forgotten long ago.
    #[error("unknown streaming token")]
    Unknown,
    /// Issued, but its time to live passed before the client came.
    #[error("streaming token expired")]
    Expired,
    /// Issued and already used: each token serves one connection.
    #[error("streaming token already used")]
    Used,
    /// Too many requests are waiting for their clients.
    #[error("too many streaming requests in flight (limit {0})")]
    Full(usize),
    /// The system's random source failed.
    #[error("no randomness for a streaming token: {0}")]
    Random(String),
}

struct Pending<T> {
    expires: Instant,
    value: T,
}

struct Inner<T> {
    pending: HashMap<String, Pending<T>>,
    /// Tokens consumed or expired recently, kept until their own expiry
    /// (bounded like `pending`) only to tell a client why it was refused.
    spent: HashMap<String, (Instant, TokenError)>,
}

/// The cache: at most `limit` tokens waiting, each for at most `ttl`.
pub(crate) struct TokenCache<T> {
    inner: Mutex<Inner<T>>,
    ttl: Duration,
    limit: usize,
}

impl<T> TokenCache<T> {
    pub(crate) fn new(ttl: Duration, limit: usize) -> Self {
        TokenCache {
            inner: Mutex::new(Inner {
                pending: HashMap::new(),
                spent: HashMap::new(),
            }),
            ttl,
            limit,
        }
    }

    /// Stores `value` under a new token.
    pub(crate) fn insert(&self, value: T) -> Result<String, TokenError> {
        self.insert_at(value, Instant::now())
    }

    /// Takes the value of `token`, once.
    pub(crate) fn consume(&self, token: &str) -> Result<T, TokenError> {
        self.consume_at(token, Instant::now())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // A panic while holding this lock leaves the maps consistent (every
        // mutation is a single insert or remove), so poison is harmless.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert_at(&self, value: T, now: Instant) -> Result<String, TokenError> {
        let mut inner = self.lock();
        purge(&mut inner, now, self.ttl, self.limit);
        if inner.pending.len() >= self.limit {
            return Err(TokenError::Full(self.limit));
        }
        let mut raw = [0u8; TOKEN_BYTES];
        getrandom::getrandom(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        inner.pending.insert(
            token.clone(),
            Pending {
                expires: now + self.ttl,
                value,
            },
        );
        Ok(token)
    }

    fn consume_at(&self, token: &str, now: Instant) -> Result<T, TokenError> {
        let mut inner = self.lock();
        purge(&mut inner, now, self.ttl, self.limit);
        if let Some(p) = inner.pending.remove(token) {
            let until = p.expires + self.ttl.max(MIN_GRACE);
            remember(
                &mut inner,
                token.to_owned(),
                until,
                TokenError::Used,
                self.limit,
            );
            return Ok(p.value);
        }
        match inner.spent.get(token) {
            Some((_, why)) => Err(why.clone()),
            None => Err(TokenError::Unknown),
        }
    }

    /// Tokens waiting for their client.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().pending.len()
    }
}

/// Moves expired pending tokens to `spent` and forgets spent ones whose
/// grace time (a TTL, at least 5 minutes, after expiry) is over.
fn purge<T>(inner: &mut Inner<T>, now: Instant, ttl: Duration, limit: usize) {
    let expired: Vec<(String, Instant)> = inner
        .pending
        .iter()
        .filter(|(_, p)| p.expires <= now)
        .map(|(k, p)| (k.clone(), p.expires))
        .collect();
    for (k, expires) in expired {
        inner.pending.remove(&k);
        remember(
            inner,
            k,
            expires + ttl.max(MIN_GRACE),
            TokenError::Expired,
            limit,
        );
    }
    inner.spent.retain(|_, (until, _)| *until > now);
}

fn remember<T>(inner: &mut Inner<T>, token: String, until: Instant, why: TokenError, limit: usize) {
    // Bounded: past the limit a refused client gets the generic answer.
    if inner.spent.len() < limit {
        inner.spent.insert(token, (until, why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_use() {
        let c = TokenCache::new(Duration::from_secs(60), 10);
        let t = c.insert(7).unwrap_or_default();
        assert_eq!(t.len(), 43, "32 bytes in unpadded base64url");
        assert_eq!(c.consume(&t), Ok(7));
        assert_eq!(c.consume(&t), Err(TokenError::Used));
        assert_eq!(c.consume("nope"), Err(TokenError::Unknown));
    }

    #[test]
    fn tokens_differ() {
        let c = TokenCache::new(Duration::from_secs(60), 10);
        let a = c.insert(()).unwrap_or_default();
        let b = c.insert(()).unwrap_or_default();
        assert_ne!(a, b);
    }

    #[test]
    fn expiry() {
        let c = TokenCache::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        let t = c.insert_at(1, now).unwrap_or_default();
        assert_eq!(
            c.consume_at(&t, now + Duration::from_secs(61)),
            Err(TokenError::Expired)
        );
        let t = c.insert_at(2, now).unwrap_or_default();
        assert_eq!(c.consume_at(&t, now + Duration::from_secs(59)), Ok(2));
    }

    #[test]
    fn limit_counts_waiting_tokens_only() {
        let c = TokenCache::new(Duration::from_secs(60), 3);
        let now = Instant::now();
        let tokens: Vec<String> = (0..3)
            .map(|i| c.insert_at(i, now).unwrap_or_default())
            .collect();
        assert_eq!(c.insert_at(9, now), Err(TokenError::Full(3)));
        assert_eq!(c.consume_at(&tokens[0], now), Ok(0));
        assert!(c.insert_at(9, now).is_ok(), "a used token frees its slot");
        assert_eq!(c.len(), 3);
        // Expired tokens free their slots too.
        assert!(c.insert_at(10, now + Duration::from_secs(61)).is_ok());
        assert_eq!(c.len(), 1);
    }
}
