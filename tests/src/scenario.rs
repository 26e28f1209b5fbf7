//! The set-up of an end-to-end test as one builder, so that a test reads as what it checks:
//! [`Scenario`] names the relay's and the sampler's flags, the relay's limits and environment,
//! then starts either `ember-relay record` ([`Scenario::record`], which starts its own sampler)
//! or `ember-relay run` on a socket in a fresh temp dir with an `ember-sampler` beside it
//! ([`Scenario::run`]). What it returns waits for batches, names the output files and the
//! metrics address, and on drop stops and reaps every process it started (the sampler before
//! its relay, and a `record`'s sampler child should it outlive `record`).
//!
//! Nothing is implied: every flag a test passes is in its builder calls, and the few the builder
//! adds itself are the ones every e2e test passes (`--log-format json` for the relay's log the
//! tests read, `--allow-root` since the tests run as root, `--verbose` for `record`'s info
//! lines, and the sampler's `--reporter-interval 1s` and `--relay-uid 0`, see
//! [`spawn_sampler`]).
//!
//! Privileges: everything here runs as root; [`ebpf_gate`] skips (or fails, under `CI`) a test
//! that is not, and serializes the eBPF tests of one test process.

use std::{
    ffi::{OsStr, OsString},
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    sync::MutexGuard,
    thread::JoinHandle,
    time::Duration,
};

use crate::{
    attack::{comm_of, is_running, limit_address_space, limit_nofile, tail},
    children_of, ebpf_lock, field_text, is_batch, message, privileged, read_to_string_thread,
    record_command, relay_bin, spawn_sampler, wait_until, ChildGuard, LogReader, RunningRelay,
};

/// The gate of every eBPF test: `let Some(_lock) = ebpf_gate() else { return };`. None (after
/// recording the skip, see [`privileged`]) when not root; otherwise the eBPF lock, held for the
/// whole test.
pub fn ebpf_gate() -> Option<MutexGuard<'static, ()>> {
    privileged().then(ebpf_lock)
}

/// How to start the relay (and, for `run`, the sampler) of one test.
#[derive(Debug, Default)]
#[must_use]
pub struct Scenario {
    name: String,
    relay_args: Vec<OsString>,
    sampler_args: Option<Vec<OsString>>,
    env: Vec<(OsString, OsString)>,
    nofile: Option<u64>,
    address_space: Option<u64>,
    output: Option<PathBuf>,
    output_dir: bool,
    config: Option<String>,
}

impl Scenario {
    /// A scenario whose processes are named `name` in the test's output.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Appends flags to the relay's command line (after `record`'s or `run`'s own).
    pub fn relay_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.relay_args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Appends flags to the sampler's command line; with [`Scenario::run`], a sampler is started
    /// once this has been called (with no flags: `sampler_args::<_, &str>([])`).
    pub fn sampler_args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.sampler_args
            .get_or_insert_with(Vec::new)
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable of the relay process (and so of `record`'s sampler).
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.env.push((key.into(), value.as_ref().to_owned()));
        self
    }

    /// RLIMIT_NOFILE (soft = hard) of the relay process (and so of `record`'s sampler).
    pub fn nofile(mut self, limit: u64) -> Self {
        self.nofile = Some(limit);
        self
    }

    /// RLIMIT_AS of the relay process: a safety net against a relay that reads without end.
    pub fn address_space(mut self, bytes: u64) -> Self {
        self.address_space = Some(bytes);
        self
    }

    /// `record --output DIR`; without it, a fresh `out` under a root-owned, world-readable
    /// temp dir (as for `sudo ember-relay record -o out`).
    pub fn output(mut self, dir: &Path) -> Self {
        self.output = Some(dir.to_path_buf());
        self
    }

    /// `run --output-dir DIR/out` in the scenario's temp dir ([`Running::out_dir`]).
    pub fn output_dir(mut self) -> Self {
        self.output_dir = true;
        self
    }

    /// `run --config DIR/relay.yaml`, that file holding `yaml` ([`Running::config_path`]).
    pub fn config(mut self, yaml: impl Into<String>) -> Self {
        self.config = Some(yaml.into());
        self
    }

    /// Starts `ember-relay record --output DIR --sampler SAMPLER --verbose --log-format json
    /// RELAY_ARGS...`. The sampler flags are not used: `record` starts its own sampler.
    pub fn record(self) -> Recording {
        let (tmp, out_dir) = match self.output.clone() {
            Some(dir) => (None, dir),
            None => {
                let tmp = world_readable_tempdir("ember-e2e-");
                let out = tmp.path().join("out");
                (Some(tmp), out)
            }
        };
        let mut command = record_command(&out_dir);
        command
            .args(["--verbose", "--log-format", "json"])
            .args(&self.relay_args);
        let mut child = spawn_with(&self.name, &mut command, &self.env, self.limits());
        let stdout = read_to_string_thread(child.child_mut().stdout.take().expect("stdout"));
        let log = LogReader::spawn(&self.name, child.child_mut().stderr.take().expect("stderr"));
        Recording {
            child,
            log,
            out_dir,
            stdout: Some(stdout),
            samplers: Vec::new(),
            _tmp: tmp,
        }
    }

    /// Makes a temp dir, starts `ember-relay run --socket DIR/ember.sock --log-format json
    /// --allow-root RELAY_ARGS...`, waits for its socket, then starts the sampler if
    /// [`Scenario::sampler_args`] was called.
    pub fn run(self) -> Running {
        let dir = tempfile::Builder::new()
            .prefix("ember-e2e-")
            .tempdir()
            .expect("creating a temp dir");
        let socket = dir.path().join("ember.sock");
        let mut args = self.relay_args.clone();
        if self.output_dir {
            args.push("--output-dir".into());
            args.push(dir.path().join("out").into());
        }
        if let Some(yaml) = &self.config {
            let path = dir.path().join(CONFIG_FILE);
            fs::write(&path, yaml).expect("writing the relay's config");
            args.push("--config".into());
            args.push(path.into());
        }
        let relay = start_relay(&self.name, &socket, &args, &self.env, self.limits());
        let mut running = Running {
            sampler: None,
            relay,
            socket,
            dir,
        };
        if let Some(args) = &self.sampler_args {
            running.sampler = Some(running.start_sampler(&format!("{} sampler", self.name), args));
        }
        running
    }

    fn limits(&self) -> Limits {
        Limits {
            nofile: self.nofile,
            address_space: self.address_space,
        }
    }
}

/// The file name of [`Scenario::config`] in the scenario's temp dir.
const CONFIG_FILE: &str = "relay.yaml";

/// Resource limits set in the relay process before exec.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limits {
    pub nofile: Option<u64>,
    pub address_space: Option<u64>,
}

/// A root-owned temp dir that everyone may read and traverse (the relay runs as a user of its
/// own and writes below it).
fn world_readable_tempdir(prefix: &str) -> tempfile::TempDir {
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating a temp dir");
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    tmp
}

/// Spawns `command` with stdin closed, stdout and stderr piped, `env` set and `limits` applied.
fn spawn_with(
    name: &str,
    command: &mut Command,
    env: &[(OsString, OsString)],
    limits: Limits,
) -> ChildGuard {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    if let Some(limit) = limits.nofile {
        limit_nofile(command, limit);
    }
    if let Some(bytes) = limits.address_space {
        limit_address_space(command, bytes);
    }
    eprintln!("running {command:?}");
    ChildGuard::spawn(name, command)
}

/// Starts `ember-relay run --socket SOCKET --log-format json --allow-root ARGS...` and, unless the
/// socket file was there already (a restarted relay taking over its path), waits for it.
pub(crate) fn start_relay(
    name: &str,
    socket: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    limits: Limits,
) -> RunningRelay {
    let existed_before = socket.exists();
    let mut command = Command::new(relay_bin());
    command
        .arg("run")
        .arg("--socket")
        .arg(socket)
        .args(["--log-format", "json", "--allow-root"])
        .args(args);
    let mut child = spawn_with(name, &mut command, env, limits);
    let log = LogReader::spawn(name, child.child_mut().stderr.take().expect("piped stderr"));
    let stdout = child.child_mut().stdout.take().expect("piped stdout");
    let stdout = LogReader::spawn(&format!("{name} stdout"), stdout);
    let mut relay = RunningRelay { child, log, stdout };
    if !existed_before {
        wait_until(Duration::from_secs(30), || {
            if let Some(status) = relay.child.try_wait() {
                relay.log.wait_closed(Duration::from_secs(2));
                panic!(
                    "{name} exited ({status}) before listening:\n{}",
                    relay.log.text()
                );
            }
            socket.exists()
        })
        .unwrap_or_else(|| {
            panic!(
                "{name} did not create {}:\n{}",
                socket.display(),
                relay.log.text()
            )
        });
    }
    relay
}

// ---------------------------------------------------------------------------------------------
// ember-relay run + ember-sampler

/// A sampler the scenario started, with its stderr.
pub struct Sampler {
    pub child: ChildGuard,
    pub log: LogReader,
}

/// A running `ember-relay run` (and its sampler, once started) on a socket in a temp dir. Drop
/// kills and reaps the sampler, then the relay, then removes the dir.
pub struct Running {
    pub sampler: Option<Sampler>,
    pub relay: RunningRelay,
    pub socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Running {
    /// The scenario's temp dir (the socket is in it; put the test's own files here too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `DIR/out`, the relay's `--output-dir` when [`Scenario::output_dir`] was set.
    pub fn out_dir(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `DIR/relay.yaml`, the relay's `--config` when [`Scenario::config`] was set.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join(CONFIG_FILE)
    }

    /// The relay's JSON log.
    pub fn log(&self) -> &LogReader {
        &self.relay.log
    }

    /// Starts another `ember-sampler --socket SOCKET ARGS...` on this scenario's relay (see
    /// [`spawn_sampler`]): one the test starts later, or a second one. The test holds it (its
    /// drop kills and reaps it).
    pub fn start_sampler<S: AsRef<OsStr>>(&self, name: &str, args: &[S]) -> Sampler {
        let args: Vec<&str> = args
            .iter()
            .map(|a| a.as_ref().to_str().expect("a UTF-8 sampler flag"))
            .collect();
        let (child, log) = spawn_sampler(name, &self.socket, &args);
        Sampler { child, log }
    }

    /// The scenario's sampler; panics when none was started.
    pub fn sampler(&mut self) -> &mut Sampler {
        self.sampler
            .as_mut()
            .expect("the scenario started no sampler")
    }

    /// Hands the scenario's sampler to the test (which then stops or restarts it, and whose drop
    /// kills it); panics when none was started.
    pub fn take_sampler(&mut self) -> Sampler {
        self.sampler
            .take()
            .expect("the scenario started no sampler")
    }

    /// Waits for the relay's first `batch received` at or after line `from`; returns its index.
    pub fn batch(&self, from: usize, timeout: Duration) -> usize {
        self.relay
            .log
            .expect(from, timeout, "\"batch received\"", is_batch)
            .0
    }

    /// Waits until the relay has logged `n` batches in all.
    pub fn batches(&self, n: usize, timeout: Duration) {
        wait_until(timeout, || self.relay.log.matching(is_batch).len() >= n).unwrap_or_else(|| {
            panic!(
                "the relay logged {} batches, not {n}, within {timeout:?}:\n{}",
                self.relay.log.matching(is_batch).len(),
                tail(&self.relay.log.text(), 40)
            )
        });
    }

    /// The address the relay's `--metrics-address 127.0.0.1:0` bound (from its log).
    pub fn metrics_address(&self) -> String {
        let (_, serving) =
            self.relay
                .log
                .expect(0, Duration::from_secs(30), "the metrics address", |v| {
                    message(v).starts_with("serving metrics")
                });
        field_text(&serving, "address").expect("the bound metrics address")
    }
}

impl Drop for Running {
    /// The sampler goes before its relay (SIGKILL and reap, as [`ChildGuard`] does); the temp
    /// dir and its socket go last, with the fields.
    fn drop(&mut self) {
        if let Some(sampler) = &mut self.sampler {
            sampler.child.kill();
        }
        self.relay.child.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// ember-relay record

/// A running `ember-relay record --log-format json` with its JSON log. Drop kills it, and kills
/// its sampler child should that have outlived it.
pub struct Recording {
    pub child: ChildGuard,
    pub log: LogReader,
    pub out_dir: PathBuf,
    stdout: Option<JoinHandle<String>>,
    samplers: Vec<u32>,
    _tmp: Option<tempfile::TempDir>,
}

impl Recording {
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Waits for `record`'s sampler to start, then for its first `batch received` (sampling is
    /// under way); returns the batch's line index. Panics with the log when none comes within
    /// `timeout`.
    pub fn first_batch(&mut self, timeout: Duration) -> usize {
        let _ = wait_until(timeout, || {
            self.note_samplers();
            !self.sampler_pids().is_empty() || self.child.try_wait().is_some()
        });
        let (index, _) = self.log.wait_for(0, timeout, is_batch).unwrap_or_else(|| {
            let (status, _) = self.wait(Duration::from_secs(1));
            panic!(
                "no batch from the record (status {status:?}):\n{}",
                tail(&self.log.text(), 60)
            )
        });
        index
    }

    /// Waits for the record to exit (killing it after `timeout`); returns its exit status
    /// (None when it had to be killed) and its stdout.
    pub fn wait(&mut self, timeout: Duration) -> (Option<ExitStatus>, String) {
        self.note_samplers();
        let status = self.child.wait_timeout(timeout);
        if status.is_none() {
            self.child.kill();
        }
        self.log.wait_closed(Duration::from_secs(5));
        // An orphaned sampler child keeps record's stdout open: never wait for it for long.
        let stdout = match self.stdout.take() {
            Some(handle) => {
                let _ = wait_until(Duration::from_secs(5), || handle.is_finished());
                if handle.is_finished() {
                    handle.join().unwrap_or_default()
                } else {
                    String::from("<stdout still open: a child of record outlived it>")
                }
            }
            None => String::new(),
        };
        (status, stdout)
    }

    /// Remembers record's sampler child (to kill it if it outlives record).
    pub fn note_samplers(&mut self) {
        for pid in children_of(self.child.pid()) {
            if comm_of(pid).as_deref() == Some("ember-sampler") && !self.samplers.contains(&pid) {
                self.samplers.push(pid);
            }
        }
    }

    /// Record's sampler children seen so far.
    pub fn sampler_pids(&self) -> Vec<u32> {
        self.samplers.clone()
    }

    /// `stacks.folded` of the output dir (empty when there is none).
    pub fn folded_text(&self) -> String {
        fs::read_to_string(self.out_dir.join("stacks.folded")).unwrap_or_default()
    }

    /// Waits for the record to finish and asserts it succeeded and wrote stacks.folded;
    /// returns the folded text.
    pub fn finish(&mut self, timeout: Duration) -> String {
        let (status, stdout) = self.wait(timeout);
        let Some(status) = status else {
            panic!(
                "ember-relay record did not finish within {timeout:?}\nstdout:\n{stdout}\nlog:\n{}",
                tail(&self.log.text(), 60)
            );
        };
        assert!(
            status.success(),
            "ember-relay record failed ({status})\nstdout:\n{stdout}\nlog:\n{}",
            tail(&self.log.text(), 60)
        );
        fs::read_to_string(self.out_dir.join("stacks.folded")).unwrap_or_else(|err| {
            panic!(
                "record succeeded but wrote no stacks.folded: {err}\nstdout:\n{stdout}\nlog:\n{}",
                tail(&self.log.text(), 60)
            )
        })
    }
}

impl Drop for Recording {
    /// Kills the record's sampler child if it outlived the record (a bug the tests report; the
    /// test must not leave a root sampler running).
    fn drop(&mut self) {
        self.child.kill();
        for pid in self.sampler_pids() {
            if is_running(pid) && comm_of(pid).as_deref() == Some("ember-sampler") {
                eprintln!("killing record's orphaned sampler {pid}");
                if let Ok(raw) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(raw),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guarantee every converted test leans on: what a scenario started is gone, reaped (no
    /// zombie left to /proc) and its temp dir removed once it is dropped, even by a panic.
    #[test]
    fn a_dropped_scenario_leaves_no_process_or_dir_behind() {
        // Given a running relay (no sampler: no root or eBPF needed)
        let scenario = Scenario::new("relay")
            .relay_args(["--sampler-uid", "0", "--metrics-address", "off"])
            .run();
        let pid = scenario.relay.child.pid();
        let dir = scenario.dir().to_path_buf();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        // When the scenario is dropped
        drop(scenario);
        // Then the relay is reaped and its temp dir removed
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "relay {pid} is still there (running or a zombie) after the scenario was dropped"
        );
        assert!(!dir.exists(), "{} was not removed", dir.display());
    }
}
