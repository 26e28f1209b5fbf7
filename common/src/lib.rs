//! Plumbing both ember binaries need, in one copy: duration, user and `--unwind` flags, the wall
//! clock, log set-up, the stop signal, `no_new_privs`, the identity check after leaving root, the
//! open-file limit and the `/proc/<pid>/status` reader.
//!
//! Privilege assumptions: none. Everything here runs in the privileged sampler too, after its
//! seccomp filter is installed, so at run time it may only make the system calls the sampler's
//! allowlist has (`sampler/src/harden.rs`): `openat` read-only, `read`, `close`, `write` to
//! stderr, `rt_sigreturn`. Nothing here spawns threads or allocates without bound.

mod account;
mod clock;
mod duration;
mod logging;
mod privileges;
mod signal;
mod status;
mod unwind_mode;

pub use account::{resolve_account, Account};
pub use clock::now_unix_ns;
pub use duration::{parse_duration, parse_off_cpu_min, MAX_OFF_CPU_MIN};
pub use logging::{init_logging, init_logging_at, log_filter_in_env, LogFormat, LOG_ENV};
pub use privileges::{check_identity, raise_nofile_limit, set_no_new_privs, Identity};
pub use signal::{
    install_reload_handler, install_stop_handlers, stop_requested, take_reload_request,
};
pub use status::{read_bounded, ProcStatus, STATUS_READ_LIMIT};
pub use unwind_mode::UnwindMode;
