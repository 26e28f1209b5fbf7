//! The relay's self-metrics and health: what the driver publishes ([`Metrics`]), its Prometheus
//! text encoding ([`encode`]), the liveness and readiness rules ([`health`]) and the small HTTP
//! server that serves `/metrics`, `/healthz` and `/readyz` ([`server`]).
//!
//! Invariants: the driver never waits on a scrape. It keeps its own counters and, once per loop
//! step, stores a heartbeat (an atomic) and copies a plain [`Published`] snapshot under a mutex it
//! only ever `try_lock`s: when a scrape holds it, that step's copy is skipped and the next one
//! carries everything (the snapshot holds totals, never deltas). The OTLP exporter's counters and
//! the source's refused connections are atomics of their own, handed over when the command
//! assembles the relay and read at scrape time; no stage keeps process-global counters. The server
//! runs on a thread of its own with a single-threaded runtime, bounded in connections (per peer and
//! in all), header size and time, and counts the connections its bounds closed ([`admission`]).

pub(crate) mod admission;
pub(crate) mod encode;
pub(crate) mod health;
pub(crate) mod process;
pub(crate) mod server;

use std::{
    fmt,
    net::SocketAddr,
    str::FromStr,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use ember_protocol::Losses;
use serde::{Deserialize, Deserializer};

use crate::{sink::otlp::stats::Stats, source::Refusals};

/// The port `run` serves metrics on by default (on 127.0.0.1). Outside 9100-9999, the range the
/// Prometheus project hands out to exporters (all taken), and away from the OpenTelemetry
/// Collector's own ports (8888, 13133, 1777, 4317, 4318, 55679), Pyroscope's 4040 and the
/// Linux ephemeral range (32768-60999), so a relay never collides with the tools it runs beside.
pub(crate) const DEFAULT_PORT: u16 = 17471;

/// `--metrics-address`: where to serve, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAddress {
    Off,
    At(SocketAddr),
}

impl MetricsAddress {
    /// `run`'s default: loopback only.
    pub(crate) fn run_default() -> Self {
        Self::At(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))
    }
}

impl FromStr for MetricsAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        text.parse::<SocketAddr>().map(Self::At).map_err(|_| {
            format!(
                "{text:?} is neither HOST:PORT with a numeric host (127.0.0.1:{DEFAULT_PORT}, \
                 0.0.0.0:{DEFAULT_PORT}, [::1]:{DEFAULT_PORT}) nor `off`"
            )
        })
    }
}

impl fmt::Display for MetricsAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::At(address) => address.fmt(f),
        }
    }
}

impl<'de> Deserialize<'de> for MetricsAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The config file's `metrics:` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where to serve /metrics, /healthz and /readyz (HOST:PORT), or `off`. `--metrics-address`
    /// wins. Default: 127.0.0.1:17471 for `run`, off for `record`.
    pub address: Option<MetricsAddress>,
}

/// Where the command serves metrics, resolved: flag > file > the command's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MetricsSettings {
    pub address: MetricsAddress,
    /// Given by the flag or the file: failing to listen there stops the relay. The default
    /// address being taken (another relay on this host) is only warned about.
    pub explicit: bool,
}

impl MetricsSettings {
    pub(crate) fn resolve(
        flag: Option<MetricsAddress>,
        file: Option<MetricsAddress>,
        default: MetricsAddress,
    ) -> Self {
        match flag.or(file) {
            Some(address) => Self {
                address,
                explicit: true,
            },
            None => Self {
                address: default,
                explicit: false,
            },
        }
    }
}

/// Upper bounds of the batch latency histogram, in seconds.
pub(crate) const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Batch latency: from an interval's end (as the sampler stamped it) to its profile reaching
/// the sinks. Plain numbers, owned by the driver and copied into each [`Published`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Latency {
    /// Observations per bucket of [`LATENCY_BUCKETS`] (not cumulative); the last is +Inf.
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    pub sum_seconds: f64,
    pub count: u64,
}

impl Latency {
    pub(crate) fn observe(&mut self, seconds: f64) {
        let index = LATENCY_BUCKETS
            .iter()
            .position(|&upper| seconds <= upper)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[index] += 1;
        self.sum_seconds += seconds;
        self.count += 1;
    }

    /// Observes the latency of an interval that ended at `end_unix_ns` (sampler's clock), now.
    pub(crate) fn observe_interval_end(&mut self, end_unix_ns: u64) {
        let now = ember_common::now_unix_ns();
        // A sampler clock ahead of ours counts as no delay rather than a negative one.
        self.observe(now.saturating_sub(end_unix_ns) as f64 / 1e9);
    }
}

/// The pipeline's side of the metrics: totals since start and what it holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RelayStats {
    pub connections: u64,
    pub connections_total: u64,
    pub batches: u64,
    pub samples_received: u64,
    pub samples_symbolized: u64,
    pub samples_filtered: u64,
    pub samples_without_process: u64,
    pub frames: u64,
    pub unknown_frames: u64,
    pub processes: u64,
    pub files: u64,
    pub resolvers: u64,
    /// What the symbolizer cache holds now, and its lookups answered from it or not.
    pub symbolizer: crate::symbolize::elf::CacheSize,
    pub symbolizer_hits: u64,
    pub symbolizer_misses: u64,
    pub resolvers_opened: u64,
    pub resolvers_evicted: u64,
    pub copied_bytes: u64,
    /// Binaries named from their symbol table only, left unnamed as too large to copy, and
    /// left unnamed after a panic inside blazesym.
    pub files_symbols_only: u64,
    pub files_too_large: u64,
    pub files_panicked: u64,
    /// Labels removed to fit Pyroscope's series limits, and reserved attributes processes
    /// claimed in their environment (both from the labels stage).
    pub labels_over_limit: u64,
    pub label_claims_dropped: u64,
    /// Unwind tables not sent: over half of the sampler's rows (for good), or over their
    /// file owner's fair share (for now); tables the relay had the sampler drop to make room
    /// within the shares; tables offered again (`unwind/budget.rs`).
    pub unwind_tables_too_large: u64,
    pub unwind_tables_over_share: u64,
    pub unwind_tables_withdrawn: u64,
    pub unwind_tables_reoffered: u64,
    /// Binaries whose compressed CFI was refused (over the limit, or not inflating to the size
    /// it claims): they unwind by frame pointers.
    pub unwind_cfi_refused: u64,
    /// JIT frames named from perf maps and jitdumps and left unnamed; perf maps the sampler
    /// refused; entries read, lines skipped, ranges forgotten to stay in the budget, files no
    /// longer read after an error, processes whose files reached the read bound
    /// (`jit/mod.rs`); ranges and bytes the JIT stores hold now.
    pub jit_frames_named: u64,
    pub jit_frames_unnamed: u64,
    pub jit_sources_refused: u64,
    pub jit_entries: u64,
    pub jit_lines_skipped: u64,
    pub jit_ranges_evicted: u64,
    pub jit_read_errors: u64,
    pub jit_read_capped: u64,
    pub jit_ranges: u64,
    pub jit_bytes: u64,
    /// The sampler's latest loss report; `None` before the first batch.
    pub sampler: Option<Losses>,
    /// When the latest batch arrived, and the length of its interval.
    pub last_batch: Option<Instant>,
    pub interval: Duration,
}

/// Closed windows the sinks could not write (the files sink's `--output-dir`), counted by the
/// driver from what the sinks return.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OutputStats {
    /// Windows a sink could not write (once per sink that failed).
    pub windows_failed: u64,
    /// Samples of those windows: in the other sinks, not in the failed one's output.
    pub samples_unwritten: u64,
}

impl OutputStats {
    /// A window of `samples` that `failed` sinks could not write.
    pub(crate) fn count(&mut self, failed: u64, samples: u64) {
        self.windows_failed = self.windows_failed.saturating_add(failed);
        self.samples_unwritten = self
            .samples_unwritten
            .saturating_add(failed.saturating_mul(samples));
    }
}

/// What the driver publishes each loop step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Published {
    pub relay: RelayStats,
    pub latency: Latency,
    pub output: OutputStats,
}

/// The shared state between the driver (writer) and the HTTP server (reader).
#[derive(Debug)]
pub(crate) struct Metrics {
    started: Instant,
    started_unix: f64,
    /// Milliseconds after `started` of the driver's latest loop step.
    heartbeat_ms: AtomicU64,
    published: Mutex<Published>,
    /// The OTLP exporters' own counters, read at scrape time.
    exporters: Mutex<Vec<Arc<Stats>>>,
    /// The HTTP server's own connection counters, read at scrape time.
    connections: Arc<admission::ConnectionStats>,
    /// The source's refused connections, read at scrape time (see [`Metrics::with_refusals`]).
    refusals: Arc<Refusals>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            heartbeat_ms: AtomicU64::new(0),
            published: Mutex::new(Published::default()),
            exporters: Mutex::new(Vec::new()),
            connections: Arc::default(),
            refusals: Arc::default(),
        }
    }
}

impl Metrics {
    /// Serves the refusals of the source the command started (none are counted otherwise).
    pub(crate) fn with_refusals(mut self, refusals: Arc<Refusals>) -> Self {
        self.refusals = refusals;
        self
    }

    /// The source's refused connections.
    pub(crate) fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// The driver's loop is alive: called once per loop step.
    pub(crate) fn heartbeat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heartbeat_ms.store(ms, Relaxed);
    }

    /// How long ago the driver last called [`Metrics::heartbeat`] (since start if never).
    pub(crate) fn heartbeat_age(&self) -> Duration {
        let at = Duration::from_millis(self.heartbeat_ms.load(Relaxed));
        self.started.elapsed().saturating_sub(at)
    }

    /// Stores the driver's snapshot unless a scrape is reading the previous one right now (then
    /// the next step's snapshot carries it). Never blocks.
    pub(crate) fn publish(&self, snapshot: &Published) {
        if let Ok(mut published) = self.published.try_lock() {
            *published = *snapshot;
        }
    }

    /// The latest snapshot (a scrape's copy).
    pub(crate) fn published(&self) -> Published {
        *self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an OTLP exporter's counters to what is served.
    pub(crate) fn watch_exporter(&self, stats: Arc<Stats>) {
        self.exporters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(stats);
    }

    pub(crate) fn exporters(&self) -> Vec<Arc<Stats>> {
        self.exporters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The HTTP server's connection counters (the server counts, a scrape reads).
    pub(crate) fn connection_stats(&self) -> Arc<admission::ConnectionStats> {
        Arc::clone(&self.connections)
    }

    pub(crate) fn started_unix_seconds(&self) -> f64 {
        self.started_unix
    }
}

/// Starts serving `settings.address` for `metrics` (nothing when off); logs the bound address.
/// Failing to listen is an error when the address was asked for, a warning for the default.
pub(crate) fn serve(settings: MetricsSettings, metrics: &Arc<Metrics>) -> anyhow::Result<()> {
    let MetricsAddress::At(address) = settings.address else {
        return Ok(());
    };
    match server::spawn(address, Arc::clone(metrics), server::Limits::default()) {
        Ok(bound) => {
            tracing::info!(
                address = %bound,
                "serving metrics and health on http://{bound}/metrics, /healthz, /readyz"
            );
            Ok(())
        }
        Err(err) if !settings.explicit => {
            tracing::warn!(
                address = %address,
                error = %err,
                "cannot serve metrics on the default address (another relay on this host?); \
                 running without them. Pass --metrics-address HOST:PORT to choose another, or \
                 --metrics-address off"
            );
            Ok(())
        }
        Err(err) => Err(anyhow::anyhow!(
            "cannot serve metrics on {address}: {err}; choose a free HOST:PORT with \
             --metrics-address (config `metrics.address`), or `off`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_off_turns_them_off() {
        assert_eq!("off".parse(), Ok(MetricsAddress::Off));
        assert_eq!(
            "0.0.0.0:9".parse(),
            Ok(MetricsAddress::At(SocketAddr::from(([0, 0, 0, 0], 9))))
        );
        let err = "localhost:1".parse::<MetricsAddress>().unwrap_err();
        assert!(err.contains("numeric host"), "{err}");
        assert_eq!(MetricsAddress::run_default().to_string(), "127.0.0.1:17471");
    }

    #[test]
    fn the_flag_beats_the_file_which_beats_the_default() {
        let at = |port| MetricsAddress::At(SocketAddr::from(([127, 0, 0, 1], port)));
        let resolve = MetricsSettings::resolve;
        assert_eq!(
            resolve(Some(at(1)), Some(at(2)), at(3)),
            MetricsSettings {
                address: at(1),
                explicit: true
            }
        );
        assert_eq!(
            resolve(None, Some(MetricsAddress::Off), at(3)).address,
            MetricsAddress::Off
        );
        assert_eq!(
            resolve(None, None, MetricsAddress::Off),
            MetricsSettings {
                address: MetricsAddress::Off,
                explicit: false
            }
        );
    }

    #[test]
    fn latency_lands_in_the_first_bucket_that_holds_it() {
        let mut latency = Latency::default();
        for seconds in [0.001, 0.005, 0.3, 100.0] {
            latency.observe(seconds);
        }
        assert_eq!(latency.buckets[0], 2);
        assert_eq!(latency.buckets[6], 1, "0.3 s is in the 0.5 s bucket");
        assert_eq!(latency.buckets[LATENCY_BUCKETS.len()], 1, "+Inf");
        assert_eq!(latency.count, 4);
    }
}
