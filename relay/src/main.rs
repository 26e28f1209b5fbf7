//! ember-relay's executable: everything, the command line included, is in the library
//! (`ember_relay::main`, relay/src/cli/), so its modules can stay crate-private.

/// Counts heap bytes per thread, so the symbolizer cache can be bounded in bytes.
#[global_allocator]
static ALLOCATOR: ember_relay::CountingAllocator = ember_relay::CountingAllocator;

/// glibc arenas the relay's threads share (see `main`).
#[cfg(target_env = "gnu")]
const ARENAS: libc::c_int = 2;

fn main() -> std::process::ExitCode {
    // glibc gives each thread that allocates while another holds the lock an arena of its own
    // (up to 8 per CPU), and memory freed in one arena serves only that arena: the relay's
    // threads (sources, driver, unwind worker, exporter, window writer) each kept the peak of
    // what they once held. Two arenas, set before any thread starts: under the churn soak
    // (bench/soak.sh --formats none, 4 min, same binary) the relay's RSS went from a mean of
    // 153.7 MiB (137.6-163.1) to 104.1 MiB (92.8-110.0). `MALLOC_ARENA_MAX` in the
    // environment still decides when set.
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; no thread has started yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
    ember_relay::main()
}
