//! Log set-up: `tracing` to stderr, as text or one JSON object per line, filtered by `EMBER_LOG`,
//! else `RUST_LOG`, else a default level (`info` unless the program chooses another). Colours
//! only when stderr is a terminal.

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The flag's value, to hand the same format to a child process.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

/// The environment variable that sets the log filter (over `RUST_LOG`), e.g. `EMBER_LOG=debug`.
pub const LOG_ENV: &str = "EMBER_LOG";

/// Whether `EMBER_LOG` or `RUST_LOG` sets the log filter (a default level then does not apply).
pub fn log_filter_in_env() -> bool {
    std::env::var_os(LOG_ENV).is_some() || std::env::var_os("RUST_LOG").is_some()
}

/// Installs the global subscriber at `info` unless the environment says otherwise; call once,
/// first thing in `main`.
pub fn init_logging(format: LogFormat) {
    init_logging_at(format, "info");
}

/// [`init_logging`] with another default level (or filter directive), e.g. `warn`.
pub fn init_logging_at(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
