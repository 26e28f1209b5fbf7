//! Loads ember's eBPF program and attaches it to a CPU-clock perf event on every online CPU.
//!
//! Needs CAP_BPF + CAP_PERFMON (or root) while it runs; nothing after it does.

use anyhow::{anyhow, Context as _};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, RawTracePoint,
    },
    util::online_cpus,
    Ebpf, EbpfLoader,
};
use ember_protocol::Mapping;
use ember_sampler_ebpf::{
    maps, programs, MappingEntry, ProcMappings, SampleKey, UnwindRow, UnwindTableInfo, UserStack,
    DWARF_GLOBAL, MAX_PROC_MAPPINGS, TARGET_TGID_GLOBAL,
};

use crate::{
    config::{SamplerConfig, Unwind},
    procevents::ProcessEvents,
    unwind::TableMaps,
};

/// Most unwind tables loaded at once (`--unwind dwarf`).
const MAX_UNWIND_TABLES: u32 = 16384;
/// Most processes whose mappings the unwinder knows (`--unwind dwarf`): 2 KiB each, 8 MiB in all.
const MAX_UNWIND_PROCESSES: u32 = 4096;

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
    /// First samples of processes, as they happen (`procevents.rs`).
    pub events: ProcessEvents,
    pub cpus: usize,
}

/// The unwind-table maps: rows, and per file where its rows are.
pub struct UnwindMaps {
    rows: Array<MapData, UnwindRow>,
    tables: HashMap<MapData, u64, UnwindTableInfo>,
    procs: HashMap<MapData, u32, ProcMappings>,
    /// Rows the row array holds.
    pub capacity_rows: u32,
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

    fn remove_info(&mut self, file_id: u64) {
        // Absent is fine: the table was never fully written.
        let _ = self.tables.remove(&file_id);
    }
}

/// Sizes the maps from the flags; returns the rows of the unwind row array. Kernel memory for
/// the DWARF unwinder (rows, tables, process mappings, walked stacks) is allocated at load, so
/// with `--unwind fp` each of its maps gets one entry.
fn size_maps(loader: &mut EbpfLoader<'_>, config: &SamplerConfig) -> u32 {
    for name in maps::COUNTS {
        loader.map_max_entries(name, config.counts_map_size);
    }
    for name in maps::STACKS {
        loader.map_max_entries(name, config.stack_map_size);
    }
    let (rows, tables, processes, stacks) = match config.unwind {
        Unwind::Fp => (1, 1, 1, 1),
        Unwind::Dwarf => (
            u32::try_from(config.unwind_memory_bytes / size_of::<UnwindRow>())
                .unwrap_or(u32::MAX)
                .max(1),
            MAX_UNWIND_TABLES,
            MAX_UNWIND_PROCESSES,
            config.stack_map_size,
        ),
    };
    for name in maps::USTACKS {
        loader.map_max_entries(name, stacks);
    }
    loader.map_max_entries(maps::UNWIND_ROWS, rows);
    loader.map_max_entries(maps::UNWIND_TABLES, tables);
    loader.map_max_entries(maps::PROC_MAPPINGS, processes);
    rows
}

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember-ebpf"));

pub fn load_and_attach(config: &SamplerConfig) -> anyhow::Result<Loaded> {
    let mut loader = EbpfLoader::new();
    loader.override_global(TARGET_TGID_GLOBAL, &config.target_pid, true);
    let dwarf = u32::from(config.unwind == Unwind::Dwarf);
    loader.override_global(DWARF_GLOBAL, &dwarf, true);
    let rows = size_maps(&mut loader, config);
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
    let unwind = UnwindMaps {
        rows: Array::try_from(take(maps::UNWIND_ROWS)?)?,
        tables: HashMap::try_from(take(maps::UNWIND_TABLES)?)?,
        procs: HashMap::try_from(take(maps::PROC_MAPPINGS)?)?,
        capacity_rows: rows,
        mappings_lost: 0,
        processes_written: 0,
    };
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
        events,
        cpus: cpus.len(),
    })
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
