//! ember-sampler: the privileged half of ember. Loads the eBPF sampler, then every interval drains
//! the in-kernel counts, reads the facts of newly seen processes and hands batches to the relay.
//! Flags -> [`SamplerConfig`] -> load -> attach -> confine -> drain loop ([`Sampler`]); nothing
//! else lives here.

mod config;
mod drain;
mod harden;
mod ignore;
mod limits;
mod link;
mod load;
mod procevents;
mod procfs;
mod rows;
mod tracker;
mod unwind;

use std::{
    fs::File,
    os::fd::OwnedFd,
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use clap::Parser;
use ember_common::{
    init_logging, install_stop_handlers, parse_duration, raise_nofile_limit, stop_requested,
    LogFormat, ProcStatus,
};
use ember_protocol::{
    decode_relay_message, encode_sampler_message, Hello, IgnoreProcesses, Limits, Losses,
    RelayMessage, SamplerMessage, NO_FD, PROTOCOL_VERSION,
};

use crate::{
    config::{SamplerConfig, Unwind},
    drain::{build_batches_in_two, BatchHeader, Drainer},
    limits::MAX_BATCH_BYTES,
    link::{BatchMark, Event, Link, Outgoing, Target},
    tracker::{state, Tracker},
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
        }
    }
}

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
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
    let sampler = Sampler {
        inherited: inherited.is_some(),
        link: Link::new(target, inherited, config.backlog_max_bytes, relay),
        tracker: Tracker::new(boot_time, max_open_files),
        hello: state(SamplerMessage::Hello(hello), kallsyms.into_iter().collect()),
        loaded,
        drainer: Drainer::new(),
        tables: unwind::Tables::new(unwind_sizes.rows, unwind_sizes.tables),
        ignored: ignore::Ignored::default(),
        probe: ignore::ProcProbe {
            boot_time_unix_ns: boot_time,
        },
        sequence: 0,
        interval_start: now_unix_ns(),
        sent_samples: 0,
        deferral: procevents::Deferral::default(),
        config,
    };
    sampler.drain_loop()
}

/// The parts of interval `sequence` as messages to queue, and their samples.
fn batch_messages(sequence: u64, batches: Vec<ember_protocol::Batch>) -> (Vec<Outgoing>, u64) {
    let mut samples = 0;
    let messages = batches
        .into_iter()
        .map(|batch| {
            let mark = BatchMark {
                sequence,
                samples: batch.sample_count(),
            };
            samples += mark.samples;
            Outgoing {
                bytes: encode_sampler_message(&SamplerMessage::Batch(batch)),
                fds: Vec::new(),
                batch: Some(mark),
            }
        })
        .collect();
    (messages, samples)
}

/// Becomes `--user` (joining the relay's group when `--relay-uid` is set) with only the
/// capabilities the loop needs, under the seccomp filter, and logs what the kernel now says.
/// Returns the relay's uid to check on connect.
fn confine(config: &SamplerConfig, parent: i32) -> anyhow::Result<Option<u32>> {
    let (uid, gid) = resolve_user("--user", &config.user)?;
    if uid == 0 {
        anyhow::bail!(
            "--user {} is root: the sampler leaves uid 0 after attaching; pass an unprivileged \
             user (the default is nobody)",
            config.user
        );
    }
    let (relay, groups) = match &config.relay_user {
        Some(user) => {
            let (relay_uid, relay_gid) = resolve_user("--relay-uid", user)?;
            // The relay's group, to reach its 0660 socket.
            (Some(relay_uid), vec![relay_gid])
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

/// The drain loop's state: every interval, drain the maps, describe new processes, queue the
/// batch parts, and keep the link to the relay going in between.
struct Sampler {
    config: SamplerConfig,
    /// The connection was inherited from `ember-relay record`: never reconnected.
    inherited: bool,
    link: Link,
    tracker: Tracker,
    /// Sent first on every connection, with the kallsyms descriptor.
    hello: Outgoing,
    loaded: load::Loaded,
    drainer: Drainer,
    /// Unwind tables the relay sent and the sampler accepted.
    tables: unwind::Tables,
    /// Processes the relay's filter left out, verified, not sampled (`ignore.rs`).
    ignored: ignore::Ignored,
    probe: ignore::ProcProbe,
    sequence: u64,
    interval_start: u64,
    sent_samples: u64,
    /// Facts of reused pids, held until the older process's rows are queued.
    deferral: procevents::Deferral,
}

/// Longest wait of the drain loop while connected: first-sample events, relay messages, room
/// to send and stop signals (EINTR) all end a wait at once, so a short one only added wake-ups
/// (10 a second were a quarter of the idle sampler's CPU time).
const IDLE_WAIT: Duration = Duration::from_secs(1);

impl Sampler {
    fn drain_loop(mut self) -> anyhow::Result<()> {
        if self.inherited {
            self.link.prepend(vec![self.hello.clone()]);
        }
        let mut next_tick = Instant::now() + self.config.interval;
        let mut last_summary = Instant::now();
        loop {
            let tick = self.wait_for_tick(next_tick);
            self.control();
            if !self.link.is_connected() && self.ignored.len() > 0 {
                // A new relay may filter otherwise: sample everything until it says.
                self.ignored.clear(&mut self.loaded.ignored);
            }
            let Some(finishing) = tick else {
                continue;
            };
            next_tick += self.config.interval;
            if next_tick < Instant::now() {
                next_tick = Instant::now() + self.config.interval;
            }
            let losses = self.interval()?;
            if last_summary.elapsed() >= Duration::from_secs(60) || finishing {
                last_summary = Instant::now();
                self.log_status(&losses);
            }
            if finishing {
                let delivered = self.link.drain_queue(Duration::from_secs(5));
                tracing::info!(delivered, sequence = self.sequence, "stopping");
                return Ok(());
            }
        }
    }

    /// Connects (sending the per-connection state first), sends what is queued and waits at
    /// most [`IDLE_WAIT`] (100 ms while disconnected, for the next connection attempt). `None` while the next interval is not due; `Some(finishing)` when it is,
    /// `finishing` when this is the last one (stop signal, or the inherited connection ended).
    fn wait_for_tick(&mut self, next_tick: Instant) -> Option<bool> {
        if self.link.maybe_connect() == Event::Connected {
            // A table the last relay left half-sent is refused, never continued by this one; the
            // tables it sent are dropped: the new relay accounts for what it sends itself
            // (its fair shares), so the sampler holds nothing it does not know of.
            self.tables.abandon();
            self.tables.drop_all(&mut self.loaded.unwind);
            self.ignored.clear(&mut self.loaded.ignored);
            let mut snapshot = vec![self.hello.clone()];
            snapshot.extend(self.tracker.snapshot());
            self.link.prepend(snapshot);
        }
        self.link.flush();
        let stopping = stop_requested();
        let now = Instant::now();
        let peer_closed = if !stopping && now < next_tick {
            let cap = if self.link.is_connected() {
                IDLE_WAIT
            } else {
                Duration::from_millis(100)
            };
            let wait = (next_tick - now).min(cap);
            let events = Some(self.loaded.events.fd());
            self.link.wait_also(wait, events) == Event::Closed
        } else {
            false
        };
        self.describe_new_processes();
        // An inherited connection is never reconnected: when it closes or breaks, stop.
        let finishing = stopping || (self.inherited && (peer_closed || self.link.ended()));
        (finishing || Instant::now() >= next_tick).then_some(finishing)
    }

    /// One interval: drain, describe new processes, queue the batch parts, then forget exited
    /// processes nothing queued refers to. Returns the losses the batches reported.
    fn interval(&mut self) -> anyhow::Result<Losses> {
        let sequence = self.sequence;
        // Before the drain, so a process that exec'd is described again at its first samples.
        for pid in self.ignored.recheck(&self.probe, &mut self.loaded.ignored) {
            self.tracker.reread(pid);
        }
        let drained = self
            .drainer
            .drain(&mut self.loaded)
            .context("draining the eBPF maps")?;
        let interval_end = now_unix_ns();
        // Processes first sampled up to the flip, so each row finds its process's facts.
        self.describe_new_processes();
        let since = self.drainer.drained_since_ns();
        let events = &self.loaded.events;
        let (drained, newer) = procevents::split_reused(drained, self.deferral.reused(), |pid| {
            events.exited_since(pid, since)
        });
        tracing::debug!(
            reused = ?self.deferral.reused(),
            older_rows = drained.rows.len(),
            newer_rows = newer.rows.len(),
            newer_pids = ?newer.rows.iter().map(|(k, _)| k.tgid).collect::<std::collections::BTreeSet<_>>(),
            "drain split at reused pids"
        );
        for message in self.tracker.observe(&drained, sequence) {
            self.link.enqueue(message);
        }
        let losses = self.losses();
        let header = BatchHeader {
            sequence,
            interval_start_unix_ns: self.interval_start,
            interval_end_unix_ns: interval_end,
            frequency_hz: self.config.frequency_hz,
            losses,
            ignore: self.ignored.stats(Drainer::ignored_samples(&self.loaded)),
        };
        // A reused pid: the older process's rows, then the newer one's facts, then its rows.
        let (older, newer) = build_batches_in_two(&drained, &newer, &header, MAX_BATCH_BYTES);
        let (older, older_samples) = batch_messages(sequence, older);
        let (newer, newer_samples) = batch_messages(sequence, newer);
        for message in self.deferral.interval(older, newer) {
            self.link.enqueue(message);
        }
        let samples = older_samples + newer_samples;
        self.tracker.notice_exits(sequence);
        self.sequence += 1;
        self.interval_start = interval_end;
        self.sent_samples += samples;
        self.link.flush();
        // Also while disconnected, so a relay that stays away cannot make exited processes
        // (and their open files) pile up.
        let notices = self
            .tracker
            .reap(self.link.oldest_queued_sequence(), self.sequence);
        if self.link.is_connected() {
            for message in notices {
                self.link.enqueue(message);
            }
        }
        let files = &self.tracker.files;
        self.tables
            .retain_known(|id| files.has_id(id), &mut self.loaded.unwind);
        self.update_unwind_mappings();
        tracing::debug!(
            sequence,
            samples,
            rows = drained.rows.len(),
            stacks = drained.stacks.len(),
            map_read_errors = drained.read_errors,
            "interval drained"
        );
        Ok(losses)
    }

    /// Reads the facts of the processes the program reported since the last call (their first
    /// samples), at once, and queues them ahead of the batch that will hold those samples.
    fn describe_new_processes(&mut self) {
        for event in self.loaded.events.take() {
            let described = self.tracker.describe_now(event.tgid, self.sequence);
            tracing::debug!(
                pid = event.tgid,
                read = described.read,
                reused = described.reused,
                deferred = described.reused || self.deferral.reused().contains(&event.tgid),
                messages = described.messages.len(),
                "process described at its first sample"
            );
            if described.read {
                self.loaded.events.facts_read(event.ktime_ns);
            }
            // The pid's older process may have samples not yet in a batch: reused facts go after
            // them (`interval`).
            let now = self
                .deferral
                .route(event.tgid, described.reused, described.messages);
            for message in now {
                self.link.enqueue(message);
            }
        }
    }

    /// Acts on what the relay sent: unwind-table chunks (kept only with `--unwind dwarf`) and
    /// table drops. Nothing else the relay says is acted on; anything undecodable is counted.
    fn control(&mut self) {
        let limits = Limits::default();
        for bytes in self.link.take_inbox() {
            match decode_relay_message(&bytes, &limits) {
                Ok(RelayMessage::UnwindTableChunk(chunk))
                    if self.config.unwind == Unwind::Dwarf =>
                {
                    let started = Instant::now();
                    let files = &self.tracker.files;
                    let maps = &mut self.loaded.unwind;
                    if let Some(file_id) = self.tables.chunk(chunk, |id| files.has_id(id), maps) {
                        tracing::debug!(
                            file_id,
                            bytes = self.tables.loaded_bytes(),
                            took_ms = started.elapsed().as_secs_f64() * 1e3,
                            "unwind table loaded"
                        );
                        // Between two tables, not after the whole inbox: a process first
                        // sampled meanwhile may live only a few milliseconds more.
                        self.describe_new_processes();
                    }
                }
                // With --unwind fp the tables are not used: each one is refused once.
                Ok(RelayMessage::UnwindTableChunk(chunk)) => {
                    self.tables.refused += u64::from(chunk.chunk == 0);
                }
                Ok(RelayMessage::DropUnwindTable { file_id }) => {
                    self.tables.drop_table(file_id, &mut self.loaded.unwind);
                }
                Ok(RelayMessage::IgnoreProcesses(message)) => self.ignore_processes(&message),
                Err(err) => {
                    tracing::debug!(%err, "undecodable message from the relay");
                    self.tables
                        .refuse("a message from the relay did not decode");
                }
            }
        }
        self.tables.log_refusals();
    }

    /// Takes the entries of an `ignoreProcesses` that check out (see `ignore.rs`).
    fn ignore_processes(&mut self, message: &IgnoreProcesses) {
        let tracker = &self.tracker;
        let taken = self.ignored.take(
            message,
            |pid| tracker.described(pid),
            &self.probe,
            &mut self.loaded.ignored,
        );
        tracing::debug!(
            accepted = taken.accepted,
            refused = taken.refused,
            forget_all = message.forget_all,
            ignored_processes = self.ignored.len(),
            "the relay's process filter: processes ignored"
        );
    }

    /// Tells the unwinder (`--unwind dwarf`) where changed processes map their files and
    /// forgets exited ones.
    fn update_unwind_mappings(&mut self) {
        let (changed, gone) = self.tracker.take_changes();
        if self.config.unwind != Unwind::Dwarf {
            return;
        }
        for pid in changed {
            if let Some(mappings) = self.tracker.mappings(pid) {
                self.loaded.unwind.set_process(pid, mappings);
            }
        }
        for pid in gone {
            self.loaded.unwind.remove_process(pid);
        }
    }

    /// The kernel's loss counters plus the sampler's own.
    fn losses(&self) -> Losses {
        let mut losses = Drainer::counters(&self.loaded);
        losses.backlog_dropped_batches = self.link.dropped_batches;
        losses.backlog_dropped_samples = self.link.dropped_samples;
        losses.facts_dropped = self.link.dropped_facts;
        losses.proc_errors = self.tracker.errors;
        losses.facts_truncated = self.tracker.truncated;
        losses.files_unopened = self.tracker.files.unopened;
        losses.unwind_tables_loaded = self.tables.accepted;
        losses.unwind_tables_evicted = self.tables.evicted;
        losses.unwind_tables_refused = self.tables.refused + self.link.inbox_refused;
        losses
    }

    fn log_status(&mut self, losses: &Losses) {
        let (events_sent, events_dropped, execs) = self.loaded.events.counters();
        // Since the last status line: how long after a process's first sample its facts were
        // read.
        let latency = self.loaded.events.take_latencies();
        tracing::info!(
            samples = self.sent_samples,
            processes = self.tracker.len(),
            open_files = self.tracker.files.open_count(),
            files_unopened = self.tracker.files.unopened,
            facts_truncated = self.tracker.truncated,
            connected = self.link.is_connected(),
            backlog_bytes = self.link.backlog_bytes(),
            queued = self.link.queued(),
            user_stack_lost = losses.user_stack_lost,
            kernel_stack_lost = losses.kernel_stack_lost,
            counts_full = losses.counts_full,
            backlog_dropped_batches = losses.backlog_dropped_batches,
            unwind_tables_loaded = losses.unwind_tables_loaded,
            unwind_tables_refused = losses.unwind_tables_refused,
            unwind_table_bytes = self.tables.loaded_bytes(),
            unwind_processes_written = self.loaded.unwind.processes_written,
            unwind_mappings_lost = self.loaded.unwind.mappings_lost,
            unwind_stopped = losses.unwind_stopped,
            unwind_cut = losses.unwind_cut,
            unwind_map_full = losses.unwind_map_full,
            ignored_processes = self.ignored.len(),
            ignore_accepted = self.ignored.accepted,
            ignore_refused = self.ignored.refused,
            ignore_released = self.ignored.released,
            unwind_tables_evicted = losses.unwind_tables_evicted,
            unwind_compactions = self.tables.compactions,
            unwind_read_failed = losses.unwind_read_failed,
            unwind_fp_no_table = losses.unwind_fp_no_table,
            process_events = events_sent,
            process_events_dropped = events_dropped,
            process_execs = execs,
            facts_read = latency.count,
            facts_latency_p50_ms = latency.p50_ns as f64 / 1e6,
            facts_latency_p99_ms = latency.p99_ns as f64 / 1e6,
            facts_latency_max_ms = latency.max_ns as f64 / 1e6,
            "sampler status"
        );
    }
}

/// Resolves a user flag (a name or a number) to a uid and its primary gid. A number without a
/// passwd entry is taken as is, with the group of the same number (e.g. a relay run with a
/// dedicated numeric uid in a container).
fn resolve_user(flag: &str, user: &str) -> anyhow::Result<(u32, u32)> {
    let (found, number) = match user.parse::<u32>() {
        Ok(uid) => (
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .with_context(|| format!("looking up uid {uid} for {flag}"))?,
            Some(uid),
        ),
        Err(_) => (
            nix::unistd::User::from_name(user)
                .with_context(|| format!("looking up user {user} for {flag}"))?,
            None,
        ),
    };
    match (found, number) {
        (Some(account), _) => Ok((account.uid.as_raw(), account.gid.as_raw())),
        (None, Some(uid)) => Ok((uid, uid)),
        (None, None) => anyhow::bail!(
            "{flag} {user}: no such user; create it, or pass a numeric uid (its gid is the same number)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_numeric_user_without_passwd_entry_gets_the_same_gid() {
        assert_eq!(
            resolve_user("--user", "4000123").expect("resolves"),
            (4_000_123, 4_000_123)
        );
        assert_eq!(resolve_user("--user", "root").expect("root"), (0, 0));
        assert!(resolve_user("--user", "no-such-user-ember").is_err());
    }
}
