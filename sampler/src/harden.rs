//! The sampler's confinement after setup: capabilities cut to what the steady-state loop needs,
//! no_new_privs, and a seccomp allowlist of the syscalls that loop makes. One file, every line
//! explained, so it can be reviewed as a whole.
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
//! real addresses), CAP_SETGID (join the relay's group), CAP_SETPCAP (shrink the bounding set).

use std::collections::{BTreeMap, HashSet};

use anyhow::{anyhow, Context as _};
use caps::{CapSet, Capability, CapsHashSet};
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

/// Drops capabilities, sets no_new_privs and installs the seccomp filter. Call once, after the
/// program is attached and every start-up-only descriptor (kallsyms) is open.
pub fn harden() -> anyhow::Result<()> {
    drop_capabilities()?;
    set_no_new_privs()?;
    let program = filter()?;
    install_sigsys_reporter()?;
    seccompiler::apply_filter(&program).context("installing the seccomp filter")?;
    Ok(())
}

/// Joins a supplementary group while we still may (CAP_SETGID), so the sampler can connect to a
/// relay socket of mode 0660 owned by the relay's group after losing CAP_DAC_OVERRIDE.
pub fn join_group(gid: u32) -> anyhow::Result<()> {
    nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(gid)])
        .with_context(|| format!("joining group {gid} (the relay's group)"))
}

fn drop_capabilities() -> anyhow::Result<()> {
    let kept: CapsHashSet = KEPT.into_iter().collect();
    // The bounding set first: dropping from it needs CAP_SETPCAP, which goes next.
    for cap in caps::all() {
        if !kept.contains(&cap) {
            caps::drop(None, CapSet::Bounding, cap)
                .with_context(|| format!("dropping {cap} from the bounding set"))?;
        }
    }
    caps::clear(None, CapSet::Ambient).context("clearing the ambient set")?;
    caps::clear(None, CapSet::Inheritable).context("clearing the inheritable set")?;
    caps::set(None, CapSet::Effective, &kept).context("setting the effective set")?;
    caps::set(None, CapSet::Permitted, &kept).context("setting the permitted set")?;
    let effective = caps::read(None, CapSet::Effective)?;
    if effective != kept {
        return Err(anyhow!(
            "capabilities after drop are {effective:?}, expected {kept:?}"
        ));
    }
    Ok(())
}

fn set_no_new_privs() -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes plain integers and affects only this process;
    // it is also what lets an unprivileged process install a seccomp filter.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_NO_NEW_PRIVS)");
    }
    Ok(())
}

/// The syscalls the steady-state loop makes, found by tracing full recordings (strace -f of a
/// sampler through connect, drain, reconnect and exit), each with the reason it is there.
fn allowed() -> Vec<(i64, &'static str)> {
    let mut list = vec![
        (
            libc::SYS_bpf,
            "map lookup/delete/next-key on the attached program's maps (cmd-filtered)",
        ),
        (libc::SYS_read, "reading /proc files"),
        (libc::SYS_pread64, "reading /proc files at an offset"),
        (libc::SYS_lseek, "rewinding /proc files"),
        (libc::SYS_write, "log lines to stderr"),
        (libc::SYS_openat, "opening /proc files and mapped binaries"),
        (libc::SYS_close, "closing them"),
        (
            libc::SYS_statx,
            "file metadata (device/inode check, /proc/<pid> existence)",
        ),
        (libc::SYS_newfstatat, "file metadata"),
        (libc::SYS_fstat, "file metadata"),
        (libc::SYS_getdents64, "listing /proc/<pid>/task"),
        (libc::SYS_readlinkat, "reading /proc/<pid>/exe"),
        (libc::SYS_fcntl, "descriptor flags"),
        (
            libc::SYS_socket,
            "a new Unix socket to reconnect (AF_UNIX only, filtered)",
        ),
        (libc::SYS_connect, "connecting it to the relay"),
        (libc::SYS_setsockopt, "its send buffer size"),
        (libc::SYS_getsockopt, "SO_PEERCRED of the relay"),
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
            libc::SYS_rt_sigreturn,
            "returning from the SIGINT/SIGTERM handler",
        ),
        (libc::SYS_rt_sigprocmask, "abort on panic"),
        (libc::SYS_sigaltstack, "std's stack-overflow guard"),
        (libc::SYS_sched_yield, "spin loops in std"),
        (libc::SYS_exit, "thread exit"),
        (libc::SYS_exit_group, "process exit"),
    ];
    #[cfg(target_arch = "x86_64")]
    list.extend([
        (libc::SYS_poll, "waiting on the socket"),
        (libc::SYS_readlink, "reading /proc/<pid>/exe"),
        (libc::SYS_access, "path checks"),
        (libc::SYS_stat, "file metadata"),
    ]);
    list
}

/// Builds the filter: allowlisted syscalls pass, `socket` only for AF_UNIX, `bpf` only for map
/// element commands, `tgkill` only at ourselves (abort); anything else traps (SIGSYS), which
/// the reporter below turns into a log line and exit status [`SECCOMP_EXIT`].
pub fn filter() -> anyhow::Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, _why) in allowed() {
        rules.insert(nr, Vec::new());
    }
    let eq = |arg: u8, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
    };
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![eq(0, libc::AF_UNIX as u64)?])?],
    );
    // BPF_MAP_LOOKUP_ELEM = 1, BPF_MAP_UPDATE_ELEM = 2, BPF_MAP_DELETE_ELEM = 3,
    // BPF_MAP_GET_NEXT_KEY = 4: no program loads, no new maps, no attach.
    let mut bpf = Vec::new();
    for cmd in 1..=4u64 {
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

/// Number of syscalls on the allowlist (for reports).
pub fn allowed_count() -> usize {
    let unique: HashSet<i64> = allowed()
        .into_iter()
        .map(|(nr, _)| nr)
        .chain([libc::SYS_socket, libc::SYS_bpf, libc::SYS_tgkill])
        .collect();
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
    use super::*;

    /// Runs `body` in a forked child under the real filter; returns its wait status.
    fn in_filtered_child(body: fn()) -> nix::sys::wait::WaitStatus {
        let program = filter().expect("filter builds");
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
                nix::sys::wait::waitpid(child, None).expect("waitpid")
            }
        }
    }

    #[test]
    fn an_inet_socket_is_refused() {
        let status = in_filtered_child(|| {
            // SAFETY: a plain socket(2) call.
            unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        });
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(status.pid().expect("pid"), SECCOMP_EXIT)
        );
    }

    #[test]
    fn a_unix_socket_is_allowed() {
        let status = in_filtered_child(|| {
            // SAFETY: a plain socket(2) call.
            let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0) };
            if fd < 0 {
                // SAFETY: exiting the child.
                unsafe { libc::_exit(4) };
            }
        });
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(status.pid().expect("pid"), 0)
        );
    }

    #[test]
    fn execve_and_bpf_prog_load_are_refused() {
        let status = in_filtered_child(|| {
            // SAFETY: BPF_PROG_LOAD (5) with a null attribute: refused before the kernel looks.
            unsafe { libc::syscall(libc::SYS_bpf, 5, 0, 0) };
        });
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(status.pid().expect("pid"), SECCOMP_EXIT)
        );
        let status = in_filtered_child(|| {
            let path = c"/bin/true";
            let argv = [path.as_ptr(), std::ptr::null()];
            // SAFETY: valid NUL-terminated path and argv.
            unsafe { libc::execv(path.as_ptr(), argv.as_ptr()) };
        });
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(status.pid().expect("pid"), SECCOMP_EXIT)
        );
    }
}
