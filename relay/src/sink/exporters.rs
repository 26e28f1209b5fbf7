//! The exporters as sinks: OTLP and debug, started after the relay dropped its privileges
//! (threads created earlier would keep root's capabilities). Both take each completed interval;
//! neither cares about windows. Adapters only: the exporters themselves live in `otlp/` and
//! `debug`, and are used through their public API.

use std::time::Duration;

use anyhow::Context as _;

use super::{
    debug::{self, DebugSettings},
    otlp::{stats::Snapshot, Drained, Exporter},
    Sink, SinkReport,
};
use crate::{config::Exporters, metrics::Metrics, model::Profile};

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
    fn interval(&mut self, profile: &Profile) {
        debug::print(profile, &self.0);
    }

    fn finish(self: Box<Self>, _: &Profile, _: Duration) -> anyhow::Result<SinkReport> {
        Ok(SinkReport::Quiet)
    }
}

/// Queues each interval for the OTLP exporter's own thread (never blocks on the network).
struct OtlpSink(Exporter);

impl Sink for OtlpSink {
    fn interval(&mut self, profile: &Profile) {
        if !profile.is_empty() {
            self.0.export(profile.clone());
        }
    }

    fn finish(self: Box<Self>, _: &Profile, drain: Duration) -> anyhow::Result<SinkReport> {
        let endpoint = self.0.description().to_owned();
        let (drained, stats) = self.0.shutdown(drain);
        Ok(SinkReport::Otlp(Box::new(OtlpFinished {
            endpoint,
            drained,
            stats,
        })))
    }
}
