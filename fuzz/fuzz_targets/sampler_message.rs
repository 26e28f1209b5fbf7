//! A datagram from a peer claiming to be the sampler, decoded as the relay decodes it.
#![no_main]

use ember_protocol::{decode_sampler_message, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_sampler_message(data, &Limits::default());
});
