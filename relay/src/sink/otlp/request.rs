//! The generation-neutral form of one OTLP profiles request, built from a [`LabeledProfile`]: what both
//! wire encoders ([`super::v1_9`], [`super::v1_10`]) turn into bytes, and what the debug
//! exporter prints.
//!
//! Invariants (the OTLP profiles rules): one dictionary per request; index 0 of every table is
//! the empty element, so "unset" and "index 0" mean the same; strings, functions, mappings,
//! locations, stacks and attributes are deduplicated; samples with the same stack and attribute
//! set within a resource are merged. One resource per distinct resource label set from the labels
//! stage (`service.name` always set, so nothing lands in Pyroscope's `unknown_service`). Sample attributes stay
//! low-cardinality: the thread name, and pid / tid only when [`SampleAttributes`] asks for them.

use std::{collections::HashMap as StdHashMap, hash::BuildHasher as _, sync::Arc};

use hashbrown::HashTable;

/// The builder's tables hash short keys (strings, small structs) millions of times per profile:
/// foldhash, randomly seeded per map, is several times faster than std's SipHash here.
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;

use crate::{
    labels::labeled::{LabeledProfile, LabeledSample},
    labels::Labels,
    model::{Frame, FrameKind, Module},
};

/// Which per-sample attributes to emit. Every distinct set is its own series in Pyroscope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleAttributes {
    /// `thread.name` (string).
    pub thread_name: bool,
    /// `process.pid` (int) on every sample (the resource carries it anyway).
    pub pid: bool,
    /// `thread.id` (int).
    pub tid: bool,
}

impl Default for SampleAttributes {
    fn default() -> Self {
        Self {
            thread_name: true,
            pid: false,
            tid: false,
        }
    }
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Str(Arc<str>),
    Int(i64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Str(s) => write!(f, "{s:?}"),
            Self::Int(i) => write!(f, "{i}"),
        }
    }
}

/// An entry of the attribute table: key (string index) and value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attribute {
    pub key: i32,
    pub value: Value,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: i32,
    pub attributes: Vec<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: i32,
    pub line: i64,
}

/// A code location. `lines` is leaf first: all but the last were inlined into the last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Location {
    pub mapping: i32,
    pub address: u64,
    pub lines: Vec<Line>,
    pub attributes: Vec<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: i32,
    pub system_name: i32,
    pub filename: i32,
}

/// The request's shared tables. Index 0 of each is the empty element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dictionary {
    pub strings: Vec<Arc<str>>,
    pub mappings: Vec<Mapping>,
    pub locations: Vec<Location>,
    pub functions: Vec<Function>,
    /// Location indexes, leaf first.
    pub stacks: Vec<Vec<i32>>,
    pub attributes: Vec<Attribute>,
}

impl Dictionary {
    pub fn string(&self, index: i32) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.strings.get(i))
            .map_or("", |s| s)
    }
}

/// A resource attribute (plain key, as `opentelemetry.proto.common.v1.KeyValue` carries it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyValue {
    pub key: Arc<str>,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub stack: i32,
    /// Sorted attribute indexes.
    pub attributes: Vec<i32>,
    pub count: i64,
}

/// One process: its resource attributes and its samples (one profile).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceProfile {
    pub resource: Vec<KeyValue>,
    pub samples: Vec<Sample>,
}

/// A whole request: dictionary, resources, and the profile facts every resource shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub dictionary: Dictionary,
    pub resources: Vec<ResourceProfile>,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    /// Nanoseconds per sample: 1e9 / Hz.
    pub period: i64,
    /// String indexes of `samples` / `count`.
    pub sample_type: (i32, i32),
    /// String indexes of `cpu` / `nanoseconds`.
    pub period_type: (i32, i32),
    /// An off-CPU profile (`--off-cpu`): sample type `off_cpu` / `nanoseconds` (Pyroscope's
    /// `off_cpu` profile), values nanoseconds blocked, period 1.
    pub off_cpu: bool,
}

impl Request {
    /// Total CPU samples (sum of counts); 0 for an off-CPU request (its values are nanoseconds).
    pub fn sample_count(&self) -> u64 {
        if self.off_cpu {
            return 0;
        }
        self.resources
            .iter()
            .flat_map(|r| &r.samples)
            .map(|s| u64::try_from(s.count).unwrap_or(0))
            .sum()
    }
}

/// Attribute keys and values of the OpenTelemetry semantic conventions.
pub mod keys {
    pub const SERVICE_NAME: &str = "service.name";
    pub const EXECUTABLE_NAME: &str = "process.executable.name";
    pub const EXECUTABLE_PATH: &str = "process.executable.path";
    pub const PID: &str = "process.pid";
    pub const HOST_NAME: &str = "host.name";
    pub const CONTAINER_ID: &str = "container.id";
    pub const THREAD_NAME: &str = "thread.name";
    pub const THREAD_ID: &str = "thread.id";
    pub const FRAME_TYPE: &str = "profile.frame.type";
    pub const BUILD_ID: &str = "process.executable.build_id.gnu";
}

/// The facts of a profile every request built from it shares.
#[derive(Clone, Debug)]
pub struct Meta {
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    pub period: i64,
    pub hostname: Option<Arc<str>>,
    /// The samples are off-CPU rows (values in nanoseconds): see [`Request::off_cpu`].
    pub off_cpu: bool,
}

impl Meta {
    pub fn of(profile: &LabeledProfile) -> Self {
        Self {
            time_unix_nano: profile.start_unix_ns,
            duration_nano: profile.end_unix_ns.saturating_sub(profile.start_unix_ns),
            period: profile.period_ns(),
            hostname: profile.hostname.clone(),
            off_cpu: false,
        }
    }
}

/// Builds one request from `samples` (ordered by thread, as [`LabeledProfile::samples`] gives them).
pub fn build(samples: &[LabeledSample<'_>], meta: &Meta, options: SampleAttributes) -> Request {
    let mut b = Builder::default();
    let (sample_type, period_type) = if meta.off_cpu {
        let off_cpu = (b.string("off_cpu"), b.string("nanoseconds"));
        (off_cpu, off_cpu)
    } else {
        (
            (b.string("samples"), b.string("count")),
            (b.string("cpu"), b.string("nanoseconds")),
        )
    };
    let mut resources = Resources::default();
    // Samples as (hash, resource, index in its samples), found by (resource, stack, attributes):
    // for merging, without a copy of the key.
    let mut merge: HashTable<(u64, usize, usize)> = HashTable::new();
    let hasher = foldhash::fast::RandomState::default();
    // One sample's frames at a time, in a list reused from sample to sample.
    let mut frames: Vec<&Frame> = Vec::new();
    for sample in samples {
        let thread = sample.thread;
        let index = resources.index_of(sample, meta);
        let Some(resource) = resources.list.get_mut(index) else {
            continue;
        };
        frames.clear();
        frames.extend(sample.stack.iter());
        let stack = b.stack(&frames);
        let mut attributes = Vec::new();
        if options.thread_name && !thread.thread_name.is_empty() {
            attributes.push(b.attribute(
                keys::THREAD_NAME,
                Value::Str(Arc::clone(&thread.thread_name)),
            ));
        }
        if options.pid {
            attributes.push(b.attribute(keys::PID, Value::Int(i64::from(thread.pid))));
        }
        if options.tid {
            attributes.push(b.attribute(keys::THREAD_ID, Value::Int(i64::from(thread.tid))));
        }
        attributes.sort_unstable();
        attributes.dedup();
        let count = i64::try_from(sample.count).unwrap_or(i64::MAX);
        let hash = hasher.hash_one((index, stack, &attributes));
        let same = |&(_, r, i): &(u64, usize, usize)| {
            r == index
                && resource
                    .samples
                    .get(i)
                    .is_some_and(|s| s.stack == stack && s.attributes == attributes)
        };
        if let Some(&(_, _, i)) = merge.find(hash, same) {
            if let Some(s) = resource.samples.get_mut(i) {
                s.count = s.count.saturating_add(count);
            }
            continue;
        }
        merge.insert_unique(hash, (hash, index, resource.samples.len()), |e| e.0);
        resource.samples.push(Sample {
            stack,
            attributes,
            count,
        });
    }
    Request {
        dictionary: b.finish(),
        resources: resources.list,
        time_unix_nano: meta.time_unix_nano,
        duration_nano: meta.duration_nano,
        period: if meta.off_cpu { 1 } else { meta.period },
        sample_type,
        period_type,
        off_cpu: meta.off_cpu,
    }
}

/// The request's resources: one per distinct set of resource attributes, in order of first
/// appearance. Processes of one service with the same labels share one (no per-process
/// attribute is a resource attribute).
#[derive(Default)]
struct Resources {
    list: Vec<ResourceProfile>,
    by_labels: HashMap<Arc<Labels>, usize>,
    by_attributes: HashMap<Vec<KeyValue>, usize>,
    /// For samples without labels: pid -> resource (several pids may share one).
    by_pid: HashMap<u32, usize>,
    /// The previous sample's labels and resource: samples come grouped by process.
    last: Option<(Arc<Labels>, usize)>,
}

impl Resources {
    fn index_of(&mut self, sample: &LabeledSample<'_>, meta: &Meta) -> usize {
        let labels = &sample.thread.resource;
        if let Some((last, index)) = &self.last {
            if Arc::ptr_eq(last, labels) && !labels.is_empty() {
                return *index;
            }
        }
        let known = if labels.is_empty() {
            self.by_pid.get(&sample.thread.pid)
        } else {
            self.by_labels.get(labels)
        };
        let index = match known {
            Some(&index) => index,
            None => {
                let attributes = resource_attributes(sample, meta);
                let next = self.list.len();
                let index = *self.by_attributes.entry(attributes.clone()).or_insert(next);
                if index == next {
                    self.list.push(ResourceProfile {
                        resource: attributes,
                        samples: Vec::new(),
                    });
                }
                if labels.is_empty() {
                    self.by_pid.insert(sample.thread.pid, index);
                } else {
                    self.by_labels.insert(Arc::clone(labels), index);
                }
                index
            }
        };
        self.last = Some((Arc::clone(labels), index));
        index
    }
}

/// Emitted first and in this order (the order from before the labels stage, so a profile
/// without extra labels keeps its bytes); every other label follows in name order.
const LEADING: [&str; 6] = [
    keys::SERVICE_NAME,
    keys::EXECUTABLE_NAME,
    keys::EXECUTABLE_PATH,
    keys::PID,
    keys::HOST_NAME,
    keys::CONTAINER_ID,
];

/// A resource's attributes: its labels from the labels stage, or, for samples without labels,
/// the process's fields. Never `process.pid` (the labels stage removes it): a pid is a sample
/// attribute, when asked for.
fn resource_attributes(sample: &LabeledSample<'_>, meta: &Meta) -> Vec<KeyValue> {
    let labels = &sample.thread.resource;
    if labels.is_empty() {
        return unlabelled_resource(sample, meta);
    }
    let leading = LEADING
        .iter()
        .filter_map(|&key| Some((key, labels.get(key)?)));
    let rest = labels.iter().filter(|(key, _)| !LEADING.contains(key));
    leading
        .chain(rest)
        .filter(|(key, _)| *key != keys::PID)
        .map(|(key, text)| KeyValue {
            key: Arc::from(key),
            value: Value::Str(Arc::from(text)),
        })
        .collect()
}

fn unlabelled_resource(sample: &LabeledSample<'_>, meta: &Meta) -> Vec<KeyValue> {
    let thread = &sample.thread;
    let name: Arc<str> = if thread.process_name.is_empty() {
        Arc::from(crate::labels::service::UNKNOWN_SERVICE)
    } else {
        Arc::clone(&thread.process_name)
    };
    let mut out = vec![
        KeyValue {
            key: Arc::from(keys::SERVICE_NAME),
            value: Value::Str(Arc::clone(&name)),
        },
        KeyValue {
            key: Arc::from(keys::EXECUTABLE_NAME),
            value: Value::Str(name),
        },
    ];
    if !thread.executable_path.is_empty() {
        out.push(KeyValue {
            key: Arc::from(keys::EXECUTABLE_PATH),
            value: Value::Str(Arc::clone(&thread.executable_path)),
        });
    }
    if let Some(host) = &meta.hostname {
        out.push(KeyValue {
            key: Arc::from(keys::HOST_NAME),
            value: Value::Str(Arc::clone(host)),
        });
    }
    if let Some(id) = &thread.container_id {
        out.push(KeyValue {
            key: Arc::from(keys::CONTAINER_ID),
            value: Value::Str(Arc::clone(id)),
        });
    }
    out
}

/// Interns everything into the dictionary tables.
struct Builder {
    dict: Dictionary,
    strings: HashMap<Arc<str>, i32>,
    attributes: HashMap<Attribute, i32>,
    functions: HashMap<Function, i32>,
    /// Keyed by the module's identity (its `Arc` address is not stable across sessions, so by
    /// content).
    mappings: HashMap<Module, i32>,
    /// Location and stack indexes, found by the content of `dict`'s entry: the large tables of
    /// a request under churn, so their keys are not copies of what `dict` holds.
    locations: HashTable<i32>,
    stacks: HashTable<i32>,
    hasher: foldhash::fast::RandomState,
    /// Location index by the address of its frame, for locations of one frame (frames of one
    /// profile are interned: a frame in many stacks is one address).
    location_by_ptr: HashMap<usize, i32>,
    /// The stack being looked up, in a list reused from stack to stack.
    scratch: Vec<i32>,
    // Fast paths keyed by `Arc` address (frames of one module, one symbol share their `Arc`s);
    // a miss falls back to the content-keyed tables above, so dedup never depends on them.
    mapping_by_ptr: HashMap<usize, i32>,
    function_by_ptr: HashMap<(usize, usize, u32), i32>,
    /// Mapping index -> the function naming its unnamed frames (one name per module).
    unknown_by_mapping: HashMap<i32, i32>,
    frame_type: [Option<i32>; FRAME_TYPES],
}

impl Default for Builder {
    fn default() -> Self {
        let empty: Arc<str> = Arc::from("");
        let mut b = Self {
            dict: Dictionary {
                strings: vec![Arc::clone(&empty)],
                mappings: vec![Mapping::default()],
                locations: vec![Location::default()],
                functions: vec![Function::default()],
                stacks: vec![Vec::new()],
                attributes: vec![Attribute {
                    key: 0,
                    value: Value::Str(Arc::clone(&empty)),
                }],
            },
            strings: HashMap::from_iter([(empty, 0)]),
            attributes: HashMap::default(),
            functions: HashMap::from_iter([(Function::default(), 0)]),
            mappings: HashMap::default(),
            locations: HashTable::new(),
            stacks: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            location_by_ptr: HashMap::default(),
            scratch: Vec::new(),
            mapping_by_ptr: HashMap::default(),
            function_by_ptr: HashMap::default(),
            unknown_by_mapping: HashMap::default(),
            frame_type: [None; FRAME_TYPES],
        };
        // The empty location and stack are index 0, found like any other.
        let hash = b.hasher.hash_one(&b.dict.locations[0]);
        b.locations.insert_unique(hash, 0, |_| hash);
        let hash = b.hasher.hash_one(b.dict.stacks[0].as_slice());
        b.stacks.insert_unique(hash, 0, |_| hash);
        b
    }
}

fn index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl Builder {
    fn string(&mut self, text: &str) -> i32 {
        if let Some(&i) = self.strings.get(text) {
            return i;
        }
        let i = index(self.dict.strings.len());
        let text: Arc<str> = Arc::from(text);
        self.dict.strings.push(Arc::clone(&text));
        self.strings.insert(text, i);
        i
    }

    fn attribute(&mut self, key: &str, value: Value) -> i32 {
        let attribute = Attribute {
            key: self.string(key),
            value,
        };
        if let Some(&i) = self.attributes.get(&attribute) {
            return i;
        }
        let i = index(self.dict.attributes.len());
        self.dict.attributes.push(attribute.clone());
        self.attributes.insert(attribute, i);
        i
    }

    fn function(&mut self, frame: &Frame) -> i32 {
        let key = (
            Arc::as_ptr(&frame.function).cast::<u8>() as usize,
            frame
                .file
                .as_ref()
                .map_or(0, |f| Arc::as_ptr(f).cast::<u8>() as usize),
            frame.line.unwrap_or(0),
        );
        if let Some(&i) = self.function_by_ptr.get(&key) {
            return i;
        }
        let i = self.function_by_content(frame);
        self.function_by_ptr.insert(key, i);
        i
    }

    /// The function of an unnamed frame in `mapping`: [`Frame::display_name`], no file.
    fn unknown_function(&mut self, frame: &Frame, mapping: i32) -> i32 {
        if let Some(&i) = self.unknown_by_mapping.get(&mapping) {
            return i;
        }
        let function = Function {
            name: self.string(&frame.display_name()),
            system_name: 0,
            filename: 0,
        };
        let i = self.intern_function(function);
        self.unknown_by_mapping.insert(mapping, i);
        i
    }

    fn function_by_content(&mut self, frame: &Frame) -> i32 {
        let function = Function {
            name: self.string(&frame.function),
            system_name: 0,
            filename: frame.file.as_deref().map_or(0, |f| self.string(f)),
        };
        self.intern_function(function)
    }

    fn intern_function(&mut self, function: Function) -> i32 {
        if let Some(&i) = self.functions.get(&function) {
            return i;
        }
        let i = index(self.dict.functions.len());
        self.dict.functions.push(function.clone());
        self.functions.insert(function, i);
        i
    }

    fn mapping_of(&mut self, module: &Arc<Module>) -> i32 {
        let key = Arc::as_ptr(module) as usize;
        if let Some(&i) = self.mapping_by_ptr.get(&key) {
            return i;
        }
        let i = self.mapping(module);
        self.mapping_by_ptr.insert(key, i);
        i
    }

    fn mapping(&mut self, module: &Module) -> i32 {
        if let Some(&i) = self.mappings.get(module) {
            return i;
        }
        let mut attributes = Vec::new();
        if let Some(id) = &module.build_id {
            attributes.push(self.attribute(keys::BUILD_ID, Value::Str(Arc::clone(id))));
        }
        let mapping = Mapping {
            memory_start: module.start,
            memory_limit: module.end,
            file_offset: module.file_offset,
            filename: self.string(&module.path),
            attributes,
        };
        let i = index(self.dict.mappings.len());
        self.dict.mappings.push(mapping);
        self.mappings.insert(module.clone(), i);
        i
    }

    /// One location for `frames`: a code frame, preceded by the frames inlined into it (same
    /// address), leaf first.
    fn location(&mut self, frames: &[&Frame]) -> i32 {
        let Some(last) = frames.last() else { return 0 };
        // A frame alone is found by its address first: the samples borrow the profile's frames,
        // so one address is one frame for the whole build.
        let by_ptr = (frames.len() == 1).then(|| std::ptr::from_ref::<Frame>(*last) as usize);
        if let Some(&i) = by_ptr.and_then(|key| self.location_by_ptr.get(&key)) {
            return i;
        }
        let i = self.location_by_content(frames);
        if let Some(key) = by_ptr {
            self.location_by_ptr.insert(key, i);
        }
        i
    }

    fn location_by_content(&mut self, frames: &[&Frame]) -> i32 {
        let Some(last) = frames.last() else { return 0 };
        let mapping = last.module.as_ref().map_or(0, |m| self.mapping_of(m));
        let lines = if last.is_unknown() {
            // One line named after the module (`[unknown] libfoo.so`, as the local files name
            // it): Pyroscope builds frames from lines only and drops a location without one.
            // The address and mapping (with its build id) stay for receivers that symbolize.
            vec![Line {
                function: self.unknown_function(last, mapping),
                line: 0,
            }]
        } else {
            frames
                .iter()
                .map(|f| Line {
                    function: self.function(f),
                    line: f.line.map_or(0, i64::from),
                })
                .collect()
        };
        let slot = frame_type_slot(last.kind);
        let kind = match self.frame_type[slot] {
            Some(kind) => kind,
            None => {
                let kind = self.attribute(
                    keys::FRAME_TYPE,
                    Value::Str(Arc::from(frame_type(last.kind))),
                );
                self.frame_type[slot] = Some(kind);
                kind
            }
        };
        let location = Location {
            mapping,
            address: last.address,
            lines,
            attributes: vec![kind],
        };
        let (table, hasher) = (&self.dict.locations, &self.hasher);
        let hash = hasher.hash_one(&location);
        let found = self.locations.find(hash, |&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| table.get(i))
                .is_some_and(|l| *l == location)
        });
        if let Some(&i) = found {
            return i;
        }
        let i = index(self.dict.locations.len());
        self.dict.locations.push(location);
        let table = &self.dict.locations;
        self.locations.insert_unique(hash, i, |&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| table.get(i))
                .map_or(0, |l| hasher.hash_one(l))
        });
        i
    }

    fn stack(&mut self, frames: &[&Frame]) -> i32 {
        let mut indexes = std::mem::take(&mut self.scratch);
        indexes.clear();
        let mut start = 0;
        for (i, frame) in frames.iter().enumerate() {
            // An inlined frame belongs to the next frame's location when they share an address.
            let joins_next = frame.inlined
                && frames
                    .get(i + 1)
                    .is_some_and(|next| next.address == frame.address);
            if !joins_next {
                indexes.push(self.location(&frames[start..=i]));
                start = i + 1;
            }
        }
        let (table, hasher) = (&self.dict.stacks, &self.hasher);
        let hash = hasher.hash_one(indexes.as_slice());
        let found = self.stacks.find(hash, |&i| {
            usize::try_from(i)
                .ok()
                .and_then(|i| table.get(i))
                .is_some_and(|s| *s == indexes)
        });
        let i = match found {
            Some(&i) => i,
            None => {
                let i = index(self.dict.stacks.len());
                // (an exact-size copy: the scratch list keeps its capacity for the next stack)
                self.dict.stacks.push(indexes.clone());
                let table = &self.dict.stacks;
                self.stacks.insert_unique(hash, i, |&i| {
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| table.get(i))
                        .map_or(0, |s| hasher.hash_one(s.as_slice()))
                });
                i
            }
        };
        self.scratch = indexes;
        i
    }

    fn finish(self) -> Dictionary {
        self.dict
    }
}

/// The `profile.frame.type` value of a frame kind.
pub fn frame_type(kind: FrameKind) -> &'static str {
    kind.as_str()
}

/// Distinct `profile.frame.type` values ([`frame_type`]).
const FRAME_TYPES: usize = 8;

/// The slot of a frame kind's `profile.frame.type` attribute among the [`FRAME_TYPES`]: kinds
/// with one value share one (a JIT frame of an unknown runtime is `native`).
fn frame_type_slot(kind: FrameKind) -> usize {
    match frame_type(kind) {
        "kernel" => 0,
        "native" => 1,
        "abort-marker" => 2,
        "cpython" => 3,
        "v8js" => 4,
        "jvm" => 5,
        "go" => 6,
        _ => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        labels::labeled::LabeledThread,
        model::{SymbolizedSample, Thread},
    };

    fn views(samples: &[SymbolizedSample<LabeledThread>]) -> Vec<LabeledSample<'_>> {
        samples.iter().map(SymbolizedSample::view).collect()
    }

    fn module(path: &str, build_id: Option<&str>) -> Arc<Module> {
        Arc::new(Module {
            path: path.into(),
            build_id: build_id.map(Arc::from),
            start: 0x40_0000,
            end: 0x50_0000,
            file_offset: 0,
            file: None,
        })
    }

    fn frame(name: &str, address: u64, kind: FrameKind, module: &Arc<Module>) -> Frame {
        Frame {
            function: name.into(),
            file: Some("app.c".into()),
            line: Some(7),
            kind,
            inlined: false,
            address,
            module: Some(Arc::clone(module)),
        }
    }

    pub(crate) fn sample(
        pid: u32,
        tid: u32,
        thread: &str,
        stack: Vec<Frame>,
        count: u64,
    ) -> SymbolizedSample<LabeledThread> {
        SymbolizedSample {
            thread: Thread {
                pid,
                tid,
                process_name: "app".into(),
                thread_name: thread.into(),
                executable_path: "/usr/bin/app".into(),
                container_id: None,
            }
            .into(),
            stack: stack.into(),
            count,
        }
    }

    fn meta() -> Meta {
        Meta {
            time_unix_nano: 1_000,
            duration_nano: 5_000,
            period: 10_101_010,
            hostname: Some("host-1".into()),
            off_cpu: false,
        }
    }

    #[test]
    fn labelled_samples_make_one_resource_per_label_set() {
        // Given three processes: two whose rules left the same labels (no pid), one with its own
        let app = module("/usr/bin/app", None);
        let stack = vec![frame("main", 0x40_2000, FrameKind::Native, &app)];
        let shared: Arc<Labels> = Arc::new(
            [
                ("service.name", "api"),
                ("team", "core"),
                ("host.name", "h"),
            ]
            .into_iter()
            .collect(),
        );
        let own: Arc<Labels> = Arc::new(
            [
                ("zone", "a"),
                ("process.pid", "30"),
                ("service.name", "db"),
                ("process.executable.name", "postgres"),
            ]
            .into_iter()
            .collect(),
        );
        let labelled = |pid, labels: &Arc<Labels>| {
            let mut s = sample(pid, pid, "t", stack.clone(), 1);
            s.thread.resource = Arc::clone(labels);
            s
        };
        let samples = vec![
            labelled(10, &shared),
            labelled(20, &Arc::new((*shared).clone())),
            labelled(30, &own),
        ];
        // When built
        let request = build(&views(&samples), &meta(), SampleAttributes::default());
        // Then equal label sets share a resource (their samples merged), and a resource lists the
        // former attributes first in their old order, then the rest by name; never the pid
        assert_eq!(request.resources.len(), 2);
        assert_eq!(request.resources[0].samples[0].count, 2);
        let attributes = |i: usize| -> Vec<String> {
            request.resources[i]
                .resource
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect()
        };
        assert_eq!(
            attributes(0),
            [
                r#"service.name="api""#,
                r#"host.name="h""#,
                r#"team="core""#
            ]
        );
        assert_eq!(
            attributes(1),
            [
                r#"service.name="db""#,
                r#"process.executable.name="postgres""#,
                r#"zone="a""#
            ]
        );
    }

    #[test]
    fn python_frames_carry_function_file_line_and_the_cpython_frame_type() {
        // Given a stack of a Python function over the native main
        let app = module("/usr/bin/python3", None);
        let python = Frame {
            function: "Worker.hot".into(),
            file: Some("/srv/app/workload.py".into()),
            line: Some(12),
            kind: FrameKind::CPython,
            inlined: false,
            address: 0,
            module: None,
        };
        let stack = vec![python, frame("main", 0x40_2000, FrameKind::Native, &app)];
        // When built into a request
        let samples = vec![sample(10, 10, "app", stack, 1)];
        let request = build(&views(&samples), &meta(), SampleAttributes::default());
        let d = &request.dictionary;
        // Then the Python frame's location has no mapping, one line naming the function, its
        // file and line, and the frame type `cpython`
        let leaf = &d.locations[d.stacks[1][0] as usize];
        assert_eq!(leaf.mapping, 0);
        let function = &d.functions[leaf.lines[0].function as usize];
        assert_eq!(d.string(function.name), "Worker.hot");
        assert_eq!(d.string(function.filename), "/srv/app/workload.py");
        assert_eq!(leaf.lines[0].line, 12);
        let kind = &d.attributes[leaf.attributes[0] as usize];
        assert_eq!(d.string(kind.key), keys::FRAME_TYPE);
        assert_eq!(kind.value, Value::Str("cpython".into()));
    }

    #[test]
    fn go_frames_carry_the_go_frame_type_and_native_ones_theirs() {
        // Given a stripped Go binary's frames: a Go function (named from its Go table) over a
        // cgo C function named from its symbols
        let app = module("/usr/local/bin/server", None);
        let go = Frame {
            file: Some("/src/server/main.go".into()),
            line: Some(42),
            ..frame("main.hotLoop", 0x40_3000, FrameKind::Go, &app)
        };
        let stack = vec![go, frame("c_helper", 0x40_2000, FrameKind::Native, &app)];
        // When built into a request
        let samples = vec![sample(10, 10, "server", stack, 1)];
        let request = build(&views(&samples), &meta(), SampleAttributes::default());
        let d = &request.dictionary;
        // Then the Go frame is typed `go` with its line, the C frame `native`
        let kind_of = |index: usize| {
            let location = &d.locations[d.stacks[1][index] as usize];
            let kind = &d.attributes[location.attributes[0] as usize];
            assert_eq!(d.string(kind.key), keys::FRAME_TYPE);
            (kind.value.clone(), location.lines[0].line)
        };
        assert_eq!(kind_of(0), (Value::Str("go".into()), 42));
        assert_eq!(kind_of(1).0, Value::Str("native".into()));
    }

    #[test]
    fn tables_start_empty_and_dedup() {
        // Given two threads of one process with the same thread name and the same stack, and a
        // third sample with another stack sharing a function.
        let app = module("/usr/bin/app", Some("abcd"));
        let kernel = module("[kernel.kallsyms]", None);
        let stack_a = vec![
            frame("do_syscall_64", 0xffff_1000, FrameKind::Kernel, &kernel),
            frame("leaf", 0x40_1000, FrameKind::Native, &app),
            frame("main", 0x40_2000, FrameKind::Native, &app),
        ];
        let stack_b = vec![frame("main", 0x40_2000, FrameKind::Native, &app)];
        let samples = vec![
            sample(10, 10, "app", stack_a.clone(), 3),
            sample(10, 11, "app", stack_a, 4),
            sample(10, 12, "app", stack_b, 1),
        ];
        // When built into a request.
        let request = build(&views(&samples), &meta(), SampleAttributes::default());
        let d = &request.dictionary;
        // Then every table starts with its empty element...
        assert_eq!(&*d.strings[0], "");
        assert_eq!(d.mappings[0], Mapping::default());
        assert_eq!(d.locations[0], Location::default());
        assert_eq!(d.functions[0], Function::default());
        assert!(d.stacks[0].is_empty());
        assert_eq!(d.attributes[0].key, 0);
        // ...nothing is duplicated...
        let mut strings = d.strings.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), d.strings.len());
        assert_eq!(d.functions.len(), 1 + 3);
        assert_eq!(d.locations.len(), 1 + 3);
        assert_eq!(d.mappings.len(), 1 + 2);
        assert_eq!(d.stacks.len(), 1 + 2);
        // ...the two threads' samples merged (same thread name, same stack), one resource.
        assert_eq!(request.resources.len(), 1);
        let counts: Vec<i64> = request.resources[0]
            .samples
            .iter()
            .map(|s| s.count)
            .collect();
        assert_eq!(counts, vec![7, 1]);
        assert_eq!(request.sample_count(), 8);
        // The build id sits on the app mapping; frame types on locations.
        let app_mapping = d
            .mappings
            .iter()
            .find(|m| d.string(m.filename) == "/usr/bin/app")
            .unwrap();
        let attr = &d.attributes[app_mapping.attributes[0] as usize];
        assert_eq!(d.string(attr.key), keys::BUILD_ID);
        assert_eq!(attr.value, Value::Str("abcd".into()));
        let kinds: Vec<String> = d.locations[1..]
            .iter()
            .map(|l| d.attributes[l.attributes[0] as usize].value.to_string())
            .collect();
        assert!(
            kinds.contains(&"\"kernel\"".to_owned()) && kinds.contains(&"\"native\"".to_owned())
        );
        // Resource identity.
        let resource: Vec<(&str, String)> = request.resources[0]
            .resource
            .iter()
            .map(|kv| (&*kv.key, kv.value.to_string()))
            .collect();
        assert!(resource.contains(&(keys::SERVICE_NAME, "\"app\"".into())));
        assert!(resource.contains(&(keys::HOST_NAME, "\"host-1\"".into())));
        assert!(resource.iter().all(|(key, _)| *key != keys::PID));
    }

    #[test]
    fn inlined_frames_share_one_location() {
        // Given a leaf inlined into its caller at the same address.
        let app = module("/usr/bin/app", None);
        let mut inlined = frame("helper", 0x40_1000, FrameKind::Native, &app);
        inlined.inlined = true;
        let outer = frame("caller", 0x40_1000, FrameKind::Native, &app);
        let main = frame("main", 0x40_2000, FrameKind::Native, &app);
        let request = build(
            &views(&[sample(1, 1, "t", vec![inlined, outer, main], 1)]),
            &meta(),
            SampleAttributes::default(),
        );
        let d = &request.dictionary;
        // Then the stack has two locations, the first with two lines, leaf first.
        let stack = &d.stacks[request.resources[0].samples[0].stack as usize];
        assert_eq!(stack.len(), 2);
        let first = &d.locations[stack[0] as usize];
        let names: Vec<&str> = first
            .lines
            .iter()
            .map(|l| d.string(d.functions[l.function as usize].name))
            .collect();
        assert_eq!(names, vec!["helper", "caller"]);
    }

    #[test]
    fn unnamed_frames_carry_one_line_named_after_their_module() {
        // Given two unnamed frames at two addresses of one module, and one without a module
        let app = module("/usr/bin/app", Some("abcd"));
        let unknown = |address| Frame {
            function: crate::model::UNKNOWN.into(),
            file: None,
            line: None,
            kind: FrameKind::Native,
            inlined: false,
            address,
            module: Some(Arc::clone(&app)),
        };
        let orphan = Frame {
            module: None,
            ..unknown(0x99)
        };
        let stack = vec![unknown(0x40_1234), unknown(0x40_5678), orphan];
        let request = build(
            &views(&[sample(1, 1, "t", stack, 1)]),
            &meta(),
            SampleAttributes::default(),
        );
        let d = &request.dictionary;
        // Then every location has a line (Pyroscope drops a location without one) whose function
        // names the module, one function for the module whatever the address, as the local
        // files name it; the address and the mapping stay on the location
        let stack = &d.stacks[request.resources[0].samples[0].stack as usize];
        let names: Vec<&str> = stack
            .iter()
            .map(|&l| {
                let location = &d.locations[l as usize];
                assert_eq!(location.lines.len(), 1, "{location:?}");
                d.string(d.functions[location.lines[0].function as usize].name)
            })
            .collect();
        assert_eq!(names, ["[unknown] app", "[unknown] app", "[unknown]"]);
        assert_eq!(d.functions.len(), 1 + 2);
        let first = &d.locations[stack[0] as usize];
        assert_eq!(first.address, 0x40_1234);
        assert_eq!(
            d.string(d.mappings[first.mapping as usize].filename),
            "/usr/bin/app"
        );
        assert_eq!(unknown(0x40_1234).display_name(), names[0]);
    }

    #[test]
    fn pids_and_tids_only_when_asked() {
        let app = module("/usr/bin/app", None);
        let stack = vec![frame("main", 0x40_2000, FrameKind::Native, &app)];
        let samples = vec![
            sample(1, 1, "a", stack.clone(), 1),
            sample(1, 2, "a", stack.clone(), 1),
            sample(2, 3, "b", stack, 1),
        ];
        // Given two processes of one executable (one service): one resource, not one per pid
        let plain = build(&views(&samples), &meta(), SampleAttributes::default());
        assert_eq!(plain.resources.len(), 1, "one resource per service");
        assert_eq!(
            plain.resources[0].samples.len(),
            2,
            "tids merged by default (two thread names)"
        );
        let tids = build(
            &views(&samples),
            &meta(),
            SampleAttributes {
                thread_name: true,
                pid: false,
                tid: true,
            },
        );
        assert_eq!(tids.resources[0].samples.len(), 3, "tid kept when asked");
        // The pid, when asked for, is a sample attribute, still one resource
        let pids = build(
            &views(&samples),
            &meta(),
            SampleAttributes {
                thread_name: true,
                pid: true,
                tid: false,
            },
        );
        assert_eq!(pids.resources.len(), 1);
        let with_pid = pids.resources[0]
            .samples
            .iter()
            .filter(|s| {
                s.attributes.iter().any(|&a| {
                    pids.dictionary
                        .string(pids.dictionary.attributes[a as usize].key)
                        == keys::PID
                })
            })
            .count();
        assert_eq!(with_pid, 2, "one sample per pid");
    }
}
