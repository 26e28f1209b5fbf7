//! What both spike servers share: the generated schema and the sampler-side table checker, so the
//! two channels are compared with exactly the same validation and the same bounds.
pub mod control_capnp {
    include!(concat!(env!("OUT_DIR"), "/control_capnp.rs"));
}
pub mod tables;
