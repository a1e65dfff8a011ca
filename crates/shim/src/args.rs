//! The shim's command line.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Usage line printed with argument errors.
pub const USAGE: &str = "usage: petrel-shim --id ID --bundle DIR --runc PATH --runc-root DIR \
                         --log-path PATH [--systemd-cgroup] [--tty] [--stdin [--stdin-once]] \
                         [--restore-from DIR [--criu PATH]]";

/// What the runtime asked the shim to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The container id, passed to runc.
    pub id: OsString,
    /// The bundle directory (holds config.json; the shim's working directory).
    pub bundle: PathBuf,
    /// The runc binary.
    pub runc: PathBuf,
    /// runc's state directory (`runc --root`).
    pub runc_root: PathBuf,
    /// The CRI log file; `None` when given as the empty string (output is
    /// drained and discarded).
    pub log_path: Option<PathBuf>,
    /// runc manages the container's cgroup through systemd (runc's global
    /// `--systemd-cgroup`).
    pub systemd_cgroup: bool,
    /// Give the container a pseudo-terminal.
    pub tty: bool,
    /// Keep the container's stdin open for a later attach.
    pub stdin: bool,
    /// Close the container's stdin when the first attach carrying input
    /// ends (CRI `stdin_once`).
    pub stdin_once: bool,
    /// Restore the container from the CRIU images in this directory
    /// (`runc restore`) instead of creating it (`runc create`).
    pub restore_from: Option<PathBuf>,
    /// The CRIU binary runc runs for a restore (runc's own lookup when
    /// `None`).
    pub criu: Option<PathBuf>,
}

/// A command line the shim cannot run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgsError {
    /// A required option is absent.
    Missing(&'static str),
    /// An option that takes a value is last on the line.
    NoValue(&'static str),
    /// An option other than the empty log path has an empty value.
    Empty(&'static str),
    /// An option is given twice.
    Duplicate(&'static str),
    /// Something that is not an option of the shim.
    Unknown(String),
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(name) => write!(f, "missing required option --{name}"),
            Self::NoValue(name) => write!(f, "option --{name} needs a value"),
            Self::Empty(name) => write!(f, "option --{name} must not be empty"),
            Self::Duplicate(name) => write!(f, "option --{name} given twice"),
            Self::Unknown(arg) => write!(f, "unknown argument {arg:?}"),
        }
    }
}

const VALUE_OPTIONS: [&str; 7] = [
    "id",
    "bundle",
    "runc",
    "runc-root",
    "log-path",
    "restore-from",
    "criu",
];

/// Parses the arguments after the program name. Options take their value as
/// the next argument or after `=` (`--id=abc`).
pub fn parse<I>(args: I) -> Result<Args, ArgsError>
where
    I: IntoIterator<Item = OsString>,
{
    let mut values: [Option<OsString>; VALUE_OPTIONS.len()] = Default::default();
    let (mut tty, mut stdin, mut stdin_once) = (false, false, false);
    let mut systemd_cgroup = false;
    let mut args = args.into_iter();

    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        let Some(option) = bytes.strip_prefix(b"--") else {
            return Err(ArgsError::Unknown(arg.to_string_lossy().into_owned()));
        };
        let (name, inline) = match option.iter().position(|&b| b == b'=') {
            Some(i) => (&option[..i], Some(OsStr::from_bytes(&option[i + 1..]))),
            None => (option, None),
        };
        let flag = match name {
            b"tty" => Some(&mut tty),
            b"systemd-cgroup" => Some(&mut systemd_cgroup),
            b"stdin" => Some(&mut stdin),
            b"stdin-once" => Some(&mut stdin_once),
            _ => None,
        };
        if let Some(flag) = flag {
            if inline.is_some() {
                return Err(ArgsError::Unknown(arg.to_string_lossy().into_owned()));
            }
            *flag = true;
            continue;
        }
        let Some(index) = VALUE_OPTIONS.iter().position(|o| o.as_bytes() == name) else {
            return Err(ArgsError::Unknown(arg.to_string_lossy().into_owned()));
        };
        let option = VALUE_OPTIONS[index];
        let value = match inline {
            Some(v) => v.to_os_string(),
            None => args.next().ok_or(ArgsError::NoValue(option))?,
        };
        if values[index].is_some() {
            return Err(ArgsError::Duplicate(option));
        }
        values[index] = Some(value);
    }

    let [id, bundle, runc, runc_root, log_path, restore_from, criu] = values;
    let required = |value: Option<OsString>, name: &'static str| match value {
        None => Err(ArgsError::Missing(name)),
        Some(v) if v.is_empty() => Err(ArgsError::Empty(name)),
        Some(v) => Ok(v),
    };
    let id = required(id, "id")?;
    let bundle = required(bundle, "bundle")?.into();
    let runc = required(runc, "runc")?.into();
    let runc_root = required(runc_root, "runc-root")?.into();
    let log_path = log_path.ok_or(ArgsError::Missing("log-path"))?;
    let log_path = (!log_path.is_empty()).then(|| log_path.into());
    let optional = |value: Option<OsString>, name: &'static str| match value {
        Some(v) if v.is_empty() => Err(ArgsError::Empty(name)),
        other => Ok(other.map(PathBuf::from)),
    };
    let restore_from = optional(restore_from, "restore-from")?;
    let criu = optional(criu, "criu")?;
    Ok(Args {
        id,
        bundle,
        runc,
        runc_root,
        log_path,
        systemd_cgroup,
        tty,
        stdin,
        stdin_once,
        restore_from,
        criu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Args, ArgsError> {
        parse(args.iter().map(OsString::from))
    }

    const FULL: [&str; 10] = [
        "--id",
        "c1",
        "--bundle",
        "/b",
        "--runc",
        "/usr/sbin/runc",
        "--runc-root",
        "/r",
        "--log-path",
        "/l/0.log",
    ];

    #[test]
    fn parse_should_read_all_options() {
        let mut argv = FULL.to_vec();
        argv.extend(["--tty", "--stdin", "--stdin-once", "--systemd-cgroup"]);
        let args = parse_strs(&argv).expect("valid command line");
        assert_eq!(
            args,
            Args {
                id: "c1".into(),
                bundle: "/b".into(),
                runc: "/usr/sbin/runc".into(),
                runc_root: "/r".into(),
                log_path: Some("/l/0.log".into()),
                systemd_cgroup: true,
                tty: true,
                stdin: true,
                stdin_once: true,
                restore_from: None,
                criu: None,
            }
        );
    }

    #[test]
    fn parse_should_read_the_restore_options() {
        let mut argv = FULL.to_vec();
        argv.extend(["--restore-from", "/cp/checkpoint", "--criu=/b/criu"]);
        let args = parse_strs(&argv).expect("valid command line");
        assert_eq!(args.restore_from, Some(PathBuf::from("/cp/checkpoint")));
        assert_eq!(args.criu, Some(PathBuf::from("/b/criu")));
        argv.truncate(FULL.len());
        argv.push("--restore-from=");
        assert_eq!(parse_strs(&argv), Err(ArgsError::Empty("restore-from")));
    }

    #[test]
    fn parse_should_default_flags_to_off() {
        let args = parse_strs(&FULL).expect("valid command line");
        assert!(!args.tty && !args.stdin && !args.stdin_once && !args.systemd_cgroup);
    }

    #[test]
    fn parse_should_accept_inline_values_in_any_order() {
        let args = parse_strs(&[
            "--stdin",
            "--log-path=/l",
            "--runc-root=/r",
            "--id=x=y",
            "--runc",
            "runc",
            "--bundle",
            "b",
        ])
        .expect("valid command line");
        assert_eq!(args.id, OsString::from("x=y"));
        assert_eq!(args.log_path, Some(PathBuf::from("/l")));
        assert_eq!(args.bundle, PathBuf::from("b"));
        assert!(args.stdin && !args.tty);
    }

    #[test]
    fn parse_should_treat_empty_log_path_as_no_log() {
        let mut argv = FULL.to_vec();
        argv[9] = "";
        assert_eq!(parse_strs(&argv).expect("valid").log_path, None);
        argv.truncate(8);
        argv.push("--log-path=");
        assert_eq!(parse_strs(&argv).expect("valid").log_path, None);
    }

    #[test]
    fn parse_should_reject_bad_command_lines() {
        assert_eq!(parse_strs(&FULL[2..]), Err(ArgsError::Missing("id")));
        assert_eq!(parse_strs(&FULL[..8]), Err(ArgsError::Missing("log-path")));
        assert_eq!(parse_strs(&FULL[..9]), Err(ArgsError::NoValue("log-path")));

        let mut argv = FULL.to_vec();
        argv[1] = "";
        assert_eq!(parse_strs(&argv), Err(ArgsError::Empty("id")));

        let mut argv = FULL.to_vec();
        argv.extend(["--id", "again"]);
        assert_eq!(parse_strs(&argv), Err(ArgsError::Duplicate("id")));

        let mut argv = FULL.to_vec();
        argv.push("--verbose");
        assert_eq!(
            parse_strs(&argv),
            Err(ArgsError::Unknown("--verbose".into()))
        );

        let mut argv = FULL.to_vec();
        argv.push("stray");
        assert_eq!(parse_strs(&argv), Err(ArgsError::Unknown("stray".into())));

        let mut argv = FULL.to_vec();
        argv.push("--tty=yes");
        assert_eq!(
            parse_strs(&argv),
            Err(ArgsError::Unknown("--tty=yes".into()))
        );
    }

    #[test]
    fn args_error_should_name_the_option() {
        assert_eq!(
            ArgsError::Missing("runc-root").to_string(),
            "missing required option --runc-root"
        );
        assert_eq!(
            ArgsError::Unknown("-x".into()).to_string(),
            "unknown argument \"-x\""
        );
    }
}
