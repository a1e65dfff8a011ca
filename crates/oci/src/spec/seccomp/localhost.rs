//! `Localhost` seccomp profiles: a JSON file in the OCI seccomp format
//! (`defaultAction`, `defaultErrnoRet`, `architectures`, `flags`,
//! `syscalls[{names, action, errnoRet, args[{index, value, valueTwo, op}]}]`),
//! read and checked before the container exists, so that a bad profile is a
//! clear INVALID_ARGUMENT rather than a runc failure or a silently weaker
//! filter.
//!
//! Refused: what Petrel cannot honour (`SCMP_ACT_NOTIFY` and its
//! `listenerPath`/`listenerMetadata`: Petrel runs no seccomp agent), Docker's
//! profile form (`archMap`, `includes`, `excludes`: their meaning depends on
//! the host and capabilities and an OCI runtime would ignore them), unknown
//! keys, actions, architectures, flags and operators. Unknown syscall
//! *names* are accepted: the OCI runtime skips names its libseccomp does not
//! know, which is how one profile serves several kernels.

use std::io::Read;
use std::path::Path;

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompFilterFlag, LinuxSeccompOperator, LinuxSyscall,
};
use serde_json::{Map, Value};

use crate::spec::{invalid, shown, SpecError};

/// A profile larger than this is refused unread (real ones are a few KiB).
const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// Architectures runc (1.1 and later) accepts.
const ARCHES: &[(&str, Arch)] = &[
    ("SCMP_ARCH_X86", Arch::ScmpArchX86),
    ("SCMP_ARCH_X86_64", Arch::ScmpArchX86_64),
    ("SCMP_ARCH_X32", Arch::ScmpArchX32),
    ("SCMP_ARCH_ARM", Arch::ScmpArchArm),
    ("SCMP_ARCH_AARCH64", Arch::ScmpArchAarch64),
    ("SCMP_ARCH_MIPS", Arch::ScmpArchMips),
    ("SCMP_ARCH_MIPS64", Arch::ScmpArchMips64),
    ("SCMP_ARCH_MIPS64N32", Arch::ScmpArchMips64n32),
    ("SCMP_ARCH_MIPSEL", Arch::ScmpArchMipsel),
    ("SCMP_ARCH_MIPSEL64", Arch::ScmpArchMipsel64),
    ("SCMP_ARCH_MIPSEL64N32", Arch::ScmpArchMipsel64n32),
    ("SCMP_ARCH_PPC", Arch::ScmpArchPpc),
    ("SCMP_ARCH_PPC64", Arch::ScmpArchPpc64),
    ("SCMP_ARCH_PPC64LE", Arch::ScmpArchPpc64le),
    ("SCMP_ARCH_S390", Arch::ScmpArchS390),
    ("SCMP_ARCH_S390X", Arch::ScmpArchS390x),
];

const ACTIONS: &[(&str, LinuxSeccompAction)] = &[
    ("SCMP_ACT_KILL", LinuxSeccompAction::ScmpActKill),
    (
        "SCMP_ACT_KILL_THREAD",
        LinuxSeccompAction::ScmpActKillThread,
    ),
    (
        "SCMP_ACT_KILL_PROCESS",
        LinuxSeccompAction::ScmpActKillProcess,
    ),
    ("SCMP_ACT_TRAP", LinuxSeccompAction::ScmpActTrap),
    ("SCMP_ACT_ERRNO", LinuxSeccompAction::ScmpActErrno),
    ("SCMP_ACT_TRACE", LinuxSeccompAction::ScmpActTrace),
    ("SCMP_ACT_LOG", LinuxSeccompAction::ScmpActLog),
    ("SCMP_ACT_ALLOW", LinuxSeccompAction::ScmpActAllow),
];

const OPERATORS: &[(&str, LinuxSeccompOperator)] = &[
    ("SCMP_CMP_NE", LinuxSeccompOperator::ScmpCmpNe),
    ("SCMP_CMP_LT", LinuxSeccompOperator::ScmpCmpLt),
    ("SCMP_CMP_LE", LinuxSeccompOperator::ScmpCmpLe),
    ("SCMP_CMP_EQ", LinuxSeccompOperator::ScmpCmpEq),
    ("SCMP_CMP_GE", LinuxSeccompOperator::ScmpCmpGe),
    ("SCMP_CMP_GT", LinuxSeccompOperator::ScmpCmpGt),
    ("SCMP_CMP_MASKED_EQ", LinuxSeccompOperator::ScmpCmpMaskedEq),
];

const FLAGS: &[(&str, LinuxSeccompFilterFlag)] = &[
    (
        "SECCOMP_FILTER_FLAG_TSYNC",
        LinuxSeccompFilterFlag::SeccompFilterFlagTsync,
    ),
    (
        "SECCOMP_FILTER_FLAG_LOG",
        LinuxSeccompFilterFlag::SeccompFilterFlagLog,
    ),
    (
        "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
        LinuxSeccompFilterFlag::SeccompFilterFlagSpecAllow,
    ),
];

/// A syscall's arguments are numbered 0 to 5.
const MAX_ARGS: usize = 6;

/// Reads and checks the profile at `path`; errors name `field` (the CRI
/// field that named the file) and the path.
pub fn load_profile(path: &Path, field: &str) -> Result<LinuxSeccomp, SpecError> {
    let at = |reason: String| {
        invalid(
            field,
            format!("seccomp profile {}: {reason}", path.display()),
        )
    };
    if !path.is_absolute() {
        return Err(invalid(
            field,
            format!(
                "seccomp profile path {} must be absolute",
                shown(&path.to_string_lossy())
            ),
        ));
    }
    let file = std::fs::File::open(path).map_err(|e| at(format!("cannot open: {e}")))?;
    let mut text = Vec::new();
    file.take(MAX_PROFILE_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| at(format!("cannot read: {e}")))?;
    if text.len() as u64 > MAX_PROFILE_BYTES {
        return Err(at(format!("larger than {MAX_PROFILE_BYTES} bytes")));
    }
    let value: Value =
        serde_json::from_slice(&text).map_err(|e| at(format!("not valid JSON: {e}")))?;
    parse_profile(&value).map_err(at)
}

/// Checks a profile's JSON and turns it into OCI `linux.seccomp`; errors
/// name the key (`syscalls[2].action`).
pub fn parse_profile(value: &Value) -> Result<LinuxSeccomp, String> {
    let top = object(value, "the profile")?;
    for key in top.keys() {
        match key.as_str() {
            "defaultAction" | "defaultErrnoRet" | "architectures" | "flags" | "syscalls" => {}
            "archMap" => {
                return Err("archMap (Docker's profile form) is not supported: list \
                            architectures instead"
                    .into())
            }
            "listenerPath" | "listenerMetadata" => {
                return Err(format!(
                    "{key}: seccomp agents (SCMP_ACT_NOTIFY) are not supported"
                ))
            }
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    let mut s = LinuxSeccomp::default();
    let default = top
        .get("defaultAction")
        .ok_or_else(|| "defaultAction is required".to_string())?;
    s.set_default_action(action(default, "defaultAction")?);
    if let Some(v) = top.get("defaultErrnoRet") {
        s.set_default_errno_ret(Some(errno(v, "defaultErrnoRet")?));
    }
    if let Some(v) = top.get("architectures") {
        let arches = array(v, "architectures")?
            .iter()
            .enumerate()
            .map(|(i, a)| named(a, &format!("architectures[{i}]"), ARCHES, "architecture"))
            .collect::<Result<Vec<_>, _>>()?;
        s.set_architectures(Some(arches));
    }
    if let Some(v) = top.get("flags") {
        let flags = array(v, "flags")?
            .iter()
            .enumerate()
            .map(|(i, f)| named(f, &format!("flags[{i}]"), FLAGS, "flag"))
            .collect::<Result<Vec<_>, _>>()?;
        s.set_flags(Some(flags));
    }
    if let Some(v) = top.get("syscalls") {
        let rules = array(v, "syscalls")?
            .iter()
            .enumerate()
            .map(|(i, r)| syscall(r, &format!("syscalls[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        s.set_syscalls(Some(rules));
    }
    Ok(s)
}

fn syscall(value: &Value, at: &str) -> Result<LinuxSyscall, String> {
    let o = object(value, at)?;
    for key in o.keys() {
        match key.as_str() {
            "names" | "action" | "errnoRet" | "args" | "comment" => {}
            "includes" | "excludes" => {
                return Err(format!(
                    "{at}.{key} (Docker's profile form) is not supported: write the rules \
                     that apply to this host"
                ))
            }
            other => return Err(format!("{at}: unknown key {other:?}")),
        }
    }
    let names_at = format!("{at}.names");
    let names = array(
        o.get("names")
            .ok_or_else(|| format!("{names_at} is required"))?,
        &names_at,
    )?;
    if names.is_empty() {
        return Err(format!("{names_at} is empty"));
    }
    let names = names
        .iter()
        .enumerate()
        .map(|(i, n)| match n.as_str() {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err(format!("{names_at}[{i}] must be a syscall name")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let action_at = format!("{at}.action");
    let act = action(
        o.get("action")
            .ok_or_else(|| format!("{action_at} is required"))?,
        &action_at,
    )?;
    let mut rule = LinuxSyscall::default();
    rule.set_names(names).set_action(act);
    if let Some(v) = o.get("errnoRet") {
        if !matches!(
            act,
            LinuxSeccompAction::ScmpActErrno | LinuxSeccompAction::ScmpActTrace
        ) {
            return Err(format!(
                "{at}.errnoRet is only valid with SCMP_ACT_ERRNO or SCMP_ACT_TRACE"
            ));
        }
        rule.set_errno_ret(Some(errno(v, &format!("{at}.errnoRet"))?));
    }
    if let Some(v) = o.get("args").filter(|v| !v.is_null()) {
        let args = array(v, &format!("{at}.args"))?;
        if args.len() > MAX_ARGS {
            return Err(format!("{at}.args: more than {MAX_ARGS} conditions"));
        }
        let args = args
            .iter()
            .enumerate()
            .map(|(i, a)| argument(a, &format!("{at}.args[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        rule.set_args((!args.is_empty()).then_some(args));
    }
    Ok(rule)
}

fn argument(value: &Value, at: &str) -> Result<LinuxSeccompArg, String> {
    let o = object(value, at)?;
    if let Some(k) = o
        .keys()
        .find(|k| !["index", "value", "valueTwo", "op"].contains(&k.as_str()))
    {
        return Err(format!("{at}: unknown key {k:?}"));
    }
    let number = |key: &str, required: bool| -> Result<Option<u64>, String> {
        match o.get(key) {
            None if required => Err(format!("{at}.{key} is required")),
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("{at}.{key} must be an unsigned 64-bit integer")),
        }
    };
    let index = number("index", true)?.unwrap_or_default();
    if index >= MAX_ARGS as u64 {
        return Err(format!("{at}.index {index} is not 0 to {}", MAX_ARGS - 1));
    }
    let op_at = format!("{at}.op");
    let op = named(
        o.get("op").ok_or_else(|| format!("{op_at} is required"))?,
        &op_at,
        OPERATORS,
        "operator",
    )?;
    let mut b = LinuxSeccompArgBuilder::default()
        .index(index as usize)
        .value(number("value", true)?.unwrap_or_default())
        .op(op);
    if let Some(two) = number("valueTwo", false)? {
        b = b.value_two(two);
    }
    b.build().map_err(|e| format!("{at}: {e}"))
}

fn action(value: &Value, at: &str) -> Result<LinuxSeccompAction, String> {
    if value.as_str() == Some("SCMP_ACT_NOTIFY") {
        return Err(format!(
            "{at}: SCMP_ACT_NOTIFY is not supported (Petrel runs no seccomp agent)"
        ));
    }
    named(value, at, ACTIONS, "action")
}

fn errno(value: &Value, at: &str) -> Result<u32, String> {
    value
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{at} must be an errno number"))
}

fn named<T: Copy>(value: &Value, at: &str, table: &[(&str, T)], what: &str) -> Result<T, String> {
    let name = value
        .as_str()
        .ok_or_else(|| format!("{at} must be a string"))?;
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            format!(
                "{at}: unknown {what} {}: expected one of {}",
                shown(name),
                known.join(", ")
            )
        })
}

fn object<'a>(value: &'a Value, at: &str) -> Result<&'a Map<String, Value>, String> {
    value
        .as_object()
        .ok_or_else(|| format!("{at} must be a JSON object"))
}

fn array<'a>(value: &'a Value, at: &str) -> Result<&'a Vec<Value>, String> {
    value
        .as_array()
        .ok_or_else(|| format!("{at} must be a JSON array"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        parse_profile(&v).expect_err("must be refused")
    }

    #[test]
    fn parse_profile_should_read_the_oci_form() {
        let p = parse_profile(&json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
            "flags": ["SECCOMP_FILTER_FLAG_LOG"],
            "syscalls": [
                {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "comment": "no dirs"},
                {"names": ["sethostname"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
                {"names": ["personality"], "action": "SCMP_ACT_ERRNO",
                 "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_NE"}]},
                {"names": ["fchmodat2_unknown_to_libseccomp"], "action": "SCMP_ACT_LOG", "args": null}
            ]
        }))
        .expect("profile");
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActAllow);
        assert_eq!(
            p.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86][..])
        );
        assert_eq!(
            p.flags().as_deref(),
            Some(&[LinuxSeccompFilterFlag::SeccompFilterFlagLog][..])
        );
        let rules = p.syscalls().as_ref().expect("syscalls");
        assert_eq!(rules.len(), 4);
        assert_eq!(
            rules[0].names(),
            &["mkdir".to_string(), "mkdirat".to_string()]
        );
        assert_eq!(rules[1].errno_ret(), Some(13));
        let a = rules[2].args().as_ref().expect("args")[0];
        assert_eq!(
            (a.index(), a.value(), a.value_two(), a.op()),
            (0, 8, Some(0), LinuxSeccompOperator::ScmpCmpNe)
        );
        assert!(rules[3].args().is_none());
    }

    #[test]
    fn parse_profile_should_refuse_what_it_cannot_honour() {
        let cases = [
            (json!([]), "must be a JSON object"),
            (json!({}), "defaultAction is required"),
            (
                json!({"defaultAction": "SCMP_ACT_MAYBE"}),
                "defaultAction: unknown action \"SCMP_ACT_MAYBE\"",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_NOTIFY"}),
                "SCMP_ACT_NOTIFY is not supported",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"}),
                "listenerPath",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "archMap": []}),
                "archMap",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscall": []}),
                "unknown key \"syscall\"",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]}),
                "architectures[0]: unknown architecture",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "flags": ["NOPE"]}),
                "flags[0]: unknown flag",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}}),
                "syscalls must be a JSON array",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ERRNO"}]}),
                "syscalls[0].names is required",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": [], "action": "SCMP_ACT_ERRNO"}]}),
                "syscalls[0].names is empty",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read", 3], "action": "SCMP_ACT_ERRNO"}]}),
                "syscalls[0].names[1]",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"]}]}),
                "syscalls[0].action is required",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW", "errnoRet": 1}]}),
                "syscalls[0].errnoRet is only valid",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ERRNO", "includes": {"caps": ["CAP_SYS_ADMIN"]}}]}),
                "syscalls[0].includes (Docker's profile form)",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 6, "value": 0, "op": "SCMP_CMP_EQ"}]}]}),
                "syscalls[0].args[0].index 6",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": -1, "op": "SCMP_CMP_EQ"}]}]}),
                "syscalls[0].args[0].value must be",
            ),
            (
                json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_ABOUT"}]}]}),
                "syscalls[0].args[0].op: unknown operator",
            ),
        ];
        for (profile, want) in cases {
            let e = err(profile.clone());
            assert!(e.contains(want), "{profile}: {e:?} lacks {want:?}");
        }
    }

    #[test]
    fn load_profile_should_name_the_field_and_path_of_a_bad_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let field = "linux.security_context.seccomp.localhost_ref";
        let missing = dir.path().join("missing.json");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{\"defaultAction\": ").expect("write");
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"defaultAction": "SCMP_ACT_ALLOW"}"#).expect("write");
        for (path, want) in [
            (missing.as_path(), "cannot open"),
            (bad.as_path(), "not valid JSON"),
            (Path::new("relative.json"), "must be absolute"),
        ] {
            match load_profile(path, field) {
                Err(SpecError::Invalid { field: f, reason }) => {
                    assert_eq!(f, field);
                    assert!(reason.contains(want), "{reason}");
                    assert!(reason.contains(&*path.to_string_lossy()), "{reason}");
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        assert!(load_profile(&good, field).is_ok());
    }
}
