//! Fuzz target: /proc/kallsyms text passed as a descriptor.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::kallsyms(data);
});
