//! The debug exporter's configuration: the `exporters.debug` section of the relay's config file
//! (present = enabled), resolved into [`DebugSettings`] with the OTLP request shape it prints.

use serde::Deserialize;

use crate::sink::otlp::EncodeSettings;

/// How much to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verbosity {
    /// One line per request.
    Basic,
    /// Plus each resource's attributes and sample count.
    Normal,
    /// Plus every sample with its attributes and frames.
    Detailed,
}

/// `exporters.debug`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebugConfig {
    /// `basic` (one line per request), `normal` (resources and sample counts) or `detailed`
    /// (every sample with its attributes and frames). Default: normal.
    pub verbosity: Option<Verbosity>,
}

/// The debug exporter, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugSettings {
    pub verbosity: Verbosity,
    /// How the OTLP exporter builds requests (generation, attributes, size limit): the debug
    /// exporter prints the same requests, split the same way.
    pub encoding: EncodeSettings,
}

/// `config` with the OTLP request shape `encoding`.
pub fn resolve(config: &DebugConfig, encoding: EncodeSettings) -> DebugSettings {
    DebugSettings {
        verbosity: config.verbosity.unwrap_or(Verbosity::Normal),
        encoding,
    }
}

/// One line describing resolved settings, for logs and `validate`.
pub fn describe(settings: &DebugSettings) -> String {
    format!("debug: verbosity {:?}", settings.verbosity)
}
