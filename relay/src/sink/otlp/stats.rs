//! Export counters, shared between the exporter thread (which updates them) and whoever reports
//! them (the exporter's periodic log line, `record`'s summary, tests). Every request and every
//! sample that does not reach the receiver is counted under exactly one drop reason.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why data was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The queue was full: the oldest request made room for a newer one.
    QueueFull,
    /// The receiver refused it with a non-retryable error.
    Permanent,
    /// Retryable failures went on past the retry budget (`max_elapsed_time`).
    RetriesExhausted,
    /// Still queued or in flight when the exporter had to stop.
    Shutdown,
    /// The hand-over channel from the pipeline was full (the exporter thread fell behind).
    ChannelFull,
}

impl DropReason {
    pub const ALL: [Self; 5] = [
        Self::QueueFull,
        Self::Permanent,
        Self::RetriesExhausted,
        Self::Shutdown,
        Self::ChannelFull,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::Permanent => "permanent_error",
            Self::RetriesExhausted => "retries_exhausted",
            Self::Shutdown => "shutdown",
            Self::ChannelFull => "channel_full",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Debug, Default)]
pub struct Stats {
    pub profiles: AtomicU64,
    pub requests_sent: AtomicU64,
    pub samples_sent: AtomicU64,
    /// Uncompressed protobuf bytes delivered.
    pub bytes_sent: AtomicU64,
    /// Bytes on the wire for HTTP (after gzip); gRPC compression happens inside tonic and is not
    /// counted here.
    pub http_body_bytes_sent: AtomicU64,
    pub retries: AtomicU64,
    /// Server errors (gRPC `UNKNOWN`, HTTP 500) treated as retryable, each counted in `retries`
    /// too.
    pub server_error_retries: AtomicU64,
    pub split_requests: AtomicU64,
    pub partial_success: AtomicU64,
    pub rejected_profiles: AtomicU64,
    pub queue_bytes: AtomicU64,
    pub queue_high_water: AtomicU64,
    pub queue_requests: AtomicU64,
    /// Thread CPU time spent building and encoding requests.
    pub encode_cpu_ns: AtomicU64,
    /// Samples encoded (the denominator for `encode_cpu_ns`).
    pub samples_encoded: AtomicU64,
    /// Total CPU time of the exporter thread (encoding, compression, TLS, I/O).
    pub thread_cpu_ns: AtomicU64,
    dropped_requests: [AtomicU64; 5],
    dropped_samples: [AtomicU64; 5],
}

impl Stats {
    pub fn dropped(&self, reason: DropReason, samples: u64) {
        self.dropped_requests[reason.index()].fetch_add(1, Relaxed);
        self.dropped_samples[reason.index()].fetch_add(samples, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let get = |a: &AtomicU64| a.load(Relaxed);
        Snapshot {
            profiles: get(&self.profiles),
            requests_sent: get(&self.requests_sent),
            samples_sent: get(&self.samples_sent),
            bytes_sent: get(&self.bytes_sent),
            http_body_bytes_sent: get(&self.http_body_bytes_sent),
            retries: get(&self.retries),
            server_error_retries: get(&self.server_error_retries),
            split_requests: get(&self.split_requests),
            partial_success: get(&self.partial_success),
            rejected_profiles: get(&self.rejected_profiles),
            queue_bytes: get(&self.queue_bytes),
            queue_high_water: get(&self.queue_high_water),
            queue_requests: get(&self.queue_requests),
            encode_cpu_ns: get(&self.encode_cpu_ns),
            samples_encoded: get(&self.samples_encoded),
            thread_cpu_ns: get(&self.thread_cpu_ns),
            dropped_requests: self.dropped_requests.each_ref().map(get),
            dropped_samples: self.dropped_samples.each_ref().map(get),
        }
    }
}

/// A copy of the counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub profiles: u64,
    pub requests_sent: u64,
    pub samples_sent: u64,
    pub bytes_sent: u64,
    pub http_body_bytes_sent: u64,
    pub retries: u64,
    pub server_error_retries: u64,
    pub split_requests: u64,
    pub partial_success: u64,
    pub rejected_profiles: u64,
    pub queue_bytes: u64,
    pub queue_high_water: u64,
    pub queue_requests: u64,
    pub encode_cpu_ns: u64,
    pub samples_encoded: u64,
    pub thread_cpu_ns: u64,
    pub dropped_requests: [u64; 5],
    pub dropped_samples: [u64; 5],
}

impl Snapshot {
    pub fn dropped_requests(&self, reason: DropReason) -> u64 {
        self.dropped_requests[reason.index()]
    }

    pub fn dropped_samples(&self, reason: DropReason) -> u64 {
        self.dropped_samples[reason.index()]
    }

    pub fn total_dropped_samples(&self) -> u64 {
        self.dropped_samples.iter().sum()
    }

    /// Logs the counters as one structured line.
    pub fn log(&self, message: &str) {
        tracing::info!(
            profiles = self.profiles,
            requests_sent = self.requests_sent,
            samples_sent = self.samples_sent,
            bytes_sent = self.bytes_sent,
            http_body_bytes_sent = self.http_body_bytes_sent,
            retries = self.retries,
            server_error_retries = self.server_error_retries,
            split_requests = self.split_requests,
            partial_success = self.partial_success,
            rejected_profiles = self.rejected_profiles,
            queue_requests = self.queue_requests,
            queue_bytes = self.queue_bytes,
            queue_high_water_bytes = self.queue_high_water,
            dropped_queue_full = self.dropped_samples(DropReason::QueueFull),
            dropped_permanent_error = self.dropped_samples(DropReason::Permanent),
            dropped_retries_exhausted = self.dropped_samples(DropReason::RetriesExhausted),
            dropped_shutdown = self.dropped_samples(DropReason::Shutdown),
            dropped_channel_full = self.dropped_samples(DropReason::ChannelFull),
            dropped_requests = self.dropped_requests.iter().sum::<u64>(),
            encode_cpu_ns = self.encode_cpu_ns,
            samples_encoded = self.samples_encoded,
            thread_cpu_ns = self.thread_cpu_ns,
            "{message}"
        );
    }
}

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
