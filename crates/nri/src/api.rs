//! NRI protocol messages (generated from `proto/nri.proto`) and the protocol's constants.

#![allow(missing_docs, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

/// Fully qualified name of the service plugins serve.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// Fully qualified name of the service runtimes serve.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// Method names of the two services.
pub mod method {
    pub const REGISTER_PLUGIN: &str = "RegisterPlugin";
    pub const UPDATE_CONTAINERS: &str = "UpdateContainers";

    pub const CONFIGURE: &str = "Configure";
    pub const SYNCHRONIZE: &str = "Synchronize";
    pub const SHUTDOWN: &str = "Shutdown";
    pub const RUN_POD_SANDBOX: &str = "RunPodSandbox";
    pub const UPDATE_POD_SANDBOX: &str = "UpdatePodSandbox";
    pub const POST_UPDATE_POD_SANDBOX: &str = "PostUpdatePodSandbox";
    pub const STOP_POD_SANDBOX: &str = "StopPodSandbox";
    pub const REMOVE_POD_SANDBOX: &str = "RemovePodSandbox";
    pub const CREATE_CONTAINER: &str = "CreateContainer";
    pub const POST_CREATE_CONTAINER: &str = "PostCreateContainer";
    pub const START_CONTAINER: &str = "StartContainer";
    pub const POST_START_CONTAINER: &str = "PostStartContainer";
    pub const UPDATE_CONTAINER: &str = "UpdateContainer";
    pub const POST_UPDATE_CONTAINER: &str = "PostUpdateContainer";
    pub const STOP_CONTAINER: &str = "StopContainer";
    pub const REMOVE_CONTAINER: &str = "RemoveContainer";
    pub const STATE_CHANGE: &str = "StateChange";
    pub const VALIDATE_CONTAINER_ADJUSTMENT: &str = "ValidateContainerAdjustment";
}

/// Environment variable holding the inherited socket's fd number (pre-registered plugins).
pub const PLUGIN_SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// Environment variable holding the plugin name the runtime launched it under.
pub const PLUGIN_NAME_ENV: &str = "NRI_PLUGIN_NAME";
/// Environment variable holding the plugin index the runtime launched it under.
pub const PLUGIN_IDX_ENV: &str = "NRI_PLUGIN_IDX";
/// Where runtimes listen for external plugins by default.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// Protocol level this crate implements, reported in registration and configuration.
pub const NRI_VERSION: &str = "v0.12.0";

/// A set of [`Event`]s: bit `n-1` stands for event `n`, as in `ConfigureResponse.events`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EventMask(pub i32);

impl EventMask {
    /// No events.
    pub const EMPTY: EventMask = EventMask(0);
    /// Every event a plugin can subscribe to (1..=14).
    pub const ALL: EventMask = EventMask((1 << (Event::Last as i32 - 1)) - 1);

    /// The mask holding only `event`.
    pub const fn of(event: Event) -> EventMask {
        EventMask(1 << (event as i32 - 1))
    }

    /// Adds `event`.
    pub fn set(&mut self, event: Event) {
        self.0 |= EventMask::of(event).0;
    }

    /// True if `event` is in the set.
    pub fn contains(self, event: Event) -> bool {
        event != Event::Unknown && event != Event::Last && self.0 & EventMask::of(event).0 != 0
    }

    /// True if every event of `other` is in the set.
    pub fn includes(self, other: EventMask) -> bool {
        other.0 & !self.0 == 0
    }

    /// The bits that are not valid events.
    pub fn invalid_bits(self) -> i32 {
        self.0 & !EventMask::ALL.0
    }

    /// True if no event is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The events in the set, in event order.
    pub fn events(self) -> impl Iterator<Item = Event> {
        (1..Event::Last as i32)
            .filter_map(|n| Event::try_from(n).ok())
            .filter(move |e| self.contains(*e))
    }
}

impl std::ops::BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: EventMask) -> EventMask {
        EventMask(self.0 | rhs.0)
    }
}

impl std::fmt::Display for EventMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.events().map(|e| e.as_str_name()).collect();
        write!(f, "{}", names.join(","))
    }
}

/// Why a plugin name or index was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// Name empty or with characters outside `[a-zA-Z0-9_.+-]`.
    #[error("invalid plugin name {0:?}: must be non-empty and use only [a-zA-Z0-9_.+-]")]
    Name(String),
    /// Index not exactly two decimal digits.
    #[error("invalid plugin index {0:?}: must be two decimal digits")]
    Index(String),
}

/// Checks a plugin name as runtimes do.
pub fn check_plugin_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-'));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Name(name.to_string()))
    }
}

/// Checks a plugin index (two decimal digits).
pub fn check_plugin_index(idx: &str) -> Result<(), IdentityError> {
    if idx.len() == 2 && idx.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(IdentityError::Index(idx.to_string()))
    }
}

/// Splits an `NN-name` executable or configuration base name into index and name.
pub fn parse_plugin_name(base: &str) -> Result<(String, String), IdentityError> {
    let (idx, name) = base
        .split_once('-')
        .ok_or_else(|| IdentityError::Index(base.to_string()))?;
    check_plugin_index(idx)?;
    check_plugin_name(name)?;
    Ok((idx.to_string(), name.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn event_mask_bits_follow_event_numbers() {
        assert_eq!(EventMask::of(Event::RunPodSandbox).0, 0x1);
        assert_eq!(EventMask::of(Event::CreateContainer).0, 0x8);
        assert_eq!(EventMask::of(Event::ValidateContainerAdjustment).0, 0x2000);
        assert_eq!(EventMask::ALL.0, 0x3FFF);
        let m = EventMask::of(Event::CreateContainer) | EventMask::of(Event::StopContainer);
        assert_eq!(
            m.events().collect::<Vec<_>>(),
            vec![Event::CreateContainer, Event::StopContainer]
        );
        assert_eq!(EventMask(0x4000).invalid_bits(), 0x4000);
        assert_eq!(m.to_string(), "CREATE_CONTAINER,STOP_CONTAINER");
    }

    #[test]
    fn plugin_identity_checks() {
        assert!(check_plugin_name("logger.v2+x_y-z").is_ok());
        assert!(check_plugin_name("").is_err());
        assert!(check_plugin_name("a/b").is_err());
        assert!(check_plugin_index("05").is_ok());
        assert!(check_plugin_index("5").is_err());
        assert!(check_plugin_index("1a").is_err());
        assert_eq!(
            parse_plugin_name("10-logger").unwrap(),
            ("10".to_string(), "logger".to_string())
        );
        assert!(parse_plugin_name("logger").is_err());
    }
}
