//! The exporters: the config file's `exporters:` section ([`ExportersConfig`]), its resolution
//! with the `--otlp-*` flags and the environment into what runs ([`Exporters`]), and the
//! exporters as sinks, OTLP and debug, started after the relay dropped its privileges (threads
//! created earlier would keep root's capabilities). Both take each completed interval; neither
//! cares about windows. Adapters only: the exporters themselves live in `otlp/` and `debug`,
//! each with its own section's type and resolution, and are used through their public API.
//!
//! Resolution reads the TLS files the section names, so it runs before the relay drops
//! privileges.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use serde::Deserialize;

use super::{
    debug::{self, DebugConfig, DebugSettings},
    otlp::{
        self,
        config::{OtlpConfig, OtlpFlags},
        exporter::Settings,
        stats::Snapshot,
        Drained, Exporter,
    },
    Sink, SinkReport,
};
use crate::{
    labels::labeled::LabeledProfile,
    layers::{ConfigError, Env},
    metrics::Metrics,
};

/// `exporters:`: where profiles go besides the local files.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportersConfig {
    /// OTLP profiles exporter (Pyroscope, OpenTelemetry Collector). Present = enabled.
    pub otlp: Option<OtlpConfig>,
    /// Prints what the OTLP exporter would send. Present = enabled.
    pub debug: Option<DebugConfig>,
}

/// What the relay exports to, resolved.
#[derive(Clone, Debug, Default)]
pub struct Exporters {
    pub otlp: Option<Settings>,
    pub debug: Option<DebugSettings>,
}

/// Resolves the file's `exporters:` section, `flags` and the environment (`env` looks a
/// variable up) into exporter settings, reading the TLS files it names.
pub fn resolve(
    section: &ExportersConfig,
    flags: &OtlpFlags,
    env: Env<'_>,
) -> Result<Exporters, ConfigError> {
    let otlp_file = section.otlp.as_ref();
    // The debug exporter shows the requests the OTLP exporter would send: same shape.
    let encoding = otlp::config::encode_settings(otlp_file, flags)?;
    Ok(Exporters {
        otlp: otlp::config::resolve(otlp_file, flags, env, encoding)?,
        debug: section
            .debug
            .as_ref()
            .map(|d| debug::config::resolve(d, encoding)),
    })
}

/// One line per exporter describing what it resolved to, for logs and `validate`.
pub fn describe(exporters: &Exporters) -> Vec<String> {
    vec![
        exporters
            .otlp
            .as_ref()
            .map_or_else(|| "otlp: off".to_owned(), otlp::config::describe),
        exporters
            .debug
            .as_ref()
            .map_or_else(|| "debug: off".to_owned(), debug::config::describe),
    ]
}

/// Warnings about resolved exporters, for logs and `validate` (credentials in plaintext).
pub fn warnings(exporters: &Exporters) -> Vec<String> {
    exporters
        .otlp
        .as_ref()
        .map(otlp::config::warnings)
        .unwrap_or_default()
}

/// How the OTLP exporter ended.
#[derive(Debug)]
pub(crate) struct OtlpFinished {
    pub endpoint: String,
    pub drained: Drained,
    pub stats: Snapshot,
}

/// Starts the exporters `config` enables, debug first (as it prints, OTLP queues); `metrics`
/// serves the OTLP exporter's counters.
pub(crate) fn start(config: Exporters, metrics: &Metrics) -> anyhow::Result<Vec<Box<dyn Sink>>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(settings) = config.debug {
        sinks.push(Box::new(DebugSink(settings)));
    }
    if let Some(settings) = config.otlp {
        let exporter = Exporter::start(settings).context("starting the OTLP exporter")?;
        metrics.watch_exporter(exporter.shared_stats());
        sinks.push(Box::new(OtlpSink(exporter)));
    }
    Ok(sinks)
}

/// Prints each interval as the OTLP request(s) it would make.
struct DebugSink(DebugSettings);

impl Sink for DebugSink {
    fn interval(&mut self, profile: &Arc<LabeledProfile>) {
        debug::print(profile, &self.0);
    }

    fn finish(self: Box<Self>, _: &LabeledProfile, _: Duration) -> anyhow::Result<SinkReport> {
        Ok(SinkReport::Quiet)
    }
}

/// Queues each interval for the OTLP exporter's own thread (never blocks on the network).
struct OtlpSink(Exporter);

impl Sink for OtlpSink {
    fn interval(&mut self, profile: &Arc<LabeledProfile>) {
        if !profile.is_empty() {
            self.0.export_shared(profile);
        }
    }

    fn finish(self: Box<Self>, _: &LabeledProfile, drain: Duration) -> anyhow::Result<SinkReport> {
        let endpoint = self.0.description().to_owned();
        let (drained, stats) = self.0.shutdown(drain);
        Ok(SinkReport::Otlp(Box::new(OtlpFinished {
            endpoint,
            drained,
            stats,
        })))
    }
}
