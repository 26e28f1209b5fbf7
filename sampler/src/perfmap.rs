//! Opens a process's perf map (`/tmp/perf-<N>.map`, which JIT runtimes write about their code:
//! Node `--perf-basic-prof`, `jcmd PID Compiler.perfmap`, Python `-X perf`, .NET
//! `DOTNET_PerfMapEnabled=1`) for the relay, the way `perf` finds it: as the process sees it
//! (under `/proc/<pid>/root`), N its pid in its own pid namespace (the last field of `NSpid:`
//! in `/proc/<pid>/status`, which the kernel writes).
//!
//! The sampler reads nothing of the file: the relay parses it through the passed descriptor.
//! What makes passing it safe, as root for a hostile process:
//! - no symlink is followed at any step: the process's root is opened as a directory (the
//!   kernel's own `root` link, which names the process's root, not a path it chose), `tmp` in it
//!   with `O_DIRECTORY | O_NOFOLLOW`, and the map with `O_PATH | O_NOFOLLOW` (a symlink is then
//!   itself what is opened, and refused);
//! - the `O_PATH` descriptor opens nothing for reading; `fstat` on it must show a regular file
//!   owned by the process's real uid (the uid the kernel reports in its status; perf's own rule,
//!   so a process can only hand over a file its own user could write) and no larger than
//!   [`PERF_MAP_MAX_BYTES`];
//! - only then is it reopened read-only through `/proc/self/fd/N`, the very inode checked, so no
//!   device or FIFO is ever opened for reading (an open of either can block or act).
//!
//! Syscalls: `openat` (read-only flags) and `fstat`, both already in the seccomp allowlist.

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
};

use crate::procfs::ProcDir;

/// Largest perf map passed, at the time it is opened (it may grow later: the relay bounds what
/// it reads of it). A 20 MB map (a busy Node service) passes with room.
pub const PERF_MAP_MAX_BYTES: u64 = 256 << 20;

/// What was found of a process's perf map.
#[derive(Debug)]
pub enum PerfMap {
    /// There is none (most processes), or the process's root or `tmp` cannot be opened.
    Absent,
    /// A read-only descriptor of it, to pass.
    Open(OwnedFd),
    /// It exists but is not passed, and why (counted by the caller, sent to the relay).
    Refused(&'static str),
}

/// Finds and opens `pid`'s perf map. `ns_pid` is its pid in its own namespace and `uid` its real
/// uid, both from its status file.
#[cfg(test)]
pub fn open_perf_map(pid: u32, ns_pid: u32, uid: u32) -> PerfMap {
    match ProcDir::open(pid) {
        Ok(dir) => open_perf_map_at(&dir, ns_pid, uid),
        Err(_) => PerfMap::Absent,
    }
}

/// [`open_perf_map`] of the process whose `/proc/<pid>` is `dir` (its `root` is found from it).
pub fn open_perf_map_at(dir: &ProcDir, ns_pid: u32, uid: u32) -> PerfMap {
    let Some(root) = open_at(dir.raw(), c"root", libc::O_PATH | libc::O_DIRECTORY) else {
        return PerfMap::Absent;
    };
    let tmp = match open_at(
        root.as_raw_fd(),
        c"tmp",
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    ) {
        Some(tmp) => tmp,
        // ELOOP/ENOTDIR: `tmp` is a symlink (or no directory); a missing one means no map.
        None if last_errno_is(&[libc::ELOOP, libc::ENOTDIR]) => {
            return PerfMap::Refused("its /tmp is a symlink or not a directory")
        }
        None => return PerfMap::Absent,
    };
    let Ok(name) = CString::new(format!("perf-{ns_pid}.map")) else {
        return PerfMap::Absent;
    };
    let Some(path_fd) = open_at(tmp.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW) else {
        return PerfMap::Absent;
    };
    let Some(meta) = fstat(path_fd.as_raw_fd()) else {
        return PerfMap::Absent;
    };
    if let Err(reason) = acceptable(&meta, uid) {
        return PerfMap::Refused(reason);
    }
    let Ok(reopen) = CString::new(format!("/proc/self/fd/{}", path_fd.as_raw_fd())) else {
        return PerfMap::Absent;
    };
    let Some(file) = open_at(
        libc::AT_FDCWD,
        &reopen,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
    ) else {
        return PerfMap::Absent;
    };
    // The same inode the checks were made on (the O_PATH descriptor pins it; checked anyway).
    match fstat(file.as_raw_fd()) {
        Some(now) if now.st_dev == meta.st_dev && now.st_ino == meta.st_ino => PerfMap::Open(file),
        _ => PerfMap::Refused("it changed while being opened"),
    }
}

/// Why a file with these metadata may not be passed as the perf map of a process of `uid`.
fn acceptable(meta: &libc::stat, uid: u32) -> Result<(), &'static str> {
    match meta.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFLNK => return Err("it is a symlink"),
        _ => return Err("it is not a regular file"),
    }
    if meta.st_uid != uid {
        return Err("it is owned by another user than the process's");
    }
    if u64::try_from(meta.st_size).map_or(true, |size| size > PERF_MAP_MAX_BYTES) {
        return Err("it is larger than the sampler passes");
    }
    Ok(())
}

/// `openat(dir, path, flags | O_CLOEXEC)`, `None` on failure (errno kept for
/// [`last_errno_is`]).
fn open_at(dir: RawFd, path: &std::ffi::CStr, flags: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: `path` is NUL-terminated; the flags create and truncate nothing (the seccomp
    // filter would refuse it).
    let fd = unsafe { libc::openat(dir, path.as_ptr(), flags | libc::O_CLOEXEC) };
    // SAFETY: a non-negative return is a descriptor this process now owns, once.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

fn last_errno_is(errnos: &[libc::c_int]) -> bool {
    std::io::Error::last_os_error()
        .raw_os_error()
        .is_some_and(|e| errnos.contains(&e))
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut meta: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `meta` is a writable stat buffer and `fd` a descriptor this process holds.
    (unsafe { libc::fstat(fd, &mut meta) } == 0).then_some(meta)
}

/// The pid of a process in its own pid namespace: the last number of its status's `NSpid:`
/// line (the kernel writes it; the process's name, the only text it chose, comes first and has
/// its line breaks escaped). Kernels before 4.1 have no such line: the pid itself then.
pub fn ns_pid(status: &ember_common::ProcStatus, pid: u32) -> u32 {
    status
        .field("NSpid")
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or(pid)
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::MetadataExt as _};

    use super::*;

    fn refused(map: PerfMap) -> &'static str {
        match map {
            PerfMap::Refused(reason) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn only_a_regular_file_of_the_processs_own_user_is_passed() {
        // Given this process's /tmp, with a perf map under a pid no process of ours has
        let me = std::process::id();
        let uid = fs::metadata("/proc/self").expect("stat /proc/self").uid();
        let fake = 4_000_000_000u32 - me;
        let path = format!("/tmp/perf-{fake}.map");
        let _ = fs::remove_file(&path);
        // When there is none, Then it is absent
        assert!(matches!(open_perf_map(me, fake, uid), PerfMap::Absent));
        // When it is a regular file of our uid, Then it is opened, and it is that file
        fs::write(&path, "1000 10 f\n").expect("write the map");
        let PerfMap::Open(fd) = open_perf_map(me, fake, uid) else {
            panic!("our own map is passed");
        };
        let meta = fs::File::from(fd).metadata().expect("fstat");
        assert_eq!(meta.ino(), fs::metadata(&path).expect("stat").ino());
        // When the process's uid is another, Then it is refused
        assert!(refused(open_perf_map(me, fake, uid + 1)).contains("another user"));
        // When it is a symlink to a file of ours, Then it is refused, not followed
        fs::remove_file(&path).expect("remove");
        std::os::unix::fs::symlink("/etc/hostname", &path).expect("symlink");
        assert!(refused(open_perf_map(me, fake, uid)).contains("symlink"));
        fs::remove_file(&path).expect("remove");
        // When it is a FIFO, Then it is refused without being opened for reading (which would
        // block this test)
        nix::unistd::mkfifo(path.as_str(), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(refused(open_perf_map(me, fake, uid)).contains("not a regular file"));
        fs::remove_file(&path).expect("remove");
    }

    #[test]
    fn the_namespace_pid_is_the_last_nspid_field() {
        let status = ember_common::ProcStatus::parse(b"Name:\tx\nNSpid:\t4242\t17\n");
        assert_eq!(ns_pid(&status, 4242), 17);
        let old = ember_common::ProcStatus::parse(b"Name:\tx\n");
        assert_eq!(ns_pid(&old, 4242), 4242);
    }
}
