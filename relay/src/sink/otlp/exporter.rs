//! The OTLP exporter: a thread of its own running a single-threaded tokio runtime, fed by the
//! synchronous pipeline through a bounded channel.
//!
//! Flow: [`Exporter::export`] (pipeline thread, never blocks) -> channel (16 profiles) -> encode
//! (split to the size limit) -> [`Queue`] (bounded by bytes, oldest dropped first) -> one request
//! in flight at a time -> retries with exponential backoff and jitter (honouring the server's
//! Retry-After / RetryInfo) up to `max_elapsed_time` -> counted as sent or dropped with a reason.
//! Memory held is at most the queue bound plus the one request in flight plus the channel.
//!
//! Starts after the relay dropped its privileges and opens no files: TLS material arrives in
//! memory with the [`Settings`].

use std::{
    cell::RefCell,
    collections::HashSet,
    sync::{atomic::Ordering::Relaxed, mpsc as std_mpsc, Arc},
    thread,
    time::Duration,
};

use tokio::{
    sync::{mpsc, Notify},
    time::Instant,
};

pub use super::retry::RetrySettings;
use super::{
    queue::Queue,
    stats::{self, DropReason, Snapshot, Stats},
    transport::{Outcome, Transport, TransportError, TransportSettings},
    wire::{EncodeSettings, Encoder},
    Encoded,
};
use crate::labels::labeled::LabeledProfile;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExporterError {
    #[error("starting the exporter thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("building the exporter runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("the exporter thread ended during start-up")]
    Died,
}

/// Everything the exporter needs, resolved from config file, environment and flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub transport: TransportSettings,
    /// Wire generation, sample attributes and request size limit.
    pub encoding: EncodeSettings,
    pub queue_bytes: usize,
    pub retry: RetrySettings,
    /// How often the counters are logged.
    pub stats_interval: Duration,
}

/// How a shutdown ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drained {
    /// Everything handed over was delivered or dropped for a counted reason before the deadline.
    Drained,
    /// The deadline passed with this much still queued or in flight (now dropped, counted as
    /// `shutdown`).
    TimedOut { requests: u64, samples: u64 },
}

enum Command {
    Export(Arc<LabeledProfile>),
    Shutdown {
        deadline: Instant,
        reply: std_mpsc::Sender<Drained>,
    },
}

/// Capacity of the hand-over channel, in profiles.
const CHANNEL_PROFILES: usize = 16;

/// The pipeline's handle on the exporter thread.
pub struct Exporter {
    tx: mpsc::Sender<Command>,
    thread: Option<thread::JoinHandle<()>>,
    stats: Arc<Stats>,
    description: String,
}

impl Exporter {
    /// Starts the exporter thread. Fails if the transport cannot be built (bad TLS material or
    /// endpoint); a receiver that is down is not an error (delivery retries).
    pub fn start(settings: Settings) -> Result<Self, ExporterError> {
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel(CHANNEL_PROFILES);
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let description = format!(
            "{} {} (OTLP profiles v{})",
            settings.transport.protocol.as_str(),
            settings.transport.display_url(),
            settings.encoding.version
        );
        let thread_stats = Arc::clone(&stats);
        let thread = thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = ready_tx.send(Err(ExporterError::Runtime(err)));
                        return;
                    }
                };
                runtime.block_on(run(settings, rx, thread_stats, ready_tx));
            })
            .map_err(ExporterError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(err),
            Err(_) => return Err(ExporterError::Died),
        }
        tracing::info!(endpoint = %description, "OTLP exporter started");
        Ok(Self {
            tx,
            thread: Some(thread),
            stats,
            description,
        })
    }

    /// Hands a profile over without blocking. If the exporter thread is so far behind that the
    /// channel is full, the profile is dropped and counted (`channel_full`).
    pub fn export(&self, profile: LabeledProfile) {
        self.export_shared(&Arc::new(profile));
    }

    /// [`Exporter::export`] of a profile other sinks read too: the exporter's thread holds it
    /// until it is encoded, and nobody copies it.
    pub fn export_shared(&self, profile: &Arc<LabeledProfile>) {
        if profile.is_empty() {
            return;
        }
        let samples = profile.total_samples();
        match self.tx.try_send(Command::Export(Arc::clone(profile))) {
            Ok(()) => {}
            Err(_) => {
                self.stats.dropped(DropReason::ChannelFull, samples);
                tracing::warn!(
                    samples,
                    "OTLP exporter is behind: dropped a profile (channel full)"
                );
            }
        }
    }

    pub fn stats(&self) -> Snapshot {
        self.stats.snapshot()
    }

    /// The live counters, for the metrics endpoint to read at scrape time.
    pub fn shared_stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// Stops taking profiles, tries to deliver everything handed over until `timeout`, drops
    /// (and counts) what is left, and ends the thread. Returns how it ended and the final counters.
    pub fn shutdown(mut self, timeout: Duration) -> (Drained, Snapshot) {
        let (reply, answer) = std_mpsc::channel();
        let deadline = Instant::now() + timeout;
        let sent = self
            .tx
            .blocking_send(Command::Shutdown { deadline, reply })
            .is_ok();
        let drained = if sent {
            answer.recv_timeout(timeout + Duration::from_secs(5)).ok()
        } else {
            None
        };
        if let Some(thread) = self.thread.take() {
            if drained.is_some() {
                let _ = thread.join();
            }
        }
        let drained = drained.unwrap_or(Drained::TimedOut {
            requests: self.stats.queue_requests.load(Relaxed),
            samples: 0,
        });
        (drained, self.stats.snapshot())
    }
}

/// State shared by the exporter's tasks (one thread: `RefCell` is enough).
struct Shared {
    queue: Queue,
    closing: Option<Instant>,
    reply: Option<std_mpsc::Sender<Drained>>,
}

/// The exporter thread: three tasks on one single-threaded runtime. [`Worker::intake`] encodes
/// what the pipeline hands over into the queue, [`Worker::send_all`] delivers it one request at
/// a time, [`Worker::report`] logs the counters; [`Worker::finish`] counts what is left.
struct Worker {
    settings: Settings,
    /// Keeps its body buffer from one profile to the next.
    encoder: RefCell<Encoder>,
    stats: Arc<Stats>,
    shared: RefCell<Shared>,
    /// Something was queued, or closing began.
    work: Notify,
    /// Closing began: retry waits end early.
    closing: Notify,
    /// The sender is done: the reporter stops.
    done: Notify,
}

async fn run(
    settings: Settings,
    rx: mpsc::Receiver<Command>,
    stats: Arc<Stats>,
    ready: std_mpsc::Sender<Result<(), ExporterError>>,
) {
    let transport = match Transport::new(&settings.transport) {
        Ok(t) => t,
        Err(err) => {
            let _ = ready.send(Err(err.into()));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let worker = Worker {
        encoder: RefCell::new(Encoder::new(settings.encoding)),
        shared: RefCell::new(Shared {
            queue: Queue::new(settings.queue_bytes),
            closing: None,
            reply: None,
        }),
        settings,
        stats,
        work: Notify::new(),
        closing: Notify::new(),
        done: Notify::new(),
    };
    tokio::join!(
        worker.intake(rx),
        worker.send_all(&transport),
        worker.report()
    );
    worker.finish();
}

impl Worker {
    /// Takes commands until a shutdown (or the handle is dropped), then starts closing.
    async fn intake(&self, mut rx: mpsc::Receiver<Command>) {
        while let Some(command) = rx.recv().await {
            match command {
                Command::Export(profile) => {
                    self.accept(&profile);
                    self.work.notify_one();
                }
                Command::Shutdown { deadline, reply } => {
                    let mut shared = self.shared.borrow_mut();
                    shared.closing = Some(deadline);
                    shared.reply = Some(reply);
                    break;
                }
            }
        }
        // Channel closed without a shutdown (the handle was dropped): stop now.
        self.shared
            .borrow_mut()
            .closing
            .get_or_insert_with(Instant::now);
        self.work.notify_one();
        self.closing.notify_waiters();
    }

    /// Encodes `profile` (split to the size limit) and queues its requests.
    fn accept(&self, profile: &LabeledProfile) {
        let (stats, settings) = (&self.stats, &self.settings.encoding);
        stats.profiles.fetch_add(1, Relaxed);
        let before = stats::thread_cpu_ns();
        let encoded = self.encoder.borrow_mut().encode(profile);
        stats
            .encode_cpu_ns
            .fetch_add(stats::thread_cpu_ns().saturating_sub(before), Relaxed);
        stats
            .samples_encoded
            .fetch_add(profile.total_samples(), Relaxed);
        if encoded.requests.len() > 1 {
            stats
                .split_requests
                .fetch_add(encoded.requests.len() as u64, Relaxed);
        }
        if encoded.oversized > 0 {
            tracing::warn!(
                requests = encoded.oversized,
                max_request_bytes = settings.max_request_bytes,
                "a single sample encodes larger than the request limit; sending it anyway"
            );
        }
        self.enqueue(encoded.requests);
    }

    /// Queues `requests`, counting (and logging) the oldest ones dropped to make room.
    fn enqueue(&self, requests: Vec<Encoded>) {
        let mut shared = self.shared.borrow_mut();
        for request in requests {
            let dropped = shared.queue.push(request);
            if dropped.is_empty() {
                continue;
            }
            let samples: u64 = dropped.iter().map(|d| d.samples).sum();
            for d in &dropped {
                self.stats.dropped(DropReason::QueueFull, d.samples);
            }
            tracing::warn!(
                requests = dropped.len(),
                samples,
                queue_bytes = shared.queue.bytes(),
                max_queue_bytes = shared.queue.max_bytes(),
                "OTLP queue full: dropped the oldest requests"
            );
        }
        gauges(&self.stats, &shared.queue);
    }

    /// Delivers queued requests one at a time until the queue is empty while closing, or the
    /// shutdown deadline passes.
    async fn send_all(&self, transport: &Transport) {
        let mut delivery = Delivery {
            worker: self,
            transport,
            logged_errors: HashSet::new(),
        };
        loop {
            let next = {
                let mut s = self.shared.borrow_mut();
                let item = s.queue.pop();
                gauges(&self.stats, &s.queue);
                match item {
                    Some(item) => Some(item),
                    None if s.closing.is_some() => break,
                    None => None,
                }
            };
            match next {
                Some(item) => delivery.deliver(item).await,
                None => self.work.notified().await,
            }
            if self.past_deadline() {
                break;
            }
        }
        self.done.notify_one();
    }

    fn deadline(&self) -> Option<Instant> {
        self.shared.borrow().closing
    }

    fn past_deadline(&self) -> bool {
        self.deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// Logs the counters every `stats_interval` until the sender is done.
    async fn report(&self) {
        let mut ticker = tokio::time::interval(self.settings.stats_interval);
        // Encoding a big profile can hold the thread past a tick: log once, not in a burst.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    self.stats.thread_cpu_ns.store(stats::thread_cpu_ns(), Relaxed);
                    self.stats.snapshot().log("otlp export stats");
                }
                _ = self.done.notified() => break,
            }
        }
    }

    /// Counts what is still queued as dropped at shutdown, logs the final counters and answers
    /// the shutdown.
    fn finish(self) {
        let stats = self.stats;
        let mut shared = self.shared.into_inner();
        while let Some(item) = shared.queue.pop() {
            stats.dropped(DropReason::Shutdown, item.samples);
        }
        gauges(&stats, &shared.queue);
        stats.thread_cpu_ns.store(stats::thread_cpu_ns(), Relaxed);
        let snapshot = stats.snapshot();
        snapshot.log("otlp export stats (final)");
        if let Some(reply) = shared.reply.take() {
            // Only a shutdown drops for reason `shutdown`: queued or in flight at the deadline.
            let result = match snapshot.dropped_requests(DropReason::Shutdown) {
                0 => Drained::Drained,
                requests => Drained::TimedOut {
                    requests,
                    samples: snapshot.dropped_samples(DropReason::Shutdown),
                },
            };
            let _ = reply.send(result);
        }
    }
}

fn gauges(stats: &Stats, queue: &Queue) {
    stats.queue_bytes.store(queue.bytes() as u64, Relaxed);
    stats
        .queue_high_water
        .store(queue.high_water() as u64, Relaxed);
    stats.queue_requests.store(queue.len() as u64, Relaxed);
}

/// One request's way to the receiver: attempts, retries, and how it ended, counted.
struct Delivery<'a> {
    worker: &'a Worker,
    transport: &'a Transport,
    /// Permanent errors already logged at error level (each distinct message once).
    logged_errors: HashSet<String>,
}

impl Delivery<'_> {
    /// Sends `item` until it is delivered, refused for good, out of retry budget, or the
    /// shutdown deadline passes.
    async fn deliver(&mut self, item: Encoded) {
        let started = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            let Some(outcome) = self.attempt(&item).await else {
                return;
            };
            let (reason, after) = match outcome {
                Outcome::Delivered {
                    rejected,
                    message,
                    wire_bytes,
                } => return self.delivered(&item, rejected, &message, wire_bytes),
                Outcome::Permanent { reason } => return self.refused(&item, reason),
                Outcome::ServerError { reason } if !self.worker.settings.retry.server_errors => {
                    return self.refused(&item, reason)
                }
                Outcome::ServerError { reason } => {
                    self.worker.stats.server_error_retries.fetch_add(1, Relaxed);
                    (reason, None)
                }
                Outcome::Retry { reason, after } => (reason, after),
            };
            let retry = &self.worker.settings.retry;
            let Some(delay) = retry.next_delay(attempt, after, started.elapsed()) else {
                self.worker
                    .stats
                    .dropped(DropReason::RetriesExhausted, item.samples);
                tracing::error!(
                    samples = item.samples,
                    attempts = attempt + 1,
                    error = %reason,
                    "OTLP request failed and its retry budget is spent; dropped"
                );
                return;
            };
            self.worker.stats.retries.fetch_add(1, Relaxed);
            if attempt == 0 {
                tracing::warn!(error = %reason, retry_in_ms = delay.as_millis() as u64, "OTLP export failed; retrying");
            } else {
                tracing::debug!(error = %reason, attempt, retry_in_ms = delay.as_millis() as u64, "OTLP export failed again; retrying");
            }
            if !self.wait(delay).await {
                self.worker
                    .stats
                    .dropped(DropReason::Shutdown, item.samples);
                return;
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// One send, cut short by the shutdown deadline (then counted as dropped: `None`).
    async fn attempt(&self, item: &Encoded) -> Option<Outcome> {
        let send = self.transport.send(item.body.clone());
        let Some(deadline) = self.worker.deadline() else {
            return Some(send.await);
        };
        let outcome = tokio::time::timeout_at(deadline, send).await.ok();
        if outcome.is_none() {
            self.worker
                .stats
                .dropped(DropReason::Shutdown, item.samples);
        }
        outcome
    }

    /// Sleeps `delay` before the next attempt, less if closing begins; `false` when the
    /// shutdown deadline has passed.
    async fn wait(&self, delay: Duration) -> bool {
        let wake = Instant::now() + delay;
        let wake = self.worker.deadline().map_or(wake, |d| wake.min(d));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = self.worker.closing.notified() => {}
        }
        !self.worker.past_deadline()
    }

    fn delivered(&self, item: &Encoded, rejected: i64, message: &str, wire_bytes: usize) {
        let stats = &self.worker.stats;
        stats.requests_sent.fetch_add(1, Relaxed);
        stats.samples_sent.fetch_add(item.samples, Relaxed);
        stats.bytes_sent.fetch_add(item.body.len() as u64, Relaxed);
        if matches!(self.transport, Transport::Http(_)) {
            stats
                .http_body_bytes_sent
                .fetch_add(wire_bytes as u64, Relaxed);
        }
        if rejected > 0 || !message.is_empty() {
            stats.partial_success.fetch_add(1, Relaxed);
            stats
                .rejected_profiles
                .fetch_add(u64::try_from(rejected).unwrap_or(0), Relaxed);
            tracing::warn!(
                rejected_profiles = rejected,
                message = %message,
                "OTLP receiver accepted the request only in part"
            );
        }
    }

    fn refused(&mut self, item: &Encoded, reason: String) {
        self.worker
            .stats
            .dropped(DropReason::Permanent, item.samples);
        if self.logged_errors.len() < 64 && self.logged_errors.insert(reason.clone()) {
            tracing::error!(
                samples = item.samples,
                error = %reason,
                "OTLP receiver refused the request; dropped (not retried; further \
                 identical errors are only counted)"
            );
        } else {
            tracing::debug!(samples = item.samples, error = %reason, "OTLP request refused");
        }
    }
}
