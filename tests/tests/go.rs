//! Go frames against the truth: the real sampler and relay record a Go workload
//! (tests/workloads/go/truth.go: main.main -> main.middleLevel -> main.hotLoop, a frameless
//! leaf, or main.coldLoop, a leaf with a frame, in a split the workload measures itself) built
//! by each Go toolchain of the machine (`ember_tests::golang`: the host's Go 1.19, trixie's Go
//! 1.24), unstripped and stripped (`-ldflags='-s -w'`: no symbol table, no DWARF), with
//! `ember-relay record --pid`.
//!
//! Each must show, from the binary's own Go table (`.gopclntab`), the hot functions named in at
//! least 90% of the process's samples, the whole chain main.main -> main.middleLevel -> leaf in
//! at least 90% of the leaves' samples (the frameless leaf too: its rows come from the table's
//! stack-pointer deltas; a frame-pointer walk skips main.middleLevel there), and the
//! hotLoop/coldLoop split within 5 points of the workload's. A missing toolchain fails under
//! `CI` or `EMBER_REQUIRE_ALL` and is a printed skip otherwise.
//!
//! The workload burns in main.warmup until the test sends it SIGUSR1, which it does once the
//! relay has sent the workload's unwind table: samples taken before (one handover at least)
//! were walked by frame pointers, and the steady state is what the chain assertion is about.
//! Warm-up samples count as named (main.warmup), not as leaves.
//!
//! They load eBPF: root, one at a time, under the machine-wide lock (build first):
//!
//! ```text
//! cargo build && flock /tmp/ember-ebpf.lock \
//!   cargo test -p ember-tests --test go -- --test-threads=1 --nocapture
//! ```
//!
//! No test asserts speed; timeouts only keep a broken build from hanging. Each prints one row
//! (`go truth row:`) with the figures it asserts on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ember_tests::{golang::Toolchain, scenario::ebpf_gate, *};

/// Samples per second on each CPU.
const FREQUENCY: &str = "499";
/// How long `record` runs.
const DURATION: &str = "8s";
const INTERVAL: &str = "250ms";
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Share of the process's samples that must name a hot function.
const MIN_NAMED: f64 = 0.90;
/// Share of the leaves' samples that must carry the whole chain.
const MIN_CHAIN: f64 = 0.90;
/// Largest difference between the measured hot/cold split and the workload's, in percentage
/// points (about 3000 leaf samples: the split's standard error is under 1 point).
const MAX_SPLIT_ERROR_PP: f64 = 5.0;

const CHAIN: [&str; 2] = ["main.main", "main.middleLevel"];
const LEAVES: [&str; 2] = ["main.hotLoop", "main.coldLoop"];
/// Where the workload burns before SIGUSR1.
const WARMUP: &str = "main.warmup";

/// What one recording measured.
#[derive(Debug, Default)]
struct Truth {
    total: u64,
    named: u64,
    hot: u64,
    cold: u64,
    chained: u64,
}

impl Truth {
    fn of(stacks: &[FoldedStack], process: &str) -> Self {
        let mut t = Self::default();
        for stack in stacks.iter().filter(|s| s.process == process) {
            t.total += stack.count;
            if stack
                .frames
                .iter()
                .any(|f| LEAVES.contains(&f.as_str()) || f == WARMUP)
            {
                t.named += stack.count;
            }
            let user: Vec<&str> = stack.user_frames().collect();
            match user.last().copied() {
                Some("main.hotLoop") => t.hot += stack.count,
                Some("main.coldLoop") => t.cold += stack.count,
                _ => continue,
            }
            if user.len() >= 3 && user[user.len() - 3..user.len() - 1] == CHAIN {
                t.chained += stack.count;
            }
        }
        t
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    100.0 * part as f64 / whole.max(1) as f64
}

/// The most common stacks of `process` (for failure messages).
fn top(stacks: &[FoldedStack], process: &str, n: usize) -> String {
    let mut ours: Vec<&FoldedStack> = stacks.iter().filter(|s| s.process == process).collect();
    ours.sort_by_key(|s| std::cmp::Reverse(s.count));
    ours.iter()
        .take(n)
        .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Builds truth.go with `toolchain` (stripped or not) as `name`, records it by pid, and checks
/// names, chain and split (see the module doc).
fn truth(toolchain: Toolchain, stripped: bool, name: &str) {
    let Some(_lock) = ebpf_gate() else { return };
    if !toolchain.available() {
        return;
    }
    let binary = toolchain.build("truth", name, stripped);
    let workload = spawn_workload(&binary, 120);
    let pid = workload.pid().to_string();
    let run = spawn_record(&[
        "--log-format",
        "json",
        "--duration",
        DURATION,
        "--frequency",
        FREQUENCY,
        "--interval",
        INTERVAL,
        "--format",
        "folded",
        "--pid",
        &pid,
    ]);
    run.log()
        .expect(0, RECORD_TIMEOUT, "the workload's unwind table sent", |l| {
            message(l).starts_with("unwind tables sent")
                && field_u64(l, "compiled").unwrap_or(0) + field_u64(l, "cache_hits").unwrap_or(0)
                    >= 1
        });
    workload.signal(nix::sys::signal::Signal::SIGUSR1);
    let recorded = run.finish_writing(RECORD_TIMEOUT, &["stacks.folded"]);
    let (_, stdout) = workload.terminate_and_read_stdout(EXIT_TIMEOUT);
    let measured: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary line from the workload: {stdout:?}"));
    let truth_hot = measured["hot"].as_f64().expect("the workload's hot share");

    let stacks = recorded.folded();
    let t = Truth::of(&stacks, name);
    let split = t.hot as f64 / (t.hot + t.cold).max(1) as f64;
    let error_pp = (split - truth_hot) * 100.0;
    let (named, chain) = (
        percent(t.named, t.total),
        percent(t.chained, t.hot + t.cold),
    );
    eprintln!(
        "go truth row: {:<16} stripped={stripped:<5} samples {:>5}  named {named:>5.1}%  chain \
         {chain:>5.1}%  hot {:>5.1}% (truth {:>5.1}%) error {error_pp:>+5.1} pp",
        toolchain.label(),
        t.total,
        split * 100.0,
        truth_hot * 100.0,
    );
    assert!(
        t.total >= 500,
        "{}: only {} samples of {name}; is the machine overloaded?\n{}",
        toolchain.label(),
        t.total,
        top(&stacks, name, 8)
    );
    assert!(
        named >= MIN_NAMED * 100.0,
        "{} stripped={stripped}: only {named:.1}% of the samples name {LEAVES:?} or {WARMUP}; \
         most common stacks:\n{}",
        toolchain.label(),
        top(&stacks, name, 8)
    );
    assert!(
        chain >= MIN_CHAIN * 100.0,
        "{} stripped={stripped}: only {chain:.1}% of the leaves' samples carry {CHAIN:?} -> \
         leaf; most common stacks:\n{}",
        toolchain.label(),
        top(&stacks, name, 8)
    );
    assert!(
        error_pp.abs() <= MAX_SPLIT_ERROR_PP,
        "{} stripped={stripped}: hotLoop has {:.1}% of the leaves' samples ({} of {}), the \
         workload measured {:.1}%: {error_pp:+.1} points",
        toolchain.label(),
        split * 100.0,
        t.hot,
        t.hot + t.cold,
        truth_hot * 100.0
    );
}

/// Go 1.19 (the host's), with its symbol table and DWARF.
#[test]
fn go_1_19_unstripped_is_named_and_unwound_whole() {
    truth(Toolchain::Host, false, "gotruth119");
}

/// Go 1.19, `-ldflags='-s -w'`: named from `.gopclntab` alone.
#[test]
fn go_1_19_stripped_is_named_and_unwound_whole() {
    truth(Toolchain::Host, true, "gotruth119s");
}

/// Go 1.24 (trixie's), with its symbol table and DWARF.
#[test]
fn go_1_24_unstripped_is_named_and_unwound_whole() {
    truth(Toolchain::Trixie, false, "gotruth124");
}

/// Go 1.24, `-ldflags='-s -w'`.
#[test]
fn go_1_24_stripped_is_named_and_unwound_whole() {
    truth(Toolchain::Trixie, true, "gotruth124s");
}
