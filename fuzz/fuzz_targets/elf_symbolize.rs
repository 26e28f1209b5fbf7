//! Fuzz target: an ELF file passed as a descriptor, symbolized at a file offset.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ember_relay::fuzzing::elf_symbolize(data);
});
