//! The process of an exec (ExecSync, and the streaming Exec): the
//! container's own process settings with another command.

use oci_spec::runtime::{Process, Spec};

use crate::error::{Result, RuntimeError};

/// The process of an exec: the container's own process settings (user,
/// environment, working directory, capabilities) with `cmd` as arguments,
/// on a terminal of `terminal` size (`Some((0, 0))`: size unknown yet) or
/// none.
pub(crate) fn exec_process(
    spec_path: &std::path::Path,
    cmd: Vec<String>,
    terminal: Option<(u16, u16)>,
) -> Result<Process> {
    let spec = Spec::load(spec_path)
        .map_err(|e| RuntimeError::io("read", spec_path, std::io::Error::other(e)))?;
    let mut p = spec.process().clone().ok_or_else(|| {
        RuntimeError::Invariant(format!("{} has no process", spec_path.display()))
    })?;
    p.set_args(Some(cmd));
    p.set_terminal(Some(terminal.is_some()));
    let size = match terminal.filter(|&(w, h)| w > 0 && h > 0) {
        Some((width, height)) => Some(
            oci_spec::runtime::BoxBuilder::default()
                .width(u64::from(width))
                .height(u64::from(height))
                .build()
                .map_err(|e| RuntimeError::Invariant(format!("terminal size: {e}")))?,
        ),
        None => None,
    };
    p.set_console_size(size);
    Ok(p)
}
