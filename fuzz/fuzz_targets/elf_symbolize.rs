//! Fuzz target: an ELF file passed as a descriptor, symbolized at a file offset.
//!
//! The property is the relay's: a hostile file neither ends it nor costs unbounded time or
//! memory. blazesym panics on some malformed files (an unwrap in its DWARF line reader, found
//! here); the relay catches those panics around every call into it and leaves the file
//! unnamed, so this target replaces libfuzzer-sys's abort-on-any-panic hook with a silent one:
//! a panic the relay catches is its designed answer, one it does not catch still aborts through
//! libfuzzer-sys's own catch_unwind and is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: std::panic::set_hook(Box::new(|_| {})),
    |data: &[u8]| {
        ember_relay::fuzzing::elf_symbolize(data);
    }
);
