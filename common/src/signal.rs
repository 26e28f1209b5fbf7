//! The stop signal: SIGINT and SIGTERM set a flag the main loops poll; the process ends its
//! work in order (last batch sent, files written) instead of dying mid-write.
//!
//! Without SA_RESTART (the sampler's choice, kept for both): a blocking call interrupted by the
//! signal returns EINTR at once, so a loop sleeping in `poll` sees the flag without waiting out
//! its timeout, and the sampler never needs `restart_syscall`, which its seccomp allowlist does
//! not have. Every raw call of the relay that can block already retries on EINTR, and std's
//! reads, writes, sleeps and waits do so themselves.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the flag [`stop_requested`] reads.
pub fn install_stop_handlers() -> anyhow::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a {signal} handler"))?;
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived since [`install_stop_handlers`].
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
