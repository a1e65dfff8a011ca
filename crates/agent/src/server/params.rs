//! Query parameters as kubelet reads them: repeated keys kept (exec's
//! `command`), booleans in Go's `strconv.ParseBool` spellings, and a 400
//! naming the parameter when one is malformed.

use std::str::FromStr;

use super::resolve::ApiError;

/// A request's decoded query.
#[derive(Debug, Default)]
pub(crate) struct QueryParams(Vec<(String, String)>);

impl QueryParams {
    /// Decodes a raw query string (absent: empty).
    pub fn parse(raw: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `key`, in order.
    pub fn all(&self, key: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// A boolean (absent: false).
    pub fn flag(&self, key: &str) -> Result<bool, ApiError> {
        match self.get(key) {
            None => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ApiError::BadRequest(format!(
                "invalid value {v:?} for parameter {key}: expected true or false"
            ))),
        }
    }

    /// A number (absent: None).
    pub fn number<T: FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::BadRequest(format!(
                        "invalid value {v:?} for parameter {key}: expected an integer"
                    ))
                })
            })
            .transpose()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn params_should_keep_repeats_and_reject_bad_values_by_name() {
        let q = QueryParams::parse(Some(
            "command=sh&command=-c&command=echo%20hi&tty=1&x=maybe&n=-3",
        ));
        assert_eq!(q.all("command"), ["sh", "-c", "echo hi"]);
        assert!(q.flag("tty").unwrap());
        assert!(!q.flag("input").unwrap());
        let e = q.flag("x").unwrap_err().to_string();
        assert!(e.contains("parameter x"), "{e}");
        assert_eq!(q.number::<i64>("n").unwrap(), Some(-3));
        assert!(q
            .number::<u64>("n")
            .unwrap_err()
            .to_string()
            .contains("parameter n"));
        assert_eq!(q.number::<u64>("absent").unwrap(), None);
    }
}
