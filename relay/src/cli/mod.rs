//! The relay's command line: the clap definitions ([`args`]), the entry point [`main`] that
//! parses them, resolves the config file and environment, and hands the result to `run`,
//! `record` or `validate`. `src/main.rs` only calls [`main`]: the whole relay is a library
//! whose modules are crate-private, so the compiler sees (and flags) code nothing uses.
//!
//! Durations, log set-up and the stop signal live in `ember-common`, shared with the sampler;
//! re-exported here under the names the relay uses.

mod args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
pub(crate) use ember_common::{
    init_logging, install_stop_handlers, parse_duration, stop_requested, LogFormat,
};

use self::args::{RecordArgs, RunArgs, ValidateArgs};
use crate::{config, record, run};

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
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve ember-sampler connections on a Unix socket and write rolling profiles.
    Run(RunArgs),
    /// Record the whole machine (or one process) for a while and write a flamegraph. Run as root:
    /// starts ember-sampler, then drops to an unprivileged user before reading anything.
    Record(RecordArgs),
    /// Check a config file (with the OTEL_EXPORTER_OTLP_* environment) without running: parses
    /// it, reads its TLS files and prints the exporters it configures.
    Validate(ValidateArgs),
}

/// The relay's entry point: parses the command line, sets up logging, runs the command and
/// logs its error, if any.
pub fn main() -> ExitCode {
    let args = Cli::parse();
    init_logging(args.log_format);
    let result = match args.command {
        Command::Run(a) => a.into_config().and_then(run::run),
        Command::Validate(a) => validate(&a),
        Command::Record(a) => a.into_config(args.log_format).and_then(record::record),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `ember-relay validate`: resolves the file with the environment (no flags) and prints what
/// it configures.
fn validate(args: &ValidateArgs) -> anyhow::Result<()> {
    let file = config::load(&args.config)?;
    let exporters = config::resolve(&file, &config::OtlpFlags::default(), &|name| {
        std::env::var(name).ok()
    })?;
    println!("{}: OK", args.config.display());
    for line in config::describe(&exporters) {
        println!("  {line}");
    }
    for warning in config::warnings(&exporters) {
        println!("  WARNING: {warning}");
    }
    Ok(())
}
