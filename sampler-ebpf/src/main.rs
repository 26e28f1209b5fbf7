//! ember's eBPF program: a perf_event handler on the CPU-clock event that counts samples per
//! (thread, user stack, kernel stack, comm) in kernel maps. See `lib.rs` for the ABI.
//!
//! Invariants: the program never drops a sample silently; each loss increments a `COUNTERS` slot.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod program {
    use aya_ebpf::{
        bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
        helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
        macros::{map, perf_event},
        maps::{Array, HashMap, PerCpuArray, StackTrace},
        programs::{tracing::StackIdContext as _, PerfEventContext},
    };
    use ember_sampler_ebpf::{
        counter, ProcMappings, SampleKey, UnwindRow, UnwindTableInfo, COMM_LEN, ERRNO_EFAULT,
    };

    /// Set by the loader; 0 samples every process.
    #[no_mangle]
    static TARGET_TGID: u32 = 0;

    /// Default sizes; the loader overrides them from its flags.
    const COUNTS_ENTRIES: u32 = 16384;
    const STACKS_ENTRIES: u32 = 16384;

    #[map]
    static COUNTS_0: HashMap<SampleKey, u64> = HashMap::with_max_entries(COUNTS_ENTRIES, 0);
    #[map]
    static COUNTS_1: HashMap<SampleKey, u64> = HashMap::with_max_entries(COUNTS_ENTRIES, 0);
    #[map]
    static STACKS_0: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
    #[map]
    static STACKS_1: StackTrace = StackTrace::with_max_entries(STACKS_ENTRIES, 0);
    /// `CONTROL[0]` is the generation (0 or 1) the program writes to.
    #[map]
    static CONTROL: Array<u32> = Array::with_max_entries(1, 0);
    #[map]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::LEN, 0);
    /// Unwind tables checked by the sampler (issue 10). Sized by the loader: one entry each
    /// with `--unwind fp`, `--unwind-memory-bytes / 12` rows with `--unwind dwarf`. Not walked
    /// yet: the in-kernel unwinder is the next step.
    #[map]
    static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1, 0);
    #[map]
    static UNWIND_TABLES: HashMap<u64, UnwindTableInfo> = HashMap::with_max_entries(1, 0);
    #[map]
    static PROC_MAPPINGS: HashMap<u32, ProcMappings> = HashMap::with_max_entries(1, 0);

    #[perf_event]
    pub fn ember_sample(ctx: PerfEventContext) -> u32 {
        sample(&ctx);
        0
    }

    #[inline(always)]
    fn bump(slot: u32) {
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
        let pid_tgid = bpf_get_current_pid_tgid();
        let tgid = (pid_tgid >> 32) as u32;
        let tid = pid_tgid as u32;
        if tid == 0 {
            bump(counter::IDLE);
            return;
        }
        // SAFETY: a read of a read-only global the loader set before load.
        let target = unsafe { core::ptr::read_volatile(&TARGET_TGID) };
        if target != 0 && target != tgid {
            bump(counter::FILTERED);
            return;
        }
        let generation = CONTROL.get(0).copied().unwrap_or(0);
        let (counts, stacks) = if generation == 0 {
            (&COUNTS_0, &STACKS_0)
        } else {
            (&COUNTS_1, &STACKS_1)
        };
        let user_stack_id = stack_id(
            ctx.get_stackid(stacks, BPF_F_USER_STACK as u64),
            counter::USER_STACK_LOST,
        );
        let kernel_stack_id = stack_id(ctx.get_stackid(stacks, 0), counter::KERNEL_STACK_LOST);
        let comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
        let key = SampleKey {
            tgid,
            tid,
            user_stack_id,
            kernel_stack_id,
            comm,
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
