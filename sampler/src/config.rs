//! The sampler's settings: command-line flags only (no config file is parsed as root).

use std::{path::PathBuf, time::Duration};

/// Everything the sampler needs to know, with the defaults `--help` shows.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    pub frequency_hz: u32,
    pub interval: Duration,
    pub socket: PathBuf,
    /// An already connected socket inherited from `ember-relay record`.
    pub inherited_fd: Option<i32>,
    pub target_pid: u32,
    pub counts_map_size: u32,
    pub stack_map_size: u32,
    pub backlog_max_bytes: usize,
    /// The relay's user; checked against SO_PEERCRED.
    pub relay_user: Option<String>,
    /// The user the sampler becomes after setup (name or uid).
    pub user: String,
    /// How user stacks are walked.
    pub unwind: Unwind,
    /// Kernel memory for all the DWARF unwinder's maps (`--unwind dwarf`).
    pub unwind_memory_bytes: usize,
    /// `--command-line`: forward each process's command line (off: it can hold secrets).
    pub command_line: bool,
    /// `--off-cpu-min`: record off-CPU time (blocked threads) with this minimum wait in
    /// nanoseconds; `None` loads no off-CPU program.
    pub off_cpu_min_ns: Option<u64>,
}

/// How user stacks are walked (`--unwind`, the relay's flag of the same name).
pub use ember_common::UnwindMode as Unwind;

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            frequency_hz: 97,
            interval: Duration::from_secs(5),
            socket: PathBuf::from("/run/ember/ember.sock"),
            inherited_fd: None,
            target_pid: 0,
            counts_map_size: 16384,
            stack_map_size: 16384,
            backlog_max_bytes: 64 << 20,
            relay_user: None,
            user: "nobody".to_owned(),
            unwind: Unwind::Dwarf,
            unwind_memory_bytes: 64 << 20,
            command_line: false,
            off_cpu_min_ns: None,
        }
    }
}
