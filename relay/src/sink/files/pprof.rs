//! pprof sink: a [`LabeledProfile`] as a gzip-compressed `perftools.profiles.Profile` (google/pprof
//! proto/profile.proto), readable by `go tool pprof`, Pyroscope and Parca.
//!
//! Invariants: `string_table[0]` is `""`; every id is nonzero and unique in its table; each
//! distinct frame is one Location with one Line (inlined frames stay separate Locations, as in
//! the model); Functions are unique by (name, file), Mappings by module, and kernel frames without
//! a module share one `[kernel.kallsyms]` Mapping. Output is deterministic for a given profile.
//! Rendering only, into the writer the files sink gives (its file), compressed as encoded.

use std::{
    collections::HashMap,
    io::{self, Write},
    sync::Arc,
};

use flate2::{write::GzEncoder, Compression};
use prost::Message;

use crate::{
    labels::labeled::LabeledProfile,
    model::{Frame, FrameKind, Module, SampleKind},
};

/// Mapping name for kernel frames that carry no module.
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PprofError {
    #[error("gzip-compressing the pprof profile (or writing it) failed")]
    Compress(#[source] io::Error),
}

/// The pprof messages, written by hand with prost derive from google/pprof proto/profile.proto
/// (field numbers as there; `Breakdown`, `LabelSet` and `tick_unit` are left out: unset optional
/// fields read as defaults). String fields are indices into `Profile::string_table`.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first. Repeated scalars are packed by default in proto3, as pprof expects.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// 0 when the frame has no mapping.
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The uncompressed pprof message of `profile`.
#[cfg(test)]
pub fn render(profile: &LabeledProfile) -> proto::Profile {
    let mut samples = Vec::new();
    let mut message = render_each(profile, |sample| samples.push(sample));
    message.sample = samples;
    message
}

/// [`render`] with its samples handed to `each` one at a time as they are made (the returned
/// message has none): the file is written without holding every sample's message at once.
fn render_each(profile: &LabeledProfile, mut each: impl FnMut(proto::Sample)) -> proto::Profile {
    let mut tables = Tables::default();
    tables.string(""); // string_table[0] must be "".
    let samples_count = tables.value_type("samples", "count");
    let cpu_nanoseconds = tables.value_type("cpu", "nanoseconds");
    let period = profile.period_ns();
    let keys = [
        tables.string("pid"),
        tables.string("tid"),
        tables.string("thread_name"),
        tables.string("process_name"),
    ];

    // Off-CPU rows (`--off-cpu`) add a third sample type, `off_cpu` / `nanoseconds`; CPU rows
    // hold 0 there and off-CPU rows 0 in the CPU types (`go tool pprof -sample_index=off_cpu`).
    let off_cpu_rows = profile.iter_of(SampleKind::OffCpu);
    let off_cpu_type = (profile.iter_of(SampleKind::OffCpu).next().is_some())
        .then(|| tables.value_type("off_cpu", "nanoseconds"));
    let rows = profile
        .iter_of(SampleKind::Cpu)
        .map(|sample| {
            let count = i64::try_from(sample.count).unwrap_or(i64::MAX);
            let mut value = vec![count, count.saturating_mul(period)];
            if off_cpu_type.is_some() {
                value.push(0);
            }
            (sample, value)
        })
        .chain(off_cpu_rows.map(|sample| {
            let ns = i64::try_from(sample.count).unwrap_or(i64::MAX);
            (sample, vec![0, 0, ns])
        }));
    for (sample, value) in rows {
        each({
            let thread = &sample.thread;
            let [pid, tid, thread_name, process_name] = keys;
            proto::Sample {
                location_id: sample
                    .stack
                    .iter()
                    .map(|frame| tables.location(frame))
                    .collect(),
                value,
                label: [
                    num_label(pid, thread.pid),
                    num_label(tid, thread.tid),
                    str_label(thread_name, tables.string(&thread.thread_name)),
                    str_label(process_name, tables.string(&thread.process_name)),
                ]
                .into_iter()
                // The process's resource labels (service.name, container.id, tags, ...) as
                // string labels; the pid stays the numeric label above.
                .chain(
                    thread
                        .resource
                        .iter()
                        .filter(|(name, _)| *name != crate::labels::keys::PROCESS_PID)
                        .map(|(name, value)| {
                            let key = tables.string(name);
                            str_label(key, tables.string(value))
                        })
                        .collect::<Vec<_>>(),
                )
                .collect(),
            }
        });
    }

    tables.main_mapping_first(main_executable(profile).as_deref());
    let comment = tables.string(&format!("ember: sampled at {} Hz", profile.frequency_hz));
    let default_sample_type = cpu_nanoseconds.r#type;
    proto::Profile {
        sample_type: [samples_count, cpu_nanoseconds.clone()]
            .into_iter()
            .chain(off_cpu_type)
            .collect(),
        sample: Vec::new(),
        mapping: tables.mappings,
        location: tables.locations,
        function: tables.functions,
        string_table: tables.strings,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: i64::try_from(profile.start_unix_ns).unwrap_or(i64::MAX),
        duration_nanos: i64::try_from(profile.end_unix_ns.saturating_sub(profile.start_unix_ns))
            .unwrap_or(i64::MAX),
        period_type: Some(cpu_nanoseconds),
        period,
        comment: vec![comment],
        default_sample_type,
    }
}

/// The gzip-compressed pprof file content of `profile` (pprof files are gzipped on disk).
#[cfg(test)]
pub fn encode(profile: &LabeledProfile) -> Result<Vec<u8>, PprofError> {
    let mut file = Vec::new();
    encode_to(profile, &mut file)?;
    Ok(file)
}

/// Writes the gzip-compressed pprof file of `profile` to `out` as it is compressed.
pub fn encode_to(profile: &LabeledProfile, out: &mut dyn Write) -> Result<(), PprofError> {
    // Each sample is encoded as it is made (`Profile.sample` is field 2; a message's fields
    // may come in any order, and readers merge them) and compressed at once, then the tables
    // after them: neither the uncompressed message nor the compressed file is held whole.
    let mut gzip = GzEncoder::new(out, Compression::default());
    let mut sample_bytes = Vec::new();
    let mut failed = None;
    let rest = render_each(profile, |sample| {
        sample_bytes.clear();
        prost::encoding::message::encode(2, &sample, &mut sample_bytes);
        if failed.is_none() {
            failed = gzip.write_all(&sample_bytes).err();
        }
    });
    if let Some(error) = failed {
        return Err(PprofError::Compress(error));
    }
    gzip.write_all(&rest.encode_to_vec())
        .map_err(PprofError::Compress)?;
    gzip.finish().map(drop).map_err(PprofError::Compress)
}

fn num_label(key: i64, num: u32) -> proto::Label {
    proto::Label {
        key,
        num: i64::from(num),
        ..proto::Label::default()
    }
}

fn str_label(key: i64, str: i64) -> proto::Label {
    proto::Label {
        key,
        str,
        ..proto::Label::default()
    }
}

/// The executable of the process with the most samples (the only one when one process was
/// recorded): pprof readers take the first mapping for the main binary (`File:` of `pprof
/// -top`).
fn main_executable(profile: &LabeledProfile) -> Option<Arc<str>> {
    let mut by_executable: HashMap<Arc<str>, u64> = HashMap::new();
    for sample in profile.iter_of(SampleKind::Cpu) {
        if !sample.thread.executable_path.is_empty() {
            *by_executable
                .entry(Arc::clone(&sample.thread.executable_path))
                .or_default() += sample.count;
        }
    }
    by_executable
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .map(|(path, _)| path)
}

/// The tables' maps: keyed by the relay's own names and frames, looked up once per frame of
/// every sample, so a fast hash beats SipHash's flooding resistance here.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The profile's deduplicated tables, ids in order of first use (so 1-based indices).
#[derive(Default)]
struct Tables {
    strings: Vec<String>,
    string_ids: FastMap<String, i64>,
    functions: Vec<proto::Function>,
    /// By (name, filename) string ids.
    function_ids: FastMap<(i64, i64), u64>,
    mappings: Vec<proto::Mapping>,
    /// Index into `mappings` by module; `None` is the shared mapping of kernel frames without a
    /// module.
    mapping_ids: FastMap<Option<Arc<Module>>, usize>,
    locations: Vec<proto::Location>,
    /// By the frame's place in the profile being encoded (its frames are interned there, and
    /// borrowed for the whole encoding): a window of short-lived processes holds about a
    /// million frames, and a map keyed by a clone of each held them all a second time.
    location_ids: FastMap<*const Frame, u64>,
}

impl Tables {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn value_type(&mut self, r#type: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(r#type),
            unit: self.string(unit),
        }
    }

    fn location(&mut self, frame: &Frame) -> u64 {
        let key = std::ptr::from_ref(frame);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let mapping_id = self.mapping(frame);
        let function_id = self.function(frame);
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: frame.address,
            line: vec![proto::Line {
                function_id,
                line: frame.line.map_or(0, i64::from),
            }],
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }

    fn function(&mut self, frame: &Frame) -> u64 {
        // Unknown frames are named `[unknown] module`, as in the text outputs and the OTLP
        // export (the address stays in the location).
        let name = self.string(&frame.display_name());
        let filename = frame.file.as_deref().map_or(0, |file| self.string(file));
        if let Some(&id) = self.function_ids.get(&(name, filename)) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            // Only the demangled name is kept by the symbolizer.
            system_name: name,
            filename,
            start_line: 0,
        });
        self.function_ids.insert((name, filename), id);
        id
    }

    /// The frame's mapping id (0 for none), creating the mapping on first use and recording in
    /// it what symbol information its frames have.
    fn mapping(&mut self, frame: &Frame) -> u64 {
        let key = match &frame.module {
            Some(module) => Some(Arc::clone(module)),
            None if frame.kind == FrameKind::Kernel => None,
            None => return 0,
        };
        let index = match self.mapping_ids.get(&key) {
            Some(&index) => index,
            None => {
                let index = self.mappings.len();
                let mapping = self.new_mapping(index as u64 + 1, key.as_deref(), frame.address);
                self.mappings.push(mapping);
                self.mapping_ids.insert(key.clone(), index);
                index
            }
        };
        let mapping = &mut self.mappings[index];
        if key.is_none() {
            // The kallsyms mapping spans the kernel addresses seen.
            mapping.memory_start = mapping.memory_start.min(frame.address);
            mapping.memory_limit = mapping.memory_limit.max(frame.address.saturating_add(1));
        }
        mapping.has_functions |= !frame.is_unknown();
        mapping.has_filenames |= frame.file.is_some();
        mapping.has_line_numbers |= frame.line.is_some();
        mapping.has_inline_frames |= frame.inlined;
        mapping.id
    }

    /// Moves the main binary's mapping to the front, renumbering the mappings (ids stay their
    /// 1-based index) and the locations that point at them: the mapping of `executable` when
    /// one has that file name, else the first that is not the kernel's. The kernel is first
    /// only when it is the only mapping.
    fn main_mapping_first(&mut self, executable: Option<&str>) {
        let filename = |m: &proto::Mapping| self.strings[m.filename as usize].as_str();
        let of_executable =
            executable.and_then(|exe| self.mappings.iter().position(|m| filename(m) == exe));
        if let (None, Some(executable)) = (of_executable, executable) {
            // No sample ran in the executable itself (a JVM's time is in libjvm and JIT
            // code): a mapping naming it still leads, so readers title the profile by it.
            let named = proto::Mapping {
                filename: self.string(executable),
                ..proto::Mapping::default()
            };
            self.mappings.insert(0, named);
            for (index, mapping) in self.mappings.iter_mut().enumerate() {
                mapping.id = index as u64 + 1;
            }
            for location in self.locations.iter_mut().filter(|l| l.mapping_id != 0) {
                location.mapping_id += 1;
            }
            self.mapping_ids.clear();
            return;
        }
        // Without a known executable: a file of the process before anonymous memory (`[anon]`,
        // JIT code), the kernel last.
        let main = of_executable.or_else(|| {
            (self.mappings.iter())
                .position(|m| !filename(m).starts_with('['))
                .or_else(|| (self.mappings.iter()).position(|m| filename(m) != KERNEL_MAPPING))
        });
        let Some(main) = main.filter(|&i| i > 0) else {
            return;
        };
        let moved = self.mappings.remove(main);
        self.mappings.insert(0, moved);
        // Old id -> new id: the main one becomes 1, the ones before it shift by one.
        let new_id = |old: u64| match old {
            0 => 0,
            old if old == main as u64 + 1 => 1,
            old if old <= main as u64 => old + 1,
            old => old,
        };
        for (index, mapping) in self.mappings.iter_mut().enumerate() {
            mapping.id = index as u64 + 1;
        }
        for location in &mut self.locations {
            location.mapping_id = new_id(location.mapping_id);
        }
        // Called once every location exists: nothing looks a mapping up by module any more.
        self.mapping_ids.clear();
    }

    fn new_mapping(&mut self, id: u64, module: Option<&Module>, address: u64) -> proto::Mapping {
        match module {
            Some(module) => proto::Mapping {
                id,
                memory_start: module.start,
                memory_limit: module.end,
                file_offset: module.file_offset,
                filename: self.string(&module.path),
                build_id: module.build_id.as_deref().map_or(0, |id| self.string(id)),
                ..proto::Mapping::default()
            },
            None => proto::Mapping {
                id,
                memory_start: address,
                memory_limit: address.saturating_add(1),
                filename: self.string(KERNEL_MAPPING),
                ..proto::Mapping::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::GzDecoder;

    use super::*;
    use crate::model::{SymbolizedSample, Thread, UNKNOWN};

    const START: u64 = 1_700_000_000_000_000_000;
    const END: u64 = START + 10_000_000_000;

    fn app_module() -> Arc<Module> {
        Arc::new(Module {
            path: "/usr/bin/app".into(),
            build_id: Some("0123456789abcdef".into()),
            start: 0x40_0000,
            end: 0x50_0000,
            file_offset: 0,
            file: None,
        })
    }

    fn native(function: &str, address: u64, module: &Arc<Module>) -> Frame {
        Frame {
            function: function.into(),
            file: Some("src/app.c".into()),
            line: Some(42),
            kind: FrameKind::Native,
            inlined: false,
            address,
            module: Some(Arc::clone(module)),
        }
    }

    fn kernel(function: &str, address: u64) -> Frame {
        Frame::bare(function, FrameKind::Kernel, address)
    }

    fn thread(pid: u32, tid: u32) -> Thread {
        Thread::bare((pid, tid), "app", "worker", "/usr/bin/app")
    }

    #[test]
    fn a_location_costs_its_message_and_a_pointer_not_a_copy_of_its_frame() {
        // Given 50,000 distinct frames of one function (a window of short-lived processes
        // holds about a million: each process's addresses and each sampled leaf instruction
        // are frames of their own), with a file name and a module like a symbolized frame's
        let app = app_module();
        let frames: Vec<Frame> = (0..50_000u64)
            .map(|i| native("compute_the_answer", 0x40_1000 + i, &app))
            .collect();
        let mut tables = Tables::default();
        tables.location(&frames[0]);
        // When each gets its location, twice
        let (ids, held) = crate::symbolize::alloc::measure(|| {
            let ids: Vec<u64> = frames.iter().map(|f| tables.location(f)).collect();
            let again: Vec<u64> = frames.iter().map(|f| tables.location(f)).collect();
            assert_eq!(ids, again, "a frame seen again keeps its location");
            ids
        });
        // Then each frame is one location, and what the tables keep per location is its
        // message (a 56-byte Location and its 16-byte Line), the map's pointer and id (16 bytes
        // and hashbrown's control byte), both grown to 65,536 slots: (72 + 17) x 65,536 /
        // 50,000 = 117 bytes. A copy of the frame as the map's key adds 64 more (193 measured).
        assert_eq!(tables.locations.len(), frames.len());
        assert_eq!(ids.len(), frames.len());
        let per_location = usize::try_from(held).expect("allocated") / frames.len();
        assert!(per_location <= 150, "{per_location} bytes per location");
    }

    /// app: main -> compute (3 samples, tid 11) and main -> write -> [kernel] (2 samples, tid 12).
    fn profile() -> LabeledProfile {
        let app = app_module();
        let main = native("main", 0x40_1000, &app);
        let mut profile = LabeledProfile::new(100);
        let computing = SymbolizedSample {
            thread: thread(10, 11),
            stack: vec![native("compute", 0x40_2000, &app), main.clone()].into(),
            count: 3,
        };
        let writing = SymbolizedSample {
            thread: thread(10, 12),
            stack: vec![
                kernel("ksys_write", 0xffff_ffff_8100_2000),
                kernel("do_syscall_64", 0xffff_ffff_8100_1000),
                native("write", 0x40_3000, &app),
                main,
            ]
            .into(),
            count: 2,
        };
        profile.add(computing, START, END);
        profile.add(writing, START, END);
        profile
    }

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut message = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut message).unwrap();
        proto::Profile::decode(message.as_slice()).unwrap()
    }

    fn string(profile: &proto::Profile, index: i64) -> &str {
        &profile.string_table[usize::try_from(index).unwrap()]
    }

    /// Function names of a sample's locations, in the sample's order.
    fn names(profile: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
        sample
            .location_id
            .iter()
            .map(|&id| {
                let location = profile.location.iter().find(|l| l.id == id).unwrap();
                let line = &location.line[0];
                let function = profile
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .unwrap();
                string(profile, function.name).to_owned()
            })
            .collect()
    }

    fn label<'a>(
        profile: &'a proto::Profile,
        sample: &'a proto::Sample,
        key: &str,
    ) -> &'a proto::Label {
        sample
            .label
            .iter()
            .find(|l| string(profile, l.key) == key)
            .unwrap()
    }

    #[test]
    fn off_cpu_rows_add_an_off_cpu_sample_type_and_only_then() {
        // Given the CPU profile, without and then with off-CPU nanoseconds of one thread
        let cpu_only = render(&profile());
        let mut with = profile();
        let app = app_module();
        let waiting = [
            kernel("__schedule", 0xffff_ffff_8100_3000),
            native("wait_for_lock", 0x40_4000, &app),
            native("main", 0x40_1000, &app),
        ];
        with.add_frames_of(
            SampleKind::OffCpu,
            &thread(10, 13).into(),
            &waiting,
            7_000_000,
        );
        let with = render(&with);
        // Then without it the types are the two CPU ones, as before
        let types = |p: &proto::Profile| -> Vec<(String, String)> {
            p.sample_type
                .iter()
                .map(|t| (string(p, t.r#type).to_owned(), string(p, t.unit).to_owned()))
                .collect()
        };
        let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            types(&cpu_only),
            [pair("samples", "count"), pair("cpu", "nanoseconds")]
        );
        // And with it a third, off_cpu / nanoseconds: CPU rows hold 0 there, the off-CPU row
        // its nanoseconds and 0 in the CPU types
        assert_eq!(
            types(&with),
            [
                pair("samples", "count"),
                pair("cpu", "nanoseconds"),
                pair("off_cpu", "nanoseconds")
            ]
        );
        let off: Vec<_> = with.sample.iter().filter(|s| s.value[2] != 0).collect();
        assert_eq!(off.len(), 1);
        assert_eq!(off[0].value, [0, 0, 7_000_000]);
        assert_eq!(
            names(&with, off[0]),
            ["__schedule", "wait_for_lock", "main"]
        );
        assert!(with
            .sample
            .iter()
            .filter(|s| s.value[2] == 0)
            .all(|s| s.value[0] > 0 && s.value.len() == 3));
    }

    #[test]
    fn python_frames_carry_their_function_file_and_line() {
        // Given a sample whose leaf is a Python function over the native main
        let app = app_module();
        let python = Frame {
            function: "Worker.hot".into(),
            file: Some("/srv/app/workload.py".into()),
            line: Some(12),
            kind: FrameKind::CPython,
            inlined: false,
            address: 0,
            module: None,
        };
        let mut profile = LabeledProfile::new(100);
        let sample = SymbolizedSample {
            thread: thread(10, 11),
            stack: vec![python, native("main", 0x40_1000, &app)].into(),
            count: 1,
        };
        profile.add(sample, START, END);
        // When encoded and decoded again
        let decoded = decode(&encode(&profile).unwrap());
        // Then its location has no mapping and one line: the function, its file, the line
        let leaf = decoded.sample[0].location_id[0];
        let location = decoded.location.iter().find(|l| l.id == leaf).unwrap();
        assert_eq!(location.mapping_id, 0);
        let function = decoded
            .function
            .iter()
            .find(|f| f.id == location.line[0].function_id)
            .unwrap();
        assert_eq!(string(&decoded, function.name), "Worker.hot");
        assert_eq!(string(&decoded, function.filename), "/srv/app/workload.py");
        assert_eq!(location.line[0].line, 12);
    }

    #[test]
    fn the_file_streamed_sample_by_sample_decodes_to_the_whole_message() {
        // Given a profile whose samples are encoded one by one before the tables
        let profile = profile();
        // When the file is decoded, then it is the message rendered whole
        assert_eq!(decode(&encode(&profile).unwrap()), render(&profile));
    }

    #[test]
    fn encodes_header_sample_types_and_period() {
        // Given a 100 Hz profile over ten seconds
        let profile = profile();

        // When encoded and decoded again
        let decoded = decode(&encode(&profile).unwrap());

        // Then the header describes samples/count and cpu/nanoseconds at a 10 ms period
        assert_eq!(decoded.string_table[0], "");
        let types: Vec<(&str, &str)> = decoded
            .sample_type
            .iter()
            .map(|t| (string(&decoded, t.r#type), string(&decoded, t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = decoded.period_type.as_ref().unwrap();
        assert_eq!(string(&decoded, period_type.r#type), "cpu");
        assert_eq!(string(&decoded, period_type.unit), "nanoseconds");
        assert_eq!(decoded.period, 10_000_000);
        assert_eq!(string(&decoded, decoded.default_sample_type), "cpu");
        assert_eq!(decoded.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(decoded.duration_nanos, 10_000_000_000);
    }

    #[test]
    fn samples_carry_values_labels_and_leaf_first_locations() {
        // Given two stacks of one process in two threads
        let profile = profile();

        // When encoded and decoded again
        let decoded = decode(&encode(&profile).unwrap());

        // Then each sample has [count, count * period], thread labels and its frames leaf first
        assert_eq!(decoded.sample.len(), 2);
        let computing = &decoded.sample[0];
        assert_eq!(computing.value, [3, 30_000_000]);
        assert_eq!(names(&decoded, computing), ["compute", "main"]);
        assert_eq!(label(&decoded, computing, "pid").num, 10);
        assert_eq!(label(&decoded, computing, "tid").num, 11);
        let thread_name = label(&decoded, computing, "thread_name");
        assert_eq!(string(&decoded, thread_name.str), "worker");
        let process_name = label(&decoded, computing, "process_name");
        assert_eq!(string(&decoded, process_name.str), "app");

        let writing = &decoded.sample[1];
        assert_eq!(writing.value, [2, 20_000_000]);
        assert_eq!(label(&decoded, writing, "tid").num, 12);
        assert_eq!(
            names(&decoded, writing),
            ["ksys_write", "do_syscall_64", "write", "main"]
        );
    }

    #[test]
    fn frames_functions_and_mappings_are_deduplicated() {
        // Given `main` in both stacks and five distinct frames in all
        let profile = profile();

        // When rendered
        let rendered = render(&profile);

        // Then one location and one function per distinct frame, and two mappings: the binary
        // with its build id, and kallsyms spanning the kernel addresses seen
        assert_eq!(rendered.location.len(), 5);
        assert_eq!(rendered.function.len(), 5);
        assert_eq!(
            rendered.sample[0].location_id[1],
            rendered.sample[1].location_id[3]
        );
        assert_eq!(rendered.mapping.len(), 2);

        let app = rendered
            .mapping
            .iter()
            .find(|m| string(&rendered, m.filename) == "/usr/bin/app")
            .unwrap();
        assert_eq!(string(&rendered, app.build_id), "0123456789abcdef");
        assert_eq!((app.memory_start, app.memory_limit), (0x40_0000, 0x50_0000));
        assert!(app.has_functions && app.has_filenames && app.has_line_numbers);
        assert!(!app.has_inline_frames);

        let kernel = rendered
            .mapping
            .iter()
            .find(|m| string(&rendered, m.filename) == "[kernel.kallsyms]")
            .unwrap();
        assert_eq!(kernel.memory_start, 0xffff_ffff_8100_1000);
        assert_eq!(kernel.memory_limit, 0xffff_ffff_8100_2001);
        assert_eq!(string(&rendered, kernel.build_id), "");

        let ids: Vec<u64> = rendered.location.iter().map(|l| l.id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
        let main = rendered
            .location
            .iter()
            .find(|l| l.address == 0x40_1000)
            .unwrap();
        assert_eq!(main.mapping_id, app.id);
        assert_eq!(main.line[0].line, 42);
    }

    #[test]
    fn the_main_executable_is_the_first_mapping_and_never_the_kernel() {
        // Given samples whose first frames are kernel frames, then a library's, then the
        // executable's: the mappings are made in that order
        let app = app_module();
        let lib = Arc::new(Module {
            path: "/usr/lib/libc.so.6".into(),
            build_id: None,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0010_0000,
            file_offset: 0,
            file: None,
        });
        let mut profile = LabeledProfile::new(100);
        let stack = vec![
            kernel("ksys_write", 0xffff_ffff_8100_2000),
            native("write", 0x7f00_0000_1000, &lib),
            native("main", 0x40_1000, &app),
        ];
        profile.add(
            SymbolizedSample {
                thread: thread(10, 11),
                stack: stack.into(),
                count: 4,
            },
            START,
            END,
        );
        // When rendered
        let rendered = render(&profile);
        // Then the process's executable is mapping 1, ids stay 1-based indices, and every
        // location still points at the mapping of its own file
        let names: Vec<&str> = rendered
            .mapping
            .iter()
            .map(|m| string(&rendered, m.filename))
            .collect();
        assert_eq!(
            names,
            ["/usr/bin/app", "[kernel.kallsyms]", "/usr/lib/libc.so.6"]
        );
        let ids: Vec<u64> = rendered.mapping.iter().map(|m| m.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        for location in &rendered.location {
            let mapping = &rendered.mapping[location.mapping_id as usize - 1];
            let expected = match location.address {
                0x40_1000 => "/usr/bin/app",
                0x7f00_0000_1000 => "/usr/lib/libc.so.6",
                _ => "[kernel.kallsyms]",
            };
            assert_eq!(string(&rendered, mapping.filename), expected);
        }
        // And without a known executable, the first mapping that is not the kernel's leads
        let mut unknown_exe = LabeledProfile::new(100);
        let mut anonymous = thread(20, 21);
        anonymous.executable_path = "".into();
        unknown_exe.add(
            SymbolizedSample {
                thread: anonymous,
                stack: vec![
                    kernel("ksys_write", 0xffff_ffff_8100_2000),
                    native("write", 0x7f00_0000_1000, &lib),
                ]
                .into(),
                count: 1,
            },
            START,
            END,
        );
        let rendered = render(&unknown_exe);
        assert_eq!(
            string(&rendered, rendered.mapping[0].filename),
            "/usr/lib/libc.so.6"
        );
        // And when no sample ran in the executable (a JVM: libjvm and anonymous JIT code), a
        // mapping naming the executable still leads and every location keeps its own mapping
        let mut jvm = LabeledProfile::new(100);
        let mut java = thread(30, 31);
        java.executable_path = "/usr/lib/jvm/bin/java".into();
        let jit = Arc::new(Module {
            path: "[anon]".into(),
            build_id: None,
            start: 0x7e00_0000_0000,
            end: 0x7e00_0010_0000,
            file_offset: 0,
            file: None,
        });
        jvm.add(
            SymbolizedSample {
                thread: java,
                stack: vec![
                    native(UNKNOWN, 0x7e00_0000_1000, &jit),
                    native("write", 0x7f00_0000_1000, &lib),
                ]
                .into(),
                count: 1,
            },
            START,
            END,
        );
        let rendered = render(&jvm);
        let names: Vec<&str> = (rendered.mapping.iter())
            .map(|m| string(&rendered, m.filename))
            .collect();
        assert_eq!(
            names,
            ["/usr/lib/jvm/bin/java", "[anon]", "/usr/lib/libc.so.6"]
        );
        for location in &rendered.location {
            let mapping = &rendered.mapping[location.mapping_id as usize - 1];
            let expected = if location.address == 0x7e00_0000_1000 {
                "[anon]"
            } else {
                "/usr/lib/libc.so.6"
            };
            assert_eq!(string(&rendered, mapping.filename), expected);
        }
    }

    #[test]
    fn unknown_frames_are_named_by_module() {
        // Given an unnamed frame in the binary
        let mut profile = LabeledProfile::new(100);
        let frame = native(UNKNOWN, 0x40_1234, &app_module());
        let sample = SymbolizedSample {
            thread: thread(1, 1),
            stack: vec![frame].into(),
            count: 1,
        };
        profile.add(sample, START, END);

        // When rendered
        let rendered = render(&profile);

        // Then its function is named like the text outputs, and the mapping claims no functions
        assert_eq!(names(&rendered, &rendered.sample[0]), ["[unknown] app"]);
        assert_eq!(rendered.location[0].address, 0x40_1234);
        assert!(!rendered.mapping[0].has_functions);
    }
}
