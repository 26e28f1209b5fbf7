//! Short-lived processes: processes that live 50-80 ms are described while they run
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

/// The last `sampler status` line.
fn last_status(stderr: &str) -> Option<Value> {
    stderr
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| message(line) == "sampler status")
}

/// The last `sampler status` line's facts-latency figures, for the log.
fn facts_latency(stderr: &str) -> String {
    last_status(stderr)
        .map(|line| {
            let fields = &line;
            format!(
                "facts read {} ms p50, {} ms p99, {} ms max over {} processes; {} process events, \
                 {} dropped; start times from the events: {} agreed with /proc, refused {}",
                fields["facts_latency_p50_ms"],
                fields["facts_latency_p99_ms"],
                fields["facts_latency_max_ms"],
                fields["facts_read"],
                fields["process_events"],
                fields["process_events_dropped"],
                fields["start_times_agreed"],
                fields["start_times_refused"],
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
        .expect(0, FIRST_BATCH_TIMEOUT, "sampler hello", is_sampling);
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
    // The start times the eBPF program read (task_struct offsets from the kernel's BTF) agreed
    // with /proc/PID/stat's for the processes read both ways, so the sampler took them and
    // stopped opening the stat file of each new process.
    let status = last_status(&recorded.stderr).expect("a sampler status line");
    assert_eq!(
        status["start_times_refused"],
        Value::Bool(false),
        "a start time from a first-sample event differed from /proc/PID/stat's"
    );
    let agreed = status["start_times_agreed"].as_u64().unwrap_or(0);
    assert!(
        agreed >= 16,
        "only {agreed} start times from the first-sample events were checked against /proc: \
         the events carry none (no task_struct offsets from the kernel's BTF?)"
    );
}

/// Two programs, `slreuse_a` and `slreuse_b`, built from the workload with their burn functions
/// renamed (`reuse_a_*`, `reuse_b_*`): same layout, so facts joined to the wrong process would
/// name the other one's functions.
fn reuse_programs() -> &'static (PathBuf, PathBuf) {
    static PROGRAMS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let dir = target_dir().join("ember-test-workloads");
        std::fs::create_dir_all(&dir).expect("creating the workload dir");
        let build = |x: &str| {
            compile_workload(
                &dir,
                "shortlived",
                &format!("slreuse_{x}"),
                &[
                    &format!("-Dburn_leaf=reuse_{x}_leaf"),
                    &format!("-Dburn_outer=reuse_{x}_outer"),
                ],
            )
        };
        (build("a"), build("b"))
    })
}

#[test]
fn a_reused_pid_never_joins_one_process_samples_to_another_facts() {
    if !privileged() {
        return;
    }
    let _lock = ebpf_lock();
    programs();
    reuse_programs();
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
        .expect(0, FIRST_BATCH_TIMEOUT, "sampler hello", is_sampling);
    // 40 rounds of: A runs 60 ms of CPU under pid P and exits, then B runs under P (forced).
    let (launcher, _) = programs();
    let (a, b) = reuse_programs();
    let output = Command::new(launcher)
        .args(["reuse", "40", "60"])
        .arg(a)
        .arg(b)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("running the launcher");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the launcher failed: {text}");
    let summary: Value = serde_json::from_str(text.trim()).expect("the launcher's JSON line");
    let mut record = record;
    assert!(
        record.child.try_wait().is_none(),
        "the record ended before the launcher did: raise --duration"
    );
    let recorded = record.finish(RECORD_TIMEOUT);

    let stacks = recorded.folded();
    let mut per_process: std::collections::BTreeMap<&str, u64> = Default::default();
    for stack in &stacks {
        *per_process.entry(stack.process.as_str()).or_default() += stack.count;
    }
    per_process.retain(|_, n| *n >= 20);
    eprintln!("samples per process (20 or more): {per_process:?}");
    let count =
        |process: &str, function: &str| {
            total_count(stacks.iter().filter(|s| {
                s.process == process && s.frames.iter().any(|f| f.starts_with(function))
            }))
        };
    let (a_in_a, b_in_a) = (
        count("slreuse_a", "reuse_a_"),
        count("slreuse_a", "reuse_b_"),
    );
    let (b_in_b, a_in_b) = (
        count("slreuse_b", "reuse_b_"),
        count("slreuse_b", "reuse_a_"),
    );
    let a_elsewhere = total_count(stacks.iter().filter(|s| {
        s.process != "slreuse_a" && s.frames.iter().any(|f| f.starts_with("reuse_a_"))
    }));
    let ns = |key: &str| Duration::from_nanos(summary[key].as_u64().expect("a number"));
    let expected_a = ns("cpu_a_ns").as_secs_f64() * f64::from(FREQUENCY);
    let expected_b = ns("cpu_b_ns").as_secs_f64() * f64::from(FREQUENCY);
    eprintln!(
        "{text}: A's functions {a_in_a} samples in A (expected {expected_a:.0}), {a_in_b} in B, \
         {a_elsewhere} in any other process; B's {b_in_b} in B (expected {expected_b:.0}), \
         {b_in_a} in A"
    );
    let reused = summary["reused"].as_u64().expect("reused");
    assert!(reused >= 30, "only {reused} of 40 rounds got the pid again");
    assert_eq!(
        (b_in_a, a_in_b, a_elsewhere),
        (0, 0, 0),
        "samples filed under the other process of a reused pid"
    );
    // Each process's samples are filed under its own facts (its name): as many as its CPU time
    // earned, none of the other's, and named with its own functions.
    for (name, process, named, expected) in [
        ("A", "slreuse_a", a_in_a, expected_a),
        ("B", "slreuse_b", b_in_b, expected_b),
    ] {
        assert!(
            named as f64 >= 0.9 * expected,
            "{name}: {named} samples in its own functions, its CPU time earned {expected:.0}"
        );
        let filed = per_process.get(process).copied().unwrap_or(0);
        assert!(
            (0.9 * expected..=1.1 * expected).contains(&(filed as f64)),
            "{name}: {filed} samples filed under {process}, its CPU time earned {expected:.0}: \
             rows of one process of a reused pid were filed under the other's facts"
        );
    }
}
