//! The relay's parts, assembled one way for `run` and `record` from one [`Settings`]: the stop
//! handlers, the SIGBUS guard and the descriptor limit, the files sink and the labels stage
//! ([`prepare`]); then the intake, the metrics endpoint, the exporters, the Kubernetes labels
//! provider, the unwind-table worker and the driver ([`Prepared::start`]). The commands keep
//! only their policy: `run` refuses root, reloads labels and listens on a socket; `record`
//! starts the sampler, drops privileges and prints a summary. Each command hands its source the
//! [`Intake`], runs the [`Relay`] under its driver [`Policy`] and finishes the sinks its way.
//!
//! Two steps because of privileges: [`prepare`] runs while the process may still be root and
//! before any thread exists (`record` makes the output directory as root, in a directory the
//! invoking user may own, and reads `/etc/passwd` and the machine id then); [`Prepared::start`]
//! runs after `record` dropped to its user, since threads created earlier would keep root's
//! capabilities. Every thread the relay starts is started there.

use std::{
    fmt,
    path::PathBuf,
    sync::{
        mpsc::{Receiver, SyncSender},
        Arc,
    },
    time::Duration,
};

use anyhow::Context as _;
use ember_protocol::Limits;

use crate::{
    config::labels::LabelConfig,
    driver::{self, Driver, Ended, Policy},
    labels::{
        kubernetes::{self, KubernetesSettings},
        stage::LabelStage,
    },
    metrics::{self, Metrics, MetricsSettings},
    session::FileLimits,
    sink::{
        exporters::{self, Exporters},
        files::{FilesSink, OutputFormat},
        Sinks,
    },
    source::Refusals,
    source::{self, SourceEvent},
    symbolize,
    unwind::sender::UnwindMode,
};

/// Everything the relay's parts are built from, the same for both commands.
pub(crate) struct Settings {
    /// Where the local files go (`run --output-dir`, `record -o`); `None`: no files.
    pub output_dir: Option<PathBuf>,
    /// `--format`: which files `output_dir` gets.
    pub formats: Vec<OutputFormat>,
    /// `run --window`: how long each window of the files lasts; `None`: one window for the
    /// whole run (`record`).
    pub window: Option<Duration>,
    /// `--max-message-bytes`: the largest message a source accepts from a sampler.
    pub max_message_bytes: usize,
    pub file_limits: FileLimits,
    /// Resolved before privileges are dropped (TLS files are read then).
    pub exporters: Exporters,
    /// `--metrics-address`: where /metrics, /healthz and /readyz are served, if anywhere.
    pub metrics: MetricsSettings,
    /// Tags, relabel rules, process filter, folded root.
    pub labels: LabelConfig,
    /// The Kubernetes labels provider, when on.
    pub kubernetes: Option<KubernetesSettings>,
    /// `--unwind`: with `dwarf`, unwind tables are compiled and sent to each sampler.
    pub unwind: UnwindMode,
    /// `--state-dir`: where compiled unwind tables are cached; `None`: no cache.
    pub state_dir: Option<PathBuf>,
    /// `--interpreters`: walk the frames of recognized interpreters (CPython) in the kernel.
    pub interpreters: bool,
    /// `--off-cpu`: the minimum wait kept whole when off-CPU time is recorded (adds the
    /// off-CPU files beside svg and folded); `None`: CPU only.
    pub off_cpu: Option<Duration>,
}

/// The output directory or its files could not be created: its own error, so a command can
/// name the flag to change. Shows the underlying error's whole chain.
#[derive(Debug)]
pub(crate) struct OutputUnwritable {
    pub dir: PathBuf,
    pub source: anyhow::Error,
}

impl fmt::Display for OutputUnwritable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.source)
    }
}

impl std::error::Error for OutputUnwritable {}

/// The parts made by [`prepare`], waiting for [`Prepared::start`].
pub(crate) struct Prepared {
    files: Option<FilesSink>,
    labels: LabelStage,
    settings: Settings,
}

/// The first step, while the process may still be privileged and before any thread: the stop
/// handlers (SIGINT, SIGTERM), the SIGBUS guard of the symbolizer's file reads, the descriptor
/// limit, the output files (a directory that cannot be made is refused now, with
/// [`OutputUnwritable`]) and the labels stage (reads `/etc/passwd` and the machine id,
/// bounded).
pub(crate) fn prepare(settings: Settings) -> anyhow::Result<Prepared> {
    ember_common::install_stop_handlers()?;
    symbolize::sigbus::install().context("installing the SIGBUS guard")?;
    source::raise_nofile_limit();
    let files = match &settings.output_dir {
        Some(dir) => Some(
            FilesSink::create(
                dir,
                &if settings.off_cpu.is_some() {
                    OutputFormat::with_off_cpu(&settings.formats)
                } else {
                    settings.formats.clone()
                },
            )
            .map_err(|source| OutputUnwritable {
                dir: dir.clone(),
                source,
            })?
            .with_folded_root(settings.labels.folded_root),
        ),
        None => None,
    };
    let labels = settings.labels.stage();
    Ok(Prepared {
        files,
        labels,
        settings,
    })
}

impl Prepared {
    /// The second step, unprivileged: the intake, the metrics endpoint (served from here on),
    /// the sinks (files first, then the exporters), the Kubernetes provider and the driver with
    /// its unwind-table worker. The command connects its source to the [`Intake`].
    pub(crate) fn start(self) -> anyhow::Result<(Relay, Intake)> {
        let Self {
            files,
            mut labels,
            settings,
        } = self;
        let (events_tx, events) = driver::intake();
        let mut sinks = Sinks::default();
        if let Some(files) = files {
            sinks.push(Box::new(files));
        }
        // The source counts what it refuses into this; /metrics and /readyz read it.
        let refusals = Arc::new(Refusals::default());
        let metrics = Arc::new(Metrics::default().with_refusals(Arc::clone(&refusals)));
        metrics::serve(settings.metrics, &metrics)?;
        sinks.extend(exporters::start(settings.exporters, &metrics)?);
        if let Some(settings) = &settings.kubernetes {
            if let Some(pods) = kubernetes::start(settings)? {
                labels = labels.with_kubernetes(pods);
            }
        }
        let driver = Driver::new(sinks, settings.file_limits, settings.window)
            .with_labels(labels)
            .with_unwind(settings.unwind, settings.state_dir.as_deref())?
            .with_interpreters(settings.interpreters)
            .with_metrics(metrics);
        let intake = Intake {
            events: events_tx,
            limits: Limits {
                max_message_bytes: settings.max_message_bytes,
            },
            refusals,
        };
        Ok((Relay { driver, events }, intake))
    }
}

/// Where a source sends what it reads from its samplers, the limits it reads them with, and
/// where it counts what it refuses.
pub(crate) struct Intake {
    pub events: SyncSender<SourceEvent>,
    pub limits: Limits,
    pub refusals: Arc<Refusals>,
}

/// The assembled relay: the driver and the receiving end of its intake.
pub(crate) struct Relay {
    driver: Driver,
    events: Receiver<SourceEvent>,
}

impl Relay {
    /// Runs the driver's loop until `policy` says stop (see [`Driver::run`]); the command then
    /// finishes the sinks of what it returns.
    pub(crate) fn run(self, policy: &mut dyn Policy) -> anyhow::Result<Ended> {
        self.driver.run(&self.events, policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsAddress;

    /// No exporters, no metrics, no unwinding: only what `prepare` makes, with `output_dir`.
    fn settings(output_dir: PathBuf) -> Settings {
        Settings {
            output_dir: Some(output_dir),
            formats: OutputFormat::DEFAULT.to_vec(),
            window: None,
            max_message_bytes: 4 << 20,
            file_limits: FileLimits::default(),
            exporters: Exporters::default(),
            metrics: MetricsSettings {
                address: MetricsAddress::Off,
                explicit: false,
            },
            labels: LabelConfig::default(),
            kubernetes: None,
            unwind: UnwindMode::Fp,
            state_dir: None,
            interpreters: true,
            off_cpu: None,
        }
    }

    #[test]
    fn an_output_directory_that_cannot_be_made_is_told_apart_and_shown_as_the_sink_says() {
        // Given an output directory below a regular file: it cannot be made
        let tmp = tempfile::tempdir().expect("temp dir");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").expect("write the file");
        let dir = file.join("out");
        let Err(direct) = FilesSink::create(&dir, &OutputFormat::DEFAULT) else {
            panic!("{} was created", dir.display())
        };
        // When the parts are prepared with it
        let Err(err) = prepare(settings(dir.clone())) else {
            panic!("prepared with {}", dir.display())
        };
        // Then the error says which directory (so `record` can name -o), and reads as the files
        // sink's own error (what `run` has always printed)
        let unwritable = err
            .downcast_ref::<OutputUnwritable>()
            .expect("an OutputUnwritable");
        assert_eq!(unwritable.dir, dir);
        assert_eq!(format!("{err:#}"), format!("{direct:#}"));
    }
}
