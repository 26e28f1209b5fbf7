//! Compiles the spike's schema with the capnp compiler (Debian `capnproto`).
fn main() {
    println!("cargo:rerun-if-changed=../schema/control.capnp");
    capnpc::CompilerCommand::new()
        .src_prefix("../schema")
        .file("../schema/control.capnp")
        .run()
        .expect("capnp compile");
}
