//! The kernel <-> user ABI of ember's eBPF sampler: map names, key layout, counter slots.
//!
//! Everything the eBPF program (`src/main.rs`) and the userspace sampler both need to agree on lives
//! here and only here. Types are `#[repr(C)]` with no padding so the kernel's byte view and Rust's
//! agree; the `user` feature adds `aya::Pod` so the sampler can read them out of maps.
#![no_std]

/// Length of a task's `comm`, as in the kernel's `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

/// Deepest stack the kernel's stack-trace map stores (`PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;

/// Aggregation key of the in-kernel sample counts: one row per distinct (thread, stacks, name).
///
/// A stack id below zero is the negated errno `bpf_get_stackid` returned: `-EFAULT` means "no
/// stack of this kind" (no user stack in a kernel thread, no kernel stack when interrupted in user
/// mode); anything else is a lost stack that userspace reports as such, never a dropped sample.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// Id in the generation's user stack-trace map, or a negated errno.
    pub user_stack_id: i32,
    /// Id in the generation's kernel stack-trace map, or a negated errno.
    pub kernel_stack_id: i32,
    /// The thread's name at sampling time, NUL padded.
    pub comm: [u8; COMM_LEN],
    /// With the DWARF unwinder: the key of the user stack in the generation's `USTACKS` map
    /// (a hash of its frames, never 0); 0 when `user_stack_id` holds the stack.
    pub user_stack_hash: u64,
    /// The key of the interpreter frames walked for this sample in the generation's
    /// `INTERP_STACKS` map (a hash of its frames, never 0); 0 when none were walked.
    pub interp_stack_hash: u64,
    /// Off-CPU rows: the key of the kernel stack in the generation's `USTACKS` map (copied
    /// there when the wait ended; a hash of its frames, never 0); 0 when `kernel_stack_id`
    /// holds the stack.
    pub kernel_stack_hash: u64,
}

#[cfg(feature = "user")]
// SAFETY: `SampleKey` is `repr(C)`, made only of integers and byte arrays, has no padding
// (4 * 4 + 16 + 8 + 8 + 8 bytes) and every bit pattern is a valid value.
unsafe impl aya::Pod for SampleKey {}

/// `bpf_get_stackid` error meaning "this context has no such stack".
pub const ERRNO_EFAULT: i32 = 14;
/// `bpf_get_stackid` error meaning "the hash bucket holds another stack" (a collision).
pub const ERRNO_EEXIST: i32 = 17;

/// One row of an unwind table, exactly the relay's 12-byte encoding (relay/src/unwind/row.rs):
/// from `pc` (an offset from the table's base) to the next row, unwind by `kind` with `a`, `b`
/// and `flags`. The sampler writes only rows it checked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindRow {
    pub pc: u32,
    pub a: i32,
    pub b: i16,
    pub kind: u8,
    pub flags: u8,
}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, no padding (4 + 4 + 2 + 1 + 1 bytes), any bit pattern valid.
unsafe impl aya::Pod for UnwindRow {}

/// Where one file's table lives in the `UNWIND_ROWS` array, and the address range it covers
/// (ELF virtual addresses of the file). Written after its rows, deleted before they are reused,
/// so the program never sees a half-written table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindTableInfo {
    /// The table's lowest address (its first row's `pc` is 0, relative to it).
    pub base: u64,
    /// `p_vaddr - p_offset` of the file's executable segment: a pc in a mapping is at table
    /// address pc - mapping start + mapping file offset + this.
    pub vaddr_minus_offset: i64,
    /// Bytes covered from `base`.
    pub len: u32,
    /// Index of the first row in `UNWIND_ROWS`.
    pub first_row: u32,
    /// Number of rows.
    pub rows: u32,
    /// When the unwinder last used this table, in [`tick`] units: written by the program, read
    /// by the sampler to evict the least recently sampled table first.
    pub last_sampled: u32,
}

/// The clock of [`UnwindTableInfo::last_sampled`]: CLOCK_MONOTONIC (`bpf_ktime_get_ns`)
/// nanoseconds shifted right by this, about 1.07 s per tick, wrapping after 146 years.
pub const TICK_SHIFT: u32 = 30;

/// The tick of a CLOCK_MONOTONIC time in nanoseconds.
pub fn tick(monotonic_ns: u64) -> u32 {
    (monotonic_ns >> TICK_SHIFT) as u32
}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, no padding (2 * 8 + 4 * 4 bytes), any bit pattern valid.
unsafe impl aya::Pod for UnwindTableInfo {}

/// Deepest user stack the DWARF unwinder walks.
pub const MAX_DWARF_FRAMES: usize = 64;

/// A user stack walked by the DWARF unwinder, stored under the hash of its frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserStack {
    pub len: u32,
    /// Frames found through unwind tables (the rest by frame pointers).
    pub dwarf_frames: u32,
    /// Leaf first; `len` used.
    pub frames: [u64; MAX_DWARF_FRAMES],
}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, no padding (8 + 64 * 8 bytes), any bit pattern valid.
unsafe impl aya::Pod for UserStack {}

/// Executable file mappings kept per process for the unwinder; more are left out (their frames
/// fall back to frame pointers).
pub const MAX_PROC_MAPPINGS: usize = 64;

/// One executable file mapping of a process, as `/proc/PID/maps` shows it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingEntry {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    /// The file's id on the sampler's connection: the key of its `UNWIND_TABLES` entry.
    pub file_id: u64,
}

/// A process's executable file mappings, sorted by `start`, `count` of them used.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcMappings {
    pub count: u32,
    pub _pad: u32,
    pub entries: [MappingEntry; MAX_PROC_MAPPINGS],
}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, no implicit padding (8 + 64 * 32 bytes), any bit pattern
// valid.
unsafe impl aya::Pod for MappingEntry {}
#[cfg(feature = "user")]
// SAFETY: as above: u32 + explicit u32 pad + an array of `MappingEntry`.
unsafe impl aya::Pod for ProcMappings {}

/// What the program tells the sampler at once, on the `PROCESS_EVENTS` ring buffer:
/// a process it had not sampled before (or not since its last exec) was just sampled, so its
/// facts can be read while it still runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessEvent {
    /// Process id (the kernel's tgid).
    pub tgid: u32,
    /// One of [`process_event`].
    pub kind: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) of the sample that revealed it.
    pub ktime_ns: u64,
    /// Real uid of the sampled thread as the kernel held it then (`bpf_get_current_uid_gid`,
    /// in the initial user namespace, where the sampler runs), or [`UNOBSERVED_UID`] when the
    /// event was not sent from the process's own context.
    pub uid: u32,
    pub _pad: u32,
    /// Its cgroup v2 id (`bpf_get_current_cgroup_id`: the inode of its cgroup's directory), or
    /// 0 when not observed.
    pub cgroup_id: u64,
    /// Its group leader's `task_struct.start_boottime` (ns of CLOCK_BOOTTIME at its fork: what
    /// /proc/PID/stat's starttime counts in ticks), or 0 when not observed or when the loader
    /// found no offsets for it ([`TASK_GROUP_LEADER_GLOBAL`]).
    pub start_boottime_ns: u64,
}

/// [`ProcessEvent::uid`] when the event was sent from another task's context (off-CPU).
pub const UNOBSERVED_UID: u32 = u32::MAX;

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, no padding (4 + 4 + 8 + 4 + 4 + 8 + 8 bytes), any bit
// pattern valid.
unsafe impl aya::Pod for ProcessEvent {}

/// Kinds of [`ProcessEvent`].
pub mod process_event {
    /// The first sample of a process not in `KNOWN_TGIDS` (new, exec'd, or evicted by the LRU).
    pub const FIRST_SAMPLE: u32 = 1;
}

/// Set in a `SampleKey`'s tgid (pids stay below 2^22) for the samples of a process whose pid
/// another process's group leader left in the same generation: the newer of the two.
pub const REUSED_TGID_BIT: u32 = 1 << 31;

/// Set in a `SampleKey`'s tid (tids stay below 2^22) for off-CPU rows: their value is
/// nanoseconds blocked (each kept wait's weight), not a sample count.
pub const OFF_CPU_TID_BIT: u32 = 1 << 31;

/// Threads the off-CPU program holds a pending wait for at once (an LRU of about 1 KiB per
/// entry, 9 MiB: a thread blocked while this many others blocked after it loses that wait).
pub const MAX_OFF_CPU_THREADS: u32 = 8192;

/// A blocked thread as the off-CPU program saw it leave the CPU: when, who, and its stacks
/// (walked then: when it comes back, the program runs in another thread's context).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuPending {
    /// CLOCK_MONOTONIC ns when it left the CPU.
    pub start: u64,
    pub tgid: u32,
    pub tid: u32,
    pub comm: [u8; COMM_LEN],
    /// `stack_hash` of `user` and of `kernel` (0: empty).
    pub user_hash: u64,
    pub kernel_hash: u64,
    pub user: UserStack,
    pub kernel: UserStack,
}

/// Entries of `KNOWN_TGIDS` (an LRU: an evicted process is reported again at its next sample).
pub const MAX_KNOWN_TGIDS: u32 = 16384;
/// Bytes of the `PROCESS_EVENTS` ring buffer: 16-byte events with an 8-byte header each, 8,192
/// of them between two reads of the sampler.
pub const PROCESS_EVENTS_BYTES: u32 = 256 * 1024;

/// Slots of the per-CPU `PROCESS_EVENT_COUNTERS` array.
pub mod event_counter {
    /// Events written to the ring buffer.
    pub const SENT: u32 = 0;
    /// Events dropped because the ring buffer was full (the process's facts are then read at
    /// the next drain, as before).
    pub const DROPPED: u32 = 1;
    /// `sched_process_exec` seen: the process's entry in `KNOWN_TGIDS` was reset.
    pub const EXECS: u32 = 2;
    /// Number of slots.
    pub const LEN: u32 = 3;
}

/// Fields of an [`InterpProc`]'s layout, in the order of docs/design/interpreters.md.
pub mod interp_field {
    pub const INTERP_THREADS_HEAD: usize = 0;
    pub const THREAD_NEXT: usize = 1;
    pub const THREAD_NATIVE_ID: usize = 2;
    pub const THREAD_PTHREAD: usize = 3;
    pub const PTHREAD_TID: usize = 4;
    pub const THREAD_FRAME: usize = 5;
    pub const CFRAME_CURRENT_FRAME: usize = 6;
    pub const FRAME_PREVIOUS: usize = 7;
    pub const FRAME_CODE: usize = 8;
    pub const FRAME_INSTRUCTION: usize = 9;
    pub const FRAME_MARKER: usize = 10;
    pub const CODE_TAG_MASK: usize = 11;
    pub const CODE_NAME: usize = 12;
    pub const CODE_FILENAME: usize = 13;
    pub const CODE_FIRSTLINENO: usize = 14;
    pub const CODE_LINETABLE: usize = 15;
    pub const OBJECT_TYPE: usize = 16;
    /// Number of fields.
    pub const LEN: usize = 17;
}

/// A layout field that the interpreter does not have.
pub const INTERP_ABSENT: u16 = 0xffff;
/// Largest offset a layout field may hold (the sampler refuses more), but
/// [`INTERP_MAX_HEAD_OFFSET`].
pub const INTERP_MAX_OFFSET: u16 = 4095;
/// Largest `interp_threads_head`: the interpreter state is large (3.13 and 3.14 keep the thread
/// list 7,344 bytes in), the other structures' fields lie within their first 4 KiB.
pub const INTERP_MAX_HEAD_OFFSET: u16 = 16383;
/// Runtimes an [`InterpProc`] may name.
pub const INTERP_RUNTIME_CPYTHON: u32 = 1;

/// An interpreter the relay found in a process, checked by the sampler: where the walk starts
/// and the offsets it follows (docs/design/interpreters.md).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpProc {
    /// Address of the pointer to the first interpreter state.
    pub root: u64,
    /// Address of the code objects' type: a code pointer whose `ob_type` differs is not copied.
    pub code_type: u64,
    /// One of the `INTERP_RUNTIME_*` values.
    pub runtime: u32,
    pub _pad: u32,
    /// Offsets by [`interp_field`]; [`INTERP_ABSENT`] where the interpreter has no such field.
    pub layout: [u16; interp_field::LEN],
    pub _pad2: [u16; 3],
}

/// Deepest interpreter stack the program walks.
pub const MAX_INTERP_FRAMES: usize = 64;
/// Threads of one interpreter the program looks through for the sampled thread's state.
pub const MAX_INTERP_THREADS: u32 = 64;

/// One interpreter frame as the program read it (raw: the relay decodes it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpFrame {
    /// The code object's address (tag bits cleared).
    pub code: u64,
    /// The 8 bytes at `frame_instruction`.
    pub instruction: u64,
    /// The byte at `frame_marker` (0 when absent).
    pub marker: u8,
    pub _pad: [u8; 7],
}

/// How an interpreter walk ended ([`InterpStack::end`]).
pub mod interp_end {
    /// At a null frame: the whole stack.
    pub const WHOLE: u32 = 0;
    /// At [`super::MAX_INTERP_FRAMES`].
    pub const CUT: u32 = 1;
    /// A read of the process's memory failed.
    pub const READ_FAILED: u32 = 2;
}

/// The interpreter frames of a sample, stored under the hash of their contents.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpStack {
    pub len: u32,
    /// One of [`interp_end`].
    pub end: u32,
    /// Leaf first; `len` used.
    pub frames: [InterpFrame; MAX_INTERP_FRAMES],
}

/// Key of a copied code object: the process (its `SampleKey` tgid, reuse bit included) and
/// the object's address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterpCodeKey {
    pub tgid: u32,
    pub _pad: u32,
    pub code: u64,
}

/// Bytes copied from the start of a code object's name string object.
pub const INTERP_NAME_BYTES: usize = 192;
/// Bytes copied from the start of its file name string object.
pub const INTERP_FILE_BYTES: usize = 320;
/// Bytes copied from the start of its line table bytes object.
pub const INTERP_LINES_BYTES: usize = 256;

/// A code object as the program copied it, once per generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpCode {
    /// `co_firstlineno`.
    pub first_line: i32,
    /// Bit 0: the name was read; bit 1: the file name; bit 2: the line table.
    pub copied: u32,
    pub name: [u8; INTERP_NAME_BYTES],
    pub filename: [u8; INTERP_FILE_BYTES],
    pub linetable: [u8; INTERP_LINES_BYTES],
}

#[cfg(feature = "user")]
// SAFETY: `repr(C)`, integers only, explicit pads (8 + 8 + 4 + 4 + 17 * 2 + 3 * 2 bytes), any
// bit pattern valid.
unsafe impl aya::Pod for InterpProc {}
#[cfg(feature = "user")]
// SAFETY: as above (8 + 8 + 1 + 7 bytes).
unsafe impl aya::Pod for InterpFrame {}
#[cfg(feature = "user")]
// SAFETY: as above (4 + 4 + 64 * 24 bytes).
unsafe impl aya::Pod for InterpStack {}
#[cfg(feature = "user")]
// SAFETY: as above (4 + 4 + 8 bytes).
unsafe impl aya::Pod for InterpCodeKey {}
#[cfg(feature = "user")]
// SAFETY: as above (4 + 4 + 192 + 320 + 256 bytes).
unsafe impl aya::Pod for InterpCode {}

/// Names of the maps, as the loader looks them up. Counts and stacks are double buffered: the
/// program writes to generation `CONTROL[0] & 1` (`CONTROL[0]` counts the sampler's flips: the
/// program's per-CPU cache of code objects already copied is valid for one count), while the sampler drains and clears the other one,
/// so samples arriving during a drain land in the fresh generation and none are lost.
pub mod maps {
    pub const COUNTS: [&str; 2] = ["COUNTS_0", "COUNTS_1"];
    pub const STACKS: [&str; 2] = ["STACKS_0", "STACKS_1"];
    pub const CONTROL: &str = "CONTROL";
    pub const COUNTERS: &str = "COUNTERS";
    /// `Array<UnwindRow>`: the rows of every loaded table (sized from `--unwind-memory-bytes`).
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    /// `HashMap<u64 file id, UnwindTableInfo>`: the loaded tables.
    pub const UNWIND_TABLES: &str = "UNWIND_TABLES";
    /// `HashMap<u32 tgid, ProcMappings>`: each sampled process's executable file mappings.
    pub const PROC_MAPPINGS: &str = "PROC_MAPPINGS";
    /// `HashMap<u64 hash, UserStack>` per generation: stacks walked by the DWARF unwinder.
    pub const USTACKS: [&str; 2] = ["USTACKS_0", "USTACKS_1"];
    /// `HashMap<u32 tgid, u8>`: processes not sampled (the relay's process filter, verified by
    /// the sampler), at most [`super::MAX_IGNORED`].
    pub const IGNORED: &str = "IGNORED";
    /// `LruHashMap<u32 tgid, u8>`: processes already reported on `PROCESS_EVENTS`.
    pub const KNOWN_TGIDS: &str = "KNOWN_TGIDS";
    /// Ring buffer of [`super::ProcessEvent`].
    pub const PROCESS_EVENTS: &str = "PROCESS_EVENTS";
    /// `LruHashMap<u32 tgid, u64 ktime * 2 + generation>`: when group leaders exited.
    pub const EXITED_AT: &str = "EXITED_AT";
    /// `PerCpuArray<u64>`: [`super::event_counter`] slots.
    pub const PROCESS_EVENT_COUNTERS: &str = "PROCESS_EVENT_COUNTERS";
    /// `HashMap<u32 tgid, InterpProc>`: interpreters to walk, checked by the sampler.
    pub const INTERP_PROCS: &str = "INTERP_PROCS";
    /// `LruHashMap<u32 tid, u64>`: each thread's interpreter thread state, checked on use.
    pub const INTERP_THREADS: &str = "INTERP_THREADS";
    /// `HashMap<u64 hash, InterpStack>` per generation.
    pub const INTERP_STACKS: [&str; 2] = ["INTERP_STACKS_0", "INTERP_STACKS_1"];
    /// `HashMap<InterpCodeKey, InterpCode>` per generation.
    pub const INTERP_CODES: [&str; 2] = ["INTERP_CODES_0", "INTERP_CODES_1"];
    /// `LruHashMap<u64 task, OffCpuPending>`: each blocked thread's pending wait
    /// (`--off-cpu`).
    pub const OFF_CPU_PENDING: &str = "OFF_CPU_PENDING";
}

/// Names of the tracepoint programs that keep `KNOWN_TGIDS` right.
pub mod programs {
    /// On `sched/sched_process_exec`: the image changed, report the process again.
    pub const EXEC: &str = "ember_process_exec";
    /// On `sched/sched_process_exit`: a group leader ended, its entry is freed (a process that
    /// reuses the pid is reported as new).
    pub const EXIT: &str = "ember_process_exit";
    /// `tp_btf/sched_switch` (`--off-cpu`): weighs the wait of the thread coming in, walks the
    /// stacks of the thread going out to wait.
    pub const OFF_CPU_SWITCH: &str = "ember_offcpu_switch";
}

/// Most processes the sampler ignores at once (the `IGNORED` map's size).
pub const MAX_IGNORED: u32 = 16384;

/// Name of the program's read-only global that restricts sampling to one process (0 = all).
pub const TARGET_TGID_GLOBAL: &str = "TARGET_TGID";
/// Name of the read-only global that turns the DWARF unwinder on (1) or off (0).
pub const DWARF_GLOBAL: &str = "DWARF";
/// Names of the read-only globals holding the device and inode of the sampler's pid namespace
/// when it is not the initial one (both 0 otherwise): tasks are then numbered in it.
pub const PIDNS_DEV_GLOBAL: &str = "PIDNS_DEV";
pub const PIDNS_INO_GLOBAL: &str = "PIDNS_INO";
/// Name of the read-only global holding `--off-cpu-min` in nanoseconds (waits at least this
/// long are kept whole; shorter ones with probability wait / min, weighed min).
pub const OFF_CPU_MIN_GLOBAL: &str = "OFF_CPU_MIN_NS";
/// Names of the read-only globals holding the byte offsets of `task_struct.group_leader` and
/// `task_struct.start_boottime`, which the loader finds in the kernel's BTF (aya-ebpf has no
/// CO-RE); both 0 (unknown) leave [`ProcessEvent::start_boottime_ns`] 0.
pub const TASK_GROUP_LEADER_GLOBAL: &str = "TASK_GROUP_LEADER";
pub const TASK_START_BOOTTIME_GLOBAL: &str = "TASK_START_BOOTTIME";
/// Largest `--off-cpu-min` (the keep test multiplies it by a 32-bit random number).
pub const MAX_OFF_CPU_MIN_NS: u64 = 1_000_000_000;

/// Slots of the per-CPU `COUNTERS` array: what the program saw and what it had to drop.
pub mod counter {
    /// Every time the program ran.
    pub const SAMPLES: u32 = 0;
    /// Samples of the idle task (pid 0), which are not recorded.
    pub const IDLE: u32 = 1;
    /// User stacks lost to a stack-map bucket collision or a full stack map.
    pub const USER_STACK_LOST: u32 = 2;
    /// Kernel stacks lost to a stack-map bucket collision or a full stack map.
    pub const KERNEL_STACK_LOST: u32 = 3;
    /// Samples dropped because the counts map was full.
    pub const COUNTS_FULL: u32 = 4;
    /// Samples skipped because a target pid filter was set and they were of another process, or
    /// because the sampler runs in a pid namespace of its own and the task is not in it.
    pub const FILTERED: u32 = 5;
    /// DWARF unwinder: user stacks that ended on a stop row other than the outermost frame's
    /// (CFI the unwinder cannot follow: the stack is cut there).
    pub const UNWIND_STOP: u32 = 6;
    /// DWARF unwinder: stacks cut at `MAX_DWARF_FRAMES`.
    pub const UNWIND_CUT: u32 = 7;
    /// DWARF unwinder: stacks whose store in `USTACKS` failed (map full): the sample falls
    /// back to the frame-pointer stack.
    pub const UNWIND_FULL: u32 = 8;
    /// DWARF unwinder: stacks that ended on a stop row with code `c` (1..=8, the relay's
    /// `StopReason` codes, 1 = outermost frame) are counted in slot `UNWIND_STOP_CODE + c - 1`.
    pub const UNWIND_STOP_CODE: u32 = 9;
    /// Number of stop codes (slots from [`UNWIND_STOP_CODE`]).
    pub const UNWIND_STOP_CODES: u32 = 8;
    /// DWARF unwinder: stacks that ended because a read of user memory failed (the return
    /// address, a saved rbp or a signal frame's registers).
    pub const UNWIND_READ_FAILED: u32 = 17;
    /// DWARF unwinder: stacks that ended at rbp 0 or a return address 0 (the end of a
    /// frame-pointer chain, or a table's caller of 0).
    pub const UNWIND_ZERO_END: u32 = 18;
    /// DWARF unwinder: frames unwound by frame pointers because their pc was in no known
    /// executable file mapping (JIT code, anonymous memory, the vDSO, over the mapping cap).
    pub const UNWIND_FP_NO_MAPPING: u32 = 19;
    /// DWARF unwinder: frames unwound by frame pointers because their file has no table loaded
    /// (not arrived yet, refused, or evicted).
    pub const UNWIND_FP_NO_TABLE: u32 = 20;
    /// DWARF unwinder: frames unwound by frame pointers because their table has a gap there
    /// (no CFI covers the address), or the pc is outside the table's range.
    pub const UNWIND_FP_GAP: u32 = 21;
    /// DWARF unwinder: user-mode samples of processes whose mappings the unwinder does not
    /// know yet: the frame-pointer stack is kept.
    pub const UNWIND_NO_PROCESS: u32 = 22;
    /// Samples of a process in `IGNORED` (the relay's process filter, pushed down): dropped
    /// before any stack walk.
    pub const IGNORED: u32 = 23;
    /// Interpreter walks that ended at a null frame (the whole interpreter stack).
    pub const INTERP_WALKED: u32 = 24;
    /// Samples of a process with an interpreter whose thread state was not found (a thread
    /// the interpreter does not know, or more threads than the walk looks through).
    pub const INTERP_NO_THREAD: u32 = 25;
    /// Interpreter walks ended by a failed read of the process's memory.
    pub const INTERP_READ_FAILED: u32 = 26;
    /// Interpreter walks cut at [`super::MAX_INTERP_FRAMES`].
    pub const INTERP_CUT: u32 = 27;
    /// Interpreter stacks lost because `INTERP_STACKS` was full, or their process had used its
    /// share of it (half) for the interval.
    pub const INTERP_STACKS_FULL: u32 = 28;
    /// Code objects not copied because `INTERP_CODES` was full, or their process had used its
    /// share of it (half) for the interval.
    pub const INTERP_CODES_FULL: u32 = 29;
    /// Code pointers that were not code objects (their type differed), each counted once per
    /// CPU and interval: left unnamed. 3.13 on counts its entry (shim) frames' `None` here.
    pub const INTERP_BAD_CODE: u32 = 30;
    /// Off-CPU waits kept (`--off-cpu`): each added its weight to an off-CPU row.
    pub const OFF_CPU_KEPT: u32 = 31;
    /// Off-CPU waits shorter than `--off-cpu-min` left out by the draw (by design: the kept
    /// ones are weighed so the total stays unbiased; not a loss).
    pub const OFF_CPU_SAMPLED_OUT: u32 = 32;
    /// Off-CPU waits dropped because the counts map was full (a loss).
    pub const OFF_CPU_COUNTS_FULL: u32 = 33;
    /// Number of slots.
    pub const LEN: u32 = 34;
}
