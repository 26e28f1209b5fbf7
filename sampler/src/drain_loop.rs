//! The sampler's drain loop, after start-up: every interval it drains the in-kernel counts
//! ([`Drainer`]), splits them at reused pids, describes newly seen processes ([`Tracker`]),
//! queues the batch parts on the [`Link`] to the relay and, between intervals, keeps that link
//! going, reads the program's first-sample events at once, and acts on what the relay sends
//! (unwind tables, the process filter, interpreters to walk).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use ember_common::{now_unix_ns, stop_requested};
use ember_protocol::{
    decode_relay_message, encode_sampler_message, split::BatchHeader, Batch, IgnoreProcesses,
    InterpreterProcess, Limits, Losses, RelayMessage, SamplerMessage,
};
use ember_sampler_ebpf::UNOBSERVED_UID;

use crate::{
    config::{SamplerConfig, Unwind},
    drain::{build_batches_in_two, split_reused, Drainer},
    ignore, interp,
    limits::MAX_BATCH_BYTES,
    link::{BatchMark, Event, Link, Outgoing},
    load::Loaded,
    procevents,
    procfs::Observed,
    tracker::Tracker,
    unwind,
};

/// The drain loop's state: every interval, drain the maps, describe new processes, queue the
/// batch parts, and keep the link to the relay going in between.
pub struct DrainLoop {
    config: SamplerConfig,
    /// The connection was inherited from `ember-relay record`: never reconnected.
    inherited: bool,
    link: Link,
    tracker: Tracker,
    /// Sent first on every connection, with the kallsyms descriptor.
    hello: Outgoing,
    loaded: Loaded,
    drainer: Drainer,
    /// Unwind tables the relay sent and the sampler accepted.
    tables: unwind::Tables,
    /// Processes the relay's filter left out, verified, not sampled (`ignore.rs`).
    ignored: ignore::Ignored,
    probe: ignore::ProcProbe,
    /// Interpreters the relay described, checked, walked by the program (`interp.rs`).
    interps: interp::Interps,
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

impl DrainLoop {
    /// The loop over a loaded program, before its first interval: `hello` is sent first on
    /// every connection; `boot_time_unix_ns` dates the processes the loop describes.
    pub fn new(
        config: SamplerConfig,
        loaded: Loaded,
        link: Link,
        hello: Outgoing,
        tracker: Tracker,
        boot_time_unix_ns: u64,
    ) -> Self {
        let unwind_sizes = loaded.unwind.sizes;
        let mut link = link;
        if let Err(err) = link.watch_ring(loaded.events.fd()) {
            // Facts are then read at the next wait's end (at most IDLE_WAIT later).
            tracing::warn!(%err, "cannot wait on the first-sample ring buffer");
        }
        Self {
            inherited: config.inherited_fd.is_some(),
            link,
            tracker,
            hello,
            loaded,
            drainer: Drainer::new(),
            tables: unwind::Tables::new(unwind_sizes.rows, unwind_sizes.tables),
            ignored: ignore::Ignored::default(),
            probe: ignore::ProcProbe { boot_time_unix_ns },
            interps: interp::Interps::default(),
            sequence: 0,
            interval_start: now_unix_ns(),
            sent_samples: 0,
            deferral: procevents::Deferral::default(),
            config,
        }
    }

    /// Runs until a stop signal, or until the inherited connection ends; an error only when the
    /// maps cannot be drained.
    pub fn run(mut self) -> anyhow::Result<()> {
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
            if !self.link.is_connected() && self.interps.len() > 0 {
                // A new relay describes the interpreters it recognizes itself.
                self.interps.clear(&mut self.loaded.interp_procs);
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
            self.interps.clear(&mut self.loaded.interp_procs);
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
            self.link.wait_also(wait) == Event::Closed
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
        let (drained, newer) = split_reused(drained, self.deferral.reused(), |pid| {
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
            interp_stacks = drained.interp.stacks.len(),
            interp_codes = drained.interp.codes.len(),
            map_read_errors = drained.read_errors,
            "interval drained"
        );
        Ok(losses)
    }

    /// Reads the facts of the processes the program reported since the last call (their first
    /// samples), at once, and queues them ahead of the batch that will hold those samples.
    fn describe_new_processes(&mut self) {
        let events = self.loaded.events.take();
        let described = !events.is_empty();
        for event in events {
            let observed = Observed {
                uid: (event.uid != UNOBSERVED_UID).then_some(event.uid),
                cgroup_id: event.cgroup_id,
                start_boottime_ns: (event.start_boottime_ns != 0)
                    .then_some(event.start_boottime_ns),
            };
            let events = &self.loaded.events;
            let leader_exited = || events.exited_since(event.tgid, event.ktime_ns);
            let described =
                self.tracker
                    .describe_now(event.tgid, self.sequence, observed, &leader_exited);
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
        if described {
            // The unwinder walks a process only once its mappings are in the kernel: written
            // now, not at the end of the interval, its tables (often loaded already: libc's)
            // serve it from its next sample on.
            self.update_unwind_mappings();
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
                Ok(RelayMessage::InterpreterProcess(message)) => {
                    self.interpreter_process(&message);
                }
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

    /// Takes an `interpreterProcess` that checks out (see `interp.rs`).
    fn interpreter_process(&mut self, message: &InterpreterProcess) {
        let pid = message.pid;
        let result = self.interps.take(
            message,
            self.tracker.described(pid),
            self.tracker.mappings(pid),
            &mut self.loaded.interp_procs,
        );
        match result {
            Ok(()) => tracing::debug!(
                pid,
                file_id = message.file_id,
                root = message.root,
                forget = message.forget,
                interpreters = self.interps.len(),
                "interpreter to walk taken"
            ),
            Err(reason) => tracing::debug!(pid, reason, "interpreterProcess refused"),
        }
    }

    /// Tells the unwinder (`--unwind dwarf`) where changed processes map their files and
    /// forgets exited ones; forgets the interpreters of processes gone or changed under them.
    fn update_unwind_mappings(&mut self) {
        let (changed, gone) = self.tracker.take_changes();
        let tracker = &self.tracker;
        self.interps.recheck(
            &changed,
            &gone,
            |pid| Some((tracker.described(pid)?, tracker.mappings(pid)?)),
            &mut self.loaded.interp_procs,
        );
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
        losses.interp_refused = self.interps.refused;
        losses
    }

    /// The sampler's own state, once a minute and at the end. The loss counters each batch
    /// carries (`Losses`, `IgnoreStats`) are not repeated here: the relay logs every one of them
    /// in its `batch received` line, exports them as metrics and sums them in `record`'s
    /// summary; only the backlog's drops are, which matter most while no relay receives them.
    fn log_status(&mut self, losses: &Losses) {
        let (events_sent, events_dropped, execs) = self.loaded.events.counters();
        // Since the last status line: how long after a process's first sample its facts were
        // read.
        let latency = self.loaded.events.take_latencies();
        tracing::info!(
            samples = self.sent_samples,
            processes = self.tracker.len(),
            open_files = self.tracker.files.open_count(),
            connected = self.link.is_connected(),
            backlog_bytes = self.link.backlog_bytes(),
            queued = self.link.queued(),
            backlog_dropped_batches = losses.backlog_dropped_batches,
            unwind_table_bytes = self.tables.loaded_bytes(),
            unwind_processes_written = self.loaded.unwind.processes_written,
            unwind_mappings_lost = self.loaded.unwind.mappings_lost,
            unwind_compactions = self.tables.compactions,
            ignore_accepted = self.ignored.accepted,
            ignore_released = self.ignored.released,
            interpreters = self.interps.len(),
            interpreters_accepted = self.interps.accepted,
            process_events = events_sent,
            process_events_dropped = events_dropped,
            process_execs = execs,
            facts_read = latency.count,
            cgroup_reads_saved = self.tracker.cgroups.hits,
            start_times_agreed = self.tracker.start_check.agreed,
            start_times_refused = self.tracker.start_check.refused,
            facts_latency_p50_ms = latency.p50_ns as f64 / 1e6,
            facts_latency_p99_ms = latency.p99_ns as f64 / 1e6,
            facts_latency_max_ms = latency.max_ns as f64 / 1e6,
            "sampler status"
        );
    }
}

/// The parts of interval `sequence` as messages to queue, and their samples.
fn batch_messages(sequence: u64, batches: Vec<Batch>) -> (Vec<Outgoing>, u64) {
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
