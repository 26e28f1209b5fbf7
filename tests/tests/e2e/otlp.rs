//! OTLP export tests.
//!
//! In-process (no eBPF, no root): the relay's real exporter ([`Exporter`], configured through its
//! real config resolution) against the real test receivers over loopback, for the delivery
//! faults: receiver down at start, UNAVAILABLE, permanent errors, partial success, a slow
//! receiver, a dead one, and requests over the size limit.
//!
//! Whole chain (root): the ground-truth workload recorded by the real sampler and relay
//! (`ember-relay record --otlp-*`) into a real receiver, checked from the decoded requests alone,
//! in both wire generations and by the official Python decoder.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    sync::{Arc, Mutex, OnceLock},
    thread,
    time::Duration,
};

use ember_relay::testing::{
    config::{self, OtlpFlags},
    model::{Frame, FrameKind, LabeledProfile, Module, SymbolizedSample, Thread},
    sink::otlp::{
        exporter::Settings,
        stats::{DropReason, Snapshot},
        transport::Protocol,
        Drained, Exporter, ProtoVersion, SampleAttributes,
    },
};
use ember_tests::{
    otlp::{self, Decoded, Receiver, Reply},
    pyroscope, *,
};
use serde_json::Value;

use super::{
    has_full_chain, last_json_line, pid_arg, FIRST_BATCH_TIMEOUT, FUNCS, LOG_TIMEOUT,
    RECORD_TIMEOUT,
};

const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Log capture: the exporter logs on its own thread, so a global subscriber writes every line to
// stderr and to a buffer the tests read.

fn log_buffer() -> &'static Mutex<Vec<u8>> {
    static BUFFER: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    BUFFER.get_or_init(|| Mutex::new(Vec::new()))
}

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // eprint!, not io::stderr(): the test harness captures it per test (threads inherit it).
        eprint!("{}", String::from_utf8_lossy(buf));
        log_buffer()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (once) and returns the current end of the log.
fn log_mark() -> usize {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("info")
            .with_ansi(false)
            .with_writer(|| Capture)
            .try_init();
    });
    log_buffer().lock().unwrap().len()
}

fn log_since(mark: usize) -> String {
    String::from_utf8_lossy(&log_buffer().lock().unwrap()[mark..]).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Synthetic profiles and exporter set-up

/// A profile of `processes` processes with `stacks` distinct 12-frame stacks each, every stack
/// sampled `count` times. Function names are unique per (process, stack, depth).
fn synthetic(processes: u32, stacks: u64, count: u64, tag: &str) -> LabeledProfile {
    let mut profile = LabeledProfile::new(97);
    profile.hostname = Some("test-host".into());
    for pid in 1..=processes {
        let module = Arc::new(Module {
            path: format!("/usr/bin/app{pid}").into(),
            build_id: Some("0123abcd".into()),
            start: 0x40_0000,
            end: 0x80_0000,
            file_offset: 0,
            file: None,
        });
        for s in 0..stacks {
            let frames: Vec<Frame> = (0..12u64)
                .map(|depth| Frame {
                    function: format!("{tag}_p{pid}_s{s}_d{depth}").into(),
                    file: Some("src/app.c".into()),
                    line: Some(10),
                    kind: FrameKind::Native,
                    inlined: false,
                    address: 0x40_1000 + s * 0x100 + depth,
                    module: Some(Arc::clone(&module)),
                })
                .collect();
            profile.add(
                SymbolizedSample {
                    thread: Thread {
                        pid: 1000 + pid,
                        tid: 1000 + pid,
                        process_name: format!("app{pid}").into(),
                        thread_name: format!("app{pid}").into(),
                        executable_path: format!("/usr/bin/app{pid}").into(),
                        container_id: None,
                    },
                    stack: frames.into(),
                    count,
                },
                1_700_000_000_000_000_000,
                1_700_000_001_000_000_000,
            );
        }
    }
    profile
}

/// Sample and resource attributes follow the options and the data exactly, decoded from the
/// bytes: `thread.name` only when asked for and the thread has a name, never empty;
/// `process.executable.path` only when the path is known.
#[test]
fn otlp_attributes_follow_the_options_and_the_data() {
    let mut profile = synthetic(1, 2, 3, "named");
    let frame = Frame {
        function: "anon_main".into(),
        file: None,
        line: None,
        kind: FrameKind::Native,
        inlined: false,
        address: 0x1000,
        module: None,
    };
    profile.add(
        SymbolizedSample {
            thread: Thread {
                pid: 2002,
                tid: 2002,
                process_name: "anon".into(),
                thread_name: "".into(),
                executable_path: "".into(),
                container_id: None,
            },
            stack: vec![frame].into(),
            count: 5,
        },
        1_700_000_000_000_000_000,
        1_700_000_001_000_000_000,
    );
    for thread_name in [true, false] {
        let options = SampleAttributes {
            thread_name,
            ..SampleAttributes::default()
        };
        let encoding = ember_relay::testing::sink::otlp::encode(
            &profile,
            ProtoVersion::V1_10,
            options,
            usize::MAX,
        );
        let mut seen = BTreeSet::new();
        for request in &encoding.requests {
            let decoded = otlp::decode("1.10", &request.body).expect("decodes as v1.10");
            for (resource, sample) in decoded.samples() {
                let name = resource.attributes.get("process.executable.name").cloned();
                let path = resource.attributes.get("process.executable.path");
                let thread = sample.attributes.get("thread.name");
                match name.as_deref() {
                    Some("app1") => {
                        assert_eq!(path.map(String::as_str), Some("/usr/bin/app1"));
                        let expected = thread_name.then_some("app1");
                        assert_eq!(
                            thread.map(String::as_str),
                            expected,
                            "thread.name with thread_name: {thread_name}"
                        );
                    }
                    Some("anon") => {
                        assert_eq!(path, None, "an unknown executable path was exported");
                        assert_eq!(thread, None, "an empty thread name was exported");
                    }
                    other => panic!("a resource of an unknown process {other:?}"),
                }
                seen.insert(name.unwrap_or_default());
            }
        }
        assert_eq!(seen, BTreeSet::from(["anon".to_owned(), "app1".to_owned()]));
    }
}

/// Exporter settings through the relay's own resolution: `yaml` is the `exporters.otlp` body
/// (indented 4), plus flags for endpoint, protocol and version.
fn settings(url: &str, protocol: Protocol, version: ProtoVersion, yaml: &str) -> Settings {
    try_settings(url, protocol, version, yaml).expect("resolving the test config")
}

fn try_settings(
    url: &str,
    protocol: Protocol,
    version: ProtoVersion,
    yaml: &str,
) -> Result<Settings, config::ConfigError> {
    let retry = if yaml.contains("retry_on_failure") {
        ""
    } else {
        "    retry_on_failure: { initial_interval: 50ms, max_interval: 500ms, max_elapsed_time: 60s }\n"
    };
    let text = format!("exporters:\n  otlp:\n{retry}    stats_interval: 1s\n{yaml}");
    let file = config::parse(&text, "test.yaml").expect("test config");
    let flags = OtlpFlags {
        endpoint: Some(url.to_owned()),
        protocol: Some(protocol),
        proto_version: Some(version),
        headers: vec![("X-Scope-OrgID".into(), "ember-test".into())],
        insecure: false,
    };
    Ok(config::resolve(&file.exporters, &flags, &|_| None)?
        .otlp
        .expect("otlp enabled"))
}

fn decoded_total(receiver: &Receiver, version: &str) -> i64 {
    receiver
        .received()
        .iter()
        .map(|r| otlp::decode(version, &r.body).expect("decoding").total())
        .sum()
}

fn all_dropped(s: &Snapshot) -> u64 {
    s.total_dropped_samples()
}

// ---------------------------------------------------------------------------------------------
// Delivery faults (in-process)

/// The receiver is down when the relay starts exporting; the data arrives once it comes up.
#[test]
fn otlp_receiver_down_at_start_delivers_when_it_comes_up() {
    let _lock = ebpf_lock();
    let mark = log_mark();
    let addr = otlp::free_addr();
    let exporter = Exporter::start(settings(
        &format!("http://{addr}"),
        Protocol::Grpc,
        ProtoVersion::V1_10,
        "",
    ))
    .expect("starting the exporter");
    let profile = synthetic(2, 5, 3, "down");
    let total = profile.total_samples();
    exporter.export(profile);
    // Wait until the exporter has failed at least twice against the closed port.
    let retried = wait_until(DELIVERY_TIMEOUT, || exporter.stats().retries >= 2);
    assert!(
        retried.is_some(),
        "the exporter never retried: {:?}",
        exporter.stats()
    );
    let receiver = Receiver::grpc(Some(addr));
    assert!(
        receiver.wait_for(DELIVERY_TIMEOUT, |r| !r.is_empty()),
        "nothing arrived after the receiver came up; log:\n{}",
        log_since(mark)
    );
    let (drained, stats) = exporter.shutdown(Duration::from_secs(10));
    eprintln!("stats: {stats:?}");
    assert_eq!(drained, Drained::Drained);
    assert_eq!(decoded_total(&receiver, "1.10") as u64, total);
    assert_eq!(stats.samples_sent, total);
    assert_eq!(all_dropped(&stats), 0);
    assert!(stats.retries >= 2);
    let log = log_since(mark);
    assert!(log.contains("retrying"), "no retry logged:\n{log}");
}

/// UNAVAILABLE three times (gRPC), and 503 then 429 with Retry-After (HTTP): retried and
/// delivered exactly once.
#[test]
fn otlp_unavailable_is_retried_and_delivered_once() {
    let _lock = ebpf_lock();
    log_mark();
    for (protocol, replies) in [
        (
            Protocol::Grpc,
            vec![Reply::Unavailable, Reply::Unavailable, Reply::Unavailable],
        ),
        (
            Protocol::Http,
            vec![Reply::Unavailable, Reply::Throttle(1), Reply::Unavailable],
        ),
    ] {
        eprintln!("--- {protocol:?}");
        let receiver = match protocol {
            Protocol::Grpc => Receiver::grpc(None),
            Protocol::Http => Receiver::http(None),
        };
        receiver.script(replies.clone());
        let exporter =
            Exporter::start(settings(&receiver.url(), protocol, ProtoVersion::V1_10, "")).unwrap();
        let profile = synthetic(1, 4, 2, "retry");
        let total = profile.total_samples();
        exporter.export(profile);
        assert!(receiver.wait_for(DELIVERY_TIMEOUT, |r| !r.is_empty()));
        let (drained, stats) = exporter.shutdown(Duration::from_secs(10));
        assert_eq!(drained, Drained::Drained);
        assert_eq!(receiver.received().len(), 1, "delivered more than once");
        assert_eq!(receiver.attempts(), 4, "answers: {:?}", receiver.answered());
        assert_eq!(stats.retries, 3);
        assert_eq!(stats.requests_sent, 1);
        assert_eq!(stats.samples_sent, total);
        assert_eq!(all_dropped(&stats), 0);
        let headers = &receiver.received()[0].headers;
        assert_eq!(
            headers.get("x-scope-orgid").map(String::as_str),
            Some("ember-test"),
            "custom header missing: {headers:?}"
        );
        assert!(
            receiver.received()[0].gzip,
            "request was not gzip-compressed"
        );
    }
}

/// Pyroscope 1.18/1.19 reject ingestion over their limits with gRPC UNKNOWN / HTTP 500: with
/// the v1.9 generation (theirs) those are retried within the budget and counted; with v1.10
/// they stay permanent unless `retry_server_errors` asks otherwise.
#[test]
fn otlp_server_errors_are_retried_for_pyroscope_1_9_receivers() {
    let _lock = ebpf_lock();
    log_mark();
    let limit = "pushing profiles: ingestion rate limit (50 MB) reached";
    for protocol in [Protocol::Grpc, Protocol::Http] {
        for (version, yaml, retried) in [
            (ProtoVersion::V1_9, "", true),
            (ProtoVersion::V1_10, "", false),
            (
                ProtoVersion::V1_10,
                "    retry_on_failure: { initial_interval: 50ms, max_interval: 500ms, \
                 max_elapsed_time: 60s, retry_server_errors: true }\n",
                true,
            ),
        ] {
            eprintln!("--- {protocol:?} {version:?} {yaml:?}");
            let receiver = match protocol {
                Protocol::Grpc => Receiver::grpc(None),
                Protocol::Http => Receiver::http(None),
            };
            receiver.script([
                Reply::ServerError(limit.into()),
                Reply::ServerError(limit.into()),
            ]);
            let exporter =
                Exporter::start(settings(&receiver.url(), protocol, version, yaml)).unwrap();
            let profile = synthetic(1, 4, 2, "limit");
            let total = profile.total_samples();
            exporter.export(profile);
            let attempts = if retried { 3 } else { 1 };
            // Wait for the request's end: delivered or dropped.
            let settled = wait_until(DELIVERY_TIMEOUT, || {
                let stats = exporter.stats();
                stats.samples_sent + all_dropped(&stats) >= total
            });
            assert!(settled.is_some(), "not settled: {:?}", exporter.stats());
            let (drained, stats) = exporter.shutdown(Duration::from_secs(10));
            eprintln!("stats: {stats:?}");
            assert_eq!(drained, Drained::Drained);
            assert_eq!(receiver.attempts(), attempts, "{:?}", receiver.answered());
            if retried {
                assert_eq!(receiver.received().len(), 1, "delivered more than once");
                assert_eq!(stats.samples_sent, total);
                assert_eq!((stats.retries, stats.server_error_retries), (2, 2));
                assert_eq!(all_dropped(&stats), 0);
            } else {
                assert_eq!(stats.samples_sent, 0);
                assert_eq!(stats.dropped_samples(DropReason::Permanent), total);
                assert_eq!((stats.retries, stats.server_error_retries), (0, 0));
            }
        }
    }
}

/// A permanent error drops that request (counted, logged once with the server's message) and
/// the next one goes through; a partial success is logged and counted.
#[test]
fn otlp_permanent_error_is_dropped_counted_and_logged() {
    let _lock = ebpf_lock();
    for protocol in [Protocol::Grpc, Protocol::Http] {
        eprintln!("--- {protocol:?}");
        let mark = log_mark();
        let receiver = match protocol {
            Protocol::Grpc => Receiver::grpc(None),
            Protocol::Http => Receiver::http(None),
        };
        receiver.script([
            Reply::Invalid("tenant ember-test is not allowed here".into()),
            Reply::Invalid("tenant ember-test is not allowed here".into()),
            Reply::Partial {
                rejected: 1,
                message: "one profile had no samples".into(),
            },
        ]);
        let exporter =
            Exporter::start(settings(&receiver.url(), protocol, ProtoVersion::V1_10, "")).unwrap();
        let mut totals = Vec::new();
        for i in 0..4 {
            let profile = synthetic(1, 3, 1 + i, &format!("perm{i}"));
            totals.push(profile.total_samples());
            exporter.export(profile);
        }
        assert!(receiver.wait_for(DELIVERY_TIMEOUT, |r| r.len() >= 2));
        let (drained, stats) = exporter.shutdown(Duration::from_secs(10));
        eprintln!("stats: {stats:?}");
        assert_eq!(drained, Drained::Drained);
        assert_eq!(receiver.attempts(), 4, "a permanent error was retried");
        assert_eq!(stats.dropped_requests(DropReason::Permanent), 2);
        assert_eq!(
            stats.dropped_samples(DropReason::Permanent),
            totals[0] + totals[1]
        );
        assert_eq!(stats.samples_sent, totals[2] + totals[3]);
        assert_eq!(stats.retries, 0);
        assert_eq!(stats.partial_success, 1);
        assert_eq!(stats.rejected_profiles, 1);
        let log = log_since(mark);
        let errors = log
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("tenant ember-test is not allowed here"))
            .count();
        assert_eq!(
            errors, 1,
            "the permanent error should be logged once:\n{log}"
        );
        assert!(
            log.contains("one profile had no samples"),
            "partial success not logged:\n{log}"
        );
        assert!(log.contains("otlp export stats"), "no stats line:\n{log}");
    }
}

/// A slow receiver: the queue stays within its byte bound, the oldest requests are dropped and
/// counted, and every sample is either delivered or counted as dropped.
#[test]
fn otlp_slow_receiver_keeps_the_queue_bounded() {
    let _lock = ebpf_lock();
    log_mark();
    let receiver = Receiver::http(None);
    receiver.set_delay(Duration::from_millis(300));
    let one = ember_relay::testing::sink::otlp::encode(
        &synthetic(1, 50, 1, "slow00"),
        ProtoVersion::V1_10,
        Default::default(),
        usize::MAX,
    );
    let request_bytes = one.requests[0].body.len();
    let bound = request_bytes * 5 / 2;
    let exporter = Exporter::start(settings(
        &receiver.url(),
        Protocol::Http,
        ProtoVersion::V1_10,
        &format!("    sending_queue: {{ queue_size_bytes: {bound} }}\n    max_request_bytes: {request_bytes}\n"),
    ))
    .unwrap();
    let mut total = 0;
    for i in 0..30 {
        let profile = synthetic(1, 50, 1, &format!("slow{i:02}"));
        total += profile.total_samples();
        exporter.export(profile);
        thread::sleep(Duration::from_millis(20));
    }
    // Seen from the receiver, not from the exporter's own figures: once the producer stopped,
    // only what the queue held (whole requests of `request_bytes`) and the one request in flight
    // can still arrive. An unbounded queue would deliver all 30.
    let seen_when_producer_stopped = receiver.received().len();
    let settled = wait_until(DELIVERY_TIMEOUT, || {
        let s = exporter.stats();
        s.samples_sent + all_dropped(&s) == total
    });
    let (drained, stats) = exporter.shutdown(Duration::from_secs(30));
    let seen_after = receiver.received().len();
    let queue_capacity = bound / request_bytes;
    eprintln!(
        "slow receiver: the receiver had {seen_when_producer_stopped} requests when the producer \
         stopped, {seen_after} in the end; the queue holds {queue_capacity} requests"
    );
    assert!(
        seen_after - seen_when_producer_stopped <= queue_capacity + 1,
        "{} requests reached the receiver after the producer stopped, but a queue of {bound} B \
         holds only {queue_capacity} requests of {request_bytes} B (+1 in flight): the queue is \
         not bounded",
        seen_after - seen_when_producer_stopped
    );
    eprintln!(
        "slow receiver: {total} samples handed over, {} sent, dropped {:?}; queue bound {bound} B, \
         high water {} B",
        stats.samples_sent, stats.dropped_samples, stats.queue_high_water
    );
    assert!(settled.is_some(), "samples unaccounted for: {stats:?}");
    assert_eq!(drained, Drained::Drained);
    assert!(
        stats.queue_high_water as usize <= bound,
        "queue grew to {} B past its bound {bound} B",
        stats.queue_high_water
    );
    assert!(
        stats.dropped_samples(DropReason::QueueFull) > 0,
        "no queue_full drops: {stats:?}"
    );
    assert_eq!(stats.samples_sent + all_dropped(&stats), total);
    assert_eq!(decoded_total(&receiver, "1.10") as u64, stats.samples_sent);
}

/// A request over the size limit is split into requests under it, each with its own dictionary,
/// and no sample is lost.
#[test]
fn otlp_oversized_request_is_split() {
    let _lock = ebpf_lock();
    log_mark();
    for (version, name) in [(ProtoVersion::V1_10, "1.10"), (ProtoVersion::V1_9, "1.9")] {
        let receiver = Receiver::http(None);
        let limit = 64 * 1024;
        let exporter = Exporter::start(settings(
            &receiver.url(),
            Protocol::Http,
            version,
            &format!("    max_request_bytes: {limit}\n"),
        ))
        .unwrap();
        let profile = synthetic(3, 300, 2, "big");
        let total = profile.total_samples();
        let expected_leaves: BTreeSet<String> = profile
            .samples()
            .iter()
            .map(|s| s.stack.first().unwrap().function.to_string())
            .collect();
        exporter.export(profile);
        let (drained, stats) = exporter.shutdown(DELIVERY_TIMEOUT);
        assert_eq!(drained, Drained::Drained);
        let received = receiver.received();
        eprintln!(
            "v{name}: {} requests, sizes {:?}",
            received.len(),
            received.iter().map(|r| r.body.len()).collect::<Vec<_>>()
        );
        assert!(received.len() > 1, "not split");
        assert!(received.iter().all(|r| r.body.len() <= limit));
        let mut leaves = BTreeSet::new();
        let mut sum = 0;
        for r in &received {
            let decoded = otlp::decode(name, &r.body).expect("each part decodes on its own");
            assert!(decoded.empty_first);
            sum += decoded.total();
            for (_, s) in decoded.samples() {
                leaves.insert(s.stack[0].clone());
            }
        }
        assert_eq!(sum as u64, total);
        assert_eq!(leaves, expected_leaves);
        assert_eq!(stats.split_requests, received.len() as u64);
    }
}

/// The queue's memory bound under a dead receiver (connection refused throughout): measured and
/// printed; the queue never holds more than its bound.
#[test]
fn otlp_dead_receiver_memory_bound() {
    let _lock = ebpf_lock();
    log_mark();
    let addr = otlp::free_addr();
    let bound = 4 << 20;
    let exporter = Exporter::start(settings(
        &format!("http://{addr}"),
        Protocol::Grpc,
        ProtoVersion::V1_10,
        &format!(
            "    sending_queue: {{ queue_size_bytes: {bound} }}\n    max_request_bytes: {bound}\n"
        ),
    ))
    .unwrap();
    let rss = || -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    // 400 profiles of ~115 KB requests: ~46 MB if nothing were dropped, 11x the queue bound, so
    // the process's own memory (VmRSS, read by the kernel, not by the exporter) tells a bounded
    // queue from an unbounded one.
    const PROFILES: u64 = 400;
    let rss_before = rss();
    let mut rss_samples = Vec::new();
    let mut total = 0;
    for i in 0..PROFILES {
        let profile = synthetic(2, 100, 1, &format!("dead{i:03}"));
        total += profile.total_samples();
        exporter.export(profile);
        thread::sleep(Duration::from_millis(10));
        if i % 20 == 19 {
            rss_samples.push(rss());
        }
    }
    // Every profile is either taken in or dropped at the hand-over (counted).
    let handed_over = wait_until(DELIVERY_TIMEOUT, || {
        let s = exporter.stats();
        s.profiles + s.dropped_requests(DropReason::ChannelFull) == PROFILES
    });
    let stats = exporter.stats();
    assert!(
        handed_over.is_some(),
        "profiles neither taken in nor counted as dropped at the hand-over: {stats:?}"
    );
    rss_samples.push(rss());
    let (drained, final_stats) = exporter.shutdown(Duration::from_millis(200));
    // A dead receiver cannot be drained: the shutdown says so and counts what it dropped.
    match drained {
        Drained::TimedOut { requests, samples } => {
            assert!(requests > 0);
            assert_eq!(samples, final_stats.dropped_samples(DropReason::Shutdown));
        }
        Drained::Drained => panic!("a dead receiver was reported drained: {final_stats:?}"),
    }
    eprintln!(
        "FIGURE dead receiver: {total} samples handed over; queue bound {bound} B; queue high \
         water {} B ({} requests queued at the end); dropped queue_full {} samples; process RSS \
         (KiB) along the way: {rss_samples:?}",
        stats.queue_high_water,
        stats.queue_requests,
        stats.dropped_samples(DropReason::QueueFull)
    );
    assert!(stats.queue_high_water <= bound as u64);
    assert!(stats.dropped_samples(DropReason::QueueFull) > 0);
    // From outside: the process grew by at most twice the bound (the queue, and requests being
    // encoded or retried beside it) plus 16 MiB for the allocator and the runtime.
    let grown_kib = rss_samples
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .saturating_sub(rss_before);
    let allowed_kib = 2 * bound as u64 / 1024 + 16 * 1024;
    eprintln!("VmRSS grew by {grown_kib} KiB (allowed {allowed_kib} KiB) from {rss_before} KiB");
    assert!(
        grown_kib <= allowed_kib,
        "the process grew by {grown_kib} KiB with a dead receiver and a {bound} B queue (allowed \
         {allowed_kib} KiB): the queue is not what bounds memory"
    );
    assert_eq!(final_stats.samples_sent, 0);
    assert_eq!(all_dropped(&final_stats), total, "{final_stats:?}");
}

/// TLS over gRPC (ALPN h2) and HTTP: a CA file makes the test server trusted and a client
/// certificate satisfies a server that requires one; without the CA file the server is refused
/// (nothing delivered, the failure counted); `insecure_skip_verify` (off by default) accepts it.
#[test]
fn otlp_tls_ca_file_client_certificate_and_verification() {
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    let pki = otlp::TestPki::create(dir.path());
    for protocol in [Protocol::Grpc, Protocol::Http] {
        eprintln!("--- {protocol:?}");
        let alpn: &[&[u8]] = match protocol {
            Protocol::Grpc => &[b"h2"],
            Protocol::Http => &[b"http/1.1"],
        };
        let start = |require_client_cert: bool| match protocol {
            Protocol::Grpc => Receiver::grpc_tls(pki.server_config(alpn, require_client_cert)),
            Protocol::Http => Receiver::http_tls(pki.server_config(alpn, require_client_cert)),
        };
        let url = |r: &Receiver| format!("https://127.0.0.1:{}", r.addr.port());

        // Trusted through ca_file, with a client certificate (mutual TLS).
        let receiver = start(true);
        let yaml = format!(
            "    tls: {{ ca_file: {}, cert_file: {}, key_file: {} }}\n",
            pki.ca.display(),
            pki.client_cert.display(),
            pki.client_key.display()
        );
        let exporter = Exporter::start(settings(
            &url(&receiver),
            protocol,
            ProtoVersion::V1_10,
            &yaml,
        ))
        .unwrap();
        let profile = synthetic(1, 3, 1, "tls");
        let total = profile.total_samples();
        exporter.export(profile);
        let (drained, stats) = exporter.shutdown(DELIVERY_TIMEOUT);
        assert_eq!(drained, Drained::Drained);
        assert_eq!(
            stats.samples_sent, total,
            "mutual TLS with ca_file failed: {stats:?}"
        );
        assert_eq!(decoded_total(&receiver, "1.10") as u64, total);
        drop(receiver);

        // Not trusted: the system store does not know the test CA.
        let receiver = start(false);
        let mark = log_mark();
        let strict = "    retry_on_failure: { initial_interval: 50ms, max_interval: 100ms, max_elapsed_time: 400ms }\n";
        match try_settings(&url(&receiver), protocol, ProtoVersion::V1_10, strict) {
            Err(err) => skip(&format!(
                "no system CA store here, so the untrusted-server check is left out: {err}"
            )),
            Ok(settings) => {
                let exporter = Exporter::start(settings).unwrap();
                exporter.export(synthetic(1, 3, 1, "untrusted"));
                let gave_up = wait_until(DELIVERY_TIMEOUT, || {
                    exporter
                        .stats()
                        .dropped_requests(DropReason::RetriesExhausted)
                        == 1
                });
                let (_, stats) = exporter.shutdown(Duration::from_secs(5));
                assert!(
                    gave_up.is_some(),
                    "an untrusted server was not refused: {stats:?}"
                );
                assert_eq!(stats.samples_sent, 0);
                assert!(receiver.received().is_empty());
                let log = log_since(mark);
                assert!(
                    log.to_lowercase().contains("certificate") || log.contains("UnknownIssuer"),
                    "the log does not say why:\n{log}"
                );
            }
        }

        // insecure_skip_verify accepts it.
        let exporter = Exporter::start(settings(
            &url(&receiver),
            protocol,
            ProtoVersion::V1_10,
            "    tls: { insecure_skip_verify: true }\n",
        ))
        .unwrap();
        exporter.export(synthetic(1, 3, 1, "skip"));
        let (drained, stats) = exporter.shutdown(DELIVERY_TIMEOUT);
        assert_eq!(drained, Drained::Drained);
        assert_eq!(stats.samples_sent, 3, "{stats:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// The whole chain: real sampler, real relay, real receiver

/// What one ground-truth recording exported.
struct Chain {
    received: Vec<otlp::Received>,
    decoded: Vec<Decoded>,
    truth: Value,
    recorded: Recorded,
    /// Wall-clock bounds of the `record` run, in ns since the epoch.
    started_ns: u64,
    ended_ns: u64,
}

fn now_ns() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after the epoch");
    u64::try_from(since.as_nanos()).expect("ns fit u64")
}

/// Records the ground-truth workload with `ember-relay record --otlp-*` into `receiver`.
fn record_ground_truth(receiver: &Receiver, protocol: &str, version: &str) -> Chain {
    const FREQUENCY: u32 = 499;
    let workload = spawn_workload(&workloads().groundtruth, 120);
    let pid = workload.pid();
    thread::sleep(Duration::from_millis(300));
    let url = receiver.url();
    let started_ns = now_ns();
    let recorded = record(
        &[
            "--duration",
            "8s",
            "--frequency",
            &FREQUENCY.to_string(),
            "--pid",
            &pid_arg(pid),
            "--otlp-endpoint",
            &url,
            "--otlp-protocol",
            protocol,
            "--otlp-proto-version",
            version,
            "--otlp-header",
            "X-Scope-OrgID=ember-e2e",
            "--log-format",
            "json",
        ],
        RECORD_TIMEOUT,
    );
    let ended_ns = now_ns();
    let (status, out) = workload.terminate_and_read_stdout(Duration::from_secs(10));
    assert!(status.success(), "groundtruth exited with {status}");
    let truth = last_json_line(&out);
    let received = receiver.received();
    assert!(
        !received.is_empty(),
        "the receiver got nothing; record stdout:\n{}\nstderr:\n{}",
        recorded.stdout,
        recorded.stderr
    );
    let decoded = received
        .iter()
        .map(|r| {
            otlp::decode(version, &r.body).unwrap_or_else(|e| {
                panic!("a v{version} request does not decode with v{version} definitions: {e}")
            })
        })
        .collect();
    Chain {
        received,
        decoded,
        truth,
        recorded,
        started_ns,
        ended_ns,
    }
}

/// What Pyroscope would keep of a whole-chain capture, under the rules of 1.18/1.19 and of
/// 1.20 on ([`pyroscope`]): every sample keeps a non-empty stack and all its frames, no series
/// is over the label limit, no pid is a label, and the series of the one process are its thread
/// names.
fn check_pyroscope_view(decoded: &[Decoded], label: &str) {
    for rules in [pyroscope::Rules::V1_18, pyroscope::Rules::V1_20] {
        let view = pyroscope::ingest(decoded, rules);
        pyroscope::report(&format!("{label} {rules:?}"), &view);
        assert!(view.total > 0, "{label}: nothing ingested");
        assert_eq!(view.empty_stack, 0, "{label} {rules:?}: empty stacks");
        assert_eq!(view.lost_frame, 0, "{label} {rules:?}: frames lost");
        assert_eq!(view.over_label_limit, 0, "{label} {rules:?}");
        assert!(
            view.series.keys().all(|l| !l.contains_key("process_pid")),
            "{label} {rules:?}: a pid became a series label"
        );
        let thread_names: BTreeSet<&String> = decoded
            .iter()
            .flat_map(|d| d.samples())
            .filter_map(|(_, s)| s.attributes.get("thread.name"))
            .collect();
        assert_eq!(
            view.series.len(),
            thread_names.len().max(1),
            "{label} {rules:?}: series {:?}",
            view.series.keys().collect::<Vec<_>>()
        );
    }
}

/// Checks the facts of a ground-truth recording from the decoded requests alone, and prints the
/// size and CPU figures.
fn check_ground_truth(chain: &Chain, label: &str) {
    const FREQUENCY: i64 = 499;
    let mut self_counts: BTreeMap<&str, i64> = FUNCS.iter().map(|f| (*f, 0)).collect();
    let mut full_chain = 0i64;
    let mut total = 0i64;
    let mut frame_types = BTreeSet::new();
    for (i, d) in chain.decoded.iter().enumerate() {
        assert!(
            d.empty_first,
            "request {i}: a dictionary table does not start empty"
        );
        assert_eq!(d.period, 1_000_000_000 / FREQUENCY, "period");
        assert_eq!(d.sample_type, ("samples".into(), "count".into()));
        assert_eq!(d.period_type, ("cpu".into(), "nanoseconds".into()));
        assert!(d.time_unix_nano > 0 && d.duration_nano > 0, "no time range");
        assert!(
            d.build_ids
                .keys()
                .any(|path| path.ends_with("/groundtruth")),
            "no build id for the groundtruth mapping: {:?}",
            d.build_ids
        );
        for resource in &d.resources {
            let a = &resource.attributes;
            assert_eq!(
                a.get("service.name").map(String::as_str),
                Some("groundtruth"),
                "{a:?}"
            );
            assert_eq!(
                a.get("process.executable.name").map(String::as_str),
                Some("groundtruth")
            );
            assert_eq!(a.get("process.pid"), None, "a pid on the resource: {a:?}");
            assert!(a
                .get("process.executable.path")
                .is_some_and(|p| p.ends_with("/groundtruth")));
            assert!(a.get("host.name").is_some_and(|h| !h.is_empty()), "{a:?}");
            for s in &resource.samples {
                assert_eq!(
                    s.attributes.get("thread.name").map(String::as_str),
                    Some("groundtruth"),
                    "sample attributes: {:?}",
                    s.attributes
                );
                assert!(
                    !s.attributes.contains_key("thread.id"),
                    "thread.id is sent without being asked for"
                );
                total += s.count;
                frame_types.extend(s.frame_types.iter().cloned());
                let Some(leaf) = s.stack.first() else {
                    continue;
                };
                if let Some(count) = self_counts.get_mut(leaf.as_str()) {
                    *count += s.count;
                    let root_first: Vec<String> = s.stack.iter().rev().cloned().collect();
                    if has_full_chain(&root_first, leaf) {
                        full_chain += s.count;
                    }
                }
            }
        }
    }
    for r in &chain.received {
        assert_eq!(
            r.headers.get("x-scope-orgid").map(String::as_str),
            Some("ember-e2e"),
            "the tenant header did not arrive"
        );
    }
    check_pyroscope_view(&chain.decoded, label);
    // Nothing lost between the local files and the export.
    let folded_total = total_count(
        chain
            .recorded
            .folded()
            .iter()
            .filter(|s| s.process == "groundtruth"),
    );
    assert_eq!(
        total as u64, folded_total,
        "{label}: the receiver got {total} samples, stacks.folded holds {folded_total}"
    );
    assert!(total >= 2000, "{label}: only {total} samples");
    // And per stack: each exported stack carries its own count, the one stacks.folded of the
    // same run has for it (a count moved to another stack keeps the total, not this). Folded
    // names kernel frames `name_[k]` (the export marks them by frame type) and unnamed frames
    // `[unknown] module`, as the export's line does: the names must agree.
    let mut exported: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for d in &chain.decoded {
        for (_, s) in d.samples() {
            let root_first = s
                .stack
                .iter()
                .zip(&s.frame_types)
                .rev()
                .map(|(name, kind)| match kind.as_str() {
                    "kernel" => format!("{name}{KERNEL_SUFFIX}"),
                    _ => name.clone(),
                })
                .collect();
            *exported.entry(root_first).or_default() += s.count;
        }
    }
    let mut folded: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for stack in chain.recorded.folded() {
        if stack.process != "groundtruth" {
            continue;
        }
        let key = stack.frames.clone();
        *folded.entry(key).or_default() += i64::try_from(stack.count).unwrap();
    }
    exported.retain(|_, count| *count != 0);
    let differing: Vec<String> = exported
        .keys()
        .chain(folded.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|key| exported.get(*key) != folded.get(*key))
        .map(|key| {
            format!(
                "{}: exported {}, stacks.folded {}",
                key.join(";"),
                exported.get(key).copied().unwrap_or(0),
                folded.get(key).copied().unwrap_or(0)
            )
        })
        .collect();
    eprintln!(
        "{label}: {} distinct stacks exported, {} in stacks.folded, {} with different counts",
        exported.len(),
        folded.len(),
        differing.len()
    );
    assert!(
        differing.is_empty(),
        "{label}: per-stack counts of the export differ from stacks.folded of the same run:\n  {}",
        differing[..differing.len().min(10)].join("\n  ")
    );
    assert!(
        chain.recorded.stdout.contains("queue drained"),
        "record did not report a drained queue:\n{}",
        chain.recorded.stdout
    );
    assert!(
        frame_types.contains("native"),
        "frame types: {frame_types:?}"
    );
    let covered: i64 = self_counts.values().sum();
    eprintln!("{label}: {total} samples, {covered} with a ground-truth leaf");
    assert!(covered as f64 >= 0.9 * total as f64);
    let mut failures = Vec::new();
    for func in FUNCS {
        let measured = self_counts[func] as f64 / covered as f64;
        let expected = chain.truth[func].as_f64().expect("truth");
        let error = (measured - expected) * 100.0;
        eprintln!(
            "{label}: {func:<12} {:>6.2}% (truth {:>6.2}%, {error:+.2} pts)",
            measured * 100.0,
            expected * 100.0
        );
        if error.abs() > 3.0 {
            failures.push(format!("{func}: {error:+.2} points"));
        }
    }
    assert!(failures.is_empty(), "{label}: shares off: {failures:?}");
    let chain_share = full_chain as f64 / covered as f64;
    assert!(
        chain_share >= 0.95,
        "{label}: only {:.1}% of samples carry exactly \
         __libc_start_call_main;main;outer_work;middle_work;inner_work (down to their leaf)",
        chain_share * 100.0
    );

    // Figures: bytes per sample and the exporter's CPU per 10k samples.
    let raw: usize = chain.received.iter().map(|r| r.body.len()).sum();
    let gzip: usize = chain
        .received
        .iter()
        .map(|r| {
            if r.wire_bytes > 0 {
                r.wire_bytes
            } else {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(&r.body).unwrap();
                e.finish().unwrap().len()
            }
        })
        .sum();
    let final_stats = chain
        .recorded
        .stderr
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| message(v) == "otlp export stats (final)")
        .unwrap_or_else(|| panic!("no final export stats in the relay log"));
    let per_10k = |key: &str| {
        field_u64(&final_stats, key).unwrap_or(0) as f64
            / 1e6
            / (field_u64(&final_stats, "samples_encoded")
                .unwrap_or(1)
                .max(1) as f64
                / 10_000.0)
    };
    eprintln!(
        "FIGURE {label}: {} requests, {total} samples; {:.1} B/sample raw, {:.1} B/sample gzip; \
         exporter CPU {:.2} ms per 10k samples ({:.2} ms of it encoding); final stats: {final_stats}",
        chain.received.len(),
        raw as f64 / total as f64,
        gzip as f64 / total as f64,
        per_10k("thread_cpu_ns"),
        per_10k("encode_cpu_ns"),
    );
}

/// `ember-relay run` with a config file: the receiver is down when the relay starts and comes
/// up later; the intervals exported meanwhile arrive, the counters are logged, and the debug
/// exporter prints what is sent.
#[test]
fn otlp_run_mode_receiver_down_at_start() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ember.sock");
    let addr = otlp::free_addr();
    let config = dir.path().join("relay.yaml");
    std::fs::write(
        &config,
        format!(
            "exporters:\n  otlp:\n    endpoint: http://{addr}\n    protocol: grpc\n    \
             proto_version: \"1.10\"\n    stats_interval: 1s\n    retry_on_failure: \
             {{ initial_interval: 200ms, max_interval: 1s }}\n  debug:\n    verbosity: basic\n"
        ),
    )
    .unwrap();
    let workload = spawn_workload(&workloads().spinner, 120);
    let pid = pid_arg(workload.pid());
    let relay = spawn_relay_run("relay", &socket, &["--config", config.to_str().unwrap()]);
    let (_sampler, _sampler_log) = spawn_sampler(
        "sampler",
        &socket,
        &["--pid", pid.as_str(), "--frequency", "99"],
    );
    // A few intervals are exported (and retried) while nothing listens.
    let (_, failing) = relay.log.expect(
        0,
        FIRST_BATCH_TIMEOUT,
        "export stats with retries while the receiver is down",
        |v| message(v) == "otlp export stats" && field_u64(v, "retries").is_some_and(|r| r > 0),
    );
    eprintln!("while down: {failing}");
    let receiver = Receiver::grpc(Some(addr));
    assert!(
        receiver.wait_for(DELIVERY_TIMEOUT, |r| r.len() >= 3),
        "nothing (or too little) arrived once the receiver came up:\n{}",
        relay.log.text()
    );
    let batches: u64 = relay
        .log
        .matching(is_batch)
        .iter()
        .filter_map(|(_, v)| field_u64(v, "samples"))
        .sum();
    let received: i64 = receiver
        .received()
        .iter()
        .map(|r| otlp::decode_v1_10(&r.body).unwrap().total())
        .sum();
    eprintln!("relay logged {batches} samples in batches; the receiver has {received}");
    assert!(received > 0);
    let spinner = receiver
        .received()
        .iter()
        .map(|r| otlp::decode_v1_10(&r.body).unwrap())
        .flat_map(|d| d.resources)
        .any(|r| r.attributes.get("service.name").map(String::as_str) == Some("spinner"));
    assert!(spinner, "no resource with service.name=spinner");
    // The stats line counts what arrived, and the debug exporter printed requests.
    let (_, stats) = relay
        .log
        .expect(0, LOG_TIMEOUT, "export stats with samples sent", |v| {
            message(v) == "otlp export stats" && field_u64(v, "samples_sent").is_some_and(|n| n > 0)
        });
    eprintln!("after: {stats}");
    assert!(
        relay
            .stdout
            .lines()
            .iter()
            .any(|l| l.raw.starts_with("OTLP profiles request:")),
        "the debug exporter printed nothing"
    );
    drop(workload);
}

/// `ember-relay record` against a receiver that never answers: it still writes its local files,
/// waits only `--export-timeout` for the queue, and says that it timed out and what it dropped.
#[test]
fn otlp_record_with_a_dead_receiver_times_out_and_says_so() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let workload = spawn_workload(&workloads().spinner, 120);
    let addr = otlp::free_addr();
    let url = format!("http://{addr}");
    let recorded = record(
        &[
            "--duration",
            "3s",
            "--frequency",
            "199",
            "--pid",
            &pid_arg(workload.pid()),
            "--otlp-endpoint",
            &url,
            "--otlp-protocol",
            "grpc",
            "--export-timeout",
            "2s",
        ],
        RECORD_TIMEOUT,
    );
    drop(workload);
    let out = &recorded.stdout;
    assert!(
        out.contains("OTLP export to") && out.contains("timed out after 2s"),
        "record did not say the export timed out:\n{out}"
    );
    assert!(
        out.contains("undelivered") && out.contains("OTLP samples dropped:"),
        "record did not say what was dropped:\n{out}"
    );
    assert!(
        total_count(&recorded.folded()) > 0,
        "the local files lost their samples"
    );
}

/// Sorted (stack, count) pairs of one request in a Python decoder's JSON.
fn python_samples(request: &Value) -> Vec<(Vec<String>, i64)> {
    let mut out: Vec<(Vec<String>, i64)> = python_profile_samples(request)
        .map(|s| {
            let stack = s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| f["function"].as_str().unwrap_or_default().to_owned())
                .collect();
            (stack, s["count"].as_i64().unwrap_or(-1))
        })
        .collect();
    out.sort();
    out
}

fn python_profiles(request: &Value) -> impl Iterator<Item = &Value> {
    request["profiles"].as_array().expect("profiles").iter()
}

fn python_profile_samples(request: &Value) -> impl Iterator<Item = &Value> {
    python_profiles(request).flat_map(|p| p["samples"].as_array().expect("samples").iter())
}

fn rust_samples(d: &Decoded) -> Vec<(Vec<String>, i64)> {
    let mut out: Vec<(Vec<String>, i64)> = d
        .samples()
        .map(|(_, s)| (s.stack.clone(), s.count))
        .collect();
    out.sort();
    out
}

fn keys(object: &Value) -> BTreeSet<String> {
    object
        .as_object()
        .expect("an attribute object")
        .keys()
        .cloned()
        .collect()
}

fn key_set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// The fields ember may set in a request, as `Message.field` of the official definitions (the
/// same names in both generations). Anything else present is a field ember put on a number the
/// receiver's generation gives to something else.
const FIELDS_EMBER_SETS: &[&str] = &[
    "AnyValue.int_value",
    "AnyValue.string_value",
    "ExportProfilesServiceRequest.dictionary",
    "ExportProfilesServiceRequest.resource_profiles",
    "Function.filename_strindex",
    "Function.name_strindex",
    "InstrumentationScope.name",
    "InstrumentationScope.version",
    "KeyValue.key",
    "KeyValue.value",
    "KeyValueAndUnit.key_strindex",
    "KeyValueAndUnit.value",
    "Line.function_index",
    "Line.line",
    "Location.address",
    "Location.attribute_indices",
    "Location.lines",
    "Location.mapping_index",
    "Mapping.attribute_indices",
    "Mapping.file_offset",
    "Mapping.filename_strindex",
    "Mapping.memory_limit",
    "Mapping.memory_start",
    "Profile.duration_nano",
    "Profile.period",
    "Profile.period_type",
    "Profile.sample_type",
    "Profile.samples",
    "Profile.time_unix_nano",
    "ProfilesDictionary.attribute_table",
    "ProfilesDictionary.function_table",
    "ProfilesDictionary.link_table",
    "ProfilesDictionary.location_table",
    "ProfilesDictionary.mapping_table",
    "ProfilesDictionary.stack_table",
    "ProfilesDictionary.string_table",
    "Resource.attributes",
    "ResourceProfiles.resource",
    "ResourceProfiles.scope_profiles",
    "Sample.attribute_indices",
    "Sample.stack_index",
    "Sample.values",
    "ScopeProfiles.profiles",
    "ScopeProfiles.scope",
    "Stack.location_indices",
    "ValueType.type_strindex",
    "ValueType.unit_strindex",
];

/// Fields every ground-truth request must carry (a zero or empty value is not sent at all, so
/// a zero period or a lost attribute list shows here).
const FIELDS_REQUIRED: &[&str] = &[
    "Line.line",
    "Location.attribute_indices",
    "Mapping.attribute_indices",
    "Profile.duration_nano",
    "Profile.period",
    "Profile.period_type",
    "Profile.sample_type",
    "Profile.time_unix_nano",
    "Sample.attribute_indices",
    "Sample.values",
];

/// The GNU build id of `binary`, as `readelf -n` (binutils, not ember) prints it; `None` when
/// the file has none.
fn readelf_build_id(binary: &std::path::Path) -> Option<String> {
    let output = std::process::Command::new("readelf")
        .arg("-n")
        .arg(binary)
        .output()
        .expect("running readelf (binutils)");
    assert!(output.status.success(), "readelf -n {}", binary.display());
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID:"))
        .map(|id| id.trim().to_owned())
}

/// The source lines (first, last) of each ground-truth function's definition, read from
/// tests/workloads/groundtruth.c: from the line naming it with its opening brace to its
/// closing `}`.
fn groundtruth_source_lines() -> BTreeMap<&'static str, (i64, i64)> {
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/groundtruth.c"),
    )
    .expect("reading groundtruth.c");
    let lines: Vec<&str> = source.lines().collect();
    ["main", "outer_work", "middle_work", "inner_work"]
        .into_iter()
        .map(|func| {
            let first = lines
                .iter()
                .position(|l| l.contains(&format!(" {func}(")) && l.trim_end().ends_with('{'))
                .unwrap_or_else(|| panic!("no definition of {func} in groundtruth.c"));
            let last = first
                + lines[first..]
                    .iter()
                    .position(|l| *l == "}")
                    .expect("a closing brace");
            (func, (first as i64 + 1, last as i64 + 1))
        })
        .collect()
}

/// User plus kernel stacks `record` reported lost (its lines "lost: the user stack of N
/// samples (...)" and "lost: the kernel stack of N samples (...)").
fn stacks_lost(stdout: &str) -> u64 {
    stdout
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.strip_prefix("lost: the ")?.split_once(" stack of ")?;
            rest.split(' ').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The official Python package of `version` decodes every request received, exactly as
/// received, without a field it does not know, to the facts ember means to send and to the same
/// samples as our decoding; the other generation's package refuses or misreads each request.
fn check_with_python(chain: &Chain, version: &str, other: &str) {
    const PERIOD: i64 = 1_000_000_000 / 499;
    let (Some(python), Some(other_python)) =
        (otlp::python_decoder(version), otlp::python_decoder(other))
    else {
        skip(
            "the Python OTLP decoders (.tools/py-otlp-*) are missing, so the official-decoder \
             check is left out; run scripts/setup.sh to install them",
        );
        return;
    };
    let bodies: Vec<&[u8]> = chain.received.iter().map(|r| r.body.as_slice()).collect();
    let facts = otlp::python_decode(&python, &bodies, false);
    eprintln!(
        "python opentelemetry-proto {} (Sample fields {}) decoded all {} requests",
        facts["package_version"],
        facts["sample_fields"],
        bodies.len()
    );
    let build_id = readelf_build_id(&workloads().groundtruth).expect("groundtruth has a build id");
    // Every mapping's file that exists here, with the build id binutils reads from it.
    let mut readelf_ids: BTreeMap<String, Option<String>> = BTreeMap::new();
    let source_lines = groundtruth_source_lines();
    let allowed = key_set(FIELDS_EMBER_SETS);
    let mut python_total = 0i64;
    let mut lines_seen: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut frame_types = BTreeSet::new();
    for (i, request) in facts["requests"].as_array().unwrap().iter().enumerate() {
        let what = format!("python v{version}, request {i}");
        assert_eq!(request["unknown_fields"], serde_json::json!([]), "{what}");
        let set: BTreeSet<String> = request["fields_set"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        let unexpected: Vec<&String> = set.difference(&allowed).collect();
        assert!(
            unexpected.is_empty(),
            "{what}: fields ember does not set are present: {unexpected:?}"
        );
        let missing: Vec<&&str> = FIELDS_REQUIRED
            .iter()
            .filter(|f| !set.contains(**f))
            .collect();
        assert!(missing.is_empty(), "{what}: fields missing: {missing:?}");
        for (name, ok) in request["empty_first"].as_object().unwrap() {
            assert_eq!(
                ok.as_bool(),
                Some(true),
                "{what}: table {name} does not start empty"
            );
        }
        // The groundtruth mapping carries the build id binutils reads from the binary.
        let mapping_ids: Vec<(&str, &Value)> = request["mappings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                m["filename"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("/groundtruth"))
            })
            .map(|m| {
                (
                    m["filename"].as_str().unwrap(),
                    &m["attributes"]["process.executable.build_id.gnu"],
                )
            })
            .collect();
        assert!(!mapping_ids.is_empty(), "{what}: no groundtruth mapping");
        for (file, id) in mapping_ids {
            assert_eq!(
                id.as_str(),
                Some(build_id.as_str()),
                "{what}: build id of {file}"
            );
        }
        // And every other mapping ember gave a build id: the one of its file.
        for m in request["mappings"].as_array().unwrap() {
            let (Some(file), Some(id)) = (
                m["filename"].as_str(),
                m["attributes"]["process.executable.build_id.gnu"].as_str(),
            ) else {
                continue;
            };
            let actual = readelf_ids.entry(file.to_owned()).or_insert_with(|| {
                let path = std::path::Path::new(file);
                path.is_file().then(|| readelf_build_id(path)).flatten()
            });
            assert!(
                actual.is_none() || actual.as_deref() == Some(id),
                "{what}: mapping {file} carries build id {id}, readelf says {actual:?}"
            );
        }
        let profiles: Vec<&Value> = python_profiles(request).collect();
        assert!(!profiles.is_empty(), "{what}: no profile");
        for p in profiles {
            assert_eq!(
                p["sample_type"],
                serde_json::json!(["samples", "count"]),
                "{what}"
            );
            assert_eq!(
                p["period_type"],
                serde_json::json!(["cpu", "nanoseconds"]),
                "{what}"
            );
            assert_eq!(p["period"].as_i64(), Some(PERIOD), "{what}: period");
            let start = p["time_unix_nano"].as_u64().unwrap();
            let duration = p["duration_nano"].as_u64().unwrap();
            assert!(
                start >= chain.started_ns && duration > 0 && start + duration <= chain.ended_ns,
                "{what}: time range [{start}, +{duration}] not within the recording \
                 [{}, {}]",
                chain.started_ns,
                chain.ended_ns
            );
            // Attributes and where they sit: the process on the resource, the thread on the
            // sample, nothing on the scope or the profile.
            // The labels stage adds host.arch, os.type, process.owner, and host.id
            // where the machine has a machine id.
            let resource = &p["resource_attributes"];
            let mut resource_keys = keys(resource);
            resource_keys.remove("host.id");
            assert_eq!(
                resource_keys,
                key_set(&[
                    "host.arch",
                    "host.name",
                    "os.type",
                    "process.executable.name",
                    "process.executable.path",
                    "process.owner",
                    "service.name",
                ]),
                "{what}: resource attributes"
            );
            assert_eq!(resource["service.name"], "groundtruth", "{what}");
            assert_eq!(resource["process.executable.name"], "groundtruth", "{what}");
            assert!(
                resource["process.executable.path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/groundtruth")),
                "{what}: {resource}"
            );
            assert!(resource["host.name"]
                .as_str()
                .is_some_and(|h| !h.is_empty()));
            assert_eq!(keys(&p["scope_attributes"]), BTreeSet::new(), "{what}");
            assert_eq!(keys(&p["profile_attributes"]), BTreeSet::new(), "{what}");
            for s in p["samples"].as_array().unwrap() {
                assert_eq!(
                    keys(&s["attributes"]),
                    key_set(&["thread.name"]),
                    "{what}: sample attributes"
                );
                assert_eq!(s["attributes"]["thread.name"], "groundtruth", "{what}");
                let values = s["values"].as_array().unwrap();
                assert!(
                    values.len() == 1 && values[0].as_i64().is_some_and(|v| v > 0),
                    "{what}: one positive value per sample (one sample type), got {values:?}"
                );
                python_total += values[0].as_i64().unwrap();
                for f in s["frames"].as_array().unwrap() {
                    frame_types.insert(f["frame_type"].to_string());
                    let name = f["function"].as_str().unwrap();
                    if source_lines.contains_key(name) {
                        lines_seen
                            .entry(name.to_owned())
                            .or_default()
                            .insert(f["line"].as_i64().unwrap());
                        assert!(
                            f["filename"]
                                .as_str()
                                .is_some_and(|n| n.ends_with("groundtruth.c")),
                            "{what}: {name} from file {}",
                            f["filename"]
                        );
                    }
                }
            }
        }
        // The per-request samples and their sum agree with our decoding of the same bytes.
        let sum: i64 = python_profile_samples(request)
            .map(|s| s["count"].as_i64().unwrap())
            .sum();
        assert_eq!(sum, chain.decoded[i].total(), "{what}: sum of values");
        assert_eq!(
            python_samples(request),
            rust_samples(&chain.decoded[i]),
            "{what}: python and Rust disagree"
        );
    }
    let rust_total: i64 = chain.decoded.iter().map(Decoded::total).sum();
    assert_eq!(python_total, rust_total, "python v{version}: total samples");
    eprintln!(
        "python v{version}: frame types {frame_types:?}; lines {lines_seen:?}; build ids checked \
         with readelf: {readelf_ids:?}"
    );
    // A stack the kernel could not store (stack-map collision) is a counted marker frame;
    // markers are allowed only when `record` reported such losses.
    let stacks_lost = stacks_lost(&chain.recorded.stdout);
    assert!(
        frame_types.iter().all(|t| t == "\"native\""
            || t == "\"kernel\""
            || (t == "\"abort-marker\"" && stacks_lost > 0)),
        "python v{version}: frame types other than native/kernel (or markers without a reported \
         loss: {stacks_lost} stacks lost): {frame_types:?}"
    );
    assert!(frame_types.contains("\"native\""));
    // Line numbers: every ground-truth function is seen with lines, each inside its definition.
    for (func, (first, last)) in &source_lines {
        let seen = lines_seen.get(*func).cloned().unwrap_or_default();
        assert!(
            !seen.is_empty() && seen.iter().all(|l| (first..=last).contains(&l)),
            "python v{version}: {func} has lines {seen:?}, its definition spans {first}..={last}"
        );
    }

    // The same bytes through the other generation's definitions: refused (unknown fields) or
    // wrong, request by request.
    let wrong = otlp::python_decode(&other_python, &bodies, true);
    for (i, request) in wrong["requests"].as_array().unwrap().iter().enumerate() {
        let refused = !request["unknown_fields"].as_array().unwrap().is_empty();
        assert!(
            refused || python_samples(request) != rust_samples(&chain.decoded[i]),
            "a v{version} request read with v{other} definitions looked right"
        );
        if i == 0 {
            eprintln!(
                "python opentelemetry-proto {} (the other generation) on request 0: {} \
                 unknown fields, the first {}",
                wrong["package_version"],
                request["unknown_fields"].as_array().map_or(0, Vec::len),
                request["unknown_fields"][0]
            );
        }
    }
}

/// Every request, read by our prost definitions of the other generation: refused or wrong.
fn check_other_generation_in_rust(chain: &Chain, other: &str) {
    for (i, r) in chain.received.iter().enumerate() {
        match otlp::decode(other, &r.body) {
            Err(err) => eprintln!("request {i} read as v{other} (prost): refused: {err}"),
            Ok(misread) => assert_ne!(
                rust_samples(&misread),
                rust_samples(&chain.decoded[i]),
                "request {i} read as v{other} (prost) looked right"
            ),
        }
    }
}

/// Ground truth over gRPC in the v1.10 generation, received as the exact bytes sent; checked by
/// our decoding, the official Python package on every request, and shown wrong when read as
/// v1.9.
#[test]
fn otlp_ground_truth_grpc_v1_10() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let receiver = Receiver::grpc(None);
    let chain = record_ground_truth(&receiver, "grpc", "1.10");
    check_ground_truth(&chain, "grpc v1.10");
    check_other_generation_in_rust(&chain, "1.9");
    check_with_python(&chain, "1.10", "1.9");
}

/// Ground truth over gRPC in the v1.9 generation: what the shipped Compose and Kubernetes
/// deployments send to Pyroscope 1.18. The receiver keeps the bytes; they decode with the v1.9
/// definitions and, every request, the official Python package 1.40.0.
#[test]
fn otlp_ground_truth_grpc_v1_9() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let receiver = Receiver::grpc(None);
    let chain = record_ground_truth(&receiver, "grpc", "1.9");
    assert!(
        chain.received.iter().all(|r| r.gzip),
        "gRPC messages not gzipped"
    );
    check_ground_truth(&chain, "grpc v1.9");
    check_other_generation_in_rust(&chain, "1.10");
    check_with_python(&chain, "1.9", "1.10");
}

/// Ground truth over HTTP/protobuf in the v1.9 generation (Pyroscope 1.18's), checked by the v1.9
/// definitions and, every request, the official Python package 1.40.0.
#[test]
fn otlp_ground_truth_http_v1_9() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let receiver = Receiver::http(None);
    let chain = record_ground_truth(&receiver, "http", "1.9");
    assert!(
        chain.received.iter().all(|r| r.gzip),
        "HTTP bodies not gzipped"
    );
    check_ground_truth(&chain, "http v1.9");
    check_other_generation_in_rust(&chain, "1.10");
    check_with_python(&chain, "1.9", "1.10");
}

/// Ground truth over HTTP/protobuf in the v1.10 generation (Pyroscope >= 1.20, Collector >=
/// 0.148), the whole chain from the real sampler to a real HTTP receiver: checked by the v1.10
/// definitions and, every request, the official Python package 1.45.2.
#[test]
fn otlp_ground_truth_http_v1_10() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    let receiver = Receiver::http(None);
    let chain = record_ground_truth(&receiver, "http", "1.10");
    assert!(
        chain.received.iter().all(|r| r.gzip),
        "HTTP bodies not gzipped"
    );
    check_ground_truth(&chain, "http v1.10");
    check_other_generation_in_rust(&chain, "1.9");
    check_with_python(&chain, "1.10", "1.9");
}

/// The relay config shipped in deploy/kubernetes/20-configmap.yaml passes
/// `ember-relay validate`, and a config with a typo is refused with its line.
#[test]
fn otlp_shipped_config_validates() {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/20-configmap.yaml");
    let text = std::fs::read_to_string(&manifest).expect("reading the ConfigMap");
    // The block scalar under `relay.yaml: |`, de-indented.
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("relay.yaml: |"));
    let header = lines.next().expect("a relay.yaml key in the ConfigMap");
    let key_indent = header.len() - header.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let yaml: String = body
        .iter()
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("relay.yaml");
    std::fs::write(&good, &yaml).unwrap();
    let output = std::process::Command::new(relay_bin())
        .args(["validate", "--config"])
        .arg(&good)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the shipped relay config does not validate:\n{yaml}\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("otlp: grpc"), "{stdout}");
    assert!(stdout.contains("proto v1.9"), "{stdout}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, yaml.replace("protocol:", "protocl:")).unwrap();
    let output = std::process::Command::new(relay_bin())
        .args(["validate", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a typo was accepted");
    assert!(
        stderr.contains("protocl") && stderr.contains("line"),
        "{stderr}"
    );
}
