//! State of one sampler connection: the files it passed (as descriptors), the processes it
//! described and its kernel symbols; turns its raw batches into symbolized samples keyed by
//! thread (pid first), without labels: the labels stage reads the process facts kept here
//! ([`Session::process_info`]) once per process.
//!
//! The relay never opens anything of other processes itself: every binary is read through a
//! descriptor in `files`.
//!
//! File lifetime is the sampler's to say: a passed file stays until a `filesClosed` names it, and
//! the relay keeps no reference counts of its own. Facts for a known pid replace the old ones
//! (with another start time, the pid was reused: nothing of the old process is kept).
//!
//! Descriptors are bounded whatever the peer says: files no known process has referred to for
//! twice the sampler's [`ember_protocol::FILE_IDLE_GRACE`] are closed at the next batch
//! (`files_swept`, which stays 0 while the sampler's closes and the relay's facts agree), and at most `max_open_files` stay open per connection (the least recently used are
//! closed beyond, their frames stay unnamed). Addresses and offsets from the sampler are
//! untrusted: arithmetic on them is checked, and a result that would wrap makes an unknown frame.

use std::{
    cell::Cell,
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use ember_protocol::{Batch, FileInfo, Hello, ProcessInfo, Row, StackRef};

use crate::{
    interp::{
        cpython::{
            self,
            naming::{Naming, Runtime},
        },
        raw::{InterpBatch, RawCode},
        seen, Recognized,
    },
    jit::{jitdump::JitDump, JitStores},
    model::{
        FileIdentity, Frame, FrameKind, JitRuntime, Module, SampleKind, SymbolizedProfile, Thread,
        UNKNOWN,
    },
    symbolize::{self, elf, ElfCache, FileKey, KernelSymbols},
};

/// The connection's kernel symbols: parsed on a thread of their own from the passed
/// `/proc/kallsyms` (the kernel generates its 100k+ lines slowly: parsing them on the driver's
/// thread held every message behind the hello for most of a second, the unwind tables of the
/// first processes included), waited for at the first kernel frame to name.
enum Kernel {
    /// No descriptor came with the hello, or the parse failed (logged).
    Absent,
    Loading(std::thread::JoinHandle<Option<KernelSymbols>>),
    Loaded(KernelSymbols),
}

impl Kernel {
    /// Starts parsing `fd` on a thread of its own.
    fn load(fd: OwnedFd) -> Self {
        let spawned = std::thread::Builder::new()
            .name("kallsyms".into())
            .spawn(move || Self::parse(fd));
        match spawned {
            Ok(handle) => Self::Loading(handle),
            Err(err) => {
                tracing::warn!(%err, "no thread to parse the kernel symbols: kernel frames will be unnamed");
                Self::Absent
            }
        }
    }

    fn parse(fd: OwnedFd) -> Option<KernelSymbols> {
        match KernelSymbols::from_fd(fd) {
            Ok(symbols) => {
                tracing::info!(
                    symbols = symbols.len(),
                    "kernel symbols loaded from the passed /proc/kallsyms"
                );
                Some(symbols)
            }
            Err(err) => {
                tracing::warn!(error = %err, "kernel frames will be unnamed");
                None
            }
        }
    }

    /// The symbols, once parsed (waiting for the parse the first time).
    fn symbols(&mut self) -> Option<&KernelSymbols> {
        if let Self::Loading(_) = self {
            let Self::Loading(handle) = std::mem::replace(self, Self::Absent) else {
                return None;
            };
            if let Ok(Some(symbols)) = handle.join() {
                *self = Self::Loaded(symbols);
            }
        }
        match self {
            Self::Loaded(symbols) => Some(symbols),
            _ => None,
        }
    }
}

struct PassedFile {
    /// Shared with queued unwind-table jobs only as a `Weak`: closing it here closes it.
    fd: Option<Arc<OwnedFd>>,
    /// The relay's own `fstat` identity of `fd` (`None` without a usable descriptor).
    key: Option<FileKey>,
    /// What the file claims, for display only: never used to pick a resolver.
    build_id: Option<Arc<str>>,
    /// The session's batch tick when a frame last used this file (for LRU eviction).
    last_used: Cell<u64>,
    /// The tick when the relay last read the file itself (a jitdump, which no frame falls in):
    /// it counts as use for eviction, not as a sampled file.
    last_read: Cell<u64>,
    /// The interpreter or runtime this file is, if the relay recognized one (`interp`).
    runtime: Option<Arc<Recognized>>,
    /// Whether a known process mapped it, and since when none does (see
    /// [`Session::sweep_unreferenced_files`]).
    was_referenced: bool,
    unreferenced_since: Option<Instant>,
}

struct Process {
    info: ProcessInfo,
    name: Arc<str>,
    executable_path: Arc<str>,
    container_id: Option<Arc<str>>,
    /// One module per executable mapping, same order as `info.mappings`.
    modules: Vec<Arc<Module>>,
    /// The recognized runtimes among its mapped files (each counted once per process).
    runtimes: Vec<Arc<Recognized>>,
    /// The path of the CPython binary it maps (`python3.X`, `libpython3.X.so`), as its modules
    /// name it: the eval loop's code when the binary's symbols do not name it.
    interpreter_path: Option<Arc<str>>,
    /// The runtime its JIT frames are of, and the one name of its JIT frames nothing names
    /// (`[jit] node`), so they add up to one flame-graph frame instead of one per address.
    jit_runtime: JitRuntime,
    jit_unnamed: Arc<str>,
}

/// Counters of what could not be named, for the logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SymbolStats {
    pub frames: u64,
    pub unknown_frames: u64,
    pub samples_without_process_facts: u64,
    /// Passed files closed because the sampler said so (`filesClosed`).
    pub files_closed: u64,
    /// Passed files closed because no process referred to them at a batch, though the sampler
    /// had not closed them: a peer that disagrees with its own facts (or lost a message).
    pub files_swept: u64,
    /// Descriptors closed because more than `max_open_files` were open (least recently used).
    pub files_evicted: u64,
    /// Frames whose file offset would have wrapped (hostile or broken mapping facts).
    pub bad_offsets: u64,
    /// Executable mappings the sampler left out of the process facts it sent (its per-process
    /// cap, `mappingsOmitted`), summed over every facts message: frames in them are unknown.
    pub mappings_omitted: u64,
    /// Frames in JIT code named from a perf map or jitdump, and frames in anonymous executable
    /// memory nothing named (each `[jit] <executable>`), counted per sample.
    pub jit_frames_named: u64,
    pub jit_frames_unnamed: u64,
}

/// Per-file limits of the relay (`--max-copy-bytes`, `--max-open-files`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Largest file copied into a private memfd when it cannot be reopened.
    pub max_copy_bytes: u64,
    /// Most passed descriptors kept open per connection (least recently used ones are closed).
    pub max_open_files: usize,
    /// Most symbol resolvers (parsed binaries) kept at once (`--symbolizer-cache-files`).
    pub symbolizer_cache_files: usize,
    /// Most heap bytes they hold together (`--symbolizer-cache-bytes`).
    pub symbolizer_cache_bytes: u64,
}

/// Default of `--max-open-files`.
pub const DEFAULT_MAX_OPEN_FILES: usize = 8192;
/// Descriptors kept free below the soft RLIMIT_NOFILE for sockets, memfds and logs.
const NOFILE_RESERVE: u64 = 256;

impl Default for FileLimits {
    fn default() -> Self {
        Self {
            max_copy_bytes: elf::DEFAULT_MAX_COPY_BYTES,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            symbolizer_cache_files: elf::DEFAULT_MAX_FILES,
            symbolizer_cache_bytes: elf::DEFAULT_MAX_BYTES,
        }
    }
}

impl FileLimits {
    /// `max_open_files` never above the soft RLIMIT_NOFILE minus a reserve (at least 1).
    pub fn clamped_to_rlimit(self) -> Self {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        let room =
            usize::try_from(soft.saturating_sub(NOFILE_RESERVE).max(1)).unwrap_or(usize::MAX);
        Self {
            max_open_files: self.max_open_files.min(room).max(1),
            ..self
        }
    }
}

pub struct Session {
    pub hello: Hello,
    kernel: Kernel,
    kernel_module: Arc<Module>,
    files: HashMap<u64, PassedFile>,
    processes: HashMap<u32, Process>,
    pub stats: SymbolStats,
    /// Samples received on this connection.
    pub samples: u64,
    /// Most descriptors in `files` kept open (see [`FileLimits::max_open_files`]).
    max_open_files: usize,
    /// Batches symbolized on this connection: the clock of `PassedFile::last_used`.
    tick: u64,
    /// How long a file no known process maps is kept before the relay closes it on its own.
    sweep_after: Duration,
    /// Samples of the last symbolized batch per passed file their user stacks fell in (each
    /// sample once per file): how much an unwind table for that file would serve now.
    file_samples: HashMap<u64, u64>,
    /// Names Python frames and splices them into native stacks (its code cache is per
    /// process, forgotten with the process).
    python: Naming,
    /// Names JIT frames from the perf maps and jitdumps of the processes (per process,
    /// forgotten with the process).
    pub jit: JitStores,
}

impl Session {
    /// Starts a session from the sampler's hello and the descriptors that came with it.
    pub fn new(hello: Hello, mut fds: Vec<Option<OwnedFd>>) -> Self {
        let kernel = usize::try_from(hello.kallsyms_fd)
            .ok()
            .and_then(|i| fds.get_mut(i)?.take())
            .map_or(Kernel::Absent, Kernel::load);
        Self {
            hello,
            kernel,
            kernel_module: symbolize::kernel_module(),
            files: HashMap::new(),
            processes: HashMap::new(),
            stats: SymbolStats::default(),
            samples: 0,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            tick: 0,
            sweep_after: ember_protocol::FILE_IDLE_GRACE * 2,
            file_samples: HashMap::new(),
            python: Naming::default(),
            jit: JitStores::default().with_jitdump(|| Box::new(JitDump::default())),
        }
    }

    /// Keeps at most `max` passed descriptors open (at least one).
    pub fn with_max_open_files(mut self, max: usize) -> Self {
        self.max_open_files = max.max(1);
        self
    }

    /// Takes in mapped files and their descriptors.
    pub fn add_files(&mut self, files: Vec<FileInfo>, mut fds: Vec<Option<OwnedFd>>) {
        for info in files {
            let fd = usize::try_from(info.fd)
                .ok()
                .and_then(|i| fds.get_mut(i)?.take());
            if fd.is_none() {
                tracing::debug!(path = %info.path, reason = %info.open_error, "file passed without a descriptor; its frames stay unnamed");
            }
            // A device mapped executable: reading it again through /proc/self/fd (build id,
            // symbols, unwind tables) could block or act on the device, so it is closed here.
            let fd = fd.filter(|fd| match elf::regular_file(fd) {
                Ok(true) => true,
                Ok(false) => {
                    tracing::info!(path = %info.path, "a mapped file that is not a regular file (a device?) is not read; its frames stay unnamed");
                    false
                }
                Err(_) => true,
            });
            let key = fd.as_ref().and_then(|fd| match FileKey::of(fd) {
                Ok(key) => Some(key),
                Err(err) => {
                    tracing::debug!(path = %info.path, %err, "fstat of a passed file failed; its frames stay unnamed");
                    None
                }
            });
            let build_id = fd.as_ref().and_then(elf::build_id);
            let runtime = fd
                .as_ref()
                .and_then(|fd| seen::recognize_passed(fd, &info.path));
            self.files.insert(
                info.file_id,
                PassedFile {
                    fd: fd.map(Arc::new),
                    key,
                    build_id,
                    last_used: Cell::new(self.tick),
                    last_read: Cell::new(0),
                    runtime,
                    was_referenced: false,
                    unreferenced_since: None,
                },
            );
        }
        self.evict_least_recently_used();
    }

    /// Closes the descriptors of the least recently used files while more than
    /// `max_open_files` are open. Their frames stay unnamed from then on.
    fn evict_least_recently_used(&mut self) {
        let mut open: Vec<(u64, u64)> = self
            .files
            .iter()
            .filter(|(_, f)| f.fd.is_some())
            .map(|(&id, f)| (f.last_used.get().max(f.last_read.get()), id))
            .collect();
        let Some(excess) = open
            .len()
            .checked_sub(self.max_open_files)
            .filter(|&n| n > 0)
        else {
            return;
        };
        open.sort_unstable();
        for (_, id) in open.into_iter().take(excess) {
            if let Some(file) = self.files.get_mut(&id) {
                file.fd = None;
                file.key = None;
            }
        }
        if self.stats.files_evicted == 0 {
            tracing::warn!(
                max_open_files = self.max_open_files,
                "more files passed than --max-open-files: the least recently used descriptors \
                 are closed and frames in those files stay unnamed; raise --max-open-files (and \
                 the relay's LimitNOFILE / ulimit -n) if this host maps that many files"
            );
        }
        self.stats.files_evicted += excess as u64;
    }

    /// A handle on a passed file's descriptor that does not keep it open: once the session
    /// closes the file (sampler's `filesClosed`, sweep or eviction), upgrading it fails.
    pub(crate) fn file_handle(&self, file_id: u64) -> Option<Weak<OwnedFd>> {
        self.files
            .get(&file_id)
            .and_then(|f| f.fd.as_ref())
            .map(Arc::downgrade)
    }

    /// Samples of the last symbolized batch per file their user stacks fell in.
    pub(crate) fn file_samples_last(&self) -> &HashMap<u64, u64> {
        &self.file_samples
    }

    /// The relay's own identity of a passed file (`fstat` of its descriptor).
    pub(crate) fn file_key(&self, file_id: u64) -> Option<FileKey> {
        self.files.get(&file_id).and_then(|f| f.key)
    }

    /// Whether the sampler still holds the file (it has not closed it).
    pub(crate) fn holds_file(&self, file_id: u64) -> bool {
        self.files.contains_key(&file_id)
    }

    /// Closes the files the sampler closed. Ids the session does not hold are ignored.
    pub fn close_files(&mut self, ids: &[u64]) {
        for id in ids {
            if self.files.remove(id).is_some() {
                self.stats.files_closed += 1;
            }
        }
    }

    /// The bound on a peer that never closes what it passed: closes files no known process
    /// refers to (counted; an honest sampler has closed them already). A file that a process
    /// mapped is kept for [`Session::sweep_after`] once none does: the sampler keeps it for half
    /// that ([`ember_protocol::FILE_IDLE_GRACE`]) so that the next start of the same program
    /// finds it. Meanwhile it counts towards `max_open_files` like any other file.
    fn sweep_unreferenced_files(&mut self) {
        let referenced: HashSet<u64> = self
            .processes
            .values()
            .flat_map(|p| p.info.mappings.iter().map(|m| m.file_id))
            .filter(|&id| id != 0)
            .collect();
        let before = self.files.len();
        let (now, after) = (Instant::now(), self.sweep_after);
        self.files.retain(|id, file| {
            if referenced.contains(id) {
                file.was_referenced = true;
                file.unreferenced_since = None;
                return true;
            }
            let since = *file.unreferenced_since.get_or_insert(now);
            file.was_referenced && now.saturating_duration_since(since) < after
        });
        let swept = (before - self.files.len()) as u64;
        if swept > 0 && self.stats.files_swept == 0 {
            tracing::warn!(
                swept,
                "closed passed files that no known process maps and the sampler never named \
                 closed: the sampler and the relay disagree about file lifetime, or a facts \
                 message was lost (logged once per connection)"
            );
        }
        self.stats.files_swept += swept;
    }

    /// Records the facts of a process, replacing what was known of its pid: newer facts of the
    /// same process, or (another start time) a new process that reused the pid.
    pub fn set_process(&mut self, info: ProcessInfo) {
        self.set_process_with_perf_map(info, None);
    }

    /// [`Session::set_process`], with the descriptor of the process's perf map the sampler
    /// passed with these facts, if any.
    pub fn set_process_with_perf_map(&mut self, info: ProcessInfo, perf_map: Option<OwnedFd>) {
        // Mapped once: kept for the grace when no process maps it any more (see the sweep).
        for mapping in info.mappings.iter().filter(|m| m.file_id != 0) {
            if let Some(file) = self.files.get_mut(&mapping.file_id) {
                file.was_referenced = true;
            }
        }
        let dumps: Vec<u64> = info
            .mappings
            .iter()
            .filter(|m| m.file_id != 0 && is_jitdump_path(&m.path))
            .map(|m| m.file_id)
            .collect();
        self.jit.process(
            info.pid,
            info.start_time_unix_ns,
            perf_map,
            &info.perf_map_refused,
            &dumps,
        );
        if info.mappings_omitted > 0 {
            self.stats.mappings_omitted += u64::from(info.mappings_omitted);
            tracing::debug!(
                pid = info.pid,
                name = %info.executable_name,
                mappings = info.mappings.len(),
                omitted = info.mappings_omitted,
                "the sampler left out executable mappings of this process (its per-process cap): \
                 frames in them stay unknown"
            );
        }
        let modules: Vec<Arc<Module>> = info
            .mappings
            .iter()
            .map(|m| {
                let build_id = self.files.get(&m.file_id).and_then(|f| f.build_id.clone());
                module_of(m, build_id)
            })
            .collect();
        let name: Arc<str> = Arc::from(info.executable_name.as_str());
        let executable_path: Arc<str> = Arc::from(info.executable_path.as_str());
        let container_id = crate::model::container_id(&info.cgroup).map(Arc::from);
        let (pid, start) = (info.pid, info.start_time_unix_ns);
        let runtimes = self.note_runtimes(&info, &name);
        let interpreter_path = info
            .mappings
            .iter()
            .zip(&modules)
            .find(|(m, _)| {
                self.files
                    .get(&m.file_id)
                    .and_then(|f| f.runtime.as_deref())
                    .is_some_and(|r| matches!(r, Recognized::CPython(_)))
            })
            .map(|(_, module)| Arc::clone(&module.path));
        let jit_runtime = JitRuntime::of_executable(&name);
        let jit_unnamed: Arc<str> = Arc::from(format!(
            "[jit] {}",
            if name.is_empty() { "?" } else { &*name }
        ));
        let process = Process {
            info,
            name,
            executable_path,
            container_id,
            modules,
            runtimes,
            interpreter_path,
            jit_runtime,
            jit_unnamed,
        };
        let exec_path = Arc::clone(&process.executable_path);
        if let Some(old) = self.processes.insert(pid, process) {
            if old.info.start_time_unix_ns != start {
                tracing::debug!(pid, old = %old.name, "pid reused: the old process's facts are dropped");
                self.python.cache.forget(pid);
            } else if old.executable_path != exec_path {
                // The same process exec'd another program: its code objects are gone.
                self.python.cache.forget(pid);
            }
        }
    }

    /// The recognized runtimes `info`'s mappings refer to; those the same process (same pid and
    /// start time) was not already known to map are counted in `interp::seen`.
    fn note_runtimes(&self, info: &ProcessInfo, name: &str) -> Vec<Arc<Recognized>> {
        let mut runtimes: Vec<Arc<Recognized>> = Vec::new();
        for m in &info.mappings {
            if let Some(runtime) = self.files.get(&m.file_id).and_then(|f| f.runtime.as_ref()) {
                if !runtimes.iter().any(|r| Arc::ptr_eq(r, runtime)) {
                    runtimes.push(Arc::clone(runtime));
                }
            }
        }
        let known = self
            .processes
            .get(&info.pid)
            .filter(|old| old.info.start_time_unix_ns == info.start_time_unix_ns)
            .map_or(&[][..], |old| old.runtimes.as_slice());
        for runtime in &runtimes {
            if !known.iter().any(|k| Arc::ptr_eq(k, runtime)) {
                seen::note_process(runtime, name, info.pid);
            }
        }
        runtimes
    }

    /// Appends the mappings of a `processMappings` message to the process they continue (same
    /// pid and start time), keeping them sorted and rebuilding its modules as
    /// [`Session::set_process`] does. Returns `false` (nothing changed) when no such process is
    /// known.
    pub fn append_mappings(
        &mut self,
        pid: u32,
        start_time_unix_ns: u64,
        mappings: Vec<ember_protocol::Mapping>,
    ) -> bool {
        let Some(process) = self.processes.get(&pid) else {
            return false;
        };
        if process.info.start_time_unix_ns != start_time_unix_ns {
            return false;
        }
        let mut info = process.info.clone();
        info.mappings.extend(mappings);
        info.mappings.sort_by_key(|m| m.start);
        self.set_process(info);
        true
    }

    /// Forgets an exited process. Its files stay until the sampler closes them.
    pub fn remove_process(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.jit.forget(pid);
        self.python.cache.forget(pid);
    }

    /// The counters of the Python stage (frames named, unknown codes, splice mismatches), of
    /// its code cache, and the code objects it holds.
    pub fn python_stats(&self) -> (cpython::naming::Stats, cpython::codes::CacheStats, usize) {
        (
            self.python.stats,
            self.python.cache.stats,
            self.python.cache.size().0,
        )
    }

    /// The files `pid` maps that the relay recognized as a runtime, with that runtime, each once
    /// (in the order of its mappings).
    pub(crate) fn runtime_files(&self, pid: u32) -> Vec<(u64, Arc<Recognized>)> {
        let mut out: Vec<(u64, Arc<Recognized>)> = Vec::new();
        let Some(process) = self.processes.get(&pid) else {
            return out;
        };
        for m in &process.info.mappings {
            if out.iter().any(|(id, _)| *id == m.file_id) {
                continue;
            }
            if let Some(runtime) = self.files.get(&m.file_id).and_then(|f| f.runtime.as_ref()) {
                out.push((m.file_id, Arc::clone(runtime)));
            }
        }
        out
    }

    /// The facts the sampler sent for `pid`, if any (what the labels stage reads).
    pub fn process_info(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes.get(&pid).map(|p| &p.info)
    }

    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// The identities of the passed files held open (the files some process maps).
    pub fn file_keys(&self) -> impl Iterator<Item = &FileKey> {
        self.files.values().filter_map(|f| f.key.as_ref())
    }

    /// Symbolizes a batch into `profile`: every row becomes a sample of its thread, whatever
    /// could be named. First closes the files no process refers to.
    ///
    /// Rows of the processes in `left_out` (ones the labels stage already left out: filtered
    /// or dropped by a relabel rule, for these very facts) are not symbolized, since nothing
    /// would export them; their samples are returned for the stage to count.
    pub fn symbolize_batch(
        &mut self,
        batch: &Batch,
        cache: &mut ElfCache,
        profile: &mut SymbolizedProfile,
        left_out: &HashSet<u32>,
    ) -> u64 {
        let interp = crate::interp::wire::interp_batch(batch);
        self.symbolize_batch_with_interp(batch, &interp, cache, profile, left_out)
    }

    /// [`Session::symbolize_batch`], with the interpreter walks of the batch: first the
    /// interval's code copies are taken in, then each row with an interpreter stack has its
    /// Python frames named and spliced into its user stack in place of the eval loop's frames
    /// (`interp::cpython::splice`). A process with no usable CPython layout keeps its native
    /// stack.
    pub fn symbolize_batch_with_interp(
        &mut self,
        batch: &Batch,
        interp: &InterpBatch,
        cache: &mut ElfCache,
        profile: &mut SymbolizedProfile,
        left_out: &HashSet<u32>,
    ) -> u64 {
        self.take_codes(interp);
        self.sweep_unreferenced_files();
        self.tick += 1;
        let kernel = self.kernel.symbols();
        let kernel_stacks: Vec<Vec<Frame>> = batch
            .kernel_stacks
            .iter()
            .map(|addrs| symbolize::kernel_frames(addrs, kernel, &self.kernel_module))
            .collect();
        self.catch_up_jit(batch, left_out);
        // Looked up once per row: foldhash, not SipHash (the keys are the sampler's indices).
        let mut user_memo: HashMap<(u32, u32), Vec<Frame>, foldhash::fast::RandomState> =
            HashMap::default();
        let mut spliced_memo: HashMap<
            (u32, Option<u32>, usize),
            Vec<Frame>,
            foldhash::fast::RandomState,
        > = HashMap::default();
        let mut files_memo: HashMap<(u32, u32), Vec<u64>> = HashMap::new();
        self.file_samples.clear();
        let mut skipped = 0u64;
        for (row_index, row) in batch.rows.iter().enumerate() {
            if left_out.contains(&row.pid) {
                skipped = skipped.saturating_add(row.count);
                continue;
            }
            let process = self.processes.get(&row.pid);
            if process.is_none() {
                self.stats.samples_without_process_facts = self
                    .stats
                    .samples_without_process_facts
                    .saturating_add(row.count);
            }
            let (kernel, kernel_marker): (&[Frame], Option<Frame>) = match row.kernel_stack {
                StackRef::Index(k) => (kernel_stacks[k as usize].as_slice(), None),
                missing => (&[], symbolize::missing_stack_marker(missing, "kernel")),
            };
            let (user, user_marker): (&[Frame], Option<Frame>) = match row.user_stack {
                StackRef::Index(u) => {
                    let frames = user_memo.entry((row.pid, u)).or_insert_with(|| {
                        user_frames(
                            &batch.user_stacks[u as usize],
                            process,
                            &self.files,
                            cache,
                            self.tick,
                            &mut self.stats.bad_offsets,
                            &self.jit,
                        )
                    });
                    (frames.as_slice(), None)
                }
                missing => (&[], symbolize::missing_stack_marker(missing, "user")),
            };
            let python = process.and_then(|p| {
                let (index, frames) = interp.stack_of_row(row_index)?;
                Some((p, cpython_runtime(p)?, index, frames))
            });
            let user: &[Frame] = match python {
                Some((p, runtime, index, frames)) => {
                    let user_index = match row.user_stack {
                        StackRef::Index(u) => Some(u),
                        _ => None,
                    };
                    spliced_memo
                        .entry((row.pid, user_index, index))
                        .or_insert_with(|| {
                            let key = (p.info.pid, p.info.start_time_unix_ns);
                            self.python.splice_stack(key, runtime, user, frames)
                        })
                        .as_slice()
                }
                None => user,
            };
            let stack = kernel
                .iter()
                .chain(kernel_marker.as_ref())
                .chain(user)
                .chain(user_marker.as_ref());
            let (mut frames, mut unknown) = (0u64, 0u64);
            for frame in stack.clone() {
                frames += 1;
                unknown += u64::from(frame.is_unknown());
                if let (FrameKind::Jit(_), Some(p)) = (frame.kind, process) {
                    if Arc::ptr_eq(&frame.function, &p.jit_unnamed) {
                        self.stats.jit_frames_unnamed += row.count;
                    } else {
                        self.stats.jit_frames_named += row.count;
                    }
                }
            }
            self.stats.frames += frames;
            self.stats.unknown_frames += unknown;
            self.samples = self.samples.saturating_add(row.count);
            if let (StackRef::Index(u), Some(p)) = (row.user_stack, process) {
                let files = files_memo
                    .entry((row.pid, u))
                    .or_insert_with(|| stack_files(&batch.user_stacks[u as usize], p));
                for &id in files.iter() {
                    *self.file_samples.entry(id).or_default() += row.count;
                }
            }
            let thread = thread_of(row, process);
            if row.count > 0 || row.off_cpu_ns == 0 {
                profile.add_frames(&thread, stack.clone(), row.count);
            }
            if row.off_cpu_ns > 0 {
                profile.add_frames_of(SampleKind::OffCpu, &thread, stack, row.off_cpu_ns);
            }
        }
        profile.observe(batch.interval_start_unix_ns, batch.interval_end_unix_ns);
        if profile.hostname.is_none() && !self.hello.hostname.is_empty() {
            profile.hostname = Some(Arc::from(self.hello.hostname.as_str()));
        }
        skipped
    }
}

/// A passed file the relay reads itself (a jitdump): a copy of its descriptor; the file counts
/// as used at `tick`, so its descriptor is not the first closed past `max_open_files`.
fn read_passed_file(
    files: &HashMap<u64, PassedFile>,
    tick: u64,
    file_id: u64,
) -> Option<std::fs::File> {
    let file = files.get(&file_id)?;
    let fd = file.fd.as_ref()?;
    file.last_read.set(tick);
    fd.try_clone().ok().map(std::fs::File::from)
}

impl Session {
    /// Reads the perf maps and jitdumps of the processes of `batch` that have frames in JIT
    /// code no range of theirs names yet (what the files gained since; usually nothing).
    fn catch_up_jit(&mut self, batch: &Batch, left_out: &HashSet<u32>) {
        let mut wanting: HashSet<u32> = HashSet::new();
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        for row in &batch.rows {
            let StackRef::Index(u) = row.user_stack else {
                continue;
            };
            if left_out.contains(&row.pid)
                || wanting.contains(&row.pid)
                || !self.jit.has_sources(row.pid)
                || !seen.insert((row.pid, u))
            {
                continue;
            }
            let Some(process) = self.processes.get(&row.pid) else {
                continue;
            };
            let addrs = batch
                .user_stacks
                .get(u as usize)
                .map_or(&[][..], Vec::as_slice);
            let missing = addrs.iter().enumerate().any(|(i, &address)| {
                let lookup = if i == 0 {
                    address
                } else {
                    address.saturating_sub(1)
                };
                in_jit_code(process, lookup) && self.jit.lookup(row.pid, lookup).is_none()
            });
            if missing {
                wanting.insert(row.pid);
            }
        }
        let (files, tick) = (&self.files, self.tick);
        let dump_file = |id: u64| read_passed_file(files, tick, id);
        for pid in wanting {
            self.jit.catch_up(pid, &dump_file);
        }
    }

    /// Takes in the interval's code copies, each for the process its pid is known as now; a
    /// copy of a process without a usable CPython layout is dropped.
    fn take_codes(&mut self, interp: &InterpBatch) {
        self.python.cache.next_interval();
        for copy in &interp.codes {
            let Some(process) = self.processes.get(&copy.pid) else {
                continue;
            };
            let Some(runtime) = cpython_runtime(process) else {
                continue;
            };
            let key = (copy.pid, process.info.start_time_unix_ns);
            let raw: &RawCode = &copy.raw;
            self.python.take_codes(key, runtime, [(copy.code, raw)]);
        }
    }
}

/// The CPython a process maps, when the relay has a layout for it.
fn cpython_runtime(process: &Process) -> Option<Runtime<'_>> {
    process.runtimes.iter().find_map(|r| match &**r {
        Recognized::CPython(i) => Some(Runtime {
            version: i.version,
            layout: i.layout.as_ref().ok()?,
            module: process.interpreter_path.as_deref(),
        }),
    })
}

/// The module of one mapping, named by the path the process mapped (as the sampler read it in
/// `/proc/PID/maps`; `[jit]` without one: anonymous executable memory holds generated code). Every output names mappings from this (pprof, both
/// OTLP generations, speedscope), so it is never the name of the descriptor the file came
/// through: that is `/proc/self/fd/N`, and for a file the relay may not reopen, its private
/// sealed copy (`/memfd:ember-elf`), which no reader of the profile could open.
///
/// A file's module is its mapped range in the file's own offsets, named by the file the kernel
/// reported (device, inode), so the processes that map one binary have equal modules wherever
/// their ASLR put it (see [`Module`]); anonymous memory's is its range in the process.
fn module_of(mapping: &ember_protocol::Mapping, build_id: Option<Arc<str>>) -> Arc<Module> {
    let path = Arc::from(if mapping.path.is_empty() {
        "[jit]"
    } else {
        mapping.path.as_str()
    });
    if is_anonymous_code(mapping) {
        return Arc::new(Module {
            path,
            build_id,
            start: mapping.start,
            end: mapping.end,
            file_offset: mapping.file_offset,
            file: None,
        });
    }
    // (the sum comes from the sampler: an overflowing offset saturates, and its frames are
    // counted as bad offsets in `user_frames`)
    let length = mapping.end.saturating_sub(mapping.start);
    Arc::new(Module {
        path,
        build_id,
        start: mapping.file_offset,
        end: mapping.file_offset.saturating_add(length),
        file_offset: mapping.file_offset,
        file: Some(FileIdentity {
            device: mapping.device,
            inode: mapping.inode,
        }),
    })
}

/// Who a row belongs to: its process's facts when known (else the thread's name names it).
fn thread_of(row: &Row, process: Option<&Process>) -> Thread {
    let process_name = match process {
        Some(p) if !p.name.is_empty() => Arc::clone(&p.name),
        _ => Arc::from(row.comm.as_str()),
    };
    let (executable_path, container_id) = match process {
        Some(p) => (Arc::clone(&p.executable_path), p.container_id.clone()),
        None => (Arc::from(""), None),
    };
    Thread {
        pid: row.pid,
        tid: row.tid,
        process_name,
        thread_name: Arc::from(row.comm.as_str()),
        executable_path,
        container_id,
    }
}

/// The passed files a user stack's frames fall in, each once.
fn stack_files(addrs: &[u64], process: &Process) -> Vec<u64> {
    let mappings = &process.info.mappings;
    let mut out: Vec<u64> = Vec::new();
    for (i, &address) in addrs.iter().enumerate() {
        let lookup = if i == 0 {
            address
        } else {
            address.saturating_sub(1)
        };
        let at = mappings.partition_point(|m| m.start <= lookup);
        let Some(mapping) = at.checked_sub(1).and_then(|i| mappings.get(i)) else {
            continue;
        };
        if lookup < mapping.end && mapping.file_id != 0 && !out.contains(&mapping.file_id) {
            out.push(mapping.file_id);
        }
    }
    out
}

/// Symbolizes one user stack (leaf first). Return addresses (all frames but the leaf) point
/// after the call, so they are looked up one byte earlier to land in the calling line.
fn user_frames(
    addrs: &[u64],
    process: Option<&Process>,
    files: &HashMap<u64, PassedFile>,
    cache: &mut ElfCache,
    tick: u64,
    bad_offsets: &mut u64,
    jit: &JitStores,
) -> Vec<Frame> {
    let mut out = Vec::with_capacity(addrs.len());
    for (i, &address) in addrs.iter().enumerate() {
        let lookup = if i == 0 {
            address
        } else {
            address.saturating_sub(1)
        };
        let found = process.and_then(|p| {
            let at = p.info.mappings.partition_point(|m| m.start <= lookup);
            let index = at.checked_sub(1)?;
            let mapping = &p.info.mappings[index];
            (lookup < mapping.end).then(|| (mapping, &p.modules[index]))
        });
        let jit_code = |p: &Process| jit.lookup(p.info.pid, lookup);
        let Some((mapping, module)) = found else {
            // No mapping covers it: JIT code mapped after the facts were read, if anything.
            match process.and_then(|p| Some((p, jit_code(p)?))) {
                Some((p, code)) => out.push(jit_frame(code, p.jit_runtime, address, None)),
                // Its address names nothing a reader could look up (no file, no mapping, and
                // the process may be gone): all such frames are one, at 0. Kept, the address
                // made a frame per process and instruction: under churn (processes that exit
                // before their facts are read) most of a window's frames.
                None => out.push(unknown(0, None)),
            }
            continue;
        };
        if let Some(p) = process.filter(|_| is_anonymous_code(mapping)) {
            // JIT code: named from the process's own files, else one name per executable.
            out.push(match jit_code(p) {
                Some(code) => jit_frame(code, p.jit_runtime, address, Some(module)),
                None => Frame {
                    function: Arc::clone(&p.jit_unnamed),
                    file: None,
                    line: None,
                    kind: FrameKind::Jit(p.jit_runtime),
                    inlined: false,
                    address,
                    module: Some(Arc::clone(module)),
                },
            });
            continue;
        }
        // `address >= lookup >= mapping.start` holds (found above); the sums come from the
        // sampler. The frame is where the file is sampled, not where this process mapped it.
        let (Some(file_offset), Some(at)) = (
            (lookup - mapping.start).checked_add(mapping.file_offset),
            (address - mapping.start).checked_add(mapping.file_offset),
        ) else {
            *bad_offsets += 1;
            out.push(unknown(u64::MAX, Some(module)));
            continue;
        };
        let resolved = files.get(&mapping.file_id).and_then(|file| {
            let fd = file.fd.as_ref()?;
            file.last_used.set(tick);
            cache.resolve(file.key.as_ref()?, fd, &mapping.path, file_offset)
        });
        match resolved {
            Some(frames) if !frames.is_empty() => {
                for r in frames.iter() {
                    out.push(Frame {
                        function: Arc::clone(&r.function),
                        file: r.file.clone(),
                        line: r.line,
                        kind: if r.go {
                            FrameKind::Go
                        } else {
                            FrameKind::Native
                        },
                        inlined: r.inlined,
                        address: at,
                        module: Some(Arc::clone(module)),
                    });
                }
            }
            _ => out.push(unknown(at, Some(module))),
        }
    }
    out
}

/// Whether `address` of `process` is in JIT code: anonymous executable memory, or no mapping.
fn in_jit_code(process: &Process, address: u64) -> bool {
    let at = process
        .info
        .mappings
        .partition_point(|m| m.start <= address);
    match at.checked_sub(1).map(|i| &process.info.mappings[i]) {
        Some(m) if address < m.end => is_anonymous_code(m),
        _ => true,
    }
}

/// Anonymous executable memory: no file, and not one of the kernel's own (`[vdso]`).
fn is_anonymous_code(mapping: &ember_protocol::Mapping) -> bool {
    mapping.inode == 0 && (mapping.path.is_empty() || mapping.path.starts_with("[anon:"))
}

/// A jitdump file's path: `.../jit-<digits>.dump`, as runtimes name it.
fn is_jitdump_path(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_prefix("jit-")
        .and_then(|rest| rest.strip_suffix(".dump"))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// A frame of JIT code named by `code` (from `process`'s perf map or jitdump).
fn jit_frame(
    code: &crate::jit::Code,
    runtime: JitRuntime,
    address: u64,
    module: Option<&Arc<Module>>,
) -> Frame {
    Frame {
        function: Arc::clone(&code.name),
        file: code.source.as_ref().map(|(file, _)| Arc::clone(file)),
        line: code.source.as_ref().map(|&(_, line)| line),
        kind: FrameKind::Jit(runtime),
        inlined: false,
        address,
        module: module.map(Arc::clone),
    }
}

fn unknown(address: u64, module: Option<&Arc<Module>>) -> Frame {
    Frame {
        function: Arc::from(UNKNOWN),
        file: None,
        line: None,
        kind: FrameKind::Native,
        inlined: false,
        address,
        module: module.map(Arc::clone),
    }
}

#[cfg(test)]
mod tests {
    use ember_protocol::{Mapping, Row};

    /// `FileLimits::clamped_to_rlimit`: however many open files are asked for, the relay keeps
    /// fewer than its soft RLIMIT_NOFILE, so passed descriptors can never exhaust it.
    #[test]
    fn max_open_files_stays_below_the_soft_nofile_limit() {
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .expect("getrlimit(RLIMIT_NOFILE)");
        let soft = usize::try_from(soft).unwrap_or(usize::MAX);
        // Given a request for more descriptors than the process may ever open
        let asked = FileLimits {
            max_open_files: usize::MAX,
            ..FileLimits::default()
        };
        // When clamped
        let clamped = asked.clamped_to_rlimit();
        // Then it stays below the limit (with room for the relay's own files), never 0, and the
        // other limit is untouched
        assert!(
            (1..soft).contains(&clamped.max_open_files),
            "max_open_files {} with a soft RLIMIT_NOFILE of {soft}",
            clamped.max_open_files
        );
        assert_eq!(clamped.max_copy_bytes, asked.max_copy_bytes);
        // And a small request is kept as asked
        let small = FileLimits {
            max_open_files: 3,
            ..FileLimits::default()
        };
        assert_eq!(small.clamped_to_rlimit().max_open_files, 3);
    }

    use super::*;

    impl Session {
        fn has_fd(&self, file_id: u64) -> bool {
            self.files.get(&file_id).is_some_and(|f| f.fd.is_some())
        }
    }

    /// `FileInfo`s for `ids` with real descriptors of temp files, in that order.
    fn files(ids: &[u64]) -> (Vec<FileInfo>, Vec<Option<OwnedFd>>) {
        let infos = ids
            .iter()
            .enumerate()
            .map(|(i, &file_id)| FileInfo {
                file_id,
                path: format!("/lib/f{file_id}.so"),
                fd: i32::try_from(i).expect("small"),
                ..FileInfo::default()
            })
            .collect();
        let fds = ids
            .iter()
            .map(|_| Some(OwnedFd::from(tempfile::tempfile().expect("temp file"))))
            .collect();
        (infos, fds)
    }

    #[test]
    fn a_process_mapping_a_recognized_interpreter_is_counted_once() {
        // Given a session holding a real CPython (Debian's, on the test machines) as file 7
        let python = std::path::Path::new("/usr/bin/python3.11");
        let Ok(file) = std::fs::File::open(python) else {
            eprintln!(
                "SKIPPED: no {} (the interp tests cover recognition)",
                python.display()
            );
            return;
        };
        let mut session = Session::new(Hello::default(), Vec::new());
        let info = FileInfo {
            file_id: 7,
            path: python.display().to_string(),
            fd: 0,
            ..FileInfo::default()
        };
        session.add_files(vec![info], vec![Some(OwnedFd::from(file))]);
        let counted = || {
            crate::interp::seen::snapshot()
                .releases
                .get(&("cpython", "3.11".to_owned()))
                .map_or(0, |r| r.processes)
        };
        let before = counted();
        // When a process mapping it is described, then described again (new facts, same
        // process) and its mappings continued
        let mut facts = process(4242, &[7], 0);
        facts.start_time_unix_ns = 11;
        session.set_process(facts.clone());
        session.set_process(facts.clone());
        assert!(session.append_mappings(4242, 11, vec![]));
        // Then it is counted once
        assert_eq!(counted() - before, 1);
        // And a new process under the same pid (another start time) is counted again
        facts.start_time_unix_ns = 12;
        session.set_process(facts);
        assert_eq!(counted() - before, 2);
    }

    #[test]
    fn python_frames_of_the_interp_seam_are_named_spliced_and_forgotten_with_the_process() {
        // Given a session holding Debian's CPython 3.11 as file 7, mapped by pid 4243
        let python = std::path::Path::new("/usr/bin/python3.11");
        let Ok(file) = std::fs::File::open(python) else {
            crate::interp::cpython::tests::missing("no /usr/bin/python3.11");
            return;
        };
        let mut session = Session::new(Hello::default(), Vec::new());
        let info = FileInfo {
            file_id: 7,
            path: python.display().to_string(),
            fd: 0,
            ..FileInfo::default()
        };
        session.add_files(vec![info], vec![Some(OwnedFd::from(file))]);
        let mut facts = process(4243, &[7], 0);
        facts.start_time_unix_ns = 5;
        session.set_process(facts);
        // And an interval whose walk copied one code object (3.11: `str` header 48 bytes) and
        // gave one sample a stack of it, ending at an entry frame
        let name = |text: &str| {
            let mut raw = vec![0u8; 48];
            raw[16..24].copy_from_slice(&(text.len() as i64).to_le_bytes());
            raw[32..36].copy_from_slice(&0xe4u32.to_le_bytes());
            raw.extend_from_slice(text.as_bytes());
            raw
        };
        let code = crate::interp::raw::RawCodeCopy {
            pid: 4243,
            code: 0x7f00_0000,
            raw: RawCode {
                first_line: 3,
                copied: RawCode::NAME | RawCode::FILENAME,
                name: name("Job.run"),
                filename: name("/srv/job.py"),
                linetable: Vec::new(),
            },
        };
        let walked = crate::interp::raw::RawInterpFrame {
            code: 0x7f00_0000,
            instruction: 0,
            marker: 1,
        };
        let interp = InterpBatch {
            stacks: vec![vec![walked]],
            row_stacks: vec![1],
            codes: vec![code],
        };
        // When a batch whose native stack has no eval frame (unnamed addresses) is symbolized
        let mut profile = SymbolizedProfile::default();
        session.symbolize_batch_with_interp(
            &batch(4243, vec![0x7010]),
            &interp,
            &mut ElfCache::default(),
            &mut profile,
            &HashSet::new(),
        );
        // Then the Python frame is named from the copy and takes the place of the interpreter
        // binary's unnamed frame (the eval loop, when no symbol names it)
        let samples = profile.samples();
        let names: Vec<String> = samples[0].stack.iter().map(Frame::text_name).collect();
        assert_eq!(
            names.last().map(String::as_str),
            Some("Job.run (job.py:3)"),
            "{names:?}"
        );
        let (stats, cache, cached) = session.python_stats();
        assert_eq!(
            (stats.frames, stats.unknown_code, stats.groups_left),
            (1, 0, 0)
        );
        assert_eq!((cache.inserted, cached), (1, 1));
        // And when the process exits, its codes are forgotten
        session.remove_process(4243);
        assert_eq!(session.python_stats().2, 0);
    }

    #[test]
    fn a_real_libpythons_eval_loop_frames_are_replaced_by_their_python_frames_until_exec() {
        // Given pyenv's CPython 3.12 library passed as file 3, mapped by pid 4244 (file offset
        // = virtual address in its text), and where its eval loop and `Py_RunMain` are
        let root = std::env::var_os("PYENV_ROOT").map_or_else(
            || {
                std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".pyenv")
            },
            std::path::PathBuf::from,
        );
        let path = root.join("versions/3.12.1/lib/libpython3.12.so.1.0");
        let Ok(file) = std::fs::File::open(&path) else {
            crate::interp::cpython::tests::missing("no pyenv CPython 3.12.1");
            return;
        };
        let wanted = [
            "_PyEval_EvalFrameDefault",
            "_PyEval_EvalFrameDefault.cold",
            "Py_RunMain",
        ];
        let facts = crate::interp::elf::read(
            &file,
            &wanted,
            crate::interp::elf::Tables::All,
            &crate::interp::Limits::default(),
        )
        .expect("read libpython's symbols");
        let base = 0x7f00_0000_0000u64;
        let at = |name: &str, plus: u64| base + facts.symbol(name).expect("symbol").value + plus;
        let mut session = Session::new(Hello::default(), Vec::new());
        let info = FileInfo {
            file_id: 3,
            path: path.display().to_string(),
            fd: 0,
            ..FileInfo::default()
        };
        session.add_files(vec![info], vec![Some(OwnedFd::from(file))]);
        let facts_of = |exe: &str| ProcessInfo {
            pid: 4244,
            start_time_unix_ns: 9,
            executable_name: "python3.12".into(),
            executable_path: exe.into(),
            mappings: vec![Mapping {
                start: base,
                end: base + 0x38_0000,
                path: path.display().to_string(),
                file_id: 3,
                ..Mapping::default()
            }],
            ..ProcessInfo::default()
        };
        session.set_process(facts_of("/usr/bin/python3.12"));
        // And an interval that copied two code objects (3.12 `str` header: 40 bytes) and walked
        // hot <- shim <- <module> <- shim
        let text = |t: &str| {
            let mut raw = vec![0u8; 40];
            raw[16..24].copy_from_slice(&(t.len() as i64).to_le_bytes());
            raw[32..36].copy_from_slice(&0x64u32.to_le_bytes());
            raw.extend_from_slice(t.as_bytes());
            raw
        };
        let copy = |code: u64, name: &str, first_line: i32| crate::interp::raw::RawCodeCopy {
            pid: 4244,
            code,
            raw: RawCode {
                first_line,
                copied: RawCode::NAME | RawCode::FILENAME,
                name: text(name),
                filename: text("/srv/workload.py"),
                linetable: Vec::new(),
            },
        };
        let walked = |code: u64, marker: u8| crate::interp::raw::RawInterpFrame {
            code,
            instruction: 0,
            marker,
        };
        let interp = InterpBatch {
            stacks: vec![vec![
                walked(0xa000, 0),
                walked(0x1, 3),
                walked(0xb000, 0),
                walked(0x2, 3),
            ]],
            row_stacks: vec![1],
            codes: vec![copy(0xa000, "hot", 12), copy(0xb000, "<module>", 1)],
        };
        // The native stack: the eval loop (leaf), the eval loop again (an outer call),
        // Py_RunMain
        let native = vec![
            at("_PyEval_EvalFrameDefault", 0x40),
            at("_PyEval_EvalFrameDefault", 0x200),
            at("Py_RunMain", 0x20),
        ];
        let mut elf = ElfCache::default();
        let mut run = |session: &mut Session, interp: &InterpBatch| {
            let mut profile = SymbolizedProfile::default();
            session.symbolize_batch_with_interp(
                &batch(4244, native.clone()),
                interp,
                &mut elf,
                &mut profile,
                &HashSet::new(),
            );
            let samples = profile.samples();
            samples[0]
                .stack
                .iter()
                .map(Frame::text_name)
                .collect::<Vec<_>>()
        };
        // When the batch is symbolized
        let names = run(&mut session, &interp);
        // Then each eval frame gave way to its group, the shims dropped, the rest kept: the C
        // helper inlined into the outer eval call at that address (`get_exception_handler`)
        // stays leaf-side of that call's Python frame, as the native stack had it
        assert_eq!(
            names,
            [
                "hot (workload.py:12)",
                "get_exception_handler",
                "<module> (workload.py:1)",
                "Py_RunMain"
            ]
        );
        assert_eq!(session.python_stats().0.mismatched_stacks, 0);
        // And in a later interval without copies, the cache still names them
        let later = InterpBatch {
            codes: Vec::new(),
            ..interp.clone()
        };
        assert_eq!(run(&mut session, &later)[0], "hot (workload.py:12)");
        // But after the process exec'd another program (same pid and start, new facts), its
        // old codes are unknown
        session.set_process(facts_of("/usr/bin/other"));
        assert_eq!(run(&mut session, &later)[0], "[unknown] python");
    }

    /// A process mapping each file of `ids` at 0x1000 * id (one page, file offset `offset`).
    fn process(pid: u32, ids: &[u64], offset: u64) -> ProcessInfo {
        ProcessInfo {
            pid,
            executable_name: "victim".into(),
            mappings: ids
                .iter()
                .map(|&id| Mapping {
                    start: 0x1000 * id,
                    end: 0x1000 * id + 0x1000,
                    file_offset: offset,
                    path: format!("/lib/f{id}.so"),
                    file_id: id,
                    ..Mapping::default()
                })
                .collect(),
            ..ProcessInfo::default()
        }
    }

    /// A batch of one sample of `pid` whose user stack is `addrs`.
    fn batch(pid: u32, addrs: Vec<u64>) -> Batch {
        Batch {
            parts: 1,
            user_stacks: vec![addrs],
            rows: vec![Row {
                pid,
                tid: pid,
                comm: "victim".into(),
                user_stack: StackRef::Index(0),
                kernel_stack: StackRef::Missing(14),
                count: 1,
                interp_stack: None,
                off_cpu_ns: 0,
            }],
            ..Batch::default()
        }
    }

    fn symbolize(session: &mut Session, batch: &Batch) -> SymbolizedProfile {
        let mut profile = SymbolizedProfile::default();
        session.symbolize_batch(
            batch,
            &mut ElfCache::default(),
            &mut profile,
            &HashSet::new(),
        );
        profile
    }

    #[test]
    fn files_no_process_refers_to_are_closed_at_the_next_batch_and_unmapped_ones_after_the_grace() {
        // Given three passed files of which one process maps only the first
        let mut session = Session::new(Hello::default(), Vec::new());
        session.sweep_after = Duration::from_millis(200);
        let (infos, fds) = files(&[1, 2, 3]);
        session.add_files(infos, fds);
        session.set_process(process(10, &[1], 0));
        assert_eq!(session.file_count(), 3);
        // When the next batch comes
        symbolize(&mut session, &batch(10, Vec::new()));
        // Then only the mapped file is still open and the others were counted
        assert_eq!(session.file_count(), 1);
        assert!(session.has_fd(1));
        assert_eq!(session.stats.files_swept, 2);
        // When a file is passed, mapped by a process whose facts are replaced before any batch
        // came (a pid reused at once), Then it is kept for the grace too
        let (infos, fds) = files(&[4]);
        session.add_files(infos, fds);
        session.set_process(process(11, &[4], 0));
        session.set_process(process(11, &[], 1));
        symbolize(&mut session, &batch(10, Vec::new()));
        assert!(session.has_fd(4));
        assert_eq!(session.stats.files_swept, 2);
        session.remove_process(11);
        // When that process is replaced by facts mapping nothing, Then its file stays for the
        // grace (the sampler keeps it for the next start of the same program), then goes
        session.set_process(process(10, &[], 0));
        symbolize(&mut session, &batch(10, Vec::new()));
        assert_eq!(session.file_count(), 2);
        std::thread::sleep(Duration::from_millis(250));
        symbolize(&mut session, &batch(10, Vec::new()));
        assert_eq!(session.file_count(), 0);
    }

    #[test]
    fn a_passed_device_is_closed_unread() {
        // Given a passed "file" that is a character device (a hostile process can map one
        // executable) beside a regular file
        let mut session = Session::new(Hello::default(), Vec::new());
        let (infos, mut fds) = files(&[1, 2]);
        fds[0] = Some(OwnedFd::from(
            std::fs::File::open("/dev/null").expect("open /dev/null"),
        ));
        // When both are taken in
        session.add_files(infos, fds);
        // Then the device's descriptor is closed at once and the regular file's kept
        assert!(!session.has_fd(1));
        assert!(session.has_fd(2));
    }

    #[test]
    fn beyond_max_open_files_the_least_recently_used_descriptor_is_closed() {
        // Given a session keeping at most two descriptors, two mapped files, and a batch that
        // used only the first
        let mut session = Session::new(Hello::default(), Vec::new()).with_max_open_files(2);
        let (infos, fds) = files(&[1, 2]);
        session.add_files(infos, fds);
        session.set_process(process(10, &[1, 2, 3], 0));
        let profile = symbolize(&mut session, &batch(10, vec![0x1010]));
        assert_eq!(profile.total_samples(), 1);
        // When a third file arrives
        let (mut infos, fds) = files(&[3]);
        infos[0].fd = 0;
        session.add_files(infos, fds);
        // Then the unused second file lost its descriptor, the used first and the new third
        // kept theirs, and the eviction was counted
        assert!(session.has_fd(1));
        assert!(!session.has_fd(2));
        assert!(session.has_fd(3));
        assert_eq!(session.stats.files_evicted, 1);
        // And a frame in the evicted file stays unnamed, the sample is kept
        let profile = symbolize(&mut session, &batch(10, vec![0x2010]));
        assert_eq!(profile.total_samples(), 1);
        assert_eq!(session.stats.unknown_frames, 2);
    }

    #[test]
    fn a_file_the_relay_reads_itself_counts_as_used() {
        // Given a session keeping at most two descriptors, a batch with a frame in the first
        // file, and the second read by the relay itself (a jitdump no frame falls in)
        let mut session = Session::new(Hello::default(), Vec::new()).with_max_open_files(2);
        let (infos, fds) = files(&[1, 2]);
        session.add_files(infos, fds);
        session.set_process(process(10, &[1, 2, 3], 0));
        symbolize(&mut session, &batch(10, vec![0x1010]));
        assert!(read_passed_file(&session.files, session.tick, 2).is_some());
        // When a third file arrives
        let (mut infos, fds) = files(&[3]);
        infos[0].fd = 0;
        session.add_files(infos, fds);
        // Then the file read keeps its descriptor, and is not taken as sampled
        assert!(session.has_fd(2));
        assert_eq!(session.stats.files_evicted, 1);
        assert!(!session.file_samples_last().contains_key(&2));
    }

    #[test]
    fn a_wrapping_file_offset_is_an_unknown_frame() {
        // Given a mapping whose file offset makes `lookup - start + file_offset` wrap
        let mut session = Session::new(Hello::default(), Vec::new());
        let (infos, fds) = files(&[1]);
        session.add_files(infos, fds);
        session.set_process(process(10, &[1], u64::MAX - 0x10));
        // When a sample lands in it
        let profile = symbolize(&mut session, &batch(10, vec![0x1800]));
        // Then the frame is unknown, counted, and the sample kept
        assert_eq!(profile.total_samples(), 1);
        assert_eq!(session.stats.bad_offsets, 1);
        assert_eq!(session.stats.unknown_frames, 1);
    }

    /// A function of this test binary to find by name in a profile.
    #[inline(never)]
    fn session_test_marker() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary as the sampler would pass it: its file (`file_id` 1, descriptor 0) and
    /// the executable mapping of it holding `address`, from this process's own maps.
    fn this_binary(address: u64) -> (FileInfo, OwnedFd, Mapping) {
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        let hex = |text: &str| u64::from_str_radix(text, 16).expect("hex");
        let range = |fields: &[&str]| {
            let (start, end) = fields[0].split_once('-').expect("start-end");
            (hex(start), hex(end))
        };
        let fields: Vec<&str> = maps
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|fields| {
                let (start, end) = range(fields);
                (start..end).contains(&address)
            })
            .expect("the mapping of this test binary's code");
        let (start, end) = range(&fields);
        let path = fields[5].to_owned();
        let mapping = Mapping {
            start,
            end,
            file_offset: hex(fields[2]),
            path: path.clone(),
            file_id: 1,
            ..Mapping::default()
        };
        let fd = OwnedFd::from(std::fs::File::open("/proc/self/exe").expect("open this binary"));
        let info = FileInfo {
            file_id: 1,
            path,
            fd: 0,
            ..FileInfo::default()
        };
        (info, fd, mapping)
    }

    /// The (process name, leaf function) of every sample in `profile`.
    fn leaves(profile: &SymbolizedProfile) -> Vec<(String, String)> {
        profile
            .samples()
            .iter()
            .map(|s| {
                let leaf = s.stack.first().map_or(String::new(), Frame::display_name);
                (s.thread.process_name.to_string(), leaf)
            })
            .collect()
    }

    #[test]
    fn a_hand_built_sampler_sequence_names_frames_follows_pid_reuse_and_closes_as_told() {
        // Given a session greeted by a sampler, passed this test binary with a real descriptor,
        // and told that pid 7 (started at 100) maps it
        let marker = session_test_marker as fn() -> u64 as usize as u64;
        let (file, fd, mapping) = this_binary(marker);
        let mut session = Session::new(Hello::default(), Vec::new());
        let mut cache = ElfCache::default();
        let mut run = |session: &mut Session, batch: &Batch| {
            let mut profile = SymbolizedProfile::default();
            session.symbolize_batch(batch, &mut cache, &mut profile, &HashSet::new());
            leaves(&profile)
        };
        session.add_files(vec![file], vec![Some(fd)]);
        let first = ProcessInfo {
            pid: 7,
            start_time_unix_ns: 100,
            executable_name: "first".into(),
            mappings: vec![mapping.clone()],
            ..ProcessInfo::default()
        };
        session.set_process(first);
        // When a sample of pid 7 lands on the marker function
        let named = run(&mut session, &batch(7, vec![marker]));
        // Then its frame is named from the passed file, under the process's name
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].0, "first");
        assert!(named[0].1.contains("session_test_marker"), "{named:?}");

        // When pid 7 is reused by a process that maps nothing (start time 200), the sampler
        // closes the file only the old process mapped, and a late continuation of the old
        // process's mappings arrives
        session.set_process(ProcessInfo {
            pid: 7,
            start_time_unix_ns: 200,
            executable_name: "second".into(),
            ..ProcessInfo::default()
        });
        session.close_files(&[1]);
        assert!(!session.append_mappings(7, 100, vec![mapping]));
        let after = run(&mut session, &batch(7, vec![marker]));
        // Then nothing of the old process is left: the new name, an unknown frame, the file
        // closed because the sampler said so, nothing left for the sweep
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].0, "second");
        assert!(after[0].1.starts_with("[unknown]"), "{after:?}");
        assert_eq!(session.file_count(), 0);
        assert_eq!(
            (session.stats.files_closed, session.stats.files_swept),
            (1, 0)
        );
    }

    #[test]
    fn frames_of_a_file_passed_as_a_private_copy_keep_the_path_the_process_mapped() {
        // Given this test binary mapped by a process as /opt/app/server, and passed through a
        // descriptor that names something else: a sealed memfd, as the relay's private copy of
        // a file it may not reopen is
        let marker = session_test_marker as fn() -> u64 as usize as u64;
        let (file, exe, mut mapping) = this_binary(marker);
        let copy = nix::sys::memfd::memfd_create("ember-elf", nix::sys::memfd::MFdFlags::empty())
            .expect("memfd_create");
        std::io::copy(
            &mut std::fs::File::from(exe),
            &mut std::fs::File::from(copy.try_clone().expect("dup the memfd")),
        )
        .expect("copy this binary into the memfd");
        mapping.path = "/opt/app/server".to_owned();
        let mut session = Session::new(Hello::default(), Vec::new());
        session.add_files(vec![file], vec![Some(copy)]);
        session.set_process(ProcessInfo {
            pid: 7,
            executable_name: "server".into(),
            executable_path: "/opt/app/server".into(),
            mappings: vec![mapping],
            ..ProcessInfo::default()
        });
        // When a sample lands on the marker function
        let profile = symbolize(&mut session, &batch(7, vec![marker]));
        // Then the frame was named from the copy's bytes, and its module and the pprof mapping
        // carry the process's path; no string of the profile names the descriptor or the copy
        let samples = profile.samples();
        let leaf = samples[0].stack.first().expect("one frame");
        assert!(leaf.function.contains("session_test_marker"), "{leaf:?}");
        let module = leaf.module.as_ref().expect("a module");
        assert_eq!(&*module.path, "/opt/app/server");
        let mut unlabelled = crate::labels::labeled::LabeledProfile::default();
        unlabelled.merge_with(&profile, |thread: &Thread| Some(thread.clone().into()));
        let pprof = crate::sink::files::pprof::render(&unlabelled);
        let first = pprof.mapping.first().expect("a mapping");
        assert_eq!(
            pprof.string_table[first.filename as usize],
            "/opt/app/server"
        );
        let leaked: Vec<&String> = (pprof.string_table.iter())
            .filter(|s| s.contains("memfd:") || s.contains("/proc/self/fd"))
            .collect();
        assert!(
            leaked.is_empty(),
            "the relay's descriptor named: {leaked:?}"
        );
    }

    /// A caller of [`session_test_marker`] to find by name in a profile.
    #[inline(never)]
    fn session_test_caller() -> u64 {
        std::hint::black_box(session_test_marker()) + 1
    }

    #[test]
    fn the_processes_of_one_binary_share_its_frames_wherever_aslr_put_it() {
        // Given this test binary passed once, and 40 short-lived processes that each map it at
        // a base of their own (as ASLR does) and have JIT code in anonymous memory of their own
        let marker = session_test_marker as fn() -> u64 as usize as u64;
        let caller = session_test_caller as fn() -> u64 as usize as u64;
        let (file, fd, real) = this_binary(marker);
        assert!((real.start..real.end).contains(&caller), "one text mapping");
        let mut session = Session::new(Hello::default(), Vec::new());
        session.add_files(vec![file], vec![Some(fd)]);
        let mut cache = ElfCache::default();
        let mut window = crate::labels::labeled::LabeledProfile::default();
        let processes = 40u32;
        let mut frames_after_one = 0;
        for pid in 100..100 + processes {
            let shift = u64::from(pid) << 36;
            let jit = 0x10_0000 + u64::from(pid) * 0x1000;
            session.set_process(ProcessInfo {
                pid,
                start_time_unix_ns: u64::from(pid),
                executable_name: "app".into(),
                mappings: vec![
                    Mapping {
                        start: jit,
                        end: jit + 0x1000,
                        ..Mapping::default()
                    },
                    Mapping {
                        start: real.start + shift,
                        end: real.end + shift,
                        inode: 42,
                        ..real.clone()
                    },
                ],
                ..ProcessInfo::default()
            });
            // When each is sampled once in the marker, called from its caller, called from JIT
            // code, and its interval merged into the window
            let stack = vec![marker + shift, caller + 1 + shift, jit + 0x11];
            let mut profile = SymbolizedProfile::default();
            session.symbolize_batch(
                &batch(pid, stack),
                &mut cache,
                &mut profile,
                &HashSet::new(),
            );
            window.merge_with(&profile, |thread: &Thread| Some(thread.clone().into()));
            session.remove_process(pid);
            // And a process whose facts never came (it exited first) is sampled at an address
            // of its own
            let mut profile = SymbolizedProfile::default();
            let unknown = batch(pid + 1000, vec![0x5000_0000 + u64::from(pid) * 0x1000]);
            session.symbolize_batch(&unknown, &mut cache, &mut profile, &HashSet::new());
            window.merge_with(&profile, |thread: &Thread| Some(thread.clone().into()));
            if pid == 100 {
                frames_after_one = window.sizes().frames;
            }
        }
        // Then the binary's frames are held once, at their file offsets, and so is the unknown
        // frame no mapping covers: only the JIT frame, which has no file, is one per process
        let samples = window.samples();
        assert_eq!(samples.len(), 2 * processes as usize);
        assert!(frames_after_one >= 4, "{frames_after_one}");
        assert_eq!(
            window.sizes().frames,
            frames_after_one + processes as usize - 1,
            "frames were added again for each process"
        );
        let offset_of = |address: u64| address - real.start + real.file_offset;
        let named = |frame: &&Frame, name: &str| frame.function.contains(name);
        let stack = (samples.iter().map(|s| s.stack.to_vec()))
            .find(|stack| {
                stack
                    .first()
                    .is_some_and(|f| named(f, "session_test_marker"))
            })
            .expect("a sample in the marker");
        let leaf = stack.first().expect("a leaf");
        assert_eq!(leaf.address, offset_of(marker));
        let call = stack.iter().find(|f| named(f, "session_test_caller"));
        assert_eq!(call.map(|f| f.address), Some(offset_of(caller + 1)));
        let root = stack.last().expect("a root frame");
        assert_eq!(root.kind, FrameKind::Jit(JitRuntime::Other));
        assert!(root.module.as_ref().is_some_and(|m| m.file.is_none()));
        // And pprof has one location per frame, one mapping for the binary, and each of its
        // locations reads back as its file offset by pprof's rule
        let pprof = crate::sink::files::pprof::render(&window);
        assert_eq!(pprof.location.len(), window.sizes().frames);
        let path = pprof.string_table.iter().position(|s| *s == real.path);
        let binary: Vec<_> = (pprof.mapping.iter())
            .filter(|m| Some(m.filename as usize) == path)
            .collect();
        assert_eq!(binary.len(), 1, "{:?}", pprof.mapping);
        let mapping = binary[0];
        let mut offsets: Vec<u64> = (pprof.location.iter())
            .filter(|l| l.mapping_id == mapping.id)
            .map(|l| l.address - mapping.memory_start + mapping.file_offset)
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        let mut expected = vec![offset_of(marker), offset_of(caller + 1)];
        expected.sort_unstable();
        assert_eq!(offsets, expected);
        assert!((mapping.memory_start..mapping.memory_limit).contains(&offset_of(marker)));
    }

    #[test]
    fn a_shared_file_stays_until_the_sampler_closes_it() {
        // Given two processes mapping one passed file
        let mut session = Session::new(Hello::default(), Vec::new());
        let (infos, fds) = files(&[1]);
        session.add_files(infos, fds);
        session.set_process(process(10, &[1], 0));
        session.set_process(process(11, &[1], 0));
        // When one exits (the sampler closes nothing: the other maps it) and a batch comes
        session.remove_process(10);
        symbolize(&mut session, &batch(11, vec![0x1010]));
        // Then the file is still open
        assert!(session.has_fd(1));
        // When the other exits and the sampler closes the file (and names one it never passed)
        session.remove_process(11);
        session.close_files(&[1, 99]);
        // Then exactly that file is gone, and the sweep had nothing to do
        assert_eq!(session.file_count(), 0);
        assert_eq!(
            (session.stats.files_closed, session.stats.files_swept),
            (1, 0)
        );
    }

    fn mapping(start: u64, file_id: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            path: format!("/lib/{file_id}.so"),
            inode: file_id,
            file_id,
            ..Mapping::default()
        }
    }

    #[test]
    fn appends_to_the_same_process_only() {
        // Given a process known with one mapping
        let mut session = Session::new(Hello::default(), Vec::new());
        session.set_process(ProcessInfo {
            pid: 7,
            start_time_unix_ns: 100,
            mappings: vec![mapping(0x5000, 1)],
            ..ProcessInfo::default()
        });
        // When more mappings arrive for it, lower and higher than the known one
        assert!(session.append_mappings(7, 100, vec![mapping(0x9000, 2), mapping(0x1000, 3)]));
        // Then they are kept sorted, with one module each and a reference on each file
        let process = &session.processes[&7];
        let starts: Vec<u64> = process.info.mappings.iter().map(|m| m.start).collect();
        assert_eq!(starts, [0x1000, 0x5000, 0x9000]);
        assert_eq!(process.modules.len(), 3);
        assert_eq!(&*process.modules[0].path, "/lib/3.so");
        // And mappings for another start time or an unknown pid are ignored
        assert!(!session.append_mappings(7, 101, vec![mapping(0xa000, 4)]));
        assert!(!session.append_mappings(8, 100, vec![mapping(0xa000, 4)]));
        assert_eq!(session.processes[&7].info.mappings.len(), 3);
    }

    #[test]
    fn mappings_the_sampler_left_out_are_counted() {
        // Given process facts whose mappings the sampler cut at its cap, sent twice (a change)
        let mut session = Session::new(Hello::default(), Vec::new());
        for _ in 0..2 {
            session.set_process(ProcessInfo {
                pid: 7,
                mappings: vec![mapping(0x5000, 1)],
                mappings_omitted: 3,
                ..ProcessInfo::default()
            });
        }
        // And facts of another process with none left out
        session.set_process(ProcessInfo {
            pid: 8,
            mappings: vec![mapping(0x5000, 1)],
            ..ProcessInfo::default()
        });
        // Then every message's omitted mappings are counted
        assert_eq!(session.stats.mappings_omitted, 6);
    }
}
