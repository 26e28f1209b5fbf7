//! Off-CPU profiles (`record --off-cpu`) against ground truth: the `offcpu` workload's threads
//! block in functions of their own (a sleeper 80% of its wall time in `offcpu_sleep`, a pipe
//! reader in `offcpu_read_pipe`, two threads contending for a mutex in `offcpu_lock`), profiled
//! by the real eBPF program and checked with real readers: Go's pprof (`-sample_index=off_cpu`),
//! the OTLP profiles protos (v1.10) through the model of Pyroscope's ingestion (an `off_cpu`
//! profile), the off-CPU folded file and flame graph. Root only (eBPF); holds `ebpf_lock()`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    io::Write as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use ember_tests::{
    go_pprof::{self, RawProfile},
    otlp::{self, Receiver},
    pyroscope::{self, Rules},
    scenario::{ebpf_gate, Scenario},
    *,
};
use nix::sys::signal::Signal;

/// How long the workload's threads run once started.
const SECONDS: u32 = 3;
const TIMEOUT: Duration = Duration::from_secs(120);

fn workload() -> PathBuf {
    let dir = target_dir().join("ember-test-workloads");
    fs::create_dir_all(&dir).unwrap();
    compile_workload(&dir, "offcpu", "offcpu", &["-pthread"])
}

/// The off-CPU nanoseconds of the samples of thread `thread` (by its name) whose stack
/// `matches`, and of all its samples.
fn off_cpu_of(
    profile: &RawProfile,
    index: usize,
    thread: &str,
    matches: impl Fn(&[String]) -> bool,
) -> (i64, i64) {
    let mut under = 0;
    let mut all = 0;
    for sample in &profile.samples {
        if sample.label("thread_name") != Some(thread) {
            continue;
        }
        let value = sample.values[index];
        all += value;
        if matches(&sample.stack) {
            under += value;
        }
    }
    (under, all)
}

fn has(stack: &[String], function: &str) -> bool {
    stack.iter().any(|f| f == function)
}

/// What one recording of the workload left: its output directory, its summary, the workload's
/// truth line and the last batch's log line.
struct Recorded {
    record: ember_tests::scenario::Recording,
    summary: String,
    truth: serde_json::Value,
    last_batch: serde_json::Value,
}

/// Records the workload run with `args` (after SECONDS) under `record --off-cpu --pid`,
/// exporting OTLP v1.10 to `otlp_url`: its threads start once the sampler holds its unwind
/// tables (the program's and libc's), so their stacks are walked whole from the first wait;
/// the record stops one batch after the workload ends.
fn record_workload(args: &[&str], otlp_url: &str) -> Recorded {
    let mut command = Command::new(workload());
    command
        .arg(SECONDS.to_string())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut workload = ChildGuard::spawn("offcpu", &mut command);
    let pid = workload.pid().to_string();
    let mut record = Scenario::new("offcpu record")
        .relay_args([
            "--off-cpu",
            "--pid",
            &pid,
            "--duration",
            "60s",
            "--interval",
            "500ms",
            "--otlp-endpoint",
            otlp_url,
            "--otlp-protocol",
            "grpc",
            "--otlp-proto-version",
            "1.10",
        ])
        .record();
    record.first_batch(TIMEOUT);
    record
        .log
        .expect(0, TIMEOUT, "the workload's unwind tables loaded", |line| {
            is_batch(line) && batch_counter(line, "unwind_tables_loaded").unwrap_or(0) >= 2
        });
    workload
        .child_mut()
        .stdin
        .take()
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    let exited = workload.wait_timeout(TIMEOUT).expect("the workload ends");
    assert!(exited.success(), "the workload failed: {exited}");
    let mut stdout = String::new();
    std::io::Read::read_to_string(
        &mut workload.child_mut().stdout.take().unwrap(),
        &mut stdout,
    )
    .unwrap();
    let truth: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the truth line");
    // The last waits end in the batch after the workload's end: stop after it.
    let lines = record.log.len();
    let (_, last_batch) = record
        .log
        .expect(lines, TIMEOUT, "one more batch", is_batch);
    record.child.signal(Signal::SIGINT);
    let (status, summary) = record.wait(TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "record failed: {status:?}\n{summary}\n{}",
        record.log.text()
    );
    Recorded {
        record,
        summary,
        truth,
        last_batch,
    }
}

/// The index of the `off_cpu` / `nanoseconds` sample type.
fn off_cpu_index(profile: &RawProfile) -> usize {
    profile
        .sample_types
        .iter()
        .position(|t| t.0 == "off_cpu" && t.1 == "nanoseconds")
        .unwrap_or_else(|| panic!("no off_cpu sample type: {:?}", profile.sample_types))
}

#[test]
fn off_cpu_time_lands_under_the_functions_that_block_in_every_output() {
    let Some(_lock) = ebpf_gate() else { return };
    let receiver = Receiver::grpc(None);
    let Recorded {
        record,
        summary,
        truth,
        ..
    } = record_workload(&[], &receiver.url());
    let sleeper_wall = truth["sleeper_wall_ns"].as_i64().unwrap();

    // Go's pprof: the off_cpu sample type, and where each thread's waits went.
    let pb = record.out_dir.join("profile.pb.gz");
    let Some(profile) = go_pprof::read_raw(&pb) else {
        return;
    };
    let index = off_cpu_index(&profile);
    let top = go_pprof::top_of(&pb, "off_cpu").unwrap();
    assert!(
        top.contains("offcpu_sleep"),
        "pprof -sample_index=off_cpu:\n{top}"
    );

    let (sleeping, sleeper) = off_cpu_of(&profile, index, "sleeper", |s| has(s, "offcpu_sleep"));
    let share = sleeper as f64 / sleeper_wall as f64;
    println!(
        "sleeper: off-CPU {:.3} s of {:.3} s wall ({:.1}%, truth 80%), {:.1}% under offcpu_sleep",
        sleeper as f64 / 1e9,
        sleeper_wall as f64 / 1e9,
        100.0 * share,
        100.0 * sleeping as f64 / sleeper.max(1) as f64
    );
    assert!(
        (0.70..=0.90).contains(&share),
        "the sleeper was off-CPU {:.1}% of its wall time, truth 80% +- 10%",
        100.0 * share
    );
    assert!(
        sleeping as f64 >= 0.9 * sleeper as f64,
        "only {sleeping} of the sleeper's {sleeper} off-CPU ns under offcpu_sleep"
    );

    let (reading, reader) = off_cpu_of(&profile, index, "reader", |s| has(s, "offcpu_read_pipe"));
    println!(
        "reader: off-CPU {:.3} s, {:.1}% under offcpu_read_pipe",
        reader as f64 / 1e9,
        100.0 * reading as f64 / reader.max(1) as f64
    );
    assert!(
        reader as f64 >= 0.5e9 * f64::from(SECONDS),
        "the reader, blocked nearly all of its {SECONDS} s, was off-CPU {reader} ns"
    );
    assert!(
        reading as f64 >= 0.9 * reader as f64,
        "only {reading} of the reader's {reader} off-CPU ns under offcpu_read_pipe"
    );

    let mut waited = 0;
    for locker in ["locker1", "locker2"] {
        let (locking, all) = off_cpu_of(&profile, index, locker, |s| {
            has(s, "offcpu_lock") && s.iter().any(|f| f.contains("pthread_mutex_lock"))
        });
        println!(
            "{locker}: off-CPU {:.3} s, {:.3} s waiting for the lock in offcpu_lock",
            all as f64 / 1e9,
            locking as f64 / 1e9
        );
        assert!(locking > 0, "{locker} never waited under offcpu_lock");
        waited += locking;
    }
    assert!(
        waited as f64 >= 0.25e9 * f64::from(SECONDS),
        "the two lockers waited {waited} ns for the lock in {SECONDS} s (each holds it half \
         the time)"
    );
    // The CPU profile is still there, the burn under offcpu_burn.
    let cpu_burn: i64 = profile
        .samples
        .iter()
        .filter(|s| s.label("thread_name") == Some("sleeper") && has(&s.stack, "offcpu_burn"))
        .map(|s| s.values[0])
        .sum();
    assert!(
        cpu_burn > 0,
        "no CPU sample of the sleeper under offcpu_burn"
    );

    // The off-CPU folded file and flame graph: the same nanoseconds.
    let folded = fs::read_to_string(record.out_dir.join("stacks.offcpu.folded")).unwrap();
    let folded_sleep: i64 = parse_folded(&folded)
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "offcpu_sleep"))
        .map(|s| s.count as i64)
        .sum();
    let all_sleep: i64 = profile
        .samples
        .iter()
        .filter(|s| has(&s.stack, "offcpu_sleep"))
        .map(|s| s.values[index])
        .sum();
    assert_eq!(
        folded_sleep, all_sleep,
        "stacks.offcpu.folded and pprof disagree"
    );
    let svg = fs::read_to_string(record.out_dir.join("flamegraph.offcpu.svg")).unwrap();
    assert!(
        svg.contains("off-CPU") && svg.contains("offcpu_sleep"),
        "flamegraph.offcpu.svg"
    );
    assert!(summary.contains("off-CPU:"), "the summary:\n{summary}");

    // OTLP v1.10 into Pyroscope's model: an off_cpu profile with the same nanoseconds.
    let decoded: Vec<_> = receiver
        .received()
        .iter()
        .map(|r| otlp::decode("1.10", &r.body).expect("decodes"))
        .collect();
    let off_cpu: Vec<_> = decoded
        .iter()
        .filter(|d| pyroscope::profile_name(d) == Some("off_cpu"))
        .cloned()
        .collect();
    let otlp_total: i64 = off_cpu.iter().map(otlp::Decoded::total).sum();
    let pprof_total: i64 = profile.samples.iter().map(|s| s.values[index]).sum();
    assert_eq!(otlp_total, pprof_total, "OTLP off_cpu and pprof totals");
    let view = pyroscope::ingest(&decoded, Rules::V1_20);
    assert_eq!(
        view.unknown_type, 0,
        "a request of a type Pyroscope does not map"
    );
    let in_off_cpu: i64 = view
        .series
        .iter()
        .filter(|(labels, _)| labels.get("__name__").map(String::as_str) == Some("off_cpu"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(in_off_cpu, pprof_total, "Pyroscope's off_cpu profile");
    let sleep_in_otlp: i64 = off_cpu
        .iter()
        .flat_map(otlp::Decoded::samples)
        .filter(|(_, s)| s.line_names.iter().any(|f| f == "offcpu_sleep"))
        .map(|(_, s)| s.count)
        .sum();
    assert_eq!(sleep_in_otlp, all_sleep, "OTLP stacks under offcpu_sleep");
}

#[test]
fn short_waits_are_sampled_and_weighed_so_the_total_stays_unbiased() {
    let Some(_lock) = ebpf_gate() else { return };
    // Ping and pong pass a byte back and forth: every wait far under --off-cpu-min (1 ms), so
    // each is kept with probability wait / 1 ms and counted as 1 ms.
    let receiver = Receiver::grpc(None);
    let Recorded {
        record,
        truth,
        last_batch,
        ..
    } = record_workload(&["pingpong"], &receiver.url());
    let pb = record.out_dir.join("profile.pb.gz");
    let Some(profile) = go_pprof::read_raw(&pb) else {
        return;
    };
    let index = off_cpu_index(&profile);
    let (reading, ping) = off_cpu_of(&profile, index, "ping", |s| has(s, "offcpu_ping_read"));
    let field = |name: &str| truth[name].as_i64().unwrap();
    let (wall, cpu, rq) = (
        field("ping_wall_ns"),
        field("ping_cpu_ns"),
        field("ping_rq_ns"),
    );
    // Off the CPU and not runnable, plus the wait for a CPU after each wake-up (ember counts
    // that, not the time a preempted thread waits): between wall - cpu - rq and wall - cpu.
    let (low, high) = (wall - cpu - rq, wall - cpu);
    let sampled_out = batch_counter(&last_batch, "off_cpu_sampled_out").unwrap_or(0);
    let kept = batch_counter(&last_batch, "off_cpu_kept").unwrap_or(0);
    println!(
        "ping: {} round trips; off-CPU recorded {:.3} s, truth {:.3} s to {:.3} s; waits kept \
         {kept}, sampled out {sampled_out}; {:.1}% under offcpu_ping_read",
        field("round_trips"),
        ping as f64 / 1e9,
        low as f64 / 1e9,
        high as f64 / 1e9,
        100.0 * reading as f64 / ping.max(1) as f64
    );
    assert!(
        sampled_out > kept,
        "the waits were not short: {kept} kept, {sampled_out} sampled out"
    );
    assert!(
        ping as f64 >= 0.85 * low as f64 && ping as f64 <= 1.15 * high as f64,
        "ping's off-CPU time {ping} ns is outside the truth {low}..{high} ns (+- 15%)"
    );
    assert!(
        reading as f64 >= 0.9 * ping as f64,
        "only {reading} of ping's {ping} off-CPU ns under offcpu_ping_read"
    );
}
