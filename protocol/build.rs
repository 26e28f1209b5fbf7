//! Compiles `schema/ember.capnp` with the capnp compiler (Debian package `capnproto`).
fn main() {
    println!("cargo:rerun-if-changed=schema/ember.capnp");
    if let Err(err) = capnpc::CompilerCommand::new()
        .src_prefix("schema")
        .file("schema/ember.capnp")
        .run()
    {
        panic!(
            "compiling schema/ember.capnp failed: {err}\n\
             the capnp compiler is needed: run scripts/setup.sh (or `apt-get install capnproto`)"
        );
    }
}
