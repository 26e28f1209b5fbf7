//! The sampler's confinement after setup: it stops being root, keeps only the capabilities the
//! steady-state loop needs, sets no_new_privs, and installs a seccomp allowlist of the syscalls
//! that loop makes. One file, every line explained, so it can be reviewed as a whole.
//!
//! Steady state = drain the already-attached BPF maps (the map descriptors are the permission:
//! no CAP_BPF/CAP_PERFMON needed), read /proc of any process, open the binaries they map, and
//! talk to the relay over one Unix socket. The capabilities that needs:
//!
//! | capability              | why                                                                  |
//! |-------------------------|----------------------------------------------------------------------|
//! | CAP_SYS_PTRACE          | read /proc/<pid>/maps, exe, root/ of processes of other users        |
//! | CAP_DAC_READ_SEARCH     | open mapped binaries whatever their mode (e.g. 0700 of another user) |
//! | CAP_CHECKPOINT_RESTORE  | open /proc/<pid>/map_files/<range> (exact, even deleted, objects)    |
//!
//! Everything else goes from the effective, permitted, inheritable, ambient and bounding sets.
//! Needed only before this runs: CAP_BPF + CAP_PERFMON (load, attach), CAP_SYSLOG (kallsyms with
//! real addresses), CAP_SETGID + CAP_SETUID (become `--user`), CAP_SETPCAP (shrink the bounding
//! set).
//!
//! Why the uid matters even with no other capability: a uid-0 process owns every root-owned
//! file for permission checks (mode bits), so with `openat` it could rewrite them. As `--user`
//! (default nobody) it can write nothing but its stderr, and seccomp allows no write anywhere
//! else anyway.
//!
//! Reading other users' /proc after the uid change: changing uids makes the sampler (and,
//! through `suid_dumpable`, its /proc files) non-dumpable, and the /proc files of others are
//! checked with `ptrace_may_access(PTRACE_MODE_READ_FSCREDS)`, which CAP_SYS_PTRACE passes
//! whatever the target's uid or dumpable flag (a non-dumpable target's files are root-owned:
//! CAP_DAC_READ_SEARCH covers their mode bits, e.g. map_files/ is 0500). map_files links need
//! CAP_CHECKPOINT_RESTORE in the initial user namespace, which is kept.

use std::collections::{BTreeMap, HashSet};

use anyhow::{anyhow, Context as _};
use caps::{CapSet, Capability, CapsHashSet};
use ember_common::{check_identity, set_no_new_privs};
use nix::unistd::{Gid, Uid};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Capabilities kept after setup (see the table above).
pub const KEPT: [Capability; 3] = [
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_CHECKPOINT_RESTORE,
];

/// Exit status when seccomp refuses a syscall (128 + SIGSYS).
pub const SECCOMP_EXIT: i32 = 128 + libc::SIGSYS;

/// Who the sampler becomes after setup; its supplementary groups are exactly the relay's group
/// (to reach its 0660 socket) or none. Checked after the change by `ember_common::check_identity`,
/// which `record`'s relay uses too.
pub use ember_common::Identity;

/// How the sampler reaches the relay; it decides whether the filter allows connecting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The connection was inherited (`--fd`): never reconnected, so no socket or connect.
    Inherited,
    /// The sampler connects to a socket path and reconnects when the relay restarts.
    Reconnecting,
}

/// Becomes `identity` keeping only [`KEPT`], sets no_new_privs and installs the seccomp
/// filter for `mode`. Call once, after the program is attached and every start-up-only
/// descriptor (kallsyms) is open. The order matters: groups and gid while CAP_SETGID is there,
/// the bounding set while CAP_SETPCAP is there, keepcaps so setresuid keeps the permitted set,
/// then the sets are cut to the kept three.
///
/// `parent` (inherited mode only) is the pid of `ember-relay record` that started us, read at
/// start: the sampler must not outlive it.
pub fn harden(identity: &Identity, mode: Mode, parent: Option<i32>) -> anyhow::Result<()> {
    let kept = kept_of_granted()?;
    let groups: Vec<Gid> = identity.groups.iter().copied().map(Gid::from_raw).collect();
    nix::unistd::setgroups(&groups)
        .with_context(|| format!("setting the supplementary groups to {:?}", identity.groups))?;
    let gid = Gid::from_raw(identity.gid);
    nix::unistd::setresgid(gid, gid, gid)
        .with_context(|| format!("setresgid({})", identity.gid))?;
    cut_bounding_set(&kept)?;
    set_keepcaps(true)?;
    let uid = Uid::from_raw(identity.uid);
    nix::unistd::setresuid(uid, uid, uid)
        .with_context(|| format!("setresuid({})", identity.uid))?;
    keep_only_needed(&kept)?;
    set_keepcaps(false)?;
    check_identity(identity)?;
    if let Some(parent) = parent {
        die_with_parent(parent)?;
    }
    set_no_new_privs()?;
    let program = filter(mode)?;
    install_sigsys_reporter()?;
    seccompiler::apply_filter(&program).context("installing the seccomp filter")?;
    Ok(())
}

/// The capabilities of [`KEPT`] the sampler was started with. A container engine that does not
/// know CAP_CHECKPOINT_RESTORE (Docker Engine before 23.0, where CAP_SYS_ADMIN stands in for it
/// at start and goes here) cannot grant it: the sampler then keeps the other two and opens mapped
/// binaries through /proc/<pid>/root instead of map_files/ (deleted binaries are missed). Never
/// more than [`KEPT`].
fn kept_of_granted() -> anyhow::Result<CapsHashSet> {
    let granted = caps::read(None, CapSet::Permitted).context("reading the permitted set")?;
    let mut kept = CapsHashSet::new();
    for cap in KEPT {
        if granted.contains(&cap) {
            kept.insert(cap);
        } else {
            tracing::warn!(
                capability = %cap,
                "not granted at start, so not kept: grant it to the sampler (docs/deploy.md)"
            );
        }
    }
    Ok(kept)
}

/// Drops every capability but `kept` from the bounding set (needs CAP_SETPCAP, still held),
/// and empties the ambient and inheritable sets, so nothing can come back through an exec.
fn cut_bounding_set(kept: &CapsHashSet) -> anyhow::Result<()> {
    for cap in caps::all() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .with_context(|| format!("dropping {cap} from the bounding set"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).context("clearing the ambient set")?;
    caps::clear(None, CapSet::Inheritable).context("clearing the inheritable set")?;
    Ok(())
}

/// Under `ember-relay record` the relay is our parent: it set PR_SET_PDEATHSIG before exec, but
/// the kernel clears that on any uid/gid change, so it is set again here (prctl is not on the
/// allowlist, so it cannot be undone later). If the parent is already gone (we were reparented),
/// there is nobody to sample for: exit now.
fn die_with_parent(parent: i32) -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG, SIGKILL) takes plain integers and affects only this thread
    // (the only one: the sampler has no other threads).
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_PDEATHSIG)");
    }
    let now = nix::unistd::getppid().as_raw();
    if now != parent {
        return Err(anyhow!(
            "ember-relay record (pid {parent}, our parent) exited before the sampler was confined"
        ));
    }
    Ok(())
}

/// PR_SET_KEEPCAPS: whether setresuid away from 0 keeps the permitted set (it empties the
/// effective set either way).
fn set_keepcaps(keep: bool) -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_KEEPCAPS, 0 or 1) takes plain integers and affects only this thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, libc::c_ulong::from(keep), 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_KEEPCAPS)");
    }
    Ok(())
}

/// Effective = permitted = `kept` (raised again after setresuid emptied the effective set).
fn keep_only_needed(kept: &CapsHashSet) -> anyhow::Result<()> {
    caps::set(None, CapSet::Permitted, kept).context("setting the permitted set")?;
    caps::set(None, CapSet::Effective, kept).context("setting the effective set")?;
    let effective = caps::read(None, CapSet::Effective)?;
    let permitted = caps::read(None, CapSet::Permitted)?;
    if effective != *kept || permitted != *kept {
        return Err(anyhow!(
            "capabilities after the drop are {effective:?} (permitted {permitted:?}), expected {kept:?}"
        ));
    }
    Ok(())
}

/// The syscalls the steady-state loop makes, found by tracing full recordings (strace -f of a
/// sampler through connect, drain, reconnect and exit), each with the reason it is there.
/// Syscalls with argument conditions are listed here too; [`filter`] adds the conditions.
fn allowed(mode: Mode) -> Vec<(i64, &'static str)> {
    let mut list = vec![
        (
            libc::SYS_bpf,
            "map lookup/update/delete/next-key on the attached program's maps (cmd-filtered)",
        ),
        (libc::SYS_read, "reading /proc files"),
        (libc::SYS_pread64, "reading /proc files at an offset"),
        (libc::SYS_lseek, "std's file reads ask for their position"),
        (libc::SYS_write, "log lines, to stderr (fd 2) only"),
        (
            libc::SYS_openat,
            "opening /proc files and mapped binaries, read-only (flags filtered)",
        ),
        (libc::SYS_close, "closing them"),
        (
            libc::SYS_statx,
            "file metadata (device/inode check, /proc/<pid> existence)",
        ),
        (libc::SYS_newfstatat, "file metadata"),
        (libc::SYS_fstat, "file metadata"),
        (libc::SYS_readlinkat, "reading /proc/<pid>/exe"),
        (libc::SYS_fcntl, "descriptor flags"),
        (libc::SYS_sendmsg, "sending batches and descriptors"),
        (
            libc::SYS_recvmsg,
            "noticing the relay closed the connection",
        ),
        (
            libc::SYS_recvfrom,
            "noticing the relay closed the connection",
        ),
        (libc::SYS_ppoll, "waiting on the socket"),
        (
            libc::SYS_epoll_pwait,
            "waiting on the socket and the ring buffer (the set made before the filter: \
             epoll_create1 is not allowed)",
        ),
        (
            libc::SYS_epoll_ctl,
            "changing what that set waits for on the socket",
        ),
        (libc::SYS_clock_nanosleep, "sleeping between intervals"),
        (libc::SYS_nanosleep, "sleeping between intervals"),
        (libc::SYS_clock_gettime, "time (when the vDSO is not used)"),
        (libc::SYS_brk, "the allocator"),
        (libc::SYS_mmap, "the allocator"),
        (libc::SYS_munmap, "the allocator"),
        (libc::SYS_mremap, "the allocator"),
        (libc::SYS_mprotect, "the allocator"),
        (libc::SYS_madvise, "the allocator"),
        (libc::SYS_futex, "std's locks"),
        (libc::SYS_getrandom, "HashMap seeds"),
        (libc::SYS_getpid, "own pid"),
        (libc::SYS_gettid, "own tid"),
        (
            libc::SYS_tgkill,
            "abort on panic, at ourselves only (pid-filtered)",
        ),
        (
            libc::SYS_rt_sigreturn,
            "returning from the SIGINT/SIGTERM handler",
        ),
        (libc::SYS_rt_sigprocmask, "abort on panic"),
        (libc::SYS_sigaltstack, "std's stack-overflow guard"),
        (libc::SYS_sched_yield, "spin loops in std"),
        (libc::SYS_exit, "thread exit"),
        (libc::SYS_exit_group, "process exit"),
    ];
    if mode == Mode::Reconnecting {
        // A sampler on a socket path must reconnect when the relay restarts, so it keeps
        // socket + connect. connect's address cannot be filtered (it is a pointer), but the
        // sampler is no longer root: it can connect only to sockets its uid and groups (at most
        // the relay's group) may write, and only AF_UNIX sockets can be created. An inherited
        // connection is never reconnected and gets none of these.
        list.extend([
            (
                libc::SYS_socket,
                "a new Unix socket to reconnect (AF_UNIX only, filtered)",
            ),
            (libc::SYS_connect, "connecting it to the relay"),
            (libc::SYS_setsockopt, "its send buffer size"),
            (libc::SYS_getsockopt, "SO_PEERCRED of the relay"),
        ]);
    }
    #[cfg(target_arch = "x86_64")]
    list.extend([
        (libc::SYS_poll, "waiting on the socket"),
        (
            libc::SYS_epoll_wait,
            "waiting on the socket and the ring buffer",
        ),
        (libc::SYS_readlink, "reading /proc/<pid>/exe"),
        (libc::SYS_access, "path checks"),
        (libc::SYS_stat, "file metadata"),
    ]);
    list
}

/// Builds the filter for `mode`: allowlisted syscalls pass; `openat` only read-only, `write`
/// only to stderr, `socket` only for AF_UNIX, `bpf` only for map element commands, `tgkill`
/// only at ourselves (abort); anything else traps (SIGSYS), which the reporter below turns
/// into a log line and exit status [`SECCOMP_EXIT`].
pub fn filter(mode: Mode) -> anyhow::Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, _why) in allowed(mode) {
        rules.insert(nr, Vec::new());
    }
    let eq = |arg: u8, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
    };
    // openat(dirfd, path, flags, mode): no write access, no creation, no truncation. O_TMPFILE
    // needs write access, so it is refused too.
    let not_writing = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) as u64;
    rules.insert(
        libc::SYS_openat,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(not_writing),
            libc::O_RDONLY as u64,
        )?])?],
    );
    // write(fd, ..): stderr only (logs, the SIGSYS and panic reports).
    rules.insert(
        libc::SYS_write,
        vec![SeccompRule::new(vec![eq(0, libc::STDERR_FILENO as u64)?])?],
    );
    if mode == Mode::Reconnecting {
        rules.insert(
            libc::SYS_socket,
            vec![SeccompRule::new(vec![eq(0, libc::AF_UNIX as u64)?])?],
        );
    }
    // BPF_MAP_LOOKUP_ELEM = 1, BPF_MAP_UPDATE_ELEM = 2, BPF_MAP_DELETE_ELEM = 3,
    // BPF_MAP_GET_NEXT_KEY = 4, and BPF_MAP_LOOKUP_AND_DELETE_BATCH = 25 (the drain empties the
    // old generation's hash maps in batches): no program loads, no new maps (BPF_MAP_CREATE =
    // 0), no attach, no batch updates or lookups that leave entries.
    let mut bpf = Vec::new();
    for cmd in [1, 2, 3, 4, crate::bulk::BPF_MAP_LOOKUP_AND_DELETE_BATCH] {
        bpf.push(SeccompRule::new(vec![eq(0, cmd)?])?);
    }
    rules.insert(libc::SYS_bpf, bpf);
    let pid = std::process::id();
    rules.insert(
        libc::SYS_tgkill,
        vec![SeccompRule::new(vec![eq(0, u64::from(pid))?])?],
    );
    let arch = std::env::consts::ARCH.try_into().map_err(|_| {
        anyhow!(
            "seccomp: unsupported architecture {}",
            std::env::consts::ARCH
        )
    })?;
    let filter = SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, arch)
        .context("building the seccomp filter")?;
    BpfProgram::try_from(filter).context("compiling the seccomp filter")
}

/// Number of syscalls on the allowlist for `mode` (for reports).
pub fn allowed_count(mode: Mode) -> usize {
    let unique: HashSet<i64> = allowed(mode).into_iter().map(|(nr, _)| nr).collect();
    unique.len()
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; for SIGSYS the
    // syscall number is the int at offset 24 (si_signo, si_errno, si_code, padding, then
    // _sigsys { void *call_addr; int syscall; unsigned arch; }).
    let nr = unsafe { *(info.cast::<u8>().add(24).cast::<i32>()) };
    let mut buf = [0u8; 160];
    let prefix = b"ember-sampler: seccomp refused system call ";
    let suffix =
        b"; this is a bug in ember-sampler's allowlist (sampler/src/harden.rs), please report it\n";
    let mut len = 0;
    for &b in prefix {
        buf[len] = b;
        len += 1;
    }
    let mut digits = [0u8; 12];
    let mut n = nr.unsigned_abs();
    let mut d = 0;
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        d += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        buf[len] = digits[d];
        len += 1;
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffers are valid for their lengths.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), len);
        libc::write(2, suffix.as_ptr().cast(), suffix.len());
        libc::_exit(SECCOMP_EXIT);
    }
}

fn install_sigsys_reporter() -> anyhow::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::SigAction(on_sigsys),
        SaFlags::SA_SIGINFO,
        SigSet::empty(),
    );
    // SAFETY: the handler uses only async-signal-safe calls.
    unsafe { sigaction(Signal::SIGSYS, &action) }.context("installing the SIGSYS reporter")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd as _;

    use nix::sys::wait::WaitStatus;

    use super::*;

    /// Runs `body` in a forked child under the real filter for `mode`; returns its exit code.
    /// The body exits non-zero itself when an allowed call fails in an unexpected way.
    fn in_filtered_child(mode: Mode, body: impl FnOnce()) -> i32 {
        let program = filter(mode).expect("filter builds");
        // SAFETY: the child only calls prctl, sigaction and the syscalls under test, then exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let ok = set_no_new_privs().is_ok()
                    && install_sigsys_reporter().is_ok()
                    && seccompiler::apply_filter(&program).is_ok();
                if !ok {
                    // SAFETY: exiting the forked child without running destructors.
                    unsafe { libc::_exit(3) };
                }
                body();
                // SAFETY: as above.
                unsafe { libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                match nix::sys::wait::waitpid(child, None).expect("waitpid") {
                    WaitStatus::Exited(_, code) => code,
                    other => panic!("child ended with {other:?}"),
                }
            }
        }
    }

    fn refused(mode: Mode, what: &str, body: impl FnOnce()) {
        assert_eq!(
            in_filtered_child(mode, body),
            SECCOMP_EXIT,
            "{what} was not refused in {mode:?} mode"
        );
    }

    fn allowed_ok(mode: Mode, what: &str, body: impl FnOnce()) {
        assert_eq!(
            in_filtered_child(mode, body),
            0,
            "{what} failed in {mode:?} mode"
        );
    }

    /// Exits the child with `code` (the allowed call did not do what it should).
    fn fail(code: i32) {
        // SAFETY: exiting the forked child.
        unsafe { libc::_exit(code) };
    }

    fn openat(path: &std::ffi::CStr, flags: libc::c_int) -> libc::c_int {
        // SAFETY: a valid NUL-terminated path; the mode is read only with O_CREAT.
        unsafe { libc::openat(libc::AT_FDCWD, path.as_ptr(), flags, 0o600) }
    }

    const BOTH: [Mode; 2] = [Mode::Inherited, Mode::Reconnecting];

    #[test]
    fn privileged_operations_are_refused() {
        for mode in BOTH {
            // SAFETY (all below): raw syscalls with plain or null arguments; each traps before
            // the kernel looks at them.
            refused(mode, "ptrace", || unsafe {
                libc::ptrace(libc::PTRACE_ATTACH, 1, 0, 0);
            });
            refused(mode, "setuid", || unsafe {
                libc::syscall(libc::SYS_setuid, 0);
            });
            refused(mode, "mount", || unsafe {
                libc::syscall(libc::SYS_mount, 0, 0, 0, 0, 0);
            });
            refused(mode, "bpf(BPF_MAP_CREATE)", || unsafe {
                libc::syscall(libc::SYS_bpf, 0, 0, 0);
            });
            refused(mode, "bpf(BPF_PROG_LOAD)", || unsafe {
                libc::syscall(libc::SYS_bpf, 5, 0, 0);
            });
            // Of the batch commands only the drain's lookup-and-delete is allowed.
            refused(mode, "bpf(BPF_MAP_UPDATE_BATCH)", || unsafe {
                libc::syscall(libc::SYS_bpf, 26, 0, 0);
            });
            refused(mode, "execve", || {
                let path = c"/bin/true";
                let argv = [path.as_ptr(), std::ptr::null()];
                // SAFETY: valid NUL-terminated path and argv.
                unsafe { libc::execv(path.as_ptr(), argv.as_ptr()) };
            });
            refused(mode, "an AF_INET socket", || unsafe {
                libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            });
            // The drain loop's epoll set is made before the filter: no other can be made.
            refused(mode, "epoll_create1", || unsafe {
                libc::epoll_create1(libc::EPOLL_CLOEXEC);
            });
        }
    }

    #[test]
    fn opening_for_writing_creating_or_truncating_is_refused() {
        let dir = tempfile_dir("open");
        let new_file = std::ffi::CString::new(format!("{dir}/new")).expect("path");
        for mode in BOTH {
            refused(mode, "openat O_WRONLY", || {
                openat(c"/dev/null", libc::O_WRONLY);
            });
            refused(mode, "openat O_RDWR", || {
                openat(c"/dev/null", libc::O_RDWR);
            });
            refused(mode, "openat O_CREAT", || {
                openat(&new_file, libc::O_RDONLY | libc::O_CREAT);
            });
            refused(mode, "openat O_TRUNC", || {
                openat(c"/dev/null", libc::O_RDONLY | libc::O_TRUNC);
            });
        }
        assert!(!std::path::Path::new(&format!("{dir}/new")).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A private directory for files the tests must not create.
    fn tempfile_dir(tag: &str) -> String {
        let dir = std::env::temp_dir().join(format!("ember-harden-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.to_string_lossy().into_owned()
    }

    #[test]
    fn writing_anywhere_but_stderr_is_refused() {
        let dir = tempfile_dir("write");
        let path = format!("{dir}/written");
        let file = std::fs::File::create(&path).expect("a regular file");
        let fd = file.as_raw_fd();
        for mode in BOTH {
            refused(mode, "write to fd 1", || unsafe {
                // SAFETY: a plain write of a valid buffer.
                libc::write(1, b"x".as_ptr().cast(), 1);
            });
            refused(mode, "write to a regular file", || unsafe {
                // SAFETY: as above; `fd` is open in the child (inherited through fork).
                libc::write(fd, b"x".as_ptr().cast(), 1);
            });
        }
        assert_eq!(std::fs::metadata(&path).expect("file").len(), 0);
        drop(file);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_inherited_sampler_cannot_make_or_connect_sockets() {
        refused(Mode::Inherited, "socket(AF_UNIX)", || unsafe {
            // SAFETY: a plain socket(2) call.
            libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        });
        refused(Mode::Inherited, "connect", || unsafe {
            // SAFETY: connect on an invalid fd with a null address: trapped before the kernel.
            libc::connect(-1, std::ptr::null(), 0);
        });
    }

    #[test]
    fn the_steady_state_calls_are_allowed() {
        for mode in BOTH {
            allowed_ok(mode, "openat O_RDONLY + read", || {
                if std::fs::read_to_string("/proc/self/status").is_err() {
                    fail(4);
                }
            });
            allowed_ok(mode, "write to stderr", || {
                // SAFETY: a zero-length write of a valid buffer.
                if unsafe { libc::write(2, b"".as_ptr().cast(), 0) } != 0 {
                    fail(4);
                }
            });
            let set = crate::waitset::WaitSet::new().expect("an epoll set, made before the filter");
            let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().expect("pair");
            theirs.send(b"x").expect("send");
            allowed_ok(
                mode,
                "epoll_ctl + epoll_wait on a set made before",
                move || {
                    let mut set = set;
                    set.watch_conn(Some(std::os::fd::AsFd::as_fd(&ours)), libc::EPOLLIN as u32);
                    match set.wait(1000, false) {
                        Ok(ready) if ready.conn == libc::EPOLLIN as u32 => {}
                        _ => fail(4),
                    }
                },
            );
            allowed_ok(mode, "bpf(BPF_MAP_LOOKUP_ELEM)", || {
                // SAFETY: a lookup on a bad fd with a null attribute: the kernel refuses it with
                // an errno, which is all this checks.
                unsafe { libc::syscall(libc::SYS_bpf, 1, 0, 0) };
            });
            allowed_ok(mode, "bpf(BPF_MAP_LOOKUP_AND_DELETE_BATCH)", || {
                // SAFETY: as above: refused with an errno, which is all this checks.
                unsafe {
                    libc::syscall(
                        libc::SYS_bpf,
                        crate::bulk::BPF_MAP_LOOKUP_AND_DELETE_BATCH,
                        0,
                        0,
                    )
                };
            });
        }
        allowed_ok(Mode::Reconnecting, "socket(AF_UNIX) + connect", || {
            match ember_protocol::transport::connect(std::path::Path::new(
                "/nonexistent/ember.sock",
            )) {
                Err(nix::errno::Errno::ENOENT) => {}
                _ => fail(4),
            }
        });
    }
}
