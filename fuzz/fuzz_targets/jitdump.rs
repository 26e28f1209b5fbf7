//! Fuzz target: a jitdump file a process writes about its JIT code, read incrementally.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::jitdump(data);
});
