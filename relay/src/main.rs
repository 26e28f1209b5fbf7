//! ember-relay's executable: everything, the command line included, is in the library
//! (`ember_relay::main`, relay/src/cli/), so its modules can stay crate-private.

fn main() -> std::process::ExitCode {
    ember_relay::main()
}
