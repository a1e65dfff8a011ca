//! Kubernetes resource quantities ("100m", "1.5", "64Mi", "1G", "2e3").

/// A quantity that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}: expected a number with an optional suffix (m, k, M, G, Ki, Mi, Gi, ...)")]
pub struct QuantityError(pub String);

/// Parses a quantity into its value (as f64; enough for node-sized
/// figures).
pub fn parse(s: &str) -> Result<f64, QuantityError> {
    let err = || QuantityError(s.to_string());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    const SUFFIXES: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (num, mult) = SUFFIXES
        .iter()
        .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
        .unwrap_or((t, 1.0));
    // Only digits, one dot, a sign and (for plain numbers) an exponent.
    if num.is_empty()
        || !num
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E'))
    {
        return Err(err());
    }
    let v: f64 = num.parse().map_err(|_| err())?;
    let v = v * mult;
    if !v.is_finite() || v < 0.0 {
        return Err(err());
    }
    Ok(v)
}

/// CPU in millicores, rounded up ("100m" → 100, "1.5" → 1500).
pub fn cpu_millis(s: &str) -> Result<i64, QuantityError> {
    Ok((parse(s)? * 1000.0).ceil() as i64)
}

/// Bytes, rounded up ("64Mi" → 67108864).
pub fn bytes(s: &str) -> Result<i64, QuantityError> {
    Ok(parse(s)?.ceil() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_should_parse_like_kubernetes() {
        assert_eq!(cpu_millis("100m"), Ok(100));
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(bytes("64Mi"), Ok(64 << 20));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("1e3"), Ok(1000));
        assert_eq!(bytes("128974848"), Ok(128974848));
        assert!(bytes("").is_err());
        assert!(bytes("12 Mi").is_err());
        assert!(bytes("abc").is_err());
        assert!(bytes("-1Mi").is_err());
        assert!(cpu_millis("1x").is_err());
    }
}
