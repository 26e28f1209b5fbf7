//! The relay's self-metrics and health, end to end: a real `ember-relay run` serving
//! `--metrics-address 127.0.0.1:0`, a real sampler profiling a real workload, and the scrape
//! parsed by the official Prometheus Python client's parser (`prometheus_client.parser`, PyPI,
//! in `.tools/venv` from scripts/setup.sh). The counters are checked against what the relay
//! logged for each batch, and `/readyz` against the sampler's comings and goings.
//!
//! ```text
//! cargo build -p ember-relay -p ember-sampler
//! sudo -E cargo test -p ember-tests --test metrics -- --test-threads=1 --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use ember_tests::{
    scenario::{ebpf_gate, Sampler, Scenario},
    *,
};
use nix::sys::signal::Signal;
use serde_json::Value;

const FIRST_BATCH_TIMEOUT: Duration = Duration::from_secs(90);
const LOG_TIMEOUT: Duration = Duration::from_secs(30);

/// Each loss field of the relay's `batch received` log line and the `ember_sampler_` counter
/// serving the same field of the sampler's `Losses`.
const LOSSES: [(&str, &str); 43] = [
    ("sampler_samples", "ember_sampler_samples_total"),
    ("idle_samples", "ember_sampler_idle_samples_total"),
    ("filtered_samples", "ember_sampler_filtered_samples_total"),
    ("user_stack_lost", "ember_sampler_user_stacks_lost_total"),
    (
        "kernel_stack_lost",
        "ember_sampler_kernel_stacks_lost_total",
    ),
    ("counts_full", "ember_sampler_counts_map_full_samples_total"),
    (
        "backlog_dropped_batches",
        "ember_sampler_backlog_dropped_batches_total",
    ),
    (
        "backlog_dropped_samples",
        "ember_sampler_backlog_dropped_samples_total",
    ),
    ("proc_errors", "ember_sampler_proc_errors_total"),
    ("facts_dropped", "ember_sampler_facts_dropped_total"),
    ("facts_truncated", "ember_sampler_facts_truncated_total"),
    ("files_unopened", "ember_sampler_files_unopened_total"),
    (
        "unwind_tables_loaded",
        "ember_sampler_unwind_tables_loaded_total",
    ),
    (
        "unwind_tables_refused",
        "ember_sampler_unwind_tables_refused_total",
    ),
    ("unwind_stopped", "ember_sampler_unwind_stopped_total"),
    ("unwind_cut", "ember_sampler_unwind_cut_total"),
    ("unwind_map_full", "ember_sampler_unwind_map_full_total"),
    ("unwind_outermost", "ember_sampler_unwind_outermost_total"),
    (
        "unwind_stop_cfa_register",
        "ember_sampler_unwind_stop_cfa_register_total",
    ),
    (
        "unwind_stop_cfa_expression",
        "ember_sampler_unwind_stop_cfa_expression_total",
    ),
    (
        "unwind_stop_offset_range",
        "ember_sampler_unwind_stop_offset_range_total",
    ),
    (
        "unwind_stop_return_address_rule",
        "ember_sampler_unwind_stop_return_address_rule_total",
    ),
    (
        "unwind_stop_rbp_rule",
        "ember_sampler_unwind_stop_rbp_rule_total",
    ),
    (
        "unwind_stop_malformed",
        "ember_sampler_unwind_stop_malformed_total",
    ),
    (
        "unwind_stop_budget",
        "ember_sampler_unwind_stop_budget_total",
    ),
    (
        "unwind_read_failed",
        "ember_sampler_unwind_read_failed_total",
    ),
    ("unwind_zero_end", "ember_sampler_unwind_zero_end_total"),
    (
        "unwind_fp_no_mapping",
        "ember_sampler_unwind_fp_no_mapping_total",
    ),
    (
        "unwind_fp_no_table",
        "ember_sampler_unwind_fp_no_table_total",
    ),
    ("unwind_fp_gap", "ember_sampler_unwind_fp_gap_total"),
    ("unwind_no_process", "ember_sampler_unwind_no_process_total"),
    (
        "unwind_tables_evicted",
        "ember_sampler_unwind_tables_evicted_total",
    ),
    ("interp_walked", "ember_sampler_interp_walked_total"),
    ("interp_no_thread", "ember_sampler_interp_no_thread_total"),
    (
        "interp_read_failed",
        "ember_sampler_interp_read_failed_total",
    ),
    ("interp_cut", "ember_sampler_interp_cut_total"),
    (
        "interp_stacks_full",
        "ember_sampler_interp_stacks_full_total",
    ),
    ("interp_codes_full", "ember_sampler_interp_codes_full_total"),
    ("interp_bad_code", "ember_sampler_interp_bad_code_total"),
    ("interp_refused", "ember_sampler_interp_refused_total"),
    ("off_cpu_kept", "ember_sampler_off_cpu_kept_total"),
    (
        "off_cpu_sampled_out",
        "ember_sampler_off_cpu_sampled_out_total",
    ),
    (
        "off_cpu_counts_full",
        "ember_sampler_off_cpu_counts_full_total",
    ),
];

/// The Python of scripts/setup.sh's tools venv, which holds `prometheus_client`.
fn python_with_prometheus_client() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/python");
    let importable = Command::new(&python)
        .args(["-c", "import prometheus_client.parser"])
        .status()
        .is_ok_and(|s| s.success());
    importable.then_some(python)
}

/// Parses an exposition with `prometheus_client.parser`: sample name with its labels
/// (`name{k="v",...}`, labels sorted) -> value, and family name -> (type, help).
struct Scrape {
    samples: BTreeMap<String, f64>,
    families: BTreeMap<String, (String, String)>,
}

fn parse_with_prometheus_client(python: &Path, text: &str) -> Scrape {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/prom_parse.py");
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the Prometheus parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "prometheus_client.parser refused the scrape:\n{}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: Value = serde_json::from_slice(&output.stdout).expect("the parser's JSON");
    let mut scrape = Scrape {
        samples: BTreeMap::new(),
        families: BTreeMap::new(),
    };
    for family in parsed["families"].as_array().expect("families") {
        let name = family["name"].as_str().unwrap().to_owned();
        let kind = family["type"].as_str().unwrap().to_owned();
        let help = family["help"].as_str().unwrap().to_owned();
        for sample in family["samples"].as_array().unwrap() {
            let labels: BTreeMap<&str, &str> = sample["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
                .collect();
            let mut key = sample["name"].as_str().unwrap().to_owned();
            if !labels.is_empty() {
                let list: Vec<String> =
                    labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                key = format!("{key}{{{}}}", list.join(","));
            }
            let value = sample["value"].as_f64().unwrap_or(f64::NAN);
            scrape.samples.insert(key, value);
        }
        scrape.families.insert(name, (kind, help));
    }
    scrape
}

impl Scrape {
    fn value(&self, sample: &str) -> f64 {
        *self
            .samples
            .get(sample)
            .unwrap_or_else(|| panic!("no {sample} in the scrape: {:#?}", self.samples))
    }
}

/// `run` with `--metrics-address 127.0.0.1:0` and a sampler: the counters equal what the relay
/// logged, /readyz is 503 before the first batch, 200 while batches arrive and 503 once the
/// sampler is gone, /healthz 200 throughout.
#[test]
fn run_serves_metrics_that_match_its_log_and_readiness_that_follows_the_sampler() {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = python_with_prometheus_client() else {
        skip("no .tools/venv with prometheus_client (scripts/setup.sh installs it)");
        return;
    };
    let workload = spawn_workload(&workloads().spinner, 120);
    let scenario = Scenario::new("relay")
        .relay_args(["--metrics-address", "127.0.0.1:0"])
        .run();
    let (relay, socket) = (&scenario.relay, &scenario.socket);
    let address = scenario.metrics_address();

    // Before any sampler: alive, not ready, and saying why.
    assert_eq!(http_get(&address, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(
        http_get(&address, "/readyz"),
        (503, "no sampler connected\n".to_owned())
    );

    // A sampler arrives: ready once its first batch is in.
    let pid = workload.pid().to_string();
    let Sampler {
        child: mut sampler, ..
    } = scenario.start_sampler("sampler", &["--pid", &pid, "--frequency", "99"]);
    relay
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "a batch", is_batch);
    let mut readiness = Vec::new();
    let ready = wait_until(LOG_TIMEOUT, || {
        let answer = http_get(&address, "/readyz");
        let done = answer.0 == 200;
        readiness.push(answer);
        done
    });
    assert!(
        ready.is_some(),
        "/readyz never became 200 after the first batch: {readiness:?}"
    );
    let third = wait_until(LOG_TIMEOUT, || relay.log.matching(is_batch).len() >= 3);
    assert!(
        third.is_some(),
        "fewer than 3 batches:\n{}",
        relay.log.text()
    );

    // The sampler stops: its last batch comes, its connection closes, the relay is not ready.
    sampler.signal(Signal::SIGTERM);
    sampler
        .wait_timeout(LOG_TIMEOUT)
        .expect("the sampler exited on SIGTERM");
    relay.log.expect(0, LOG_TIMEOUT, "the disconnection", |v| {
        message(v) == "sampler disconnected"
    });
    let mut text = String::new();
    let gone = wait_until(LOG_TIMEOUT, || {
        text = http_get(&address, "/metrics").1;
        text.contains("\nember_relay_samplers_connected 0\n")
    });
    assert!(
        gone.is_some(),
        "the scrape never showed the sampler gone:\n{text}"
    );
    let (status, reason) = http_get(&address, "/readyz");
    assert_eq!((status, reason.as_str()), (503, "no sampler connected\n"));
    assert_eq!(http_get(&address, "/healthz").0, 200);

    // A client of the wrong uid (this test runs as root, the relay takes --sampler-uid 65534):
    // refused, counted by reason, and named by /readyz.
    let refused = "ember_relay_sampler_connections_refused_total{reason=\"peer_uid\"}";
    assert!(text.contains(&format!("\n{refused} 0\n")), "{text}");
    drop(ember_protocol::transport::connect(socket).expect("connect to the relay's socket"));
    let counted = wait_until(LOG_TIMEOUT, || {
        text = http_get(&address, "/metrics").1;
        text.contains(&format!("\n{refused} 1\n"))
    });
    assert!(counted.is_some(), "the refusal was not counted:\n{text}");
    let (status, reason) = http_get(&address, "/readyz");
    assert_eq!(status, 503);
    assert!(
        reason.starts_with("no sampler connected (1 connection(s) refused"),
        "{reason}"
    );

    // The scrape, parsed by Prometheus' own client, against the relay's log.
    let scrape = parse_with_prometheus_client(&python, &text);
    let batches = relay.log.matching(is_batch);
    let logged: u64 = batches
        .iter()
        .map(|(_, v)| field_u64(v, "samples").expect("samples in a batch line"))
        .sum();
    let last = &batches.last().expect("batches").1;
    eprintln!(
        "{} batches, {logged} samples logged; scrape:\n{text}",
        batches.len()
    );
    assert!(logged > 0, "the workload was busy: no samples logged");
    assert_eq!(
        scrape.value("ember_relay_samples_received_total"),
        logged as f64
    );
    assert_eq!(
        scrape.value("ember_relay_samples_symbolized_total"),
        logged as f64
    );
    assert_eq!(
        scrape.value("ember_relay_batches_received_total"),
        batches.len() as f64
    );
    for (field, counter) in LOSSES {
        let value = batch_counter(last, field).unwrap_or_else(|| panic!("{field} in {last}"));
        assert_eq!(
            scrape.value(counter),
            value as f64,
            "{counter} vs {field} of {last}"
        );
    }
    assert!(
        scrape.value("ember_sampler_samples_total") >= logged as f64,
        "the sampler saw fewer samples than it sent"
    );
    assert_eq!(scrape.value("ember_relay_sampler_connections_total"), 1.0);
    let intervals = scrape.value("ember_relay_batch_latency_seconds_count");
    assert!(intervals >= 3.0, "{intervals} intervals timed");
    assert_eq!(
        scrape.value("ember_relay_batch_latency_seconds_bucket{le=\"+Inf\"}"),
        intervals
    );
    // The symbolizer cache: the spinner's frames were looked up in its binary once (misses,
    // each remembered as an entry) and answered from the cache in the later batches (hits);
    // every lookup is one frame at most; the spinner's binary is among the files held.
    let (hits, misses) = (
        scrape.value("ember_relay_symbolizer_cache_hits_total"),
        scrape.value("ember_relay_symbolizer_cache_misses_total"),
    );
    let entries = scrape.value("ember_relay_symbolizer_cache_entries");
    eprintln!("symbolizer cache: {hits} hits, {misses} misses, {entries} entries");
    assert!(misses >= 1.0, "no lookup reached a binary");
    assert!(
        hits >= 1.0,
        "3 batches of one spinner: later batches' frames come from the cache"
    );
    assert!(
        (1.0..=misses).contains(&entries),
        "{entries} entries for {misses} misses"
    );
    assert!(
        hits + misses <= scrape.value("ember_relay_frames_total"),
        "more lookups than frames"
    );
    let spinner_bytes = std::fs::metadata(&workloads().spinner).unwrap().len() as f64;
    assert!(scrape.value("ember_relay_symbolizer_resolvers") >= 1.0);
    assert!(
        scrape.value("ember_relay_symbolizer_cache_file_bytes") >= spinner_bytes,
        "the spinner's binary ({spinner_bytes} bytes) is not among the files held"
    );
    assert!(scrape.value("process_resident_memory_bytes") > 0.0);
    assert!(scrape.value("process_open_fds") >= 3.0);
    let version = env!("CARGO_PKG_VERSION");
    let build = format!("ember_relay_build_info{{protocol_version=\"3\",version=\"{version}\"}}");
    assert_eq!(scrape.value(&build), 1.0);
    // Types and help as the parser read them: counters are counters, every family explained.
    let (kind, help) = &scrape.families["ember_relay_samples_received"];
    assert_eq!(kind, "counter");
    assert!(help.starts_with("Samples received from samplers"), "{help}");
    assert_eq!(
        scrape.families["ember_relay_batch_latency_seconds"].0,
        "histogram"
    );
    assert_eq!(scrape.families["ember_relay_processes"].0, "gauge");
    for (name, (kind, help)) in &scrape.families {
        assert!(!help.is_empty(), "{name} ({kind}) has no HELP");
        let prefixed = ["ember_relay_", "ember_sampler_", "process_"]
            .iter()
            .any(|p| name.starts_with(p));
        assert!(prefixed, "{name}");
    }
    drop(scenario);
}
