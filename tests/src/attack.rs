//! Support for the attack regression tests (tests/attacks.rs): an unprivileged attacker
//! uid picked at run time, the attacker programs of tests/workloads/attack_*.c compiled at test
//! time, running them as that uid, attacker-owned directories, the resource limits a relay may be
//! started under (see `scenario`), and what the tests measure of the relay from /proc (peak
//! memory, open descriptors, memfd copies).
//!
//! Privileges: everything here runs as root (the tests skip otherwise). Attacker processes drop
//! to the attacker uid in `pre_exec` (no supplementary groups, no capabilities: an ordinary
//! local user). Nothing here kills a process the test did not start; the one indirect case is
//! the sampler child of a `record` the test started, killed by its pid when it outlives record.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::{
        fs::{MetadataExt as _, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::{compile_workload, process_cpu_time, target_dir, wait_until, ChildGuard, LogReader};

// ---------------------------------------------------------------------------------------------
// The attacker

/// An unprivileged local user: a uid (and gid of the same number) with no passwd or group entry
/// and no running process, so nothing on the machine trusts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attacker {
    pub uid: u32,
    pub gid: u32,
}

/// Uids of every running process (real, effective, saved, fs), from /proc/*/status.
pub fn running_uids() -> BTreeMap<u32, Vec<u32>> {
    let mut uids: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return uids;
    };
    for entry in dir.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            if let Some(ids) = line.strip_prefix("Uid:") {
                for id in ids.split_whitespace().filter_map(|s| s.parse::<u32>().ok()) {
                    let pids = uids.entry(id).or_default();
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
            }
        }
    }
    uids
}

/// The attacker of this test process: the first uid in 45000..46000 with no passwd entry, no
/// group entry and no process.
pub fn attacker() -> Attacker {
    static ATTACKER: OnceLock<Attacker> = OnceLock::new();
    *ATTACKER.get_or_init(|| {
        let busy = running_uids();
        let uid = (45000..46000)
            .find(|&id| {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id))
                    .ok()
                    .flatten()
                    .is_none()
                    && nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id))
                        .ok()
                        .flatten()
                        .is_none()
                    && !busy.contains_key(&id)
            })
            .expect("no unused uid in 45000..46000 for the attacker");
        eprintln!("attacker: uid {uid} gid {uid} (no passwd entry, no process)");
        Attacker { uid, gid: uid }
    })
}

/// Makes `command` run as `uid`/`gid` with no supplementary groups (and so no capabilities):
/// setgroups([]), setresgid, setresuid in the child before exec.
pub fn run_as(command: &mut Command, uid: u32, gid: u32) -> &mut Command {
    // SAFETY: the closure only makes async-signal-safe syscalls (setgroups, setresgid,
    // setresuid) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Sets RLIMIT_NOFILE (soft = hard = `limit`) for the child before exec.
pub fn limit_nofile(command: &mut Command, limit: u64) -> &mut Command {
    // SAFETY: setrlimit is async-signal-safe; the struct lives on the child's stack.
    unsafe {
        command.pre_exec(move || {
            let rlim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rlim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Sets RLIMIT_AS (address space) for the child before exec: a safety net so that a relay that
/// reads an endless file fails its allocation instead of eating the machine's memory.
pub fn limit_address_space(command: &mut Command, bytes: u64) -> &mut Command {
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let rlim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &rlim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A temp dir under /tmp owned by the attacker (mode 0755, so other users may traverse it).
pub fn attacker_dir(who: Attacker, prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("creating an attacker temp dir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::chown(dir.path(), Some(who.uid), Some(who.gid)).expect("chown");
    dir
}

/// A started attacker program with its stdout lines (JSON: `{"ready":true,...}`).
pub struct AttackProcess {
    pub child: ChildGuard,
    pub stdout: LogReader,
}

impl AttackProcess {
    /// Waits for the program's `{"ready":true}` line (it has set up its mappings).
    pub fn wait_ready(&mut self, timeout: Duration) -> serde_json::Value {
        let (_, ready) = self.stdout.expect(0, timeout, "{\"ready\":true}", |v| {
            v.get("ready").and_then(serde_json::Value::as_bool) == Some(true)
        });
        assert!(
            self.child.try_wait().is_none(),
            "{} exited right after getting ready",
            self.child.name()
        );
        ready
    }
}

/// Starts `program ARGS` as the attacker, stdout piped into a [`LogReader`].
pub fn spawn_attacker(who: Attacker, program: &Path, args: &[&str]) -> AttackProcess {
    let name = program
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    run_as(&mut command, who.uid, who.gid);
    let mut child = ChildGuard::spawn(&name, &mut command);
    let stdout = LogReader::spawn(&name, child.child_mut().stdout.take().expect("stdout"));
    AttackProcess { child, stdout }
}

// ---------------------------------------------------------------------------------------------
// Attacker programs

/// The attacker programs of tests/workloads/attack_*.c, compiled once per test process into the
/// world-readable workload dir.
#[derive(Debug)]
pub struct AttackPrograms {
    /// Many executable mappings: one file under a long path, or many distinct files.
    pub mappings: PathBuf,
    /// A sparse multi-GiB mode-0700 file mapped executable, spinning in it.
    pub bigfile: PathBuf,
    /// Fake frame-pointer chains into a copy of libc, then truncates the copy.
    pub truncate: PathBuf,
    /// Tries /proc/PID/mem, /proc/PID/fd/N and pidfd_getfd; prints what each gave.
    pub probe: PathBuf,
}

/// The dir the workloads and attacker programs are compiled into.
pub fn program_dir() -> PathBuf {
    let dir = target_dir().join("ember-test-workloads");
    fs::create_dir_all(&dir).expect("creating the workload dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod workload dir");
    dir
}

pub fn attack_programs() -> &'static AttackPrograms {
    static PROGRAMS: OnceLock<AttackPrograms> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let dir = program_dir();
        let build = |name: &str| compile_workload(&dir, name, name, &["-ldl"]);
        AttackPrograms {
            mappings: build("attack_mappings"),
            bigfile: build("attack_bigfile"),
            truncate: build("attack_truncate"),
            probe: build("attack_probe"),
        }
    })
}

// ---------------------------------------------------------------------------------------------
// /proc measurements

/// A `kB` field of /proc/PID/status (VmHWM, VmRSS, ...), in KiB.
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Peak resident memory of `pid` (VmHWM), in KiB.
pub fn vm_hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM")
}

/// How many descriptors `pid` holds.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// The descriptor numbers `pid` holds, with what they point to.
pub fn fds_of(pid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<(u32, String)> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            Some((n, target.to_string_lossy().into_owned()))
        })
        .collect();
    fds.sort();
    fds
}

/// Bytes of memfd files (the relay's private copies) `pid` holds open or maps, each file counted
/// once: memory the relay uses that VmHWM does not show until it is touched.
pub fn memfd_bytes(pid: u32) -> u64 {
    let mut files: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut add = |path: PathBuf| {
        let is_memfd = fs::read_link(&path)
            .map(|t| t.to_string_lossy().starts_with("/memfd:"))
            .unwrap_or(false);
        if is_memfd {
            if let Ok(meta) = fs::metadata(&path) {
                files.insert((meta.dev(), meta.ino()), meta.size());
            }
        }
    };
    for dir in ["fd", "map_files"] {
        if let Ok(entries) = fs::read_dir(format!("/proc/{pid}/{dir}")) {
            for entry in entries.filter_map(Result::ok) {
                add(entry.path());
            }
        }
    }
    files.values().sum()
}

/// What a [`Watch`] saw of a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watched {
    pub max_hwm_kib: u64,
    /// Largest RssAnon + RssShmem seen (the relay's own heap and its mapped private copies,
    /// without the file-backed pages of binaries it maps, which VmHWM also counts).
    pub max_anon_shmem_kib: u64,
    pub max_fds: usize,
    pub max_memfd_bytes: u64,
    pub last_fds: usize,
    pub polls: u64,
}

/// Polls a process's VmHWM, descriptor count and memfd bytes every 20 ms on a thread; stops when
/// dropped or stopped. `kill_above_kib` kills it (SIGKILL, by its pid: a process the test
/// started) when its resident memory passes that many KiB, so that a vulnerable build cannot
/// eat the machine's memory.
pub struct Watch {
    pid: u32,
    seen: Arc<Mutex<Watched>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    pub fn start(pid: u32, kill_above_kib: Option<u64>) -> Self {
        let seen = Arc::new(Mutex::new(Watched::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (Arc::clone(&seen), Arc::clone(&stop));
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                let hwm = vm_hwm_kib(pid);
                let rss = status_kib(pid, "VmRSS").unwrap_or(0);
                let anon_shmem = status_kib(pid, "RssAnon").unwrap_or(0)
                    + status_kib(pid, "RssShmem").unwrap_or(0);
                let fds = fd_count(pid);
                let memfd = memfd_bytes(pid);
                {
                    let mut s = seen2.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(hwm) = hwm {
                        s.max_hwm_kib = s.max_hwm_kib.max(hwm);
                    }
                    if let Some(fds) = fds {
                        s.max_fds = s.max_fds.max(fds);
                        s.last_fds = fds;
                    }
                    s.max_memfd_bytes = s.max_memfd_bytes.max(memfd);
                    s.max_anon_shmem_kib = s.max_anon_shmem_kib.max(anon_shmem);
                    s.polls += 1;
                }
                if let Some(limit) = kill_above_kib {
                    if rss > limit || memfd / 1024 > limit {
                        eprintln!(
                            "watch: pid {pid} holds {rss} KiB resident and {} KiB of memfd \
                             copies, above the {limit} KiB safety limit: killing it",
                            memfd / 1024
                        );
                        if let Ok(raw) = i32::try_from(pid) {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(raw),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            pid,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What it saw so far.
    pub fn seen(&self) -> Watched {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops polling and returns what it saw.
    pub fn stop(mut self) -> Watched {
        self.halt();
        self.seen()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.halt();
    }
}

// ---------------------------------------------------------------------------------------------
// Witness workload

/// Waits (up to `timeout`) for the child `pid` to exit without reaping it, and returns the CPU
/// time it used over its whole life (a zombie's /proc/PID/stat keeps its final utime/stime).
pub fn cpu_time_at_exit(pid: u32, timeout: Duration) -> Option<Duration> {
    let raw = libc::id_t::try_from(pid).ok()?;
    wait_until(timeout, || {
        // SAFETY: waitid only writes the siginfo we pass; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; P_PID with the pid of our own child.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                raw,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            )
        };
        // SAFETY: si_pid is valid to read after a successful waitid.
        rc == 0 && unsafe { info.si_pid() } != 0
    })?;
    Some(process_cpu_time(pid))
}

// ---------------------------------------------------------------------------------------------
// Processes

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether `pid` exists and is not a zombie.
pub fn is_running(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned));
    !matches!(state.as_deref(), Some("Z" | "X") | None)
}

/// The `comm` of `pid`.
pub fn comm_of(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}
