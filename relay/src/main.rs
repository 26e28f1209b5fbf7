//! ember-relay's executable: everything, the command line included, is in the library
//! (`ember_relay::main`, relay/src/cli/), so its modules can stay crate-private.

/// Counts heap bytes per thread, so the symbolizer cache can be bounded in bytes.
#[global_allocator]
static ALLOCATOR: ember_relay::CountingAllocator = ember_relay::CountingAllocator;

fn main() -> std::process::ExitCode {
    ember_relay::main()
}
