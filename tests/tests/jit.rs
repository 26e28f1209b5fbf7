//! JIT frames named from perf maps against the truth: the real sampler and relay (`ember-relay
//! record --pid`) profile workloads of JIT runtimes that write a perf map (tests/workloads/jit,
//! tests/workloads/python/truth.py): two hot functions in a known split under a named caller.
//! The hot functions must be named, as JIT frames (`_[j]`), in at least 80% of the process's
//! samples, in the split the workload measured itself.
//!
//! Runtimes: Node with `--perf-basic-prof` (the host's, Node 20 in the trixie root, 24 in sid),
//! CPython with `-X perf` (pyenv 3.12, Debian 3.13 in trixie, 3.14 in sid), the JVM after
//! `jcmd PID Compiler.perfmap` (the host's 17, 21 in trixie, 25 in sid: run with /proc bound in
//! the root, in a mount namespace of its own). The roots are `scripts/python-roots.sh`'s. A
//! missing runtime fails under `CI` or `EMBER_REQUIRE_ALL=1` and is a printed skip otherwise.
//!
//! Then processes that lie with their perf maps (owned by another user, a symlink to a
//! root-only file, a `/tmp` that is a symlink, larger than the sampler passes, garbage lines):
//! each is refused or bounded and counted, an honest process beside them keeps its names, and
//! the relay keeps running. And 50 processes with a 20 MB perf map each: the relay's peak RSS
//! stays within the JIT store's budget (relay/src/jit/mod.rs).
//!
//! They load eBPF: root, one at a time, under the machine-wide lock (build first):
//!
//! ```text
//! cargo build && flock /tmp/ember-ebpf.lock \
//!   cargo test -p ember-tests --test jit -- --test-threads=1 --nocapture
//! ```
//!
//! Timeouts only keep a broken build from hanging; no test asserts speed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use ember_tests::{
    attack::tail,
    python::{Python, Source},
    *,
};
use nix::sys::signal::Signal;

const FREQUENCY: &str = "199";
/// Recorded once the workload is warm.
const RECORD: &str = "6s";
const RECORD_TIMEOUT: Duration = Duration::from_secs(180);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Warm-up before recording: the JIT compiles the hot functions (and for the JVM, before the
/// perf map is written).
const WARM_UP: Duration = Duration::from_secs(3);
/// Share of the process's samples that must name a hot function as a JIT frame.
const MIN_NAMED: f64 = 0.80;
/// Largest difference between the measured split and the workload's own, in percentage
/// points (about 1,000 samples: the standard error is 1.5 points).
const MAX_SPLIT_ERROR_PP: f64 = 8.0;

fn roots_dir() -> PathBuf {
    std::env::var_os("EMBER_PYTHON_ROOTS")
        .map_or_else(|| PathBuf::from("/var/cache/ember/roots"), PathBuf::from)
}

const INSTALL: &str = "install nodejs and openjdk-17-jdk-headless on the host, pyenv's 3.12, and \
                       run `sudo scripts/python-roots.sh` (nodejs and openjdk-21/25-jdk-headless \
                       in the trixie and sid roots)";

/// Where a runtime comes from: the host, or a Debian root (entered with chroot).
#[derive(Clone, Copy, Debug)]
enum Place {
    Host,
    Root(&'static str),
}

impl Place {
    fn root(self) -> Option<PathBuf> {
        match self {
            Self::Host => None,
            Self::Root(suite) => Some(roots_dir().join(suite)),
        }
    }

    /// The directory workloads are copied to, as the host sees it, and as the process does.
    fn dirs(self) -> (PathBuf, PathBuf) {
        let own = PathBuf::from("/tmp/ember-test-workloads/jit");
        match self.root() {
            Some(root) => (root.join(own.strip_prefix("/").unwrap()), own),
            None => (target_dir().join("ember-test-workloads/jit"), {
                target_dir().join("ember-test-workloads/jit")
            }),
        }
    }

    /// A host path of `exe` (absolute, as seen inside the place), when it exists.
    fn has(self, exe: &str) -> bool {
        match self.root() {
            Some(root) if exe.starts_with('/') => root.join(&exe[1..]).exists(),
            Some(root) => root.join("usr/bin").join(exe).exists(),
            None => Command::new("sh")
                .args(["-c", &format!("command -v {exe}")])
                .output()
                .is_ok_and(|o| o.status.success()),
        }
    }

    /// A command running `args` there: chroot for a root, in a mount namespace of its own with
    /// /proc bound inside (the JVM reads /proc/self); `unshare` execs, so the pid is the
    /// runtime's.
    fn command(self, args: &[&str]) -> Command {
        match self.root() {
            None => {
                let mut command = Command::new(args[0]);
                command.args(&args[1..]);
                command
            }
            Some(root) => {
                let mut command = Command::new("unshare");
                command
                    .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .arg("mount --bind /proc \"$0/proc\" && exec chroot \"$0\" \"$@\"")
                    .arg(root)
                    .args(args);
                command
            }
        }
    }

    fn label(self) -> String {
        match self {
            Self::Host => "host".into(),
            Self::Root(suite) => format!("Debian {suite}"),
        }
    }
}

/// Copies tests/workloads/`rel` to the place's workload dir; returns its path as the process
/// sees it.
fn copy_workload(place: Place, rel: &str) -> String {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(rel);
    let (host, own) = place.dirs();
    fs::create_dir_all(&host).expect("creating the workload dir");
    fs::set_permissions(&host, fs::Permissions::from_mode(0o755)).expect("chmod");
    let name = source.file_name().unwrap();
    let tmp = host.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    fs::copy(&source, &tmp).expect("copying the workload");
    fs::rename(&tmp, host.join(name)).expect("renaming the workload");
    own.join(name).display().to_string()
}

/// A running truth workload: its `ready` line was read.
struct Workload {
    child: ChildGuard,
    stdout: LogReader,
}

impl Workload {
    fn spawn(name: &str, mut command: Command) -> Self {
        // (node writes an isolate log into its working directory on some flags)
        command
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        eprintln!("running {command:?}");
        let mut child = ChildGuard::spawn(name, &mut command);
        let stdout = LogReader::spawn(name, child.child_mut().stdout.take().unwrap());
        stdout.expect(0, READY_TIMEOUT, "ready line", |v| v["ready"] == true);
        Self { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Stops it (SIGTERM) and returns alpha's share of alpha + beta, as it measured it.
    fn truth(mut self) -> f64 {
        self.child.signal(Signal::SIGTERM);
        self.child.wait_timeout(Duration::from_secs(30));
        self.stdout.wait_closed(Duration::from_secs(5));
        self.stdout
            .json()
            .into_iter()
            .rev()
            .find_map(|(_, v)| v["alpha"].as_f64())
            .unwrap_or_else(|| panic!("no split printed:\n{}", self.stdout.text()))
    }
}

/// What a recording says of one workload's JIT frames.
#[derive(Debug, Default)]
struct Named {
    samples: u64,
    alpha: u64,
    beta: u64,
    with_caller: u64,
}

impl Named {
    fn named(&self) -> u64 {
        self.alpha + self.beta
    }

    fn share(&self) -> f64 {
        self.named() as f64 / self.samples.max(1) as f64
    }
}

/// The names a runtime's perf map gives the workload's functions (substrings of the JIT
/// frames' names).
struct Names {
    alpha: &'static str,
    beta: &'static str,
    caller: &'static str,
}

const NODE: Names = Names {
    alpha: "hotAlpha ",
    beta: "hotBeta ",
    caller: "outerCaller ",
};
const JVM: Names = Names {
    alpha: "Truth.hotAlpha(",
    beta: "Truth.hotBeta(",
    caller: "Truth.outerCaller(",
};
const PYTHON: Names = Names {
    alpha: "py::alpha:",
    beta: "py::beta:",
    caller: "py::outer:",
};

fn is_jit(frame: &str) -> bool {
    frame.ends_with("_[j]")
}

/// Counts the samples of `stacks` whose JIT frames name alpha or beta (the innermost of them
/// decides), and those with the caller's JIT frame too.
fn count(stacks: &[FoldedStack], names: &Names) -> Named {
    let mut named = Named::default();
    for stack in stacks {
        named.samples += stack.count;
        let leafmost = stack
            .frames
            .iter()
            .rev()
            .find(|f| is_jit(f) && (f.contains(names.alpha) || f.contains(names.beta)));
        match leafmost {
            Some(f) if f.contains(names.alpha) => named.alpha += stack.count,
            Some(_) => named.beta += stack.count,
            None => continue,
        }
        if stack
            .frames
            .iter()
            .any(|f| is_jit(f) && f.contains(names.caller))
        {
            named.with_caller += stack.count;
        }
    }
    named
}

/// Records `workload` with `record --pid` and checks its JIT frames against its truth.
fn check_truth(label: &str, workload: Workload, names: &Names) {
    let pid = workload.pid().to_string();
    let recorded = spawn_record(&[
        "--pid",
        &pid,
        "--duration",
        RECORD,
        "--frequency",
        FREQUENCY,
        "--format",
        "folded",
    ])
    .finish_writing(RECORD_TIMEOUT, &["stacks.folded"]);
    let truth = workload.truth();
    let stacks = recorded.folded();
    let named = count(&stacks, names);
    let alpha = 100.0 * named.alpha as f64 / named.named().max(1) as f64;
    let error = alpha - 100.0 * truth;
    let top = {
        let mut sorted: Vec<&FoldedStack> = stacks.iter().collect();
        sorted.sort_by_key(|s| std::cmp::Reverse(s.count));
        sorted
            .iter()
            .take(6)
            .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
            .collect::<Vec<_>>()
            .join("\n")
    };
    eprintln!(
        "truth row: | {label} | {} samples | named {:.1}% | alpha {alpha:.1}% (truth {:.1}%) | \
         error {error:+.1} pp | caller {:.1}% |",
        named.samples,
        100.0 * named.share(),
        100.0 * truth,
        100.0 * named.with_caller as f64 / named.named().max(1) as f64,
    );
    assert!(named.samples >= 200, "{label}: too few samples:\n{top}");
    assert!(
        named.share() >= MIN_NAMED,
        "{label}: the hot functions are named in {:.1}% of the samples (< {:.0}%):\n{top}",
        100.0 * named.share(),
        100.0 * MIN_NAMED
    );
    assert!(
        error.abs() <= MAX_SPLIT_ERROR_PP,
        "{label}: alpha's share {alpha:.1}% is {error:+.1} pp off the truth"
    );
}

// ---------------------------------------------------------------------------------------------
// Node

fn node_truth(place: Place) {
    if !privileged() {
        return;
    }
    if !place.has("node") {
        skip(&format!("no node in {}: {INSTALL}", place.label()));
        return;
    }
    let _lock = ebpf_lock();
    let script = copy_workload(place, "jit/truth.js");
    let command = place.command(&[
        "node",
        "--perf-basic-prof",
        "--no-turbo-inlining",
        &script,
        "120",
    ]);
    let workload = Workload::spawn("node", command);
    std::thread::sleep(WARM_UP);
    let version = place
        .command(&["node", "--version"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    check_truth(
        &format!("Node {version} ({})", place.label()),
        workload,
        &NODE,
    );
}

#[test]
fn truth_node_host() {
    node_truth(Place::Host);
}

#[test]
fn truth_node_debian_trixie() {
    node_truth(Place::Root("trixie"));
}

#[test]
fn truth_node_debian_sid() {
    node_truth(Place::Root("sid"));
}

// ---------------------------------------------------------------------------------------------
// CPython -X perf

fn python_truth(source: Source) {
    if !privileged() {
        return;
    }
    let Some(python) = Python::find(source) else {
        return;
    };
    let _lock = ebpf_lock();
    let script = python.workload("truth.py");
    let command = python.command_as(None, &["-X", "perf", &script, "120"]);
    let workload = Workload::spawn("python", command);
    std::thread::sleep(WARM_UP);
    check_truth(&format!("CPython {}", python.label), workload, &PYTHON);
}

#[test]
fn truth_python_pyenv_3_12() {
    python_truth(Source::Pyenv("3.12"));
}

#[test]
fn truth_python_debian_trixie_3_13() {
    python_truth(Source::Root("trixie"));
}

#[test]
fn truth_python_debian_sid_3_14() {
    python_truth(Source::Root("sid"));
}

// ---------------------------------------------------------------------------------------------
// The JVM, after jcmd PID Compiler.perfmap

fn jvm_truth(place: Place, java: &str) {
    if !privileged() {
        return;
    }
    if !place.has(java) || !place.has("jcmd") {
        skip(&format!("no {java} in {}: {INSTALL}", place.label()));
        return;
    }
    let Some(javac) = Place::Host.has("javac").then_some("javac") else {
        skip(&format!("no javac on the host: {INSTALL}"));
        return;
    };
    let _lock = ebpf_lock();
    let source = copy_workload(place, "jit/Truth.java");
    let (host_dir, own_dir) = place.dirs();
    // Compiled by the host's JDK 17 for release 17: every later JVM runs it.
    let status = Command::new(javac)
        .args(["--release", "17", "-d"])
        .arg(&host_dir)
        .arg(host_dir.join("Truth.java"))
        .status()
        .expect("running javac");
    assert!(status.success(), "javac failed for {source}");
    let classes = own_dir.display().to_string();
    let command = place.command(&[
        java,
        "-XX:+PreserveFramePointer",
        "-XX:CompileCommand=quiet",
        "-XX:CompileCommand=dontinline,Truth::hot*",
        "-cp",
        &classes,
        "Truth",
        "120",
    ]);
    let workload = Workload::spawn("java", command);
    std::thread::sleep(WARM_UP);
    // The place's own jcmd: it finds the JVM's attach socket in the /tmp they share.
    let pid = workload.pid().to_string();
    let out = place
        .command(&["jcmd", &pid, "Compiler.perfmap"])
        .output()
        .expect("running jcmd");
    assert!(
        out.status.success(),
        "jcmd Compiler.perfmap failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let version = place
        .command(&[java, "-version"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default();
    check_truth(&format!("{version} ({})", place.label()), workload, &JVM);
}

#[test]
fn truth_jvm_host_17() {
    jvm_truth(Place::Host, "java");
}

#[test]
fn truth_jvm_debian_trixie_21() {
    jvm_truth(Place::Root("trixie"), "/usr/bin/java");
}

#[test]
fn truth_jvm_debian_sid_25() {
    jvm_truth(Place::Root("sid"), "/usr/bin/java");
}

// ---------------------------------------------------------------------------------------------
// Hostile perf maps

/// The value of `key` in the last "batch received" line of a record's JSON log.
fn last_batch_counter(log: &str, key: &str) -> u64 {
    log.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(is_batch)
        .find_map(|v| batch_counter(&v, key))
        .unwrap_or(0)
}

/// A CPython 3.12 `-X perf` process named `name` running truth.py.
fn python_perf(python: &Python, name: &str) -> Workload {
    let script = python.workload("truth.py");
    let command = python.command_as(Some(name), &["-X", "perf", &script, "120"]);
    Workload::spawn(name, command)
}

/// The host's node under the name `name` (a hard link: the same file, another name for the
/// process) running truth.js with `--perf-basic-prof`.
fn node_as(name: &str) -> Workload {
    let (dir, _) = Place::Host.dirs();
    let script = copy_workload(Place::Host, "jit/truth.js");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).expect("bin dir");
    let link = bin.join(name);
    let _ = fs::remove_file(&link);
    let node = fs::canonicalize(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("node"))
            .find(|p| p.exists())
            .expect("node on PATH"),
    )
    .expect("resolve node");
    fs::hard_link(&node, &link).expect("hard-link node (same file system as target/)");
    let mut command = Command::new(&link);
    command.args(["--perf-basic-prof", "--no-turbo-inlining", &script, "120"]);
    Workload::spawn(name, command)
}

fn perf_map(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

#[test]
fn hostile_perf_maps_are_refused_or_bounded_and_counted_and_spoil_nothing_else() {
    if !privileged() {
        return;
    }
    if !Place::Host.has("node") {
        skip(&format!("no node on the host: {INSTALL}"));
        return;
    }
    let Some(python) = Python::find(Source::Pyenv("3.12")) else {
        return;
    };
    let _lock = ebpf_lock();
    // Given an honest Node process, and Node processes whose perf maps are: owned by another
    // user; a symlink to a root-only file; larger than the sampler passes (1 GiB, sparse);
    // a CPython -X perf process whose map (appended to, never rewritten) is full of garbage and
    // over-long lines; and one whose /tmp is a symlink (a static program chrooted in a root
    // whose tmp points elsewhere; it maps an anonymous executable page, as a JIT does, since the
    // sampler looks for a perf map only in a process that has one)
    let victim = node_as("jitvictim");
    let owned = node_as("jitowned");
    let linked = node_as("jitlinked");
    let huge = node_as("jithuge");
    let garbage = python_perf(&python, "jitgarbage");
    nix::unistd::chown(
        &perf_map(owned.pid()),
        Some(nix::unistd::Uid::from_raw(65534)),
        None,
    )
    .expect("chown the map");
    let secret = target_dir().join("ember-jit-secret");
    fs::write(&secret, "0 ffffffffffff secret\n").expect("write the secret");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::remove_file(perf_map(linked.pid())).expect("remove the map");
    std::os::unix::fs::symlink(&secret, perf_map(linked.pid())).expect("symlink");
    fs::File::options()
        .write(true)
        .open(perf_map(huge.pid()))
        .and_then(|f| f.set_len(1 << 30))
        .expect("grow the map to 1 GiB (sparse)");
    let mut junk = String::new();
    for i in 0..2_000u32 {
        junk.push_str(&format!("zz{i} not hex\n\u{1b}[2J\u{0}\u{7f}\n"));
    }
    junk.push_str(&"7f00 10 ".repeat(100_000));
    junk.push('\n');
    fs::OpenOptions::new()
        .append(true)
        .open(perf_map(garbage.pid()))
        .and_then(|mut f| std::io::Write::write_all(&mut f, junk.as_bytes()))
        .expect("append garbage");
    let root = tempfile::Builder::new()
        .prefix("ember-jit-root-")
        .tempdir()
        .expect("temp root");
    let spinner = root.path().join("spin");
    let status = Command::new("cc")
        .args(["-static", "-O1", "-x", "c", "-o"])
        .arg(&spinner)
        .arg("-")
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            std::io::Write::write_all(
                c.stdin.as_mut().unwrap(),
                b"#include <sys/mman.h>\nint main(void){mmap(0,4096,PROT_READ|PROT_EXEC,\
                  MAP_PRIVATE|MAP_ANONYMOUS,-1,0);volatile unsigned long x=0;for(;;)x++;}",
            )?;
            c.wait()
        })
        .expect("cc -static");
    assert!(status.success(), "cc -static failed (libc6-dev has libc.a)");
    std::os::unix::fs::symlink("/root", root.path().join("tmp")).expect("symlink tmp");
    let mut tmp_linked = ChildGuard::spawn(
        "jittmplinked",
        Command::new("chroot").arg(root.path()).arg("/spin"),
    );
    // When the machine's processes of these names are recorded
    let filter = "jit(victim|owned|linked|huge|garbage)|spin";
    let recorded = spawn_record(&[
        "--duration",
        "8s",
        "--frequency",
        FREQUENCY,
        "--format",
        "folded",
        "--process-filter",
        filter,
        "--log-format",
        "json",
    ])
    .finish_writing(RECORD_TIMEOUT, &["stacks.folded"]);
    tmp_linked.kill();
    let stacks = recorded.folded();
    let log = &recorded.stderr;
    let of = |name: &str| -> Vec<FoldedStack> {
        stacks
            .iter()
            .filter(|s| s.process == name)
            .cloned()
            .collect()
    };
    let show = |stacks: &[FoldedStack]| {
        stacks
            .iter()
            .take(5)
            .map(|s| format!("  {} {}", s.frames.join(";"), s.count))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Then every refusal is counted (other owner, symlink, too large, tmp a symlink), and the
    // garbage lines and the over-long one
    let refused = last_batch_counter(log, "jit_maps_refused");
    let garbage_lines = last_batch_counter(log, "jit_garbage_lines");
    let long_lines = last_batch_counter(log, "jit_long_lines");
    eprintln!(
        "refused {refused}, garbage lines {garbage_lines}, long lines {long_lines}, maps taken {}",
        last_batch_counter(log, "jit_maps")
    );
    assert!(
        refused >= 4,
        "{refused} refusals counted:\n{}",
        tail(log, 30)
    );
    assert!(
        garbage_lines >= 4_000 && long_lines >= 1,
        "{}",
        tail(log, 30)
    );
    // And no refused map names anything: those processes' JIT frames are one unnamed frame
    for name in ["jitowned", "jitlinked", "jithuge"] {
        let stacks = of(name);
        let named = count(&stacks, &NODE);
        eprintln!("{name}: {named:?}");
        assert!(named.samples >= 50, "too few samples of {name}");
        assert_eq!(named.named(), 0, "{name}'s refused map named frames");
        let unnamed: u64 = stacks
            .iter()
            .filter(|s| s.frames.iter().any(|f| f == &format!("[jit] {name}_[j]")))
            .map(|s| s.count)
            .sum();
        assert!(
            unnamed as f64 >= MIN_NAMED * named.samples as f64,
            "{name}'s JIT frames are not `[jit] {name}`:\n{}",
            show(&stacks)
        );
        assert!(
            !stacks
                .iter()
                .any(|s| s.frames.iter().any(|f| f.contains("secret"))),
            "the root-only file's content named a frame"
        );
    }
    // And the honest process keeps all of its names
    let named = count(&of("jitvictim"), &NODE);
    eprintln!("jitvictim: {named:?}");
    assert!(
        named.share() >= MIN_NAMED,
        "jitvictim: named in {:.1}% of its samples:\n{}",
        100.0 * named.share(),
        show(&of("jitvictim"))
    );
    for workload in [victim, owned, linked, huge, garbage] {
        let _ = fs::remove_file(perf_map(workload.pid()));
        drop(workload);
    }
}

/// Relay peak RSS (KiB) from its status.
fn peak_rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn fifty_processes_with_20_mb_perf_maps_stay_within_the_budget() {
    if !privileged() {
        return;
    }
    let Some(python) = Python::find(Source::Pyenv("3.12")) else {
        return;
    };
    let _lock = ebpf_lock();
    // Given one 20 MB perf map of 330,000 lines naming code at addresses no process uses
    let big = target_dir().join("ember-jit-20mb.map");
    {
        let mut text = String::with_capacity(21 << 20);
        let mut i = 0u64;
        while text.len() < 20_000_000 {
            text.push_str(&format!(
                "{:x} 40 LazyCompile:*generated_function_{i} /srv/app/lib/module.js:1:1\n",
                0x10_0000_0000u64 + i * 0x40
            ));
            i += 1;
        }
        fs::write(&big, text).expect("write the 20 MB map");
    }
    // And 50 CPython -X perf processes, each with its own map extended by those 20 MB (the
    // same lines, hard-linked in: disk is one copy)
    let script = python.workload("truth.py");
    let mut workloads = Vec::new();
    for _ in 0..50 {
        let command = python.command_as(Some("jitmany"), &["-X", "perf", &script, "120"]);
        let workload = Workload::spawn("jitmany", command);
        let map = perf_map(workload.pid());
        let _ = fs::remove_file(&map);
        fs::hard_link(&big, &map).expect("link the 20 MB map");
        workloads.push(workload);
    }
    // When the machine's jitmany processes are recorded
    let run = spawn_record(&[
        "--duration",
        "10s",
        "--frequency",
        FREQUENCY,
        "--format",
        "folded",
        "--process-filter",
        "jitmany",
        "--log-format",
        "json",
    ]);
    // (record is the relay; its peak RSS is read until it exits: a zombie has none)
    let relay = run.pid();
    let mut peak = 0;
    loop {
        let now = peak_rss_kib(relay);
        if now == 0 {
            break;
        }
        peak = peak.max(now);
        std::thread::sleep(Duration::from_millis(200));
    }
    let recorded = run.finish_writing(RECORD_TIMEOUT, &["stacks.folded"]);
    let log = &recorded.stderr;
    let maps = last_batch_counter(log, "jit_maps");
    let held = last_batch_counter(log, "jit_bytes_held");
    let read = last_batch_counter(log, "jit_bytes_read");
    let evicted = last_batch_counter(log, "jit_evicted");
    eprintln!(
        "memory row: {maps} maps taken, {read} bytes read, {held} bytes held, {evicted} ranges \
         evicted, relay peak RSS {peak} KiB"
    );
    for workload in workloads {
        let _ = fs::remove_file(perf_map(workload.pid()));
        drop(workload);
    }
    let _ = fs::remove_file(&big);
    // Then the maps were read, and the store and the relay stay within the budget: 128 MiB for
    // the stores (+ one process's 16 MiB between checks); the relay's peak RSS (a debug build,
    // which also symbolizes these 50 processes) is reported and bounded loosely
    // (a process is described once sampled, a map read once a frame of its process falls in
    // JIT code nothing names: on a busy machine not all 50 within the recording)
    assert!(maps >= 20, "only {maps} maps taken:\n{}", tail(log, 20));
    assert!(read >= 10 * 20_000_000, "only {read} bytes read");
    assert!(held <= (128 + 16) << 20, "{held} bytes held");
    assert!(peak > 0 && peak < 512 << 10, "relay peak RSS {peak} KiB");
}
