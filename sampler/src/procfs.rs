//! Reads the facts only the privileged side can see about a process from /proc: executable
//! mappings, executable path, cgroup, start time, real uid, the two allowlisted variables of
//! its environment ([`ENV_ALLOWLIST`]: nothing else of `/proc/PID/environ` is kept) and, only
//! with `--command-line`, the command line ([`forward_command_lines`]), and opens each mapped file once per
//! (device, inode) so the relay can read it through the passed descriptor, and its perf map if it
//! has one ([`crate::perfmap`]). Thread names are not
//! read here: each sample's row carries the name of its thread, from eBPF.
//!
//! Only kernel-formatted text is read here (maps, stat, status; environ is only scanned for two
//! name prefixes, its values are forwarded unparsed; the cgroup file is forwarded whole, bounded
//! and unparsed: the relay reads its v1 and v2 lines); file contents are never parsed.
//! Every failure is per process and reported to the caller, never fatal: processes exit at any
//! moment.
//!
//! What a process start costs here: one `/proc/<pid>` descriptor ([`ProcDir`]) through which
//! maps, exe, cgroup, stat, status, environ (and comm, cmdline, perf map only when needed) are
//! read, each in one pass; a mapped file is opened only for a (device, inode) the table does not
//! hold. At a process's first sample the eBPF program reports its uid, cgroup id and start time
//! ([`Observed`]): its status file is then read only when it runs anonymous code (a perf map's
//! owner and pid), its cgroup file only when no process of that cgroup was read lately
//! ([`crate::cgroups`]), and its stat file only when its group leader exited since that sample
//! (or the start times are still being checked: [`crate::tracker::StartCheck`]).
//!
//! Taking the file's identity from the maps line (kernel-written) is safe because the table
//! holds a descriptor of every file it names (checked against that identity when opened
//! through `map_files/`, the exact object the process maps): while it is held the inode cannot
//! be freed, so no other file can come to have its (device, inode), and a process mapping that
//! pair maps that very file, whatever was renamed, replaced or deleted under its path since.
//! A file that could not be opened is forgotten as soon as no process maps it, since nothing
//! pins its number.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ffi::{CStr, CString},
    fs::File,
    io::{BufRead as _, BufReader, Read},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::fs::MetadataExt as _,
    },
    path::Path,
    rc::Rc,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use ember_protocol::{FileInfo, Mapping, ProcessInfo, NO_FD};

use crate::{
    cgroups::CgroupCache,
    limits::{
        ENVIRON_MAX_BYTES, ENV_VALUE_MAX_BYTES, MAPS_MAX_BYTES, MAX_FILES_PER_PROCESS,
        MAX_MAPPINGS_PER_PROCESS, MAX_OPEN_FILES, NOFILE_RESERVE, PATH_CUT_MARK, PATH_MAX_BYTES,
        SMALL_FILE_MAX_BYTES,
    },
    perfmap::{self, PerfMap},
};

/// One mapped file, shared by every process that maps it.
pub struct OpenFile {
    pub id: u64,
    pub fd: Option<Rc<OwnedFd>>,
    pub info: FileInfo,
    /// Processes whose current facts refer to this file.
    refs: usize,
    /// Left unopened by a cap (not by an error): opened when a later process may.
    capped: bool,
    /// Since when no process refers to it, while it is kept open for [`FILE_IDLE_GRACE`].
    idle_since: Option<Instant>,
}

/// How long a file nobody maps any more stays open (and known to the relay under its id): a
/// program started again and again (a shell loop, a build, cron) maps the same binaries, and
/// with its file kept the next start costs no open, no `files` message, and no new ELF read nor
/// unwind table in the relay. Short, because a held descriptor keeps a deleted file's blocks
/// and its file system busy (a container's root cannot be unmounted while it is held).
pub use ember_protocol::FILE_IDLE_GRACE;

/// Mapped files by (device, inode), each opened once and reused.
pub struct FileTable {
    files: HashMap<(u64, u64), OpenFile>,
    /// File id -> (device, inode), so lookups by id need no scan.
    ids: HashMap<u64, (u64, u64)>,
    next_id: u64,
    /// Files held open now, and the most allowed (see [`open_files_cap`]).
    open: usize,
    max_open: usize,
    /// Files not opened because of a cap, since start.
    pub unopened: u64,
    /// Ids of files closed since the last [`FileTable::take_closed`], for the relay.
    closed: Vec<u64>,
    /// Open files nobody maps, oldest first (entries revived meanwhile are skipped).
    idle: VecDeque<(Instant, (u64, u64))>,
    /// How long those stay open ([`FILE_IDLE_GRACE`]; zero closes at once).
    pub idle_grace: Duration,
}

/// The global open-file cap: [`MAX_OPEN_FILES`], and never closer than [`NOFILE_RESERVE`] to
/// the soft RLIMIT_NOFILE, so a process cannot starve the sampler of descriptors.
pub fn open_files_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let below_limit = usize::try_from(soft.saturating_sub(NOFILE_RESERVE)).unwrap_or(usize::MAX);
    MAX_OPEN_FILES.min(below_limit)
}

/// Budget of one process's [`FileTable::intern`] calls.
struct ProcessBudget {
    pid: u32,
    /// Files this process made the sampler open.
    opened: usize,
}

impl FileTable {
    pub fn new(max_open: usize) -> Self {
        Self {
            files: HashMap::new(),
            ids: HashMap::new(),
            next_id: 0,
            open: 0,
            max_open,
            unopened: 0,
            closed: Vec::new(),
            idle: VecDeque::new(),
            idle_grace: FILE_IDLE_GRACE,
        }
    }

    /// Every file currently held, for re-sending after a reconnect.
    pub fn all(&self) -> impl Iterator<Item = &OpenFile> {
        self.files.values()
    }

    /// Whether `id` names a file the sampler holds (an unwind table may only be for one).
    pub fn has_id(&self, id: u64) -> bool {
        self.ids.contains_key(&id)
    }

    /// Files held open now.
    pub fn open_count(&self) -> usize {
        self.open
    }

    /// Why no file may be opened for this process now, if a cap says so.
    fn cap_reached(&self, budget: &ProcessBudget) -> Option<String> {
        if budget.opened >= MAX_FILES_PER_PROCESS {
            return Some(format!(
                "not opened: the sampler's cap of {MAX_FILES_PER_PROCESS} files per process was reached"
            ));
        }
        if self.open >= self.max_open {
            return Some(format!(
                "not opened: the sampler's cap of {} open files was reached",
                self.max_open
            ));
        }
        None
    }

    /// Opens the file of `mapping` for `budget.pid` unless a cap stops it.
    fn open_within_caps(
        &mut self,
        budget: &mut ProcessBudget,
        mapping: &Mapping,
    ) -> (Option<Rc<OwnedFd>>, String, bool) {
        // Files nobody maps make room before any file goes unopened.
        while self.open >= self.max_open && self.close_oldest_idle() {}
        if let Some(reason) = self.cap_reached(budget) {
            self.unopened += 1;
            return (None, reason, true);
        }
        budget.opened += 1;
        match open_mapped(budget.pid, mapping) {
            Ok(fd) => {
                self.open += 1;
                (Some(Rc::new(fd)), String::new(), false)
            }
            Err(err) => (None, err, false),
        }
    }

    /// Returns the id of the file behind `mapping`, opening it if new (or if a cap kept it
    /// closed before and no longer does); files to (re)send are pushed to `fresh`.
    fn intern(
        &mut self,
        budget: &mut ProcessBudget,
        mapping: &Mapping,
        fresh: &mut Vec<u64>,
    ) -> u64 {
        let key = (mapping.device, mapping.inode);
        let retry = match self.files.get_mut(&key) {
            Some(file) => {
                file.refs += 1;
                // Kept open while nobody mapped it: the relay still holds it under its id.
                file.idle_since = None;
                file.capped.then_some(file.id)
            }
            None => None,
        };
        if let Some(id) = retry {
            if self.cap_reached(budget).is_none() {
                let (fd, open_error, capped) = self.open_within_caps(budget, mapping);
                if let Some(file) = self.files.get_mut(&key) {
                    file.fd = fd;
                    file.info.open_error = open_error;
                    file.capped = capped;
                }
                fresh.push(id);
            }
            return id;
        }
        if let Some(file) = self.files.get(&key) {
            return file.id;
        }
        self.next_id += 1;
        let id = self.next_id;
        let (fd, open_error, capped) = self.open_within_caps(budget, mapping);
        let info = FileInfo {
            file_id: id,
            device: mapping.device,
            inode: mapping.inode,
            path: mapping.path.clone(),
            fd: NO_FD,
            open_error,
        };
        self.ids.insert(id, key);
        self.files.insert(
            key,
            OpenFile {
                id,
                fd,
                info,
                refs: 1,
                capped,
                idle_since: None,
            },
        );
        fresh.push(id);
        id
    }

    /// Sets the file ids of `pid`'s file mappings, opening their files within the caps.
    pub fn intern_mappings(&mut self, pid: u32, mappings: &mut [Mapping], fresh: &mut Vec<u64>) {
        let mut budget = ProcessBudget { pid, opened: 0 };
        let mut interned = HashMap::new();
        for mapping in mappings {
            if mapping.inode == 0 || !mapping.path.starts_with('/') {
                continue;
            }
            // One reference per process and file, however many segments map it.
            let key = (mapping.device, mapping.inode);
            mapping.file_id = match interned.get(&key) {
                Some(&id) => id,
                None => {
                    let id = self.intern(&mut budget, mapping, fresh);
                    interned.insert(key, id);
                    id
                }
            };
        }
    }

    /// Forgets one reference of every file of `mappings`. A file nobody maps any more is kept
    /// open for [`FileTable::idle_grace`] if it has a descriptor, else closed at once (its id is
    /// kept for [`FileTable::take_closed`]). Only a held descriptor makes keeping it safe: it
    /// keeps the inode alive, so no other file can take its (device, inode) meanwhile and be
    /// taken for it; an unopened file's (device, inode) may be reused as soon as it is deleted.
    pub fn release(&mut self, mappings: &[Mapping]) {
        let mut seen = HashSet::new();
        let now = Instant::now();
        for mapping in mappings.iter().filter(|m| m.file_id != 0) {
            let key = (mapping.device, mapping.inode);
            if !seen.insert(key) {
                continue;
            }
            let Some(file) = self.files.get_mut(&key) else {
                continue;
            };
            file.refs = file.refs.saturating_sub(1);
            if file.refs > 0 {
                continue;
            }
            if file.fd.is_some() && !self.idle_grace.is_zero() {
                file.idle_since = Some(now);
                self.idle.push_back((now, key));
            } else {
                self.close(key);
            }
        }
    }

    /// Closes the files kept open longer than [`FileTable::idle_grace`] with nobody mapping
    /// them.
    pub fn close_idle(&mut self) {
        while let Some(&(since, _)) = self.idle.front() {
            if since.elapsed() < self.idle_grace {
                break;
            }
            self.close_oldest_idle();
        }
    }

    /// Closes the file idle the longest; false when none is.
    fn close_oldest_idle(&mut self) -> bool {
        while let Some((since, key)) = self.idle.pop_front() {
            // Skips entries of files mapped again since (or idle again, since a later time).
            if self
                .files
                .get(&key)
                .is_some_and(|f| f.refs == 0 && f.idle_since == Some(since))
            {
                self.close(key);
                return true;
            }
        }
        false
    }

    /// Forgets a file: its descriptor is closed and its id kept for the relay.
    fn close(&mut self, key: (u64, u64)) {
        if let Some(file) = self.files.remove(&key) {
            if file.fd.is_some() {
                self.open -= 1;
            }
            self.ids.remove(&file.id);
            self.closed.push(file.id);
        }
    }

    /// The ids of the files closed since the last call, in closing order.
    pub fn take_closed(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.closed)
    }

    pub fn by_id(&self, id: u64) -> Option<&OpenFile> {
        self.files.get(self.ids.get(&id)?)
    }
}

/// Opens the file behind a mapping: through `map_files/` (the exact mapped object, even when
/// deleted or in another mount namespace), else through the process's root. The device and
/// inode are checked so a replaced path is never passed off as the mapped file.
fn open_mapped(pid: u32, mapping: &Mapping) -> Result<OwnedFd, String> {
    let by_range = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    let mut candidates = vec![by_range];
    // A cut path names no file; the exact object is still reachable through map_files.
    if !mapping.path.ends_with(PATH_CUT_MARK) {
        candidates.push(format!(
            "/proc/{pid}/root{}",
            mapping.path.trim_end_matches(" (deleted)")
        ));
    }
    let mut last_error = String::new();
    for candidate in candidates {
        match File::open(&candidate) {
            Ok(file) => match file.metadata() {
                Ok(meta) if meta.dev() == mapping.device && meta.ino() == mapping.inode => {
                    return Ok(OwnedFd::from(file));
                }
                Ok(_) => {
                    last_error = format!("{candidate} is not the mapped file (device/inode differ)")
                }
                Err(err) => last_error = format!("fstat {candidate}: {err}"),
            },
            Err(err) => last_error = format!("open {candidate}: {err}"),
        }
    }
    Err(last_error)
}

/// Wall-clock boot time in ns, from /proc/stat's `btime`.
pub fn boot_time_unix_ns() -> u64 {
    read_small("/proc/stat")
        .ok()
        .and_then(|stat| {
            stat.lines()
                .find_map(|line| line.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map_or(0, |secs| secs.saturating_mul(1_000_000_000))
}

/// Reads at most [`SMALL_FILE_MAX_BYTES`] of a small /proc file (a longer one is cut).
pub fn read_small(path: impl AsRef<Path>) -> std::io::Result<String> {
    ember_common::read_bounded(path, SMALL_FILE_MAX_BYTES)
}

/// Whether command lines are forwarded (`--command-line`): set once at start, before any
/// process is read; one switch for the whole sampler, like [`ENV_ALLOWLIST`].
static COMMAND_LINE: AtomicBool = AtomicBool::new(false);

/// Turns the forwarding of command lines on or off (`--command-line`).
pub fn forward_command_lines(on: bool) {
    COMMAND_LINE.store(on, Ordering::Relaxed);
}

/// Most bytes of `/proc/PID/cmdline` forwarded; a longer one is cut (counted).
pub const COMMAND_LINE_MAX_BYTES: u64 = 4 << 10;

/// Most bytes of `/proc/PID/cgroup` forwarded: a v1 host's dozen hierarchies with container
/// paths fit several times over; a longer file is cut after its last whole line (counted).
pub const CGROUP_MAX_BYTES: u64 = 4 << 10;

/// `bytes` as text (invalid UTF-8 replaced); when `cut`, without its last, partial line.
fn whole_lines(bytes: &[u8], cut: bool) -> String {
    let end = if cut {
        bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1)
    } else {
        bytes.len()
    };
    String::from_utf8_lossy(bytes.get(..end).unwrap_or_default()).into_owned()
}

/// Cuts `path` to at most [`PATH_MAX_BYTES`] (plus the mark), at a char boundary.
pub fn cap_path(mut path: String) -> String {
    if path.len() <= PATH_MAX_BYTES {
        return path;
    }
    let mut end = PATH_MAX_BYTES;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path.truncate(end);
    path.push_str(PATH_CUT_MARK);
    path
}

/// Whether `pid` is exiting or a zombie: its /proc/PID/stat state is `Z` or `X`, or its
/// address space is already gone (an empty maps file). Unreadable counts as exiting.
pub fn is_exiting(pid: u32) -> bool {
    let Ok(stat) = read_small(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    if matches!(state, Some('Z' | 'X') | None) {
        return true;
    }
    File::open(format!("/proc/{pid}/maps"))
        .and_then(|mut f| f.read(&mut [0u8; 1]))
        .map_or(true, |n| n == 0)
}

/// The facts of a process and whether caps cut them.
pub struct ReadProcess {
    pub info: ProcessInfo,
    /// Some mappings were left out, or the maps file was longer than read.
    pub truncated: bool,
    /// Its perf map, opened for the relay ([`crate::perfmap`]).
    pub perf_map: Option<OwnedFd>,
}

/// `/proc/<pid>` opened once for one reading of a process's facts: each file is then found
/// without walking `/proc` and `<pid>` again, and every one is the same process's: once it has
/// exited, a process that reuses its pid does not answer through this directory (opens fail),
/// so one reading never mixes two processes' facts.
pub(crate) struct ProcDir {
    fd: OwnedFd,
}

impl ProcDir {
    pub(crate) fn open(pid: u32) -> std::io::Result<Self> {
        let path = CString::new(format!("/proc/{pid}")).map_err(std::io::Error::other)?;
        Self::open_at(libc::AT_FDCWD, &path, libc::O_PATH | libc::O_DIRECTORY).map(|fd| Self { fd })
    }

    /// `openat(dir, name, flags | O_CLOEXEC)`.
    fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        // SAFETY: `name` is NUL-terminated; the flags create and truncate nothing (the seccomp
        // filter would refuse it).
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a non-negative return is a descriptor this process now owns, once.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory's descriptor, for `openat` of entries below it.
    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// One of its files, opened for reading.
    fn file(&self, name: &CStr) -> std::io::Result<File> {
        Self::open_at(self.raw(), name, libc::O_RDONLY).map(File::from)
    }

    /// At most `max` bytes of one of its files, and whether it was longer. For the files read
    /// this way (stat, status, cgroup, comm, cmdline, environ) a read that returns less than it
    /// asked for returned all there is: the first four are produced whole by one `show` of a
    /// `seq_file` and handed out from that, and cmdline and environ are copied page after page
    /// until the end or the size asked. So a small file takes one `read`, not one more to
    /// see its end. (Not maps: a `seq_file` of many records fills a read one page at a time.)
    fn read(&self, name: &CStr, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
        let want = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
        let mut file = self.file(name)?;
        let mut bytes = vec![0u8; want.min(4096)];
        let n = loop {
            match file.read(&mut bytes) {
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        let short = n < bytes.len();
        bytes.truncate(n);
        if !short {
            let rest = u64::try_from(want - n).unwrap_or(u64::MAX);
            file.take(rest).read_to_end(&mut bytes)?;
        }
        let cut = u64::try_from(bytes.len()).map_or(true, |len| len > max);
        if cut {
            bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        }
        Ok((bytes, cut))
    }

    /// At most [`SMALL_FILE_MAX_BYTES`] of one of its files, as text.
    fn read_small(&self, name: &CStr) -> std::io::Result<String> {
        let (bytes, _) = self.read(name, SMALL_FILE_MAX_BYTES)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The target of one of its links (`exe`), cut by [`cap_path`].
    fn read_link(&self, name: &CStr) -> std::io::Result<String> {
        // One byte more than a kept path, so a longer target is seen (and cut) as such.
        let mut buf = vec![0u8; PATH_MAX_BYTES + 1];
        // SAFETY: `name` is NUL-terminated and `buf` is writable for its whole length.
        let len = unsafe {
            libc::readlinkat(
                self.raw(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let Ok(len) = usize::try_from(len) else {
            return Err(std::io::Error::last_os_error());
        };
        buf.truncate(len);
        // A target longer than the buffer fills it, and is cut (and marked) like any long path.
        Ok(cap_path(String::from_utf8_lossy(&buf).into_owned()))
    }
}

/// Reads the facts of `pid` and interns its mapped files. `fresh` receives ids of files to
/// send. Fails only when the process is gone or unreadable.
///
/// System calls: every file below is opened once through one [`ProcDir`] and read in one pass
/// (maps in 64 KiB reads); `comm` only when the executable's path cannot name the process.
#[cfg(test)]
pub fn read_process(
    pid: u32,
    boot_time_unix_ns: u64,
    files: &mut FileTable,
    fresh: &mut Vec<u64>,
) -> std::io::Result<ReadProcess> {
    read_process_observed(
        pid,
        boot_time_unix_ns,
        files,
        fresh,
        Observed::default(),
        &mut CgroupCache::with_nothing(),
        &|| false,
    )
}

/// What the kernel observed of a process at its first sample (its `ProcessEvent`, written by
/// the eBPF program in the process's own context), so that its files need not be read for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Its real uid: its status file is then read only for a perf map's owner and pid.
    pub uid: Option<u32>,
    /// Its cgroup v2 id (0 unknown): its cgroup file is taken from `cgroups` when known there.
    pub cgroup_id: u64,
    /// Its group leader's `start_boottime`: its stat file is then not read for its start time,
    /// unless its group leader exited since that sample (the pid may be another process's now).
    pub start_boottime_ns: Option<u64>,
}

/// [`read_process`] with what the kernel observed of the process at its first sample: the
/// status file is left unread unless the process runs anonymous code (a perf map's owner and
/// pid come from it), the cgroup file when [`CgroupCache`] knows the observed cgroup, the stat
/// file when the start time was observed and `leader_exited` (asked after `/proc/<pid>` is
/// open) says the process's group leader has not exited since: the directory then holds the
/// process that was sampled, not a later one with its pid.
pub fn read_process_observed(
    pid: u32,
    boot_time_unix_ns: u64,
    files: &mut FileTable,
    fresh: &mut Vec<u64>,
    observed: Observed,
    cgroups: &mut CgroupCache,
    leader_exited: &dyn Fn() -> bool,
) -> std::io::Result<ReadProcess> {
    let dir = ProcDir::open(pid)?;
    let maps = parse_maps(dir.file(c"maps")?, MAPS_MAX_BYTES, MAX_MAPPINGS_PER_PROCESS)?;
    let executable_path = dir.read_link(c"exe").unwrap_or_default();
    // A cut path has no trustworthy last component: the kernel's comm names it then.
    let executable_name = match Path::new(executable_path.trim_end_matches(" (deleted)"))
        .file_name()
        .filter(|_| !executable_path.ends_with(PATH_CUT_MARK))
    {
        Some(name) => name.to_string_lossy().into_owned(),
        None => dir
            .read_small(c"comm")
            .map(|c| c.trim_end().to_owned())
            .unwrap_or_default(),
    };
    // The whole file, unparsed (cgroup v1 hosts have one line per hierarchy): the relay reads it.
    let known = (observed.cgroup_id != 0)
        .then(|| cgroups.get(observed.cgroup_id))
        .flatten();
    let (cgroup, cgroup_cut) = match known {
        Some(text) => (text, false),
        None => {
            let (text, cut) = dir
                .read(c"cgroup", CGROUP_MAX_BYTES)
                .map(|(bytes, cut)| (whole_lines(&bytes, cut), cut))
                .unwrap_or_default();
            if !cut && observed.cgroup_id != 0 {
                cgroups.offer(observed.cgroup_id, &text);
            }
            (text, cut)
        }
    };
    let start_time_unix_ns = match observed.start_boottime_ns.filter(|_| !leader_exited()) {
        Some(ns) => start_time_from_boottime(boot_time_unix_ns, ns),
        None => dir
            .read_small(c"stat")
            .ok()
            .and_then(|stat| start_ticks(&stat))
            .map_or(0, |ticks| start_time_from_ticks(boot_time_unix_ns, ticks)),
    };
    let ParsedMaps {
        mut mappings,
        omitted: mappings_omitted,
        cut,
    } = maps;
    files.intern_mappings(pid, &mut mappings, fresh);
    let jit_code = mappings.iter().any(is_anonymous);
    // The status file only when the kernel did not tell the uid, or for a perf map's owner and
    // pid.
    let status = (observed.uid.is_none() || jit_code)
        .then(|| dir.read(c"status", ember_common::STATUS_READ_LIMIT).ok())
        .flatten()
        .map(|(bytes, _)| ember_common::ProcStatus::parse(&bytes));
    let uid = status
        .as_ref()
        .and_then(|status| status.uids().first().copied())
        .or(observed.uid);
    // Its perf map, only when its real uid is known (the owner it must have), and only when it
    // runs code from anonymous memory (a JIT's): others have no code a perf map could name, and
    // the tracker reads the facts again once a sample falls in such code.
    let perf_map = match (&status, uid) {
        (Some(status), Some(uid)) if jit_code => {
            perfmap::open_perf_map_at(&dir, perfmap::ns_pid(status, pid), uid)
        }
        _ => PerfMap::Absent,
    };
    // Only with --command-line, raw: the relay turns it into text.
    let (command_line, command_line_cut) = if COMMAND_LINE.load(Ordering::Relaxed) {
        dir.read(c"cmdline", COMMAND_LINE_MAX_BYTES)
            .map(|(bytes, cut)| (Some(bytes).filter(|b| !b.is_empty()), cut))
            .unwrap_or_default()
    } else {
        (None, false)
    };
    // The environment the process was started with (exec time); unreadable = nothing forwarded.
    let [otel_service_name, otel_resource_attributes] = dir
        .read(c"environ", ENVIRON_MAX_BYTES)
        .map(|(environ, _)| allowlisted_env(&String::from_utf8_lossy(&environ)))
        .unwrap_or_default();
    let (perf_map, perf_map_refused) = match perf_map {
        PerfMap::Open(fd) => (Some(fd), String::new()),
        PerfMap::Refused(reason) => (None, reason.to_owned()),
        PerfMap::Absent => (None, String::new()),
    };
    Ok(ReadProcess {
        truncated: cut || mappings_omitted > 0 || cgroup_cut || command_line_cut,
        perf_map,
        info: ProcessInfo {
            pid,
            start_time_unix_ns,
            executable_path,
            executable_name,
            cgroup,
            mappings,
            mappings_omitted,
            uid,
            otel_service_name,
            otel_resource_attributes,
            command_line,
            // Set to the descriptor's index where it is sent (`tracker::process_messages`).
            perf_map_fd: None,
            perf_map_refused,
        },
    })
}

/// The only variables of a process's environment the sampler forwards, in this order. Every
/// other variable (tokens, passwords, ...) never leaves the sampler.
pub const ENV_ALLOWLIST: [&str; 2] = ["OTEL_SERVICE_NAME=", "OTEL_RESOURCE_ATTRIBUTES="];

/// The values of the [`ENV_ALLOWLIST`] variables in `environ` (NUL-separated `NAME=value`
/// entries), each cut to [`ENV_VALUE_MAX_BYTES`]; `None` when absent or empty. A name given
/// twice keeps its first value (what `getenv` returns). No parsing beyond the prefix match.
pub fn allowlisted_env(environ: &str) -> [Option<String>; 2] {
    let mut found: [Option<String>; 2] = [None, None];
    for entry in environ.split('\0') {
        for (slot, prefix) in found.iter_mut().zip(ENV_ALLOWLIST) {
            if let (None, Some(value)) = (&slot, entry.strip_prefix(prefix)) {
                *slot = Some(cut(value, ENV_VALUE_MAX_BYTES)).filter(|v| !v.is_empty());
            }
        }
    }
    found
}

/// `text` cut to at most `max` bytes, at a char boundary.
fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// The start time of `pid` as its facts give it (`ProcessInfo.startTimeUnixNs`), read alone:
/// the ignored processes are re-checked with it every drain.
pub fn start_time_unix_ns(pid: u32, boot_time_unix_ns: u64) -> Option<u64> {
    let ticks = start_ticks(&read_small(format!("/proc/{pid}/stat")).ok()?)?;
    Some(start_time_from_ticks(boot_time_unix_ns, ticks))
}

/// A start time in /proc/PID/stat's ticks since boot, on the wall clock.
fn start_time_from_ticks(boot_time_unix_ns: u64, ticks: u64) -> u64 {
    boot_time_unix_ns.saturating_add(ticks.saturating_mul(1_000_000_000 / clock_ticks()))
}

/// A group leader's `start_boottime` (ns) as the same start time: cut to whole ticks first, as
/// the kernel does for /proc/PID/stat (`nsec_to_clock_t`), so that both sources agree exactly:
/// the start time is the process's identity across pid reuse everywhere.
pub fn start_time_from_boottime(boot_time_unix_ns: u64, start_boottime_ns: u64) -> u64 {
    start_time_from_ticks(
        boot_time_unix_ns,
        start_boottime_ns / (1_000_000_000 / clock_ticks()),
    )
}

/// Field 22 (starttime, clock ticks since boot) of /proc/<pid>/stat; the comm field may hold
/// spaces and parentheses, so fields are counted after the last ')'.
fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether an executable mapping is anonymous memory (JIT code), not a file's: no path, or a
/// name the process gave it (`[anon:...]`); `[vdso]` and the like are the kernel's.
pub fn is_anonymous(mapping: &Mapping) -> bool {
    mapping.inode == 0 && (mapping.path.is_empty() || mapping.path.starts_with("[anon:"))
}

/// The executable mappings read from a maps file.
#[derive(Debug)]
pub struct ParsedMaps {
    /// Sorted by start.
    pub mappings: Vec<Mapping>,
    /// Executable mappings beyond the cap.
    pub omitted: u32,
    /// The file went on beyond the bytes read.
    pub cut: bool,
}

/// Streams a /proc/<pid>/maps file: at most `max_bytes`, complete lines only, at most
/// `max_mappings` executable mappings kept (the rest counted).
pub fn parse_maps(
    source: impl Read,
    max_bytes: u64,
    max_mappings: usize,
) -> std::io::Result<ParsedMaps> {
    // 64 KiB reads: the kernel formats the file anew from the line a read starts at.
    let mut reader = BufReader::with_capacity(64 << 10, source.take(max_bytes));
    let mut parsed = ParsedMaps {
        mappings: Vec::new(),
        omitted: 0,
        cut: false,
    };
    let mut line = Vec::new();
    let mut consumed = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            break;
        }
        consumed += n as u64;
        if line.last() != Some(&b'\n') {
            // A line cut by the byte bound (or a file ending without a newline): dropped.
            parsed.cut = consumed >= max_bytes;
            break;
        }
        let Some(mapping) = parse_maps_line(&String::from_utf8_lossy(&line[..n - 1])) else {
            continue;
        };
        if parsed.mappings.len() >= max_mappings {
            parsed.omitted = parsed.omitted.saturating_add(1);
            continue;
        }
        parsed.mappings.push(mapping);
    }
    if consumed >= max_bytes {
        parsed.cut = true;
    }
    parsed.mappings.sort_by_key(|m| m.start);
    Ok(parsed)
}

/// One line of a maps file, if it is an executable mapping.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if !perms.contains('x') {
        return None;
    }
    let path = cap_path(fields.next().unwrap_or("").trim_start().to_owned());
    let (start, end) = range.split_once('-')?;
    let (Ok(start), Ok(end), Ok(file_offset)) = (
        u64::from_str_radix(start, 16),
        u64::from_str_radix(end, 16),
        u64::from_str_radix(offset, 16),
    ) else {
        return None;
    };
    let device = dev
        .split_once(':')
        .and_then(|(major, minor)| {
            Some(libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ))
        })
        .unwrap_or(0);
    Some(Mapping {
        start,
        end,
        file_offset,
        path,
        device,
        inode: inode.parse().unwrap_or(0),
        file_id: 0,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::fs;

    use super::*;

    /// At most `max` bytes of a /proc file, and whether it was longer.
    fn read_cut(path: impl AsRef<Path>, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
        let mut bytes = Vec::new();
        File::open(path)?
            .take(max.saturating_add(1))
            .read_to_end(&mut bytes)?;
        let cut = u64::try_from(bytes.len()).map_or(true, |len| len > max);
        if cut {
            bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        }
        Ok((bytes, cut))
    }

    #[test]
    fn parses_executable_mappings_only() {
        let maps = "\
55d4c0a00000-55d4c0a01000 r--p 00000000 08:01 1234 /usr/bin/my prog
55d4c0a01000-55d4c0a05000 r-xp 00001000 08:01 1234 /usr/bin/my prog
7f00000000-7f00001000 rwxp 00000000 00:00 0 
7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]
";
        let mappings = parse_maps(maps.as_bytes(), 1 << 20, 100)
            .expect("parses")
            .mappings;
        assert_eq!(mappings.len(), 3);
        assert_eq!(mappings[0].path, "[vdso]");
        assert_eq!(mappings[1].start, 0x7f00000000);
        let prog = &mappings[2];
        assert_eq!(prog.path, "/usr/bin/my prog");
        assert_eq!(prog.file_offset, 0x1000);
        assert_eq!(prog.inode, 1234);
        assert_eq!(prog.device, libc::makedev(8, 1));
    }

    #[test]
    fn a_maps_text_cut_mid_line_keeps_complete_lines_only() {
        let maps = "\
1000-2000 r-xp 00000000 08:01 11 /usr/lib/a.so
3000-4000 r-xp 00000000 08:01 12 /usr/lib/b.so
5000-6000 r-xp 00000000 08:01 13 /usr/lib/c.so
";
        // Cut in the middle of the third line.
        let cut_at = maps.find("/usr/lib/c").expect("third line") as u64;
        let parsed = parse_maps(maps.as_bytes(), cut_at, 100).expect("parses");
        let paths: Vec<&str> = parsed.mappings.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(paths, ["/usr/lib/a.so", "/usr/lib/b.so"]);
        assert!(parsed.cut);
        // The whole text, capped at two mappings: the third is counted, not kept.
        let parsed = parse_maps(maps.as_bytes(), 1 << 20, 2).expect("parses");
        assert_eq!(parsed.mappings.len(), 2);
        assert_eq!(parsed.omitted, 1);
        assert!(!parsed.cut);
    }

    #[test]
    fn a_long_path_is_cut_at_a_char_boundary() {
        // 'é' is two bytes: 1023 ASCII bytes put one across the cap.
        let long = format!("/{}{}", "a".repeat(PATH_MAX_BYTES - 2), "é".repeat(100));
        let cut = cap_path(long);
        assert!(cut.ends_with(PATH_CUT_MARK));
        let kept = &cut[..cut.len() - PATH_CUT_MARK.len()];
        assert_eq!(kept.len(), PATH_MAX_BYTES - 1);
        assert!(kept.ends_with('a'));
        let short = "/usr/lib/libc.so.6".to_owned();
        assert_eq!(cap_path(short.clone()), short);
    }

    /// A file of its own under the system temp dir, removed on drop.
    pub(crate) struct TempFile(std::path::PathBuf);

    impl TempFile {
        pub(crate) fn new(name: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("ember-procfs-{}-{name}", std::process::id()));
            fs::write(&path, name).expect("write the test's temp file");
            Self(path)
        }

        pub(crate) fn path(&self) -> String {
            self.0.to_str().expect("UTF-8 temp path").to_owned()
        }

        pub(crate) fn dev_ino(&self) -> (u64, u64) {
            let meta = fs::metadata(&self.0).expect("stat the temp file");
            (meta.dev(), meta.ino())
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }

    /// A mapping of `path` claiming (`device`, `inode`), at a range this process does not
    /// map, so `map_files/` fails (as it does for non-root anyway) and the path under
    /// `/proc/<pid>/root` is what gets opened.
    pub(crate) fn mapping_of(path: String, device: u64, inode: u64) -> Mapping {
        Mapping {
            start: 0x1000,
            end: 0x2000,
            path,
            device,
            inode,
            ..Mapping::default()
        }
    }

    #[test]
    fn a_path_holding_another_file_than_the_mapped_one_is_refused() {
        // Given two files, and the (device, inode) of the first
        let mapped = TempFile::new("mapped");
        let other = TempFile::new("other");
        let (device, inode) = mapped.dev_ino();
        let me = std::process::id();
        // When the right identity is asked for at the right path, the file is opened, and the
        // descriptor is that file
        let fd = open_mapped(me, &mapping_of(mapped.path(), device, inode))
            .expect("the mapped file opens");
        let opened = File::from(fd)
            .metadata()
            .expect("fstat the passed descriptor");
        assert_eq!((opened.dev(), opened.ino()), (device, inode));
        // When the path now holds another file (a replaced binary), it is refused, saying so
        let err = open_mapped(me, &mapping_of(other.path(), device, inode))
            .expect_err("another file at the mapped path must not be passed on");
        assert!(
            err.contains("is not the mapped file (device/inode differ)")
                && err.contains(&other.path()),
            "{err}"
        );
        // And a wrong inode alone, or a wrong device alone, is refused too
        for (device, inode) in [(device, inode + 1), (device + 1, inode)] {
            let err = open_mapped(me, &mapping_of(mapped.path(), device, inode))
                .expect_err("a device/inode mismatch must be refused");
            assert!(err.contains("device/inode differ"), "{err}");
        }
    }

    #[test]
    fn only_the_two_allowlisted_variables_leave_the_environment() {
        // Given an environment with a secret, look-alike names and both allowlisted variables
        let environ = "AWS_SECRET_ACCESS_KEY=hunter2\0OTEL_SERVICE_NAME_X=no\0\
                       MY_OTEL_SERVICE_NAME=no\0OTEL_SERVICE_NAME=billing\0\
                       OTEL_RESOURCE_ATTRIBUTES=team=finance\0\
                       OTEL_SERVICE_NAME=second\0PASSWORD=hunter2\0";
        // When the allowlist is applied
        let [name, attributes] = allowlisted_env(environ);
        // Then exactly the two values are kept (the first of a repeated name), nothing else
        assert_eq!(name.as_deref(), Some("billing"));
        assert_eq!(attributes.as_deref(), Some("team=finance"));
        let kept = format!("{name:?}{attributes:?}");
        assert!(!kept.contains("hunter2"), "{kept}");
        assert_eq!(
            allowlisted_env("PATH=/bin\0OTEL_SERVICE_NAME=\0"),
            [None, None]
        );
        // And a long value is cut to the bound at a char boundary
        let long = format!("OTEL_SERVICE_NAME={}", "é".repeat(ENV_VALUE_MAX_BYTES));
        let [cut, _] = allowlisted_env(&long);
        let cut = cut.expect("a long value is kept, cut");
        assert!(cut.len() <= ENV_VALUE_MAX_BYTES && cut.len() > ENV_VALUE_MAX_BYTES - 2);
    }

    #[test]
    fn this_process_facts_carry_its_uid_and_allowlisted_environment_only() {
        // Given a child started with a secret and OTEL_SERVICE_NAME in its environment
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .env("OTEL_SERVICE_NAME", "env-test")
            .env("EMBER_TEST_SECRET", "s3cr3t-value")
            .spawn()
            .expect("spawn sleep");
        let mut files = FileTable::new(64);
        // Until the child's exec has set up its stack, its environ is ours (fork) or empty.
        let mut read = read_process(child.id(), 0, &mut files, &mut Vec::new());
        for _ in 0..200 {
            if read
                .as_ref()
                .is_ok_and(|r| r.info.otel_service_name.is_some())
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            read = read_process(child.id(), 0, &mut files, &mut Vec::new());
        }
        let _ = child.kill();
        let _ = child.wait();
        // When its facts are read and encoded as the sampler sends them
        let info = read.expect("read the child's facts").info;
        let bytes = ember_protocol::encode_sampler_message(
            &ember_protocol::SamplerMessage::Process(info.clone()),
        );
        // Then they carry our uid and its service name, and the secret is nowhere in the bytes
        // SAFETY: getuid has no preconditions.
        assert_eq!(info.uid, Some(unsafe { libc::getuid() }));
        assert_eq!(info.otel_service_name.as_deref(), Some("env-test"));
        let needle = b"s3cr3t-value";
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
    }

    #[test]
    fn the_whole_cgroup_file_is_forwarded_and_a_long_one_cut_at_a_line() {
        // This process's file, as read: every hierarchy's line, v1 and v2 alike
        let read = read_process(
            std::process::id(),
            0,
            &mut FileTable::new(64),
            &mut Vec::new(),
        )
        .expect("read our own facts");
        let ours = fs::read_to_string("/proc/self/cgroup").expect("read our cgroup file");
        assert_eq!(read.info.cgroup, ours);
        // A file longer than the bound keeps its whole lines only, and says it was cut
        let file = TempFile::new("cgroup");
        let path = file.path();
        let line = "12:memory:/kubepods/burstable/pod0/0123456789abcdef\n";
        fs::write(&path, line.repeat(200)).expect("write");
        let (bytes, cut) = read_cut(&path, CGROUP_MAX_BYTES).expect("read");
        assert!(cut);
        let text = whole_lines(&bytes, cut);
        assert!(text.len() <= 4096 && text.ends_with('\n'), "{}", text.len());
        assert_eq!(text.len() % line.len(), 0);
        let (bytes, cut) = read_cut(&path, 1 << 20).expect("read");
        assert!(!cut);
        assert_eq!(whole_lines(&bytes, cut).len(), line.len() * 200);
    }

    #[test]
    fn the_command_line_is_read_only_when_turned_on() {
        // Given a child with arguments
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        let read = |on: bool| {
            forward_command_lines(on);
            let read = read_process(child.id(), 0, &mut FileTable::new(64), &mut Vec::new());
            forward_command_lines(false);
            read.expect("read the child's facts").info
        };
        // When its facts are read with --command-line, Then they carry its raw cmdline (once its
        // exec has recorded the new arguments: until then the file is empty, or ours)
        let mut on = read(true);
        for _ in 0..200 {
            if on.command_line.as_deref() == Some(&b"sleep\x005\0"[..]) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            on = read(true);
        }
        assert_eq!(on.command_line.as_deref(), Some(&b"sleep\x005\0"[..]));
        // And without it, none
        let off = read(false);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(off.command_line, None);
    }
    #[test]
    fn a_file_is_read_whole_up_to_its_bound_whatever_its_size() {
        // Given files of 0, 5,000, 4,096 (one first read's worth) and 10,000 bytes
        let dir = std::env::temp_dir().join(format!("ember-procdir-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let path = CString::new(dir.to_str().expect("UTF-8")).expect("no NUL");
        let proc_dir = ProcDir {
            fd: ProcDir::open_at(libc::AT_FDCWD, &path, libc::O_PATH | libc::O_DIRECTORY)
                .expect("open the dir"),
        };
        for (len, max, kept, cut) in [
            (0, 100, 0, false),
            (5_000, 64 << 10, 5_000, false),
            (4_096, 64 << 10, 4_096, false),
            (4_096, 4_096, 4_096, false),
            (10_000, 8_192, 8_192, true),
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            fs::write(dir.join("f"), &bytes).expect("write");
            // When it is read with a bound
            let (read, was_cut) = proc_dir.read(c"f", max).expect("read");
            // Then all of it up to the bound is read, and a longer one says so
            assert_eq!(
                (read.len(), was_cut),
                (kept, cut),
                "{len} bytes, bound {max}"
            );
            assert_eq!(read[..], bytes[..kept]);
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_perf_map_is_looked_for_only_in_a_process_running_anonymous_code() {
        // Given two processes of ours with a perf map each: one maps anonymous executable
        // memory (as a JIT does), the other does not
        let spawn = |code: &str| {
            std::process::Command::new("python3")
                .args(["-c", code])
                .spawn()
                .expect("spawn python3")
        };
        let mut jit = spawn(
            "import mmap,time; m = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, \
             prot=mmap.PROT_READ | mmap.PROT_EXEC); \
             time.sleep(20)",
        );
        let mut plain = spawn("import time; time.sleep(20)");
        let maps: Vec<String> = [&jit, &plain]
            .iter()
            .map(|c| format!("/tmp/perf-{}.map", c.id()))
            .collect();
        for map in &maps {
            fs::write(map, "1000 10 f\n").expect("write a perf map");
        }
        // When their facts are read (once the JIT's mapping is there)
        let read = |pid: u32| {
            read_process(pid, 0, &mut FileTable::new(64), &mut Vec::new()).expect("read facts")
        };
        let mut facts = read(jit.id());
        for _ in 0..300 {
            if facts.info.mappings.iter().any(is_anonymous) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            facts = read(jit.id());
        }
        let plain_facts = read(plain.id());
        for child in [&mut jit, &mut plain] {
            let _ = child.kill();
            let _ = child.wait();
        }
        for map in &maps {
            let _ = fs::remove_file(map);
        }
        // Then the JIT's map is passed, and the other process's is not even looked for
        assert!(facts.info.mappings.iter().any(is_anonymous));
        assert!(facts.perf_map.is_some(), "the JIT process's perf map");
        assert!(!plain_facts.info.mappings.iter().any(is_anonymous));
        assert!(plain_facts.perf_map.is_none());
        assert_eq!(plain_facts.info.perf_map_refused, "");
    }

    #[test]
    fn start_time_survives_odd_comm() {
        let stat = "42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 777 1000 10";
        assert_eq!(start_ticks(stat), Some(777));
    }
}
