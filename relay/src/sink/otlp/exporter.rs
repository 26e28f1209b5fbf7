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

use super::{
    encode,
    queue::Queue,
    stats::{self, DropReason, Snapshot, Stats},
    transport::{Outcome, Transport, TransportError, TransportSettings},
    Encoded, ProtoVersion, SampleAttributes,
};
use crate::model::Profile;

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

/// Retry policy (the Collector's `retry_on_failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrySettings {
    pub enabled: bool,
    pub initial_interval: Duration,
    pub max_interval: Duration,
    /// Give a request up after retrying it this long.
    pub max_elapsed_time: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(30),
            max_elapsed_time: Duration::from_secs(300),
        }
    }
}

/// Everything the exporter needs, resolved from config file, environment and flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub transport: TransportSettings,
    pub version: ProtoVersion,
    pub attributes: SampleAttributes,
    pub max_request_bytes: usize,
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
    Export(Profile),
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
            settings.version
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
    pub fn export(&self, profile: Profile) {
        if profile.is_empty() {
            return;
        }
        let samples = profile.total_samples();
        match self.tx.try_send(Command::Export(profile)) {
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

async fn run(
    settings: Settings,
    mut rx: mpsc::Receiver<Command>,
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
    let shared = RefCell::new(Shared {
        queue: Queue::new(settings.queue_bytes),
        closing: None,
        reply: None,
    });
    let work = Notify::new();
    let closing = Notify::new();
    let done = Notify::new();

    let intake = async {
        while let Some(command) = rx.recv().await {
            match command {
                Command::Export(profile) => {
                    stats.profiles.fetch_add(1, Relaxed);
                    let before = stats::thread_cpu_ns();
                    let encoded = encode(
                        &profile,
                        settings.version,
                        settings.attributes,
                        settings.max_request_bytes,
                    );
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
                    let mut shared = shared.borrow_mut();
                    for request in encoded.requests {
                        let dropped = shared.queue.push(request);
                        if !dropped.is_empty() {
                            let samples: u64 = dropped.iter().map(|d| d.samples).sum();
                            for d in &dropped {
                                stats.dropped(DropReason::QueueFull, d.samples);
                            }
                            tracing::warn!(
                                requests = dropped.len(),
                                samples,
                                queue_bytes = shared.queue.bytes(),
                                max_queue_bytes = shared.queue.max_bytes(),
                                "OTLP queue full: dropped the oldest requests"
                            );
                        }
                    }
                    gauges(&stats, &shared.queue);
                    work.notify_one();
                }
                Command::Shutdown { deadline, reply } => {
                    let mut shared = shared.borrow_mut();
                    shared.closing = Some(deadline);
                    shared.reply = Some(reply);
                    break;
                }
            }
        }
        // Channel closed without a shutdown (the handle was dropped): stop now.
        shared.borrow_mut().closing.get_or_insert_with(Instant::now);
        work.notify_one();
        closing.notify_waiters();
    };

    let sender = async {
        let mut delivery = Delivery {
            transport: &transport,
            settings: &settings,
            stats: &stats,
            logged_errors: HashSet::new(),
        };
        loop {
            let next = {
                let mut s = shared.borrow_mut();
                let item = s.queue.pop();
                gauges(&stats, &s.queue);
                match item {
                    Some(item) => Some(item),
                    None if s.closing.is_some() => break,
                    None => None,
                }
            };
            match next {
                Some(item) => delivery.deliver(item, &shared, &closing).await,
                None => work.notified().await,
            }
            let past_deadline = shared
                .borrow()
                .closing
                .is_some_and(|deadline| Instant::now() >= deadline);
            if past_deadline {
                break;
            }
        }
        done.notify_one();
    };

    let reporter = async {
        let mut ticker = tokio::time::interval(settings.stats_interval);
        // Encoding a big profile can hold the thread past a tick: log once, not in a burst.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    stats.thread_cpu_ns.store(stats::thread_cpu_ns(), Relaxed);
                    stats.snapshot().log("otlp export stats");
                }
                _ = done.notified() => break,
            }
        }
    };

    tokio::join!(intake, sender, reporter);

    // Whatever is still queued did not make it before the deadline.
    let mut shared = shared.into_inner();
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

fn gauges(stats: &Stats, queue: &Queue) {
    stats.queue_bytes.store(queue.bytes() as u64, Relaxed);
    stats
        .queue_high_water
        .store(queue.high_water() as u64, Relaxed);
    stats.queue_requests.store(queue.len() as u64, Relaxed);
}

struct Delivery<'a> {
    transport: &'a Transport,
    settings: &'a Settings,
    stats: &'a Stats,
    /// Permanent errors already logged at error level (each distinct message once).
    logged_errors: HashSet<String>,
}

impl Delivery<'_> {
    /// Sends `item` until it is delivered, refused for good, out of retry budget, or the
    /// shutdown deadline passes.
    async fn deliver(&mut self, item: Encoded, shared: &RefCell<Shared>, closing: &Notify) {
        let started = Instant::now();
        let retry = self.settings.retry;
        let mut attempt: u32 = 0;
        loop {
            let deadline = shared.borrow().closing;
            let send = self.transport.send(item.body.clone());
            let outcome = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, send).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        self.stats.dropped(DropReason::Shutdown, item.samples);
                        return;
                    }
                },
                None => send.await,
            };
            match outcome {
                Outcome::Delivered {
                    rejected,
                    message,
                    wire_bytes,
                } => {
                    self.stats.requests_sent.fetch_add(1, Relaxed);
                    self.stats.samples_sent.fetch_add(item.samples, Relaxed);
                    self.stats
                        .bytes_sent
                        .fetch_add(item.body.len() as u64, Relaxed);
                    if matches!(self.transport, Transport::Http(_)) {
                        self.stats
                            .http_body_bytes_sent
                            .fetch_add(wire_bytes as u64, Relaxed);
                    }
                    if rejected > 0 || !message.is_empty() {
                        self.stats.partial_success.fetch_add(1, Relaxed);
                        self.stats
                            .rejected_profiles
                            .fetch_add(u64::try_from(rejected).unwrap_or(0), Relaxed);
                        tracing::warn!(
                            rejected_profiles = rejected,
                            message = %message,
                            "OTLP receiver accepted the request only in part"
                        );
                    }
                    return;
                }
                Outcome::Permanent { reason } => {
                    self.stats.dropped(DropReason::Permanent, item.samples);
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
                    return;
                }
                Outcome::Retry { reason, after } => {
                    let delay = after.unwrap_or_else(|| backoff(&retry, attempt));
                    let elapsed = started.elapsed();
                    if !retry.enabled || elapsed + delay > retry.max_elapsed_time {
                        self.stats
                            .dropped(DropReason::RetriesExhausted, item.samples);
                        tracing::error!(
                            samples = item.samples,
                            attempts = attempt + 1,
                            error = %reason,
                            "OTLP request failed and its retry budget is spent; dropped"
                        );
                        return;
                    }
                    self.stats.retries.fetch_add(1, Relaxed);
                    if attempt == 0 {
                        tracing::warn!(error = %reason, retry_in_ms = delay.as_millis() as u64, "OTLP export failed; retrying");
                    } else {
                        tracing::debug!(error = %reason, attempt, retry_in_ms = delay.as_millis() as u64, "OTLP export failed again; retrying");
                    }
                    let wake = Instant::now() + delay;
                    let wake = match shared.borrow().closing {
                        Some(deadline) => wake.min(deadline),
                        None => wake,
                    };
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake) => {}
                        _ = closing.notified() => {}
                    }
                    let deadline = shared.borrow().closing;
                    if let Some(deadline) = deadline {
                        if Instant::now() >= deadline {
                            self.stats.dropped(DropReason::Shutdown, item.samples);
                            return;
                        }
                    }
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }
}

/// The delay before retry number `attempt + 1`: `initial * 2^attempt`, capped at
/// `max_interval`, jittered uniformly by +-50% so that many relays do not retry in step.
fn backoff(retry: &RetrySettings, attempt: u32) -> Duration {
    let base = retry
        .initial_interval
        .saturating_mul(1u32 << attempt.min(20))
        .min(retry.max_interval);
    base.mul_f64(0.5 + fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let retry = RetrySettings {
            enabled: true,
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(1),
            max_elapsed_time: Duration::from_secs(10),
        };
        for attempt in 0..10 {
            let d = backoff(&retry, attempt);
            let base = (100u64 << attempt).min(1000);
            assert!(d >= Duration::from_millis(base / 2), "{attempt}: {d:?}");
            assert!(d <= Duration::from_millis(base * 3 / 2), "{attempt}: {d:?}");
        }
    }
}
