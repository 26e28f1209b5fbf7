//! Fuzz target: a Go binary's `.gopclntab` bytes, parsed, looked up and read for unwind rows.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::go_pclntab(data);
});
