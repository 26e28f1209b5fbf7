//! Python frames against the truth: the real sampler and relay profile CPython workloads
//! (tests/workloads/python) under every CPython line the project supports, and the outputs must
//! name the Python functions that ran, in their callers' chain, in the share the workload
//! measured itself; and Python processes that lie about their frames must not hurt ember or an
//! honest Python process profiled beside them.
//!
//! The interpreters (`ember_tests::python`): pyenv's 3.6 to 3.13 (shared builds), Debian's
//! `/usr/bin/python3.11` (static), and Debian's python3 3.13 and 3.14 in the roots of
//! `scripts/runtime-roots.sh`, run under `chroot`. A missing one fails the test under `CI` or
//! `EMBER_REQUIRE_ALL=1` and is a printed skip otherwise.
//!
//! Most tests read the windows of an `ember-relay run --window 2s --output-dir` and leave out
//! the first window holding the workload: samples taken before the relay has learned the process
//! and sent its interpreter layout to the sampler cannot carry Python frames (the process's facts
//! reach the relay with a batch, once a second), so that window measures the start-up, not the
//! walk. The next windows are the steady state the assertions are about.
//!
//! They load eBPF: root, one at a time, under the machine-wide lock (build first):
//!
//! ```text
//! cargo build && flock /tmp/ember-ebpf.lock \
//!   cargo test -p ember-tests --test python -- --test-threads=1 --nocapture
//! ```
//!
//! Timeouts only keep a broken build from hanging; no test asserts speed. Every test prints the
//! figures it asserts on; the truth tests print one table row per interpreter (`truth row:`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, time::Duration};

use ember_tests::{
    attack::tail,
    python::{
        is_python, python_depth, python_frames, python_leaf, PyFrame, PyProcess, Python, Source,
        Windows,
    },
    scenario::{ebpf_gate, Running, Scenario},
    *,
};
use nix::sys::signal::Signal;

/// Samples per second on each CPU.
const FREQUENCY: u32 = 199;
/// The relay's window: each is one reading of stacks.folded.
const WINDOW: &str = "2s";
/// Steady-state windows read after the start-up window.
const STEADY_WINDOWS: usize = 2;
/// Waiting for one window (the sampler's start loads eBPF: seconds on a busy host).
const WINDOW_TIMEOUT: Duration = Duration::from_secs(90);
/// Windows read at most while waiting for the workload's first samples.
const MAX_START_WINDOWS: usize = 30;
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Share of a workload's samples that must carry its Python names, in the steady state.
const MIN_NAMED: f64 = 0.90;
/// Share of alpha's and beta's samples that must carry the whole chain.
const MIN_CHAIN: f64 = 0.90;
/// Largest difference between the measured alpha/beta split and the workload's own, in
/// percentage points. About 800 samples at 199 Hz in two 2-s windows: the split's standard
/// error is under 1.7 points (sqrt(0.3 x 0.7 / 800)), so 5 points is 3 sigma.
const MAX_SPLIT_ERROR_PP: f64 = 5.0;
/// The walk's bound (docs/design/interpreters.md, `MAX_INTERP_FRAMES`).
const MAX_PYTHON_FRAMES: usize = 64;
/// Longest Python name or file name accepted in an output: the kernel copies 192 bytes of a
/// name object and 320 of a file name's (headers included), so a name is far shorter; 1 KiB
/// leaves room for escaping and marks.
const MAX_NAME_BYTES: usize = 1024;

// ---------------------------------------------------------------------------------------------
// Set-up shared by the tests

/// `ember-relay run --window 2s --format folded --output-dir` with a sampler at [`FREQUENCY`]:
/// of `pid` only when given, else of the whole machine with the relay's `--process-filter`
/// `filter` (the relay then asks the sampler to stop sampling every other process, so a debug
/// relay on a busy machine keeps up and each window holds its seconds of samples).
fn windowed(name: &str, pid: Option<u32>, filter: Option<&str>) -> Running {
    let mut scenario = Scenario::new(name)
        .relay_args(["--window", WINDOW, "--format", "folded"])
        .output_dir()
        .sampler_args(["--frequency", &FREQUENCY.to_string()]);
    if let Some(pid) = pid {
        scenario = scenario.sampler_args(["--pid", &pid.to_string()]);
    }
    if let Some(filter) = filter {
        scenario = scenario.relay_args(["--process-filter", filter]);
    }
    scenario.run()
}

/// Waits for the first window holding samples of `process`, leaves it out (see the module
/// doc), and returns the stacks of the next [`STEADY_WINDOWS`] windows together.
fn steady_stacks(scenario: &Running, windows: &mut Windows, process: &str) -> Vec<FoldedStack> {
    let mut seen = std::collections::BTreeSet::new();
    let mut started = false;
    for _ in 0..MAX_START_WINDOWS {
        let window = windows.next(WINDOW_TIMEOUT, scenario.log());
        if window.iter().any(|s| s.process == process) {
            started = true;
            break;
        }
        seen.extend(window.into_iter().map(|s| s.process));
    }
    assert!(
        started,
        "no window held samples of {process} in {MAX_START_WINDOWS} windows (processes seen: \
         {seen:?}):\n{}",
        tail(&scenario.log().text(), 20)
    );
    (0..STEADY_WINDOWS)
        .flat_map(|_| windows.next(WINDOW_TIMEOUT, scenario.log()))
        .collect()
}

fn of_process<'a>(stacks: &'a [FoldedStack], process: &str) -> Vec<&'a FoldedStack> {
    stacks.iter().filter(|s| s.process == process).collect()
}

fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// The most common stacks among `stacks` (for failure messages).
fn top(stacks: &[&FoldedStack], n: usize) -> String {
    let mut sorted: Vec<&&FoldedStack> = stacks.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
    sorted
        .iter()
        .take(n)
        .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether the stack holds a Python frame of `file` named (base name) one of `names`.
fn has_python(stack: &FoldedStack, file: &str, names: &[&str]) -> bool {
    python_frames(stack)
        .iter()
        .any(|f| f.file == file && names.contains(&f.base_name()))
}

// ---------------------------------------------------------------------------------------------
// The truth, under every interpreter

/// What one truth run measured.
struct Truth {
    total: u64,
    named: u64,
    alpha: u64,
    beta: u64,
    chained: u64,
    native_root: u64,
}

/// The workload's names; `<module>` is a code object's name on every release.
const TRUTH_NAMES: [&str; 4] = ["<module>", "outer", "alpha", "beta"];

impl Truth {
    fn of(stacks: &[&FoldedStack]) -> Self {
        let mut truth = Self {
            total: 0,
            named: 0,
            alpha: 0,
            beta: 0,
            chained: 0,
            native_root: 0,
        };
        for stack in stacks {
            truth.total += stack.count;
            if !has_python(stack, "truth.py", &TRUTH_NAMES) {
                continue;
            }
            truth.named += stack.count;
            // Native frames (the interpreter's start, libc) stay on the root side.
            if stack.frames.first().is_some_and(|f| !is_python(f)) {
                truth.native_root += stack.count;
            }
            let Some(leaf) = python_leaf(stack).filter(|f| f.file == "truth.py") else {
                continue;
            };
            match leaf.base_name() {
                "alpha" => truth.alpha += stack.count,
                "beta" => truth.beta += stack.count,
                _ => continue,
            }
            // The Python chain, root first, is exactly <module> -> outer -> alpha|beta.
            let chain: Vec<(&str, &str)> = python_frames(stack)
                .iter()
                .map(|f: &PyFrame<'_>| (f.file, f.base_name()))
                .collect();
            let expected = [
                ("truth.py", "<module>"),
                ("truth.py", "outer"),
                ("truth.py", leaf.base_name()),
            ];
            if chain == expected {
                truth.chained += stack.count;
            }
        }
        truth
    }
}

/// Runs truth.py under `source`'s interpreter, profiled by pid, and checks the steady state: at
/// least 90% of the samples carry the workload's Python names, the alpha/beta split is within
/// 5 points of the split the workload measured with its own CPU clock, at least 90% of alpha's
/// and beta's samples carry exactly the chain `<module>` -> `outer` -> leaf, and named stacks
/// keep their native frames on the root side.
fn truth(source: Source) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let mut workload = python.spawn("python-truth", "truth.py", &["120"]);
    let scenario = windowed("truth relay", Some(workload.pid()), None);
    let mut windows = Windows::new(&scenario.out_dir());
    let stacks = steady_stacks(&scenario, &mut windows, "python-truth");
    workload.child.signal(Signal::SIGTERM);
    let measured = workload.wait_for_line("alpha", EXIT_TIMEOUT);
    drop(scenario);

    let ours = of_process(&stacks, "python-truth");
    let t = Truth::of(&ours);
    let truth_alpha = measured["alpha"]
        .as_f64()
        .expect("the workload's alpha share");
    let split = t.alpha as f64 / (t.alpha + t.beta).max(1) as f64;
    let error_pp = (split - truth_alpha) * 100.0;
    let (named, chain) = (
        percent(t.named, t.total),
        percent(t.chained, t.alpha + t.beta),
    );
    eprintln!(
        "truth row: {:<20} samples {:>5}  named {named:>5.1}%  alpha {:>5.1}% (truth {:>5.1}%) \
         error {error_pp:>+5.1} pp  chain {chain:>5.1}%  native root {:>5.1}%",
        python.label,
        t.total,
        split * 100.0,
        truth_alpha * 100.0,
        percent(t.native_root, t.named),
    );
    assert!(
        t.total >= 200,
        "{}: only {} samples of the workload in {STEADY_WINDOWS} windows of {WINDOW} at \
         {FREQUENCY} Hz; is the machine overloaded?",
        python.label,
        t.total
    );
    assert!(
        named >= MIN_NAMED * 100.0,
        "{}: only {named:.1}% of truth.py's samples carry its Python names ({:?}); most common \
         stacks:\n{}",
        python.label,
        TRUTH_NAMES,
        top(&ours, 8)
    );
    assert!(
        error_pp.abs() <= MAX_SPLIT_ERROR_PP,
        "{}: alpha has {:.1}% of alpha+beta's samples ({} of {}), the workload measured {:.1}%: \
         {error_pp:+.1} points",
        python.label,
        split * 100.0,
        t.alpha,
        t.alpha + t.beta,
        truth_alpha * 100.0
    );
    assert!(
        chain >= MIN_CHAIN * 100.0,
        "{}: only {chain:.1}% of alpha's and beta's samples carry <module> -> outer -> leaf; most \
         common stacks:\n{}",
        python.label,
        top(&ours, 8)
    );
    assert!(
        percent(t.native_root, t.named) >= MIN_NAMED * 100.0,
        "{}: the native frames below the Python ones were lost in {} of {} named samples",
        python.label,
        t.named - t.native_root,
        t.named
    );
}

/// One test per interpreter, so a failure names the interpreter.
macro_rules! truth_tests {
    ($($(#[$doc:meta])* $name:ident => $source:expr;)*) => {
        $(
            $(#[$doc])*
            #[test]
            fn $name() {
                truth($source);
            }
        )*
    };
}

truth_tests! {
    /// pyenv's CPython 3.6 (frame objects, `f_back`; no thread_time: process_time).
    truth_pyenv_3_6 => Source::Pyenv("3.6");
    /// pyenv's CPython 3.7.
    truth_pyenv_3_7 => Source::Pyenv("3.7");
    /// pyenv's CPython 3.8.
    truth_pyenv_3_8 => Source::Pyenv("3.8");
    /// pyenv's CPython 3.9.
    truth_pyenv_3_9 => Source::Pyenv("3.9");
    /// pyenv's CPython 3.10 (the last with frame objects on the stack).
    truth_pyenv_3_10 => Source::Pyenv("3.10");
    /// pyenv's CPython 3.11 (interpreter frames through `cframe`, `is_entry`).
    truth_pyenv_3_11 => Source::Pyenv("3.11");
    /// pyenv's CPython 3.12 (frame `owner`, shim frames).
    truth_pyenv_3_12 => Source::Pyenv("3.12");
    /// pyenv's CPython 3.13 (`_Py_DebugOffsets`, `current_frame`).
    truth_pyenv_3_13 => Source::Pyenv("3.13");
    /// Debian's /usr/bin/python3.11: statically linked (the interpreter is the executable).
    truth_debian_host_3_11 => Source::Host("/usr/bin/python3.11");
    /// Debian trixie's python3 (3.13), in its root under chroot.
    truth_debian_trixie_3_13 => Source::Root("trixie");
    /// Debian sid's python3 (3.14: tagged code pointers), in its root under chroot.
    truth_debian_sid_3_14 => Source::Root("sid");
}

// ---------------------------------------------------------------------------------------------
// Threads

/// Two threads burn in their own function (threads.py: `hot_a` on one, `hot_b` on the other):
/// in profile.pb.gz every sample holding `hot_a` is on `hot_a`'s thread (the `tid` label) and
/// likewise for `hot_b`, with at least 50 samples each; pprof gives the Python function its
/// file (`threads.py`) and a line inside the function; stacks.folded and the SVG write it
/// `hot_a (threads.py:LINE)`.
fn threads(source: Source) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let workload = python.spawn("python-threads", "threads.py", &["120"]);
    let ready = workload.ready.clone();
    let tid = |f: &str| {
        ready["tids"][f]
            .as_i64()
            .unwrap_or_else(|| panic!("threads.py gave no tid for {f}: {ready}"))
    };
    let first_line = |f: &str| ready["lines"][f].as_i64().expect("a first line");
    let mut record = Scenario::new("threads record")
        .relay_args(["--duration", "8s", "--frequency", &FREQUENCY.to_string()])
        .relay_args(["--pid", &workload.pid().to_string()])
        .record();
    record.finish(RECORD_TIMEOUT);
    drop(workload);

    let profile = pprof::read(&record.out_dir.join("profile.pb.gz"));
    let mut counts: BTreeMap<&str, (u64, u64)> = BTreeMap::new(); // function -> (on its thread, elsewhere)
    let mut bad_files = Vec::new();
    for sample in &profile.sample {
        let frames = profile.stack_lines(sample);
        let sample_tid = profile.num_label(sample, "tid");
        for function in ["hot_a", "hot_b"] {
            let Some((_, file, line)) = frames.iter().find(|(name, _, _)| name == function) else {
                continue;
            };
            let (first, last) = (first_line(function), first_line(function) + 8);
            if !file.ends_with("threads.py") || !(first..=last).contains(line) {
                bad_files.push(format!("{function} in {file:?} line {line}"));
            }
            let entry = counts.entry(function).or_default();
            if sample_tid == Some(tid(function)) {
                entry.0 += profile.sample_count(sample);
            } else {
                entry.1 += profile.sample_count(sample);
            }
        }
    }
    eprintln!(
        "threads row: {:<20} (on its own thread, on another) {counts:?}; tids {}",
        python.label,
        workload_tids_text(&profile)
    );
    for function in ["hot_a", "hot_b"] {
        let (own, other) = counts.get(function).copied().unwrap_or_default();
        assert!(
            own >= 50,
            "{}: only {own} samples of {function} on its thread {}; pprof stacks hold Python \
             functions by name?",
            python.label,
            tid(function)
        );
        assert_eq!(
            other,
            0,
            "{}: {other} samples of {function} were filed under another thread than {}",
            python.label,
            tid(function)
        );
    }
    assert!(
        bad_files.is_empty(),
        "{}: Python functions with a wrong file or line in pprof: {:?}",
        python.label,
        &bad_files[..bad_files.len().min(10)]
    );
    let folded = record.folded_text();
    let svg = std::fs::read_to_string(record.out_dir.join("flamegraph.svg")).expect("the SVG");
    for function in ["hot_a", "hot_b"] {
        let prefix = format!("{function} (threads.py:");
        assert!(
            folded.contains(&prefix),
            "{}: stacks.folded never writes {prefix}LINE)",
            python.label
        );
        assert!(
            svg.contains(&prefix),
            "{}: the SVG never writes {prefix}LINE)",
            python.label
        );
    }
}

/// The distinct tids of a profile's samples (for the log).
fn workload_tids_text(profile: &pprof::Profile) -> String {
    let mut tids: Vec<i64> = profile
        .sample
        .iter()
        .filter_map(|s| profile.num_label(s, "tid"))
        .collect();
    tids.sort_unstable();
    tids.dedup();
    format!("{tids:?}")
}

#[test]
fn threads_pyenv_3_12() {
    threads(Source::Pyenv("3.12"));
}

#[test]
fn threads_pyenv_3_8() {
    threads(Source::Pyenv("3.8"));
}

// ---------------------------------------------------------------------------------------------
// C extensions

/// A frame of zlib's deflate.
fn is_zlib(frame: &str) -> bool {
    !is_python(frame) && frame.to_ascii_lowercase().contains("deflate")
}

/// A frame of the SHA-256 code: OpenSSL's libcrypto (`EVP_Digest*`, `SHA256_*`,
/// `sha256_block_data_order*`) or CPython's own (`_sha256`, HACL* in `_sha2` from 3.12).
fn is_sha(frame: &str) -> bool {
    let lower = frame.to_ascii_lowercase();
    !is_python(frame)
        && ["sha256", "sha2_", "evp_digest", "hacl"]
            .iter()
            .any(|k| lower.contains(k))
}

/// (samples with a `native` frame, of which the Python `caller` is the innermost Python frame
/// and lies on the root side of every such native frame).
fn under_caller(stacks: &[&FoldedStack], native: fn(&str) -> bool, caller: &str) -> (u64, u64) {
    let (mut total, mut under) = (0, 0);
    for stack in stacks {
        let Some(first_native) = stack.frames.iter().position(|f| native(f)) else {
            continue;
        };
        total += stack.count;
        let last_python = stack.frames.iter().rposition(|f| is_python(f));
        let leaf_python = python_leaf(stack);
        if last_python.is_some_and(|i| i < first_native)
            && leaf_python.is_some_and(|f| f.file == "cext.py" && f.base_name() == caller)
        {
            under += stack.count;
        }
    }
    (total, under)
}

/// cext.py calls zlib.compress and hashlib.sha256 on 1 MiB from two Python functions: at least
/// 90% of the samples in deflate sit under `compress_loop`, and of those in the SHA-256 code
/// under `hash_loop` (the Python caller on the root side, no Python frame on the leaf side of
/// the native ones), with at least 30 samples each.
fn c_extension(source: Source) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let workload = python.spawn("python-cext", "cext.py", &["120"]);
    let scenario = windowed("cext relay", Some(workload.pid()), None);
    let mut windows = Windows::new(&scenario.out_dir());
    let stacks = steady_stacks(&scenario, &mut windows, "python-cext");
    drop(workload);
    let ours = of_process(&stacks, "python-cext");
    let zlib = under_caller(&ours, is_zlib, "compress_loop");
    let sha = under_caller(&ours, is_sha, "hash_loop");
    eprintln!(
        "cext row: {:<20} deflate {} samples, {:.1}% under compress_loop; sha256 {} samples, \
         {:.1}% under hash_loop",
        python.label,
        zlib.0,
        percent(zlib.1, zlib.0),
        sha.0,
        percent(sha.1, sha.0)
    );
    for (what, caller, (total, under)) in [
        ("deflate", "compress_loop", zlib),
        ("the SHA-256 code", "hash_loop", sha),
    ] {
        assert!(
            total >= 30,
            "{}: only {total} samples in {what}; most common stacks:\n{}",
            python.label,
            top(&ours, 8)
        );
        assert!(
            percent(under, total) >= MIN_NAMED * 100.0,
            "{}: only {under} of {total} samples in {what} have the Python caller {caller} \
             above it; most common stacks:\n{}",
            python.label,
            top(&ours, 8)
        );
    }
}

#[test]
fn c_extension_frames_stay_under_their_python_caller_pyenv_3_12() {
    c_extension(Source::Pyenv("3.12"));
}

#[test]
fn c_extension_frames_stay_under_their_python_caller_pyenv_3_9() {
    c_extension(Source::Pyenv("3.9"));
}

// ---------------------------------------------------------------------------------------------
// exec

/// An exec workload's windows: the steady ones before it execs, then every one after, until
/// one read after it exited.
struct ExecWindows {
    before: Vec<FoldedStack>,
    /// (stacks, whether the process was still running when the window was read).
    after: Vec<(Vec<FoldedStack>, bool)>,
}

/// Runs exec.py (started by the caller, profiled by `scenario`): its steady windows while it
/// burns in `before_exec`, then SIGUSR1 (it execs), then every window until one after it exited.
fn exec_windows(scenario: &Running, workload: &mut PyProcess) -> ExecWindows {
    let mut windows = Windows::new(&scenario.out_dir());
    let before = steady_stacks(scenario, &mut windows, "python-exec");
    workload.child.signal(Signal::SIGUSR1);
    workload
        .stdout
        .expect(0, EXIT_TIMEOUT, "exec line", |v| v.get("exec").is_some());
    let mut after = Vec::new();
    loop {
        let window = windows.next(WINDOW_TIMEOUT, scenario.log());
        let running = workload.child.try_wait().is_none();
        after.push((window, running));
        if !running || after.len() > 60 {
            break;
        }
    }
    ExecWindows { before, after }
}

/// The last two windows read while the exec'd program still ran (at least 4 s after the exec,
/// which the program outlives by more).
fn last_two_running(after: &[(Vec<FoldedStack>, bool)], rows: &[String]) -> Vec<Vec<FoldedStack>> {
    let running: Vec<&Vec<FoldedStack>> = after
        .iter()
        .filter(|(w, running)| *running && total_count(w.iter()) > 0)
        .map(|(w, _)| w)
        .collect();
    assert!(
        running.len() >= 3,
        "too few windows after the exec:\n  {}",
        rows.join("\n  ")
    );
    running[running.len() - 2..]
        .iter()
        .map(|w| (*w).clone())
        .collect()
}

fn spins(stack: &FoldedStack) -> bool {
    stack.has_frame("spin_hot") || stack.has_frame("spin_outer")
}

fn has_any_python(stack: &FoldedStack) -> bool {
    stack.frames.iter().any(|f| is_python(f))
}

/// exec.py burns in `before_exec` under `source`, then (told so by the test) execs the spinner
/// (a C program: main -> spin_outer -> spin_hot) for 8 s, keeping its pid and start time. Before
/// the exec at least 90% of its samples carry `before_exec`; no stack ever holds a Python frame
/// together with the spinner's; the last two windows the spinner ran through hold no Python
/// frame at all and its own functions in at least 90% of their samples.
fn exec_into_native(source: Source) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    // The spinner is a file of the host: run this test with interpreters of the host.
    let spinner = workloads().spinner.display().to_string();
    let mut workload = python.spawn("python-exec", "exec.py", &[&spinner, "8"]);
    let scenario = windowed("exec relay", Some(workload.pid()), None);
    let read = exec_windows(&scenario, &mut workload);
    drop(scenario);

    let named = |w: &[FoldedStack]| {
        total_count(
            w.iter()
                .filter(|s| has_python(s, "exec.py", &["before_exec"])),
        )
    };
    let before_total = total_count(read.before.iter());
    let before_named = named(&read.before);
    let mut rows = vec![format!(
        "before the exec: {before_total} samples, before_exec {:.1}%",
        percent(before_named, before_total)
    )];
    for (i, (window, running)) in read.after.iter().enumerate() {
        let total = total_count(window);
        rows.push(format!(
            "window {i} after: {total} samples, before_exec {:.1}%, spinner {:.1}%, any Python \
             frame {:.1}%{}",
            percent(named(window), total),
            percent(total_count(window.iter().filter(|s| spins(s))), total),
            percent(
                total_count(window.iter().filter(|s| has_any_python(s))),
                total
            ),
            if *running {
                ""
            } else {
                " (read after the exit)"
            }
        ));
    }
    eprintln!("exec ({}):\n  {}", python.label, rows.join("\n  "));
    let mixed: Vec<&FoldedStack> = read
        .before
        .iter()
        .chain(read.after.iter().flat_map(|(w, _)| w))
        .filter(|s| spins(s) && has_any_python(s))
        .collect();
    assert!(
        mixed.is_empty(),
        "{}: stacks with both Python frames and the exec'd spinner's:\n{}",
        python.label,
        top(&mixed, 5)
    );
    assert!(
        before_total >= 200 && percent(before_named, before_total) >= MIN_NAMED * 100.0,
        "{}: before the exec only {before_named} of {before_total} samples carry \
         before_exec:\n  {}",
        python.label,
        rows.join("\n  ")
    );
    for window in last_two_running(&read.after, &rows) {
        let total = total_count(window.iter());
        let spinning = total_count(window.iter().filter(|s| spins(s)));
        let pythonic = total_count(window.iter().filter(|s| has_any_python(s)));
        assert_eq!(
            pythonic,
            0,
            "{}: after the exec into a C program, {pythonic} samples still carry Python \
             frames:\n  {}",
            python.label,
            rows.join("\n  ")
        );
        assert!(
            percent(spinning, total) >= MIN_NAMED * 100.0,
            "{}: after the exec only {spinning} of {total} samples carry the spinner's \
             functions:\n  {}",
            python.label,
            rows.join("\n  ")
        );
    }
}

#[test]
fn exec_from_python_into_a_native_program_pyenv_3_12() {
    exec_into_native(Source::Pyenv("3.12"));
}

#[test]
fn exec_from_python_into_a_native_program_pyenv_3_9() {
    exec_into_native(Source::Pyenv("3.9"));
}

/// exec.py burns in `before_exec` under `from`, then (told so by the test) execs `to`'s
/// interpreter running truth.py for 14 s: another CPython release, so another layout and root,
/// with the same pid and start time. Before the exec at least 90% of the samples carry
/// `before_exec`; no stack mixes the two programs' Python frames; the last two windows before
/// the exit carry truth.py's names in at least 90% of their samples and `before_exec` in none.
fn exec_into_python(from: Source, to: Source) {
    let Some(_lock) = ebpf_gate() else { return };
    let (Some(python), Some(next)) = (Python::find(from), Python::find(to)) else {
        return;
    };
    let truth_py = next.workload("truth.py");
    let next_exe = next.executable();
    let mut workload = python.spawn("python-exec", "exec.py", &[&next_exe, &truth_py, "14"]);
    let scenario = windowed("exec relay", Some(workload.pid()), None);
    let read = exec_windows(&scenario, &mut workload);
    drop(scenario);

    let old = |w: &[FoldedStack]| {
        total_count(
            w.iter()
                .filter(|s| has_python(s, "exec.py", &["before_exec"])),
        )
    };
    let new = |w: &[FoldedStack]| {
        total_count(w.iter().filter(|s| has_python(s, "truth.py", &TRUTH_NAMES)))
    };
    let before_total = total_count(read.before.iter());
    let mut rows = vec![format!(
        "before the exec: {before_total} samples, before_exec {:.1}%, truth.py {:.1}%",
        percent(old(&read.before), before_total),
        percent(new(&read.before), before_total)
    )];
    for (i, (window, running)) in read.after.iter().enumerate() {
        let total = total_count(window);
        rows.push(format!(
            "window {i} after: {total} samples, before_exec {:.1}%, truth.py {:.1}%{}",
            percent(old(window), total),
            percent(new(window), total),
            if *running {
                ""
            } else {
                " (read after the exit)"
            }
        ));
    }
    eprintln!(
        "exec ({} -> {}):\n  {}",
        python.label,
        next.label,
        rows.join("\n  ")
    );
    let mixed: Vec<&FoldedStack> = read
        .before
        .iter()
        .chain(read.after.iter().flat_map(|(w, _)| w))
        .filter(|s| {
            let frames = python_frames(s);
            frames.iter().any(|f| f.file == "exec.py")
                && frames.iter().any(|f| f.file == "truth.py")
        })
        .collect();
    assert!(
        mixed.is_empty(),
        "{} -> {}: stacks mix the Python frames of before and after the exec:\n{}",
        python.label,
        next.label,
        top(&mixed, 5)
    );
    assert!(
        before_total >= 200 && percent(old(&read.before), before_total) >= MIN_NAMED * 100.0,
        "{}: before the exec only {} of {before_total} samples carry before_exec:\n  {}",
        python.label,
        old(&read.before),
        rows.join("\n  ")
    );
    for window in last_two_running(&read.after, &rows) {
        let total = total_count(window.iter());
        assert_eq!(
            old(&window),
            0,
            "{}: before_exec after the exec:\n  {}",
            python.label,
            rows.join("\n  ")
        );
        assert!(
            percent(new(&window), total) >= MIN_NAMED * 100.0,
            "{} -> {}: after the exec only {} of {total} samples carry truth.py's names (the \
             new interpreter was not walked):\n  {}",
            python.label,
            next.label,
            new(&window),
            rows.join("\n  ")
        );
    }
}

#[test]
fn exec_from_python_3_9_into_python_3_12() {
    exec_into_python(Source::Pyenv("3.9"), Source::Pyenv("3.12"));
}

#[test]
fn exec_from_python_3_13_into_python_3_10() {
    exec_into_python(Source::Pyenv("3.13"), Source::Pyenv("3.10"));
}

// ---------------------------------------------------------------------------------------------
// Short-lived processes

/// Runs of short.py.
const SHORT_RUNS: u32 = 40;
/// Share of the short processes' expected samples (CPU time x frequency) that must be captured.
/// Measured before the walk existed (this test, 2026-11-27, a 2-CPU VM): 100.3% (3.7) with the
/// machine otherwise idle, but 79.5% and 80.4% (3.11) while other builds kept both CPUs busy,
/// and 70.8% then when recording everything instead of filtering; tests/tests/shortlived.rs gets
/// at least 95% for C processes of the same length. That loss under load is not the walk's and is not
/// closed here; 60% guards against the walk adding to it.
const MIN_SHORT_CAPTURED: f64 = 0.60;
/// Share of the long-lived witness's samples named over a whole `record` (10-20 s here): its
/// first second or two, before the relay has sent its layout, are not walked.
const MIN_WITNESS_NAMED_WHOLE: f64 = 0.70;

/// short.py started 40 times in a row under `source`, each living 50-80 ms of CPU (start-up
/// included), while a long-lived truth.py of the same interpreter runs beside them, recorded
/// system-wide at 499 Hz.
///
/// The threshold is what the design can meet: a process's facts reach the relay with the
/// sampler's next batch (once a second) and only then can the relay send the interpreter's
/// layout to the sampler, so a Python process that lives 50-80 ms has exited before its frames
/// can be walked; its Python frames may be absent (the named share is printed, not asserted).
/// What must hold: the short processes lose no more samples than before the walk (at least
/// [`MIN_SHORT_CAPTURED`] of their CPU time x the frequency, from wait4's rusage) and no stack
/// of theirs carries a Python frame of another process (truth.py's), nor truth.py's one of
/// theirs; and the long-lived truth.py beside them has at least 70% of its samples named over
/// the whole recording (the walk was on). The relay's `--process-filter` keeps the rest of the
/// machine out.
fn short_lived(source: Source) {
    const HZ: u32 = 499;
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let script = python.workload("short.py");
    let mut witness = python.spawn("python-witness", "truth.py", &["120"]);
    let mut record = Scenario::new("short-lived record")
        .relay_args(["--duration", "300s", "--frequency", &HZ.to_string()])
        .relay_args([
            "--format",
            "folded",
            "--process-filter",
            "python-short|python-witness",
        ])
        .record();
    record.first_batch(RECORD_TIMEOUT);
    let mut cpu = Duration::ZERO;
    for i in 0..SHORT_RUNS {
        let ms = (50 + (i * 7) % 31).to_string();
        let mut command = python.command_as(Some("python-short"), &[&script, &ms]);
        command.stdout(std::process::Stdio::null());
        let child = ChildGuard::spawn("python-short", &mut command);
        cpu += wait4_cpu(child.pid());
    }
    assert!(
        record.child.try_wait().is_none(),
        "the record ended before the short processes did: raise --duration"
    );
    // Two intervals for their last samples to reach the relay, then Ctrl-C: record writes all.
    std::thread::sleep(Duration::from_secs(2));
    record.child.signal(Signal::SIGINT);
    let folded = record.finish(RECORD_TIMEOUT);
    witness.child.signal(Signal::SIGTERM);
    let _ = witness.wait_for_line("alpha", EXIT_TIMEOUT);

    let stacks = parse_folded(&folded);
    let short = of_process(&stacks, "python-short");
    let captured = total_count(short.iter().copied());
    let named = total_count(
        short
            .iter()
            .copied()
            .filter(|s| has_python(s, "short.py", &["<module>", "short_burn"])),
    );
    let foreign: Vec<&FoldedStack> = short
        .iter()
        .copied()
        .filter(|s| python_frames(s).iter().any(|f| f.file == "truth.py"))
        .chain(
            of_process(&stacks, "python-witness")
                .into_iter()
                .filter(|s| python_frames(s).iter().any(|f| f.file == "short.py")),
        )
        .collect();
    let expected = cpu.as_secs_f64() * f64::from(HZ);
    eprintln!(
        "short-lived row: {:<20} {SHORT_RUNS} runs, {:.3} s of CPU: {expected:.0} samples \
         expected, {captured} captured ({:.1}%), {named} with short.py's names ({:.1}%)",
        python.label,
        cpu.as_secs_f64(),
        100.0 * captured as f64 / expected.max(1.0),
        percent(named, captured)
    );
    let mut by_process: BTreeMap<&str, u64> = BTreeMap::new();
    for stack in &stacks {
        *by_process.entry(stack.process.as_str()).or_default() += stack.count;
    }
    assert!(
        captured as f64 >= MIN_SHORT_CAPTURED * expected,
        "{}: {captured} samples of the short-lived Python processes, expected {expected:.0} \
         (their CPU time x {HZ} Hz): under {:.0}%; samples by process: {by_process:?}",
        python.label,
        MIN_SHORT_CAPTURED * 100.0
    );
    // The walk was on meanwhile: the long-lived witness is named from its first seconds on.
    let honest = of_process(&stacks, "python-witness");
    let t = Truth::of(&honest);
    eprintln!(
        "short-lived witness: {} samples, {:.1}% named",
        t.total,
        percent(t.named, t.total)
    );
    assert!(
        percent(t.named, t.total) >= MIN_WITNESS_NAMED_WHOLE * 100.0,
        "{}: the long-lived truth.py beside the short processes has only {} of {} samples \
         named over the whole recording",
        python.label,
        t.named,
        t.total
    );
    assert!(
        foreign.is_empty(),
        "{}: stacks carry another process's Python frames:\n{}",
        python.label,
        top(&foreign, 5)
    );
}

/// Reaps child `pid` and returns the CPU time (user + system) its whole life used, from
/// wait4's rusage (microseconds, not /proc's clock ticks).
fn wait4_cpu(pid: u32) -> Duration {
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let raw = i32::try_from(pid).expect("pid fits i32");
    // SAFETY: wait4 on our own child with valid pointers to locals.
    let rc = unsafe { libc::wait4(raw, &mut status, 0, &mut usage) };
    assert_eq!(rc, raw, "wait4({pid}) failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "short.py exited with status {status:#x}"
    );
    let micros = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

#[test]
fn short_lived_python_processes_pyenv_3_11() {
    short_lived(Source::Pyenv("3.11"));
}

#[test]
fn short_lived_python_processes_pyenv_3_7() {
    short_lived(Source::Pyenv("3.7"));
}

// ---------------------------------------------------------------------------------------------
// Hostile Python processes

/// hostile.py in `mode` (a frame chain that loops on itself, one that leads into a forged
/// frame, a 1 MiB function and file name) runs beside an honest truth.py of the same
/// interpreter, the whole machine profiled. The relay and the sampler keep running; the
/// hostile process is still sampled (at least 50 samples), each of its stacks holds at most 64
/// Python frames and no name or file name over 1 KiB; with the big name, the function still
/// appears (truncated) in at least half its samples; the honest witness keeps at least 90% of
/// its samples named.
fn hostile(source: Source, mode: &str) {
    let Some(_lock) = ebpf_gate() else { return };
    let Some(python) = Python::find(source) else {
        return;
    };
    let mut witness = python.spawn("python-witness", "truth.py", &["120"]);
    let hostile = python.spawn("python-hostile", "hostile.py", &[mode, "120"]);
    let mut scenario = windowed("hostile relay", None, Some("python-witness|python-hostile"));
    let mut windows = Windows::new(&scenario.out_dir());
    let stacks = steady_stacks(&scenario, &mut windows, "python-witness");
    assert!(
        scenario.relay.child.try_wait().is_none(),
        "the relay died:\n{}",
        tail(&scenario.log().text(), 40)
    );
    let sampler_alive = scenario.sampler().child.try_wait().is_none();
    assert!(sampler_alive, "the sampler died");
    drop(hostile);
    witness.child.signal(Signal::SIGTERM);
    let _ = witness.wait_for_line("alpha", EXIT_TIMEOUT);
    drop(scenario);

    let honest = of_process(&stacks, "python-witness");
    let t = Truth::of(&honest);
    let bad = of_process(&stacks, "python-hostile");
    let bad_total = total_count(bad.iter().copied());
    // Named or not: every frame the walk gave counts against its bound.
    let deepest = bad.iter().map(|s| python_depth(s)).max().unwrap_or(0);
    let longest = bad
        .iter()
        .flat_map(|s| python_frames(s))
        .map(|f| f.name.len().max(f.file.len()))
        .max()
        .unwrap_or(0);
    let big_named = total_count(bad.iter().copied().filter(|s| {
        python_frames(s)
            .iter()
            .any(|f| f.name.starts_with("fxxxxxxxx"))
    }));
    eprintln!(
        "hostile row: {:<20} {mode:<8} witness {} samples, {:.1}% named; hostile {bad_total} \
         samples, deepest {deepest} Python frames, longest name {longest} bytes, big name in \
         {:.1}%",
        python.label,
        t.total,
        percent(t.named, t.total),
        percent(big_named, bad_total)
    );
    assert!(
        bad_total >= 50,
        "{}: the hostile process got only {bad_total} samples: was it dropped?",
        python.label
    );
    assert!(
        deepest <= MAX_PYTHON_FRAMES,
        "{}: a stack of the hostile process holds {deepest} Python frames (at most \
         {MAX_PYTHON_FRAMES})",
        python.label
    );
    assert!(
        longest <= MAX_NAME_BYTES,
        "{}: a Python name or file name of {longest} bytes reached the output",
        python.label
    );
    if mode == "bigname" {
        assert!(
            percent(big_named, bad_total) >= 50.0,
            "{}: the function with the 1 MiB name is in only {big_named} of {bad_total} \
             samples; most common stacks:\n{}",
            python.label,
            top(&bad, 5)
        );
    }
    assert!(
        t.total >= 200 && percent(t.named, t.total) >= MIN_NAMED * 100.0,
        "{}: the honest witness beside the hostile process has {} of {} samples named; most \
         common stacks:\n{}",
        python.label,
        t.named,
        t.total,
        top(&honest, 8)
    );
}

#[test]
fn hostile_frame_cycle_pyenv_3_12() {
    hostile(Source::Pyenv("3.12"), "cycle");
}

#[test]
fn hostile_frame_cycle_pyenv_3_9() {
    hostile(Source::Pyenv("3.9"), "cycle");
}

#[test]
fn hostile_forged_frame_pyenv_3_12() {
    hostile(Source::Pyenv("3.12"), "wild");
}

#[test]
fn hostile_forged_frame_pyenv_3_9() {
    hostile(Source::Pyenv("3.9"), "wild");
}

#[test]
fn hostile_forged_frame_debian_sid_3_14() {
    hostile(Source::Root("sid"), "wild");
}

#[test]
fn hostile_1_mib_name_pyenv_3_12() {
    hostile(Source::Pyenv("3.12"), "bigname");
}

#[test]
fn hostile_1_mib_name_pyenv_3_9() {
    hostile(Source::Pyenv("3.9"), "bigname");
}

// ---------------------------------------------------------------------------------------------
// The counting itself, without root: windows written as the relay writes Python frames

/// What the truth tests count, on a window in the relay's text for Python frames: named
/// samples, the alpha/beta leaves, the exact chain and the native root.
#[test]
fn the_truth_counts_read_python_frames_as_the_relay_writes_them() {
    let folded = "\
python-truth;_start;Py_BytesMain;<module> (truth.py:70);outer (truth.py:48);alpha (truth.py:30) 30
python-truth;_start;Py_BytesMain;<module> (truth.py:70);outer (truth.py:48);beta (truth.py:39);PyLong_FromLong 60
python-truth;_start;<module> (truth.py:70);outer (truth.py:48);outer (truth.py:48);beta (truth.py:39) 3
python-truth;_start;Py_BytesMain;<module> (truth.py:70);outer (truth.py:48) 2
python-truth;_start;Py_BytesMain;[unknown] python;_PyEval_EvalFrameDefault 5
other;main 7
";
    let stacks = parse_folded(folded);
    let t = Truth::of(&of_process(&stacks, "python-truth"));
    assert_eq!(
        (t.total, t.named, t.alpha, t.beta, t.chained, t.native_root),
        (100, 95, 30, 63, 90, 95)
    );
}

/// What the C-extension tests count: a native frame under its Python caller, and not when a
/// Python frame sits on its leaf side or another function is the innermost Python frame.
#[test]
fn native_frames_count_under_their_python_caller_only_with_it_on_the_root_side() {
    let folded = "\
python-cext;_start;<module> (cext.py:35);compress_loop (cext.py:21);zlib_compress;deflate;deflate_slow 10
python-cext;_start;<module> (cext.py:35);zlib_compress;deflate;compress_loop (cext.py:21) 3
python-cext;_start;<module> (cext.py:35);hash_loop (cext.py:27);deflate 2
python-cext;_start;<module> (cext.py:35);hash_loop (cext.py:27);EVP_DigestUpdate;SHA256_Update 4
";
    let stacks = parse_folded(folded);
    let ours = of_process(&stacks, "python-cext");
    assert_eq!(under_caller(&ours, is_zlib, "compress_loop"), (15, 10));
    assert_eq!(under_caller(&ours, is_sha, "hash_loop"), (4, 4));
}
