//! The sampler <-> relay protocol: plain Rust message types, their Cap'n Proto codec, the
//! SOCK_SEQPACKET transport that carries one message plus its file descriptors per datagram, and
//! the byte encoding of the unwind tables the relay sends back ([`unwind_table`]).
//!
//! Nobody outside this crate touches capnp builders or readers. Decoding is bounded: a datagram
//! larger than [`Limits::max_message_bytes`] is refused before it is parsed, and the capnp
//! traversal limit is derived from the message size, so a hostile peer cannot make the reader
//! allocate or walk without bound.

mod codec;
mod losses;
mod messages;
pub mod split;
pub mod transport;
pub mod unwind_table;

#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used, unused)]
mod ember_capnp {
    include!(concat!(env!("OUT_DIR"), "/ember_capnp.rs"));
}

pub use codec::{
    decode_relay_message, decode_sampler_message, encode_relay_message, encode_sampler_message,
    DecodeError, Limits,
};
pub use losses::{distinct_losses, LossCounter, Losses, Summary, LOSS_COUNTERS};
pub use messages::*;

/// How long the sampler keeps a file open after the last process that mapped it is gone, before
/// it names it in `filesClosed`: the next start of the same program reuses the file under its id
/// (no new descriptor, ELF read or unwind table). The relay keeps a passed file that no known
/// process maps for twice as long before it closes it on its own (its bound on a sampler that
/// never closes what it passed).
pub const FILE_IDLE_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Version of the wire protocol this build speaks; checked by the relay on `Hello`.
pub const PROTOCOL_VERSION: u32 = ember_capnp::PROTOCOL_VERSION;
