//! The relay's ground types, which every stage shares and which import no stage: symbolized
//! frames, the thread a sample belongs to, and the aggregated [`Profile`] (a table of
//! (who, stack) -> count), and how a frame is named in text outputs ([`Frame::text_name`]), so
//! every sink and `record`'s summary name frames alike.
//!
//! Flow: `RawBatch` (protocol) -> frames (symbolize), added to the batch's [`SymbolizedProfile`]
//! in place ([`Profile::add_frames`]), its rows keyed by [`Thread`] (pid first) -> the labels
//! stage files each process under its resource labels into a `Profile` keyed by its own type
//! (`labels::labeled::LabeledProfile`, [`Profile::merge_with`]) -> sinks. A frame that could not
//! be named is still a frame (`[unknown]` with its module), so no sample is ever dropped between
//! stages. Every output names it alike, by its module (`[unknown] libfoo.so`), one name per
//! module and not per address, so flame graphs aggregate it; the address stays where an output
//! has a field for it (pprof and OTLP locations). A frame in a file is where in the file (its
//! module is the file, its address a file offset), not where a process mapped it: the processes
//! of one binary share its frames whatever their ASLR layout ([`Module`]).

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use indexmap::IndexSet;

mod stacks;
use stacks::Ids;
pub(crate) use stacks::StackTable;

/// Where a frame's code lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    Kernel,
    Native,
    /// Not a code frame: a marker such as "[lost stack: collision]".
    Marker,
    /// A CPython function's frame, spliced in place of the eval loop's C frame
    /// (`interp::cpython::splice`): `function` is its qualified name, `file` its file name as
    /// the code object says, `line` the line it is at (its first line when the line table
    /// could not tell), `address` 0 and no module, so one function at one line is one frame
    /// whichever process ran it.
    CPython,
    /// A Go function's frame (native code, named from the binary's own Go table,
    /// `symbolize::gopclntab`): OpenTelemetry's `go` frame type, so a backend can tell Go code
    /// from C in a cgo binary.
    Go,
    /// Code a runtime generated at run time (anonymous executable memory): `function` is the
    /// name the runtime gave it in its perf map or jitdump (`jit`), or `[jit] <executable>` when
    /// nothing names it; its module is `[jit]`.
    Jit(JitRuntime),
}

/// The runtime whose JIT wrote a frame's code, as the process's executable tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JitRuntime {
    /// Node.js (V8).
    V8,
    /// A Java virtual machine.
    Jvm,
    /// CPython's perf trampolines (`-X perf`).
    CPython,
    /// .NET.
    Dotnet,
    /// Any other program that generates code.
    Other,
}

impl JitRuntime {
    /// The runtime of a process, from its executable's file name (`node`, `java`,
    /// `python3.12`, `dotnet`).
    pub fn of_executable(name: &str) -> Self {
        let name = name.trim_end_matches(" (deleted)");
        if name == "node" || name == "nodejs" || name.starts_with("node-") {
            Self::V8
        } else if name == "java" || name == "javaw" {
            Self::Jvm
        } else if name.starts_with("python") {
            Self::CPython
        } else if name == "dotnet" {
            Self::Dotnet
        } else {
            Self::Other
        }
    }
}

impl FrameKind {
    /// The OpenTelemetry `profile.frame.type` value: a JIT frame takes its runtime's own type
    /// (`v8js`, `jvm`, `cpython`, `dotnet`), `native` when the runtime is not known.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Native | Self::Jit(JitRuntime::Other) => "native",
            Self::Marker => "abort-marker",
            Self::CPython | Self::Jit(JitRuntime::CPython) => "cpython",
            Self::Go => "go",
            Self::Jit(JitRuntime::V8) => "v8js",
            Self::Jit(JitRuntime::Jvm) => "jvm",
            Self::Jit(JitRuntime::Dotnet) => "dotnet",
        }
    }
}

/// The module (mapped file) a frame's address belongs to.
///
/// A module of a file is the file's mapped range, described in the file's own offsets, not
/// where a process mapped it: `start` and `file_offset` are the mapping's file offset and `end`
/// is that plus its length, so `address - start + file_offset` (pprof's and OpenTelemetry's rule
/// for a mapping) is the file offset, and so are its frames' addresses. Every process that maps
/// one file alike, whatever its ASLR layout, has equal modules and, at one place in the file,
/// equal frames: a window of short-lived processes running the same few binaries holds the
/// frames of those binaries once, not once per process. Anonymous memory (JIT code, `[jit]`)
/// has no file: its module is its range in the process (`file` is `None`), and its frames keep
/// the process's addresses. The kernel's module spans the kernel's addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Module {
    /// Path as the process saw it, or `[kernel.kallsyms]`, `[vdso]`, `[jit]`.
    pub path: Arc<str>,
    /// GNU build id in hex, when known (what the file claims: shown, never its identity).
    pub build_id: Option<Arc<str>>,
    /// The range its frames' addresses fall in, and the file offset of its start (see above).
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The mapped file as the kernel named it in `/proc/PID/maps` (device, inode); `None` for
    /// anonymous memory and the kernel. Two files at one path (two containers' `/usr/bin/app`,
    /// two processes' `memfd:` files) are two modules.
    pub file: Option<FileIdentity>,
}

/// A mapped file's identity as the kernel reports it: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
}

impl Module {
    /// Last path component, as shown in `[unknown]` frames.
    pub fn base_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// One symbolized frame. Inlined functions become frames of their own (`inlined = true`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name; for an unnamed frame: `[unknown]`.
    pub function: Arc<str>,
    pub file: Option<Arc<str>>,
    pub line: Option<u32>,
    pub kind: FrameKind,
    pub inlined: bool,
    /// Where the frame is: in a file's module, the file offset of the sampled address (so the
    /// processes of one binary share it); in anonymous memory, the address in the process; in
    /// the kernel, the kernel address (see [`Module`]).
    pub address: u64,
    pub module: Option<Arc<Module>>,
}

impl Frame {
    /// The frame's name in every output: the function, or `[unknown] module` when unnamed
    /// (`[unknown]` without a module). One name per module, not per address: an unnamed
    /// library's samples add up to one flame-graph frame instead of one per instruction, and
    /// Pyroscope, which builds frames from function names only, keeps the frame.
    pub fn display_name(&self) -> String {
        if !self.is_unknown() {
            return self.function.to_string();
        }
        match &self.module {
            Some(module) => format!("{UNKNOWN} {}", module.base_name()),
            None => UNKNOWN.to_owned(),
        }
    }

    pub fn is_unknown(&self) -> bool {
        &*self.function == UNKNOWN
    }

    /// The frame's name in every text output (folded stacks, flamegraph, `record`'s top list):
    /// [`Frame::display_name`] made text-safe ([`text_safe`]), `_[k]` appended for kernel frames.
    /// A user frame whose own name ends in a flame-graph annotation (`do_syscall_64_[k]`) has
    /// its brackets turned into parentheses (`do_syscall_64_(k)`): only a frame the kernel stack
    /// gave is drawn as the kernel's.
    ///
    /// A CPython frame reads `qualname (file.py:line)`: the file name's last component only, as
    /// tracebacks are read at a glance (the whole path stays in `file` for pprof and OTLP).
    pub fn text_name(&self) -> String {
        let mut name = text_safe(&if self.kind == FrameKind::CPython {
            self.python_text()
        } else {
            self.display_name()
        });
        match self.kind {
            FrameKind::Kernel => name.push_str(KERNEL_SUFFIX),
            FrameKind::Jit(_) => {
                disarm_annotation(&mut name);
                name.push_str(JIT_SUFFIX);
            }
            _ => disarm_annotation(&mut name),
        }
        name
    }
}

impl Frame {
    /// `qualname (file.py:line)`, or the bare name without a file or line.
    fn python_text(&self) -> String {
        let base = self
            .file
            .as_deref()
            .map(|path| path.rsplit('/').next().unwrap_or(path))
            .filter(|base| !base.is_empty());
        match (base, self.line) {
            (Some(base), Some(line)) => format!("{} ({base}:{line})", self.function),
            (Some(base), None) => format!("{} ({base})", self.function),
            (None, Some(line)) => format!("{} (:{line})", self.function),
            (None, None) => self.function.to_string(),
        }
    }
}

/// Appended to kernel frames' text names, as `stackcollapse-perf.pl --kernel` does; flamegraph
/// palettes colour such frames apart.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Appended to JIT frames' text names, as `stackcollapse-perf.pl --jit` does.
pub const JIT_SUFFIX: &str = "_[j]";

/// The suffixes flame-graph palettes read as a frame's kind (kernel, JIT, inlined, waker), as
/// flamegraph.pl and inferno do.
const ANNOTATIONS: [&str; 4] = [KERNEL_SUFFIX, JIT_SUFFIX, "_[i]", "_[w]"];

/// Rewrites a trailing annotation that a name carries itself (`f_[k]` -> `f_(k)`), so that no
/// function name can pass for a frame of another kind.
pub(crate) fn disarm_annotation(name: &mut String) {
    if let Some(annotation) = ANNOTATIONS.iter().find(|a| name.ends_with(*a)) {
        let kind = &annotation[2..3];
        let stem = name.len() - annotation.len();
        name.replace_range(stem.., &format!("_({kind})"));
    }
}

/// Replaces the folded format's frame separator inside a name.
const SEPARATOR_REPLACEMENT: char = ':';

/// `name` safe for text outputs read in a terminal, an editor or a browser: `;` (the folded
/// format's frame separator) becomes `:`, so `[u8; 8]` becomes `[u8: 8]`; a control character
/// (line breaks and the escape sequences a terminal obeys) and an invisible character that
/// reorders or hides text (bidi overrides and isolates, zero-width characters, line and
/// paragraph separators) are written as Rust escapes (`\u{1b}`, `\u{202e}`), visibly. A name
/// can then split neither a line nor a frame, and shows what it is.
pub fn text_safe(name: &str) -> String {
    terminal_safe(&name.replace(';', &SEPARATOR_REPLACEMENT.to_string()))
}

/// `text` with every control character and invisible format character written as its Rust
/// escape (see [`text_safe`]), `;` kept: for a value printed on a line of its own kind (the
/// debug exporter's attributes and frames).
pub fn terminal_safe(text: &str) -> String {
    let mut safe = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || is_invisible_format(c) {
            safe.extend(c.escape_unicode());
        } else {
            safe.push(c);
        }
    }
    safe
}

/// Format characters that change how the text around them is shown without showing
/// themselves: bidi marks, embeddings, overrides and isolates; zero-width spaces and joiners;
/// the word joiner and byte-order mark; the line and paragraph separators.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// The name of a frame that could not be symbolized.
pub const UNKNOWN: &str = "[unknown]";

/// Who a sample belongs to, as symbolization knows it (the process's facts, no labels).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Thread {
    pub pid: u32,
    pub tid: u32,
    pub process_name: Arc<str>,
    pub thread_name: Arc<str>,
    /// The process's executable as the sampler read it (`/proc/PID/exe`); empty when unknown.
    pub executable_path: Arc<str>,
    /// The container the process runs in, from its cgroup path, when it names one.
    pub container_id: Option<Arc<str>>,
}

/// Fixtures for the crate's unit tests.
#[cfg(test)]
impl Frame {
    /// A frame of `function` at `address`, with no source line, module or inlining.
    pub(crate) fn bare(function: &str, kind: FrameKind, address: u64) -> Self {
        Self {
            function: function.into(),
            file: None,
            line: None,
            kind,
            inlined: false,
            address,
            module: None,
        }
    }
}

#[cfg(test)]
impl Thread {
    /// A thread of no container.
    pub(crate) fn bare(
        (pid, tid): (u32, u32),
        process_name: &str,
        thread_name: &str,
        executable_path: &str,
    ) -> Self {
        Self {
            pid,
            tid,
            process_name: process_name.into(),
            thread_name: thread_name.into(),
            executable_path: executable_path.into(),
            container_id: None,
        }
    }
}

/// The container id in a cgroup path (`.../docker-<64 hex>.scope`, `/docker/<64 hex>`,
/// `cri-containerd-<id>.scope`, `crio-<id>`, `libpod-<id>`), if any; of any line of a whole
/// `/proc/PID/cgroup` text (what the sampler forwards).
pub fn container_id(cgroup: &str) -> Option<&str> {
    cgroup
        .lines()
        .flat_map(|line| line.rsplit('/'))
        .find_map(|segment| {
            let segment = segment.strip_suffix(".scope").unwrap_or(segment);
            let id = segment.rsplit('-').next().unwrap_or(segment);
            (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
        })
}

/// A stack, leaf first, shared between samples.
pub type Stack = Arc<[Frame]>;

/// One aggregated row held whole: a thread, a stack (leaf first) and how many times it was
/// sampled. The pipeline adds its rows to a [`Profile`] without one ([`Profile::add_frames`]);
/// this is how the unit tests and the end-to-end tests (through `ember_relay::testing`) build a
/// profile ([`Profile::add`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedSample<T = Thread> {
    pub thread: T,
    pub stack: Stack,
    pub count: u64,
}

impl<T> SymbolizedSample<T> {
    /// This sample as sinks read one (see [`Profile::samples`]).
    pub fn view(&self) -> SampleRef<'_, T> {
        SampleRef {
            thread: &self.thread,
            stack: StackView(Repr::Frames(&self.stack)),
            count: self.count,
        }
    }
}

/// One aggregated row of a [`Profile`], borrowed from it: what sinks iterate.
#[derive(Debug)]
pub struct SampleRef<'a, T = Thread> {
    pub thread: &'a T,
    pub stack: StackView<'a>,
    pub count: u64,
}

impl<T> Clone for SampleRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SampleRef<'_, T> {}

/// A stack (leaf first) borrowed from a [`Profile`]'s tables or from a [`SymbolizedSample`].
#[derive(Clone, Copy)]
pub struct StackView<'a>(Repr<'a>);

impl std::fmt::Debug for StackView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[derive(Clone, Copy)]
enum Repr<'a> {
    Interned {
        ids: Ids<'a>,
        frames: &'a IndexSet<Frame, Hasher>,
    },
    Frames(&'a [Frame]),
}

impl<'a> StackView<'a> {
    pub fn len(&self) -> usize {
        match self.0 {
            Repr::Interned { ids, .. } => ids.len(),
            Repr::Frames(frames) => frames.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self.0 {
            Repr::Interned { ids, .. } => ids.is_empty(),
            Repr::Frames(frames) => frames.is_empty(),
        }
    }

    /// The `i`th frame, leaf first.
    pub fn get(&self, i: usize) -> Option<&'a Frame> {
        self.iter().nth(i)
    }

    /// The leaf frame.
    pub fn first(&self) -> Option<&'a Frame> {
        self.iter().next()
    }

    /// The outermost frame.
    pub fn last(&self) -> Option<&'a Frame> {
        self.iter().next_back()
    }

    /// The frames, leaf first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &'a Frame> + 'a {
        match self.0 {
            Repr::Interned { ids, frames } => FramesOf::Interned { ids, frames },
            Repr::Frames(frames) => FramesOf::Frames(frames.iter()),
        }
    }

    /// The frames, leaf first, in one slice (for outputs that group neighbouring frames).
    pub fn to_vec(self) -> Vec<&'a Frame> {
        self.iter().collect()
    }
}

/// The frames of a [`StackView`], leaf first, from either end.
enum FramesOf<'a> {
    Interned {
        ids: Ids<'a>,
        frames: &'a IndexSet<Frame, Hasher>,
    },
    Frames(std::slice::Iter<'a, Frame>),
}

impl<'a> Iterator for FramesOf<'a> {
    type Item = &'a Frame;

    fn next(&mut self) -> Option<&'a Frame> {
        match self {
            // (an id that names no frame is skipped, as a missing frame would be)
            Self::Interned { ids, frames } => ids.find_map(|id| frames.get_index(id as usize)),
            Self::Frames(frames) => frames.next(),
        }
    }
}

impl DoubleEndedIterator for FramesOf<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Self::Interned { ids, frames } => loop {
                let id = ids.next_back()?;
                if let Some(frame) = frames.get_index(id as usize) {
                    break Some(frame);
                }
            },
            Self::Frames(frames) => frames.next_back(),
        }
    }
}

/// The hasher of the profile's tables: keys are the relay's own (frames it named, threads of
/// processes the sampler described), hashed per sample, so a fast hash beats SipHash's
/// flooding resistance here.
type Hasher = foldhash::fast::RandomState;

/// What a row of a [`Profile`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SampleKind {
    /// CPU samples: the row's value is a count of samples (each 1 / Hz of CPU time).
    Cpu,
    /// Off-CPU time (`--off-cpu`): the row's value is nanoseconds blocked, the kept waits'
    /// weights summed (docs/offcpu.md).
    OffCpu,
}

/// Samples aggregated over a time range, keyed by who they belong to (`T`): a [`Thread`] after
/// symbolization ([`SymbolizedProfile`]), the labels stage's own type after it (what sinks
/// receive).
///
/// Stored compactly: every distinct frame, thread and stack once, in tables; a stack is the list
/// of its frames' ids, one to three bytes each (`stacks`), and a value is keyed by (thread id,
/// stack id), one map per kind. A window of many distinct stacks then costs about a byte per
/// frame of each stack and a few dozen bytes per row (the bound is a unit test's).
#[derive(Clone, Debug)]
pub struct Profile<T = Thread> {
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub frequency_hz: u32,
    /// The sampled machine's host name (from the sampler's hello), when known.
    pub hostname: Option<Arc<str>>,
    frames: IndexSet<Frame, Hasher>,
    stacks: StackTable,
    threads: IndexSet<T, Hasher>,
    /// Values by (thread id, stack id): samples (CPU rows).
    cpu: HashMap<(u32, u32), u64, Hasher>,
    /// Values by (thread id, stack id): nanoseconds off-CPU.
    off_cpu: HashMap<(u32, u32), u64, Hasher>,
    /// The rows (thread id, stack id) of each kind in output order, sorted by the first
    /// [`Profile::samples_of`] after a change and kept until the next: every file format of a
    /// closed window reads them, and sorting a large window is the costly part.
    order: [OnceLock<Vec<(u32, u32)>>; 2],
}

/// One batch's samples as symbolization leaves them: keyed by thread (pid first), no labels.
pub type SymbolizedProfile = Profile<Thread>;

impl<T> Default for Profile<T> {
    fn default() -> Self {
        Self {
            start_unix_ns: 0,
            end_unix_ns: 0,
            frequency_hz: 0,
            hostname: None,
            frames: IndexSet::default(),
            stacks: StackTable::default(),
            threads: IndexSet::default(),
            cpu: HashMap::default(),
            off_cpu: HashMap::default(),
            order: [OnceLock::new(), OnceLock::new()],
        }
    }
}

/// A table index as an id. Tables cannot reach 2^32 entries (each entry takes at least 5
/// bytes), so the fallback is never taken; it is there so no input can panic the relay.
fn id(index: usize) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX)
}

/// Each entry's position in the set's sorted order, by index: distinct entries get distinct
/// ranks, so comparing ranks orders entries as comparing them would.
fn ranks<T: Ord>(set: &IndexSet<T, Hasher>) -> Vec<u32> {
    let mut order: Vec<usize> = (0..set.len()).collect();
    order.sort_unstable_by(|&a, &b| set[a].cmp(&set[b]));
    let mut rank = vec![0u32; order.len()];
    for (position, &index) in order.iter().enumerate() {
        if let Some(slot) = rank.get_mut(index) {
            *slot = id(position);
        }
    }
    rank
}

/// The id of `value` in `set`, inserting a clone when it is new.
fn intern<T: Clone + Eq + std::hash::Hash>(set: &mut IndexSet<T, Hasher>, value: &T) -> u32 {
    match set.get_index_of(value) {
        Some(index) => id(index),
        None => id(set.insert_full(value.clone()).0),
    }
}

impl SampleKind {
    /// The kind's slot in a profile's per-kind tables.
    fn index(self) -> usize {
        match self {
            Self::Cpu => 0,
            Self::OffCpu => 1,
        }
    }
}

/// The id of `value` in `set`, inserting it when it is new.
fn intern_owned<T: Eq + std::hash::Hash>(set: &mut IndexSet<T, Hasher>, value: T) -> u32 {
    id(set.insert_full(value).0)
}

impl<T> Profile<T> {
    /// The values of one kind, by (thread id, stack id).
    fn values(&self, kind: SampleKind) -> &HashMap<(u32, u32), u64, Hasher> {
        match kind {
            SampleKind::Cpu => &self.cpu,
            SampleKind::OffCpu => &self.off_cpu,
        }
    }

    /// Every row: kind, (thread id, stack id), value.
    fn rows(&self) -> impl Iterator<Item = (SampleKind, (u32, u32), u64)> + '_ {
        let of = |kind: SampleKind| {
            self.values(kind)
                .iter()
                .map(move |(&key, &value)| (kind, key, value))
        };
        of(SampleKind::Cpu).chain(of(SampleKind::OffCpu))
    }

    /// The rows changed: the sorted orders are stale.
    fn changed(&mut self) {
        for order in &mut self.order {
            order.take();
        }
    }

    fn count(&mut self, kind: SampleKind, key: (u32, u32), count: u64) {
        if key.1 == stacks::NONE {
            return;
        }
        self.changed();
        let values = match kind {
            SampleKind::Cpu => &mut self.cpu,
            SampleKind::OffCpu => &mut self.off_cpu,
        };
        // Counts come from the sampler: saturate rather than wrap (or panic in debug builds).
        let total = values.entry(key).or_insert(0);
        *total = total.saturating_add(count);
    }
}

impl<T: Clone + Eq + std::hash::Hash + Ord> Profile<T> {
    pub fn new(frequency_hz: u32) -> Self {
        Self {
            frequency_hz,
            ..Self::default()
        }
    }

    /// Widens the time range to cover `[start, end]`, observed time with or without samples: a
    /// profile's range is the time it watched, so rates computed from it (samples per second,
    /// pprof's "% of duration") are not inflated by idle intervals. Zero (unknown) is ignored.
    pub fn observe(&mut self, start_unix_ns: u64, end_unix_ns: u64) {
        if start_unix_ns != 0 && (self.start_unix_ns == 0 || start_unix_ns < self.start_unix_ns) {
            self.start_unix_ns = start_unix_ns;
        }
        self.end_unix_ns = self.end_unix_ns.max(end_unix_ns);
    }

    /// Adds samples, widening the time range to cover `[start, end]`.
    pub fn add<S: Into<T>>(
        &mut self,
        sample: SymbolizedSample<S>,
        start_unix_ns: u64,
        end_unix_ns: u64,
    ) {
        self.observe(start_unix_ns, end_unix_ns);
        self.add_frames(&sample.thread.into(), sample.stack.iter(), sample.count);
    }

    /// Empties the profile (time range, host name and samples), keeping its tables' capacity:
    /// the pipeline's batch profile is refilled at every batch.
    pub fn clear(&mut self) {
        self.start_unix_ns = 0;
        self.end_unix_ns = 0;
        self.hostname = None;
        self.frames.clear();
        self.stacks.clear();
        self.threads.clear();
        self.cpu.clear();
        self.off_cpu.clear();
        self.changed();
    }

    /// Adds `count` samples of `thread` with the stack `frames` (leaf first), interning what is
    /// new; the time range is the caller's ([`Profile::observe`]).
    pub fn add_frames<'f>(
        &mut self,
        thread: &T,
        frames: impl IntoIterator<Item = &'f Frame>,
        count: u64,
    ) {
        self.add_frames_of(SampleKind::Cpu, thread, frames, count);
    }

    /// Adds `value` of `kind` (samples, or nanoseconds off-CPU) to `thread` with the stack
    /// `frames` (leaf first), as [`Profile::add_frames`] does.
    pub fn add_frames_of<'f>(
        &mut self,
        kind: SampleKind,
        thread: &T,
        frames: impl IntoIterator<Item = &'f Frame>,
        count: u64,
    ) {
        let table = &mut self.frames;
        let stack = self
            .stacks
            .intern(frames.into_iter().map(|f| intern(table, f)));
        let thread = intern(&mut self.threads, thread);
        self.count(kind, (thread, stack), count);
    }

    /// Merges another profile into this one, its observed time too (even without samples).
    /// Each of its distinct frames, threads and stacks is looked up once, not once per sample.
    pub fn merge(&mut self, other: Profile<T>) {
        if self.frequency_hz == 0 {
            self.frequency_hz = other.frequency_hz;
        }
        if self.hostname.is_none() {
            self.hostname = other.hostname;
        }
        self.observe(other.start_unix_ns, other.end_unix_ns);
        let frames: Vec<u32> = other
            .frames
            .into_iter()
            .map(|f| intern_owned(&mut self.frames, f))
            .collect();
        let threads: Vec<u32> = other
            .threads
            .into_iter()
            .map(|t| intern_owned(&mut self.threads, t))
            .collect();
        let stacks: Vec<u32> = other
            .stacks
            .iter()
            .map(|stack| {
                let ids = stack.map(|f| frames.get(f as usize).copied().unwrap_or(u32::MAX));
                self.stacks.intern(ids)
            })
            .collect();
        for (kind, values) in [
            (SampleKind::Cpu, other.cpu),
            (SampleKind::OffCpu, other.off_cpu),
        ] {
            for ((thread, stack), count) in values {
                if let (Some(&thread), Some(&stack)) =
                    (threads.get(thread as usize), stacks.get(stack as usize))
                {
                    self.count(kind, (thread, stack), count);
                }
            }
        }
    }

    /// Adds another profile's samples, each under what `who` makes of its thread (`None`: left
    /// out), and its observed time, as [`Profile::merge`] does. `who` is asked once per distinct
    /// thread of `other`, each of its distinct frames and stacks is looked up once. Returns the
    /// samples left out.
    pub fn merge_with<O>(
        &mut self,
        other: &Profile<O>,
        mut who: impl FnMut(&O) -> Option<T>,
    ) -> u64 {
        if self.frequency_hz == 0 {
            self.frequency_hz = other.frequency_hz;
        }
        if self.hostname.is_none() {
            self.hostname.clone_from(&other.hostname);
        }
        self.observe(other.start_unix_ns, other.end_unix_ns);
        let threads: Vec<Option<u32>> = other
            .threads
            .iter()
            .map(|t| who(t).map(|t| intern_owned(&mut self.threads, t)))
            .collect();
        let mut frames: Vec<Option<u32>> = vec![None; other.frames.len()];
        let mut stacks: Vec<Option<u32>> = vec![None; other.stacks.len()];
        let mut left_out = 0u64;
        for (kind, (thread, stack), count) in other.rows() {
            let Some(&Some(thread)) = threads.get(thread as usize) else {
                if kind == SampleKind::Cpu {
                    left_out = left_out.saturating_add(count);
                }
                continue;
            };
            let Some(slot) = stacks.get_mut(stack as usize) else {
                continue;
            };
            let stack = match *slot {
                Some(id) => id,
                None => {
                    let table = &mut self.frames;
                    let ids = other.stacks.get(stack).unwrap_or_default().map(|f| {
                        let Some(slot) = frames.get_mut(f as usize) else {
                            return u32::MAX;
                        };
                        *slot.get_or_insert_with(|| match other.frames.get_index(f as usize) {
                            Some(frame) => intern(table, frame),
                            None => u32::MAX,
                        })
                    });
                    let id = self.stacks.intern(ids);
                    *slot = Some(id);
                    id
                }
            };
            self.count(kind, (thread, stack), count);
        }
        left_out
    }

    /// Rows the profile's value maps hold room for without growing: what a profile emptied by
    /// [`Profile::clear`] keeps from its largest fill.
    pub fn row_capacity(&self) -> usize {
        self.cpu.capacity() + self.off_cpu.capacity()
    }

    /// CPU samples in the profile.
    pub fn total_samples(&self) -> u64 {
        self.total_of(SampleKind::Cpu)
    }

    /// The sum of the values of one kind (samples, or nanoseconds off-CPU).
    pub fn total_of(&self, kind: SampleKind) -> u64 {
        self.values(kind)
            .values()
            .fold(0u64, |total, &v| total.saturating_add(v))
    }

    pub fn is_empty(&self) -> bool {
        self.cpu.is_empty() && self.off_cpu.is_empty()
    }

    /// How many distinct frames, stacks, threads and (thread, stack) rows the profile holds.
    pub fn sizes(&self) -> ProfileSizes {
        ProfileSizes {
            frames: self.frames.len(),
            stacks: self.stacks.len(),
            threads: self.threads.len(),
            rows: self.cpu.len() + self.off_cpu.len(),
        }
    }

    fn row(&self, (thread, stack): (u32, u32), count: u64) -> Option<SampleRef<'_, T>> {
        // (the kind is the caller's: it picked the rows)
        Some(SampleRef {
            thread: self.threads.get_index(thread as usize)?,
            stack: StackView(Repr::Interned {
                ids: self.stacks.get(stack)?,
                frames: &self.frames,
            }),
            count,
        })
    }

    /// Samples in a stable order (by thread, then stack, comparing their content), for
    /// deterministic outputs. Threads and frames are ranked once; rows are then sorted by
    /// those ranks, so a window of hundreds of thousands of stacks compares integers, not
    /// frames' strings.
    /// CPU rows only: every sink reads these; the off-CPU rows are [`Profile::samples_of`].
    pub fn samples(&self) -> Vec<SampleRef<'_, T>> {
        self.samples_of(SampleKind::Cpu)
    }

    /// The rows of one kind, in the order of [`Profile::samples`] (`count` holds nanoseconds
    /// for [`SampleKind::OffCpu`]).
    pub fn samples_of(&self, kind: SampleKind) -> Vec<SampleRef<'_, T>> {
        self.iter_of(kind).collect()
    }

    /// [`Profile::samples_of`] one row at a time: a window's renderers walk its hundreds of
    /// thousands of rows once, and a `Vec` of them all (40 bytes a row) added to what each held.
    pub fn iter_of(&self, kind: SampleKind) -> impl Iterator<Item = SampleRef<'_, T>> + '_ {
        let values = self.values(kind);
        self.order[kind.index()]
            .get_or_init(|| self.sorted_rows(kind))
            .iter()
            .filter_map(move |&key| self.row(key, values.get(&key).copied().unwrap_or(0)))
    }

    /// The rows of one kind in the order of [`Profile::samples`].
    fn sorted_rows(&self, kind: SampleKind) -> Vec<(u32, u32)> {
        let thread_rank = ranks(&self.threads);
        let frame_rank = ranks(&self.frames);
        let rank_of = |f: u32| frame_rank.get(f as usize).copied().unwrap_or(u32::MAX);
        let stack = |s: u32| self.stacks.get(s).unwrap_or_default();
        let mut rows: Vec<(u32, u32, u32)> = self
            .values(kind)
            .keys()
            .map(|&(thread, s)| {
                let rank = thread_rank.get(thread as usize).copied();
                (rank.unwrap_or(u32::MAX), thread, s)
            })
            .collect();
        rows.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                if a.2 == b.2 {
                    return std::cmp::Ordering::Equal;
                }
                stack(a.2).map(rank_of).cmp(stack(b.2).map(rank_of))
            })
        });
        rows.into_iter()
            .map(|(_, thread, stack)| (thread, stack))
            .collect()
    }

    /// Sampling period in nanoseconds (1e9 / Hz).
    pub fn period_ns(&self) -> i64 {
        1_000_000_000 / i64::from(self.frequency_hz.max(1))
    }

    /// The `n` functions with the most self samples (samples whose leaf frame they are), most
    /// first, ties by name. Named by [`Frame::text_name`] (kernel frames end in `_[k]`); samples
    /// with an empty stack have no function and are not counted.
    pub fn top_self(&self, n: usize) -> Vec<(String, u64)> {
        self.top_self_of(SampleKind::Cpu, n)
    }

    /// [`Profile::top_self`] of one kind. Off-CPU, a thread's leaf is always the scheduler's
    /// (it left the CPU there): the function is its innermost frame outside the kernel and the
    /// C library (the code that blocked, not the `read` or `nanosleep` wrapper it called), a
    /// kernel thread's leaf otherwise.
    pub fn top_self_of(&self, kind: SampleKind, n: usize) -> Vec<(String, u64)> {
        let mut by_leaf: HashMap<u32, u64, Hasher> = HashMap::default();
        for (&(_, stack), &count) in self.values(kind) {
            let Some(ids) = self.stacks.get(stack) else {
                continue;
            };
            let ids: Vec<u32> = ids.collect();
            let frame = |f: &&u32| self.frames.get_index(**f as usize);
            let user = |f: &&u32| frame(f).is_some_and(|frame| frame.kind != FrameKind::Kernel);
            let callers = |f: &&u32| {
                user(f) && !frame(f).is_some_and(|frame| in_c_library(frame.module.as_deref()))
            };
            let leaf = match kind {
                SampleKind::OffCpu => ids
                    .iter()
                    .find(callers)
                    .or_else(|| ids.iter().find(user))
                    .or(ids.first()),
                SampleKind::Cpu => ids.first(),
            };
            if let Some(&leaf) = leaf {
                *by_leaf.entry(leaf).or_insert(0) += count;
            }
        }
        let mut self_samples: HashMap<String, u64> = HashMap::new();
        for (leaf, count) in by_leaf {
            if let Some(frame) = self.frames.get_index(leaf as usize) {
                *self_samples.entry(frame.text_name()).or_insert(0) += count;
            }
        }
        let mut top: Vec<(String, u64)> = self_samples.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(n);
        top
    }
}

/// Whether `module` is the C library or the dynamic loader (glibc's `libc.so.6`,
/// `libpthread`, `ld-linux`; musl's `libc.musl`, `ld-musl`), whose wrappers every blocking call
/// goes through.
fn in_c_library(module: Option<&Module>) -> bool {
    let Some(module) = module else {
        return false;
    };
    let name = module.path.rsplit('/').next().unwrap_or(&module.path);
    [
        "libc.so",
        "libc-",
        "libc.musl",
        "libpthread",
        "ld-linux",
        "ld-musl",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// Table sizes of a [`Profile`] (see [`Profile::sizes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileSizes {
    pub frames: usize,
    pub stacks: usize,
    pub threads: usize,
    pub rows: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_cpu_rows_stay_apart_from_cpu_samples() {
        // Given a thread with 4 CPU samples and 9 ms off-CPU on the same stack, and 2 ms on a
        // stack whose innermost frames are the kernel's
        let thread = Thread::bare((1, 1), "app", "app", "/usr/bin/app");
        let user = Frame::bare("read_config", FrameKind::Native, 0x1000);
        let kernel = Frame::bare("__schedule", FrameKind::Kernel, 0xffff_ffff_8100_0000);
        let mut profile = Profile::<Thread>::new(99);
        profile.add_frames(&thread, [&user], 4);
        profile.add_frames_of(SampleKind::OffCpu, &thread, [&user], 9_000_000);
        profile.add_frames_of(SampleKind::OffCpu, &thread, [&kernel, &user], 2_000_000);
        let mut merged = Profile::<Thread>::new(99);
        merged.merge(profile.clone());
        for p in [&profile, &merged] {
            // Then the CPU view is what it was: 4 samples, one row
            assert_eq!(p.total_samples(), 4);
            assert_eq!(p.samples().len(), 1);
            assert_eq!(p.samples()[0].count, 4);
            // And the off-CPU rows are their own, in nanoseconds
            assert_eq!(p.total_of(SampleKind::OffCpu), 11_000_000);
            assert_eq!(p.samples_of(SampleKind::OffCpu).len(), 2);
            // And off-CPU time is named by the innermost frame outside the kernel
            assert_eq!(
                p.top_self_of(SampleKind::OffCpu, 5),
                [("read_config".to_owned(), 11_000_000)]
            );
            assert!(in_c_library(Some(&Module {
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                build_id: None,
                start: 0,
                end: 0,
                file_offset: 0,
                file: None,
            })));
            assert_eq!(p.top_self(5), [("read_config".to_owned(), 4)]);
        }
    }

    #[test]
    fn text_names_escape_terminal_controls_and_bidi_overrides() {
        // Given names with an OSC title, an OSC 52 clipboard write, a colour, a bidi override
        // and a zero-width space
        let cases = [
            ("\u{1b}]0;owned\u{7}f", "\\u{1b}]0:owned\\u{7}f"),
            ("\u{1b}]52;c;ZWNobw==\u{7}", "\\u{1b}]52:c:ZWNobw==\\u{7}"),
            ("\u{1b}[31mred\u{1b}[0m", "\\u{1b}[31mred\\u{1b}[0m"),
            ("evil\u{202e}gnp.exe", "evil\\u{202e}gnp.exe"),
            ("\u{9b}31m", "\\u{9b}31m"),
            (
                "a\u{200b}b\u{2028}c\u{2067}d",
                "a\\u{200b}b\\u{2028}c\\u{2067}d",
            ),
            ("caf\u{e9} \u{65e5}\u{672c}", "caf\u{e9} \u{65e5}\u{672c}"),
        ];
        for (name, want) in cases {
            // When made text-safe
            let safe = text_safe(name);
            // Then every control and invisible format character shows as its escape, and
            // nothing a terminal or a bidi renderer obeys is left; other text is kept
            assert_eq!(safe, want, "{name:?}");
            assert!(!safe
                .chars()
                .any(|c| c.is_control() || is_invisible_format(c)));
        }
    }

    #[test]
    fn only_kernel_frames_carry_the_kernel_annotation() {
        // Given a user function named like a kernel frame, and other annotations
        let named = |name: &str, kind| Frame::bare(name, kind, 0x1000).text_name();
        // Then only the kernel's own frame ends in `_[k]`
        assert_eq!(
            named("do_syscall_64", FrameKind::Kernel),
            "do_syscall_64_[k]"
        );
        assert_eq!(
            named("do_syscall_64_[k]", FrameKind::Native),
            "do_syscall_64_(k)"
        );
        assert_eq!(named("f_[j]", FrameKind::Native), "f_(j)");
        assert_eq!(named("f_[i]", FrameKind::Native), "f_(i)");
        assert_eq!(named("f_[w]", FrameKind::Native), "f_(w)");
        assert_eq!(named("a[k]", FrameKind::Native), "a[k]");
        assert_eq!(named("_[k]", FrameKind::Native), "_(k)");
        // And a kernel frame's name that ends in an annotation keeps its own, plus the mark
        assert_eq!(named("x_[k]", FrameKind::Kernel), "x_[k]_[k]");
    }

    #[test]
    fn python_frames_read_qualname_file_and_line_and_never_pass_for_another_kind() {
        let python = |function: &str, file: Option<&str>, line: Option<u32>| Frame {
            file: file.map(Arc::from),
            line,
            ..Frame::bare(function, FrameKind::CPython, 0)
        };
        // Given Python frames with a path, a bare name, no file, and hostile names
        let cases = [
            (
                python("Worker.hot", Some("/srv/app/workload.py"), Some(12)),
                "Worker.hot (workload.py:12)",
            ),
            (
                python("<module>", Some("app.py"), Some(1)),
                "<module> (app.py:1)",
            ),
            (python("f", Some("/srv/x.py"), None), "f (x.py)"),
            (python("f", None, Some(3)), "f (:3)"),
            (python("[unknown] python", None, None), "[unknown] python"),
            // A name posing as a kernel frame, and separators and controls in names and paths
            (python("evil_[k]", None, None), "evil_(k)"),
            (
                python("a;b", Some("/x;y/c\u{1b}.py"), Some(2)),
                "a:b (c\\u{1b}.py:2)",
            ),
        ];
        for (frame, want) in cases {
            // Then the text name is `qualname (file:line)`, text-safe, and not annotated
            assert_eq!(frame.text_name(), want, "{frame:?}");
            assert!(!frame.text_name().ends_with(KERNEL_SUFFIX));
        }
        // And the OpenTelemetry frame type is cpython
        assert_eq!(FrameKind::CPython.as_str(), "cpython");
    }

    fn frame(function: &str, address: u64) -> Frame {
        Frame::bare(function, FrameKind::Native, address)
    }

    fn thread(pid: u32, tid: u32) -> Thread {
        Thread::bare((pid, tid), "app", &format!("t{tid}"), "/usr/bin/app")
    }

    /// The profile's rows as owned values, in its order.
    fn rows(profile: &Profile) -> Vec<(Thread, Vec<Frame>, u64)> {
        profile
            .samples()
            .iter()
            .map(|s| (s.thread.clone(), s.stack.iter().cloned().collect(), s.count))
            .collect()
    }

    /// 3 threads x 40 stacks of 30 frames drawn from 50 functions: many stacks, few frames.
    fn samples() -> Vec<SymbolizedSample> {
        let mut out = Vec::new();
        for tid in 1..=3u32 {
            for s in 0..40u64 {
                let stack: Vec<Frame> = (0..30u64)
                    .map(|depth| {
                        let f = (s * 7 + depth * 3 + u64::from(tid)) % 50;
                        frame(&format!("f{f}"), 0x1000 + f)
                    })
                    .collect();
                out.push(SymbolizedSample {
                    thread: thread(7, tid),
                    stack: stack.into(),
                    count: s + u64::from(tid),
                });
            }
        }
        out
    }

    #[test]
    fn each_frame_and_stack_is_stored_once_and_every_row_keeps_its_own_stack_and_count() {
        let mut profile = Profile::new(99);
        for sample in samples() {
            profile.add(sample.clone(), 1, 2);
            profile.add(sample, 1, 2);
        }
        let sizes = profile.sizes();
        assert_eq!(sizes.frames, 50);
        assert_eq!(sizes.threads, 3);
        assert_eq!(sizes.rows, 120);
        assert!(sizes.stacks <= 120, "{sizes:?}");
        let mut expected: Vec<(Thread, Vec<Frame>, u64)> = samples()
            .into_iter()
            .map(|s| (s.thread, s.stack.to_vec(), 2 * s.count))
            .collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        assert_eq!(rows(&profile), expected);
    }

    #[test]
    fn the_rows_read_after_a_change_include_it() {
        let all = samples();
        let mut profile = Profile::new(99);
        profile.add(all[0].clone(), 1, 2);
        assert_eq!(profile.samples().len(), 1);
        profile.add(all[0].clone(), 1, 2);
        profile.add(all[1].clone(), 1, 2);
        let rows = rows(&profile);
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows.iter().map(|r| r.2).sum::<u64>(),
            2 * all[0].count + all[1].count
        );
        let mut window = Profile::default();
        assert!(window.samples().is_empty());
        window.merge(profile);
        assert_eq!(window.samples().len(), 2);
    }

    #[test]
    fn a_merged_window_equals_one_profile_of_all_its_samples() {
        // Given the samples split over three intervals in different orders
        let all = samples();
        let mut whole = Profile::new(99);
        for sample in &all {
            whole.add(sample.clone(), 10, 20);
        }
        let mut window = Profile::default();
        for part in 0..3 {
            let mut interval = Profile::new(99);
            for sample in all.iter().rev().skip(part).step_by(3) {
                interval.add(sample.clone(), 10 + part as u64, 20 + part as u64);
            }
            window.merge(interval);
        }
        // Then the window holds the same rows, counts and tables as the single profile
        assert_eq!(rows(&window), rows(&whole));
        assert_eq!(window.sizes(), whole.sizes());
        assert_eq!(window.total_samples(), whole.total_samples());
        assert_eq!((window.start_unix_ns, window.end_unix_ns), (10, 22));
        assert_eq!(window.top_self(3), whole.top_self(3));
    }

    #[test]
    fn merge_with_maps_each_thread_once_and_counts_what_it_leaves_out() {
        // Given a batch of 3 threads x 40 stacks, added twice
        let mut batch: Profile = Profile::new(99);
        for sample in samples() {
            batch.add(sample.clone(), 1, 2);
            batch.add(sample, 1, 2);
        }
        // When it is merged into a profile keyed by (thread, tag), leaving thread 2 out
        let mut asked = Vec::new();
        let mut tagged: Profile<(Thread, &str)> = Profile::new(99);
        let left_out = tagged.merge_with(&batch, |thread: &Thread| {
            asked.push(thread.tid);
            (thread.tid != 2).then(|| (thread.clone(), "tag"))
        });
        // Then each distinct thread was asked about once, the left-out samples are counted, and
        // the kept rows are the batch's rows of the other threads, with their stacks and counts
        asked.sort_unstable();
        assert_eq!(asked, [1, 2, 3]);
        let of = |tid: u32| -> u64 {
            let rows = rows(&batch).into_iter().filter(|r| r.0.tid == tid);
            rows.map(|r| r.2).sum()
        };
        assert_eq!(left_out, of(2));
        assert_eq!(tagged.total_samples(), of(1) + of(3));
        let kept: Vec<(Thread, Vec<Frame>, u64)> = tagged
            .samples()
            .iter()
            .map(|s| {
                (
                    s.thread.0.clone(),
                    s.stack.iter().cloned().collect(),
                    s.count,
                )
            })
            .collect();
        let expected: Vec<_> = rows(&batch).into_iter().filter(|r| r.0.tid != 2).collect();
        assert_eq!(kept, expected);
        assert_eq!((tagged.start_unix_ns, tagged.end_unix_ns), (1, 2));
    }

    /// Heap bytes a window holds per distinct stack, at most: the model's own tables, sorted for
    /// output. Derived from the layout, for stacks of 30 frames whose ids are under 128 (one byte
    /// each; a window's common frames get the small ids), each stack its own row: 30 bytes of ids
    /// and 4 of where they end (each buffer up to twice that when it has just grown), a 4-byte
    /// slot and a control byte in the stack index and a 16-byte entry and a control byte in the
    /// row map (both at most 7/8 full, up to twice that just after growing), and 8 bytes of
    /// sorted order: 34 x 2 + 5 / 0.875 x 2 + 17 / 0.875 x 2 + 8 = 126. Boxed `[u32]` stacks
    /// in an `IndexSet` with (thread, stack, kind) keys took about 260.
    const BYTES_PER_STACK: i64 = 126;

    #[test]
    fn a_distinct_stack_costs_the_bytes_of_its_ids_and_a_row_not_a_copy_of_its_frames() {
        // Given 100 frames (already in the profile, as a window's frames are after its first
        // intervals) and one thread
        let frames: Vec<Frame> = (0..100u64)
            .map(|f| frame(&format!("function_{f}"), 0x1000 + f))
            .collect();
        let thread = thread(7, 7);
        let mut profile = Profile::<Thread>::new(99);
        profile.add_frames(&thread, frames.iter(), 1);
        // When 100,000 distinct stacks of 30 frames each are added and the rows sorted
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let stacks: Vec<Vec<usize>> = (0..100_000)
            .map(|_| {
                (0..30)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        (seed % 100) as usize
                    })
                    .collect()
            })
            .collect();
        let (stacks, frames, thread) = (&stacks, &frames, &thread);
        let (profile, bytes) = crate::symbolize::alloc::measure(move || {
            for stack in stacks {
                profile.add_frames(thread, stack.iter().map(|&f| &frames[f]), 1);
            }
            assert!(!profile.samples().is_empty());
            profile
        });
        // Then each distinct stack cost at most the layout's bound
        let distinct = profile.sizes().stacks as i64 - 1;
        assert!(distinct > 99_000, "{distinct}");
        let per_stack = bytes / distinct;
        eprintln!("{per_stack} bytes per distinct stack");
        assert!(
            per_stack <= BYTES_PER_STACK,
            "{per_stack} bytes per distinct stack, more than {BYTES_PER_STACK}"
        );
    }

    #[test]
    fn container_ids_from_cgroup_paths() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for path in [
            format!("/system.slice/docker-{id}.scope"),
            format!("/docker/{id}"),
            format!("/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope"),
            format!("/machine.slice/libpod-{id}.scope/container"),
        ] {
            assert_eq!(container_id(&path), Some(id), "{path}");
        }
        assert_eq!(
            container_id("/user.slice/user-1000.slice/session-2.scope"),
            None
        );
        assert_eq!(container_id(""), None);
        // A whole cgroup v1 file: any hierarchy's line
        let v1 = format!("12:pids:/docker/{id}\n4:cpuset:/\n1:name=systemd:/docker/{id}\n");
        assert_eq!(container_id(&v1), Some(id));
        assert_eq!(container_id("4:memory:/\n1:name=systemd:/\n0::/\n"), None);
    }
}
