//! Plain Rust forms of the protocol messages (see `schema/ember.capnp` for field meanings).

/// Every message the sampler sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SamplerMessage {
    Hello(Hello),
    Files(Vec<FileInfo>),
    Process(ProcessInfo),
    Batch(Batch),
    Exited {
        pid: u32,
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
}

/// Totals since the sampler started (see `Losses` in the schema).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Losses {
    pub samples: u64,
    pub idle: u64,
    pub filtered: u64,
    pub user_stack_lost: u64,
    pub kernel_stack_lost: u64,
    pub counts_full: u64,
    pub backlog_dropped_batches: u64,
    pub backlog_dropped_samples: u64,
    pub proc_errors: u64,
    pub facts_dropped: u64,
    pub facts_truncated: u64,
    pub files_unopened: u64,
    pub unwind_tables_loaded: u64,
    pub unwind_tables_refused: u64,
    pub unwind_stopped: u64,
    pub unwind_cut: u64,
    pub unwind_map_full: u64,
    /// Stacks that ended at a stop row of code 1: the outermost frame (_start, thread start), the normal end.
    pub unwind_outermost: u64,
    /// Stacks cut at a stop row of code 2: CFA from a register other than rsp/rbp.
    pub unwind_stop_cfa_register: u64,
    /// Code 3: CFA a DWARF expression other than PLT/signal.
    pub unwind_stop_cfa_expression: u64,
    /// Code 4: an offset over the row's field.
    pub unwind_stop_offset_range: u64,
    /// Code 5: return address not at CFA - 8.
    pub unwind_stop_return_address_rule: u64,
    /// Code 6: rbp restored by a rule without a row kind.
    pub unwind_stop_rbp_rule: u64,
    /// Code 7: malformed CFI.
    pub unwind_stop_malformed: u64,
    /// Code 8: FDE over the compiler's budget.
    pub unwind_stop_budget: u64,
    /// Stacks ended by a failed read of user memory.
    pub unwind_read_failed: u64,
    /// Stacks ended at rbp 0 or a return address 0 (end of a frame-pointer chain).
    pub unwind_zero_end: u64,
    /// Frames unwound by frame pointers: pc in no known file mapping.
    pub unwind_fp_no_mapping: u64,
    /// Frames unwound by frame pointers: their file has no table loaded (absent, refused, evicted).
    pub unwind_fp_no_table: u64,
    /// Frames unwound by frame pointers: a gap row or outside the table.
    pub unwind_fp_gap: u64,
    /// User-mode samples of processes whose mappings the unwinder does not know yet (frame-pointer stack kept).
    pub unwind_no_process: u64,
    /// Loaded tables evicted (least recently sampled first) to make room under --unwind-memory-bytes.
    pub unwind_tables_evicted: u64,
}

impl Losses {
    /// Walked stacks that ended at a stop row of `code` (the relay's `StopReason` codes 1..=8).
    pub fn unwind_stops_with_code(&self, code: u32) -> Option<u64> {
        let counts = [
            self.unwind_outermost,
            self.unwind_stop_cfa_register,
            self.unwind_stop_cfa_expression,
            self.unwind_stop_offset_range,
            self.unwind_stop_return_address_rule,
            self.unwind_stop_rbp_rule,
            self.unwind_stop_malformed,
            self.unwind_stop_budget,
        ];
        counts
            .get(usize::try_from(code.checked_sub(1)?).ok()?)
            .copied()
    }
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
