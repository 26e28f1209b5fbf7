//! Retry classification and policy, apart from the transports that report failures and the
//! exporter that waits: which answers are worth retrying (the OTLP specification's lists for
//! gRPC codes and HTTP statuses), the backoff between attempts, and the budget that ends them.
//! Pure: no I/O, no clock of its own (the caller passes elapsed time).

use std::time::Duration;

use http::StatusCode;
use tonic::Code;

/// Retry policy (the Collector's `retry_on_failure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrySettings {
    pub enabled: bool,
    pub initial_interval: Duration,
    pub max_interval: Duration,
    /// Give a request up after retrying it this long.
    pub max_elapsed_time: Duration,
    /// Retry a server error (gRPC `UNKNOWN`, HTTP 500) like a retryable failure. Pyroscope 1.18
    /// and 1.19 answer their ingestion limits so, not with `RESOURCE_EXHAUSTED` / 429.
    pub server_errors: bool,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(30),
            max_elapsed_time: Duration::from_secs(300),
            server_errors: false,
        }
    }
}

/// gRPC codes the OTLP specification says to retry.
pub(crate) fn grpc_retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// A server error: gRPC `UNKNOWN` (how a Go gRPC server reports a plain error) or HTTP 500.
/// Neither is retryable by the OTLP specification; Pyroscope 1.18/1.19 reject over-limit
/// ingestion with them ([`RetrySettings::server_errors`]).
pub(crate) fn grpc_server_error(code: Code) -> bool {
    code == Code::Unknown
}

/// See [`grpc_server_error`].
pub(crate) fn http_server_error(status: StatusCode) -> bool {
    status == StatusCode::INTERNAL_SERVER_ERROR
}

/// HTTP statuses the OTLP specification says to retry.
pub(crate) fn http_retryable(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The delay before retry number `attempt + 1`: `initial * 2^attempt`, capped at
/// `max_interval`, jittered uniformly by +-50% so that many relays do not retry in step.
pub(crate) fn backoff(retry: &RetrySettings, attempt: u32) -> Duration {
    let base = retry
        .initial_interval
        .saturating_mul(1u32 << attempt.min(20))
        .min(retry.max_interval);
    base.mul_f64(0.5 + fastrand::f64())
}

impl RetrySettings {
    /// The wait before the next attempt after failed attempt number `attempt` (0-based):
    /// `asked` (the receiver's Retry-After / RetryInfo) or the backoff. `None` when retries are
    /// off or the wait would end past `max_elapsed_time` since the first attempt (`elapsed`).
    pub(crate) fn next_delay(
        &self,
        attempt: u32,
        asked: Option<Duration>,
        elapsed: Duration,
    ) -> Option<Duration> {
        let delay = asked.unwrap_or_else(|| backoff(self, attempt));
        (self.enabled && elapsed + delay <= self.max_elapsed_time).then_some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry() -> RetrySettings {
        RetrySettings {
            enabled: true,
            initial_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(1),
            max_elapsed_time: Duration::from_secs(10),
            server_errors: false,
        }
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let retry = retry();
        for attempt in 0..10 {
            let d = backoff(&retry, attempt);
            let base = (100u64 << attempt).min(1000);
            assert!(d >= Duration::from_millis(base / 2), "{attempt}: {d:?}");
            assert!(d <= Duration::from_millis(base * 3 / 2), "{attempt}: {d:?}");
        }
    }

    #[test]
    fn the_budget_ends_retries_and_the_receivers_delay_wins() {
        let retry = retry();
        let asked = Some(Duration::from_secs(3));
        // The receiver's delay is used as is while it fits the budget.
        assert_eq!(retry.next_delay(0, asked, Duration::ZERO), asked);
        assert_eq!(retry.next_delay(5, asked, Duration::from_secs(7)), asked);
        // Past the budget, or with retries off: give up.
        assert_eq!(
            retry.next_delay(5, asked, Duration::from_millis(7001)),
            None
        );
        let off = RetrySettings {
            enabled: false,
            ..retry
        };
        assert_eq!(off.next_delay(0, asked, Duration::ZERO), None);
    }

    #[test]
    fn classification_follows_the_otlp_specification() {
        assert!(grpc_retryable(Code::Unavailable) && grpc_retryable(Code::ResourceExhausted));
        assert!(!grpc_retryable(Code::InvalidArgument) && !grpc_retryable(Code::Unauthenticated));
        assert!(http_retryable(StatusCode::TOO_MANY_REQUESTS));
        assert!(http_retryable(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!http_retryable(StatusCode::BAD_REQUEST));
        assert!(!http_retryable(StatusCode::INTERNAL_SERVER_ERROR));
        // Server errors apart: retried only when the exporter asks for it.
        assert!(grpc_server_error(Code::Unknown) && !grpc_server_error(Code::Internal));
        assert!(http_server_error(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(!http_server_error(StatusCode::NOT_IMPLEMENTED));
    }
}
