//! The relay's pipeline: takes source events in order and keeps one [`Session`] per sampler
//! connection. A batch goes through the stages in order: the session symbolizes it into a
//! [`SymbolizedProfile`] (samples keyed by thread, no labels), then the labels stage files each
//! process's samples under its resource labels into the current interval's [`LabeledProfile`],
//! which the driver takes for the sinks when a batch completes its interval. Symbolizer state is
//! not `Send` (blazesym resolvers), which is why all of it lives on the driver's thread.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    os::fd::OwnedFd,
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant},
};

use ember_protocol::{Batch, Losses, SamplerMessage};

use crate::{
    interp::publish::InterpPublisher,
    jit::JitStats,
    labels::{
        labeled::LabeledProfile,
        pushdown::IgnoreSender,
        stage::{LabelStage, LabelStats},
    },
    metrics::RelayStats,
    model::SymbolizedProfile,
    session::{FileLimits, Session, SymbolStats},
    source::{ConnectionId, SourceEvent},
    symbolize::{sigbus, ElfCache},
    unwind::{
        budget::{Budget, BudgetCounters},
        sender::{lock, Job, TableSender},
    },
};

/// Resolvers unused this long are closed.
const RESOLVER_IDLE: Duration = Duration::from_secs(120);

/// Resolvers of files no process maps any more (the sampler closed them) are closed once unused
/// this long: a program started again within it (a build running the same compiler over and
/// over) keeps its parsed tables.
const RESOLVER_UNREFERENCED: Duration = Duration::from_secs(10);

/// How often at most freed heap memory is handed back to the kernel (`malloc_trim`).
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// What one handled event amounted to, for callers that report progress.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) enum Handled {
    #[default]
    Nothing,
    /// A batch part was symbolized into the profile; `last_part` when it completed its interval.
    Batch { samples: u64, last_part: bool },
    /// A connection ended.
    Closed,
}

#[derive(Default)]
pub(crate) struct Pipeline {
    sessions: HashMap<ConnectionId, Session>,
    cache: ElfCache,
    /// The batch being handled, symbolized (emptied and refilled at every batch).
    symbolized: SymbolizedProfile,
    /// Samples symbolized and labelled since the last [`Pipeline::take_interval`].
    interval: LabeledProfile,
    /// An interval the sinks are done with, emptied, to be the next one ([`Pipeline::recycle`]).
    spare: Option<LabeledProfile>,
    /// The most rows an interval held lately, decaying by a sixteenth an interval: a spare
    /// with room for far more is not kept.
    interval_rows_peak: usize,
    /// Samples symbolized since start.
    samples: u64,
    /// Samples the sampler could not deliver, from its latest loss report.
    last_losses: Losses,
    /// `processMappings` messages that continued no known process (ignored).
    orphan_mappings_messages: u64,
    /// `--max-copy-bytes` / `--max-open-files`, see [`Pipeline::set_file_limits`].
    limits: FileLimits,
    /// The SIGBUS guard's repair count when the pipeline last looked.
    sigbus_seen: u64,
    /// Resource labels per process, relabeling, the process filter.
    labels: LabelStage,
    /// The labels stage's counters when last logged.
    labels_logged: LabelStats,
    /// With `--unwind dwarf`: the worker that compiles passed files and sends their tables.
    unwind: Option<TableSender>,
    /// Each connection's sending side, kept only with `unwind` (dropped when it closes).
    controls: HashMap<ConnectionId, Arc<OwnedFd>>,
    /// Each connection's account of its sampler's unwind budget (from its hello, with `unwind`).
    budgets: HashMap<ConnectionId, Arc<Mutex<Budget>>>,
    /// The budgets' counters, over all connections.
    budget_counters: Arc<BudgetCounters>,
    /// Sends the processes the process filter left out to their sampler (`labels::pushdown`).
    ignore: IgnoreSender,
    /// Describes the interpreters of described processes to their sampler, for the kernel to
    /// walk their frames (`interp::publish`).
    interp: InterpPublisher,
    /// Totals for the metrics that outlive the sessions they come from.
    totals: Totals,
    /// When freed heap memory was last handed back (see [`Pipeline::trim`]).
    trimmed: Option<Instant>,
    /// A large release since then (a window, a large binary's parsed tables).
    trim_due: bool,
}

/// What the pipeline counts for the metrics alone (see [`Pipeline::stats`]).
#[derive(Default)]
struct Totals {
    connections: u64,
    connections_total: u64,
    batches: u64,
    symbolized: u64,
    filtered: u64,
    frames: u64,
    unknown_frames: u64,
    without_process: u64,
    /// JIT frames named and left unnamed, and what the JIT stores read and skipped.
    jit_frames_named: u64,
    jit_frames_unnamed: u64,
    jit: JitStats,
    last_batch: Option<Instant>,
    interval: Duration,
}

impl Totals {
    /// Adds a symbolized batch: `samples` in it, `filtered` of them left out, the session's
    /// symbolization and JIT counters `before` and `after` it.
    fn count_batch(
        &mut self,
        batch: &Batch,
        samples: u64,
        filtered: u64,
        before: (&SymbolStats, &JitStats),
        after: (&SymbolStats, &JitStats),
    ) {
        let ((before, jit_before), (after, jit_after)) = (before, after);
        self.jit_frames_named += after.jit_frames_named - before.jit_frames_named;
        self.jit_frames_unnamed += after.jit_frames_unnamed - before.jit_frames_unnamed;
        self.jit.add_since(jit_before, jit_after);
        self.batches += 1;
        self.filtered += filtered;
        self.symbolized += samples.saturating_sub(filtered);
        self.frames += after.frames - before.frames;
        self.unknown_frames += after.unknown_frames - before.unknown_frames;
        self.without_process +=
            after.samples_without_process_facts - before.samples_without_process_facts;
        self.last_batch = Some(Instant::now());
        self.interval = Duration::from_nanos(
            batch
                .interval_end_unix_ns
                .saturating_sub(batch.interval_start_unix_ns),
        );
    }
}

/// The sampler's counters the `batch received` line logs under their own keys (scripts and
/// alerts read them: the samples and the samples lost); every other counter that is not zero
/// goes into its `losses` field.
const LOGGED_APART: [&str; 6] = [
    "sampler_samples",
    "user_stack_lost",
    "kernel_stack_lost",
    "counts_full",
    "backlog_dropped_batches",
    "backlog_dropped_samples",
];

/// The `losses` field of the `batch received` line: `key=value` of every counter not zero and
/// not logged apart, in the protocol's order, separated by spaces.
fn other_losses(losses: &Losses) -> String {
    let mut text = String::new();
    for (counter, value) in losses.counters() {
        if value == 0 || LOGGED_APART.contains(&counter.log) {
            continue;
        }
        if !text.is_empty() {
            text.push(' ');
        }
        // (writing to a String cannot fail)
        let _ = write!(text, "{}={value}", counter.log);
    }
    text
}

/// The `batch received` line: the part, what the session holds, and the sampler's counters.
fn log_batch(conn: ConnectionId, batch: &Batch, samples: u64, session: &Session, ignore_sent: u64) {
    let losses = &batch.losses;
    let (python, python_codes, python_cached) = session.python_stats();
    let jit_held = session.jit.size();
    tracing::info!(
        connection = conn,
        sequence = batch.sequence,
        part = batch.part,
        parts = batch.parts,
        interval_start_unix_ns = batch.interval_start_unix_ns,
        interval_end_unix_ns = batch.interval_end_unix_ns,
        samples,
        processes = session.process_count(),
        files = session.file_count(),
        unknown_frames = session.stats.unknown_frames,
        frames = session.stats.frames,
        files_closed = session.stats.files_closed,
        files_swept = session.stats.files_swept,
        mappings_omitted = session.stats.mappings_omitted,
        python_frames = python.frames,
        python_unknown_code = python.unknown_code,
        python_mismatched_stacks = python.mismatched_stacks,
        python_codes_cached = python_cached,
        python_codes_evicted = python_codes.evicted,
        jit_frames_named = session.stats.jit_frames_named,
        jit_frames_unnamed = session.stats.jit_frames_unnamed,
        jit_maps = session.jit.stats.maps,
        jit_maps_refused = session.jit.stats.maps_refused,
        jit_entries = session.jit.stats.entries,
        jit_ranges_held = jit_held.0,
        jit_bytes_held = jit_held.1,
        jit_evicted = session.jit.stats.evicted,
        jit_garbage_lines = session.jit.stats.garbage_lines,
        jit_long_lines = session.jit.stats.long_lines,
        jit_read_errors = session.jit.stats.read_errors,
        jit_read_capped = session.jit.stats.read_capped,
        jit_bytes_read = session.jit.stats.bytes_read,
        sampler_samples = losses.samples,
        user_stack_lost = losses.user_stack_lost,
        kernel_stack_lost = losses.kernel_stack_lost,
        counts_full = losses.counts_full,
        backlog_dropped_batches = losses.backlog_dropped_batches,
        backlog_dropped_samples = losses.backlog_dropped_samples,
        losses = other_losses(losses).as_str(),
        ignored_samples = batch.ignore.ignored_samples,
        ignore_refused = batch.ignore.refused,
        ignored_processes = batch.ignore.processes,
        ignore_sent,
        interp_stacks = batch.interp_stacks.len(),
        interp_codes = batch.interp_codes.len(),
        interp_samples = batch
            .rows
            .iter()
            .filter(|row| row.interp_stack.is_some())
            .fold(0u64, |n, row| n.saturating_add(row.count)),
        "batch received"
    );
    // What the kernel copied, raw (B's naming stage decodes it): printable bytes of each code
    // object's name, for `-v` debugging and the end-to-end test.
    if tracing::enabled!(tracing::Level::DEBUG) {
        for code in &batch.interp_codes {
            tracing::debug!(
                connection = conn,
                pid = code.pid,
                code = format_args!("{:#x}", code.code),
                first_line = code.first_line,
                name_bytes = %printable(&code.name),
                filename_bytes = code.filename.len(),
                linetable_bytes = code.linetable.len(),
                "interpreter code object received"
            );
        }
    }
}

/// Bytes as text: printable ASCII kept, anything else a `.`.
fn printable(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        })
        .collect()
}

impl Pipeline {
    pub fn new() -> Self {
        Self::default()
    }

    /// `--interpreters off`: tells no sampler where an interpreter's frames are, so the kernel
    /// walks none (native stacks only, as before interpreters were walked).
    pub fn without_interpreters(&mut self) {
        self.interp.off = true;
    }

    /// Samples symbolized since start.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The sampler's latest loss report (totals since it started).
    pub fn last_losses(&self) -> Losses {
        self.last_losses
    }

    /// Totals since start and what the pipeline holds now, for the metrics.
    pub fn stats(&self) -> RelayStats {
        let t = &self.totals;
        let sessions = self.sessions.values();
        let labels = self.labels.stats();
        let jit_held = self
            .sessions
            .values()
            .map(|s| s.jit.size())
            .fold((0, 0), |(n, b), (sn, sb)| (n + sn, b + sb));
        RelayStats {
            connections: t.connections,
            connections_total: t.connections_total,
            batches: t.batches,
            samples_received: self.samples,
            samples_symbolized: t.symbolized,
            samples_filtered: t.filtered,
            samples_without_process: t.without_process,
            frames: t.frames,
            unknown_frames: t.unknown_frames,
            processes: sessions.clone().map(|s| s.process_count() as u64).sum(),
            files: sessions.map(|s| s.file_count() as u64).sum(),
            resolvers: self.cache.len() as u64,
            symbolizer: self.cache.size(),
            symbolizer_hits: self.cache.hits,
            symbolizer_misses: self.cache.misses,
            resolvers_opened: self.cache.opened,
            resolvers_evicted: self.cache.evicted + self.cache.tables_dropped,
            copied_bytes: self.cache.copied_bytes,
            files_symbols_only: self.cache.symbols_only,
            files_too_large: self.cache.too_large,
            files_panicked: self.cache.panicked,
            labels_over_limit: labels.labels_over_limit,
            label_claims_dropped: labels.claims_dropped,
            unwind_tables_too_large: self.budget_counters.too_large.load(Ordering::Relaxed),
            unwind_tables_over_share: self.budget_counters.over_share.load(Ordering::Relaxed),
            unwind_tables_withdrawn: self.budget_counters.withdrawn.load(Ordering::Relaxed),
            unwind_tables_reoffered: self.budget_counters.reoffered.load(Ordering::Relaxed),
            unwind_cfi_refused: self.budget_counters.cfi_refused.load(Ordering::Relaxed),
            jit_frames_named: t.jit_frames_named,
            jit_frames_unnamed: t.jit_frames_unnamed,
            jit_sources_refused: t.jit.maps_refused,
            jit_entries: t.jit.entries,
            jit_lines_skipped: t.jit.garbage_lines + t.jit.long_lines,
            jit_ranges_evicted: t.jit.evicted,
            jit_read_errors: t.jit.read_errors,
            jit_read_capped: t.jit.read_capped,
            jit_ranges: jit_held.0 as u64,
            jit_bytes: jit_held.1 as u64,
            sampler: (t.batches > 0).then_some(self.last_losses),
            last_batch: t.last_batch,
            interval: t.interval,
        }
    }

    /// The sampling frequency, from the first hello or batch (0 before).
    pub fn frequency_hz(&self) -> u32 {
        self.interval.frequency_hz
    }

    /// Applies the file limits; `max_open_files` is lowered to the soft RLIMIT_NOFILE minus a
    /// reserve when that is smaller.
    pub fn set_file_limits(&mut self, limits: FileLimits) {
        self.limits = limits.clamped_to_rlimit();
        self.cache.max_copy_bytes = self.limits.max_copy_bytes;
        self.cache.max_files = self.limits.symbolizer_cache_files.max(1);
        self.cache.max_bytes = self.limits.symbolizer_cache_bytes;
    }

    /// Replaces the labels stage (settings, user names, machine id).
    pub fn set_labels(&mut self, labels: LabelStage) {
        self.labels = labels;
        // The filter may have changed: samplers sample everything until told anew.
        self.ignore.forget_all();
    }

    /// Replaces the labels stage's settings (a config reload); cached labels are recomputed.
    pub fn reload_labels(&mut self, settings: crate::labels::stage::LabelSettings) {
        self.labels.replace_settings(settings);
        // The filter may have changed: samplers sample everything until told anew (the stage
        // lists the processes the new filter leaves out as their labels are computed again).
        self.ignore.forget_all();
    }

    /// Sends each passed executable's unwind table to its sampler (`--unwind dwarf`).
    pub fn send_unwind_tables(&mut self, sender: TableSender) {
        self.unwind = Some(sender);
    }

    pub fn handle(&mut self, event: SourceEvent) -> Handled {
        match event {
            SourceEvent::Connected {
                conn,
                peer_uid,
                peer_pid,
                control,
            } => {
                tracing::info!(connection = conn, peer_uid, peer_pid, "sampler connected");
                if let Some(control) = &control {
                    self.ignore.connected(conn, Arc::clone(control));
                    self.interp.connected(conn, Arc::clone(control));
                }
                self.totals.connections += 1;
                self.totals.connections_total += 1;
                if let (Some(control), Some(_)) = (control, &self.unwind) {
                    self.controls.insert(conn, control);
                }
                Handled::Nothing
            }
            SourceEvent::Closed { conn, error } => {
                self.totals.connections = self.totals.connections.saturating_sub(1);
                self.controls.remove(&conn);
                self.budgets.remove(&conn);
                self.ignore.closed(conn);
                self.interp.closed(conn);
                if let Some(session) = self.sessions.remove(&conn) {
                    tracing::info!(
                        connection = conn,
                        samples = session.samples,
                        clean = error.is_none(),
                        "sampler disconnected"
                    );
                }
                Handled::Closed
            }
            SourceEvent::Message { conn, message, fds } => self.message(conn, message, fds),
        }
    }

    fn message(
        &mut self,
        conn: ConnectionId,
        message: SamplerMessage,
        fds: Vec<OwnedFd>,
    ) -> Handled {
        let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
        if let SamplerMessage::Hello(hello) = message {
            tracing::info!(
                connection = conn,
                sampler_version = %hello.sampler_version,
                hostname = %hello.hostname,
                frequency_hz = hello.frequency_hz,
                target_pid = hello.target_pid,
                "sampler hello"
            );
            if self.interval.frequency_hz == 0 {
                self.interval.frequency_hz = hello.frequency_hz;
            }
            let others = self.samplers_of_host(&hello.hostname, conn);
            if !others.is_empty() {
                tracing::warn!(
                    connection = conn,
                    hostname = %hello.hostname,
                    other_connections = ?others,
                    "a second sampler of the same host connected: every sample of that host is \
                     now counted once per sampler; run one ember-sampler per host (stop the \
                     extra one), or give each host its own hostname if these are several hosts"
                );
            }
            if self.unwind.is_some() && self.controls.contains_key(&conn) {
                let budget = Budget::new(
                    hello.unwind_rows,
                    hello.unwind_tables,
                    Arc::clone(&self.budget_counters),
                );
                tracing::info!(
                    connection = conn,
                    unwind_rows = hello.unwind_rows,
                    unwind_tables = hello.unwind_tables,
                    "unwind tables sent within the sampler's maps, a fair share per file owner"
                );
                self.budgets.insert(conn, Arc::new(Mutex::new(budget)));
            }
            let session = Session::new(hello, fds).with_max_open_files(self.limits.max_open_files);
            self.sessions.insert(conn, session);
            return Handled::Nothing;
        }
        // The source lets nothing but a hello open a connection.
        let Some(session) = self.sessions.get_mut(&conn) else {
            return Handled::Nothing;
        };
        match message {
            SamplerMessage::Hello(_) => Handled::Nothing,
            SamplerMessage::Files(files) => {
                let ids: Vec<u64> = files.iter().map(|f| f.file_id).collect();
                session.add_files(files, fds);
                if let (Some(sender), Some(control), Some(budget)) = (
                    &mut self.unwind,
                    self.controls.get(&conn),
                    self.budgets.get(&conn),
                ) {
                    // Not sampled yet: after every file a batch sampled, in the order they came.
                    let cold: Vec<(u64, u64)> = ids.iter().map(|&id| (id, 0)).collect();
                    offer_tables(sender, control, budget, session, &cold);
                }
                Handled::Nothing
            }
            SamplerMessage::Process(info) => {
                // New facts (exec, or a reused pid): the labels are computed anew.
                self.labels.forget(info.pid);
                let pid = info.pid;
                let perf_map = info
                    .perf_map_fd
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| fds.get_mut(i)?.take());
                session.set_process_with_perf_map(info, perf_map);
                if let Some(info) = session.process_info(pid) {
                    self.interp.process(conn, info, &session.runtime_files(pid));
                }
                Handled::Nothing
            }
            SamplerMessage::ProcessMappings(more) => {
                let pid = more.pid;
                if session.append_mappings(more.pid, more.start_time_unix_ns, more.mappings) {
                    if let Some(info) = session.process_info(pid) {
                        self.interp.process(conn, info, &session.runtime_files(pid));
                    }
                } else {
                    self.orphan_mappings_messages += 1;
                    tracing::debug!(
                        connection = conn,
                        pid = more.pid,
                        ignored = self.orphan_mappings_messages,
                        "mappings for an unknown process (or another start time) ignored"
                    );
                }
                Handled::Nothing
            }
            SamplerMessage::Exited { pids } => {
                for pid in pids {
                    self.labels.forget(pid);
                    self.interp.exited(conn, pid);
                    session.remove_process(pid);
                }
                Handled::Nothing
            }
            SamplerMessage::FilesClosed(ids) => {
                session.close_files(&ids);
                Handled::Nothing
            }
            SamplerMessage::Batch(batch) => self.batch(conn, &batch),
        }
    }

    /// Symbolizes one batch part into the current interval.
    fn batch(&mut self, conn: ConnectionId, batch: &Batch) -> Handled {
        let Some(session) = self.sessions.get_mut(&conn) else {
            return Handled::Nothing;
        };
        if self.interval.frequency_hz == 0 {
            self.interval.frequency_hz = batch.frequency_hz;
        }
        // The batch's interval was observed, samples or not: an idle second is part of the window.
        self.interval
            .observe(batch.interval_start_unix_ns, batch.interval_end_unix_ns);
        let (before, filtered_before) = (session.stats, self.labels.stats().samples_dropped);
        let jit_before = session.jit.stats;
        self.symbolized.clear();
        // Processes the labels stage already left out are not symbolized again.
        let left_out: HashSet<u32> = batch
            .rows
            .iter()
            .map(|row| row.pid)
            .filter(|&pid| {
                session.process_info(pid).is_some_and(|info| {
                    self.labels
                        .left_out(&session.hello.hostname, pid, info.start_time_unix_ns)
                })
            })
            .collect();
        let skipped =
            session.symbolize_batch(batch, &mut self.cache, &mut self.symbolized, &left_out);
        self.labels.count_left_out(skipped);
        self.labels.label(
            &session.hello.hostname,
            &self.symbolized,
            |pid| session.process_info(pid),
            &mut self.interval,
        );
        self.ignore.send(conn, self.labels.take_filtered_out());
        self.interp.flush(conn);
        if let (Some(sender), Some(control), Some(budget)) = (
            &mut self.unwind,
            self.controls.get(&conn),
            self.budgets.get(&conn),
        ) {
            // The samples of this batch per file, per MiB of the file: the files whose tables
            // would recover the most stacks per second of compiling go first (`queue.rs`).
            let heat: HashMap<u64, u64> = session
                .file_samples_last()
                .iter()
                .map(|(&id, &samples)| {
                    let size = session.file_key(id).map_or(u64::MAX, |k| k.size);
                    (id, crate::unwind::queue::heat(samples, size))
                })
                .collect();
            sender.reheat(budget, &heat);
            // Tables evicted, refused for now or skipped by a full queue go again (rate-limited).
            let again = {
                let mut budget = lock(budget);
                budget.retain(|id| session.holds_file(id));
                let sampled: Vec<u64> = heat.keys().copied().collect();
                let now = budget.interval_time(batch.sequence, Instant::now());
                budget.after_batch(&sampled, batch.losses.unwind_tables_evicted, now)
            };
            let again: Vec<(u64, u64)> = again
                .into_iter()
                .map(|id| (id, heat.get(&id).copied().unwrap_or(0)))
                .collect();
            offer_tables(sender, control, budget, session, &again);
        }
        let samples = batch.sample_count();
        self.samples += samples;
        self.last_losses = *batch.losses;
        // Saturating: a new labels stage (set_labels) starts its counters at zero.
        let filtered = self
            .labels
            .stats()
            .samples_dropped
            .saturating_sub(filtered_before);
        self.totals.count_batch(
            batch,
            samples,
            filtered,
            (&before, &jit_before),
            (&session.stats, &session.jit.stats),
        );
        log_batch(conn, batch, samples, session, self.ignore.sent);
        self.release_symbolizer_memory();
        self.check_sigbus();
        self.log_label_stats();
        Handled::Batch {
            samples,
            last_part: batch.part.saturating_add(1) >= batch.parts,
        }
    }

    /// After a batch: closes the resolvers that are idle or whose file no process maps any
    /// more, hands the file pages blazesym read back to the page cache, and the freed heap
    /// back to the kernel when they held enough to matter ([`crate::heap::worth_trimming`];
    /// at most every [`TRIM_EVERY`]).
    fn release_symbolizer_memory(&mut self) {
        let live: std::collections::HashSet<crate::symbolize::FileKey> = self
            .sessions
            .values()
            .flat_map(|s| s.file_keys().copied())
            .collect();
        let held = self.cache.size().bytes;
        self.cache
            .evict(RESOLVER_IDLE, RESOLVER_UNREFERENCED, |key| {
                live.contains(key)
            });
        self.cache.release_pages();
        let released = held.saturating_sub(self.cache.size().bytes);
        self.trim_due |= crate::heap::worth_trimming(released);
        self.trim();
    }

    /// Hands freed heap back to the kernel after a large release (a window handed over, a
    /// large binary's parsed tables), at most every [`TRIM_EVERY`]. The space steady churn
    /// frees and reuses every second stays: trimming it made the RSS dip and climb back.
    pub fn trim(&mut self) {
        if !self.trim_due || self.trimmed.is_some_and(|at| at.elapsed() < TRIM_EVERY) {
            return;
        }
        self.trim_due = false;
        self.trimmed = Some(Instant::now());
        crate::heap::trim();
    }

    /// A window of samples was freed: trim at the next chance, when the relay grew past the
    /// level it keeps for the next window ([`crate::heap::window_worth_trimming`]).
    pub fn freed(&mut self) {
        self.trim_due |= crate::heap::window_worth_trimming(crate::heap::resident_bytes());
    }

    /// Logs what the labels stage left out, when that changed.
    fn log_label_stats(&mut self) {
        let stats = self.labels.stats();
        if stats == self.labels_logged {
            return;
        }
        self.labels_logged = stats;
        tracing::info!(
            processes_filtered = stats.processes_filtered,
            processes_dropped = stats.processes_dropped,
            samples_dropped = stats.samples_dropped,
            labels_over_limit = stats.labels_over_limit,
            env_attributes_discarded = stats.env_attributes_discarded,
            claims_dropped = stats.claims_dropped,
            services_unknown = stats.services_unknown,
            "labels stage: processes left out (process filter, relabel drop) and labels trimmed"
        );
    }

    /// After the SIGBUS guard repaired a mapping (a file shrank while mapped), drops every
    /// resolver so no damaged mapping stays in use.
    fn check_sigbus(&mut self) {
        let repaired = sigbus::repaired();
        if repaired != self.sigbus_seen {
            tracing::warn!(
                pages = repaired.wrapping_sub(self.sigbus_seen),
                resolvers_dropped = self.cache.len(),
                "a mapped file shrank while the relay read it (truncated by its owner): the \
                 pages past its end read as zeros, symbols of that file were dropped, and every \
                 open symbolizer was closed to be reopened on demand"
            );
            self.sigbus_seen = repaired;
            self.cache.clear();
        }
    }

    /// The connections other than `except` whose sampler said it runs on `hostname`.
    fn samplers_of_host(&self, hostname: &str, except: ConnectionId) -> Vec<ConnectionId> {
        let mut conns: Vec<ConnectionId> = self
            .sessions
            .iter()
            .filter(|(conn, session)| **conn != except && session.hello.hostname == hostname)
            .map(|(conn, _)| *conn)
            .collect();
        conns.sort_unstable();
        conns
    }

    /// Takes the samples symbolized since the last call and the time the batches covered (with
    /// or without samples), leaving an empty profile with the same frequency: the spare handed
    /// to [`Pipeline::recycle`], if any, else a new one.
    pub fn take_interval(&mut self) -> LabeledProfile {
        let frequency = self.interval.frequency_hz;
        let mut next = self.spare.take().unwrap_or_default();
        next.frequency_hz = frequency;
        self.interval_rows_peak = self
            .interval
            .sizes()
            .rows
            .max(self.interval_rows_peak - self.interval_rows_peak / 16);
        std::mem::replace(&mut self.interval, next)
    }

    /// Rows the interval being filled has room for (what a recycled one brought).
    #[cfg(test)]
    pub fn interval_row_capacity(&self) -> usize {
        self.interval.row_capacity()
    }

    /// Takes back an interval no sink holds any more, to be emptied and filled as the next one:
    /// its tables keep their capacity, so an interval like the last grows none of them (under
    /// churn, each second's tables were otherwise built from empty, rehashed as they doubled,
    /// and freed). One far larger than intervals have been lately (more than twice the
    /// decaying peak of their rows, and worth freeing) is dropped instead, so one exceptional
    /// second does not pin its size.
    pub fn recycle(&mut self, mut spent: LabeledProfile) {
        const KEEP_ALWAYS_ROWS: usize = 4096;
        let rows = spent.row_capacity();
        if rows > KEEP_ALWAYS_ROWS && rows / 2 > self.interval_rows_peak {
            return;
        }
        spent.clear();
        self.spare = Some(spent);
    }
}

/// Hands passed files (id, heat) to the unwind worker: each job holds the connection and a
/// `Weak` handle on the session's descriptor, so it never keeps a file open that the session
/// closes before the worker reaches it.
fn offer_tables(
    sender: &mut TableSender,
    control: &Arc<OwnedFd>,
    budget: &Arc<Mutex<Budget>>,
    session: &Session,
    files: &[(u64, u64)],
) {
    for &(file_id, heat) in files {
        let Some(file) = session.file_handle(file_id) else {
            continue;
        };
        sender.offer(
            Job {
                control: Arc::clone(control),
                file_id,
                file,
                budget: Arc::clone(budget),
                key: session.file_key(file_id),
            },
            heat,
        );
    }
}

/// Hand-built source events around a real binary (this test executable, passed by descriptor as
/// the sampler would), for the pipeline's and the driver's tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::{fs::File, io::Write as _, os::fd::OwnedFd};

    use ember_protocol::{
        Batch, FileInfo, Hello, Mapping, ProcessInfo, Row, SamplerMessage, StackRef,
        PROTOCOL_VERSION,
    };

    use crate::source::{ConnectionId, SourceEvent};

    pub const CONN: ConnectionId = 7;
    pub const PID: u32 = 4242;
    pub const FREQUENCY_HZ: u32 = 99;
    /// A kernel address inside `do_one` of [`KALLSYMS`].
    pub const KERNEL_ADDRESS: u64 = 0xffff_ffff_8100_0150;
    const KALLSYMS: &str = "ffffffff81000000 T _stext\nffffffff81000100 T do_one\n";

    /// The user-space leaf of every fixture sample: a function of this executable.
    #[inline(never)]
    pub fn fixture_leaf_function() -> u64 {
        std::hint::black_box(17)
    }

    /// The address of [`fixture_leaf_function`] and the mapping of this executable holding it,
    /// from /proc/self/maps (file id 1).
    pub fn leaf_address_and_mapping() -> (u64, Mapping) {
        let address = fixture_leaf_function as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        let mapping = maps
            .lines()
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let (start, end) = fields.first()?.split_once('-')?;
                let start = u64::from_str_radix(start, 16).ok()?;
                let end = u64::from_str_radix(end, 16).ok()?;
                (start..end).contains(&address).then(|| Mapping {
                    start,
                    end,
                    file_offset: u64::from_str_radix(fields[2], 16).unwrap_or(0),
                    path: fields.get(5).copied().unwrap_or("").to_owned(),
                    file_id: 1,
                    ..Mapping::default()
                })
            })
            .expect("this executable maps its own function");
        (address, mapping)
    }

    fn message(message: SamplerMessage, fds: Vec<OwnedFd>) -> SourceEvent {
        SourceEvent::Message {
            conn: CONN,
            message,
            fds,
        }
    }

    /// Hello (with a kallsyms descriptor), the executable's file, its process: what a sampler
    /// sends before its first batch.
    pub fn session_start() -> Vec<SourceEvent> {
        let mut kallsyms = tempfile::tempfile().expect("temp file");
        kallsyms
            .write_all(KALLSYMS.as_bytes())
            .expect("write kallsyms");
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            hostname: "fixture-host".into(),
            frequency_hz: FREQUENCY_HZ,
            kallsyms_fd: 0,
            ..Hello::default()
        };
        let (_, mapping) = leaf_address_and_mapping();
        let exe = File::open("/proc/self/exe").expect("open this executable");
        let files = vec![FileInfo {
            file_id: 1,
            path: mapping.path.clone(),
            fd: 0,
            ..FileInfo::default()
        }];
        let process = ProcessInfo {
            pid: PID,
            executable_name: "fixture".into(),
            executable_path: mapping.path.clone(),
            mappings: vec![mapping],
            ..ProcessInfo::default()
        };
        vec![
            SourceEvent::Connected {
                conn: CONN,
                peer_uid: 0,
                peer_pid: 1,
                control: None,
            },
            message(SamplerMessage::Hello(hello), vec![kallsyms.into()]),
            message(SamplerMessage::Files(files), vec![exe.into()]),
            message(SamplerMessage::Process(process), Vec::new()),
        ]
    }

    /// Part `part` of `parts` of interval `sequence`: `count` samples of thread "worker" in
    /// [`fixture_leaf_function`] called from the kernel's `do_one`, and one more sample of it
    /// without a kernel stack (user mode).
    pub fn batch(sequence: u64, part: u32, parts: u32, count: u64) -> SourceEvent {
        let (address, _) = leaf_address_and_mapping();
        let row = |kernel_stack, count| Row {
            pid: PID,
            tid: PID + 1,
            comm: "worker".into(),
            user_stack: StackRef::Index(0),
            kernel_stack,
            count,
            interp_stack: None,
            off_cpu_ns: 0,
        };
        let second = 1_000_000_000;
        message(
            SamplerMessage::Batch(Batch {
                sequence,
                part,
                parts,
                interval_start_unix_ns: sequence * second,
                interval_end_unix_ns: (sequence + 1) * second,
                frequency_hz: FREQUENCY_HZ,
                user_stacks: vec![vec![address]],
                kernel_stacks: vec![vec![KERNEL_ADDRESS]],
                // No samples: an idle interval (the sampler sends one every interval).
                rows: if count == 0 {
                    Vec::new()
                } else {
                    vec![
                        row(StackRef::Index(0), count - 1),
                        row(StackRef::Missing(14), 1),
                    ]
                },
                ..Batch::default()
            }),
            Vec::new(),
        )
    }

    pub fn closed() -> SourceEvent {
        SourceEvent::Closed {
            conn: CONN,
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{fixtures::*, *};
    use crate::{
        labels::labeled::LabeledThread,
        model::{Frame, FrameKind, Thread},
    };

    fn started() -> Pipeline {
        let mut pipeline = Pipeline::new();
        for event in session_start() {
            assert_eq!(pipeline.handle(event), Handled::Nothing);
        }
        pipeline
    }

    thread_local! {
        /// What this test thread logged (see [`logged_json`]).
        static LOGGED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Writes into this thread's [`LOGGED`].
    struct ThreadLog;

    impl std::io::Write for ThreadLog {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            LOGGED.with_borrow_mut(|logged| logged.extend_from_slice(bytes));
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `handle(event)` logged on this thread, one JSON object per line. The subscriber
    /// is the global one, each thread writing to its own buffer: a subscriber set for one
    /// thread only misses events whose call site another test thread registered first.
    fn logged_json(pipeline: &mut Pipeline, event: SourceEvent) -> Vec<serde_json::Value> {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_writer(|| ThreadLog)
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        });
        LOGGED.with_borrow_mut(Vec::clear);
        pipeline.handle(event);
        let text = LOGGED.with_borrow_mut(std::mem::take);
        String::from_utf8(text)
            .expect("utf-8")
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON log line"))
            .collect()
    }

    #[test]
    fn the_batch_line_logs_every_loss_counter_once_under_its_key() {
        // Given a batch whose loss counters each hold a value no other holds
        let mut pipeline = started();
        let SourceEvent::Message {
            conn,
            message: SamplerMessage::Batch(mut part),
            fds,
        } = batch(1, 0, 1, 5)
        else {
            panic!("a batch event");
        };
        part.losses = Box::new(ember_protocol::distinct_losses(1000));
        let event = SourceEvent::Message {
            conn,
            message: SamplerMessage::Batch(part),
            fds,
        };
        // When it is handled
        let lines = logged_json(&mut pipeline, event);
        let line = lines
            .iter()
            .find(|l| l["message"] == "batch received")
            .unwrap_or_else(|| panic!("no batch line: {lines:?}"));
        // Then each counter is there once: under its own key, or as `key=value` in `losses`
        let losses = line["losses"].as_str().expect("a losses field");
        let listed: std::collections::BTreeMap<&str, u64> = losses
            .split(' ')
            .map(|pair| {
                let (key, value) = pair.split_once('=').expect("key=value");
                (key, value.parse().expect("a number"))
            })
            .collect();
        for (counter, value) in ember_protocol::distinct_losses(1000).counters() {
            let own = line.get(counter.log).and_then(serde_json::Value::as_u64);
            let found = match (own, listed.get(counter.log)) {
                (Some(own), None) => own,
                (None, Some(listed)) => *listed,
                both => panic!("{}: {both:?} in {line}", counter.log),
            };
            assert_eq!(found, value, "{} in {line}", counter.log);
        }
        assert_eq!(
            listed.len() + LOGGED_APART.len(),
            ember_protocol::LOSS_COUNTERS.len(),
            "{line}"
        );
        // And the relay's own count of the part's samples keeps its key
        assert_eq!(line["samples"], 5);
    }

    #[test]
    fn jit_counters_add_up_across_batches_and_connections() {
        // Given two connections' JIT counters, each growing over two batches
        let mut totals = Totals::default();
        let batch = ember_protocol::Batch::default();
        let symbols = |named, unnamed| SymbolStats {
            jit_frames_named: named,
            jit_frames_unnamed: unnamed,
            ..SymbolStats::default()
        };
        let jit = |entries, errors| JitStats {
            entries,
            read_errors: errors,
            ..JitStats::default()
        };
        // When each batch is counted with the counters before and after it
        totals.count_batch(
            &batch,
            0,
            0,
            (&symbols(0, 0), &jit(0, 0)),
            (&symbols(5, 1), &jit(40, 0)),
        );
        totals.count_batch(
            &batch,
            0,
            0,
            (&symbols(5, 1), &jit(40, 0)),
            (&symbols(9, 1), &jit(41, 1)),
        );
        totals.count_batch(
            &batch,
            0,
            0,
            (&symbols(0, 0), &jit(0, 0)),
            (&symbols(2, 3), &jit(7, 0)),
        );
        // Then the totals are the sums of what each batch added
        assert_eq!(
            (totals.jit_frames_named, totals.jit_frames_unnamed),
            (11, 4)
        );
        assert_eq!((totals.jit.entries, totals.jit.read_errors), (48, 1));
    }

    #[test]
    fn counters_at_zero_are_left_out_of_the_losses_field() {
        let mut losses = ember_protocol::Losses {
            unwind_outermost: 4,
            idle: 2,
            counts_full: 9,
            ..ember_protocol::Losses::default()
        };
        assert_eq!(other_losses(&losses), "idle_samples=2 unwind_outermost=4");
        losses = ember_protocol::Losses::default();
        assert_eq!(other_losses(&losses), "");
    }

    #[test]
    fn a_batch_counts_its_samples_per_file_their_user_stacks_fell_in() {
        // Given a session whose process maps this executable as file 1
        let mut pipeline = started();
        // When a batch of 5 samples in it arrives (4 with a kernel stack, 1 without)
        pipeline.handle(batch(1, 0, 1, 5));
        // Then file 1 counts all 5: the heat its unwind table is compiled with (`queue.rs`)
        let session = pipeline.sessions.get(&CONN).expect("the session");
        assert_eq!(
            session.file_samples_last(),
            &HashMap::from([(1u64, 5u64)]),
            "samples per file"
        );
        // And an idle batch counts nothing
        pipeline.handle(batch(2, 0, 1, 0));
        let session = pipeline.sessions.get(&CONN).expect("the session");
        assert!(session.file_samples_last().is_empty());
    }

    #[test]
    fn a_batch_is_named_through_the_descriptors_the_sampler_passed() {
        // Given a session that passed this executable and a kallsyms descriptor
        let mut pipeline = started();
        // When a one-part batch of 5 samples arrives
        let handled = pipeline.handle(batch(1, 0, 1, 5));
        // Then it completes its interval, and the interval's profile names both frames
        assert_eq!(
            handled,
            Handled::Batch {
                samples: 5,
                last_part: true
            }
        );
        let profile = pipeline.take_interval();
        assert_eq!(profile.total_samples(), 5);
        assert_eq!(profile.frequency_hz, FREQUENCY_HZ);
        assert_eq!(profile.hostname.as_deref(), Some("fixture-host"));
        assert_eq!(
            (profile.start_unix_ns, profile.end_unix_ns),
            (1_000_000_000, 2_000_000_000)
        );
        let samples = profile.samples();
        assert_eq!(samples.len(), 2, "{samples:#?}");
        for sample in &samples {
            assert_eq!(&*sample.thread.process_name, "fixture");
            assert_eq!(&*sample.thread.thread_name, "worker");
            assert_eq!(sample.thread.pid, PID);
        }
        let user_leaf = |s: &crate::labels::labeled::LabeledSample<'_>| {
            let frame = s.stack.last().expect("a user frame");
            assert_eq!(frame.kind, FrameKind::Native);
            assert!(
                frame.function.ends_with("fixture_leaf_function"),
                "{frame:?}"
            );
        };
        // Leaf first: kernel frames come before the user frames they interrupted.
        let with_kernel = samples.iter().find(|s| s.count == 4).expect("4 samples");
        assert_eq!(with_kernel.stack.len(), 2);
        let leaf = with_kernel.stack.first().expect("a kernel leaf");
        assert_eq!(&*leaf.function, "do_one");
        assert_eq!(leaf.kind, FrameKind::Kernel);
        user_leaf(with_kernel);
        let user_only = samples.iter().find(|s| s.count == 1).expect("1 sample");
        assert_eq!(user_only.stack.len(), 1);
        user_leaf(user_only);
        assert_eq!(profile.top_self(1), [("do_one_[k]".to_owned(), 4)]);
        // And the interval was taken: the next one starts empty, the totals stay
        assert!(pipeline.take_interval().is_empty());
        assert_eq!(pipeline.samples(), 5);
    }

    #[test]
    fn a_spent_interval_far_larger_than_intervals_have_been_is_not_kept() {
        // Given a pipeline whose intervals have been small (a row or two)
        let mut pipeline = started();
        pipeline.handle(batch(1, 0, 1, 5));
        let small = pipeline.take_interval();
        assert!(small.row_capacity() > 0);
        // When an interval with room for 10,000 rows is handed back
        let thread = LabeledThread::from(Thread::bare((1, 1), "app", "app", "/app"));
        let mut big = LabeledProfile::new(99);
        for address in 0..10_000 {
            let frame = Frame::bare("f", FrameKind::Native, address);
            big.add_frames(&thread, [&frame], 1);
        }
        pipeline.recycle(big);
        // Then it is dropped: the next interval starts with no room
        drop(pipeline.take_interval());
        assert_eq!(pipeline.interval_row_capacity(), 0);
        // And one like those before is kept, emptied, and refilled as the next interval
        pipeline.recycle(small);
        drop(pipeline.take_interval());
        assert!(pipeline.interval_row_capacity() > 0);
        pipeline.handle(batch(2, 0, 1, 5));
        let refilled = pipeline.take_interval();
        assert_eq!(refilled.total_samples(), 5);
        assert_eq!(
            (refilled.start_unix_ns, refilled.end_unix_ns),
            (2_000_000_000, 3_000_000_000)
        );
    }

    #[test]
    fn a_second_sampler_of_the_same_host_is_noticed() {
        // Given a started session of host fixture-host on connection CONN
        let pipeline = started();
        // Then another connection from that host finds it, one from another host does not
        assert_eq!(pipeline.samplers_of_host("fixture-host", CONN + 1), [CONN]);
        assert!(pipeline.samplers_of_host("other-host", CONN + 1).is_empty());
        // And a session is not a duplicate of itself (a reconnect on the same connection)
        assert!(pipeline.samplers_of_host("fixture-host", CONN).is_empty());
    }

    #[test]
    fn parts_accumulate_until_the_last_one() {
        // Given a started session
        let mut pipeline = started();
        // When an interval comes in two parts
        let first = pipeline.handle(batch(1, 0, 2, 3));
        let second = pipeline.handle(batch(1, 1, 2, 4));
        // Then only the second completes it, and the interval holds both
        assert_eq!(
            (first, second),
            (
                Handled::Batch {
                    samples: 3,
                    last_part: false
                },
                Handled::Batch {
                    samples: 4,
                    last_part: true
                }
            )
        );
        assert_eq!(pipeline.take_interval().total_samples(), 7);
    }

    /// A `Process` message for the fixture's pid with `name` and `OTEL_SERVICE_NAME`.
    fn process_message(name: &str, service: Option<&str>) -> SourceEvent {
        let (_, mapping) = leaf_address_and_mapping();
        let info = ember_protocol::ProcessInfo {
            pid: PID,
            executable_name: name.into(),
            mappings: vec![mapping],
            uid: Some(0),
            otel_service_name: service.map(Into::into),
            ..ember_protocol::ProcessInfo::default()
        };
        SourceEvent::Message {
            conn: CONN,
            message: SamplerMessage::Process(info),
            fds: Vec::new(),
        }
    }

    #[test]
    fn samples_carry_their_process_labels_refreshed_on_exec_and_dropped_by_rules() {
        // Given a labels stage with a tag and a rule dropping executables named "noisy"
        let configs: Vec<crate::relabel::RelabelConfig> = serde_saphyr::from_str(
            "- source_labels: [process.executable.name]\n  regex: noisy\n  action: drop\n",
        )
        .expect("yaml");
        let settings = crate::labels::stage::LabelSettings {
            tags: [("team", "core")].into_iter().collect(),
            rules: crate::relabel::compile(&configs).expect("rules"),
            ..Default::default()
        };
        let mut pipeline = started();
        pipeline.set_labels(LabelStage::new(settings, Default::default(), None));
        // When the process names its service through its environment and samples arrive
        pipeline.handle(process_message("fixture", Some("billing")));
        pipeline.handle(batch(1, 0, 1, 3));
        // Then every sample carries the same shared labels, with the service name and the tag
        let profile = pipeline.take_interval();
        let samples = profile.samples();
        let resource = &samples[0].thread.resource;
        assert_eq!(resource.get("service.name"), Some("billing"));
        assert_eq!(resource.get("team"), Some("core"));
        assert_eq!(resource.get("host.name"), Some("fixture-host"));
        assert!(samples
            .iter()
            .all(|s| Arc::ptr_eq(&s.thread.resource, resource)));
        // When the process execs (same pid and start time, new facts) into a dropped executable
        pipeline.handle(process_message("noisy", None));
        pipeline.handle(batch(2, 0, 1, 4));
        // Then its samples are not exported, and counted
        assert!(pipeline.take_interval().is_empty());
        let stats = pipeline.labels.stats();
        assert_eq!((stats.processes_dropped, stats.samples_dropped), (1, 4));
        // And the metrics count them as received and filtered, not symbolized
        let counted = pipeline.stats();
        assert_eq!(
            (
                counted.samples_received,
                counted.samples_symbolized,
                counted.samples_filtered
            ),
            (7, 3, 4)
        );
        // When more of its samples arrive, the process is still left out
        let frames = pipeline.stats().frames;
        pipeline.handle(batch(3, 0, 1, 5));
        // Then they are counted as filtered without being symbolized again
        assert!(pipeline.take_interval().is_empty());
        let counted = pipeline.stats();
        assert_eq!(pipeline.labels.stats().samples_dropped, 9);
        assert_eq!((counted.samples_filtered, counted.frames), (9, frames));
        // And after another exec it is labelled anew (no stale drop)
        pipeline.handle(process_message("worker", None));
        pipeline.handle(batch(4, 0, 1, 2));
        let profile = pipeline.take_interval();
        assert_eq!(profile.total_samples(), 2);
        assert_eq!(
            profile.samples()[0].thread.resource.get("service.name"),
            Some("worker")
        );
    }

    /// The `ignoreProcesses` messages waiting on `sock`.
    fn ignore_messages(sock: &OwnedFd) -> Vec<ember_protocol::IgnoreProcesses> {
        use std::os::fd::AsFd as _;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let mut ready = [nix::poll::PollFd::new(
                sock.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            if !nix::poll::poll(&mut ready, nix::poll::PollTimeout::ZERO).is_ok_and(|n| n > 0) {
                return out;
            }
            let Ok(ember_protocol::transport::Received::Message { len, .. }) =
                ember_protocol::transport::recv(sock.as_fd(), &mut buf)
            else {
                return out;
            };
            match ember_protocol::decode_relay_message(&buf[..len], &Default::default()) {
                Ok(ember_protocol::RelayMessage::IgnoreProcesses(m)) => out.push(m),
                other => panic!("unexpected: {other:?}"),
            }
        }
    }

    /// A pipeline whose connection's control side is `ours`, past the session start.
    fn started_with_control(ours: OwnedFd, filter: Option<&str>) -> Pipeline {
        let mut pipeline = Pipeline::new();
        let settings = crate::labels::stage::LabelSettings {
            process_filter: filter.map(|f| crate::labels::stage::process_filter(f).expect("regex")),
            ..Default::default()
        };
        pipeline.set_labels(LabelStage::new(settings, Default::default(), None));
        pipeline.handle(SourceEvent::Connected {
            conn: fixtures::CONN,
            peer_uid: 0,
            peer_pid: 1,
            control: Some(Arc::new(ours)),
        });
        for event in session_start().into_iter().skip(1) {
            pipeline.handle(event);
        }
        let (_, mapping) = leaf_address_and_mapping();
        pipeline.handle(SourceEvent::Message {
            conn: fixtures::CONN,
            message: SamplerMessage::Process(ember_protocol::ProcessInfo {
                pid: PID,
                start_time_unix_ns: 77,
                executable_name: "fixture".into(),
                mappings: vec![mapping],
                ..Default::default()
            }),
            fds: Vec::new(),
        });
        pipeline
    }

    #[test]
    fn a_filtered_process_is_pushed_down_to_its_sampler_once() {
        // Given a filter that leaves the fixture's process out
        let (ours, theirs) = ember_protocol::transport::pair().expect("socketpair");
        let mut pipeline = started_with_control(ours, Some("other"));
        // When two batches of it arrive
        pipeline.handle(batch(1, 0, 1, 3));
        pipeline.handle(batch(2, 0, 1, 3));
        // Then its samples are dropped here, and its sampler is asked once to ignore it
        assert!(pipeline.take_interval().is_empty());
        let sent = ignore_messages(&theirs);
        let expected = ember_protocol::IgnoredProcess {
            pid: PID,
            start_time_unix_ns: 77,
        };
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(
            (sent[0].forget_all, &sent[0].processes[..]),
            (false, &[expected][..])
        );
        // When the labels stage is replaced (a reload), Then the sampler is told to forget all
        pipeline.set_labels(LabelStage::default());
        let sent = ignore_messages(&theirs);
        assert_eq!(sent.len(), 1);
        assert!(sent[0].forget_all && sent[0].processes.is_empty());
        // And without a filter nothing more is sent
        pipeline.handle(batch(3, 0, 1, 3));
        assert_eq!(pipeline.take_interval().total_samples(), 3);
        assert!(ignore_messages(&theirs).is_empty());
    }

    #[test]
    fn without_a_filter_nothing_is_sent_to_the_sampler() {
        let (ours, theirs) = ember_protocol::transport::pair().expect("socketpair");
        let mut pipeline = started_with_control(ours, None);
        pipeline.handle(batch(1, 0, 1, 3));
        assert_eq!(pipeline.take_interval().total_samples(), 3);
        assert!(ignore_messages(&theirs).is_empty());
    }

    #[test]
    fn the_metrics_count_what_the_pipeline_saw_and_hold_what_it_holds() {
        // Given a connected session that passed one file and one process
        let mut pipeline = started();
        let stats = pipeline.stats();
        assert_eq!((stats.connections, stats.connections_total), (1, 1));
        assert_eq!((stats.processes, stats.files), (1, 1));
        assert!(stats.sampler.is_none() && stats.last_batch.is_none());
        // When two batches of 5 and 3 samples arrive
        pipeline.handle(batch(1, 0, 1, 5));
        pipeline.handle(batch(2, 0, 1, 3));
        // Then every sample was received and symbolized, the 1 s interval and losses are kept
        let stats = pipeline.stats();
        assert_eq!(
            (
                stats.batches,
                stats.samples_received,
                stats.samples_symbolized
            ),
            (2, 8, 8)
        );
        assert_eq!(stats.samples_filtered, 0);
        assert!(stats.frames >= 4 && stats.unknown_frames <= stats.frames);
        assert_eq!(stats.interval, Duration::from_secs(1));
        assert!(stats.sampler.is_some() && stats.last_batch.is_some());
        // When the connection closes, then nothing is held, and the totals stay
        pipeline.handle(closed());
        let stats = pipeline.stats();
        assert_eq!((stats.connections, stats.connections_total), (0, 1));
        assert_eq!((stats.processes, stats.files), (0, 0));
        assert_eq!(stats.samples_received, 8);
    }

    #[test]
    fn a_batch_on_an_unknown_connection_is_ignored() {
        // Given no hello on the connection
        let mut pipeline = Pipeline::new();
        // When a batch arrives, then it is not symbolized
        assert_eq!(pipeline.handle(batch(1, 0, 1, 5)), Handled::Nothing);
        assert!(pipeline.take_interval().is_empty());
        // And a closed connection is reported as such
        assert_eq!(pipeline.handle(closed()), Handled::Closed);
    }
}
