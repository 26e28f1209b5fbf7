//! The export side of `run` and `record`: the configured exporters (OTLP, debug), started after
//! the relay dropped its privileges, handed each completed interval, and drained at the end.

use std::time::Duration;

use anyhow::Context as _;

use crate::{
    config::Exporters,
    model::Profile,
    sink::{
        debug::{self, DebugSettings},
        otlp::{stats::Snapshot, Drained, Exporter},
    },
};

/// Running exporters.
#[derive(Default)]
pub struct Exports {
    otlp: Option<Exporter>,
    debug: Option<DebugSettings>,
}

/// How the OTLP exporter ended.
pub struct Finished {
    pub endpoint: String,
    pub drained: Drained,
    pub stats: Snapshot,
}

impl Exports {
    /// Starts the exporters `config` enables (none: a no-op set).
    pub fn start(config: Exporters) -> anyhow::Result<Self> {
        let otlp = config
            .otlp
            .map(Exporter::start)
            .transpose()
            .context("starting the OTLP exporter")?;
        Ok(Self {
            otlp,
            debug: config.debug,
        })
    }

    pub fn enabled(&self) -> bool {
        self.otlp.is_some() || self.debug.is_some()
    }

    /// Hands one interval's profile to every exporter (never blocks on the network).
    pub fn export(&self, profile: Profile) {
        if let Some(settings) = &self.debug {
            debug::print(&profile, settings);
        }
        if let Some(otlp) = &self.otlp {
            otlp.export(profile);
        }
    }

    pub fn otlp_stats(&self) -> Option<Snapshot> {
        self.otlp.as_ref().map(Exporter::stats)
    }

    /// Drains the OTLP exporter for up to `timeout`.
    pub fn finish(self, timeout: Duration) -> Option<Finished> {
        let otlp = self.otlp?;
        let endpoint = otlp.description().to_owned();
        let (drained, stats) = otlp.shutdown(timeout);
        Some(Finished {
            endpoint,
            drained,
            stats,
        })
    }
}
