//! Process events: the first sample of a process the program has not reported yet
//! goes to the sampler at once on a ring buffer, so it reads the process's facts while the
//! process still runs (with what the kernel holds of it there: uid, cgroup id, and its start
//! time, read from its group leader's `task_struct` at offsets the loader took from the
//! kernel's BTF, so the sampler need not open its stat file); `sched_process_exec` and `sched_process_exit` keep the set of reported
//! processes right (an exec'd image and a reused pid are reported again).
//!
//! A pid reused within one generation (the leader of one process exited, another process got its
//! pid before the sampler drained) is told apart: the newer process's samples carry
//! [`REUSED_TGID_BIT`] in their key's tgid.
//!
//! Kept apart from the sampling and unwinding code: the perf_event program calls [`note`] at
//! its entry and [`reuse_tag`] where it builds the key.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_task, bpf_get_current_uid_gid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_get_current_cgroup_id,
    },
    macros::{map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use ember_sampler_ebpf::{
    event_counter, process_event, ProcessEvent, MAX_KNOWN_TGIDS, PROCESS_EVENTS_BYTES,
    REUSED_TGID_BIT, UNOBSERVED_UID,
};

/// Byte offset of `task_struct.group_leader`, from the kernel's BTF (set by the loader; 0 =
/// unknown).
#[no_mangle]
static TASK_GROUP_LEADER: u32 = 0;
/// Byte offset of `task_struct.start_boottime`, likewise.
#[no_mangle]
static TASK_START_BOOTTIME: u32 = 0;

#[map]
static KNOWN_TGIDS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_KNOWN_TGIDS, 0);
#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENTS_BYTES, 0);
/// Group leaders that exited: `ktime * 2 + generation` at their exit. A process that reuses the
/// pid in that same generation has its samples tagged apart ([`reuse_tag`]); the sampler reads
/// the time to tell which process untagged rows belong to.
#[map]
static EXITED_AT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_KNOWN_TGIDS, 0);
#[map]
static PROCESS_EVENT_COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(event_counter::LEN, 0);

#[inline(always)]
fn bump(slot: u32) {
    if let Some(ptr) = PROCESS_EVENT_COUNTERS.get_ptr_mut(slot) {
        // SAFETY: a per-CPU slot, touched only by this CPU; programs do not nest on one CPU for
        // these program types (and a lost increment would only skew a debug counter).
        unsafe { *ptr += 1 };
    }
}

/// The current task's group leader's `start_boottime`: the start time /proc/PID/stat gives in
/// ticks, so the sampler need not open that file. 0 when the loader found no offsets or a read
/// failed.
#[inline(always)]
fn leader_start_boottime() -> u64 {
    // SAFETY: reads of read-only globals the loader set before load.
    let (leader_at, start_at) = unsafe {
        (
            core::ptr::read_volatile(&TASK_GROUP_LEADER),
            core::ptr::read_volatile(&TASK_START_BOOTTIME),
        )
    };
    if leader_at == 0 || start_at == 0 {
        return 0;
    }
    // SAFETY: the helper returns the current task's address and takes no argument.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: `bpf_probe_read_kernel` checks the address it reads and fails on a bad one; the
    // offsets are the kernel's own (its BTF), so these are its `task_struct` fields.
    let leader =
        match unsafe { bpf_probe_read_kernel(task.wrapping_add(leader_at as usize) as *const u64) }
        {
            Ok(leader) if leader != 0 => leader as *const u8,
            _ => return 0,
        };
    // SAFETY: as above.
    unsafe { bpf_probe_read_kernel(leader.wrapping_add(start_at as usize) as *const u64) }
        .unwrap_or(0)
}

/// Reports `tgid` on the ring buffer unless it was already reported (since its last exec).
/// `in_context`: the program runs in one of the process's threads, so its uid, cgroup and start
/// time are the current task's and go with the event (the sampler then reads none of them from
/// /proc).
#[inline(always)]
pub fn note(tgid: u32, in_context: bool) {
    if KNOWN_TGIDS.get_ptr(&tgid).is_some() {
        return;
    }
    // Another CPU may insert it first (a second thread of the process): only one reports.
    if KNOWN_TGIDS.insert(&tgid, &1, BPF_NOEXIST as u64).is_err() {
        return;
    }
    let (uid, cgroup_id, start_boottime_ns) = if in_context {
        // The low half is the real uid.
        let uid = bpf_get_current_uid_gid() as u32;
        // SAFETY: a helper without arguments.
        let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        (uid, cgroup_id, leader_start_boottime())
    } else {
        (UNOBSERVED_UID, 0, 0)
    };
    match PROCESS_EVENTS.reserve::<ProcessEvent>(0) {
        Some(mut entry) => {
            entry.write(ProcessEvent {
                tgid,
                kind: process_event::FIRST_SAMPLE,
                // SAFETY: a helper without arguments.
                ktime_ns: unsafe { bpf_ktime_get_ns() },
                uid,
                _pad: 0,
                cgroup_id,
                start_boottime_ns,
            });
            entry.submit(0);
            bump(event_counter::SENT);
        }
        None => bump(event_counter::DROPPED),
    }
}

/// [`REUSED_TGID_BIT`] when the group leader of another process with this pid exited in the
/// generation the sample goes to: its samples and this process's would share a key otherwise.
/// The sampler files tagged rows under the newer process's facts.
#[inline(always)]
pub fn reuse_tag(tgid: u32, generation: u32) -> u32 {
    // SAFETY: a lookup whose value is copied at once.
    match unsafe { EXITED_AT.get(&tgid) } {
        Some(&at) if at & 1 == u64::from(generation & 1) => REUSED_TGID_BIT,
        _ => 0,
    }
}

// Raw tracepoints: attached by name, without tracefs (often not mounted in containers).
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn ember_process_exec(_ctx: RawTracePointContext) -> i32 {
    // Runs in the task that exec'd: its next sample is of the new image.
    let Some((tgid, _)) = crate::pidns::current() else {
        return 0;
    };
    let _ = KNOWN_TGIDS.remove(&tgid);
    bump(event_counter::EXECS);
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn ember_process_exit(_ctx: RawTracePointContext) -> i32 {
    // Runs in the exiting task; only the group leader's exit frees the process's entry.
    let Some((tgid, pid)) = crate::pidns::current() else {
        return 0;
    };
    if tgid == pid {
        let _ = KNOWN_TGIDS.remove(&tgid);
        let generation = crate::program::CONTROL.get(0).copied().unwrap_or(0) & 1;
        // SAFETY: a helper without arguments.
        let at = unsafe { bpf_ktime_get_ns() }.wrapping_mul(2) | u64::from(generation & 1);
        let _ = EXITED_AT.insert(&tgid, &at, 0);
    }
    0
}
