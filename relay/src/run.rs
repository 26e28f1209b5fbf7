//! `ember-relay run`: the long-running service. Listens for samplers, symbolizes every batch and,
//! with `--output-dir`, keeps the local files of the current window up to date; with exporters
//! configured, hands each completed interval to them.

use std::{
    path::PathBuf,
    sync::mpsc::{self, RecvTimeoutError},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use ember_protocol::Limits;

use crate::{
    cli,
    config::Exporters,
    export::Exports,
    output::OutputSet,
    pipeline::{Handled, Pipeline},
    privileges,
    session::FileLimits,
    source, symbolize,
};

pub struct RunConfig {
    pub socket: PathBuf,
    pub output_dir: Option<PathBuf>,
    pub window: Duration,
    pub max_message_bytes: usize,
    pub allow_root: bool,
    pub sampler_uids: Vec<u32>,
    pub exporters: Exporters,
    pub file_limits: FileLimits,
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
    cli::install_stop_handlers()?;
    symbolize::sigbus::install().context("installing the SIGBUS guard")?;
    source::raise_nofile_limit();
    let limits = Limits {
        max_message_bytes: config.max_message_bytes,
    };
    let (events_tx, events) = mpsc::sync_channel(source::INTAKE_CAPACITY);
    source::spawn_listener(&config.socket, limits, config.sampler_uids, events_tx).with_context(
        || {
            format!(
            "cannot listen on {}; check that its directory exists and this user may write to it",
            config.socket.display()
        )
        },
    )?;
    let status = privileges::status();
    tracing::info!(
        socket = %config.socket.display(),
        uid = %status.uid,
        cap_eff = %status.cap_eff,
        "listening for ember-sampler"
    );
    let mut outputs = match &config.output_dir {
        Some(dir) => Some(OutputSet::create(dir)?),
        None => None,
    };
    let exports = Exports::start(config.exporters)?;
    let mut pipeline = if exports.enabled() {
        Pipeline::with_export()
    } else {
        Pipeline::new()
    };
    pipeline.set_file_limits(config.file_limits);
    let mut window_start = Instant::now();
    loop {
        match events.recv_timeout(Duration::from_millis(250)) {
            Ok(event) => {
                if let Handled::Batch { last_part, .. } = pipeline.handle(event) {
                    if let Some(outputs) = outputs.as_mut() {
                        if let Err(err) = outputs.write(&pipeline.profile) {
                            tracing::error!("{err:#}");
                        }
                    }
                    if last_part {
                        if let Some(profile) = pipeline.take_export() {
                            exports.export(profile);
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("the socket listener stopped"),
        }
        if cli::stop_requested() {
            tracing::info!(samples = pipeline.samples, "stopping");
            if let Some(profile) = pipeline.take_export() {
                exports.export(profile);
            }
            if let Some(done) = exports.finish(EXPORT_DRAIN_TIMEOUT) {
                tracing::info!(
                    endpoint = %done.endpoint,
                    outcome = ?done.drained,
                    samples_sent = done.stats.samples_sent,
                    "OTLP exporter stopped"
                );
            }
            return Ok(());
        }
        if window_start.elapsed() >= config.window {
            let done = pipeline.take_profile();
            tracing::info!(
                samples = done.total_samples(),
                "window complete; starting a new one"
            );
            window_start = Instant::now();
        }
    }
}
