//! Helpers for ember's end-to-end tests (tests/e2e.rs), which run the real `ember-sampler` and
//! `ember-relay` binaries from `target/debug` against small C workloads compiled at test time.
//!
//! The eBPF tests need root. [`privileged`] skips them for an unprivileged `cargo test` (and fails
//! them under `CI` or `EMBER_REQUIRE_ALL`, where skipping would hide a broken setup); every other
//! skip goes through [`skip`] too, which prints and records it (see the `gate` module). They must
//! not run concurrently (each loads the sampler and counts samples of the whole machine), so
//! every one holds [`ebpf_lock`]; running with `--test-threads=1` is equivalent.
//! `scenario::ebpf_gate` does both (the root check and the lock), and the `scenario` builder
//! starts a test's relay and sampler.
//!
//! Timeouts here only keep a broken build from hanging the suite; no test asserts how fast
//! anything is.

// Test support: a failed expectation should panic with its message, as in a test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod attack;
pub mod dockerd;
mod gate;
pub mod go_pprof;
pub mod golang;
pub mod nspawn;
pub mod otlp;
pub mod pprof;
pub mod pyroscope;
pub mod python;
pub mod scenario;
pub mod speedscope;

use std::{
    fs,
    io::{BufRead as _, BufReader, Read},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::Value;

pub use crate::gate::{privileged, skip, RECORD_ENV};

// ---------------------------------------------------------------------------------------------
// Binaries

/// `target/debug` (or whichever profile dir the test binary was built in): the test executable is
/// `target/<profile>/deps/<test>-<hash>`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent dir");
    let dir = if deps.file_name().is_some_and(|name| name == "deps") {
        deps.parent().expect("deps has a parent dir")
    } else {
        deps
    };
    dir.to_path_buf()
}

fn binary(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.is_file(),
        "{} not found; run `cargo build` first (the e2e tests run the real binaries)",
        path.display()
    );
    path
}

pub fn sampler_bin() -> PathBuf {
    binary("ember-sampler")
}

pub fn relay_bin() -> PathBuf {
    binary("ember-relay")
}

// ---------------------------------------------------------------------------------------------
// Privilege gate and serialization

static EBPF: Mutex<()> = Mutex::new(());

/// Serializes the eBPF tests within this process. A test that panicked while holding it does not
/// poison the others.
pub fn ebpf_lock() -> MutexGuard<'static, ()> {
    EBPF.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// The C workloads of tests/workloads, compiled once per test process.
#[derive(Debug)]
pub struct Workloads {
    /// main -> outer_work -> middle_work -> inner_work with a measured self-time split.
    pub groundtruth: PathBuf,
    /// write()/getppid() loop; mostly kernel time.
    pub syscalls: PathBuf,
    /// main -> spin_outer -> spin_hot.
    pub spinner: PathBuf,
}

/// Flags that keep frame pointers and every call of the workloads' call chains.
pub const WORKLOAD_CFLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-inline",
    "-fno-optimize-sibling-calls",
];

pub fn workloads() -> &'static Workloads {
    static WORKLOADS: OnceLock<Workloads> = OnceLock::new();
    WORKLOADS.get_or_init(|| {
        // Under target/ (never committed), world-readable: the relay runs as `nobody`.
        let dir = target_dir().join("ember-test-workloads");
        fs::create_dir_all(&dir).expect("creating the workload dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod workload dir");
        Workloads {
            groundtruth: compile_workload(&dir, "groundtruth", "groundtruth", &[]),
            syscalls: compile_workload(&dir, "syscalls", "syscalls", &[]),
            spinner: compile_workload(&dir, "spinner", "spinner", &[]),
        }
    })
}

/// Compiles tests/workloads/`source`.c to `dir`/`out` with [`WORKLOAD_CFLAGS`] plus `extra`
/// (e.g. `-D` renames, `-Wl,--build-id=...`, `-ldl`); mode 0755.
pub fn compile_workload(dir: &Path, source: &str, out: &str, extra: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(format!("{source}.c"));
    let path = dir.join(out);
    // Build beside, then rename: another test process may be running the previous binary.
    let tmp = dir.join(format!(".{out}.{}", std::process::id()));
    let output = Command::new("cc")
        .args(WORKLOAD_CFLAGS)
        .args(extra)
        .arg("-o")
        .arg(&tmp)
        .arg(&source)
        .output()
        .unwrap_or_else(|err| panic!("running `cc` to build {}: {err}", source.display()));
    assert!(
        output.status.success(),
        "cc failed for {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).expect("chmod workload");
    fs::rename(&tmp, &path).expect("renaming the workload into place");
    path
}

/// Children of `pid` (from /proc/PID/task/PID/children), e.g. `record`'s sampler.
pub fn children_of(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Starts a workload for `seconds` with stdout piped (for its JSON summary).
pub fn spawn_workload(path: &Path, seconds: u32) -> ChildGuard {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut command = Command::new(path);
    command
        .arg(seconds.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    ChildGuard::spawn(&name, &mut command)
}

/// CPU time (user + system) a process has used so far, from /proc/PID/stat.
pub fn process_cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc/PID/stat");
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat has a comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    Duration::from_nanos((utime + stime) * 1_000_000_000 / ticks)
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process that is killed (SIGKILL) and reaped when dropped, so a failing test leaves no
/// sampler, relay or workload behind.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
}

impl ChildGuard {
    pub fn spawn(name: &str, command: &mut Command) -> Self {
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("starting {name} ({command:?}): {err}"));
        Self {
            name: name.to_owned(),
            child,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"));
        // ESRCH (already gone, not yet reaped) is fine.
        let _ = nix::sys::signal::kill(pid, signal);
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waitpid")
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits (SIGKILL after `timeout`); returns everything the child wrote to its
    /// piped stdout.
    pub fn terminate_and_read_stdout(mut self, timeout: Duration) -> (ExitStatus, String) {
        self.signal(Signal::SIGTERM);
        let status = match self.wait_timeout(timeout) {
            Some(status) => status,
            None => {
                self.signal(Signal::SIGKILL);
                panic!("{} did not exit within {timeout:?} of SIGTERM", self.name);
            }
        };
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            stdout
                .read_to_string(&mut out)
                .expect("reading child stdout");
        }
        (status, out)
    }

    /// Kills with SIGKILL and reaps.
    pub fn kill(&mut self) {
        if self.try_wait().is_none() {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output readers

/// One line a child wrote, with its JSON form when it is a JSON object.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub raw: String,
    pub json: Option<Value>,
}

/// Collects a child's output lines (e.g. the relay's `--log-format json` stderr) on a thread,
/// echoing them to the test's stderr with a prefix.
#[derive(Clone, Debug)]
pub struct LogReader {
    name: String,
    lines: Arc<Mutex<Vec<LogLine>>>,
    done: Arc<Mutex<bool>>,
}

impl LogReader {
    pub fn spawn(name: &str, source: impl Read + Send + 'static) -> Self {
        let reader = Self {
            name: name.to_owned(),
            lines: Arc::new(Mutex::new(Vec::new())),
            done: Arc::new(Mutex::new(false)),
        };
        let (lines, done, prefix) = (
            Arc::clone(&reader.lines),
            Arc::clone(&reader.done),
            name.to_owned(),
        );
        thread::spawn(move || {
            for line in BufReader::new(source).lines() {
                let Ok(raw) = line else { break };
                eprintln!("[{prefix}] {raw}");
                let json = serde_json::from_str::<Value>(&raw)
                    .ok()
                    .filter(Value::is_object);
                lock(&lines).push(LogLine { raw, json });
            }
            *lock(&done) = true;
        });
        reader
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        lock(&self.lines).clone()
    }

    pub fn len(&self) -> usize {
        lock(&self.lines).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The JSON lines so far, with their indexes.
    pub fn json(&self) -> Vec<(usize, Value)> {
        lock(&self.lines)
            .iter()
            .enumerate()
            .filter_map(|(i, line)| line.json.clone().map(|json| (i, json)))
            .collect()
    }

    /// JSON lines matching `predicate`.
    pub fn matching(&self, predicate: impl Fn(&Value) -> bool) -> Vec<(usize, Value)> {
        self.json()
            .into_iter()
            .filter(|(_, v)| predicate(v))
            .collect()
    }

    /// All the text so far (for failure messages).
    pub fn text(&self) -> String {
        lock(&self.lines)
            .iter()
            .map(|l| format!("{}\n", l.raw))
            .collect()
    }

    /// Waits until the stream ends (the child exited and closed it), up to `timeout`.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !*lock(&self.done) {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Polls for the first JSON line at index >= `from` that matches `predicate`; None after
    /// `timeout`. Returns the line's index, so a later wait can start after it.
    pub fn wait_for(
        &self,
        from: usize,
        timeout: Duration,
        predicate: impl Fn(&Value) -> bool,
    ) -> Option<(usize, Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let lines = lock(&self.lines);
                for (i, line) in lines.iter().enumerate().skip(from) {
                    if let Some(json) = &line.json {
                        if predicate(json) {
                            return Some((i, json.clone()));
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`Self::wait_for`] that panics with `what` and the whole log on timeout.
    pub fn expect(
        &self,
        from: usize,
        timeout: Duration,
        what: &str,
        predicate: impl Fn(&Value) -> bool,
    ) -> (usize, Value) {
        self.wait_for(from, timeout, predicate).unwrap_or_else(|| {
            panic!(
                "{}: no {what} within {timeout:?}; its output so far:\n{}",
                self.name,
                self.text()
            )
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reads a whole stream to a string on a thread (for outputs that are only looked at afterwards).
pub fn read_to_string_thread(mut source: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = source.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

// ---------------------------------------------------------------------------------------------
// Relay JSON log fields (tracing-subscriber's json format with flattened fields)

/// The `message` of a log line.
pub fn message(line: &Value) -> &str {
    line.get("message").and_then(Value::as_str).unwrap_or("")
}

/// The `level` of a log line ("INFO", "ERROR", ...).
pub fn level(line: &Value) -> &str {
    line.get("level").and_then(Value::as_str).unwrap_or("")
}

/// A numeric field, logged either as a number or as a decimal string.
pub fn field_u64(line: &Value, key: &str) -> Option<u64> {
    match line.get(key)? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A field as text (strings as is, other values in their JSON form).
pub fn field_text(line: &Value, key: &str) -> Option<String> {
    match line.get(key)? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A sampler counter of a `batch received` line, by its key: logged apart under that key (the
/// samples and the samples lost), else a `key=value` of its `losses` field, which lists only the
/// counters not zero (so one absent from it is 0). None when the line has neither.
pub fn batch_counter(line: &Value, key: &str) -> Option<u64> {
    if let Some(value) = field_u64(line, key) {
        return Some(value);
    }
    let losses = line.get("losses")?.as_str()?;
    Some(
        losses
            .split(' ')
            .filter_map(|pair| pair.split_once('='))
            .find(|(name, _)| *name == key)
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0),
    )
}

pub fn is_batch(line: &Value) -> bool {
    message(line) == "batch received"
}

pub fn is_connected(line: &Value) -> bool {
    message(line) == "sampler connected"
}

/// The relay took the sampler's hello: the sampler has attached its program and samples. The
/// relay logs "sampler connected" ([`is_connected`]) before that, while the sampler still loads
/// and verifies its program, which takes a second or more on a busy host: a workload started
/// at "connected" runs unsampled meanwhile.
pub fn is_sampling(line: &Value) -> bool {
    message(line) == "sampler hello"
}

pub fn is_closing_error(line: &Value) -> bool {
    level(line) == "ERROR" && message(line).starts_with("closing connection")
}

pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

// ---------------------------------------------------------------------------------------------
// ember-relay run / ember-sampler

/// A relay in `run` mode with its JSON log.
pub struct RunningRelay {
    pub child: ChildGuard,
    pub log: LogReader,
    /// What it printed on stdout (the debug exporter writes there).
    pub stdout: LogReader,
}

impl RunningRelay {
    /// Stops the relay with SIGTERM (its output files are written as it stops) and waits up to
    /// `timeout`; None when it did not exit.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child.signal(Signal::SIGTERM);
        self.child.wait_timeout(timeout)
    }
}

/// Starts `ember-relay run --socket SOCKET --log-format json --allow-root EXTRA...` and waits
/// for the socket file to appear.
pub fn spawn_relay_run(name: &str, socket: &Path, extra: &[&str]) -> RunningRelay {
    let extra: Vec<std::ffi::OsString> = extra.iter().map(Into::into).collect();
    scenario::start_relay(name, socket, &extra, &[], scenario::Limits::default())
}

/// Starts `ember-sampler --socket SOCKET --reporter-interval 1s [--relay-uid 0] EXTRA...`.
///
/// The sampler connects as nobody (it leaves uid 0 once attached), which the relay's default
/// `--sampler-uid` (65534) accepts; the relays of these tests run as root and make their socket
/// 0660 root:root, so unless EXTRA names another relay the sampler is told `--relay-uid 0`: it
/// serves only a root relay and joins group 0 to reach that socket.
pub fn spawn_sampler(name: &str, socket: &Path, extra: &[&str]) -> (ChildGuard, LogReader) {
    let mut command = Command::new(sampler_bin());
    command
        .arg("--socket")
        .arg(socket)
        .args(["--reporter-interval", "1s"]);
    if !extra.contains(&"--relay-uid") {
        command.args(["--relay-uid", "0"]);
    }
    command
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = ChildGuard::spawn(name, &mut command);
    let log = LogReader::spawn(name, child.child_mut().stderr.take().expect("piped stderr"));
    (child, log)
}

/// Polls `condition` every 20 ms; Some(()) once true, None after `timeout`.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> Option<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return Some(());
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// ember-relay record

/// A running `ember-relay record`.
pub struct RecordRun {
    pub child: ChildGuard,
    /// The `--output` dir (created by the relay).
    pub out_dir: PathBuf,
    tmp: tempfile::TempDir,
    stdout: JoinHandle<String>,
    stderr: LogReader,
}

/// The outputs of a finished `ember-relay record`.
pub struct Recorded {
    pub out_dir: PathBuf,
    pub stdout: String,
    pub stderr: String,
    _tmp: tempfile::TempDir,
}

/// Starts `ember-relay record --verbose --output DIR --sampler SAMPLER ARGS...` (info logs, which
/// the tests read). DIR does not exist yet; its parent is a root-owned, world-readable temp dir,
/// as for `sudo ember-relay record -o out`.
pub fn spawn_record(args: &[&str]) -> RecordRun {
    spawn_record_logging(args, true)
}

/// [`spawn_record`], at record's default log level (warnings only) unless `verbose`.
pub fn spawn_record_logging(args: &[&str], verbose: bool) -> RecordRun {
    spawn_record_with(args, verbose, &[])
}

/// `ember-relay record --output OUT_DIR --sampler SAMPLER`, this build's binaries: the start of
/// every record command line the tests run.
pub fn record_command(out_dir: &Path) -> Command {
    let mut command = Command::new(relay_bin());
    command
        .arg("record")
        .arg("--output")
        .arg(out_dir)
        .arg("--sampler")
        .arg(sampler_bin());
    command
}

/// [`spawn_record_logging`] with environment changes: `(NAME, Some(value))` sets, `(NAME, None)`
/// removes.
pub fn spawn_record_with(args: &[&str], verbose: bool, env: &[(&str, Option<&str>)]) -> RecordRun {
    let tmp = tempfile::Builder::new()
        .prefix("ember-e2e-")
        .tempdir()
        .expect("creating a temp dir");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    let out_dir = tmp.path().join("out");
    let mut command = record_command(&out_dir);
    command
        .args(verbose.then_some("--verbose"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !verbose {
        // The default level is what is tested: no filter from the test's environment.
        command.env_remove("EMBER_LOG").env_remove("RUST_LOG");
    }
    for (name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    eprintln!("running {command:?}");
    let mut child = ChildGuard::spawn("ember-relay record", &mut command);
    let stdout = read_to_string_thread(child.child_mut().stdout.take().expect("piped stdout"));
    let stderr = LogReader::spawn(
        "record",
        child.child_mut().stderr.take().expect("piped stderr"),
    );
    RecordRun {
        child,
        out_dir,
        tmp,
        stdout,
        stderr,
    }
}

impl RecordRun {
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// What `record` has written to stderr so far (JSON lines with `--log-format json`).
    pub fn log(&self) -> &LogReader {
        &self.stderr
    }

    /// Waits for the record to finish (up to `timeout`), asserts it succeeded and wrote its three
    /// outputs, and returns them.
    pub fn finish(self, timeout: Duration) -> Recorded {
        self.finish_writing(
            timeout,
            &["stacks.folded", "profile.pb.gz", "flamegraph.svg"],
        )
    }

    /// [`RecordRun::finish`] for a record that writes the files `names` (its `--format`).
    pub fn finish_writing(mut self, timeout: Duration, names: &[&str]) -> Recorded {
        let status = self.child.wait_timeout(timeout);
        if status.is_none() {
            self.child.kill();
        }
        self.stderr.wait_closed(Duration::from_secs(5));
        let stdout = self.stdout.join().unwrap_or_default();
        let stderr = self.stderr.text();
        let Some(status) = status else {
            panic!("ember-relay record did not finish within {timeout:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        };
        assert!(
            status.success(),
            "ember-relay record failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        eprintln!("record stdout:\n{stdout}");
        for name in names {
            let path = self.out_dir.join(name);
            let len = fs::metadata(&path).map(|m| m.len()).unwrap_or_else(|err| {
                panic!(
                    "record did not write {}: {err}\nstdout:\n{stdout}\nstderr:\n{stderr}",
                    path.display()
                )
            });
            assert!(len > 0, "{} is empty", path.display());
            assert!(
                stdout.contains(name),
                "record's stdout does not name its output {name}:\n{stdout}"
            );
        }
        Recorded {
            out_dir: self.out_dir,
            stdout,
            stderr,
            _tmp: self.tmp,
        }
    }
}

/// Runs `ember-relay record` to completion (see [`spawn_record`] and [`RecordRun::finish`]).
pub fn record(args: &[&str], timeout: Duration) -> Recorded {
    spawn_record(args).finish(timeout)
}

impl Recorded {
    pub fn folded_text(&self) -> String {
        fs::read_to_string(self.out_dir.join("stacks.folded")).expect("reading stacks.folded")
    }

    pub fn folded(&self) -> Vec<FoldedStack> {
        parse_folded(&self.folded_text())
    }

    pub fn profile(&self) -> pprof::Profile {
        pprof::read(&self.out_dir.join("profile.pb.gz"))
    }

    pub fn flamegraph(&self) -> String {
        fs::read_to_string(self.out_dir.join("flamegraph.svg")).expect("reading flamegraph.svg")
    }
}

// ---------------------------------------------------------------------------------------------
// Folded stacks

/// One line of stacks.folded: `process;root;...;leaf COUNT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldedStack {
    pub process: String,
    /// Root first, leaf last.
    pub frames: Vec<String>,
    pub count: u64,
}

/// Suffix of kernel frames in folded stacks.
pub const KERNEL_SUFFIX: &str = "_[k]";

impl FoldedStack {
    pub fn leaf(&self) -> Option<&str> {
        self.frames.last().map(String::as_str)
    }

    pub fn has_frame(&self, name: &str) -> bool {
        self.frames.iter().any(|f| f == name)
    }

    pub fn kernel_frames(&self) -> impl Iterator<Item = &str> {
        self.frames
            .iter()
            .map(String::as_str)
            .filter(|f| is_kernel_frame(f))
    }

    pub fn user_frames(&self) -> impl Iterator<Item = &str> {
        self.frames
            .iter()
            .map(String::as_str)
            .filter(|f| !is_kernel_frame(f))
    }
}

pub fn is_kernel_frame(frame: &str) -> bool {
    frame.ends_with(KERNEL_SUFFIX)
}

pub fn is_unknown_frame(frame: &str) -> bool {
    frame.starts_with("[unknown]")
}

/// Parses stacks.folded; panics (naming the line) on a malformed line.
pub fn parse_folded(text: &str) -> Vec<FoldedStack> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("stacks.folded line {}: no count: {line:?}", i + 1));
            let count: u64 = count
                .parse()
                .unwrap_or_else(|_| panic!("stacks.folded line {}: bad count: {line:?}", i + 1));
            let mut parts = stack.split(';').map(str::to_owned);
            let process = parts.next().unwrap_or_default();
            assert!(
                !process.is_empty(),
                "stacks.folded line {}: no process name: {line:?}",
                i + 1
            );
            FoldedStack {
                process,
                frames: parts.collect(),
                count,
            }
        })
        .collect()
}

pub fn total_count<'a>(stacks: impl IntoIterator<Item = &'a FoldedStack>) -> u64 {
    stacks.into_iter().map(|s| s.count).sum()
}

// ---------------------------------------------------------------------------------------------
// /proc status

/// The `Key:\tvalue` lines of /proc/PID/status (or a task's status).
pub fn proc_status(path: &Path) -> Option<Vec<(String, String)>> {
    let text = fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect(),
    )
}

pub fn status_field<'a>(status: &'a [(String, String)], key: &str) -> Option<&'a str> {
    status
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

// ---------------------------------------------------------------------------------------------
// The relay's /metrics, scraped over plain HTTP/1.1 (tests/faults.rs; metrics.rs parses the
// exposition with Prometheus' own client, these only read single series)

/// `GET path` from `address` (HOST:PORT); returns the status code and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    use std::io::Write as _;
    let mut stream = std::net::TcpStream::connect(address)
        .unwrap_or_else(|err| panic!("connect {address}: {err}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .unwrap_or_else(|err| panic!("GET {path}: {err}"));
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("GET {path}: no HTTP head in {answer:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: no status in {head:?}"));
    (status, body.to_owned())
}

/// The address a relay started with `--metrics-address 127.0.0.1:0` bound (from its log).
pub fn metrics_address(relay: &RunningRelay) -> String {
    let (_, serving) = relay
        .log
        .expect(0, Duration::from_secs(30), "the metrics address", |v| {
            message(v).starts_with("serving metrics")
        });
    field_text(&serving, "address").expect("the bound metrics address")
}

/// The value of one series of a Prometheus text exposition, named exactly as it is written
/// (`name` or `name{label="value"}`); None when absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
}

/// The sum of `samples` over the relay's `batch received` lines so far.
pub fn logged_samples(log: &LogReader) -> u64 {
    log.matching(is_batch)
        .iter()
        .filter_map(|(_, v)| field_u64(v, "samples"))
        .sum()
}
