//! Liveness and readiness, as pure functions of what the driver published and of the time, so
//! the rules are tested without a clock or a server.
//!
//! - Live (`/healthz`): the driver's loop stepped within [`STALE_AFTER`]. The loop steps at
//!   least once per poll period (250 ms in `run`, 200 ms in `record`) even when nothing arrives,
//!   so this is about 120 poll periods: long enough for the slowest legitimate step (writing a
//!   window's files, opening a large binary's symbols), short enough that a wedged loop is
//!   restarted within a minute by a probe that fails 3 times 10 s apart.
//! - Ready (`/readyz`): a sampler is connected and a batch arrived within the last
//!   [`READY_INTERVALS`] reporter intervals (never less than [`READY_MIN_WINDOW`]).

use std::time::{Duration, Instant};

use super::RelayStats;

/// The driver's loop is dead when it has not stepped for this long.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(30);

/// Ready while the latest batch is at most this many reporter intervals old.
pub(crate) const READY_INTERVALS: u32 = 3;

/// The readiness window is never shorter than this, so a sub-second reporter interval does not
/// make readiness flap with scheduling noise.
pub(crate) const READY_MIN_WINDOW: Duration = Duration::from_secs(3);

/// `Ok` when live, else the one-line reason.
pub(crate) fn liveness(heartbeat_age: Duration) -> Result<(), String> {
    if heartbeat_age > STALE_AFTER {
        return Err(format!(
            "the relay's loop has not stepped for {:.1}s (limit {}s)",
            heartbeat_age.as_secs_f64(),
            STALE_AFTER.as_secs()
        ));
    }
    Ok(())
}

/// `Ok` when ready, else the one-line reason. `refused`: connections the relay refused or
/// closed on an error since start (named when no sampler is connected: the likely cause).
pub(crate) fn readiness(stats: &RelayStats, refused: u64, now: Instant) -> Result<(), String> {
    if stats.connections == 0 && refused > 0 {
        return Err(format!(
            "no sampler connected ({refused} connection(s) refused or closed on an error, by \
             reason in ember_relay_sampler_connections_refused_total; the relay's log says why)"
        ));
    }
    if stats.connections == 0 {
        return Err("no sampler connected".to_owned());
    }
    let Some(at) = stats.last_batch else {
        return Err("a sampler is connected but no batch has arrived yet".to_owned());
    };
    let window = (stats.interval * READY_INTERVALS).max(READY_MIN_WINDOW);
    let age = now.saturating_duration_since(at);
    if age > window {
        return Err(format!(
            "the latest batch arrived {:.1}s ago, more than {READY_INTERVALS} reporter \
             intervals ({:.1}s)",
            age.as_secs_f64(),
            window.as_secs_f64()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_until_the_loop_stops_stepping() {
        assert!(liveness(Duration::ZERO).is_ok());
        assert!(liveness(STALE_AFTER).is_ok());
        let err = liveness(STALE_AFTER + Duration::from_millis(100)).unwrap_err();
        assert!(err.contains("has not stepped for 30.1s"), "{err}");
    }

    #[test]
    fn ready_once_a_connected_sampler_sent_a_recent_batch() {
        let start = Instant::now();
        // Given no sampler
        let mut stats = RelayStats::default();
        assert_eq!(
            readiness(&stats, 0, start).unwrap_err(),
            "no sampler connected"
        );
        // And when connections were refused, it says so
        assert!(readiness(&stats, 2, start)
            .unwrap_err()
            .starts_with("no sampler connected (2 connection(s) refused"));
        // When one connects, then it is not ready before its first batch
        stats.connections = 1;
        assert!(readiness(&stats, 0, start)
            .unwrap_err()
            .contains("no batch has arrived yet"));
        // When a batch of a 5 s interval arrives, then it is ready for 3 intervals
        stats.last_batch = Some(start);
        stats.interval = Duration::from_secs(5);
        assert!(readiness(&stats, 0, start + Duration::from_secs(15)).is_ok());
        let late = readiness(&stats, 0, start + Duration::from_secs(16)).unwrap_err();
        assert!(
            late.contains("16.0s ago") && late.contains("(15.0s)"),
            "{late}"
        );
        // And a short interval still gets the minimum window
        stats.interval = Duration::from_millis(100);
        assert!(readiness(&stats, 0, start + READY_MIN_WINDOW).is_ok());
        // And once the sampler is gone it is not ready, however recent the batch
        stats.connections = 0;
        assert!(readiness(&stats, 0, start).is_err());
    }
}
