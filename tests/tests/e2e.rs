//! End-to-end tests: the real `ember-sampler` and `ember-relay` (from `cargo build`) against C
//! workloads with known behaviour. They load eBPF, so they need root; run them with
//!
//! ```text
//! cargo build && sudo -E cargo test -p ember-tests -- --test-threads=1 --nocapture
//! ```
//!
//! Every test holds `ebpf_lock()`, so they are serialized even without `--test-threads=1`.
//! Timeouts only keep a broken build from hanging; no test asserts speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e/otlp.rs"]
mod otlp;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::{
        fd::{AsFd as _, OwnedFd},
        unix::process::CommandExt as _,
    },
    path::Path,
    thread,
    time::{Duration, Instant},
};

use ember_protocol::{
    decode_sampler_message, encode_sampler_message,
    transport::{self, Received},
    Batch, FileInfo, Hello, Limits, SamplerMessage, NO_FD, PROTOCOL_VERSION,
};
use ember_tests::{
    attack::*,
    scenario::{ebpf_gate, Sampler, Scenario},
    *,
};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout},
    sys::signal::Signal,
};
use serde_json::Value;

const RECORD_TIMEOUT: Duration = Duration::from_secs(180);
const FIRST_BATCH_TIMEOUT: Duration = Duration::from_secs(90);
const LOG_TIMEOUT: Duration = Duration::from_secs(30);

/// The ground truth workload's call chain, root first.
const CHAIN: [&str; 4] = ["main", "outer_work", "middle_work", "inner_work"];
const FUNCS: [&str; 3] = ["outer_work", "middle_work", "inner_work"];

fn pid_arg(pid: u32) -> String {
    pid.to_string()
}

fn last_json_line(out: &str) -> Value {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("workload printed no JSON summary; stdout: {out:?}"));
    serde_json::from_str(line).unwrap_or_else(|err| panic!("bad workload JSON {line:?}: {err}"))
}

/// The user frames below `main` that a frame-pointer walk reaches on this host (Debian 12, glibc
/// 2.36), root first. glibc is built without frame pointers: `_start` zeroes rbp and neither
/// `__libc_start_main_impl` nor `__libc_start_call_main` pushes a frame, so `main`'s saved rbp is
/// that 0 and the walk ends with `main`'s return address, inside `__libc_start_call_main`.
/// Dropping, adding or misnaming that outermost frame breaks the exact match below.
const LIBC_ENTRY: [&str; 1] = ["__libc_start_call_main"];

/// What the DWARF unwinder (`--unwind dwarf`, the default) adds below [`LIBC_ENTRY`]: glibc's
/// CFI leads on to `_start`, the outermost frame.
const DWARF_ROOT: [&str; 2] = ["_start", "__libc_start_main_impl"];

/// Whether `frames` (root first) are exactly [`LIBC_ENTRY`] then [`CHAIN`] down to `leaf`,
/// after [`DWARF_ROOT`] when the stack starts with it: the whole stack from the outermost
/// frame, nothing missing, nothing extra.
fn has_full_chain(frames: &[String], leaf: &str) -> bool {
    let Some(depth) = CHAIN.iter().position(|f| *f == leaf) else {
        return false;
    };
    let dwarf_root =
        frames.len() >= DWARF_ROOT.len() && frames.iter().zip(DWARF_ROOT).all(|(a, b)| a == b);
    let frames = if dwarf_root {
        &frames[DWARF_ROOT.len()..]
    } else {
        frames
    };
    let expected = LIBC_ENTRY.iter().chain(&CHAIN[..=depth]);
    frames.len() == LIBC_ENTRY.len() + depth + 1 && frames.iter().zip(expected).all(|(a, b)| a == b)
}

/// State letter of /proc/PID/stat (R, S, T, Z, ...).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// profile.pb.gz of a recording, read by Go's pprof (`go tool pprof -raw`, not our decoder), says
/// what stacks.folded of the same recording says, stack by stack: the same (process, stack root
/// first) with the same count, nothing more, nothing less. It is a CPU profile (period type
/// cpu/nanoseconds, period 1e9/`frequency`, sample types samples/count and cpu/nanoseconds) and
/// each sample's CPU time is its count times the period. Counts moved between samples, a frame
/// lost at either end of a stack, or a wrong period fail here even when totals agree.
fn assert_go_pprof_reads_the_folded_stacks(out_dir: &Path, folded: &[FoldedStack], frequency: u32) {
    let Some(raw) = go_pprof::read_raw(&out_dir.join("profile.pb.gz")) else {
        return;
    };
    let period = 1_000_000_000 / i64::from(frequency);
    assert_eq!(
        raw.period_type,
        ("cpu".to_owned(), "nanoseconds".to_owned()),
        "go tool pprof reads the period type of profile.pb.gz as {:?}",
        raw.period_type
    );
    assert_eq!(
        raw.period, period,
        "go tool pprof reads period {} in profile.pb.gz; sampling at {frequency} Hz is one \
         sample per {period} ns",
        raw.period
    );
    let types =
        [("samples", "count"), ("cpu", "nanoseconds")].map(|(t, u)| (t.to_owned(), u.to_owned()));
    assert_eq!(
        raw.sample_types, types,
        "go tool pprof reads these sample types in profile.pb.gz"
    );
    for sample in &raw.samples {
        assert_eq!(
            sample.values[1],
            sample.values[0] * period,
            "a sample of {} has CPU time {} ns, not its count x the period {period} ns; stack \
             (leaf first): {:?}",
            sample.values[0],
            sample.values[1],
            sample.stack
        );
    }

    let from_pprof = go_pprof::raw_by_stack(&raw);
    let from_folded = go_pprof::folded_by_stack(folded);
    let show =
        |(process, frames): &(String, Vec<String>)| format!("{process};{}", frames.join(";"));
    let mut differences = Vec::new();
    for (stack, &count) in &from_folded {
        match from_pprof.get(stack) {
            Some(&pprof_count) if pprof_count == count => {}
            Some(&pprof_count) => differences.push(format!(
                "{}: {count} in stacks.folded, {pprof_count} in profile.pb.gz",
                show(stack)
            )),
            None => differences.push(format!(
                "{}: {count} in stacks.folded, absent from profile.pb.gz",
                show(stack)
            )),
        }
    }
    for (stack, &count) in &from_pprof {
        if !from_folded.contains_key(stack) {
            differences.push(format!(
                "{}: {count} in profile.pb.gz, absent from stacks.folded",
                show(stack)
            ));
        }
    }
    eprintln!(
        "go tool pprof -raw: {} stacks, {} samples; stacks.folded: {} stacks; {} differ",
        from_pprof.len(),
        from_pprof.values().sum::<u64>(),
        from_folded.len(),
        differences.len()
    );
    assert!(
        !from_folded.is_empty(),
        "stacks.folded is empty: nothing to compare profile.pb.gz with"
    );
    assert!(
        differences.is_empty(),
        "go tool pprof reads other stacks or counts in profile.pb.gz than stacks.folded has \
         ({} differences, {} stacks in stacks.folded; kernel `_[k]` suffixes stripped): {:#?}",
        differences.len(),
        from_folded.len(),
        &differences[..differences.len().min(20)]
    );
}

/// Ground truth: every sample the workload earned is there (its CPU time x the frequency, within
/// a derived bound), the self-time split over main -> outer_work -> middle_work -> inner_work
/// matches the split the workload measured with CLOCK_THREAD_CPUTIME_ID, and the stacks carry
/// the whole call chain from the outermost frame.
#[test]
fn ground_truth_split_matches_the_workload() {
    let Some(_lock) = ebpf_gate() else { return };
    const FREQUENCY: u32 = 499;
    const RUN: Duration = Duration::from_secs(8);
    let workload = spawn_workload(&workloads().groundtruth, 120);
    let pid = workload.pid();
    // Past its start-up calibration, then stopped: it uses no CPU until sampling is on, so all
    // the CPU time it uses from SIGCONT to its exit is inside the recording.
    thread::sleep(Duration::from_millis(300));
    workload.signal(Signal::SIGSTOP);
    wait_until(LOG_TIMEOUT, || process_state(pid) == Some('T'))
        .expect("the groundtruth workload did not stop on SIGSTOP");
    let mut record = Scenario::new("ground truth record")
        .relay_args(["--duration", "20s", "--frequency", &FREQUENCY.to_string()])
        .relay_args(["--pid", &pid_arg(pid)])
        .record();
    // The sampler says hello only after its perf events are attached.
    record
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "sampler hello", is_sampling);
    let cpu_before = process_cpu_time(pid);
    workload.signal(Signal::SIGCONT);
    thread::sleep(RUN);
    workload.signal(Signal::SIGTERM);
    let cpu_after =
        cpu_time_at_exit(pid, LOG_TIMEOUT).expect("groundtruth did not exit on SIGTERM");
    assert!(
        record.child.try_wait().is_none(),
        "the record ended before the workload exited, so its samples were not all taken: raise \
         --duration"
    );
    let cpu = cpu_after.saturating_sub(cpu_before);
    let (status, out) = workload.terminate_and_read_stdout(Duration::from_secs(10));
    assert!(status.success(), "groundtruth exited with {status}");
    let truth = last_json_line(&out);
    eprintln!("workload truth: {truth}");
    let (record_status, record_stdout) = record.wait(RECORD_TIMEOUT);
    assert!(
        record_status.is_some_and(|s| s.success()),
        "ember-relay record failed ({record_status:?}):\n{}",
        tail(&record.log.text(), 60)
    );
    let folded_text = std::fs::read_to_string(record.out_dir.join("stacks.folded"))
        .expect("reading stacks.folded");

    let stacks = parse_folded(&folded_text);
    let ours: Vec<&FoldedStack> = stacks
        .iter()
        .filter(|s| s.process == "groundtruth")
        .collect();
    let others: BTreeSet<&str> = stacks
        .iter()
        .filter(|s| s.process != "groundtruth")
        .map(|s| s.process.as_str())
        .collect();
    assert!(
        others.is_empty(),
        "--pid {pid} recorded other processes too: {others:?}"
    );
    let total = total_count(ours.iter().copied());

    assert_go_pprof_reads_the_folded_stacks(&record.out_dir, &stacks, FREQUENCY);

    // Sample volume against the workload's own CPU time. The sampler's clock is a per-CPU
    // cpu-clock timer firing every 1/FREQUENCY s of that CPU's time, so the workload gets one
    // sample per period it was running: expected = cpu x FREQUENCY. Each stretch it runs on a
    // CPU gets the floor or the ceiling of its length in periods depending on the timer's phase,
    // an independent error of variance p(1-p) <= p, p the stretch's share of a period; summed,
    // the variance is at most `expected` (the Poisson/binomial bound), so 4 sigma is
    // 4 * sqrt(expected) (~250 of ~4,000). The fixed slack covers the CPU time figures: /proc
    // gives utime+stime in clock ticks, each of the two readings truncated by < 1 tick, and a
    // stretch cut at SIGCONT and at the exit. Samples lost or counted twice (a third of them, or
    // any loss of more than ~6%) land outside.
    // SAFETY: sysconf has no preconditions.
    let tick_hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let expected = cpu.as_secs_f64() * f64::from(FREQUENCY);
    let slack = 2.0 * f64::from(FREQUENCY) / tick_hz + 2.0;
    let bound = 4.0 * expected.sqrt() + slack;
    eprintln!(
        "samples of groundtruth: {total}; expected {expected:.0} ({:.3} s of CPU from SIGCONT to \
         exit x {FREQUENCY} Hz), allowed +-{bound:.0} (4 x sqrt(expected) + {slack:.0}); off by \
         {:+.0} ({:+.2}%)",
        cpu.as_secs_f64(),
        total as f64 - expected,
        100.0 * (total as f64 - expected) / expected.max(1.0)
    );
    assert!(
        cpu.as_secs_f64() >= 0.5 * RUN.as_secs_f64(),
        "the workload got only {:.2} s of CPU in {RUN:?}: too little for a 3-point comparison; is \
         the machine overloaded?",
        cpu.as_secs_f64()
    );
    assert!(
        (total as f64 - expected).abs() <= bound,
        "{total} samples of the workload, but it ran {:.3} s of CPU at {FREQUENCY} Hz: expected \
         {expected:.0} +- {bound:.0}; samples are {}",
        cpu.as_secs_f64(),
        if (total as f64) < expected {
            "being lost"
        } else {
            "counted more than once"
        }
    );

    let mut self_counts: BTreeMap<&str, u64> = FUNCS.iter().map(|f| (*f, 0)).collect();
    let mut full_chain = 0u64;
    let mut broken_chains: HashMap<String, u64> = HashMap::new();
    for stack in &ours {
        let Some(leaf) = stack.leaf() else { continue };
        if let Some(count) = self_counts.get_mut(leaf) {
            *count += stack.count;
            if has_full_chain(&stack.frames, leaf) {
                full_chain += stack.count;
            } else {
                *broken_chains.entry(stack.frames.join(";")).or_default() += stack.count;
            }
        }
    }
    let covered: u64 = self_counts.values().sum();
    eprintln!(
        "samples with a ground-truth function as leaf: {covered} of {total} ({:.1}%)",
        100.0 * covered as f64 / total.max(1) as f64
    );
    assert!(
        covered as f64 >= 0.90 * total as f64,
        "only {covered} of {total} samples have outer_work/middle_work/inner_work as leaf frame \
         (the workload spends >98% of its time there); stacks.folded:\n{}",
        folded_text
    );

    eprintln!("function      measured   truth     error");
    let mut failures = Vec::new();
    for func in FUNCS {
        let measured = self_counts[func] as f64 / covered as f64;
        let expected = truth[func]
            .as_f64()
            .unwrap_or_else(|| panic!("truth has no {func}"));
        let error = (measured - expected) * 100.0;
        eprintln!(
            "{func:<12} {:>7.2}%  {:>7.2}%  {error:>+6.2} pts  ({} samples)",
            measured * 100.0,
            expected * 100.0,
            self_counts[func]
        );
        if error.abs() > 3.0 {
            failures.push(format!(
                "{func}: measured {:.2}%, truth {:.2}% ({error:+.2} points)",
                measured * 100.0,
                expected * 100.0
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "self-time shares off by more than 3 points: {failures:?}"
    );

    let chain_share = full_chain as f64 / covered as f64;
    eprintln!(
        "whole stack __libc_start_call_main;main;...;leaf: {:.2}% of those samples",
        chain_share * 100.0
    );
    let mut broken: Vec<_> = broken_chains.into_iter().collect();
    broken.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    eprintln!(
        "most common other stacks: {:?}",
        &broken[..broken.len().min(5)]
    );
    assert!(
        chain_share >= 0.95,
        "only {:.1}% of samples carry exactly the whole stack {} from the outermost frame to \
         their leaf; most common other stacks: {:?}",
        chain_share * 100.0,
        LIBC_ENTRY
            .iter()
            .chain(&CHAIN)
            .copied()
            .collect::<Vec<_>>()
            .join(";"),
        &broken[..broken.len().min(5)]
    );
    assert!(
        record_stdout.contains("inner_work"),
        "the top functions printed by record do not include inner_work (50% self time):\n{}",
        record_stdout
    );
}

/// The kernel part (root first, names as in /proc/kallsyms) of the syscalls workload's write()
/// to /dev/null on this host's kernel (6.18, x86-64): `x64_sys_call`'s switch inlines
/// `__x64_sys_write`, so `do_syscall_64` calls `ksys_write` directly.
const WRITE_PATH: [&str; 5] = [
    "entry_SYSCALL_64_after_hwframe",
    "do_syscall_64",
    "ksys_write",
    "vfs_write",
    "write_null",
];
/// The same for its getppid().
const GETPPID_PATH: [&str; 4] = [
    "entry_SYSCALL_64_after_hwframe",
    "do_syscall_64",
    "__do_sys_getppid",
    "__task_pid_nr_ns",
];

/// Kernel frames: a syscall-heavy workload shows kernel frames on top of its user stack, named
/// exactly as /proc/kallsyms names the functions executing: the syscall entry, then the write
/// and getppid paths function by function.
#[test]
fn kernel_frames_are_named() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().syscalls, 120);
    let pid = workload.pid();
    thread::sleep(Duration::from_millis(100));
    let recorded = record(
        &[
            "--duration",
            "5s",
            "--frequency",
            "499",
            "--pid",
            &pid_arg(pid),
        ],
        RECORD_TIMEOUT,
    );
    drop(workload);

    let stacks = recorded.folded();
    let ours: Vec<&FoldedStack> = stacks.iter().filter(|s| s.process == "syscalls").collect();
    let total = total_count(ours.iter().copied());
    assert!(
        total >= 500,
        "only {total} samples of the syscalls workload:\n{}",
        recorded.folded_text()
    );

    let mut with_kernel = 0u64;
    let mut kernel_frames = 0u64;
    let mut named_kernel_frames = 0u64;
    let mut kernel_with_user = 0u64;
    let mut misordered = Vec::new();
    // Samples whose kernel part (suffix stripped) starts with `prefix`, per prefix checked below.
    let mut kernel_paths: HashMap<Vec<&str>, u64> = HashMap::new();
    let mut padding: BTreeMap<&str, u64> = BTreeMap::new();
    let mut leaf_self: HashMap<&str, u64> = HashMap::new();
    let mut inclusive: HashMap<&str, u64> = HashMap::new();
    for stack in &ours {
        let kernel: Vec<&str> = stack.kernel_frames().collect();
        if kernel.is_empty() {
            continue;
        }
        with_kernel += stack.count;
        // Root first: user frames, then kernel frames up to the leaf, never interleaved.
        let first_kernel = stack
            .frames
            .iter()
            .position(|f| is_kernel_frame(f))
            .unwrap();
        if !stack.frames[first_kernel..]
            .iter()
            .all(|f| is_kernel_frame(f))
        {
            misordered.push(stack.frames.join(";"));
        }
        if stack.user_frames().any(|f| f == "main") {
            kernel_with_user += stack.count;
        }
        let names: Vec<&str> = kernel
            .iter()
            .map(|f| f.strip_suffix(KERNEL_SUFFIX).unwrap_or(f))
            .collect();
        *kernel_paths.entry(names.clone()).or_default() += stack.count;
        for name in &names {
            // `__pfx_<fn>` is the padding before a function: no sampled address lies there, a
            // lookup that does not take the symbol at or below the address names it.
            if name.starts_with("__pfx_") {
                *padding.entry(name).or_default() += stack.count;
            }
        }
        for frame in &kernel {
            kernel_frames += stack.count;
            if !is_unknown_frame(frame) {
                named_kernel_frames += stack.count;
            }
        }
        for frame in kernel.iter().copied().collect::<BTreeSet<_>>() {
            *inclusive.entry(frame).or_default() += stack.count;
        }
        if let Some(leaf) = stack.leaf() {
            *leaf_self.entry(leaf).or_default() += stack.count;
        }
    }
    let mut top_self: Vec<_> = leaf_self
        .into_iter()
        .filter(|(f, _)| is_kernel_frame(f))
        .collect();
    top_self.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut top_inclusive: Vec<_> = inclusive.into_iter().collect();
    top_inclusive.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    eprintln!(
        "syscalls workload: {total} samples, {with_kernel} ({:.1}%) with kernel frames; \
         {named_kernel_frames} of {kernel_frames} kernel frames named",
        100.0 * with_kernel as f64 / total as f64
    );
    eprintln!("top kernel frames (self):");
    for (frame, count) in top_self.iter().take(10) {
        eprintln!("  {count:>6}  {frame}");
    }
    eprintln!("top kernel frames (inclusive):");
    for (frame, count) in top_inclusive.iter().take(10) {
        eprintln!("  {count:>6}  {frame}");
    }

    assert!(
        misordered.is_empty(),
        "kernel frames must be the leaf end of a stack, after the user frames: {:?}",
        &misordered[..misordered.len().min(5)]
    );
    assert!(
        with_kernel as f64 >= 0.4 * total as f64,
        "only {with_kernel} of {total} samples of a write()/getppid() loop have kernel frames"
    );
    assert!(
        named_kernel_frames as f64 >= 0.8 * kernel_frames as f64,
        "only {named_kernel_frames} of {kernel_frames} kernel frames are named (kallsyms not used?)"
    );
    assert!(
        padding.is_empty(),
        "kernel frames named after the padding before a function (the lookup takes the wrong \
         symbol): {padding:?}"
    );
    let starting_with = |prefix: &[&str]| -> u64 {
        kernel_paths
            .iter()
            .filter(|(path, _)| path.starts_with(prefix))
            .map(|(_, count)| count)
            .sum()
    };
    let exactly = |path: &[&str]| kernel_paths.get(path).copied().unwrap_or(0);
    let mut paths: Vec<_> = kernel_paths.iter().collect();
    paths.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let common = paths
        .iter()
        .take(8)
        .map(|(path, count)| format!("{count} {}", path.join(";")))
        .collect::<Vec<_>>()
        .join("\n  ");
    eprintln!("most common kernel paths:\n  {common}");
    let entry = starting_with(&WRITE_PATH[..2]);
    let write = starting_with(&WRITE_PATH[..4]);
    let getppid = starting_with(&GETPPID_PATH[..3]);
    eprintln!(
        "kernel samples under {}: {entry}; write path {}: {write} ({} down to {}); getppid path \
         {}: {getppid} ({} down to {})",
        WRITE_PATH[..2].join(";"),
        WRITE_PATH[..4].join(";"),
        exactly(&WRITE_PATH),
        WRITE_PATH[4],
        GETPPID_PATH[..3].join(";"),
        exactly(&GETPPID_PATH),
        GETPPID_PATH[3],
    );
    // Nearly every kernel sample of a syscall loop is inside a syscall; the rest are interrupt
    // entries and the few instructions before the entry frame exists.
    assert!(
        entry as f64 >= 0.8 * with_kernel as f64,
        "only {entry} of {with_kernel} kernel samples start with exactly {}; most common kernel \
         paths:\n  {common}",
        WRITE_PATH[..2].join(";")
    );
    // The write path and getppid each take a good part of the loop's kernel time (~20% each
    // here); 5% leaves room for another machine's costs, not for a misnamed frame.
    for (what, path, count, depth) in [
        ("write()", &WRITE_PATH[..], write, 4),
        ("getppid()", &GETPPID_PATH[..], getppid, 3),
    ] {
        assert!(
            count as f64 >= 0.05 * with_kernel as f64 && exactly(path) > 0,
            "{what}: {count} of {with_kernel} kernel samples start with exactly {} and {} are \
             exactly {}; most common kernel paths:\n  {common}",
            path[..depth].join(";"),
            exactly(path),
            path.join(";")
        );
    }
    assert!(
        kernel_with_user as f64 >= 0.8 * with_kernel as f64,
        "only {kernel_with_user} of {with_kernel} kernel samples also carry the user stack down \
         to main"
    );
}

/// System-wide recording of two different workloads: each process has its own name and its own
/// hot function, nothing is attributed across them, and profile.pb.gz agrees with the folded
/// stacks.
#[test]
fn multi_process_system_wide() {
    let Some(_lock) = ebpf_gate() else { return };
    let groundtruth = spawn_workload(&workloads().groundtruth, 120);
    let spinner = spawn_workload(&workloads().spinner, 120);
    thread::sleep(Duration::from_millis(300));
    let recorded = record(&["--duration", "5s", "--frequency", "499"], RECORD_TIMEOUT);
    let (gt_pid, spin_pid) = (groundtruth.pid(), spinner.pid());
    drop(groundtruth);
    drop(spinner);

    let stacks = recorded.folded();
    let mut per_process: BTreeMap<&str, u64> = BTreeMap::new();
    for stack in &stacks {
        *per_process.entry(stack.process.as_str()).or_default() += stack.count;
    }
    let mut busiest: Vec<_> = per_process.iter().collect();
    busiest.sort_by(|a, b| b.1.cmp(a.1));
    eprintln!(
        "samples per process (top 10): {:?}",
        &busiest[..busiest.len().min(10)]
    );

    let count_where = |process: &str, pred: &dyn Fn(&FoldedStack) -> bool| -> u64 {
        stacks
            .iter()
            .filter(|s| s.process == process && pred(s))
            .map(|s| s.count)
            .sum()
    };
    for (process, hot, chain) in [
        (
            "groundtruth",
            "inner_work",
            &["main", "outer_work", "middle_work", "inner_work"][..],
        ),
        (
            "spinner",
            "spin_hot",
            &["main", "spin_outer", "spin_hot"][..],
        ),
    ] {
        let total = per_process.get(process).copied().unwrap_or(0);
        assert!(
            total >= 100,
            "process {process} has {total} samples in a 5 s system-wide record (it is always \
             busy); processes seen: {per_process:?}"
        );
        let hot_samples = count_where(process, &|s| s.leaf() == Some(hot));
        let chained = count_where(process, &|s| {
            s.leaf() == Some(hot)
                && s.frames
                    .ends_with(&chain.iter().map(|f| (*f).to_owned()).collect::<Vec<_>>())
        });
        eprintln!("{process}: {total} samples, {hot_samples} with leaf {hot}, {chained} of them with the full chain");
        assert!(hot_samples > 0, "{process} has no samples in {hot}");
        assert!(
            chained as f64 >= 0.9 * hot_samples as f64,
            "{process}: only {chained} of {hot_samples} {hot} samples have the chain {chain:?}"
        );
    }
    let crossed_gt = count_where("groundtruth", &|s| {
        s.has_frame("spin_hot") || s.has_frame("spin_outer")
    });
    let crossed_spin = count_where("spinner", &|s| FUNCS.iter().any(|f| s.has_frame(f)));
    assert_eq!(
        crossed_gt, 0,
        "spinner's functions attributed to groundtruth"
    );
    assert_eq!(
        crossed_spin, 0,
        "groundtruth's functions attributed to spinner"
    );

    let svg = recorded.flamegraph();
    assert!(svg.contains("<svg"), "flamegraph.svg is not an SVG");
    for name in ["spin_hot", "inner_work"] {
        assert!(svg.contains(name), "flamegraph.svg does not mention {name}");
    }

    // profile.pb.gz: same samples as stacks.folded, and the pids (when labelled) are right.
    let profile = recorded.profile();
    let folded_total = total_count(&stacks);
    assert_eq!(
        profile.total_samples(),
        folded_total,
        "profile.pb.gz and stacks.folded disagree on the number of samples"
    );
    let mut pids_of: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut any_pid_label = false;
    for sample in &profile.sample {
        let names = profile.stack(sample);
        let pids: Vec<String> = profile
            .labels(sample)
            .into_iter()
            .filter(|(k, _)| pprof::is_pid_key(k))
            .map(|(_, v)| v)
            .collect();
        any_pid_label |= !pids.is_empty();
        for hot in ["spin_hot", "inner_work"] {
            if names.first().is_some_and(|leaf| leaf == hot) {
                pids_of.entry(hot).or_default().extend(pids.iter().cloned());
            }
        }
    }
    for hot in ["spin_hot", "inner_work"] {
        assert!(
            pids_of.contains_key(hot),
            "profile.pb.gz has no sample with leaf {hot}"
        );
    }
    if any_pid_label {
        eprintln!("pprof pid labels: {pids_of:?} (groundtruth {gt_pid}, spinner {spin_pid})");
        let expect = |hot: &str, pid: u32| {
            let pids = &pids_of[hot];
            assert!(
                pids.len() == 1 && pids.contains(&pid.to_string()),
                "profile.pb.gz labels {hot} samples with pids {pids:?}, expected only {pid}"
            );
        };
        expect("spin_hot", spin_pid);
        expect("inner_work", gt_pid);
    } else {
        eprintln!("NOTE: profile.pb.gz has no pid labels; pids not checked");
    }
}

/// `ember-relay record` runs the relay as a uid of its own (not root, not the shared nobody, used
/// by no other process), with no supplementary groups, no capabilities, NoNewPrivs and not
/// dumpable (another process of that very uid cannot open its memory or list its descriptors),
/// and it still symbolizes and writes its outputs.
#[test]
fn relay_runs_unprivileged() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 120);
    let mut run = spawn_record(&[
        "--duration",
        "6s",
        "--frequency",
        "499",
        "--pid",
        &pid_arg(workload.pid()),
    ]);
    let pid = run.pid();
    let status_path = format!("/proc/{pid}/status");

    // Wait for the drop (the relay starts as root to start its sampler): all four uids equal
    // and not 0.
    let mut relay_uid = None;
    wait_until(Duration::from_secs(60), || {
        if run.child.try_wait().is_some() {
            return true;
        }
        let uids: Vec<u32> = proc_status(Path::new(&status_path))
            .and_then(|s| {
                status_field(&s, "Uid").map(|v| {
                    v.split_whitespace()
                        .filter_map(|n| n.parse().ok())
                        .collect()
                })
            })
            .unwrap_or_default();
        if uids.len() == 4 && uids.iter().all(|&u| u == uids[0] && u != 0) {
            relay_uid = Some(uids[0]);
            return true;
        }
        false
    });
    let relay_uid = relay_uid
        .unwrap_or_else(|| panic!("ember-relay record (pid {pid}) never left uid 0 while running"));
    assert!(
        run.child.try_wait().is_none(),
        "ember-relay record exited during the check"
    );
    eprintln!("relay {pid} runs as uid {relay_uid}");
    assert_ne!(relay_uid, 0, "the relay runs as root");
    assert_ne!(
        relay_uid, 65534,
        "the relay runs as the shared nobody, whose other processes could reach it"
    );

    // No other process runs as that uid (any of real, effective, saved, filesystem).
    let others: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p != pid)
        .filter_map(|p| {
            let status = proc_status(Path::new(&format!("/proc/{p}/status")))?;
            let uid = status_field(&status, "Uid")?;
            let name = status_field(&status, "Name").unwrap_or("?");
            uid.split_whitespace()
                .any(|u| u == relay_uid.to_string())
                .then(|| format!("pid {p} ({name}): Uid {uid}"))
        })
        .collect();
    assert!(
        others.is_empty(),
        "other processes share the relay's uid {relay_uid}: {others:#?}"
    );

    // Then every thread must be unprivileged. Give the drop a moment to complete (uid first,
    // then NoNewPrivs, say), then check, and check again later in the recording.
    let check = || -> Vec<String> {
        let mut problems = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path().join("status"))
                .collect::<Vec<_>>()
        });
        for path in tasks.unwrap_or_default() {
            let Some(status) = proc_status(&path) else {
                continue;
            };
            let field = |key: &str| status_field(&status, key).unwrap_or("<missing>").to_owned();
            let uid = field("Uid");
            if !uid.split_whitespace().all(|id| id == relay_uid.to_string()) {
                problems.push(format!("{}: Uid {uid}", path.display()));
            }
            let gid = field("Gid");
            if gid.split_whitespace().any(|id| id == "0") {
                problems.push(format!(
                    "{}: Gid {gid} (still in group root)",
                    path.display()
                ));
            }
            // setgroups([]): no supplementary group at all.
            let groups = field("Groups");
            if !groups.is_empty() {
                problems.push(format!(
                    "{}: Groups [{groups}] (supplementary groups left)",
                    path.display()
                ));
            }
            for cap in ["CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"] {
                let value = field(cap);
                if !value.trim_start_matches('0').is_empty() {
                    problems.push(format!("{}: {cap} {value}", path.display()));
                }
            }
            let nnp = field("NoNewPrivs");
            if nnp != "1" {
                problems.push(format!("{}: NoNewPrivs {nnp}", path.display()));
            }
            eprintln!(
                "{}: Uid {uid} Gid {gid} Groups [{groups}] CapEff {} CapPrm {} CapBnd {} NoNewPrivs {nnp}",
                path.display(),
                field("CapEff"),
                field("CapPrm"),
                field("CapBnd")
            );
        }
        problems
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut problems = check();
    while !problems.is_empty() && Instant::now() < deadline && run.child.try_wait().is_none() {
        thread::sleep(Duration::from_millis(100));
        problems = check();
    }
    assert!(
        problems.is_empty(),
        "relay still privileged after dropping its privileges: {problems:#?}"
    );

    // Not dumpable: a process of the relay's own uid can neither open its memory nor list its
    // descriptors (both would work against a dumpable process of the same uid).
    for (what, path) in [
        ("open its memory", format!("/proc/{pid}/mem")),
        ("list its descriptors", format!("/proc/{pid}/fd")),
    ] {
        // `exec 3<PATH` only opens (a read of mem at offset 0 would fail anyway).
        let probe = std::process::Command::new("sh")
            .args(["-c", "exec 3<\"$1\"", "probe", &path])
            .stderr(std::process::Stdio::null())
            .uid(relay_uid)
            .gid(relay_uid)
            .status()
            .expect("running a probe as the relay's uid");
        assert!(
            !probe.success(),
            "a process of the relay's uid {relay_uid} could {what} ({path}): the relay is dumpable"
        );
    }

    thread::sleep(Duration::from_secs(2));
    if run.child.try_wait().is_none() {
        let later = check();
        assert!(
            later.is_empty(),
            "relay regained privileges during the recording: {later:#?}"
        );
    }

    let recorded = run.finish(RECORD_TIMEOUT);
    drop(workload);
    let stacks = recorded.folded();
    let hot =
        total_count(stacks.iter().filter(|s| {
            s.process == "spinner" && s.leaf() == Some("spin_hot") && s.has_frame("main")
        }));
    assert!(
        hot > 0,
        "the unprivileged relay produced no symbolized spinner;...;main;spin_outer;spin_hot \
         stacks:\n{}",
        recorded.folded_text()
    );
}

/// The sampler keeps batches while the relay is away and delivers them to the next relay; a
/// relay serves a restarted sampler.
#[test]
fn relay_and_sampler_restarts() {
    let Some(_lock) = ebpf_gate() else { return };
    let workload = spawn_workload(&workloads().spinner, 300);
    let pid = pid_arg(workload.pid());
    let sampler_args = ["--pid", pid.as_str(), "--frequency", "99"];

    let mut scenario = Scenario::new("relay-1").run();
    let (dir, socket) = (scenario.dir().to_path_buf(), scenario.socket.clone());
    let Sampler {
        child: mut sampler, ..
    } = scenario.start_sampler("sampler-1", &sampler_args);
    let relay1 = &mut scenario.relay;
    relay1
        .log
        .expect(0, FIRST_BATCH_TIMEOUT, "\"batch received\"", is_batch);
    let relay1_batches = relay1.log.matching(is_batch);
    let last_seq = relay1_batches
        .last()
        .and_then(|(_, v)| field_u64(v, "sequence"));

    relay1.child.signal(Signal::SIGKILL);
    assert!(
        relay1.child.wait_timeout(Duration::from_secs(10)).is_some(),
        "relay-1 survived SIGKILL"
    );
    let killed_at = now_unix_ns();
    thread::sleep(Duration::from_secs(3));
    assert!(
        sampler.try_wait().is_none(),
        "the sampler exited when the relay went away"
    );
    let restarted_at = now_unix_ns();
    let out_dir = dir.join("out");
    let out_arg = out_dir.to_str().unwrap();
    let mut relay2 = spawn_relay_run("relay-2", &socket, &["--output-dir", out_arg]);

    let ended_between = |v: &Value, from: u64, to: u64| {
        is_batch(v)
            && field_u64(v, "interval_end_unix_ns").is_some_and(|end| end > from && end < to)
    };
    let (_, backlog) = relay2.log.expect(
        0,
        FIRST_BATCH_TIMEOUT,
        "backlog batch (interval ended while no relay was running)",
        |v| ended_between(v, killed_at, restarted_at),
    );
    let (_, fresh) = relay2.log.expect(
        0,
        LOG_TIMEOUT,
        "batch recorded wholly after the restart",
        |v| {
            is_batch(v) && field_u64(v, "interval_start_unix_ns").is_some_and(|t| t >= restarted_at)
        },
    );
    let relay2_batches = relay2.log.matching(is_batch);
    let sequences: Vec<Option<u64>> = relay2_batches
        .iter()
        .map(|(_, v)| field_u64(v, "sequence"))
        .collect();
    eprintln!(
        "relay-1 last sequence {last_seq:?}; relay-2 sequences {sequences:?}; backlog batch {backlog}; \
         fresh batch {fresh}"
    );
    assert!(
        field_u64(&backlog, "samples").is_some_and(|n| n > 0),
        "the backlog batch carries no samples (the workload was busy): {backlog}"
    );
    let seqs: Vec<u64> = sequences.iter().flatten().copied().collect();
    assert!(
        seqs.windows(2).all(|w| w[0] <= w[1]),
        "relay-2 received batches out of order: {seqs:?}"
    );
    if let (Some(last), Some(first)) = (last_seq, seqs.first()) {
        assert!(
            *first > last,
            "relay-2 got sequence {first} again after relay-1 logged {last}"
        );
    }

    // Sampler restart: SIGTERM, a new sampler, a second connection on the same relay.
    let first_connection = relay2
        .log
        .matching(is_batch)
        .last()
        .and_then(|(_, v)| field_text(v, "connection"));
    sampler.signal(Signal::SIGTERM);
    let status = sampler
        .wait_timeout(Duration::from_secs(30))
        .expect("the sampler did not exit on SIGTERM");
    assert!(
        status.success(),
        "the sampler exited with {status} on SIGTERM"
    );
    let mark = relay2.log.len();
    let (_sampler2, _sampler2_log) = spawn_sampler("sampler-2", &socket, &sampler_args);
    let (connected, _) = relay2.log.expect(
        mark,
        FIRST_BATCH_TIMEOUT,
        "second \"sampler connected\"",
        is_connected,
    );
    let (_, batch) = relay2.log.expect(
        connected,
        FIRST_BATCH_TIMEOUT,
        "batch from the new sampler",
        is_batch,
    );
    let connections = relay2.log.matching(is_connected).len();
    assert!(
        connections >= 2,
        "relay-2 logged {connections} \"sampler connected\", expected 2"
    );
    let second_connection = field_text(&batch, "connection");
    eprintln!("connections: first {first_connection:?}, second {second_connection:?}");
    if first_connection.is_some() && second_connection.is_some() {
        assert_ne!(
            first_connection, second_connection,
            "the new sampler's batches carry the old connection id"
        );
    }

    // --output-dir: stacks.folded is written when the window closes or the relay stops (never
    // per batch); stopped within its first window, it covers every batch relay-2 logged.
    relay2.child.signal(Signal::SIGTERM);
    assert!(
        relay2.child.wait_timeout(Duration::from_secs(30)).is_some(),
        "relay-2 did not stop on SIGTERM"
    );
    relay2.log.wait_closed(Duration::from_secs(5));
    let folded_path = out_dir.join("stacks.folded");
    let logged: u64 = relay2
        .log
        .matching(is_batch)
        .iter()
        .filter_map(|(_, v)| field_u64(v, "samples"))
        .sum();
    let written = std::fs::read_to_string(&folded_path)
        .map(|text| total_count(&parse_folded(&text)))
        .unwrap_or(0);
    assert!(
        logged > 0 && logged == written,
        "{} holds {written} samples, but relay-2 logged batches with {logged} samples in all",
        folded_path.display(),
    );
    let folded = parse_folded(&std::fs::read_to_string(&folded_path).unwrap());
    assert!(
        folded
            .iter()
            .any(|s| s.process == "spinner" && s.leaf() == Some("spin_hot")),
        "{} has no spinner;...;spin_hot stack",
        folded_path.display()
    );
    eprintln!("{}: {written} samples, as logged", folded_path.display());
    drop(workload);
}

fn hello(protocol_version: u32) -> SamplerMessage {
    SamplerMessage::Hello(Hello {
        protocol_version,
        sampler_version: "e2e-test".to_owned(),
        hostname: "e2e".to_owned(),
        frequency_hz: 99,
        kallsyms_fd: NO_FD,
        target_pid: 0,
        ..Hello::default()
    })
}

fn connect(socket: &Path) -> OwnedFd {
    let mut last = Errno::UnknownErrno;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match transport::connect(socket) {
            Ok(fd) => return fd,
            Err(err @ (Errno::ECONNREFUSED | Errno::ENOENT)) => last = err,
            Err(err) => panic!("connecting to {}: {err}", socket.display()),
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("cannot connect to {}: {last}", socket.display());
}

/// Whether the peer closed `sock` within `timeout` (reading and discarding anything it sends).
fn closed_within(sock: &OwnedFd, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        let ready = nix::poll::poll(
            &mut fds,
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
        );
        match ready {
            Ok(0) => return false,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(err) => panic!("poll: {err}"),
        }
        match transport::recv(sock.as_fd(), &mut buf) {
            Ok(Received::Closed) | Err(Errno::ECONNRESET) => return true,
            Ok(_) => continue,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(err) => panic!("recv: {err}"),
        }
    }
}

/// Malformed input: the relay closes the offending connection, logs an error, and keeps
/// serving. The handshake, fd-index and connection-cap rules have their own test below
/// (`relay_enforces_handshake_fd_indices_and_connection_cap`).
#[test]
fn relay_rejects_malformed_input() {
    let Some(_lock) = ebpf_gate() else { return };
    const MAX: usize = 65536;
    // The fake samplers below are this (root) test process; the real one at the end runs as
    // nobody once confined.
    let mut scenario = Scenario::new("relay")
        .relay_args(["--max-message-bytes", &MAX.to_string()])
        .relay_args(["--sampler-uid", "0,65534"])
        .run();
    let socket = scenario.socket.clone();
    let relay = &mut scenario.relay;

    let limits = Limits {
        max_message_bytes: MAX,
    };
    let valid_hello = encode_sampler_message(&hello(PROTOCOL_VERSION));
    let garbage: Vec<u8> = b"\xff\xff\xff\x7fthis is not a Cap'n Proto message"
        .iter()
        .copied()
        .cycle()
        .take(200)
        .collect();
    let truncated = valid_hello[..valid_hello.len() / 2].to_vec();
    let oversized = encode_sampler_message(&SamplerMessage::Batch(Batch {
        sequence: 1,
        part: 0,
        parts: 1,
        interval_start_unix_ns: 1,
        interval_end_unix_ns: 2,
        frequency_hz: 99,
        user_stacks: vec![vec![0x40_1000; 100 * 1024 / 8 + 64]],
        ..Batch::default()
    }));
    let wrong_version = encode_sampler_message(&hello(999));
    // A Hello naming kallsyms at descriptor index 5 in a datagram that carries none.
    let mut dangling = hello(PROTOCOL_VERSION);
    if let SamplerMessage::Hello(h) = &mut dangling {
        h.kallsyms_fd = 5;
    }
    let dangling_fd_hello = encode_sampler_message(&dangling);
    assert!(decode_sampler_message(&garbage, &limits).is_err());
    assert!(decode_sampler_message(&truncated, &limits).is_err());
    assert!(
        oversized.len() >= 100 * 1024,
        "oversized message is only {} bytes",
        oversized.len()
    );

    // (case, a valid message sent before the bad one, the bad one, what the logged error must
    // say: each rule is named, so a message refused for another reason fails here)
    type Case<'a> = (&'a str, Option<&'a [u8]>, &'a [u8], &'a [&'a str]);
    let oversized_error = format!(
        "datagram of {} bytes exceeds --max-message-bytes {MAX}",
        oversized.len()
    );
    let cases: [Case<'_>; 5] = [
        (
            "garbage bytes",
            None,
            &garbage,
            &["malformed message: not a valid Cap'n Proto message"],
        ),
        (
            "truncated Hello",
            None,
            &truncated,
            &["malformed message: not a valid Cap'n Proto message"],
        ),
        (
            "oversized (100 KiB) message after a valid Hello",
            Some(&valid_hello),
            &oversized,
            &[oversized_error.as_str()],
        ),
        (
            "Hello with protocol version 999",
            None,
            &wrong_version,
            &["protocol version", "999"],
        ),
        (
            "Hello naming descriptor 5 with none attached",
            None,
            &dangling_fd_hello,
            &["fd index 5", "0 descriptors"],
        ),
    ];
    for (case, before, bad, expected) in cases {
        eprintln!("--- {case}");
        let errors_before = relay.log.matching(is_closing_error).len();
        let mark = relay.log.len();
        let sock = connect(&socket);
        if let Some(first) = before {
            transport::send(sock.as_fd(), first, &[], false).expect("sending the valid Hello");
            // The valid Hello must be accepted: connection kept, no error.
            relay.log.expect(
                mark,
                LOG_TIMEOUT,
                "\"sampler connected\" for a valid Hello",
                is_connected,
            );
            assert!(
                !closed_within(&sock, Duration::from_millis(500)),
                "the relay closed the connection after a valid Hello:\n{}",
                relay.log.text()
            );
            assert_eq!(
                relay.log.matching(is_closing_error).len(),
                errors_before,
                "the relay logged an error for a valid Hello"
            );
        }
        match transport::send(sock.as_fd(), bad, &[], false) {
            Ok(()) => {}
            Err(err @ (Errno::EPIPE | Errno::ECONNRESET)) => {
                eprintln!("send: {err} (already closed)")
            }
            Err(err) => panic!("sending {case}: {err}"),
        }
        assert!(
            closed_within(&sock, LOG_TIMEOUT),
            "the relay did not close the connection after {case}:\n{}",
            relay.log.text()
        );
        let (_, error) = relay.log.expect(
            mark,
            LOG_TIMEOUT,
            &format!("ERROR \"closing connection...\" for {case}"),
            is_closing_error,
        );
        let text = field_text(&error, "error").unwrap_or_default();
        eprintln!("relay: {} / error: {text}", message(&error));
        assert!(
            expected.iter().all(|part| text.contains(part)),
            "the relay closed the connection after {case}, but its error does not name the rule \
             (expected {expected:?}): {error}"
        );
        assert!(
            relay.child.try_wait().is_none(),
            "the relay exited after {case}:\n{}",
            relay.log.text()
        );
        // And it keeps serving: the next client's Hello is taken.
        drop(greeted_connection(
            relay,
            &socket,
            &format!("a client after {case}"),
        ));
    }

    // A real sampler is still served.
    let workload = spawn_workload(&workloads().spinner, 120);
    let pid = pid_arg(workload.pid());
    let mark = relay.log.len();
    let (_sampler, _sampler_log) = spawn_sampler(
        "sampler",
        &socket,
        &["--pid", pid.as_str(), "--frequency", "99"],
    );
    relay.log.expect(
        mark,
        FIRST_BATCH_TIMEOUT,
        "\"batch received\" from a real sampler",
        is_batch,
    );
    assert!(relay.child.try_wait().is_none(), "the relay exited");
}

/// The relay's error for a connection it closed, from its log after `mark` (panics with the log
/// when there is none within [`LOG_TIMEOUT`]).
fn closing_error(relay: &RunningRelay, mark: usize, case: &str) -> String {
    let (_, error) = relay.log.expect(
        mark,
        LOG_TIMEOUT,
        &format!("ERROR \"closing connection...\" for {case}"),
        is_closing_error,
    );
    eprintln!("relay: {}", message(&error));
    field_text(&error, "error").unwrap_or_else(|| message(&error).to_owned())
}

/// Sends `bytes` (with `fds`), tolerating a peer that already closed.
fn send_or_closed(sock: &OwnedFd, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>], what: &str) {
    match transport::send(sock.as_fd(), bytes, fds, false) {
        Ok(()) => {}
        Err(err @ (Errno::EPIPE | Errno::ECONNRESET)) => eprintln!("send {what}: {err} (closed)"),
        Err(err) => panic!("sending {what}: {err}"),
    }
}

/// Connects, sends a valid Hello and waits until the relay took it ("sampler hello" logged for
/// this connection); returns the connection and its id. Panics if the relay refuses or closes it.
fn greeted_connection(relay: &RunningRelay, socket: &Path, what: &str) -> (OwnedFd, u64) {
    let mark = relay.log.len();
    let sock = connect(socket);
    send_or_closed(
        &sock,
        &encode_sampler_message(&hello(PROTOCOL_VERSION)),
        &[],
        "a valid Hello",
    );
    let (_, hello) = relay.log.expect(
        mark,
        LOG_TIMEOUT,
        &format!("\"sampler hello\" for {what}"),
        |v| message(v) == "sampler hello" || is_closing_error(v),
    );
    assert_eq!(
        message(&hello),
        "sampler hello",
        "the relay refused {what}:\n{}",
        relay.log.text()
    );
    let conn = field_u64(&hello, "connection").expect("the hello line names its connection");
    (sock, conn)
}

/// The handshake and fd rules of the relay's source, each broken by a fake sampler: a first
/// message other than Hello (`NoHello`), a second Hello (`DuplicateHello`), a Files message
/// naming fd index 3 in a datagram carrying one descriptor (`FdIndex`, with no MSG_CTRUNC); and
/// the 64-connection cap. Each time the relay closes that connection and logs the exact reason,
/// and the next client is served. Needs no root: the relay accepts this test's own uid.
#[test]
fn relay_enforces_handshake_fd_indices_and_connection_cap() {
    let _lock = ebpf_lock();
    let uid = nix::unistd::geteuid().to_string();
    let mut scenario = Scenario::new("relay")
        .relay_args(["--sampler-uid", &uid])
        .run();
    let socket = scenario.socket.clone();
    let relay = &mut scenario.relay;

    // The cap first, on a fresh relay, so no earlier connection is still counted.
    // Given 64 samplers connected and greeted, and idle.
    let mut open: Vec<(OwnedFd, u64)> = (0..64)
        .map(|i| greeted_connection(relay, &socket, &format!("connection {}", i + 1)))
        .collect();
    // When a 65th connects, then it is closed with the logged reason.
    let mark = relay.log.len();
    let extra = connect(&socket);
    assert!(
        closed_within(&extra, LOG_TIMEOUT),
        "the relay did not close a 65th connection:\n{}",
        relay.log.text()
    );
    let (_, refused) = relay
        .log
        .expect(mark, LOG_TIMEOUT, "a refusal of the 65th", |v| {
            is_closing_error(v)
        });
    assert_eq!(
        message(&refused),
        "closing connection: too many samplers connected at once",
        "{refused}"
    );
    assert_eq!(field_u64(&refused, "max"), Some(64), "{refused}");
    for (sock, conn) in &open {
        assert!(
            !closed_within(sock, Duration::from_millis(10)),
            "connection {conn} was closed while the relay was full"
        );
    }
    // When one closes, then a new one is let in (once the relay has seen it close: retried
    // while refusals come back, each one a logged event, never a timed guess).
    let (gone, gone_id) = open.pop().unwrap();
    let mark = relay.log.len();
    drop(gone);
    relay.log.expect(mark, LOG_TIMEOUT, "the disconnect", |v| {
        message(v) == "sampler disconnected" && field_u64(v, "connection") == Some(gone_id)
    });
    let mut admitted = None;
    for attempt in 1..=50 {
        let mark = relay.log.len();
        let sock = connect(&socket);
        let (_, outcome) = relay
            .log
            .expect(mark, LOG_TIMEOUT, "accept or refusal", |v| {
                is_connected(v) || is_closing_error(v)
            });
        if is_connected(&outcome) {
            admitted = Some(sock);
            break;
        }
        eprintln!("attempt {attempt}: still refused ({})", message(&outcome));
        thread::sleep(Duration::from_millis(20));
    }
    let admitted = admitted.expect("no connection admitted after one of 64 closed");
    send_or_closed(
        &admitted,
        &encode_sampler_message(&hello(PROTOCOL_VERSION)),
        &[],
        "a Hello on the admitted connection",
    );
    assert!(
        !closed_within(&admitted, Duration::from_millis(500)),
        "the admitted connection was closed:\n{}",
        relay.log.text()
    );
    drop(admitted);
    drop(open);

    // The protocol rules.
    let files = |fd: i32| {
        encode_sampler_message(&SamplerMessage::Files(vec![FileInfo {
            file_id: 1,
            device: 1,
            inode: 1,
            path: "/fake/libfake.so".to_owned(),
            fd,
            open_error: String::new(),
        }]))
    };
    let valid_hello = encode_sampler_message(&hello(PROTOCOL_VERSION));
    let passed = std::fs::File::open("/dev/null").unwrap();
    // (case, messages sent in order, the last with descriptors, the relay's exact reason)
    let cases: [(&str, Vec<Vec<u8>>, bool, &str); 3] = [
        (
            "a Files message first",
            vec![files(NO_FD)],
            false,
            "first message was `files`, expected `hello`",
        ),
        (
            "a second Hello",
            vec![valid_hello.clone(), valid_hello.clone()],
            false,
            "a second `hello` on one connection",
        ),
        (
            "fd index 3 with one descriptor",
            vec![valid_hello.clone(), files(3)],
            true,
            "message refers to fd index 3 but carried 1 descriptors",
        ),
    ];
    for (case, messages, with_fd, reason) in cases {
        eprintln!("--- {case}");
        let mark = relay.log.len();
        let sock = connect(&socket);
        let last = messages.len() - 1;
        for (i, bytes) in messages.iter().enumerate() {
            let fds = if i == last && with_fd {
                vec![passed.as_fd()]
            } else {
                Vec::new()
            };
            send_or_closed(&sock, bytes, &fds, case);
        }
        assert!(
            closed_within(&sock, LOG_TIMEOUT),
            "the relay did not close the connection after {case}:\n{}",
            relay.log.text()
        );
        let error = closing_error(relay, mark, case);
        assert_eq!(error, reason, "the relay's reason for {case}");
        // The next client is served.
        let (next, _) = greeted_connection(relay, &socket, &format!("the client after {case}"));
        assert!(
            !closed_within(&next, Duration::from_millis(500)),
            "the relay closed a valid client after {case}:\n{}",
            relay.log.text()
        );
    }
    assert!(relay.child.try_wait().is_none(), "the relay exited");
}

/// `ember-relay run` as root without `--allow-root` refuses to start, naming the flag.
#[test]
fn relay_run_refuses_root_without_allow_root() {
    let Some(_lock) = ebpf_gate() else { return };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ember.sock");
    let mut command = std::process::Command::new(relay_bin());
    command
        .arg("run")
        .arg("--socket")
        .arg(&socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = ChildGuard::spawn("relay without --allow-root", &mut command);
    let stderr = read_to_string_thread(child.child_mut().stderr.take().unwrap());
    let status = child
        .wait_timeout(LOG_TIMEOUT)
        .unwrap_or_else(|| panic!("ember-relay run as root kept running without --allow-root"));
    let stderr = stderr.join().unwrap();
    eprintln!("exit: {status}\nstderr:\n{stderr}");
    assert!(!status.success(), "exit {status}:\n{stderr}");
    assert!(
        stderr.contains("refusing to run as root") && stderr.contains("--allow-root"),
        "the refusal does not name --allow-root:\n{stderr}"
    );
    assert!(!socket.exists(), "the refused relay created its socket");
}
