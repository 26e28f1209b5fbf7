//! When the relay hands freed heap back to the kernel (`malloc_trim`): only after a release
//! large enough to matter ([`worth_trimming`]), never for the space steady work reuses; after a
//! written window only when the relay grew past [`WINDOW_KEEP_RSS`] ([`window_worth_trimming`]).
//!
//! Why a rule and not a trim after every release: under steady churn the relay allocates and
//! frees about a third of its heap every second (each interval's profile, its OTLP encoding,
//! each batch), and glibc reuses those freed chunks the next second. Trimming whenever a
//! symbolizer resolver closed (every few seconds under churn) handed those pages back and the
//! next second faulted them in again: the RSS dipped by 10-17 MiB and climbed back within a
//! second (bench/soak.sh --formats none: swing 19-30% of the mean; without those trims 8%).
//!
//! The rule looks at what was released, not at the allocator's free lists: glibc's
//! `mallinfo2` walks every free chunk under the arenas' locks, which under churn took long
//! enough to cost the relay about a tenth of a CPU when read every second.

/// While the relay's RSS is at most this, the heap a written window freed is kept for the next
/// window to reuse instead of handed back: writing a window of an all-formats relay under heavy
/// churn (hundreds of thousands of distinct stacks a minute) holds a few tens of MiB for a few
/// seconds, and handing them back after each window made the RSS fall and climb again every
/// minute (bench/RESULTS.md). Above it (a window far larger than usual), the freed heap goes
/// back.
pub(crate) const WINDOW_KEEP_RSS: u64 = 192 << 20;

/// Whether the heap a written window freed is worth handing back, at `resident` bytes of RSS
/// (None: unknown, handed back as before).
pub(crate) fn window_worth_trimming(resident: Option<u64>) -> bool {
    resident.is_none_or(|bytes| bytes > WINDOW_KEEP_RSS)
}

/// The relay's resident set in bytes (/proc/self/statm, the kernel's own figures for this
/// process; a few dozen bytes read), None where it cannot be read.
pub(crate) fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}

/// A release below this is never handed back: a closed resolver of an ordinary binary (a few
/// MiB), whose space the next one reuses. A large binary's parsed debug info is more.
pub(crate) const TRIM_RELEASED_MIN: u64 = 64 << 20;

/// Whether `released` heap bytes (freed at once: a resolver's parsed tables, a window) are
/// worth handing back to the kernel.
pub(crate) fn worth_trimming(released: u64) -> bool {
    released >= TRIM_RELEASED_MIN
}

/// Hands every arena's free memory back to the kernel.
pub(crate) fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_space_steady_churn_reuses_stays_and_a_large_release_goes() {
        // Given what a resolver of an ordinary binary holds (the churn soak's closed every
        // few seconds: 1-6 MiB each), and nothing at all
        for released in [0, MIB, 6 * MIB, 63 * MIB] {
            // Then it is kept for the next second to reuse
            assert!(!worth_trimming(released), "{released}");
        }
        // When a large binary's parsed debug info or a window was freed
        for released in [64 * MIB, 300 * MIB] {
            // Then it is handed back
            assert!(worth_trimming(released), "{released}");
        }
    }

    #[test]
    fn a_written_window_is_kept_for_the_next_unless_the_relay_grew_past_the_level() {
        // Given the RSS an all-formats relay under churn holds while it writes a window
        for resident in [64 * MIB, 180 * MIB, WINDOW_KEEP_RSS] {
            // Then the window's freed heap is kept for the next window
            assert!(!window_worth_trimming(Some(resident)), "{resident}");
        }
        // When a window far larger than usual took it past the level, or it is unknown
        for resident in [Some(WINDOW_KEEP_RSS + 1), Some(900 * MIB), None] {
            // Then it is handed back
            assert!(window_worth_trimming(resident), "{resident:?}");
        }
    }

    #[test]
    fn this_process_has_a_resident_set() {
        let resident = resident_bytes().expect("/proc/self/statm");
        assert!(resident > MIB, "{resident}");
    }
}
