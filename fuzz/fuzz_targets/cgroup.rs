//! Fuzz target: a process's cgroup text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        ember_relay::fuzzing::cgroup(text);
    }
});
