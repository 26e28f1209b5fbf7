//! A datagram from a peer claiming to be the relay, decoded as the sampler decodes it.
#![no_main]

use ember_protocol::{decode_relay_message, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_relay_message(data, &Limits::default());
});
