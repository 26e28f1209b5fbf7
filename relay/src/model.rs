//! The relay's data model between stages: symbolized frames, samples and the aggregated profile
//! of an interval that sinks write out, and how a frame is named in text outputs
//! ([`Frame::text_name`]), so every sink and `record`'s summary name frames alike.
//!
//! Flow: `RawBatch` (protocol) -> [`SymbolizedSample`] (symbolize) -> [`Profile`] (aggregate)
//! -> sinks. A frame that could not be named is still a frame (`[unknown]` with its module), so
//! no sample is ever dropped between stages. Every output names it alike, by its module
//! (`[unknown] libfoo.so`), one name per module and not per address, so flame graphs aggregate
//! it; the address stays where an output has a field for it (pprof and OTLP locations).

use std::{collections::HashMap, sync::Arc};

use crate::labels::Labels;

/// Where a frame's code lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    Kernel,
    Native,
    /// Not a code frame: a marker such as "[lost stack: collision]".
    Marker,
}

impl FrameKind {
    /// The OpenTelemetry `profile.frame.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Native => "native",
            Self::Marker => "abort-marker",
        }
    }
}

/// The module (mapped file) a frame's address belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Module {
    /// Path as the process saw it, or `[kernel.kallsyms]`, `[vdso]`, `[anon]`.
    pub path: Arc<str>,
    /// GNU build id in hex, when known.
    pub build_id: Option<Arc<str>>,
    /// Start and end of the mapping in the process, and the file offset of its start.
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
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
    /// The address in the process (user) or kernel, as sampled.
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
    /// [`Frame::display_name`] made text-safe (`text_safe`), `_[k]` appended for kernel frames.
    pub fn text_name(&self) -> String {
        let mut name = text_safe(&self.display_name());
        if self.kind == FrameKind::Kernel {
            name.push_str(KERNEL_SUFFIX);
        }
        name
    }
}

/// Appended to kernel frames' text names, as `stackcollapse-perf.pl --kernel` does; flamegraph
/// palettes colour such frames apart.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Replaces the folded format's frame separator inside a name.
const SEPARATOR_REPLACEMENT: char = ':';

/// `name` safe for line-based text outputs: `;` separates frames and a line break ends a line,
/// so both (and other control characters) are replaced and a name can split neither a line nor
/// a frame. `[u8; 8]` becomes `[u8: 8]`.
pub fn text_safe(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => SEPARATOR_REPLACEMENT,
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

/// The name of a frame that could not be symbolized.
pub const UNKNOWN: &str = "[unknown]";

/// Who a sample belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Thread {
    pub pid: u32,
    pub tid: u32,
    pub process_name: Arc<str>,
    pub thread_name: Arc<str>,
    /// The process's executable as the sampler read it (`/proc/PID/exe`); empty when unknown.
    pub executable_path: Arc<str>,
    /// The container the process runs in, from its cgroup path, when it names one.
    pub container_id: Option<Arc<str>>,
    /// The process's resource labels from the labels stage, shared by all its samples (empty
    /// when no stage ran: sinks then fall back to the fields above).
    pub resource: Arc<Labels>,
}

/// Hashes everything but `resource`: a process's labels are one shared set, the same for every
/// thread of a pid, so hashing them per sample would cost without telling threads apart (equal
/// threads still hash equal; equality compares the labels, pointer first).
impl std::hash::Hash for Thread {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pid.hash(state);
        self.tid.hash(state);
        self.process_name.hash(state);
        self.thread_name.hash(state);
        self.executable_path.hash(state);
        self.container_id.hash(state);
    }
}

impl Thread {
    /// The resource's `service.name`, else the process name.
    pub fn service_name(&self) -> &str {
        self.resource
            .get(crate::labels::keys::SERVICE_NAME)
            .unwrap_or(&self.process_name)
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

/// One aggregated row: a thread, a stack (leaf first) and how many times it was sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedSample {
    pub thread: Thread,
    pub stack: Stack,
    pub count: u64,
}

/// Samples aggregated over a time range, as sinks receive them.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub frequency_hz: u32,
    /// The sampled machine's host name (from the sampler's hello), when known.
    pub hostname: Option<Arc<str>>,
    counts: HashMap<(Thread, Stack), u64>,
}

impl Profile {
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
    pub fn add(&mut self, sample: SymbolizedSample, start_unix_ns: u64, end_unix_ns: u64) {
        self.observe(start_unix_ns, end_unix_ns);
        // Counts come from the sampler: saturate rather than wrap (or panic in debug builds).
        let total = self
            .counts
            .entry((sample.thread, sample.stack))
            .or_insert(0);
        *total = total.saturating_add(sample.count);
    }

    /// Merges another profile into this one, its observed time too (even without samples).
    pub fn merge(&mut self, other: Profile) {
        if self.frequency_hz == 0 {
            self.frequency_hz = other.frequency_hz;
        }
        if self.hostname.is_none() {
            self.hostname = other.hostname;
        }
        let (start, end) = (other.start_unix_ns, other.end_unix_ns);
        self.observe(start, end);
        for ((thread, stack), count) in other.counts {
            self.add(
                SymbolizedSample {
                    thread,
                    stack,
                    count,
                },
                start,
                end,
            );
        }
    }

    pub fn total_samples(&self) -> u64 {
        self.counts.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Samples in a stable order (by thread, then stack), for deterministic outputs.
    pub fn samples(&self) -> Vec<SymbolizedSample> {
        let mut out: Vec<SymbolizedSample> = self
            .counts
            .iter()
            .map(|((thread, stack), &count)| SymbolizedSample {
                thread: thread.clone(),
                stack: Arc::clone(stack),
                count,
            })
            .collect();
        out.sort_by(|a, b| a.thread.cmp(&b.thread).then_with(|| a.stack.cmp(&b.stack)));
        out
    }

    /// Sampling period in nanoseconds (1e9 / Hz).
    pub fn period_ns(&self) -> i64 {
        1_000_000_000 / i64::from(self.frequency_hz.max(1))
    }

    /// The `n` functions with the most self samples (samples whose leaf frame they are), most
    /// first, ties by name. Named by [`Frame::text_name`] (kernel frames end in `_[k]`); samples
    /// with an empty stack have no function and are not counted.
    pub fn top_self(&self, n: usize) -> Vec<(String, u64)> {
        let mut self_samples: HashMap<String, u64> = HashMap::new();
        for ((_, stack), &count) in &self.counts {
            if let Some(leaf) = stack.first() {
                *self_samples.entry(leaf.text_name()).or_insert(0) += count;
            }
        }
        let mut top: Vec<(String, u64)> = self_samples.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(n);
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
