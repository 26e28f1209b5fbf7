//! When the relay hands freed heap back to the kernel (`malloc_trim`): only after a release
//! large enough to matter ([`worth_trimming`]), never for the space steady work reuses.
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
}
