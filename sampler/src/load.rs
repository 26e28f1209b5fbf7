//! Loads ember's eBPF program and attaches it to a CPU-clock perf event on every online CPU.
//!
//! Needs CAP_BPF + CAP_PERFMON (or root) while it runs; nothing after it does.

use anyhow::{anyhow, Context as _};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, StackTraceMap},
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent,
    },
    util::online_cpus,
    Ebpf, EbpfLoader,
};
use ember_sampler_ebpf::{maps, SampleKey, TARGET_TGID_GLOBAL};

use crate::config::SamplerConfig;

/// The loaded program and the maps the drain loop uses. Dropping it detaches everything.
pub struct Loaded {
    /// Keeps the program and its perf links alive.
    _ebpf: Ebpf,
    pub counts: [HashMap<MapData, SampleKey, u64>; 2],
    pub stacks: [StackTraceMap<MapData>; 2],
    pub control: Array<MapData, u32>,
    pub counters: PerCpuArray<MapData, u64>,
    pub cpus: usize,
}

/// The eBPF object built by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember-ebpf"));

pub fn load_and_attach(config: &SamplerConfig) -> anyhow::Result<Loaded> {
    let mut loader = EbpfLoader::new();
    loader.override_global(TARGET_TGID_GLOBAL, &config.target_pid, true);
    for name in maps::COUNTS {
        loader.map_max_entries(name, config.counts_map_size);
    }
    for name in maps::STACKS {
        loader.map_max_entries(name, config.stack_map_size);
    }
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
    let control = Array::try_from(take(maps::CONTROL)?)?;
    let counters = PerCpuArray::try_from(take(maps::COUNTERS)?)?;
    Ok(Loaded {
        _ebpf: ebpf,
        counts,
        stacks,
        control,
        counters,
        cpus: cpus.len(),
    })
}
