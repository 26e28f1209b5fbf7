//! The clap definitions of `run`, `record` and `validate`, and their conversion into the plain
//! config structs of [`run`] and [`record`]. The flags both commands take are flattened groups:
//! [`PartsArgs`] (itself made of groups), and [`FormatArgs`] beside each command's output
//! directory; with that directory they become the [`assembly::Settings`] of the relay's parts.
//! The config file and the environment are resolved by their owners (`config`,
//! `sink::exporters`, `metrics`) on the way.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;

use super::{kubernetes::KubernetesArgs, labels::LabelArgs, parse_duration, LogFormat};
use crate::{
    assembly, config,
    metrics::{MetricsAddress, MetricsSettings},
    record, run, session,
    sink::{
        exporters::{self, Exporters},
        files::OutputFormat,
        otlp::{
            config::{parse_header_flag, OtlpFlags},
            transport::Protocol,
            ProtoVersion,
        },
    },
    unwind::sender::UnwindMode,
    usage::UsageError,
};

#[derive(clap::Args, Debug)]
pub(super) struct ValidateArgs {
    /// The relay config file (YAML).
    #[arg(long, value_name = "FILE")]
    pub(super) config: PathBuf,
}

#[derive(clap::Args, Debug)]
pub(super) struct ReportArgs {
    /// A pprof profile, e.g. the profile.pb.gz `record` wrote (gzipped or not).
    #[arg(value_name = "FILE")]
    pub(super) file: PathBuf,
    /// How many functions to print (the ones with the most self samples first).
    #[arg(long, short = 'n', default_value_t = 20)]
    pub(super) count: usize,
    /// The sample type to count, as pprof's -sample_index: `samples` (default when the profile
    /// has it) or `cpu` (nanoseconds).
    #[arg(long, value_name = "TYPE")]
    pub(super) sample_index: Option<String>,
}

/// Exporter options shared by `run` and `record`. Flags override the config file, which
/// overrides the OTEL_EXPORTER_OTLP_* environment variables.
#[derive(clap::Args, Debug, Default)]
pub(super) struct ExportArgs {
    /// Relay config file (YAML) with `exporters: { otlp: ..., debug: ... }`.
    #[arg(long, value_name = "FILE", env = "EMBER_RELAY_CONFIG")]
    config: Option<PathBuf>,
    /// Export profiles over OTLP to this receiver, e.g. http://pyroscope:4040 (Pyroscope) or
    /// http://collector:4317 (OpenTelemetry Collector, gRPC).
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// OTLP transport: grpc or http (http/protobuf).
    #[arg(long, value_name = "PROTOCOL")]
    otlp_protocol: Option<Protocol>,
    /// OTLP profiles wire generation the receiver speaks: 1.9 (Pyroscope 1.18 and 1.19,
    /// Collector <= 0.147) or 1.10 (Pyroscope >= 1.20, Collector >= 0.148). Default 1.10.
    /// With 1.9, server errors (gRPC UNKNOWN, HTTP 500) are retried: Pyroscope 1.18/1.19 answer
    /// their ingestion limits so (exporters.otlp.retry_on_failure.retry_server_errors).
    #[arg(long, value_name = "VERSION")]
    otlp_proto_version: Option<ProtoVersion>,
    /// Extra request header (gRPC metadata), e.g. X-Scope-OrgID=tenant. Repeatable.
    #[arg(long = "otlp-header", value_name = "K=V", value_parser = parse_header_flag)]
    otlp_headers: Vec<(String, String)>,
    /// Plaintext (h2c/http) for an endpoint given without a scheme.
    #[arg(long)]
    otlp_insecure: bool,
}

impl ExportArgs {
    /// Reads the config file and resolves it with the flags and the environment.
    fn resolve(&self) -> anyhow::Result<Exporters> {
        let file = match &self.config {
            Some(path) => config::load(path)?,
            None => config::RelayConfig::default(),
        };
        let flags = OtlpFlags {
            endpoint: self.otlp_endpoint.clone(),
            protocol: self.otlp_protocol,
            proto_version: self.otlp_proto_version,
            headers: self.otlp_headers.clone(),
            insecure: self.otlp_insecure,
        };
        let exporters =
            exporters::resolve(&file.exporters, &flags, &|name| std::env::var(name).ok())
                .context("resolving the exporter settings")?;
        for line in exporters::describe(&exporters) {
            tracing::info!("exporter {line}");
        }
        for warning in exporters::warnings(&exporters) {
            tracing::warn!("{warning}");
        }
        Ok(exporters)
    }
}

/// The flags `run` and `record` share for what the relay keeps of the sampler's files.
#[derive(clap::Args, Debug)]
pub(super) struct FileLimitArgs {
    /// Largest file copied into the relay's memory (a sealed memfd) when the relay may not
    /// reopen it, e.g. a root-only binary; larger files stay unnamed, with a logged reason.
    #[arg(long, default_value_t = session::FileLimits::default().max_copy_bytes, value_name = "BYTES")]
    max_copy_bytes: u64,
    /// Most passed file descriptors kept open per sampler connection (never above the soft
    /// RLIMIT_NOFILE minus 256); beyond, the least recently used are closed and their frames
    /// stay unnamed.
    #[arg(long, default_value_t = session::FileLimits::default().max_open_files, value_name = "N")]
    max_open_files: usize,
    /// Most binaries whose parsed symbol and line tables the symbolizer keeps at once (each
    /// from a few KiB to tens of MiB for a large binary with debug info); beyond, the least
    /// recently used is closed and parsed again when next needed. Resolvers unused for 2
    /// minutes, or for 10 s once no process maps their file, are closed as well. Lower it to
    /// bound the relay's memory on hosts running many large binaries at once.
    #[arg(long, default_value_t = session::FileLimits::default().symbolizer_cache_files, value_name = "N")]
    symbolizer_cache_files: usize,
    /// Most heap memory the symbolizer's parsed tables and remembered lookups may hold together
    /// (as the relay's allocator counts what each binary's parsing left allocated); beyond, the
    /// parsed tables of the binaries looked up least recently are dropped after each batch, their
    /// remembered lookups kept (the one parsed last stays, whatever its size). Binaries with new
    /// addresses within the last 10 s keep their tables up to 2 times this, so the working set
    /// is not parsed again every batch. Raise it when the same large binaries are parsed again
    /// and again (ember_relay_symbolizer_resolvers_opened_total climbing).
    #[arg(long, default_value_t = session::FileLimits::default().symbolizer_cache_bytes, value_name = "BYTES")]
    symbolizer_cache_bytes: u64,
}

impl FileLimitArgs {
    fn file_limits(&self) -> session::FileLimits {
        session::FileLimits {
            max_copy_bytes: self.max_copy_bytes,
            max_open_files: self.max_open_files,
            symbolizer_cache_files: self.symbolizer_cache_files,
            symbolizer_cache_bytes: self.symbolizer_cache_bytes,
        }
    }
}

/// `--unwind` and where its tables are cached, the same for `run` and `record`.
#[derive(clap::Args, Debug)]
pub(super) struct UnwindArgs {
    /// How user stacks are walked: `dwarf` (the default: the relay compiles each profiled
    /// binary's CFI, .eh_frame and .debug_frame, compressed or not, into an unwind table and
    /// sends it to the sampler, which checks it before use) or `fp` (frame pointers only: nothing compiled or sent). `record` passes it
    /// to the sampler it starts; with `run`, start the sampler with the same --unwind.
    #[arg(long, value_enum, default_value_t = UnwindMode::Dwarf)]
    unwind: UnwindMode,
    /// Where compiled unwind tables are cached (in `unwind-cache/`, at most 256 MiB, verified by
    /// SHA-256 against each binary before use), so the same binaries are not compiled again
    /// after a restart; used with --unwind dwarf only. Default: for `run`, `$STATE_DIRECTORY`
    /// (systemd's StateDirectory=), else /var/lib/ember-relay if writable, else no cache; for
    /// `record`, no cache.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

/// `--format`, the same for `run` and `record`; each flattens it beside its output directory.
#[derive(clap::Args, Debug)]
pub(super) struct FormatArgs {
    /// Which files to write in the output directory (`run --output-dir`, `record -o`): a
    /// comma-separated list of the values below (or the flag repeated). Only those are written
    /// (and `record`'s summary lists them).
    #[arg(
        long = "format",
        value_name = "LIST",
        value_enum,
        value_delimiter = ',',
        default_value = "svg,pprof,folded"
    )]
    formats: Vec<OutputFormat>,
}

/// The flags of the relay's parts, the same for `run` and `record`: with the output directory
/// and `--format`, they become the [`assembly::Settings`] both commands build their parts from.
#[derive(clap::Args, Debug)]
pub(super) struct PartsArgs {
    /// Largest message accepted from a sampler, in bytes; a larger one closes that sampler's
    /// connection, with a logged reason. ember-sampler's messages are at most 128 KiB, so the
    /// default (4 MiB) leaves room; each connection holds a receive buffer of this size.
    #[arg(long, default_value_t = 4 << 20, value_name = "BYTES")]
    max_message_bytes: usize,
    #[command(flatten)]
    file_limits: FileLimitArgs,
    #[command(flatten)]
    unwind: UnwindArgs,
    /// Serve the relay's own metrics (/metrics, Prometheus text) and health (/healthz: the loop
    /// is alive; /readyz: a sampler is connected and sent a batch within 3 intervals) over HTTP
    /// on HOST:PORT, or `off`. Default: for `run`, 127.0.0.1:17471 (this host only; in a pod,
    /// use 0.0.0.0:17471 so the kubelet's probes reach it); for `record`, off. Config file:
    /// `metrics.address`.
    #[arg(long, value_name = "HOST:PORT|off")]
    metrics_address: Option<MetricsAddress>,
    #[command(flatten)]
    export: ExportArgs,
    #[command(flatten)]
    labels: LabelArgs,
    /// Name the functions of interpreted code: for each process running a recognized
    /// interpreter (CPython 3.6 to 3.14), tell the sampler where its frames are, so the kernel
    /// walks them at each sample and the stacks show Python functions, files and lines in
    /// place of the interpreter's eval loop (docs/runtimes.md). `off`: native stacks only.
    #[arg(
        long,
        value_name = "on|off",
        default_value = "on",
        value_parser = parse_on_off,
        action = clap::ArgAction::Set
    )]
    interpreters: bool,
    /// Also record off-CPU time: where threads block (locks, I/O, sleeps) and for how long, as
    /// a second sample type (`off_cpu` / `nanoseconds` in pprof and OTLP) and its own files
    /// (flamegraph.offcpu.svg, stacks.offcpu.folded). `record` starts the sampler with it;
    /// with `run`, start ember-sampler with --off-cpu too (docs/offcpu.md). Config file:
    /// `off_cpu.enabled`.
    #[arg(long)]
    off_cpu: bool,
    /// With --off-cpu: waits at least this long are kept whole; shorter ones are kept with
    /// probability wait / min and counted as min, so totals stay unbiased while the many short
    /// waits add few rows (default 1ms; e.g. 200us; 0 keeps every wait; at most 1s). Config
    /// file: `off_cpu.min`.
    #[arg(long, value_name = "DURATION", value_parser = ember_common::parse_off_cpu_min)]
    off_cpu_min: Option<Duration>,
}

impl PartsArgs {
    /// `--off-cpu` and `--off-cpu-min` over the config file's `off_cpu` section: the minimum
    /// wait when off-CPU time is recorded.
    fn off_cpu(&self, config: Option<&Path>) -> anyhow::Result<Option<Duration>> {
        let file = match config {
            Some(path) => crate::config::Config::load(path)?.off_cpu,
            None => crate::config::OffCpuConfig::default(),
        };
        if !(self.off_cpu || file.enabled) {
            return Ok(None);
        }
        Ok(Some(
            self.off_cpu_min
                .or(file.min)
                .unwrap_or(crate::config::DEFAULT_OFF_CPU_MIN),
        ))
    }

    /// The parts' settings, with the config file and the environment resolved: the exporters,
    /// the labels, Kubernetes (`run`'s flags, when given), the metrics address (over the
    /// command's `metrics_default`). `output_dir`, `format` and `window` are flags the command
    /// places itself.
    fn settings(
        self,
        output_dir: Option<PathBuf>,
        format: FormatArgs,
        window: Option<Duration>,
        metrics_default: MetricsAddress,
        kubernetes: Option<&KubernetesArgs>,
    ) -> anyhow::Result<assembly::Settings> {
        let config = self.export.config.as_deref();
        let off_cpu = self.off_cpu(config)?;
        Ok(assembly::Settings {
            exporters: self.export.resolve()?,
            labels: self.labels.flags().resolve(config)?,
            kubernetes: match kubernetes {
                Some(args) => args.resolve(config)?,
                None => None,
            },
            metrics: self.metrics(config, metrics_default)?,
            output_dir,
            formats: format.formats,
            window,
            max_message_bytes: self.max_message_bytes,
            file_limits: self.file_limits.file_limits(),
            unwind: self.unwind.unwind,
            state_dir: self.unwind.state_dir,
            interpreters: self.interpreters,
            off_cpu,
        })
    }

    /// `--metrics-address` over the file's `metrics.address` over the command's `default`.
    fn metrics(
        &self,
        config: Option<&Path>,
        default: MetricsAddress,
    ) -> anyhow::Result<MetricsSettings> {
        let flag = self.metrics_address;
        let file = match (config, flag) {
            (Some(path), None) => config::load(path)?.metrics.address,
            _ => None,
        };
        Ok(MetricsSettings::resolve(flag, file, default))
    }
}

#[derive(clap::Args, Debug)]
pub(super) struct RunArgs {
    /// Unix socket to listen on (SOCK_SEQPACKET).
    #[arg(long, default_value = "/run/ember/ember.sock", env = "EMBER_SOCKET")]
    socket: PathBuf,
    /// Only samplers running as this uid may connect; others are refused with a logged reason.
    /// Default 65534: ember-sampler connects after it has left uid 0 for its --user (nobody).
    /// Repeat the flag (or separate uids with commas) to accept several.
    #[arg(
        long,
        default_value = "65534",
        env = "EMBER_SAMPLER_UID",
        value_delimiter = ','
    )]
    sampler_uid: Vec<u32>,
    /// Allow running as root (not recommended: the relay parses untrusted ELF/DWARF).
    #[arg(long)]
    allow_root: bool,
    /// Write stacks.folded, profile.pb.gz and flamegraph.svg here (or what --format chooses),
    /// covering one window (see --window): written when the window closes and when the relay
    /// stops, never per batch.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    #[command(flatten)]
    format: FormatArgs,
    /// Length of the window the output files cover: when it closes they are rewritten with it,
    /// and a new window starts empty.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    window: Duration,
    #[command(flatten)]
    parts: PartsArgs,
    #[command(flatten)]
    kubernetes: KubernetesArgs,
}

#[derive(clap::Args, Debug)]
pub(super) struct RecordArgs {
    /// How long to record, e.g. 10s, 2m. Ctrl-C ends early and still writes everything.
    #[arg(long, short = 'd', default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Directory for flamegraph.svg, profile.pb.gz and stacks.folded (or what --format
    /// chooses).
    #[arg(long, short = 'o', default_value = "ember-out")]
    output: PathBuf,
    #[command(flatten)]
    format: FormatArgs,
    /// At the end, open flamegraph.svg in a browser ($BROWSER, else xdg-open) as the user who
    /// ran sudo (never as root), when a graphical session is visible (DISPLAY or
    /// WAYLAND_DISPLAY); otherwise say why not. Needs svg in --format.
    #[arg(long)]
    open: bool,
    /// Samples per second on each CPU, 1 to 10000.
    #[arg(long, short = 'F', visible_alias = "samples-per-second", default_value_t = 97,
          value_parser = parse_frequency)]
    frequency: u32,
    /// Record only this process (its pid, not a thread's id); it must be running.
    #[arg(long, short = 'p')]
    pid: Option<u32>,
    /// Unprivileged user (name or uid) the relay becomes before it reads anything. Default: the
    /// `ember` account if it exists, else an unused uid picked at run time from 61184..=65519
    /// (no account, no group, no process has it). Never share it with other processes.
    #[arg(long, value_name = "USER|UID")]
    user: Option<String>,
    /// The ember-sampler binary (default: next to this executable, then $PATH).
    #[arg(long)]
    sampler: Option<PathBuf>,
    /// How often the sampler hands over samples (progress updates at this pace).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    /// Start the sampler with --command-line: each process's command line (at most 4 KiB) is
    /// exported as `process.command_line`. Off by default: arguments can hold secrets.
    #[arg(long)]
    command_line: bool,
    /// At the end, wait at most this long for the OTLP export queue to drain.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    export_timeout: Duration,
    #[command(flatten)]
    parts: PartsArgs,
}

impl RunArgs {
    /// The flags of `run`, with the config file and the environment resolved.
    pub(super) fn into_config(self) -> anyhow::Result<run::RunConfig> {
        Ok(run::RunConfig {
            parts: self.parts.settings(
                self.output_dir,
                self.format,
                Some(self.window),
                MetricsAddress::run_default(),
                Some(&self.kubernetes),
            )?,
            socket: self.socket,
            allow_root: self.allow_root,
            sampler_uids: self.sampler_uid,
        })
    }
}

/// Why `--open` is refused without svg in `--format`.
const OPEN_NEEDS_SVG: &str = "--open opens flamegraph.svg, which --format leaves out: add svg \
     to --format (e.g. --format svg,speedscope) or leave --open out";

/// Highest `record --frequency`: beyond, the sampler's own cost dominates what it measures.
const MAX_FREQUENCY_HZ: u32 = 10_000;

/// `--frequency`: 1 to [`MAX_FREQUENCY_HZ`] samples per second, the fix in the message.
fn parse_frequency(text: &str) -> Result<u32, String> {
    let hz: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of samples per second, e.g. 97"))?;
    if !(1..=MAX_FREQUENCY_HZ).contains(&hz) {
        return Err(format!(
            "{hz} samples per second is out of range: use 1 to {MAX_FREQUENCY_HZ} (default 97)"
        ));
    }
    Ok(hz)
}

/// `--pid` names a running process, and not one of its threads (the sampler keeps samples by
/// process id: a thread id would record nothing). Checked before anything starts.
fn check_pid(pid: u32, proc_root: &std::path::Path) -> Result<(), UsageError> {
    let status = std::fs::read_to_string(proc_root.join(pid.to_string()).join("status"));
    let Ok(status) = status else {
        return Err(UsageError(format!(
            "--pid {pid}: no such process; pass the pid of a running process (`pgrep NAME` \
             lists them), or leave --pid out to record the whole machine"
        )));
    };
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse::<u32>().ok());
    match tgid {
        Some(tgid) if tgid != pid => Err(UsageError(format!(
            "--pid {pid}: a thread of process {tgid}, not a process; pass --pid {tgid}"
        ))),
        _ => Ok(()),
    }
}

impl RecordArgs {
    /// The flags of `record`, with the exporters resolved; `log_format` is passed on to the
    /// sampler it starts. A `--pid` that is not a running process is refused here, before
    /// anything starts.
    pub(super) fn into_config(
        self,
        log_format: LogFormat,
        log_level: &'static str,
    ) -> anyhow::Result<record::RecordConfig> {
        if let Some(pid) = self.pid {
            check_pid(pid, std::path::Path::new("/proc"))?;
        }
        if self.open && !self.format.formats.contains(&OutputFormat::Svg) {
            return Err(UsageError(OPEN_NEEDS_SVG.to_owned()).into());
        }
        let off_cpu_min = self.parts.off_cpu(self.parts.export.config.as_deref())?;
        Ok(record::RecordConfig {
            parts: self.parts.settings(
                Some(self.output),
                self.format,
                None,
                MetricsAddress::Off,
                None,
            )?,
            duration: self.duration,
            open: self.open,
            user: self.user,
            sampler: record::SamplerLaunch {
                binary: self.sampler,
                frequency_hz: self.frequency,
                pid: self.pid,
                interval: self.interval,
                log_format,
                command_line: self.command_line,
                off_cpu_min,
            },
            log_level,
            export_timeout: self.export_timeout,
        })
    }
}

/// `on` or `off` (also `true`/`false`), for switches whose default is on.
fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        other => Err(format!("`{other}` is neither `on` nor `off`")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_pid_must_be_a_running_process_not_a_thread() {
        let proc_root = Path::new("/proc");
        // Given this test's own process: accepted
        let me = std::process::id();
        assert!(check_pid(me, proc_root).is_ok());
        // Given one of its threads: refused, naming the process to pass instead
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            tid_tx
                .send(nix::unistd::gettid().as_raw())
                .expect("send tid");
            // Alive until the check is done.
            let _ = done_rx.recv();
        });
        let tid = u32::try_from(tid_rx.recv().expect("tid")).expect("tid fits u32");
        let err = check_pid(tid, proc_root).expect_err("a thread id");
        drop(done_tx);
        thread.join().expect("thread");
        assert_eq!(
            err.0,
            format!("--pid {tid}: a thread of process {me}, not a process; pass --pid {me}")
        );
        // Given a pid with no /proc entry: refused as no such process
        let empty = tempfile::tempdir().expect("temp dir");
        let err = check_pid(me, empty.path()).expect_err("no such process");
        assert!(
            err.0.starts_with(&format!("--pid {me}: no such process;")),
            "{err}"
        );
    }

    #[test]
    fn frequency_out_of_range_names_the_range() {
        assert_eq!(parse_frequency("97"), Ok(97));
        assert_eq!(
            parse_frequency("0"),
            Err("0 samples per second is out of range: use 1 to 10000 (default 97)".to_owned())
        );
        assert!(parse_frequency("10001").is_err());
        assert!(parse_frequency("fast").is_err());
    }
}
