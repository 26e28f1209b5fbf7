//! Loads ember's eBPF program and attaches it to a CPU-clock perf event on every online CPU.
//!
//! Needs CAP_BPF + CAP_PERFMON (or root) while it runs, and uses CAP_SYS_ADMIN where it has it
//! to keep the loader off the kernel's BTF ([`hide_kernel_btf`]); nothing after it does.

use std::os::fd::AsFd as _;

use anyhow::{anyhow, Context as _};
use aya::{
    maps::{Array, HashMap, IterableMap as _, Map, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        BtfTracePoint, PerfEvent, RawTracePoint,
    },
    util::online_cpus,
    Btf, Ebpf, EbpfLoader,
};
use ember_protocol::Mapping;
use ember_sampler_ebpf::{
    maps, programs, InterpCode, InterpCodeKey, InterpProc, InterpStack, MappingEntry, ProcMappings,
    SampleKey, UnwindRow, UnwindTableInfo, UserStack, DWARF_GLOBAL, MAX_PROC_MAPPINGS,
    OFF_CPU_MIN_GLOBAL, PIDNS_DEV_GLOBAL, PIDNS_INO_GLOBAL, TARGET_TGID_GLOBAL,
    TASK_GROUP_LEADER_GLOBAL, TASK_START_BOOTTIME_GLOBAL,
};

use crate::{
    config::{SamplerConfig, Unwind},
    procevents::ProcessEvents,
    rows::MappedRows,
    unwind::TableMaps,
};

/// Most unwind tables loaded at once (`--unwind dwarf`).
const MAX_UNWIND_TABLES: u32 = 16384;
/// Most processes whose mappings the unwinder knows (`--unwind dwarf`).
const MAX_UNWIND_PROCESSES: u32 = 4096;
/// The kernel's per-entry overhead of a preallocated hash map (`struct htab_elem`, rounded up).
const HASH_ENTRY_OVERHEAD: u64 = 48;

/// Entries of the DWARF unwinder's maps, all sized from one byte budget
/// (`--unwind-memory-bytes`): 1/16 for each generation's walked stacks (at most
/// `--stack-map-size`), 1/16 for process mappings, 1/64 for table entries, the rest rows.
/// Array values are rounded up to 8 bytes by the kernel (a 12-byte row costs 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindSizes {
    pub rows: u32,
    pub tables: u32,
    pub processes: u32,
    /// Per generation.
    pub walked_stacks: u32,
}

impl UnwindSizes {
    /// Bytes of one entry of each map, as the kernel allocates them.
    const ROW: u64 = size_of::<UnwindRow>().next_multiple_of(8) as u64;
    const TABLE: u64 = HASH_ENTRY_OVERHEAD + 8 + size_of::<UnwindTableInfo>() as u64;
    const PROCESS: u64 = HASH_ENTRY_OVERHEAD + 8 + size_of::<ProcMappings>() as u64;
    const STACK: u64 = HASH_ENTRY_OVERHEAD + 8 + size_of::<UserStack>() as u64;

    /// The sizes for a budget of `bytes`; small budgets get small minimums (which may exceed
    /// them by a few hundred KiB).
    pub fn from_budget(bytes: u64, stack_map_size: u32) -> Self {
        let part = |share: u64, each: u64, min: u64, max: u64| -> u32 {
            let n = (bytes / share / each).clamp(min, max.max(min));
            u32::try_from(n).unwrap_or(u32::MAX)
        };
        let walked_stacks = part(16, Self::STACK, 64, u64::from(stack_map_size));
        let processes = part(16, Self::PROCESS, 16, u64::from(MAX_UNWIND_PROCESSES));
        let tables = part(64, Self::TABLE, 16, u64::from(MAX_UNWIND_TABLES));
        let others = 2 * u64::from(walked_stacks) * Self::STACK
            + u64::from(processes) * Self::PROCESS
            + u64::from(tables) * Self::TABLE;
        let rows =
            u32::try_from((bytes.saturating_sub(others) / Self::ROW).max(1)).unwrap_or(u32::MAX);
        Self {
            rows,
            tables,
            processes,
            walked_stacks,
        }
    }

    /// Kernel memory of the four maps (rows, tables, processes, two generations of stacks).
    pub fn bytes(&self) -> u64 {
        u64::from(self.rows) * Self::ROW
            + u64::from(self.tables) * Self::TABLE
            + u64::from(self.processes) * Self::PROCESS
            + 2 * u64::from(self.walked_stacks) * Self::STACK
    }

    /// One entry each: `--unwind fp` allocates nothing for the unwinder.
    const NONE: Self = Self {
        rows: 1,
        tables: 1,
        processes: 1,
        walked_stacks: 1,
    };
}

/// The loaded program and the maps the drain loop uses. Dropping it detaches everything.
pub struct Loaded {
    /// Keeps the program and its perf links alive.
    _ebpf: Ebpf,
    pub counts: [HashMap<MapData, SampleKey, u64>; 2],
    pub stacks: [StackTraceMap<MapData>; 2],
    /// Stacks walked by the DWARF unwinder, by hash (one entry each with `--unwind fp`).
    pub ustacks: [HashMap<MapData, u64, UserStack>; 2],
    pub control: Array<MapData, u32>,
    pub counters: PerCpuArray<MapData, u64>,
    /// Processes the program does not sample (see `ignore.rs`).
    pub ignored: HashMap<MapData, u32, u8>,
    pub unwind: UnwindMaps,
    /// Interpreters the program walks (`interp.rs`).
    pub interp_procs: HashMap<MapData, u32, InterpProc>,
    /// Interpreter stacks by hash, and code objects copied, per generation.
    pub interp_stacks: [HashMap<MapData, u64, InterpStack>; 2],
    pub interp_codes: [HashMap<MapData, InterpCodeKey, InterpCode>; 2],
    /// First samples of processes, as they happen (`procevents.rs`).
    pub events: ProcessEvents,
    pub cpus: usize,
}

/// The unwind-table maps: rows, and per file where its rows are.
pub struct UnwindMaps {
    rows: Array<MapData, UnwindRow>,
    /// Writes the rows through mappings of the array (`rows.rs`); `None` if it cannot be
    /// mapped: then each row is one map update.
    mapped: Option<MappedRows>,
    tables: HashMap<MapData, u64, UnwindTableInfo>,
    procs: HashMap<MapData, u32, ProcMappings>,
    /// Entries of each map.
    pub sizes: UnwindSizes,
    /// Process mappings the map refused (full) or left out (over [`MAX_PROC_MAPPINGS`]).
    pub mappings_lost: u64,
    /// Processes whose mappings were written, since start.
    pub processes_written: u64,
}

impl UnwindMaps {
    /// Tells the unwinder where `pid`'s executable files are mapped (file mappings only, the
    /// first [`MAX_PROC_MAPPINGS`] by address; the rest unwind by frame pointers).
    pub fn set_process(&mut self, pid: u32, mappings: &[Mapping]) {
        let mut value = ProcMappings {
            count: 0,
            _pad: 0,
            entries: [MappingEntry::default(); MAX_PROC_MAPPINGS],
        };
        let files = mappings.iter().filter(|m| m.file_id != 0);
        for (slot, m) in value.entries.iter_mut().zip(files.clone()) {
            *slot = MappingEntry {
                start: m.start,
                end: m.end,
                file_offset: m.file_offset,
                file_id: m.file_id,
            };
            value.count += 1;
        }
        let left_out = files.count().saturating_sub(MAX_PROC_MAPPINGS);
        self.mappings_lost += left_out as u64;
        match self.procs.insert(pid, value, 0) {
            Ok(()) => self.processes_written += 1,
            Err(_) => self.mappings_lost += 1,
        }
    }

    /// Forgets an exited process.
    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }
}

impl TableMaps for UnwindMaps {
    fn write_rows(&mut self, first: u32, rows: &[UnwindRow]) -> Result<(), String> {
        if let Some(mapped) = &self.mapped {
            return mapped.write(self.rows.map().fd().as_fd(), first, rows);
        }
        for (index, row) in (first..).zip(rows) {
            self.rows
                .set(index, row, 0)
                .map_err(|err| err.to_string())?;
        }
        Ok(())
    }

    fn set_info(&mut self, file_id: u64, info: UnwindTableInfo) -> Result<(), String> {
        self.tables
            .insert(file_id, info, 0)
            .map_err(|err| err.to_string())
    }

    fn move_table(&mut self, file_id: u64, from: u32, to: u32, count: u32) -> Result<(), String> {
        let mut info = self
            .tables
            .get(&file_id, 0)
            .map_err(|err| format!("the table entry to move: {err}"))?;
        // Hidden while its rows move; `to < from`, and each part is read whole before it is
        // written, so no row is overwritten before it was copied.
        self.remove_info(file_id);
        let part = crate::unwind::ROWS_PER_WRITE as u32;
        for offset in (0..count).step_by(part as usize) {
            let n = part.min(count - offset);
            let rows = match &self.mapped {
                Some(mapped) => mapped.read(self.rows.map().fd().as_fd(), from + offset, n)?,
                None => (from + offset..from + offset + n)
                    .map(|i| self.rows.get(&i, 0).map_err(|err| err.to_string()))
                    .collect::<Result<Vec<_>, _>>()?,
            };
            self.write_rows(to + offset, &rows)?;
        }
        info.first_row = to;
        self.set_info(file_id, info)
    }

    fn remove_info(&mut self, file_id: u64) {
        // Absent is fine: the table was never fully written.
        let _ = self.tables.remove(&file_id);
    }

    fn last_sampled(&self, file_id: u64) -> Option<u32> {
        self.tables
            .get(&file_id, 0)
            .ok()
            .map(|info| info.last_sampled)
    }

    fn now_tick(&self) -> u32 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into the valid, owned `ts` (vDSO, no
        // syscall). CLOCK_MONOTONIC is bpf_ktime_get_ns's clock; it cannot fail.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let now = u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(ts.tv_nsec).unwrap_or(0);
        ember_sampler_ebpf::tick(now)
    }
}

/// Sizes the maps from the flags; returns the unwinder's sizes. Kernel memory for the DWARF
/// unwinder (rows, tables, process mappings, walked stacks) is allocated at load, so with
/// `--unwind fp` each of its maps gets one entry.
fn size_maps(loader: &mut EbpfLoader<'_>, config: &SamplerConfig) -> UnwindSizes {
    // Off-CPU rows share the counts maps (their keys are tagged): twice the room for them.
    let counts = if config.off_cpu_min_ns.is_some() {
        config.counts_map_size.saturating_mul(2)
    } else {
        config.counts_map_size
    };
    for name in maps::COUNTS {
        loader.map_max_entries(name, counts);
    }
    if config.off_cpu_min_ns.is_none() {
        loader.map_max_entries(maps::OFF_CPU_PENDING, 1);
    }
    for name in maps::STACKS {
        loader.map_max_entries(name, config.stack_map_size);
    }
    let sizes = match config.unwind {
        Unwind::Fp => UnwindSizes::NONE,
        Unwind::Dwarf => {
            let budget = u64::try_from(config.unwind_memory_bytes).unwrap_or(u64::MAX);
            let sizes = UnwindSizes::from_budget(budget, config.stack_map_size);
            tracing::info!(
                budget_bytes = budget,
                kernel_bytes = sizes.bytes(),
                rows = sizes.rows,
                tables = sizes.tables,
                processes = sizes.processes,
                walked_stacks_per_generation = sizes.walked_stacks,
                "unwind maps sized from --unwind-memory-bytes"
            );
            sizes
        }
    };
    // Off-CPU waits store their user and kernel stacks there too (`--off-cpu`): room for
    // half a stack map more of them, whichever way CPU samples are walked.
    let off_cpu_stacks = if config.off_cpu_min_ns.is_some() {
        config.stack_map_size / 2
    } else {
        0
    };
    for name in maps::USTACKS {
        loader.map_max_entries(name, sizes.walked_stacks.saturating_add(off_cpu_stacks));
    }
    loader.map_max_entries(maps::UNWIND_ROWS, sizes.rows);
    loader.map_max_entries(maps::UNWIND_TABLES, sizes.tables);
    loader.map_max_entries(maps::PROC_MAPPINGS, sizes.processes);
    sizes
}

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember-ebpf"));

pub fn load_and_attach(config: &SamplerConfig) -> anyhow::Result<Loaded> {
    // The off-CPU program attaches by BTF (tp_btf): the kernel's BTF is read for it.
    let kernel_btf = match config.off_cpu_min_ns {
        Some(_) => Some(Btf::from_sys_fs().context(
            "--off-cpu needs the kernel's BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF)",
        )?),
        None => None,
    };
    // Before the BTF is hidden from aya below.
    let task = task_offsets();
    hide_kernel_btf();
    let mut loader = EbpfLoader::new();
    loader.override_global(TASK_GROUP_LEADER_GLOBAL, &task.group_leader, true);
    loader.override_global(TASK_START_BOOTTIME_GLOBAL, &task.start_boottime, true);
    if let Some(min) = &config.off_cpu_min_ns {
        loader.override_global(OFF_CPU_MIN_GLOBAL, min, true);
    }
    loader.override_global(TARGET_TGID_GLOBAL, &config.target_pid, true);
    let dwarf = u32::from(config.unwind == Unwind::Dwarf);
    loader.override_global(DWARF_GLOBAL, &dwarf, true);
    // In a pid namespace of its own, the program numbers tasks as this /proc does and drops
    // (counts as filtered) those outside it.
    let (pidns_dev, pidns_ino) = crate::pidns::own()?.unwrap_or((0, 0));
    if pidns_ino != 0 {
        tracing::info!(
            pidns_dev,
            pidns_ino,
            "in a pid namespace of its own: sampling only its tasks (Linux >= 5.7)"
        );
    }
    loader.override_global(PIDNS_DEV_GLOBAL, &pidns_dev, true);
    loader.override_global(PIDNS_INO_GLOBAL, &pidns_ino, true);
    let sizes = size_maps(&mut loader, config);
    let mut ebpf = loader.load(EBPF_OBJECT).context(
        "loading the eBPF program failed; ember-sampler needs root (or CAP_BPF + CAP_PERFMON) \
         and a kernel with BPF stack-trace maps (Linux >= 5.8)",
    )?;

    let program: &mut PerfEvent = ebpf
        .program_mut("ember_sample")
        .ok_or_else(|| anyhow!("program `ember_sample` missing from the eBPF object"))?
        .try_into()?;
    program
        .load()
        .context("the kernel verifier rejected `ember_sample`")?;
    let cpus = online_cpus().map_err(|(path, err)| anyhow!("reading {path}: {err}"))?;
    for &cpu in &cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(u64::from(config.frequency_hz)),
                false,
            )
            .with_context(|| format!("attaching the CPU-clock perf event on CPU {cpu}"))?;
    }

    attach_process_tracepoints(&mut ebpf);
    if let (Some(btf), Some(min)) = (&kernel_btf, config.off_cpu_min_ns) {
        attach_off_cpu(&mut ebpf, btf, min)?;
    }
    drop(kernel_btf);

    let mut take = |name: &str| {
        ebpf.take_map(name)
            .ok_or_else(|| anyhow!("map `{name}` missing from the eBPF object"))
    };
    let counts = [
        HashMap::try_from(take(maps::COUNTS[0])?)?,
        HashMap::try_from(take(maps::COUNTS[1])?)?,
    ];
    let stacks = [
        StackTraceMap::try_from(take(maps::STACKS[0])?)?,
        StackTraceMap::try_from(take(maps::STACKS[1])?)?,
    ];
    let ustacks = [
        HashMap::try_from(take(maps::USTACKS[0])?)?,
        HashMap::try_from(take(maps::USTACKS[1])?)?,
    ];
    let control = Array::try_from(take(maps::CONTROL)?)?;
    let counters = PerCpuArray::try_from(take(maps::COUNTERS)?)?;
    let ignored = HashMap::try_from(take(maps::IGNORED)?)?;
    let rows = take(maps::UNWIND_ROWS)?;
    let mapped = map_rows(&rows, sizes.rows);
    let unwind = UnwindMaps {
        rows: Array::try_from(rows)?,
        mapped,
        tables: HashMap::try_from(take(maps::UNWIND_TABLES)?)?,
        procs: HashMap::try_from(take(maps::PROC_MAPPINGS)?)?,
        sizes,
        mappings_lost: 0,
        processes_written: 0,
    };
    let interp_procs = HashMap::try_from(take(maps::INTERP_PROCS)?)?;
    let interp_stacks = [
        HashMap::try_from(take(maps::INTERP_STACKS[0])?)?,
        HashMap::try_from(take(maps::INTERP_STACKS[1])?)?,
    ];
    let interp_codes = [
        HashMap::try_from(take(maps::INTERP_CODES[0])?)?,
        HashMap::try_from(take(maps::INTERP_CODES[1])?)?,
    ];
    let events = ProcessEvents::new(
        RingBuf::try_from(take(maps::PROCESS_EVENTS)?)?,
        PerCpuArray::try_from(take(maps::PROCESS_EVENT_COUNTERS)?)?,
        HashMap::try_from(take(maps::EXITED_AT)?)?,
    );
    Ok(Loaded {
        _ebpf: ebpf,
        counts,
        stacks,
        ustacks,
        control,
        counters,
        ignored,
        unwind,
        interp_procs,
        interp_stacks,
        interp_codes,
        events,
        cpus: cpus.len(),
    })
}

/// Where `task_struct.group_leader` and `.start_boottime` lie (see [`crate::btf`]), so that the
/// program reads a process's start time at its first sample; both 0 (the program then reads
/// none, and the sampler reads /proc/PID/stat) when the kernel's BTF is not there (the systemd
/// unit covers it) or does not have them.
fn task_offsets() -> crate::btf::TaskOffsets {
    match crate::btf::task_offsets() {
        Ok(offsets) => {
            tracing::info!(
                group_leader = offsets.group_leader,
                start_boottime = offsets.start_boottime,
                "task_struct offsets from the kernel's BTF: start times from the first-sample event"
            );
            offsets
        }
        Err(err) => {
            tracing::info!(
                err = %anyhow::Error::from(err),
                "no task_struct offsets: start times from /proc/PID/stat"
            );
            crate::btf::TaskOffsets {
                group_leader: 0,
                start_boottime: 0,
            }
        }
    }
}

/// Where the kernel publishes its own BTF; aya 0.14's `EbpfLoader::new()` reads and parses it.
const KERNEL_BTF_DIR: &str = "/sys/kernel/btf";

/// Keeps aya from parsing the kernel's BTF, which ember's program does not use (it has no CO-RE
/// relocations; a test checks) but which `EbpfLoader::new()` reads and parses anyway: 5 MiB of
/// file and 17 MiB of heap at once, three quarters of the sampler's peak memory. With
/// CAP_SYS_ADMIN (`ember-relay record`, a root shell) the sampler enters a mount namespace of its
/// own, a follower of the host's, and covers the directory with an empty read-only tmpfs: the
/// parse then fails at once and the loader goes on without BTF. Without it (the systemd unit,
/// which covers the directory itself, and containers) the parse happens as before.
fn hide_kernel_btf() {
    use nix::{
        mount::{mount, MsFlags},
        sched::{unshare, CloneFlags},
    };
    if !std::path::Path::new(KERNEL_BTF_DIR)
        .join("vmlinux")
        .exists()
    {
        return;
    }
    let hidden = unshare(CloneFlags::CLONE_NEWNS)
        .and_then(|()| {
            // A follower: mounts made here must not reach the host's namespace.
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_SLAVE,
                None::<&str>,
            )
        })
        .and_then(|()| {
            mount(
                Some("none"),
                KERNEL_BTF_DIR,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=0555"),
            )
        });
    match hidden {
        Ok(()) => tracing::debug!(dir = KERNEL_BTF_DIR, "kernel BTF hidden from the loader"),
        Err(err) => tracing::info!(
            dir = KERNEL_BTF_DIR,
            %err,
            "the loader parses the kernel's BTF (about 17 MiB more peak memory while loading): \
             without CAP_SYS_ADMIN the sampler cannot cover it itself; an empty tmpfs on the \
             directory (systemd: TemporaryFileSystem=/sys/kernel/btf:ro) avoids it"
        ),
    }
}

/// Checks that the row array can be mapped into memory (see `rows.rs`); on failure (logged)
/// rows are written one map update each, which holds the drain loop for seconds on a large
/// table.
fn map_rows(rows: &Map, entries: u32) -> Option<MappedRows> {
    let mapped = match rows {
        Map::Array(data) => MappedRows::map(data.fd().as_fd(), entries),
        _ => Err(std::io::Error::other("UNWIND_ROWS is not an array map")),
    };
    mapped
        .inspect_err(|err| {
            tracing::warn!(
                %err,
                "cannot map the unwind row array into memory; tables are written one row per                  system call (slow for large binaries)"
            );
        })
        .ok()
}

/// Attaches the exec and exit tracepoints (raw: by name, no tracefs needed) that keep the
/// program's set of reported processes right. Without them (no tracefs, an old kernel) sampling goes on: an exec'd process is then
/// described at its next drain, as before, and a failure is logged.
fn attach_process_tracepoints(ebpf: &mut Ebpf) {
    for (name, event) in [
        (programs::EXEC, "sched_process_exec"),
        (programs::EXIT, "sched_process_exit"),
    ] {
        let attached = (|| -> anyhow::Result<()> {
            let program: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("program `{name}` missing from the eBPF object"))?
                .try_into()?;
            program.load()?;
            program.attach(event)?;
            Ok(())
        })();
        if let Err(err) = attached {
            tracing::warn!(
                program = name,
                tracepoint = event,
                error = %format!("{err:#}"),
                "cannot attach a process tracepoint; exec'd and reused processes are described \
                 at their next drain instead of at once"
            );
        }
    }
}

/// Loads and attaches the off-CPU program (`--off-cpu`) on `tp_btf/sched_switch`. A failure
/// fails the start: the user asked for off-CPU profiles.
fn attach_off_cpu(ebpf: &mut Ebpf, btf: &Btf, min_ns: u64) -> anyhow::Result<()> {
    let hint = "--off-cpu needs Linux >= 5.18 with BTF (CONFIG_DEBUG_INFO_BTF: tp_btf, \
                bpf_task_pt_regs, sched_switch's prev_state); run without --off-cpu on older \
                kernels";
    let name = programs::OFF_CPU_SWITCH;
    let program: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program `{name}` missing from the eBPF object"))?
        .try_into()?;
    program
        .load("sched_switch", btf)
        .with_context(|| format!("loading tp_btf/sched_switch; {hint}"))?;
    program
        .attach()
        .with_context(|| format!("attaching tp_btf/sched_switch; {hint}"))?;
    tracing::info!(
        min_ns,
        "off-CPU program attached (tp_btf/sched_switch): waits of at least min_ns kept whole, \
         shorter ones sampled and weighed"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_needs_no_kernel_btf() {
        // Given the eBPF object the sampler loads, Then it has no CO-RE relocations: loading
        // without the kernel's BTF (hide_kernel_btf) would leave them unapplied, silently.
        let object = aya_obj::Object::parse(EBPF_OBJECT).expect("the built eBPF object parses");
        // The check means something only where relocations would be recorded.
        assert!(
            object.btf_ext.is_some(),
            "the eBPF object lost its .BTF.ext section"
        );
        assert!(
            !object.has_btf_relocations(),
            "the eBPF program now has CO-RE relocations: stop hiding /sys/kernel/btf in load.rs"
        );
    }

    #[test]
    fn the_unwinder_maps_fit_the_budget() {
        // Given the default budget, Then all four maps fit it and the rows get most of it.
        let budget = 64 << 20;
        let sizes = UnwindSizes::from_budget(budget, 16384);
        assert!(
            sizes.bytes() <= budget,
            "{sizes:?}: {} bytes",
            sizes.bytes()
        );
        assert!(
            sizes.bytes() > budget - (1 << 20),
            "budget left unused: {sizes:?}"
        );
        assert!(u64::from(sizes.rows) * 16 > budget * 3 / 4, "{sizes:?}");
        assert_eq!(sizes.processes, 1985);
        // A tiny budget still gets a working minimum.
        let tiny = UnwindSizes::from_budget(4096, 16384);
        assert_eq!((tiny.rows, tiny.tables, tiny.walked_stacks), (1, 16, 64));
    }
}
