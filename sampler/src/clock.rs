//! CLOCK_MONOTONIC, the program's clock (`bpf_ktime_get_ns`), to compare with the times the
//! program records. (The wall clock, for the interval bounds of a batch, is
//! `ember_common::now_unix_ns`, which the relay reads too.)

/// CLOCK_MONOTONIC now, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to the pointer, which is valid for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) } != 0 {
        return 0;
    }
    let secs = u64::try_from(now.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}
