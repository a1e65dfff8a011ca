//! The exit status a remote command reports on its error stream: a
//! Kubernetes `metav1.Status` in JSON (protocol v4 and later), or the plain
//! failure message (v1 to v3, which cannot carry an exit code).

use serde::{Deserialize, Serialize};

/// `Status.reason` of a command that exited with a non-zero code.
const NON_ZERO_EXIT_CODE: &str = "NonZeroExitCode";
/// `StatusCause.reason` (Go: `Type`) carrying the exit code.
const EXIT_CODE_CAUSE: &str = "ExitCode";
/// `Status.reason` of a server-side failure.
const INTERNAL_ERROR: &str = "InternalError";

/// How a remote command ended, as the error stream reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Exit code 0 (or an attach that ended normally).
    Success,
    /// The command ran and exited with this non-zero code.
    Exited {
        /// The exit code.
        code: i32,
        /// A human-readable explanation.
        message: String,
    },
    /// The server could not run the command.
    Failed(String),
}

/// The JSON shape of `metav1.Status`, with only the fields this protocol uses.
#[derive(Debug, Serialize, Deserialize, Default)]
struct Status {
    /// Always `{}`; Go's encoder writes the empty list metadata.
    #[serde(default)]
    metadata: Metadata,
    status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    #[serde(default, skip_serializing_if = "is_zero")]
    code: i32,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct Metadata {}

#[derive(Debug, Serialize, Deserialize, Default)]
struct Details {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    causes: Vec<Cause>,
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct Cause {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
}

impl Outcome {
    /// The outcome of an exec that returned `code`.
    pub fn from_exit_code(code: i32) -> Outcome {
        if code == 0 {
            Outcome::Success
        } else {
            Outcome::Exited {
                code,
                message: format!("command terminated with non-zero exit code: exit status {code}"),
            }
        }
    }

    /// The exit code a client reports for this outcome, if the command ran.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Outcome::Success => Some(0),
            Outcome::Exited { code, .. } => Some(*code),
            Outcome::Failed(_) => None,
        }
    }

    /// The error stream payload for protocol v4 and later.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        let status = match self {
            Outcome::Success => Status {
                status: "Success".into(),
                ..Status::default()
            },
            Outcome::Exited { code, message } => Status {
                status: "Failure".into(),
                message: message.clone(),
                reason: NON_ZERO_EXIT_CODE.into(),
                details: Some(Details {
                    causes: vec![Cause {
                        reason: EXIT_CODE_CAUSE.into(),
                        message: code.to_string(),
                    }],
                }),
                ..Status::default()
            },
            Outcome::Failed(message) => Status {
                status: "Failure".into(),
                message: format!("Internal error occurred: {message}"),
                reason: INTERNAL_ERROR.into(),
                details: Some(Details {
                    causes: vec![Cause {
                        reason: String::new(),
                        message: message.clone(),
                    }],
                }),
                code: 500,
                ..Status::default()
            },
        };
        // Serializing plain strings and integers cannot fail.
        serde_json::to_vec(&status).unwrap_or_default()
    }

    /// The error stream payload for protocols v1 to v3: nothing on success,
    /// the message otherwise.
    pub(crate) fn to_text(&self) -> Vec<u8> {
        match self {
            Outcome::Success => Vec::new(),
            Outcome::Exited { message, .. } => message.clone().into_bytes(),
            Outcome::Failed(message) => message.clone().into_bytes(),
        }
    }

    /// Reads an error stream's payload as a client: `json` for protocol v4
    /// and later. An empty payload means success (the server closed the
    /// stream without a word).
    pub(crate) fn parse(payload: &[u8], json: bool) -> Outcome {
        let text = String::from_utf8_lossy(payload);
        if text.trim().is_empty() {
            return Outcome::Success;
        }
        if !json {
            return Outcome::Failed(text.into_owned());
        }
        let status: Status = match serde_json::from_slice(payload) {
            Ok(s) => s,
            Err(e) => {
                return Outcome::Failed(format!("error stream protocol error: {e} in {text:?}"))
            }
        };
        if status.status == "Success" {
            return Outcome::Success;
        }
        if status.reason == NON_ZERO_EXIT_CODE {
            let code = status
                .details
                .iter()
                .flat_map(|d| d.causes.iter())
                .find(|c| c.reason == EXIT_CODE_CAUSE)
                .and_then(|c| c.message.parse::<i32>().ok());
            if let Some(code) = code {
                return Outcome::Exited {
                    code,
                    message: status.message,
                };
            }
        }
        Outcome::Failed(status.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_kubelets_bytes() {
        assert_eq!(
            Outcome::Success.to_json(),
            br#"{"metadata":{},"status":"Success"}"#.to_vec()
        );
    }

    #[test]
    fn exit_code_shape() {
        let json = String::from_utf8(Outcome::from_exit_code(3).to_json()).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#
        );
        assert_eq!(
            Outcome::parse(json.as_bytes(), true).exit_code(),
            Some(3),
            "round trip"
        );
    }

    #[test]
    fn failure_round_trip() {
        let o = Outcome::Failed("no such container".into());
        match Outcome::parse(&o.to_json(), true) {
            Outcome::Failed(m) => assert!(m.contains("no such container"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(Outcome::parse(b"", true), Outcome::Success);
        assert_eq!(Outcome::parse(b"", false), Outcome::Success);
        assert!(matches!(Outcome::parse(b"boom", false), Outcome::Failed(m) if m == "boom"));
    }
}
