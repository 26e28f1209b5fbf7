//! Off-CPU time (`--off-cpu`): how long threads were blocked, and where, aggregated in the
//! same counts map as CPU samples under keys tagged [`OFF_CPU_TID_BIT`], whose value is
//! nanoseconds rather than samples.
//!
//! One program on `tp_btf/sched_switch` (a BTF raw tracepoint: no kprobe, no tracefs), which
//! runs in the context of the thread leaving the CPU (`prev`) and sees the one coming in
//! (`next`) only as a pointer:
//! - `next`'s pending wait, if it has one, ends: its length is weighed (below) and, when kept,
//!   its stacks go into the generation's `USTACKS` map and its weight into the counts;
//! - `prev`, when it blocks (gives the CPU up in a sleeping state: not preempted, not yielding
//!   or rescheduled while runnable, not exiting), has its user stack walked as a CPU sample's is (unwind tables or
//!   frame pointers) and its kernel stack read, both kept with the time in `OFF_CPU_PENDING`.
//!
//! The stacks are walked when the thread leaves: when it comes back the program runs in another
//! thread's context, whose memory is the one user reads see (walking at switch-in, as bcc's
//! offcputime does, needs a probe in the incoming thread's context: `finish_task_switch`,
//! whose fentry the kernels ember was built on refuse; see docs/offcpu.md).
//!
//! Which waits are kept, unbiased: a wait of at least `OFF_CPU_MIN_NS` always, weighed by its
//! length; a shorter wait `d` with probability `d / OFF_CPU_MIN_NS`, weighed `OFF_CPU_MIN_NS`.
//! Each wait's expected weight is its length, so totals are unbiased.
//!
//! The tracepoint runs with interrupts off (the run queue's lock is held), so the per-CPU
//! scratch space the walk shares with the perf_event program is not reentered.

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_task, bpf_get_current_task_btf, bpf_get_prandom_u32,
        bpf_get_stack, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_task_pt_regs,
    },
    macros::{btf_tracepoint, map},
    maps::{LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
    EbpfContext as _,
};
use ember_sampler_ebpf::{
    counter, OffCpuPending, SampleKey, UserStack, COMM_LEN, ERRNO_EFAULT, MAX_DWARF_FRAMES,
    MAX_OFF_CPU_THREADS, OFF_CPU_TID_BIT,
};

use crate::program::{
    bump, stack_hash, walk_user, CONTROL, COUNTS_0, COUNTS_1, DWARF, IGNORED, TARGET_TGID,
    USTACKS_0, USTACKS_1,
};

/// Set by the loader from `--off-cpu-min` (at most `MAX_OFF_CPU_MIN_NS`).
#[no_mangle]
static OFF_CPU_MIN_NS: u64 = 1_000_000;

/// Each blocked thread's pending wait, by its task (the pointer `sched_switch` gives as
/// `next` when it comes back).
#[map]
static OFF_CPU_PENDING: LruHashMap<u64, OffCpuPending> =
    LruHashMap::with_max_entries(MAX_OFF_CPU_THREADS, 0);

/// Per-CPU room to build one pending wait (too large for the 512-byte BPF stack).
#[map]
static OFF_CPU_SCRATCH: PerCpuArray<OffCpuPending> = PerCpuArray::with_max_entries(1, 0);

/// `TASK_DEAD` in `prev_state`: the thread is exiting, it will not come back.
const TASK_DEAD: u64 = 0x80;
/// Kernel frames left out at the leaf (`BPF_F_SKIP_FIELD_MASK`): the program's own and
/// `bpf_trace_run4`'s, so the stack starts in `__schedule`.
const KERNEL_SKIP: u64 = 2;
/// "No space": the stack map was full when the wait's stack was stored (a lost stack).
const ERRNO_ENOSPC: i32 = 28;

#[btf_tracepoint(function = "sched_switch")]
pub fn ember_offcpu_switch(ctx: BtfTracePointContext) -> u32 {
    // sched_switch(bool preempt, struct task_struct *prev, *next, unsigned int prev_state).
    let preempt: u64 = ctx.arg(0);
    let next: u64 = ctx.arg(2);
    let prev_state: u64 = ctx.arg(3);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    switch_in(next, now);
    // Blocked: it gave the CPU up (not preempted) in a sleeping state (not TASK_RUNNING: a
    // yield or a reschedule on the way back to user space leaves it runnable), not exiting.
    if preempt & 0xff == 0 && prev_state != 0 && prev_state & TASK_DEAD == 0 {
        switch_out(&ctx, now);
    }
    0
}

/// Ends `next`'s pending wait, if it has one: weighs it and, when kept, adds it to the counts.
#[inline(always)]
fn switch_in(next: u64, now: u64) {
    let Some(pending) = OFF_CPU_PENDING.get_ptr_mut(&next) else {
        return;
    };
    // SAFETY: a live value of this program's own map, valid for this run; entries are only
    // written by this program, on one CPU at a time per task.
    let pending = unsafe { &mut *pending };
    let wait = now.saturating_sub(pending.start);
    // SAFETY: a read of a read-only global the loader set before load.
    let min = unsafe { core::ptr::read_volatile(&OFF_CPU_MIN_NS) };
    // SAFETY: a helper without arguments.
    let draw = unsafe { bpf_get_prandom_u32() };
    let weight = if wait >= min {
        wait
    } else if (u64::from(draw) * min) >> 32 < wait {
        // Kept with probability wait / min (min <= 1e9 < 2^32: the product fits).
        min
    } else {
        bump(counter::OFF_CPU_SAMPLED_OUT);
        let _ = OFF_CPU_PENDING.remove(&next);
        return;
    };
    let tgid = pending.tgid;
    // The switch runs in the context of the task leaving the CPU, not this one.
    crate::events::note(tgid, false);
    let epoch = CONTROL.get(0).copied().unwrap_or(0);
    let generation = epoch & 1;
    let (counts, ustacks) = if generation == 0 {
        (&COUNTS_0, &USTACKS_0)
    } else {
        (&COUNTS_1, &USTACKS_1)
    };
    let store = |hash: u64, stack: &UserStack| -> (i32, u64) {
        if hash == 0 {
            return (-ERRNO_EFAULT, 0);
        }
        if ustacks.insert(&hash, stack, 0).is_err() {
            bump(counter::UNWIND_FULL);
            return (-ERRNO_ENOSPC, 0);
        }
        (0, hash)
    };
    let (user_stack_id, user_stack_hash) = store(pending.user_hash, &pending.user);
    let (kernel_stack_id, kernel_stack_hash) = store(pending.kernel_hash, &pending.kernel);
    let key = SampleKey {
        tgid: tgid | crate::events::reuse_tag(tgid, generation),
        tid: pending.tid | OFF_CPU_TID_BIT,
        user_stack_id,
        kernel_stack_id,
        comm: pending.comm,
        user_stack_hash,
        interp_stack_hash: 0,
        kernel_stack_hash,
    };
    let _ = OFF_CPU_PENDING.remove(&next);
    bump(counter::OFF_CPU_KEPT);
    // A thread runs on one CPU at a time and the key holds its id: a plain add is exact.
    if let Some(total) = counts.get_ptr_mut(&key) {
        // SAFETY: the pointer is to a live value of this map, valid for this program run.
        unsafe { *total += weight };
        return;
    }
    if counts.insert(&key, &weight, BPF_NOEXIST as u64).is_err() {
        bump(counter::OFF_CPU_COUNTS_FULL);
    }
}

/// Starts the current thread's wait: the time, who it is, its user and kernel stacks.
#[inline(always)]
fn switch_out(ctx: &BtfTracePointContext, now: u64) {
    if crate::pidns::kernel_ids().1 == 0 {
        return;
    }
    // Numbered in the sampler's pid namespace, like CPU samples; a task outside it is not ours.
    let Some((tgid, tid)) = crate::pidns::current() else {
        return;
    };
    // SAFETY: a read of a read-only global the loader set before load.
    let target = unsafe { core::ptr::read_volatile(&TARGET_TGID) };
    // SAFETY: a lookup in a map only the sampler writes; the value is not read.
    if (target != 0 && target != tgid) || unsafe { IGNORED.get(&tgid) }.is_some() {
        return;
    }
    let Some(pending) = OFF_CPU_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's scratch slot; the tracepoint runs with interrupts off.
    let pending = unsafe { &mut *pending };
    pending.start = now;
    pending.tgid = tgid;
    pending.tid = tid;
    pending.comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    pending.user.len = 0;
    pending.user.dwarf_frames = 0;
    // SAFETY: a read of a read-only global the loader set before load.
    let dwarf = unsafe { core::ptr::read_volatile(&DWARF) } != 0;
    let mut walked = false;
    if dwarf {
        // The registers the thread saved on entering the kernel: where it is in user space.
        // SAFETY: helpers on the current task, which tracing programs may call; the read is
        // checked.
        let regs = unsafe {
            let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
            bpf_probe_read_kernel(regs)
        };
        if let Some(stack) = regs.ok().and_then(|regs| walk_user(&regs, tgid)) {
            let len = (stack.len as usize).min(MAX_DWARF_FRAMES);
            for i in 0..MAX_DWARF_FRAMES {
                if i >= len {
                    break;
                }
                pending.user.frames[i] = stack.frames[i];
            }
            pending.user.len = len as u32;
            pending.user.dwarf_frames = stack.dwarf_frames;
            walked = true;
        }
    }
    if !walked {
        pending.user.len = read_stack(ctx, &mut pending.user, BPF_F_USER_STACK as u64);
    }
    // The two innermost kernel frames are this program's and the tracepoint's runner.
    pending.kernel.len = read_stack(ctx, &mut pending.kernel, KERNEL_SKIP);
    pending.kernel.dwarf_frames = 0;
    pending.user_hash = if pending.user.len > 0 {
        stack_hash(&pending.user)
    } else {
        0
    };
    pending.kernel_hash = if pending.kernel.len > 0 {
        stack_hash(&pending.kernel)
    } else {
        0
    };
    // SAFETY: a helper without arguments; the pointer is only a key.
    let task = unsafe { bpf_get_current_task() };
    // An LRU: a full map evicts the longest-blocked thread's wait (that wait is not counted).
    let _ = OFF_CPU_PENDING.insert(&task, pending, 0);
}

/// Reads the current thread's user (`BPF_F_USER_STACK`) or kernel stack into `stack.frames`
/// by frame pointers / the kernel's unwinder; returns the frames read (0: none).
#[inline(always)]
fn read_stack(ctx: &BtfTracePointContext, stack: &mut UserStack, flags: u64) -> u32 {
    // SAFETY: the buffer is the whole `frames` array of a map value, its size passed.
    let read = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            stack.frames.as_mut_ptr().cast(),
            (MAX_DWARF_FRAMES * 8) as u32,
            flags,
        )
    };
    if read <= 0 {
        return 0;
    }
    (read as u32 / 8).min(MAX_DWARF_FRAMES as u32)
}
