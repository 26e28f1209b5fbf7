//! Short-lived processes (issue 11): processes that live 50-80 ms are described while they run
//! (the program reports each process's first sample on a ring buffer and the sampler reads its
//! facts at once), so their samples are symbolized, not only counted.
//!
//! The workload fork+execs `slburn` 20 times a second; each burns 50-80 ms of CPU in
//! main -> burn_outer -> burn_leaf and exits. Expected samples come from the children's CPU time
//! as the launcher reaps it (wait4 rusage) x frequency. Root only (loads eBPF); holds
//! `ebpf_lock()`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use ember_tests::*;
use serde_json::Value;

const FIRST_BATCH_TIMEOUT: Duration = Duration::from_secs(90);
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);
const FREQUENCY: u32 = 499;
/// The child's name, as its samples are filed in stacks.folded.
const CHILD: &str = "slburn";

/// (launcher, child): one source built twice, so the two have distinct names.
fn programs() -> &'static (PathBuf, PathBuf) {
    static PROGRAMS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let dir = target_dir().join("ember-test-workloads");
        std::fs::create_dir_all(&dir).expect("creating the workload dir");
        (
            compile_workload(&dir, "shortlived", "sllaunch", &[]),
            compile_workload(&dir, "shortlived", CHILD, &[]),
        )
    })
}

/// What the launcher reports when it has reaped every child.
struct Launched {
    started: u64,
    reaped: u64,
    cpu: Duration,
}

/// Runs the launcher for `seconds` at `rate` children a second and reads its summary.
fn launch(seconds: u32, rate: u32) -> Launched {
    let (launcher, child) = programs();
    let output = Command::new(launcher)
        .args(["launch", &seconds.to_string(), &rate.to_string()])
        .arg(child)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("running the launcher");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the launcher failed: {text}");
    let summary: Value = serde_json::from_str(text.trim()).expect("the launcher's JSON line");
    let field = |key: &str| summary[key].as_u64().expect("a number");
    Launched {
        started: field("started"),
        reaped: field("reaped"),
        cpu: Duration::from_nanos(field("cpu_ns")),
    }
}

/// The last `sampler status` line's facts-latency figures, for the log.
fn facts_latency(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| message(line) == "sampler status")
        .map(|line| {
            let fields = &line;
            format!(
                "facts read {} ms p50, {} ms p99, {} ms max over {} processes; {} process events, {} dropped",
                fields["facts_latency_p50_ms"],
                fields["facts_latency_p99_ms"],
                fields["facts_latency_max_ms"],
                fields["facts_read"],
                fields["process_events"],
                fields["process_events_dropped"],
            )
        })
        .unwrap_or_else(|| "no sampler status line".into())
}

#[test]
fn short_lived_processes_are_symbolized() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    programs();
    let record = spawn_record(&[
        "--duration",
        "12s",
        "--frequency",
        &FREQUENCY.to_string(),
        "--log-format",
        "json",
    ]);
    record
        .log()
        .expect(0, FIRST_BATCH_TIMEOUT, "sampler connected", is_connected);
    let launched = launch(4, 20);
    let mut record = record;
    assert!(
        record.child.try_wait().is_none(),
        "the record ended before the launcher did: raise --duration"
    );
    let recorded = record.finish(RECORD_TIMEOUT);

    let stacks = recorded.folded();
    let children: Vec<&FoldedStack> = stacks.iter().filter(|s| s.process == CHILD).collect();
    let captured = total_count(children.iter().copied());
    let named = total_count(
        children
            .iter()
            .copied()
            .filter(|s| s.has_frame("burn_outer") || s.has_frame("burn_leaf")),
    );
    let expected = launched.cpu.as_secs_f64() * f64::from(FREQUENCY);
    eprintln!(
        "{} children started, {} reaped, {:.3} s of CPU: {expected:.0} samples expected, \
         {captured} captured ({:.1}%), {named} of them in burn_outer/burn_leaf ({:.1}%); {}",
        launched.started,
        launched.reaped,
        launched.cpu.as_secs_f64(),
        100.0 * captured as f64 / expected.max(1.0),
        100.0 * named as f64 / (captured as f64).max(1.0),
        facts_latency(&recorded.stderr),
    );
    assert_eq!(launched.started, launched.reaped, "children not reaped");
    assert!(launched.started >= 60, "only {} children", launched.started);
    assert!(
        captured as f64 >= 0.95 * expected,
        "{captured} samples of the short-lived children captured, expected {expected:.0} \
         (their CPU time x {FREQUENCY} Hz): less than 95%"
    );
    assert!(
        named as f64 >= 0.95 * captured as f64,
        "only {named} of {captured} samples of the short-lived children have burn_outer or \
         burn_leaf named: their facts were not read while they ran"
    );
}
