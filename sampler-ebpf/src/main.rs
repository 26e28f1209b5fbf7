//! ember's eBPF program: a perf_event handler on the CPU-clock event that counts samples per
//! (thread, user stack, kernel stack, comm) in kernel maps. See `lib.rs` for the ABI.
//!
//! Invariants: the program never drops a sample silently; each loss increments a `COUNTERS` slot.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod events;
#[cfg(target_arch = "bpf")]
mod interp;
#[cfg(target_arch = "bpf")]
mod offcpu;
#[cfg(target_arch = "bpf")]
mod pidns;
#[cfg(target_arch = "bpf")]
mod window;

#[cfg(target_arch = "bpf")]
mod program {
    use aya_ebpf::{
        bindings::{BPF_F_MMAPABLE, BPF_F_USER_STACK, BPF_NOEXIST},
        helpers::{bpf_get_current_comm, bpf_ktime_get_ns, bpf_loop},
        macros::{map, perf_event},
        maps::{Array, HashMap, PerCpuArray, StackTrace},
        programs::{tracing::StackIdContext as _, PerfEventContext},
    };

    use crate::window::StackWindow;
    use ember_sampler_ebpf::{
        counter, MappingEntry, ProcMappings, SampleKey, UnwindRow, UnwindTableInfo, UserStack,
        COMM_LEN, ERRNO_EFAULT, MAX_DWARF_FRAMES, MAX_IGNORED, MAX_PROC_MAPPINGS,
    };

    /// Set by the loader; 0 samples every process.
    #[no_mangle]
    pub(crate) static TARGET_TGID: u32 = 0;
    /// Set by the loader: 1 walks user stacks with the unwind tables (`--unwind dwarf`).
    #[no_mangle]
    pub(crate) static DWARF: u32 = 0;

    /// Default sizes; the loader overrides them from its flags.
    const COUNTS_ENTRIES: u32 = 16384;
    const STACKS_ENTRIES: u32 = 16384;

    #[map]
    pub(crate) static COUNTS_0: HashMap<SampleKey, u64> =
        HashMap::with_max_entries(COUNTS_ENTRIES, 0);
    #[map]
    pub(crate) static COUNTS_1: HashMap<SampleKey, u64> =
        HashMap::with_max_entries(COUNTS_ENTRIES, 0);
    #[map]
    static STACKS_0: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
    #[map]
    static STACKS_1: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
    /// `CONTROL[0]` counts the sampler's flips; its low bit is the generation (0 or 1) the
    /// program writes to (one value, so a run never sees a generation with another epoch).
    #[map]
    pub(crate) static CONTROL: Array<u32> = Array::with_max_entries(1, 0);
    #[map]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::LEN, 0);
    /// Unwind tables checked by the sampler. Sized by the loader: one entry each
    /// with `--unwind fp`, `--unwind-memory-bytes / 16` rows at most with `--unwind dwarf`.
    /// Memory-mappable: the sampler stores rows with plain writes (`sampler/src/rows.rs`).
    #[map]
    static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, BPF_F_MMAPABLE);
    #[map]
    static UNWIND_TABLES: HashMap<u64, UnwindTableInfo> = HashMap::with_max_entries(1, 0);
    #[map]
    static PROC_MAPPINGS: HashMap<u32, ProcMappings> = HashMap::with_max_entries(1, 0);
    /// Stacks the DWARF unwinder walked, by the hash of their frames, per generation.
    #[map]
    pub(crate) static USTACKS_0: HashMap<u64, UserStack> = HashMap::with_max_entries(1, 0);
    #[map]
    pub(crate) static USTACKS_1: HashMap<u64, UserStack> = HashMap::with_max_entries(1, 0);
    /// Processes not sampled: the relay's process filter, each entry verified by the sampler.
    #[map]
    pub(crate) static IGNORED: HashMap<u32, u8> = HashMap::with_max_entries(MAX_IGNORED, 0);
    /// Per-CPU room to build one stack (too large for the 512-byte BPF stack) and the walk's
    /// state between frames.
    #[map]
    pub(crate) static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

    /// Bisection steps: 2^7 >= MAX_PROC_MAPPINGS mappings, 2^24 rows per table.
    const MAPPING_STEPS: usize = 7;
    const ROW_STEPS: usize = 24;

    /// The registers the unwinder tracks.
    struct Regs {
        pc: u64,
        sp: u64,
        bp: u64,
    }

    enum Step {
        /// Unwound one frame with a table row.
        Dwarf,
        /// Unwound one frame by frame pointer (no table, or a gap row).
        FramePointer,
        /// A stop row with this code (1..=8 as the sampler checked; 1 = the outermost frame).
        Stop(u32),
        /// A read of user memory failed.
        ReadFailed,
        /// rbp 0: the end of a frame-pointer chain.
        ZeroEnd,
    }

    /// Makes the mapping of `procs` that holds `pc` the walk's current one, with what its
    /// table lookup found: a table (`has_table` 1), no table (0), or no mapping at all
    /// (`map_end` 0).
    #[inline(always)]
    fn enter_mapping(walk: &mut WalkState, procs: &ProcMappings, pc: u64) {
        walk.map_start = 0;
        walk.map_end = 0;
        walk.has_table = 0;
        let Some(mapping) = find_mapping(procs, pc) else {
            return;
        };
        walk.map_start = mapping.start;
        walk.map_end = mapping.end;
        let Some(info) = UNWIND_TABLES.get_ptr_mut(&mapping.file_id) else {
            return;
        };
        // SAFETY: a live value of the map for this program run. The sampler replaces or
        // deletes whole entries; a racing write of the tick can only age one table by a tick.
        let info = unsafe { &mut *info };
        // The least recently sampled table is evicted first (sampler/src/unwind.rs).
        if info.last_sampled != walk.tick {
            info.last_sampled = walk.tick;
        }
        // A pc of the mapping is at table offset
        // pc - start + file offset + (p_vaddr - p_offset) - base.
        walk.table_bias = mapping
            .file_offset
            .wrapping_add(info.vaddr_minus_offset as u64)
            .wrapping_sub(info.base)
            .wrapping_sub(mapping.start);
        walk.table_len = info.len;
        walk.first_row = info.first_row;
        walk.rows = info.rows;
        walk.has_table = 1;
    }

    /// The file mapping of the process that holds `pc`.
    #[inline(always)]
    fn find_mapping(procs: &ProcMappings, pc: u64) -> Option<&MappingEntry> {
        let count = (procs.count as usize).min(MAX_PROC_MAPPINGS);
        let (mut lo, mut hi) = (0usize, count);
        for _ in 0..MAPPING_STEPS {
            if lo >= hi {
                break;
            }
            let mid = (lo + hi) / 2;
            if procs.entries.get(mid)?.start <= pc {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let mapping = procs.entries.get(lo.checked_sub(1)?)?;
        if pc >= mapping.end {
            return None;
        }
        Some(mapping)
    }

    /// The row of the current mapping's table covering `pc`, if the table covers it.
    #[inline(always)]
    fn find_in_table(walk: &WalkState, pc: u64) -> Option<UnwindRow> {
        let offset = pc.wrapping_add(walk.table_bias);
        if offset >= u64::from(walk.table_len) {
            return None;
        }
        let offset = offset as u32;
        let (mut lo, mut hi) = (0u32, walk.rows);
        for _ in 0..ROW_STEPS {
            if lo >= hi {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            if UNWIND_ROWS.get(walk.first_row.wrapping_add(mid))?.pc <= offset {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        UNWIND_ROWS
            .get(walk.first_row.wrapping_add(lo.checked_sub(1)?))
            .copied()
    }

    #[inline(always)]
    fn frame_pointer_step(r: &mut Regs, window: &mut StackWindow) -> Step {
        if r.bp == 0 {
            return Step::ZeroEnd;
        }
        let (Some(next_bp), Some(ret)) = (window.read(r.bp), window.read(r.bp.wrapping_add(8)))
        else {
            return Step::ReadFailed;
        };
        r.sp = r.bp.wrapping_add(16);
        r.bp = next_bp;
        r.pc = ret;
        Step::FramePointer
    }

    /// Unwinds one frame by `row` (encoding: relay/src/unwind/row.rs); `None` for a gap row
    /// (no CFI there: the caller steps by frame pointers).
    #[inline(always)]
    fn apply(row: UnwindRow, r: &mut Regs, window: &mut StackWindow) -> Option<Step> {
        let a = row.a as i64 as u64;
        let b = row.b as i64 as u64;
        let cfa = match row.kind {
            1 => r.sp.wrapping_add(a),
            2 => r.bp.wrapping_add(a),
            3 => {
                r.sp.wrapping_add(a)
                    .wrapping_add(if (r.pc & 15) >= b { 8 } else { 0 })
            }
            4 => {
                let sp = r.sp;
                let (Some(new_sp), Some(pc), Some(bp)) = (
                    window.read(sp.wrapping_add(a)),
                    window.read(sp.wrapping_add(a).wrapping_add(8)),
                    window.read(sp.wrapping_add(b)),
                ) else {
                    return Some(Step::ReadFailed);
                };
                r.sp = new_sp;
                r.pc = pc;
                r.bp = bp;
                return Some(Step::Dwarf);
            }
            5 => return Some(Step::Stop(row.a as u32)),
            _ => return None,
        };
        let Some(ret) = window.read(cfa.wrapping_sub(8)) else {
            return Some(Step::ReadFailed);
        };
        if row.kind != 3 && row.flags & 1 != 0 {
            let Some(bp) = window.read(cfa.wrapping_add(b)) else {
                return Some(Step::ReadFailed);
            };
            r.bp = bp;
        }
        r.sp = cfa;
        r.pc = ret;
        Some(Step::Dwarf)
    }

    /// What one frame of the walk hands the next: the registers, and the file mapping the
    /// frame was in with what its table lookup found. Consecutive frames are nearly always in
    /// one file, so the process's mappings and the file's table are looked up once per file
    /// and walk, not per frame.
    ///
    /// Kept in this CPU's `SCRATCH` slot, not on the program's stack: the verifier knows
    /// nothing of a map value's contents, so every iteration of `walk_frame` starts from the
    /// same state and it checks the callback once. On the stack it tracks what each field
    /// holds (a flag's 0 or 1, a bound), the loop's iterations differ, and checking them took
    /// seconds at load.
    ///
    /// A table the sampler replaces during a walk is still used for the rest of that walk (a
    /// few microseconds): at worst that sample's stack is wrong, as a table replaced during
    /// one frame's row search makes it.
    #[repr(C)]
    pub(crate) struct WalkState {
        pc: u64,
        sp: u64,
        bp: u64,
        /// The current mapping, [`map_start`, `map_end`); `map_end` 0: none.
        map_start: u64,
        map_end: u64,
        /// Added to a pc of the current mapping: its offset in the file's table.
        table_bias: u64,
        /// The table: bytes covered, first row in `UNWIND_ROWS`, rows.
        table_len: u32,
        first_row: u32,
        rows: u32,
        /// 1 when the current mapping's file has a table loaded.
        has_table: u32,
        tgid: u32,
        /// 1 once the walk reached its end (anything but the frame cap).
        ended: u32,
        /// This sample's tick (`ember_sampler_ebpf::tick`), stamped on the tables used.
        tick: u32,
        _pad: u32,
    }

    /// One CPU's room for a walk: the stack it builds, the walk's state and its window onto
    /// the stack's memory.
    #[repr(C)]
    pub(crate) struct Scratch {
        stack: UserStack,
        walk: WalkState,
        window: StackWindow,
    }

    /// One frame of the walk, run by `bpf_loop` (a bounded loop the verifier checks once):
    /// records the frame, unwinds it, returns 1 to stop.
    #[inline(never)]
    extern "C" fn walk_frame(index: u64, _ctx: *mut core::ffi::c_void) -> i64 {
        let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
            return 1;
        };
        // SAFETY: this CPU's scratch slot; the programs that use it do not nest on one CPU.
        let Scratch {
            stack,
            walk,
            window,
        } = unsafe { &mut *scratch };
        let i = index as usize;
        if i >= MAX_DWARF_FRAMES {
            return 1;
        }
        stack.frames[i] = walk.pc;
        stack.len = i as u32 + 1;
        let mut r = Regs {
            pc: walk.pc,
            sp: walk.sp,
            bp: walk.bp,
        };
        // A caller's pc is a return address: look up the call instruction before it.
        let lookup = if i == 0 { r.pc } else { r.pc.wrapping_sub(1) };
        if lookup < walk.map_start || lookup >= walk.map_end {
            // SAFETY: a lookup in a map only the sampler writes.
            let Some(procs) = (unsafe { PROC_MAPPINGS.get(&walk.tgid) }) else {
                bump(counter::UNWIND_NO_PROCESS);
                walk.ended = 1;
                return 1;
            };
            enter_mapping(walk, procs, lookup);
        }
        let step = if walk.map_end == 0 {
            bump(counter::UNWIND_FP_NO_MAPPING);
            None
        } else if walk.has_table == 0 {
            bump(counter::UNWIND_FP_NO_TABLE);
            None
        } else {
            let step = find_in_table(walk, lookup).and_then(|row| apply(row, &mut r, window));
            if step.is_none() {
                // The table does not cover the pc, or has a gap row there.
                bump(counter::UNWIND_FP_GAP);
            }
            step
        };
        // One frame-pointer step for every reason above (one copy for the verifier to check).
        let step = match step {
            Some(step) => step,
            None => frame_pointer_step(&mut r, window),
        };
        (walk.pc, walk.sp, walk.bp) = (r.pc, r.sp, r.bp);
        // Each walked stack ends under exactly one reason (or the frame cap, counted by the
        // caller).
        match step {
            Step::Dwarf => stack.dwarf_frames += 1,
            Step::FramePointer => {}
            Step::Stop(code) => {
                if (1..=counter::UNWIND_STOP_CODES).contains(&code) {
                    bump(counter::UNWIND_STOP_CODE + code - 1);
                }
                if code != 1 {
                    bump(counter::UNWIND_STOP);
                }
                walk.ended = 1;
            }
            Step::ReadFailed => {
                bump(counter::UNWIND_READ_FAILED);
                walk.ended = 1;
            }
            Step::ZeroEnd => {
                bump(counter::UNWIND_ZERO_END);
                walk.ended = 1;
            }
        }
        if walk.ended == 0 && walk.pc == 0 {
            bump(counter::UNWIND_ZERO_END);
            walk.ended = 1;
        }
        // The verifier wants a return value it can see is 0 or 1.
        if walk.ended != 0 {
            1
        } else {
            0
        }
    }

    /// Walks the interrupted user stack with the unwind tables (frame pointers where there is
    /// none) and stores it under the hash of its frames. Returns the hash, or 0 when no walk was
    /// possible (interrupted in kernel mode: these registers are the kernel's; no mappings
    /// known; map full): the caller then keeps the frame-pointer stack.
    #[inline(always)]
    fn dwarf_stack(ctx: &PerfEventContext, tgid: u32, ustacks: &HashMap<u64, UserStack>) -> u64 {
        // SAFETY: the perf_event context always points at the sample's registers.
        let regs = unsafe { &(*ctx.ctx).regs };
        let Some(stack) = walk_user(regs, tgid) else {
            return 0;
        };
        let hash = stack_hash(stack);
        // A stack seen before in this generation is already stored: an update would copy it
        // again under the bucket's lock. (Two CPUs racing on a new stack both insert it.)
        if ustacks.get_ptr(&hash).is_some() {
            return hash;
        }
        if ustacks.insert(&hash, stack, 0).is_err() {
            bump(counter::UNWIND_FULL);
            return 0;
        }
        hash
    }

    /// Walks the user stack the registers `regs` describe (a perf sample's, or those a thread
    /// saved when it entered the kernel) into this CPU's `SCRATCH` slot, and returns it; `None`
    /// when no walk was possible (kernel-mode registers, no mappings known).
    #[inline(always)]
    pub(crate) fn walk_user(
        regs: &aya_ebpf::bindings::pt_regs,
        tgid: u32,
    ) -> Option<&'static mut UserStack> {
        if regs.cs & 3 != 3 {
            return None;
        }
        // SAFETY: a lookup in a map only the sampler writes.
        let Some(procs) = (unsafe { PROC_MAPPINGS.get(&tgid) }) else {
            bump(counter::UNWIND_NO_PROCESS);
            return None;
        };
        let scratch = SCRATCH.get_ptr_mut(0)?;
        {
            // SAFETY: this CPU's scratch slot; the programs that use it do not nest on one CPU
            // (perf_event programs, and the off-CPU tracepoint, which runs with interrupts
            // off). The reference ends before `walk_frame` takes its own.
            let Scratch {
                stack,
                walk,
                window,
            } = unsafe { &mut *scratch };
            window.clear();
            stack.len = 0;
            stack.dwarf_frames = 0;
            walk.pc = regs.rip;
            walk.sp = regs.rsp;
            walk.bp = regs.rbp;
            walk.tgid = tgid;
            walk.ended = 0;
            // SAFETY: a helper without arguments.
            walk.tick = ember_sampler_ebpf::tick(unsafe { bpf_ktime_get_ns() });
            // The first frame's mapping, from the lookup just made.
            enter_mapping(walk, procs, regs.rip);
        }
        // SAFETY: `walk_frame` takes no context: its state is in this CPU's `SCRATCH` slot.
        unsafe {
            bpf_loop(
                MAX_DWARF_FRAMES as u32,
                walk_frame as *mut core::ffi::c_void,
                core::ptr::null_mut(),
                0,
            )
        };
        // SAFETY: as above; `walk_frame` is done with the slot.
        let Scratch { stack, walk, .. } = unsafe { &mut *scratch };
        if walk.ended == 0 {
            bump(counter::UNWIND_CUT);
        }
        Some(stack)
    }

    /// The key of a stack in `USTACKS`: a hash of its frames, never 0.
    #[inline(always)]
    pub(crate) fn stack_hash(stack: &UserStack) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for i in 0..MAX_DWARF_FRAMES {
            if i as u32 >= stack.len {
                break;
            }
            hash = (hash ^ stack.frames[i]).wrapping_mul(0x0000_0100_0000_01b3);
            hash ^= hash >> 29;
        }
        hash.max(1)
    }

    #[perf_event]
    pub fn ember_sample(ctx: PerfEventContext) -> u32 {
        sample(&ctx);
        0
    }

    #[inline(always)]
    pub(crate) fn bump(slot: u32) {
        if let Some(ptr) = COUNTERS.get_ptr_mut(slot) {
            // SAFETY: a per-CPU slot is only touched by this CPU, and the program is not reentrant
            // on one CPU for perf_event programs.
            unsafe { *ptr += 1 };
        }
    }

    #[inline(always)]
    fn stack_id(result: Result<core::ffi::c_long, i32>, lost_slot: u32) -> i32 {
        match result {
            Ok(id) => id as i32,
            Err(err) => {
                if err != -ERRNO_EFAULT {
                    bump(lost_slot);
                }
                err
            }
        }
    }

    #[inline(always)]
    fn sample(ctx: &PerfEventContext) {
        bump(counter::SAMPLES);
        if crate::pidns::kernel_ids().1 == 0 {
            bump(counter::IDLE);
            return;
        }
        // Numbered as the sampler's /proc numbers them; a task outside its pid namespace is
        // one it cannot read: counted with the filtered ones.
        let Some((tgid, tid)) = crate::pidns::current() else {
            bump(counter::FILTERED);
            return;
        };
        // SAFETY: a read of a read-only global the loader set before load.
        let target = unsafe { core::ptr::read_volatile(&TARGET_TGID) };
        if target != 0 && target != tgid {
            bump(counter::FILTERED);
            return;
        }
        // SAFETY: a lookup in a map only the sampler writes; the value is not read.
        if unsafe { IGNORED.get(&tgid) }.is_some() {
            bump(counter::IGNORED);
            return;
        }
        crate::events::note(tgid, true);
        let epoch = CONTROL.get(0).copied().unwrap_or(0);
        let generation = epoch & 1;
        let (counts, stacks, ustacks) = if generation == 0 {
            (&COUNTS_0, &STACKS_0, &USTACKS_0)
        } else {
            (&COUNTS_1, &STACKS_1, &USTACKS_1)
        };
        // SAFETY: a read of a read-only global the loader set before load.
        let dwarf = unsafe { core::ptr::read_volatile(&DWARF) } != 0;
        let user_stack_hash = if dwarf {
            dwarf_stack(ctx, tgid, ustacks)
        } else {
            0
        };
        let user_stack_id = if user_stack_hash != 0 {
            0
        } else {
            stack_id(
                ctx.get_stackid(stacks, BPF_F_USER_STACK as u64),
                counter::USER_STACK_LOST,
            )
        };
        // Interrupted in user mode there is no kernel stack: the helper would set up a
        // callchain only to answer -EFAULT.
        // SAFETY: the perf_event context always points at the sample's registers.
        let kernel_stack_id = if unsafe { (*ctx.ctx).regs.cs } & 3 == 3 {
            -ERRNO_EFAULT
        } else {
            stack_id(ctx.get_stackid(stacks, 0), counter::KERNEL_STACK_LOST)
        };
        let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
        let key_tgid = tgid | crate::events::reuse_tag(tgid, generation);
        let interp_stack_hash = crate::interp::walk(tgid, tid, key_tgid, generation, epoch);
        let key = SampleKey {
            tgid: key_tgid,
            tid,
            user_stack_id,
            kernel_stack_id,
            comm,
            user_stack_hash,
            interp_stack_hash,
            kernel_stack_hash: 0,
        };
        // The key holds the thread id and a thread runs on one CPU at a time, so no two CPUs
        // update the same entry at once: a plain increment is exact without atomics.
        if let Some(count) = counts.get_ptr_mut(&key) {
            // SAFETY: the pointer is to a live value of this map, valid for this program run.
            unsafe { *count += 1 };
            return;
        }
        if counts.insert(&key, &1, BPF_NOEXIST as u64).is_err() {
            bump(counter::COUNTS_FULL);
        }
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[link_section = "license"]
    #[no_mangle]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
