//! The wall clock as both binaries stamp it: the sampler bounds each batch's interval with it,
//! the relay measures how late a batch arrived against it.

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock now, in nanoseconds since the Unix epoch (0 before it).
pub fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
