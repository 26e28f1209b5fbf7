//! Fuzz target: the relay's YAML config file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        ember_relay::fuzzing::config_file(text);
    }
});
