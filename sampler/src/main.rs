//! ember-sampler: the privileged half of ember. Loads the eBPF sampler, then every interval drains
//! the in-kernel counts, reads the facts of newly seen processes and hands batches to the relay.
//! Flags -> [`SamplerConfig`] -> load -> attach -> confine -> drain loop ([`DrainLoop`], in
//! `drain_loop.rs`); nothing else lives here.

mod btf;
mod bulk;
mod cgroups;
mod clock;
mod config;
mod drain;
mod drain_loop;
mod harden;
mod ignore;
mod interp;
mod limits;
mod link;
mod load;
mod perfmap;
mod pidns;
mod procevents;
mod procfs;
mod rows;
mod tracker;
mod unwind;
mod waitset;

use std::{fs::File, os::fd::OwnedFd, path::PathBuf, rc::Rc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use ember_common::{
    init_logging, install_stop_handlers, parse_duration, raise_nofile_limit, resolve_account,
    Account, LogFormat, ProcStatus,
};
use ember_protocol::{Hello, SamplerMessage, NO_FD, PROTOCOL_VERSION};

use crate::{
    config::{SamplerConfig, Unwind},
    drain_loop::DrainLoop,
    link::{Link, Target},
    tracker::{state, Tracker},
    waitset::WaitSet,
};

/// ember's privileged eBPF sampler. Samples every CPU with a CPU-clock perf event, aggregates
/// stacks in the kernel and sends them, with the facts only a privileged process can read
/// (mappings, open binaries, /proc/kallsyms), to ember-relay over a Unix socket.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Samples per second on each CPU.
    #[arg(short = 'F', long, visible_alias = "samples-per-second", default_value_t = SamplerConfig::default().frequency_hz,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    frequency: u32,
    /// How often to drain the kernel maps and send a batch, e.g. 5s, 500ms, 1m.
    #[arg(long, visible_alias = "interval", default_value = "5s", value_parser = parse_duration)]
    reporter_interval: Duration,
    /// Unix socket where ember-relay listens.
    #[arg(long, default_value = "/run/ember/ember.sock", env = "EMBER_SOCKET")]
    socket: PathBuf,
    /// Use this already connected socket (set by `ember-relay record`); exits when it closes.
    #[arg(long, value_name = "FD", conflicts_with = "socket")]
    fd: Option<i32>,
    /// Sample only this process (default: every process).
    #[arg(long)]
    pid: Option<u32>,
    /// Entries in each in-kernel counts map; samples beyond it are dropped and counted.
    #[arg(long, default_value_t = SamplerConfig::default().counts_map_size)]
    counts_map_size: u32,
    /// Entries in each stack-trace map; collisions lose a stack (counted), never the sample.
    #[arg(long, default_value_t = SamplerConfig::default().stack_map_size)]
    stack_map_size: u32,
    /// Most bytes of batches kept while the relay is unreachable; the oldest go first, counted.
    #[arg(long, default_value_t = SamplerConfig::default().backlog_max_bytes)]
    backlog_max_bytes: usize,
    /// The relay's user (name or uid). The sampler joins its group (to reach a 0660 socket) and
    /// refuses a relay whose SO_PEERCRED uid differs. Without it any listener on --socket is
    /// trusted.
    #[arg(long, value_name = "USER|UID", env = "EMBER_RELAY_UID")]
    relay_uid: Option<String>,
    /// The user (name or uid) the sampler becomes once the program is attached; it keeps only
    /// the capabilities to read /proc and open mapped files. A uid without a passwd entry is
    /// used with the group of the same number.
    #[arg(long, value_name = "USER|UID", env = "EMBER_SAMPLER_USER", default_value_t = SamplerConfig::default().user)]
    user: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "EMBER_LOG_FORMAT")]
    log_format: LogFormat,
    /// How user stacks are walked: `dwarf` (the default: unwind tables the relay compiles from
    /// .eh_frame, checked by the sampler, which refuses bad ones, counted; frame pointers for
    /// code without a table; needs Linux >= 5.17) or `fp` (frame pointers only, no unwinder
    /// memory). Use the same value as the relay.
    #[arg(long, value_enum, default_value_t = SamplerConfig::default().unwind)]
    unwind: Unwind,
    /// Kernel memory for all of the DWARF unwinder's maps (rows, tables, process mappings,
    /// walked stacks), sized from it at start (the sizes are logged). When the rows are full,
    /// the least recently sampled binary's table is evicted (counted); its frames fall back to
    /// frame pointers.
    #[arg(long, default_value_t = SamplerConfig::default().unwind_memory_bytes)]
    unwind_memory_bytes: usize,
    /// Forward each process's command line (/proc/PID/cmdline, at most 4 KiB, cuts counted) to
    /// the relay as `process.command_line`. Off by default: arguments can hold secrets, and
    /// this side decides what leaves it.
    #[arg(long)]
    command_line: bool,
    /// Also record off-CPU time: where threads block and for how long (docs/offcpu.md).
    /// Waits of at least --off-cpu-min are kept whole; shorter ones are kept with probability
    /// wait / min and weighed min, so totals stay unbiased. Needs Linux >= 5.18 with BTF
    /// (tp_btf/sched_switch).
    #[arg(long)]
    off_cpu: bool,
    /// The minimum off-CPU wait kept whole (see --off-cpu), e.g. 1ms, 200us; at most 1s.
    #[arg(long, default_value = "1ms", value_parser = ember_common::parse_off_cpu_min)]
    off_cpu_min: Duration,
}

impl Cli {
    fn into_config(self) -> SamplerConfig {
        SamplerConfig {
            frequency_hz: self.frequency,
            interval: self.reporter_interval,
            socket: self.socket,
            inherited_fd: self.fd,
            target_pid: self.pid.unwrap_or(0),
            counts_map_size: self.counts_map_size,
            stack_map_size: self.stack_map_size,
            backlog_max_bytes: self.backlog_max_bytes,
            relay_user: self.relay_uid,
            user: self.user,
            unwind: self.unwind,
            unwind_memory_bytes: self.unwind_memory_bytes,
            command_line: self.command_line,
            off_cpu_min_ns: self.off_cpu.then(|| {
                u64::try_from(self.off_cpu_min.as_nanos())
                    .unwrap_or(u64::MAX)
                    .min(ember_sampler_ebpf::MAX_OFF_CPU_MIN_NS)
            }),
        }
    }
}

fn main() {
    keep_large_buffers_apart();
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if let Err(err) = run(cli.into_config()) {
        tracing::error!("{err:#}");
        std::process::exit(1);
    }
}

/// glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed: after the
/// kernel BTF aya parses at load is freed, unwind tables (MiBs each) were assembled in the heap,
/// and the heap kept the pages after they were freed (29 MiB of RssAnon, for good). Fixed at
/// its default, large buffers keep their own mappings, returned to the kernel when freed.
fn keep_large_buffers_apart() {
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10) };
}

/// Set-up while privileged (kallsyms, load, attach), confinement, then the drain loop.
fn run(config: SamplerConfig) -> anyhow::Result<()> {
    // Under `ember-relay record`, the process that started us and must outlive us.
    let parent = nix::unistd::getppid().as_raw();
    install_stop_handlers()?;
    // One descriptor is kept per mapped binary.
    raise_nofile_limit();
    // Read now: getrlimit (prlimit64) is not on the seccomp allowlist.
    let max_open_files = procfs::open_files_cap();
    // Opened while privileged: the kernel shows real addresses to whoever holds this descriptor.
    let kallsyms: Option<Rc<OwnedFd>> = match File::open("/proc/kallsyms") {
        Ok(file) => Some(Rc::new(OwnedFd::from(file))),
        Err(err) => {
            tracing::warn!(%err, "cannot open /proc/kallsyms; kernel frames will be unnamed");
            None
        }
    };
    let loaded = load::load_and_attach(&config)?;
    let boot_time = procfs::boot_time_unix_ns();
    procfs::forward_command_lines(config.command_line);
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Before the seccomp filter, which leaves out epoll_create1.
    let wait_set = WaitSet::new().context("creating the drain loop's epoll set")?;
    let relay = confine(&config, parent)?;
    tracing::info!(
        cpus = loaded.cpus,
        frequency_hz = config.frequency_hz,
        interval = ?config.interval,
        target_pid = config.target_pid,
        "sampling"
    );
    let (target, inherited) = match config.inherited_fd {
        // SAFETY: `--fd` names the socket `ember-relay record` passed to this process for it alone.
        Some(fd) => (Target::Inherited, Some(unsafe { Link::inherit(fd) })),
        None => (Target::Path(config.socket.clone()), None),
    };
    let unwind_sizes = loaded.unwind.sizes;
    let dwarf = config.unwind == Unwind::Dwarf;
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        sampler_version: env!("CARGO_PKG_VERSION").to_owned(),
        hostname,
        frequency_hz: config.frequency_hz,
        kallsyms_fd: if kallsyms.is_some() { 0 } else { NO_FD },
        target_pid: config.target_pid,
        unwind_rows: if dwarf { unwind_sizes.rows } else { 0 },
        unwind_tables: if dwarf { unwind_sizes.tables } else { 0 },
    };
    let link = Link::new(target, inherited, config.backlog_max_bytes, relay, wait_set);
    let hello = state(SamplerMessage::Hello(hello), kallsyms.into_iter().collect());
    let tracker = Tracker::new(boot_time, max_open_files);
    DrainLoop::new(config, loaded, link, hello, tracker, boot_time).run()
}

/// Becomes `--user` (joining the relay's group when `--relay-uid` is set) with only the
/// capabilities the loop needs, under the seccomp filter, and logs what the kernel now says.
/// Returns the relay's uid to check on connect.
fn confine(config: &SamplerConfig, parent: i32) -> anyhow::Result<Option<u32>> {
    let Account { uid, gid, .. } = resolve_account("--user", &config.user)?;
    if uid == 0 {
        anyhow::bail!(
            "--user {} is root: the sampler leaves uid 0 after attaching; pass an unprivileged \
             user (the default is nobody)",
            config.user
        );
    }
    let (relay, groups) = match &config.relay_user {
        Some(user) => {
            let relay = resolve_account("--relay-uid", user)?;
            // The relay's group, to reach its 0660 socket.
            (Some(relay.uid), vec![relay.gid])
        }
        None => {
            if config.inherited_fd.is_none() {
                tracing::warn!(
                    "no --relay-uid: any process listening on the socket receives the samples"
                );
            }
            (None, Vec::new())
        }
    };
    let mode = if config.inherited_fd.is_some() {
        harden::Mode::Inherited
    } else {
        harden::Mode::Reconnecting
    };
    let parent = (mode == harden::Mode::Inherited).then_some(parent);
    harden::harden(&harden::Identity { uid, gid, groups }, mode, parent)
        .context("confining the sampler")?;
    let status = ProcStatus::read_self();
    tracing::info!(
        uid,
        gid,
        cap_eff = %status.field("CapEff"),
        cap_bnd = %status.field("CapBnd"),
        no_new_privs = %status.field("NoNewPrivs"),
        seccomp = %status.field("Seccomp"),
        allowed_syscalls = harden::allowed_count(mode),
        "sampler confined"
    );
    Ok(relay)
}
