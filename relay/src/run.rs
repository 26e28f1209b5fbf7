//! `ember-relay run`: the long-running service. Listens for samplers and runs the driver with
//! its sinks: with `--output-dir`, the files of each window, written when the window closes and
//! at stop; with exporters configured, each completed interval to them. The parts are built by
//! [`crate::assembly`]; `run` owns only its policy: refusing root, the reload signal, the
//! default state directory, the listening socket, when to stop, and logging how each sink
//! finished within the drain timeout. SIGHUP and a changed `--config` file reload the label
//! settings ([`crate::config::reload`]).

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    assembly::{self, Settings},
    config::{labels::LabelConfig, reload::Reloader},
    driver::{Flow, Policy, Tick},
    labels::stage::LabelSettings,
    privileges,
    sink::SinkReport,
    source,
    unwind::sender::{self, UnwindMode},
};

pub struct RunConfig {
    pub socket: PathBuf,
    pub allow_root: bool,
    pub sampler_uids: Vec<u32>,
    /// The relay's parts: `--output-dir` and `--window`, the exporters, metrics, labels (with
    /// Kubernetes), unwinding. `state_dir` `None` here: the default
    /// ([`sender::default_state_dir`]).
    pub parts: Settings,
}

/// How long `run` tries to deliver what is queued when it is stopped.
const EXPORT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub fn run(config: RunConfig) -> anyhow::Result<()> {
    refuse_root(config.allow_root)?;
    privileges::set_no_new_privs()?;
    // Never dumpable: no other process of this uid may read our memory or take our descriptors.
    privileges::set_non_dumpable()?;
    ember_common::install_reload_handler()?;
    let mut parts = config.parts;
    if parts.unwind == UnwindMode::Dwarf && parts.state_dir.is_none() {
        parts.state_dir = sender::default_state_dir();
    }
    let reloader = reloader(&parts.labels);
    let (relay, intake) = assembly::prepare(parts)?.start()?;
    source::spawn_listener(
        &config.socket,
        intake.limits,
        config.sampler_uids,
        intake.events,
        intake.refusals,
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
    let ended = relay.run(&mut Service { reloader })?;
    ended
        .sinks
        .finish(&ended.window, EXPORT_DRAIN_TIMEOUT, &mut log_report)
}

/// The relay parses untrusted ELF/DWARF and needs no privileges: root only when asked for.
fn refuse_root(allow_root: bool) -> anyhow::Result<()> {
    if nix::unistd::Uid::effective().is_root() {
        if !allow_root {
            bail!(
                "refusing to run as root: the relay parses untrusted ELF/DWARF and needs no \
                 privileges. Run it as an unprivileged user (e.g. `sudo -u nobody ember-relay run`), \
                 or pass --allow-root to override"
            );
        }
        tracing::warn!("running as root because of --allow-root; this is not recommended");
    }
    Ok(())
}

/// What reloads the label settings: the flags and config file they came from, read again.
fn reloader(labels: &LabelConfig) -> Reloader {
    let source = labels.source.clone();
    Reloader::new(
        source.config.clone(),
        Box::new(move || source.settings()),
        true,
    )
}

/// How `run` tells what each sink did at the end: in the log. A failed sink must not keep the
/// others from finishing.
fn log_report(report: anyhow::Result<SinkReport>) -> anyhow::Result<()> {
    match report {
        Ok(SinkReport::Otlp(done)) => tracing::info!(
            endpoint = %done.endpoint,
            outcome = ?done.drained,
            samples_sent = done.stats.samples_sent,
            "OTLP exporter stopped"
        ),
        Ok(_) => {}
        Err(err) => tracing::error!("{err:#}"),
    }
    Ok(())
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
