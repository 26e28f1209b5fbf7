//! `/metrics`: the Prometheus text exposition (format 0.0.4, prometheus-client's encoder) of
//! one [`Metrics`] at scrape time. Names follow Prometheus' conventions: `ember_relay_` for the
//! relay's own series, `ember_sampler_` for the counters the sampler reports in each batch's
//! `Losses` (it has no network, so the relay serves them), base units in the name (`_bytes`,
//! `_seconds`) and `_total` on counters (added by the encoder to the names below), and the
//! `process_` series every Prometheus client library serves (see [`super::process`]).
//!
//! Each series is one line of a table; the sampler's are the protocol's list of loss counters
//! (`LOSS_COUNTERS`: a field added to `Losses` is served once it is listed there).

use std::{fmt, time::Instant};

use ember_protocol::PROTOCOL_VERSION;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, NoLabelSet},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};

use super::{
    admission::{Closed, ConnectionStats},
    process::{self, ProcessStats},
    Metrics, OutputStats, Published, RelayStats, LATENCY_BUCKETS,
};
use crate::{
    sink::otlp::stats::{DropReason, Snapshot},
    source::Refusal,
};

/// The `Content-Type` of what [`render`] returns.
pub(crate) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Counter or gauge.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One series of the relay's snapshot: name (without `ember_relay_` and `_total`), help, kind,
/// value.
type RelaySeries = (&'static str, &'static str, Kind, fn(&RelayStats) -> u64);

const RELAY: &[RelaySeries] = &[
    ("samplers_connected", "Samplers connected now.", Kind::Gauge, |s| s.connections),
    ("sampler_connections", "Sampler connections accepted since start.", Kind::Counter, |s| s.connections_total),
    ("batches_received", "Batch parts received from samplers.", Kind::Counter, |s| s.batches),
    ("samples_received", "Samples received from samplers (the sum of `samples` of the `batch received` log lines).", Kind::Counter, |s| s.samples_received),
    ("samples_symbolized", "Samples symbolized into profiles (received minus filtered).", Kind::Counter, |s| s.samples_symbolized),
    ("samples_filtered", "Samples left out because their process was filtered out (process_filter) or dropped by a relabel rule.", Kind::Counter, |s| s.samples_filtered),
    ("samples_without_process", "Samples whose process facts had not arrived: exported under the fallback service (never their thread's name), their user frames unknown.", Kind::Counter, |s| s.samples_without_process),
    ("frames", "Stack frames symbolized (each distinct stack of a batch counted once).", Kind::Counter, |s| s.frames),
    ("unknown_frames", "Stack frames that could not be named, counted like frames (each names its reason in the profile).", Kind::Counter, |s| s.unknown_frames),
    ("processes", "Processes whose facts the relay holds now.", Kind::Gauge, |s| s.processes),
    ("files", "Binaries passed by samplers that the relay holds open now.", Kind::Gauge, |s| s.files),
    ("symbolizer_resolvers", "Symbol resolvers (one per open binary) in the symbolizer cache now.", Kind::Gauge, |s| s.resolvers),
    ("symbolizer_resolvers_opened", "Symbol resolvers opened: symbolizer cache misses.", Kind::Counter, |s| s.resolvers_opened),
    ("symbolizer_resolvers_evicted", "Symbol resolvers closed because unused or over the cache's bounds, or their parsed tables dropped over its bytes (their remembered lookups kept).", Kind::Counter, |s| s.resolvers_evicted),
    ("symbolizer_cache_entries", "Lookups remembered by the symbolizer cache now (file offset -> functions), in all files.", Kind::Gauge, |s| s.symbolizer.entries),
    ("symbolizer_cache_bytes", "Heap bytes the symbolizer cache holds now: parsed symbol and line tables and remembered lookups (--symbolizer-cache-bytes bounds it).", Kind::Gauge, |s| s.symbolizer.bytes),
    ("symbolizer_cache_file_bytes", "Bytes of the binaries behind the open symbol resolvers (mapped read-only; only pages being read count in the relay's memory).", Kind::Gauge, |s| s.symbolizer.file_bytes),
    ("symbolizer_cache_hits", "Frame lookups answered from the symbolizer cache.", Kind::Counter, |s| s.symbolizer_hits),
    ("symbolizer_cache_misses", "Frame lookups the symbolizer cache did not hold (symbolized from the binary's tables).", Kind::Counter, |s| s.symbolizer_misses),
    ("symbolizer_copied_bytes", "Bytes of binaries copied into memory because the relay may not reopen them.", Kind::Counter, |s| s.copied_bytes),
    ("symbolizer_files_symbols_only", "Binaries named from their symbol table only: their links to separate debug info lead where the relay does not trust (the relay's INFO log says why, per file).", Kind::Counter, |s| s.files_symbols_only),
    ("symbolizer_files_too_large", "Binaries left unnamed: the relay may not reopen them and they exceed --max-copy-bytes.", Kind::Counter, |s| s.files_too_large),
    ("symbolizer_files_panicked", "Binaries left unnamed because parsing them panicked inside blazesym (a malformed or hostile file).", Kind::Counter, |s| s.files_panicked),
    ("labels_over_limit", "Labels removed to fit Pyroscope's 30 labels per series, what a process supplied itself (OTEL_RESOURCE_ATTRIBUTES) first; counted each time a process's labels are computed.", Kind::Counter, |s| s.labels_over_limit),
    ("label_claims_dropped", "Attributes a process claimed in OTEL_RESOURCE_ATTRIBUTES under a name only the relay or the cluster sets (k8s.*, container.*, host.*, os.*, process.*, systemd.*, thread.*, service_name, __*): dropped; counted each time a process's labels are computed.", Kind::Counter, |s| s.label_claims_dropped),
    ("unwind_tables_too_large", "Unwind tables never sent: over half of the sampler's rows (--unwind-memory-bytes); their binaries unwind by frame pointers.", Kind::Counter, |s| s.unwind_tables_too_large),
    ("unwind_tables_over_share", "Unwind tables not sent for now: their file owner's fair share of the sampler's rows was full (offered again when sampled).", Kind::Counter, |s| s.unwind_tables_over_share),
    ("unwind_tables_withdrawn", "Unwind tables the relay had the sampler drop to make room for another within the fair shares.", Kind::Counter, |s| s.unwind_tables_withdrawn),
    ("unwind_tables_reoffered", "Unwind tables offered again: evicted, refused for now, or skipped while the compile queue was full.", Kind::Counter, |s| s.unwind_tables_reoffered),
    ("unwind_cfi_refused", "Binaries whose compressed .debug_frame was refused (claims more than the limit, or does not inflate to the size it claims: a broken or hostile file); they unwind by frame pointers.", Kind::Counter, |s| s.unwind_cfi_refused),
    ("jit_frames_named", "Frames in JIT code named from the process's perf map or jitdump (per distinct stack of a batch, weighted by its samples).", Kind::Counter, |s| s.jit_frames_named),
    ("jit_frames_unnamed", "Frames in JIT code no perf map or jitdump named (the runtime writes none: see docs/runtimes.md to enable it), counted like jit_frames_named.", Kind::Counter, |s| s.jit_frames_unnamed),
    ("jit_perf_maps_refused", "Perf maps the sampler found but did not pass (owned by another user than the process, a symlink, not a regular file, over the size bound), once per process and reason.", Kind::Counter, |s| s.jit_sources_refused),
    ("jit_entries_read", "Entries read from perf maps and jitdumps.", Kind::Counter, |s| s.jit_entries),
    ("jit_lines_skipped", "Perf map lines skipped: not an entry, or over the length bound.", Kind::Counter, |s| s.jit_lines_skipped),
    ("jit_ranges_evicted", "JIT code ranges forgotten to keep a process (or all together) within the JIT budget, oldest first.", Kind::Counter, |s| s.jit_ranges_evicted),
    ("jit_read_errors", "Perf maps and jitdumps no longer read after a read error or a malformed record.", Kind::Counter, |s| s.jit_read_errors),
    ("jit_read_capped", "Processes whose perf map or jitdump reached the bytes the relay reads of one process: their newer JIT code stays unnamed.", Kind::Counter, |s| s.jit_read_capped),
    ("jit_ranges", "JIT code ranges the relay holds now, all processes together.", Kind::Gauge, |s| s.jit_ranges),
    ("jit_bytes", "Bytes the JIT code ranges held now take (names and sources included).", Kind::Gauge, |s| s.jit_bytes),
];

/// The sinks' windows unwritten (`run --output-dir`, `record --output`): name, help, value.
type OutputSeries = (&'static str, &'static str, fn(&OutputStats) -> u64);

const OUTPUT: [OutputSeries; 2] = [
    (
        "ember_relay_output_windows_failed",
        "Windows whose output files (--output-dir) could not be written; the error log names the fix.",
        |o| o.windows_failed,
    ),
    (
        "ember_relay_output_samples_unwritten",
        "Samples of the windows whose output files could not be written (still sent to the other sinks).",
        |o| o.samples_unwritten,
    ),
];

/// One counter or gauge of an OTLP exporter: name without `ember_relay_export_` and `_total`.
type ExportSeries = (&'static str, &'static str, Kind, fn(&Snapshot) -> u64);

const EXPORT: &[ExportSeries] = &[
    (
        "profiles",
        "Interval profiles handed to the OTLP exporter.",
        Kind::Counter,
        |s| s.profiles,
    ),
    (
        "requests",
        "OTLP export requests delivered.",
        Kind::Counter,
        |s| s.requests_sent,
    ),
    (
        "samples",
        "Samples delivered over OTLP.",
        Kind::Counter,
        |s| s.samples_sent,
    ),
    (
        "bytes",
        "Uncompressed protobuf bytes delivered over OTLP.",
        Kind::Counter,
        |s| s.bytes_sent,
    ),
    (
        "http_body_bytes",
        "OTLP/HTTP body bytes sent, after compression (gRPC: not counted).",
        Kind::Counter,
        |s| s.http_body_bytes_sent,
    ),
    (
        "retries",
        "OTLP request attempts retried after a retryable failure.",
        Kind::Counter,
        |s| s.retries,
    ),
    (
        "server_error_retries",
        "OTLP server errors (gRPC UNKNOWN, HTTP 500) retried because retry_server_errors is on \
         (Pyroscope 1.18/1.19 answer over-limit ingestion so); also counted in retries.",
        Kind::Counter,
        |s| s.server_error_retries,
    ),
    (
        "split_requests",
        "OTLP requests split because they exceeded the request size limit.",
        Kind::Counter,
        |s| s.split_requests,
    ),
    (
        "partial_successes",
        "OTLP responses reporting a partial success.",
        Kind::Counter,
        |s| s.partial_success,
    ),
    (
        "rejected_profiles",
        "Profiles the receiver rejected in partial successes.",
        Kind::Counter,
        |s| s.rejected_profiles,
    ),
    (
        "queue_bytes",
        "Bytes of encoded requests waiting in the export queue now.",
        Kind::Gauge,
        |s| s.queue_bytes,
    ),
    (
        "queue_high_water_bytes",
        "The most bytes the export queue has held.",
        Kind::Gauge,
        |s| s.queue_high_water,
    ),
    (
        "queue_requests",
        "Requests waiting in the export queue now.",
        Kind::Gauge,
        |s| s.queue_requests,
    ),
];

/// Encodes everything `metrics` holds now.
pub(crate) fn render(metrics: &Metrics) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        published: metrics.published(),
        exporters: metrics.exporters().iter().map(|s| s.snapshot()).collect(),
        heartbeat_age: metrics.heartbeat_age().as_secs_f64(),
        started_unix: metrics.started_unix_seconds(),
        now: Instant::now(),
        process: process::read(),
        connections: metrics.connection_stats(),
        refused: Refusal::ALL.map(|reason| (reason, metrics.refusals().total(reason))),
    }));
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
    Ok(text)
}

/// The values of one scrape.
#[derive(Debug)]
struct Scrape {
    published: Published,
    exporters: Vec<Snapshot>,
    heartbeat_age: f64,
    started_unix: f64,
    now: Instant,
    process: Option<ProcessStats>,
    connections: std::sync::Arc<ConnectionStats>,
    /// The source's refused connections, by reason.
    refused: [(Refusal, u64); Refusal::ALL.len()],
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let relay = &self.published.relay;
        let build = [
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ("protocol_version", PROTOCOL_VERSION.to_string()),
        ];
        encoder
            .encode_descriptor(
                "ember_relay_build",
                "The relay's version and protocol version (value 1).",
                None,
                MetricType::Info,
            )?
            .encode_info(&build)?;
        self.encode_process(&mut encoder)?;
        gauge_f64(
            &mut encoder,
            "ember_relay_loop_heartbeat_age_seconds",
            "Seconds since the relay's loop last stepped (/healthz fails above 30).",
            self.heartbeat_age,
        )?;
        gauge_f64(
            &mut encoder,
            "ember_relay_last_batch_age_seconds",
            "Seconds since the latest batch arrived (absent before the first one).",
            relay.last_batch.map_or(f64::NAN, |at| {
                self.now.saturating_duration_since(at).as_secs_f64()
            }),
        )?;
        for (name, help, kind, value) in RELAY {
            series(
                &mut encoder,
                &format!("ember_relay_{name}"),
                help,
                *kind,
                value(relay),
            )?;
        }
        for (name, help, value) in OUTPUT {
            let value = value(&self.published.output);
            series(&mut encoder, name, help, Kind::Counter, value)?;
        }
        let mut refused = encoder.encode_descriptor(
            "ember_relay_sampler_connections_refused",
            "Sampler connections refused, or closed on a protocol error, by reason.",
            None,
            MetricType::Counter,
        )?;
        for (reason, total) in &self.refused {
            let labels = [("reason", reason.as_str())];
            ConstCounter::new(*total).encode(refused.encode_family(&labels)?)?;
        }
        self.encode_connections(&mut encoder)?;
        self.encode_latency(&mut encoder)?;
        if let Some(losses) = &relay.sampler {
            for (counter, value) in losses.counters() {
                let name = format!("ember_sampler_{}", counter.metric);
                series(&mut encoder, &name, counter.help, Kind::Counter, value)?;
            }
        }
        for export in &self.exporters {
            encode_export(&mut encoder, export)?;
        }
        encode_interpreters(&mut encoder, &crate::interp::seen::snapshot())?;
        Ok(())
    }
}

/// Processes seen running a recognized interpreter (`interp::seen`), by runtime and release.
fn encode_interpreters(
    encoder: &mut DescriptorEncoder,
    seen: &crate::interp::seen::Seen,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "ember_relay_interpreters_seen",
        "Processes seen mapping an interpreter the relay recognized (its functions are not named \
         yet: docs/runtimes.md), by runtime and release.",
        None,
        MetricType::Counter,
    )?;
    for ((runtime, version), release) in &seen.releases {
        let labels = [("runtime", *runtime), ("version", version.as_str())];
        ConstCounter::new(release.processes).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Scrape {
    /// The HTTP server's own connections (this scrape's among them).
    fn encode_connections(&self, encoder: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
        let stats = &self.connections;
        series(
            encoder,
            "ember_relay_metrics_connections",
            "Connections accepted by the metrics and health server.",
            Kind::Counter,
            stats.accepted(),
        )?;
        series(
            encoder,
            "ember_relay_metrics_connections_open",
            "Connections open on the metrics and health server now.",
            Kind::Gauge,
            stats.open(),
        )?;
        let mut closed = encoder.encode_descriptor(
            "ember_relay_metrics_connections_closed",
            "Connections the metrics and health server closed before their exchange ended, by \
             reason: head_timeout (request head incomplete 2 s after accept), peer_limit (a peer \
             over its connections; its oldest closed), server_full (all connections taken; the \
             oldest waiting closed), exchange_timeout (over 10 s).",
            None,
            MetricType::Counter,
        )?;
        for reason in Closed::ALL {
            let labels = [("reason", reason.as_str())];
            ConstCounter::new(stats.closed(reason)).encode(closed.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// The conventional `process_` series (those that could be read).
    fn encode_process(&self, encoder: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
        gauge_f64(
            encoder,
            "process_start_time_seconds",
            "When the relay started, seconds since the Unix epoch.",
            self.started_unix,
        )?;
        let Some(p) = &self.process else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        let help = "User and system CPU time the relay used, in seconds.";
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            help,
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size, in bytes.",
                Some(p.resident_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes.",
                Some(p.virtual_bytes),
            ),
            ("process_threads", "Threads of the relay.", Some(p.threads)),
            (
                "process_open_fds",
                "Open file descriptors (passed binaries included).",
                p.open_fds,
            ),
            (
                "process_max_fds",
                "The soft limit on open file descriptors.",
                p.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                series(encoder, name, help, Kind::Gauge, value)?;
            }
        }
        Ok(())
    }

    fn encode_latency(&self, encoder: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
        let latency = &self.published.latency;
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(latency.buckets)
            .collect();
        encoder
            .encode_descriptor(
                "ember_relay_batch_latency_seconds",
                "From an interval's end (sampler's clock) to its profile reaching the sinks.",
                None,
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(latency.sum_seconds, latency.count, &buckets, None)
    }
}

/// A family of the exporter's drops by reason: name, help, value of one reason.
type DropSeries = (&'static str, &'static str, fn(&Snapshot, DropReason) -> u64);

/// The OTLP exporter's series, dropped requests and samples by reason.
fn encode_export(encoder: &mut DescriptorEncoder, export: &Snapshot) -> Result<(), fmt::Error> {
    for (name, help, kind, value) in EXPORT {
        let name = format!("ember_relay_export_{name}");
        series(encoder, &name, help, *kind, value(export))?;
    }
    let dropped: [DropSeries; 2] = [
        (
            "ember_relay_export_dropped_requests",
            "OTLP requests given up, by reason.",
            Snapshot::dropped_requests,
        ),
        (
            "ember_relay_export_dropped_samples",
            "Samples in the OTLP requests given up, by reason.",
            Snapshot::dropped_samples,
        ),
    ];
    for (name, help, value) in dropped {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for reason in DropReason::ALL {
            let labels = [("reason", reason.as_str())];
            ConstCounter::new(value(export, reason)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn series(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: Kind,
    value: u64,
) -> Result<(), fmt::Error> {
    match kind {
        Kind::Counter => {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)
        }
        Kind::Gauge => {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
        }
    }
}

/// A gauge with a fractional value; NaN leaves it out.
fn gauge_f64(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), fmt::Error> {
    if value.is_nan() {
        return Ok(());
    }
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        sync::{atomic::AtomicU64, Arc},
    };

    use super::*;
    use crate::{sink::otlp::stats::Stats, source::Refusals};

    /// `name{labels}` -> value, and each family's HELP text and TYPE.
    struct Parsed {
        values: BTreeMap<String, f64>,
        help: BTreeMap<String, String>,
        types: BTreeMap<String, String>,
    }

    fn parse(text: &str) -> Parsed {
        let mut parsed = Parsed {
            values: BTreeMap::new(),
            help: BTreeMap::new(),
            types: BTreeMap::new(),
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP name text");
                parsed.help.insert(name.to_owned(), help.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                parsed.types.insert(name.to_owned(), kind.to_owned());
            } else {
                let (series, value) = line.rsplit_once(' ').expect("series value");
                let value = value.parse().expect("a number");
                assert!(
                    parsed.values.insert(series.to_owned(), value).is_none(),
                    "{line}"
                );
            }
        }
        parsed
    }

    /// Losses with every field a different value: counter i holds 1000 + i.
    fn distinct_losses() -> ember_protocol::Losses {
        ember_protocol::distinct_losses(1000)
    }

    fn scraped(metrics: &Metrics) -> Parsed {
        parse(&render(metrics).expect("encodes"))
    }

    #[test]
    fn processes_running_a_recognized_interpreter_are_counted_by_runtime_and_release() {
        use crate::interp::{
            cpython::{Interpreter, Version},
            seen, Recognized,
        };
        // Given two processes seen running a CPython release no other test uses
        let python = Recognized::CPython(Interpreter {
            version: Version::new(3, 99, 1),
            shared_library: true,
            first_vaddr: 0,
            layout: Err("test".to_owned()),
        });
        seen::note_process(&python, "python3", 1);
        seen::note_process(&python, "python3", 2);
        // When scraped
        let parsed = scraped(&Metrics::default());
        // Then one counter family labelled by runtime and release says so
        let name = "ember_relay_interpreters_seen_total";
        assert_eq!(parsed.types[name], "counter");
        assert!(parsed.help[name].contains("docs/runtimes.md"));
        let series = format!("{name}{{runtime=\"cpython\",version=\"3.99\"}}");
        assert_eq!(
            parsed.values.get(&series),
            Some(&2.0),
            "{:?}",
            parsed.values
        );
    }

    #[test]
    fn every_sampler_loss_field_is_a_counter_with_its_own_value() {
        // Given a snapshot whose loss report has a distinct value in every field
        let metrics = Metrics::default();
        let losses = distinct_losses();
        metrics.publish(&Published {
            relay: RelayStats {
                sampler: Some(losses),
                ..RelayStats::default()
            },
            ..Published::default()
        });
        // When it is scraped
        let parsed = scraped(&metrics);
        // Then each field of `Losses` (counted from its Debug form, so a new field counts too)
        // is one ember_sampler_*_total counter, and no two carry the same field
        let fields = format!("{losses:?}").matches(": ").count();
        let sampler: BTreeMap<&String, &f64> = parsed
            .values
            .iter()
            .filter(|(name, _)| name.starts_with("ember_sampler_"))
            .collect();
        assert_eq!(
            sampler.len(),
            fields,
            "one series per Losses field: {sampler:#?}"
        );
        let mut values: Vec<u64> = sampler.values().map(|v| **v as u64).collect();
        values.sort_unstable();
        assert_eq!(values, (1000..1000 + fields as u64).collect::<Vec<_>>());
        assert_eq!(
            parsed.values["ember_sampler_counts_map_full_samples_total"],
            1005.0
        );
        assert_eq!(
            parsed.values["ember_sampler_user_stacks_lost_total"],
            1003.0
        );
        for name in sampler.keys() {
            assert!(name.ends_with("_total"), "{name}");
            assert_eq!(parsed.types[*name], "counter", "{name}");
        }
    }

    #[test]
    fn every_counter_and_gauge_is_read_from_its_own_field() {
        // Given a snapshot in which every field of the relay's stats, the sampler's losses, the
        // sinks' unwritten windows, the source's refusals and an exporter's counters holds a
        // value no other field holds
        let refusals = Arc::new(Refusals::default());
        // (reason i: 5000 + i refusals)
        for (i, reason) in Refusal::ALL.into_iter().enumerate() {
            for _ in 0..5000 + i {
                refusals.count(reason);
            }
        }
        let metrics = Metrics::default().with_refusals(refusals);
        let relay = RelayStats {
            connections: 2001,
            connections_total: 2002,
            batches: 2003,
            samples_received: 2004,
            samples_symbolized: 2005,
            samples_filtered: 2006,
            samples_without_process: 2007,
            frames: 2008,
            unknown_frames: 2009,
            processes: 2010,
            files: 2011,
            resolvers: 2012,
            symbolizer: crate::symbolize::elf::CacheSize {
                files: 2013,
                entries: 2014,
                bytes: 2015,
                file_bytes: 2016,
            },
            symbolizer_hits: 2017,
            symbolizer_misses: 2018,
            resolvers_opened: 2019,
            resolvers_evicted: 2020,
            copied_bytes: 2021,
            files_symbols_only: 2022,
            files_too_large: 2023,
            files_panicked: 2024,
            labels_over_limit: 2025,
            label_claims_dropped: 2026,
            unwind_tables_too_large: 2027,
            unwind_tables_over_share: 2028,
            unwind_tables_withdrawn: 2029,
            unwind_tables_reoffered: 2030,
            unwind_cfi_refused: 2031,
            jit_frames_named: 2032,
            jit_frames_unnamed: 2033,
            jit_sources_refused: 2034,
            jit_entries: 2035,
            jit_lines_skipped: 2036,
            jit_ranges_evicted: 2037,
            jit_read_errors: 2038,
            jit_read_capped: 2039,
            jit_ranges: 2040,
            jit_bytes: 2041,
            sampler: Some(distinct_losses()),
            ..RelayStats::default()
        };
        metrics.publish(&Published {
            relay,
            output: OutputStats {
                windows_failed: 4001,
                samples_unwritten: 4002,
            },
            ..Published::default()
        });
        let stats = Arc::new(Stats::default());
        let exporter: [&AtomicU64; 13] = [
            &stats.profiles,
            &stats.requests_sent,
            &stats.samples_sent,
            &stats.bytes_sent,
            &stats.http_body_bytes_sent,
            &stats.retries,
            &stats.server_error_retries,
            &stats.split_requests,
            &stats.partial_success,
            &stats.rejected_profiles,
            &stats.queue_bytes,
            &stats.queue_high_water,
            &stats.queue_requests,
        ];
        for (i, counter) in exporter.into_iter().enumerate() {
            counter.store(3000 + i as u64, std::sync::atomic::Ordering::Relaxed);
        }
        // (reason i: i + 1 requests of 100 + i samples each)
        for (i, reason) in DropReason::ALL.into_iter().enumerate() {
            for _ in 0..=i {
                stats.dropped(reason, 100 + i as u64);
            }
        }
        metrics.watch_exporter(stats);
        // When it is scraped
        let parsed = scraped(&metrics);
        // Then each series, looked up by its name, carries the value of the field it names
        // (written out here rather than taken from the tables above, so that two series
        // swapped in a table, or one reading its neighbour's field, fail here)
        let relay = [
            ("ember_relay_samplers_connected", 2001),
            ("ember_relay_sampler_connections_total", 2002),
            ("ember_relay_batches_received_total", 2003),
            ("ember_relay_samples_received_total", 2004),
            ("ember_relay_samples_symbolized_total", 2005),
            ("ember_relay_samples_filtered_total", 2006),
            ("ember_relay_samples_without_process_total", 2007),
            ("ember_relay_frames_total", 2008),
            ("ember_relay_unknown_frames_total", 2009),
            ("ember_relay_processes", 2010),
            ("ember_relay_files", 2011),
            ("ember_relay_symbolizer_resolvers", 2012),
            ("ember_relay_symbolizer_cache_entries", 2014),
            ("ember_relay_symbolizer_cache_bytes", 2015),
            ("ember_relay_symbolizer_cache_file_bytes", 2016),
            ("ember_relay_symbolizer_cache_hits_total", 2017),
            ("ember_relay_symbolizer_cache_misses_total", 2018),
            ("ember_relay_symbolizer_resolvers_opened_total", 2019),
            ("ember_relay_symbolizer_resolvers_evicted_total", 2020),
            ("ember_relay_symbolizer_copied_bytes_total", 2021),
            ("ember_relay_symbolizer_files_symbols_only_total", 2022),
            ("ember_relay_symbolizer_files_too_large_total", 2023),
            ("ember_relay_symbolizer_files_panicked_total", 2024),
            ("ember_relay_labels_over_limit_total", 2025),
            ("ember_relay_label_claims_dropped_total", 2026),
            ("ember_relay_unwind_tables_too_large_total", 2027),
            ("ember_relay_unwind_tables_over_share_total", 2028),
            ("ember_relay_unwind_tables_withdrawn_total", 2029),
            ("ember_relay_unwind_tables_reoffered_total", 2030),
            ("ember_relay_unwind_cfi_refused_total", 2031),
            ("ember_relay_jit_frames_named_total", 2032),
            ("ember_relay_jit_frames_unnamed_total", 2033),
            ("ember_relay_jit_perf_maps_refused_total", 2034),
            ("ember_relay_jit_entries_read_total", 2035),
            ("ember_relay_jit_lines_skipped_total", 2036),
            ("ember_relay_jit_ranges_evicted_total", 2037),
            ("ember_relay_jit_read_errors_total", 2038),
            ("ember_relay_jit_read_capped_total", 2039),
            ("ember_relay_jit_ranges", 2040),
            ("ember_relay_jit_bytes", 2041),
        ];
        // (in the order of the fields of `Losses`, which `distinct_losses` numbers from 1000)
        let sampler = [
            "samples",
            "idle_samples",
            "filtered_samples",
            "user_stacks_lost",
            "kernel_stacks_lost",
            "counts_map_full_samples",
            "backlog_dropped_batches",
            "backlog_dropped_samples",
            "proc_errors",
            "facts_dropped",
            "facts_truncated",
            "files_unopened",
            "unwind_tables_loaded",
            "unwind_tables_refused",
            "unwind_stopped",
            "unwind_cut",
            "unwind_map_full",
            "unwind_outermost",
            "unwind_stop_cfa_register",
            "unwind_stop_cfa_expression",
            "unwind_stop_offset_range",
            "unwind_stop_return_address_rule",
            "unwind_stop_rbp_rule",
            "unwind_stop_malformed",
            "unwind_stop_budget",
            "unwind_read_failed",
            "unwind_zero_end",
            "unwind_fp_no_mapping",
            "unwind_fp_no_table",
            "unwind_fp_gap",
            "unwind_no_process",
            "unwind_tables_evicted",
            "interp_walked",
            "interp_no_thread",
            "interp_read_failed",
            "interp_cut",
            "interp_stacks_full",
            "interp_codes_full",
            "interp_bad_code",
            "interp_refused",
            "off_cpu_kept",
            "off_cpu_sampled_out",
            "off_cpu_counts_full",
        ];
        let sampler = sampler
            .iter()
            .enumerate()
            .map(|(i, name)| (format!("ember_sampler_{name}_total"), 1000 + i as u64));
        let export = [
            ("profiles_total", 3000),
            ("requests_total", 3001),
            ("samples_total", 3002),
            ("bytes_total", 3003),
            ("http_body_bytes_total", 3004),
            ("retries_total", 3005),
            ("server_error_retries_total", 3006),
            ("split_requests_total", 3007),
            ("partial_successes_total", 3008),
            ("rejected_profiles_total", 3009),
            ("queue_bytes", 3010),
            ("queue_high_water_bytes", 3011),
            ("queue_requests", 3012),
        ];
        let export = export
            .iter()
            .map(|(name, value)| (format!("ember_relay_export_{name}"), *value));
        let dropped = DropReason::ALL
            .into_iter()
            .enumerate()
            .flat_map(|(i, reason)| {
                let (i, reason) = (i as u64, reason.as_str());
                [
                    (
                        format!("ember_relay_export_dropped_requests_total{{reason=\"{reason}\"}}"),
                        i + 1,
                    ),
                    (
                        format!("ember_relay_export_dropped_samples_total{{reason=\"{reason}\"}}"),
                        (i + 1) * (100 + i),
                    ),
                ]
            });
        let output = [
            ("ember_relay_output_windows_failed_total", 4001),
            ("ember_relay_output_samples_unwritten_total", 4002),
        ];
        let refused = [
            "peer_uid",
            "credentials",
            "too_many",
            "recv_error",
            "oversized",
            "malformed",
            "handshake",
            "version",
            "fd_index",
        ];
        let refused = refused.iter().enumerate().map(|(i, reason)| {
            (
                format!("ember_relay_sampler_connections_refused_total{{reason=\"{reason}\"}}"),
                5000 + i as u64,
            )
        });
        let expected: Vec<(String, u64)> = relay
            .iter()
            .chain(&output)
            .map(|(name, value)| ((*name).to_owned(), *value))
            .chain(refused)
            .chain(sampler)
            .chain(export)
            .chain(dropped)
            .collect();
        for (name, value) in &expected {
            assert_eq!(
                parsed.values.get(name).copied(),
                Some(*value as f64),
                "{name}"
            );
        }
        // And every other ember_ series is one of those checked (but for the few whose values
        // the test cannot choose, which the test below checks)
        let checked: std::collections::BTreeSet<&str> =
            expected.iter().map(|(name, _)| name.as_str()).collect();
        let elsewhere = [
            "ember_relay_build_info",
            "ember_relay_loop_heartbeat_age_seconds",
            "ember_relay_batch_latency_seconds",
            "ember_relay_metrics_connections",
        ];
        for name in parsed.values.keys() {
            if name.starts_with("ember_") && !elsewhere.iter().any(|e| name.starts_with(e)) {
                assert!(checked.contains(name.as_str()), "unchecked: {name}");
            }
        }
        let relay_fields = RELAY.len();
        assert_eq!(relay.len(), relay_fields, "a RELAY series unchecked here");
    }

    #[test]
    fn relay_series_have_conventional_names_types_and_help() {
        // Given a relay that received batches and an OTLP exporter that dropped one request
        let metrics = Metrics::default();
        let mut latency = super::super::Latency::default();
        latency.observe(0.02);
        latency.observe(0.3);
        metrics.publish(&Published {
            relay: RelayStats {
                connections: 1,
                connections_total: 2,
                samples_received: 42,
                samples_symbolized: 40,
                samples_filtered: 2,
                processes: 7,
                files_symbols_only: 3,
                files_too_large: 4,
                files_panicked: 5,
                unwind_tables_too_large: 6,
                unwind_tables_over_share: 7,
                unwind_tables_withdrawn: 8,
                unwind_tables_reoffered: 9,
                ..RelayStats::default()
            },
            latency,
            ..Published::default()
        });
        let stats = Arc::new(Stats::default());
        stats.dropped(DropReason::QueueFull, 9);
        stats
            .queue_bytes
            .store(4096, std::sync::atomic::Ordering::Relaxed);
        metrics.watch_exporter(stats);
        // When it is scraped
        let parsed = scraped(&metrics);
        let v = |name: &str| parsed.values.get(name).copied();
        // Then counters end in _total, gauges do not, and every family has a HELP line
        assert_eq!(v("ember_relay_samples_received_total"), Some(42.0));
        assert_eq!(v("ember_relay_samples_symbolized_total"), Some(40.0));
        assert_eq!(v("ember_relay_samplers_connected"), Some(1.0));
        assert_eq!(v("ember_relay_sampler_connections_total"), Some(2.0));
        assert_eq!(v("ember_relay_processes"), Some(7.0));
        assert_eq!(parsed.types["ember_relay_processes"], "gauge");
        for (files, value) in [("symbols_only", 3.0), ("too_large", 4.0), ("panicked", 5.0)] {
            let name = format!("ember_relay_symbolizer_files_{files}_total");
            assert_eq!(v(&name), Some(value), "{name}");
        }
        for (what, value) in [
            ("too_large", 6.0),
            ("over_share", 7.0),
            ("withdrawn", 8.0),
            ("reoffered", 9.0),
        ] {
            let name = format!("ember_relay_unwind_tables_{what}_total");
            assert_eq!(v(&name), Some(value), "{name}");
        }
        assert_eq!(
            parsed.types["ember_relay_samples_received_total"],
            "counter"
        );
        let refused = "ember_relay_sampler_connections_refused_total";
        assert_eq!(parsed.types[refused], "counter");
        assert!(v(&format!("{refused}{{reason=\"version\"}}")).is_some());
        // And the metrics server's own connections, closed ones by reason
        assert_eq!(v("ember_relay_metrics_connections_total"), Some(0.0));
        assert_eq!(v("ember_relay_metrics_connections_open"), Some(0.0));
        let closed = "ember_relay_metrics_connections_closed_total";
        assert_eq!(parsed.types[closed], "counter");
        for reason in Closed::ALL {
            let series = format!("{closed}{{reason=\"{}\"}}", reason.as_str());
            assert_eq!(v(&series), Some(0.0), "{series}");
        }
        assert_eq!(
            v("ember_relay_build_info{version=\"0.1.0\",protocol_version=\"3\"}"),
            Some(1.0)
        );
        // And the latency histogram is cumulative, in seconds
        assert_eq!(
            parsed.types["ember_relay_batch_latency_seconds"],
            "histogram"
        );
        assert_eq!(
            v("ember_relay_batch_latency_seconds_bucket{le=\"0.025\"}"),
            Some(1.0)
        );
        assert_eq!(
            v("ember_relay_batch_latency_seconds_bucket{le=\"0.5\"}"),
            Some(2.0)
        );
        assert_eq!(
            v("ember_relay_batch_latency_seconds_bucket{le=\"+Inf\"}"),
            Some(2.0)
        );
        assert_eq!(v("ember_relay_batch_latency_seconds_count"), Some(2.0));
        // And the exporter's drops are one family labelled by reason, its queue a gauge in bytes
        let dropped = |reason: &str| {
            v(&format!(
                "ember_relay_export_dropped_samples_total{{reason=\"{reason}\"}}"
            ))
        };
        assert_eq!(dropped("queue_full"), Some(9.0));
        assert_eq!(dropped("retries_exhausted"), Some(0.0));
        assert_eq!(v("ember_relay_export_queue_bytes"), Some(4096.0));
        // And the process's own resources under the conventional names
        assert_eq!(parsed.types["process_cpu_seconds_total"], "counter");
        assert!(v("process_resident_memory_bytes").is_some_and(|b| b > 0.0));
        assert!(v("process_open_fds").is_some_and(|n| n >= 3.0));
        // And no sampler series before the first batch
        assert!(!parsed
            .values
            .keys()
            .any(|k| k.starts_with("ember_sampler_")));
        for name in parsed.types.keys() {
            let help = &parsed.help[name];
            assert!(
                help.len() > 10 && help.ends_with('.') || help.ends_with(')'),
                "{name}: {help}"
            );
            let prefixed = ["ember_relay_", "ember_sampler_", "process_"]
                .iter()
                .any(|p| name.starts_with(p));
            assert!(prefixed, "{name}");
            assert_eq!(
                parsed.types[name] == "counter",
                name.ends_with("_total"),
                "{name}"
            );
        }
    }
}
