//! Fuzz target: a CPython process's code object copies and interpreter frames, as the kernel
//! copies them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::python_code(data);
});
