//! What every config section's resolution shares: the error type, durations written as text,
//! and the precedence of the layers a setting can come from (flag > file > environment >
//! default). Knows no section and no command: the config file's root (`config`) and each sink's
//! own section (`sink::otlp::config`) use these alike, so a sink never reaches up into the
//! command layer for them.

use std::{fmt, path::Path, time::Duration};

use serde::{Deserialize, Deserializer};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{setting}: {reason}")]
    Invalid { setting: String, reason: String },
    #[error("TLS settings: {0}")]
    Tls(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// `setting` is wrong, for `reason`.
pub fn invalid(setting: &str, reason: impl fmt::Display) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.to_owned(),
        reason: reason.to_string(),
    }
}

/// Looks an environment variable up (the process environment, or a table in tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The setting from the first layer that has it: the command-line flag, the config file, the
/// environment (read only if neither has it; its text may be invalid), else `default`.
pub fn pick<T>(
    flag: Option<T>,
    file: Option<T>,
    env: impl FnOnce() -> Result<Option<T>, ConfigError>,
    default: T,
) -> Result<T, ConfigError> {
    match flag.or(file) {
        Some(value) => Ok(value),
        None => Ok(env()?.unwrap_or(default)),
    }
}

/// Reads the file `path` names, if any; `setting` names it in the error.
pub fn read_file(setting: &str, path: Option<String>) -> Result<Option<Vec<u8>>, ConfigError> {
    path.map(|p| {
        // As the `sudo` user, when root runs for one (see `invoker_files`).
        let invoker = crate::invoker_files::invoker();
        crate::invoker_files::read(Path::new(&p), invoker).map_err(|source| ConfigError::Read {
            path: format!("{p} ({setting})"),
            source,
        })
    })
    .transpose()
}

/// A duration written as `10s`, `500ms`, `2m` (or a bare number of seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationText(pub Duration);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 10s, 500ms or 2m")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationText, E> {
                ember_common::parse_duration(v)
                    .map(DurationText)
                    .map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationText, E> {
                Ok(DurationText(Duration::from_secs(v)))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationText, E> {
                u64::try_from(v)
                    .map(|v| DurationText(Duration::from_secs(v)))
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_layer_that_has_a_setting_wins_and_the_environment_is_read_last() {
        let env_unread = || -> Result<Option<u8>, ConfigError> { panic!("env read") };
        assert_eq!(pick(Some(1), Some(2), env_unread, 9).unwrap(), 1);
        assert_eq!(pick(None, Some(2), env_unread, 9).unwrap(), 2);
        assert_eq!(pick(None, None, || Ok(Some(3)), 9).unwrap(), 3);
        assert_eq!(pick(None, None, || Ok(None), 9).unwrap(), 9);
        let bad = || Err(invalid("OTEL_X", "bad"));
        assert!(pick::<u8>(None, None, bad, 9).is_err());
    }
}
