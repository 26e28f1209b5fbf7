//! Plain Rust forms of the protocol messages (see `schema/ember.capnp` for field meanings).

use crate::losses::Losses;

/// Every message the sampler sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SamplerMessage {
    Hello(Hello),
    Files(Vec<FileInfo>),
    Process(ProcessInfo),
    Batch(Batch),
    /// Processes that exited (at least one: the first is the schema's `pid`).
    Exited {
        pids: Vec<u32>,
    },
    ProcessMappings(ProcessMappings),
    /// Ids of files the sampler closed (see `FilesClosed` in the schema).
    FilesClosed(Vec<u64>),
}

impl SamplerMessage {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Files(_) => "files",
            Self::Process(_) => "process",
            Self::Batch(_) => "batch",
            Self::Exited { .. } => "exited",
            Self::ProcessMappings(_) => "process mappings",
            Self::FilesClosed(_) => "files closed",
        }
    }
}

/// An index into the file descriptors that came with the same datagram.
pub type FdIndex = i32;

/// Marks "no fd" in an [`FdIndex`].
pub const NO_FD: FdIndex = -1;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hello {
    pub protocol_version: u32,
    pub sampler_version: String,
    pub hostname: String,
    pub frequency_hz: u32,
    pub kallsyms_fd: FdIndex,
    pub target_pid: u32,
    /// Rows of the sampler's unwind row array; 0 when it has none or did not say.
    pub unwind_rows: u32,
    /// Entries of the sampler's unwind table map; 0 when it has none or did not say.
    pub unwind_tables: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileInfo {
    pub file_id: u64,
    pub device: u64,
    pub inode: u64,
    pub path: String,
    pub fd: FdIndex,
    pub open_error: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub path: String,
    pub device: u64,
    pub inode: u64,
    /// 0 when no file was passed for this mapping.
    pub file_id: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub start_time_unix_ns: u64,
    pub executable_path: String,
    pub executable_name: String,
    /// The text of `/proc/PID/cgroup` (every hierarchy's line), bounded; an older sampler sent
    /// only the v2 path.
    pub cgroup: String,
    pub mappings: Vec<Mapping>,
    /// Executable mappings left out by the sampler's per-process cap.
    pub mappings_omitted: u32,
    /// The real uid, when the sampler could read it.
    pub uid: Option<u32>,
    /// The process's `OTEL_SERVICE_NAME`, the first of the two variables the sampler's environ
    /// allowlist forwards (`None`: not set or empty).
    pub otel_service_name: Option<String>,
    /// The process's `OTEL_RESOURCE_ATTRIBUTES` (unparsed), the other one.
    pub otel_resource_attributes: Option<String>,
    /// `/proc/PID/cmdline`'s bytes (NUL-terminated arguments), bounded; `None` unless the
    /// sampler runs with `--command-line`, or when it was empty.
    pub command_line: Option<Vec<u8>>,
    /// The index of the process's perf map descriptor in the datagram (`None`: none passed).
    pub perf_map_fd: Option<FdIndex>,
    /// Why the process's perf map was not passed (empty: passed, or there is none).
    pub perf_map_refused: String,
}

/// More executable mappings of the process described just before (its facts did not fit one
/// datagram).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessMappings {
    pub pid: u32,
    pub start_time_unix_ns: u64,
    pub mappings: Vec<Mapping>,
}

/// Where a row's stack is: an index into the batch's stack table, or the errno of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackRef {
    Index(u32),
    /// The kernel returned this errno (positive), e.g. 14 (EFAULT) for "no such stack".
    Missing(i32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub user_stack: StackRef,
    pub kernel_stack: StackRef,
    pub count: u64,
    /// Index into [`Batch::interp_stacks`] of the interpreter frames walked for these samples.
    pub interp_stack: Option<u32>,
    /// Nanoseconds blocked (`--off-cpu`), the kept waits' weights summed; an off-CPU row has
    /// `count` 0.
    pub off_cpu_ns: u64,
}

/// Deepest interpreter stack a batch may carry (the kernel's `MAX_INTERP_FRAMES`); deeper ones
/// are refused on decode.
pub const MAX_INTERP_FRAMES: usize = 64;
/// Most bytes of a code object's name the kernel copies (`INTERP_NAME_BYTES`).
pub const INTERP_NAME_BYTES: usize = 192;
/// Most bytes of its file name (`INTERP_FILE_BYTES`).
pub const INTERP_FILE_BYTES: usize = 320;
/// Most bytes of its line table (`INTERP_LINES_BYTES`).
pub const INTERP_LINES_BYTES: usize = 256;

/// One interpreter frame, raw as the kernel read it (docs/design/interpreters.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterpFrameWire {
    /// The code object's address (tag bits cleared).
    pub code: u64,
    /// The 8 bytes of the frame's instruction field, as a little-endian `u64`.
    pub instruction: u64,
    /// The frame's marker byte (0 when the layout has none).
    pub marker: u8,
}

/// The interpreter frames of some samples, leaf first, at most [`MAX_INTERP_FRAMES`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterpStackWire {
    pub frames: Vec<InterpFrameWire>,
    /// How the walk ended: 0 at a null frame, 1 cut at the frame cap, 2 a read failed.
    pub end: u8,
}

/// A code object of process `pid` as the kernel copied it: raw bytes from the start of the
/// objects, bounded by the `INTERP_*_BYTES` constants; empty where the read failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterpCodeWire {
    pub pid: u32,
    pub code: u64,
    pub first_line: i32,
    pub name: Vec<u8>,
    pub filename: Vec<u8>,
    pub linetable: Vec<u8>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub sequence: u64,
    pub part: u32,
    pub parts: u32,
    pub interval_start_unix_ns: u64,
    pub interval_end_unix_ns: u64,
    pub frequency_hz: u32,
    /// Raw user addresses, leaf first.
    pub user_stacks: Vec<Vec<u64>>,
    /// Raw kernel addresses, leaf first.
    pub kernel_stacks: Vec<Vec<u64>>,
    pub rows: Vec<Row>,
    /// Boxed to keep [`SamplerMessage`] (and the relay's events carrying it) small.
    pub losses: Box<Losses>,
    /// What the sampler did with the relay's `ignoreProcesses` (see the schema).
    pub ignore: IgnoreStats,
    /// Interpreter frames walked in the kernel; rows refer to them by index.
    pub interp_stacks: Vec<InterpStackWire>,
    /// The code objects those frames name, copied raw.
    pub interp_codes: Vec<InterpCodeWire>,
}

/// The process filter pushed down to the sampler, as each batch reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IgnoreStats {
    /// Samples of ignored processes counted and dropped by the program, since start.
    pub ignored_samples: u64,
    /// Entries refused (identity not verified, over a cap, malformed), since start.
    pub refused: u64,
    /// Processes ignored now.
    pub processes: u32,
}

impl Batch {
    /// Total samples in this part.
    pub fn sample_count(&self) -> u64 {
        self.rows
            .iter()
            .fold(0u64, |total, row| total.saturating_add(row.count))
    }
}

/// Largest `data` of one [`UnwindTableChunk`]: whole datagrams stay far below the socket's
/// buffer, and the sampler never holds more than this per received datagram.
pub const MAX_UNWIND_CHUNK_BYTES: usize = 48 << 10;

/// What the relay sends to the sampler (see `RelayMessage` in the schema).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RelayMessage {
    /// One chunk of an encoded unwind table.
    UnwindTableChunk(UnwindTableChunk),
    /// Forget the table of this file id.
    DropUnwindTable { file_id: u64 },
    /// Stop sampling these processes (the relay's process filter left them out).
    IgnoreProcesses(IgnoreProcesses),
    /// Walk this process's interpreter frames in the kernel (or stop, with `forget`).
    InterpreterProcess(InterpreterProcess),
}

/// Offsets an [`InterpreterProcess`] carries (docs/design/interpreters.md's layout table).
pub const INTERP_LAYOUT_LEN: usize = 17;
/// A layout offset the interpreter does not have.
pub const INTERP_LAYOUT_ABSENT: u16 = 0xffff;
/// Largest offset the sampler takes in an [`InterpreterProcess`] layout, but the first.
pub const INTERP_MAX_OFFSET: u16 = 4095;
/// Largest first offset (`interp_threads_head`): 3.13 and 3.14 keep it 7,344 bytes in.
pub const INTERP_MAX_HEAD_OFFSET: u16 = 16383;
/// [`InterpreterProcess::runtime`] of CPython.
pub const INTERP_RUNTIME_CPYTHON: u32 = 1;

/// Where a process's interpreter keeps its threads and frames (see `InterpreterProcess` in the
/// schema and docs/design/interpreters.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterpreterProcess {
    pub pid: u32,
    pub start_time_unix_ns: u64,
    /// The sampler's id of the interpreter file.
    pub file_id: u64,
    /// One of the `INTERP_RUNTIME_*` values.
    pub runtime: u32,
    /// Absolute address of the pointer to the first interpreter state.
    pub root: u64,
    /// Absolute address of the code objects' type.
    pub code_type: u64,
    /// Offsets in the order of the doc's table; [`INTERP_LAYOUT_ABSENT`] where absent.
    pub layout: [u16; INTERP_LAYOUT_LEN],
    /// Stop walking this process.
    pub forget: bool,
}

/// Most entries of one `ignoreProcesses` the sampler reads; the rest are refused unread.
pub const MAX_IGNORE_PER_MESSAGE: usize = 1024;

/// Processes the relay asks the sampler to ignore (see `IgnoreProcesses` in the schema).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IgnoreProcesses {
    /// Forget every process ignored so far first.
    pub forget_all: bool,
    /// At most [`MAX_IGNORE_PER_MESSAGE`] when decoded.
    pub processes: Vec<IgnoredProcess>,
    /// Decoding only: entries beyond [`MAX_IGNORE_PER_MESSAGE`], left unread (the encoder
    /// ignores it).
    pub excess: u32,
}

/// A process as the relay knows it: the pid and start time of the sampler's `process` message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IgnoredProcess {
    pub pid: u32,
    pub start_time_unix_ns: u64,
}

/// One chunk of the unwind table of `file_id`: chunks `0..chunks` concatenated are the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindTableChunk {
    pub file_id: u64,
    pub chunk: u32,
    pub chunks: u32,
    pub data: Vec<u8>,
    /// `p_vaddr - p_offset` of the file's executable segment (see the schema).
    pub vaddr_minus_offset: i64,
}
