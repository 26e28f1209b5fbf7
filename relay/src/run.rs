//! `ember-relay run`: the long-running service. Listens for samplers and runs the driver with
//! its sinks: with `--output-dir`, the files of each window, written when the window closes and
//! at stop; with exporters configured, each completed interval to them. Owns only the policy:
//! refusing root, the stop and reload signals, the window length, the drain timeout. SIGHUP and a
//! changed `--config` file reload the label settings ([`crate::config::reload`]).

use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use ember_protocol::Limits;

use crate::config::labels::LabelConfig;
use crate::labels::stage::LabelSettings;
use crate::{
    config::{reload::Reloader, Exporters},
    driver::{self, Driver, Flow, Policy, Tick},
    metrics::{self, Metrics, MetricsSettings},
    privileges,
    session::FileLimits,
    sink::{
        exporters,
        files::{FilesSink, OutputFormat},
        SinkReport, Sinks,
    },
    source, symbolize,
    unwind::sender::UnwindMode,
};

pub struct RunConfig {
    pub socket: PathBuf,
    pub output_dir: Option<PathBuf>,
    /// `--format`: which files `output_dir` gets.
    pub formats: Vec<OutputFormat>,
    pub window: Duration,
    pub max_message_bytes: usize,
    pub allow_root: bool,
    pub sampler_uids: Vec<u32>,
    pub exporters: Exporters,
    pub file_limits: FileLimits,
    /// Tags, relabel rules, process filter, folded root.
    pub labels: LabelConfig,
    /// The Kubernetes labels provider, when on.
    pub kubernetes: Option<crate::labels::kubernetes::KubernetesSettings>,
    /// `--unwind`: with `dwarf`, unwind tables are compiled and sent to each sampler.
    pub unwind: UnwindMode,
    /// `--metrics-address`: where /metrics, /healthz and /readyz are served.
    pub metrics: MetricsSettings,
    /// `--state-dir`; `None`: the default ([`crate::unwind::sender::default_state_dir`]).
    pub state_dir: Option<PathBuf>,
}

/// How long `run` tries to deliver what is queued when it is stopped.
const EXPORT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(config: RunConfig) -> anyhow::Result<()> {
    if nix::unistd::Uid::effective().is_root() {
        if !config.allow_root {
            bail!(
                "refusing to run as root: the relay parses untrusted ELF/DWARF and needs no \
                 privileges. Run it as an unprivileged user (e.g. `sudo -u nobody ember-relay run`), \
                 or pass --allow-root to override"
            );
        }
        tracing::warn!("running as root because of --allow-root; this is not recommended");
    }
    privileges::set_no_new_privs()?;
    // Never dumpable: no other process of this uid may read our memory or take our descriptors.
    privileges::set_non_dumpable()?;
    ember_common::install_stop_handlers()?;
    ember_common::install_reload_handler()?;
    symbolize::sigbus::install().context("installing the SIGBUS guard")?;
    source::raise_nofile_limit();
    let limits = Limits {
        max_message_bytes: config.max_message_bytes,
    };
    let (events_tx, events) = driver::intake();
    let refusals = Arc::new(source::Refusals::default());
    source::spawn_listener(
        &config.socket,
        limits,
        config.sampler_uids,
        events_tx,
        Arc::clone(&refusals),
    )
    .with_context(|| {
        format!(
            "cannot listen on {}; check that its directory exists and this user may write to it",
            config.socket.display()
        )
    })?;
    let status = privileges::status();
    tracing::info!(
        socket = %config.socket.display(),
        uid = %status.uid,
        cap_eff = %status.cap_eff,
        "listening for ember-sampler"
    );
    let mut sinks = Sinks::default();
    if let Some(dir) = &config.output_dir {
        sinks.push(Box::new(
            FilesSink::create(dir, &config.formats)?.with_folded_root(config.labels.folded_root),
        ));
    }
    let metrics = Arc::new(Metrics::default().with_refusals(refusals));
    metrics::serve(config.metrics, &metrics)?;
    sinks.extend(exporters::start(config.exporters, &metrics)?);
    let source = config.labels.source.clone();
    let reloader = Reloader::new(
        source.config.clone(),
        Box::new(move || source.settings()),
        true,
    );
    let mut labels = config.labels.stage();
    if let Some(settings) = &config.kubernetes {
        if let Some(pods) = crate::labels::kubernetes::start(settings)? {
            labels = labels.with_kubernetes(pods);
        }
    }
    let state_dir = match (config.unwind, config.state_dir) {
        (UnwindMode::Dwarf, None) => crate::unwind::sender::default_state_dir(),
        (_, dir) => dir,
    };
    let driver = Driver::new(sinks, config.file_limits, Some(config.window))
        .with_labels(labels)
        .with_unwind(config.unwind, state_dir.as_deref())?
        .with_metrics(metrics);
    let ended = driver.run(&events, &mut Service { reloader })?;
    ended
        .sinks
        .finish(&ended.window, EXPORT_DRAIN_TIMEOUT, &mut |report| {
            match report {
                Ok(SinkReport::Otlp(done)) => tracing::info!(
                    endpoint = %done.endpoint,
                    outcome = ?done.drained,
                    samples_sent = done.stats.samples_sent,
                    "OTLP exporter stopped"
                ),
                Ok(_) => {}
                // A failed sink must not keep the others from finishing.
                Err(err) => tracing::error!("{err:#}"),
            }
            Ok(())
        })
}

/// `run`'s policy: serve until the stop signal (the listener must never go away), reloading
/// the label settings when asked.
struct Service {
    reloader: Reloader,
}

impl Policy for Service {
    fn poll_period(&self) -> Duration {
        Duration::from_millis(250)
    }

    fn check(&mut self, tick: &Tick, samples: u64) -> anyhow::Result<Flow> {
        if *tick == Tick::Disconnected {
            bail!("the socket listener stopped");
        }
        if ember_common::stop_requested() {
            tracing::info!(samples, "stopping");
            return Ok(Flow::Stop);
        }
        Ok(Flow::Continue)
    }

    fn reload(&mut self, now: Instant) -> Option<LabelSettings> {
        self.reloader.poll(now)
    }
}
