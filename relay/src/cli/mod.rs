//! The relay's command line: the clap definitions ([`args`]), the entry point [`main`] that
//! parses them, resolves the config file and environment, and hands the result to `run`,
//! `record` or `validate`. `src/main.rs` only calls [`main`]: the whole relay is a library
//! whose modules are crate-private, so the compiler sees (and flags) code nothing uses.
//!
//! Durations, log set-up and the stop signal live in `ember-common`, shared with the sampler;
//! re-exported here under the names the relay uses.

mod args;
pub(crate) mod kubernetes;
pub(crate) mod labels;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
pub(crate) use ember_common::{init_logging_at, parse_duration, LogFormat};

use self::args::{RecordArgs, ReportArgs, RunArgs, ValidateArgs};
use crate::{
    config, record, report, run,
    sink::{exporters, otlp::config::OtlpFlags},
    usage::{UsageError, USAGE_EXIT},
};

/// ember's unprivileged relay: receives stacks from ember-sampler, symbolizes them through the
/// file descriptors the sampler passed, and writes profiles (pprof, folded stacks, flamegraph).
#[derive(Parser, Debug)]
#[command(name = "ember-relay", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "EMBER_LOG_FORMAT")]
    log_format: LogFormat,
    /// More logs: `record` logs warnings only by default, -v adds info (every batch), -vv debug;
    /// `run` logs info by default, -v adds debug. EMBER_LOG or RUST_LOG (a tracing filter, e.g.
    /// `EMBER_LOG=ember_relay=debug`) override both.
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

impl Cli {
    /// The log level when the environment sets none: `record` is quiet (a progress line and a
    /// summary are its output), `run` is a service whose log is its output.
    fn default_log_level(&self) -> &'static str {
        let quiet = matches!(self.command, Command::Record(_));
        match (quiet, self.verbose) {
            (true, 0) => "warn",
            (true, 1) | (false, 0) => "info",
            (_, _) => "debug",
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve ember-sampler connections on a Unix socket and write rolling profiles.
    ///
    /// SIGHUP, and a change to the --config file (looked at every 2 s), reload the label
    /// settings: `labels:`, `process_filter:` and `relabel_configs:`, with --tags,
    /// --process-filter and --service-name merged over them again. A bad file is refused (logged)
    /// and the settings in effect stay. Exporters and every other flag need a restart.
    Run(RunArgs),
    /// Record the whole machine (or one process) for a while and write a flamegraph. Run as root:
    /// starts ember-sampler, then drops to an unprivileged user before reading anything.
    Record(RecordArgs),
    /// Check a config file (with the OTEL_EXPORTER_OTLP_* environment) without running: parses
    /// it, reads its TLS files and prints the exporters it configures.
    Validate(ValidateArgs),
    /// Print the top functions of a saved profile (the profile.pb.gz of `record`, or any pprof
    /// file) by self and total samples, as `go tool pprof -top` does, without a Go toolchain.
    Report(ReportArgs),
}

/// The relay's entry point: parses the command line, sets up logging, runs the command and
/// logs its error, if any.
pub fn main() -> ExitCode {
    let args = Cli::parse();
    let level = args.default_log_level();
    init_logging_at(args.log_format, level);
    let result = match args.command {
        Command::Run(a) => a.into_config().and_then(run::run),
        Command::Validate(a) => validate(&a),
        Command::Report(a) => report::report(&a.file, a.count, a.sample_index.as_deref()),
        Command::Record(a) => a
            .into_config(args.log_format, level)
            .and_then(record::record),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            if err.chain().any(|e| e.is::<UsageError>()) {
                ExitCode::from(USAGE_EXIT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `ember-relay validate`: resolves the file with the environment (no flags) and prints what
/// it configures.
fn validate(args: &ValidateArgs) -> anyhow::Result<()> {
    let file = config::load(&args.config)?;
    let exporters = exporters::resolve(&file.exporters, &OtlpFlags::default(), &|name| {
        std::env::var(name).ok()
    })?;
    println!("{}: OK", args.config.display());
    for line in exporters::describe(&exporters) {
        println!("  {line}");
    }
    for warning in exporters::warnings(&exporters) {
        println!("  WARNING: {warning}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Duration};

    use clap::CommandFactory as _;

    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("ember-relay").chain(args.iter().copied()))
            .expect("valid command line")
    }

    /// clap's own consistency check: no two flags share a name or a short, defaults parse,
    /// flattened groups (ExportArgs, and whatever is flattened next) do not collide.
    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_flags_land_in_run_config() {
        // Given run's flags
        let cli = parse(&[
            "run",
            "--socket",
            "/tmp/e.sock",
            "--output-dir",
            "/tmp/out",
            "--window",
            "90s",
            "--max-open-files",
            "7",
            "--max-copy-bytes",
            "4096",
            "--sampler-uid",
            "1,2",
            "--allow-root",
        ]);
        // When they become a RunConfig
        let Command::Run(args) = cli.command else {
            panic!("not run: {:?}", cli.command)
        };
        let config = args
            .into_config()
            .expect("no config file: default exporters");
        // Then every flag is where run reads it
        assert_eq!(config.socket, Path::new("/tmp/e.sock"));
        assert_eq!(
            config.parts.output_dir.as_deref(),
            Some(Path::new("/tmp/out"))
        );
        assert_eq!(config.parts.window, Some(Duration::from_secs(90)));
        assert_eq!(config.parts.file_limits.max_open_files, 7);
        assert_eq!(config.parts.file_limits.max_copy_bytes, 4096);
        assert_eq!(config.sampler_uids, [1, 2]);
        assert!(config.allow_root);
    }

    #[test]
    fn record_flags_land_in_record_config() {
        // Given record's flags and a global log format after the subcommand (--pid: a running
        // process, this test's)
        let me = std::process::id().to_string();
        let cli = parse(&[
            "record",
            "-d",
            "3s",
            "-o",
            "/tmp/o",
            "-F",
            "49",
            "-p",
            &me,
            "--interval",
            "2s",
            "--log-format",
            "json",
        ]);
        let log_format = cli.log_format;
        let Command::Record(args) = cli.command else {
            panic!("not record: {:?}", cli.command)
        };
        // When they become a RecordConfig
        let config = args
            .into_config(log_format, "warn")
            .expect("default exporters");
        // Then every flag is where record reads it, the log format included (the sampler it
        // starts logs the same way)
        assert_eq!(config.duration, Duration::from_secs(3));
        assert_eq!(
            config.parts.output_dir.as_deref(),
            Some(Path::new("/tmp/o"))
        );
        assert_eq!(config.sampler.frequency_hz, 49);
        assert_eq!(config.sampler.pid, Some(std::process::id()));
        assert_eq!(config.sampler.interval, Duration::from_secs(2));
        assert_eq!(config.sampler.log_format, LogFormat::Json);
    }

    #[test]
    fn format_defaults_to_the_three_files_and_open_needs_svg() {
        use crate::sink::files::OutputFormat::{self, Folded, Speedscope, Svg};
        let record = |args: &[&str]| {
            let Command::Record(a) = parse(&[&["record"], args].concat()).command else {
                panic!("not record")
            };
            a.into_config(LogFormat::Text, "warn")
        };
        // Given no --format: today's three files, for record and for run
        let config = record(&[]).expect("defaults");
        assert_eq!(config.parts.formats, OutputFormat::DEFAULT);
        assert!(!config.open);
        let Command::Run(run) = parse(&["run"]).command else {
            panic!("not run")
        };
        assert_eq!(
            run.into_config().expect("run").parts.formats,
            OutputFormat::DEFAULT
        );
        // Given a list and a repeat: all of them, --open with svg accepted
        let config = record(&["--format", "speedscope,folded", "--format", "svg", "--open"])
            .expect("svg chosen");
        assert_eq!(config.parts.formats, [Speedscope, Folded, Svg]);
        assert!(config.open);
        // Given --open without svg: a usage error naming the fix
        let Err(err) = record(&["--format", "folded", "--open"]) else {
            panic!("--open without svg was accepted")
        };
        let usage = err.downcast_ref::<UsageError>().expect("a usage error");
        assert!(usage.0.contains("add svg to --format"), "{usage}");
        // Given an unknown format: clap refuses it, listing the values
        let err = Cli::try_parse_from(["ember-relay", "record", "--format", "html"])
            .expect_err("unknown format");
        assert!(
            err.to_string()
                .contains("[possible values: svg, pprof, folded, speedscope]"),
            "{err}"
        );
    }

    #[test]
    fn metrics_are_served_by_run_on_loopback_and_by_record_only_when_asked() {
        use crate::metrics::{MetricsAddress, MetricsSettings};
        let run = |args: &[&str]| {
            let Command::Run(a) = parse(&[&["run"], args].concat()).command else {
                panic!("not run")
            };
            a.into_config().expect("run config").parts.metrics
        };
        let record = |args: &[&str]| {
            let Command::Record(a) = parse(&[&["record"], args].concat()).command else {
                panic!("not record")
            };
            a.into_config(LogFormat::Text, "warn")
                .expect("record config")
                .parts
                .metrics
        };
        // Given no flag: run serves 127.0.0.1:17471 (a taken port only warns), record nothing
        assert_eq!(
            run(&[]),
            MetricsSettings {
                address: MetricsAddress::run_default(),
                explicit: false
            }
        );
        assert_eq!(record(&[]).address, MetricsAddress::Off);
        // The flag turns them off, or on at an address that must then be bound
        assert_eq!(
            run(&["--metrics-address", "off"]).address,
            MetricsAddress::Off
        );
        let asked = record(&["--metrics-address", "127.0.0.1:0"]);
        assert_eq!(asked.address, "127.0.0.1:0".parse().expect("address"));
        assert!(asked.explicit);
        // And the config file's metrics.address, unless the flag says otherwise
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), "metrics:\n  address: 0.0.0.0:9\n").expect("write");
        let path = file.path().to_str().expect("utf-8 path");
        let from_file = run(&["--config", path]);
        assert_eq!(from_file.address, "0.0.0.0:9".parse().expect("address"));
        assert_eq!(
            run(&["--config", path, "--metrics-address", "off"]).address,
            MetricsAddress::Off
        );
        assert!(
            Cli::try_parse_from(["ember-relay", "run", "--metrics-address", "localhost"]).is_err()
        );
    }

    #[test]
    fn record_is_quiet_unless_asked_and_run_logs_info() {
        let level = |args: &[&str]| parse(args).default_log_level();
        assert_eq!(level(&["record"]), "warn");
        assert_eq!(level(&["record", "-v"]), "info");
        assert_eq!(level(&["-vv", "record"]), "debug");
        assert_eq!(level(&["run"]), "info");
        assert_eq!(level(&["run", "--verbose"]), "debug");
    }

    #[test]
    fn out_of_range_frequency_is_refused() {
        assert!(Cli::try_parse_from(["ember-relay", "record", "-F", "0"]).is_err());
        assert!(Cli::try_parse_from(["ember-relay", "record", "-F", "10001"]).is_err());
    }
}
