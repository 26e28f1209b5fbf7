//! ember-relay: command-line entry. `run` serves samplers on a socket; `record` is the
//! one-command local mode. Flags are parsed here and handed to the command modules.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use ember_relay::{cli, record, run};

/// ember's unprivileged relay: receives stacks from ember-sampler, symbolizes them through the
/// file descriptors the sampler passed, and writes profiles (pprof, folded stacks, flamegraph).
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = cli::LogFormat::Text, env = "EMBER_LOG_FORMAT")]
    log_format: cli::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve ember-sampler connections on a Unix socket and write rolling profiles.
    Run(RunArgs),
    /// Record the whole machine (or one process) for a while and write a flamegraph. Run as root:
    /// starts ember-sampler, then drops to an unprivileged user before reading anything.
    Record(RecordArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Unix socket to listen on (SOCK_SEQPACKET).
    #[arg(long, default_value = "/run/ember/ember.sock", env = "EMBER_SOCKET")]
    socket: PathBuf,
    /// Write stacks.folded, profile.pb.gz and flamegraph.svg here after every batch, covering
    /// the current window (see --window).
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Length of the window the output files cover; a new window starts empty.
    #[arg(long, default_value = "10m", value_parser = cli::parse_duration)]
    window: Duration,
    /// Largest message accepted from a sampler; larger ones close the connection.
    #[arg(long, default_value_t = 4 << 20)]
    max_message_bytes: usize,
    /// Allow running as root (not recommended: the relay parses untrusted ELF/DWARF).
    #[arg(long)]
    allow_root: bool,
    /// Only samplers running as this uid may connect; others are refused with a logged reason.
    #[arg(long, default_value_t = 0, env = "EMBER_SAMPLER_UID")]
    sampler_uid: u32,
}

#[derive(clap::Args, Debug)]
struct RecordArgs {
    /// How long to record, e.g. 10s, 2m. Ctrl-C ends early and still writes everything.
    #[arg(long, short = 'd', default_value = "10s", value_parser = cli::parse_duration)]
    duration: Duration,
    /// Directory for flamegraph.svg, profile.pb.gz and stacks.folded.
    #[arg(long, short = 'o', default_value = "ember-out")]
    output: PathBuf,
    /// Samples per second on each CPU.
    #[arg(long, short = 'F', visible_alias = "samples-per-second", default_value_t = 97,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    frequency: u32,
    /// Record only this process.
    #[arg(long, short = 'p')]
    pid: Option<u32>,
    /// Unprivileged user the relay becomes before it reads anything.
    #[arg(long, default_value = "nobody")]
    user: String,
    /// The ember-sampler binary (default: next to this executable, then $PATH).
    #[arg(long)]
    sampler: Option<PathBuf>,
    /// How often the sampler hands over samples (progress updates at this pace).
    #[arg(long, default_value = "1s", value_parser = cli::parse_duration)]
    interval: Duration,
    /// Largest message accepted from the sampler.
    #[arg(long, default_value_t = 4 << 20)]
    max_message_bytes: usize,
}

fn main() -> ExitCode {
    let args = Cli::parse();
    cli::init_logging(args.log_format);
    let result = match args.command {
        Command::Run(a) => run::run(run::RunConfig {
            socket: a.socket,
            output_dir: a.output_dir,
            window: a.window,
            max_message_bytes: a.max_message_bytes,
            allow_root: a.allow_root,
            sampler_uid: a.sampler_uid,
        }),
        Command::Record(a) => record::record(record::RecordConfig {
            duration: a.duration,
            output: a.output,
            frequency_hz: a.frequency,
            pid: a.pid,
            user: a.user,
            sampler: a.sampler,
            interval: a.interval,
            max_message_bytes: a.max_message_bytes,
            log_format: args.log_format,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}
