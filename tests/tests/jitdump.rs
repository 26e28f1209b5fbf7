//! JIT frames named from jitdump files: CPython 3.13 and 3.14 (Debian's python3 in the trixie
//! and sid roots, run under `chroot`) started with `-X perf_jit` give each Python function a
//! trampoline in anonymous executable memory and name it in `/tmp/jit-PID.dump`, a file they map
//! executable. The sampler passes that mapped file's descriptor like any other; the relay reads
//! it (relay/src/jit/jitdump.rs) into the process's JIT store, and the trampoline frames of
//! `record --pid` must carry the workload's function names (`py::alpha:FILE`), in the split the
//! workload measured with its own CPU clock.
//!
//! The kernel's Python walk names the same functions as Python frames (tests/tests/python.rs);
//! what is checked here is the native frame of the trampoline, which without the jitdump is one
//! unnamed `[jit]` frame per process.
//!
//! They load eBPF: root, one at a time, under the machine-wide lock (build first):
//!
//! ```text
//! cargo build --workspace && flock /tmp/ember-ebpf.lock \
//!   cargo test -p ember-tests --test jitdump -- --test-threads=1 --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{env, fs, path::PathBuf, time::Duration};

use ember_tests::{
    python::{Python, Source},
    scenario::ebpf_gate,
    *,
};
use nix::sys::signal::Signal;

/// Samples per second on each CPU.
const FREQUENCY: &str = "199";
const DURATION: &str = "12s";
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Share of the workload's samples whose trampoline frame must be named alpha or beta.
const MIN_NAMED: f64 = 0.80;
/// Largest difference between the split of the named trampolines and the workload's own, in
/// percentage points: 12 s at 199 Hz is up to 2,400 samples, 800 on a busy machine, where the
/// split's standard error is 1.6 points (sqrt(0.3 x 0.7 / 800)), so 5 points is 3 sigma.
const MAX_SPLIT_ERROR_PP: f64 = 5.0;
/// A JIT frame in stacks.folded ends with this (relay/src/model.rs `JIT_SUFFIX`).
const JIT_SUFFIX: &str = "_[j]";

/// The function a JIT frame names, when it is one of the workload's trampolines:
/// `py::alpha:/tmp/.../truth.py_[j]` -> `alpha`.
fn trampoline(frame: &str) -> Option<&str> {
    let name = frame.strip_suffix(JIT_SUFFIX)?.strip_prefix("py::")?;
    let (function, file) = name.split_once(':')?;
    file.ends_with("/truth.py").then_some(function)
}

/// Runs truth.py with `-X perf_jit` (records flushed into the dump before it is ready) under `source`'s interpreter, records it by pid, and
/// checks that at least [`MIN_NAMED`] of its samples have alpha's or beta's trampoline named
/// and that the innermost named trampoline splits them as the workload measured.
fn perf_jit(source: Source, suite: &str) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let name = "jit-truth";
    let mut workload = python.spawn_with_options(
        name,
        &["-X", "perf_jit"],
        "truth.py",
        &["60", "--flush-jitdump"],
    );
    let pid = workload.pid();
    let dump = env::var_os("EMBER_ROOTS")
        .or_else(|| env::var_os("EMBER_PYTHON_ROOTS"))
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
        .join(suite)
        .join(format!("tmp/jit-{pid}.dump"));
    let run = spawn_record(&[
        "--duration",
        DURATION,
        "--frequency",
        FREQUENCY,
        "--format",
        "folded",
        "--pid",
        &pid.to_string(),
    ]);
    let recorded = run.finish_writing(RECORD_TIMEOUT, &["stacks.folded"]);
    workload.child.signal(Signal::SIGTERM);
    let measured = workload.wait_for_line("alpha", EXIT_TIMEOUT);
    let _ = fs::remove_file(&dump);

    let folded = fs::read_to_string(recorded.out_dir.join("stacks.folded")).unwrap();
    let stacks = parse_folded(&folded);
    let (mut total, mut named, mut alpha, mut beta, mut unnamed_jit) = (0, 0, 0, 0, 0);
    for stack in stacks.iter().filter(|s| s.process == name) {
        total += stack.count;
        // The innermost trampoline is the function whose code runs.
        match stack.frames.iter().rev().find_map(|f| trampoline(f)) {
            Some("alpha") => alpha += stack.count,
            Some("beta") => beta += stack.count,
            _ => {}
        }
        if stack
            .frames
            .iter()
            .any(|f| matches!(trampoline(f), Some("alpha" | "beta")))
        {
            named += stack.count;
        } else if stack.frames.iter().any(|f| f.ends_with(JIT_SUFFIX)) {
            unnamed_jit += stack.count;
        }
    }
    let percent = |part: u64| 100.0 * part as f64 / total.max(1) as f64;
    let split = alpha as f64 / (alpha + beta).max(1) as f64;
    let truth = measured["alpha"]
        .as_f64()
        .expect("the workload's alpha share");
    let error_pp = (split - truth) * 100.0;
    eprintln!(
        "jitdump row: {:<22} samples {total:>5}  named {:>5.1}%  other JIT frames {:>5.1}%  \
         alpha {:>5.1}% (truth {:>5.1}%) error {error_pp:>+5.1} pp",
        python.label,
        percent(named),
        percent(unnamed_jit),
        split * 100.0,
        truth * 100.0,
    );
    let mut all: Vec<&FoldedStack> = stacks.iter().collect();
    all.sort_by_key(|s| std::cmp::Reverse(s.count));
    for s in all.iter().take(4) {
        eprintln!("common stack: {} {}", s.frames.join(";"), s.count);
    }
    // The most common stacks without a named trampoline, for the log and a failure.
    let mut top: Vec<&FoldedStack> = stacks
        .iter()
        .filter(|s| !s.frames.iter().any(|f| trampoline(f).is_some()))
        .collect();
    top.sort_by_key(|s| std::cmp::Reverse(s.count));
    let top: Vec<String> = top
        .iter()
        .take(8)
        .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
        .collect();
    eprintln!("stacks without a named trampoline:\n{}", top.join("\n"));
    assert!(
        total >= 300,
        "{}: only {total} samples of the workload; is the machine overloaded?",
        python.label
    );
    assert!(
        percent(named) >= MIN_NAMED * 100.0,
        "{}: only {:.1}% of the workload's samples have alpha's or beta's trampoline named from \
         its jitdump (the stacks without are above)",
        python.label,
        percent(named),
    );
    assert!(
        error_pp.abs() <= MAX_SPLIT_ERROR_PP,
        "{}: alpha's trampoline has {:.1}% of alpha+beta's samples ({alpha} of {}), the \
         workload measured {:.1}%",
        python.label,
        split * 100.0,
        alpha + beta,
        truth * 100.0
    );
}

#[test]
fn python_3_13_perf_jit_frames_are_named_from_its_jitdump() {
    perf_jit(Source::Root("trixie"), "trixie");
}

#[test]
fn python_3_14_perf_jit_frames_are_named_from_its_jitdump() {
    perf_jit(Source::Root("sid"), "sid");
}
