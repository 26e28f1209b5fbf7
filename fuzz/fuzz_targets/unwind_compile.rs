//! Fuzz target: an ELF file passed as a descriptor, compiled into an unwind table.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::unwind_compile(data);
});
